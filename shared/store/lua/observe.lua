-- Record the allocation a bound pod carries (watchers, rebuilds). Payload: {uid, cards, mem, cores,
-- slices, pod, keep_bound}. Idempotent. The API server is the truth: the booking is made even when it
-- over-commits a card (reported back so it can be alerted on), never silently dropped.
-- keep_bound: a bound reservation is what our bind booked and wrote; a record that differs from it was
-- changed afterwards, so it is not booked: {kept = true, booked = <the reservation>} (checked here, in
-- the same step as the write, so no other call can come between the read and the decision).
-- A uid tombstoned on the node (its pod ended, and the pod watcher's release came first: `tombstone`, _lib.lua) is
-- not booked: {ended = true}, nothing written (a record read before the pod ended, its observe late).
local damaged = clear_damage()
if damaged then return damaged end
local p, err = payload()
if err then return err end
local bad = check_res(p)
if bad then return fail("BADINPUT", bad) end
if p.keep_bound ~= nil and type(p.keep_bound) ~= "boolean" then return fail("BADINPUT", "keep_bound must be a boolean") end
if not redis.call('HGET', NODE_KEY, 'version') then
  -- never recreate a node from one pod: after a Redis loss only a rebuild may (with all its pods)
  return cjson.encode({ok = false, reason = "node missing"})
end
if ended_uid(p.uid, now_ms()) then
  return cjson.encode({ok = true, changed = false, overcommit = false, ended = true})
end
local more = need_keys(p.cards, {p.uid})
if more then return more end
local r = res_of(p.uid)
if r then
  more = need_keys(split_cards(r.cards), {})  -- a different booking of the uid is given back
  if more then return more end
end
local csv = cards_csv(p.cards)
if r and r.cards == csv and r.mem == p.mem and r.cores == p.cores and r.slices == p.slices then
  if r.state ~= "bound" then
    local pod = r.pod
    if p.pod ~= nil and p.pod ~= "" then pod = p.pod end
    redis.call('HSET', res_key(p.uid), 'state', 'bound', 'bound_at', now_ms(), 'pod', pod)
    publish('bound', p.uid, res_view(p.uid), {})
    return cjson.encode({ok = true, changed = true, overcommit = overcommitted(p.cards)})
  end
  return cjson.encode({ok = true, changed = false, overcommit = false})
end
if r and r.state == "bound" and p.keep_bound then
  return cjson.encode({ok = true, changed = false, overcommit = false, kept = true,
                       booked = {cards = r.cards, mem = r.mem, cores = r.cores, slices = r.slices}})
end
local touched, kept = {}, nil
if r then
  kept = carry_of(p.uid, r)
  refused_when_full()  -- drop_reservation may begin with the DEL of an emptied removed card
  drop_reservation(p.uid, r)
  touched = split_cards(r.cards)
end
for _, idx in ipairs(p.cards) do touched[#touched + 1] = idx end
-- the pod's booking still, on the record's cards: it keeps its last bind attempt's number and attempts (book's carry)
book(p, "bound", now_ms(), nil, kept)
publish('observe', p.uid, res_view(p.uid), touched)
return cjson.encode({ok = true, changed = true, overcommit = overcommitted(p.cards)})
