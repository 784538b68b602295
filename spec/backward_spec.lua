-- The backward through Lua: sta.attention_backward against finite
-- differences of sta.reference, layer:forward{lse = true} / layer:backward
-- under the live context, and the errors (STA.md section 10).
local sta = require "sta"

local seed = os.time() % 100000

-- sum(dout * reference(q, k, v)) in double
local function loss(q, k, v, dout, o)
  local out = sta.reference(q, k, v, o)
  local a, b = out:totable(), dout:totable() -- flat, same order
  local s = 0
  for i = 1, #a do s = s + a[i] * b[i] end
  out:release()
  return s
end

describe("sta.attention_backward", function()
  local o = { canvas = {4, 5, 6}, tile = {2, 3, 3}, text_len = 2, window = {1, 3, 1} }
  local S = 4 * 5 * 6 + 3 -- one padding row after the 2 valid text rows

  it("matches finite differences of the reference", function()
    local q = sta.randn({1, S, 2, 4}, { seed = seed + 1 })
    local k = sta.randn({1, S, 2, 4}, { seed = seed + 2 })
    local v = sta.randn({1, S, 2, 4}, { seed = seed + 3 })
    local g = sta.randn({1, S, 2, 4}, { seed = seed + 4 })
    local out, lse = sta.attention(q, k, v, { canvas = o.canvas, tile = o.tile, text_len = 2,
                                             window = o.window, lse = true })
    local grads = { sta.attention_backward(q, k, v, out, lse, g, o) }
    local eps = 1e-2
    for which, t in ipairs{ q, k, v } do
      for n = 1, 6 do
        local at = { 1, (n * 37 + which * 11) % S + 1, n % 2 + 1, (n + which) % 4 + 1 }
        local x0 = t:get(at)
        t:set(at, x0 + eps)
        local lp = loss(q, k, v, g, o)
        t:set(at, x0 - eps)
        local lm = loss(q, k, v, g, o)
        t:set(at, x0)
        local fd, an = (lp - lm) / (2 * eps), grads[which]:get(at)
        assert.is_true(math.abs(fd - an) <= 2e-3 + 2e-3 * math.abs(an),
                       ("grad %d at %s: analytic %g, finite difference %g"):format(which,
                       table.concat(at, ","), an, fd))
      end
    end
    -- the padding row (never a key) has dk = dv = 0 exactly, and a dq
    for d = 1, 4 do
      assert.equal(0, grads[2]:get{1, S, 1, d})
      assert.equal(0, grads[3]:get{1, S, 2, d})
    end
  end)

  it("writes into given tensors and says what is wrong", function()
    local q = sta.randn({1, S, 1, 8}, { seed = seed + 5 })
    local out, lse = sta.attention(q, q, q, { canvas = o.canvas, tile = o.tile, window = o.window, lse = true })
    local dq, dk, dv = sta.tensor({1, S, 1, 8}), sta.tensor({1, S, 1, 8}), sta.tensor({1, S, 1, 8})
    local a, b, c = sta.attention_backward(q, q, q, out, lse, q, { canvas = o.canvas, tile = o.tile,
      window = o.window, dq = dq, dk = dk, dv = dv, deterministic = true })
    assert.equal(dq, a); assert.equal(dk, b); assert.equal(dv, c)
    local ok, msg = pcall(sta.attention_backward, q, q, q, out, lse, q, { canvas = o.canvas,
      tile = o.tile, window = o.window, dq = dq, dk = dq, dv = dv })
    assert.is_false(ok)
    assert.equal("dk: shares memory with dq (the backward writes dk while writing dq; use a separate tensor)", msg)
    ok, msg = pcall(sta.attention_backward, q, q, q, out, nil, q, { canvas = o.canvas })
    assert.is_false(ok)
    assert.truthy(msg:find("lse", 1, true))
  end)
end)

describe("layer:backward", function()
  it("uses the windows its forward ran (the forward's third result) and refuses a search row", function()
    local canvas, tile, S = {4, 8, 8}, {2, 4, 4}, 4 * 8 * 8 + 6
    local strat = sta.strategy.new()
    local wins = {{1, 1, 3}, {3, 1, 1}, {1, 3, 1}, {3, 3, 3}}
    for h = 0, 3 do strat:set(0, 0, h, wins[h + 1]) end
    local layer = sta.layer{ layer = 0, heads = 4, head_dim = 8, canvas = canvas, tile = tile,
                             text_len = 6, strategy = strat }
    local batch = sta.forward_batch{ batch_size = 1 }
    local q = sta.randn({1, S, 4, 8}, { seed = seed + 6 })
    local k = sta.randn({1, S, 4, 8}, { seed = seed + 7 })
    local v = sta.randn({1, S, 4, 8}, { seed = seed + 8 })
    local g = sta.randn({1, S, 4, 8}, { seed = seed + 9 })
    do
      local ctx <close> = sta.forward_context{ step = 0, batch = batch }
      local out, lse, used = layer:forward(q, k, v, { lse = true })
      assert.same(wins, used.window)
      local dq, dk, dv = layer:backward(q, k, v, out, lse, g, used)
      local r = { sta.attention_backward(q, k, v, out, lse, g, { canvas = canvas, tile = tile,
        text_len = 6, window = wins }) }
      for i, x in ipairs{ dq, dk, dv } do
        local mx = x:compare(r[i])
        assert.equal(0, mx)
      end
    end
    local md = sta.metadata.search(1, {{1, 1, 1}, {3, 2, 3}})
    local ctx <close> = sta.forward_context{ step = 4, batch = batch, metadata = md }
    local out, lse, used = layer:forward(q, k, v, { lse = true })
    local ok, msg = pcall(layer.backward, layer, q, k, v, out, lse, g, used)
    assert.is_false(ok)
    assert.equal("backward: layer 0 runs a mask search at step 4 (2 candidate windows); a " ..
                 "search-mode forward has no backward", msg)
  end)
end)
