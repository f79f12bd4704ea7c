-- Replace a node's state with what the API server implies, atomically (rebuild, reconcile, a node that
-- stops reporting cards). Payload: {error, cards, bound: [{uid, cards, mem, cores, slices, pod}], keep_ms,
-- keep_from, keep_bound}. Reservations of pods not in `bound` that are still settling (`settles`: pending,
-- as a binder may be mid-flight, or made or bound since now - keep_ms or keep_from) are kept whether or
-- not they fit: their binder goes on to write the Binding and its record whatever the ledger says, so
-- dropping one would offer a share a pod is about to hold (fail open). A card they over-fill is shown so,
-- offers nothing more, and is counted in `pending_overfull`; a card the node no longer reports stays as a
-- "removed" placeholder while they hold it. keep_bound: a pod of `bound` whose reservation here is bound
-- keeps that booking when its record says otherwise (the record changed after our bind, see observe.lua);
-- reported as kept_bound = [uid, ...]. `dropped` counts the reservations it frees (neither bound nor settling).
-- A reservation it writes anew (kept, or a pod of `bound` booked here before) keeps its `binds`, the number of the
-- last bind attempt that held it, and the attempts holding it (`attempts`, _lib.lua): an earlier attempt's give-back
-- (release.lua) leaves it still.
-- A uid tombstoned on the node (its pod ended and the pod watcher released it: `tombstone`, _lib.lua) is not booked:
-- a pod of `bound` read before it ended is left out (reported as ended = [uid, ...]), and a reservation the node
-- holds for one is freed (counted in `dropped`), settling or not.
local damaged = clear_damage()
if damaged then return damaged end
local p, err = payload()
if err then return err end
if p.keep_bound ~= nil and type(p.keep_bound) ~= "boolean" then return fail("BADINPUT", "keep_bound must be a boolean") end
local _, bad = check_cards(p.cards)
if bad then return fail("BADINPUT", bad) end
bad = check_error(p.error)
if bad then return fail("BADINPUT", bad) end
if not is_list(p.bound, 100000) then return fail("BADINPUT", "bound must be a list") end
if p.keep_ms ~= nil and not is_int(p.keep_ms, 0, 86400000) then
  return fail("BADINPUT", "keep_ms must be 0..86400000")
end
if p.keep_from ~= nil and not is_int(p.keep_from, 0, 9007199254740991) then
  return fail("BADINPUT", "keep_from must be a time in ms")
end
if p.verify_after_ms ~= nil and not is_int(p.verify_after_ms, 0, 3600000) then
  return fail("BADINPUT", "verify_after_ms must be 0..3600000")
end
if p.lost ~= nil and type(p.lost) ~= "boolean" then return fail("BADINPUT", "lost must be a boolean") end
local now0 = now_ms()
-- truth_at: when the caller's consistent read began, on this Redis's clock (it read TIME before): never later
if p.truth_at ~= nil and not is_int(p.truth_at, 0, now0) then
  return fail("BADINPUT", "truth_at must be a time in ms no later than now")
end
local keep_from = math.huge
if p.keep_ms ~= nil then keep_from = now0 - p.keep_ms end
-- keep_from: an instant on Redis's clock (the caller read the ledger after it), so a reservation made
-- after the caller's read is kept however long the caller took
if p.keep_from ~= nil then keep_from = math.min(keep_from, p.keep_from) end
-- Everything is validated before the first write: a script that fails half-way is not rolled back.
local pending, is_bound = {}, {}
for _, b in ipairs(p.bound) do
  local e = check_res(b)
  if e then return fail("BADINPUT", "bound: " .. e) end
  if is_bound[b.uid] then return fail("BADINPUT", "bound: uid " .. b.uid .. " repeats") end
  is_bound[b.uid] = true
