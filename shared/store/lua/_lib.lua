-- Shared prelude, prepended to every ledger script when it is loaded (one SHA per script).
-- Calling convention for every script:
--   KEYS[1] = "<prefix>:{<node>}:node"   (the node hash; its hash tag puts all node keys in one slot)
--   KEYS[2..] = every other key the script may touch, all of the same {<node>}: the pods set
--     "<base>:pods", card hashes "<base>:card:<idx>", reservation hashes "<base>:res:<uid>"
--     (built by shared/store/keys.py, one function per script; Redis Cluster requires every key in KEYS)
--   ARGV[1] = feed channel, ARGV[2] = node name, ARGV[3] = JSON payload (script specific), ARGV[4] = "clear"
--     only after WRONGTYPE (clear_damage)
-- Which cards and reservations a node has only Redis knows: a script that needs a card or reservation
-- key its caller did not declare answers MOREKEYS (see `need_keys`) before its first write, and the caller
-- calls again with them. The node hash and the pods set are the index: scripts read them first.
local NODE_KEY = KEYS[1]
local BASE = string.sub(NODE_KEY, 1, -6)          -- strip ":node"
local FEED = ARGV[1]
local NODE = ARGV[2]
local PODS_KEY = BASE .. ":pods"
local DECLARED = {}
for _, k in ipairs(KEYS) do DECLARED[k] = true end
local MAX_UNITS = 1048576
local FUTURE_MS = 60000  -- a reservation stamped later than now + this comes from a clock that jumped

local function card_key(idx) return BASE .. ":card:" .. idx end
local function res_key(uid) return BASE .. ":res:" .. uid end

-- nil when every card and reservation key in `cards` (indices) and `uids` is in KEYS; else the MOREKEYS
-- error reply naming the lists to declare: with whole = true they are all the node has (the caller
-- replaces what it knew), else only the ones this call needs (added to it). Called before any write.
local function need_keys(cards, uids, whole)
  local missing = false
  for _, idx in ipairs(cards) do if not DECLARED[card_key(idx)] then missing = true end end
  for _, uid in ipairs(uids) do if not DECLARED[res_key(uid)] then missing = true end end
  if not missing then return nil end
  local c, u = {}, {}
  for i, idx in ipairs(cards) do c[i] = tostring(idx) end
  for i, uid in ipairs(uids) do u[i] = uid end
  return redis.error_reply("MOREKEYS " .. cjson.encode({cards = c, uids = u, whole = whole == true}))
end

