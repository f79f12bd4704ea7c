-- Mark reservations bound once their Bindings exist. Payload: {uids} (1..MARK_BOUND_MAX pod uids of this
-- node; the extender confirms the binds it answered in one call per node, controller/confirm.py `_confirm`).
-- Idempotent. One feed message for all the reservations it changed: the first as `uid`/`res`, the
-- others in `more` ({uid: res}) with `span` = how many it changed (the node's version moves by that much),
-- so the feed carries one message per batch, not one per pod.
-- Replies {missing = [uids with no reservation]} (an empty list is encoded `{}`).
local damaged = clear_damage()
if damaged then return damaged end
local p, err = payload()
if err then return err end
local uids = p.uids
if not is_list(uids, 512) or #uids == 0 then return fail("BADINPUT", "uids must be a list of 1..512 pod uids") end
for _, uid in ipairs(uids) do
  local bad = check_uid(uid)
  if bad then return fail("BADINPUT", bad) end
end
local more = need_keys({}, uids)
if more then return more end
local missing, changed, first, n = {}, {}, nil, 0
local now = now_ms()
for _, uid in ipairs(uids) do
  local r = res_of(uid)
  if not r then
    missing[#missing + 1] = uid
  elseif r.state ~= "bound" then
    r.state, r.bound_at = "bound", now
    redis.call('HSET', res_key(uid), 'state', r.state, 'bound_at', r.bound_at)
    n = n + 1
    if first == nil then first = {uid, r} else changed[uid] = r end
  end
end
if first ~= nil then
  publish('bound', first[1], first[2], {}, nil, n > 1 and {more = changed, span = n} or nil)
end
return cjson.encode({missing = missing})
