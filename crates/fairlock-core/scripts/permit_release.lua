-- permit_release.lua: a holder gives its permit back; in the same script
-- the permit goes to as many live waiters at the head of the queue as now
-- fit (direct handoff), each woken on its process's channel.
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] owner_id        the releasing holder
-- ARGV[2] idle_ms         TTL of the seq key
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
--
-- Replies:
--   {1, dropped, more, owner_id_1, token_1, unheard_1, ...}  released; the
--                owner ids now holding by this release and their tokens, so
--                a releaser in the same process can wake them without
--                waiting for pub/sub; unheard: 1 if that grant's message
--                reached nobody and its lease was cut to the waiter TTL
--                (whoever wakes it must set its lease); more: 1 if
--                entries are left to look at (the client goes on with
--                heartbeat calls)
--   {0}          refused: the caller holds no live permit; permits that
--                expired leases freed go to live waiters that now fit,
--                woken by message, as a heartbeat would
--
-- Holder-only. A resent release finds no permit and answers {0}; it never
-- touches a later holder.

local owner_id = ARGV[1]
local deadline = read_key(1, 'ZSCORE', owner_id)
read_key(2, 'ZCARD')
read_key(3, 'ZCARD')
read_key(5, 'HGET', 'limit')
local now = now_us()
local now_ms = math.floor(now / 1000)
if not deadline or tonumber(deadline) <= now_ms then
  -- A release that comes after its lease ran out: the permit it held (and
  -- any other that expired) goes on now, not at the next heartbeat. Not if
  -- the caller is itself queued (an owner id of a waiter): the permit could
  -- go to the caller, and a resend of this release would then free it.
  if not redis.call('ZSCORE', KEYS[2], owner_id) then
    expire_holders(now_ms)
    grant_waiting(now, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
  end
  return {0}
end
redis.call('ZREM', KEYS[1], owner_id)
redis.call('HDEL', KEYS[5], owner_id)
expire_holders(now_ms)
local granted, dropped, more = grant_waiting(now, tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
local reply = {1, dropped, more and 1 or 0}
for _, value in ipairs(granted) do
  reply[#reply + 1] = value
end
return reply
