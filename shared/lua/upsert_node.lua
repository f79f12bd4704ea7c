-- Upsert a node's cards from its reported capacity. Payload: {error: "", cards: [{index, capacity,
-- slice_limit, health}]}. Usage on surviving cards is kept; capacity changes never make free negative.
local p, err = payload()
if err then return err end
local _, bad = check_cards(p.cards)
if bad then return fail("BADINPUT", bad) end
if p.error ~= nil and type(p.error) ~= "string" then return fail("BADINPUT", "error must be a string") end
write_cards(p.cards, false)
redis.call('HSET', NODE_KEY, 'error', p.error or "")
return publish('node', nil, nil)
