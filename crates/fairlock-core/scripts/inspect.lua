-- inspect.lua: read-only snapshot of one lock, for operators and tests.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
--
-- Reply: {owner or "", token, pttl, queue_len, last_token, last_ticket}
--   token is the holder's fencing token (0 when free); pttl -2 when free.

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

return {
  redis.call('HGET', KEYS[1], 'id') or '',
  tonumber(redis.call('HGET', KEYS[1], 'token') or 0),
  redis.call('PTTL', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  tonumber(redis.call('HGET', KEYS[4], 'token') or 0),
  tonumber(redis.call('HGET', KEYS[4], 'ticket') or 0),
}
