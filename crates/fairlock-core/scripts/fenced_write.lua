-- fenced_write.lua: apply one write (or a read that decides a write) to a
-- resource that lives in Redis only if the caller's fencing token is newer
-- than the newest token the resource has seen, or that same token from the
-- same holder. A holder paused past
-- its lease carries an old token, so its late write is refused instead of
-- clobbering a newer holder's. A fenced read records the token too, so once
-- a newer holder has read, an older one can no longer write.
--
-- KEYS[1] fence   string "<token> <holder>": the newest token this resource
--                 has seen and who carried it
-- KEYS[2] target  the key written
-- ARGV[1] token   the writer's fencing token
-- ARGV[2] holder  the writer's owner id
-- ARGV[3] op      "set" | "hset" | "incrby" | "get" | "hget"
-- ARGV[4..]       set: value;  hset: field, value;  incrby: delta;  hget: field
--
-- Replies:
--   {1, result}   applied; result is the command's reply
--   {0, newest}   refused: a newer token has written; nothing changed
--
-- Idempotent for set and hset; an incrby resent with the same token is
-- applied again (the token alone cannot tell a resend from a second write).

local expected = ({set = 'string', hset = 'hash', incrby = 'string',
                   get = 'string', hget = 'hash'})[ARGV[3]]
if not expected then
  return redis.error_reply('ERR fairlock fenced write: unknown op ' .. tostring(ARGV[3]))
end
local kind = redis.call('TYPE', KEYS[2]).ok
if ARGV[3] ~= 'set' and kind ~= 'none' and kind ~= expected then
  return redis.error_reply('WRONGTYPE fairlock fenced write target ' .. KEYS[2] .. ' holds a ' ..
    kind .. ' where a ' .. expected .. ' was expected')
end

local refused, record = fence_check()
if refused then return refused end

local result
if ARGV[3] == 'set' then
  result = redis.call('SET', KEYS[2], ARGV[4])
elseif ARGV[3] == 'hset' then
  result = redis.call('HSET', KEYS[2], ARGV[4], ARGV[5])
elseif ARGV[3] == 'get' then
  result = redis.call('GET', KEYS[2])
elseif ARGV[3] == 'hget' then
  result = redis.call('HGET', KEYS[2], ARGV[4])
else
  result = redis.call('INCRBY', KEYS[2], ARGV[4])
end
record()
return {1, result}
