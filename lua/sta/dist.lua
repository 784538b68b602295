--[[
sta.dist -- sequence parallelism (Ulysses) for Lua:  local dist = require "sta.dist"

P ranks each hold V/P video tokens of ALL heads plus every text row:
q, k, v are [B, V/P + text, H, D] (BSHD; or BHSD), rank r holding video
tokens r*V/P .. (r+1)*V/P - 1.  SP attention gathers the whole video for the
rank's heads r*H/P .. (r+1)*H/P - 1 (all-to-all), runs STA with those GLOBAL
heads' windows, and brings the output back to the token split, head chunk
by head chunk so the exchanges of one chunk run while another computes.
V % P and H % P must be 0.  Before any data moves the ranks compare their
calls and all raise the same error when they disagree.

  dist.init()                     a communicator for the launcher's world
                                  (scripts/sta-launch, torchrun, mpirun or
                                  srun: see dist.world), NCCL unless
                                  STA_DIST_BACKEND=tcp; raises without NCCL
                                  or a GPU (as "st attn not supported"
                                  does); nil, message, code when NCCL, the
                                  rendezvous or a file fails
  dist.init{rank=, size=, id_file=, device=, backend="nccl"|"tcp"}
                                  id_file: a path or tcp://HOST:PORT
  dist.loopback(P)                P communicators of one in-process world
  dist.world() -> rank, size, local_rank, launcher ("sta-launch",
                                  "torchrun", "mpirun", "srun" or nil), from
                                  the environment without a communicator
  dist.rank(), dist.size(), dist.local_rank()
  comm:rank() comm:size() comm:name() comm:barrier()
  comm:set_chunks(n) comm:chunks()   head chunks of the pipeline (0: chosen)
  comm:all_to_all(send, recv)     comm:all_gather(send, recv)
  comm:attention(q, k, v, opts)   opts as sta.attention on the WHOLE problem:
                                  canvas= (or geometry=), tile=, text_len=,
                                  window= ({Kt,Kh,Kw} or one per global head),
                                  layout=, scale=, out=
  dist.run_attention(comms, qs, ks, vs, opts) -> outs   (loopback: a thread
                                  per rank)
  dist.shard(full, opts, rank, size) -> the rank's shard (new tensor)
  dist.unshard(shards, opts) -> the full tensor
  dist.layer(comm, opts)          an SP layer; opts as sta.layer but heads =
                                  the GLOBAL heads and canvas= required
  layer:forward(q, k, v [, out])  (reads the live forward context)
  dist.run_layers(comms, layers, qs, ks, vs) -> outs   (replays the caller's
                                  live context on every rank's thread)
]]
local core = require "sta.core"

local path = assert(package.searchpath("sta.core", package.cpath))
local open = assert(package.loadlib(path, "luaopen_sta_dist"))
local C = open()

local options = require "sta.options"

local dist = {}
dist.loopback = C.loopback

-- dist.init's own keys (a transport, not an attention: not in sta.options)
local INIT_KEYS = { rank = true, size = true, id_file = true, device = true, backend = true }

local function check_keys(opts, keys, list)
  for k in pairs(opts) do
    if not keys[k] then
      error(("options: unknown key '%s' (known: %s)"):format(tostring(k), list), 0)
    end
  end
end

--- opts of an SP call checked against sta.options (call "sp_attention" or
-- "sp_layer"), normalized.
local function checked(call, opts)
  return options.check(call, opts, "lua")
end

-- (of normalized options)
local function geometry_of(opts)
  if opts.geometry ~= nil then return opts.geometry end
  if opts.canvas == nil then
    error("canvas: sequence parallelism needs the canvas {T, H, W} (or geometry=)", 0)
  end
  return core.geometry { canvas = opts.canvas, tile = opts.tile, text_len = opts.text_len }
end

local function like(t)
  return core.tensor(t:shape(), { dtype = t:dtype(), device = t:device() })
end

--- This process's rank, world size, local rank and launcher, from the
-- environment (sta_comm_env: the first of sta-launch's STA_*, torchrun's,
-- mpirun's OMPI_COMM_WORLD_* and srun's SLURM_* that is set).
dist.world = C._env
function dist.rank() return (C._env()) end
function dist.size() return select(2, C._env()) end
function dist.local_rank() return select(3, C._env()) end

--- A communicator: from the environment (no argument) or explicit settings
-- {rank=, size=, id_file=, device=, backend=} (backend "nccl", the default,
-- or "tcp": CPU processes).  No NCCL library or no GPU raises (STA_ERR_BACKEND,
-- as sta.tensor{device="cuda"} does); a failure of NCCL, the network or a
-- file: nil, message, code.
function dist.init(opts)
  if opts == nil then return C._init() end
  if type(opts) ~= "table" then
    error(("options: expected a table, got %s"):format(type(opts)), 0)
  end
  check_keys(opts, INIT_KEYS, "rank, size, id_file, device, backend")
  return C._init(opts.rank or 0, opts.size or 1, opts.id_file, opts.device or -1, opts.backend)
end

local comm_methods = debug.getregistry()["sta.Comm"].methods

--- comm:attention(q, k, v, opts) -> out: this rank's shard of the output.
function comm_methods.attention(comm, q, k, v, opts)
  opts = checked("sp_attention", opts)
  local g = geometry_of(opts)
  local out = opts.out or like(q)
  return C._attention(comm, g, opts.window, opts.layout, opts.scale, q, k, v, out)
end

--- Run SP attention on every rank of a loopback world (one thread each).
function dist.run_attention(comms, qs, ks, vs, opts)
  local outs = type(opts) == "table" and opts.out or nil -- a list, one per rank
  if outs ~= nil then
    local o = {}
    for key, val in pairs(opts) do if key ~= "out" then o[key] = val end end
    opts = o
  end
  opts = checked("sp_attention", opts)
  local g = geometry_of(opts)
  if outs == nil then
    outs = {}
    for r, q in ipairs(qs) do outs[r] = like(q) end
  end
  return C._run_attention(comms, g, opts.window, opts.layout, opts.scale, qs, ks, vs, outs)
end

local function layout_dims(layout)
  if layout == "bhsd" then return 3, 2 end
  return 2, 3
end

--- The rank's shard of a full [B, S, H, D] tensor: its V/size video rows
-- and every text row.
function dist.shard(full, opts, rank, size)
  opts = checked("sp_shard", opts)
  local g = geometry_of(opts)
  local shape = full:shape()
  local sdim = layout_dims(opts.layout)
  local v = g:video_tokens()
  if v % size ~= 0 then
    error(("canvas: V = %d video tokens is not divisible by the %d ranks"):format(v, size), 0)
  end
  shape[sdim] = v // size + (shape[sdim] - v)
  local t = core.tensor(shape, { dtype = full:dtype(), device = full:device() })
  return C._shard(t, full, g, opts.layout, rank, size, false)
end

--- The full tensor from every rank's shard (shards[r + 1] is rank r's).
function dist.unshard(shards, opts)
  opts = checked("sp_shard", opts)
  local g = geometry_of(opts)
  local size = #shards
  local shape = shards[1]:shape()
  local sdim = layout_dims(opts.layout)
  local v = g:video_tokens()
  shape[sdim] = v + (shape[sdim] - v // size)
  local full = core.tensor(shape, { dtype = shards[1]:dtype(), device = shards[1]:device() })
  for r = 1, size do C._shard(shards[r], full, g, opts.layout, r - 1, size, true) end
  return full
end

local layer_methods = debug.getregistry()["sta.SPLayer"].methods

--- dist.layer(comm, {prefix= or layer=, heads= (global), head_dim=, canvas=,
-- tile=, text_len=, layout=, device=, scale=, strategy=})
function dist.layer(comm, opts)
  opts = checked("sp_layer", opts)
  local size = comm:size()
  local heads = opts.heads
  if heads % size ~= 0 then
    error(("heads: %d heads are not divisible by the %d ranks"):format(heads, size), 0)
  end
  local o = {}
  for k, v in pairs(opts) do o[k] = v end
  o.heads = heads // size
  return C._layer(comm, geometry_of(opts), opts.layout, o)
end

function layer_methods.forward(layer, q, k, v, out)
  return layer:_forward(q, k, v, out or like(q))
end

--- Every rank's SP layer forward on a loopback world, under the caller's
-- live forward context (replayed on each rank's thread).
function dist.run_layers(comms, layers, qs, ks, vs)
  local outs = {}
  for r, q in ipairs(qs) do outs[r] = like(q) end
  return C._run_layers(comms, layers, qs, ks, vs, outs)
end

return dist
