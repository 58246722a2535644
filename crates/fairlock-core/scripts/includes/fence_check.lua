-- includes/fence_check.lua: the check every fenced write runs first.
--
-- KEYS[1] is the resource's fence key, a string "<token> <holder>": the
-- newest fencing token that used the resource and the holder (owner id)
-- that carried it. ARGV[1] is the caller's token, ARGV[2] its holder id.
-- A token older than the newest is refused. An equal token is accepted
-- only from the same holder: two holders can never both write with one
-- token. A newer token may go ahead. Returns the reply to send back when
-- refused; else nil and the function that records the token, called once
-- the operation has succeeded: an operation Redis refuses (an INCRBY of a
-- value that is no integer) raises before it, and leaves the fence as it
-- was (a script is not rolled back: a record written first stayed).
local function fence_check()
  local token = tonumber(ARGV[1])
  if not token or token < 0 or string.find(ARGV[1], '^%d+$') == nil then
    return redis.error_reply('ERR fairlock fencing token must be a non-negative integer, got ' ..
      tostring(ARGV[1]))
  end
  -- Tokens are compared as Lua numbers, exact up to 2^53 (fairlock's follow
  -- the server clock in microseconds, below it for centuries); a larger
  -- one would be rounded, or recorded as a value no later call can read.
  -- Compared as digits: 2^53 + 1 itself reads as 2^53 in Lua.
  if #ARGV[1] > 16 or (#ARGV[1] == 16 and ARGV[1] > '9007199254740992') then
    return redis.error_reply('ERR fairlock fencing token must be at most 2^53 (9007199254740992), got ' ..
      ARGV[1])
  end
  if ARGV[2] == nil or ARGV[2] == '' or string.find(ARGV[2], '%s') then
    return redis.error_reply('ERR fairlock fenced write needs the holder id after the token')
  end
  local stored = redis.pcall('GET', KEYS[1])
  if type(stored) == 'table' and stored.err then
    return redis.error_reply('WRONGTYPE fairlock fence key ' .. KEYS[1] ..
      ' holds a value of another type where a string was expected')
  end
  local newest, holder = 0, ''
  if stored then
    -- Only a record fairlock wrote: another value ("hello", or a data key
    -- named by mistake holding "100") was once read as a token and
    -- overwritten.
    local t, h = string.match(stored, '^(%d+) (%S+)$')
    if not t or #t > 18 then
      return redis.error_reply('WRONGTYPE fairlock fence key ' .. KEYS[1] ..
        ' holds a value fairlock did not write (not "<token> <holder>")')
    end
    newest, holder = tonumber(t), h
  end
  if token < newest or (token == newest and holder ~= ARGV[2]) then
    return {0, newest}
  end
  local fence, record, newer = KEYS[1], ARGV[1] .. ' ' .. ARGV[2], token > newest
  return nil, function()
    if newer then
      redis.call('SET', fence, record)
    end
  end
end
