-- includes/publish.lua: sent second in every lock and permit script, after
-- includes/key_family.lua and before any fast path.
--
-- publish_to(channel, message): tells one process, on its grant channel,
-- what happened to one of its waiters (a grant, a permit, a revocation),
-- and returns how many subscribers received it. On a cluster the channel
-- carries a hash tag in the lock's own slot and the message goes by
-- SPUBLISH (it never crosses the cluster bus); elsewhere by PUBLISH.
--
-- A message is always sent after the script's writes (the grant is made
-- first, then announced), so a refused one must not fail the script: Redis
-- keeps the writes of a script that fails halfway, and the caller would be
-- told that a release it made had failed. A refusal (the user's ACL changed
-- after the client's connect-time check, or, for a program calling these
-- scripts itself, a channel in another cluster slot) counts as a message
-- nobody received: the caller cuts the grant's lease to the waiter TTL as
-- for any unheard grant, and the waiter's process finds the grant at its
-- next heartbeat. Redis's log gets a warning naming the refusal.
local function publish_to(channel, message)
  local command = string.find(channel, '{', 1, true) and 'SPUBLISH' or 'PUBLISH'
  local heard = redis.pcall(command, channel, message)
  if type(heard) == 'table' then
    redis.log(redis.LOG_WARNING, 'fairlock: ' .. command .. ' ' .. channel .. ' refused (' ..
      tostring(heard.err) .. '); its process learns of it at its next heartbeat')
    return 0
  end
  return heard
end
