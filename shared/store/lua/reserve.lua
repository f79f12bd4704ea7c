-- Check-and-book a reservation on given cards. Payload: {uid, cards, mem, cores, slices, accepts, deny,
-- idle, pod, hold_ms, attempt} (legacy: model = accepts {model}, whole = idle). Every card is checked by card_rule,
-- the twin of shared/domain/fit.py's. Idempotent by uid: a repeated call for the same amounts returns the
-- cards already booked (`existing`); other amounts are refused (a pod's request never changes: its Binding
-- would carry a record the ledger does not book). hold_ms (a binder): the booking's `settle_by` becomes at
-- least now + hold_ms, when this attempt's Binding is committed or never (the janitor leaves it alone until
-- then, expire.lua), and its `binds` becomes this attempt's number, answered as `bind_no` (an attempt's give-back
-- leaves a booking a later attempt holds, release.lua: a counter, whatever Redis's clock does). The numbers come
-- from the node's `bind_seq`, not from the booking: a give-back sent again after its first run released the
-- booking (its reply lost) must not take a booking a later attempt made anew meanwhile, numbered from 1 again.
-- `attempt` (with hold_ms): the attempt's name, added to the booking's `attempts` (_lib.lua): its give-back frees
-- the booking only when no other attempt holds it, in whatever order the attempts' commands ran; this attempt's
-- command run again (its reply lost) is answered its own number again, no new one. A holder that names no attempt
-- (an older release's binder), found when a named attempt joins, is listed as `*<n>` (_lib.lua). On conflict
-- returns the reason and the node's current cards (refusal_view), so the caller can refit without another read.
local damaged = clear_damage()
if damaged then return damaged end
local function unverified()
  return cjson.encode({ok = false, unverified = true, reason = "node unverified: Redis restarted, failed over or evicted keys "
    .. "since the watchers last compared this node with the API server (it may lack a booking a pod holds); "
    .. "no new booking until they compare it again"})
end
-- The next bind attempt's number on this node, above `floor` (the booking's own: one numbered before the node kept
-- a sequence). Rising while the node hash lives (within one Redis history), across its bookings: a release naming
-- an earlier attempt's number (release.lua's if_bind_no) never takes a booking a later attempt made, whether it
-- found it or made it anew. Read with num() and written as an integer, never HINCRBY: a damaged field (a hand
-- edit) starts the count again rather than failing every booking on the node; below release's 2^52 bound.
local BIND_NO_MAX = 2 ^ 52
local function next_bind_no(floor)
  if floor < 0 or floor >= BIND_NO_MAX - 1 then floor = 0 end
  if not redis.call('HGET', NODE_KEY, 'version') then return floor + 1 end  -- (no node hash: none made for this)
  local seq = num(redis.call('HGET', NODE_KEY, 'bind_seq'))
  if seq < 0 or seq >= BIND_NO_MAX - 1 then seq = 0 end
  local n = math.max(seq, floor) + 1
  redis.call('HSET', NODE_KEY, 'bind_seq', int_str(n))
  return n
end
local p, err = payload()
if err then return err end
local bad = check_res(p)
if bad then return fail("BADINPUT", bad) end
if not is_int(p.model or 0, 0, 4096) or (p.whole ~= nil and type(p.whole) ~= "boolean") or p.slices < 1
    or (p.idle ~= nil and type(p.idle) ~= "boolean") or not is_int(p.hold_ms or 0, 0, FUTURE_MS) then
  return fail("BADINPUT", "model must be 0..4096, whole and idle booleans, slices >= 1, hold_ms 0.." .. FUTURE_MS)
end
bad = check_attempt(p.attempt, "attempt")
if bad then return fail("BADINPUT", bad) end
if p.attempt ~= nil and (p.hold_ms or 0) == 0 then return fail("BADINPUT", "attempt needs hold_ms > 0") end
-- before anything is booked or answered again: a Redis that may drop any key when full may drop this booking
local evicts = evicting_policy()
if evicts then return cjson.encode({ok = false, reason = eviction_refusal(evicts)}) end
local accepts, e1 = int_set(p.accepts, 2, 4096, "accepts")
local deny, e2 = int_set(p.deny, 0, 1023, "deny")
if e1 or e2 then return fail("BADINPUT", e1 or e2) end
if (p.model or 0) > 0 then accepts = accepts or {}; accepts[p.model] = true end
local need = {mem = p.mem, cores = p.cores, slices = p.slices, accepts = accepts, deny = deny,
              idle = p.idle or p.whole or false}
