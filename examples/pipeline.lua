--[[
pipeline.lua -- a DiT-style denoising loop on sta: what `make example`
runs.  `lua5.4 examples/pipeline.lua --help` prints the options, their
defaults and what the script does (the `about` text below).
]]
local sta = require "sta"
local cli = require "sta.cli"
io.stdout:setvbuf("line") -- per-step lines as they come, also into a pipe

local about = [[
A DiT-style denoising loop on sta.  Each step runs a classifier-free-guidance
pair (positive and negative prompt) through every layer; each layer calls
layer:forward inside a forward context for its step, with the step's windows
from a mask strategy (uniform: the full window for the first --full-steps
steps, --window afterwards; or the file named by STA_ATTENTION_CONFIG).  The
latent is updated by the guided prediction after each step.  A progress bar
on stderr, one timing line per step on stdout, a summary at the end.  Writes
no files.

--mode vsa runs Video Sparse Attention layers instead (STA.md section 12):
the latent in the cube order of --cube (4x4x4 or 4x8x8 tokens a cube), each
prompt's conditioning added to it (random rows standing for the text, which
VSA's self-attention does not take), and each layer selects the top
ceil((1 - s) * cubes) key cubes of every query cube, s the forward batch's
sparsity (SGLang's VSA_sparsity, set each step from --sparsity), every cube
in the first --full-steps steps.]]
local spec, usage, help = cli.options("pipeline.lua", about, {
  { "steps", 10, "N", "denoising steps" },
  { "layers", 4, "N", "transformer layers" },
  { "heads", 4, "N", "attention heads" },
  { "head_dim", 64, "D", "head dimension" },
  { "canvas", "12x16x16", "TxHxW", "latent video tokens" },
  { "tile", "6x8x8", "TxHxW", "tile size" },
  { "text", 16, "N", "text tokens after the video" },
  { "window", "1x1x1", "KtxKhxKw", "the sparse window, in tiles" },
  { "full_steps", -1, "N", "first steps with the full window (VSA: every cube)",
    default = "2, or --steps when fewer" },
  { "mode", "sta", "sta|vsa", "the layers' attention: STA's window or VSA" },
  { "sparsity", 0.875, "S", "VSA: the fraction of key cubes left out, in [0, 1)" },
  { "cube", "4x4x4", "TxHxW", "VSA: the cube (4x4x4: 64 tokens, 4x8x8: 256)" },
  { "guidance", 5.0, "G", "classifier-free guidance scale" },
  { "device", "auto", "auto|cpu|cuda", "where to run", default = "auto: cuda when a GPU answers" },
  { "dtype", "", "f32|bf16|f16", "compute dtype", default = "f32 on the CPU, bf16 on CUDA" },
  { "seed", 1234, "N", "random seed" },
  { "threads", 0, "N", "CPU threads", default = "0: OpenMP's" },
  { "quiet", false, false, "print nothing but errors" },
}, "Environment: STA_ATTENTION_CONFIG=file.json uses that mask strategy; STA_DEVICE sets the device.")

local ok, opts = pcall(cli.parse, arg, spec, help)
if not ok then io.stderr:write("pipeline: ", opts, "\n", usage, "\n") os.exit(2) end

local function main()
for _, n in ipairs{ "steps", "layers", "heads", "head_dim" } do cli.int(opts, n, 1) end
cli.int(opts, "text", 0)
cli.int(opts, "threads", 0)
if opts.full_steps == -1 then opts.full_steps = math.min(2, opts.steps) end -- the default
cli.int(opts, "full_steps", 0)
cli.check(opts.full_steps <= opts.steps, "--full-steps %d: more than --steps %d",
  opts.full_steps, opts.steps)
cli.check(opts.device == "auto" or opts.device == "cpu" or opts.device == "cuda",
  "--device: expected auto, cpu or cuda, got '%s'", opts.device)
if opts.device == "cuda" and not sta.backend_available("cuda") then
  error(("--device cuda: no CUDA device here (%s); use --device cpu or auto"):format(sta.info().cuda), 0)
end
cli.check(opts.mode == "sta" or opts.mode == "vsa", "--mode: expected sta or vsa, got '%s'", opts.mode)
local vsa = opts.mode == "vsa"
cli.check(opts.sparsity >= 0 and opts.sparsity < 1, "--sparsity: expected a number in [0, 1), got %s",
  tostring(opts.sparsity))
local canvas, tile = cli.triple(opts.canvas, "--canvas"), cli.triple(opts.tile, "--tile")
local window, cube = cli.triple(opts.window, "--window"), cli.triple(opts.cube, "--cube")
local device = opts.device == "auto" and sta.default_device() or opts.device
local dtype = opts.dtype ~= "" and opts.dtype or (device == "cpu" and "f32" or "bf16")
if opts.threads > 0 then sta.set_num_threads(opts.threads) end
local say = opts.quiet and function() end or function(...) io.stdout:write(string.format(...)) end

local geom = sta.geometry{ canvas = canvas, tile = tile, text_len = opts.text }
local grid = geom:grid()
local V = geom:video_tokens()
local S = V + opts.text
local H, D, L = opts.heads, opts.head_dim, opts.layers
-- VSA: the latent's rows in cube order (cubes x the cube's tokens), no text rows
local cubes = vsa and sta.cube_sizes{ canvas = canvas, cube = cube }:numel() or 0
if vsa then S = cubes * cube[1] * cube[2] * cube[3] end
local function topk_of(step) -- the key cubes a VSA layer selects at step
  return step < opts.full_steps and cubes or sta.vsa_topk(opts.sparsity, cubes)
