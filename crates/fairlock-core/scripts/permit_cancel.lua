-- permit_cancel.lua: a waiter gives up (timeout, or its future was
-- dropped). It leaves the queue; a permit that raced the cancellation is
-- given back; and the waiters that now fit are granted (a writer that gave
-- up lets the readers behind it in).
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] owner_id        the waiter giving up
-- ARGV[2] idle_ms         TTL of the seq key
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
--
-- Reply: {was_queued, was_holder, dropped, more}
--
-- Idempotent: a second run finds nothing to remove (an owner id is never
-- queued again once it gave up).

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('permit_cancel', false, 5)
if other_family then
  return other_family
end

local owner_id = ARGV[1]
local deadline = read_key(1, 'ZSCORE', owner_id)
read_key(2, 'ZCARD')
read_key(3, 'ZCARD')
local stored = read_key(5, 'HGET', 'limit')
local now = now_us()
local now_ms = math.floor(now / 1000)
local was_queued = redis.call('ZREM', KEYS[2], owner_id)
local was_holder = 0
if deadline then
  redis.call('ZREM', KEYS[1], owner_id)
  redis.call('HDEL', KEYS[5], owner_id)
  if tonumber(deadline) > now_ms then
    was_holder = 1
  end
end
expire_holders(now_ms)
local _, dropped, more = grant_waiting(now, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), stored)
return {was_queued, was_holder, dropped, more and 1 or 0}
