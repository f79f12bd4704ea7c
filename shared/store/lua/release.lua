-- Release a reservation by pod uid, giving its share back. Payload: {uid, if_bind_no?}. Idempotent.
-- if_bind_no (a binder giving back its own booking: the `bind_no` its reserve answered): the booking stays
-- when a later bind attempt of the pod holds it (`binds` above it: its Binding may still be committed),
-- answered {released = false, kept = true}. A counter, not a time: Redis's clock may step; the node's, not the
-- booking's (reserve.lua next_bind_no), so a give-back sent again leaves a booking a later attempt made anew.
local p, reply = uid_payload()
if not p then return reply end
if p.if_bind_no ~= nil and not is_int(p.if_bind_no, 0, 2 ^ 52) then
  return fail("BADINPUT", "if_bind_no must be a whole number >= 0")
end
local r = res_of(p.uid)
if not r then return cjson.encode({ok = true, released = false}) end
if p.if_bind_no ~= nil and r.binds > p.if_bind_no then
  return cjson.encode({ok = true, released = false, kept = true})
end
local more = need_keys(split_cards(r.cards), {})  -- the cards it gives back (and publishes)
if more then return more end
local views = drop_reservation(p.uid, r)
local _, msg = publish('release', p.uid, false, split_cards(r.cards), views)
-- the message too, as reserve's: a caller that serves filters applies it to its mirror at once
return cjson.encode({ok = true, released = true, cards = r.cards, feed = msg})
