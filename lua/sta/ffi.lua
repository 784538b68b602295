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

-- out (o.out, else new) and with o.lse the log-sum-exp of f(d, q, k, v,
-- out, lse, o), d from make(o, q, call, k) (M.desc, M.blocks_desc,
-- M.vsa_desc) with what it points to kept alive for the call.
local function forward(q, k, v, o, make, call, f)
  check_tensor(q, "q")
  check_tensor(k, "k")
  check_tensor(v, "v")
  local d, keep
  d, keep, o = make(o, q, call, k)
  local out, lse = o.out or M.like(q), new_lse(q, o)
  M.check(f(d, q, k, v, out, lse, o))
  local _ = keep
  if lse then return out, lse end
  return out
end

local function attention_forward(d, q, k, v, out, lse) return C.sta_attention_forward(d, q, k, v, out, lse) end
local function attention_reference(d, q, k, v, out, lse)
  return C.sta_attention_reference(d, q, k, v, out, lse)
end

--- out = STA(q, k, v) (reference = true: the brute-force reference); with
-- o.lse also the f32 [B, heads, S] log-sum-exp (o.lse a tensor: written
-- there); o.out: the output to write.
function M.attention(q, k, v, o, reference)
  return forward(q, k, v, o, M.desc, reference and "reference" or "attention",
                 reference and attention_reference or attention_forward)
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
-- dq, dk, dv (o.dq, ... else new: dq like q, dk and dv like k) of
-- sta_attention_backward with the descriptor make(o, q, call) gives.
local function backward(q, k, v, out, lse, dout, o, make, call)
  local d, keep
  d, keep, o = make(o, q, call)
  local dq, dk, dv = o.dq or M.like(q), o.dk or M.like(k), o.dv or M.like(k)
  M.check(C.sta_attention_backward(d, q, k, v, out, lse, dout, dq, dk, dv))
  local _ = keep
  return dq, dk, dv
end

function M.attention_backward(q, k, v, out, lse, dout, o)
  return backward(q, k, v, out, lse, dout, o, M.desc, "attention_backward")
end

-- ---- block lists and VSA (STA.md section 12) -------------------------------

local function device_of(t) return device_names[tonumber(C.sta_tensor_device(t))] end

