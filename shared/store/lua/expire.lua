-- Release pending reservations older than a TTL (their binder died or gave up). Payload: {ttl_ms}.
local p, err = payload()
if err then return err end
if not is_int(p.ttl_ms, 1000, 86400000) then return fail("BADINPUT", "ttl_ms must be 1000..86400000") end
local now = now_ms()
local gone = {}
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if not r then
    redis.call('SREM', PODS_KEY, uid)
  elseif r.state == "pending" and (now - r.created > p.ttl_ms or r.created - now > FUTURE_MS) then
    local views = drop_reservation(uid, r)
    publish('expire', uid, false, split_cards(r.cards), views)
    gone[#gone + 1] = uid
  end
end
return cjson.encode(gone)
