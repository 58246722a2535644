-- renew.lua: one call renews or checks every lock this client holds in one
-- slot. For each lock it checks that the holder still owns it and, if a
-- lease is given, sets the lease to that long from now.
--
-- KEYS[1..n]   the owner key of each lock
-- ARGV[i]      for KEYS[i]: "<owner id> <lease_ms>", lease 0 to only check;
--              or "<owner id> <lease_ms> <token>": held only if that grant
--              is the one held (a waiter confirming the grant it took: the
--              owner id may hold a later grant by then, and the waiter's
--              guard must carry the token Redis holds)
--
-- Reply: {status_1, ..., status_n}
--   1 held (and renewed if asked), 0 lost (gone or owned by another),
--   -1 the key holds a value of another type (nothing changed)
--
-- Idempotent: renewing twice sets the same lease. Cost: 2 commands a lock.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('renew', true, 1)
if other_family then
  return other_family
end

-- Every item is checked before any lease is set (renewal_items).
local items, refused = renewal_items('renew', ARGV, #KEYS)
if not items then
  return refused
end

local reply = {}
for i, key in ipairs(KEYS) do
  local owner_id, lease_ms, want = items[i][1], items[i][2], items[i][3]
  local held = redis.pcall('GET', key)
  if type(held) == 'table' and held.err then
    reply[i] = -1
  elseif parse_owner(held) == owner_id and (not want or select(2, owner_fields(held)) == want) then
    if lease_ms > 0 then
      redis.call('PEXPIRE', key, lease_ms)
    end
    reply[i] = 1
  else
    reply[i] = 0
  end
end
return reply
