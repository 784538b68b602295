-- sparse_spec.lua -- block-sparse attention and VSA in the Lua module (STA.md
-- section 12): sta.block_sparse and its backward against a float64
-- brute force written here, lists as Lua tables or i32 tensors (the same
-- bits), sta.vsa against a float64 VSA written here (means, coarse
-- softmax, top-k with ties to the lower index, the fine branch, the gate)
-- and its gradients against central differences of that reference, the
-- core's float64 VSA (sta.vsa_reference, sta.vsa_backward_reference)
-- against the fast path, the coarse branch and selection (sta.vsa_coarse)
-- against the forward, the cube order, VSA layers per step from the forward batch's sparsity (dense
-- steps), i32 tensors, and the errors.
local sta = require "sta"
local H = require "helpers"

-- ---- float64 references on flat BSHD tables ------------------------------------

local function at(S, Hh, D) -- flat index of (b, s, h, d), all 0-based, in [B, S, H, D]
  return function(b, s, h, d) return ((b * S + s) * Hh + h) * D + d + 1 end
end

-- Block-sparse attention: q [B, Sq, H, D], k, v [B, Sk, H, D] (flat
-- tables); lists[b][h][m] = key blocks (0-based); kvs, qs: valid rows per
-- block (tables, 0-based block index + 1).  Returns out, lse (flat) and,
-- with dout, dq, dk, dv.
local function ref_blocks(p, q, k, v, dout)
  local B, Sq, Sk, Hh, D, br = p.B, p.Sq, p.Sk, p.H, p.D, p.br
  local iq, ik = at(Sq, Hh, D), at(Sk, Hh, D)
  local out, lse, dq, dk, dv = {}, {}, {}, {}, {}
  for i = 1, B * Sq * Hh * D do out[i] = 0; dq[i] = 0 end
  for i = 1, B * Sk * Hh * D do dk[i] = 0; dv[i] = 0 end
  for b = 0, B - 1 do
    for h = 0, Hh - 1 do
      for r = 0, Sq - 1 do
        local m = r // br
        local li = (b * Hh + h) * Sq + r + 1
        lse[li] = -math.huge
        if r % br < p.qs[m + 1] and #p.lists[b + 1][h + 1][m + 1] > 0 then
          local keys, s, mx = {}, {}, -math.huge
          for _, n in ipairs(p.lists[b + 1][h + 1][m + 1]) do
            for j = n * br, n * br + p.kvs[n + 1] - 1 do keys[#keys + 1] = j end
          end
          for t, j in ipairs(keys) do
            local x = 0
            for d = 0, D - 1 do x = x + q[iq(b, r, h, d)] * k[ik(b, j, h, d)] end
            s[t] = x * p.scale
            if s[t] > mx then mx = s[t] end
          end
          local sum = 0
          for t = 1, #keys do sum = sum + math.exp(s[t] - mx) end
          local l = mx + math.log(sum)
          lse[li] = l
          local P = {}
          for t, j in ipairs(keys) do
            P[t] = math.exp(s[t] - l)
            for d = 0, D - 1 do
              local o = iq(b, r, h, d)
              out[o] = out[o] + P[t] * v[ik(b, j, h, d)]
            end
          end
          if dout then
            local dodo = 0
            for d = 0, D - 1 do dodo = dodo + dout[iq(b, r, h, d)] * out[iq(b, r, h, d)] end
            for t, j in ipairs(keys) do
              local dp = 0
              for d = 0, D - 1 do dp = dp + dout[iq(b, r, h, d)] * v[ik(b, j, h, d)] end
              local ds = P[t] * (dp - dodo) * p.scale
              for d = 0, D - 1 do
                dv[ik(b, j, h, d)] = dv[ik(b, j, h, d)] + P[t] * dout[iq(b, r, h, d)]
                dq[iq(b, r, h, d)] = dq[iq(b, r, h, d)] + ds * k[ik(b, j, h, d)]
                dk[ik(b, j, h, d)] = dk[ik(b, j, h, d)] + ds * q[iq(b, r, h, d)]
              end
            end
          end
        end
      end
    end
  end
  return out, lse, dq, dk, dv
end

-- VSA on cube-order q, k, v (flat, [B, M*br, H, D]) with sizes, topk and
-- gate (flat or nil): out (flat); the selection lists[b][h][m] (ascending),
-- the coarse output outc[b][h][m][d] and lse lsec[b][h][m] (m, d 0-based).
local function ref_vsa(p, q, k, v, gate)
  local B, Hh, D, br, M = p.B, p.H, p.D, p.br, p.M
  local ix = at(M * br, Hh, D)
  local lists = {}
  local outc, lsec = {}, {} -- [b][h][m][d], [b][h][m]
  for b = 0, B - 1 do
    lists[b + 1], outc[b + 1], lsec[b + 1] = {}, {}, {}
    for h = 0, Hh - 1 do
      local function mean(x, c)
        local mu = {}
        for d = 0, D - 1 do
          local sum = 0
          for r = c * br, c * br + p.sizes[c + 1] - 1 do sum = sum + x[ix(b, r, h, d)] end
          mu[d] = sum / p.sizes[c + 1]
        end
        return mu
      end
      local qc, kc, vc = {}, {}, {}
      for c = 0, M - 1 do qc[c], kc[c], vc[c] = mean(q, c), mean(k, c), mean(v, c) end
      lists[b + 1][h + 1], outc[b + 1][h + 1], lsec[b + 1][h + 1] = {}, {}, {}
      for m = 0, M - 1 do
        local s, mx = {}, -math.huge
        for n = 0, M - 1 do
          local x = 0
          for d = 0, D - 1 do x = x + qc[m][d] * kc[n][d] end
          s[n] = x
          if x * p.scale > mx then mx = x * p.scale end
        end
        local sum = 0
        for n = 0, M - 1 do sum = sum + math.exp(s[n] * p.scale - mx) end
        local oc = {}
        for d = 0, D - 1 do
          local x = 0
          for n = 0, M - 1 do x = x + math.exp(s[n] * p.scale - mx) / sum * vc[n][d] end
          oc[d] = x
        end
        outc[b + 1][h + 1][m] = oc
        lsec[b + 1][h + 1][m] = mx + math.log(sum)
        local order = {}
        for n = 0, M - 1 do order[n + 1] = n end
        table.sort(order, function(a, c) return s[a] > s[c] or (s[a] == s[c] and a < c) end)
        local sel = {}
        for i = 1, p.topk do sel[i] = order[i] end
        table.sort(sel)
        lists[b + 1][h + 1][m + 1] = sel
      end
    end
  end
  local fine = ref_blocks({ B = B, Sq = M * br, Sk = M * br, H = Hh, D = D, br = br,
                            lists = lists, kvs = p.sizes, qs = p.sizes, scale = p.scale }, q, k, v)
  local out = {}
  for b = 0, B - 1 do
    for r = 0, M * br - 1 do
      local m = r // br
      for h = 0, Hh - 1 do
        for d = 0, D - 1 do
          local i = ix(b, r, h, d)
          out[i] = r % br < p.sizes[m + 1] and
            (gate and gate[i] or 1) * outc[b + 1][h + 1][m][d] + fine[i] or 0
        end
      end
    end
  end
  return out, lists, outc, lsec
end

local function max_err(a, b)
  local e, n = 0, 0
  for i = 1, #b do
    e = math.max(e, math.abs(a[i] - b[i]))
    n = math.max(n, math.abs(b[i]))
  end
  return e / math.max(n, 1e-30)
end

-- ---- the problems ---------------------------------------------------------------

local function rnd_lists(B, Hh, Mq, Mk, empty)
  local lists = {}
  for b = 1, B do
    lists[b] = {}
    for h = 1, Hh do
      lists[b][h] = {}
      for m = 1, Mq do
        local pool = {}
        for n = 0, Mk - 1 do pool[#pool + 1] = n end
        local l = {}
        for _ = 1, math.random(1, Mk) do l[#l + 1] = table.remove(pool, math.random(#pool)) end
        lists[b][h][m] = l -- in random order: the order changes no bit
      end
    end
  end
  if empty then lists[1][1][1] = {} end
  return lists
end

local function rnd_sizes(n, br)
  local s = {}
  for i = 1, n do s[i] = math.random(1, br) end
  return s
end

describe("sta.block_sparse", function()
  math.randomseed(H.seed())

  local function problem()
    local p = { B = 2, H = 2, D = 8, br = 8, Mq = 3, Mk = 4, scale = 0.3 }
    p.Sq, p.Sk = p.Mq * p.br, p.Mk * p.br
    p.lists = rnd_lists(p.B, p.H, p.Mq, p.Mk, true)
    p.kvs, p.qs = rnd_sizes(p.Mk, p.br), rnd_sizes(p.Mq, p.br)
    p.q = H.randn({ p.B, p.Sq, p.H, p.D })
    p.k, p.v = H.randn({ p.B, p.Sk, p.H, p.D }), H.randn({ p.B, p.Sk, p.H, p.D })
    p.opts = { idx = p.lists, kv_sizes = p.kvs, q_sizes = p.qs, block_rows = p.br, scale = p.scale }
    return p
  end

  it("equals a float64 brute force, forward and backward, ragged lists with an empty one", function()
    for _ = 1, 3 do
      local p = problem()
      local dout = H.randn({ p.B, p.Sq, p.H, p.D })
      local o = { lse = true }
      for key, x in pairs(p.opts) do o[key] = x end
      local out, lse = sta.block_sparse(p.q, p.k, p.v, o)
      local ro, rl, rdq, rdk, rdv = ref_blocks(p, p.q:totable(), p.k:totable(), p.v:totable(),
                                               dout:totable())
      assert.is_true(max_err(out:totable(), ro) < 1e-5)
      local l = lse:totable()
      for i = 1, #rl do
        if rl[i] == -math.huge then assert.equal(-math.huge, l[i])
        else assert.is_true(math.abs(l[i] - rl[i]) < 1e-4) end
      end
      local dq, dk, dv = sta.block_sparse_backward(p.q, p.k, p.v, out, lse, dout, p.opts)
      assert.same({ p.B, p.Sk, p.H, p.D }, dk:shape())
      assert.is_true(max_err(dq:totable(), rdq) < 1e-4)
      assert.is_true(max_err(dk:totable(), rdk) < 1e-4)
      assert.is_true(max_err(dv:totable(), rdv) < 1e-4)
    end
  end)

  it("takes the lists as i32 tensors too, with the same bits", function()
    local p = problem()
    local L = 0
    for _, bl in ipairs(p.lists) do for _, hl in ipairs(bl) do for _, l in ipairs(hl) do
      L = math.max(L, #l) end end end
    local idx = sta.zeros({ p.B, p.H, p.Mq, L }, { dtype = "i32" })
    local num = sta.zeros({ p.B, p.H, p.Mq }, { dtype = "i32" })
    for b = 1, p.B do for h = 1, p.H do for m = 1, p.Mq do
      local l = p.lists[b][h][m]
      num:set({ b, h, m }, #l)
      for i, n in ipairs(l) do idx:set({ b, h, m, i }, n) end
    end end end
    local a = sta.block_sparse(p.q, p.k, p.v, p.opts)
    local b = sta.block_sparse(p.q, p.k, p.v, { idx = idx, num = num, block_rows = p.br, scale = p.scale,
      kv_sizes = sta.from_table(p.kvs, { p.Mk }, { dtype = "i32" }),
      q_sizes = sta.from_table(p.qs, { p.Mq }, { dtype = "i32" }) })
    assert.is_true(H.same_values(a, b))
    assert.equal("num: required with an idx tensor (how many of each list's entries count: i32 "
      .. "[B, heads, Mq])", H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = idx, block_rows = p.br }))
  end)

  it("refuses bad lists naming the place, and changes no output", function()
    local p = problem()
    local out = H.randn({ p.B, p.Sq, p.H, p.D })
    local before = out:totable()
    local bad = rnd_lists(p.B, p.H, p.Mq, p.Mk)
    bad[2][1][3] = { 1, 2, 1 }
    assert.equal("blocks.idx[b=1, h=0, m=2]: key block 1 is listed twice (entries 0 and 2)",
      H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = bad, block_rows = p.br, out = out }))
    bad[2][1][3] = { 4 }
    assert.equal("blocks.idx[b=1, h=0, m=2]: entry 0 is key block 4, outside 0..3",
      H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = bad, block_rows = p.br, out = out }))
    bad[2][1] = { { 1 } }
    assert.equal("idx[2][1]: 1 entries, expected 3 as the other lists at this level",
      H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = bad, block_rows = p.br }))
    assert.equal("idx[1][1][1]: expected a list (4 levels of lists), got number",
      H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = { { { 1 } } }, block_rows = p.br }))
    assert.equal("kv_sizes[2]: expected a 32-bit integer >= 1, got 0",
      H.error_of(sta.block_sparse, p.q, p.k, p.v, { idx = p.lists, kv_sizes = { 1, 0 } }))
    assert.is_true(H.same_values(out, sta.from_table(before, out:shape())))
  end)
