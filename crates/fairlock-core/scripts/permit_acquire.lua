-- permit_acquire.lua: take a permit if one is free and nobody live waits
-- ahead; otherwise join the FIFO queue (mode "wait") or report busy (mode
-- "try"). A shared caller's permit count becomes the set's limit; waiters
-- that fit are granted first (after a raised limit or an expired holder),
-- so the caller never overtakes them.
--
-- KEYS[1] holders   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] grants
-- ARGV[1] owner_id        the caller: nonce, client tag, lease (ms), permits
-- ARGV[2] mode            "wait" to enqueue when no permit fits, "try" never
-- ARGV[3] waiter_ttl_ms   heartbeat deadline given to the caller's process
-- ARGV[4] queue_ttl_ms    TTL of the queue keys, refreshed by every heartbeat
-- ARGV[5] idle_ms         TTL of the seq key and of a stored limit
-- ARGV[6] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[7] rejoin          (optional) the ticket this caller was given when
--                         it queued before: a waiter whose entry was lost
--                         joins again with it, in its old place (and is
--                         granted if that makes it the head and it fits);
--                         used only if below the server clock (one it
--                         could have issued)
--
-- Replies (as acquire.lua's):
--   {1, token}                            granted to the caller
--   {1, token, dropped, more}             granted after dropping dead
--                                         waiters (more: some are left)
--   {2, ticket, position, dropped, more}  queued: entries ahead of the caller
--   {3, dropped, more}                    busy (mode "try" only)
--
-- Idempotent: run again by a holder it answers the same token (and sets
-- the holder's own lease from now: a waiter whose grant message was lost
-- learns of its grant this way); run again by a queued owner id it keeps
-- its place.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('permit_acquire', false, 5)
if other_family then
  return other_family
end

local owner_id = ARGV[1]
local waiter_ttl_ms = tonumber(ARGV[3])
local queue_ttl_ms = tonumber(ARGV[4])
local idle_ms = tonumber(ARGV[5])
local tag, lease_ms, permits = parse_permit_owner_id(owner_id)
if not tag then
  return redis.error_reply('ERR fairlock permit_acquire: malformed owner id ' .. owner_id)
end
-- The old ticket, if it is digits fairlock could have issued (below 2^63).
local rejoin_str = ARGV[7]
local rejoin = rejoin_str and #rejoin_str <= 18 and string.match(rejoin_str, '^[1-9]%d*$')
  and tonumber(rejoin_str)

local held = read_key(1, 'ZSCORE', owner_id)
local ticket = read_key(2, 'ZSCORE', owner_id)
read_key(3, 'ZSCORE', tag)
local stored = read_key(5, 'HGET', 'limit')
local now = now_us()
local now_ms = math.floor(now / 1000)

-- The grant reply; what a purge on the way did, only if it did something
-- (an uncontended grant stays two numbers).
local function granted_reply(token, dropped, flags)
  if dropped == 0 and flags == 0 then
    return {1, token}
  end
  return {1, token, dropped, flags}
end

-- The caller holds, with its own lease from now.
local function holding(token, dropped, flags)
  redis.call('ZADD', KEYS[1], 'XX', now_ms + lease_ms, owner_id)
  keep_for(KEYS[1], lease_ms)
  keep_for(KEYS[5], lease_ms)
  return granted_reply(token, dropped or 0, flags or 0)
end

if held and tonumber(held) > now_ms then
  local token = tonumber(redis.call('HGET', KEYS[5], owner_id))
  if token then
    return holding(token)
  end
  -- Its token is gone (the hash was lost): not a usable grant.
  redis.call('ZREM', KEYS[1], owner_id)
end
expire_holders(now_ms)
if permits > 0 and stored ~= tostring(permits) then
  redis.call('HSET', KEYS[5], 'limit', permits)
  keep_for(KEYS[5], idle_ms)
  stored = tostring(permits)
end

local granted, dropped, more = grant_waiting(now, idle_ms, ARGV[6], waiter_ttl_ms, stored)
local flags = more and 1 or 0
if ticket then
  for i = 1, #granted, 3 do
    if granted[i] == owner_id then
      return holding(granted[i + 1], dropped, flags)
    end
  end
  if redis.call('ZSCORE', KEYS[2], owner_id) then
    -- A resend or a re-check: the caller keeps its place.
    redis.call('ZADD', KEYS[3], now_ms + waiter_ttl_ms, tag)
    redis.call('PEXPIRE', KEYS[2], queue_ttl_ms)
    -- Never shortened: it also holds remembered releases (permit_release.lua).
    keep_for(KEYS[3], queue_ttl_ms)
    return {2, tonumber(ticket), redis.call('ZRANK', KEYS[2], owner_id), dropped, flags}
  end
  -- Dropped as dead meanwhile (its process missed heartbeats), or its
  -- entry was lost: it joins again below, in its old place if it brought
  -- its ticket, else at the back.
end

-- Only a number from the past: one the set's counter could have issued.
if rejoin and rejoin >= now then
  rejoin = false
end
local waiting = redis.call('ZCARD', KEYS[2])
-- Whether the caller heads the queue: nobody waits, or its old ticket is
-- older than the head's (which did not fit, or it would be granted).
local first = waiting == 0
if rejoin and not first then
  first = rejoin < tonumber(redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2])
end
if first and fits(permits, permits) then
  return granted_reply(grant_permit(now, owner_id, lease_ms, idle_ms), dropped, flags)
end
if ARGV[2] == 'try' then
  return {3, dropped, flags}
end
redis.call('ZADD', KEYS[3], now_ms + waiter_ttl_ms, tag)
local new_ticket, position = rejoin, waiting
if rejoin then
  redis.call('ZADD', KEYS[2], 'NX', rejoin_str, owner_id)
  position = redis.call('ZRANK', KEYS[2], owner_id)
else
  new_ticket = next_seq(now, idle_ms)
  redis.call('ZADD', KEYS[2], 'NX', digits(new_ticket), owner_id)
end
redis.call('PEXPIRE', KEYS[2], queue_ttl_ms)
keep_for(KEYS[3], queue_ttl_ms)
return {2, new_ticket, position, dropped, flags}
