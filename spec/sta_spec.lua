-- The sta module as a whole: its one public surface and its one error policy.
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

  -- the tile defaults to the core's 6x8x8; the window has no default (a
  -- silent 3x3x3 once hid typos such as windows=), as in sta-run
  it("takes the tile from the core and requires a window", function()
    local g = sta.geometry { canvas = { 12, 16, 16 } }
    assert.same({ 6, 8, 8 }, g.tile)
    assert.equal("window: required ({Kt, Kh, Kw} for every head, or a list of them, one per head)",
      H.error_of(sta.strategy.uniform, { steps = 1, layers = 1, heads = 1 }))
    local q = H.randn({ 1, 12 * 16 * 16, 1, 8 })
    assert.equal("window: required ({Kt, Kh, Kw} for every head, or a list of them, one per head)",
      H.error_of(sta.attention, q, q, q, { canvas = { 12, 16, 16 }, tile = { 6, 4, 4 } }))
    assert.equal("options: unknown key 'windows' (known: canvas, tile, text_len, order, layout, "
      .. "window, scale, softmax, precision, deterministic, geometry, out, lse)",
      H.error_of(sta.attention, q, q, q, { canvas = { 12, 16, 16 }, windows = { 1, 1, 1 } }))
    local o3 = sta.attention(q, q, q, { canvas = { 12, 16, 16 }, tile = { 6, 4, 4 }, window = { 3, 3, 3 } })
    local o1 = sta.attention(q, q, q, { canvas = { 12, 16, 16 }, tile = { 6, 4, 4 }, window = { 1, 1, 1 } })
    assert.is_true(o3:compare(o1) > 0)
  end)

  -- misuse raises; failures of the environment return nil, message, code
  local function environment(code)
    return code >= 400 and code ~= sta.status.ENV
  end

  it("raises misuse and returns nil, message, code for the environment, by status group", function()
    for name, code in pairs(sta.status) do
      if code ~= sta.status.OK then
        local ok, a, b, c = pcall(sta.debug.fail, code, "failed: " .. name)
        if environment(code) then
          assert.is_true(ok, name)
          assert.same({ nil, "failed: " .. name, code }, { a, b, c }, name)
        else
          assert.is_false(ok, name)
          assert.equal("failed: " .. name, a)
        end
      end
    end
    assert.is_false(environment(sta.status.UNSUPPORTED))
    assert.is_true(environment(sta.status.DEVICE))
  end)

  it("applies the policy on real calls, one status of each group", function()
    -- 100: an argument
    assert.equal("window: K = 2 is even and smaller than 4 tiles", H.error_of(sta.window_range, 0, 2, 4))
    -- 200: the state
    local layer = sta.layer { layer = 0, heads = 1, head_dim = 8, canvas = { 4, 8, 8 }, tile = { 2, 4, 4 } }
    local q = H.randn({ 1, 256, 1, 8 })
    assert.equal("STA forward called outside a forward context (no context is live)",
      H.error_of(layer.forward, layer, q, q, q))
    -- 300: unsupported, STA.md section 9
    assert.equal("seq_len 1234 not supported for STA", H.error_of(sta.geometry_from_seq_len, 1234))
    if not sta.backend_available("cuda") then
      -- STA.md's text, then why (the probe's reason)
      assert.matches("^st attn not supported %(cuda: .+%)$", H.error_of(sta.tensor, { 2 }, { device = "cuda" }))
    end
    -- 400: host memory
    sta.debug.fault_arm(1)
    local ok, none, msg, code = pcall(sta.strategy.new)
    sta.debug.fault_arm(0)
    assert.is_true(ok)
    assert.same({ nil, "out of host memory (mask strategy)", sta.status.NOMEM }, { none, msg, code })
    -- 500: no device fails on purpose here; sta.debug.fail pins the group above
    -- 600: a file
    none, msg, code = sta.strategy.load("/nonexistent/dir/s.json")
    assert.is_nil(none)
    assert.equal('mask strategy: cannot open "/nonexistent/dir/s.json": No such file or directory', msg)
    assert.equal(sta.status.IO, code)
    -- STA_ERR_ENV, in the 600 group, raises: STA.md section 9
    if not (os.getenv("STA_ATTENTION_CONFIG") or os.getenv("SGLANG_DIFFUSION_ATTENTION_CONFIG")
        or os.getenv("FASTVIDEO_ATTENTION_CONFIG")) then
      assert.equal("STA_ATTENTION_CONFIG is not set", H.error_of(sta.strategy.default))
    end
  end)
end)
