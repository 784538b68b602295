--[[
compare.lua -- per-head error of STA against full attention on captured
activations.  `lua5.4 examples/compare.lua --help` prints the options, their
defaults and what the script does (the `about` text below).
]]
local sta = require "sta"
local cli = require "sta.cli"

local about = [[
Per-head error of STA against full attention on captured activations (.npy
or .safetensors), printed as a table: the window and sparsity of each head,
the mean L1 and L2 differences and the relative error; then both times.
  compare.lua --q q.npy --k k.npy --v v.npy --canvas 30x48x80 --window 3x3x3
  compare.lua --file acts.safetensors --names q,k,v --window 3x3x3,1x5x7,...
  compare.lua --demo     (random activations written to .npy under --out first)
--canvas may be left out for FastVideo's sequence lengths; --window takes one
window for all heads or one per head (3x3x3,1x5x7 or 3,3,3:1,5,7; triples as
TxHxW or T,H,W, as sta-run and every binding take them).  Reads the inputs; writes files only
with --demo.]]
local spec, usage, help = cli.options("compare.lua", about, {
  { "q", "", "F.npy", "queries [B, S, heads, D]", default = "none" },
  { "k", "", "F.npy", "keys", default = "none" },
  { "v", "", "F.npy", "values", default = "none" },
  { "file", "", "F.safetensors", "q, k and v from one file instead", default = "none" },
  { "names", "q,k,v", "Q,K,V", "their names in --file" },
  { "demo", false, false, "compare random activations, written to --out first" },
  { "canvas", "", "TxHxW", "latent video tokens", default = "from the sequence length (FastVideo's)" },
  { "tile", "6x8x8", "TxHxW", "tile size" },
  { "text", -1, "N", "valid text tokens", default = "every row after the video" },
  { "window", "3x3x3", "W[,W...]", "one window, or one per head, in tiles",
    default = "3x3x3; with --demo 1x1x1,1x2x2,2x1x1,2x2x2" },
  { "layout", "bshd", "bshd|bhsd", "the inputs' layout" },
  { "bf16", false, false, "read <u2 .npy arrays as raw bf16" },
  { "device", "cpu", "cpu|cuda", "where to run" },
  { "dtype", "", "f32|bf16|f16", "compute dtype", default = "the inputs'; bf16 for f32 inputs on CUDA" },
  { "out", "", "DIR", "--demo's folder", default = "a new folder under $TMPDIR or /tmp" },
})
local ok, opts = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("compare: ", opts, "\n", usage, "\n") os.exit(2) end

local function main()

local function fail(msg)
  io.stderr:write("compare: ", msg, "\n")
  os.exit(1)
end

if opts.demo then -- write random activations, then compare them like captured ones
  local dir = cli.out_dir(opts.out, "compare")
  if opts.canvas == "" then opts.canvas = "6x16x16" end
  local c = cli.triple(opts.canvas, "--canvas")
  local S = c[1] * c[2] * c[3] + math.max(opts.text, 0)
  for i, name in ipairs{ "q", "k", "v" } do
    local path = ("%s/%s.npy"):format(dir, name)
    sta.randn({ 1, S, 4, 64 }, { seed = 100 + i }):save(path)
    opts[name] = path
  end
  if opts.window == "3x3x3" then opts.window = "1x1x1,1x2x2,2x1x1,2x2x2" end
  print(("demo: random q, k, v written to %s/{q,k,v}.npy"):format(dir))
end

local function load(path)
  local t, msg = sta.load(path, opts.bf16 and "bf16" or nil)
  if not t then fail(msg) end
  return t
end

