-- heartbeat.lua: one call per lock per interval for all of one process's
-- waiters on that lock. Moves the process's deadline forward, forgets dead
-- processes, grants the lock if its holder vanished, and tells each waiter
-- where it is, so a lost pub/sub message or a queue lost in a failover
-- heals here.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
-- ARGV[1] waiter_ttl_ms   new deadline offset for the process of these waiters
-- ARGV[2] queue_ttl_ms    TTL of the queue keys
-- ARGV[3] grant_lease_ms  lease of a lock handed to a waiter
-- ARGV[4] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[5..] members       this process's waiters on this lock (one client tag)
--
-- Reply: {evicted, pttl, status_1, token_1, status_2, token_2, ...}
--   status 0 missing (not queued: re-enqueue), 1 queued, 2 owns the lock (token)
--   pttl is the owner's remaining lease (-2 when free)
--
-- Cost: O(m log N) for m members, plus O(k log N) for k dead processes
-- forgotten (at most 64 per call) and dead waiters skipped at the head.
-- Waiters of dead processes elsewhere in the queue are dropped when they
-- reach the head. Idempotent apart from the deadline.

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

local now = now_ms()
local waiter_ttl_ms = tonumber(ARGV[1])
local queued = {}
local any_queued = false
for i = 5, #ARGV do
  local member = ARGV[i]
  if redis.call('ZSCORE', KEYS[2], member) then
    queued[member] = true
    any_queued = true
  end
end
if any_queued then
  redis.call('ZADD', KEYS[3], now + waiter_ttl_ms, client_of(ARGV[5]))
end

-- Processes whose deadline passed are dead; their waiters are skipped.
local evicted = 0
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now, 'LIMIT', 0, 64)
for _, tag in ipairs(dead) do
  redis.call('ZREM', KEYS[3], tag)
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  local _, more = grant_next(now, tonumber(ARGV[3]), ARGV[4])
  evicted = evicted + more
end

if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]))
end

local owner = redis.call('HGET', KEYS[1], 'id')
local token = tonumber(redis.call('HGET', KEYS[1], 'token'))
local reply = {evicted, redis.call('PTTL', KEYS[1])}
for i = 5, #ARGV do
  local member = ARGV[i]
  if member == owner then
    table.insert(reply, 2)
    table.insert(reply, token)
  elseif queued[member] and redis.call('ZSCORE', KEYS[2], member) then
    table.insert(reply, 1)
    table.insert(reply, 0)
  else
    table.insert(reply, 0)
    table.insert(reply, 0)
  end
end
return reply
