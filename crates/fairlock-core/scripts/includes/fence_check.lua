-- includes/fence_check.lua: the check every fenced write runs first.
--
-- KEYS[1] is the resource's fence key, a string holding the newest fencing
-- token that has written to the resource; ARGV[1] is the writer's token.
-- A token older than the newest is refused; an equal or newer one is
-- recorded and may write. Returns nil when the write may go ahead, or the
-- reply to send back.
local function fence_check()
  local kind = redis.call('TYPE', KEYS[1]).ok
  if kind ~= 'none' and kind ~= 'string' then
    return redis.error_reply('WRONGTYPE fairlock fence key ' .. KEYS[1] .. ' holds a ' ..
      kind .. ' where a string was expected')
  end
  local token = tonumber(ARGV[1])
  if not token then
    return redis.error_reply('ERR fairlock fencing token must be an integer, got ' .. tostring(ARGV[1]))
  end
  local newest = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
  if token < newest then
    return {0, newest}
  end
  if token > newest then
    redis.call('SET', KEYS[1], ARGV[1])
  end
  return nil
end
