local sta = require "sta"
local H = require "helpers"

local function random_strategy(steps, layers, heads, seed)
  local s = sta.strategy.new()
  local choices = {{3, 3, 3}, {1, 5, 7}, {3, 1, 9}, {1, 1, 1}, {5, 6, 10}}
  local x = seed
  for st = 0, steps - 1 do
    for l = 0, layers - 1 do
      for h = 0, heads - 1 do
        x = (x * 1103515245 + 12345) % 2147483648
        s:set(st, l, h, choices[x % #choices + 1])
      end
    end
  end
  return s
end

describe("sta mask strategies", function()
  after_each(H.cleanup)

  it("builds a uniform strategy with full first steps", function()
    local s = sta.strategy.uniform{ steps = 4, layers = 2, heads = 3, window = {3, 3, 3},
      full = {5, 6, 10}, full_steps = 1 }
    assert.equal(24, s:count())
    assert.equal(24, #s)
    assert.same({4, 2, 3}, { s:extent() })
    assert.same({5, 6, 10}, s:get(0, 1, 2))
    assert.same({3, 3, 3}, s:get(1, 0, 0))
    assert.same({3, 3, 3}, s:get(3, 1, 2))
    assert.is_true(s:check(4, 2, 3))
    assert.equal("sta.Strategy(24 entries, 4 steps x 2 layers x 3 heads)", tostring(s))
  end)

  it("computes sparsity against the full volume", function()
    local s = sta.strategy.uniform{ steps = 4, layers = 2, heads = 3, window = {3, 3, 3},
      full = {5, 6, 10}, full_steps = 1 }
    local grid = {5, 6, 10}
    local expect = 1 - (3 * 300 + 9 * 27) / (12 * 300)
    assert.is_true(math.abs(s:sparsity(grid) - expect) < 1e-12)
    local g = sta.geometry{ canvas = {30, 48, 80} }
    assert.equal(s:sparsity(grid), s:sparsity(g))
    -- windows larger than the grid are clamped: all full
    local f = sta.strategy.uniform{ steps = 1, layers = 1, heads = 1, window = {9, 9, 9} }
    assert.equal(0, f:sparsity{3, 3, 3})
  end)

  it("round-trips through JSON text and files", function()
    local s = random_strategy(3, 4, 5, H.seed())
    local json = s:to_json()
    assert.truthy(json:find('"0_0_0"', 1, true))
    local back = assert(sta.strategy.parse(json))
    assert.is_true(s:equal(back))
    assert.is_true(s == back)
    local p = H.tmp(".json")
    assert.is_true(s:save(p))
    local loaded = assert(sta.strategy.load(p))
    assert.is_true(loaded == s)
    loaded:set(2, 3, 4, {1, 1, 1})
    if s:get(2, 3, 4)[1] ~= 1 or s:get(2, 3, 4)[2] ~= 1 then
      assert.is_false(loaded == s)
    end
  end)

  it("reads FastVideo's format", function()
    local s = assert(sta.strategy.parse('{"14_3_7": [3, 3, 5], "0_0_0": [1, 6, 10]}'))
    assert.same({3, 3, 5}, s:get(14, 3, 7))
    assert.same({1, 6, 10}, s:get(0, 0, 0))
    assert.same({15, 4, 8}, { s:extent() })
  end)

  it("names the first bad key or value of a malformed file", function()
    local s, msg, code = sta.strategy.parse('{"0_0_0": [3, 3, 3], "1_x_0": [3, 3, 3]}')
    assert.is_nil(s)
    assert.equal(sta.status.FORMAT, code)
    assert.truthy(msg:find('key "1_x_0" is not "step_layer_head"', 1, true))
    s, msg = sta.strategy.parse('{"0_0_0": [3, 0, 3]}')
    assert.is_nil(s)
    assert.truthy(msg:find('"0_0_0": expected [Kt, Kh, Kw] of 3 positive integers', 1, true))
    s, msg, code = sta.strategy.load("/nonexistent/strategy.json")
    assert.is_nil(s)
    assert.equal(sta.status.IO, code)
    assert.truthy(msg:find("/nonexistent/strategy.json", 1, true))
  end)

  it("names a missing key, and changes nothing on a bad set", function()
    local s = sta.strategy.uniform{ steps = 2, layers = 2, heads = 2, window = {3, 3, 3} }
    assert.equal('mask strategy has no window for "5_0_1" (step 5, layer 0, head 1)',
      H.error_of(s.get, s, 5, 0, 1))
    assert.equal('mask strategy has no window for "2_0_0" (step 2, layer 0, head 0)',
      H.error_of(s.check, s, 3, 2, 2))
    local json = s:to_json()
    assert.has_error(function() s:set(0, 0, 0, {3, 0, 3}) end)
    assert.equal("window: expected 3 integers, got 2", H.error_of(s.set, s, 0, 0, 0, {3, 3}))
    assert.equal(json, s:to_json())
  end)

  it("raises STA_ATTENTION_CONFIG is not set, and loads the file it names", function()
    local code = [[
      local sta = require "sta"
      local ok, err = pcall(sta.strategy.default)
      io.write(ok and "loaded " .. sta.strategy.default():count() or err)
    ]]
    local unset = { STA_ATTENTION_CONFIG = false, SGLANG_DIFFUSION_ATTENTION_CONFIG = false,
      FASTVIDEO_ATTENTION_CONFIG = false }
    local out = H.run_lua(code, unset)
    assert.equal("STA_ATTENTION_CONFIG is not set", out)
    local p = H.tmp(".json")
    sta.strategy.uniform{ steps = 2, layers = 1, heads = 3, window = { 3, 3, 3 } }:save(p)
    unset.FASTVIDEO_ATTENTION_CONFIG = p
    assert.equal("loaded 6", H.run_lua(code, unset))
  end)
end)
