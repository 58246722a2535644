-- redlock_fence.lua: raise one primary's fencing counter to a grant's token.
--
-- A RedLock grant takes max(floors of the majority it won) + 1 as its
-- token and writes it back to that majority with this script, so any later
-- majority (which overlaps this one) starts above it.
--
-- KEYS[1] seq    string  the last fencing token issued on this primary
-- ARGV[1] token          the grant's token
-- ARGV[2] idle_ms        TTL of the counter; losing it is safe, the next
--                        grant's floor is the server clock in us
--
-- Reply: the counter after the call, max(current, token).
--
-- Cost: O(1). Never lowers the counter, so a resend or a late write of an
-- older grant changes nothing.

local token = tonumber(ARGV[1])
local current = read_seq(KEYS[1], now_us())
if current and current >= token then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return digits(current)
end
redis.call('SET', KEYS[1], digits(token), 'PX', ARGV[2])
return digits(token)
