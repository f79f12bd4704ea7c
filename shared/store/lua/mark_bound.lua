-- Mark a reservation bound once the Binding exists. Payload: {uid}. Idempotent.
local p, err = payload()
if err then return err end
local bad = check_uid(p.uid)
if bad then return fail("BADINPUT", bad) end
local more = need_keys({}, {p.uid})
if more then return more end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = false, reason = "no reservation"}) end
if r.state ~= "bound" then
  r.state, r.bound_at = "bound", now_ms()
  redis.call('HSET', res_key(p.uid), 'state', r.state, 'bound_at', r.bound_at)
  publish('bound', p.uid, r, {})
end
return cjson.encode({ok = true, cards = r.cards})
