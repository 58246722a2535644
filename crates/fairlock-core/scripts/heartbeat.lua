-- heartbeat.lua: one call per interval for one process covers every lock
-- it waits on (a batch of them; on a cluster, the locks of one slot),
-- however many of its tasks wait there. For each lock: moves the process's
-- deadline forward, forgets dead processes, grants the lock if its holder
-- vanished, and tells the process who holds the lock and which of its
-- probed waiters are still queued, so a lost pub/sub message, an orphaned
-- grant or a queue entry lost in a fail-over heals here. With no probe it
-- only hands a free lock on: clients use that to go on purging dead
-- waiters.
--
-- KEYS: five per lock, lock i at KEYS[5i-4 .. 5i]:
--   owner, queue, alive, seq, freed (the layout of includes/common.lua)
-- ARGV[1] tag             the calling process's client tag
-- ARGV[2] waiter_ttl_ms   new deadline offset for the process
-- ARGV[3] queue_ttl_ms    TTL of the queue keys
-- ARGV[4] idle_ms         TTL of the seq and freed keys
-- ARGV[5] channel_prefix  waiters are woken on channel_prefix .. client tag
-- then, lock after lock in KEYS order:
--   n                     how many probes follow for this lock, 0 to 32
--   probe 1 .. probe n    owner ids of the process's waiters on the lock
--                         (the client sends its oldest first, its newest,
--                         and a few others in turn)
--
-- The process's deadline on a lock moves on when one of its probes is
-- queued there or holds the lock.
--
-- Reply: five fields per lock, in KEYS order:
--   {holder, token, queued, dropped, more, ...}
--   holder and token of the lock after this call ("" and 0 when free);
--   queued: bit j-1 set (2^(j-1) added) when probe j is in the queue; a
--   probe that is neither queued nor the holder has lost its place if its
--   task still waits, and the client has it run acquire again, which is
--   idempotent;
--   dropped and more as in acquire.lua
--
-- Cost: about 8 commands per lock (one ZMSCORE checks all its probes),
-- whatever the number of the process's waiters; at most 32 dead processes
-- are forgotten per lock. The per-call cost (one round trip, one script
-- run) is shared by the batch.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('heartbeat', true, 5)
if other_family then
  return other_family
end

local MAX_PROBES = 32

local locks = #KEYS / 5
-- Where each lock's probes start in ARGV, checked before the first write.
local probes_at, probe_count = {}, {}
local at = 6
if locks >= 1 and locks == math.floor(locks) then
  for i = 1, locks do
    local n = tonumber(ARGV[at])
    if not n or n < 0 or n > MAX_PROBES or n ~= math.floor(n) then
      at = -1
      break
    end
    probe_count[i], probes_at[i] = n, at + 1
    at = at + 1 + n
  end
end
if locks < 1 or locks ~= math.floor(locks) or at ~= #ARGV + 1 then
  return redis.error_reply('ERR fairlock heartbeat: ' .. #KEYS .. ' keys and ' ..
    #ARGV .. ' arguments are not five keys per lock and, per lock, a count of ' ..
    'at most ' .. MAX_PROBES .. ' probes and the probes')
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
  local n, from = probe_count[i], probes_at[i]
  local held = redis.call('GET', K[1])
  local queued, live = 0, false
  if n > 0 then
    local scores = redis.call('ZMSCORE', K[2], unpack(ARGV, from, from + n - 1))
    for j = 1, n do
      if scores[j] then
        queued = queued + 2 ^ (j - 1)
        live = true
      end
    end
    if not live and held then
      -- A probe that holds the lock was granted while this call was on
      -- its way (the client probes with its oldest waiter, the next to be
      -- granted): its process is alive all the same.
      local holder = parse_owner(held)
      for j = from, from + n - 1 do
        if ARGV[j] == holder then
          live = true
          break
        end
      end
    end
  end
  if live then
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
  local r = #reply
  reply[r + 1] = holder or ''
  reply[r + 2] = token
  reply[r + 3] = queued
  reply[r + 4] = dropped
  reply[r + 5] = more and 1 or 0
end
return reply
