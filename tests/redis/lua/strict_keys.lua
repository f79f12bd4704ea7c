-- Test-only prelude (tests/redis/test_script_keys.py), put before _lib.lua: every redis.call or
-- redis.pcall on a key that is not in KEYS fails the script. A local `redis` shadows the global one
-- for the whole chunk, so no call in _lib.lua or a script escapes it.
local redis = (function(real)
  local keyless = {TIME = true, PUBLISH = true, INFO = true}  -- PUBLISH names a channel, INFO a section
  local all_keys = {DEL = true, EXISTS = true}      -- commands whose every argument is a key
  local declared = {}
  for _, k in ipairs(KEYS) do declared[k] = true end
  local function check(cmd, ...)
    local name = string.upper(cmd)
    if keyless[name] then return end
    local args = {...}
    local last = all_keys[name] and #args or 1     -- any other command: its first argument is a key
    for i = 1, last do
      if not declared[args[i]] then error("UNDECLARED " .. name .. " " .. tostring(args[i]) .. " (not in KEYS)") end
    end
  end
  return setmetatable({
    call = function(cmd, ...) check(cmd, ...) return real.call(cmd, ...) end,
    pcall = function(cmd, ...) check(cmd, ...) return real.pcall(cmd, ...) end,
  }, {__index = real})
end)(redis)
