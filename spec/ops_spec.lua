-- Elementwise operations and reductions from Lua (core/ops.c): axpby,
-- scale, add, stats, the transfer counter; on the host by default, on the
-- GPU against the host in the #gpu block (busted --run=gpu).
local sta = require "sta"
local H = require "helpers"

-- Values a rounding to dtype of x may take: |got - want| within one unit.
local unit = { f32 = 2 ^ -23, f16 = 2 ^ -10, bf16 = 2 ^ -7 }
local function close(got, want, dtype, scale)
  return math.abs(got - want) <= unit[dtype] * math.abs(want) + 2 ^ -22 * (scale or 0) + 1e-7
end

describe("elementwise operations", function()
  it("compute y = a*x + b*y, t = a*t and out = x + y on views and mixed dtypes", function()
    local base = H.randn({4, 6, 5}, { dtype = "bf16" })
    local y = base:permute{3, 1, 2}:narrow(3, 2, 4) -- 5x4x4, strided
    local x = H.randn({5, 4, 4}) -- f32
    local xv, yv = x:totable(), y:totable()
    local a, b = H.seed() % 7 / 3 - 1, H.seed() % 11 / 5 - 1
    assert.equal(y, y:axpby(a, x, b))
    local got = y:totable()
    for i = 1, #got do
      local want = a * xv[i] + b * yv[i]
      assert.is_true(close(got[i], want, "bf16", math.abs(a * xv[i]) + math.abs(b * yv[i])), i)
    end
    local z = H.randn({5, 4, 4}, { dtype = "f16" })
    local zv = z:totable()
    assert.equal(z, z:scale(-2))
    for i, v in ipairs(z:totable()) do assert.equal(zv[i] * -2, v) end -- exact in f16
    local out = sta.tensor({5, 4, 4})
    assert.equal(out, out:add(x, z))
    local ov = out:totable()
    for i = 1, #ov do assert.is_true(close(ov[i], xv[i] - 2 * zv[i], "f32", math.abs(xv[i]) + 2 * math.abs(zv[i]))) end
    out:add(out) -- out = out + out
    for i, v in ipairs(out:totable()) do assert.equal(2 * ov[i], v) end
  end)

  it("reduces mean, std, min, max and counts", function()
    local t = H.randn({64, 33}, { mean = 0.5, std = 2 })
    local v = t:totable()
    t:set({3, 7}, 0 / 0)
    t:set({60, 1}, math.huge)
    local sum, n, lo, hi = 0, 0, math.huge, -math.huge
    for i, x in ipairs(v) do
      if i ~= 2 * 33 + 7 and i ~= 59 * 33 + 1 then
        sum, n = sum + x, n + 1
        lo, hi = math.min(lo, x), math.max(hi, x)
      end
    end
    local mean, sq = sum / n, 0
    for i, x in ipairs(v) do
      if i ~= 2 * 33 + 7 and i ~= 59 * 33 + 1 then sq = sq + (x - mean) ^ 2 end
    end
    local st = t:stats()
    assert.equal(2, st.nonfinite)
    assert.equal(n, st.count)
    assert.is_true(math.abs(st.mean - mean) < 1e-12)
    assert.is_true(math.abs(st.std - math.sqrt(sq / n)) < 1e-12)
    assert.equal(lo, st.min)
    assert.equal(hi, st.max)
    assert.same(st, t:stats()) -- the same numbers again
  end)

  it("raises on misuse, naming the argument, and changes nothing", function()
    local y, x = H.randn({3, 5}, { dtype = "bf16" }), H.randn({3, 5})
    local before = y:totable()
    assert.equal("axpby: shapes differ (y 3x5 vs x 5x3)", H.error_of(y.axpby, y, 1, H.randn({5, 3}), 1))
    assert.equal("a: expected a finite float32 value, got inf", H.error_of(y.axpby, y, math.huge, x, 1))
    assert.equal("b: expected a finite float32 value, got 1e+39", H.error_of(y.axpby, y, 1, x, 1e39))
    assert.equal("a: expected a finite float32 value, got -inf", H.error_of(y.scale, y, -math.huge))
    assert.equal("add: shapes differ (out 3x5 vs y 2x2)", H.error_of(y.add, y, x, H.randn({2, 2})))
    assert.equal("x: expected a tensor, got number", H.error_of(y.add, y, 3))
    local line = H.randn({8})
    assert.equal("axpby: y overlaps x without being the same view",
      H.error_of(line.axpby, line:narrow(1, 1, 4), 1, line:narrow(1, 2, 4), 1))
    assert.equal("copy: dst overlaps src without being the same view",
      H.error_of(line.copy, line:narrow(1, 1, 4), line:narrow(1, 3, 4)))
    assert.same(before, y:totable())
  end)

  it("counts host<->device bytes; host work moves none", function()
    local moved = sta.transfer_bytes()
    assert.equal(moved, sta.info().transfer_bytes)
    local t = H.randn({100})
    t:axpby(2, t, 1):scale(0.5):add(t)
    local _ = t:stats()
    assert.equal(moved, sta.transfer_bytes())
  end)
end)

