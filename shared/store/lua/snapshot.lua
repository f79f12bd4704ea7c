-- Read one node's whole state (cards and reservations) in one call. Payload ignored. KEYS: the whole node.
local more = need_node_keys()
if more then return more end
return cjson.encode(node_view())
