-- inspect.lua: read-only snapshot of one lock, for operators and tests.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] limit   how many waiters from the head to list
--
-- Reply: {holder, token, pttl, queue_len, last_seq, now_ms, waiters...}
--   holder "" and token 0 when free; pttl -2 when free; last_seq is the
--   last token or ticket issued (0 if the counter expired); then for each
--   listed waiter, oldest first: owner id, ticket, its process's deadline
--   (ms of server time, -1 if the process is not alive there)

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('inspect', true, 5)
if other_family then
  return other_family
end

local held = redis.call('GET', KEYS[1])
if foreign_owner(held) then
  return foreign_owner_error()
end
local holder, token = parse_owner(held)
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local reply = {
  holder or '',
  token,
  redis.call('PTTL', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  tonumber(redis.call('GET', KEYS[4]) or '0') or 0,
  now_ms,
}
local limit = tonumber(ARGV[1])
if limit > 0 then
  local waiters = redis.call('ZRANGE', KEYS[2], 0, limit - 1, 'WITHSCORES')
  for i = 1, #waiters, 2 do
    local owner_id = waiters[i]
    local ticket = tonumber(waiters[i + 1])
    -- An entry fairlock did not write (a member that is no owner id, a
    -- score that is no ticket) is left out: the next caller drops it.
    -- Listed, it failed the whole reply's decoding.
    if parse_owner_id(owner_id) and ticket and ticket >= 0 and ticket < 2 ^ 64 then
      local deadline = tonumber(redis.call('ZSCORE', KEYS[3], tag_of(owner_id)) or '-1')
      if not deadline or deadline < 0 or deadline >= 2 ^ 53 then
        -- Not alive, or alive for ever (no heartbeat writes that).
        deadline = -1
      end
      reply[#reply + 1] = owner_id
      reply[#reply + 1] = digits(ticket)
      reply[#reply + 1] = deadline
    end
  end
end
return reply
