-- permit_heartbeat.lua: one call per permit set per interval for one
-- process, however many of its tasks wait there. Moves the process's
-- deadline forward, forgets dead processes, returns the permits of holders
-- whose lease ran out, grants the waiters that fit, and says which of the
-- process's probed waiters are still queued. With no probe it only hands
-- free permits on: clients use that to go on after a call reported more.
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] tag             the calling process's client tag
-- ARGV[2] waiter_ttl_ms   new deadline offset for the process
-- ARGV[3] queue_ttl_ms    TTL of the queue keys
-- ARGV[4] idle_ms         TTL of the seq key
-- ARGV[5] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[6..] probes        0 to 32 owner ids of the process's waiters on
--                         this set (the client sends its oldest first, its
--                         newest, and a few others in turn)
--
-- The process's deadline moves on when a probe is queued or holds a
-- permit (it was granted while this call was on its way: the client
-- probes with its oldest waiter, the next to be granted).
--
-- Reply: {queued, dropped, more, holds, unheard}
--   queued: bit j-1 set (2^(j-1) added) when probe j is queued;
--   holds: bit j-1 set when probe j is not queued but holds a permit;
--   unheard: bit j-1 set when that permit's lease ends within the waiter
--   TTL: a grant whose message reached nobody has its lease cut to it, so
--   the grants of the same release (all the readers at the head) may
--   have gone unheard too (or the lease asked for is that short).
--   A probe in neither (dropped, or granted and released already) whose
--   task still waits has lost its place, and the client has it run
--   permit_acquire again, which answers a grant or keeps or retakes a
--   place. A probe that holds while its task still waits (the grant's
--   message was lost or is on its way) runs permit_acquire again too.
--
-- Cost: about 10 commands (one ZMSCORE checks every probe, a second one
-- the holders only when a probe is missing from the queue), whatever the
-- number of the process's waiters.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('permit_heartbeat', false, 5)
if other_family then
  return other_family
end

local MAX_PROBES = 32

local tag = ARGV[1]
local n = #ARGV - 5
if n > MAX_PROBES then
  return redis.error_reply('ERR fairlock permit heartbeat: ' .. n .. ' probes, at most ' ..
    MAX_PROBES)
end
read_key(1, 'ZCARD')
local scores
if n > 0 then
  scores = read_key(2, 'ZMSCORE', unpack(ARGV, 6, 5 + n))
else
  read_key(2, 'ZCARD')
end
read_key(3, 'ZCARD')
local stored = read_key(5, 'HGET', 'limit')
local now = now_us()
local now_ms = math.floor(now / 1000)
local queued, holds, unheard, live = 0, 0, 0, false
if n > 0 then
  local missing, names = {}, {}
  for j = 1, n do
    if scores[j] then
      queued = queued + 2 ^ (j - 1)
      live = true
    else
      missing[#missing + 1] = j
      names[#names + 1] = ARGV[5 + j]
    end
  end
  if #missing > 0 then
    -- A holder whose lease ran out (not yet removed below) holds nothing.
    local deadlines = redis.call('ZMSCORE', KEYS[1], unpack(names))
    for k, j in ipairs(missing) do
      local deadline = tonumber(deadlines[k])
      if deadline ~= nil and deadline > now_ms then
        holds = holds + 2 ^ (j - 1)
        live = true
        if deadline <= now_ms + tonumber(ARGV[2]) then
          unheard = unheard + 2 ^ (j - 1)
        end
      end
    end
  end
end
if live then
  redis.call('ZADD', KEYS[3], now_ms + tonumber(ARGV[2]), tag)
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  -- Never shortened: it also holds remembered releases (permit_release.lua).
  keep_for(KEYS[3], tonumber(ARGV[3]))
end

-- Processes whose deadline passed are dead, and releases past their time
-- are forgotten: remove a bounded batch.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. now_ms, 'LIMIT', 0, 32)
if #dead > 0 then
  redis.call('ZREM', KEYS[3], unpack(dead))
end

expire_holders(now_ms)
local _, dropped, more = grant_waiting(now, tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[2]), stored)
return {queued, dropped, more and 1 or 0, holds, unheard}
