-- force_release.lua: ADMIN ONLY. Frees the lock whoever holds it and hands it
-- to the oldest live waiter. The evicted holder is not told directly; its
-- next renewal finds the lock gone and fires its lease-lost signal.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
-- ARGV[1] grant_lease_ms  lease of the handed-on lock
-- ARGV[2] channel_prefix  waiters are woken on channel_prefix .. client tag
--
-- Reply: {had_owner, handed_on, evicted}

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

-- `freed` is deliberately not set: the evicted holder's own release must be
-- refused (NotOwner), not taken for a resend of a release it never made.
local owner = redis.call('HGET', KEYS[1], 'id')
if owner then
  redis.call('DEL', KEYS[1])
end
local next_owner, evicted = grant_next(now_ms(), tonumber(ARGV[1]), ARGV[2])
return {owner and 1 or 0, next_owner and 1 or 0, evicted}
