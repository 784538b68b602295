--[[
sta -- Sliding Tile Attention for Lua 5.4:  local sta = require "sta"

The C module sta.core binds core/sta.h; this file arranges it into the
documented API (namespaces, file loading by extension, helpers).

Errors follow Lua's io library: misuse raises an error whose value is the
exact message (STA.md section 9 messages arrive verbatim, no position
prefix); failures of the environment -- out of memory, device failures,
missing or malformed files -- return nil, message, code (sta.status.*).

Indices: tensor dimensions and element indices are 1-based; steps, layers,
heads and tile coordinates are 0-based, as in STA.md and strategy files.

  sta.tensor(shape, {dtype=, device=})     sta.randn(shape, {seed=, ...})
  sta.zeros(shape, opts)                   sta.from_table(values, shape, opts)
  sta.load(path [, name | {bf16=true}])    t:save(path)
  sta.load_safetensors(path)               sta.save_safetensors(path, {name=t})
  sta.geometry{canvas=, tile=, text_len=, order=}  sta.attention(q, k, v, opts)
  sta.reference(q, k, v, opts)             sta.strategy.new/load/parse/uniform/default
  sta.block_sparse(q, k, v, {idx=, ...})   sta.vsa(q, k, v, {canvas=, sparsity=, ...})
  sta.block_sparse_backward / sta.vsa_backward(q, k, v, out, lse, dout, opts)
  sta.vsa_reference(q, k, v, opts) / sta.vsa_backward_reference(q, k, v, out, lse, dout, opts)
  sta.vsa_coarse(q, k, v, opts) -> out_c, lse_c, idx, num
  sta.to_cubes / sta.from_cubes(x, {canvas=, cube=})  sta.cube_sizes{canvas=, cube=}
  sta.metadata(layers) / .from_strategy / .search
  sta.forward_batch{batch_size=, negative=, vsa_sparsity=}
  local ctx <close> = sta.forward_context{step=, metadata=, batch=}
  sta.layer{..., mode = "vsa"}:forward(q, k, v [, out])  sta.tune{files=, skip_steps=, full=}
  sta.backends()  sta.info()  sta.transfer_bytes()  sta.last_launch()  sta.debug.live_tensors()
  sta.now()
  tensor methods: shape size strides dtype device ndim numel to clone copy
    view permute narrow select get set fill randn totable compare save
    axpby scale add stats release;  t[i], #t, tostring(t), <close>
  sta.svg (pictures of masks), sta.dist (sequence parallelism), sta.cli (example helpers), sta.ffi (LuaJIT)
]]
local core = require "sta.core"
local options = require "sta.options"

local sta = {}
for k, v in pairs(core) do sta[k] = v end
sta.core = core
sta._VERSION = "sta " .. core.version

local function ends_with(s, suffix)
  return s:sub(-#suffix) == suffix
end

local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  return keys
end

--- Load a tensor from .npy or .safetensors.  For .safetensors, name picks
-- the entry (optional when the file holds one); for .npy, name may be
-- {bf16 = true} (or "bf16") to read '<u2' arrays as raw bf16 bits.
function sta.load(path, name)
  if type(path) ~= "string" then
    error(("path: expected a string, got %s"):format(type(path)), 0)
  end
  if ends_with(path, ".safetensors") then
    local all, names_or_msg, code = core.load_safetensors(path)
    if not all then return nil, names_or_msg, code end
    if name ~= nil then
      local t = all[name]
      if not t then
        error(("name: no tensor '%s' in %s (has %s)"):format(tostring(name), path,
          table.concat(names_or_msg, ", ")), 0)
      end
      return t
    end
    if #names_or_msg ~= 1 then
      error(("name: %s holds %d tensors (%s); give a name"):format(path, #names_or_msg,
        table.concat(names_or_msg, ", ")), 0)
    end
    return all[names_or_msg[1]]
  end
  local bf16 = name == "bf16" or (type(name) == "table" and name.bf16)
  return core.npy_load(path, bf16 and true or false)
end

-- Contexts -----------------------------------------------------------------

--- Push a forward context: {step=, metadata=, batch=}, or {step=,
-- strategy=, layers=, heads=, batch=} to build the step's metadata from a
-- strategy.  Use as a to-be-closed value:
--   local ctx <close> = sta.forward_context{step = 3, metadata = md, batch = fb}
function sta.forward_context(opts)
  opts = options.check("forward_context", opts, "lua")
  if opts.strategy ~= nil then
    local md = core.metadata.from_strategy(opts.strategy, opts.step, opts.layers, opts.heads or 1)
    opts = { step = opts.step, metadata = md, batch = opts.batch }
  end
  return core.forward_context(opts)
end

--- Run fn(ctx, ...) inside a forward context; the context is popped on
-- return and when fn raises.
function sta.with_context(opts, fn, ...)
  local ctx <close> = sta.forward_context(opts)
  return fn(ctx, ...)
end

-- Backends ------------------------------------------------------------------------
--- The default device: "cuda" when STA_DEVICE says so or a GPU answers,
-- else "cpu".  STA_DEVICE=cpu forces the CPU.
function sta.default_device()
  local env = os.getenv("STA_DEVICE")
  if env and env ~= "" then return env end
  return core.backend_available("cuda") and "cuda" or "cpu"
end

--- Tensor methods written in Lua go on the shared method table.
local tensor_methods = debug.getregistry()["sta.Tensor"].methods

--- t:info() -- the one-line description without values.
function tensor_methods.info(t)
  return ("sta.Tensor(%s, %s, %s)"):format(t:dtype(), t:device(),
    table.concat(t:shape(), "x"))
end

-- t:totable() and t:stats() print readably (the REPL prints with tostring)
local function fmt_number(x)
  return math.type(x) == "integer" and tostring(x) or ("%.6g"):format(x)
end
local list_mt = { __tostring = function(t)
  local parts, n = {}, #t
  for i = 1, math.min(n, 16) do parts[i] = fmt_number(t[i]) end
  if n > 16 then parts[#parts + 1] = ("... (%d values)"):format(n) end
  return "{" .. table.concat(parts, ", ") .. "}"
end }
local stats_mt = { __tostring = function(s)
  local parts = {}
  for _, k in ipairs{ "mean", "std", "min", "max", "nonfinite" } do
    if s[k] ~= nil then parts[#parts + 1] = ("%s=%s"):format(k, fmt_number(s[k])) end
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end }
-- the C methods, kept once: this file may be loaded again (busted)
local class = debug.getregistry()["sta.Tensor"]
class.c_methods = class.c_methods or { totable = tensor_methods.totable, stats = tensor_methods.stats }
for name, mt in pairs{ totable = list_mt, stats = stats_mt } do
  local f = class.c_methods[name]
  tensor_methods[name] = function(...)
    local r = f(...)
    if type(r) == "table" and getmetatable(r) == nil then setmetatable(r, mt) end
    return r
  end
end

sta.sorted_keys = sorted_keys

setmetatable(sta, {
  __index = function(_, k)
    -- loaded on first use: pictures and sequence parallelism
    if k == "svg" or k == "dist" then
      local m = require("sta." .. k)
      rawset(sta, k, m)
      return m
    end
  end,
})

return sta
