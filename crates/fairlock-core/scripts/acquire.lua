-- acquire.lua: take the lock if it is free and nobody waits; otherwise
-- join the FIFO queue (mode "wait") or report busy (mode "try").
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] owner_id        the caller: nonce, client tag and lease (ms)
-- ARGV[2] mode            "wait" to enqueue when busy, "try" to never enqueue
-- ARGV[3] waiter_ttl_ms   heartbeat deadline given to the caller's process
-- ARGV[4] queue_ttl_ms    TTL of the queue keys, refreshed by every heartbeat
-- ARGV[5] idle_ms         TTL of the seq and freed keys
-- ARGV[6] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[7] rejoin          (optional) the ticket this caller was given when
--                         it queued before: a waiter whose entry was lost
--                         (a fail-over, taken for dead) joins again with
--                         it, in its old place, not at the back; used only
--                         if below the number drawn now (one it could have issued)
--
-- Replies:
--   {1, token}                            granted to the caller
--   {1, token, dropped, 0}                granted after dropping dead waiters
--                                         (a lock grant leaves none to purge)
--   {2, ticket, position, dropped, more}  queued: waiters ahead of the caller
--   {3, dropped, more}                    busy (mode "try" only)
--   dropped: dead waiters removed on the way; more: 1 if dead waiters are
--   left at the head of the queue (the client calls heartbeat to go on)
--
-- Cost: 5 commands when the lock is free and nobody waits (ZCARD, EXISTS,
-- TIME, SET seq, SET owner); 8 to join a queue that exists (ZCARD, GET,
-- TIME, ZADD alive, SET seq, ZADD queue, PEXPIRE queue and alive), 9 to
-- be the first waiter (EXISTS too). Both are answered by
-- fast_paths/acquire.lua, which runs first and reads `waiting`; this
-- script answers the rest (a free lock with waiters, a resend, a rejoin,
-- a try on a held lock, bad input).
-- Idempotent: run again with the same owner id it returns the same grant
-- (the owner id owns the lock) or the same ticket (it keeps its place).
-- No barging: a caller is granted a free lock only if no live waiter is
-- older.

local owner_id = ARGV[1]
local waiter_ttl_ms = tonumber(ARGV[3])
-- TTLs only passed on to commands stay digits (see parse_owner_id).
local queue_ttl_ms = ARGV[4]
local idle_ms = ARGV[5]
local channel_prefix = ARGV[6]
-- The old ticket, if it is digits fairlock could have issued (below 2^63).
local rejoin_str = ARGV[7]
local rejoin = rejoin_str and #rejoin_str <= 18 and string.match(rejoin_str, '^[1-9]%d*$')
  and tonumber(rejoin_str)
local tag, lease_ms, lease_str = parse_owner_id(owner_id)
if not tag or not usable(lease_ms) then
  return redis.error_reply('ERR fairlock acquire: malformed owner id ' .. owner_id)
end

-- `drawn` is {value seq had} when this call already drew a number.
local function wrong_type(key, drawn)
  if drawn then
    restore_seq(drawn[1])
  end
  return redis.error_reply('WRONGTYPE fairlock key ' .. key ..
    ' holds a value of another type')
end

-- The caller already owns the lock (a resend of the call that was
-- granted, or a grant made by a release while this call was on its way):
-- the answer is that grant, with the caller's own lease set now, since
-- the client takes this reply as a grant with its full lease. A grant
-- whose message reached nobody had only the waiter TTL.
local function own_grant(token)
  redis.call('PEXPIRE', KEYS[1], lease_str)
  return {1, token}
end

