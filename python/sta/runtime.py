"""Mask strategies, per-step metadata, forward contexts and STA layers.

The Python face of sta.h's runtime sections (STA.md sections 5-7), as the
Lua module offers them:

    strat = sta.Strategy.load("mask_strategy.json")   # FastVideo's JSON
    layer = sta.Layer(prefix="transformer.blocks.7.attn.impl", heads=24,
                      head_dim=128, canvas=(30, 48, 80), device="cuda")
    batch = sta.ForwardBatch(batch_size=1)
    for step in range(50):
        md = sta.Metadata.from_strategy(strat, step, layers=40, heads=24)
        with sta.forward_context(step=step, metadata=md, batch=batch):
            out = layer(q, k, v)          # windows of (step, 7, head)

Objects own their C handles and release them when collected (or on
close()).  A context borrows its metadata and batch: the Python context
object keeps them alive until it is popped.
"""
import ctypes as C
import os
import threading

from . import _capi
from ._args import _E_ARGUMENT, _bad, _layout, _order, _text_len, _triple
from ._capi import LayerDesc, TuneReport, ints
from .errors import StateError

__all__ = ["Strategy", "Metadata", "ForwardBatch", "ForwardContext", "forward_context",
           "current_context", "context_depth", "in_forward_pass", "Layer", "tune",
           "layer_index_from_prefix"]


def _L():
    return _capi.lib()


def _new(fn, *args):
    """Run a constructor fn(&out, *args); raise on error; return the handle."""
    h = C.c_void_p()
    L = _L()
    L.check(fn(C.byref(h), *args))
    return h


def _path(p, name="path"):
    if isinstance(p, os.PathLike):
        p = os.fspath(p)
    if isinstance(p, str):
        return p.encode()
    if isinstance(p, bytes):
        return p
    raise _bad(_E_ARGUMENT, "%s: expected a path, got %s" % (name, type(p).__name__))


def _optional(value, cls, name):
    """value is None or a cls, else ArgumentError naming the argument."""
    if value is not None and not isinstance(value, cls):
        raise _bad(_E_ARGUMENT, "%s: expected sta.%s, got %s"
                   % (name, cls.__name__, type(value).__name__))


