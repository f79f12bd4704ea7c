-- Replace a node's state with what the API server implies, atomically (rebuild). Payload: {error,
-- cards, bound: [{uid, cards, mem, cores, slices, pod}]}. Pending reservations of pods not in
-- `bound` are kept when they still fit (a binder may be mid-flight); the rest are dropped.
local p, err = payload()
if err then return err end
local _, bad = check_cards(p.cards)
if bad then return fail("BADINPUT", bad) end
if type(p.bound) ~= "table" then return fail("BADINPUT", "bound must be a list") end
for _, b in ipairs(p.bound) do
  local e = check_res(b)
  if e then return fail("BADINPUT", "bound: " .. e) end
end
local pending, is_bound = {}, {}
for _, b in ipairs(p.bound) do is_bound[b.uid] = true end
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if r and r.state == "pending" and not is_bound[uid] then pending[#pending + 1] = {uid, r} end
  redis.call('DEL', res_key(uid))
end
redis.call('DEL', PODS_KEY)
write_cards(p.cards, true)
redis.call('HSET', NODE_KEY, 'error', p.error or "")
local now = now_ms()
for _, b in ipairs(p.bound) do book(b, "bound", now) end
local kept = 0
for _, e in ipairs(pending) do
  local uid, r = e[1], e[2]
  local fits = true
  local list = split_cards(r.cards)
  for _, idx in ipairs(list) do
    local c = card_view(idx)
    if not c or c.health ~= "ok" or c.mem_free < r.mem or c.cores_free < r.cores
        or c.slices + r.slices > c.slice_limit then fits = false end
  end
  if fits then
    local nums = {}
    for i, idx in ipairs(list) do nums[i] = tonumber(idx) end
    book({uid = uid, cards = nums, mem = r.mem, cores = r.cores, slices = r.slices, pod = r.pod}, "pending",
         r.created)
    kept = kept + 1
  end
end
publish('rebuild', nil, nil)
return cjson.encode({ok = true, bound = #p.bound, pending_kept = kept, pending_dropped = #pending - kept})
