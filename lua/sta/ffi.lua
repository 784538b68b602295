--[[
sta.ffi -- LuaJIT FFI binding of libsta.so, straight from core/sta.h.

  local S = require "sta.ffi"          -- under luajit
  S.C.sta_version()                     -- every sta_* function of sta.h
  local q = S.randn({1, 296, 2, 64}, 1) -- helpers own their cdata (ffi.gc)

The declarations between the STA_DECLS_BEGIN / STA_DECLS_END markers of
sta.h are fed to ffi.cdef with comments stripped, so the header is the one
source.  The header is looked for in $STA_HEADER, next to this file's
repository (core/sta.h), under the prefix this file is installed in
(PREFIX/share/lua/5.1/sta/ffi.lua -> PREFIX/include/sta.h, as `make install`
lays it out) and in /usr/local/include and /usr/include; the library in
$STA_LIB, then $STA_BUILD (or $BUILD, else build)/libsta.so of the
repository, then PREFIX/lib/libsta.so, then the system's "sta".
Errors: helpers raise sta_last_error() (exact message, no position) for
any failed call, or a message naming the bad argument (a nil tensor, an
unknown dtype or option); raw C calls return a status you check yourself
(every function of sta.h takes NULL/nil without crashing).
]]
local ffi = require "ffi"

local M = { ffi = ffi }

local function dirname(p) return p:match("^(.*)/[^/]*$") or "." end
local here = debug.getinfo(1, "S").source:match("^@(.*)$") or "lua/sta/ffi.lua"
local repo = dirname(dirname(dirname(here))) -- lua/sta/ffi.lua -> repository root
-- installed: PREFIX/share/lua/<version>/sta/ffi.lua
local prefix = here:match("^(.*)/share/lua/[^/]+/sta/ffi%.lua$")

local function readable(p)
  local f = p and io.open(p, "r")
  if f then f:close() return true end
  return false
end

local function first(cands)
  for _, p in ipairs(cands) do if readable(p) then return p end end
end

--- The declaration block of sta.h with comments removed.
function M.declarations(header_text)
  local block = header_text:match("/%* STA_DECLS_BEGIN %*/(.-)/%* STA_DECLS_END %*/")
  if not block then error("sta.h: no STA_DECLS_BEGIN/STA_DECLS_END block", 0) end
  block = block:gsub("/%*.-%*/", " "):gsub("//[^\n]*", "")
  if block:find("\n%s*#") then error("sta.h: preprocessor line inside the declaration block", 0) end
  return block
end

M.header = os.getenv("STA_HEADER") or first{ repo .. "/core/sta.h",
  prefix and prefix .. "/include/sta.h", "/usr/local/include/sta.h", "/usr/include/sta.h" }
if not M.header then error("sta.ffi: cannot find sta.h (set STA_HEADER)", 0) end
do
  local f = assert(io.open(M.header, "r"))
  M.decls = M.declarations(f:read("*a"))
  f:close()
end
ffi.cdef(M.decls)

local build = os.getenv("STA_BUILD") or os.getenv("BUILD") or "build"
if build:sub(1, 1) ~= "/" then build = repo .. "/" .. build end
M.library = os.getenv("STA_LIB") or first{ build .. "/libsta.so", prefix and prefix .. "/lib/libsta.so" }
  or "sta"
M.C = ffi.load(M.library)
local C = M.C
-- LuaJIT unloads the library when the state closes, under the feet of its
-- OpenMP/OpenBLAS worker threads (a crash at exit): mark it RTLD_NODELETE.
pcall(function()
  ffi.cdef("void *dlopen(const char *file, int mode);")
  local RTLD_NOW, RTLD_NOLOAD, RTLD_NODELETE = 2, 4, 0x1000
  if M.library:find("/", 1, true) then ffi.C.dlopen(M.library, RTLD_NOW + RTLD_NOLOAD + RTLD_NODELETE) end
end)

--- Raise the last error when rc is not STA_OK.
function M.check(rc)
  rc = tonumber(rc)
  if rc ~= 0 then error(ffi.string(C.sta_last_error()), 0) end
end

function M.last_error() return ffi.string(C.sta_last_error()), tonumber(C.sta_last_status()) end

local devices = { cpu = C.STA_CPU, cuda = C.STA_CUDA }
local tensor_ptr = ffi.typeof("sta_tensor *")

