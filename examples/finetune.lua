--[[
finetune.lua -- gradient descent through STA (STA.md section 10).
`lua5.4 examples/finetune.lua --help` prints the options, their defaults and
what the script does (the `about` text below).
]]
local sta = require "sta"
local cli = require "sta.cli"
io.stdout:setvbuf("line")

local about = [[
Gradient descent through STA (STA.md section 10): the fine-tuning the STA
paper does, in miniature.  A teacher runs full attention; the student starts
from the teacher's Q, K and V but attends only inside a sliding tile window,
so its output differs; a few steps of gradient descent on Q, K and V through
the STA layer's backward bring the sparse output back toward the dense one.
Each step pushes a forward context, runs layer:forward with the log-sum-exp
and layer:backward with what that forward returned (out, lse and the record
of the windows it ran, so the backward uses them whatever happens in
between), and moves Q, K, V against their gradients, normalised by their
RMS.  The parameters are kept in f32 (on the device when there is one)
and cast to the compute dtype for each step.  Prints the loss per step;
exits 1 if it did not fall.  Writes no files.]]
local spec, usage, help = cli.options("finetune.lua", about, {
  { "steps", 20, "N", "gradient steps" },
  { "lr", 0.02, "X", "learning rate" },
  { "heads", 4, "N", "attention heads" },
  { "head_dim", 64, "D", "head dimension" },
  { "canvas", "12x16x24", "TxHxW", "latent video tokens" },
  { "tile", "6x8x8", "TxHxW", "tile size" },
  { "text", 16, "N", "text tokens after the video" },
  { "window", "1x1x1", "KtxKhxKw", "the student's window, in tiles" },
  { "device", "auto", "auto|cpu|cuda", "where to run", default = "auto: cuda when a GPU answers" },
  { "dtype", "", "f32|bf16|f16", "compute dtype", default = "f32 on the CPU, bf16 on CUDA" },
  { "seed", 7, "N", "random seed" },
  { "quiet", false, false, "print nothing but errors" },
})

local ok, opts = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("finetune: ", opts, "\n", usage, "\n") os.exit(2) end
if opts.steps < 1 then io.stderr:write("finetune: --steps: expected >= 1, got ", opts.steps, "\n") os.exit(2) end
if not (opts.lr > 0) then io.stderr:write("finetune: --lr: expected > 0, got ", opts.lr, "\n") os.exit(2) end

local canvas, tile = cli.triple(opts.canvas, "--canvas"), cli.triple(opts.tile, "--tile")
local window = cli.triple(opts.window, "--window")
local device = opts.device == "auto" and sta.default_device() or opts.device
local available = false
for _, b in ipairs(sta.backends()) do available = available or b == device end
if not available then
  io.stderr:write("finetune: --device ", device, ": not available here (", sta.info().cuda or "no GPU",
                  ")\n")
  os.exit(2)
end
local dtype = opts.dtype ~= "" and opts.dtype or (device == "cpu" and "f32" or "bf16")
local say = opts.quiet and function() end or function(...) io.stdout:write(string.format(...)) end

local geom = sta.geometry{ canvas = canvas, tile = tile, text_len = opts.text }
local grid = geom:grid()
local S, H, D = geom:video_tokens() + opts.text, opts.heads, opts.head_dim
local shape = { 1, S, H, D }
local n = S * H * D

-- the teacher: dense attention (the full window) of random Q, K, V
local function param(seed)
  local t = sta.randn(shape, { seed = seed })
  return device == "cpu" and t or t:to(device)
end
local tq, tk, tv = param(opts.seed), param(opts.seed + 1), param(opts.seed + 2)
local function cast(t) return t:to(dtype) end
local target = sta.attention(cast(tq), cast(tk), cast(tv),
  { canvas = canvas, tile = tile, text_len = opts.text, window = grid })

-- the student: the teacher's parameters (f32 masters), attending in the window
local p = { q = tq:clone(), k = tk:clone(), v = tv:clone() }
local strat = sta.strategy.uniform{ steps = 1, layers = 1, heads = H, window = window }
local layer = sta.layer{ layer = 0, heads = H, head_dim = D, canvas = canvas, tile = tile,
  text_len = opts.text, strategy = strat, backend = device }
local batch = sta.forward_batch{ batch_size = 1 }

say("sta %s finetune: %s on %s; canvas %s, tile %s, grid %s, %d tokens, %d heads x D %d\n",
  sta.info().version, dtype, device, cli.fmt_triple(canvas), cli.fmt_triple(tile),
  cli.fmt_triple(grid), S, H, D)
say("  student window %s (sparsity %.3f) fitted to the teacher's full attention, lr %g\n",
  cli.fmt_triple(window), strat:sparsity(grid), opts.lr)

local diff = sta.tensor(shape, { dtype = dtype, device = device })
local losses = {}
for step = 1, opts.steps + 1 do
  local q, k, v = cast(p.q), cast(p.k), cast(p.v)
  local ctx <close> = sta.forward_context{ step = 0, batch = batch }
  local out, lse, used = layer:forward(q, k, v, { lse = true })
  -- loss = mean((out - target)^2); dout = 2 (out - target) / n
  diff:copy(out)
  diff:axpby(-1, target, 1)
  local st = diff:stats()
  local loss = st.std * st.std + st.mean * st.mean
  losses[#losses + 1] = loss
  say("step %3d  loss %.6e\n", step - 1, loss)
  if step > opts.steps then break end
  diff:scale(2 / n)
  local dq, dk, dv = layer:backward(q, k, v, out, lse, diff, used)
  -- normalised gradient descent: each parameter moves lr * g / rms(g)
  for name, g in pairs{ q = dq, k = dk, v = dv } do
    local gs = g:stats()
    local rms = math.sqrt(gs.std * gs.std + gs.mean * gs.mean)
    if rms > 0 then p[name]:axpby(-opts.lr / rms, g, 1) end
    g:release()
  end
  for _, t in ipairs{ q, k, v, out, lse } do t:release() end
end

local first, last = losses[1], losses[#losses]
say("summary: loss %.6e -> %.6e over %d steps (%.1f%% of the start)\n", first, last,
  opts.steps, 100 * last / first)
if not (last < first) then
  io.stderr:write("finetune: the loss did not fall\n")
  os.exit(1)
end
say("ok\n")
