-- includes/releases.lua: a lock's record of its last releases, its
-- `freed` key, so that a release sent again after its first send ran is
-- recognised and answered released, not refused as if its lease had run
-- out. Included before the release fast path, which writes it.
--
-- `freed` is a string: the owner ids of the lock's last RELEASES_KEPT
-- releases, newest first, separated by single spaces (an owner id has
-- none), with the idle TTL. One entry was not enough: a resend comes once
-- the client has connected again after the first send's reply was lost
-- with its connection, and the waiters that first send woke may have
-- released meanwhile, each replacing the record; the resend was refused
-- (`NotOwner`) though it ran. Eight entries cover a resend after up to
-- seven later releases; an owner id is at most 128 bytes, so the record
-- is at most about a kilobyte per lock released lately. A value of a
-- foreign type under the key holds no release and is replaced by the next
-- record (fairlock's own disposable key). The helpers take the key.

local RELEASES_KEPT = 8

-- The record at `key` as a string: '' if there is none, or a foreign type.
local function releases_recorded(key)
  local kept = redis.pcall('GET', key)
  if type(kept) == 'string' then
    return kept
  end
  return ''
end

-- Whether `owner_id` can stand in the record: an owner id no lock could
-- have had (empty, with a space, over 128 bytes: only a client of one's
-- own could send one) is never recorded, so never found there either.
local function recordable(owner_id)
  return owner_id ~= '' and #owner_id <= 128 and not string.find(owner_id, ' ', 1, true)
end

-- Whether `owner_id` released the lock lately (one of the last
-- RELEASES_KEPT releases), and the record as read.
local function released_lately(key, owner_id)
  local kept = releases_recorded(key)
  if not recordable(owner_id) then
    return false, kept
  end
  return string.find(' ' .. kept .. ' ', ' ' .. owner_id .. ' ', 1, true) ~= nil, kept
end

-- Records the release of `owner_id` as the newest, keeping the
-- RELEASES_KEPT - 1 newest of the earlier ones, with the idle TTL; an
-- owner id that is not `recordable` (sent as a release already answered)
-- records nothing. A record longer than RELEASES_KEPT owner ids of 128
-- bytes can hold (a string fairlock did not write) starts again.
local function record_release(key, owner_id, idle_ms)
  if not recordable(owner_id) then
    return
  end
  local kept = releases_recorded(key)
  if #kept > RELEASES_KEPT * 129 then
    kept = ''
  end
  local record = owner_id
  if kept ~= '' then
    -- The end of the (RELEASES_KEPT - 1)-th entry, if there are more.
    local cut = 0
    for _ = 1, RELEASES_KEPT - 1 do
      cut = string.find(kept, ' ', cut + 1, true)
      if not cut then
        break
      end
    end
    if cut then
      kept = string.sub(kept, 1, cut - 1)
    end
    record = owner_id .. ' ' .. kept
  end
  redis.call('SET', key, record, 'PX', idle_ms)
end
