-- includes/redlock_common.lua: helpers of the RedLock scripts (redlock_*.lua).
--
-- RedLock keeps, on each of N independent primaries, two keys per lock
-- under the same hash tag as the fair lock's keys (with the RedLock key
-- prefix, `fairlock:redlock:` by default, so the two modes never share a
-- key):
--   owner  string  the owner id (a nonce) that this primary voted for; TTL = lease
--   seq    string  the last fencing token a grant wrote back here

-- Lua 5.1 prints large numbers in exponent form; Redis wants digits.
local function digits(n)
  return string.format('%.0f', n)
end

-- `text` as a number of ms if it is 1 to `max`, written in plain digits;
-- else nil. Checked before a script's first write: a lease or TTL Redis
-- refuses, or one of ages, is an error with nothing changed.
local function ms_in_range(text, max)
  if type(text) ~= 'string' or not string.match(text, '^[1-9]%d*$') or #text > 15 then
    return nil
  end
  local ms = tonumber(text)
  if ms > max then
    return nil
  end
  return ms
end

-- The longest lease a RedLock holder may ask for: a day, as a fair lock's.
local REDLOCK_MAX_LEASE_MS = 86400000

local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- A counter more than a day ahead of the server clock was not written by
-- fairlock (tokens move 1 us per grant above the clock at most): ignore it.
local SEQ_AHEAD_LIMIT_US = 86400 * 1000000

-- The counter as a number, or nil if missing or not a counter fairlock
-- wrote (a foreign type or value is ignored and overwritten by the next
-- grant's write-back: the counter is disposable thanks to the clock floor).
local function read_seq(key, now)
  local value = redis.pcall('GET', key)
  if type(value) ~= 'string' then
    return nil
  end
  local n = tonumber(value)
  if n and n <= now + SEQ_AHEAD_LIMIT_US then
    return n
  end
  return nil
end
