-- options_spec.lua -- the one option schema (lua/sta/options.lua): its
-- Python copies are current, and the Lua module raises exactly the schema's
-- message for every generated case (spec/option_cases.lua: every option of
-- every call x missing, wrong type, out of range, boundary).  The LuaJIT
-- FFI runs the same cases in ffi_spec.lua, Python in test_options.py.
local sta = require "sta"
local options = require "sta.options"
local H = require "helpers"
local cases = require("option_cases")(options)

local P = cases.problem

local function read(path)
  local f = assert(io.open(path, "r"))
  local s = f:read("a")
  f:close()
  return s
end

-- every call of the Lua module, by the schema's call name
local function harness()
  local shape = { 1, P.S, P.heads, P.D }
  local q, k, v = H.randn(shape), H.randn(shape), H.randn(shape)
  local dout = H.randn(shape)
  local out, lse = sta.attention(q, k, v, { canvas = P.canvas, tile = P.tile, window = { 1, 1, 1 },
                                            lse = true })
  local f8 = {}
  for i, x in ipairs{ q, k, v } do
    f8[i] = sta.tensor(shape, { dtype = "f8e4m3" })
    f8[i]:copy(x)
  end
  local rs = sta.tensor({ 1, P.heads, P.S })
  rs:fill(0.5)
  local cs = sta.tensor({ 1, P.heads, P.D })
  cs:fill(0.5)
  local cshape = { 1, P.vsa_rows, P.heads, P.D } -- the cube order of the vsa base's canvas
  local qc, kc, vc, gc = H.randn(cshape), H.randn(cshape), H.randn(cshape), H.randn(cshape)
  local cout, clse = sta.vsa(qc, kc, vc, { canvas = { 4, 4, 8 }, topk = 1, lse = true })
  local x = H.randn({ 1, 2 * 4 * 4, P.heads, P.D })
  return {
    block_sparse = function(o) return sta.block_sparse(q, k, v, o) end,
    block_sparse_backward = function(o) return sta.block_sparse_backward(q, k, v, out, lse, dout, o) end,
    vsa = function(o) return sta.vsa(qc, kc, vc, o) end,
    vsa_backward = function(o) return sta.vsa_backward(qc, kc, vc, cout, clse, gc, o) end,
    vsa_reference = function(o) return sta.vsa_reference(qc, kc, vc, o) end,
    vsa_backward_reference = function(o)
      return sta.vsa_backward_reference(qc, kc, vc, cout, clse, gc, o)
    end,
    vsa_coarse = function(o) return sta.vsa_coarse(qc, kc, vc, o) end,
    cubes = function(o) return sta.to_cubes(x, o) end,
    cube_sizes = function(o) return sta.cube_sizes(o) end,
    attention = function(o) return sta.attention(q, k, v, o) end,
    reference = function(o) return sta.reference(q, k, v, o) end,
    attention_backward = function(o) return sta.attention_backward(q, k, v, out, lse, dout, o) end,
    attention_fp8 = function(o) return sta.attention_fp8(f8[1], f8[2], f8[3], rs, rs, cs, o) end,
    layer = function(o) return sta.layer(o) end,
    forward_batch = function(o) return sta.forward_batch(o) end,
    forward_context = function(o) local c = sta.forward_context(o); c:pop() end,
    uniform = function(o) return sta.strategy.uniform(o) end,
    geometry = function(o) return sta.geometry(o) end,
    tune = function(o) return sta.tune(o) end,
  }
end

describe("the option schema", function()
  it("has current Python copies (python/sta/_options.py, python/tests/option_cases.py)", function()
    assert.equal(options.python_source(), read("python/sta/_options.py"))
    assert.equal(cases.python_source(), read("python/tests/option_cases.py"))
  end)

  it("gives every binding's call a known option list, and every option a kind", function()
    for call, list in pairs(options.calls) do
      for _, n in ipairs(list) do
        local name = n:gsub("[?!]$", "")
        assert.truthy(options.options[name], call .. ": " .. name)
      end
    end
    for name, def in pairs(options.options) do
      assert.truthy(options.expected(def) ~= def.kind or def.kind == "output", name)
    end
  end)

  it("is what the Lua module checks: every generated case, the schema's exact message", function()
    local run = harness()
    local n, refused, accepted = 0, 0, 0
    for _, c in ipairs(cases.list("lua")) do
      local ok, err = pcall(run[c.call], c.opts)
      local msg = not ok and err or nil
      assert(cases.agrees(c, msg), ("%s %s %s %s: expected %s, got %s"):format(c.call, c.option,
        c.what, options.show(c.value), tostring(c.expect or "no schema error"), tostring(msg)))
      n = n + 1
      if c.expect then refused = refused + 1 elseif ok then accepted = accepted + 1 end
    end
    assert.is_true(n > 400 and refused > 300 and accepted > 50, ("%d cases, %d refused, %d ran")
      :format(n, refused, accepted))
  end)

  it("takes both spellings of triples and window lists, in calls and in the examples' flags", function()
    local cli = require "sta.cli"
    assert.same({ 30, 48, 80 }, cli.triple("30x48x80", "--canvas"))
    assert.same({ 30, 48, 80 }, cli.triple("30,48,80", "--canvas"))
    assert.same({ { 3, 3, 3 }, { 1, 5, 7 } }, cli.windows("3,3,3:1,5,7", "--window"))
    assert.same({ { 3, 3, 3 }, { 1, 5, 7 } }, cli.windows("3x3x3,1x5x7", "--window"))
    assert.same({ { 3, 3, 3 } }, cli.windows("3x3x3", "--window"))
    assert.equal("--canvas: expected 3 integers ({a, b, c}, 'axbxc' or 'a,b,c'), got '30x48'",
      H.error_of(cli.triple, "30x48", "--canvas"))
    local run = harness()
    local a = run.attention({ canvas = "2x4x4", tile = "1,2,2", window = "1,1,1:1,3,1" })
    local b = run.attention({ canvas = P.canvas, tile = P.tile, window = { { 1, 1, 1 }, { 1, 3, 1 } } })
    local c = run.attention({ canvas = "2,4,4", tile = "1x2x2", window = "1x1x1,1x3x1" })
    assert.equal(0, (a:compare(b)))
    assert.equal(0, (c:compare(b)))
  end)

  it("never depends on earlier calls: a refused value is refused after a good one", function()
    local run = harness()
    local o = { canvas = P.canvas, tile = P.tile, window = { 1, 1, 1 } }
    assert.truthy(run.attention(o))
    o.window = { 1, 1, 1.5 }
    assert.equal("window[3]: expected a 32-bit integer, got 1.5", H.error_of(run.attention, o))
    o.window = "1x1x1"
    assert.truthy(run.attention(o))
    o.window = { true, 1, 1 }
    assert.equal("window[1]: expected a 32-bit integer, got true", H.error_of(run.attention, o))
  end)
end)
