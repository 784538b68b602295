#!/usr/bin/env lua5.4
--[[
gen-api-test.lua -- writes spec/test_api.c's generated half: every public
function of core/sta.h (the STA_DECLS block) called with NULL in each pointer
argument in turn, and with a released handle in each handle argument, the
other arguments valid (made by spec/test_api.c's fixture).  A call that returns
a status must fail with a 1xx status and a message naming the argument
(nullable arguments, listed below, need only not crash); every call must
leave no live handle behind.

  lua5.4 scripts/test/gen-api-test.lua core/sta.h > build/gen/test_api_calls.h

A public function with an argument this script cannot make a valid value for
stops the build with a message naming it: add the value here.
]]

local header = arg[1] or "core/sta.h"
local f = assert(io.open(header, "r"))
local text = f:read("a")
f:close()

local function die(msg)
  io.stderr:write("gen-api-test: ", msg, "\n")
  os.exit(1)
end

-- ---- parse the declaration block --------------------------------------------

local block = text:match("/%* STA_DECLS_BEGIN %*/(.-)/%* STA_DECLS_END %*/")
if not block then die(header .. ": no STA_DECLS block") end
block = block:gsub("/%*.-%*/", " ")
-- typedef struct/enum NAME { ... } NAME;  and other typedefs
block = block:gsub("typedef%s+%a+%s+[%w_]*%s*(%b{})%s*[%w_]+%s*;", " ")
block = block:gsub("typedef[^;]*;", " ")

local funcs = {}
for decl in block:gmatch("([^;]+);") do
  decl = decl:gsub("%s+", " "):gsub("^ ", ""):gsub(" $", "")
  if decl ~= "" then
    local ret, name, params = decl:match("^(.-)([%w_]+)%s*(%b())$")
    if not name then die("cannot parse declaration: " .. decl) end
    params = params:sub(2, -2)
    local ps = {}
    if params ~= "void" then
      for p in params:gmatch("[^,]+") do
        p = p:gsub("^ ", ""):gsub(" $", "")
        local ty, pname, arr = p:match("^(.-)([%w_]+)%s*(%[?%d*%]?)$")
        if not pname then die(name .. ": cannot parse parameter " .. p) end
        ty = ty:gsub(" $", "") .. (arr ~= "" and " *" or "")
        ty = ty:gsub("%s*%*", " *"):gsub("%* %*", "**"):gsub("%s+", " ")
        ps[#ps + 1] = { type = ty, name = pname }
      end
    end
    funcs[#funcs + 1] = { ret = ret:gsub(" $", ""), name = name, params = ps }
  end
end
if #funcs < 100 then die("only " .. #funcs .. " functions parsed from " .. header) end

-- ---- valid values ------------------------------------------------------------

-- Handle kinds: the pointer type's base name -> fixture maker and killer.
local HANDLE = {
  sta_tensor = "tensor", sta_safetensors = "safetensors", sta_strategy = "strategy",
  sta_metadata = "metadata", sta_forward_batch = "batch", sta_context = "context",
  sta_layer = "layer", sta_comm = "comm", sta_sp_layer = "sp_layer",
}

-- Arguments that may be NULL (sta.h says so): the call only must not crash.
local NULLABLE = {
  ["sta_free.p"] = true, ["sta_tensor_wrap.strides"] = true,
  ["sta_attention_forward.lse"] = true, ["sta_attention_reference.lse"] = true,
  ["sta_attention_forward_fp8.lse"] = true,
  ["sta_layer_forward_lse.lse"] = true, ["sta_context_push.md"] = true,
  ["sta_context_push.fb"] = true, ["sta_strategy_uniform.full"] = true,
  ["sta_tune.report"] = true, ["sta_cuda_set_stream.stream"] = true,
  ["sta_comm_loopback_run.arg"] = true, ["sta_layer_set_strategy.s"] = true,
  ["sta_strategy_extent.steps"] = true, ["sta_strategy_extent.layers"] = true,
  ["sta_strategy_extent.heads"] = true, ["sta_comm_nccl.id_file"] = true,
  ["sta_comm_tcp.id_file"] = true, ["sta_tune_defaults.full"] = true,
  ["sta_tune_defaults.skip_steps"] = true, ["sta_tensor_compare.max_abs"] = true,
  ["sta_tensor_compare.rel_l2"] = true,
  ["sta_vsa_forward.gate"] = true, ["sta_vsa_forward.lse"] = true,
  ["sta_vsa_backward.gate"] = true, ["sta_vsa_backward.dgate"] = true,
  ["sta_vsa_coarse.out_c"] = true, ["sta_vsa_coarse.lse_c"] = true,
  ["sta_vsa_coarse.idx"] = true, ["sta_vsa_coarse.num"] = true,
  ["sta_vsa_reference.gate"] = true, ["sta_vsa_reference.lse"] = true,
  ["sta_vsa_backward_reference.gate"] = true, ["sta_vsa_backward_reference.dgate"] = true,
  ["sta_layer_resolve_vsa.canvas"] = true, ["sta_layer_resolve_vsa.cube"] = true,
}

-- Statuses sta.h gives for a NULL argument outside the 1xx group.
local NULL_STATUS = {
  ["sta_metadata_from_strategy.s"] = "STA_ERR_NO_STRATEGY",
}

-- The name a message gives an argument, where it is not the C name.
local ALIAS = {
  fb = "forward batch", m = "metadata", md = "metadata", s = "strategy", l = "layer",
  c = "comm", g = "geometry", t = "transport", desc = "desc", st = "f",
}

-- A valid value for a (function, parameter): specific first, then by name
-- and type.  Values are C expressions over the fixture `x`.
local SPECIFIC = {
  ["sta_tensor_create.shape"] = "x.shape4", ["sta_tensor_wrap.shape"] = "x.shape4",
  ["sta_tensor_wrap.data"] = "x.buf", ["sta_tensor_wrap.strides"] = "NULL",
  ["sta_tensor_view.shape"] = "x.shape4", ["sta_tensor_view.strides"] = "x.strides4",
  ["sta_tensor_get.index"] = "x.index4", ["sta_tensor_set.index"] = "x.index4",
  ["sta_tensor_permute.perm"] = "x.perm4",
  ["sta_free.p"] = "NULL", ["sta_cuda_set_stream.stream"] = "NULL",
  ["sta_comm_loopback_run.arg"] = "NULL", ["sta_comm_loopback_run.comms"] = "&x.comm",
  ["sta_comm_loopback.comms"] = "&x.comm_out",
  ["sta_comm_tcp.id_file"] = "NULL", ["sta_comm_nccl.id_file"] = "NULL",
  ["sta_file_write.data"] = "\"x\"", ["sta_file_write.path"] = "x.path_out",
  ["sta_npy_load.path"] = "x.path_npy", ["sta_npy_save.path"] = "x.path_out",
  ["sta_safetensors_open.path"] = "x.path_st", ["sta_safetensors_save.path"] = "x.path_out",
  ["sta_strategy_load.path"] = "x.path_json", ["sta_strategy_save.path"] = "x.path_out",
  ["sta_forward_batch_save_search.path"] = "x.path_out",
  ["sta_safetensors_read.name"] = "\"q\"", ["sta_safetensors_save.names"] = "x.names",
  ["sta_safetensors_save.tensors"] = "(const sta_tensor *const *)x.tlist",
  ["sta_tune.paths"] = "x.paths",   ["sta_dtype_parse.name"] = "\"f32\"", ["sta_layer_index_from_prefix.prefix"] = "\"a.b.7.c.d\"",
  ["sta_strategy_sparsity.grid"] = "x.grid", ["sta_metadata_search.candidates"] = "x.cands",
  ["sta_forward_batch_record.candidates"] = "x.cands",
  ["sta_metadata_set_row.windows"] = "x.wins", ["sta_forward_batch_record.l1"] = "x.loss",
  ["sta_forward_batch_record.l2"] = "x.loss", ["sta_head_diff.l1"] = "x.fout",
  ["sta_head_diff.l2"] = "x.fout2", ["sta_comm_create.t"] = "&x.transport",
  ["sta_comm_loopback_run.fn"] = "fx_rank_ok", ["sta_layer_create.desc"] = "&x.ldesc",
  ["sta_sp_layer_create.desc"] = "&x.ldesc", ["sta_metadata_row.windows"] = "&x.cwins",
  ["sta_strategy_to_json.json"] = "&x.json", ["sta_tune.full"] = "x.fullwin",
  ["sta_strategy_parse.len"] = "strlen(x.json_text)", ["sta_strategy_parse.json"] = "x.json_text",
  -- tensors whose shape the function dictates
  ["sta_attention_forward.lse"] = "fx_lse(&x)", ["sta_attention_reference.lse"] = "fx_lse(&x)",
  ["sta_attention_backward.lse"] = "fx_lse(&x)", ["sta_layer_forward_lse.lse"] = "fx_lse(&x)",
  ["sta_layer_backward.lse"] = "fx_lse(&x)",
  ["sta_attention_forward_fp8.desc"] = "&x.desc8", ["sta_attention_forward_fp8.q8"] = "fx_tensor8(&x)",
  ["sta_attention_forward_fp8.k8"] = "fx_tensor8(&x)", ["sta_attention_forward_fp8.v8"] = "fx_tensor8(&x)",
  ["sta_attention_forward_fp8.q_scale"] = "fx_lse(&x)", ["sta_attention_forward_fp8.k_scale"] = "fx_lse(&x)",
  ["sta_attention_forward_fp8.v_scale"] = "fx_vscale(&x)", ["sta_attention_forward_fp8.lse"] = "fx_lse(&x)",
  ["sta_comm_all_to_all.recv"] = "fx_tensor(&x)", ["sta_comm_all_gather.recv"] = "fx_tensor(&x)",
}

local BY_TYPE = {
  ["sta_geometry *"] = "&x.geom", ["const sta_geometry *"] = "&x.geom",
  ["const sta_attention_desc *"] = "&x.desc", ["sta_attention_desc *"] = "&x.desc",
  ["const int64_t *"] = "x.shape4",
  ["const int32_t *"] = "x.win", ["int32_t *"] = "x.iout", ["double *"] = "x.dout",
  ["float *"] = "x.fout", ["sta_dtype *"] = "&x.dtype_out", ["sta_tune_report *"] = "&x.report",
  ["char **"] = "&x.json", ["const char *"] = "x.path_out", ["void *"] = "NULL",
  ["sta_stats *"] = "&x.stats", ["const sta_vsa_desc *"] = "&x.vdesc", ["sta_vsa_desc *"] = "&x.vdesc",
  ["int64_t *"] = "&x.i64out",
}

local SCALAR = { -- by parameter name, any integer or float type
  ndim = "4", dim = "0", start = "0", len = "1", offset = "0", step = "0", layer = "0",
  head = "0", layers = "1", heads = "FX_H", steps = "1", n = "1", negative = "0",
  batch_size = "1", rank = "0", size = "1", seed = "1", mean = "0", std = "1", value = "0",
  i = "0", as_bf16 = "0", n_files = "1", skip_steps = "0", full_steps = "0",
  n_candidates = "2", seq_len = "FX_S", batch = "1", head_dim = "FX_D", t = "FX_T",
  h = "FX_HH", w = "FX_W", q = "0", k = "1", c = "1", device = "-1", a = "0.5", b = "2",
  sparsity = "0.5", cubes = "4",
}
local ENUM = { sta_dtype = "STA_F32", sta_device = "STA_CPU", sta_layout = "STA_BSHD",
               sta_status = "STA_ERR_SHAPE" }

local function base_of(ty)
  return ty:gsub("const ", ""):gsub(" %*const", ""):gsub("[%s%*]", "")
end

local function valid(fn, p)
  local key = fn.name .. "." .. p.name
  if SPECIFIC[key] then return SPECIFIC[key] end
  local ty, b = p.type, base_of(p.type)
  local stars = select(2, ty:gsub("%*", ""))
  if HANDLE[b] and stars == 1 then
    if b == "sta_tensor" then return "fx_tensor(&x)" end
    return "x." .. HANDLE[b]
  end
  if HANDLE[b] and stars == 2 then return "&x." .. HANDLE[b] .. "_out" end
  if BY_TYPE[ty] then return BY_TYPE[ty] end
  if stars == 0 then
    if ENUM[ty] then return ENUM[ty] end
    if ty:match("int") or ty == "double" or ty == "float" or ty == "size_t" then
      if SCALAR[p.name] then return SCALAR[p.name] end
    end
  end
  die(("%s: no valid value for parameter '%s' of type '%s': add one to %s"):format(
    fn.name, p.name, ty, arg[0]))
end

-- ---- emit --------------------------------------------------------------------

local out = {}
local function emit(s, ...) out[#out + 1] = select("#", ...) > 0 and s:format(...) or s end

emit("/* Generated from %s by scripts/test/gen-api-test.lua: do not edit. */", header)
emit("#define FX_NFUNCS %d", #funcs)

local tests = {}
for _, fn in ipairs(funcs) do
  local returns_status = fn.ret == "sta_status"
  local kills = fn.name:match("_destroy$") or fn.name:match("_close$") or fn.name == "sta_free"
  emit("static void test_%s(void **state) {", fn.name)
  emit("  (void)state;")
  local function call(args)
    local r = returns_status and "rc = " or (fn.ret ~= "void" and "(void)" or "")
    return ("%s%s(%s);"):format(r, fn.name, table.concat(args, ", "))
  end
  local function variant(kind, idx, value, argname, nullable)
    emit("  {")
    emit("    fx x;")
    emit("    fx_open(&x);")
    -- locals, the tested argument last: nothing allocated after a handle
    -- is released can take its address
    local args = {}
    for j, p in ipairs(fn.params) do
      if j ~= idx then emit("    %s a%d = %s;", p.type, j, valid(fn, p)) end
      args[j] = "a" .. j
    end
    if idx then emit("    %s a%d = %s;", fn.params[idx].type, idx, value) end
    if returns_status then emit("    sta_status rc;") end
    emit("    sta_clear_error();")
    emit("    %s", call(args))
    if returns_status and kind ~= "valid" and not nullable then
      local want = kind == "null" and NULL_STATUS[fn.name .. "." .. argname]
      if want then
        emit("    assert_int_equal(rc, %s);", want)
      else
        emit("    fx_refused(rc, \"%s\", \"%s\", \"%s\", %s);", fn.name, argname,
          ALIAS[argname] or argname, kind == "dead" and "1" or "0")
      end
    elseif returns_status then
      emit("    fx_consistent(rc, \"%s\");", fn.name)
    elseif kind == "dead" and not kills then
      emit("    fx_dead_reported(\"%s\", \"%s\");", fn.name, argname)
    end
    if kind == "valid" and fn.name:match("_retain$") then -- give the extra reference back
      emit("    %s(a1);", (fn.name:gsub("_retain$", "_destroy")))
    end
    emit("    fx_close(&x);")
    emit("  }")
  end
  variant("valid")
  for j, p in ipairs(fn.params) do
    local key = fn.name .. "." .. p.name
    local stars = select(2, p.type:gsub("%*", ""))
    if stars > 0 or p.type == "sta_rank_fn" then
      variant("null", j, "NULL", p.name, NULLABLE[key])
    end
    local b = base_of(p.type)
    if HANDLE[b] and stars == 1 then
      variant("dead", j, ("(%s)fx_dead_%s()"):format(p.type, HANDLE[b]), p.name, false)
    elseif HANDLE[b] and p.type:match("%*const %*") then
      variant("dead", j, ("fx_dead_list_%s()"):format(HANDLE[b]), p.name, false)
    end
  end
  emit("}")
  tests[#tests + 1] = ("  cmocka_unit_test(test_%s),"):format(fn.name)
end
emit("#define FX_TESTS \\")
for _, t in ipairs(tests) do emit("%s \\", t) end
emit("")
io.write(table.concat(out, "\n"), "\n")