p.idle = need.idle
local more = need_keys(p.cards, {p.uid})
if more then return more end
local r = res_of(p.uid)
if r and (r.mem ~= p.mem or r.cores ~= p.cores or r.slices ~= p.slices or r.idle ~= need.idle
          or #split_cards(r.cards) ~= #p.cards) then
  return cjson.encode({ok = false, reason = string.format("booked with other amounts: %d card(s) of mem %d, "
    .. "cores %d, slices %d%s; asked %d card(s) of mem %d, cores %d, slices %d%s: refused until that booking "
    .. "is released or expires", #split_cards(r.cards), r.mem, r.cores, r.slices, r.idle and ", idle" or "",
    #p.cards, p.mem, p.cores, p.slices, need.idle and ", idle" or "")})
end
if r and r.state ~= "bound" then
  -- a pending booking answered again is a bind going on: not on a node this Redis process has not verified
  -- (it may be a leftover of a lost history, its release lost), nor on a card it over-fills (kept by
  -- replace_node for a binder that was in flight; answering it would let that binder write its Binding)
  if not verified() then return unverified() end
  local rc = split_cards(r.cards)
  local more_cards = need_keys(rc, {})
  if more_cards then return more_cards end
  -- (only one replace_node kept from a node of another history, `carried`: a card over-filled later, e.g. by
  -- a lowered max_inst, counts this booking already, and refusing it would gain nothing)
  if r.carried and overcommitted(rc) then
    return cjson.encode({ok = false, reason = "its pending booking over-fills card(s) " .. r.cards
      .. " (kept for a bind in flight when the node was rewritten from the API): not answered again"})
  end
end
local hold = p.hold_ms or 0
if r then
  local settle_by, bind_no = r.settle_by, r.binds
  if hold > 0 then
    -- this attempt's Binding may be committed until then: the janitor leaves the booking alone before, and an
    -- earlier attempt's give-back leaves it to this one (no feed message: a mirror's copy may be older, and
    -- the scripts decide). A stamp from a clock that stepped back stays: never lowered within FUTURE_MS
    local held = p.attempt and attempts_of(p.uid) or nil
    local mine = p.attempt and entry_of(held, p.attempt) or nil  -- this attempt's command, run before
    -- a holder that names no attempt took the booking after the last named one (or made it, also one that numbered
    -- nothing: a pending booking with neither list nor number): listed, so that no named give-back frees the booking
    -- under its Binding
    local unnamed = nil
    if p.attempt and not mine and (r.binds > named_binds_of(p.uid, r, held)
                                   or (not held and r.binds == 0 and r.state ~= "bound")) then
      unnamed = "*" .. int_str(r.binds)
      if entry_of(held, unnamed) then unnamed = nil end
    end
    if p.attempt and not mine and #(held or {}) + (unnamed and 2 or 1) > ATTEMPTS_MAX then
      return cjson.encode({ok = false, reason = string.format("too many bind attempts: %d of the pod hold its "
        .. "booking here, none given back yet; no more until one is, or the booking expires", #held)})
    end
    local now = now_ms()
    settle_by = math.max((r.settle_by - now <= FUTURE_MS) and r.settle_by or 0, now + hold)
    if mine then
      redis.call('HSET', res_key(p.uid), 'settle_by', settle_by)
      -- its own number, not a later attempt's (an entry written without one: the booking's)
      local own = num(string.match(mine, ":(%d+)$"))
      if own > 0 then bind_no = own end
    else
      bind_no = next_bind_no(r.binds)
      local fields = {'settle_by', settle_by, 'binds', bind_no}
      if p.attempt then
        held = held or {}
        if unnamed then held[#held + 1] = unnamed end
        held[#held + 1] = p.attempt .. ":" .. int_str(bind_no)
        fields[5], fields[6], fields[7], fields[8] = 'attempts', table.concat(held, ","), 'named_binds', int_str(bind_no)
      end
      redis.call('HSET', res_key(p.uid), unpack(fields))
    end
  end
  return cjson.encode({ok = true, existing = true, cards = r.cards, state = r.state, settle_by = settle_by,
                       bind_no = bind_no})
end
if not redis.call('HGET', NODE_KEY, 'version') then
  return cjson.encode({ok = false, reason = "node unregistered", node = refusal_view()})
end
local nodeerr = redis.call('HGET', NODE_KEY, 'error')
if nodeerr and nodeerr ~= "" then
  return cjson.encode({ok = false, reason = "node unregistered: " .. nodeerr, node = refusal_view()})
end
if not verified() then return unverified() end
local seen = {}
for _, idx in ipairs(p.cards) do
  local c = card_view(tostring(math.floor(idx)))
  seen[tostring(math.floor(idx))] = c
  local why = card_rule(c, math.floor(idx), need)
  if why then return cjson.encode({ok = false, reason = why, card = idx, node = refusal_view()}) end
end
local now = now_ms()
local settle_by, bind_no, hold_fields = 0, 0, nil
if hold > 0 then  -- numbered before anything is booked; written with the booking (book's carry)
  settle_by, bind_no = now + hold, next_bind_no(0)
  hold_fields = {settle_by = settle_by, binds = bind_no}
  if p.attempt then
    hold_fields.attempts, hold_fields.named = p.attempt .. ":" .. int_str(bind_no), int_str(bind_no)
  end
end
local views, res = book(p, "pending", now, seen, hold_fields)
if hold > 0 then res.settle_by, res.binds = settle_by, bind_no end
local v, msg = publish('reserve', p.uid, res, p.cards, views)
return cjson.encode({ok = true, existing = false, cards = cards_csv(p.cards), version = v, feed = msg,
                     settle_by = settle_by, bind_no = bind_no})
