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

-- A token is a number Lua holds exactly (at most 2^53, compared as
-- digits: 2^53 + 1 reads as 2^53), and the TTL 1 ms to a year (0 would
-- delete the counter the reply describes).
local token = tonumber(ARGV[1])
if not string.match(ARGV[1], '^%d+$') or #ARGV[1] > 16
    or (#ARGV[1] == 16 and ARGV[1] > '9007199254740992') then
  return redis.error_reply('ERR fairlock redlock fence: token must be 0 to 2^53 (9007199254740992), got ' ..
    ARGV[1])
end
if not ms_in_range(ARGV[2], 31536000000) then
  return redis.error_reply('ERR fairlock redlock fence: idle TTL must be 1 to 31536000000 ms, got ' ..
    tostring(ARGV[2]))
end
local current = read_seq(KEYS[1], now_us())
if current and current >= token then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return digits(current)
end
redis.call('SET', KEYS[1], digits(token), 'PX', ARGV[2])
return digits(token)
