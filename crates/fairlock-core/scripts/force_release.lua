-- force_release.lua: ADMIN ONLY. Frees the lock from the holder the caller
-- saw (`expected`, read with inspect) and hands it to the oldest live
-- waiter. The evicted holder's process is told on its channel
-- ("<owner id> revoked:<token>"), so its lease-lost signal fires at once;
-- the token names the grant revoked (an owner id that queues again gets
-- later grants under the same id).
--
-- KEYS[1] owner   KEYS[2] queue   KEYS[3] alive   KEYS[4] seq   KEYS[5] freed
-- ARGV[1] expected        the holder as the caller saw it: "<owner id> <token>"
--                         (exactly that grant), or "<owner id>" (that owner id's
--                         grant, whatever its token), or "" to only hand a
--                         free lock on
-- ARGV[2] idle_ms         TTL of the seq and freed keys
-- ARGV[3] channel_prefix  waiters are woken on channel_prefix .. client tag
-- ARGV[4] waiter_ttl_ms   lease of a grant whose message reached nobody
--
-- Reply: {status, holder, dropped, more}
--   status 1 released `expected` (and handed the lock on if anyone waits)
--          0 the lock is not held by `expected` (already released, or a
--            later holder has it): nothing changed; holder is the
--            current one ("" if free)
--
-- Idempotent: a resend finds a different holder (or none) and changes
-- nothing, so it never frees the next holder.

-- The other family's keys are refused first (includes/key_family.lua).
local other_family = refuse_other_family('force_release', true, 5)
if other_family then
  return other_family
end

local expected = ARGV[1]
local held = redis.call('GET', KEYS[1])
if foreign_owner(held) then
  return foreign_owner_error()
end
local holder = parse_owner(held)
local matches = held and (held == expected or holder == expected)
if expected == '' or not matches then
  local dropped, more, next_owner, _ = 0, false, false, 0
  if not held and expected == '' then
    -- A free lock with waiters (its holder's lease ran out): hand it on.
    next_owner, _, dropped, more = grant_next(tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
  end
  return {0, next_owner or holder or '', dropped, more and 1 or 0}
end
-- `freed` is deliberately left alone: the evicted holder's own release must
-- be refused (its lease is lost), not taken for a resend.
local next_owner, _, dropped, more = grant_next(tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]))
if not next_owner then
  redis.call('DEL', KEYS[1])
end
publish(ARGV[3], holder, 'revoked:' .. string.match(held, ' (%d+)$'))
return {1, holder, dropped, more and 1 or 0}
