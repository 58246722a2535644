-- redlock_renew.lua: renew one primary's vote.
--
-- The holder renews while its validity lasts, so it holds a majority: a
-- primary where its key is missing (expired, or lost in a restart) but
-- free gives it the key again, which only strengthens the hold. Without
-- that, a holder whose majority included a primary that died would lose
-- the lock at its next renewal although nobody else could have won it.
--
-- KEYS[1] owner    string  the owner id of the holder on this primary
-- ARGV[1] owner_id         the holder's owner id
-- ARGV[2] lease_ms         the new lease, from now
--
-- Reply: 1 if the key is the owner id's and now has the new lease, 0 if
-- another owner id holds it (nothing changed).
--
-- Cost: O(1). Idempotent.

if not ms_in_range(ARGV[2], REDLOCK_MAX_LEASE_MS) then
  return redis.error_reply('ERR fairlock redlock renew: lease must be 1 to 86400000 ms, got ' ..
    tostring(ARGV[2]))
end
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
