--[[
sp_pipeline.lua -- sequence-parallel (Ulysses) STA, end to end.
`lua5.4 examples/sp_pipeline.lua --help` prints the options, their defaults
and what the script does (the `about` text below).
]]
local sta = require "sta"
local dist = require "sta.dist"
local cli = require "sta.cli"

local about = [[
Sequence-parallel (Ulysses) STA, end to end.  Every rank builds the same full
q, k, v (same seeds), keeps its shard (V/P video rows of all heads + every
text row), runs SP attention and checks its output shard against
single-device STA on the whole problem, for each head chunk count asked;
optionally times them.  Exits with an error when a rank's output differs.
Writes no files.
  launched, one rank per process (dist.init(): scripts/sta-launch, or
  torchrun / mpirun / srun with MASTER_ADDR and MASTER_PORT):
    scripts/sta-launch -n 2 examples/sp_pipeline.lua --device cuda --shape hunyuan
  alone: --ranks P simulated ranks in this process (loopback, a thread each):
    lua5.4 examples/sp_pipeline.lua --ranks 4
Timing, launched: the median of N runs of each, between barriers: "single"
is sta.attention on the whole problem on rank 0's device; "compute alone" the
attention each rank runs (all tokens, H/P heads); "exchanges alone" the
all-to-alls and the all-gather an SP call makes, on contiguous buffers, with
nothing else running; "exposed" = SP - compute alone, and "hidden" the share
of the exchanges that SP did not add to the compute.]]
local spec, usage, help = cli.options("sp_pipeline.lua", about, {
  { "ranks", 2, "P", "simulated ranks when not launched (loopback)" },
  { "device", "cpu", "cpu|cuda", "where each rank runs" },
  { "shape", "small", "small|medium|hunyuan", "the problem" },
  { "iters", 0, "N", "timed runs of each (0: no timing)" },
  { "chunks", "0", "LIST", "head chunks of the pipeline to check, e.g. 0,1,2,4 (0: chosen per call)" },
  { "seed", os.time() % 100000, "S", "random seed", default = "from the clock" },
})
local ok, args = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("sp_pipeline: ", args, "\n", usage, "\n") os.exit(2) end

