-- release.lua: the owner frees the lock; in the same script the oldest live
-- waiter becomes the owner, with its own lease (direct handoff), and is
-- woken.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] owner_id        the releasing owner
-- ARGV[2] idle_ms         TTL of the seq and freed keys
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
-- ARGV[5] reply_to        tag of the calling process, or "": a new owner of
--                         that process is not sent a message; the caller
--                         wakes it from this reply
-- ARGV[6] "again"         (optional) a release sent again after its first
--                         send was answered released: where the caller no
--                         longer owns the lock it answers released, not
--                         {0} (see below)
--
-- Replies:
--   {1, dropped, more, next, token, unheard}
--                            released; `next` is the owner id that now
--                            owns the lock with fencing `token` ("" and 0 if
--                            none), so a releaser in the same process can
--                            wake it without waiting for pub/sub (it must,
--                            when the new owner's tag is `reply_to`: then
--                            no message was published); `unheard`
--                            is 1 if the grant message reached nobody and
--                            the new owner's lease was cut to the waiter
--                            TTL (whoever wakes it must set its lease);
--                            `more` is 1 if dead waiters are left to purge
--                            before a live one can be found (the client
--                            goes on with heartbeat calls)
--   {0} or {0, dropped, more}
--                            refused: the caller does not own the lock;
--                            if nobody does (the caller's lease ran out),
--                            the oldest live waiter found within the scan
--                            bound is made the owner and woken by
--                            message, as a heartbeat would, and the dead
--                            waiters purged looking for it are reported
--                            as above (`more`: none found yet)
--
-- Cost: 5 commands with nobody waiting (GET, ZRANGE, DEL, GET and SET
-- freed); 10 for a handoff to a live head in another process (GET,
-- ZRANGE, TIME, ZSCORE alive, SET seq, ZREM, SET owner, PUBLISH, GET and
-- SET freed), 9 in the caller's. Both are answered by fast_paths/release.lua, which runs first;
-- this script answers the rest (a dead or malformed head, a caller that
-- is not the owner, a resend).
-- Owner-only: anyone but the owner changes nothing but what a heartbeat
-- would (a free lock goes to its oldest live waiter). Idempotent: a resent
-- release by an owner id among the lock's last 8 releases
-- (includes/releases.lua) answers {1, 0, 0, "", 0, 0} and changes nothing
-- but the TTL of the record of those releases.

-- `owner_id`, `value` (the owner key's value) and `first` (the queue's
-- oldest entry, if the caller owns the lock) are read by the fast path.
local holder = parse_owner(value)
if holder ~= owner_id then
  local resent, kept = released_lately(KEYS[5], owner_id)
  if resent then
    -- A resend. The record is written again (same value, a fresh TTL),
    -- so that a WAIT on the resending connection, which may be a new one
    -- after a reconnect, covers the release it stands for.
    redis.call('SET', KEYS[5], kept, 'PX', ARGV[2])
    return {1, 0, 0, '', 0, 0}
  end
  if ARGV[6] == 'again' then
    -- Answered released once already: 8 or more later releases may have
    -- pushed it out of the record above. A write that changes no value
    -- (the counter, renewed at every grant, gets its idle TTL again), so
    -- that a WAIT after this covers the state this server is in.
    if redis.call('PEXPIRE', KEYS[4], ARGV[2]) == 0 then
      record_release(KEYS[5], owner_id, ARGV[2])
    end
    return {1, 0, 0, '', 0, 0}
  end
  -- A release that comes after its lease ran out finds the lock free: it
  -- goes to the next live waiter now, not at the next heartbeat. Not if
  -- the caller is itself queued (an owner id of a waiter): the lock would
  -- go to the caller, and a resend of this release would then free it.
  if not holder and not redis.call('ZSCORE', KEYS[2], owner_id) then
    local _, _, dropped, more = grant_next(ARGV[2], ARGV[3], tonumber(ARGV[4]), '')
    if dropped > 0 or more then
      return {0, dropped, more and 1 or 0}
    end
  end
  return {0}
end

local next_owner, token, dropped, more, unheard =
  release_and_hand_on(owner_id, ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], first)
return {1, dropped, more and 1 or 0, next_owner or '', token, unheard and 1 or 0}
