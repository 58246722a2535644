-- includes/common.lua: the key layout and the helpers every lock script shares.
--
-- Every lock script takes the same five keys, all under one hash tag
-- (`<prefix>{<escaped name>}:...`), so a lock lives in one cluster slot:
--   KEYS[1] owner  string "<owner id> <token>"; its TTL is the holder's lease
--   KEYS[2] queue  zset   owner id -> ticket (FIFO order)
--   KEYS[3] alive  zset   client tag -> heartbeat deadline, ms of server time
--   KEYS[4] seq    string the last token or ticket issued (one counter for both)
--   KEYS[5] freed  string the owner ids of the last 8 releases, so a
--                         resent release is recognised (includes/releases.lua)
-- Every key expires: owner with the lease, queue and alive with the queue
-- TTL that heartbeats refresh, seq and freed with the idle TTL. An idle
-- lock leaves nothing behind.
--
-- An owner id is `<nonce, 32 hex>.<client tag, 16 hex>.<lease ms>`. The
-- client tag names the waiter's process: its pub/sub channel
-- (channel prefix .. tag) and its liveness (one `alive` entry per process
-- and lock, refreshed by one heartbeat call however many waiters it has).
-- The lease travels inside the owner id, so a handoff grants the waiter's
-- own lease with no confirm round trip.
--
-- Scripts read every key they will write before their first write (a read
-- of a key of a foreign type fails with WRONGTYPE), so a failing script
-- leaves Redis as it found it, without TYPE probes on the hot path. The
-- exception is heartbeat.lua, which covers several locks in one call: a
-- foreign key under a later lock fails the call after the earlier locks'
-- writes; the client then beats each lock on its own, which redoes those
-- writes harmlessly (each is idempotent).

-- The five keys of the lock the helpers below work on: KEYS itself, except
-- in heartbeat.lua, which covers several locks in one call and points K at
-- each lock's five keys in turn.
local K = KEYS

-- Lua 5.1 prints large numbers in exponent form; Redis wants digits.
local function digits(n)
  return string.format('%.0f', n)
end

-- Server time in microseconds, as a number and as digits. The digits are
-- put together from TIME's own strings: formatting a number costs Redis
-- 7.0 a printf, and every grant writes the time as a token.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]), t[1] .. string.sub('00000' .. t[2], -6)
end

local function tag_of(owner_id)
  return string.match(owner_id, '^%x+%.(%x+)%.%d+$')
end

local function lease_of(owner_id)
  return tonumber(string.match(owner_id, '%.(%d+)$'))
end

