-- includes/common.lua: helpers shared by every lock script.
--
-- Every lock script takes the same four keys, all under one hash tag
-- (`<prefix>{<name>}:...`), so a lock lives in one cluster slot:
--   KEYS[1] owner  hash  {id = <member>, token = <fencing token>}; its TTL is the lease
--   KEYS[2] queue  zset  member -> ticket (FIFO order)
--   KEYS[3] alive  zset  client tag -> heartbeat deadline, ms of server time
--   KEYS[4] fence  hash  {token = last fencing token, ticket = last ticket,
--                         freed = member of the last release}; never expires
-- A member is `<owner id, 32 hex>.<client tag, hex>`; the client tag names
-- the one pub/sub channel of the waiter's process (ARGV channel prefix .. tag)
-- and its liveness: a process heartbeats all its waiters at once, so a
-- waiter is alive while its process's deadline in `alive` lies ahead. One
-- queue entry per waiter, one `alive` entry per process.

-- Refuse keys of a foreign type before the first write, so a failing script
-- leaves Redis exactly as it found it.
local function check_types(types)
  for i, expected in ipairs(types) do
    local actual = redis.call('TYPE', KEYS[i]).ok
    if actual ~= 'none' and actual ~= expected then
      return redis.error_reply('WRONGTYPE fairlock key ' .. KEYS[i] .. ' holds a ' ..
        actual .. ' where a ' .. expected .. ' was expected')
    end
  end
  return nil
end

-- Server time in milliseconds. Clients' clocks are never trusted.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The client tag of a member: its process.
local function client_of(member)
  return string.match(member, '%.(%x+)$') or member
end

-- Tell one waiter's process, on its own channel, that the waiter now owns
-- the lock. One PUBLISH reaches one subscriber: no herd.
local function notify(channel_prefix, member, token)
  redis.call('PUBLISH', channel_prefix .. client_of(member), member .. ' ' .. token)
end

-- Make `member` the owner with a fresh fencing token and lease `lease_ms`.
-- The token counter lives in the fence hash, which never expires, so tokens
-- increase strictly for the life of the lock name.
local function grant(member, lease_ms)
  local token = redis.call('HINCRBY', KEYS[4], 'token', 1)
  redis.call('HSET', KEYS[1], 'id', member, 'token', token)
  redis.call('PEXPIRE', KEYS[1], lease_ms)
  return token
end

-- The oldest waiter whose process's heartbeat deadline has not passed, or
-- false. Dead waiters found at the head are dropped on the way: O(k log N)
-- for k dead waiters, O(log N) when the head is alive.
local function live_head(now)
  local evicted = 0
  while true do
    local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
    if not head then
      return false, evicted
    end
    local deadline = tonumber(redis.call('ZSCORE', KEYS[3], client_of(head)))
    if deadline and deadline >= now then
      return head, evicted
    end
    redis.call('ZREM', KEYS[2], head)
    evicted = evicted + 1
  end
end

-- Direct handoff: the lock is free; make the oldest live waiter its owner
-- with a short grant lease and wake it. The woken waiter already owns the
-- lock, so nobody can barge in between. If it turns out to be dead, the
-- grant lease runs out and the next acquire or heartbeat grants the next one.
-- Returns the granted member (or false) and how many dead waiters were dropped.
local function grant_next(now, grant_lease_ms, channel_prefix)
  local head, evicted = live_head(now)
  if not head then
    return false, evicted
  end
  redis.call('ZREM', KEYS[2], head)
  local token = grant(head, grant_lease_ms)
  notify(channel_prefix, head, token)
  return head, evicted
end

-- Free the lock held by `member` and hand it on. `freed` remembers who
-- released last, so a resent release (after a reconnect) is recognised.
local function release_and_hand_on(member, grant_lease_ms, channel_prefix)
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[4], 'freed', member)
  local next_owner, evicted = grant_next(now_ms(), grant_lease_ms, channel_prefix)
  return next_owner, evicted
end
