-- Release a reservation by pod uid, giving its share back. Payload: {uid, if_settle_by?}. Idempotent.
-- if_settle_by (a binder giving back its own booking: the `settle_by` its reserve answered): the booking
-- stays when a later bind attempt of the pod stamped a later one (its Binding may still be committed),
-- answered {released = false, kept = true}.
local p, reply = uid_payload()
if not p then return reply end
if p.if_settle_by ~= nil and not is_int(p.if_settle_by, 0, 2 ^ 52) then
  return fail("BADINPUT", "if_settle_by must be a time in ms")
end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = true, released = false}) end
if p.if_settle_by ~= nil and (r.settle_by or 0) > p.if_settle_by then
  return cjson.encode({ok = true, released = false, kept = true})
end
local more = need_keys(split_cards(r.cards), {})  -- the cards it gives back (and publishes)
if more then return more end
local views = drop_reservation(p.uid, r)
local _, msg = publish('release', p.uid, false, split_cards(r.cards), views)
-- the message too, as reserve's: a caller that serves filters applies it to its mirror at once
return cjson.encode({ok = true, released = true, cards = r.cards, feed = msg})
