-- The sta module as a whole: its one public surface.
local sta = require "sta"
local H = require "helpers"

describe("sta", function()
  it("has one name for each function", function()
    for _, name in ipairs({ "strategy_new", "strategy_parse", "strategy_load", "strategy_default",
      "strategy_uniform", "metadata_from_strategy", "metadata_search", "live_tensors",
      "fault_arm", "last_error" }) do
      assert.is_nil(sta[name], name)
      assert.is_nil(sta.core[name], name)
    end
    assert.equal(sta.core.strategy, sta.strategy)
    assert.equal(sta.core.metadata, sta.metadata)
    assert.equal(sta.core.debug, sta.debug)
    assert.is_nil(sta.debug.context_depth)
    assert.is_function(sta.context_depth)
    local t = H.randn({ 2 })
    assert.is_nil(t.free)
    local ctx = sta.forward_context { step = 0 }
    assert.is_nil(ctx.close)
    ctx:pop()
  end)

  it("reaches strategies, metadata and debug helpers through their tables", function()
    local s = sta.strategy.uniform { steps = 2, layers = 1, heads = 2, window = { 1, 3, 3 } }
    assert.same({ 1, 3, 3 }, s:get(1, 0, 1))
    assert.is_true(s == sta.strategy.parse(s:to_json()))
    assert.equal(0, sta.strategy.new():count())
    local md = sta.metadata(3)
    assert.equal("sta.Metadata(3 layers)", tostring(md))
    assert.equal("sta.Metadata(2 layers)", tostring(sta.metadata.new(2)))
    assert.same({ { 1, 3, 3 }, { 1, 3, 3 } }, sta.metadata.from_strategy(s, 1, 1, 2):row(0))
    assert.same({ { 1, 1, 1 }, { 3, 3, 3 } }, sta.metadata.search(2, { { 1, 1, 1 }, { 3, 3, 3 } }):row(1))
    local n = sta.debug.live_tensors()
    local t = H.randn({ 3 })
    assert.equal(n + 1, sta.debug.live_tensors())
    t:release()
    assert.equal(n, sta.debug.live_tensors())
  end)
end)