-- Problem shapes: canvas, tile, text rows, heads, head dim, dtype, windows
-- cycled over the heads (global head h uses windows[h % #windows + 1]).
local shapes = {
  small = { canvas = { 6, 16, 16 }, tile = { 3, 8, 8 }, text = 16, heads = 8, d = 32,
            dtype = "f32", windows = { { 1, 1, 1 }, { 3, 1, 1 }, { 1, 3, 3 }, { 3, 3, 3 } } },
  medium = { canvas = { 18, 24, 32 }, tile = { 6, 8, 8 }, text = 64, heads = 8, d = 128,
             dtype = "bf16", windows = { { 3, 3, 3 }, { 1, 3, 1 }, { 3, 1, 3 }, { 1, 1, 1 } } },
  hunyuan = { canvas = { 30, 48, 80 }, tile = { 6, 8, 8 }, text = 256, heads = 24, d = 128,
              dtype = "bf16", windows = { { 3, 3, 3 } } },
}
local function main()
local sh = cli.check(shapes[args.shape], "--shape: expected small, medium or hunyuan, got '%s'",
  tostring(args.shape))
cli.int(args, "ranks", 1)
cli.int(args, "iters", 0)
local chunk_list = {}
for c in tostring(args.chunks):gmatch("[^,]+") do
  chunk_list[#chunk_list + 1] = cli.check(math.tointeger(tonumber(c)),
    "--chunks: expected a list of integers >= 0 (0,1,2), got '%s'", tostring(args.chunks))
end
cli.check(#chunk_list > 0, "--chunks: expected a list of integers >= 0 (0,1,2), got '%s'",
  tostring(args.chunks))
cli.check(args.device == "cpu" or args.device == "cuda", "--device: expected cpu or cuda, got '%s'",
  tostring(args.device))
if args.device == "cuda" and not sta.backend_available("cuda") then
  error(("--device cuda: no CUDA device here (%s); use --device cpu"):format(sta.info().cuda), 0)
end
local _, world, _, launcher = dist.world()
local launched = launcher ~= nil
local P0 = launched and world or args.ranks
local V0 = sh.canvas[1] * sh.canvas[2] * sh.canvas[3]
cli.check(sh.heads % P0 == 0 and V0 % P0 == 0,
  "%s %d: the %s shape's %d heads and %d video tokens must divide among the ranks (try 1, 2, 4 or 8)",
  launched and "world size" or "--ranks", P0, args.shape, sh.heads, V0)
if args.device == "cpu" and sh.dtype == "bf16" then sh.dtype = "f32" end
local now = sta.core.now or os.clock
local function sync() if args.device == "cuda" then sta.synchronize() end end

local V = sh.canvas[1] * sh.canvas[2] * sh.canvas[3]
local S = V + sh.text
local windows = {}
for h = 0, sh.heads - 1 do windows[h + 1] = sh.windows[h % #sh.windows + 1] end
local opts = { canvas = sh.canvas, tile = sh.tile, window = windows }

-- the world: the launcher's ranks, else a loopback world here
local comms, P
if launched then
  local c, msg = dist.init()
  if not c then error("dist.init: " .. msg, 0) end
  comms, P = { c }, c:size()
else
  P = args.ranks
  comms = dist.loopback(P)
end
local me = launched and comms[1]:rank() or nil
local function say(fmt, ...)
  io.write(fmt:format(...) .. "\n")
  io.flush()
end

local topt = { dtype = sh.dtype, device = args.device }
local function randn(shape, seed)
  local o = { seed = seed }
  for k, v in pairs(topt) do o[k] = v end
  return sta.randn(shape, o)
end
local full = { 1, S, sh.heads, sh.d }
local q, k, v = randn(full, args.seed), randn(full, args.seed + 1), randn(full, args.seed + 2)
local ref = sta.attention(q, k, v, opts)

local ranks = launched and { me } or {}
if not launched then for r = 0, P - 1 do ranks[#ranks + 1] = r end end
local qs, ks, vs = {}, {}, {}
for i, r in ipairs(ranks) do
  qs[i], ks[i], vs[i] = dist.shard(q, opts, r, P), dist.shard(k, opts, r, P), dist.shard(v, opts, r, P)
end

local function sp_forward()
  if launched then return { comms[1]:attention(qs[1], ks[1], vs[1], opts) } end
  return dist.run_attention(comms, qs, ks, vs, opts)
end

-- median of args.iters runs; collective runs start and end at a barrier
local function time(fn, collective)
  local ms = {}
  for i = 1, args.iters do
    if collective then comms[1]:barrier() end
    sync()
    local t0 = now()
    fn()
    sync()
    if collective then comms[1]:barrier() end
    ms[i] = (now() - t0) * 1000
  end
  table.sort(ms)
  return ms[(#ms + 1) // 2]
end

local single, alone, moving = 0, nil, nil
if args.iters > 0 then
  -- the single-device baseline on rank 0 alone (the other ranks wait, so
  -- ranks sharing CPU cores do not slow it down)
  if not launched or me == 0 then
    single = time(function() sta.attention(q, k, v, { canvas = opts.canvas, tile = opts.tile,
      window = windows, out = ref }) end, false)
  end
  if launched then
    comms[1]:barrier()
    local hl = sh.heads // P
    local mine = {}
    for h = 1, hl do mine[h] = windows[me * hl + h] end
    local lshape = { 1, S, hl, sh.d }
    local lq, lk, lv = randn(lshape, args.seed + 3), randn(lshape, args.seed + 4),
      randn(lshape, args.seed + 5)
    local lo = sta.attention(lq, lk, lv, { canvas = opts.canvas, tile = opts.tile, window = mine })
    alone = time(function() sta.attention(lq, lk, lv, { canvas = opts.canvas, tile = opts.tile,
      window = mine, out = lo }) end, true)
    local n = V // P * sh.heads * sh.d
    local send, recv = randn({ n }, args.seed + 6), randn({ n }, args.seed + 7)
    local tsend, trecv = randn({ sh.text * hl * sh.d }, args.seed + 8),
      randn({ P * sh.text * hl * sh.d }, args.seed + 9)
    local c = comms[1]
    moving = time(function()
      for _ = 1, 4 do c:all_to_all(send, recv) end -- q, k, v in; out back
      if sh.text > 0 then c:all_gather(tsend, trecv) end
    end, true)
  end
end

local bad = false
for _, n in ipairs(chunk_list) do
  for _, c in ipairs(comms) do c:set_chunks(n) end
  local label = args.chunks == "0" and "" or (" chunks %d"):format(n) -- as asked
  local outs = sp_forward()
  sync()
  local tol = sh.dtype == "f32" and 1e-6 or 1e-3
  for i, r in ipairs(ranks) do
    local want = dist.shard(ref, opts, r, P)
    local mx, rel = outs[i]:compare(want)
    local ok = rel <= tol
    bad = bad or not ok
    say("sp %s P=%d rank %d %s %s%s: max|diff| %.3g rel %.3g %s%s", args.shape, P, r,
      args.device, sh.dtype, label, mx, rel, ok and "ok" or "MISMATCH", mx == 0 and " (bitwise)" or "")
  end
  if args.iters > 0 then
    local sp = time(sp_forward, launched)
    local flops = sta.flops { canvas = sh.canvas, tile = sh.tile, window = windows,
      batch = 1, seq_len = S, heads = sh.heads, head_dim = sh.d }
    local msg = ("time %s P=%d %s %s%s: single device %.2f ms, SP %.2f ms (%.2fx, "
      .. "%.0f %% parallel efficiency), %.3g TFLOP/s SP"):format(args.shape, P, args.device,
      launched and comms[1]:name() or "loopback", label, single, sp, single / sp,
      100 * single / (P * sp), flops / (sp * 1e-3) / 1e12)
    if alone then
      local exposed = sp - alone
      msg = msg .. ("; compute alone %.2f ms, exchanges alone %.2f ms, exposed %.2f ms "
        .. "(%.0f %% hidden)"):format(alone, moving, exposed,
        moving > 0 and math.max(0, 100 * (1 - math.max(exposed, 0) / moving)) or 0)
    end
    msg = msg .. ("; median of %d"):format(args.iters)
    if not launched or me == 0 then say("%s", msg) end
  end
end

if bad then error("SP output differs from single-device STA", 0) end
end

cli.main("sp_pipeline", main, usage)
