-- Read one node's whole state (cards and reservations) in one call. Payload ignored.
return cjson.encode(node_view())
