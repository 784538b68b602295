local sta = require "sta"
local H = require "helpers"

local canvas, tile = {6, 12, 12}, {2, 4, 4} -- grid 3x3x3
local S = 6 * 12 * 12
local cands = {{1, 1, 1}, {1, 3, 3}, {3, 3, 3}} -- full last; fewer than the heads

describe("sta mask search", function()
  after_each(H.cleanup)

  it("runs every candidate, returns the full output, records L1/L2", function()
    local heads, D = 4, 8
    local layers = 2
    local md = sta.metadata.search(layers, cands)
    local fb = sta.forward_batch{}
    local ls = {}
    for l = 0, layers - 1 do
      ls[l] = sta.layer{ layer = l, heads = heads, head_dim = D, canvas = canvas, tile = tile }
    end
    for step = 0, 1 do
      for _, negative in ipairs{ false, true } do
        fb:negative(negative)
        local ctx <close> = sta.forward_context{ step = step, metadata = md, batch = fb }
        for l = 0, layers - 1 do
          local q, k, v = H.randn({1, S, heads, D}), H.randn({1, S, heads, D}), H.randn({1, S, heads, D})
          local out = ls[l]:forward(q, k, v)
          local full = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {3, 3, 3} })
          local _, rel = out:compare(full)
          assert.is_true(rel < 1e-6)
          if step == 1 and l == 1 and not negative then
            local small = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 1, 1} })
            local l1, l2 = sta.head_diff(small, full)
            ls.expect = { l1 = l1, l2 = l2 }
          end
        end
      end
    end
    assert.equal(4, fb:records(false))
    assert.equal(4, fb:records(true))
    local p = H.tmp(".json")
    assert.is_true(fb:save_search(p, false))
    local text = H.read(p)
    assert.truthy(text:find('"L2_loss"', 1, true))
    assert.truthy(text:find('"L1_loss"', 1, true))
    assert.truthy(text:find('"[1, 3, 3]"', 1, true))
    assert.falsy(text:find('"[3, 3, 3]"', 1, true))
    -- the recorded [1,1,1] loss of step 1, layer 1 matches head_diff
    local l2_111 = text:match('"L2_loss"%s*:%s*{.-"%[1, 1, 1%]"%s*:%s*(%b[])')
    assert.truthy(l2_111)
    local nums = {}
    for x in l2_111:gmatch("[-%d%.eE+]+") do nums[#nums + 1] = tonumber(x) end
    assert.equal(2 * 2 * 4, #nums) -- steps x layers x heads
    local got = nums[(1 * 2 + 1) * 4 + 1]
    assert.is_true(math.abs(got - ls.expect.l2[1]) <= 1e-5 * ls.expect.l2[1], got)
  end)

  it("refuses to save an empty list", function()
    local fb = sta.forward_batch{}
    assert.equal("search results: the positive list holds no records",
      H.error_of(fb.save_search, fb, H.tmp(".json"), false))
  end)
end)

describe("sta tuning", function()
  after_each(H.cleanup)

  -- two prompts of hand-made losses: steps 3, layers 1, heads 2
  local function prompt(path, scale)
    local fb = sta.forward_batch{}
    local c = {{1, 1, 1}, {1, 3, 3}, {3, 1, 1}}
    for step = 0, 2 do
      -- head 0 prefers candidate 1 ({1,1,1}); head 1 prefers candidate 3 (ties broken to the first)
      local l2 = { {0.1 * scale, 0.9}, {0.5, 0.4}, {0.7, 0.4} }
      fb:record{ step = step, layer = 0, candidates = c, l1 = l2, l2 = l2 }
    end
    assert(fb:save_search(path, false))
  end

  it("averages L2, keeps full windows early, breaks ties to the first", function()
    local a, b = H.tmp(".json"), H.tmp(".json")
    prompt(a, 1)
    prompt(b, 3)
    local s, report = sta.tune{ files = {a, b}, skip_steps = 1, full = {3, 3, 3} }
    assert.same({3, 3, 3}, s:get(0, 0, 0))
    assert.same({3, 3, 3}, s:get(0, 0, 1))
    for step = 1, 2 do
      assert.same({1, 1, 1}, s:get(step, 0, 0))
      assert.same({1, 3, 3}, s:get(step, 0, 1))
    end
    assert.equal(6, s:count())
    local expect = 1 - (2 * 27 + 2 * 1 + 2 * 9) / (6 * 27)
    assert.is_true(math.abs(report.sparsity - expect) < 1e-9, report.sparsity)
    local total = 0
    for i, w in ipairs(report.windows) do total = total + report.counts[i]; assert.equal(3, #w) end
    assert.equal(6, total)
  end)

  it("returns nil, message, code for a malformed or missing file", function()
    local p = H.tmp(".json")
    H.write(p, '{"L2_loss": {"[1, 1]": []}}')
    local s, msg, code = sta.tune{ files = {p}, skip_steps = 0 }
    assert.is_nil(s)
    assert.equal(sta.status.FORMAT, code)
    assert.truthy(msg:find(p, 1, true))
    s, msg, code = sta.tune{ files = {"/nonexistent/search.json"} }
    assert.is_nil(s)
    assert.truthy(code == sta.status.IO or code == sta.status.FORMAT)
    assert.equal("files: required (saved search files)", H.error_of(sta.tune, {}))
  end)
end)
