-- permit_heartbeat.lua: one call per permit set per interval for one
-- process, however many of its tasks wait there. Moves the process's
-- deadline forward, forgets dead processes, returns the permits of holders
-- whose lease ran out, grants the waiters that fit, and says whether the
-- process's oldest waiter is still queued. With no probe it only hands
-- free permits on: clients use that to go on after a call reported more.
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] tag             the calling process's client tag
-- ARGV[2] waiter_ttl_ms   new deadline offset for the process
-- ARGV[3] queue_ttl_ms    TTL of the queue keys
-- ARGV[4] idle_ms         TTL of the seq key
-- ARGV[5] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[6] probe           the process's oldest waiter on this set, or ""
--
-- The process's deadline moves on when the probe is queued or holds a
-- permit (it was granted while this call was on its way: the client
-- probes with its oldest waiter, the next to be granted).
--
-- Reply: {probe_queued, dropped, more, probe_holds}
--   probe_queued 0 and probe_holds 0: the probe is neither queued nor
--   holding (dropped, or granted and released already): if it still
--   waits, the process has each of its waiters run permit_acquire again,
--   which answers a grant or keeps or retakes a place.
--   probe_holds 1: the probe holds a permit; if its task still waits (the
--   grant's message was lost or is on its way), only the probe runs
--   permit_acquire again.

local tag = ARGV[1]
local probe = ARGV[6]
read_key(1, 'ZCARD')
local queued = false
if probe ~= '' then
  queued = read_key(2, 'ZSCORE', probe)
else
  read_key(2, 'ZCARD')
end
read_key(3, 'ZCARD')
local stored = read_key(5, 'HGET', 'limit')
local now = now_us()
local now_ms = math.floor(now / 1000)
-- A holder whose lease ran out (not yet removed below) holds nothing.
local holds = false
if probe ~= '' and not queued then
  local deadline = tonumber(redis.call('ZSCORE', KEYS[1], probe))
  holds = deadline ~= nil and deadline > now_ms
end
local probe_queued = queued and 1 or 0
if queued or holds then
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[2]), tag)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[3]))
end

-- Processes whose deadline passed are dead, and releases past their time
-- are forgotten: remove a bounded batch.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now_ms, 'LIMIT', 0, 32)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
end

expire_holders(now_ms)
local _, dropped, more = grant_waiting(now, tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[2]), stored)
return {probe_queued, dropped, more and 1 or 0, holds and 1 or 0}
