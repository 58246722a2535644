-- atomic_buy.lua: the whole sale of one unit in one script, no lock.
-- Redis runs a script alone, so the check and the decrement cannot be
-- interleaved with another buyer's: this is the right tool when the sale
-- is nothing but Redis key updates.
--
-- KEYS[1] stock   string: units left
-- KEYS[2] orders  hash: order id -> buyer
-- ARGV[1] order id (unique per purchase attempt)
-- ARGV[2] buyer
--
-- Replies:
--   n >= 0  sold; n units are left
--   -1      sold out; nothing changed
--   -2      no such item (the stock key is missing); nothing changed
--   -3      the order id is taken; nothing changed
--
-- Idempotent: a resend after a reconnect finds its own order id and
-- changes nothing (answering -3), so a unit is never sold twice.

local stock = redis.call('GET', KEYS[1])
if not stock then
  return -2
end
if tonumber(stock) <= 0 then
  return -1
end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 0 then
  return -3
end
return redis.call('DECR', KEYS[1])
