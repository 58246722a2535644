-- includes/permits.lua: the helpers of the permit scripts (the fair
-- semaphore and the fair read-write lock), sent after common.lua, whose
-- next_seq (KEYS[4]), digits, now_us, MAX_LEASE_MS and scan bounds they use.
--
-- Every permit script takes the five keys of one permit set, all under the
-- hash tag of its name (`<prefix>{<escaped name>}:<sem|rw>:...`), so a set
-- lives in one cluster slot and never shares a key with a lock:
--   KEYS[1] holders  zset   holder owner id -> lease deadline, ms of server time
--   KEYS[2] queue    zset   waiter owner id -> ticket (FIFO order)
--   KEYS[3] alive    zset   client tag -> heartbeat deadline, ms of server time;
--                           also released owner id -> the ms of server time
--                           its release is forgotten at (permit_release.lua:
--                           a resend of the release is recognised until
--                           then); an entry past its time is gone either way
--   KEYS[4] seq      string the last token or ticket issued (one counter)
--   KEYS[5] grants   hash   holder owner id -> its fencing token; the field
--                           "limit" -> the permit count last asked for
--
-- An owner id is `<nonce>.<client tag>.<lease ms>.<permits>`. permits >= 1
-- asks for one permit shared with at most that many holders in all (a
-- semaphore permit, or a reader with a huge count); permits 0 asks to hold
-- alone (a writer). A request fits when
--   shared:    no exclusive holder, and fewer holders than the limit (the
--              stored "limit", or the owner id's own count if none is stored);
--   exclusive: no holder at all.
-- An exclusive holder therefore always holds alone, so whether one holds is
-- a look at the single holder when there is exactly one: O(1).
--
-- Grants go from the head of the queue while the head fits and stop at the
-- first live waiter that does not: strict FIFO, so a waiting writer blocks
-- the readers behind it (writers never starve), and the readers at the
-- head are granted together.
--
-- Every call first removes holders whose deadline passed (a bounded batch),
-- so a dead holder's permit returns at most its lease after its last
-- renewal, without any timer. holders and grants expire no sooner than the
-- longest lease set in them; queue and alive like a lock's.
--
-- Scripts read every key they will write (with read_key, which names the
-- key of a foreign type) before their first write, so a failing call
-- leaves Redis as it found it.

-- The most permits a set may have; also the readers' count of a read-write
-- lock, which is in effect unlimited.
local MAX_PERMITS = 1000000

-- The tag, lease and permit count of an owner id, or nil if fairlock did not
-- write it (such an entry is dropped like a dead one).
local function parse_permit_owner_id(owner_id)
  local tag, lease, permits = string.match(owner_id, '^%x+%.(%x+)%.(%d+)%.(%d+)$')
  if not tag then
    return nil
  end
  lease, permits = tonumber(lease), tonumber(permits)
  if lease < 1 or lease > MAX_LEASE_MS or permits > MAX_PERMITS then
    return nil
  end
  return tag, lease, permits
end

-- `command` on KEYS[i]; a key of a foreign type fails the script with an
-- error that names the key.
local function read_key(i, command, ...)
  local reply = redis.pcall(command, KEYS[i], ...)
  if type(reply) == 'table' and reply.err then
    if string.sub(reply.err, 1, 9) == 'WRONGTYPE' then
      error({err = 'WRONGTYPE fairlock key ' .. KEYS[i] ..
        ' holds a value of another type'})
    end
    error(reply)
  end
  return reply
end

-- Makes `key` live at least `ms` more (never shortens its TTL).
local function keep_for(key, ms)
  local ttl = redis.call('PTTL', key)
  if ttl == -1 or (ttl >= 0 and ttl < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- Removes holders whose lease ran out, at most 128 a call (the rest stay
-- counted until a later call: conservative, never an extra grant).
local function expire_holders(now_ms)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', digits(now_ms), 'LIMIT', 0, 128)
  if #gone > 0 then
    redis.call('ZREM', KEYS[1], unpack(gone))
    redis.call('HDEL', KEYS[5], unpack(gone))
  end
end

-- Whether a request for `permits` fits beside the holders now; `limit`
-- is the shared limit in force.
local function fits(permits, limit)
  local count = redis.call('ZCARD', KEYS[1])
  if count == 0 then
    return true
  end
  if permits == 0 then
    return false
  end
  if count == 1 then
    local _, _, only = parse_permit_owner_id(redis.call('ZRANGE', KEYS[1], 0, 0)[1])
    if only == 0 then
      return false
    end
  end
  return count < limit
end

-- The shared limit for an owner id asking with `permits`.
local function limit_for(stored, permits)
  return tonumber(stored) or permits
end

-- Makes `owner_id` a holder for `lease_ms` from now, with a fresh token.
local function grant_permit(now, owner_id, lease_ms, idle_ms)
  local token = next_seq(now, idle_ms)
  redis.call('ZADD', KEYS[1], math.floor(now / 1000) + lease_ms, owner_id)
  redis.call('HSET', KEYS[5], owner_id, digits(token))
  keep_for(KEYS[1], lease_ms)
  keep_for(KEYS[5], lease_ms)
  return token
end

-- common.lua's publish, for an owner id whose tag is already parsed (a permit
-- owner id has one field more than a lock's). Same message, so the client's
-- one grant router serves both; KEYS[1] names the set.
local function publish_permit(channel_prefix, owner_id, tag, what)
  return publish_to(channel_prefix .. tag, owner_id .. ' ' .. what .. ' ' .. KEYS[1])
end

-- Direct handoff to as many waiters as fit: from the head of the queue,
-- dropping dead waiters on the way, granting each live one that fits (its
-- own lease, a fresh token, woken on its process's channel) and stopping
-- at the first live one that does not. A grant whose message reached
-- nobody keeps its place only for `unheard_ms` (the waiter TTL), as a
-- lock's does. Work is bounded like pop_live_head's. `stored` is the
-- stored limit (grants' "limit" field, false if none) as the caller read
-- or wrote it: callers read it first anyway, as the type check of grants.
-- Returns the grants as a flat list {owner id, token, unheard, ...} (unheard:
-- 1 if the grant's message reached nobody and its lease was cut to
-- `unheard_ms`, so whoever wakes it must set its lease), the number of
-- dead waiters dropped, and whether the search stopped with entries left
-- to look at (the caller's client then goes on with heartbeat calls).
-- Windows grow like a lock's (128 entries in all): a release usually
-- grants the head and finds the next one blocked, so the first window
-- holds two entries, not a hundred to parse.
local PERMIT_SCAN_WINDOWS = {2, 14, 48, 64}

local function grant_waiting(now, idle_ms, channel_prefix, unheard_ms, stored)
  local granted, dropped = {}, 0
  local now_ms = math.floor(now / 1000)
  for _, size in ipairs(PERMIT_SCAN_WINDOWS) do
    local window = redis.call('ZRANGE', KEYS[2], 0, size - 1)
    if #window == 0 then
      return granted, dropped, false
    end
    local parsed, tags, seen = {}, {}, {}
    for i, owner_id in ipairs(window) do
      local tag, lease, permits = parse_permit_owner_id(owner_id)
      parsed[i] = {tag, lease, permits}
      if tag and not seen[tag] then
        seen[tag] = true
        tags[#tags + 1] = tag
      end
    end
    local alive = {}
    if #tags > 0 then
      local deadlines = redis.call('ZMSCORE', KEYS[3], unpack(tags))
      for i, tag in ipairs(tags) do
        local deadline = tonumber(deadlines[i])
        alive[tag] = deadline ~= nil and deadline >= now_ms
      end
    end
    local remove, blocked = {}, false
    for i, owner_id in ipairs(window) do
      local tag, lease, permits = parsed[i][1], parsed[i][2], parsed[i][3]
      if not (tag and alive[tag]) then
        remove[#remove + 1] = owner_id
        dropped = dropped + 1
      elseif fits(permits, limit_for(stored, permits)) then
        local token = grant_permit(now, owner_id, lease, idle_ms)
        local unheard = publish_permit(channel_prefix, owner_id, tag, digits(token)) == 0
          and unheard_ms < lease
        if unheard then
          redis.call('ZADD', KEYS[1], 'XX', now_ms + unheard_ms, owner_id)
        end
        remove[#remove + 1] = owner_id
        granted[#granted + 1] = owner_id
        granted[#granted + 1] = token
        granted[#granted + 1] = unheard and 1 or 0
      else
        blocked = true
        break
      end
    end
    if #remove > 0 then
      redis.call('ZREM', KEYS[2], unpack(remove))
    end
    if blocked or #window < size then
      return granted, dropped, false
    end
  end
  return granted, dropped, true
end
