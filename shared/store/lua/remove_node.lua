-- Forget a deleted node and everything booked on it. Payload ignored. KEYS: the whole node.
local more = need_node_keys()
if more then return more end
for _, idx in ipairs(card_indices()) do redis.call('DEL', card_key(idx)) end
for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do redis.call('DEL', res_key(uid)) end
redis.call('DEL', PODS_KEY)
local existed = redis.call('EXISTS', NODE_KEY)
local v = tonumber(redis.call('HGET', NODE_KEY, 'version') or "0") + 1
redis.call('DEL', NODE_KEY)
redis.call('PUBLISH', FEED, cjson.encode({node = NODE, version = v, kind = 'removed', cards = {}, error = ""}))
return existed
