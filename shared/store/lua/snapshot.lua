-- Read one node's whole state (cards and reservations) in one call. Payload ignored. KEYS: the whole node.
local damaged = clear_damage()
if damaged then return damaged end
local more = need_node_keys()
if more then return more end
local view = node_view()
view.verified = verified()  -- compared with the API server in this Redis process (replace_node)
-- not verified: when its keep window began (0: not yet), so that the watchers read the API for it only once
-- a read may verify it (Reconciler._pass)
if not view.verified then view.unverified_since = window_start() or 0 end
return cjson.encode(view)
