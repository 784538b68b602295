-- hardening_spec.lua -- the hardening of handles and calls through the Lua
-- binding: released handles a context or layer still holds, forward contexts
-- per coroutine and contexts collected without <close>, no silent integer
-- truncation, unknown option keys and the omitted window, Ctrl-C and
-- printing in the REPL; then random API sequences with random garbage
-- collection.
local sta = require "sta"
local H = require "helpers"

local canvas, tile = { 2, 4, 4 }, { 1, 2, 2 } -- grid 2x2x2, 32 video tokens
local S, HEADS, D = 32 + 2, 2, 8

local function qkv()
  return H.randn({ 1, S, HEADS, D }), H.randn({ 1, S, HEADS, D }), H.randn({ 1, S, HEADS, D })
end

local function layer(strategy)
  return sta.layer{ layer = 0, heads = HEADS, head_dim = D, canvas = canvas, tile = tile,
                    strategy = strategy }
end

-- out must be the forward with window w on every head
local function expect_window(q, k, v, out, w)
  local ref = sta.attention(q, k, v, { canvas = canvas, tile = tile, window = w })
  assert.equal(0, (out:compare(ref)))
end

describe("hardening through Lua", function()
  it("a context keeps its released metadata; a layer its released strategy", function()
    local q, k, v = qkv()
    local s = sta.strategy.uniform{ steps = 2, layers = 1, heads = HEADS, window = { 1, 3, 1 } }
    local fb = sta.forward_batch{}
    local md = sta.metadata.from_strategy(s, 0, 1, HEADS)
    local l = layer(nil)
    do
      local ctx <close> = sta.forward_context{ step = 0, batch = fb, metadata = md }
      md:release()
      H.full_gc()
      local other = sta.metadata.from_strategy( -- would take freed memory
        sta.strategy.uniform{ steps = 1, layers = 1, heads = HEADS, window = { 3, 1, 3 } }, 0, 1, HEADS)
      expect_window(q, k, v, l:forward(q, k, v), { 1, 3, 1 })
      other:release()
    end
    assert.equal("metadata: released", H.error_of(md.row, md, 0))
    local l2 = layer(s)
    s:release()
    H.full_gc()
    local ctx <close> = sta.forward_context{ step = 1, batch = fb }
    expect_window(q, k, v, l2:forward(q, k, v), { 1, 3, 1 })
    assert.equal("strategy: released", H.error_of(s.get, s, 0, 0, 0))
  end)

  it("gives every coroutine its own innermost context", function()
    local q, k, v = qkv()
    local s = sta.strategy.uniform{ steps = 3, layers = 1, heads = HEADS, window = { 1, 1, 1 } }
    s:set(1, 0, 0, { 3, 3, 3 }); s:set(1, 0, 1, { 3, 3, 3 })
    local l, fb = layer(s), sta.forward_batch{}
    local d0 = sta.context_depth()
    local co = coroutine.create(function()
      local mine <close> = sta.forward_context{ step = 1, batch = fb }
      coroutine.yield(sta.context_depth())
      expect_window(q, k, v, l:forward(q, k, v), { 3, 3, 3 }) -- its own step 1
      coroutine.yield(sta.current_context():step())
    end)
    assert.is_true(select(2, coroutine.resume(co)) == 1)
    do
      local outer <close> = sta.forward_context{ step = 0, batch = fb }
      assert.equal(d0 + 1, sta.context_depth())
      local ok, step = coroutine.resume(co)
      assert.is_true(ok, step)
      assert.equal(1, step)
      expect_window(q, k, v, l:forward(q, k, v), { 1, 1, 1 }) -- main's step 0
      assert.is_true(coroutine.resume(co)) -- closes the coroutine's context
      assert.equal("dead", coroutine.status(co))
      assert.equal(outer, sta.current_context())
      -- a coroutine with no context of its own sees the main one's
      local seen = coroutine.wrap(function() return sta.current_context():step(), sta.in_forward_pass() end)
      assert.same({ 0, true }, { seen() })
    end
    assert.equal(d0, sta.context_depth())
    assert.is_false(sta.in_forward_pass())
  end)

  it("pops a context collected without <close>; the next forward names the leak", function()
    local q, k, v = qkv()
    local l = layer(sta.strategy.uniform{ steps = 8, layers = 1, heads = HEADS, window = { 1, 1, 1 } })
    local d0 = sta.context_depth()
    do local c = sta.forward_context{ step = 7, batch = sta.forward_batch{} } end -- no <close>
    H.full_gc()
    assert.equal(d0, sta.context_depth())
    assert.is_nil(sta.current_context())
    assert.equal("forward context: the context of step 7 (level 1) was garbage-collected without being "
      .. "closed; it has been popped (open contexts with `local ctx <close> = sta.forward_context{...}`)",
      H.error_of(l.forward, l, q, k, v))
    -- reported once; after it the stack is clean
    assert.equal("STA forward called outside a forward context (no context is live)",
      H.error_of(l.forward, l, q, k, v))
  end)

  it("refuses integers that do not fit 32 bits", function()
    local s = sta.strategy.uniform{ steps = 2, layers = 1, heads = 1, window = { 1, 1, 1 } }
    assert.equal("step: expected a 32-bit integer, got 4294967296", H.error_of(s.get, s, 2 ^ 32, 0, 0))
    local n = sta.strategy.new()
    assert.equal("step: expected a 32-bit integer, got 4294967297",
      H.error_of(n.set, n, math.tointeger(2 ^ 32 + 1), 0, 0, { 3, 3, 3 }))
    assert.equal(0, n:count())
    assert.equal("window[2]: expected a 32-bit integer, got 4294967299",
      H.error_of(n.set, n, 0, 0, 0, { 1, 2 ^ 32 + 3, 1 }))
    assert.equal("layers: expected a 32-bit integer, got -2147483649",
      H.error_of(sta.metadata, -2 ^ 31 - 1))
    assert.equal("heads: expected a 32-bit integer >= 1, got 1099511627776",
      H.error_of(sta.strategy.uniform, { steps = 1, layers = 1, heads = 2 ^ 40, window = { 1, 1, 1 } }))
    assert.equal("step: expected an integer, got 0.5", H.error_of(s.get, s, 0.5, 0, 0))
  end)

  it("raises on an unknown option key and on an omitted window", function()
    local q = H.randn({ 1, S, HEADS, D })
    assert.equal("options: unknown key 'windows' (known: canvas, tile, text_len, order, layout, "
      .. "window, scale, softmax, precision, deterministic, geometry, out, lse)",
      H.error_of(sta.attention, q, q, q, { canvas = canvas, tile = tile, windows = { 1, 1, 1 } }))
    assert.equal("window: required ({Kt, Kh, Kw} for every head, or a list of them, one per head)",
      H.error_of(sta.attention, q, q, q, { canvas = canvas, tile = tile }))
    assert.equal("options: unknown key 'stepp' (known: step, metadata, batch, strategy, layers, heads)",
      H.error_of(sta.forward_context, { stepp = 1 }))
    assert.equal("options: unknown key 'sed' (known: seed, dtype, device, mean, std)",
      H.error_of(sta.randn, { 2 }, { sed = 1 }))
    assert.equal("options: unknown key 'head' (known: prefix, layer, heads, head_dim, sp_rank, sp_size, "
      .. "canvas, tile, text_len, order, layout, geometry, device, scale, softmax, precision, strategy, "
      .. "mode, cube, dense_steps)",
      H.error_of(sta.layer, { head = 2 }))
    assert.equal("options: unknown key 'window_size' (known: steps, layers, heads, window, full, full_steps)",
      H.error_of(sta.strategy.uniform, { steps = 1, layers = 1, heads = 1, window_size = { 1, 1, 1 } }))
    local comm = sta.dist.loopback(1)[1]
    assert.equal("options: unknown key 'windows' (known: canvas, tile, text_len, geometry, window, layout, "
      .. "scale, out)", H.error_of(comm.attention, comm, q, q, q, { canvas = canvas, windows = { 1, 1, 1 } }))
    assert.equal("options: unknown key 'head' (known: prefix, layer, heads, head_dim, canvas, tile, "
      .. "text_len, layout, geometry, device, scale, softmax, precision, strategy)",
      H.error_of(sta.dist.layer, comm, { canvas = canvas, heads = 2, head = 2 }))
  end)

  it("prints totable and stats readably", function()
    local t = sta.from_table({ 1, 2.5, -3 }, { 3 })
    assert.equal("{1, 2.5, -3}", tostring(t:totable()))
    assert.equal("{mean=0.166667, std=2.3214, min=-3, max=2.5, nonfinite=0}", tostring(t:stats()))
    assert.same({ 1, 2.5, -3 }, t:totable())
  end)

  it("cancels a long call: sta.cancel, and Ctrl-C in the REPL", function()
    local q = H.randn({ 1, S, HEADS, D })
    local o = { canvas = canvas, tile = tile, window = { 1, 1, 1 } }
    sta.cancel()
    assert.is_true(sta.cancelled())
    assert.equal("attention: cancelled (sta_cancel) before it finished; no output was changed",
      H.error_of(sta.attention, q, q, q, o))
    sta.cancel_clear()
    assert.truthy(sta.attention(q, q, q, o))
    -- the REPL: SIGINT one second into a forward of several seconds.  The
    -- REPL says when its inputs are made (a marker file): a SIGINT sent
    -- while the interpreter still starts (slow under ASan on a loaded
    -- machine) would be lost, the shell starting it in the background with
    -- SIGINT ignored until lua.c's first call installs its handler.
    local script, marker = H.tmp(".sh"), H.tmp(".ready")
    H.write(script, ([[
      { printf 'q = sta.randn({1, 96*16*16, 8, 64}, {seed = 1}); o = {canvas = {96, 16, 16}, window = {99, 99, 99}}; io.open("%s", "w"):close()\n'
        printf 't0 = sta.now(); sta.attention(q, q, q, o)\n'
        sleep 4; printf 'print("after", sta.cancelled(), sta.now() - t0)\n'; } | scripts/sta-repl &
      pid=$!
      for i in $(seq 300); do [ -e '%s' ] && break; sleep 0.2; done
      sleep 1
      kill -INT $pid
      rm -f '%s'
      wait $pid
    ]]):format(marker, marker, marker))
    local out = H.sh("bash " .. H.quote(script))
    -- the call stops at its next work item; lua.c's own handler (chained)
    -- then reports "interrupted!", or the binding's cancel error comes first
    assert.truthy(out:find("interrupted!", 1, true) or
      out:find("attention: cancelled (sta_cancel) before it finished; no output was changed", 1, true), out)
    local cancelled, took = out:match("after\t(%a+)\t([%d.]+)")
    assert.equal("false", cancelled, out) -- cleared for the next line
    assert.is_true(tonumber(took) < 5, out) -- uninterrupted, the forward alone takes ~6 s
  end)
end)