-- A declared key of another type than the layout gives it (a string or list where a hash or set belongs: an
-- operator's or another program's write, nothing a script writes) failed every script declaring it (WRONGTYPE) for
-- ever, and so every read, booking and repair of the node. A caller that met WRONGTYPE on the node calls again with
-- ARGV[4] = "clear" (LedgerCore._call, LedgerReads._snapshot_batch; never otherwise: the probe costs a read of every
-- declared key, a tenth of a busy node's booking): such keys are deleted and DAMAGED answered, naming them, before
-- anything else is read or written (no write after the DEL: a script's first write is the one Redis checks against
-- maxmemory); the caller calls again, and the node reads as if they were missing, which the watchers repair. Probed
-- with HGET and SISMEMBER, commands the roles' ACL user has (docs/install.md "Redis"); an error that is not
-- WRONGTYPE (an ACL refusal) deletes nothing.
local function clear_damage()
  if ARGV[4] ~= "clear" then return nil end
  local gone = {}
  for _, k in ipairs(KEYS) do
    local r
    if k == PODS_KEY then r = redis.pcall('SISMEMBER', k, '') else r = redis.pcall('HGET', k, '') end
    if type(r) == 'table' and r.err and string.find(r.err, 'WRONGTYPE', 1, true) then
      redis.call('DEL', k)
      gone[#gone + 1] = k
    end
  end
  if #gone == 0 then return nil end
  return redis.error_reply("DAMAGED " .. cjson.encode(gone))
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The history this Redis holds, as `<run_id>:<master_replid>`, and `:e<n>` once it has evicted n keys: the run
-- id is new after every restart, the replication id after every promotion (a failover, also a fail-back to a
-- server that never restarted), the eviction count after every key Redis dropped when full (any key of the
-- server: which one it was, INFO does not say). A node's state carries the token it was last verified against
-- the API server under (`run`): a restart from an old snapshot or a promoted replica may lack the last writes,
-- an eviction any key (a booking a running pod holds), so no new booking is made there until the watchers
-- have compared it again (replace_node, verify_after). A server that never evicted keeps the token of earlier
-- releases. Read once per script call. "" when this Redis does not say (then nothing is ever verified).
local SERVER_TOKEN
local EVICTED = 0
local function server_info()
  if SERVER_TOKEN == nil then
    -- one call per section: INFO with several sections is Redis 7's (6.2 answers it with a syntax error)
    local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
    local replid = string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)')
    EVICTED = tonumber(string.match(redis.call('INFO', 'stats'), 'evicted_keys:(%d+)') or "0")
    SERVER_TOKEN = (run and replid) and (run .. ":" .. replid) or ""
    if SERVER_TOKEN ~= "" and EVICTED > 0 then SERVER_TOKEN = SERVER_TOKEN .. ":e" .. EVICTED end
  end
  return SERVER_TOKEN
end

-- The eviction policy this Redis applies when full, when it may drop any key (allkeys-*), else nil: the twin of
-- shared/store/eviction.py's evicts_ledger. A dropped node, card or reservation hash loses a booking unseen.
local function evicting_policy()
  local policy = string.match(redis.call('INFO', 'memory'), 'maxmemory_policy:([%w%-]+)')
  if policy and string.sub(policy, 1, 8) == "allkeys-" then return policy end
  return nil
end

-- The refusal's words, the same as eviction.py's eviction_refusal.
local function eviction_refusal(policy)
  return "Redis evicts keys (maxmemory-policy " .. policy .. "): when full it may drop a booking a running pod "
    .. "holds, unseen; no booking until it is set to noeviction (or a volatile-* policy: no ledger key has a time "
    .. "to live)"
end

local function verified()
  local token = server_info()
  return token ~= "" and redis.call('HGET', NODE_KEY, 'run') == token
end

-- Whether a node this Redis does not hold is new, not dropped by an eviction (then it may be verified at once).
local function new_and_whole()
  server_info()
  return EVICTED == 0
end

-- Called before a script's first write where that write would be one Redis allows when full (a DEL, an SREM):
-- once a script has written, Redis lets all its other writes through, past `maxmemory` under noeviction. An
-- HSET is refused when full, so the script is refused whole. It rewrites the node's `error` with its value.
local function refused_when_full()
  redis.call('HSET', NODE_KEY, 'error', redis.call('HGET', NODE_KEY, 'error') or "")
end

local function mark_verified(now)
  redis.call('HSET', NODE_KEY, 'run', server_info(), 'verified_at', now)
  redis.call('HDEL', NODE_KEY, 'unverified_since')
end

-- When the keep window of a node not verified under this history began (ms, this Redis's clock); nil when no
-- writer has found it so under this history yet.
local function window_start()
  local token = server_info()
  local since = redis.call('HGET', NODE_KEY, 'unverified_since') or ""
  local s_token, s_ms = string.match(since, '^(%x+:%x+:?e?%d*):(%d+)$')
  if token == "" or s_token ~= token then return nil end
  return tonumber(s_ms)
end

-- The node has just been written from the API's truth by a caller that may verify it (replace_node's
-- verify_after_ms): it is verified once its truth was read at least `after_ms` after its bookings could last
-- have been lost. A bind in flight then (its booking acknowledged, then lost; its Binding not written yet) is
-- committed in the API within that window (the extender sends each Binding with a deadline shorter than it,
-- shared/domain/timing.py), so a consistent read begun after it has it. `truth_at` is when the caller's
-- consistent read of the node's pods began (Redis time, read before it); a caller whose truth is a watch's
-- view (which may lag) passes none and never verifies a node of another history: it starts the window and
-- is told how much is left. The window starts, for a node this Redis holds under another token, when a writer
-- first found it so (`unverified_since`); a node new to this Redis is verified at once, unless the caller
-- knows its keys were lost (`lost`: a rebuild after the state went, a node the watchers knew missing) or this
-- Redis has evicted keys (its hash may be one of them: new_and_whole), when it starts now. Returns (verified,
-- ms left until a read may verify it).
local function verify_after(existed, after_ms, now, lost, truth_at)
  if verified() then return true, 0 end
  local token = server_info()
  if token == "" then return false, after_ms end
  local start = window_start()
  -- a start later than now was stamped before Redis's clock stepped back: it starts again now (later in real
  -- time than that first comparison, so as safe), else no read could verify the node for the step's length
  if start ~= nil and start > now then start = nil end
  if start == nil then
    if not existed and not lost and new_and_whole() then mark_verified(now) return true, 0 end
    start = now
    redis.call('HSET', NODE_KEY, 'unverified_since', token .. ":" .. start)
  end
  if truth_at ~= nil and truth_at - start >= after_ms then mark_verified(now) return true, 0 end
  return false, math.max(0, start + after_ms - now)
end

local function fail(code, msg)
  return redis.error_reply(code .. " " .. msg)
end

-- Decodes ARGV[3]; returns (table, nil) or (nil, error reply). Strict JSON: NaN, Infinity and hex
-- numbers (which cjson accepts by default) are refused; the default is restored for other scripts.
local function payload()
  cjson.decode_invalid_numbers(false)
  local ok, v = pcall(cjson.decode, ARGV[3] or "")
  cjson.decode_invalid_numbers(true)
  if not ok or type(v) ~= "table" then return nil, fail("BADINPUT", "payload is not a JSON object") end
  return v, nil
end

local function is_int(v, lo, hi)
  return type(v) == "number" and v == math.floor(v) and v >= lo and v <= hi
end

-- A pod uid: 1..128 characters of [A-Za-z0-9-._:] (Kubernetes uids are UUIDs). Returns an error or nil.
local function check_uid(uid)
  if type(uid) ~= "string" or #uid > 128 or not string.match(uid, "^[%w%-%.:_]+$") then
    return "uid must be 1..128 characters of [A-Za-z0-9-._:]"
  end
  return nil
end

-- A list decoded from JSON: a table whose keys are exactly 1..n (cjson gives {} for both [] and {}).
local function is_list(t, max)
  if type(t) ~= "table" then return false end
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n == #t and n <= max
end

