local sta = require "sta"
local H = require "helpers"

-- STA.md sections 1-4 written out naively in Lua: the third opinion.
local function axis_range(q, k, c)
  if k >= c then return 0, c - 1 end
  local r = k // 2
  local start = math.min(math.max(q - r, 0), c - k)
  return start, start + k - 1
end

local function naive(q, k, v, canvas, tile, windows, text_len)
  local B, S, NH, D = table.unpack(q:shape())
  local T, Hh, W = table.unpack(canvas)
  local V = T * Hh * W
  local grid = {}
  for a = 1, 3 do grid[a] = math.ceil(canvas[a] / tile[a]) end
  local qv, kv, vv = q:totable(), k:totable(), v:totable()
  local function at(vals, b, s, h, d) return vals[((b * S + s) * NH + h) * D + d + 1] end
  local function coords(i) -- token -> tile coords
    local t = i // (Hh * W); local h = (i // W) % Hh; local w = i % W
    return { t // tile[1], h // tile[2], w // tile[3] }
  end
  local out = {}
  for b = 0, B - 1 do
    for h = 0, NH - 1 do
      local win = windows[h + 1] or windows[1]
      for i = 0, S - 1 do
        local keys = {}
        if i < V then
          local qc = coords(i)
          local lo, hi = {}, {}
          for a = 1, 3 do lo[a], hi[a] = axis_range(qc[a], win[a], grid[a]) end
          for j = 0, V - 1 do
            local kc = coords(j)
            local ok = true
            for a = 1, 3 do if kc[a] < lo[a] or kc[a] > hi[a] then ok = false end end
            if ok then keys[#keys + 1] = j end
          end
        else
          for j = 0, V - 1 do keys[#keys + 1] = j end
        end
        for j = V, V + text_len - 1 do keys[#keys + 1] = j end
        local scale = 1 / math.sqrt(D)
        local logits, m = {}, -math.huge
        for n, j in ipairs(keys) do
          local s = 0
          for d = 0, D - 1 do s = s + at(qv, b, i, h, d) * at(kv, b, j, h, d) end
          logits[n] = s * scale
          m = math.max(m, logits[n])
        end
        local z = 0
        for n = 1, #logits do logits[n] = math.exp(logits[n] - m); z = z + logits[n] end
        for d = 0, D - 1 do
          local acc = 0
          for n, j in ipairs(keys) do acc = acc + logits[n] * at(vv, b, j, h, d) end
          out[((b * S + i) * NH + h) * D + d + 1] = acc / z
        end
      end
    end
  end
  return sta.from_table(out, { B, S, NH, D })
end

local function qkv(shape, dtype)
  return H.randn(shape, { dtype = dtype }), H.randn(shape, { dtype = dtype }),
    H.randn(shape, { dtype = dtype })
end

describe("sta attention", function()
  it("matches a naive Lua implementation of STA.md (partial tiles, text)", function()
    local canvas, tile = {3, 4, 5}, {1, 2, 2} -- grid 3x2x3, partial tiles on w
    local V, text, pad = 60, 3, 2
    local q, k, v = qkv({1, V + text + pad, 2, 4})
    local windows = {{1, 1, 1}, {3, 1, 3}}
    local out = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = windows, text_len = text })
    local expect = naive(q, k, v, canvas, tile, windows, text)
    local max_abs, rel = out:compare(expect)
    assert.is_true(rel < 1e-5, "rel " .. rel)
    assert.is_true(max_abs < 1e-5)
  end)

  it("agrees with the reference on random geometries, both layouts", function()
    local cases = {
      { canvas = {4, 6, 6}, tile = {2, 3, 3}, window = {1, 1, 1}, heads = 2, D = 16, text = 0 },
      { canvas = {5, 7, 9}, tile = {2, 4, 4}, window = {3, 1, 3}, heads = 3, D = 8, text = 5 },
      { canvas = {6, 8, 8}, tile = {2, 4, 4}, window = {{1, 1, 1}, {3, 3, 3}}, heads = 2, D = 32, text = 7 },
      { canvas = {2, 3, 17}, tile = {1, 2, 4}, window = {1, 3, 3}, heads = 1, D = 64, text = 2 },
    }
    for _, c in ipairs(cases) do
      for _, layout in ipairs{ "bshd", "bhsd" } do
        local V = c.canvas[1] * c.canvas[2] * c.canvas[3]
        local S = V + c.text + 1
        local shape = layout == "bshd" and {2, S, c.heads, c.D} or {2, c.heads, S, c.D}
        local q, k, v = qkv(shape)
        local opts = { canvas = c.canvas, tile = c.tile, window = c.window, text_len = c.text, layout = layout, lse = true }
        local out, lse = sta.attention(q, k, v, opts)
        local ref, ref_lse = sta.reference(q, k, v, opts)
        local _, rel = out:compare(ref)
        assert.is_true(rel < 1e-4, ("%s %s rel %g"):format(table.concat(c.canvas, "x"), layout, rel))
        local _, rel_lse = lse:compare(ref_lse)
        assert.is_true(rel_lse < 1e-4)
        assert.same({2, c.heads, S}, lse:shape())
      end
    end
  end)

  it("reads FastVideo's tiled order in place (order = \"tiled\")", function()
    -- partial tiles: 2x2x2 tiles of 2x3x4 = 24, 192 video rows for 60 tokens
    local canvas, tile = {3, 5, 7}, {2, 3, 4}
    local g = sta.geometry{ canvas = canvas, tile = tile }
    local S = 105 + 4
    for _, layout in ipairs{ "bshd", "bhsd" } do
      local shape = layout == "bshd" and {2, S, 2, 8} or {2, 2, S, 8}
      local q, k, v, dout = H.randn(shape), H.randn(shape), H.randn(shape), H.randn(shape)
      local o = { canvas = canvas, tile = tile, window = {{1, 1, 3}, {3, 1, 1}}, text_len = 3,
                  layout = layout }
      local out, lse = sta.attention(q, k, v, { canvas = canvas, tile = tile, text_len = 3,
                                                window = o.window, layout = layout, lse = true })
      local dq, dk, dv = sta.attention_backward(q, k, v, out, lse, dout, o)
      local tq, tk, tv, tdo = sta.tile(q, g, layout), sta.tile(k, g, layout),
                              sta.tile(v, g, layout), sta.tile(dout, g, layout)
      o.order = "tiled"
      o.lse = true
      local tout, tlse = sta.attention(tq, tk, tv, o)
      o.lse = nil
      assert.is_true(H.same_values(sta.tile(out, g, layout), tout)) -- padding rows 0 both
      local tdq, tdk, tdv = sta.attention_backward(tq, tk, tv, tout, tlse, tdo, o)
      for i, pair in ipairs{ {dq, tdq}, {dk, tdk}, {dv, tdv} } do
        assert.is_true(H.same_values(pair[1], sta.untile(pair[2], g, S, layout)), "gradient " .. i)
        assert.is_true(H.same_values(sta.tile(pair[1], g, layout), pair[2]), "padding " .. i)
      end
      local ref = sta.reference(tq, tk, tv, o)
      local _, rel = ref:compare(tout)
      assert.is_true(rel < 1e-5)
      -- an untiled length in the tiled order, a bad order: named
      assert.equal("seq_len 109 not supported for STA (the tiled order of canvas 3x5x7 has 192 "
        .. "video rows: 2x2x2 tiles of 2x3x4, partial ones padded; then the text)",
        H.error_of(sta.attention, q, k, v, o))
      o.order = "fastvideo"
      assert.equal("order: expected \"untiled\" or \"tiled\", got 'fastvideo'",
        H.error_of(sta.attention, tq, tk, tv, o))
    end
  end)

  it("keeps its window alive when an option's __index collects garbage", function()
    -- the window lives in a userdata the call holds; a collection run from
    -- an option table's metamethod in the middle of the call (looking up
    -- out, dq, ...) freed it on main, and the forward read it afterwards
    -- (heap-use-after-free under make sanitize); the fresh strings below
    -- reuse freed blocks, so without ASan the window reads as garbage then
    local q, k, v, g = H.randn({1, 144, 2, 8}), H.randn({1, 144, 2, 8}), H.randn({1, 144, 2, 8}),
                       H.randn({1, 144, 2, 8})
    local plain = { canvas = {4, 6, 6}, tile = {2, 3, 3}, window = {1, 3, 1} }
    local want, lse = sta.attention(q, k, v, { canvas = plain.canvas, tile = plain.tile,
                                               window = plain.window, lse = true })
    local wq, wk, wv = sta.attention_backward(q, k, v, want, lse, g, plain)
    local junk = {}
    local collect = { __index = function(_, key)
      if key == "out" or key == "dq" then
        collectgarbage()
        collectgarbage()
        for i = 1, 200 do junk[i] = ("\127"):rep(16 + i % 8) .. i end
      end
    end }
    local function opts() return setmetatable({ canvas = {4, 6, 6}, tile = {2, 3, 3}, window = {1, 3, 1} }, collect) end
    assert.is_true(H.same_values(want, sta.attention(q, k, v, opts())))
    local dq, dk, dv = sta.attention_backward(q, k, v, want, lse, g, opts())
    assert.is_true(H.same_values(wq, dq) and H.same_values(wk, dk) and H.same_values(wv, dv))
  end)

  it("reports no CUDA launch for a host call (sta.last_launch)", function()
    local q = H.randn({1, 6 * 8 * 8, 2, 16})
    local before = sta.last_launch()
    sta.attention(q, q, q, { canvas = {6, 8, 8}, window = {1, 1, 1} })
    assert.equal("string", type(before))
    assert.equal(before, sta.last_launch()) -- only CUDA forwards write it
  end)

  it("is dense attention with the full window", function()
    local canvas, tile = {4, 4, 4}, {2, 2, 2}
    local q, k, v = qkv({1, 64, 2, 16})
    local full = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {2, 2, 2} })
    local big = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {9, 9, 9} })
    local sparse = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 1, 1} })
    local _, same = full:compare(big)
    assert.is_true(same < 1e-6)
    local _, differ = sparse:compare(full)
    assert.is_true(differ > 1e-2)
  end)

  it("runs bf16 and f16 inputs close to f32", function()
    local canvas, tile = {4, 6, 6}, {2, 3, 3}
    local q, k, v = qkv({1, 144, 2, 32})
    local opts = { canvas = canvas, tile = tile, window = {1, 1, 1} }
    local ref = sta.attention(q, k, v, opts)
    for _, dt in ipairs{ "bf16", "f16" } do
      local out = sta.attention(q:to(dt), k:to(dt), v:to(dt), opts)
      assert.equal(dt, out:dtype())
      local _, rel = out:compare(ref)
      assert.is_true(rel < (dt == "bf16" and 2e-2 or 3e-3), dt .. " rel " .. rel)
    end
  end)

  it("writes into out= and honours scale", function()
    local canvas = {2, 8, 8}
    local q, k, v = qkv({1, 128, 1, 8})
    local out = sta.tensor({1, 128, 1, 8})
    local r = sta.attention(q, k, v, { canvas = canvas, window = {1, 1, 1}, out = out, scale = 0.01 })
    assert.equal(out, r)
    local ref = sta.reference(q, k, v, { canvas = canvas, window = {1, 1, 1}, scale = 0.01 })
    local _, rel = out:compare(ref)
    assert.is_true(rel < 1e-5)
  end)

  it("takes softmax = \"exact\" or \"fast\" (the CPU computes exact for both)", function()
    local q, k, v = qkv({1, 144, 2, 8})
    local o = { canvas = {4, 6, 6}, tile = {2, 2, 3}, window = {1, 3, 1} }
    local exact = sta.attention(q, k, v, o)
    o.softmax = "fast"
    local fast = sta.attention(q, k, v, o)
    local mx = fast:compare(exact)
    assert.equal(0, mx)
    o.softmax = "slow"
    assert.equal("softmax: expected \"exact\" or \"fast\", got 'slow'", H.error_of(sta.attention, q, k, v, o))
    o.softmax = 1
    assert.equal("softmax: expected \"exact\" or \"fast\", got 1", H.error_of(sta.attention, q, k, v, o))
  end)

  it("takes precision = \"fp8\" (the CPU's fp8 reference) and refuses other names", function()
    local canvas = {6, 8, 16}
    local q, k, v = qkv({1, 6 * 8 * 16 + 4, 2, 32})
    local o = { canvas = canvas, window = {1, 1, 1} }
    local ref = sta.reference(q, k, v, o)
    o.precision = "native"
    local _, rel_native = sta.attention(q, k, v, o):compare(ref)
    o.precision = "fp8"
    local fp8 = sta.attention(q, k, v, o)
    local _, rel = fp8:compare(ref)
    assert.is_true(rel_native < 1e-5)
    assert.is_true(rel > 1e-2 and rel < 4e-2, "fp8 rel L2 " .. rel) -- quantized, to the scheme's error
    assert.equal(0, (fp8:compare(sta.reference(q, k, v, o)))) -- FP8's reference is the same
    o.precision = "fp16"
    assert.equal("precision: expected \"native\" or \"fp8\", got 'fp16'", H.error_of(sta.attention, q, k, v, o))
    o.precision = "fp8"
    local out, lse = sta.attention(q, k, v, { canvas = canvas, window = {1, 1, 1}, precision = "fp8", lse = true })
    assert.equal("precision: the backward has no STA_PRECISION_FP8 mode (it differentiates the exact "
      .. "forward): use STA_PRECISION_NATIVE", H.error_of(sta.attention_backward, q, k, v, out, lse, out, o))
  end)

  it("attention_fp8 takes 8-bit operands with their scales (what precision fp8 computes on them)", function()
    local canvas = {6, 8, 16}
    local S, Hh, D = 6 * 8 * 16 + 4, 2, 32
    local q, k, v = qkv({1, S, Hh, D})
    local x8, deq = {}, {}
    for i, t in ipairs{q, k, v} do
      x8[i] = t:to("f8e4m3")
      deq[i] = x8[i]:to("f32")
    end
    local qs = sta.tensor({1, Hh, S}):fill(1)
    local vs = sta.tensor({1, Hh, D}):fill(1)
    local o = { canvas = canvas, window = {1, 1, 1} }
    local want, want_lse = sta.attention(deq[1], deq[2], deq[3],
      { canvas = canvas, window = {1, 1, 1}, precision = "fp8", lse = true })
    o.lse = true
    local out, lse = sta.attention_fp8(x8[1], x8[2], x8[3], qs, qs, vs, o)
    assert.equal("f32", out:dtype())
    assert.equal(0, (out:compare(want)))
    assert.equal(0, (lse:compare(want_lse)))
    local ob = sta.attention_fp8(x8[1], x8[2], x8[3], qs, qs, vs,
      { canvas = canvas, window = {1, 1, 1}, dtype = "bf16" })
    assert.equal("bf16", ob:dtype())
    assert.equal(0, (ob:compare(want:to("bf16"))))
    -- errors name the argument; a given out is left as it was
    local keep = H.randn({1, S, Hh, D})
    local before = keep:totable()
    assert.equal("k_scale: expected a tensor, got nil",
      H.error_of(sta.attention_fp8, x8[1], x8[2], x8[3], qs, nil, vs, o))
    assert.equal("precision: expected \"native\" or \"fp8\", got 'fp4'", H.error_of(sta.attention_fp8,
      x8[1], x8[2], x8[3], qs, qs, vs, { canvas = canvas, window = {1, 1, 1}, precision = "fp4" }))
    local msg = H.error_of(sta.attention_fp8, q, k, v, qs, qs, vs,
      { canvas = canvas, window = {1, 1, 1}, out = keep })
    assert.truthy(msg:find("q8", 1, true), msg)
    assert.same(before, keep:totable())
  end)

  it("reports bad inputs exactly and leaves out unchanged", function()
    local canvas = {4, 6, 6}
    local q, k, v = qkv({1, 144, 2, 8})
    local out = H.randn({1, 144, 2, 8})
    local before = out:totable()
    local o = { canvas = canvas, tile = {2, 2, 3}, out = out } -- grid 2x3x2
    o.window = {1, 2, 1}
    assert.equal("window: Kh = 2 is even and smaller than the 3 tiles on the h axis "
      .. "(use an odd window, or >= 3 for the whole axis)", H.error_of(sta.attention, q, k, v, o))
    o.window = {{1, 1, 1}, {1, 0, 1}}
    assert.equal("head 1: window: Kh = 0, expected >= 1", H.error_of(sta.attention, q, k, v, o))
    o.window = {1, 1, 1}
    o.canvas = {8, 6, 6}
    assert.equal("seq_len 144 not supported for STA (canvas 8x6x6 has 288 video rows, q has 144)",
      H.error_of(sta.attention, q, k, v, o))
    o.canvas = canvas
    local k2 = H.randn({1, 144, 2, 16})
    assert.equal("k: shape [B=1, S=144, heads=2, D=16] differs from q's [B=1, S=144, heads=2, D=8]",
      H.error_of(sta.attention, q, k2, v, o))
    assert.equal("v: dtype bf16 differs from q's f32", H.error_of(sta.attention, q, k, v:to("bf16"), o))
    o.layout = "sbhd"
    assert.equal("layout: expected \"bshd\" or \"bhsd\", got 'sbhd'", H.error_of(sta.attention, q, k, v, o))
    o.layout = nil
    assert.equal("q: expected a tensor, got nil", H.error_of(sta.attention, nil, k, v, o))
    -- no canvas and an unknown length
    assert.equal("seq_len 144 not supported for STA",
      H.error_of(sta.attention, q, k, v, { out = out, window = {1, 1, 1} }))
    assert.same(before, out:totable())
  end)

  it("counts FLOP as STA.md section 8 does", function()
    local f = sta.flops{ canvas = {30, 48, 80}, text_len = 256, window = {3, 3, 3}, heads = 24, head_dim = 128 }
    assert.is_true(math.abs(f / 1e12 - 15.40) < 0.01, f)
  end)

  it("measures per-head L1 and L2 differences", function()
    local a = H.randn({2, 10, 3, 4})
    local b = a:clone()
    b:set({1, 1, 2, 1}, b:get{1, 1, 2, 1} + 0.5)
    local l1, l2 = sta.head_diff(a, b)
    assert.equal(0, l1[1]); assert.equal(0, l1[3])
    assert.is_true(math.abs(l1[2] - 0.5 / 80) < 1e-6)
    assert.is_true(math.abs(l2[2] - 0.25 / 80) < 1e-6)
  end)
end)
