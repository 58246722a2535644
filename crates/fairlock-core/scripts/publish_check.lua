-- publish_check.lua: whether the calling user's ACL lets it publish a
-- grant. A release that hands the lock to a waiter of another process
-- publishes inside the script, after its writes; a PUBLISH the ACL refuses
-- there counts as a message nobody received (includes/publish.lua), so
-- every such grant would wait for the waiter's heartbeat. The client asks
-- this once, at connect.
--
-- ARGV[1] command   PUBLISH (a single server) or SPUBLISH (a cluster)
-- ARGV[2] channel   a grant channel of another process
--
-- Reply: 1 if the ACL lets the user run the command on the channel, 0 if
-- not. Read-only. Needs Redis 7.0 or Valkey (redis.acl_check_cmd).
if redis.acl_check_cmd(ARGV[1], ARGV[2], '') then
  return 1
end
return 0
