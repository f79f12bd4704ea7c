-- Check-and-book a reservation on given cards. Payload: {uid, cards, mem, cores, slices, model, whole,
-- pod}. Idempotent by uid: a repeated call returns the cards already booked. On conflict returns the
-- reason and the node's current state, so the caller can refit without another read.
local p, err = payload()
if err then return err end
local bad = check_res(p)
if bad then return fail("BADINPUT", bad) end
if not is_int(p.model or 0, 0, 4096) or (p.whole ~= nil and type(p.whole) ~= "boolean") or p.slices < 1 then
  return fail("BADINPUT", "model must be 0..4096, whole a boolean, slices >= 1")
end
local r = res_view(p.uid)
if r then return cjson.encode({ok = true, existing = true, cards = r.cards, state = r.state}) end
if not redis.call('HGET', NODE_KEY, 'version') then
  return cjson.encode({ok = false, reason = "node unregistered", node = node_view()})
end
local nodeerr = redis.call('HGET', NODE_KEY, 'error')
if nodeerr and nodeerr ~= "" then
  return cjson.encode({ok = false, reason = "node unregistered: " .. nodeerr, node = node_view()})
end
local seen = {}
for _, idx in ipairs(p.cards) do
  local c = card_view(tostring(math.floor(idx)))
  seen[tostring(math.floor(idx))] = c
  local why = nil
  if not c or c.health == "removed" then why = "CardNotFound"
  elseif c.health == "cordoned" then why = "CardCordoned"
  elseif c.health ~= "ok" then why = "CardNotHealth"
  elseif (p.model or 0) > 0 and c.capacity ~= p.model then why = "CardTypeMismatch"
  elseif c.slices + p.slices > c.slice_limit then why = "CardTimeSlicingExhausted"
  elseif p.whole and (c.mem_used > 0 or c.cores_used > 0 or c.slices > 0) then why = "ExclusiveDeviceAllocateConflict"
  elseif c.mem_free < p.mem then why = "CardInsufficientMemory"
  elseif c.cores_free < p.cores then why = "CardInsufficientCore"
  end
  if why then return cjson.encode({ok = false, reason = why, card = idx, node = node_view()}) end
end
local views, res = book(p, "pending", now_ms(), seen)
local v = publish('reserve', p.uid, res, p.cards, views)
return cjson.encode({ok = true, existing = false, cards = cards_csv(p.cards), version = v})
