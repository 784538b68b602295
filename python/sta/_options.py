"""The options of sta's bindings (names, kinds, ranges, calls), generated
from lua/sta/options.lua by its python_source(): do not edit; regenerate with
  lua5.4 -e 'io.write(dofile("lua/sta/options.lua").python_source())' \
    > python/sta/_options.py
(spec/options_spec.lua fails when this copy is stale).  _args.py checks
arguments against it."""

OPTIONS = {
    "batch": {"class": "sta.ForwardBatch", "doc": "the forward batch", "kind": "object"},
    "batch_size": {"default": 1, "doc": "requests in the batch", "kind": "int32", "min": 1},
    "canvas": {"default": "the known shape of the sequence length (sta_geometry_from_seq_len)", "doc": "T, H, W video tokens", "kind": "triple", "min": 1},
    "deterministic": {"doc": "bit-identical gradients", "kind": "bool"},
    "device": {"alias": "backend", "doc": "where it runs", "kind": "enum", "values": ("cpu", "cuda")},
    "dk": {"doc": "dk to write", "kind": "tensor", "only": ("ffi", "lua")},
    "dq": {"doc": "dq to write", "kind": "tensor", "only": ("ffi", "lua")},
    "dtype": {"doc": "the dtype of a new out", "kind": "enum", "only": ("ffi", "lua"), "values": ("f32", "f16", "bf16")},
    "dv": {"doc": "dv to write", "kind": "tensor", "only": ("ffi", "lua")},
    "files": {"doc": "saved search files", "kind": "paths"},
    "full": {"doc": "the full window", "kind": "windows", "single": True},
    "full_steps": {"default": 0, "doc": "steps with the full window", "kind": "int32", "min": 0},
    "geometry": {"class": "sta.Geometry", "doc": "canvas, tile, text_len and order in one", "excludes": ("canvas", "tile", "text_len", "order"), "kind": "object", "only": ("lua",)},
    "head_dim": {"doc": "D", "kind": "int32", "min": 1, "required": True},
    "heads": {"doc": "an integer >= 1: the heads on this rank; sta.dist.layer: of all ranks", "kind": "int32", "min": 1, "required": True},
    "layer": {"default": 0, "doc": "layer index (when no prefix)", "kind": "int32", "min": 0},
    "layers": {"default": 1, "doc": "transformer layers", "kind": "int32", "min": 1},
    "layout": {"doc": "[B, S, heads, D] or [B, heads, S, D]", "kind": "enum", "values": ("bshd", "bhsd")},
    "lse": {"doc": "return the log-sum-exp", "kind": "output", "only": ("ffi", "lua")},
    "metadata": {"class": "sta.Metadata", "doc": "the step's window table", "excludes": ("strategy",), "kind": "object"},
    "negative": {"doc": "the classifier-free-guidance negative pass", "kind": "bool"},
    "order": {"doc": "the rows' token order", "kind": "enum", "values": ("untiled", "tiled")},
    "out": {"doc": "the output to write", "kind": "tensor", "only": ("ffi", "lua")},
    "out_dtype": {"class": "torch.dtype (float32, float16 or bfloat16)", "doc": "the dtype of out", "kind": "object", "only": ("python",)},
    "precision": {"doc": "the forward's compute", "kind": "enum", "values": ("native", "fp8")},
    "prefix": {"doc": "module prefix; the layer is prefix.split('.')[-3]", "kind": "string"},
    "return_lse": {"doc": "return the log-sum-exp too", "kind": "bool", "only": ("python",)},
    "scale": {"default": "1/sqrt(D)", "doc": "the softmax scale", "kind": "float32", "positive": True},
    "skip_steps": {"default": "sta_tune_defaults'", "doc": "steps that keep the full window", "kind": "int32", "min": 0},
    "softmax": {"doc": "the forward's softmax", "kind": "enum", "values": ("exact", "fast")},
    "sp_rank": {"default": 0, "doc": "this rank", "kind": "int32", "min": 0},
    "sp_size": {"default": 1, "doc": "ranks splitting the heads", "kind": "int32", "min": 1},
    "step": {"default": 0, "doc": "the denoising step", "kind": "int32", "min": 0},
    "steps": {"doc": "denoising steps", "kind": "int32", "min": 1, "required": True},
    "strategy": {"class": "sta.Strategy", "doc": "used when the context has no metadata", "kind": "object"},
    "text_len": {"default": "every row after the video", "doc": "valid text rows", "kind": "int64", "min": 0},
    "tile": {"default": "sta_geometry_init's tile", "doc": "tt, th, tw tokens", "kind": "triple"},
    "window": {"doc": "{Kt, Kh, Kw} for every head, or a list of them, one per head", "kind": "windows", "required": True},
}

CALLS = {
    "attention": ("canvas", "tile", "text_len", "order", "layout", "window", "scale", "softmax", "precision", "deterministic", "geometry", "out", "lse", "return_lse"),
    "attention_backward": ("canvas", "tile", "text_len", "order", "layout", "window", "scale", "softmax", "precision", "deterministic", "geometry", "dq", "dk", "dv"),
    "attention_fp8": ("canvas", "tile", "text_len", "order", "layout", "window", "scale", "softmax", "precision", "deterministic", "geometry", "out", "lse", "return_lse", "dtype", "out_dtype"),
    "forward_batch": ("batch_size", "negative"),
    "forward_context": ("step", "metadata", "batch", "strategy", "layers", "heads?"),
    "geometry": ("canvas", "tile", "text_len", "order"),
    "layer": ("prefix", "layer", "heads", "head_dim", "sp_rank", "sp_size", "canvas", "tile", "text_len", "order", "layout", "geometry", "device", "scale", "softmax", "precision", "strategy"),
    "layer_backward": ("dq", "dk", "dv"),
    "layer_forward": ("out", "lse"),
    "reference": ("canvas", "tile", "text_len", "order", "layout", "window", "scale", "softmax", "precision", "deterministic", "geometry", "out", "lse", "return_lse"),
    "sp_attention": ("canvas", "tile", "text_len", "geometry", "window", "layout", "scale", "out"),
    "sp_layer": ("prefix", "layer", "heads", "head_dim", "canvas", "tile", "text_len", "layout", "geometry", "device", "scale", "softmax", "precision", "strategy"),
    "sp_shard": ("canvas", "tile", "text_len", "geometry", "window?", "layout", "scale", "out"),
    "tune": ("files!", "skip_steps", "full"),
    "uniform": ("steps", "layers!", "heads", "window", "full", "full_steps"),
}

FLOAT32 = (7.0064923216240854e-46, 3.4028235677973366e+38)
