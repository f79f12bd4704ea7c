-- Release a reservation by pod uid, giving its share back. Payload: {uid}. Idempotent.
local p, err = payload()
if err then return err end
if type(p.uid) ~= "string" or #p.uid == 0 or #p.uid > 128 then return fail("BADINPUT", "uid must be a string") end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = true, released = false}) end
drop_reservation(p.uid, r)
publish('release', p.uid, false)
return cjson.encode({ok = true, released = true, cards = r.cards})
