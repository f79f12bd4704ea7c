-- Mark a reservation bound once the Binding exists. Payload: {uid}. Idempotent.
local p, err = payload()
if err then return err end
local bad = check_uid(p.uid)
if bad then return fail("BADINPUT", bad) end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = false, reason = "no reservation"}) end
if r.state ~= "bound" then
  redis.call('HSET', res_key(p.uid), 'state', 'bound', 'bound_at', now_ms())
  publish('bound', p.uid, res_view(p.uid), {})
end
return cjson.encode({ok = true, cards = r.cards})
