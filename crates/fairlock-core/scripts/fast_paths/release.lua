-- fast_paths/release.lua: the common case of release.lua, the owner
-- releasing a lock nobody waits for, answered before the helpers of
-- includes/common.lua are defined (see fast_paths/acquire.lua for why).
--
-- It answers only where the full script would answer the same: the owner
-- key deleted, the release recorded in `freed`, {1, 0, 0, "", 0, 0}.
-- Anything else (waiters to hand on to, a caller that is not the owner, a
-- value fairlock did not write) falls through to the full script below,
-- which has written nothing yet.
--
-- `owner_id`, `value` (the owner key's value) and `first` (the queue's
-- oldest entry, read when the caller is the owner; the handoff starts from
-- it) are read here once for both.
local owner_id = ARGV[1]
local value = redis.call('GET', KEYS[1])
local first
if value then
  -- The holder, as owner_fields reads a value fairlock wrote.
  local holder = string.match(value, '^(%x+%.%x+%.[1-9]%d*) %d+$')
  if holder == owner_id and #holder <= 128 and #value - #holder <= 19 then
    first = redis.call('ZRANGE', KEYS[2], '0', '0')[1]
    if not first then
      redis.call('DEL', KEYS[1])
      redis.call('SET', KEYS[5], owner_id, 'PX', ARGV[2])
      return {1, 0, 0, '', 0, 0}
    end
  end
end
