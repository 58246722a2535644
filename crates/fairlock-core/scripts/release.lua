-- release.lua: the owner frees the lock; in the same script the oldest live
-- waiter becomes the owner (direct handoff) and is woken.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
-- ARGV[1] member          the releasing owner
-- ARGV[2] grant_lease_ms  lease of the handed-on lock until its new owner confirms
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
--
-- Replies:
--   {1, handed_on, evicted, next, token}  released; handed_on is 1 if a waiter
--                            now owns it: member `next` with fencing `token`
--                            (so a releaser in the same process can wake it
--                            without waiting for pub/sub)
--   {0}                      refused: the caller does not own the lock
--
-- Owner-only: anyone but the owner changes nothing. Idempotent: a resent
-- release by the member that freed the lock last answers {1, 0, 0} again.

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

local member = ARGV[1]
if redis.call('HGET', KEYS[1], 'id') ~= member then
  if redis.call('HGET', KEYS[4], 'freed') == member then
    return {1, 0, 0}
  end
  return {0}
end

local next_owner, evicted = release_and_hand_on(member, tonumber(ARGV[2]), ARGV[3])
if next_owner then
  return {1, 1, evicted, next_owner, tonumber(redis.call('HGET', KEYS[1], 'token'))}
end
return {1, 0, evicted}
