-- GPU against CPU (busted --run=gpu, on a machine with a CUDA device; the
-- default task excludes #gpu).  Normalised error ||gpu - cpu|| / ||cpu||
-- on fresh random inputs, many geometries, both layouts, bf16 and f16,
-- per-head windows and text tokens.
local sta = require "sta"
local H = require "helpers"

local have = sta.backend_available("cuda")

-- random geometry: canvas and tile (odd sizes and partial tiles included)
local function random_case(rng)
  local tiles = { {6, 8, 8}, {2, 4, 4}, {3, 8, 8}, {6, 8, 8} }
  local tile = tiles[rng(#tiles)]
  local grid = { rng(3), rng(3), rng(4) } -- keeps the CPU reference quick
  local canvas = {}
  for a = 1, 3 do canvas[a] = math.max(1, grid[a] * tile[a] - (rng(3) == 1 and rng(tile[a]) - 1 or 0)) end
  local g = sta.geometry{ canvas = canvas, tile = tile }:grid()
  local function odd(n) local k = 2 * rng(math.max(1, (n + 1) // 2)) - 1 return math.min(k, n % 2 == 1 and n or n + 1) end
  local heads = rng(3)
  local windows = {}
  for h = 1, heads do windows[h] = { odd(g[1]), odd(g[2]), odd(g[3]) } end
  return { canvas = canvas, tile = tile, heads = heads, windows = windows, D = rng(2) == 1 and 64 or 128,
    text = rng(3) == 1 and 0 or rng(40), pad = rng(3) - 1, batch = rng(2) }
end

describe("sta on the GPU #gpu", function()
  it("finds a CUDA device", function()
    assert.is_true(have, sta.info().cuda)
    assert.same({"cpu", "cuda"}, sta.backends())
  end)

  it("matches the CPU on random geometries, both layouts, bf16 and f16", function()
    if not have then return end
    local seed = H.seed()
    local state = seed
    local function rng(n)
      state = (state * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff
      return (state >> 33) % n + 1
    end
    for case = 1, 16 do
      local c = random_case(rng)
      local V = c.canvas[1] * c.canvas[2] * c.canvas[3]
      local S = V + c.text + c.pad
      for _, layout in ipairs{ "bshd", "bhsd" } do
        for _, dt in ipairs{ "bf16", "f16" } do
          local shape = layout == "bshd" and {c.batch, S, c.heads, c.D} or {c.batch, c.heads, S, c.D}
          local q, k, v = H.randn(shape, { dtype = dt }), H.randn(shape, { dtype = dt }), H.randn(shape, { dtype = dt })
          local opts = { canvas = c.canvas, tile = c.tile, window = c.windows, text_len = c.text, layout = layout,
            lse = true }
          local cpu, cpu_lse = sta.attention(q, k, v, opts)
          local gq, gk, gv = q:to("cuda"), k:to("cuda"), v:to("cuda")
          local gpu, gpu_lse = sta.attention(gq, gk, gv, opts)
          assert.equal("cuda:0", gpu:device())
          local _, rel = gpu:compare(cpu)
          local tol = dt == "bf16" and 2e-2 or 4e-3
          local what = ("case %d seed %d canvas %s tile %s D %d heads %d text %d %s %s"):format(case, seed,
            table.concat(c.canvas, "x"), table.concat(c.tile, "x"), c.D, c.heads, c.text, layout, dt)
          assert.is_true(rel < tol, what .. (": rel %g"):format(rel))
          local _, rel_lse = gpu_lse:compare(cpu_lse)
          assert.is_true(rel_lse < 1e-3, what .. (": lse rel %g"):format(rel_lse))
        end
      end
    end
  end)

  it("runs an STA layer on the cuda backend", function()
    if not have then return end
    local canvas, tile = {12, 16, 16}, {6, 8, 8}
    local S = 12 * 16 * 16 + 8
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 64, canvas = canvas, tile = tile, text_len = 8,
      backend = "cuda", strategy = s }
    local q, k, v = H.randn({1, S, 2, 64}, { dtype = "bf16" }), H.randn({1, S, 2, 64}, { dtype = "bf16" }),
      H.randn({1, S, 2, 64}, { dtype = "bf16" })
    local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{} }
    local out = layer:forward(q:to("cuda"), k:to("cuda"), v:to("cuda"))
    local cpu = sta.attention(q, k, v, { canvas = canvas, tile = tile, text_len = 8, window = {1, 1, 1} })
    local _, rel = out:compare(cpu)
    assert.is_true(rel < 2e-2, rel)
    assert.equal("sta.Tensor(bf16, cuda:0, 1x3080x2x64)", tostring(out))
  end)

  it("runs the pipeline's layer call (one tensor as q, k, v) on the bare forward's kernel", function()
    if not have then return end
    local canvas, text, heads = {12, 16, 24}, 24, 3
    local S = 12 * 16 * 24 + text
    local x = sta.randn({1, S, heads, 128}, { seed = H.seed(), dtype = "bf16", device = "cuda" })
    local q = sta.randn({1, S, heads, 128}, { seed = H.seed(), dtype = "bf16", device = "cuda" })
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = heads, window = {3, 3, 3} }
    local layer = sta.layer{ layer = 0, heads = heads, head_dim = 128, canvas = canvas, text_len = text,
      backend = "cuda" }
    local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{},
      metadata = sta.metadata.from_strategy(s, 0, 1, heads) }
    local out = layer:forward(x, x, x)
    local line = sta.last_launch()
    assert.truthy(line:find("forward: Wide<bf16, D 128>", 1, true), line)
    assert.truthy(line:find("loads by TMA;", 1, true), line)
    assert.falsy(line:find("left out", 1, true), line)
    local bare = sta.attention(q, q, q, { canvas = canvas, text_len = text, window = {3, 3, 3} })
    assert.equal(line, sta.last_launch())
    assert.equal(0, (out:compare(sta.attention(x, x, x, { canvas = canvas, text_len = text,
      window = {3, 3, 3} }))))
    assert.is_true(select(2, bare:compare(out)) > 0.1) -- other inputs, other output
  end)

  it("counts device bytes and lets the collector free them", function()
    if not have then return end
    H.full_gc()
    local before = sta.device_bytes()
    do
      local t <close> = sta.tensor({1024, 1024}, { dtype = "bf16", device = "cuda" })
      assert.equal(before + 2 * 1024 * 1024, sta.device_bytes())
    end
    assert.equal(before, sta.device_bytes())
    sta.set_device_soft_limit(8 * 1024 * 1024)
    local peak = 0
    for _ = 1, 64 do
      sta.tensor({1024, 1024}, { dtype = "f32", device = "cuda" }) -- 4 MiB, garbage at once
      peak = math.max(peak, sta.device_bytes() - before)
    end
    sta.set_device_soft_limit(1 << 30)
    H.full_gc()
    assert.equal(before, sta.device_bytes())
    assert.is_true(peak < 64 * 4 * 1024 * 1024, peak) -- the collector stepped
  end)

  it("reports unsupported GPU requests as errors, CPU tensors stay usable", function()
    if not have then return end
    local q = H.randn({1, 64 + 1, 1, 64}):to("cuda") -- f32 on the GPU
    local msg = H.error_of(sta.attention, q, q, q, { canvas = {1, 8, 8}, tile = {1, 8, 8}, window = {1, 1, 1} })
    assert.equal("attention: dtype f32 not supported on cuda (use bf16 or f16)", msg)
  end)
end)
