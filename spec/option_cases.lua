--[[
option_cases.lua -- the binding tests generated from the option schema
(lua/sta/options.lua): for every option of every call, values that are
missing, of a wrong type, out of range, and on the boundary, each with the
message the schema gives (or none: accepted).  spec/options_spec.lua runs
them through the Lua module, spec/ffi_spec.lua through the LuaJIT FFI, and
python/tests/test_options.py through Python (python/tests/option_cases.py,
written by python_source() below and kept current by options_spec.lua):
every binding must raise exactly these messages.

  local cases = require("option_cases")(options)   -- the sta.options module
  for _, c in ipairs(cases.list("lua")) do ... end

Lua 5.1 syntax (LuaJIT runs it too).
]]
return function(O)
  local M = {}

  -- the problem every case runs on: q, k, v [1, S, HEADS, D]
  M.problem = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, text = 2, heads = 2, D = 8 }
  M.problem.S = 2 * 4 * 4 + M.problem.text

  -- calls with the options that make them run; the generated cases change one
  M.base = {
    attention = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, window = { 1, 1, 1 } },
    reference = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, window = { 1, 1, 1 } },
    attention_backward = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, window = { 1, 1, 1 } },
    attention_fp8 = { canvas = { 2, 4, 4 }, tile = { 1, 2, 2 }, window = { 1, 1, 1 } },
    layer = { layer = 0, heads = 2, head_dim = 8, canvas = { 2, 4, 4 }, tile = { 1, 2, 2 } },
    forward_batch = {},
    forward_context = { step = 0 },
    uniform = { steps = 1, layers = 1, heads = 2, window = { 1, 1, 1 } },
    geometry = { canvas = { 2, 4, 4 } },
    tune = { files = { "/nonexistent/search.json" } },
    -- blocks of 17 rows: Mq = Mk = 2 (idx: one ragged list per (batch, head, query block);
    -- Python takes it positionally: M.problem.block_idx)
    block_sparse = { block_rows = 17, idx = { { { { 0, 1 }, { 1 } }, { { 0 }, { 1, 0 } } } } },
    block_sparse_backward = { block_rows = 17,
                              idx = { { { { 0, 1 }, { 1 } }, { { 0 }, { 1, 0 } } } } },
    -- q, k, v in the cube order of M.problem.vsa_canvas (2 cubes of 64 rows)
    vsa = { canvas = { 4, 4, 8 }, sparsity = 0.5 },
    vsa_backward = { canvas = { 4, 4, 8 }, sparsity = 0.5 },
    vsa_reference = { canvas = { 4, 4, 8 }, sparsity = 0.5 },
    vsa_backward_reference = { canvas = { 4, 4, 8 }, sparsity = 0.5 },
    vsa_coarse = { canvas = { 4, 4, 8 }, sparsity = 0.5 },
    cubes = { canvas = { 2, 4, 4 } },
    cube_sizes = { canvas = { 2, 4, 4 } },
  }
  M.problem.vsa_rows = 128
  M.problem.block_idx = M.base.block_sparse.idx
  -- values on the boundary that depend on the call's problem
  M.extra = {
    block_sparse = { kv_sizes = { { 5, 17 }, { 1, 1 } }, q_sizes = { { 17, 3 } },
                     num = { { { { 2, 1 }, { 1, 2 } } }, { { { 1, 1 }, { 0, 1 } } } } },
  }
  -- the calls of each binding (Python: reference_backward is its
  -- attention_backward; forward_context pushes nothing until `with`)
  M.calls = {
    lua = { "attention", "reference", "attention_backward", "attention_fp8", "layer",
            "forward_batch", "forward_context", "uniform", "geometry", "tune", "block_sparse",
            "block_sparse_backward", "vsa", "vsa_backward", "vsa_reference",
            "vsa_backward_reference", "vsa_coarse", "cubes", "cube_sizes" },
    ffi = { "attention", "reference", "attention_backward", "attention_fp8", "block_sparse",
            "block_sparse_backward", "vsa", "vsa_backward", "vsa_reference",
            "vsa_backward_reference", "vsa_coarse", "cubes", "cube_sizes" },
    python = { "attention", "reference", "attention_backward", "attention_fp8", "layer",
               "forward_batch", "forward_context", "uniform", "tune", "block_sparse", "vsa",
               "vsa_reference", "vsa_backward_reference", "vsa_coarse", "cubes", "cube_sizes" },
  }

  local function copy(t)
    local o = {}
    for k, v in pairs(t) do o[k] = v end
    return o
  end

  local function str3(t, sep) return t[1] .. sep .. t[2] .. sep .. t[3] end

  -- {what, value} pairs for a definition; base: the call's value, if any;
  -- per_head: the call takes a window per head (tensors of M.problem.heads)
  local function values(def, base, per_head)
    local k, v = def.kind, {}
    local function add(what, x) v[#v + 1] = { what = what, value = x } end
    if k == "int32" or k == "int64" then
      add("type", "x"); add("type", 1.5); add("type", true)
      if k == "int32" then add("range", 2 ^ 31); add("range", -2 ^ 31 - 1)
      else add("range", 2 ^ 63); add("range", -2 ^ 63 * 2) end
      if def.min then add("range", def.min - 1); add("boundary", def.min) end
    elseif k == "float32" then
      add("type", "x"); add("type", true)
      for _, x in ipairs{ 0, -1, 0 / 0, 1 / 0, -1 / 0, 1e-50, 1e39, O.FLOAT32[1], O.FLOAT32[2] } do
        add("range", x)
      end
      add("boundary", 2 ^ -149); add("boundary", 3.4e38); add("boundary", 0.5)
    elseif k == "bool" then
      add("type", 1); add("type", "true"); add("boundary", true); add("boundary", false)
    elseif k == "enum" then
      add("type", 1); add("type", true); add("range", "nope")
      add("range", def.values[#def.values]:upper())
      for _, x in ipairs(def.values) do add("boundary", x) end
    elseif k == "string" then
      add("type", 1); add("type", true); add("boundary", "blocks.3.attn.impl")
    elseif k == "triple" or k == "windows" then
      add("type", true); add("type", 5)
      add("range", { 1, 2 }); add("range", { 1, 2, 3, 4 }); add("range", { 1, "a", 3 })
      add("range", { 1, 2 ^ 32, 1 }); add("range", "1x2"); add("range", "1,2,3,4")
      add("range", "1x1xq")
      if def.min then add("range", { 1, def.min - 1, 1 }) end
      if k == "windows" and not def.single then
        add("range", {}); add("range", { { 1, 1, 1 }, { 1, 1 } }); add("range", "1,1,1:1,1")
        add("range", "1x1x1,1x1")
      end
      if k == "windows" and def.single then add("range", "1,1,1:1,1,1") end
      local b = base or (k == "windows" and { 1, 1, 1 }) or nil
      if b then add("boundary", str3(b, "x")); add("boundary", str3(b, ",")); add("boundary", str3(b, "X")) end
      if k == "windows" and per_head then
        add("boundary", "1,1,1:1,1,1"); add("boundary", "1x1x1,1x1x1")
        add("boundary", { { 1, 1, 1 }, { 1, 1, 1 } }); add("boundary", { "1x1x1", "1,1,1" })
      end
    elseif k == "tensor" or k == "object" then
      add("type", 1); add("type", "x")
    elseif k == "output" then
      add("type", 1); add("type", "x"); add("boundary", true); add("boundary", false)
    elseif k == "fraction" then
      add("type", "x"); add("type", true)
      for _, x in ipairs{ -0.1, 1, 1.5, 0 / 0, 1 / 0, -1 / 0 } do add("range", x) end
      add("boundary", 0); add("boundary", 0.5); add("boundary", 0.999)
    elseif k == "ints" then
      add("type", 1); add("type", "x"); add("type", true)
      add("range", { 1.5 }); add("range", { 2 ^ 31 }); add("range", { { 1, "a" } })
      if def.min then add("range", { def.min - 1 }) end
    elseif k == "paths" then
      add("type", 5); add("type", "x"); add("type", true); add("range", { 1 })
      add("range", { "a.json", true })
    end
    return v
  end

  local function no_object() return false end

  --- The message the schema gives for opts of call in binding, or false.
  function M.expect(call, opts, binding)
    local ok, err = pcall(O.check, call, opts, binding, no_object)
    return not ok and err
  end

  --- The cases of binding: {call=, option=, what=, value=, opts=, expect=},
  -- opts the call's options (the base with the case's change).
  function M.list(binding)
    local out = {}
    local function add(call, option, what, value, opts)
      out[#out + 1] = { call = call, option = option, what = what, value = value, opts = opts,
                        expect = M.expect(call, opts, binding) }
    end
    for _, call in ipairs(M.calls[binding]) do
      local names, required = O.names(call, binding)
      local base = {} -- what this binding takes as options (Python: idx is positional)
      for _, n in ipairs(names) do base[n] = M.base[call][n] end
      local per_head = base.canvas ~= nil and call ~= "layer"
      add(call, "bogus", "unknown", 1, (function() local o = copy(base); o.bogus = 1; return o end)())
      for _, n in ipairs(names) do
        local def = O.options[n]
        local o = copy(base)
        o[n] = nil
        if base[n] ~= nil or required[n] then add(call, n, "missing", nil, o) end
        local vs = values(def, base[n], per_head)
        for _, x in ipairs(M.extra[call] and M.extra[call][n] or {}) do
          vs[#vs + 1] = { what = "boundary", value = x }
        end
        for _, c in ipairs(vs) do
          if not (call == "uniform" and n == "window" and type(c.value) == "table" and
                  type(c.value[1]) == "table") then
            o = copy(base)
            if def.either then o[def.either] = nil end -- one of the two at a time
            o[n] = c.value
            add(call, n, c.what, c.value, o)
          end
        end
        if def.either and base[n] ~= nil then -- both given
          for _, c in ipairs(values(O.options[def.either], nil, false)) do
            if c.what == "boundary" then
              o = copy(base)
              o[def.either] = c.value
              add(call, n, "conflict", c.value, o)
              break
            end
          end
        end
        if def.alias then
          o = copy(base)
          o[def.alias] = def.values[1]
          add(call, def.alias, "alias", def.values[1], o)
          o = copy(o)
          o[n] = def.values[1]
          add(call, n, "alias", def.values[1], o)
        end
      end
    end
    return out
  end

  --- Whether err (a binding's error, or nil) is what case c wants: the
  -- schema's exact message, or, for a value the schema takes, no message
  -- of the schema about it (the core may still refuse the call: a device
  -- with no GPU, a tile the core's checks refuse).
  function M.agrees(c, err)
    if c.expect then return err == c.expect end
    if err == nil then return true end
    if err:find("^options: ") then return false end
    local n = c.option
    local rest = err:match("^" .. n .. "[%[%]%d]*: (.*)$")
    if not rest then return true end
    if rest:find("^required %(") or rest:find("^given ") then return false end
    local def = O.options[n] or { kind = "enum", values = {} }
    for _, p in ipairs{ O.expected(def), "3 integers", "a 32-bit integer", "a 64-bit integer" } do
      if rest:sub(1, #p + 9) == "expected " .. p then return false end
    end
    return true
  end

  -- ---- the Python copy ------------------------------------------------------

  local py = O.python_literal

  --- python/tests/option_cases.py
  function M.python_source()
    local lines = {
      '"""The cases of the generated binding tests, written by spec/option_cases.lua',
      "(python_source) from the option schema (lua/sta/options.lua): do not edit;",
      "spec/options_spec.lua fails when this copy is stale.  Regenerate with",
      "  lua5.4 -e 'package.path=\"lua/?.lua;spec/?.lua;\"..package.path",
      "    io.write(require(\"option_cases\")(require(\"sta.options\")).python_source())' \\",
      "    > python/tests/option_cases.py",
      "Each case: (call, option, what, value, options, expected message or None).",
      '"""',
      "",
      "PROBLEM = " .. py(M.problem),
      "",
      "CASES = [",
    }
    for _, c in ipairs(M.list("python")) do
      local keys, parts = {}, {}
      for key in pairs(c.opts) do keys[#keys + 1] = key end
      table.sort(keys)
      for _, key in ipairs(keys) do parts[#parts + 1] = ("%q: %s"):format(key, py(c.opts[key])) end
      lines[#lines + 1] = ("    (%s, %s, %s, %s, {%s},\n     %s),"):format(py(c.call), py(c.option),
        py(c.what), py(c.value), table.concat(parts, ", "), c.expect and py(c.expect) or "None")
    end
    lines[#lines + 1] = "]"
    lines[#lines + 1] = ""
    return table.concat(lines, "\n")
  end

  return M
end
