-- heartbeat.lua: one call per lock per interval for one process, however
-- many of its tasks wait there. Moves the process's deadline forward,
-- forgets dead processes, grants the lock if its holder vanished, and
-- tells the process who holds the lock and whether its oldest waiter is
-- still queued, so a lost pub/sub message, an orphaned grant or a queue
-- lost in a fail-over heals here. With no probe it only hands a free lock
-- on: clients use that to go on purging dead waiters.
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] tag             the calling process's client tag
-- ARGV[2] waiter_ttl_ms   new deadline offset for the process
-- ARGV[3] queue_ttl_ms    TTL of the queue keys
-- ARGV[4] idle_ms         TTL of the seq and freed keys
-- ARGV[5] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[6] probe           the process's oldest waiter on this lock, or ""
--
-- The process's deadline moves on when the probe is queued or holds the lock.
--
-- Reply: {holder, token, probe_queued, dropped, more}
--   holder and token of the lock after this call ("" and 0 when free);
--   probe_queued 1 if the probe is in the queue (if 0, the process checks
--   each of its waiters by running acquire again, which is idempotent)
--
-- Cost: about 8 commands, whatever the number of the process's waiters;
-- at most 32 dead processes are forgotten per call.

local tag = ARGV[1]
local probe = ARGV[6]
local held = redis.call('GET', KEYS[1])
local probe_queued = 0
if probe ~= '' and redis.call('ZSCORE', KEYS[2], probe) then
  probe_queued = 1
end
-- A probe that holds the lock was granted while this call was on its way
-- (the client probes with its oldest waiter, the next to be granted): its
-- process is alive all the same.
local probe_holds = probe ~= '' and held and parse_owner(held) == probe
local now_ms = math.floor(now_us() / 1000)
if probe_queued == 1 or probe_holds then
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[2]), tag)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[3]))
end

-- Processes whose deadline passed are dead: forget a bounded batch.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now_ms, 'LIMIT', 0, 32)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
end

local dropped, more = 0, false
if not held then
  local next_owner, token
  next_owner, token, dropped, more = grant_next(tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[2]))
  if next_owner then
    held = next_owner .. ' ' .. digits(token)
  end
end
local holder, token = parse_owner(held)
return {holder or '', token, probe_queued, dropped, more and 1 or 0}
