--[[
mask_search.lua -- STA mask search and tuning end to end, on synthetic
activations whose answer is known.  `lua5.4 examples/mask_search.lua --help`
prints the options, their defaults and what the script does (the `about`
text below).
]]
local sta = require "sta"
local cli = require "sta.cli"

local about = [[
STA mask search and tuning end to end, on synthetic activations whose answer
is known.  Half of the heads are "local": q = k = sharp positional features,
so each token attends (almost only) to itself and every window gives the full
output.  The other half are "wide": near-uniform attention over the whole
video, so the largest window loses least.  The search runs every candidate
window on every layer and step (search-mode metadata), records L1/L2 per head
into the forward batch and saves one file per prompt; tuning averages them
and picks per (step, layer, head) the window with the least L2.  Expected:
local heads get the smallest candidate, wide heads the largest.
Writes into --out: search_<prompt>.json, strategy.json, strategy.svg and
tiles_head<h>.svg (the tiles one query tile sees under each head's window).]]
local spec, usage, help = cli.options("mask_search.lua", about, {
  { "prompts", 2, "N", "prompts searched (one record file each)" },
  { "steps", 4, "N", "denoising steps" },
  { "layers", 2, "N", "transformer layers" },
  { "skip_steps", 1, "N", "first steps tuning leaves at the full window" },
  { "heads", 6, "N", "attention heads (half local, half wide)" },
  { "head_dim", 32, "D", "head dimension" },
  { "canvas", "6x12x12", "TxHxW", "latent video tokens" },
  { "tile", "2x4x4", "TxHxW", "tile size" },
  { "out", "", "DIR", "where the files go", default = "a new folder under $TMPDIR or /tmp" },
  { "seed", 7, "N", "random seed" },
  { "quiet", false, false, "print nothing but errors" },
})
local ok, opts = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("mask_search: ", opts, "\n", usage, "\n") os.exit(2) end

local function main()
for _, n in ipairs{ "prompts", "steps", "layers", "heads", "head_dim" } do cli.int(opts, n, 1) end
cli.int(opts, "skip_steps", 0)
local say = opts.quiet and function() end or function(...) io.stdout:write(string.format(...)) end

local canvas, tile = cli.triple(opts.canvas, "--canvas"), cli.triple(opts.tile, "--tile")
local geom = sta.geometry{ canvas = canvas, tile = tile, text_len = 0 }
local grid = geom:grid()
local V, H, D, L = geom:video_tokens(), opts.heads, opts.head_dim, opts.layers
local n_local = H // 2

-- candidates ordered smallest first (ties go to the first), full last
local function odd_at_most(n, want) return math.max(1, math.min(want, n % 2 == 1 and n or n - 1)) end
local full = { grid[1], grid[2], grid[3] }
local candidates = {
  { 1, 1, 1 },
  { odd_at_most(grid[1], 3), 1, 1 },
  { 1, odd_at_most(grid[2], 3), odd_at_most(grid[3], 3) },
}
local search_row = {}
for i, c in ipairs(candidates) do search_row[i] = c end
search_row[#search_row + 1] = full
if #search_row >= H then
  io.stderr:write(("mask_search: needs more heads (%d) than candidate windows (%d)\n"):format(H, #search_row))
  os.exit(2)
end

opts.out = cli.out_dir(opts.out, "mask_search")
say("mask search: canvas %s, tile %s, grid %s; %d layers x %d heads (%d local, %d wide), %d steps, %d prompts\n",
  cli.fmt_triple(canvas), cli.fmt_triple(tile), cli.fmt_triple(grid), L, H, n_local, H - n_local, opts.steps,
  opts.prompts)
local names = {}
for i, c in ipairs(search_row) do names[i] = cli.fmt_triple(c) end
say("  candidates %s (full last)\n", table.concat(names, ", "))

-- synthetic q and k: [1, V, H, D] flat, row-major
local function synthetic_qk(seed)
  local freq = sta.randn({ D // 2, 3 }, { seed = seed, std = 2.0 }):totable() -- sharp kernel
  local noise = sta.randn({ V * H * D }, { seed = seed + 1 }):totable()
  local q, k = {}, {}
  local HW, W = canvas[2] * canvas[3], canvas[3]
  local amp = 10.0
  for s = 0, V - 1 do
    local t, h, w = s // HW, (s // W) % canvas[2], s % W
    for head = 0, H - 1 do
      local base = (s * H + head) * D
      if head < n_local then
        for j = 0, D // 2 - 1 do
          local ph = freq[3 * j + 1] * t + freq[3 * j + 2] * h + freq[3 * j + 3] * w
          local c, sn = amp * math.cos(ph), amp * math.sin(ph)
          q[base + 2 * j + 1], q[base + 2 * j + 2] = c, sn
          k[base + 2 * j + 1], k[base + 2 * j + 2] = c, sn
        end
      else
        for d = 1, D do
          q[base + d] = 0.01 * noise[base + d]
          k[base + d] = noise[base + d]
        end
      end
    end
  end
  return sta.from_table(q, { 1, V, H, D }), sta.from_table(k, { 1, V, H, D })
end

local layers = {}
for l = 0, L - 1 do
  layers[l] = sta.layer{ layer = l, heads = H, head_dim = D, canvas = canvas, tile = tile, text_len = 0 }
end
local md = sta.metadata.search(L, search_row)

local files = {}
local t0 = sta.now()
local bar = cli.progress(opts.prompts * opts.steps * 2 * L, "searching")
local done = 0
for p = 1, opts.prompts do
  local batch = sta.forward_batch{ batch_size = 1 }
  local qk = {}
  for l = 0, L - 1 do qk[l] = { synthetic_qk(opts.seed * 1000 + p * 100 + l) } end
  for step = 0, opts.steps - 1 do
    for _, pass in ipairs{ "pos", "neg" } do
      batch:negative(pass == "neg")
      local ctx <close> = sta.forward_context{ step = step, metadata = md, batch = batch }
      for l = 0, L - 1 do
        local v = sta.randn({ 1, V, H, D }, { seed = opts.seed + p * 7919 + step * 31 + l })
        layers[l]:forward(qk[l][1], qk[l][2], v)
        done = done + 1
        bar:update(done, ("prompt %d step %d %s layer %d"):format(p, step, pass, l))
      end
    end
  end
  local path = ("%s/search_%d.json"):format(opts.out, p)
  assert(batch:save_search(path, false))
  files[#files + 1] = path
end
bar:finish()
say("  searched in %.2f s: %s\n", sta.now() - t0, table.concat(files, ", "))

local strategy, report = sta.tune{ files = files, skip_steps = opts.skip_steps, full = full }
if not strategy then io.stderr:write("mask_search: ", report, "\n") os.exit(1) end
local spath = opts.out .. "/strategy.json"
assert(strategy:save(spath))
say("  tuned strategy: %s (sparsity %.3f)\n", spath, report.sparsity)
local rows = {}
for i, w in ipairs(report.windows) do rows[i] = { cli.fmt_triple(w), report.counts[i] } end
cli.table({ "window", "entries" }, rows)

-- the known answer
local expect_local, expect_wide = candidates[1], candidates[#candidates]
local wrong, rows2 = 0, {}
local last = opts.steps - 1
for h = 0, H - 1 do
  local kind = h < n_local and "local" or "wide"
  local want = h < n_local and expect_local or expect_wide
  local got = strategy:get(last, 0, h)
  for step = opts.skip_steps, opts.steps - 1 do
    for l = 0, L - 1 do
      local w = strategy:get(step, l, h)
      if w[1] ~= want[1] or w[2] ~= want[2] or w[3] ~= want[3] then wrong = wrong + 1 end
    end
  end
  rows2[#rows2 + 1] = { h, kind, cli.fmt_triple(got), cli.fmt_triple(want) }
end
say("\n")
cli.table({ "head", "kind", ("chosen (step %d, layer 0)"):format(last), "expected" }, rows2)

-- pictures
local svg = require "sta.svg"
assert(svg.strategy(strategy, { grid = grid, path = opts.out .. "/strategy.svg",
  title = "Tuned mask: local heads (left) vs wide heads (right)" }))
local centre = { grid[1] // 2, grid[2] // 2, grid[3] // 2 }
for _, h in ipairs{ 0, H - 1 } do
  local w = strategy:get(last, 0, h)
  assert(svg.tiles(geom, centre, w, { path = ("%s/tiles_head%d.svg"):format(opts.out, h),
    title = ("Head %d (%s): window %s around tile (%d, %d, %d)"):format(h, h < n_local and "local" or "wide",
      cli.fmt_triple(w), centre[1], centre[2], centre[3]) }))
end
say("\n  pictures: %s/strategy.svg, %s/tiles_head0.svg, %s/tiles_head%d.svg\n", opts.out, opts.out, opts.out, H - 1)
if wrong > 0 then
  say("UNEXPECTED: %d (step, layer, head) entries differ from the known answer\n", wrong)
  os.exit(1)
end
say("ok: local heads chose %s, wide heads %s, full window for the first %d steps\n",
  cli.fmt_triple(expect_local), cli.fmt_triple(expect_wide), opts.skip_steps)
end

cli.main("mask_search", main, usage)
