-- Forget a deleted node and everything booked on it. Payload: {keep_ms} or nothing. With keep_ms, a node
-- where a reservation is still settling (`settles`: pending, or made or bound in the last keep_ms) is left
-- as it is and -1 is returned: its binder writes the Binding and its record whatever the ledger says, so
-- the caller keeps the booking (replace_node onto placeholder cards) instead. Else returns 1 if the node
-- existed, 0 if not. KEYS: the whole node (with its tombstones, `<base>:ended`, deleted with it).
local damaged = clear_damage()
if damaged then return damaged end
local p, err = payload()
if err then return err end
local keep_ms = p.keep_ms
if keep_ms ~= nil and not is_int(keep_ms, 0, 86400000) then return fail("BADINPUT", "keep_ms must be 0..86400000") end
local more = need_node_keys()
if more then return more end
if keep_ms ~= nil then
  -- not verified under this Redis's history: a booking it lost may be held there; removed now, the node
  -- would come back as new (the caller keeps it on placeholder cards instead)
  if redis.call('HGET', NODE_KEY, 'version') and not verified() then return -1 end
  local now = now_ms()
  for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
    local r = res_view(uid)
    if r and settles(r, now, now - keep_ms) then return -1 end
  end
end
for _, idx in ipairs(card_indices()) do redis.call('DEL', card_key(idx)) end
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do redis.call('DEL', res_key(uid)) end
redis.call('DEL', PODS_KEY)
redis.call('DEL', ENDED_KEY)  -- its tombstones: no booking is made on a node Redis does not hold (observe.lua)
local existed = redis.call('EXISTS', NODE_KEY)
local v = counted(redis.call('HGET', NODE_KEY, 'version'), 1)
-- `prev`, the stamp of the node's last write: a mirror drops its snapshot only if it is of that write, and reads the
-- node otherwise. Pub/Sub channels are shared by every database of a Redis, so a mirror also hears the removals of
-- a ledger with the same keyPrefix in another database (a move from /0 to /1 while old replicas run, or clusters
-- that share a Redis by database number), of a node that may have its name but not its history.
local prev = redis.call('HGET', NODE_KEY, 'stamp') or ""
redis.call('DEL', NODE_KEY)
redis.call('PUBLISH', FEED, cjson.encode({node = NODE, version = v, kind = 'removed', cards = {}, error = "",
                                          prev = prev}))
return existed
