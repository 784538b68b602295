local sta = require "sta"
local H = require "helpers"

local canvas, tile = {4, 8, 8}, {2, 4, 4} -- grid 2x2x2, 256 video tokens
local S = 256 + 4

local function qkv(heads, D, layout)
  local shape = layout == "bhsd" and {1, heads, S, D} or {1, S, heads, D}
  return H.randn(shape), H.randn(shape), H.randn(shape)
end

describe("sta layers", function()
  it("finds the layer index from the module prefix", function()
    assert.equal(7, sta.layer_index_from_prefix("transformer.double_blocks.7.attn.impl"))
    local l = sta.layer{ prefix = "model.blocks.12.attn.impl", heads = 2, head_dim = 8, canvas = canvas, tile = tile }
    assert.equal(12, l:index())
    assert.equal("sta.Layer(12)", tostring(l))
    assert.has_error(function() sta.layer_index_from_prefix("attn") end)
  end)

  it("takes order = \"tiled\": FastVideo's tiled rows, read in place", function()
    local c, t = {3, 5, 7}, {2, 3, 4} -- partial tiles: 192 video rows
    local St = 192 + 2
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 3} }
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, canvas = c, tile = t,
                             order = "tiled", strategy = s }
    local q, k, v = H.randn({1, St, 2, 8}), H.randn({1, St, 2, 8}), H.randn({1, St, 2, 8})
    local fb = sta.forward_batch{}
    local ctx <close> = sta.forward_context{ step = 0, batch = fb }
    local out = layer:forward(q, k, v)
    local expect = sta.attention(q, k, v, { canvas = c, tile = t, order = "tiled", window = {1, 1, 3} })
    assert.is_true(H.same_values(expect, out))
  end)

  it("runs the step's windows from the context, per head", function()
    local heads, D = 3, 16
    local s = sta.strategy.new()
    local wins = {{1, 1, 1}, {1, 2, 2}, {2, 2, 2}}
    for st = 0, 1 do
      for l = 0, 1 do
        for h = 0, heads - 1 do s:set(st, l, h, wins[(h + st) % 3 + 1]) end
      end
    end
    local layer = sta.layer{ layer = 1, heads = heads, head_dim = D, canvas = canvas, tile = tile, text_len = 4 }
    local fb = sta.forward_batch{}
    for step = 0, 1 do
      local q, k, v = qkv(heads, D)
      local md = sta.metadata.from_strategy(s, step, 2, heads)
      local ctx <close> = sta.forward_context{ step = step, metadata = md, batch = fb }
      local out = layer:forward(q, k, v)
      local per_head = {}
      for h = 0, heads - 1 do per_head[h + 1] = s:get(step, 1, h) end
      local expect = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = per_head, text_len = 4 })
      local _, rel = out:compare(expect)
      assert.is_true(rel < 1e-6, "rel " .. rel)
    end
  end)

  it("falls back to its own strategy when the context has no metadata", function()
    local s = sta.strategy.uniform{ steps = 2, layers = 1, heads = 2, window = {1, 1, 1} }
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile, strategy = s,
      layout = "bhsd" }
    s = nil
    H.full_gc() -- the layer pins its strategy
    local q, k, v = qkv(2, 8, "bhsd")
    local ctx <close> = sta.forward_context{ step = 1, batch = sta.forward_batch{} }
    local out = layer:forward(q, k, v)
    local expect = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 1, 1}, layout = "bhsd" })
    local _, rel = out:compare(expect)
    assert.is_true(rel < 1e-6)
  end)

  it("passes softmax = \"fast\" on to the forward, and refuses other names", function()
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile, strategy = s,
      softmax = "fast" }
    local q, k, v = qkv(2, 8)
    local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{} }
    local out = layer:forward(q, k, v)
    local expect = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 1, 1} })
    assert.equal(0, (out:compare(expect)))
    assert.equal("softmax: expected \"exact\" or \"fast\", got 'quick'", H.error_of(sta.layer,
      { layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile, softmax = "quick" }))
  end)

  it("passes precision = \"fp8\" on to the forward, and refuses other names", function()
    local s = sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile, strategy = s,
      precision = "fp8" }
    local q, k, v = qkv(2, 8)
    local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{} }
    local out = layer:forward(q, k, v)
    local o = { canvas = canvas, tile = tile, window = {1, 1, 1}, precision = "fp8" }
    assert.equal(0, (out:compare(sta.attention(q, k, v, o))))
    o.precision = nil
    assert.is_true(select(2, out:compare(sta.attention(q, k, v, o))) > 1e-3)
    assert.equal("precision: expected \"native\" or \"fp8\", got 'int4'", H.error_of(sta.layer,
      { layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile, precision = "int4" }))
  end)

  it("uses this rank's global heads under sequence parallelism", function()
    local s = sta.strategy.new()
    local wins = {{1, 1, 1}, {2, 2, 2}, {1, 2, 1}, {2, 1, 1}}
    for h = 0, 3 do s:set(0, 0, h, wins[h + 1]) end
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, sp_rank = 1, sp_size = 2, canvas = canvas,
      tile = tile, strategy = s }
    local q, k, v = qkv(2, 8)
    local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{} }
    local out = layer:forward(q, k, v)
    local expect = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {wins[3], wins[4]} })
    local _, rel = out:compare(expect)
    assert.is_true(rel < 1e-6)
  end)

  it("raises STA.md section 9 messages and leaves out and the stack unchanged", function()
    local d0 = sta.context_depth()
    local q, k, v = qkv(2, 8)
    local out = H.randn({1, S, 2, 8})
    local before = out:totable()
    local layer = sta.layer{ layer = 3, heads = 2, head_dim = 8, canvas = canvas, tile = tile }
    local function fwd() return layer:forward(q, k, v, out) end
    assert.equal("STA forward called outside a forward context (no context is live)", H.error_of(fwd))
    local function in_ctx(opts)
      local ctx <close> = sta.forward_context(opts)
      return layer:forward(q, k, v, out)
    end
    assert.equal("forward_batch cannot be None", H.error_of(in_ctx, { step = 0 }))
    local fb = sta.forward_batch{}
    assert.equal("mask_strategy cannot be None for SlidingTileAttention", H.error_of(in_ctx, { step = 0, batch = fb }))
    layer:set_strategy(sta.strategy.parse('{"1_3_0": [1, 1, 1], "1_3_1": [1, 1, 1]}'))
    assert.equal("mask_strategy[0] cannot be None for SlidingTileAttention",
      H.error_of(in_ctx, { step = 1, batch = fb }))
    assert.equal("Invalid STA_param", H.error_of(in_ctx, { step = 0, batch = fb, metadata = sta.metadata(2) }))
    local md = sta.metadata(4)
    assert.equal("Invalid STA_param", H.error_of(in_ctx, { step = 0, batch = fb, metadata = md }))
    md:set_row(3, {{1, 1, 1}, {1, 1, 1}})
    local short = H.randn({1, 100, 2, 8})
    assert.equal("seq_len 100 not supported for STA", H.error_of(function()
      local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
      return layer:forward(short, short, short)
    end))
    local auto = sta.layer{ layer = 3, heads = 2, head_dim = 8 } -- canvas from seq_len
    assert.equal(("seq_len %d not supported for STA"):format(S), H.error_of(function()
      local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
      return auto:forward(q, k, v)
    end))
    assert.equal("q: expected 2 heads (local_heads), got 3", H.error_of(function()
      local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
      local q3 = H.randn({1, S, 3, 8})
      return layer:forward(q3, q3, q3)
    end))
    assert.same(before, out:totable())
    assert.equal(d0, sta.context_depth())
    -- and it works once everything is there
    local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
    layer:forward(q, k, v, out)
    assert.are_not.same(before, out:totable())
  end)

  it("names the device option as given (device, or its alias backend), as SP layers do", function()
    assert.equal("backend: expected \"cpu\" or \"cuda\", got 'tpu'",
      H.error_of(sta.layer, { layer = 0, heads = 1, head_dim = 8, backend = "tpu", canvas = canvas }))
    assert.equal("device: expected \"cpu\" or \"cuda\", got 'tpu'",
      H.error_of(sta.layer, { layer = 0, heads = 1, head_dim = 8, device = "tpu", canvas = canvas }))
    assert.equal("device: given twice (as device and backend)",
      H.error_of(sta.layer, { layer = 0, heads = 1, head_dim = 8, device = "cpu", backend = "cpu",
                              canvas = canvas }))
    assert.equal("prefix: expected a string, got 3",
      H.error_of(sta.layer, { prefix = 3, heads = 1, head_dim = 8, canvas = canvas }))
  end)

  it("refuses the CUDA backend when no GPU answers", function()
    if sta.backend_available("cuda") then return end
    assert.matches("^st attn not supported %(cuda: .+%)$",
      H.error_of(sta.layer, { layer = 0, heads = 1, head_dim = 8, backend = "cuda", canvas = canvas }))
  end)
end)
