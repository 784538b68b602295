--[[
sta.help -- the REPL's reference card: every function of require "sta" with
its signature and one line, and a readable form of plain tables.

  local help = require "sta.help"
  help.show()                  all entries, grouped
  help.show("attention")       the entries whose name has "attention"
  help.show(sta.attention)     the entry of that function
  help.format(sta.info())      a table as text: keys sorted, nested tables
                               inline, long lists cut

spec/repl_spec.lua checks that every function of sta (and of sta.strategy,
sta.metadata) has an entry here: a new function needs a line below.
]]
local M = {}

-- {group, name, signature, what}; name as the user types it after "sta."
M.entries = {
  { "tensors", "tensor", "sta.tensor(shape [, {dtype=, device=}])", "a new tensor, uninitialised" },
  { "tensors", "zeros", "sta.zeros(shape [, {dtype=, device=, value=}])", "a new tensor filled with value (0)" },
  { "tensors", "randn", "sta.randn(shape [, {seed=, dtype=, device=, mean=, std=}])",
    "normal random values, the same bits on every backend" },
  { "tensors", "from_table", "sta.from_table(values, shape [, {dtype=, device=}])", "a tensor of flat row-major values" },
  { "files", "load", "sta.load(path [, name | {bf16 = true}])",
    ".npy or .safetensors (name: which entry); bf16: read <u2 as raw bf16" },
  { "files", "npy_load", "sta.npy_load(path [, as_bf16])", "a .npy file" },
  { "files", "load_safetensors", "sta.load_safetensors(path) -> {name = t}, {names}", "every tensor of a file" },
  { "files", "save_safetensors", "sta.save_safetensors(path, {name = t, ...})", "written atomically, names sorted" },
  { "files", "write_file", "sta.write_file(path, text)", "replaced atomically; true or nil, message, code" },
  { "attention", "attention", "sta.attention(q, k, v, {canvas=, window=, tile=, text_len=, order=, layout=, "
    .. "scale=, softmax=, precision=, lse=, out=}) -> out [, lse]",
    "STA; window {Kt, Kh, Kw} in tiles, or one per head" },
  { "attention", "attention_backward", "sta.attention_backward(q, k, v, out, lse, dout [, opts]) -> dq, dk, dv",
    "the gradients; opts: the forward's, deterministic=, dq=, dk=, dv=" },
  { "attention", "attention_fp8", "sta.attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale [, opts]) -> out [, lse]",
    "8-bit operands with their scales; opts: attention's, dtype=" },
  { "attention", "reference", "sta.reference(q, k, v, opts) -> out [, lse]", "the brute-force CPU reference" },
  { "attention", "flops", "sta.flops{canvas=, tile=, text_len=, window=, batch=, seq_len=, heads=, head_dim=}",
    "the FLOPs of one forward" },
  { "attention", "head_diff", "sta.head_diff(a, b [, layout]) -> l1s, l2s", "per-head L1 and L2 differences" },
  { "sparse", "block_sparse", "sta.block_sparse(q, k, v, {idx=, num=, kv_sizes=, q_sizes=, block_rows=, "
    .. "layout=, scale=, lse=, out=}) -> out [, lse]",
    "key blocks as data (FastVideo's q2k_idx / q2k_num): i32 tensors or lists idx[b][h][m] = {n, ...}" },
  { "sparse", "block_sparse_backward", "sta.block_sparse_backward(q, k, v, out, lse, dout, opts) -> dq, dk, dv",
    "the gradients; opts: the forward's, deterministic=, dq=, dk=, dv=" },
  { "sparse", "vsa", "sta.vsa(q, k, v, {canvas=, cube=, sparsity= | topk=, gate=, layout=, scale=, lse=, "
    .. "out=}) -> out [, lse]", "Video Sparse Attention; q, k, v in the canvas's cube order" },
  { "sparse", "vsa_backward", "sta.vsa_backward(q, k, v, out, lse, dout, opts) -> dq, dk, dv [, dgate]",
    "the gradients; opts: the forward's (gate: dgate too), dq=, dk=, dv=, dgate=" },
  { "sparse", "vsa_reference", "sta.vsa_reference(q, k, v, opts) -> out [, lse]",
    "VSA's brute force in double, host tensors; opts: vsa's" },
  { "sparse", "vsa_backward_reference", "sta.vsa_backward_reference(q, k, v, out, lse, dout, opts) "
    .. "-> dq, dk, dv [, dgate]", "its gradients in double (out, lse unread: may be nil); opts: vsa_backward's" },
  { "sparse", "vsa_coarse", "sta.vsa_coarse(q, k, v, {canvas=, cube=, sparsity= | topk=, layout=, scale=}) "
    .. "-> out_c, lse_c, idx, num", "the coarse branch and the selection (a block list for block_sparse)" },
  { "sparse", "vsa_topk", "sta.vsa_topk(sparsity, cubes)", "ceil((1 - sparsity) * cubes)" },
  { "sparse", "to_cubes", "sta.to_cubes(x, {canvas=, cube=, layout=, out=})",
    "untiled rows to the cube order (padding rows 0)" },
  { "sparse", "from_cubes", "sta.from_cubes(x, {canvas=, cube=, layout=, out=})", "the cube order back" },
  { "sparse", "cube_sizes", "sta.cube_sizes{canvas=, cube=, device=}",
    "each cube's valid tokens, i32 (FastVideo's variable_block_sizes)" },
  { "geometry", "geometry", "sta.geometry{canvas=, tile=, text_len=, order=}",
    "methods: grid video_tokens video_rows text_len_for tiled_len check window_check key_tiles" },
  { "geometry", "geometry_from_seq_len", "sta.geometry_from_seq_len(seq_len)", "FastVideo's known canvases" },
  { "geometry", "window_range", "sta.window_range(q, k, c) -> start, count", "the key tiles a query tile sees, one axis" },
  { "geometry", "tile", "sta.tile(t, geometry [, layout])", "untiled rows to FastVideo's tiled order" },
  { "geometry", "untile", "sta.untile(t, geometry, seq_len [, layout])", "tiled rows back to the untiled order" },
  { "pipelines", "strategy.new", "sta.strategy.new()", "an empty mask strategy" },
  { "pipelines", "strategy.load", "sta.strategy.load(path)", "FastVideo's strategy JSON" },
  { "pipelines", "strategy.parse", "sta.strategy.parse(json)", "the same, from a string" },
  { "pipelines", "strategy.default", "sta.strategy.default()", "the built-in default strategy" },
  { "pipelines", "strategy.uniform", "sta.strategy.uniform{steps=, layers=, heads=, window=, full=, full_steps=}",
    "one window everywhere, full for the first steps" },
  { "pipelines", "metadata.new", "sta.metadata.new(layers)", "one step's [layer][head] windows" },
  { "pipelines", "metadata.from_strategy", "sta.metadata.from_strategy(strategy, step, layers, heads)",
    "a step of a strategy" },
  { "pipelines", "metadata.search", "sta.metadata.search(layers, {window, ..., full})",
    "search mode: every candidate window is run and recorded" },
  { "pipelines", "metadata", "sta.metadata(layers)", "sta.metadata.new" },
  { "pipelines", "forward_batch", "sta.forward_batch{batch_size=, negative=, vsa_sparsity=}",
    "records for mask search; VSA layers' sparsity (methods vsa_sparsity, negative, records, ...)" },
  { "pipelines", "forward_context", "local ctx <close> = sta.forward_context{step=, metadata=, batch=}",
    "or {step=, strategy=, layers=, heads=, batch=}" },
  { "pipelines", "with_context", "sta.with_context(opts, fn, ...)", "fn(ctx, ...) inside a forward context" },
  { "pipelines", "current_context", "sta.current_context()", "the innermost live context, or nil" },
  { "pipelines", "context_depth", "sta.context_depth()", "live contexts this coroutine sees" },
  { "pipelines", "in_forward_pass", "sta.in_forward_pass()", "true inside a context with a batch" },
  { "pipelines", "layer", "sta.layer{layer= | prefix=, heads=, head_dim=, canvas=, strategy=, mode=, cube=, "
    .. "dense_steps=, ...}",
    "methods: forward(q, k, v [, out | {out=, lse=, gate=}]) backward(...) index set_strategy" },
  { "pipelines", "layer_index_from_prefix", "sta.layer_index_from_prefix(prefix)", "\"blocks.12.attn\" -> 12" },
  { "pipelines", "tune", "sta.tune{files=, skip_steps=, full=} -> strategy, report",
    "a strategy from mask-search records" },
  { "backends", "backends", "sta.backends()", "the devices that can run now" },
  { "backends", "backend_available", "sta.backend_available(device)", "\"cpu\" or \"cuda\"" },
  { "backends", "default_device", "sta.default_device()", "cuda when a GPU answers (STA_DEVICE overrides)" },
  { "backends", "info", "sta.info()", "version, backends, threads, device and transfer bytes" },
  { "backends", "set_num_threads", "sta.set_num_threads(n)", "CPU threads (0: OpenMP's default)" },
  { "backends", "get_num_threads", "sta.get_num_threads()", "" },
  { "backends", "synchronize", "sta.synchronize()", "waits for the GPU" },
  { "backends", "device_bytes", "sta.device_bytes() -> in_use, peak", "device memory sta holds" },
  { "backends", "set_device_soft_limit", "sta.set_device_soft_limit(bytes)",
    "device bytes above which the collector steps" },
  { "backends", "transfer_bytes", "sta.transfer_bytes()", "bytes moved between host and device" },
  { "backends", "last_launch", "sta.last_launch()", "the last CUDA forward's kernel, one line" },
  { "misc", "cancel", "sta.cancel()", "stop the running call at its next work item" },
  { "misc", "cancel_clear", "sta.cancel_clear()", "" },
  { "misc", "cancelled", "sta.cancelled()", "" },
  { "misc", "interruptible", "sta.interruptible(on)", "Ctrl-C cancels the call in progress" },
  { "misc", "now", "sta.now()", "monotonic seconds" },
  { "misc", "status_name", "sta.status_name(code)", "\"STA_ERR_SEQ_LEN\"" },
  { "misc", "history", "sta.history(path)", "readline history kept in path" },
  { "misc", "sorted_keys", "sta.sorted_keys(t)", "" },
}

