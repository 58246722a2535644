-- fast_paths/draw.lua: the sequence number the fast paths draw, defined
-- before them. It is includes/common.lua's next_seq without its repairs,
-- for scripts that must answer before the shared helpers are defined: one
-- closure instead of about 25.
--
-- fast_draw(t, now, idle_ms): `t` is TIME's reply and `now` the same time
-- in microseconds. Draws the next number of the lock's sequence (the
-- clock, or one above the counter if that is ahead) and writes it to the
-- counter, as next_seq does: a counter that is new, not a number, or more
-- than a day ahead (garbage) starts again at the clock with the idle TTL;
-- otherwise it keeps its TTL. Returns true, the number, its digits and the
-- value it replaced (false if none), so a caller can put it back; or false
-- with nothing written if the counter has a foreign type (the full script
-- repairs it) or the write failed (the full script raises the error).
local function fast_draw(t, now, idle_ms)
  local seq_str = t[1] .. string.sub('00000' .. t[2], -6)
  local previous = redis.pcall('SET', KEYS[4], seq_str, 'GET', 'KEEPTTL')
  if type(previous) == 'table' then
    return false
  end
  local seq, last = now, tonumber(previous)
  if not last or last > now + 86400 * 1000000 then
    redis.call('PEXPIRE', KEYS[4], idle_ms)
  elseif last >= now then
    seq = last + 1
    seq_str = string.format('%.0f', seq)
    redis.call('SET', KEYS[4], seq_str, 'KEEPTTL')
  end
  return true, seq, seq_str, previous
end
