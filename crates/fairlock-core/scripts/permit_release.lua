-- permit_release.lua: a holder gives its permit back; in the same script
-- the permit goes to as many live waiters at the head of the queue as now
-- fit (direct handoff), each woken on its process's channel.
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] owner_id        the releasing holder
-- ARGV[2] idle_ms         TTL of the seq key
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
-- ARGV[5] remember_ms     how long the release is remembered (alive holds
--                         owner id -> server ms it is forgotten at), so that
--                         a resend of it is recognised
--
-- Replies:
--   {1, dropped, more, owner_id_1, token_1, unheard_1, ...}  released; the
--                owner ids now holding by this release and their tokens, so
--                a releaser in the same process can wake them without
--                waiting for pub/sub; unheard: 1 if that grant's message
--                reached nobody and its lease was cut to the waiter TTL
--                (whoever wakes it must set its lease); more: 1 if
--                entries are left to look at (the client goes on with
--                heartbeat calls)
--   {0} or {0, dropped, more}
--                refused: the caller holds no live permit and no release
--                of it is remembered (its lease ran out, or it never
--                held); permits that expired leases freed go to live
--                waiters that now fit (those found within the scan
--                bound), woken by message, as a heartbeat would, and the
--                dead waiters purged looking for them are reported as
--                above
--
-- Holder-only. Idempotent: a resent release (fred and the client send a
-- call again when its connection dropped after it was written) finds the
-- record of the release that ran and answers {1, 0, 0}: released, nothing
-- handed on by this run (the first run's grants were published), and
-- nothing changed but the record's deadline. It never touches a later
-- holder.
--
-- Cost with nobody waiting: 11 commands while earlier releases are still
-- remembered, 12 on a fresh set, 13 when expired records are removed and
-- alive's TTL is extended (under a steady stream of releases one record
-- expires per release and the TTL is extended once per remember_ms: 12);
-- 21 to hand the permit to a waiter of another process. Remembering costs
-- a ZADD and a PTTL, and a ZREM and a PEXPIRE when due; the limit is read
-- once, not twice. Before releases were remembered a release ran 10 and
-- 20 (permit_model.rs: commands_per_permit_release).

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('permit_release', false, 5)
if other_family then
  return other_family
end

local owner_id = ARGV[1]
local remember_ms = tonumber(ARGV[5])
-- Checked before anything is read or written: a process tag taken for an
-- owner id would be read as a release record (alive holds both), and a
-- remember_ms PEXPIRE refuses would fail the script after its writes.
if not parse_permit_owner_id(owner_id) then
  return redis.error_reply('ERR fairlock permit release: malformed owner id ' .. owner_id)
end
if not string.match(ARGV[5], '^[1-9]%d*$') or #ARGV[5] > 8 or remember_ms > 86400000 then
  return redis.error_reply('ERR fairlock permit release: remember_ms must be 1 to 86400000, got ' ..
    ARGV[5])
end
local now = now_us()
local now_ms = math.floor(now / 1000)
local deadline = read_key(1, 'ZSCORE', owner_id)
read_key(2, 'ZCARD')
-- The type check of alive also finds the entries whose deadline passed (dead
-- processes, forgotten releases): at most two are removed per release, one
-- more than each release adds, so records never pile up even when no
-- heartbeat runs (nobody waits).
local stale = read_key(3, 'ZRANGEBYSCORE', '-inf', '(' .. digits(now_ms), 'LIMIT', 0, 2)
local stored = read_key(5, 'HGET', 'limit')

-- Records the release of `owner_id` until remember_ms from now. alive is
-- kept at least that long; when it is extended, to twice that, so the
-- releases that follow within remember_ms need no PEXPIRE.
local function remember()
  redis.call('ZADD', KEYS[3], digits(now_ms + remember_ms), owner_id)
  local ttl = redis.call('PTTL', KEYS[3])
  if ttl == -1 or ttl < remember_ms then
    redis.call('PEXPIRE', KEYS[3], 2 * remember_ms)
  end
end

if not deadline or tonumber(deadline) <= now_ms then
  local released = tonumber(redis.call('ZSCORE', KEYS[3], owner_id))
  if released and released >= now_ms then
    -- A resend. The record is written again (a later deadline) so that a
    -- WAIT on the resending connection, which may be a new one after a
    -- reconnect, covers the release it stands for.
    remember()
    return {1, 0, 0}
  end
  -- A release that comes after its lease ran out: the permit it held (and
  -- any other that expired) goes on now, not at the next heartbeat. Not if
  -- the caller is itself queued (an owner id of a waiter): the permit could
  -- go to the caller, and a resend of this release would then free it.
  if not redis.call('ZSCORE', KEYS[2], owner_id) then
    expire_holders(now_ms)
    local _, dropped, more = grant_waiting(now, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), stored)
    if dropped > 0 or more then
      return {0, dropped, more and 1 or 0}
    end
  end
  return {0}
end
redis.call('ZREM', KEYS[1], owner_id)
redis.call('HDEL', KEYS[5], owner_id)
if #stale > 0 then
  redis.call('ZREM', KEYS[3], unpack(stale))
end
remember()
expire_holders(now_ms)
local granted, dropped, more = grant_waiting(now, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), stored)
local reply = {1, dropped, more and 1 or 0}
for _, value in ipairs(granted) do
  reply[#reply + 1] = value
end
return reply
