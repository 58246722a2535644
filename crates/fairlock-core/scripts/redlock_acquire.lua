-- redlock_acquire.lua: one primary's vote in a RedLock acquire.
--
-- RedLock runs this on each of N independent primaries; the caller holds
-- the lock when a majority voted for it within the lease (the client
-- checks the time). A primary votes by setting the owner key, if free, to
-- the caller's owner id with the lease as its TTL.
--
-- KEYS[1] owner  string  the owner id of the holder on this primary; TTL = lease
-- KEYS[2] seq    string  the last fencing token issued on this primary
-- ARGV[1] owner_id       the caller's random owner id (32 hex)
-- ARGV[2] lease_ms       the lease asked for
-- ARGV[3] min_uptime_ms  the delayed-restart rule: a server up for less
--                        than this may have lost, in a restart without
--                        persistence, a key it had voted for, so it does
--                        not vote (and writes nothing)
--
-- Replies:
--   {1, floor}        voted for the caller (or had already: a resend, or
--                     an earlier attempt's vote; its lease set again);
--                     floor = max(seq, server time in us), the least
--                     token this primary lets the grant take
--   {2, pttl, holder} the key is another owner id's; pttl its lease left (ms)
--   {3, uptime_ms}    too recently started to vote; nothing written
--
-- Cost: O(1). INFO server is read inside the script so that the uptime and
-- the vote belong to one server instance: a restart between a check and
-- the vote is impossible.

local owner_id = ARGV[1]
local lease_ms = ms_in_range(ARGV[2], REDLOCK_MAX_LEASE_MS)
if not lease_ms then
  return redis.error_reply('ERR fairlock redlock acquire: lease must be 1 to 86400000 ms, got ' ..
    tostring(ARGV[2]))
end
local min_uptime_ms = tonumber(ARGV[3])

local info = redis.call('INFO', 'server')
local uptime_ms = (tonumber(string.match(info, 'uptime_in_seconds:(%d+)')) or 0) * 1000
if uptime_ms < min_uptime_ms then
  return {3, uptime_ms}
end

local holder = redis.call('GET', KEYS[1])
if holder and holder ~= owner_id then
  return {2, redis.call('PTTL', KEYS[1]), holder}
end
-- Set, or set again: a key of the caller's own is an earlier attempt's
-- vote (its reply lost; the client keeps its owner id across the attempts
-- of one acquire), and this attempt's validity counts from its own start,
-- so the key must live a whole lease from now too.
redis.call('SET', KEYS[1], owner_id, 'PX', ARGV[2])
local now = now_us()
local floor = math.max(read_seq(KEYS[2], now) or 0, now)
return {1, digits(floor)}