end

-- the mask strategy
local strategy, source
if vsa then
  source = ("VSA, cube %s, %d cubes, sparsity %g (every cube for %d steps)"):format(
    cli.fmt_triple(cube), cubes, opts.sparsity, opts.full_steps)
elseif os.getenv("STA_ATTENTION_CONFIG") and os.getenv("STA_ATTENTION_CONFIG") ~= "" then
  local s, msg = sta.strategy.default()
  if not s then io.stderr:write("pipeline: ", msg, "\n") os.exit(1) end
  strategy, source = s, os.getenv("STA_ATTENTION_CONFIG")
  strategy:check(opts.steps, L, H) -- raises naming the first missing key
else
  strategy = sta.strategy.uniform{ steps = opts.steps, layers = L, heads = H, window = window,
    full = grid, full_steps = opts.full_steps }
  source = ("uniform %s, full %s for %d steps"):format(cli.fmt_triple(window), cli.fmt_triple(grid),
    opts.full_steps)
end

say("sta %s pipeline: %s on %s (%s)\n", sta.info().version, dtype, device,
  device == "cpu" and sta.info().cpu or sta.info().cuda)
if vsa then
  say("  canvas %s, %d video tokens in %d rows of cube order; %d layers x %d heads x D %d\n",
    cli.fmt_triple(canvas), V, S, L, H, D)
else
  say("  canvas %s, tile %s, grid %s, %d video + %d text tokens; %d layers x %d heads x D %d\n",
    cli.fmt_triple(canvas), cli.fmt_triple(tile), cli.fmt_triple(grid), V, opts.text, L, H, D)
end
if vsa then say("  attention: %s\n", source)
else say("  strategy: %s; sparsity %.3f\n", source, strategy:sparsity(grid)) end

-- layers, named as a DiT names its modules (layer index from the prefix)
local layers = {}
for l = 0, L - 1 do
  local prefix = ("transformer.blocks.%d.attn.impl"):format(l)
  layers[l] = vsa and sta.layer{ prefix = prefix, heads = H, head_dim = D, canvas = canvas,
      mode = "vsa", cube = cube, dense_steps = opts.full_steps, backend = device }
    or sta.layer{ prefix = prefix, heads = H, head_dim = D, canvas = canvas, tile = tile,
      text_len = opts.text, backend = device }
end

-- latent (video rows) and the two prompts' text rows, drawn on the device
-- (the same values on every device: a counter-based generator)
local function randn(rows, seed)
  return sta.randn({ 1, rows, H, D }, { seed = seed, dtype = dtype, device = device })
end
local latent = randn(V, opts.seed)
local text_rows = { pos = opts.text > 0 and randn(opts.text, opts.seed + 1),
  neg = opts.text > 0 and randn(opts.text, opts.seed + 2) }
if vsa then -- the latent in cube order (padding rows 0) and each prompt's conditioning
  latent = sta.to_cubes(latent, { canvas = canvas, cube = cube })
  text_rows = { pos = randn(S, opts.seed + 1):scale(0.1), neg = randn(S, opts.seed + 2):scale(0.1) }
end

-- each pass's hidden sequence and its layers' outputs: two buffers per
-- pass, reused every step; every operation below runs on the device
local bufs = {}
for _, pass in ipairs{ "pos", "neg" } do
  bufs[pass] = { sta.tensor({ 1, S, H, D }, { dtype = dtype, device = device }),
    sta.tensor({ 1, S, H, D }, { dtype = dtype, device = device }) }
end

-- the hidden sequence of one pass: latent rows, then the prompt's text rows
local function hidden(pass)
  local h = bufs[pass][1]
  if vsa then return h:add(latent, text_rows[pass]) end
  h:narrow(2, 1, V):copy(latent)
  if opts.text > 0 then h:narrow(2, V + 1, opts.text):copy(text_rows[pass]) end
  return h
end

local batch = sta.forward_batch{ batch_size = 1 }
local flops_per_step, attn_time, total_flops, forwards = 0, 0, 0, 0
local step_times, fwd_times, layer_times = {}, {}, {}
for l = 0, L - 1 do layer_times[l + 1] = {} end
local bar = cli.progress(opts.steps * 2 * L, "denoising")
local t_start, moved = sta.now(), sta.transfer_bytes()

