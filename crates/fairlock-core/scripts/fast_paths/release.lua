-- fast_paths/release.lua: the common cases of release.lua, answered before
-- the helpers of includes/common.lua are defined (see fast_paths/acquire.lua
-- for why): the owner's release of a lock nobody waits for, and the
-- owner's release handed to a live waiter at the head of the queue (a
-- handoff: 10 commands, about 30 us of Redis time by the full script, about
-- 20 us here).
--
-- It answers only where the full script would answer the same:
--   * nobody waits: the owner key deleted, the release recorded in
--     `freed` (includes/releases.lua), {1, 0, 0, "", 0, 0};
--   * the queue's oldest entry is a well-formed owner id whose process is
--     alive: it leaves the queue and owns the lock with its own lease and
--     the next token, is woken by a message on its process's channel
--     (none if its process is the caller's, `reply_to`; the lease cut to
--     the waiter TTL if the message reached nobody), the release is
--     recorded, {1, 0, 0, next, token, unheard}.
-- Anything else (a dead or malformed head, a caller that is not the owner,
-- a value fairlock did not write, a counter of a foreign type) falls
-- through to the full script below, which has written nothing yet.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('release', true, 5)
if other_family then
  return other_family
end

-- `owner_id`, `value` (the owner key's value) and `first` (the queue's
-- oldest entry, read when the caller is the owner; the full script's
-- handoff starts from it) are read here once for both.
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
      record_release(KEYS[5], owner_id, ARGV[2])
      return {1, 0, 0, '', 0, 0}
    end
    -- The head's tag and lease, as parse_owner_id and usable take them,
    -- and its process alive at the server's time (pop_live_head's check).
    local tag, lease_str = string.match(first, '^%x+%.(%x+)%.([1-9]%d*)$')
    local lease = tonumber(lease_str)
    if tag and #first <= 128 and lease <= 86400000 then
      local t = redis.call('TIME')
      local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
      local deadline = tonumber(redis.call('ZSCORE', KEYS[3], tag))
      if deadline and deadline >= math.floor(now / 1000) then
        local drawn, token, token_str = fast_draw(t, now, ARGV[2])
        if drawn then
          redis.call('ZREM', KEYS[2], first)
          redis.call('SET', KEYS[1], first .. ' ' .. token_str, 'PX', lease_str)
          local unheard = 0
          if tag ~= ARGV[5] then
            -- The waiter TTL as a number, as the full script reads it.
            local unheard_ms = tonumber(ARGV[4])
            -- As publish() of includes/common.lua sends it.
            if publish_to(ARGV[3] .. tag, first .. ' ' .. token_str .. ' ' .. KEYS[1]) == 0
                and unheard_ms < lease then
              redis.call('PEXPIRE', KEYS[1], unheard_ms)
              unheard = 1
            end
          end
          record_release(KEYS[5], owner_id, ARGV[2])
          return {1, 0, 0, first, token, unheard}
        end
      end
    end
  end
end
