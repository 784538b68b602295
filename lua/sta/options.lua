--[[
sta.options -- the options of sta's bindings, defined once: names, kinds,
ranges, which calls take them, and what an absent one means (always the
core's default: an absent option is passed to the core unset, never
filled in here).  Every binding checks its option tables against this:

  - the Lua module (lua/*.c: sta.attention, sta.layer, ...) through check()
    below, called from C before an option is read;
  - the LuaJIT FFI (sta.ffi) through the same check();
  - Python (python/sta/_options.py, generated from this file by
    python_source() below; spec/options_spec.lua keeps it current) through
    python/sta/_args.py, which implements the same rules and messages.

The tests of all three are generated from this table (spec/options_spec.lua,
python/tests/test_options.py): every option of every call x {missing, wrong
type, out of range, boundary}, with the same message in every binding.

Plain data and Lua 5.1 syntax (LuaJIT reads it too).

Kinds and what a value must be:
  int32     an integer (an integral number) in the C int32 range and in
            [min, max]; never wrapped
  int64     the same in the int64 range
  float32   a number > 0 (positive = true) that stays > 0 and finite as a
            C float: 0, negative, NaN, Inf and what rounds to 0 or Inf in
            float32 are refused (0 would mean the core's default)
  bool      true or false
  enum      one of values (strings); values[1] is the core's 0
  string    a string
  triple    3 int32 >= min, as a list, or a string 'TxHxW' or 'T,H,W'
  windows   one triple (every head) or a list of triples (one per head);
            strings: '3,3,3' or '3x3x3', and lists '3,3,3:1,5,7' or
            '1x1x1,3x3x3'
  tensor    a tensor of the binding (checked by the binding)
  object    an object of class (checked by the binding's is_a)
  output    true, false, or a tensor to write into
  paths     a list of file paths (strings; Python: also os.PathLike)
  fraction  a number in [0, 1)
  ints      an i32 tensor (Python: a torch integer tensor), or a list of
            integers (nested lists for a tensor of more dimensions; the
            binding checks their shape when it converts them), each in the
            int32 range and >= min

either: the option and the one it names are one choice: exactly one of
them must be given (both or neither is an error).
]]

local M = {}

M.INT32 = { -2147483648, 2147483647 }
M.INT64 = { -9223372036854775808, 9223372036854775807 }
-- float32: a double rounds to 0 at or below 2^-150 (half the least subnormal,
-- ties to even) and to Inf at or above 2^128 - 2^103 (half an ulp past FLT_MAX)
M.FLOAT32 = { 2 ^ -150, 2 ^ 128 - 2 ^ 103 }

-- name -> definition.  default: what an absent option means: a value the
-- binding passes where the core takes no default (a number), else text for
-- the docs (the value is the core's: the option is passed unset).  only: the bindings that
-- take it, when not all.  alias: another accepted name.  min/max: what the
-- binding must refuse because the core would read it as "unset" (canvas
-- 0,0,0: the known shape; text_len -1: every row) or names it otherwise
-- (heads: the core's local_heads); other ranges (a window's 1..grid, a
-- tile's 1..2^20) are the core's, with its messages naming axis and head.
M.options = {
  canvas = { kind = "triple", min = 1, doc = "T, H, W video tokens",
             default = "the known shape of the sequence length (sta_geometry_from_seq_len)" },
  tile = { kind = "triple", doc = "tt, th, tw tokens", default = "sta_geometry_init's tile" },
  text_len = { kind = "int64", min = 0, doc = "valid text rows", default = "every row after the video" },
  order = { kind = "enum", values = { "untiled", "tiled" }, doc = "the rows' token order" },
  layout = { kind = "enum", values = { "bshd", "bhsd" }, doc = "[B, S, heads, D] or [B, heads, S, D]" },
  window = { kind = "windows", required = true,
             doc = "{Kt, Kh, Kw} for every head, or a list of them, one per head" },
  scale = { kind = "float32", positive = true, doc = "the softmax scale", default = "1/sqrt(D)" },
  softmax = { kind = "enum", values = { "exact", "fast" }, doc = "the forward's softmax" },
  precision = { kind = "enum", values = { "native", "fp8" }, doc = "the forward's compute" },
  deterministic = { kind = "bool", doc = "bit-identical gradients" },
  geometry = { kind = "object", class = "sta.Geometry", only = { lua = true },
               excludes = { "canvas", "tile", "text_len", "order" },
               doc = "canvas, tile, text_len and order in one" },
  out = { kind = "tensor", only = { lua = true, ffi = true }, doc = "the output to write" },
  lse = { kind = "output", only = { lua = true, ffi = true }, doc = "return the log-sum-exp" },
  return_lse = { kind = "bool", only = { python = true }, doc = "return the log-sum-exp too" },
  dq = { kind = "tensor", only = { lua = true, ffi = true }, doc = "dq to write" },
  dk = { kind = "tensor", only = { lua = true, ffi = true }, doc = "dk to write" },
  dv = { kind = "tensor", only = { lua = true, ffi = true }, doc = "dv to write" },
  dtype = { kind = "enum", values = { "f32", "f16", "bf16" }, only = { lua = true, ffi = true },
            doc = "the dtype of a new out" },
  out_dtype = { kind = "object", class = "torch.dtype (float32, float16 or bfloat16)",
                only = { python = true }, doc = "the dtype of out" },
  -- layers
  prefix = { kind = "string", doc = "module prefix; the layer is prefix.split('.')[-3]" },
  layer = { kind = "int32", min = 0, doc = "layer index (when no prefix)", default = 0 },
  heads = { kind = "int32", min = 1, required = true,
            doc = "an integer >= 1: the heads on this rank; sta.dist.layer: of all ranks" },
  head_dim = { kind = "int32", min = 1, required = true, doc = "D" },
  sp_rank = { kind = "int32", min = 0, doc = "this rank", default = 0 },
  sp_size = { kind = "int32", min = 1, doc = "ranks splitting the heads", default = 1 },
  device = { kind = "enum", values = { "cpu", "cuda" }, alias = "backend", doc = "where it runs" },
  strategy = { kind = "object", class = "sta.Strategy", doc = "used when the context has no metadata" },
  -- runtime
  batch_size = { kind = "int32", min = 1, doc = "requests in the batch", default = 1 },
  negative = { kind = "bool", doc = "the classifier-free-guidance negative pass" },
  step = { kind = "int32", min = 0, doc = "the denoising step", default = 0 },
  metadata = { kind = "object", class = "sta.Metadata", doc = "the step's window table",
               excludes = { "strategy" } },
  batch = { kind = "object", class = "sta.ForwardBatch", doc = "the forward batch" },
  steps = { kind = "int32", min = 1, required = true, doc = "denoising steps" },
  layers = { kind = "int32", min = 1, doc = "transformer layers", default = 1 },
  full = { kind = "windows", single = true, doc = "the full window" },
  full_steps = { kind = "int32", min = 0, doc = "steps with the full window", default = 0 },
  -- block lists and VSA (STA.md section 12)
  idx = { kind = "ints", min = 0, only = { lua = true, ffi = true },
          doc = "the key blocks of each (batch, head, query block): i32 [B, heads, Mq, L], or "
          .. "lists idx[b][h][m] = {n, ...}" },
  num = { kind = "ints", min = 0, only = { lua = true, ffi = true },
          doc = "how many of idx's entries each list holds: i32 [B, heads, Mq] or lists",
          default = "the lengths of idx's lists (required with an idx tensor)" },
  kv_sizes = { kind = "ints", min = 1, doc = "valid rows of each key block: i32 [Mk] or a list",
               default = "every key block whole" },
  q_sizes = { kind = "ints", min = 1, doc = "valid rows of each query block: i32 [Mq] or a list",
              default = "kv_sizes when Mq = Mk, else every query block whole" },
  block_rows = { kind = "int32", min = 1, doc = "rows per block", default = "64" },
  cube = { kind = "triple", min = 1, doc = "ct, ch, cw tokens a cube (4x4x4: 64 rows, 4x8x8: 256)",
           default = "4x4x4" },
  sparsity = { kind = "fraction", either = "topk",
               doc = "the fraction of key cubes left out: topk = ceil((1 - sparsity) * cubes)" },
  topk = { kind = "int32", min = 1, either = "sparsity", doc = "key cubes per query cube" },
  gate = { kind = "tensor", doc = "out = out_c * gate + out_s (FastVideo's compress_attn_weight)",
           default = "1" },
  dgate = { kind = "tensor", only = { lua = true, ffi = true }, doc = "dgate to write" },
  mode = { kind = "enum", values = { "sta", "vsa" }, doc = "what a layer computes" },
  dense_steps = { kind = "int32", min = 0, doc = "VSA layers: steps that select every cube",
                  default = 0 },
  vsa_sparsity = { kind = "fraction", doc = "VSA layers' sparsity (SGLang's VSA_sparsity)",
                   default = "0: every cube" },
  -- tuning (sta_tune; absent: sta_tune_defaults')
  files = { kind = "paths", doc = "saved search files" },
  skip_steps = { kind = "int32", min = 0, doc = "steps that keep the full window",
                 default = "sta_tune_defaults'" },
}

local ATTENTION = { "canvas", "tile", "text_len", "order", "layout", "window", "scale", "softmax",
                    "precision", "deterministic", "geometry" }
local function with(list, extra)
  local t = {}
  for i = 1, #list do t[#t + 1] = list[i] end
  for i = 1, #extra do t[#t + 1] = extra[i] end
  return t
end

local VSA_FORWARD = { "canvas!", "cube", "sparsity", "topk", "gate", "layout", "scale",
                      "deterministic", "out", "lse", "return_lse" }
local VSA_BACKWARD = { "canvas!", "cube", "sparsity", "topk", "gate", "layout", "scale",
                       "deterministic", "dq", "dk", "dv", "dgate" }

-- call -> the options it takes, in the order messages list them; "name?":
-- optional in this call though required elsewhere, "name!": required in it.
M.calls = {
  attention = with(ATTENTION, { "out", "lse", "return_lse" }),
  reference = with(ATTENTION, { "out", "lse", "return_lse" }),
  attention_backward = with(ATTENTION, { "dq", "dk", "dv" }),
  attention_fp8 = with(ATTENTION, { "out", "lse", "return_lse", "dtype", "out_dtype" }),
  layer = { "prefix", "layer", "heads", "head_dim", "sp_rank", "sp_size", "canvas", "tile",
            "text_len", "order", "layout", "geometry", "device", "scale", "softmax", "precision",
            "strategy", "mode", "cube", "dense_steps" },
  block_sparse = { "idx!", "num", "kv_sizes", "q_sizes", "block_rows", "layout", "scale",
                   "deterministic", "out", "lse", "return_lse" },
  block_sparse_backward = { "idx!", "num", "kv_sizes", "q_sizes", "block_rows", "layout", "scale",
                            "deterministic", "dq", "dk", "dv" },
  vsa = VSA_FORWARD,
  vsa_reference = VSA_FORWARD,
  vsa_backward = VSA_BACKWARD,
  vsa_backward_reference = VSA_BACKWARD,
  vsa_coarse = { "canvas!", "cube", "sparsity", "topk", "layout", "scale" },
  cubes = { "canvas!", "cube", "layout", "out" },
  cube_sizes = { "canvas!", "cube", "device" },
  sp_attention = { "canvas", "tile", "text_len", "geometry", "window", "layout", "scale", "out" },
  sp_shard = { "canvas", "tile", "text_len", "geometry", "window?", "layout", "scale", "out" },
  sp_layer = { "prefix", "layer", "heads", "head_dim", "canvas", "tile", "text_len", "layout",
               "geometry", "device", "scale", "softmax", "precision", "strategy" },
  geometry = { "canvas", "tile", "text_len", "order" },
  layer_forward = { "out", "lse", "gate" },
  layer_backward = { "dq", "dk", "dv", "dgate" },
  forward_batch = { "batch_size", "negative", "vsa_sparsity" },
  forward_context = { "step", "metadata", "batch", "strategy", "layers", "heads?" },
  uniform = { "steps", "layers!", "heads", "window", "full", "full_steps" },
  tune = { "files!", "skip_steps", "full" },
}

-- ---- checking -----------------------------------------------------------------

local floor, huge = math.floor, math.huge

--- A value as messages print it, the same in every binding: integers
-- plainly, other numbers as %.14g, strings quoted, the rest by type.
function M.show(v)
  local t = type(v)
  if t == "number" then
    if v ~= v then return "nan" end
    if v == huge then return "inf" end
    if v == -huge then return "-inf" end
    if v == floor(v) and v >= -2 ^ 63 and v < 2 ^ 63 then return ("%d"):format(v) end
    return ("%.14g"):format(v)
  end
  if t == "string" then return "'" .. v .. "'" end
  if t == "boolean" or t == "nil" then return tostring(v) end
  return t
end

local function fail(fmt, ...) error(fmt:format(...), 0) end

local function is_integer(v)
  return type(v) == "number" and v == floor(v) and v > -huge and v < huge
end

--- The words after "expected" for a definition.
function M.expected(def)
  local k = def.kind
  if k == "int32" or k == "int64" then
    local s = k == "int32" and "a 32-bit integer" or "a 64-bit integer"
    if def.min and def.max then return ("%s in %d..%d"):format(s, def.min, def.max) end
    if def.min then return ("%s >= %d"):format(s, def.min) end
    return s
  end
  if k == "float32" then return "a number > 0 that float32 holds (not 0, not Inf, no NaN)" end
  if k == "bool" then return "a boolean" end
  if k == "string" then return "a string" end
  if k == "enum" then
    local q = {}
    for i, v in ipairs(def.values) do q[i] = '"' .. v .. '"' end
    if #q == 1 then return q[1] end
    return table.concat(q, ", ", 1, #q - 1) .. " or " .. q[#q]
  end
  if k == "triple" then return "3 integers ({a, b, c}, 'axbxc' or 'a,b,c')" end
  if k == "windows" then
    return def.single and "3 integers ({Kt, Kh, Kw}, 'KtxKhxKw' or 'Kt,Kh,Kw')"
      or "3 integers or a list of them, one per head ({Kt, Kh, Kw}, 'KtxKhxKw', "
      .. "'Kt,Kh,Kw', a list of those, '3,3,3:1,5,7' or '1x1x1,3x3x3')"
  end
  if k == "tensor" then return "a tensor" end
  if k == "output" then return "a boolean or a tensor" end
  if k == "object" then return "a " .. def.class end
  if k == "paths" then return "a list of paths (strings)" end
  if k == "fraction" then return "a number in [0, 1)" end
  if k == "ints" then return "an i32 tensor or a list of integers" end
  return k
end

local function check_int(name, v, def, bits)
  if not is_integer(v) then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
  local r = bits == 64 and M.INT64 or M.INT32
  -- 2^63 is the first double past int64: compare with < 2^63, not <= max
  local too_big = bits == 64 and v >= 2 ^ 63 or bits ~= 64 and v > r[2]
  if v < r[1] or too_big or (def.min and v < def.min) or (def.max and v > def.max) then
    fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
  end
  return v
end

-- "3x3x3", "3,3,3": 3 ints, or nil
local function parse_triple(s)
  local sep = s:find("[xX]") and "[xX]" or ","
  local parts, start = {}, 1
  while true do
    local a, b = s:find(sep, start)
    parts[#parts + 1] = s:sub(start, a and a - 1 or #s)
    if not a then break end
    start = b + 1
  end
  if #parts ~= 3 then return nil end
  local t = {}
  for i = 1, 3 do
    local d = parts[i]:match("^%s*([+-]?%d+)%s*$")
    if not d then return nil end
    t[i] = tonumber(d)
  end
  return t
end

local function split(s, sep)
  local parts, start = {}, 1
  while true do
    local a = s:find(sep, start, true)
    parts[#parts + 1] = s:sub(start, a and a - 1 or #s)
    if not a then return parts end
    start = a + 1
  end
end

local function check_triple(name, v, def)
  if type(v) == "string" then
    local t = parse_triple(v)
    if not t then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
    v = t
  elseif type(v) ~= "table" then
    fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
  end
  local n = #v
  if n ~= 3 then fail("%s: expected 3 integers, got %d", name, n) end
  local el = { kind = "int32", min = def.min }
  local out = {}
  for i = 1, 3 do out[i] = check_int(("%s[%d]"):format(name, i), v[i], el, 32) end
  return out
end

-- windows: one triple, or a list of them
local function check_windows(name, v, def)
  if type(v) == "string" then
    local items
    if v:find(":", 1, true) then items = split(v, ":")
    elseif v:find("[xX]") then items = split(v, ",")
    else items = { v } end
    if #items == 1 then return check_triple(name, items[1], def) end
    if def.single then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
    local out, el = {}, { kind = "triple", min = def.min }
    for i, s in ipairs(items) do out[i] = check_triple(("%s[%d]"):format(name, i), s, el) end
    return out
  end
  if type(v) ~= "table" then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
  local first = v[1]
  if def.single or (first ~= nil and type(first) ~= "table" and type(first) ~= "string") then
    return check_triple(name, v, def)
  end
  if first == nil then fail("%s: expected %s, got an empty list", name, M.expected(def)) end
  local out, el = {}, { kind = "triple", min = def.min }
  for i = 1, #v do out[i] = check_triple(("%s[%d]"):format(name, i), v[i], el) end
  return out
end

-- ints as lists: every leaf an int32 >= def.min, named by its place
-- (idx[1][2][1][3]); nested lists stay nested (the binding checks their shape)
local function check_ints(name, v, def)
  local el = { kind = "int32", min = def.min }
  local out = {}
  for i = 1, #v do
    local x, at = v[i], ("%s[%d]"):format(name, i)
    if type(x) == "table" then out[i] = check_ints(at, x, def)
    else out[i] = check_int(at, x, el, 32) end
  end
  return out
end

--- One value against its definition; returns it normalized (triples and
-- windows as tables of integers).  is_a(v, class, kind): the binding's
-- test for tensors and objects (nil: not checked here).
function M.check_value(name, v, def, is_a)
  local k = def.kind
  if k == "int32" then return check_int(name, v, def, 32) end
  if k == "int64" then return check_int(name, v, def, 64) end
  if k == "float32" then
    if type(v) ~= "number" or not (v > M.FLOAT32[1] and v < M.FLOAT32[2]) then
      fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
    end
    return v
  end
  if k == "bool" then
    if type(v) ~= "boolean" then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
    return v
  end
  if k == "string" then
    if type(v) ~= "string" then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
    return v
  end
  if k == "enum" then
    if type(v) == "string" then
      for _, x in ipairs(def.values) do if x == v then return v end end
    end
    fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
  end
  if k == "triple" then return check_triple(name, v, def) end
  if k == "windows" then return check_windows(name, v, def) end
  if k == "paths" then
    if type(v) ~= "table" then fail("%s: expected %s, got %s", name, M.expected(def), M.show(v)) end
    local out = {}
    for i = 1, #v do
      if type(v[i]) ~= "string" then
        fail("%s[%d]: expected a path (a string), got %s", name, i, M.show(v[i]))
      end
      out[i] = v[i]
    end
    return out
  end
  if k == "fraction" then
    if type(v) ~= "number" or not (v >= 0 and v < 1) then
      fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
    end
    return v
  end
  if k == "ints" and type(v) == "table" then return check_ints(name, v, def) end
  if k == "output" and type(v) == "boolean" then return v end
  if (k == "tensor" or k == "output" or k == "object" or k == "ints") and is_a and
      not is_a(v, k == "object" and def.class or "tensor", k) then
    fail("%s: expected %s, got %s", name, M.expected(def), M.show(v))
  end
  return v
end

--- The names a binding's call takes, in order, and name -> whether the
-- call requires it.
function M.names(call, binding)
  local list = M.calls[call]
  if not list then error("sta.options: no call " .. tostring(call), 0) end
  local out, required = {}, {}
  for _, n in ipairs(list) do
    local name, mark = n:match("^([%w_]+)([?!]?)$")
    local def = M.options[name]
    if mark == "?" then required[name] = false
    elseif mark == "!" then required[name] = true
    else required[name] = def.required or false end
    if not def.only or def.only[binding] then out[#out + 1] = name end
  end
  return out, required
end

local known_cache = {}
local function known(call, binding)
  local key = call .. "/" .. binding
  local k = known_cache[key]
  if not k then
    local names, required = M.names(call, binding)
    k = { set = {}, text = table.concat(names, ", "), names = names, required = required }
    for _, n in ipairs(names) do
      k.set[n] = n
      local a = M.options[n].alias
      if a then k.set[a] = n end
    end
    known_cache[key] = k
  end
  return k
end

--- Check the options table o of call for binding ("lua", "ffi"): unknown
-- keys, missing required options, every value's kind and range.  Returns a
-- new plain table of the normalized values (aliases under their names;
-- absent options with a number default get it, the others stay absent: the
-- core's defaults apply).  o may be nil.
-- Misuse raises "<name>: expected ..., got ..." (no position), as the
-- other bindings word it.
function M.check(call, o, binding, is_a)
  local k = known(call, binding)
  if o == nil then o = {} end
  if type(o) ~= "table" then fail("options: expected a table, got %s", M.show(o)) end
  for key in pairs(o) do
    if type(key) ~= "string" or not k.set[key] then
      fail("options: unknown key %s (known: %s)", M.show(key), k.text)
    end
  end
  local out = {}
  for _, n in ipairs(k.names) do
    local def = M.options[n]
    local v, given = o[n], n
    if def.alias then
      local a = o[def.alias]
      if a ~= nil then
        if v ~= nil then fail("%s: given twice (as %s and %s)", n, n, def.alias) end
        v, given = a, def.alias
      end
    end
    if v == nil then
      if k.required[n] then fail("%s: required (%s)", n, def.doc) end
      if def.either and o[def.either] == nil and k.set[def.either] then
        fail("%s: required (%s), or %s", n, def.doc, def.either)
      end
      if type(def.default) == "number" then out[n] = def.default end
    else
      if def.either and o[def.either] ~= nil then
        fail("%s: given with %s (give one of them)", n, def.either)
      end
      out[n] = M.check_value(given, v, def, is_a or M.is_a[binding])
    end
  end
  for n, v in pairs(out) do
    local ex = M.options[n].excludes
    if ex and v ~= nil then
      for _, x in ipairs(ex) do
        if out[x] ~= nil then fail("%s: given with %s (it holds %s)", n, x, table.concat(ex, ", ")) end
      end
    end
  end
  return out
end

--- The Lua module's objects by their metatable's name (tensors: sta.Tensor).
M.is_a = {
  lua = function(v, class)
    local mt = type(v) == "userdata" and getmetatable(v)
    return mt and type(mt) == "table" and mt.__name == (class == "tensor" and "sta.Tensor" or class)
      or false
  end,
}

-- ---- the Python copy ----------------------------------------------------------

--- A Lua value as a Python literal (tables: tuples, or dicts by sorted key).
local function py(v)
  local t = type(v)
  if t == "string" then return ("%q"):format(v) end
  if t == "boolean" then return v and "True" or "False" end
  if t == "nil" then return "None" end
  if t == "number" then
    if v ~= v then return 'float("nan")' end
    if v == huge then return 'float("inf")' end
    if v == -huge then return '-float("inf")' end
    return (is_integer(v) and v > -2 ^ 53 and v < 2 ^ 53) and ("%d"):format(v) or ("%.17g"):format(v)
  end
  if t == "table" then
    if #v > 0 or next(v) == nil then
      local parts = {}
      for i, x in ipairs(v) do parts[i] = py(x) end
      return "(" .. table.concat(parts, ", ") .. (#v == 1 and ",)" or ")")
    end
    local keys = {}
    for key in pairs(v) do keys[#keys + 1] = key end
    table.sort(keys)
    local parts = {}
    for _, key in ipairs(keys) do parts[#parts + 1] = py(key) .. ": " .. py(v[key]) end
    return "{" .. table.concat(parts, ", ") .. "}"
  end
  error("sta.options: cannot write a " .. t .. " for Python", 0)
end

M.python_literal = py

--- python/sta/_options.py: the tables above for Python.
function M.python_source()
  local names = {}
  for n in pairs(M.options) do names[#names + 1] = n end
  table.sort(names)
  local lines = {
    '"""The options of sta\'s bindings (names, kinds, ranges, calls), generated',
    "from lua/sta/options.lua by its python_source(): do not edit; regenerate with",
    "  lua5.4 -e 'io.write(dofile(\"lua/sta/options.lua\").python_source())' \\",
    "    > python/sta/_options.py",
    "(spec/options_spec.lua fails when this copy is stale).  _args.py checks",
    'arguments against it."""',
    "",
    "OPTIONS = {",
  }
  for _, n in ipairs(names) do
    local def, fields = M.options[n], {}
    local keys = {}
    for key in pairs(def) do keys[#keys + 1] = key end
    table.sort(keys)
    for _, key in ipairs(keys) do
      local v = def[key]
      if key == "only" then
        local bs = {}
        for b in pairs(v) do bs[#bs + 1] = b end
        table.sort(bs)
        v = bs
      end
      fields[#fields + 1] = py(key) .. ": " .. py(v)
    end
    lines[#lines + 1] = ("    %s: {%s},"):format(py(n), table.concat(fields, ", "))
  end
  lines[#lines + 1] = "}"
  lines[#lines + 1] = ""
  lines[#lines + 1] = "CALLS = {"
  local calls = {}
  for c in pairs(M.calls) do calls[#calls + 1] = c end
  table.sort(calls)
  for _, c in ipairs(calls) do lines[#lines + 1] = ("    %s: %s,"):format(py(c), py(M.calls[c])) end
  lines[#lines + 1] = "}"
  lines[#lines + 1] = ""
  lines[#lines + 1] = ("FLOAT32 = (%s, %s)"):format(py(M.FLOAT32[1]), py(M.FLOAT32[2]))
  lines[#lines + 1] = ""
  return table.concat(lines, "\n")
end

return M