for step = 0, opts.steps - 1 do
  local t0 = sta.now()
  local md = not vsa and sta.metadata.from_strategy(strategy, step, L, H) or nil
  batch:vsa_sparsity(opts.sparsity) -- per step, as SGLang's VSA_sparsity
  local preds = {}
  for _, pass in ipairs{ "pos", "neg" } do
    batch:negative(pass == "neg")
    local h = hidden(pass)
    local ctx <close> = sta.forward_context{ step = step, metadata = md, batch = batch }
    for l = 0, L - 1 do
      if device ~= "cpu" then sta.synchronize() end -- time the attention alone
      local ta = sta.now()
      local out = layers[l]:forward(h, h, h, bufs[pass][2 - l % 2])
      if device ~= "cpu" then sta.synchronize() end
      fwd_times[#fwd_times + 1] = sta.now() - ta
      table.insert(layer_times[l + 1], fwd_times[#fwd_times])
      attn_time = attn_time + fwd_times[#fwd_times]
      if vsa then -- the fine branch's selected work, taking each selected cube as a whole one's share
        total_flops = total_flops + 4 * D * H * V * V * topk_of(step) / cubes
      else
        total_flops = total_flops + sta.flops{ canvas = canvas, tile = tile, text_len = opts.text,
          window = md:row(l), seq_len = S, heads = H, head_dim = D }
      end
      forwards = forwards + 1
      h = out
      bar:update(step * 2 * L + (pass == "neg" and L or 0) + l + 1,
        ("step %d/%d %s layer %d/%d"):format(step + 1, opts.steps, pass, l + 1, L))
    end
    preds[pass] = h
  end
  -- guided prediction g*pos + (1-g)*neg, then latent += dt * (pred - latent)
  local pred = preds.pos:axpby(1 - opts.guidance, preds.neg, opts.guidance)
  local dt = 1 / opts.steps
  latent:axpby(dt, vsa and pred or pred:narrow(2, 1, V), 1 - dt)
  if device ~= "cpu" then sta.synchronize() end
  local elapsed = sta.now() - t0
  step_times[#step_times + 1] = elapsed
  bar:finish()
  if vsa then
    say("step %2d/%d  topk %d/%d cubes  %8.1f ms\n", step + 1, opts.steps, topk_of(step), cubes,
      elapsed * 1e3)
  else
    say("step %2d/%d  window %-8s  sparsity %.3f  %8.1f ms\n", step + 1, opts.steps,
      cli.fmt_triple(strategy:get(step, 0, 0)),
      sta.strategy.uniform{ steps = 1, layers = 1, heads = 1, window = strategy:get(step, 0, 0) }:sparsity(grid),
      elapsed * 1e3)
  end
end
bar:finish()
local total, moved_steps = sta.now() - t_start, sta.transfer_bytes() - moved

if vsa then latent = sta.from_cubes(latent, { canvas = canvas, cube = cube }) end -- the tokens
local st = latent:stats()
local finite = st.nonfinite == 0
local function median(t)
  local sorted = table.move(t, 1, #t, 1, {})
  table.sort(sorted)
  return sorted[(#sorted + 1) // 2]
end

say("summary: %d steps x 2 passes x %d layers = %d %s forwards in %.2f s\n", opts.steps, L, forwards,
  vsa and "VSA" or "STA", total)
say("  median step %.1f ms; attention %.2f s (%.0f%% of the run), %.3f TFLOP, %.1f GFLOP/s\n",
  median(step_times) * 1e3, attn_time, 100 * attn_time / total, total_flops / 1e12,
  total_flops / attn_time / 1e9)
local by_layer = {}
for l = 1, L do by_layer[l] = ("%.2f"):format(median(layer_times[l]) * 1e3) end
say("  median layer forward %.2f ms (by layer: %s)\n", median(fwd_times) * 1e3,
  table.concat(by_layer, " / "))
if device ~= "cpu" then say("  last kernel: %s\n", sta.last_launch()) end
if vsa then
  say("  VSA sparsity %g (top %d of %d cubes) after %d dense steps; contexts left %d\n",
    batch:vsa_sparsity(), topk_of(opts.steps), cubes, opts.full_steps, sta.context_depth())
else
  say("  strategy sparsity %.3f; search records %d; contexts left %d\n", strategy:sparsity(grid),
    batch:records(false) + batch:records(true), sta.context_depth())
end
say("  host<->device bytes moved by the steps: %d\n", moved_steps)
say("  latent mean %.6f std %.6f min %.4f max %.4f, %s\n", st.mean, st.std, st.min, st.max,
  finite and "all finite" or "NOT FINITE")
if not finite or sta.context_depth() ~= 0 then os.exit(1) end
say("ok\n")
end

cli.main("pipeline", main, usage)
