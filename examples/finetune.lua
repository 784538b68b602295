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
exits 1 if it did not fall.  Writes no files.

--mode vsa fits a Video Sparse Attention layer instead (STA.md section 12):
Q, K, V in the cube order of --cube, the teacher dense attention over every
cube (sta.block_sparse with every key block listed), the student a VSA
layer at the forward batch's sparsity (--sparsity), whose gate (FastVideo's
compress_attn_weight on the coarse branch) starts at 0 and is learned with
Q, K and V through layer:backward's dgate.]]
local spec, usage, help = cli.options("finetune.lua", about, {
  { "steps", 20, "N", "gradient steps" },
  { "lr", 0.02, "X", "learning rate" },
  { "heads", 4, "N", "attention heads" },
  { "head_dim", 64, "D", "head dimension" },
  { "canvas", "12x16x24", "TxHxW", "latent video tokens" },
  { "tile", "6x8x8", "TxHxW", "tile size" },
  { "text", 16, "N", "text tokens after the video" },
  { "window", "1x1x1", "KtxKhxKw", "the student's window, in tiles" },
  { "mode", "sta", "sta|vsa", "the student: an STA layer or a VSA layer" },
  { "sparsity", 0.875, "S", "VSA: the fraction of key cubes the student leaves out" },
  { "cube", "4x4x4", "TxHxW", "VSA: the cube (4x4x4 or 4x8x8)" },
  { "device", "auto", "auto|cpu|cuda", "where to run", default = "auto: cuda when a GPU answers" },
  { "dtype", "", "f32|bf16|f16", "compute dtype", default = "f32 on the CPU, bf16 on CUDA" },
  { "seed", 7, "N", "random seed" },
  { "quiet", false, false, "print nothing but errors" },
})

local ok, opts = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("finetune: ", opts, "\n", usage, "\n") os.exit(2) end
if opts.steps < 1 then io.stderr:write("finetune: --steps: expected >= 1, got ", opts.steps, "\n") os.exit(2) end
if not (opts.lr > 0) then io.stderr:write("finetune: --lr: expected > 0, got ", opts.lr, "\n") os.exit(2) end
if opts.mode ~= "sta" and opts.mode ~= "vsa" then
  io.stderr:write("finetune: --mode: expected sta or vsa, got '", opts.mode, "'\n") os.exit(2)
end
local vsa = opts.mode == "vsa"

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
local V, H, D = geom:video_tokens(), opts.heads, opts.head_dim
local S = V + opts.text
local cube = cli.triple(opts.cube, "--cube")
local sizes = vsa and sta.cube_sizes{ canvas = canvas, cube = cube, device = device }
if vsa then S = sizes:numel() * cube[1] * cube[2] * cube[3] end -- the cube order's rows
local shape = { 1, S, H, D }
local n = (vsa and V or S) * H * D -- the valid elements (VSA's padding rows are 0 on both sides)

-- the teacher: dense attention (the full window; VSA: every cube listed) of random Q, K, V
local function param(seed)
  local t = sta.randn({ 1, vsa and V or S, H, D }, { seed = seed })
  if vsa then t = sta.to_cubes(t, { canvas = canvas, cube = cube }) end
  return device == "cpu" and t or t:to(device)
end
local tq, tk, tv = param(opts.seed), param(opts.seed + 1), param(opts.seed + 2)
local function cast(t) return t:to(dtype) end
local target
if vsa then
  local every, lists = {}, {}
  for c = 1, sizes:numel() do every[c] = c - 1 end
  for h = 1, H do
    lists[h] = {}
    for m = 1, sizes:numel() do lists[h][m] = every end
  end
  target = sta.block_sparse(cast(tq), cast(tk), cast(tv),
    { idx = { lists }, kv_sizes = sizes, block_rows = S // sizes:numel() })
else
  target = sta.attention(cast(tq), cast(tk), cast(tv),
    { canvas = canvas, tile = tile, text_len = opts.text, window = grid })
end

-- the student: the teacher's parameters (f32 masters), attending in the window
-- (VSA: the top cubes, and a gate from 0)
local p = { q = tq:clone(), k = tk:clone(), v = tv:clone(),
  g = vsa and sta.zeros(shape, { device = device }) or nil }
local strat = not vsa and sta.strategy.uniform{ steps = 1, layers = 1, heads = H, window = window }
local layer = vsa and sta.layer{ layer = 0, heads = H, head_dim = D, canvas = canvas, mode = "vsa",
    cube = cube, backend = device }
  or sta.layer{ layer = 0, heads = H, head_dim = D, canvas = canvas, tile = tile,
    text_len = opts.text, strategy = strat, backend = device }
local batch = sta.forward_batch{ batch_size = 1, vsa_sparsity = vsa and opts.sparsity or nil }

say("sta %s finetune: %s on %s; canvas %s, tile %s, grid %s, %d tokens, %d heads x D %d\n",
  sta.info().version, dtype, device, cli.fmt_triple(canvas), cli.fmt_triple(tile),
  cli.fmt_triple(grid), S, H, D)
if vsa then
  say("  student VSA, cube %s, top %d of %d cubes (sparsity %g), gate from 0, fitted to dense "
    .. "attention, lr %g\n", cli.fmt_triple(cube), sta.vsa_topk(opts.sparsity, sizes:numel()),
    sizes:numel(), opts.sparsity, opts.lr)
else
  say("  student window %s (sparsity %.3f) fitted to the teacher's full attention, lr %g\n",
    cli.fmt_triple(window), strat:sparsity(grid), opts.lr)
end

local diff = sta.tensor(shape, { dtype = dtype, device = device })
local losses = {}
for step = 1, opts.steps + 1 do
  local q, k, v = cast(p.q), cast(p.k), cast(p.v)
  local ctx <close> = sta.forward_context{ step = 0, batch = batch }
  local out, lse, used = layer:forward(q, k, v, { lse = true, gate = vsa and cast(p.g) or nil })
  -- loss = mean((out - target)^2); dout = 2 (out - target) / n
  diff:copy(out)
  diff:axpby(-1, target, 1)
  local st = diff:stats()
  local loss = (st.std * st.std + st.mean * st.mean) * S * H * D / n -- over the valid elements
  losses[#losses + 1] = loss
  say("step %3d  loss %.6e\n", step - 1, loss)
  if step > opts.steps then break end
  diff:scale(2 / n)
  local dq, dk, dv, dg = layer:backward(q, k, v, out, lse, diff, used) -- dg: VSA's gate
  -- normalised gradient descent: each parameter moves lr * g / rms(g)
  for name, g in pairs{ q = dq, k = dk, v = dv, g = dg } do
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