describe("elementwise operations on the GPU #gpu", function()
  local have = sta.backend_available("cuda")

  it("give the host's bits: randn, fill, copy, axpby, scale, add; stats to rounding", function()
    if not have then return end
    for case = 1, 12 do
      local dt = ({ "f32", "bf16", "f16" })[case % 3 + 1]
      local shape = { H.seed() % 5 + 1, H.seed() % 300 + 1, 8 * (H.seed() % 4 + 1) }
      local seed = H.seed()
      local h = sta.randn(shape, { seed = seed, dtype = dt, mean = 0.25, std = 3 })
      local g = sta.randn(shape, { seed = seed, dtype = dt, mean = 0.25, std = 3, device = "cuda" })
      local m = g:compare(h)
      assert.equal(0, m, ("case %d %s randn"):format(case, dt))
      local hx, gx = H.randn(shape), nil
      gx = hx:to("cuda")
      local hv, gv = h:narrow(2, 1, shape[2] // 2 + 1), g:narrow(2, 1, shape[2] // 2 + 1)
      hv:axpby(1.5, hx:narrow(2, 1, shape[2] // 2 + 1), -0.75)
      gv:axpby(1.5, gx:narrow(2, 1, shape[2] // 2 + 1), -0.75)
      h:scale(0.3):add(hx)
      g:scale(0.3):add(gx)
      assert.equal(0, (g:compare(h)), ("case %d %s lincomb"):format(case, dt))
      local hs, gs = h:stats(), g:stats()
      assert.equal(hs.count, gs.count)
      assert.equal(hs.min, gs.min)
      assert.equal(hs.max, gs.max)
      assert.is_true(math.abs(hs.mean - gs.mean) <= 1e-6 * (hs.std + math.abs(hs.mean)))
      assert.is_true(math.abs(hs.std - gs.std) <= 1e-6 * (hs.std + math.abs(hs.mean)))
      local gc = sta.tensor(shape, { dtype = "bf16", device = "cuda" }):copy(g:permute{1, 2, 3})
      assert.equal(0, (gc:compare(sta.tensor(shape, { dtype = "bf16" }):copy(h))))
    end
  end)

  it("moves no bytes across in a pipeline step on the device", function()
    if not have then return end
    local canvas, tile, text, heads, D = {6, 16, 16}, {6, 8, 8}, 16, 2, 64
    local V = 6 * 16 * 16
    local S = V + text
    local latent = sta.randn({1, V, heads, D}, { seed = H.seed(), dtype = "bf16", device = "cuda" })
    local rows = sta.randn({1, text, heads, D}, { seed = H.seed(), dtype = "bf16", device = "cuda" })
    local layer = sta.layer{ layer = 0, heads = heads, head_dim = D, canvas = canvas, tile = tile,
      text_len = text, backend = "cuda",
      strategy = sta.strategy.uniform{ steps = 1, layers = 1, heads = heads, window = {1, 1, 1} } }
    local batch = sta.forward_batch{ batch_size = 1 }
    local moved = sta.transfer_bytes()
    local preds = {}
    for _, pass in ipairs{ "pos", "neg" } do
      local h = sta.tensor({1, S, heads, D}, { dtype = "bf16", device = "cuda" })
      h:narrow(2, 1, V):copy(latent)
      h:narrow(2, V + 1, text):copy(rows)
      batch:negative(pass == "neg")
      local ctx <close> = sta.forward_context{ step = 0, batch = batch }
      preds[pass] = layer:forward(h, h, h)
    end
    local pred = preds.pos:axpby(-4, preds.neg, 5)
    latent:axpby(0.1, pred:narrow(2, 1, V), 0.9)
    local st = latent:stats()
    sta.synchronize()
    assert.equal(moved, sta.transfer_bytes())
    assert.equal(0, st.nonfinite)
    local host = latent:to("cpu") -- asked for: counted, exactly
    assert.equal(moved + V * heads * D * 2, sta.transfer_bytes())
    assert.equal("cpu", host:device())
  end)

  it("runs examples/pipeline.lua on the device with the CPU's output, moving no bytes", function()
    if not have then return end
    local function run(device)
      local args = { "--steps", "3", "--layers", "2", "--heads", "2", "--head-dim", "64", "--canvas",
        "6x16x16", "--text", "16", "--full-steps", "1", "--dtype", "bf16", "--device", device }
      for i, a in ipairs(args) do args[i] = ("%q"):format(a) end
      local out, ok = H.run_lua(([[
        arg = { [0] = "examples/pipeline.lua", %s }
        dofile("examples/pipeline.lua")
      ]]):format(table.concat(args, ", ")), { STA_NO_PROGRESS = "1", STA_ATTENTION_CONFIG = false })
      assert.is_true(ok, out)
      local st = {}
      st.mean, st.std, st.min, st.max = out:match("latent mean (%S+) std (%S+) min (%S+) max (%S+), all finite")
      assert.truthy(st.mean, out)
      for k, v in pairs(st) do st[k] = tonumber(v) end
      return st, out
    end
    local gpu, out = run("cuda")
    local cpu = run("cpu")
    assert.truthy(out:find("host<->device bytes moved by the steps: 0\n", 1, true), out)
    -- bf16 inputs on both; the attention rounds differently (bf16 P on the
    -- GPU): the summary agrees to bf16's rounding, not bit for bit
    assert.is_true(math.abs(gpu.mean - cpu.mean) <= 0.01 * cpu.std, out)
    assert.is_true(math.abs(gpu.std - cpu.std) <= 0.01 * cpu.std, out)
    assert.is_true(math.abs(gpu.max - cpu.max) <= 0.05 * cpu.std + 2 ^ -7 * math.abs(cpu.max), out)
  end)
end)