local q, k, v
if opts.file ~= "" then
  local all, names = sta.load_safetensors(opts.file)
  if not all then fail(names) end
  local want = {}
  for n in opts.names:gmatch("[^,]+") do want[#want + 1] = n end
  if #want ~= 3 then fail("--names: expected three names, got '" .. opts.names .. "'") end
  q, k, v = all[want[1]], all[want[2]], all[want[3]]
  if not (q and k and v) then
    fail(("%s holds %s; --names asks for %s"):format(opts.file, table.concat(names, ", "), opts.names))
  end
elseif opts.q ~= "" and opts.k ~= "" and opts.v ~= "" then
  q, k, v = load(opts.q), load(opts.k), load(opts.v)
else
  io.stderr:write(usage, "\n")
  os.exit(2)
end
-- the GPU backend computes bf16/f16: f32 inputs go as bf16 unless --dtype says
local dtype = opts.dtype ~= "" and opts.dtype or (opts.device ~= "cpu" and q:dtype() == "f32" and "bf16") or q:dtype()
if opts.device ~= "cpu" or dtype ~= q:dtype() then
  q, k, v = q:to(dtype, opts.device), k:to(dtype, opts.device), v:to(dtype, opts.device)
end

local layout = opts.layout
local sdim, hdim = layout == "bshd" and 2 or 3, layout == "bshd" and 3 or 2
if q:ndim() ~= 4 then fail(("q: expected a 4-D tensor, got %s"):format(q:info())) end
local S, heads = q:size(sdim), q:size(hdim)
local geom
if opts.canvas ~= "" then
  geom = sta.geometry{ canvas = cli.triple(opts.canvas, "--canvas"), tile = cli.triple(opts.tile, "--tile"),
    text_len = opts.text }
else
  local g = sta.geometry_from_seq_len(S)
  geom = sta.geometry{ canvas = g.canvas, tile = cli.triple(opts.tile, "--tile"), text_len = opts.text }
end
local grid = geom:grid()

local windows = cli.windows(opts.window, "--window")
if #windows ~= 1 and #windows ~= heads then
  fail(("--window: expected 1 or %d windows (one per head), got %d"):format(heads, #windows))
end

local base = { geometry = geom, layout = layout }
local function run(win)
  local o = { window = win }
  for kk, vv in pairs(base) do o[kk] = vv end
  if opts.device ~= "cpu" then sta.attention(q, k, v, o) sta.synchronize() end -- warm-up
  local t0 = sta.now()
  local out = sta.attention(q, k, v, o)
  if opts.device ~= "cpu" then sta.synchronize() end
  return out, sta.now() - t0
end
local out, t_sta = run(#windows == 1 and windows[1] or windows)
local full, t_full = run(grid)
local zero = sta.zeros(full:shape(), { dtype = full:dtype(), device = full:device() })
local l1, l2 = sta.head_diff(out, full, layout)
local _, power = sta.head_diff(full, zero, layout)

print(("q %s, canvas %s, tile %s, grid %s, text %d, layout %s"):format(q:info(), cli.fmt_triple(geom.canvas),
  cli.fmt_triple(geom.tile), cli.fmt_triple(grid), geom:text_len_for(S), layout))
local rows, worst = {}, 0
for h = 1, heads do
  local w = windows[#windows == 1 and 1 or h]
  local vol = 1
  for a = 1, 3 do vol = vol * math.min(w[a], grid[a]) / grid[a] end
  local rel = math.sqrt(l2[h] / math.max(power[h], 1e-30))
  worst = math.max(worst, rel)
  rows[h] = { h - 1, cli.fmt_triple(w), ("%.1f%%"):format(100 * (1 - vol)), ("%.3e"):format(l1[h]),
    ("%.3e"):format(l2[h]), ("%.4f"):format(rel) }
end
cli.table({ "head", "window", "sparsity", "L1 mean|d|", "L2 mean d^2", "rel. error" }, rows)
local _, rel_all = out:compare(full)
print(("all heads: relative L2 error %.4f (worst head %.4f); STA %.1f ms, full %.1f ms (%.2fx)"):format(
  rel_all, worst, t_sta * 1e3, t_full * 1e3, t_full / t_sta))
end

cli.main("compare", main, usage)
