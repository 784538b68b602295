-- reliability_spec.lua -- memory stays flat over many create/drop cycles,
-- errors inside <close> forward contexts leave the context stack as it was,
-- and injected allocation failures reach Lua as clean errors.
local sta = require "sta"
local H = require "helpers"

local canvas, tile = {4, 6, 6}, {2, 3, 3} -- grid 2x2x2, 144 video tokens
local S = 144 + 5

-- RSS in KiB from /proc/self/statm (nil where there is none).  Under ASan
-- (quarantine) or valgrind RSS says nothing about leaks: those runs check
-- the Lua heap and the live tensor count only.
local function rss_kib()
  local f = io.open("/proc/self/statm")
  if not f then return nil end
  local _, res = f:read("n", "n")
  f:close()
  return res * 4
end
local rss_meaningful = not (os.getenv("LD_PRELOAD") or ""):find("asan")
  and os.getenv("STA_RSS_CHECK") ~= "0"

local function qkv(heads, D)
  local shape = {1, S, heads, D}
  return H.randn(shape), H.randn(shape), H.randn(shape)
end

-- One pipeline step's worth of objects, some released by hand, the rest
-- left to the collector.
local function cycle(i)
  local heads, D = 3, 8
  local q, k, v = qkv(heads, D)
  local s = sta.strategy.uniform{ steps = 2, layers = 2, heads = heads, window = {1, 1, 1} }
  local json = s:to_json()
  local s2 = sta.strategy.parse(json)
  assert(s2:count() == s:count())
  local md = sta.metadata.search and i % 2 == 0
    and sta.metadata.search(2, { {1, 1, 1}, {3, 3, 3} })
    or sta.metadata.from_strategy(s, i % 2, 2, heads)
  local fb = sta.forward_batch{ batch_size = 1 }
  local layer = sta.layer{ layer = 1, heads = heads, head_dim = D, canvas = canvas, tile = tile }
  do
    local ctx <close> = sta.forward_context{ step = i % 2, metadata = md, batch = fb }
    local out = layer:forward(q, k, v)
    assert(out:shape()[2] == S)
    if i % 3 == 0 then out:release() end
  end
  local a = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 3, 1} })
  a:release()
  if i % 2 == 1 then q:release(); s:release() end
end

local function settle()
  for _ = 1, 3 do collectgarbage("collect") end
end

describe("sta reliability", function()
  it("keeps memory flat over many create/drop cycles", function()
    for i = 1, 20 do cycle(i) end -- warm up pools, arenas and caches
    settle()
    local live0, lua0 = sta.debug.live_tensors(), collectgarbage("count")
    local n, rss = 50, {}
    for w = 1, 2 do -- two equal windows: growth in the second is a leak
      for i = 1, n do cycle(i) end
      settle()
      rss[w] = rss_kib()
    end
    local live1, lua1 = sta.debug.live_tensors(), collectgarbage("count")
    assert.equal(live0, live1)
    -- a leak of one small Lua object per cycle would show as >= 100 * 64 B
    assert.is_true(lua1 - lua0 < 48, ("Lua heap grew %.1f KiB over %d cycles"):format(lua1 - lua0, 2 * n))
    if rss_meaningful and rss[1] then
      -- one leaked tensor per cycle would be ~14 KiB x 50 plus the rest of
      -- the cycle; malloc's own noise stays well below 2 MiB
      assert.is_true(rss[2] - rss[1] < 2048,
        ("RSS grew %d KiB over the second %d cycles"):format(rss[2] - rss[1], n))
    end
  end)

  it("leaves the context depth as it was when a step errors inside <close> contexts", function()
    local d0 = sta.context_depth()
    local layer = sta.layer{ layer = 0, heads = 2, head_dim = 8, canvas = canvas, tile = tile }
    local md = sta.metadata.from_strategy(
      sta.strategy.uniform{ steps = 1, layers = 1, heads = 2, window = {1, 1, 1} }, 0, 1, 2)
    local q, k, v = qkv(2, 8)
    for round = 1, 30 do
      local ok, err = pcall(function()
        local outer <close> = sta.forward_context{ step = 0, metadata = md, batch = sta.forward_batch{} }
        local out = layer:forward(q, k, v)
        local inner <close> = sta.forward_context{ step = 0, metadata = md, batch = sta.forward_batch{} }
        assert(sta.context_depth() == d0 + 2)
        if round % 3 == 0 then
          -- sta itself raises: a wrong head count
          local bad = H.randn({1, S, 3, 8})
          layer:forward(bad, bad, bad)
        elseif round % 3 == 1 then
          error({ step = round }) -- a non-string error value
        else
          out:get({1, S + 1, 1, 1}) -- an index error from the binding
        end
      end)
      assert.is_false(ok)
      assert.is_not_nil(err)
      assert.equal(d0, sta.context_depth())
      assert.is_nil(sta.current_context())
    end
    -- a coroutine closed while suspended inside a context pops it too
    local co = coroutine.create(function()
      local ctx <close> = sta.forward_context{ step = 0, metadata = md, batch = sta.forward_batch{} }
      coroutine.yield(sta.context_depth())
      error("never reached")
    end)
    local ok, depth = coroutine.resume(co)
    assert.is_true(ok)
    assert.equal(d0 + 1, depth)
    assert.is_true(coroutine.close(co))
    assert.equal(d0, sta.context_depth())
  end)

  it("turns every injected allocation failure into a clean error", function()
    local json = sta.strategy.uniform{ steps = 2, layers = 2, heads = 3, window = {3, 3, 3} }:to_json()
    local shape = {1, S, 2, 8}
    local q, k, v = H.randn(shape), H.randn(shape), H.randn(shape)
    settle()
    local live0 = sta.debug.live_tensors()
    local ops = {
      parse = function() return sta.strategy.parse(json) end,
      attention = function() return sta.attention(q, k, v, { canvas = canvas, tile = tile, window = {1, 1, 1} }) end,
      randn = function() return sta.randn({3, 5}, { seed = 4 }) end,
    }
    for name, op in pairs(ops) do
      local failures, i = 0, 1
      while true do
        sta.debug.fault_arm(i)
        local ok, r, msg = pcall(op)
        sta.debug.fault_arm(0)
        if ok and r then break end -- past the last allocation site: success
        failures = failures + 1
        local text = ok and msg or r
        assert.is_truthy(tostring(text):find("out of host memory", 1, true),
          ("%s, fault %d: %s"):format(name, i, tostring(text)))
        i = i + 1
        assert.is_true(i < 5000, name .. ": never succeeded")
      end
      assert.is_true(failures > 0, name .. ": no allocation site was hit")
    end
    settle()
    assert.equal(live0, sta.debug.live_tensors())
    assert.equal(0, sta.context_depth())
  end)
end)
