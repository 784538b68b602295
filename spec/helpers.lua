-- Shared helpers for sta's busted specs.
local sta = require "sta"
local H = {}

local seed = os.time() % 100000
--- A fresh seed per call (inputs differ from run to run and call to call).
function H.seed()
  seed = seed + 7919
  return seed
end

function H.randn(shape, opts)
  opts = opts or {}
  local o = { seed = H.seed() }
  for k, v in pairs(opts) do o[k] = v end
  return sta.randn(shape, o)
end

--- The error value raised by fn(...), which must raise.
function H.error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert(not ok, "expected an error, got success")
  return err
end

--- A temporary file name with the given suffix, removed by H.cleanup().
local made = {}
function H.tmp(suffix)
  local p = os.tmpname()
  os.remove(p)
  p = p .. (suffix or "")
  made[#made + 1] = p
  return p
end
function H.cleanup()
  for _, p in ipairs(made) do os.remove(p) end
  made = {}
end

function H.read(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

function H.write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

--- Flat list of a tensor's values.
function H.values(t) return t:totable() end

function H.same_values(a, b)
  local x, y = a:totable(), b:totable()
  if #x ~= #y then return false end
  for i = 1, #x do if x[i] ~= y[i] then return false end end
  return true
end

--- Run fn and collect garbage until the live tensor count settles.
function H.full_gc()
  collectgarbage("collect")
  collectgarbage("collect")
end

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
H.quote = shell_quote

--- Run a Lua 5.4 chunk in a fresh interpreter that finds sta as this one
-- does.  env: {NAME = value or false (unset)}.  Returns output, ok.
function H.run_lua(code, env)
  local parts, sets = { "env" }, {}
  for k, v in pairs(env or {}) do -- env wants every -u before the first NAME=value
    if v == false then parts[#parts + 1] = "-u " .. k
    else sets[#sets + 1] = k .. "=" .. shell_quote(v) end
  end
  for _, s in ipairs(sets) do parts[#parts + 1] = s end
  parts[#parts + 1] = "LUA_PATH=" .. shell_quote(package.path)
  parts[#parts + 1] = "LUA_CPATH=" .. shell_quote(package.cpath)
  parts[#parts + 1] = "lua5.4 -e " .. shell_quote(code) .. " 2>&1"
  local f = assert(io.popen(table.concat(parts, " ")))
  local out = f:read("a")
  local ok = f:close() and true or false
  return out, ok
end

--- Run a shell command line; returns output, ok.
function H.sh(cmd)
  local f = assert(io.popen(cmd .. " 2>&1"))
  local out = f:read("a")
  local ok = f:close() and true or false
  return out, ok
end

return H
