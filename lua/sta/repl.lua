--[[
repl.lua -- run by scripts/sta-repl as `lua5.4 -i lua/sta/repl.lua`: loads sta
as the global `sta`, prints a banner, keeps readline history across
sessions ($STA_HISTORY; none when it is empty), then lua5.4's own prompt
takes over.  lua.c prints a line's results with the global print: here
plain tables print readably ({backends = {"cpu"}, version = "0.1.0", ...},
sta.help.format), tensors as one line (with values when small).
help() lists every function with its signature, help("attention") or
help(sta.attention) one entry (sta.help).
]]
sta = require "sta"
local sta_help = require "sta.help"
-- Ctrl-C during a long call (a forward) cancels it (sta.cancel) instead of
-- being noticed only when it returns
sta.interruptible(true)

local info = sta.info()
local hist = os.getenv("STA_HISTORY")
if hist == nil then hist = (os.getenv("HOME") or ".") .. "/.sta_history" end
local has_history = hist ~= "" and sta.core.history(hist)

-- sta.info().cuda reads "cuda: <device or why not>": shown once, not as "cuda: cuda: ..."
local cuda = tostring(info.cuda):gsub("^cuda: ", "")
io.write(("sta %s -- Sliding Tile Attention (%s)\n"):format(info.version, _VERSION))
io.write(("  backends: %s; cpu threads: %s; cuda: %s\n"):format(table.concat(info.backends, ", "),
  info.threads == 0 and "OpenMP default" or tostring(info.threads), cuda))
io.write("  try: q = sta.randn{1, 1024 + 8, 2, 64}   out = sta.attention(q, q, q, {canvas = {4, 16, 16}, "
  .. "tile = {2, 8, 8}, window = {1, 1, 1}})\n")
io.write("  help() lists the API with signatures, help(\"attention\") one part; Ctrl-C interrupts a long call"
  .. (has_history and ("; history in " .. hist) or "") .. "\n")

local raw_print = print
--- print, as the prompt uses it: tables readably, the rest as print does.
function print(...)
  local n = select("#", ...)
  local out = {}
  for i = 1, n do
    local v = select(i, ...)
    out[i] = type(v) == "table" and sta_help.format(v) or v
  end
  raw_print(table.unpack(out, 1, n))
end

function help(what) sta_help.show(what) end

-- scripts given on the command line run after the banner
for i = 1, #arg do dofile(arg[i]) end
