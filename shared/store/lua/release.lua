-- Release a reservation by pod uid, giving its share back. Payload: {uid, if_attempt?, if_bind_no?, ended?}. Idempotent.
-- ended (the pod watcher's release of a pod that ended: deleted, Succeeded or Failed): the uid is tombstoned on the
-- node in the same step (`tombstone`, _lib.lua), held or not, so no write read before the pod ended books it again.
-- A binder giving back its own booking (its Binding does not exist and never will) names its attempt: if_attempt
-- (reserve.lua's `attempt`) and if_bind_no (the `bind_no` its reserve answered). The booking stays, answered
-- {released = false, kept = true}, when the pod's Binding is committed here (bound: the watchers release it when
-- the pod goes), or another attempt of the pod holds it: with an `attempts` list (_lib.lua) this attempt's name is
-- taken off and the booking freed only when none is left (an entry `*<n>`, a holder that names no attempt, is never
-- taken off) and no such holder took it after the last named attempt (`binds` above `named_binds`); without one
-- (a booking of a binder that names no attempt, or a list an older release's rewrite dropped), when the give-back
-- names no number (an attempt's name alone: Ledger._withdraw, or a bind too late to send) or a later
-- attempt's number is on it (`binds` above if_bind_no: a counter, the node's, not the booking's, reserve.lua
-- next_bind_no, so a give-back sent again leaves a booking a later attempt made anew).
local damaged = clear_damage()
if damaged then return damaged end
local p, reply = uid_payload()
if not p then return reply end
if p.if_bind_no ~= nil and not is_int(p.if_bind_no, 0, 2 ^ 52) then
  return fail("BADINPUT", "if_bind_no must be a whole number >= 0")
end
local bad = check_attempt(p.if_attempt, "if_attempt")
if bad then return fail("BADINPUT", bad) end
if p.ended ~= nil and type(p.ended) ~= "boolean" then return fail("BADINPUT", "ended must be a boolean") end
if p.ended and (p.if_attempt ~= nil or p.if_bind_no ~= nil) then
  return fail("BADINPUT", "ended names no attempt (a binder's give-back is not a pod's end)")
end
local r = res_of(p.uid)
if not r then
  if p.ended then tombstone(p.uid, true) end
  return cjson.encode({ok = true, released = false})
end
local kept = cjson.encode({ok = true, released = false, kept = true})
if p.if_attempt ~= nil or p.if_bind_no ~= nil then
  if r.state == "bound" then return kept end
  local held = p.if_attempt ~= nil and attempts_of(p.uid) or nil
  if held then
    local rest = {}
    for _, t in ipairs(held) do if entry_name(t) ~= p.if_attempt then rest[#rest + 1] = t end end
    local changed = #rest < #held
    -- none left, but a holder that names no attempt took the booking after the last named one (an older release's
    -- binder: its reserve numbers its attempt in `binds` and lists nothing): listed, and the booking kept for it
    if #rest == 0 and r.binds > named_binds_of(p.uid, r, held) then
      rest[1], changed = "*" .. int_str(r.binds), true
    end
    if #rest > 0 then
      if changed then redis.call('HSET', res_key(p.uid), 'attempts', table.concat(rest, ",")) end
      return kept
    end
  elseif p.if_bind_no == nil or r.binds > p.if_bind_no then
    -- no list, and no number to go by (a name only: an attempt whose reserve's answer never came) or a later one's
    return kept
  end
end
local more = need_keys(split_cards(r.cards), {})  -- the cards it gives back (and publishes)
if more then return more end
if p.ended then tombstone(p.uid) end  -- (a write Redis refuses when full, before drop_reservation's DEL)
local views = drop_reservation(p.uid, r)
local _, msg = publish('release', p.uid, false, split_cards(r.cards), views)
-- the message too, as reserve's: a caller that serves filters applies it to its mirror at once
return cjson.encode({ok = true, released = true, cards = r.cards, feed = msg})
