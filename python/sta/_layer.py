"""sta.Layer: an attention layer of a pipeline, STA (the live context's
windows for its step, layer and heads) or VSA (mode="vsa": the forward
batch's sparsity per step), differentiable (split out of runtime.py, whose
classes it builds on)."""
import ctypes as C

from . import _args
from ._args import enum
from ._capi import AttentionDesc, LayerDesc, STA_LAYER_VSA, VsaDesc
from .errors import UnsupportedError
from .runtime import Strategy, _Handle, _L, _enter, _is_a, _leave, _new, _optional, _path

__all__ = ["Layer"]


class Layer(_Handle):
    """An STA attention layer: runs with the live context's windows for its
    (step, layer, heads), from the context's metadata or its own strategy
    (STA.md sections 5-7; search rows run the mask search).

    Options (sta's option schema, as sta.layer{...} in Lua): heads (this
    rank's) and head_dim, required; prefix (the module name, layer =
    int(prefix.split('.')[-3])) or layer; canvas (absent: FastVideo's known
    shape by seq_len), tile, text_len; order "untiled" or "tiled"
    (FastVideo's tiled token order, read in place); layout "bshd"/"bhsd";
    device "cpu"/"cuda" (alias backend); scale (absent: 1/sqrt(D));
    softmax, precision; strategy (used when the context has no metadata);
    sp_rank, sp_size (heads split over ranks).  mode "vsa" (STA.md section
    12): Video Sparse Attention on q, k, v in the cube order of canvas
    (sta.to_cubes), cube 4x4x4 or 4x8x8, the sparsity of the live context's
    forward batch (ForwardBatch.vsa_sparsity, SGLang's VSA_sparsity) each
    step, every cube for steps below dense_steps; layer(q, k, v, gate)
    takes FastVideo's compress_attn_weight.  A VSA layer takes no text
    rows, strategy or sequence parallelism.

    layer(q, k, v) returns out.  Inputs that require grad are differentiable:
    the forward resolves the attention it runs (sta_layer_resolve: windows,
    scale, geometry) and runs it as sta.attention does, and the backward
    uses exactly that (STA.md section 10), whatever the context, the
    strategy or the layer hold by then.  The backward of a search-mode
    forward raises UnsupportedError.
    """

    _destroy = "sta_layer_destroy"
    _what = "layer"

    def __init__(self, *, heads=None, head_dim=None, prefix=None, layer=None, canvas=None,
                 tile=None, text_len=None, order=None, layout=None, device=None, scale=None,
                 softmax=None, precision=None, strategy=None, sp_rank=None, sp_size=None,
                 mode=None, cube=None, dense_steps=None, **unknown):
        given = dict(heads=heads, head_dim=head_dim, prefix=prefix, layer=layer, canvas=canvas,
                     tile=tile, text_len=text_len, order=order, layout=layout, device=device,
                     scale=scale, softmax=softmax, precision=precision, strategy=strategy,
                     sp_rank=sp_rank, sp_size=sp_size, mode=mode, cube=cube,
                     dense_steps=dense_steps)
        if "backend" in unknown:  # the schema's alias of device
            given["backend"] = unknown.pop("backend")
        if unknown:
            raise _args.unknown("layer", unknown)
        o = _args.check("layer", given, _is_a)
        L = _L()
        d = LayerDesc()
        self._prefix = _path(prefix, "prefix") if prefix is not None else None
        d.prefix = self._prefix
        d.layer_index = o["layer"]
        d.local_heads, d.head_dim = o["heads"], o["head_dim"]
        d.sp_rank, d.sp_size = o["sp_rank"], o["sp_size"]
        if "canvas" in o:  # else FastVideo's known canvases by seq_len
            L.sta_geometry_init(C.byref(d.geom), *o["canvas"])
            if "tile" in o:
                d.geom.tile[:] = o["tile"]
            if "text_len" in o:
                d.geom.text_len = o["text_len"]
        d.geom.order = enum("order", o.get("order"))
        d.layout = enum("layout", o.get("layout"))
        d.backend = enum("device", o.get("device"))
        d.scale = o.get("scale", 0.0)
        d.softmax = enum("softmax", o.get("softmax"))
        d.precision = enum("precision", o.get("precision"))
        d.strategy = strategy.handle if strategy is not None else None
        d.mode = enum("mode", o.get("mode"))
        if "cube" in o:
            d.cube[:] = o["cube"]
        d.dense_steps = o["dense_steps"]
        self._strategy = strategy
        self._vsa = d.mode == STA_LAYER_VSA
        super().__init__(_new(L.sta_layer_create, C.byref(d)))
        self._desc = d
        self.device = o.get("device", "cpu")
        self.layout = o.get("layout", "bshd")

    @property
    def index(self):
        return int(_L().sta_layer_index(self.handle))

    @property
    def strategy(self):
        return self._strategy

    @strategy.setter
    def strategy(self, s):
        _optional(s, Strategy, "strategy")
        _L().check(_L().sta_layer_set_strategy(self.handle, s.handle if s is not None else None))
        self._strategy = s

    def forward(self, q, k, v, gate=None):
        """out = STA(q, k, v) with the live context's windows for this layer,
        or VSA (mode "vsa") with the step's topk and gate (FastVideo's
        compress_attn_weight; VSA layers only); differentiable (the backward
        uses this forward's windows or topk, scale and geometry, kept with
        it)."""
        import torch
        from ._op import _check_tensors, _run_attention
        _check_tensors(("q", "k", "v"), (q, k, v))
        if self._vsa:
            return self._vsa_forward(q, k, v, gate)
        if gate is not None:
            raise _args._bad(_args._E_ARGUMENT,
                             'gate: an STA layer takes no gate (a layer of mode "vsa" does)')
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            spec, search = self._resolve(q)
            if spec is not None:
                return _run_attention(q, k, v, spec, False)
            return _search_function().apply(self, q, k, v, search)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _layer_call(self, "sta_layer_forward", (q, k, v, out))
        return out

    __call__ = forward

    def _resolve(self, q):
        """(the Spec of the attention the forward runs for q under the live
        context, None), or (None, the UnsupportedError of a search row)."""
        from ._op import Spec, _handles
        L = _L()
        d = AttentionDesc()
        wins = (C.c_int32 * (3 * max(self._desc.local_heads, 1)))()
        h = _enter()
        try:
            rc = L.sta_layer_resolve(self.handle, _handles(L, (q,))[0], C.byref(d), wins)
        finally:
            _leave(h)
        if rc:
            e = L.error(rc)
            if isinstance(e, UnsupportedError) and e.status_name == "STA_ERR_UNSUPPORTED":
                return None, e
            raise e
        return Spec(tuple(d.geom.canvas), tuple(d.geom.tile), d.geom.text_len, d.layout,
                    d.softmax, d.deterministic, d.geom.order, d.precision,
                    tuple(wins[:3 * d.n_windows]), d.scale), None

    def _vsa_forward(self, q, k, v, gate):
        """VSA with what sta_layer_resolve_vsa gives under the live context:
        the same op as sta.vsa, its spec and sizes kept for the backward."""
        import torch
        from ._op import _check_tensors, _handles
        from ._sparse import VsaSpec, _cached, _cube_sizes, _vsa_call
        if gate is not None:
            _check_tensors(("q", "gate"), (q, gate))
        L = _L()
        d = VsaDesc()
        canvas, cube = (C.c_int32 * 3)(), (C.c_int32 * 3)()
        h = _enter()
        try:
            L.check(L.sta_layer_resolve_vsa(self.handle, _handles(L, (q,))[0], C.byref(d),
                                            canvas, cube))
        finally:
            _leave(h)
        canvas, cube = tuple(canvas), tuple(cube)
        sizes = _cached(("sizes", canvas, cube, q.device),
                        lambda: torch.tensor(_cube_sizes(canvas, cube), dtype=torch.int32,
                                             device=q.device))
        spec = VsaSpec(d.block_rows, d.topk, d.layout, d.deterministic, d.scale)
        return _vsa_call(q, k, v, gate, sizes, None, spec)

    def __repr__(self):
        return "sta.Layer(released)" if self._h is None else "sta.Layer(%d)" % self.index


def _layer_call(layer, fn, tensors):
    """fn(layer, *tensors) on the tensors' device, with the innermost
    context on the core's stack for the call."""
    from ._op import _handles, _run
    L = _L()
    hs = _handles(L, tensors)
    f = getattr(L, fn)

    def call():
        h = _enter()
        try:
            return f(layer.handle, *hs)
        finally:
            _leave(h)

    _run(tensors[0].device, call)


_SearchFunction = None


def _search_function():
    global _SearchFunction
    if _SearchFunction is not None:
        return _SearchFunction
    import torch

    class SearchFunction(torch.autograd.Function):
        """A layer's search-mode forward (STA.md section 7): out is the full
        window's; its backward raises (a search row has no backward)."""

        @staticmethod
        def forward(ctx, layer, q, k, v, error):
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            _layer_call(layer, "sta_layer_forward", (q, k, v, out))
            ctx.error = error
            return out

        @staticmethod
        def backward(ctx, dout):
            raise ctx.error

    _SearchFunction = SearchFunction
    return SearchFunction