end
-- the pods of `bound` whose pod ended (after validation: a payload refused is refused whole)
local ended, live = {}, {}
for _, b in ipairs(p.bound) do
  if ended_uid(b.uid, now0) then
    ended[#ended + 1] = b.uid
    is_bound[b.uid] = nil
  else
    live[#live + 1] = b
  end
end
p.bound = live
-- KEYS: the whole node, the reported cards, every bound pod's reservation and cards, then (once those
-- are declared and can be read) the cards of the reservations it has, which it may keep
local named_cards, named_uids = {}, {}
for _, c in ipairs(p.cards) do named_cards[#named_cards + 1] = c.index end
for _, b in ipairs(p.bound) do
  named_uids[#named_uids + 1] = b.uid
  for _, idx in ipairs(b.cards) do named_cards[#named_cards + 1] = idx end
end
local more = need_node_keys(named_cards, named_uids)
if more then return more end
local existed = redis.call('HGET', NODE_KEY, 'version') ~= false
-- pending bookings kept on a node of another history may be leftovers of it (reserve.lua: `carried`)
local was_unverified = existed and not verified()
local held = {}
for _, list in ipairs({redis.call('SMEMBERS', PODS_KEY), named_uids}) do
  for _, uid in ipairs(list) do
    local r = res_of(uid)
    if r then for _, idx in ipairs(split_cards(r.cards)) do held[#held + 1] = idx end end
  end
end
more = need_keys(held, {})
if more then return more end
local kept_bound = {}
if p.keep_bound then
  for _, b in ipairs(p.bound) do
    local r = res_of(b.uid)
    if r and r.state == "bound" and (r.cards ~= cards_csv(b.cards) or r.mem ~= b.mem or r.cores ~= b.cores
        or r.slices ~= b.slices) then
      b.cards = {}
      for i, idx in ipairs(split_cards(r.cards)) do b.cards[i] = tonumber(idx) end
      b.mem, b.cores, b.slices = r.mem, r.cores, r.slices
      kept_bound[#kept_bound + 1] = b.uid
    end
  end
end
-- first: a write Redis refuses when full (the DELs below would let every later write past maxmemory)
redis.call('HSET', NODE_KEY, 'error', p.error or "")
ensure_ended()  -- (its tombstones exist with the node: ensure_ended, _lib.lua)
local dropped = 0  -- reservations of pods not in `bound` and not settling: their cards are free again
-- the last bind attempt's number and the attempts holding each pod of `bound` booked here: booked anew below, its
-- reservation keeps them, so an earlier attempt's give-back (release.lua, maybe sent again after its reply was lost)
-- still leaves it
local carry = {}
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
  local r = res_view(uid)
  if r and not is_bound[uid] then
    if settles(r, now0, keep_from) and not ended_uid(uid, now0) then
      pending[#pending + 1] = {uid, r, carry_of(uid, r), damaged_amounts(uid)}
    else
      dropped = dropped + 1
    end
  elseif r then
    carry[uid] = carry_of(uid, r)
  end
  redis.call('DEL', res_key(uid))
end
redis.call('DEL', PODS_KEY)
write_cards(p.cards, true)
local now = now_ms()
-- verify_after_ms (every writer in the roles): the node is what the API implies, so it may be verified for
-- the history this Redis holds (verify_after in _lib.lua: only by a consistent read, truth_at, begun a keep
-- window after the change); without it (a writer whose view is not live) only a node new to this Redis is
local is_verified, verify_in = verified(), 0
if p.verify_after_ms ~= nil then
  is_verified, verify_in = verify_after(existed, p.verify_after_ms, now, p.lost == true, p.truth_at)
elseif not existed and p.lost ~= true and new_and_whole() then
  mark_verified(now)  -- new to this Redis: nothing it holds was lost (a writer that knows otherwise passes lost)
  is_verified = true
end
for _, b in ipairs(p.bound) do
  book(b, "bound", now, nil, carry[b.uid])
end
local overfull = 0
for _, e in ipairs(pending) do
  local uid, r, kept, hurt = e[1], e[2], e[3], e[4]
  local nums = {}
  for i, idx in ipairs(split_cards(r.cards)) do nums[i] = tonumber(idx) end
  -- its bind attempt's stamp (a pending one's Binding may still be committed), number and attempts: `kept`
  if r.state ~= "bound" and r.settle_by > 0 then kept.settle_by = r.settle_by end
  local mem, cores, slices = r.mem, r.cores, r.slices
  if hurt.amounts then
    -- fail closed: amounts a hand edit damaged were read as nothing held, and another pod booked the room its binder
    -- holds (tests/redis/test_redteam_damaged_usage.py); booked as its cards whole (every reported card when which
    -- ones cannot be read) until released or replaced by its pod's record (observe)
    if hurt.cards then
      nums = {}
      for i, c in ipairs(p.cards) do nums[i] = c.index end
    end
    mem, cores, slices = 0, CARD_CORES, CARD_CORES
    for _, idx in ipairs(nums) do
      local c = card_view(idx)
      if c then mem = math.max(mem, c.capacity) end
    end
  end
  book({uid = uid, cards = nums, mem = mem, cores = cores, slices = slices, pod = r.pod, idle = r.idle},
       r.state, r.created, nil, kept)
  -- book stamps a bound one as bound when it was made: keep when it was bound, or its keep window ends early
  if r.state == "bound" then redis.call('HSET', res_key(uid), 'bound_at', r.bound_at) end
  if r.state ~= "bound" and (r.carried or was_unverified) then redis.call('HSET', res_key(uid), 'carried', '1') end
  for _, idx in ipairs(split_cards(r.cards)) do
    local c = card_view(idx)
    if c and c.health ~= "removed" and (c.mem_used > c.capacity or c.cores_used > c.cores
        or c.slices > c.slice_limit) then
      overfull = overfull + 1
      break
    end
  end
end
publish('rebuild', nil, nil)
-- (cjson encodes an empty kept_bound or ended as {}, which Ledger.replace_node reads as no uid)
return cjson.encode({ok = true, bound = #p.bound, pending_kept = #pending, pending_overfull = overfull,
                     dropped = dropped, kept_bound = kept_bound, ended = ended, verified = is_verified, verify_in_ms = verify_in,
                     was_unverified = was_unverified})
