-- redlock_renew.lua: renew one primary's vote.
--
-- KEYS[1] owner    string  the member of the holder on this primary
-- ARGV[1] member           the holder's owner id
-- ARGV[2] lease_ms         the new lease, from now
--
-- Reply: 1 if the key is the member's and now has the new lease, 0 if not
-- (expired, lost in a restart, or someone else's; nothing changed).
--
-- Cost: O(1). Idempotent.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
