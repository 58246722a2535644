-- fast_paths/acquire.lua: the common case of acquire.lua, a free lock that
-- nobody waits for, granted before the helpers of includes/common.lua are
-- defined. Redis builds those helpers, about 25 closures, on every call,
-- and with the pattern matches and tables the full script uses they cost
-- it as much time as the commands of an uncontended grant; this path
-- needs none of them (its ZCARD and EXISTS replace the full script's
-- SET NX GET, so it can decide before writing anything).
--
-- It answers only where the full script would answer the same: a grant
-- {1, token}, with the counter and the owner key written as next_seq and
-- the full script write them. Anything else (a held lock, waiters, an
-- owner id the full script would refuse, a counter of a foreign type) falls
-- through to the full script below with Redis as it found it.
--
-- `waiting`, the queue's length, is read here once for both.
local waiting = redis.call('ZCARD', KEYS[2])
if waiting == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  -- The lease, as parse_owner_id reads it and usable accepts it (1 ms to a
  -- day; a leading zero is refused).
  local fast_lease = string.match(ARGV[1], '^%x+%.%x+%.([1-9]%d*)$')
  if fast_lease and tonumber(fast_lease) <= 86400000 then
    -- next_seq, inline: the server clock in microseconds, or one above the
    -- counter if that is ahead; a counter that is new, not a number or more
    -- than a day ahead (garbage) is started again at the clock, with the
    -- idle TTL.
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local seq_str = t[1] .. string.sub('00000' .. t[2], -6)
    local previous = redis.pcall('SET', KEYS[4], seq_str, 'GET', 'KEEPTTL')
    if type(previous) ~= 'table' then
      local seq, last = now, tonumber(previous)
      if not last or last > now + 86400 * 1000000 then
        redis.call('PEXPIRE', KEYS[4], ARGV[5])
      elseif last >= now then
        seq = last + 1
        seq_str = string.format('%.0f', seq)
        redis.call('SET', KEYS[4], seq_str, 'KEEPTTL')
      end
      redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. seq_str, 'PX', fast_lease)
      return {1, seq}
    end
    -- An error reply wrote nothing: the full script repairs a foreign type
    -- or raises the error.
  end
end
