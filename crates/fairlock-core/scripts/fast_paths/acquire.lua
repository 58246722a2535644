-- fast_paths/acquire.lua: the common cases of acquire.lua, answered before
-- the helpers of includes/common.lua are defined: a free lock that nobody
-- waits for is granted, and a caller finding the lock held joins the
-- queue. Redis builds those helpers, about 25 closures, on every call, and
-- with the pattern matches and tables the full script uses they cost it
-- as much time as the commands themselves (a join: 8 commands, about 24 us
-- of Redis time by the full script, about 17 us here, on this project's
-- 2-core machine).
--
-- It answers only where the full script would answer the same:
--   * a grant {1, token}, with the counter and the owner key written as
--     the full script writes them (its ZCARD and EXISTS replace the full
--     script's SET NX GET, so it decides before writing anything);
--   * a join {2, ticket, waiters ahead, 0, 0} of a lock held by another
--     owner id, in mode "wait", not rejoining: the liveness entry, the
--     ticket and the queue entry written, and both keys' TTLs set, as the
--     full script's enqueue does.
-- Anything else (a free lock with waiters, a caller that owns the lock,
-- mode "try" on a held lock, a rejoin, an owner id or owner value the
-- full script would refuse, a key of a foreign type) falls through to
-- the full script below with Redis as it found it, but for two cases of a
-- join, which fall through after writing the caller's liveness (the full
-- script then writes it again, as it would have alone): a resend, found
-- only by its queue entry's write, which puts the counter back first; and
-- a counter of a foreign type, found by the draw (which writes nothing).

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('acquire', true, 5)
if other_family then
  return other_family
end

-- `waiting`, the queue's length, is read here once for both.
local waiting = redis.call('ZCARD', KEYS[2])
if waiting == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  -- The lease, as parse_owner_id reads it and usable accepts it (an id of
  -- at most 128 bytes, a lease of 1 ms to a day; a leading zero is
  -- refused).
  local fast_lease = #ARGV[1] <= 128 and string.match(ARGV[1], '^%x+%.%x+%.([1-9]%d*)$')
  if fast_lease and tonumber(fast_lease) <= 86400000 then
    local t = redis.call('TIME')
    local drawn, seq, seq_str = fast_draw(t, tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[5])
    if drawn then
      redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. seq_str, 'PX', fast_lease)
      return {1, seq}
    end
  end
elseif ARGV[2] == 'wait' and not ARGV[7] then
  -- The holder, as owner_fields reads a value fairlock wrote; the caller's
  -- tag and lease, as parse_owner_id and usable take them.
  local value = redis.pcall('GET', KEYS[1])
  local holder = type(value) == 'string' and string.match(value, '^(%x+%.%x+%.[1-9]%d*) %d+$')
  local tag, lease = string.match(ARGV[1], '^%x+%.(%x+)%.([1-9]%d*)$')
  local waiter_ttl_ms = tonumber(ARGV[3])
  if holder and holder ~= ARGV[1] and #holder <= 128 and #value - #holder <= 19
      and tag and #ARGV[1] <= 128 and tonumber(lease) <= 86400000 and waiter_ttl_ms then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    -- The liveness entry first, as the full script's enqueue writes it:
    -- an error (a foreign type) wrote nothing.
    local alive = redis.pcall('ZADD', KEYS[3], math.floor(now / 1000) + waiter_ttl_ms, tag)
    if type(alive) ~= 'table' then
      local drawn, ticket, ticket_str, previous = fast_draw(t, now, ARGV[5])
      if drawn then
        if redis.call('ZADD', KEYS[2], 'NX', ticket_str, ARGV[1]) == 1 then
          redis.call('PEXPIRE', KEYS[2], ARGV[4])
          redis.call('PEXPIRE', KEYS[3], ARGV[4])
          return {2, ticket, waiting, 0, 0}
        end
        -- A resend: the full script answers it with the place taken the
        -- first time, from the counter as it was.
        if previous then
          redis.call('SET', KEYS[4], previous, 'KEEPTTL')
        else
          redis.call('DEL', KEYS[4])
        end
      end
    end
  end
end
