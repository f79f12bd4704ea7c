-- Release pending reservations older than a TTL (their binder died or gave up), unless a bind attempt's
-- Binding may still be committed (`settle_by`, in_flight in _lib.lua). One stamped later than now + FUTURE_MS
-- (Redis's clock stepped back since: its age cannot be told, its Binding may be in flight) is stamped anew at
-- now instead (`restamps` in _lib.lua): released a TTL later. Payload: {ttl_ms, uids}.
-- uids (optional): only these may be released (the ones the caller vetted: a watcher holding back a bound
-- pod's record has booked it or kept it out of the list); others wait for the caller's next sweep.
-- Which reservations expire (and which are stamped anew) is the twin of shared/domain/reconcile.py `expires`
-- (and `restamps`; tests/redis/test_expires_twin.py).
-- KEYS: the whole node (every reservation is read), and the cards of the ones released.
local damaged = clear_damage()
if damaged then return damaged end
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
local stale, expiring, cards, again = {}, {}, {}, {}
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if not r then
    stale[#stale + 1] = uid
  elseif r.state == "pending" and (only == nil or only[uid]) and restamps(r, now) then
    again[#again + 1] = {uid, r}  -- stamped ahead of this clock: its TTL starts now (restamps in _lib.lua)
  elseif r.state == "pending" and (only == nil or only[uid]) and not in_flight(r, now)
      and now - r.created > p.ttl_ms then
    expiring[#expiring + 1] = {uid, r}
    for _, idx in ipairs(split_cards(r.cards)) do cards[#cards + 1] = idx end
  end
end
more = need_keys(cards, {})
if more then return more end
for _, e in ipairs(again) do
  redis.call('HSET', res_key(e[1]), 'created', now, 'settle_by', math.min(e[2].settle_by, now))
end
for _, uid in ipairs(stale) do redis.call('SREM', PODS_KEY, uid) end
local gone = {}
for _, e in ipairs(expiring) do
  local uid, r = e[1], e[2]
  local views = drop_reservation(uid, r)
  publish('expire', uid, false, split_cards(r.cards), views)
  gone[#gone + 1] = uid
end
return cjson.encode(gone)