-- The node's error text from a payload: absent or a string of at most 4096 bytes. Returns an error or nil.
local function check_error(e)
  if e ~= nil and (type(e) ~= "string" or #e > 4096) then return "error must be a string of at most 4096 bytes" end
  return nil
end

local function hgetall(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return nil end
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function card_indices()
  local raw = redis.call('HGET', NODE_KEY, 'cards')
  local out = {}
  if raw and raw ~= "" then
    for idx in string.gmatch(raw, "[^,]+") do out[#out + 1] = idx end
  end
  return out
end

-- A whole number from a hash field; 0 when missing or damaged (someone edited Redis by hand): every
-- script keeps working, and fails closed (a card with no capacity or slice limit takes nothing) until
-- the reconciler rewrites the node from the API's truth.
local function num(v)
  local n = tonumber(v)
  if n == nil or n ~= n or n == math.huge or n == -math.huge then return 0 end
  return math.floor(n)
end

-- The card knobs the node agent published besides max_inst, shown and never judged: absent (nil, so
-- left out of the JSON) when the node publishes none or a field is damaged.
local KNOB_FIELDS = {"policy", "time_slice", "overcommit_ratio"}

-- A card's usage (`mem_used`, `cores_used`, `slices`) read fail closed: one a hand edit damaged (gone, not a whole
-- number, negative, infinite) reads as `full`, the card's whole, `cores` as no more than a card has, and a damaged
-- `slice_limit` (the node agent's, not known here) as 0. num() made such usage 0 (and kept a negative one), so the next booking went past the card (90
-- units over a held 90 on a 96-unit card) before any pass could see it (tests/redis/test_redteam_damaged_usage.py);
-- the watchers' pass finds the usage does not add up to the reservations and rewrites it.
local CARD_CORES = 16
local function used(v, full)
  local n = tonumber(v)
  if n == nil or n ~= math.floor(n) or n < 0 or n == math.huge then return full end
  return n
end

local function card_view(idx)
  local c = hgetall(card_key(idx))
  if not c then return nil end
  local capacity, cores = num(c.capacity), math.min(num(c.cores), CARD_CORES)
  local slice_limit = tonumber(c.slice_limit)
  if slice_limit == nil or slice_limit ~= math.floor(slice_limit) or slice_limit < 1 or slice_limit > CARD_CORES then
    slice_limit = 0
  end
  local v = {
    capacity = capacity, mem_used = used(c.mem_used, capacity), mem_free = num(c.mem_free),
    cores = cores, cores_used = used(c.cores_used, cores), cores_free = num(c.cores_free),
    slices = used(c.slices, slice_limit), slice_limit = slice_limit, health = c.health or "unhealthy",
  }
  for _, k in ipairs(KNOB_FIELDS) do
    local n = tonumber(c[k])  -- (not infinite: cjson refuses to encode it, and every read of the node failed)
    if n and n == math.floor(n) and math.abs(n) < math.huge then v[k] = n end
  end
  return v
end

-- Whether a reservation's amounts (`mem`, `cores`, `slices`), and its `cards`, were damaged by a hand edit: an amount
-- gone, not a whole number, negative, or past what one card has (res_view reads it with num(), as 0 or as the negative
-- number); a card list empty or naming anything but indices 0..1023 (res_view keeps only those).
local function damaged_amounts(uid)
  local amounts = false
  for field, most in pairs({mem = MAX_UNITS, cores = CARD_CORES, slices = CARD_CORES}) do
    local n = tonumber(redis.call('HGET', res_key(uid), field))
    if not n or n ~= math.floor(n) or n < 0 or n > most then amounts = true end
  end
  local cards = true  -- until one index is read
  for idx in string.gmatch(redis.call('HGET', res_key(uid), 'cards') or "", "[^,]+") do
    if not string.match(idx, "^%d+$") or tonumber(idx) > 1023 then return {amounts = true, cards = true} end
    cards = false
  end
  return {amounts = amounts or cards, cards = cards}
end

local function res_view(uid)
  local r = hgetall(res_key(uid))
  if not r then return nil end
  local cards = {}
  for idx in string.gmatch(r.cards or "", "[^,]+") do  -- (a card index as upsert_node takes them: 0..1023; one
    -- past Lua's exact integers was written back by replace_node as "1e+23", which failed every read of the node)
    if string.match(idx, "^%d+$") and tonumber(idx) <= 1023 then cards[#cards + 1] = idx end
  end
  return {
    cards = table.concat(cards, ","), mem = num(r.mem), cores = num(r.cores), slices = num(r.slices),
    state = r.state or "bound", created = num(r.created), bound_at = num(r.bound_at), pod = r.pod or "",
    idle = r.idle == "1", carried = (r.carried == "1") or nil,  -- nil: left out of every reply
    settle_by = num(r.settle_by), binds = num(r.binds),
  }
end

-- The bind attempts that hold a pending booking: each binder's reserve with a hold names its attempt (16 hex
-- digits, the same on every send of that call: reserve.lua's `attempt`), listed in the reservation's `attempts`
-- field, and its give-back (release.lua's `if_attempt`) takes its own name off; the booking is freed only when no
-- attempt is left on it. A set, not an order: a reserve that runs late (its reply lost and the command sent again,
-- or delivered after a later attempt's) adds its name wherever it lands, so no give-back frees a booking another
-- attempt's Binding may still be committed on. Each entry is `<name>:<n>`, the attempt and the number reserve gave
-- it (answered again to its command run again: its own, not a later attempt's, for release's numbers when the list
-- is gone), or `*<n>`: a holder that names no attempt (a binder of an older release numbers its attempt in `binds`
-- and lists nothing), found on the booking when a named attempt joined it; no give-back takes that one off (the
-- janitor's expiry frees the booking). `named_binds` is the number of the last named attempt that joined: `binds`
-- above it means such a holder joined since, and a give-back leaves the booking to it. nil when the booking has no
-- list, or an empty one (damaged): `binds` decides then (written by a writer that names no attempt: the watchers, a
-- binder or a rewrite of an older release).
local ATTEMPTS_MAX = 16
local function check_attempt(t, what)
  if t ~= nil and (type(t) ~= "string" or #t ~= 16 or not string.match(t, "^%x+$")) then
    return what .. " must be 16 hex digits"
  end
  return nil
end
local function int_str(n) return string.format('%.0f', n) end
-- A counter `v` (a field's text, or nil) plus `step`, for one the scripts bump (the node's `version`, its tombstones'
-- `#n`). HINCRBY alone refused a field a hand edit damaged (not a whole number, or at the end of its 64-bit range),
-- and so failed every write of the node for ever, the watchers' repair too
-- (tests/redis/test_redteam_damaged_counters.py): a damaged or negative one starts again, as one past 2^52 (Lua's
-- numbers are exact below 2^53), at 1 whatever `step` (read, step 0: as 0). At 1, as keys made anew, so a mirror
-- holding a higher version reads the node again ("recreated", or "history"/"gap" beside its 0 or 1): started at
-- `step`, a batched confirmation's version was its span, which such a mirror took for a message it had, and every
-- write after it until the count passed its own (tests/redis/test_redteam_damaged_version_feed.py).
local COUNT_MAX = 2 ^ 52
-- Whether `v` is a sound count, and its number: a whole number 0..2^52 written as Redis writes one, which HINCRBY takes
-- ("-0" reads as 0 and %.0f writes -0 so, yet HINCRBY refused it, and every write of the node failed again:
-- tests/redis/test_redteam_damaged_counter_forms.py)
local function sound_count(v)
  local n = num(v)
  return not (n < 0 or n >= COUNT_MAX or tostring(v) ~= int_str(n) or tostring(v) == "-0"), n
end
local function counted(v, step)
  local ok, n = sound_count(v)
  if not ok then return math.min(step, 1) end
  return n + step
end
-- The new count of `field` (its text `v`) and the command that writes it: HINCRBY on a sound counter, as before; HSET
-- of the count started (again) on a damaged one or one not there yet (1, whatever `step`: a batch's span past a
-- missing version was the same trap as a damaged one's).
local function bump(key, field, v, step)
  local n = counted(v, step)
  if sound_count(v) then return n, {'HINCRBY', key, field, step} end
  return n, {'HSET', key, field, int_str(n)}
end
local function attempts_of(uid)
  local raw = redis.call('HGET', res_key(uid), 'attempts')
  if not raw then return nil end
  local out = {}
  for t in string.gmatch(raw, "[^,]+") do out[#out + 1] = t end
  if #out == 0 then return nil end
  return out
end
-- The name of an entry of `attempts` (an attempt's 16 hex digits, or `*<n>`)
local function entry_name(e) return (string.match(e, "^[^:]*")) end
-- The entry of attempt (or holder) `name` in `list`, or nil
local function entry_of(list, name)
  for _, e in ipairs(list or {}) do if entry_name(e) == name then return e end end
  return nil
end
-- The number of the last named attempt that joined booking `r` of `uid` (`named_binds`); with a list `held` but no
-- such field (written before it was kept, always with `binds`) its `binds`; 0 without either, or when the list is
-- damaged (present, no entry): then every number on the booking may be a holder's no list names.
local function named_binds_of(uid, r, held)
  -- (HGET, not HEXISTS: the roles' least-privilege ACL, docs/install.md "Redis", grants no +hexists)
  if not held and redis.call('HGET', res_key(uid), 'attempts') then return 0 end
  local v = redis.call('HGET', res_key(uid), 'named_binds')
  if v then return num(v) end
  if held then return r.binds end
  return 0
end
-- What a rewrite of uid's booking `r` carries over (book's `carry`): read before the old hash goes
local function carry_of(uid, r)
  return {binds = r and r.binds or 0, attempts = redis.call('HGET', res_key(uid), 'attempts') or nil,
          named = redis.call('HGET', res_key(uid), 'named_binds') or nil}
end

-- A reservation named by a caller (a uid from a payload): the node's only while its pods set lists it, the index
-- every reader and every rewrite of the node goes by. A hash the set does not list (left when Redis evicted the
-- set but not the hash: no script leaves one) is nobody's booking: never answered again, bound, recorded over or
-- given back, and replaced whole when the uid books again (book). It is not deleted here: a DEL is a write Redis
-- allows when full, after which it lets the script's other writes through too, past `maxmemory` under
-- noeviction (tests/redis/test_eviction_policy.py).
local function res_of(uid)
  if redis.call('SISMEMBER', PODS_KEY, uid) == 1 then return res_view(uid) end
  return nil
end

-- Whether a pending reservation's last Binding may still be committed at `now`: every bind attempt that
-- answers with it stamps `settle_by` (its Binding's deadline plus the settle time, on Redis's clock;
-- reserve.lua). A stamp later than now + FUTURE_MS comes from a clock that jumped and holds nothing.
local function in_flight(r, now)
  return (r.settle_by or 0) >= now and r.settle_by - now <= FUTURE_MS
end

-- Whether reservation view `r` is still settling at `now` (Redis's clock), so no caller's truth may judge
-- it yet: pending (its binder may be mid-flight; expire.lua ends it after the TTL, whatever its stamps say: one
-- stamped by a clock that stepped back since may hold a Binding in flight, `restamps`), or made or bound at or
-- after `keep_from` (newer than the caller's truth). A bound stamp later than now + FUTURE_MS comes from a
-- clock that jumped and settles nothing. The twin of settles in shared/domain/reconcile.py
-- (tests/redis/test_settles_twin.py runs one table through both).
local function settles(r, now, keep_from)
  if r.state == "pending" then return true end
  local stamp = math.max(r.created, r.bound_at)
  if stamp > now + FUTURE_MS then return false end
  return stamp >= keep_from
end

-- Whether pending reservation view `r` carries a stamp later than now + FUTURE_MS (`created`, or a bind
-- attempt's `settle_by`): Redis's clock stepped back since it was made (or a failover went to a server behind),
-- so its age cannot be told, and its Binding may be in flight. expire.lua stamps it anew at `now` instead of
-- releasing it: it expires a TTL later, when that Binding is committed or never (red team, clocks). The twin
-- of restamps in shared/domain/reconcile.py (tests/redis/test_expires_twin.py).
local function restamps(r, now)
  return r.state == "pending" and (r.created - now > FUTURE_MS or r.settle_by - now > FUTURE_MS)
end

local function node_view()
  local cards = {}
  for _, idx in ipairs(card_indices()) do cards[idx] = card_view(idx) end
  local res = {}
  for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do res[uid] = res_view(uid) end
  local n = hgetall(NODE_KEY) or {}
  return {node = NODE, version = counted(n.version, 0), stamp = n.stamp or "", error = n.error or "",
          cards = cards, res = res, exists = n.version ~= nil}
end

-- The payload {uid, ...} of a script on one reservation: checked, and the reservation's key declared.
-- Returns p, or nil and the reply to return at once (BADINPUT, or MOREKEYS).
local function uid_payload()
  local p, err = payload()
  if err then return nil, err end
  local bad = check_uid(p.uid)
  if bad then return nil, fail("BADINPUT", bad) end
  local more = need_keys({}, {p.uid})
  if more then return nil, more end
  return p
end

-- need_keys() for a script that reads the whole node: all its cards and reservations, plus the `cards` and
-- `uids` the call itself names (both optional); the node's complete lists.
local function need_node_keys(cards, uids)
  local c, u = card_indices(), redis.call('SMEMBERS', PODS_KEY)
  for _, idx in ipairs(cards or {}) do c[#c + 1] = idx end
  for _, uid in ipairs(uids or {}) do u[#u + 1] = uid end
  return need_keys(c, u, true)
end

-- The node's state sent with a refused booking, so the caller refits without another read: every card
-- (nil when one of them is not in KEYS: the caller then reads the node) and the reservations that are
-- in KEYS (the caller declares those it knows of; a refit needs only the cards, and the caller's own
-- reservation, which is declared and, had it existed, would have been answered as existing).
local function refusal_view()
  local cards = {}
  for _, idx in ipairs(card_indices()) do
    if not DECLARED[card_key(idx)] then return nil end
    cards[idx] = card_view(idx)
  end
  local res = {}
  for _, uid in ipairs(redis.call('SMEMBERS', PODS_KEY)) do
    if DECLARED[res_key(uid)] then res[uid] = res_view(uid) end
  end
  local n = hgetall(NODE_KEY) or {}
  return {node = NODE, version = counted(n.version, 0), stamp = n.stamp or "", error = n.error or "",
          cards = cards, res = res, exists = n.version ~= nil}
end

-- Applies a signed amount to one card: sign 1 books, -1 gives back. Free never goes below 0; used is
-- the truth (it may exceed capacity only when the API server says so, see observe.lua).
-- `c` is the card's view when the caller just read it (saves reading it again). Returns the card's
-- new view (as card_view would read it), or false when the card is gone or never existed.
local function add_usage(idx, mem, cores, slices, sign, c)
  local key = card_key(idx)
  c = c or card_view(idx)
  if not c then return false end
  local mu = math.max(0, c.mem_used + sign * mem)
  local cu = math.max(0, c.cores_used + sign * cores)
  local su = math.max(0, c.slices + sign * slices)
  if sign < 0 and (c.mem_used == c.capacity or c.cores_used == c.cores or c.slices == c.slice_limit) then
    -- a give-back on a usage field a hand edit damaged (read as the card full, `used`) leaves it full: the full value
    -- less the holder's share is a sound-looking number below what the others hold on a card holding more than it
    -- has (observe's truth, a lowered slice_limit), and the next booking went past them; the pass rewrites it
    -- (tests/redis/test_redteam_damaged_usage_release.py). Only a field that reads full can be one: the others'
    -- give-backs read nothing more
    local raw = redis.call('HMGET', key, 'mem_used', 'cores_used', 'slices')
    if used(raw[1], false) == false then mu = c.mem_used end
    if used(raw[2], false) == false then cu = c.cores_used end
    if used(raw[3], false) == false then su = c.slices end
  end
  if sign < 0 and c.health == "removed" and mu == 0 and cu == 0 and su == 0 then
    redis.call('DEL', key)          -- a removed card disappears once nothing holds it
    local kept = {}
    for _, i in ipairs(card_indices()) do if i ~= idx then kept[#kept + 1] = i end end
    redis.call('HSET', NODE_KEY, 'cards', table.concat(kept, ","))
    return false
  end
  local mf, cf = math.max(0, c.capacity - mu), math.max(0, c.cores - cu)
  redis.call('HSET', key, 'mem_used', mu, 'mem_free', mf, 'cores_used', cu, 'cores_free', cf, 'slices', su)
  return {capacity = c.capacity, mem_used = mu, mem_free = mf, cores = c.cores, cores_used = cu, cores_free = cf,
          slices = su, slice_limit = c.slice_limit, health = c.health, policy = c.policy,
          time_slice = c.time_slice, overcommit_ratio = c.overcommit_ratio}
end

local function split_cards(s)
  local out = {}
  for idx in string.gmatch(s or "", "[^,]+") do out[#out + 1] = idx end
  return out
end

-- Gives a reservation's share back and deletes it; returns the cards' new views (see add_usage).
local function drop_reservation(uid, r)
  local views = {}
  for _, idx in ipairs(split_cards(r.cards)) do views[idx] = add_usage(idx, r.mem, r.cores, r.slices, -1) end
  redis.call('DEL', res_key(uid))
  redis.call('SREM', PODS_KEY, uid)
  return views
end

-- Bumps the node version and publishes a change, plus the one reservation touched (res = false when it
-- was removed). `touched` lists the cards whose state changed: only those are sent (a card that no
-- longer exists as false), and mirrors merge them; with touched = nil every card is sent and
-- full = true tells mirrors to replace theirs. Reading and encoding every card of the node on every
-- booking was most of a script's time. `views` (optional): touched cards' states the caller already
-- knows (from add_usage), so they need not be read again. `extra` (optional): more fields of the message
-- (mark_bound's `more` and `span`). Mirrors apply a message when version == theirs + span (1 unless the
-- message says), else re-read the node: a write that changed n reservations counts n versions, so a mirror
-- that reads only `uid`/`res` (one of an earlier release) sees a gap and re-reads instead of taking the
-- version with only part of the write.
local function publish(kind, uid, res, touched, views, extra)
  local v, write = bump(NODE_KEY, 'version', redis.call('HGET', NODE_KEY, 'version'), (extra and extra.span) or 1)
  redis.call(unpack(write))
  -- When this write happened (Redis's clock, microseconds): with the version it names the node's last
  -- write, also across a loss (a version starts over at 1 when the keys are new, and a shard that failed
  -- over to a lagging replica counts again from an older one). Mirrors compare (version, stamp) with
  -- theirs to find the nodes to re-read, without reading the others (Ledger.heads).
  -- `prev`, the stamp of the write this one follows, goes in the message: a mirror applies a message onto
  -- its snapshot only when that snapshot is of that write, so a message of a node made anew or of a shard
  -- that failed over is never merged into a snapshot of the other history (which would then carry this
  -- write's (version, stamp) and be skipped by every periodic resync: tests/redis/test_redteam_heads.py)
  local t = redis.call('TIME')
  local stamp = t[1] .. "." .. t[2]
  local prev = redis.call('HGET', NODE_KEY, 'stamp') or ""
  redis.call('HSET', NODE_KEY, 'stamp', stamp)
  local cards = {}
  if touched then
    for _, idx in ipairs(touched) do
      local k = tostring(math.floor(tonumber(idx)))
      local view = views and views[k]
      if view == nil then view = card_view(k) or false end
      cards[k] = view
    end
  else
    for _, idx in ipairs(card_indices()) do cards[idx] = card_view(idx) end
  end
  local msg = {node = NODE, version = v, stamp = stamp, prev = prev, kind = kind, full = touched == nil, cards = cards,
               error = redis.call('HGET', NODE_KEY, 'error') or ""}
  if uid then msg.uid = uid; msg.res = res or false end
  if extra then for k, v in pairs(extra) do msg[k] = v end end
  redis.call('PUBLISH', FEED, cjson.encode(msg))
  return v, msg  -- the message too: reserve hands it to its caller, which applies it to its mirror at once
end

-- Validates a card list from the payload: [{index, capacity, slice_limit, health, and optionally the
-- knobs policy, time_slice, overcommit_ratio}].
local function check_cards(list)
  if not is_list(list, 1024) then return nil, "cards must be a list of at most 1024 cards" end
  local seen = {}
  for _, c in ipairs(list) do
    if type(c) ~= "table" or not is_int(c.index, 0, 1023) or not is_int(c.capacity, 2, 4096)
        or not is_int(c.slice_limit, 1, 16)
        or (c.health ~= "ok" and c.health ~= "cordoned" and c.health ~= "unhealthy") then
      return nil, "each card needs index 0..1023, capacity 2..4096, slice_limit 1..16, health ok|cordoned|unhealthy"
    end
    if (c.policy ~= nil and not is_int(c.policy, 0, 2)) or (c.time_slice ~= nil and not is_int(c.time_slice, 1, 1000000))
        or (c.overcommit_ratio ~= nil and not is_int(c.overcommit_ratio, 100, 200)) then
      return nil, "card knobs, when given: policy 0..2, time_slice 1..1000000, overcommit_ratio 100..200"
    end
    if seen[c.index] then return nil, "card index " .. c.index .. " repeats" end
    seen[c.index] = true
  end
  return seen, nil
end

-- Writes the reported cards, keeping each card's usage; cards no longer reported stay visible as
-- "removed" while something holds them (so no reservation becomes invisible), else disappear.
local function write_cards(list, reset)
  local want = {}
  for _, c in ipairs(list) do want[tostring(c.index)] = c end
  local keep = {}
  for _, idx in ipairs(card_indices()) do
    if not want[idx] then
      local c = card_view(idx)
      if c and not reset and (c.mem_used > 0 or c.cores_used > 0 or c.slices > 0) then
        redis.call('HSET', card_key(idx), 'health', 'removed')
        keep[#keep + 1] = tonumber(idx)
      else
        redis.call('DEL', card_key(idx))
      end
    end
  end
  for _, c in ipairs(list) do
    local idx = tostring(c.index)
    local cur = (not reset) and card_view(idx) or nil
    local mu, cu, su = 0, 0, 0
    if cur then mu, cu, su = cur.mem_used, cur.cores_used, cur.slices end
    redis.call('HSET', card_key(idx), 'id', NODE .. "-mthreads-" .. idx, 'capacity', c.capacity,
               'mem_used', mu, 'mem_free', math.max(0, c.capacity - mu), 'cores', 16, 'cores_used', cu,
               'cores_free', math.max(0, 16 - cu), 'slices', su, 'slice_limit', c.slice_limit, 'health', c.health)
    for _, k in ipairs(KNOB_FIELDS) do
      if c[k] ~= nil then redis.call('HSET', card_key(idx), k, c[k]) else redis.call('HDEL', card_key(idx), k) end
    end
    keep[#keep + 1] = c.index
  end
  table.sort(keep)
  for i, v in ipairs(keep) do keep[i] = tostring(v) end
  redis.call('HSET', NODE_KEY, 'cards', table.concat(keep, ","), 'updated', now_ms())
end

-- Validates a reservation payload {uid, cards, mem, cores, slices, pod}.
local function check_res(p)
  if type(p) ~= "table" then return "a reservation must be a JSON object" end
  local bad_uid = check_uid(p.uid)
  if bad_uid then return bad_uid end
  if not is_list(p.cards, 64) or #p.cards < 1 then return "cards must list 1..64 card indices" end
  local seen = {}
  for _, idx in ipairs(p.cards) do
    if not is_int(idx, 0, 1023) or seen[idx] then return "cards must be distinct indices 0..1023" end
    seen[idx] = true
  end
  if not is_int(p.mem, 0, MAX_UNITS) or not is_int(p.cores, 0, 16) or not is_int(p.slices, 0, 16) then
    return "mem must be 0.." .. MAX_UNITS .. ", cores 0..16, slices 0..16"
  end
  if p.pod ~= nil and (type(p.pod) ~= "string" or #p.pod > 512) then return "pod must be a string" end
  return nil
end

local function cards_csv(list)
  local t = {}
  for i, idx in ipairs(list) do t[i] = tostring(math.floor(idx)) end
  return table.concat(t, ",")
end

-- Books a reservation unconditionally (callers checked what they must). Unknown cards get a
-- placeholder marked "removed" so that usage the API server reports is never dropped; `known` holds
-- the views of the cards the caller just read (all of them exist: saves two reads per card).
-- Returns the cards' new views and the reservation as res_view would read it.
local function book(p, state, now, known, carry)
  local views = {}
  for _, idx in ipairs(p.cards) do
    local k = tostring(math.floor(idx))
    if not known and redis.call('EXISTS', card_key(k)) == 0 then
      redis.call('HSET', card_key(k), 'id', NODE .. "-mthreads-" .. k, 'capacity', math.max(p.mem, 1),
                 'mem_used', 0, 'mem_free', math.max(p.mem, 1), 'cores', 16, 'cores_used', 0, 'cores_free', 16,
                 'slices', 0, 'slice_limit', 16, 'health', 'removed')
      local list = card_indices()
      list[#list + 1] = k
      table.sort(list, function(a, b) return tonumber(a) < tonumber(b) end)
      redis.call('HSET', NODE_KEY, 'cards', table.concat(list, ","))
    end
    views[k] = add_usage(k, p.mem, p.cores, p.slices, 1, known and known[k])
  end
  local csv = cards_csv(p.cards)
  local fields = {'cards', csv, 'mem', p.mem, 'cores', p.cores, 'slices', p.slices,
                  'state', state, 'created', now, 'pod', p.pod or ""}
  if p.idle then fields[#fields + 1] = 'idle'; fields[#fields + 1] = '1' end
  -- `carry` (a rewrite of the pod's booking: its last bind attempt's number and the attempts holding it stay, so an
  -- earlier attempt's give-back, release.lua, still leaves it; or a binder's new booking: its hold, reserve.lua)
  if carry and carry.settle_by and carry.settle_by > 0 then
    fields[#fields + 1] = 'settle_by'; fields[#fields + 1] = carry.settle_by
  end
  if carry and carry.binds and carry.binds > 0 then fields[#fields + 1] = 'binds'; fields[#fields + 1] = carry.binds end
  if carry and carry.attempts then fields[#fields + 1] = 'attempts'; fields[#fields + 1] = carry.attempts end
  if carry and carry.named then fields[#fields + 1] = 'named_binds'; fields[#fields + 1] = carry.named end
  -- a new hash: no field of an earlier one (an orphan's) carried into it (after add_usage's HSET above, a write
  -- Redis refuses when full, so this DEL never opens the way past maxmemory)
  if redis.call('EXISTS', res_key(p.uid)) == 1 then redis.call('DEL', res_key(p.uid)) end
  local bound_at = 0
  if state == "bound" then bound_at = now; fields[#fields + 1] = 'bound_at'; fields[#fields + 1] = now end
  redis.call('HSET', res_key(p.uid), unpack(fields))
  redis.call('SADD', PODS_KEY, p.uid)
  return views, {cards = csv, mem = p.mem, cores = p.cores, slices = p.slices, state = state, created = now,
                 bound_at = bound_at, pod = p.pod or ""}
end

-- The card rule: why card view `c` cannot take `n` = {mem, cores, slices, accepts (set of capacities or
-- nil = any), deny (set of indices or nil), idle (boolean)}; nil if it can. The twin of card_rule in
-- shared/domain/fit.py: same order, same reason names (tests/redis/test_fit_twin.py runs one table through
-- both). `idx` is the card's index as a number.
local function card_rule(c, idx, n)
  if not c or c.health == "removed" then return "CardNotFound" end
  if c.health == "unhealthy" then return "CardNotHealth" end
  if c.health == "cordoned" then return "CardCordoned" end
  if c.health ~= "ok" then return "CardNotHealth" end
  if n.accepts and not n.accepts[c.capacity] then return "CardTypeMismatch" end
  if n.deny and n.deny[idx] then return "CardUuidMismatch" end
  if c.slices + n.slices > c.slice_limit then return "CardTimeSlicingExhausted" end
  if n.idle and (c.mem_used > 0 or c.cores_used > 0 or c.slices > 0) then
    return "ExclusiveDeviceAllocateConflict"
  end
  local mem_free = math.max(0, c.capacity - c.mem_used)
  local cores_free = math.max(0, c.cores - c.cores_used)
  if mem_free < n.mem then return "CardInsufficientMemory" end
  if n.cores == 0 and cores_free <= 0 then return "CardComputeUnitsExhausted" end
  if cores_free < n.cores then return "CardInsufficientCore" end
  return nil
end

-- A list of whole numbers lo..hi from the payload as a set, or nil when absent; (nil, error) if malformed.
local function int_set(list, lo, hi, what)
  if list == nil then return nil, nil end
  if not is_list(list, 1024) then return nil, what .. " must be a list" end
  local set = {}
  for _, v in ipairs(list) do
    if not is_int(v, lo, hi) then return nil, what .. " must hold whole numbers " .. lo .. ".." .. hi end
    set[v] = true
  end
  return set, nil
end

local function overcommitted(list)
  for _, idx in ipairs(list) do
    local c = card_view(tostring(math.floor(idx)))
    if c and (c.mem_used > c.capacity or c.cores_used > c.cores or c.slices > c.slice_limit) then return true end
  end
  return false
end

-- Ended pods' tombstones (docs/redis-layout.md `<base>:ended`): a hash of the uids of pods the pod watcher saw
-- end, each with when its release wrote it (ms, Redis's clock). A write read before the pod ended (a held-back
-- record's observe, a node written with its holders, a repair or rebuild) books no uid it holds: Kubernetes never
-- reuses a uid. A hash, not a sorted set: it needs no command beyond those the ledger's ACL rules already grant
-- (docs/install.md), so an upgrade asks nothing of an operator's Redis user. Its `#n` (tombstones written since
-- the last trim, and kept by it), `#trim_at` and `#trimmed` fields (no uid starts with `#`: check_uid) bound it:
-- the write that brings `#n` to `#trim_at`, or the first one once the last trim (`#trimmed`, ms) is past the keep
-- window, drops every tombstone past that window, and the next trim comes after twice as many as it kept
-- (amortised: each write pays for one tombstone read, and a node's hash is read whole once in ten minutes at
-- most besides). ENDED_KEEP_MS, tombstoned, next_trim and trim_due are the twins of shared/domain/ended.py's
-- (tests/redis/test_ended_twin.py runs one table through both).
local ENDED_KEY = BASE .. ":ended"
local ENDED_KEEP_MS = 600000
local ENDED_TRIM_FLOOR = 64
-- The twin of shared/domain/ended.py's tombstoned: whether a uid tombstoned at `at` (nil: not) may not be booked
local function tombstoned(at, now)
  return at ~= nil and now - at <= ENDED_KEEP_MS
end
-- The twin of shared/domain/ended.py's next_trim: `#trim_at` after a trim that kept `kept` tombstones
local function next_trim(kept)
  return math.max(ENDED_TRIM_FLOOR, 2 * kept)
end
-- The twin of shared/domain/ended.py's trim_due: whether the write that brings `#n` to `n` trims (`#trim_at` reached,
-- or the last trim, `#trimmed`, past the keep window: a burst's tombstones do not stay until as many new ones come)
local function trim_due(n, trim_at, trimmed_at, now)
  return n >= trim_at or trimmed_at == nil or now - trimmed_at > ENDED_KEEP_MS
end
local function ended_uid(uid, now)
  local s = redis.call('HGET', ENDED_KEY, uid)
  if not s then return false end
  return tombstoned(tonumber(s), now)
end
-- `soft`: a write Redis refuses (full, noeviction) is left out (nil) instead of failing the script
local function ended_write(soft, ...)
  if not soft then return redis.call(...) end
  local out = redis.pcall(...)
  if type(out) == "table" and out.err then return nil end
  return out
end
local function trim_ended(now, soft)
  local all = redis.call('HGETALL', ENDED_KEY)
  local kept, old = 0, {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '#' then
      if tombstoned(tonumber(all[i + 1]), now) then kept = kept + 1 else old[#old + 1] = all[i] end
    end
  end
  for i = 1, #old, 1000 do  -- (unpack's bound on arguments)
    if not ended_write(soft, 'HDEL', ENDED_KEY, unpack(old, i, math.min(i + 999, #old))) then return end
  end
  ended_write(soft, 'HSET', ENDED_KEY, '#n', kept, '#trim_at', next_trim(kept), '#trimmed', int_str(now))
end
-- A node's tombstones exist from its first write on (replace_node, upsert_node), `#n` 0 when none: on a Redis Cluster,
-- a script naming a key that does not exist is refused (TRYAGAIN) while the node's slot moves, which the node's
-- other keys all do; so a tombstone check (observe) or write (release of an ended pod) during a move works as soon as
-- the node's hash does. (A trim keeps `#n`: the hash goes only with its node, remove_node.)
local function ensure_ended()
  if redis.call('EXISTS', ENDED_KEY) == 0 then redis.call('HSET', ENDED_KEY, '#n', 0) end
end
-- The release of an ended pod writes its tombstone, on a node this Redis holds (a pod of a node the ledger does
-- not know, one with no cards, leaves no key behind), and trims when due (above).
-- `soft` (a release that frees nothing, which wrote nothing before tombstones): a Redis that refuses writes (full,
-- noeviction) leaves the tombstone out rather than fail the release, which a re-list sends for every ended pod
-- (the watchers' release-again belt covers it, and a full Redis books no record either); the release that frees a
-- booking is refused whole then anyway (its HSETs are).
local function tombstone(uid, soft)
  if not redis.call('HGET', NODE_KEY, 'version') then return end
  local now = now_ms()
  local added = ended_write(soft, 'HSET', ENDED_KEY, uid, int_str(now))
  if added ~= 1 then return end  -- (refused, or a tombstone again: counted once)
  local n, write = bump(ENDED_KEY, '#n', redis.call('HGET', ENDED_KEY, '#n'), 1)
  if not ended_write(soft, unpack(write)) then return end
  -- (a damaged `#trim_at` trims now: it failed every release of an ended pod on the node, for ever)
  local trim_at = tonumber(redis.call('HGET', ENDED_KEY, '#trim_at')) or ENDED_TRIM_FLOOR
  if trim_due(n, trim_at, tonumber(redis.call('HGET', ENDED_KEY, '#trimmed') or ""), now) then
    trim_ended(now, soft)
  end
end