M.tensor_methods = "t:shape() size(i) strides() dtype() device() ndim() numel() is_contiguous() "
  .. "to(dtype_or_device, ...) clone() copy(src) view(shape [, strides [, offset]]) permute{2, 1, 3, 4} "
  .. "narrow(dim, start, len) select(i) get{i, ...} set({i, ...}, x) fill(x) randn([seed [, mean, std]]) "
  .. "totable() compare(b) -> max_abs, rel_l2 save(path [, name]) axpby(a, x, b) scale(a) add(x [, y]) stats() info() "
  .. "release() released();  t[i], #t, tostring(t), <close>"

local function find(fn)
  local sta = require "sta"
  for _, e in ipairs(M.entries) do
    local ns, name = e[2]:match("^(%w+)%.(.+)$")
    local f = ns and type(sta[ns]) == "table" and sta[ns][name] or sta[e[2]]
    if f == fn then return e end
  end
end

--- The help text: all, the entries whose name contains what (a string),
-- or the entry of a function.
function M.text(what)
  local out = {}
  if type(what) == "function" then
    local e = find(what)
    if not e then return "no help for this function (it is not one of sta's)\n" end
    return ("%s\n    %s\n"):format(e[3], e[4])
  end
  local group
  for _, e in ipairs(M.entries) do
    if what == nil or e[2]:find(what, 1, true) then
      if what == nil and e[1] ~= group then
        group = e[1]
        out[#out + 1] = "-- " .. group
      end
      out[#out + 1] = "  " .. e[3] .. (e[4] ~= "" and ("\n      " .. e[4]) or "")
    end
  end
  if what == nil or ("tensor"):find(what, 1, true) then
    out[#out + 1] = "-- tensor methods\n  " .. M.tensor_methods
  end
  if #out == 0 then return ("no entry has %q; help() lists them all\n"):format(tostring(what)) end
  return table.concat(out, "\n") .. "\n"
end

function M.show(what) io.write(M.text(what)) end

--- A plain table as one line (or several, when long): keys sorted,
-- nested tables inline, lists shown as lists.  Values with __tostring keep it.
function M.format(v, depth)
  depth = depth or 0
  if type(v) == "string" then return depth == 0 and v or ("%q"):format(v) end
  if type(v) ~= "table" then return tostring(v) end
  local mt = getmetatable(v)
  if mt and mt.__tostring then return tostring(v) end
  if depth > 2 then return "{...}" end
  local parts, n = {}, #v
  for i = 1, math.min(n, 16) do parts[#parts + 1] = M.format(v[i], depth + 1) end
  if n > 16 then parts[#parts + 1] = ("... (%d items)"):format(n) end
  local keys = {}
  for k in pairs(v) do
    if not (math.type(k) == "integer" and k >= 1 and k <= n) then keys[#keys + 1] = k end
  end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  for _, k in ipairs(keys) do
    local key = type(k) == "string" and k:match("^[%a_][%w_]*$") and k or ("[" .. M.format(k, 3) .. "]")
    parts[#parts + 1] = key .. " = " .. M.format(v[k], depth + 1)
  end
  local one = "{" .. table.concat(parts, ", ") .. "}"
  if depth > 0 or #one <= 100 or #keys == 0 then return one end
  return "{\n  " .. table.concat(parts, ",\n  ") .. "\n}"
end

return M
