local sta = require "sta"
local H = require "helpers"

describe("sta forward contexts", function()
  it("push and pop with <close>, innermost live", function()
    local d0 = sta.context_depth()
    local fb = sta.forward_batch{ batch_size = 1 }
    local md = sta.metadata(2)
    do
      local outer <close> = sta.forward_context{ step = 3, metadata = md, batch = fb }
      assert.equal(d0 + 1, sta.context_depth())
      assert.equal(outer, sta.current_context())
      assert.equal(3, outer:step())
      assert.equal(md, outer:metadata())
      assert.equal(fb, outer:batch())
      assert.is_true(sta.in_forward_pass())
      do
        local inner <close> = sta.forward_context{ step = 4 }
        assert.equal(d0 + 2, sta.context_depth())
        assert.equal(inner, sta.current_context())
        assert.is_false(sta.in_forward_pass())
        assert.is_nil(inner:batch())
      end
      assert.equal(outer, sta.current_context())
      assert.is_true(sta.in_forward_pass())
    end
    assert.equal(d0, sta.context_depth())
    assert.is_false(sta.in_forward_pass())
  end)

  it("pops when an error unwinds a <close> scope", function()
    local d0 = sta.context_depth()
    local ok, err = pcall(function()
      local ctx <close> = sta.forward_context{ step = 1, batch = sta.forward_batch{} }
      local ctx2 <close> = sta.forward_context{ step = 2 }
      assert(sta.context_depth() == d0 + 2)
      error("boom", 0)
    end)
    assert.is_false(ok)
    assert.equal("boom", err)
    assert.equal(d0, sta.context_depth())
    assert.is_nil(sta.current_context())
  end)

  it("with_context pops on return and on error", function()
    local d0 = sta.context_depth()
    local step = sta.with_context({ step = 9 }, function(ctx) return ctx:step() end)
    assert.equal(9, step)
    assert.equal("inner", H.error_of(sta.with_context, { step = 1 }, function() error("inner", 0) end))
    assert.equal(d0, sta.context_depth())
  end)

  it("refuses a pop out of order and leaves the stack as it was", function()
    local d0 = sta.context_depth()
    local a = sta.forward_context{ step = 0 }
    local b = sta.forward_context{ step = 1 }
    assert.equal(("forward context: pop of a context that is not the innermost (it is at level %d of depth %d)")
      :format(d0 + 1, d0 + 2), H.error_of(a.pop, a))
    assert.equal(d0 + 2, sta.context_depth())
    assert.equal(b, sta.current_context())
    b:pop()
    b:pop() -- idempotent
    a:pop()
    assert.equal(d0, sta.context_depth())
    assert.equal("context: already popped", H.error_of(a.step, a))
    assert.equal("sta.Context(popped)", tostring(a))
  end)

  it("keeps metadata and batch alive while pushed", function()
    local d0 = sta.context_depth()
    local ctx = sta.forward_context{ step = 0, metadata = sta.metadata(3), batch = sta.forward_batch{ batch_size = 2 } }
    H.full_gc()
    assert.equal(3, ctx:metadata():layers())
    assert.equal(2, ctx:batch():size())
    local c = sta.current_context()
    c = nil
    H.full_gc()
    assert.equal(d0 + 1, sta.context_depth())
    ctx:pop()
    assert.equal(d0, sta.context_depth())
  end)

  it("builds the step's metadata from a strategy", function()
    local s = sta.strategy.uniform{ steps = 3, layers = 2, heads = 4, window = {1, 3, 3},
      full = {3, 5, 5}, full_steps = 1 }
    do
      local ctx <close> = sta.forward_context{ step = 0, strategy = s, layers = 2, heads = 4 }
      assert.same({{3, 5, 5}, {3, 5, 5}, {3, 5, 5}, {3, 5, 5}}, ctx:metadata():row(1))
    end
    local ctx <close> = sta.forward_context{ step = 2, strategy = s, layers = 2, heads = 4 }
    assert.same({1, 3, 3}, ctx:metadata():row(0)[4])
  end)

  it("rejects bad arguments exactly and pushes nothing", function()
    local d0 = sta.context_depth()
    assert.equal("step: expected a 32-bit integer >= 0, got -1", H.error_of(sta.forward_context, { step = -1 }))
    assert.equal("metadata: expected a sta.Metadata, got 'x'", H.error_of(sta.forward_context, { metadata = "x" }))
    assert.equal("batch: expected a sta.ForwardBatch, got table", H.error_of(sta.forward_context, { batch = {} }))
    assert.equal("mask_strategy cannot be None for SlidingTileAttention",
      H.error_of(sta.metadata.from_strategy, nil, 0, 1, 1))
    local no0 = sta.strategy.parse('{"1_0_0": [1, 1, 1]}')
    assert.equal("mask_strategy[0] cannot be None for SlidingTileAttention",
      H.error_of(sta.forward_context, { step = 1, strategy = no0, layers = 1, heads = 1 }))
    assert.equal(d0, sta.context_depth())
  end)
end)

describe("sta forward batches", function()
  it("holds size and the CFG flag", function()
    local fb = sta.forward_batch{ batch_size = 2, negative = true }
    assert.equal(2, fb:size())
    assert.is_true(fb:negative())
    fb:negative(false)
    assert.is_false(fb:negative())
    assert.equal("sta.ForwardBatch(size 2, positive, 0+0 records)", tostring(fb))
    assert.equal("batch_size: expected a 32-bit integer >= 1, got 0", H.error_of(sta.forward_batch, { batch_size = 0 }))
  end)

  it("metadata rows hold windows", function()
    local md = sta.metadata(2)
    md:set_row(1, {{3, 3, 3}, {1, 5, 7}})
    assert.same({{3, 3, 3}, {1, 5, 7}}, md:row(1))
    assert.same({}, md:row(0))
    assert.equal("layer: expected 0..1, got 2", H.error_of(md.set_row, md, 2, {{3, 3, 3}}))
    assert.equal("windows[2]: expected 3 integers, got 2", H.error_of(md.set_row, md, 0, {{3, 3, 3}, {1, 1}}))
    assert.same({{3, 3, 3}, {1, 5, 7}}, md:row(1))
  end)
end)