-- A list (depth levels, every leaf an int32: sta.options checked them) as
-- an i32 tensor on dev; ragged: the last level padded with 0 to the
-- longest list (at least 1), and the lists' lengths returned too.
local function ints_tensor(v, name, depth, ragged, dev)
  local n = {}
  local function measure(t, lv, path)
    if lv == depth and ragged then
      n[lv] = math.max(n[lv] or 1, #t)
    elseif n[lv] == nil then
      n[lv] = #t
    elseif n[lv] ~= #t then
      bad("%s: %d entries, expected %d as the other lists at this level", path, #t, n[lv])
    end
    for i = 1, #t do
      local at = ("%s[%d]"):format(path, i)
      if lv < depth then
        if type(t[i]) ~= "table" then
          bad("%s: expected a list (%d levels of lists), got %s", at, depth, type(t[i]))
        end
        measure(t[i], lv + 1, at)
      elseif type(t[i]) ~= "number" then
        bad("%s: expected an integer, got %s", at, type(t[i]))
      end
    end
  end
  measure(v, 1, name)
  for i = 1, depth do n[i] = n[i] or 0 end
  local vals = M.tensor(n, "i32")
  local lshape = {}
  for i = 1, depth - 1 do lshape[i] = n[i] end
  local lens = ragged and depth > 1 and M.tensor(lshape, "i32") or nil
  local p = ffi.cast("int32_t *", C.sta_tensor_data(vals))
  local lp = lens and ffi.cast("int32_t *", C.sta_tensor_data(lens))
  local o, lo = 0, 0
  local function fill(t, lv)
    if lv == depth then
      for i = 1, n[lv] do p[o] = t[i] or 0; o = o + 1 end
      if lp then lp[lo] = #t; lo = lo + 1 end
      return
    end
    for i = 1, #t do fill(t[i], lv + 1) end
  end
  fill(v, 1)
  local function on(t)
    if not t or dev == "cpu" then return t end
    local d = M.tensor(M.shape(t), "i32", dev)
    M.check(C.sta_tensor_copy(d, t))
    return d
  end
  return on(vals), on(lens)
end

-- o[key] (an ints option) as an i32 tensor on dev (and the lengths of
-- ragged lists); nil when absent
local function ints_opt(o, key, depth, ragged, dev)
  local v = o[key]
  if v == nil or type(v) ~= "table" then return v end
  return ints_tensor(v, key, depth, ragged, dev)
end

--- The sta_attention_desc of a block-list call (sta.options: idx=, num=,
-- kv_sizes=, q_sizes=, block_rows=, layout=, scale=, deterministic=):
-- returns it, what it points to (keep it alive with it) and the options.
function M.blocks_desc(o, q, call)
  o = options.check(call or "block_sparse", o, "ffi", is_a)
  local dev = device_of(q)
  local d, bl = ffi.new("sta_attention_desc"), ffi.new("sta_block_list")
  local idx, lens = ints_opt(o, "idx", 4, true, dev)
  local num = ints_opt(o, "num", 3, false, dev) or lens
  if num == nil then
    bad("num: required with an idx tensor (how many of each list's entries count: i32 [B, heads, Mq])")
  end
  local kvs, qs = ints_opt(o, "kv_sizes", 1, false, dev), ints_opt(o, "q_sizes", 1, false, dev)
  bl.block_rows = o.block_rows or 0
  bl.idx, bl.num, bl.kv_sizes, bl.q_sizes = idx, num, kvs, qs
  d.mask = C.STA_MASK_BLOCKS
  d.blocks = bl
  if o.layout then d.layout = LAYOUTS[o.layout] end
  if o.scale then d.scale = o.scale end
  if o.deterministic then d.deterministic = 1 end
  return d, { bl, idx, num, kvs, qs }, o
end

--- out = block-sparse attention of q, k, v (STA.md section 12); o: the
-- options of blocks_desc, out=, lse= (true or a tensor).
function M.block_sparse(q, k, v, o)
  return forward(q, k, v, o, M.blocks_desc, "block_sparse", attention_forward)
end

--- dq, dk, dv of block_sparse (its options, dq=, dk=, dv=).
function M.block_sparse_backward(q, k, v, out, lse, dout, o)
  return backward(q, k, v, out, lse, dout, o, M.blocks_desc, "block_sparse_backward")
end

local function canvas_cube(o)
  local canvas = ffi.new("int32_t[3]", o.canvas)
  local cube = ffi.new("int32_t[3]", o.cube or { 4, 4, 4 })
  local n = ffi.new("int64_t[1]")
  M.check(C.sta_vsa_cube_count(canvas, cube, n))
  return canvas, cube, n[0]
end

--- The sta_vsa_desc of a VSA call (sta.options: canvas=, cube=, sparsity=
-- or topk=, layout=, scale=, deterministic=; gate=): returns it, its cube
-- sizes (keep them with it) and the options.
function M.vsa_desc(o, q, call, k)
  o = options.check(call or "vsa", o, "ffi", is_a)
  local canvas, cube, n = canvas_cube(o)
  local br = cube[0] * cube[1] * cube[2]
  for _, nt in ipairs{ { "q", q }, { "k", k } } do -- the rows of the cube order
    local name, t = nt[1], nt[2]
    if t ~= nil and C.sta_tensor_ndim(t) == 4 then
      local rows = tonumber(C.sta_tensor_size(t, o.layout == "bhsd" and 2 or 1))
      if rows ~= tonumber(n) * br then
        bad("%s: %d rows, expected %d (the canvas %dx%dx%d in %d cubes of %d rows, cube order)",
            name, rows, tonumber(n) * br, canvas[0], canvas[1], canvas[2], tonumber(n), br)
      end
    end
  end
  local sizes = M.tensor({ tonumber(n) }, "i32", device_of(q))
  M.check(C.sta_vsa_cube_sizes(sizes, canvas, cube))
  local d = ffi.new("sta_vsa_desc")
  d.block_rows = br
  d.kv_sizes = sizes
  if o.topk then d.topk = o.topk
  else
    local t = ffi.new("int32_t[1]")
    M.check(C.sta_vsa_topk(o.sparsity, n, t))
    d.topk = t[0]
  end
  if o.layout then d.layout = LAYOUTS[o.layout] end
  if o.scale then d.scale = o.scale end
  if o.deterministic then d.deterministic = 1 end
  return d, sizes, o
end

--- out = VSA(q, k, v), rows in the cube order of o.canvas; o: the options
-- of vsa_desc, out=, lse=.  vsa_reference: the brute force in double
-- (sta_vsa_reference, host tensors).
local function vsa_forward(call, f)
  return function(q, k, v, o)
    return forward(q, k, v, o, M.vsa_desc, call, function(d, q_, k_, v_, out, lse, oo)
      return f(d, q_, k_, v_, oo.gate, out, lse)
    end)
  end
end
M.vsa = vsa_forward("vsa", function(...) return C.sta_vsa_forward(...) end)
M.vsa_reference = vsa_forward("vsa_reference", function(...) return C.sta_vsa_reference(...) end)

--- dq, dk, dv (and dgate with a gate) of vsa; its options, dq=, dk=, dv=,
-- dgate=.  vsa_backward_reference: those of vsa_reference in double
-- (sta_vsa_backward_reference: out and lse are not read, may be nil).
local function vsa_grads(call)
  local ref = call == "vsa_backward_reference"
  return function(q, k, v, out, lse, dout, o)
    local d, keep
    d, keep, o = M.vsa_desc(o, q, call, k)
    local dq, dk, dv = o.dq or M.like(q), o.dk or M.like(k), o.dv or M.like(k)
    local dgate = o.gate and (o.dgate or M.like(q)) or nil
    if ref then M.check(C.sta_vsa_backward_reference(d, q, k, v, o.gate, dout, dq, dk, dv, dgate))
    else M.check(C.sta_vsa_backward(d, q, k, v, o.gate, out, lse, dout, dq, dk, dv, dgate)) end
    local _ = keep
    if dgate then return dq, dk, dv, dgate end
    return dq, dk, dv
  end
end
M.vsa_backward = vsa_grads("vsa_backward")
M.vsa_backward_reference = vsa_grads("vsa_backward_reference")

--- out_c f32 [B, heads, Mq, D], lse_c f32 [B, heads, Mq], idx i32 [B,
-- heads, Mq, topk] (ascending), num i32 [B, heads, Mq]: VSA's coarse branch
-- and selection (sta_vsa_coarse) on q's device; o: canvas=, cube=,
-- sparsity= or topk=, layout=, scale=.
function M.vsa_coarse(q, k, v, o)
  check_tensor(q, "q")
  check_tensor(k, "k")
  check_tensor(v, "v")
  local d, keep
  d, keep, o = M.vsa_desc(o, q, "vsa_coarse", k)
  if C.sta_tensor_ndim(q) ~= 4 then bad("q: expected a 4-D tensor, got %d-D", C.sta_tensor_ndim(q)) end
  local s, dev = M.shape(q), device_of(q)
  local b, h, n = s[1], s[3], s[2]
  if o.layout == "bhsd" then h, n = s[2], s[3] end
  local mq = math.floor(n / d.block_rows)
  local oc, lc = M.tensor({ b, h, mq, s[4] }, "f32", dev), M.tensor({ b, h, mq }, "f32", dev)
  local idx, num = M.tensor({ b, h, mq, d.topk }, "i32", dev), M.tensor({ b, h, mq }, "i32", dev)
  M.check(C.sta_vsa_coarse(d, q, k, v, oc, lc, idx, num))
  local _ = keep
  return oc, lc, idx, num
end

--- topk = ceil((1 - sparsity) * cubes) (sta_vsa_topk).
function M.vsa_topk(sparsity, cubes)
  local t = ffi.new("int32_t[1]")
  M.check(C.sta_vsa_topk(sparsity, cubes, t))
  return t[0]
end

local function cubes(x, o, to)
  check_tensor(x, "x")
  o = options.check("cubes", o, "ffi", is_a)
  local canvas, cube, n = canvas_cube(o)
  local layout = LAYOUTS[o.layout or "bshd"]
  local out = o.out
  if not out then
    if C.sta_tensor_ndim(x) ~= 4 then bad("x: expected a 4-D tensor, got %d-D", C.sta_tensor_ndim(x)) end
    local s = M.shape(x)
    local rows = to and tonumber(n) * cube[0] * cube[1] * cube[2] or canvas[0] * canvas[1] * canvas[2]
    s[layout == C.STA_BSHD and 2 or 3] = rows
    out = M.tensor(s, ffi.string(C.sta_dtype_name(C.sta_tensor_dtype(x))), device_of(x))
  end
  local f = to and C.sta_tensor_to_cubes or C.sta_tensor_from_cubes
  M.check(f(out, x, canvas, cube, layout))
  return out
end

--- x (untiled rows) in the cube order of o.canvas (o: canvas=, cube=,
-- layout=, out=); from_cubes the other way.
function M.to_cubes(x, o) return cubes(x, o, true) end
function M.from_cubes(x, o) return cubes(x, o, false) end

--- Each cube's valid tokens, i32 [cubes] (o: canvas=, cube=, device=).
function M.cube_sizes(o)
  o = options.check("cube_sizes", o, "ffi", is_a)
  local canvas, cube, n = canvas_cube(o)
  local t = M.tensor({ tonumber(n) }, "i32", o.device)
  M.check(C.sta_vsa_cube_sizes(t, canvas, cube))
  return t
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
