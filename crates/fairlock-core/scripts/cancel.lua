-- cancel.lua: a waiter gives up (timeout, or its future was dropped). It
-- leaves the queue; if a grant raced the cancellation, the lock is passed on
-- at once instead of waiting for the grant lease to run out.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
-- ARGV[1] member          the waiter giving up
-- ARGV[2] grant_lease_ms  lease of the handed-on lock
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
--
-- Reply: {was_queued, was_owner, evicted}
--
-- Idempotent: a second run finds nothing to remove and changes nothing.

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

local member = ARGV[1]
local was_queued = redis.call('ZREM', KEYS[2], member)

if redis.call('HGET', KEYS[1], 'id') ~= member then
  return {was_queued, 0, 0}
end
local _, evicted = release_and_hand_on(member, tonumber(ARGV[2]), ARGV[3])
return {was_queued, 1, evicted}
