-- permit_renew.lua: one call renews or checks every permit this client
-- holds in one slot. For each permit it checks that its lease is still
-- running and, if a lease is given, sets it to that long from now.
--
-- KEYS[2i-1]   the holders key of permit i's set
-- KEYS[2i]     the grants key of that set (kept as long as the lease)
-- ARGV[i]      for permit i: "<owner id> <lease_ms>", lease 0 to only check;
--              or "<owner id> <lease_ms> <token>": held only if that grant
--              is the one held (see renew.lua)
--
-- Reply: {status_1, ..., status_n}
--   1 held (and renewed if asked), 0 lost (released, expired or removed),
--   -1 a key holds a value of another type (nothing changed)
--
-- A permit whose deadline passed is lost even if no call removed it yet:
-- a renewal never revives it. Idempotent: renewing twice sets the same
-- lease.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('permit_renew', false, 2)
if other_family then
  return other_family
end

-- Every item is checked before any lease is set (renewal_items).
local items, refused = renewal_items('permit renew', ARGV, #ARGV)
if not items then
  return refused
end

local now_ms = math.floor(now_us() / 1000)
local reply = {}
for i = 1, #ARGV do
  local holders, grants = KEYS[2 * i - 1], KEYS[2 * i]
  local owner_id, lease_ms, want = items[i][1], items[i][2], items[i][3]
  local deadline = redis.pcall('ZSCORE', holders, owner_id)
  local token = redis.pcall('HGET', grants, owner_id)
  if (type(deadline) == 'table' and deadline.err) or (type(token) == 'table' and token.err) then
    reply[i] = -1
  elseif deadline and token and tonumber(deadline) > now_ms and (not want or token == want) then
    if lease_ms > 0 then
      redis.call('ZADD', holders, 'XX', now_ms + lease_ms, owner_id)
      keep_for(holders, lease_ms)
      keep_for(grants, lease_ms)
    end
    reply[i] = 1
  else
    reply[i] = 0
  end
end
return reply
