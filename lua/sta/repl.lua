--[[
repl.lua -- run by scripts/sta-repl as `lua5.4 -i lua/sta/repl.lua`: loads sta
as the global `sta`, prints a banner, keeps readline history across
sessions ($STA_HISTORY), then lua5.4's own prompt takes over (tensors print
as one line, with values when small).
]]
sta = require "sta"
-- Ctrl-C during a long call (a forward) cancels it (sta.cancel) instead of
-- being noticed only when it returns
sta.interruptible(true)

local info = sta.info()
local hist = os.getenv("STA_HISTORY") or ((os.getenv("HOME") or ".") .. "/.sta_history")
local has_history = sta.core.history(hist)

io.write(("sta %s -- Sliding Tile Attention (%s)\n"):format(info.version, _VERSION))
io.write(("  backends: %s; cpu threads: %s; cuda: %s\n"):format(table.concat(info.backends, ", "),
  info.threads == 0 and "OpenMP default" or tostring(info.threads), info.cuda))
io.write("  try: q = sta.randn{1, 1024 + 8, 2, 64}   out = sta.attention(q, q, q, {canvas = {4, 16, 16}, "
  .. "tile = {2, 8, 8}, window = {1, 1, 1}})\n")
io.write("  help() lists the API; Ctrl-C interrupts a long call" .. (has_history and ("; history in " .. hist) or "") .. "\n")

function help()
  local names = {}
  for k, v in pairs(sta) do
    if type(v) == "function" then names[#names + 1] = "sta." .. k
    elseif type(v) == "table" and k ~= "core" and k ~= "status" then
      for k2 in pairs(v) do names[#names + 1] = ("sta.%s.%s"):format(k, k2) end
    end
  end
  table.sort(names)
  io.write(table.concat(names, "  "), "\n")
  io.write("tensor methods: ")
  local m = {}
  for k in pairs(debug.getregistry()["sta.Tensor"].methods) do m[#m + 1] = k end
  table.sort(m)
  io.write(table.concat(m, " "), "\n")
end

-- scripts given on the command line run after the banner
for i = 1, #arg do dofile(arg[i]) end