end)

describe("sta.vsa", function()
  math.randomseed(H.seed())
  -- canvas 5x5x5 in 4x4x4 cubes: 8 cubes, 125 tokens in 512 rows
  local canvas, M, br = { 5, 5, 5 }, 8, 64

  local function sizes()
    return sta.cube_sizes{ canvas = canvas }:totable()
  end

  local function problem(layout)
    local shape = { 1, M * br, 2, 8 }
    local p = { B = 1, H = 2, D = 8, br = br, M = M, scale = 1 / math.sqrt(8), sizes = sizes() }
    p.q, p.k, p.v, p.g = H.randn(shape), H.randn(shape), H.randn(shape), H.randn(shape)
    return p, layout
  end

  it("gives each cube its valid tokens, and round-trips the cube order", function()
    local s = sizes()
    local want = {}
    for it = 0, 1 do for ih = 0, 1 do for iw = 0, 1 do
      want[#want + 1] = math.min(4, 5 - 4 * it) * math.min(4, 5 - 4 * ih) * math.min(4, 5 - 4 * iw)
    end end end
    assert.same(want, s)
    assert.equal("i32", sta.cube_sizes{ canvas = "30x48x80", cube = "4x8x8" }:dtype())
    assert.equal(4 * 6 * 10, sta.cube_sizes{ canvas = "16x48x80", cube = "4x8x8" }:numel())
    local x = H.randn({ 2, 125, 3, 4 })
    local c = sta.to_cubes(x, { canvas = canvas })
    assert.same({ 2, 512, 3, 4 }, c:shape())
    -- token (t, h, w) at its cube's row: STA.md section 12's formula
    local t, hh, w = 4, 2, 4
    local row = (((t // 4) * 2 + hh // 4) * 2 + w // 4) * 64 +
      ((t % 4) * math.min(4, 5 - hh // 4 * 4) + hh % 4) * math.min(4, 5 - w // 4 * 4) + w % 4
    assert.equal(x:get{ 2, (t * 5 + hh) * 5 + w + 1, 3, 4 }, c:get{ 2, row + 1, 3, 4 })
    assert.equal(0, c:get{ 1, 64 + 60, 1, 1 }) -- cube 1 holds 4x4x1 = 16 tokens
    assert.is_true(H.same_values(x, sta.from_cubes(c, { canvas = canvas })))
    local xb = H.randn({ 1, 2, 125, 4 })
    assert.is_true(H.same_values(xb, sta.from_cubes(sta.to_cubes(xb, { canvas = "5,5,5", layout = "bhsd" }),
                                                    { canvas = canvas, layout = "bhsd" })))
  end)

  it("equals a float64 VSA, with and without a gate, by sparsity or topk", function()
    for _, case in ipairs{ { sparsity = 0.6 }, { topk = 2 }, { topk = M }, { sparsity = 0 } } do
      local p = problem()
      p.topk = case.topk or sta.vsa_topk(case.sparsity, M)
      for _, gated in ipairs{ false, true } do
        local o = { canvas = canvas, sparsity = case.sparsity, topk = case.topk,
                    gate = gated and p.g or nil }
        local out = sta.vsa(p.q, p.k, p.v, o)
        local want = ref_vsa(p, p.q:totable(), p.k:totable(), p.v:totable(),
                             gated and p.g:totable() or nil)
        assert.is_true(max_err(out:totable(), want) < 1e-5)
      end
    end
    assert.equal(4, sta.vsa_topk(0.6, 8))
    assert.equal(240, sta.vsa_topk(0.875, 1920))
  end)

  it("has the gradients of that reference (central differences), gate included", function()
    local p = problem()
    p.topk = 3
    local dout = H.randn(p.q:shape())
    local o = { canvas = canvas, topk = 3, gate = p.g }
    local out, lse = sta.vsa(p.q, p.k, p.v, { canvas = canvas, topk = 3, gate = p.g, lse = true })
    local dq, dk, dv, dg = sta.vsa_backward(p.q, p.k, p.v, out, lse, dout, o)
    local x = { p.q:totable(), p.k:totable(), p.v:totable(), p.g:totable() }
    local got = { dq:totable(), dk:totable(), dv:totable(), dg:totable() }
    local dt = dout:totable()
    local function loss()
      local y, s = ref_vsa(p, x[1], x[2], x[3], x[4]), 0
      for i = 1, #y do s = s + y[i] * dt[i] end
      return s
    end
    local ix = at(M * br, 2, 8)
    for which = 1, 4 do
      for _ = 1, 4 do -- valid rows: the first cube's 64
        local i = ix(0, math.random(0, 63), math.random(0, 1), math.random(0, 7))
        local x0, eps = x[which][i], 1e-4
        x[which][i] = x0 + eps
        local up = loss()
        x[which][i] = x0 - eps
        local down = loss()
        x[which][i] = x0
        local fd = (up - down) / (2 * eps)
        assert.is_true(math.abs(got[which][i] - fd) < 2e-3 * math.max(1, math.abs(fd)),
          ("input %d element %d: %g against %g"):format(which, i, got[which][i], fd))
      end
      -- padding rows: zero gradients
      assert.equal(0, got[which][ix(0, 64 + 63, 1, 7)])
    end
  end)

  local function rel(a, b) return select(2, a:compare(b)) end

  it("has a float64 reference, forward and backward, that the fast path matches", function()
    for _, case in ipairs{ { topk = 3, gated = true }, { sparsity = 0.4 }, { sparsity = 0, gated = true } } do
      local p = problem()
      local o = { canvas = canvas, sparsity = case.sparsity, topk = case.topk,
                  gate = case.gated and p.g or nil, lse = true }
      local out, lse = sta.vsa(p.q, p.k, p.v, o)
      local rout, rlse = sta.vsa_reference(p.q, p.k, p.v, o)
      assert.same(out:shape(), rout:shape())
      assert.is_true(rel(out, rout) < 1e-5, tostring(rel(out, rout)))
      local lf, lr = lse:totable(), rlse:totable()
      for i = 1, #lr do -- padding rows: -inf in both
        if lr[i] == -math.huge then assert.equal(-math.huge, lf[i])
        else assert.is_true(math.abs(lf[i] - lr[i]) < 1e-4) end
      end
      p.topk = case.topk or sta.vsa_topk(case.sparsity, M)
      local want = ref_vsa(p, p.q:totable(), p.k:totable(), p.v:totable(),
                           case.gated and p.g:totable() or nil)
      assert.is_true(max_err(rout:totable(), want) < 1e-6)
      assert.equal(1, select("#", sta.vsa_reference(p.q, p.k, p.v, { canvas = canvas, topk = 2 })))
      local dout = H.randn(p.q:shape())
      o.lse = nil
      local a = { sta.vsa_backward(p.q, p.k, p.v, out, lse, dout, o) }
      local b = { sta.vsa_backward_reference(p.q, p.k, p.v, out, lse, dout, o) }
      local c = { sta.vsa_backward_reference(p.q, p.k, p.v, nil, nil, dout, o) } -- not read
      assert.equal(case.gated and 4 or 3, #b)
      assert.equal(#a, #b)
      for i = 1, #a do
        assert.same(a[i]:shape(), b[i]:shape())
        assert.is_true(rel(a[i], b[i]) < 1e-5, ("grad %d: %g"):format(i, rel(a[i], b[i])))
        assert.is_true(H.same_values(b[i], c[i]))
      end
    end
  end)

  it("gives the coarse branch and the forward's selection (sta.vsa_coarse)", function()
    for _, case in ipairs{ { topk = 3 }, { sparsity = 0.6, layout = "bhsd" }, { topk = M } } do
      local p = problem()
      p.topk = case.topk or sta.vsa_topk(case.sparsity, M)
      local bhsd = case.layout == "bhsd"
      local function lay(t) return bhsd and t:permute({ 1, 3, 2, 4 }):clone() or t end
      local q, k, v, g = lay(p.q), lay(p.k), lay(p.v), lay(p.g)
      local o = { canvas = canvas, sparsity = case.sparsity, topk = case.topk, layout = case.layout }
      local oc, lc, idx, num = sta.vsa_coarse(q, k, v, o)
      assert.same({ 1, 2, M, 8 }, oc:shape())
      assert.same({ 1, 2, M }, lc:shape())
      assert.same({ 1, 2, M, p.topk }, idx:shape())
      assert.equal("i32", idx:dtype())
      assert.equal("i32", num:dtype())
      assert.equal("f32", oc:dtype())
      local _, lists, routc, rlsec = ref_vsa(p, p.q:totable(), p.k:totable(), p.v:totable())
      for h = 1, 2 do
        for m = 1, M do
          assert.equal(p.topk, num:get{ 1, h, m })
          for i = 1, p.topk do assert.equal(lists[1][h][m][i], idx:get{ 1, h, m, i }) end
          assert.is_true(math.abs(lc:get{ 1, h, m } - rlsec[1][h][m - 1]) < 1e-5)
          for d = 1, 8 do
            assert.is_true(math.abs(oc:get{ 1, h, m, d } - routc[1][h][m - 1][d - 1]) < 1e-5)
          end
        end
      end
      -- the block-sparse fine branch over those lists plus gate * out_c is sta.vsa
      o.gate = g
      local out = sta.vsa(q, k, v, o)
      local s = sta.cube_sizes{ canvas = canvas }
      local fine = sta.block_sparse(q, k, v, { idx = idx, num = num, kv_sizes = s, q_sizes = s,
                                               block_rows = br, layout = case.layout })
      local sz = s:totable()
      for r = 1, M * br, 7 do
        local m = (r - 1) // br + 1
        for h = 1, 2 do
          for d = 1, 8 do
            local at4 = bhsd and { 1, h, r, d } or { 1, r, h, d }
            local want = (r - 1) % br < sz[m] and g:get(at4) * oc:get{ 1, h, m, d } + fine:get(at4) or 0
            assert.is_true(math.abs(out:get(at4) - want) < 1e-5 * math.max(1, math.abs(want)),
              ("row %d head %d: %g against %g"):format(r, h, out:get(at4), want))
          end
        end
      end
    end
  end)

  it("refuses misuse with the schema's and the core's messages", function()
    local p = problem()
    local out = H.randn(p.q:shape())
    local before = out:totable()
    for _, f in ipairs{ sta.vsa, sta.vsa_reference, sta.vsa_coarse } do
      assert.equal("sparsity: given with topk (give one of them)",
        H.error_of(f, p.q, p.k, p.v, { canvas = canvas, sparsity = 0.5, topk = 2 }))
      assert.equal("topk: expected 1..8 (the key cubes), got 9",
        H.error_of(f, p.q, p.k, p.v, { canvas = canvas, topk = 9 }))
      assert.equal("q: 512 rows, expected 256 (the canvas 4x8x8 in 1 cubes of 256 rows, cube order)",
        H.error_of(f, p.q, p.k, p.v, { canvas = { 4, 8, 8 }, cube = "4x8x8", topk = 1 }))
    end
    assert.equal("topk: expected 1..8 (the key cubes), got 9",
      H.error_of(sta.vsa_reference, p.q, p.k, p.v, { canvas = canvas, topk = 9, out = out }))
    assert.is_true(H.same_values(out, sta.from_table(before, out:shape())))
    assert.equal(H.error_of(sta.vsa_backward, p.q, p.k, p.v, p.q, p.q, p.q, { canvas = canvas, topk = 9 }),
      H.error_of(sta.vsa_backward_reference, p.q, p.k, p.v, nil, nil, p.q, { canvas = canvas, topk = 9 }))
    assert.equal("options: unknown key 'gate' (known: canvas, cube, sparsity, topk, layout, scale)",
      H.error_of(sta.vsa_coarse, p.q, p.k, p.v, { canvas = canvas, topk = 2, gate = p.g }))
    assert.equal("dout: expected a tensor, got nil",
      H.error_of(sta.vsa_backward_reference, p.q, p.k, p.v, nil, nil, nil, { canvas = canvas, topk = 2 }))
    assert.equal("sparsity: given with topk (give one of them)",
      H.error_of(sta.vsa, p.q, p.k, p.v, { canvas = canvas, sparsity = 0.5, topk = 2 }))
    assert.equal("topk: expected 1..8 (the key cubes), got 9",
      H.error_of(sta.vsa, p.q, p.k, p.v, { canvas = canvas, topk = 9 }))
    assert.equal("q: 512 rows, expected 256 (the canvas 4x8x8 in 1 cubes of 256 rows, cube order)",
      H.error_of(sta.vsa, p.q, p.k, p.v, { canvas = { 4, 8, 8 }, cube = "4x8x8", topk = 1 }))
    assert.equal("block_rows: expected 64 (4x4x4 cubes) or 256 (4x8x8 cubes), got 8",
      H.error_of(sta.vsa, p.q, p.k, p.v, { canvas = { 4, 8, 16 }, cube = "2x2x2", topk = 1 }))
  end)
end)

describe("VSA layers", function()
  local canvas = { 5, 5, 5 }
  local shape = { 1, 512, 2, 8 }

  it("take the sparsity of the forward batch per step, every cube in the dense steps", function()
    local layer = sta.layer{ mode = "vsa", canvas = canvas, heads = 2, head_dim = 8, dense_steps = 2 }
    local fb = sta.forward_batch{ vsa_sparsity = 0.7 }
    assert.equal(0.7, fb:vsa_sparsity())
    local q, k, v, g = H.randn(shape), H.randn(shape), H.randn(shape), H.randn(shape)
    local dout = H.randn(shape)
    for step = 0, 3 do
      if step == 3 then fb:vsa_sparsity(0.3) end
      local topk = step < 2 and 8 or sta.vsa_topk(fb:vsa_sparsity(), 8)
      local ctx <close> = sta.forward_context{ step = step, batch = fb }
      local out = layer:forward(q, k, v)
      assert.is_true(H.same_values(out, sta.vsa(q, k, v, { canvas = canvas, topk = topk })))
      local o2, lse, used = layer:forward(q, k, v, { lse = true, gate = g })
      assert.equal(topk, used.topk)
      assert.same(canvas, used.canvas)
      assert.equal(g, used.gate)
      local want = sta.vsa(q, k, v, { canvas = canvas, topk = topk, gate = g })
      assert.is_true(H.same_values(o2, want))
      local a = { layer:backward(q, k, v, o2, lse, dout, used) }
      local b = { sta.vsa_backward(q, k, v, o2, lse, dout, used) }
      assert.equal(4, #a)
      for i = 1, 4 do assert.is_true(H.same_values(a[i], b[i])) end
    end
  end)

  it("refuse what is not theirs", function()
    local q = H.randn(shape)
    local vsa = sta.layer{ mode = "vsa", canvas = canvas, heads = 2, head_dim = 8 }
    assert.equal("VSA forward called outside a forward context (no context is live)",
      H.error_of(vsa.forward, vsa, q, q, q))
    assert.equal("text_len: a VSA layer has no text rows, got 3",
      H.error_of(sta.layer, { mode = "vsa", canvas = canvas, text_len = 3, heads = 2, head_dim = 8 }))
    assert.equal("cube: a layer in STA mode has no cubes (VSA mode: STA_LAYER_VSA)",
      H.error_of(sta.layer, { canvas = canvas, cube = "4x4x4", heads = 2, head_dim = 8 }))
    local st = sta.layer{ canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, heads = 2, head_dim = 8 }
    local x = H.randn({ 1, 32, 2, 8 })
    assert.equal("gate: an STA layer takes no gate (a layer of mode \"vsa\" does)",
      H.error_of(st.forward, st, x, x, x, { gate = x }))
    local fb = sta.forward_batch{}
    assert.equal(0, fb:vsa_sparsity())
    assert.equal("sparsity: expected a value in [0, 1), got 1", H.error_of(fb.vsa_sparsity, fb, 1))
    assert.equal("vsa_sparsity: expected a number in [0, 1), got -0.5",
      H.error_of(sta.forward_batch, { vsa_sparsity = -0.5 }))
  end)
end)

describe("i32 tensors", function()
  it("hold integers: created, filled, read and written exactly", function()
    local t = sta.zeros({ 2, 3 }, { dtype = "i32" })
    assert.equal("i32", t:dtype())
    t:set({ 2, 3 }, 2147483647)
    t:set({ 1, 1 }, -7)
    local v = t:totable()
    assert.equal(-7, v[1])
    assert.equal(2147483647, v[6])
    assert.equal("integer", math.type(v[6]))
    assert.same({ 4, 5 }, sta.from_table({ 4, 5 }, { 2 }, { dtype = "int32" }):totable())
    assert.equal("value: 1.5 is not an i32 (an integer in -2147483648..2147483647)",
      H.error_of(sta.from_table, { 1.5 }, { 1 }, { dtype = "i32" }))
  end)
end)
