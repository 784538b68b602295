-- silent_answers_spec.lua -- calls of the Lua module that once returned wrong
-- answers without an error: scale 0 or negative (it ran with 1/sqrt(D)), and
-- layer:backward using the windows of its forward, not what the context or
-- the layer hold by the time it runs.  The FFI's window lists and layouts
-- are in ffi_spec.lua, Python's in python/tests (RELIABILITY.md: Found and fixed).
local sta = require "sta"
local H = require "helpers"

local canvas, tile = { 2, 4, 4 }, { 1, 2, 2 } -- grid 2x2x2, 32 video tokens
local S, HEADS, D = 32 + 2, 2, 8
local geom = { canvas = canvas, tile = tile }

local function qkv()
  return H.randn({ 1, S, HEADS, D }), H.randn({ 1, S, HEADS, D }), H.randn({ 1, S, HEADS, D })
end

local function with(t, extra)
  local o = {}
  for k, v in pairs(t) do o[k] = v end
  for k, v in pairs(extra) do o[k] = v end
  return o
end

describe("silent wrong answers through Lua", function()
  it("refuses scale 0, negative, non-finite or 0 in float32", function()
    local q, k, v = qkv()
    for _, s in ipairs{ 0, -1, -0.0, 0 / 0, 1 / 0, -1 / 0, 1e-50, 1e39 } do
      local err = H.error_of(sta.attention, q, k, v, with(geom, { window = { 1, 1, 1 }, scale = s }))
      assert.truthy(err:find("^scale: expected a number > 0"), err)
      err = H.error_of(sta.layer, with(geom, { layer = 0, heads = HEADS, head_dim = D, scale = s }))
      assert.truthy(err:find("^scale: expected a number > 0"), err)
    end
    -- the smallest positive float32 and the largest finite one run
    local tiny = sta.attention(q, k, v, with(geom, { window = { 1, 1, 1 }, scale = 1.5e-45 }))
    assert.equal("f32", tiny:dtype())
    assert.truthy(sta.layer(with(geom, { layer = 0, heads = HEADS, head_dim = D, scale = 3.4e38 })))
  end)

  it("layer:backward takes the windows its forward used", function()
    local q, k, v = qkv()
    local dout = H.randn({ 1, S, HEADS, D })
    local a = sta.strategy.uniform{ steps = 1, layers = 1, heads = HEADS, window = { 1, 1, 1 } }
    local b = sta.strategy.uniform{ steps = 1, layers = 1, heads = HEADS, window = { 1, 3, 1 } }
    local l = sta.layer(with(geom, { layer = 0, heads = HEADS, head_dim = D, strategy = a }))
    local fb = sta.forward_batch{}
    local out, lse, used
    do
      local ctx <close> = sta.forward_context{ step = 0, batch = fb }
      out, lse, used = l:forward(q, k, v, { lse = true })
    end
    l:set_strategy(b) -- after the forward: changes nothing for its backward
    local dq, dk, dv = l:backward(q, k, v, out, lse, dout, used)
    local want = { sta.attention_backward(q, k, v, out, lse, dout, with(geom, { window = { 1, 1, 1 } })) }
    for i, g in ipairs{ dq, dk, dv } do assert.equal(0, (g:compare(want[i]))) end
    -- the same through a metadata row changed after the forward
    local md = sta.metadata.from_strategy(a, 0, 1, HEADS)
    do
      local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
      out, lse, used = l:forward(q, k, v, { lse = true })
      md:set_row(0, { { 3, 3, 3 }, { 3, 3, 3 } })
      dq, dk, dv = l:backward(q, k, v, out, lse, dout, used)
    end
    for i, g in ipairs{ dq, dk, dv } do assert.equal(0, (g:compare(want[i]))) end
    assert.equal("used: expected the third result of layer:forward(q, k, v, {lse = true}), got nil",
      H.error_of(l.backward, l, q, k, v, out, lse, dout))
  end)
end)
