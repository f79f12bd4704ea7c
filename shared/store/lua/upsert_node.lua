-- Upsert a node's cards from its reported capacity. Payload: {error: "", create: bool, cards: [{index,
-- capacity, slice_limit, health}]}. Usage on surviving cards is kept; capacity changes never make free
-- negative. A missing node is only created when `create` is true (a node new to the cluster): if a
-- known node is missing, Redis lost its data, and creating it empty would offer cards that running
-- pods hold; the script returns -1 instead and the caller rebuilds from the API server.
local damaged = clear_damage()
if damaged then return damaged end
local p, err = payload()
if err then return err end
local _, bad = check_cards(p.cards)
if bad then return fail("BADINPUT", bad) end
bad = check_error(p.error)
if bad then return fail("BADINPUT", bad) end
local exists = redis.call('HGET', NODE_KEY, 'version')
if not exists and p.create ~= true then return -1 end
-- the reported cards and the ones it has (a card no longer reported is marked removed or deleted)
local cards = card_indices()
for _, c in ipairs(p.cards) do cards[#cards + 1] = c.index end
local more = need_keys(cards, {})
if more then return more end
-- first: a write Redis refuses when full (write_cards may begin with the DEL of a card no longer reported)
redis.call('HSET', NODE_KEY, 'error', p.error or "")
ensure_ended()  -- (its tombstones exist with the node: ensure_ended, _lib.lua)
write_cards(p.cards, false)
if not exists and new_and_whole() then mark_verified(now_ms()) end  -- create: tests and tools only (the roles never create here)
return publish('node', nil, nil)
