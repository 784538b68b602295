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
  local dims = ffi.new("int64_t[?]", math.max(#shape, 1), shape)
  local out = ffi.new("sta_tensor *[1]")
  M.check(C.sta_tensor_create(out, M.dtype(dtype or "f32"), device(dev), #shape, dims))
  return ffi.gc(out[0], C.sta_tensor_destroy)
end

function M.randn(shape, seed, dtype)
  local t = M.tensor(shape, dtype)
  M.check(C.sta_tensor_randn(t, seed or 0, 0, 1))
  return t
end

local DESC_KEYS = { canvas = true, tile = true, text_len = true, order = true, window = true,
                    windows = true, layout = true, scale = true, lse = true, deterministic = true,
                    precision = true }
local ORDERS = { untiled = C.STA_ORDER_UNTILED, tiled = C.STA_ORDER_TILED }
local PRECISIONS = { native = C.STA_PRECISION_NATIVE, fp8 = C.STA_PRECISION_FP8 }

--- An sta_attention_desc from {canvas=, tile=, text_len=, order= ("untiled"
-- or "tiled": FastVideo's tiled token order, read in place), window= or
-- windows=, layout=, scale=, precision= ("native" or "fp8": sta.h's
-- sta_precision, never chosen for the caller)}; keeps the window array
-- alive in the result.
-- canvas and a window (or windows, one per head) are required; an unknown
-- key raises naming it.
function M.desc(o)
  if type(o) ~= "table" then bad("options: expected a table, got %s", type(o)) end
  for k in pairs(o) do
    if not DESC_KEYS[k] then bad("options: unknown key '%s'", tostring(k)) end
  end
  if type(o.canvas) ~= "table" then bad("canvas: expected {T, H, W}, got %s", type(o.canvas)) end
  if o.window == nil and o.windows == nil then
    bad("window: required ({Kt, Kh, Kw} for every head, or windows = one per head)")
  end
  local d = ffi.new("sta_attention_desc")
  C.sta_geometry_init(d.geom, o.canvas[1], o.canvas[2], o.canvas[3])
  if o.tile then for i = 0, 2 do d.geom.tile[i] = o.tile[i + 1] end end
  d.geom.text_len = o.text_len or -1
  if o.order ~= nil and not ORDERS[o.order] then
    bad("order: expected \"untiled\" or \"tiled\", got '%s'", tostring(o.order))
  end
  d.geom.order = ORDERS[o.order or "untiled"]
  d.layout = o.layout == "bhsd" and C.STA_BHSD or C.STA_BSHD
  local wins = o.windows or { o.window }
  local flat = {}
  for _, w in ipairs(wins) do for a = 1, 3 do flat[#flat + 1] = w[a] end end
  local arr = ffi.new("int32_t[?]", #flat, flat)
  d.n_windows = #wins
  d.windows = arr
  d.scale = o.scale or 0
  if o.precision ~= nil and not PRECISIONS[o.precision] then
    bad("precision: expected \"native\" or \"fp8\", got '%s'", tostring(o.precision))
  end
  d.precision = PRECISIONS[o.precision or "native"]
  return d, arr
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

-- The f32 [B, heads, S] log-sum-exp of a BSHD q when o.lse, else nil.
local function new_lse(q, o)
  if not o.lse then return nil end
  local s = M.shape(q)
  return M.tensor({ s[1], s[3], s[2] }, "f32", device_names[tonumber(C.sta_tensor_device(q))])
end

--- out = STA(q, k, v) (reference = true: the brute-force reference); with
-- o.lse also the f32 [B, heads, S] log-sum-exp (BSHD).
function M.attention(q, k, v, o, reference)
  check_tensor(q, "q")
  check_tensor(k, "k")
  check_tensor(v, "v")
  local d, keep = M.desc(o)
  local out, lse = M.like(q), new_lse(q, o)
  local f = reference and C.sta_attention_reference or C.sta_attention_forward
  M.check(f(d, q, k, v, out, lse))
  local _ = keep
  if lse then return out, lse end
  return out
end

--- out = STA of 8-bit operands (f8e4m3) with their f32 scales
-- (sta_attention_forward_fp8: q_scale, k_scale [B, heads, S], v_scale [B,
-- heads, D]); o as for attention (precision fp8 unless given), plus o.dtype
-- of out ("f32", the default, "f16" or "bf16").
function M.attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, o)
  local names = { "q8", "k8", "v8", "q_scale", "k_scale", "v_scale" }
  for i, t in ipairs{ q8, k8, v8, q_scale, k_scale, v_scale } do check_tensor(t, names[i]) end
  if type(o) ~= "table" then bad("options: expected a table, got %s", type(o)) end
  local od = {}
  for key, val in pairs(o) do if key ~= "dtype" then od[key] = val end end
  od.precision = od.precision or "fp8"
  local d, keep = M.desc(od)
  local out = M.tensor(M.shape(q8), o.dtype or "f32", device_names[tonumber(C.sta_tensor_device(q8))])
  local lse = new_lse(q8, o)
  M.check(C.sta_attention_forward_fp8(d, q8, k8, v8, q_scale, k_scale, v_scale, out, lse))
  local _ = keep
  if lse then return out, lse end
  return out
end

--- dq, dk, dv of out = STA(q, k, v) for dout (STA.md section 10); o as for
-- attention, plus o.deterministic.
function M.attention_backward(q, k, v, out, lse, dout, o)
  local d, keep = M.desc(o)
  d.deterministic = o.deterministic and 1 or 0
  local dq, dk, dv = M.like(q), M.like(q), M.like(q)
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
