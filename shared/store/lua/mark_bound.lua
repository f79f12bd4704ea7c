-- Mark a reservation bound once the Binding exists. Payload: {uid}. Idempotent.
local p, reply = uid_payload()
if not p then return reply end
local r = res_view(p.uid)
if not r then return cjson.encode({ok = false, reason = "no reservation"}) end
if r.state ~= "bound" then
  r.state, r.bound_at = "bound", now_ms()
  redis.call('HSET', res_key(p.uid), 'state', r.state, 'bound_at', r.bound_at)
  publish('bound', p.uid, r, {})
end
return cjson.encode({ok = true, cards = r.cards})
