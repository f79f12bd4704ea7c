-- Release pending reservations older than a TTL (their binder died or gave up), unless a bind attempt's
-- Binding may still be committed (`settle_by`, in_flight in _lib.lua). Payload: {ttl_ms, uids}.
-- uids (optional): only these may be released (the ones the caller vetted: a watcher holding back a bound
-- pod's record has booked it or kept it out of the list); others wait for the caller's next sweep.
-- Which reservations expire is the twin of shared/domain/reconcile.py `expires` (tests/redis/test_expires_twin.py).
-- KEYS: the whole node (every reservation is read), and the cards of the ones released.
local p, err = payload()
if err then return err end
if not is_int(p.ttl_ms, 1000, 86400000) then return fail("BADINPUT", "ttl_ms must be 1000..86400000") end
local only = nil
if p.uids ~= nil then
  if type(p.uids) ~= "table" or (#p.uids == 0 and next(p.uids) ~= nil) then
    return fail("BADINPUT", "uids must be a list of pod uids")
  end
  only = {}
  for _, u in ipairs(p.uids) do
    if type(u) ~= "string" then return fail("BADINPUT", "uids must be strings") end
    only[u] = true
  end
end
local more = need_node_keys()
if more then return more end
local now = now_ms()
local stale, expiring, cards = {}, {}, {}
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if not r then
    stale[#stale + 1] = uid
  elseif r.state == "pending" and (only == nil or only[uid]) and not in_flight(r, now)
      and (now - r.created > p.ttl_ms or r.created - now > FUTURE_MS) then
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
