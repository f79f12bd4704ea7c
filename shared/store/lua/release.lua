-- Release a reservation by pod uid, giving its share back. Payload: {uid}. Idempotent.
local p, reply = uid_payload()
if not p then return reply end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = true, released = false}) end
local more = need_keys(split_cards(r.cards), {})  -- the cards it gives back (and publishes)
if more then return more end
local views = drop_reservation(p.uid, r)
local _, msg = publish('release', p.uid, false, split_cards(r.cards), views)
-- the message too, as reserve's: a caller that serves filters applies it to its mirror at once
return cjson.encode({ok = true, released = true, cards = r.cards, feed = msg})
