-- cancel.lua: a waiter gives up (timeout, or its future was dropped). It
-- leaves the queue; if a grant raced the cancellation, the lock is passed
-- on at once.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] owner_id        the waiter giving up
-- ARGV[2] idle_ms         TTL of the seq and freed keys
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
--
-- Reply: {was_queued, was_owner, dropped, more}
--
-- Idempotent: a second run finds nothing to remove and changes nothing
-- (an owner id is never queued again once it gave up).

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('cancel', true, 5)
if other_family then
  return other_family
end

local owner_id = ARGV[1]
local holder = parse_owner(redis.call('GET', KEYS[1]))
local was_queued = redis.call('ZREM', KEYS[2], owner_id)
if holder ~= owner_id then
  return {was_queued, 0, 0, 0}
end
local _, _, dropped, more = release_and_hand_on(owner_id, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
return {was_queued, 1, dropped, more and 1 or 0}
