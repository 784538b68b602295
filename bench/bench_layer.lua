--[[
bench_layer.lua -- the pipeline's layer forward against the bare forward,
on the same inputs, in one process, rounds alternated.

examples/pipeline.lua calls layers[l]:forward(h, h, h, out): one tensor as
q, k and v, per-head windows from a forward context.  bench/bench_gpu.py
times sta_attention_forward on three separate randn tensors with one
window.  Each case below changes one of those differences:

  bare q,k,v        sta.attention on separate randn q, k, v (bench_gpu.py's call)
  bare q,k,v heads  the same with the window given per head (n_windows = heads)
  bare x,x,x        one randn tensor as q, k and v
  bare x,x',x''     x and two copies of it: the same values, three buffers
  layer x,x,x       layer:forward(x, x, x, out) in a forward context (the pipeline's call)
  layer q,k,v       the layer on separate q, k, v
  bare y,y,y        one tensor as q, k and v holding what the pipeline's later
                    layers see: x through two layers of itself
  bare x,x,x fresh  bare x,x,x with x rewritten (a device copy) just before each
                    call, as a layer's input is the last layer's output

Per call: synchronize, time the call, synchronize (as pipeline.lua does);
ms: median of --reps calls, per round.  Each case's first call prints
sta.last_launch() (the kernel, its loads and tensor maps).  Outputs of
the layer and the bare call on the same inputs are compared (the same
kernel and windows: identical).

  lua5.4 bench/bench_layer.lua [--device cuda] [--canvas 30x48x80] [--text 256]
      [--heads 24] [--head-dim 128] [--window 3x3x3] [--dtype bf16] [--reps 10] [--rounds 3]
]]
local sta = require "sta"
local cli = require "sta.cli"
io.stdout:setvbuf("line")

local usage = [==[
usage: bench_layer.lua [--device cuda|cpu] [--canvas TxHxW] [--tile TxHxW] [--text N]
       [--heads N] [--head-dim D] [--window KtxKhxKw] [--dtype bf16|f16|f32]
       [--reps N] [--rounds N] [--seed N]]==]

local ok, opts = pcall(cli.parse, arg, {
  device = "cuda", canvas = "30x48x80", tile = "6x8x8", text = 256, heads = 24, head_dim = 128,
  window = "3x3x3", dtype = "", reps = 10, rounds = 3, seed = 1,
}, usage)
if not ok then io.stderr:write(opts, "\n", usage, "\n") os.exit(2) end

local function main()
  for _, n in ipairs{ "heads", "head_dim", "reps", "rounds" } do cli.int(opts, n, 1) end
  cli.int(opts, "text", 0)
  cli.check(opts.device == "cpu" or opts.device == "cuda", "--device: expected cpu or cuda, got '%s'",
    opts.device)
  if opts.device == "cuda" and not sta.backend_available("cuda") then
    error(("--device cuda: no CUDA device here (%s)"):format(sta.info().cuda), 0)
  end
  local dev = opts.device
  local dtype = opts.dtype ~= "" and opts.dtype or (dev == "cpu" and "f32" or "bf16")
  local canvas, tile = cli.triple(opts.canvas, "--canvas"), cli.triple(opts.tile, "--tile")
  local w = cli.triple(opts.window, "--window")
  local H, D = opts.heads, opts.head_dim
  local geom = sta.geometry{ canvas = canvas, tile = tile, text_len = opts.text }
  local S = geom:video_rows() + opts.text
  local function sync() if dev ~= "cpu" then sta.synchronize() end end
  local function randn(seed) return sta.randn({ 1, S, H, D }, { seed = seed, dtype = dtype, device = dev }) end
  local function new() return sta.tensor({ 1, S, H, D }, { dtype = dtype, device = dev }) end

  local q, k, v, x = randn(opts.seed), randn(opts.seed + 1), randn(opts.seed + 2), randn(opts.seed + 3)
  local x1, x2 = new():copy(x), new():copy(x)
  local o = new()
  local function bare(wins, a, b, c, out)
    return sta.attention(a, b, c, { canvas = canvas, tile = tile, text_len = opts.text, window = wins,
      out = out or o })
  end
  local per_head = {}
  for h = 1, H do per_head[h] = w end

  -- the pipeline's layer: windows per head from a strategy, through a forward context
  local strategy = sta.strategy.uniform{ steps = 1, layers = 1, heads = H, window = w,
    full = geom:grid(), full_steps = 0 }
  local md = sta.metadata.from_strategy(strategy, 0, 1, H)
  local layer = sta.layer{ layer = 0, heads = H, head_dim = D, canvas = canvas, tile = tile,
    text_len = opts.text, backend = dev }
  local batch = sta.forward_batch{ batch_size = 1 }
  local function in_layer(fn)
    local ctx <close> = sta.forward_context{ step = 0, metadata = md, batch = batch }
    return fn()
  end

  -- the later layers' inputs: x through two layers of itself
  local y1, y = new(), new()
  bare(w, x, x, x, y1)
  bare(w, y1, y1, y1, y)
  sync()

  local cases = {
    { "bare q,k,v", function() return bare(w, q, k, v) end },
    { "bare q,k,v heads", function() return bare(per_head, q, k, v) end },
    { "bare x,x,x", function() return bare(w, x, x, x) end },
    { "bare x,x',x''", function() return bare(w, x, x1, x2) end },
    { "layer x,x,x", function() return in_layer(function() return layer:forward(x, x, x, o) end) end },
    { "layer q,k,v", function() return in_layer(function() return layer:forward(q, k, v, o) end) end },
    { "bare y,y,y", function() return bare(w, y, y, y) end },
    { "bare x,x,x fresh", function() return bare(w, x, x, x) end, function() x:copy(x1) end },
  }

  print(("sta %s bench_layer: %s on %s (%s)"):format(sta.info().version, dtype, dev,
    dev == "cpu" and sta.info().cpu or sta.info().cuda))
  print(("  canvas %s, tile %s, %d text, S %d, %d heads x D %d, window %s; %d rounds x %d calls")
    :format(cli.fmt_triple(canvas), cli.fmt_triple(tile), opts.text, S, H, D, cli.fmt_triple(w),
      opts.rounds, opts.reps))
  print(("  %.3f TFLOP per call"):format(sta.flops{ canvas = canvas, tile = tile, text_len = opts.text,
    window = w, seq_len = S, heads = H, head_dim = D } / 1e12))

  -- outputs: the layer against the bare call on the same inputs
  local ob, ol = new(), new()
  bare(w, x, x, x, ob)
  in_layer(function() return layer:forward(x, x, x, ol) end)
  sync()
  local maxabs = ob:compare(ol)
  print(("  layer x,x,x against bare x,x,x: max |diff| %g (%s)"):format(maxabs,
    maxabs == 0 and "identical" or "DIFFERENT"))

  local ms = {}
  for c = 1, #cases do ms[c] = {} end
  for r = 1, opts.rounds do
    for c, case in ipairs(cases) do
      sync()
      case[2]() -- warm-up; its launch, once
      sync()
      if r == 1 then print(("  %-17s %s"):format(case[1], dev == "cpu" and "cpu" or sta.last_launch())) end
      local t = {}
      for i = 1, opts.reps do
        if case[3] then case[3]() end
        sync()
        local t0 = sta.now()
        case[2]()
        sync()
        t[i] = (sta.now() - t0) * 1e3
      end
      table.sort(t)
      ms[c][r] = t[(#t + 1) // 2]
    end
  end

  local function median(t)
    local s = table.move(t, 1, #t, 1, {})
    table.sort(s)
    return s[(#s + 1) // 2]
  end
  print("")
  print("| case | ms per round | median | vs bare q,k,v |")
  print("|---|---|---:|---:|")
  local base = median(ms[1])
  for c, case in ipairs(cases) do
    local rs = {}
    for r = 1, opts.rounds do rs[r] = ("%.2f"):format(ms[c][r]) end
    local m = median(ms[c])
    print(("| %s | %s | %.2f | %+.1f %% |"):format(case[1], table.concat(rs, " / "), m,
      100 * (m / base - 1)))
  end
  print("ok")
end

cli.main("bench_layer", main, usage)
