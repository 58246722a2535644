-- acquire.lua: take the lock if it is free and nobody waits; otherwise
-- join the FIFO queue (mode "wait") or report busy (mode "try").
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] fence
-- ARGV[1] member          the caller's owner id and client tag
-- ARGV[2] lease_ms        the caller's lease if granted now
-- ARGV[3] mode            "wait" to enqueue when busy, "try" to never enqueue
-- ARGV[4] waiter_ttl_ms   heartbeat deadline given to the caller's process
-- ARGV[5] queue_ttl_ms    TTL of the queue keys, refreshed by every heartbeat
-- ARGV[6] grant_lease_ms  lease of a lock handed to a waiter that is not here
-- ARGV[7] channel_prefix  waiters are woken on channel_prefix .. client tag
--
-- Replies:
--   {1, token, evicted}                 granted to the caller
--   {2, ticket, position, pttl, evicted} queued: 0-based position, holder's lease left
--   {3, pttl, evicted}                  busy (mode "try" only)
--
-- Idempotent: running it again with the same member returns the same grant
-- (the member already owns the lock) or the same ticket (it keeps its place).
-- No barging: a caller is granted a free lock only if no live waiter is older.

local err = check_types({'hash', 'zset', 'zset', 'hash'})
if err then return err end

local member = ARGV[1]
local lease_ms = tonumber(ARGV[2])
local waiter_ttl_ms = tonumber(ARGV[4])
local queue_ttl_ms = tonumber(ARGV[5])
local grant_lease_ms = tonumber(ARGV[6])

local owner = redis.call('HGET', KEYS[1], 'id')
if owner == member then
  return {1, tonumber(redis.call('HGET', KEYS[1], 'token')), 0}
end

local now = now_ms()
local evicted = 0
if not owner then
  local head
  head, evicted = live_head(now)
  if not head or head == member then
    if head then
      redis.call('ZREM', KEYS[2], member)
    end
    return {1, grant(member, lease_ms), evicted}
  end
  -- The lock is free but an older waiter exists: its holder vanished
  -- without a release. The oldest waiter gets the lock, not the caller.
  redis.call('ZREM', KEYS[2], head)
  notify(ARGV[7], head, grant(head, grant_lease_ms))
end

if ARGV[3] == 'try' then
  return {3, redis.call('PTTL', KEYS[1]), evicted}
end

local ticket = tonumber(redis.call('ZSCORE', KEYS[2], member))
if not ticket then
  ticket = redis.call('HINCRBY', KEYS[4], 'ticket', 1)
  redis.call('ZADD', KEYS[2], ticket, member)
end
-- The caller's process is evidently alive: move its deadline.
redis.call('ZADD', KEYS[3], now + waiter_ttl_ms, client_of(member))
redis.call('PEXPIRE', KEYS[2], queue_ttl_ms)
redis.call('PEXPIRE', KEYS[3], queue_ttl_ms)
return {2, ticket, redis.call('ZRANK', KEYS[2], member), redis.call('PTTL', KEYS[1]), evicted}