-- The longest lease an owner id may carry (a day, the client's own limit):
-- an entry asking for more, or for none, was not written by fairlock and
-- is dropped like a dead one instead of failing the grant.
local MAX_LEASE_MS = 86400000

-- The items of a renewal batch (renew.lua, permit_renew.lua), each
-- "<owner id> <lease ms>", lease 0 to check only: a list of
-- {owner id, lease}, or nil and the error reply naming the first item of
-- another shape or with a lease over MAX_LEASE_MS. Checked before any
-- lease is set, so a refused call leaves every lease as it was.
local function renewal_items(script, args, count)
  local items = {}
  for i = 1, count do
    local arg = args[i] or ''
    -- A token, if given, names the grant that must be the one held (a
    -- waiter confirming a grant it took); without one, any grant of the
    -- owner id is (the watchdog's renewals).
    local owner_id, lease_ms, token = string.match(arg, '^(%S+) (%d+) (%d+)$')
    if not owner_id then
      owner_id, lease_ms = string.match(arg, '^(%S+) (%d+)$')
    end
    if not owner_id or #lease_ms > 8 or tonumber(lease_ms) > MAX_LEASE_MS
        or (token and #token > 18) then
      return nil, redis.error_reply('ERR fairlock ' .. script .. ': item ' .. i ..
        ' needs "<owner id> <lease ms>" or "<owner id> <lease ms> <token>" with a lease of ' ..
        'at most a day (86400000) and a token of at most 18 digits, got ' .. tostring(args[i]))
    end
    items[i] = {owner_id, tonumber(lease_ms), token}
  end
  return items
end

local function usable(lease)
  return lease ~= nil and lease >= 1 and lease <= MAX_LEASE_MS
end

-- An owner id's tag and lease in one pattern match (each match costs Redis
-- time on every call; the hot paths parse an owner id once). The lease comes
-- as a number and as the owner id's own digits, which commands take as they
-- are (a number argument costs Redis a printf).
local function parse_owner_id(owner_id)
  -- At most 128 bytes, as owner_fields reads an owner value back (a longer
  -- id granted the lock could never release it). No leading zero: the
  -- digits go to PX as they are, and Redis refuses `PX 060000` (fairlock
  -- never writes one).
  if #owner_id > 128 then
    return nil
  end
  local tag, lease = string.match(owner_id, '^%x+%.(%x+)%.([1-9]%d*)$')
  return tag, tonumber(lease), lease
end

-- An owner value "<owner id> <token>" as fairlock writes it: an owner id
-- as the client makes them (at most 128 bytes, as OwnerId::is_well_formed
-- takes them) and a token of at most 18 digits (below 2^63). Anything else
-- is another program's value, never a holder: "x 5" taken for one queued
-- waiters behind it for ever, and force_release refused its owner id.
local function owner_fields(value)
  local owner_id, token = string.match(value, '^(%x+%.%x+%.[1-9]%d*) (%d+)$')
  if owner_id and #owner_id <= 128 and #token <= 18 then
    return owner_id, token
  end
end

-- The owner value "<owner id> <token>": its owner id and token, and whether
-- fairlock wrote it (false for a value another program wrote, which is
-- returned whole as the owner id).
local function parse_owner(value)
  if not value then
    return false, 0, true
  end
  local owner_id, token = owner_fields(value)
  return owner_id or value, tonumber(token) or 0, owner_id ~= nil
end

-- An owner value fairlock did not write (another program uses the key).
local function foreign_owner(value)
  return value and not owner_fields(value)
end

local function foreign_owner_error()
  return redis.error_reply('WRONGTYPE fairlock key ' .. K[1] ..
    ' holds a value fairlock did not write')
end

-- The next number of the lock's sequence, shared by fencing tokens and
-- queue tickets: strictly above the last one issued and never below the
-- server clock in microseconds. So tokens and tickets never repeat or go
-- back even when every key of the lock is lost (eviction, FLUSHDB, a
-- restart without persistence, a fail-over to a lagging replica), as long
-- as the server clock does not go back. KEEPTTL: the key expires
-- `idle_ms` after it was created, whatever its use; that is safe because
-- of the clock floor. Returns the number and the value it replaced, so a
-- caller that must fail afterwards can put it back.
-- A sequence value more than a day ahead of the server clock was not
-- written by fairlock (the floor moves it 1 us per grant at most): it is
-- garbage, and trusting it would stop tokens from increasing at 2^53.
local SEQ_AHEAD_LIMIT_US = 86400 * 1000000

-- An error reply other than a foreign key type (OOM, READONLY, ...) is
-- raised again as it is: only a foreign type may be repaired or reported
-- as WRONGTYPE.
local function only_wrongtype(reply)
  if type(reply) == 'table' and reply.err and string.sub(reply.err, 1, 9) ~= 'WRONGTYPE' then
    error(reply)
  end
  return reply
end

-- `now_str` is `now` in digits when the caller has them (see now_us); the
-- number is returned in digits as well.
local function next_seq(now, idle_ms, now_str)
  now_str = now_str or digits(now)
  local previous = only_wrongtype(redis.pcall('SET', K[4], now_str, 'GET', 'KEEPTTL'))
  local last = tonumber(previous)
  if (type(previous) == 'table' and previous.err)
      or (previous and not last) or (last and last > now + SEQ_AHEAD_LIMIT_US) then
    -- Repair: the counter is disposable thanks to the clock floor.
    redis.call('DEL', K[4])
    previous, last = false, nil
    redis.call('SET', K[4], now_str)
  end
  local seq, seq_str = now, now_str
  if last and last >= now then
    seq = last + 1
    seq_str = digits(seq)
    redis.call('SET', K[4], seq_str, 'KEEPTTL')
  end
  if not previous then
    redis.call('PEXPIRE', K[4], idle_ms)
  end
  return seq, previous, seq_str
end

-- Put the sequence back as it was before next_seq (a failing script).
local function restore_seq(previous)
  if previous then
    redis.call('SET', K[4], previous, 'KEEPTTL')
  else
    redis.call('DEL', K[4])
  end
end

-- publish: tell one owner id's process, on its own channel, what happened to it:
-- "<owner id> <token> <owner key>" for a grant, "<owner id> revoked:<token>
-- <owner key>" for a forced release. The owner key names the lock, so a grant
-- that reaches a process where nobody waits for it can be handed back.
-- One message reaches one subscriber: no herd.
-- On a cluster the channel prefix carries a hash tag in the lock's own
-- slot and the message goes by SPUBLISH, so it never crosses the cluster
-- bus. Returns how many subscribers received it (0 for a message Redis
-- refused: includes/publish.lua).
local function publish(channel_prefix, owner_id, what, tag)
  return publish_to(channel_prefix .. (tag or tag_of(owner_id)), owner_id .. ' ' .. what .. ' ' .. K[1])
end

-- Make `owner_id` the owner with a fresh token and its own lease (`lease`,
-- digits, or the owner id's). Returns the token as a number and in digits.
local function grant(now, owner_id, idle_ms, lease, now_str)
  local token, _, token_str = next_seq(now, idle_ms, now_str)
  redis.call('SET', K[1], owner_id .. ' ' .. token_str, 'PX', lease or lease_of(owner_id))
  return token, token_str
end

-- How many queue entries one call looks at, window by window, when it
-- searches for the oldest live waiter past a dead head (the head itself
-- is checked alone first: it is almost always alive, so a handoff reads
-- one owner id, not a hundred). Bounds the work of one script however many
-- dead waiters the queue holds: 128 entries in all (a call that parses
-- and removes 128 dead entries takes about 0.4 ms of Redis time on a slow
-- 2-core machine; 256 took up to 1.2 ms), and the search stops at the
-- first window that is not full.
local SCAN_WINDOWS = {64, 64}

-- Whether a process with a heartbeat deadline in `alive` is alive at
-- `now_ms`.
local function alive_at(deadline, now_ms)
  deadline = tonumber(deadline)
  return deadline ~= nil and deadline >= now_ms
end

-- The oldest waiter whose process is alive, removed from the queue, or
-- false. Dead waiters passed on the way are removed in the same ZREM.
-- Server time is read only once the queue turns out not to be empty.
-- Returns the head (or false), how many dead waiters were dropped,
-- whether the search stopped with dead waiters left to look at (the
-- caller's client then calls again), the time read (or false), and the
-- head's tag, lease and lease digits and the time in digits.
-- `known_first` is the queue's oldest entry if the caller has just read it
-- (release.lua's fast path has), so it is not read twice.
local function pop_live_head(known_first)
  local first = known_first or redis.call('ZRANGE', K[2], '0', '0')[1]
  if not first then
    return false, 0, false, false
  end
  local now, now_str = now_us()
  local now_ms = math.floor(now / 1000)
  local first_tag, first_lease, first_lease_str = parse_owner_id(first)
  if first_tag and usable(first_lease)
      and alive_at(redis.call('ZSCORE', K[3], first_tag), now_ms) then
    redis.call('ZREM', K[2], first)
    return first, 0, false, now, first_tag, first_lease, first_lease_str, now_str
  end
  -- The head is dead: search the windows after it (from the head on, so
  -- it goes in the same ZREM).
  local dropped = 0
  for _, size in ipairs(SCAN_WINDOWS) do
    local window = redis.call('ZRANGE', K[2], 0, size - 1)
    if #window == 0 then
      return false, dropped, false, now
    end
    -- One pattern match per owner id: tag and lease are kept for the
    -- second pass and for the grant.
    local tags, seen, tag_at, lease_at, lease_digits = {}, {}, {}, {}, {}
    for i, owner_id in ipairs(window) do
      local tag, lease, lease_str = parse_owner_id(owner_id)
      tag = tag or '-'
      tag_at[i] = tag
      lease_at[i] = lease
      lease_digits[i] = lease_str
      if not seen[tag] then
        seen[tag] = true
        tags[#tags + 1] = tag
      end
    end
    local deadlines = redis.call('ZMSCORE', K[3], unpack(tags))
    local alive = {}
    for i, tag in ipairs(tags) do
      alive[tag] = alive_at(deadlines[i], now_ms)
    end
    local remove = {}
    local head, head_at = false, 0
    for i, owner_id in ipairs(window) do
      remove[#remove + 1] = owner_id
      if alive[tag_at[i]] and usable(lease_at[i]) then
        head, head_at = owner_id, i
        break
      end
    end
    redis.call('ZREM', K[2], unpack(remove))
    if head then
      return head, dropped + #remove - 1, false, now, tag_at[head_at], lease_at[head_at],
        lease_digits[head_at], now_str
    end
    dropped = dropped + #remove
    if #window < size then
      return false, dropped, false, now
    end
  end
  return false, dropped, true, now
end

-- Direct handoff: the lock is free; make the oldest live waiter its owner
-- with the lease it asked for, and wake it. The woken waiter already owns
-- the lock, so nobody can barge in between. If the message reached nobody
-- (the waiter's process died within its waiter TTL, its pub/sub connection
-- is down this instant, or a slot migration dropped its subscription), the
-- grant keeps its place but only for `unheard_ms` (the waiter TTL): a live
-- process learns of it from its next heartbeat and sets its own lease, a
-- dead one lets it run out and the next waiter is granted.
-- The caller has deleted or will overwrite the owner key.
-- Returns the new owner (or false), its token, dead waiters dropped,
-- whether dead waiters are left to purge before a live one can be found,
-- and whether the grant went unheard and its lease was cut to
-- `unheard_ms` (a process that wakes the new owner by other means, such
-- as the releaser's own, must then set the owner's lease itself).
-- `reply_to` is the tag of the process that receives this script's reply
-- and wakes a new owner of its own from it (a release): no message is
-- published to that process, so its new owner is woken once, straight
-- from the reply, and Redis sends one message less. `known_first`: see
-- pop_live_head.
local function grant_next(idle_ms, channel_prefix, unheard_ms, reply_to, known_first)
  local head, dropped, more, now, tag, lease, lease_str, now_str = pop_live_head(known_first)
  if not head then
    return false, 0, dropped, more, false
  end
  local token, token_str = grant(now, head, idle_ms, lease_str, now_str)
  if tag == reply_to then
    return head, token, dropped, false, false
  end
  local unheard = publish(channel_prefix, head, token_str, tag) == 0 and unheard_ms < lease
  if unheard then
    redis.call('PEXPIRE', K[1], unheard_ms)
  end
  return head, token, dropped, false, unheard
end

-- Free the lock held by `owner_id` (its owner) and hand it on. `freed`
-- records the releaser (includes/releases.lua, included before this
-- file), so a resent release is answered the same way.
local function release_and_hand_on(owner_id, idle_ms, channel_prefix, unheard_ms, reply_to, known_first)
  local next_owner, token, dropped, more, unheard =
    grant_next(idle_ms, channel_prefix, unheard_ms, reply_to, known_first)
  if not next_owner then
    redis.call('DEL', K[1])
  end
  record_release(K[5], owner_id, idle_ms)
  return next_owner, token, dropped, more, unheard
end