-- Arguments: misuse raises naming the argument, as the C module does.
local function bad(fmt, ...) error(fmt:format(...), 0) end

-- Options are checked against sta.options (lua/sta/options.lua, next to
-- this file), the schema every binding shares: the same keys, kinds,
-- ranges and messages as the Lua module and Python.
local options = dofile(dirname(here) .. "/options.lua")
M.options = options
local SIZE, SEED = { kind = "int64", min = 0 }, { kind = "int64" }

local function check_tensor(t, name)
  if type(t) ~= "cdata" or not ffi.istype(tensor_ptr, t) or t == nil then
    error(("%s: expected a tensor, got %s"):format(name, t == nil and "nil" or type(t)), 0)
  end
  return t
end

--- A dtype name ("f32", "bf16", ...) as sta_dtype; the core's message when unknown.
function M.dtype(name)
  if type(name) ~= "string" then bad("dtype: expected a name, got %s", type(name)) end
  local d = ffi.new("sta_dtype[1]")
  M.check(C.sta_dtype_parse(name, d))
  return d[0]
end

local function device(name)
  local d = devices[name or "cpu"]
  if not d then bad("device: expected \"cpu\" or \"cuda\", got %s", tostring(name)) end
  return d
end

--- New contiguous tensor owned by the collector.
function M.tensor(shape, dtype, dev)
  if type(shape) ~= "table" then bad("shape: expected a list of sizes, got %s", type(shape)) end
  for i = 1, #shape do options.check_value(("shape[%d]"):format(i), shape[i], SIZE) end
  local dims = ffi.new("int64_t[?]", math.max(#shape, 1), shape)
  local out = ffi.new("sta_tensor *[1]")
  M.check(C.sta_tensor_create(out, M.dtype(dtype or "f32"), device(dev), #shape, dims))
  return ffi.gc(out[0], C.sta_tensor_destroy)
end

function M.randn(shape, seed, dtype)
  if seed ~= nil then options.check_value("seed", seed, SEED) end
  local t = M.tensor(shape, dtype)
  M.check(C.sta_tensor_randn(t, seed or 0, 0, 1))
  return t
end

local function is_a(v, class)
  return class == "tensor" and type(v) == "cdata" and ffi.istype(tensor_ptr, v) and v ~= nil
end

local ORDERS = { untiled = C.STA_ORDER_UNTILED, tiled = C.STA_ORDER_TILED }
local LAYOUTS = { bshd = C.STA_BSHD, bhsd = C.STA_BHSD }
local SOFTMAX = { exact = C.STA_SOFTMAX_EXACT, fast = C.STA_SOFTMAX_FAST }
local PRECISIONS = { native = C.STA_PRECISION_NATIVE, fp8 = C.STA_PRECISION_FP8 }

--- An sta_attention_desc from the options of call (default "attention";
-- sta.options: canvas=, tile=, text_len=, order=, layout=, window= (one,
-- or one per head), scale=, softmax=, precision=, deterministic=, and the
-- call's out=, lse=, dq=...), checked; absent ones are the core's defaults
-- (no canvas: the known shape of q's sequence length).  Returns the
-- descriptor, the window array it points to (keep it alive with the
-- descriptor) and the normalized options.
function M.desc(o, q, call)
  o = options.check(call or "attention", o, "ffi", is_a)
  local d = ffi.new("sta_attention_desc")
  local c = o.canvas
  if c then
    C.sta_geometry_init(d.geom, c[1], c[2], c[3])
  else
    if q == nil then bad("canvas: required when no q is given (the known shape of q's length)") end
    local s = C.sta_tensor_ndim(q) == 4 and C.sta_tensor_size(q, o.layout == "bhsd" and 2 or 1) or -1
    M.check(C.sta_geometry_from_seq_len(d.geom, s))
  end
  if o.tile then for i = 0, 2 do d.geom.tile[i] = o.tile[i + 1] end end
  if o.text_len then d.geom.text_len = o.text_len end
  if o.order then d.geom.order = ORDERS[o.order] end
  if o.layout then d.layout = LAYOUTS[o.layout] end
  local wins = type(o.window[1]) == "table" and o.window or { o.window }
  local flat = {}
  for _, w in ipairs(wins) do for a = 1, 3 do flat[#flat + 1] = w[a] end end
  local arr = ffi.new("int32_t[?]", #flat, flat)
  d.n_windows = #wins
  d.windows = arr
  if o.scale then d.scale = o.scale end -- absent: 0, the core's 1/sqrt(D)
  if o.softmax then d.softmax = SOFTMAX[o.softmax] end
  if o.precision then d.precision = PRECISIONS[o.precision] end
  if o.deterministic then d.deterministic = 1 end
  return d, arr, o
end

function M.shape(t)
  check_tensor(t, "t")
  local s = {}
  for i = 0, C.sta_tensor_ndim(t) - 1 do s[i + 1] = tonumber(C.sta_tensor_size(t, i)) end
  return s
end

local device_names = { [tonumber(C.STA_CPU)] = "cpu", [tonumber(C.STA_CUDA)] = "cuda" }

--- A new tensor of t's shape, dtype and device.
function M.like(t)
  return M.tensor(M.shape(t), ffi.string(C.sta_dtype_name(C.sta_tensor_dtype(t))),
                  device_names[tonumber(C.sta_tensor_device(t))])
end

-- The lse to write when o.lse: o.lse itself if a tensor, else a new f32
-- [B, heads, S] on q's device; nil without o.lse.
local function new_lse(q, o)
  if not o.lse then return nil end
  if o.lse ~= true then return o.lse end
  local s = M.shape(q)
  local b, h, n = s[1], s[3], s[2]
  if o.layout == "bhsd" then h, n = s[2], s[3] end
  return M.tensor({ b, h, n }, "f32", device_names[tonumber(C.sta_tensor_device(q))])
end

--- out = STA(q, k, v) (reference = true: the brute-force reference); with
-- o.lse also the f32 [B, heads, S] log-sum-exp (o.lse a tensor: written
-- there); o.out: the output to write.
function M.attention(q, k, v, o, reference)
  check_tensor(q, "q")
  check_tensor(k, "k")
  check_tensor(v, "v")
  local d, keep
  d, keep, o = M.desc(o, q, reference and "reference" or "attention")
  local out, lse = o.out or M.like(q), new_lse(q, o)
  local f = reference and C.sta_attention_reference or C.sta_attention_forward
  M.check(f(d, q, k, v, out, lse))
  local _ = keep
  if lse then return out, lse end
  return out
end

--- out = STA of 8-bit operands (f8e4m3) with their f32 scales
-- (sta_attention_forward_fp8: q_scale, k_scale [B, heads, S], v_scale [B,
-- heads, D]); o as for attention (precision fp8 unless given), plus o.dtype
-- of a new out ("f32", the default, "f16" or "bf16").
function M.attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, o)
  local names = { "q8", "k8", "v8", "q_scale", "k_scale", "v_scale" }
  for i, t in ipairs{ q8, k8, v8, q_scale, k_scale, v_scale } do check_tensor(t, names[i]) end
  local d, keep
  d, keep, o = M.desc(o, q8, "attention_fp8")
  if not o.precision then d.precision = C.STA_PRECISION_FP8 end
  local out = o.out or M.tensor(M.shape(q8), o.dtype or "f32",
                                device_names[tonumber(C.sta_tensor_device(q8))])
  local lse = new_lse(q8, o)
  M.check(C.sta_attention_forward_fp8(d, q8, k8, v8, q_scale, k_scale, v_scale, out, lse))
  local _ = keep
  if lse then return out, lse end
  return out
end

--- dq, dk, dv of out = STA(q, k, v) for dout (STA.md section 10); o as for
-- attention (deterministic= too), plus dq=, dk=, dv= to write into.
function M.attention_backward(q, k, v, out, lse, dout, o)
  local d, keep
  d, keep, o = M.desc(o, q, "attention_backward")
  local dq, dk, dv = o.dq or M.like(q), o.dk or M.like(q), o.dv or M.like(q)
  M.check(C.sta_attention_backward(d, q, k, v, out, lse, dout, dq, dk, dv))
  local _ = keep
  return dq, dk, dv
end

--- max |a-b|, ||a-b|| / ||b||
function M.compare(a, b)
  check_tensor(a, "a")
  check_tensor(b, "b")
  local m, r = ffi.new("double[1]"), ffi.new("double[1]")
  M.check(C.sta_tensor_compare(a, b, m, r))
  return m[0], r[0]
end

return M
