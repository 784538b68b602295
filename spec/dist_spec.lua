local sta = require "sta"
local dist = require "sta.dist"
local H = require "helpers"

-- Full problem [B, S, H, D] in layout; its shards on p ranks; SP on a
-- loopback world; the shards of the single-device output must match.
local function full_qkv(b, s, heads, d, layout, dtype)
  local shape = layout == "bhsd" and { b, heads, s, d } or { b, s, heads, d }
  local o = { dtype = dtype }
  return H.randn(shape, o), H.randn(shape, o), H.randn(shape, o)
end

local function shards(t, opts, p)
  local out = {}
  for r = 1, p do out[r] = dist.shard(t, opts, r - 1, p) end
  return out
end

local function check_sp(o, b, text, heads, d, ps)
  local c = o.canvas
  local v = c[1] * c[2] * c[3]
  local q, k, vv = full_qkv(b, v + text, heads, d, o.layout, o.dtype)
  local opts = {} -- the attention's options: all but dtype
  for key, val in pairs(o) do if key ~= "dtype" then opts[key] = val end end
  local ref = sta.attention(q, k, vv, opts)
  for _, p in ipairs(ps) do
    local comms = dist.loopback(p)
    -- every head chunk count of the pipeline (0: chosen per call)
    for n = 0, heads // p do
      if n == 0 or (heads // p) % n == 0 then
        for _, c in ipairs(comms) do assert.equal(c, c:set_chunks(n)) end
        assert.equal(n, comms[1]:chunks())
        local outs = dist.run_attention(comms, shards(q, opts, p), shards(k, opts, p),
          shards(vv, opts, p), opts)
        for r = 1, p do
          local want = dist.shard(ref, opts, r - 1, p)
          local mx = outs[r]:compare(want)
          assert.equal(0, mx, ("P=%d chunks %d rank %d: max |diff| %g"):format(p, n, r - 1, mx))
        end
        local mx = dist.unshard(outs, opts):compare(ref)
        assert.equal(0, mx)
      end
    end
  end
end

describe("sta.dist", function()
  after_each(H.cleanup)

  it("makes loopback worlds of communicators", function()
    local comms = dist.loopback(3)
    assert.equal(3, #comms)
    for r = 1, 3 do
      assert.equal(r - 1, comms[r]:rank())
      assert.equal(3, comms[r]:size())
      assert.equal("loopback", comms[r]:name())
    end
    assert.equal("sta.Comm(loopback, rank 1 of 3)", tostring(comms[2]))
    comms[2]:release()
    comms[2]:release() -- idempotent
    assert.equal("sta.Comm(released)", tostring(comms[2]))
    assert.equal("comm: released", H.error_of(comms[2].rank, comms[2]))
    assert.equal("comm: expected a communicator, got number", H.error_of(comms[1].rank, 42))
    assert.equal("layer: expected an SP layer, got table",
      H.error_of(debug.getregistry()["sta.SPLayer"].methods.index, {}))
    assert.equal("size: expected 1..64 ranks, got 0", H.error_of(dist.loopback, 0))
    assert.equal("size: expected 1..64 ranks, got 65", H.error_of(dist.loopback, 65))
  end)

  it("moves data in a world of one", function()
    local c = dist.loopback(1)[1]
    assert.is_true(c:barrier())
    local send = H.randn({ 6 })
    local recv = sta.zeros({ 6 }, { value = 7 })
    c:all_to_all(send, recv)
    assert.is_true(H.same_values(send, recv))
    local g = sta.zeros({ 6 }, { value = 3 })
    c:all_gather(H.randn({ 6 }), g)
    assert.is_false(H.same_values(g, sta.zeros({ 6 }, { value = 3 })))
    local before = recv:clone()
    assert.equal("send: 5 elements are not divisible by the 2 ranks",
      H.error_of(dist.loopback(2)[1].all_to_all, dist.loopback(2)[1], H.randn({ 5 }), H.randn({ 5 })))
    assert.equal("recv: 5 elements, expected send's 6", H.error_of(c.all_to_all, c, send, H.randn({ 5 })))
    assert.is_true(H.same_values(recv, before))
  end)

  it("equals single-device STA with per-head windows, no text, P = 1..4", function()
    check_sp({ canvas = { 4, 6, 6 }, tile = { 2, 3, 3 },
      window = { { 1, 1, 1 }, { 3, 1, 3 }, { 1, 3, 1 }, { 3, 3, 3 }, { 1, 1, 3 }, { 3, 1, 1 },
        { 1, 1, 1 }, { 3, 3, 1 }, { 1, 3, 3 }, { 3, 3, 3 }, { 1, 1, 1 }, { 3, 1, 3 } } },
      1, 0, 12, 8, { 1, 2, 3, 4 })
  end)

  it("equals single-device STA with text rows and padding", function()
    check_sp({ canvas = { 4, 4, 6 }, tile = { 2, 2, 3 }, text_len = 3,
      window = { { 1, 1, 1 }, { 3, 3, 3 }, { 1, 3, 1 }, { 3, 1, 3 } } },
      2, 6, 4, 8, { 1, 2, 4 })
  end)

  it("equals single-device STA on an odd canvas with partial tiles", function()
    check_sp({ canvas = { 3, 5, 7 }, tile = { 2, 2, 3 }, window = { 1, 3, 1 } },
      1, 4, 6, 8, { 1, 3 })
  end)

  it("equals single-device STA in BHSD, bf16", function()
    check_sp({ canvas = { 2, 8, 8 }, tile = { 1, 4, 4 }, window = { 1, 1, 1 }, layout = "bhsd",
      dtype = "bf16" }, 1, 5, 4, 16, { 1, 2, 4 })
  end)

  it("runs SP attention on one rank through comm:attention", function()
    local opts = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, window = { 1, 1, 1 } }
    local q, k, v = full_qkv(1, 32 + 2, 2, 8)
    local c = dist.loopback(1)[1]
    local out = c:attention(q, k, v, opts)
    assert.equal(0, (out:compare(sta.attention(q, k, v, opts))))
  end)

  it("shards and unshards", function()
    local opts = { canvas = { 2, 4, 4 } }
    local full = H.randn({ 2, 32 + 3, 4, 2 })
    local s = shards(full, opts, 4)
    assert.same({ 2, 8 + 3, 4, 2 }, s[2]:shape())
    assert.equal(full:get { 1, 9, 1, 1 }, s[2]:get { 1, 1, 1, 1 })  -- video row 8 is rank 1's first
    assert.equal(full:get { 2, 33, 3, 2 }, s[4]:get { 2, 9, 3, 2 }) -- text rows on every rank
    assert.is_true(H.same_values(dist.unshard(s, opts), full))
    assert.equal("rank: expected 0..3, got 4", H.error_of(dist.shard, full, opts, 4, 4))
    assert.equal("canvas: V = 32 video tokens is not divisible by the 3 ranks",
      H.error_of(dist.shard, full, opts, 0, 3))
  end)

  it("raises the divisibility errors word for word and leaves out unchanged", function()
    local comms = dist.loopback(2)
    local q = H.randn({ 1, 52 + 3, 4, 8 })
    local out = H.randn({ 1, 52 + 3, 4, 8 })
    local before = out:clone()
    assert.equal("canvas: V = 105 video tokens (3x5x7) is not divisible by the 2 ranks",
      H.error_of(comms[1].attention, comms[1], q, q, q, { canvas = { 3, 5, 7 }, window = { 1, 1, 1 }, out = out }))
    local q3 = H.randn({ 1, 32 + 3, 3, 8 })
    assert.equal("heads: 3 heads are not divisible by the 2 ranks",
      H.error_of(comms[2].attention, comms[2], q3, q3, q3, { canvas = { 4, 4, 4 }, window = { 1, 1, 1 } }))
    assert.equal("n_windows: expected 1 or heads (4), got 2",
      H.error_of(comms[1].attention, comms[1], q, q, q,
        { canvas = { 2, 4, 13 }, window = { { 1, 1, 1 }, { 1, 1, 1 } }, out = out }))
    assert.equal("canvas: sequence parallelism needs the canvas {T, H, W} (or geometry=)",
      H.error_of(comms[1].attention, comms[1], q, q, q, { window = { 1, 1, 1 } }))
    assert.equal("comms: expected 1..64 communicators, got 0",
      H.error_of(dist.run_attention, {}, {}, {}, {}, { canvas = { 4, 4, 4 }, window = { 1, 1, 1 } }))
    assert.equal("q: expected 2 entries (one per rank), got 1",
      H.error_of(dist.run_attention, comms, { q }, { q }, { q }, { canvas = { 4, 4, 4 }, window = { 1, 1, 1 } }))
    -- windows are checked by the one schema sta.attention uses (sta.options)
    for w, msg in pairs({
      [{ 1, 1 }] = "window: expected 3 integers, got 2",
      [{ { 1, 1, 1 }, 3 }] = "window[2]: expected 3 integers ({a, b, c}, 'axbxc' or 'a,b,c'), got 3",
      ["3x3"] = "window: expected 3 integers or a list of them, one per head ({Kt, Kh, Kw}, "
        .. "'KtxKhxKw', 'Kt,Kh,Kw', a list of those, '3,3,3:1,5,7' or '1x1x1,3x3x3'), got '3x3'" }) do
      assert.equal(msg, H.error_of(comms[1].attention, comms[1], q, q, q,
        { canvas = { 2, 4, 13 }, window = w, out = out }))
      assert.equal(msg, H.error_of(sta.attention, q, q, q, { canvas = { 2, 4, 13 }, window = w }))
    end
    assert.is_true(H.same_values(out, before))
  end)

  it("runs SP layers with a strategy, every rank its global heads", function()
    local heads, D = 4, 8
    local opts = { canvas = { 4, 4, 4 }, tile = { 2, 2, 2 } }
    local wins = { { 1, 1, 1 }, { 3, 1, 1 }, { 1, 3, 1 }, { 1, 1, 3 } }
    local s = sta.strategy.new()
    for h = 0, heads - 1 do s:set(0, 3, h, wins[h + 1]) end
    local q, k, v = full_qkv(1, 64 + 2, heads, D)
    local ref = sta.attention(q, k, v, { canvas = opts.canvas, tile = opts.tile, window = wins })
    for _, p in ipairs { 1, 2, 4 } do
      local comms = dist.loopback(p)
      local layers = {}
      for r = 1, p do
        layers[r] = dist.layer(comms[r], { prefix = "transformer.blocks.3.attn.impl", heads = heads,
          head_dim = D, canvas = opts.canvas, tile = opts.tile, strategy = s })
        assert.equal(3, layers[r]:index())
      end
      local ctx <close> = sta.forward_context { step = 0, batch = sta.forward_batch {} }
      local outs = dist.run_layers(comms, layers, shards(q, opts, p), shards(k, opts, p),
        shards(v, opts, p))
      assert.equal(0, (dist.unshard(outs, opts):compare(ref)))
    end
    assert.equal("sta.SPLayer(3)", tostring(dist.layer(dist.loopback(1)[1],
      { layer = 3, heads = 2, head_dim = 8, canvas = { 4, 4, 4 } })))
  end)

  it("runs an SP layer of one rank under the live context", function()
    local opts = { canvas = { 4, 4, 4 }, tile = { 2, 2, 2 } }
    local md = sta.metadata(2)
    md:set_row(1, { { 1, 1, 1 }, { 3, 3, 1 } })
    local c = dist.loopback(1)[1]
    local layer = dist.layer(c, { layer = 1, heads = 2, head_dim = 8, canvas = opts.canvas,
      tile = opts.tile })
    local q, k, v = full_qkv(1, 64, 2, 8)
    local ctx <close> = sta.forward_context { step = 0, metadata = md, batch = sta.forward_batch {} }
    local out = layer:forward(q, k, v)
    local ref = sta.attention(q, k, v, { canvas = opts.canvas, tile = opts.tile,
      window = { { 1, 1, 1 }, { 3, 3, 1 } } })
    assert.equal(0, (out:compare(ref)))
  end)

  it("checks SP layers and refuses loopback search rows", function()
    local comms = dist.loopback(2)
    assert.equal("heads: 3 heads are not divisible by the 2 ranks",
      H.error_of(dist.layer, comms[1], { heads = 3, head_dim = 8, canvas = { 4, 4, 4 } }))
    assert.equal("heads: required (an integer >= 1: the heads on this rank; sta.dist.layer: of all ranks)",
      H.error_of(dist.layer, comms[1], { head_dim = 8, canvas = { 4, 4, 4 } }))
    assert.equal("canvas: sequence parallelism needs the canvas {T, H, W} (or geometry=)",
      H.error_of(dist.layer, comms[1], { heads = 2, head_dim = 8 }))
    assert.equal("backend: expected \"cpu\" or \"cuda\", got 'tpu'",
      H.error_of(dist.layer, comms[1], { heads = 2, head_dim = 8, canvas = { 4, 4, 4 }, backend = "tpu" }))
    assert.equal("prefix: expected a string, got 3",
      H.error_of(dist.layer, comms[1], { heads = 2, head_dim = 8, canvas = { 4, 4, 4 }, prefix = 3 }))
    local layers = {}
    for r = 1, 2 do
      layers[r] = dist.layer(comms[r], { layer = 0, heads = 4, head_dim = 8, canvas = { 4, 4, 4 },
        tile = { 2, 2, 2 } })
    end
    local q = H.randn({ 1, 32, 4, 8 })
    assert.equal("STA forward called outside a forward context (no context is live)",
      H.error_of(dist.run_layers, comms, layers, { q, q }, { q, q }, { q, q }))
    local md = sta.metadata.search(1, { { 1, 1, 1 }, { 3, 3, 3 } })
    local ctx <close> = sta.forward_context { step = 0, metadata = md, batch = sta.forward_batch {} }
    assert.equal("loopback: layer 0's row holds 2 candidate windows (a search row); search "
      .. "records need one rank per process",
      H.error_of(dist.run_layers, comms, layers, { q, q }, { q, q }, { q, q }))
  end)

  it("raises for a missing NCCL or GPU, as for any unsupported request", function()
    local ok, c = pcall(dist.init, { rank = 0, size = 1 })
    if ok then -- a machine with NCCL and a GPU: a world of one
      assert.equal("nccl", c:name())
      assert.equal(1, c:size())
      c:release()
    else
      assert.truthy(c:find("^nccl: "), c)
      assert.equal(sta.status.BACKEND, select(2, sta.debug.last_error()))
    end
    assert.equal("id_file: expected a path or tcp://HOST:PORT to share the NCCL id (world size 2)",
      H.error_of(dist.init, { rank = 1, size = 2 }))
    assert.equal("id_file: expected a path or tcp://HOST:PORT (port 1..65535), got \"tcp://x\"",
      H.error_of(dist.init, { rank = 1, size = 2, id_file = "tcp://x" }))
    assert.equal("rank: expected 0..1, got 2", H.error_of(dist.init, { rank = 2, size = 2 }))
    assert.equal(0, dist.rank())
    assert.equal(1, dist.size())
    assert.equal(0, dist.local_rank())
  end)

  it("reads the world that torchrun, mpirun, srun or sta-launch describe", function()
    local lua = os.getenv("LUA") or "lua5.4"
    local build = os.getenv("STA_BUILD") or os.getenv("BUILD") or "build"
    local function world(env)
      local p = io.popen(("env -u STA_RANK -u STA_WORLD_SIZE %s %s -e \"package.path='lua/?.lua;"
        .. "lua/?/init.lua;'..package.path; package.cpath='%s/lua/?.so;'..package.cpath; "
        .. "local d = require 'sta.dist'; print(pcall(d.world))\" 2>&1"):format(env, lua, build))
      local out = p:read("a")
      p:close()
      return out
    end
    assert.equal("true\t0\t1\t0\tnil\n", world(""))
    assert.equal("true\t2\t4\t1\ttorchrun\n", world("RANK=2 WORLD_SIZE=4 LOCAL_RANK=1"))
    assert.equal("true\t3\t8\t3\tmpirun\n",
      world("SLURM_PROCID=0 SLURM_NTASKS=1 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=8"))
    assert.equal("true\t1\t2\t0\tsrun\n", world("SLURM_PROCID=1 SLURM_NTASKS=2 SLURM_LOCALID=0"))
    assert.equal("true\t1\t2\t1\tsta-launch\n", world("STA_RANK=1 STA_WORLD_SIZE=2 RANK=0 WORLD_SIZE=1"))
    assert.equal("false\tWORLD_SIZE: not set, but RANK is (torchrun sets both)\n", world("RANK=1"))
  end)

  it("raises the same error on every rank when the ranks disagree, and runs after", function()
    local opts = { canvas = { 4, 4, 4 }, tile = { 2, 2, 2 }, window = { 1, 1, 1 } }
    local comms = dist.loopback(2)
    local q4, q6 = H.randn({ 1, 32 + 3, 4, 8 }), H.randn({ 1, 32 + 3, 6, 8 })
    local o4, o6 = H.randn({ 1, 32 + 3, 4, 8 }), H.randn({ 1, 32 + 3, 6, 8 })
    local b4, b6 = o4:clone(), o6:clone()
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.out = { o4, o6 }
    assert.equal("rank 0: ranks disagree on the heads: rank 0 has 4, rank 1 has 6",
      H.error_of(dist.run_attention, comms, { q4, q6 }, { q4, q6 }, { q4, q6 }, o))
    assert.is_true(H.same_values(o4, b4))
    assert.is_true(H.same_values(o6, b6))
    comms[1]:set_chunks(2)
    assert.equal("rank 0: ranks disagree on the chunks: rank 0 runs 2, rank 1 runs 1 "
      .. "(sta_comm_set_chunks)",
      H.error_of(dist.run_attention, comms, { q4, q4 }, { q4, q4 }, { q4, q4 }, opts))
    assert.equal("n: expected 0 (choose) or 1..64 chunks, got 65", H.error_of(comms[1].set_chunks, comms[1], 65))
    assert.equal("n: expected an integer, got x", H.error_of(comms[1].set_chunks, comms[1], "x"))
    comms[1]:set_chunks(0)
    local full = H.randn({ 1, 64 + 3, 4, 8 })
    local outs = dist.run_attention(comms, shards(full, opts, 2), shards(full, opts, 2),
      shards(full, opts, 2), opts)
    assert.equal(0, (dist.unshard(outs, opts):compare(sta.attention(full, full, full, opts))))
  end)

  it("launches ranks with scripts/sta-launch", function()
    local script = H.tmp(".lua")
    H.write(script, [[
      local r, n = tonumber(os.getenv("STA_RANK")), tonumber(os.getenv("STA_WORLD_SIZE"))
      print(("rank %d of %d local %s id %s nvls %s"):format(r, n, os.getenv("STA_LOCAL_RANK"),
        os.getenv("STA_DIST_ID_FILE"):match("nccl%.id$") and "ok" or "?", os.getenv("NCCL_NVLS_ENABLE")))
      if arg[1] == "fail" then
        if r == 1 then os.exit(3) end
        os.execute("sleep 20")
      end
    ]])
    local function launch(extra)
      local p = io.popen("scripts/sta-launch -n 3 " .. script .. " " .. extra .. " 2>&1")
      local out = p:read("a")
      local _, _, code = p:close()
      return out, code
    end
    local out, code = launch("")
    assert.equal(0, code)
    for r = 0, 2 do
      assert.truthy(out:find(("[%d] rank %d of 3 local %d id ok nvls 0\n"):format(r, r, r), 1, true), out)
    end
    local t0 = sta.core.now()
    out, code = launch("fail")
    assert.equal(3, code)
    assert.truthy(out:find("sta-launch: rank 1 failed (status 3); stopping the other ranks", 1, true), out)
    assert.is_true(sta.core.now() - t0 < 10) -- the sleeping ranks were stopped
  end)

  it("runs examples/sp_pipeline.lua on a loopback world", function()
    local build = os.getenv("STA_BUILD") or os.getenv("BUILD") or "build"
    local lua = os.getenv("LUA") or "lua5.4"
    local cmd = ("%s -e \"package.path='lua/?.lua;lua/?/init.lua;'..package.path; "
      .. "package.cpath='%s/lua/?.so;'..package.cpath\" examples/sp_pipeline.lua --ranks 4 "
      .. "--seed %d 2>&1"):format(lua, build, H.seed())
    local p = io.popen(cmd)
    local out = p:read("a")
    local ok = p:close()
    assert.is_true(ok, out)
    for r = 0, 3 do
      assert.truthy(out:find(("sp small P=4 rank %d cpu f32: max|diff| 0 rel 0 ok (bitwise)"):format(r),
        1, true), out)
    end
  end)

  it("runs sp_pipeline as separate processes over TCP with scripts/sta-launch", function()
    -- sta-launch's own variables, and those of torchrun, srun and mpirun
    -- (the ranks meeting at MASTER_ADDR:MASTER_PORT + 1)
    for _, run in ipairs { { 4, "sta", "0,2" }, { 2, "torchrun", "0,4" }, { 2, "srun", "1" },
                           { 2, "mpirun", "2" } } do
      local n, env, chunks = run[1], run[2], run[3]
      local p = io.popen(("STA_DIST_BACKEND=tcp scripts/sta-launch -n %d --env %s --timeout 60 "
        .. "examples/sp_pipeline.lua --chunks %s --seed %d 2>&1"):format(n, env, chunks, H.seed()))
      local out = p:read("a")
      local ok = p:close()
      assert.is_true(ok, out)
      for r = 0, n - 1 do
        for c in chunks:gmatch("%d+") do
          assert.truthy(out:find(("[%d] sp small P=%d rank %d cpu f32 chunks %s: max|diff| 0 rel 0 ok "
            .. "(bitwise)"):format(r, n, r, c), 1, true), env .. ": " .. out)
        end
      end
    end
    local p = io.popen("scripts/sta-launch --env slurm -- true 2>&1")
    local out = p:read("a")
    local _, _, code = p:close()
    assert.equal(2, code)
    assert.truthy(out:find("sta-launch: --env: expected sta, torchrun, srun or mpirun, got 'slurm'",
      1, true), out)
    local c = dist.init { backend = "tcp" } -- a world of one
    assert.equal("sta.Comm(tcp, rank 0 of 1)", tostring(c))
    assert.is_true(c:barrier())
    assert.equal("backend: expected \"nccl\" or \"tcp\", got 'mpi'", H.error_of(dist.init, { backend = "mpi" }))
    -- rank 0 cannot publish its port: an environment failure
    local none, msg, code = dist.init { backend = "tcp", rank = 0, size = 2, id_file = "/nonexistent/dir/id" }
    assert.is_nil(none)
    assert.equal(sta.status.IO, code)
    assert.equal('id_file "/nonexistent/dir/id": cannot open for writing: No such file or directory', msg)
  end)
end)

describe("sta.dist on the GPU #gpu", function()
  local have = sta.backend_available("cuda")

  it("moves CUDA memory in a loopback world: SP == single-device on the GPU", function()
    if not have then return end
    local opts = { canvas = { 6, 16, 24 }, tile = { 6, 8, 8 }, text_len = 20,
      window = { { 1, 1, 1 }, { 1, 3, 3 }, { 1, 1, 3 }, { 1, 3, 1 } } }
    local shape = { 1, 2304 + 24, 4, 64 }
    local q = H.randn(shape, { dtype = "bf16", device = "cuda" })
    local k = H.randn(shape, { dtype = "bf16", device = "cuda" })
    local v = H.randn(shape, { dtype = "bf16", device = "cuda" })
    local ref = sta.attention(q, k, v, opts)
    for _, p in ipairs { 1, 2, 4 } do
      local comms = dist.loopback(p)
      -- the pipeline on two CUDA streams per rank (chunks > 1) too
      for _, n in ipairs { 0, 1, 4 // p > 1 and 4 // p or 1 } do
        for _, c in ipairs(comms) do c:set_chunks(n) end
        local outs = dist.run_attention(comms, shards(q, opts, p), shards(k, opts, p), shards(v, opts, p), opts)
        assert.equal("cuda:0", outs[1]:device())
        local mx = dist.unshard(outs, opts):compare(ref)
        assert.equal(0, mx, ("P=%d chunks %d max |diff| %g"):format(p, n, mx))
      end
    end
  end)

  it("runs a world of one through NCCL when libnccl is found", function()
    if not have then return end
    local ok, c, msg = pcall(dist.init, { rank = 0, size = 1, device = 0 })
    if not (ok and c) then
      print("sta.dist: no NCCL world (" .. tostring(ok and msg or c)
        .. "); set STA_NCCL_LIB (scripts/test-dist-gpu finds it)")
      return
    end
    assert.equal("nccl", c:name())
    local opts = { canvas = { 6, 16, 16 }, tile = { 6, 8, 8 }, window = { 1, 1, 1 } }
    local q = H.randn({ 1, 1536 + 8, 2, 128 }, { dtype = "bf16", device = "cuda" })
    local ref = sta.attention(q, q, q, opts)
    for _, n in ipairs { 0, 2 } do -- 2: the pipeline through NCCL on a second stream
      c:set_chunks(n)
      local out = c:attention(q, q, q, opts)
      assert.equal(0, (out:compare(ref)), "chunks " .. n)
    end
    assert.is_true(c:barrier())
    local send, recv = H.randn({ 2 }), H.randn({ 2 }) -- host memory goes over the host links
    c:all_gather(send, recv)
    assert.is_true(H.same_values(send, recv))
  end)
end)
