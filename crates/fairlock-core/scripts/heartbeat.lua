-- heartbeat.lua: one call per interval for one process covers every lock
-- it waits on (a batch of them; on a cluster, the locks of one slot),
-- however many of its tasks wait there. For each lock: moves the process's
-- deadline forward, forgets dead processes, grants the lock if its holder
-- vanished, and tells the process who holds the lock and whether its
-- oldest waiter is still queued, so a lost pub/sub message, an orphaned
-- grant or a queue lost in a fail-over heals here. With no probe it only
-- hands a free lock on: clients use that to go on purging dead waiters.
--
-- KEYS: five per lock, lock i at KEYS[5i-4 .. 5i]:
--   owner, queue, alive, seq, freed (the layout of includes/common.lua)
-- ARGV[1] tag             the calling process's client tag
-- ARGV[2] waiter_ttl_ms   new deadline offset for the process
-- ARGV[3] queue_ttl_ms    TTL of the queue keys
-- ARGV[4] idle_ms         TTL of the seq and freed keys
-- ARGV[5] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[5+i] probe         the process's oldest waiter on lock i, or ""
--
-- The process's deadline on a lock moves on when its probe is queued there
-- or holds the lock.
--
-- Reply: five fields per lock, in KEYS order:
--   {holder, token, probe_queued, dropped, more, ...}
--   holder and token of the lock after this call ("" and 0 when free);
--   probe_queued 1 if the probe is in the queue (if 0, the process checks
--   each of its waiters by running acquire again, which is idempotent);
--   dropped and more as in acquire.lua
--
-- Cost: about 8 commands per lock, whatever the number of the process's
-- waiters; at most 32 dead processes are forgotten per lock. The per-call
-- cost (one round trip, one script run) is shared by the batch.

local locks = #KEYS / 5
if locks < 1 or locks ~= math.floor(locks) or #ARGV ~= 5 + locks then
  return redis.error_reply('ERR fairlock heartbeat: ' .. #KEYS .. ' keys and ' ..
    #ARGV .. ' arguments are not five keys and one probe per lock')
end
local tag = ARGV[1]
local waiter_ttl_ms = tonumber(ARGV[2])
local queue_ttl_ms = tonumber(ARGV[3])
local idle_ms = tonumber(ARGV[4])
local channel_prefix = ARGV[5]
local now_ms = math.floor(now_us() / 1000)
local all_keys = KEYS
local reply = {}

for i = 1, locks do
  local first = 5 * (i - 1)
  K = {all_keys[first + 1], all_keys[first + 2], all_keys[first + 3],
    all_keys[first + 4], all_keys[first + 5]}
  local probe = ARGV[5 + i]
  local held = redis.call('GET', K[1])
  local probe_queued = 0
  if probe ~= '' and redis.call('ZSCORE', K[2], probe) then
    probe_queued = 1
  end
  -- A probe that holds the lock was granted while this call was on its
  -- way (the client probes with its oldest waiter, the next to be
  -- granted): its process is alive all the same.
  local probe_holds = probe ~= '' and held and parse_owner(held) == probe
  if probe_queued == 1 or probe_holds then
    redis.call('ZADD', K[3], now_ms + waiter_ttl_ms, tag)
    redis.call('PEXPIRE', K[2], queue_ttl_ms)
    redis.call('PEXPIRE', K[3], queue_ttl_ms)
  end

  -- Processes whose deadline passed are dead: forget a bounded batch.
  local dead = redis.call('ZRANGEBYSCORE', K[3], '-inf', '(' .. now_ms, 'LIMIT', 0, 32)
  if #dead > 0 then
    redis.call('ZREM', K[3], unpack(dead))
  end

  local dropped, more = 0, false
  if not held then
    local next_owner, token
    next_owner, token, dropped, more = grant_next(idle_ms, channel_prefix, waiter_ttl_ms)
    if next_owner then
      held = next_owner .. ' ' .. digits(token)
    end
  end
  local holder, token = parse_owner(held)
  local n = #reply
  reply[n + 1] = holder or ''
  reply[n + 2] = token
  reply[n + 3] = probe_queued
  reply[n + 4] = dropped
  reply[n + 5] = more and 1 or 0
end
return reply