-- Join the queue with `ticket` (number and digits; or a new one drawn at
-- `now`, number and digits), `ahead` waiters in front; or, rejoining, with
-- the caller's old ticket, in its old place.
local function enqueue(now, now_str, ticket, ticket_str, drawn, ahead)
  local fresh_tag = only_wrongtype(redis.pcall('ZADD', KEYS[3], math.floor(now / 1000) + waiter_ttl_ms, tag))
  if type(fresh_tag) == 'table' then
    return wrong_type(KEYS[3], drawn)
  end
  if not ticket then
    local previous
    ticket, previous, ticket_str = next_seq(now, idle_ms, now_str)
    drawn = {previous}
  end
  local rejoined = rejoin and rejoin < ticket
  if rejoined then
    ticket, ticket_str = rejoin, rejoin_str
  end
  if redis.call('ZADD', KEYS[2], 'NX', ticket_str, owner_id) == 0 then
    -- A resend: keep the place taken the first time, and the counter as
    -- it was.
    restore_seq(drawn[1])
    ticket = tonumber(redis.call('ZSCORE', KEYS[2], owner_id))
    ahead = redis.call('ZRANK', KEYS[2], owner_id)
  elseif rejoined then
    ahead = redis.call('ZRANK', KEYS[2], owner_id)
  end
  -- Both keys live on from every join, as from every heartbeat: this
  -- waiter's first heartbeat may be an interval away, and keys near the
  -- end of their TTL would otherwise take its entry, or its process's
  -- liveness, with them before it.
  redis.call('PEXPIRE', KEYS[2], queue_ttl_ms)
  redis.call('PEXPIRE', KEYS[3], queue_ttl_ms)
  return ticket, ahead
end

-- The caller's grant, made past `dropped` dead waiters (counted only if
-- there were any: the usual grant stays two numbers).
local function granted_after(token, dropped)
  if dropped == 0 then
    return {1, token}
  end
  return {1, token, dropped, 0}
end

-- `waiting` is the queue's length, read by the fast path.
if waiting == 0 then
  -- Nobody waits: take the lock unless it is held (the fast path took a
  -- free lock, and joined a held one, unless the owner id, the owner
  -- value, a key's type or the call needs this script's answer).
  local now, now_str = now_us()
  local seq, previous, seq_str = next_seq(now, idle_ms, now_str)
  local held = redis.pcall('SET', KEYS[1], owner_id .. ' ' .. seq_str, 'NX', 'GET', 'PX', lease_str)
  if type(held) == 'table' and held.err then
    if string.sub(held.err, 1, 9) ~= 'WRONGTYPE' then
      restore_seq(previous)
      return held
    end
    return wrong_type(KEYS[1], {previous})
  end
  if not held then
    return {1, seq}
  end
  local holder, token, ours = parse_owner(held)
  if not ours then
    restore_seq(previous)
    return foreign_owner_error()
  end
  if holder == owner_id or ARGV[2] == 'try' then
    -- A resend of a granted acquire, or a try on a held lock: nothing to
    -- keep of this call, not even the number it drew.
    restore_seq(previous)
    if holder == owner_id then
      return own_grant(token)
    end
    return {3, 0, 0}
  end
  -- The number just drawn serves as the ticket: it is above every token
  -- and ticket issued before.
  local ticket, ahead = enqueue(now, now_str, seq, seq_str, {previous}, 0)
  if type(ticket) == 'table' then
    return ticket
  end
  return {2, ticket, ahead, 0, 0}
end

local held = redis.call('GET', KEYS[1])
local holder, token, ours = parse_owner(held)
if not ours then
  return foreign_owner_error()
end
if holder == owner_id then
  return own_grant(token)
end
local dropped, more = 0, false
if not held then
  -- The holder vanished without a release (its lease ran out) while
  -- others wait: the oldest live waiter gets the lock, not the caller.
  local head, head_token, unheard
  head, head_token, dropped, more, unheard = grant_next(idle_ms, channel_prefix, waiter_ttl_ms)
  if head == owner_id then
    if unheard then
      -- The caller's own grant, unheard: its subscriber is down, but the
      -- caller learns of it from this reply, so it keeps its own lease.
      redis.call('PEXPIRE', KEYS[1], lease_str)
    end
    return granted_after(head_token, dropped)
  end
  if not head then
    waiting = redis.call('ZCARD', KEYS[2])
    if waiting == 0 then
      -- Only dead waiters were queued: the lock is the caller's.
      local now, now_str = now_us()
      return granted_after((grant(now, owner_id, idle_ms, lease_str, now_str)), dropped)
    end
  else
    waiting = waiting - dropped - 1
  end
end
if ARGV[2] == 'try' then
  return {3, dropped, more and 1 or 0}
end
local now, now_str = now_us()
local ticket, ahead = enqueue(now, now_str, false, nil, nil, waiting)
if type(ticket) == 'table' then
  return ticket
end
return {2, ticket, ahead, dropped, more and 1 or 0}
