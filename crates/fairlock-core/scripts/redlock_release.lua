-- redlock_release.lua: give back one primary's vote.
--
-- KEYS[1] owner    string  the owner id of the holder on this primary
-- ARGV[1] owner_id         the releasing owner id
-- ARGV[2] channel          where waiters hear of releases ("" = tell nobody:
--                          an attempt that failed to win a majority gives
--                          back its votes without waking waiters, none of
--                          whom was blocked by a holder that existed)
--
-- Reply: 1 if this primary's key was the owner id's and is deleted, 0 if
-- it was not (expired, never set, or someone else's; nothing changed).
--
-- Cost: O(1) plus one PUBLISH. Idempotent: a resend finds nothing.

if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] ~= '' then
  redis.call('PUBLISH', ARGV[2], 'released')
end
return 1
