-- includes/key_family.lua: sent first in every lock and permit script.
-- A lock's keys and a permit set's share their hash tag and three of their
-- types, but not the first key (a lock's owner is a string, a permit set's
-- holders a zset) nor the last (a lock's `freed` is a string, a permit
-- set's `grants` a hash), and both travel in a `LockKeys` value. A script
-- of one family run on the other family's keys could write a key of the
-- wrong type (an acquire on a free permit set wrote a string where its
-- holders belong, a permit acquire on a free lock a zset and a hash), or
-- take the other family's entries for its own. The client picks the
-- scripts by the keys' family and never mixes them; a program calling the
-- scripts itself is refused here, before anything is read or written.
--
-- refuse_other_family(script, lock_family, stride) checks KEYS[1],
-- KEYS[1 + stride], ...: a lock's owner key ends in `}:owner`, a permit
-- set's holders key in `}:<family>:holders`. It returns the error reply to
-- give, or nil.
local function refuse_other_family(script, lock_family, stride)
  for i = 1, #KEYS, stride do
    local key = KEYS[i]
    local ours
    if lock_family then
      ours = string.sub(key, -7) == '}:owner'
    else
      ours = string.find(key, '}:%l+:holders$') ~= nil
    end
    if not ours then
      return redis.error_reply('ERR fairlock ' .. script .. ': KEYS[' .. i .. '] ' .. key ..
        ' is not ' .. (lock_family and "a lock's owner key" or "a permit set's holders key") ..
        ': the keys of the other family are refused (lock and permit scripts never share keys)')
    end
  end
end
