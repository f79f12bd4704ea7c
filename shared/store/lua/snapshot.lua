-- Read one node's whole state (cards and reservations) in one call. Payload ignored. KEYS: the whole node.
local more = need_node_keys()
if more then return more end
local view = node_view()
view.verified = verified()  -- compared with the API server in this Redis process (replace_node)
return cjson.encode(view)
