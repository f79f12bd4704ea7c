-- Release pending reservations older than a TTL (their binder died or gave up). Payload: {ttl_ms}.
-- KEYS: the whole node (every reservation is read), and the cards of the ones released.
local p, err = payload()
if err then return err end
if not is_int(p.ttl_ms, 1000, 86400000) then return fail("BADINPUT", "ttl_ms must be 1000..86400000") end
local more = need_node_keys()
if more then return more end
local now = now_ms()
local stale, expiring, cards = {}, {}, {}
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if not r then
    stale[#stale + 1] = uid
  elseif r.state == "pending" and (now - r.created > p.ttl_ms or r.created - now > FUTURE_MS) then
    expiring[#expiring + 1] = {uid, r}
    for _, idx in ipairs(split_cards(r.cards)) do cards[#cards + 1] = idx end
  end
end
more = need_keys(cards, {})
if more then return more end
for _, uid in ipairs(stale) do redis.call('SREM', PODS_KEY, uid) end
local gone = {}
for _, e in ipairs(expiring) do
  local uid, r = e[1], e[2]
  local views = drop_reservation(uid, r)
  publish('expire', uid, false, split_cards(r.cards), views)
  gone[#gone + 1] = uid
end
return cjson.encode(gone)
