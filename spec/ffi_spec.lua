-- LuaJIT FFI binding: busted --run=ffi (runs under luajit).
local S = require "sta.ffi"
local ffi = S.ffi
local C = S.C

local seed = os.time() % 100000

describe("sta.ffi #ffi", function()
  it("parses the declaration block of sta.h", function()
    assert.truthy(S.decls:find("sta_attention_forward", 1, true))
    assert.falsy(S.decls:find("/*", 1, true))
    assert.equal(40, ffi.sizeof("sta_geometry"))
    assert.equal("0.1.0", ffi.string(C.sta_version()))
    assert.equal(101, tonumber(C.STA_ERR_SHAPE))
    assert.equal("STA_ERR_SEQ_LEN", ffi.string(C.sta_status_name(C.STA_ERR_SEQ_LEN)))
    assert.equal(1, tonumber(C.sta_backend_available(C.STA_CPU)))
  end)

  it("refuses a preprocessor line inside the block", function()
    assert.has_error(function() S.declarations("/* STA_DECLS_BEGIN */\n#define X 1\n/* STA_DECLS_END */") end)
  end)

  it("runs a small STA forward that matches the reference", function()
    local canvas, tile = {3, 8, 8}, {1, 4, 4} -- grid 3x2x2
    local S_len = 3 * 8 * 8 + 5
    local q = S.randn({1, S_len, 2, 32}, seed + 1)
    local k = S.randn({1, S_len, 2, 32}, seed + 2)
    local v = S.randn({1, S_len, 2, 32}, seed + 3)
    local o = { canvas = canvas, tile = tile, text_len = 5, window = {{1, 1, 1}, {3, 1, 2}} }
    local out = S.attention(q, k, v, o)
    local ref = S.attention(q, k, v, o, true)
    local max_abs, rel = S.compare(out, ref)
    assert.is_true(rel < 1e-4, rel)
    assert.is_true(max_abs < 1e-3)
    local dense = S.attention(q, k, v, { canvas = canvas, tile = tile, text_len = 5, window = {3, 2, 2} })
    local _, differ = S.compare(out, dense)
    assert.is_true(differ > 1e-3)
  end)

  it("computes the backward, equal to the reference's gradients", function()
    local canvas, tile = {3, 8, 8}, {1, 4, 4}
    local S_len = 3 * 8 * 8 + 5
    local q, k, v, g = S.randn({1, S_len, 2, 16}, seed + 4), S.randn({1, S_len, 2, 16}, seed + 5),
                       S.randn({1, S_len, 2, 16}, seed + 6), S.randn({1, S_len, 2, 16}, seed + 7)
    local o = { canvas = canvas, tile = tile, text_len = 4, window = {{1, 1, 1}, {3, 1, 2}}, lse = true }
    local out, lse = S.attention(q, k, v, o)
    local bo = { canvas = canvas, tile = tile, text_len = 4, window = o.window }
    local dq, dk, dv = S.attention_backward(q, k, v, out, lse, g, bo)
    local d, keep = S.desc(o)
    local r = { S.like(q), S.like(q), S.like(q) }
    S.check(C.sta_attention_backward_reference(d, q, k, v, g, r[1], r[2], r[3]))
    local _ = keep
    for i, x in ipairs{ dq, dk, dv } do
      local _, rel = S.compare(x, r[i])
      assert.is_true(rel < 1e-4, rel)
    end
    assert.equal("lse: expected the forward's f32 [B, heads, S] log-sum-exp, got NULL",
                 select(2, pcall(S.attention_backward, q, k, v, out, nil, g, bo)))
  end)

  it("takes precision = \"fp8\" in the descriptor", function()
    local canvas = {6, 8, 16}
    local n = 6 * 8 * 16
    local q, k, v = S.randn({1, n, 2, 32}, seed + 7), S.randn({1, n, 2, 32}, seed + 8),
                    S.randn({1, n, 2, 32}, seed + 9)
    local o = { canvas = canvas, window = {1, 1, 1} }
    local ref = S.attention(q, k, v, o, true)
    o.precision = "fp8"
    local _, rel = S.compare(S.attention(q, k, v, o), ref)
    assert.is_true(rel > 1e-2 and rel < 4e-2, "fp8 rel L2 " .. rel)
    o.precision = "bf8"
    assert.equal("precision: expected \"native\" or \"fp8\", got 'bf8'", select(2, pcall(S.attention, q, k, v, o)))
  end)

  it("attention_fp8 takes 8-bit operands with their scales", function()
    local canvas, n = {6, 8, 16}, 6 * 8 * 16
    local x8, deq = {}, {}
    for i = 1, 3 do
      local x = S.randn({1, n, 2, 32}, seed + 20 + i)
      x8[i] = S.tensor({1, n, 2, 32}, "f8e4m3")
      S.check(S.C.sta_tensor_copy(x8[i], x))
      deq[i] = S.tensor({1, n, 2, 32}, "f32")
      S.check(S.C.sta_tensor_copy(deq[i], x8[i]))
    end
    local qs, vs = S.tensor({1, 2, n}), S.tensor({1, 2, 32})
    S.check(S.C.sta_tensor_fill(qs, 0.5))
    S.check(S.C.sta_tensor_fill(vs, 2))
    for i, f in ipairs{0.5, 0.5, 2} do S.check(S.C.sta_tensor_scale(deq[i], f)) end
    local o = { canvas = canvas, window = {1, 1, 1} }
    local out = S.attention_fp8(x8[1], x8[2], x8[3], qs, qs, vs, o)
    o.precision = "fp8"
    assert.equal(0, (S.compare(out, S.attention(deq[1], deq[2], deq[3], o))))
    assert.equal("q8: expected f8e4m3, got f32",
                 select(2, pcall(S.attention_fp8, deq[1], x8[2], x8[3], qs, qs, vs, o)))
  end)

  it("reads FastVideo's tiled order in place (order = \"tiled\")", function()
    local canvas, tile = {3, 5, 7}, {2, 4, 4} -- 2x2x2 tiles of 32: 256 video rows
    local q, k, v = S.randn({1, 259, 2, 16}, seed + 8), S.randn({1, 259, 2, 16}, seed + 9),
                    S.randn({1, 259, 2, 16}, seed + 10)
    local o = { canvas = canvas, tile = tile, order = "tiled", window = {1, 1, 1} }
    local out = S.attention(q, k, v, o)
    local ref = S.attention(q, k, v, o, true)
    local _, rel = S.compare(out, ref)
    assert.is_true(rel < 1e-5, rel)
    local d, keep = S.desc(o)
    assert.equal(tonumber(C.STA_ORDER_TILED), tonumber(d.geom.order))
    assert.equal(256, tonumber(C.sta_geometry_video_rows(d.geom)))
    local _ = keep
    o.order = "zigzag"
    assert.equal("order: expected \"untiled\" or \"tiled\", got 'zigzag'",
                 select(2, pcall(S.attention, q, k, v, o)))
  end)

  it("runs block lists (Lua lists or i32 tensors) against the block-list reference", function()
    local q, k, v = S.randn({1, 24, 2, 8}, seed + 60), S.randn({1, 32, 2, 8}, seed + 61),
                    S.randn({1, 32, 2, 8}, seed + 62)
    local lists = { { { {3, 0}, {}, {1} }, { {2}, {0, 1, 2, 3}, {3} } } } -- Mq 3, Mk 4
    local o = { idx = lists, block_rows = 8, kv_sizes = {8, 5, 1, 7}, q_sizes = {3, 8, 6} }
    local out, lse = S.block_sparse(q, k, v, { idx = lists, block_rows = 8, kv_sizes = o.kv_sizes,
                                               q_sizes = o.q_sizes, lse = true })
    local d, keep = S.blocks_desc(o, q)
    local ref = S.like(q)
    S.check(C.sta_attention_reference(d, q, k, v, ref, nil))
    local _, rel = S.compare(out, ref)
    assert.is_true(rel < 1e-5, rel)
    -- the same lists as i32 tensors: the same bits
    local idx, num = S.tensor({1, 2, 3, 4}, "i32"), S.tensor({1, 2, 3}, "i32")
    S.check(C.sta_tensor_fill(idx, 0))
    for h = 1, 2 do for m = 1, 3 do
      local l = lists[1][h][m]
      S.check(C.sta_tensor_set(num, ffi.new("int64_t[3]", {0, h - 1, m - 1}), #l))
      for i, n in ipairs(l) do
        S.check(C.sta_tensor_set(idx, ffi.new("int64_t[4]", {0, h - 1, m - 1, i - 1}), n))
      end
    end end
    local out2 = S.block_sparse(q, k, v, { idx = idx, num = num, block_rows = 8, kv_sizes = o.kv_sizes,
                                           q_sizes = o.q_sizes })
    assert.equal(0, (S.compare(out, out2)))
    local dq, dk, dv = S.block_sparse_backward(q, k, v, out, lse, S.randn({1, 24, 2, 8}, seed + 63), o)
    assert.same({1, 32, 2, 8}, S.shape(dk))
    assert.same({1, 24, 2, 8}, S.shape(dq))
    local _ = { keep, dv }
  end)

  it("runs VSA on the cube order, with its cube helpers", function()
    local x = S.randn({1, 5 * 6 * 7, 2, 8}, seed + 70)
    local xc = S.to_cubes(x, { canvas = {5, 6, 7} })
    assert.same({1, 512, 2, 8}, S.shape(xc))
    assert.equal(0, (S.compare(S.from_cubes(xc, { canvas = "5x6x7" }), x)))
    local q, k = S.to_cubes(S.randn({1, 210, 2, 8}, seed + 71), { canvas = {5, 6, 7} }),
                 S.to_cubes(S.randn({1, 210, 2, 8}, seed + 72), { canvas = {5, 6, 7} })
    local g = S.randn({1, 512, 2, 8}, seed + 73)
    local out, lse = S.vsa(q, k, xc, { canvas = {5, 6, 7}, sparsity = 0.6, gate = g, lse = true })
    local d = ffi.new("sta_vsa_desc")
    d.block_rows, d.topk, d.kv_sizes = 64, S.vsa_topk(0.6, 8), S.cube_sizes{ canvas = {5, 6, 7} }
    assert.equal(4, d.topk)
    local ref = S.like(q)
    S.check(C.sta_vsa_reference(d, q, k, xc, g, ref, nil))
    local _, rel = S.compare(out, ref)
    assert.is_true(rel < 1e-5, rel)
    local o = { canvas = {5, 6, 7}, topk = 4, gate = g }
    assert.equal(0, (S.compare(S.vsa_reference(q, k, xc, o), ref)))
    local dout = S.randn({1, 512, 2, 8}, seed + 74)
    local grads = { S.vsa_backward(q, k, xc, out, lse, dout, o) }
    local rgrads = { S.vsa_backward_reference(q, k, xc, nil, nil, dout, o) }
    assert.equal(4, #grads)
    assert.equal(4, #rgrads)
    for i = 1, 4 do
      local _, r = S.compare(grads[i], rgrads[i])
      assert.is_true(r < 1e-5, r)
    end
    -- the coarse branch and the selection: the fine branch over them plus
    -- gate * out_c is the forward's out (the C module's spec checks each entry)
    local oc, lc, idx, num = S.vsa_coarse(q, k, xc, { canvas = {5, 6, 7}, topk = 4 })
    assert.same({1, 2, 8, 8}, S.shape(oc))
    assert.same({1, 2, 8}, S.shape(lc))
    assert.same({1, 2, 8, 4}, S.shape(idx))
    assert.same({1, 2, 8}, S.shape(num))
    local sizes = S.cube_sizes{ canvas = {5, 6, 7} }
    local fine = S.block_sparse(q, k, xc, { idx = idx, num = num, kv_sizes = sizes, q_sizes = sizes })
    local pf, pg, po = ffi.cast("float *", C.sta_tensor_data(fine)), ffi.cast("float *", C.sta_tensor_data(g)),
                       ffi.cast("float *", C.sta_tensor_data(out))
    local poc, ps = ffi.cast("float *", C.sta_tensor_data(oc)), ffi.cast("int32_t *", C.sta_tensor_data(sizes))
    local worst = 0
    for r = 0, 511 do
      local m = math.floor(r / 64)
      for h = 0, 1 do
        for dd = 0, 7 do
          local i = (r * 2 + h) * 8 + dd
          local want = r % 64 < ps[m] and pg[i] * poc[(h * 8 + m) * 8 + dd] + pf[i] or 0
          worst = math.max(worst, math.abs(po[i] - want) / math.max(1, math.abs(want)))
        end
      end
    end
    assert.is_true(worst < 1e-5, worst)
    assert.equal("q: 512 rows, expected 256 (the canvas 4x8x8 in 1 cubes of 256 rows, cube order)",
      select(2, pcall(S.vsa, q, k, xc, { canvas = {4, 8, 8}, cube = "4x8x8", topk = 1 })))
  end)

  -- a window list of 2 was once read past its end, one of 4 accepted, and
  -- any layout but "bhsd" taken for bshd
  it("refuses a window that is not 3 integers, and an unknown layout", function()
    local q = S.randn({1, 4 * 8 * 8, 2, 8}, seed + 11)
    local o = { canvas = {4, 8, 8}, tile = {2, 4, 4} }
    local function err(extra)
      local t = {}
      for k, v in pairs(o) do t[k] = v end
      for k, v in pairs(extra) do t[k] = v end
      local ok, e = pcall(S.attention, q, q, q, t)
      assert.is_false(ok, "accepted")
      return e
    end
    assert.truthy(err{ window = {3, 1} }:find("^window: expected 3 integers"))
    assert.truthy(err{ window = {3, 1, 3, 9} }:find("^window: expected 3 integers"))
    assert.truthy(err{ window = {{1, 1, 1}, {3, 1}} }:find("^window%[2%]: expected 3 integers"))
    assert.truthy(err{ window = {1, 1.5, 1} }:find("^window%[2%]: expected a 32%-bit integer"))
    assert.truthy(err{ window = {1, 1, 1}, layout = "BSDH" }:find("^layout: expected"))
    assert.truthy(err{ window = {1, 1, 1}, layout = 1 }:find("^layout: expected"))
    assert.truthy(err{ window = {1, 1, 1}, scale = 0 }:find("^scale: expected a number > 0"))
    assert.truthy(err{ window = {1, 1, 1}, scale = -1 }:find("^scale: expected a number > 0"))
    assert.truthy(err{ window = {1, 1, 1}, text_len = 2 ^ 63 }:find("^text_len: expected"))
    assert.truthy(err{ window = {1, 1, 1}, tile = {2, 4, 2 ^ 32 + 4} }:find("^tile%[3%]: expected a 32%-bit integer"))
    assert.equal("shape[2]: expected a 64-bit integer >= 0, got 1.5", select(2, pcall(S.tensor, {2, 1.5})))
    assert.equal("shape[1]: expected a 64-bit integer >= 0, got -1", select(2, pcall(S.tensor, {-1})))
  end)

  -- the generated binding tests (spec/option_cases.lua): every option of
  -- every FFI call x missing, wrong type, out of range, boundary, with the
  -- schema's exact message, as the Lua module and Python raise it
  it("checks every option as the schema says (the generated cases)", function()
    package.path = "spec/?.lua;" .. package.path
    local cases = require("option_cases")(S.options)
    local P = cases.problem
    local shape = {1, P.S, P.heads, P.D}
    local q, k, v, g = S.randn(shape, seed + 30), S.randn(shape, seed + 31), S.randn(shape, seed + 32),
                       S.randn(shape, seed + 33)
    local out, lse = S.attention(q, k, v, { canvas = P.canvas, tile = P.tile, window = {1, 1, 1}, lse = true })
    local f8 = {}
    for i, x in ipairs{ q, k, v } do
      f8[i] = S.tensor(shape, "f8e4m3")
      S.check(C.sta_tensor_copy(f8[i], x))
    end
    local rs, cs = S.tensor({1, P.heads, P.S}), S.tensor({1, P.heads, P.D})
    S.check(C.sta_tensor_fill(rs, 0.5))
    S.check(C.sta_tensor_fill(cs, 0.5))
    local cshape = {1, P.vsa_rows, P.heads, P.D} -- the cube order of the vsa base's canvas
    local qc, kc, vc, gc = S.randn(cshape, seed + 34), S.randn(cshape, seed + 35),
                           S.randn(cshape, seed + 36), S.randn(cshape, seed + 37)
    local cout, clse = S.vsa(qc, kc, vc, { canvas = {4, 4, 8}, topk = 1, lse = true })
    local x = S.randn({1, 2 * 4 * 4, P.heads, P.D}, seed + 38)
    local run = {
      attention = function(o) return S.attention(q, k, v, o) end,
      reference = function(o) return S.attention(q, k, v, o, true) end,
      attention_backward = function(o) return S.attention_backward(q, k, v, out, lse, g, o) end,
      attention_fp8 = function(o) return S.attention_fp8(f8[1], f8[2], f8[3], rs, rs, cs, o) end,
      block_sparse = function(o) return S.block_sparse(q, k, v, o) end,
      block_sparse_backward = function(o) return S.block_sparse_backward(q, k, v, out, lse, g, o) end,
      vsa = function(o) return S.vsa(qc, kc, vc, o) end,
      vsa_backward = function(o) return S.vsa_backward(qc, kc, vc, cout, clse, gc, o) end,
      vsa_reference = function(o) return S.vsa_reference(qc, kc, vc, o) end,
      vsa_backward_reference = function(o)
        return S.vsa_backward_reference(qc, kc, vc, cout, clse, gc, o)
      end,
      vsa_coarse = function(o) return S.vsa_coarse(qc, kc, vc, o) end,
      cubes = function(o) return S.to_cubes(x, o) end,
      cube_sizes = function(o) return S.cube_sizes(o) end,
    }
    local n, refused = 0, 0
    for _, c in ipairs(cases.list("ffi")) do
      local ok, err = pcall(run[c.call], c.opts)
      local msg = not ok and err or nil
      assert(cases.agrees(c, msg), ("%s %s %s %s: expected %s, got %s"):format(c.call, c.option,
        c.what, S.options.show(c.value), tostring(c.expect or "no schema error"), tostring(msg)))
      n = n + 1
      if c.expect then refused = refused + 1 end
    end
    assert.is_true(n > 300 and refused > 200, n .. " cases")
  end)

  it("reports errors through the status and sta_last_error", function()
    local out = ffi.new("sta_tensor *[1]")
    local dims = ffi.new("int64_t[5]", {1, 1, 1, 1, 1})
    local rc = C.sta_tensor_create(out, C.STA_F32, C.STA_CPU, 5, dims)
    assert.equal(tonumber(C.STA_ERR_SHAPE), tonumber(rc))
    assert.equal("ndim: expected 1..4, got 5", ffi.string(C.sta_last_error()))
    assert.is_true(out[0] == nil)
    assert.equal("ndim: expected 1..4, got 5", select(2, pcall(S.tensor, {1, 1, 1, 1, 1})))
  end)

  -- these crashed the interpreter once
  it("takes nil (NULL) in every call without crashing", function()
    assert.equal(0, tonumber(C.sta_tensor_ndim(nil)))
    assert.equal("t: expected a tensor, got NULL", ffi.string(C.sta_last_error()))
    assert.equal(-1, tonumber(C.sta_tensor_size(nil, 0)))
    assert.is_true(C.sta_tensor_data(nil) == nil)
    assert.equal(tonumber(C.STA_ERR_ARGUMENT), tonumber(C.sta_tensor_fill(nil, 1)))
    C.sta_tensor_destroy(nil)
    C.sta_geometry_init(nil, 1, 2, 3)
    assert.equal("geometry: expected a geometry, got NULL", ffi.string(C.sta_last_error()))
    local q = S.randn({1, 70, 2, 8}, seed)
    local o = { canvas = {2, 4, 8}, tile = {1, 2, 4}, window = {1, 1, 1} }
    assert.equal("q: expected a tensor, got nil", select(2, pcall(S.attention, nil, q, q, o)))
    assert.equal("v: expected a tensor, got nil", select(2, pcall(S.attention, q, q, ffi.cast("sta_tensor *", nil), o)))
    assert.equal("dtype: unknown dtype 'f64' (expected f32, f16, bf16, f8e4m3 or i32)", select(2, pcall(S.tensor, {2, 2}, "f64")))
    assert.equal("device: expected \"cpu\" or \"cuda\", got tpu", select(2, pcall(S.tensor, {2, 2}, "f32", "tpu")))
    assert.equal("options: unknown key 'windws' (known: canvas, tile, text_len, order, layout, window, "
      .. "scale, softmax, precision, deterministic, out, lse)", select(2, pcall(S.attention, q, q, q,
      { canvas = {2, 4, 8}, windws = {{1, 1, 1}} })))
    assert.equal("window: required ({Kt, Kh, Kw} for every head, or a list of them, one per head)",
      select(2, pcall(S.attention, q, q, q, { canvas = {2, 4, 8} })))
    -- a released handle: refused, not read
    local t = S.tensor({2})
    local raw = ffi.cast("sta_tensor *", t)
    ffi.gc(t, nil)
    C.sta_tensor_destroy(raw)
    assert.equal(0, tonumber(C.sta_tensor_ndim(raw)))
    assert.equal("t: not a live sta_tensor (released already, or not made by sta)", ffi.string(C.sta_last_error()))
    C.sta_tensor_destroy(raw)
  end)

  -- luajit finds the installed binding, header and library
  it("works from a make install prefix with no environment", function()
    local build = os.getenv("STA_BUILD") or os.getenv("BUILD") or "build"
    local prefix = os.tmpname()
    os.remove(prefix)
    -- (make runs without make sanitize's preloaded ASan runtime: GNU make's
    -- own strndup trips its strict string checks)
    local make = ("env -u LD_PRELOAD make -s --no-print-directory -o all install PREFIX='%s' BUILD='%s' NVCC= >/dev/null 2>&1")
      :format(prefix, build)
    assert.is_true(os.execute(make) == true or os.execute(make) == 0, make)
    local probe = ("cd / && env -u STA_HEADER -u STA_LIB -u STA_BUILD -u BUILD -u LUA_PATH luajit -e "
      .. "\"package.path='%s/share/lua/5.1/?.lua;'..package.path; local S = require 'sta.ffi'; "
      .. "local t = S.randn({1, 20, 1, 4}, 3); print(S.header, S.library, S.shape(t)[2])\" 2>&1"):format(prefix)
    local p = io.popen(probe)
    local out = p:read("a")
    p:close()
    os.execute(("rm -rf '%s'"):format(prefix))
    assert.equal(("%s/include/sta.h\t%s/lib/libsta.so\t20\n"):format(prefix, prefix), out)
  end)
end)
