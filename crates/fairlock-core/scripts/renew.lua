-- renew.lua: the owner sets its lease to lease_ms from now. Used by the
-- watchdog, by extend(), and by a waiter confirming a handed-on grant.
--
-- KEYS[1] owner
-- ARGV[1] member     the owner
-- ARGV[2] lease_ms   the new lease, from now (server time)
--
-- Replies:
--   {1, token}   renewed
--   {0}          refused: the lock is gone or owned by someone else (lease lost)
--
-- Idempotent: renewing twice sets the same lease.

local err = check_types({'hash'})
if err then return err end

if redis.call('HGET', KEYS[1], 'id') ~= ARGV[1] then
  return {0}
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return {1, tonumber(redis.call('HGET', KEYS[1], 'token'))}