class _Handle:
    """Owns one C handle; close() (or collection) destroys it once."""

    _destroy = None
    _what = "object"

    def __init__(self, handle):
        self._h = handle

    @property
    def handle(self):
        if self._h is None:
            raise StateError("%s: released" % self._what, 200, "STA_ERR_STATE")
        return self._h

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h is not None and _capi._lib is not None:
            getattr(_capi._lib, self._destroy)(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass


# ---- strategies -------------------------------------------------------------

class Strategy(_Handle):
    """A window for every (step, layer, head): FastVideo's {"t_l_h": [Kt, Kh, Kw]}."""

    _destroy = "sta_strategy_destroy"
    _what = "strategy"

    def __init__(self, handle=None):
        super().__init__(handle if handle is not None else _new(_L().sta_strategy_create))

    @classmethod
    def load(cls, path):
        """Read a strategy JSON file (EnvError naming the first bad key or value)."""
        return cls(_new(_L().sta_strategy_load, _path(path)))

    @classmethod
    def parse(cls, text):
        """Parse strategy JSON from a string or bytes."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        return cls(_new(_L().sta_strategy_parse, data, len(data)))

    @classmethod
    def default(cls):
        """The file named by STA_ATTENTION_CONFIG (or SGLANG_DIFFUSION_ / FASTVIDEO_
        ATTENTION_CONFIG); EnvError "STA_ATTENTION_CONFIG is not set" otherwise."""
        return cls(_new(_L().sta_strategy_load_default))

    @classmethod
    def uniform(cls, steps, layers, heads, window, full=None, full_steps=0):
        """One window everywhere (required, as in the C, Lua and FFI APIs); full for
        steps < full_steps."""
        w = ints(_triple(window, "window"))
        f = ints(_triple(full, "full")) if full is not None else None
        return cls(_new(_L().sta_strategy_uniform, steps, layers, heads, w, f, full_steps))

    def save(self, path):
        """Write the JSON file atomically."""
        _L().check(_L().sta_strategy_save(self.handle, _path(path)))

    def to_json(self):
        p = C.c_void_p()
        L = _L()
        L.check(L.sta_strategy_to_json(self.handle, C.byref(p)))
        try:
            return C.string_at(p).decode()
        finally:
            L.sta_free(p)

    def get(self, step, layer, head):
        """(Kt, Kh, Kw); ArgumentError (STA_ERR_KEY) naming a missing key."""
        w = (C.c_int32 * 3)()
        _L().check(_L().sta_strategy_get(self.handle, step, layer, head, w))
        return tuple(w)

    def set(self, step, layer, head, window):
        _L().check(_L().sta_strategy_set(self.handle, step, layer, head,
                                         ints(_triple(window, "window"))))
        return self

    def __len__(self):
        return int(_L().sta_strategy_count(self.handle))

    @property
    def extent(self):
        """(steps, layers, heads): 1 + the largest of each present."""
        a, b, c = C.c_int32(), C.c_int32(), C.c_int32()
        _L().sta_strategy_extent(self.handle, C.byref(a), C.byref(b), C.byref(c))
        return a.value, b.value, c.value

    def check(self, steps, layers, heads):
        """Every (step, layer, head) below the counts present, else ArgumentError."""
        _L().check(_L().sta_strategy_check(self.handle, steps, layers, heads))

    def sparsity(self, grid):
        """1 - sum(window volume) / sum(full volume) on a tile grid (NT, NH, NW)."""
        out = C.c_double()
        _L().check(_L().sta_strategy_sparsity(self.handle, ints(_triple(grid, "grid")),
                                              C.byref(out)))
        return out.value

    def __eq__(self, other):
        if not isinstance(other, Strategy):
            return NotImplemented
        return bool(_L().sta_strategy_equal(self.handle, other.handle))

    __hash__ = None

    def __repr__(self):
        if self._h is None:
            return "sta.Strategy(released)"
        s, l, h = self.extent
        return "sta.Strategy(%d entries, %d steps x %d layers x %d heads)" % (len(self), s, l, h)


# ---- metadata -------------------------------------------------------------------

class Metadata(_Handle):
    """One step's [layer][head] window table (FastVideo's STA_param).  A row
    with fewer windows than the model's heads is a search row (candidates,
    the full window last)."""

    _destroy = "sta_metadata_destroy"
    _what = "metadata"

    def __init__(self, layers=None, handle=None):
        if handle is None:
            handle = _new(_L().sta_metadata_create, layers if layers is not None else 0)
        super().__init__(handle)

    @classmethod
    def from_strategy(cls, strategy, step, layers, heads):
        """The table of step; strategy None gives "mask_strategy cannot be None ..."."""
        s = strategy.handle if strategy is not None else None
        return cls(handle=_new(_L().sta_metadata_from_strategy, s, step, layers, heads))

    @classmethod
    def search(cls, layers, candidates):
        """A search table: every layer's row is the candidates (full last)."""
        flat = [x for i, w in enumerate(candidates) for x in _triple(w, "candidates[%d]" % i)]
        return cls(handle=_new(_L().sta_metadata_search, layers, len(flat) // 3, ints(flat)))

    @property
    def layers(self):
        return int(_L().sta_metadata_layers(self.handle))

    def __len__(self):
        return self.layers

    def set_row(self, layer, windows):
        flat = [x for i, w in enumerate(windows) for x in _triple(w, "windows[%d]" % i)]
        _L().check(_L().sta_metadata_set_row(self.handle, layer, len(flat) // 3, ints(flat)))
        return self

    def row(self, layer):
        """The windows of layer's row, a list of (Kt, Kh, Kw); [] when unset."""
        n = C.c_int32()
        p = C.POINTER(C.c_int32)()
        _L().check(_L().sta_metadata_row(self.handle, layer, C.byref(n), C.byref(p)))
        return [(p[3 * i], p[3 * i + 1], p[3 * i + 2]) for i in range(n.value)]

    def __repr__(self):
        return "sta.Metadata(released)" if self._h is None else \
            "sta.Metadata(%d layers)" % self.layers


# ---- forward batch ---------------------------------------------------------------

class ForwardBatch(_Handle):
    """The request batch a forward context carries: size, the CFG negative
    flag, and where mask-search records go."""

    _destroy = "sta_forward_batch_destroy"
    _what = "forward batch"

    def __init__(self, batch_size=1, negative=False):
        super().__init__(_new(_L().sta_forward_batch_create, batch_size))
        self.negative = negative

    @property
    def size(self):
        return int(_L().sta_forward_batch_size(self.handle))

    @property
    def negative(self):
        return bool(_L().sta_forward_batch_is_negative(self.handle))

    @negative.setter
    def negative(self, flag):
        _L().sta_forward_batch_set_negative(self.handle, 1 if flag else 0)

    def records(self, negative=False):
        return int(_L().sta_forward_batch_records(self.handle, 1 if negative else 0))

    def record(self, step, layer, candidates, l1, l2, negative=False):
        """Add a search record by hand: candidates (sparse windows), l1 and l2
        [candidate][head] lists of floats."""
        flat = [x for i, w in enumerate(candidates) for x in _triple(w, "candidates[%d]" % i)]
        n = len(flat) // 3
        heads = len(l1[0]) if n else 0
        for name, loss in (("l1", l1), ("l2", l2)):
            if len(loss) != n or any(len(r) != heads for r in loss):
                raise _bad(_E_ARGUMENT, "%s: expected %d lists of %d floats (candidate x head)"
                                    % (name, n, heads))
        a = (C.c_float * max(n * heads, 1))(*[x for r in l1 for x in r])
        b = (C.c_float * max(n * heads, 1))(*[x for r in l2 for x in r])
        _L().check(_L().sta_forward_batch_record(self.handle, 1 if negative else 0, step, layer,
                                                 n, ints(flat), heads, a, b))
        return self

    def save_search(self, path, negative=False):
        """Write one list in FastVideo's per-prompt search layout (atomically)."""
        _L().check(_L().sta_forward_batch_save_search(self.handle, 1 if negative else 0,
                                                      _path(path)))

    def clear(self):
        _L().sta_forward_batch_clear(self.handle)

    def __repr__(self):
        if self._h is None:
            return "sta.ForwardBatch(released)"
        return "sta.ForwardBatch(size %d, %s, %d+%d records)" % (
            self.size, "negative" if self.negative else "positive", self.records(False),
            self.records(True))


# ---- contexts -------------------------------------------------------------------

_live = threading.local()  # handle value -> ForwardContext, per thread (as sta's stack)


def _live_map():
    m = getattr(_live, "map", None)
    if m is None:
        m = _live.map = {}
    return m


class ForwardContext:
    """A forward context (STA.md section 6): pushed on __enter__ (or push()),
    popped on __exit__ (or pop()), also when an exception unwinds.  The
    contexts form the calling thread's stack; the innermost is live."""

    def __init__(self, step=0, metadata=None, batch=None):
        _optional(metadata, Metadata, "metadata")
        _optional(batch, ForwardBatch, "batch")
        self.step = step
        self.metadata = metadata
        self.batch = batch
        self._h = None

    @property
    def live(self):
        return self._h is not None

    def push(self):
        if self._h is not None:
            raise StateError("forward context: already pushed", 200, "STA_ERR_STATE")
        md = self.metadata.handle if self.metadata is not None else None
        fb = self.batch.handle if self.batch is not None else None
        self._h = _new(_L().sta_context_push, self.step, md, fb)
        _live_map()[self._h.value] = self
        return self

    def pop(self):
        """Pop; it must be the innermost (StateError otherwise, nothing changed).
        Popping a popped context does nothing."""
        if self._h is None:
            return
        _L().check(_L().sta_context_pop(self._h))
        _live_map().pop(self._h.value, None)
        self._h = None

    def __enter__(self):
        return self.push()

    def __exit__(self, *exc):
        self.pop()
        return False

    def __repr__(self):
        return "sta.ForwardContext(step %d, %s)" % (self.step, "live" if self.live else "not pushed")


def forward_context(step=0, metadata=None, batch=None, *, strategy=None, layers=None,
                    heads=None):
    """A ForwardContext for `with`: metadata given, or built from strategy for
    step (layers x heads), as sta.forward_context{strategy=...} in Lua."""
    if metadata is None and strategy is not None:
        metadata = Metadata.from_strategy(strategy, step, layers or 1, heads or 1)
    return ForwardContext(step, metadata, batch)


def current_context():
    """The live ForwardContext pushed from Python on this thread, or None."""
    h = _L().sta_context_current()
    return _live_map().get(h) if h else None


def context_depth():
    return int(_L().sta_context_depth())


def in_forward_pass():
    """True when a live context has a forward batch."""
    return bool(_L().sta_in_forward_pass())


# ---- layers -----------------------------------------------------------------------

def layer_index_from_prefix(prefix):
    """SGLang's rule: int(prefix.split('.')[-3])."""
    i = C.c_int32()
    _L().check(_L().sta_layer_index_from_prefix(_path(prefix, "prefix"), C.byref(i)))
    return i.value


class Layer(_Handle):
    """An STA attention layer: runs with the live context's windows for its
    (step, layer, heads), from the context's metadata or its own strategy
    (STA.md sections 5-7; search rows run the mask search).

    prefix (the module name, layer = int(prefix.split('.')[-3])) or layer;
    heads (this rank's), head_dim; canvas (None: FastVideo's known shape by
    seq_len), tile, text_len; order "untiled" or "tiled" (FastVideo's tiled
    token order, read in place); layout "bshd"/"bhsd"; device "cpu"/"cuda";
    scale (None: 1/sqrt(D)); strategy (used when the context has no
    metadata); sp_rank, sp_size (heads split over ranks).

    layer(q, k, v) returns out.  Inputs that require grad are differentiable
    (sta_layer_forward_lse, then sta_layer_backward under the forward's
    context); the backward of a search-mode forward raises UnsupportedError
    (STA.md section 10).
    """

    _destroy = "sta_layer_destroy"
    _what = "layer"

    def __init__(self, *, heads, head_dim, prefix=None, layer=0, canvas=None,
                 tile=(6, 8, 8), text_len=None, layout="bshd", device="cpu", scale=None,
                 strategy=None, sp_rank=0, sp_size=1, order="untiled"):
        d = LayerDesc()
        self._prefix = _path(prefix, "prefix") if prefix is not None else None
        d.prefix = self._prefix
        d.layer_index = layer
        d.local_heads, d.head_dim = heads, head_dim
        d.sp_rank, d.sp_size = sp_rank, sp_size
        if canvas is not None:  # else FastVideo's known canvases by seq_len
            d.geom.canvas[:] = _triple(canvas, "canvas")
            d.geom.tile[:] = _triple(tile, "tile")
            d.geom.text_len = _text_len(text_len)
        d.geom.order = _order(order)
        d.layout = _layout(layout)
        if device not in ("cpu", "cuda"):
            raise _bad(_E_ARGUMENT, "device: expected \"cpu\" or \"cuda\", got %r" % (device,))
        d.backend = _capi.STA_CUDA if device == "cuda" else _capi.STA_CPU
        d.scale = float(scale) if scale is not None else 0.0
        _optional(strategy, Strategy, "strategy")
        d.strategy = strategy.handle if strategy is not None else None
        self._strategy = strategy
        super().__init__(_new(_L().sta_layer_create, C.byref(d)))
        self._desc = d
        self.device = device
        self.layout = layout

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

    def forward(self, q, k, v):
        """out = STA(q, k, v) with the live context's windows for this layer.
        Differentiable: the backward runs sta_layer_backward under the
        forward's context (step, metadata, batch), pushed again for the
        backward, so keep that metadata unchanged until backward."""
        import torch
        from ._op import _check_tensors
        _check_tensors(("q", "k", "v"), (q, k, v))
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _layer_function().apply(self, q, k, v)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _layer_call(self, "sta_layer_forward", (q, k, v, out))
        return out

    __call__ = forward

    def __repr__(self):
        return "sta.Layer(released)" if self._h is None else "sta.Layer(%d)" % self.index


def _layer_call(layer, fn, tensors, context=None):
    """fn(layer, *tensors) on the tensors' device; context: (step, metadata
    handle, batch handle) to push around the call."""
    from ._op import _handles, _run
    L = _L()
    hs = _handles(L, tensors)
    f = getattr(L, fn)

    def call():
        pushed = _new(L.sta_context_push, *context) if context is not None else None
        try:
            return f(layer.handle, *hs)
        finally:
            if pushed is not None:
                L.sta_context_pop(pushed)

    _run(tensors[0].device, call)


_LayerFunction = None


def _layer_function():
    global _LayerFunction
    if _LayerFunction is not None:
        return _LayerFunction
    import torch

    class LayerFunction(torch.autograd.Function):
        """A layer's forward with its lse, and sta_layer_backward under the
        forward's context, pushed again on the backward's thread."""

        @staticmethod
        def forward(ctx, layer, q, k, v):
            L = _L()
            c = L.sta_context_current()
            lay = layer._desc.layout
            b, x, y = q.shape[:3]
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            lse = torch.empty((b, y, x) if lay == _capi.STA_BSHD else (b, x, y),
                              dtype=torch.float32, device=q.device)
            _layer_call(layer, "sta_layer_forward_lse", (q, k, v, out, lse))
            ctx.layer = layer
            ctx.live = (L.sta_context_step(c), L.sta_context_metadata(c),
                        L.sta_context_batch(c))
            ctx.keep = current_context()  # its metadata and batch stay alive
            ctx.save_for_backward(q, k, v, out, lse)
            return out

        @staticmethod
        def backward(ctx, dout):
            from ._op import _last_dim_dense
            q, k, v, out, lse = ctx.saved_tensors
            grads = [torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3)]
            _layer_call(ctx.layer, "sta_layer_backward",
                        (q, k, v, out, lse, _last_dim_dense(dout), *grads), ctx.live)
            return (None,) + tuple(grads)

    _LayerFunction = LayerFunction
    return LayerFunction


# ---- tuning -------------------------------------------------------------------------

def tune(files, skip_steps=12, full=(3, 6, 10)):
    """Average L2 over saved search files; full window below skip_steps, the
    argmin afterwards.  Returns (Strategy, report dict: sparsity, windows,
    counts)."""
    paths = [_path(f, "files[%d]" % i) for i, f in enumerate(files)]
    arr = (C.c_char_p * max(len(paths), 1))(*paths)
    rep = TuneReport()
    h = _new(_L().sta_tune, len(paths), arr, skip_steps, ints(_triple(full, "full")),
             C.byref(rep))
    n = min(rep.n_windows, 16)
    return Strategy(h), {"sparsity": rep.sparsity,
                         "windows": [tuple(rep.windows[i]) for i in range(n)],
                         "counts": [int(rep.counts[i]) for i in range(n)]}