-- Random sequences of calls, with and without <close>, releases in any
-- order, coroutines that yield inside contexts, and collections at random
-- points: nothing may crash, every error is a message, and at the end the
-- live tensors and the context depth are back where they were.
describe("random API sequences with garbage collection", function()
  it("survives 3000 random calls", function()
    local seed = H.seed()
    local rng = (function(x) return function(n) x = (x * 1103515245 + 12345) % 2147483648; return x % n end end)(seed)
    H.full_gc()
    local live0, d0 = sta.debug.live_tensors(), sta.context_depth()
    local pool = { t = {}, s = {}, m = {}, b = {}, l = {}, c = {}, co = {} }
    local function pick(list) return list[rng(#list + 1)] end -- may be nil
    local wins = { { 1, 1, 1 }, { 3, 1, 3 }, { 2, 2, 2 } }
    local ops = {
      function() pool.t[rng(4) + 1] = H.randn({ 1, S, HEADS, D }) end,
      function() local t = pick(pool.t); if t then t:release() end end,
      function() pool.s[rng(3) + 1] = sta.strategy.uniform{ steps = 2, layers = 1, heads = HEADS, window = wins[rng(3) + 1] } end,
      function() local s = pick(pool.s); if s then s:release() end end,
      function() pool.m[rng(3) + 1] = sta.metadata.from_strategy(pick(pool.s), rng(2), 1, HEADS) end,
      function() pool.m[rng(3) + 1] = sta.metadata.search(1, { { 1, 1, 1 }, { 3, 3, 3 } }) end,
      function() local m = pick(pool.m); if m then m:release() end end,
      function() pool.b[rng(2) + 1] = sta.forward_batch{} end,
      function() local b = pick(pool.b); if b then b:release() end end,
      function() pool.l[rng(2) + 1] = layer(pick(pool.s)) end,
      function() local l = pick(pool.l); if l then l:set_strategy(pick(pool.s)) end end,
      function() local l = pick(pool.l); if l then l:release() end end,
      function() -- a context kept in the pool, popped later or collected
        pool.c[rng(3) + 1] = sta.forward_context{ step = rng(2), metadata = pick(pool.m), batch = pick(pool.b) }
      end,
      function() local c = pick(pool.c); if c then c:pop() end end,
      function() -- a scoped context and a forward inside it
        local ctx <close> = sta.forward_context{ step = rng(2), metadata = pick(pool.m), batch = pick(pool.b) }
        local l = pick(pool.l)
        if l then l:forward(pick(pool.t), pick(pool.t), pick(pool.t)) end
      end,
      function() local l = pick(pool.l); if l then l:forward(pick(pool.t), pick(pool.t), pick(pool.t)) end end,
      function() sta.attention(pick(pool.t), pick(pool.t), pick(pool.t), { canvas = canvas, tile = tile, window = wins[rng(3) + 1] }) end,
      function() -- a coroutine that yields inside a context, resumed or abandoned later
        local co = coroutine.create(function()
          local ctx <close> = sta.forward_context{ step = 0, batch = sta.forward_batch{} }
          coroutine.yield()
          local l = pick(pool.l)
          if l then l:forward(pick(pool.t), pick(pool.t), pick(pool.t)) end
        end)
        coroutine.resume(co)
        pool.co[rng(3) + 1] = co
      end,
      function() local co = pick(pool.co); if co and coroutine.status(co) == "suspended" then coroutine.resume(co) end end,
      function() local co = pick(pool.co); if co then coroutine.close(co) end end,
      function() for k in pairs(pool) do pool[k][rng(4) + 1] = nil end end, -- forget some
      function() collectgarbage("step", rng(64)) end,
      function() if rng(8) == 0 then collectgarbage() end end,
    }
    local errors = 0
    for _ = 1, 3000 do
      local ok, err = pcall(ops[rng(#ops) + 1])
      if not ok then
        errors = errors + 1
        assert(type(err) == "string" and #err > 0, tostring(err))
        assert(not err:find("traceback", 1, true), err)
      end
    end
    -- unwind: coroutines closed, every context popped or forgotten, then collected
    for _, co in pairs(pool.co) do coroutine.close(co) end
    for _, c in pairs(pool.c) do pcall(c.pop, c) end
    for k in pairs(pool) do pool[k] = {} end
    H.full_gc()
    H.full_gc()
    -- forgotten contexts: the next forward reports them and they are gone
    do
      local q, l = H.randn({ 1, S, HEADS, D }), layer(nil)
      local _, leak = pcall(l.forward, l, q, q, q)
      assert.truthy(leak:find("garbage-collected", 1, true) or leak:find("outside a forward context", 1, true), leak)
    end
    H.full_gc()
    print(("# random API sequence: seed %d, 3000 calls, %d refused"):format(seed, errors))
    assert.equal(live0, sta.debug.live_tensors())
    assert.equal(d0, sta.context_depth())
  end)
end)
