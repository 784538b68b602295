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
close()).  Options are checked against sta's one option schema (_args),
as in the Lua module and the LuaJIT FFI.  A pushed context holds references
to its metadata and batch (closing them changes nothing until it is
popped).  Contexts are kept per thread and per asyncio task (a
contextvars.ContextVar, as the Lua module keeps them per coroutine: STA.md
section 6) and put on the core's stack only around a call that reads them;
a context collected while pushed (push() without pop()) is detected there:
that call raises naming it and the context goes.
"""
import contextvars
import ctypes as C
import os
import weakref

from . import _args, _capi
from ._args import _E_ARGUMENT, _bad, triple
from ._capi import TuneReport, ints
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


_INT32 = {"kind": "int32"}


def _i32(name, v):
    """v as an int32 argument of a C call: an integer in range, else
    ArgumentError naming it (ctypes would wrap it silently)."""
    return _args.check_value(name, v, _INT32)


def _floats(name, rows, n, width):
    """rows: n lists of width numbers, flat for C (ArgumentError otherwise)."""
    import numbers
    if not hasattr(rows, "__len__") or len(rows) != n or any(
            not hasattr(r, "__len__") or len(r) != width for r in rows):
        raise _bad(_E_ARGUMENT, "%s: expected %d lists of %d floats (candidate x head)"
                   % (name, n, width))
    flat = [x for r in rows for x in r]
    for x in flat:
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise _bad(_E_ARGUMENT, "%s: expected numbers, got %s" % (name, _args.show(x)))
    return (C.c_float * max(len(flat), 1))(*flat)


def _is_a(v, cls):
    """The option schema's classes (kind object) in this binding."""
    c = {"sta.Strategy": Strategy, "sta.Metadata": Metadata,
         "sta.ForwardBatch": ForwardBatch}.get(cls)
    return c is not None and isinstance(v, c)


def _optional(value, cls, name):
    """value is None or a cls, else ArgumentError naming the argument."""
    if value is not None and not isinstance(value, cls):
        raise _bad(_E_ARGUMENT, "%s: expected a sta.%s, got %s"
                   % (name, cls.__name__, _args.show(value)))


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
        if not isinstance(text, (str, bytes, bytearray, memoryview)):
            raise _bad(_E_ARGUMENT, "text: expected JSON as str or bytes, got %s"
                       % _args.show(text))
        data = text.encode() if isinstance(text, str) else bytes(text)
        return cls(_new(_L().sta_strategy_parse, data, len(data)))

    @classmethod
    def default(cls):
        """The file named by STA_ATTENTION_CONFIG (or SGLANG_DIFFUSION_ / FASTVIDEO_
        ATTENTION_CONFIG); EnvError "STA_ATTENTION_CONFIG is not set" otherwise."""
        return cls(_new(_L().sta_strategy_load_default))

    @classmethod
    def uniform(cls, steps=None, layers=None, heads=None, window=None, full=None,
                full_steps=None, **unknown):
        """One window everywhere (steps, layers, heads and window required, as
        in the C, Lua and FFI APIs); full for steps < full_steps."""
        if unknown:
            raise _args.unknown("uniform", unknown)
        o = _args.check("uniform", dict(steps=steps, layers=layers, heads=heads, window=window,
                                        full=full, full_steps=full_steps))
        if type(o["window"][0]) is not int:
            raise _bad(_E_ARGUMENT, "window: expected one window {Kt, Kh, Kw}, got a list")
        f = ints(o["full"]) if "full" in o else None
        return cls(_new(_L().sta_strategy_uniform, o["steps"], o["layers"], o["heads"],
                        ints(o["window"]), f, o["full_steps"]))

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
        _L().check(_L().sta_strategy_get(self.handle, _i32("step", step), _i32("layer", layer),
                                         _i32("head", head), w))
        return tuple(w)

    def set(self, step, layer, head, window):
        _L().check(_L().sta_strategy_set(self.handle, _i32("step", step), _i32("layer", layer),
                                         _i32("head", head), ints(triple(window, "window"))))
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
        _L().check(_L().sta_strategy_check(self.handle, _i32("steps", steps),
                                           _i32("layers", layers), _i32("heads", heads)))

    def sparsity(self, grid):
        """1 - sum(window volume) / sum(full volume) on a tile grid (NT, NH, NW)."""
        out = C.c_double()
        _L().check(_L().sta_strategy_sparsity(self.handle, ints(triple(grid, "grid")),
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
            handle = _new(_L().sta_metadata_create,
                          _i32("layers", layers) if layers is not None else 0)
        super().__init__(handle)

    @classmethod
    def from_strategy(cls, strategy, step, layers, heads):
        """The table of step; strategy None gives "mask_strategy cannot be None ..."."""
        _optional(strategy, Strategy, "strategy")
        s = strategy.handle if strategy is not None else None
        return cls(handle=_new(_L().sta_metadata_from_strategy, s, _i32("step", step),
                               _i32("layers", layers), _i32("heads", heads)))

    @classmethod
    def search(cls, layers, candidates):
        """A search table: every layer's row is the candidates (full last)."""
        flat = [x for i, w in enumerate(candidates) for x in triple(w, "candidates[%d]" % i)]
        return cls(handle=_new(_L().sta_metadata_search, _i32("layers", layers), len(flat) // 3,
                               ints(flat)))

    @property
    def layers(self):
        return int(_L().sta_metadata_layers(self.handle))

    def __len__(self):
        return self.layers

    def set_row(self, layer, windows):
        flat = [x for i, w in enumerate(windows) for x in triple(w, "windows[%d]" % i)]
        _L().check(_L().sta_metadata_set_row(self.handle, _i32("layer", layer), len(flat) // 3,
                                             ints(flat)))
        return self

    def row(self, layer):
        """The windows of layer's row, a list of (Kt, Kh, Kw); [] when unset."""
        n = C.c_int32()
        p = C.POINTER(C.c_int32)()
        _L().check(_L().sta_metadata_row(self.handle, _i32("layer", layer), C.byref(n),
                                         C.byref(p)))
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

    def __init__(self, batch_size=None, negative=None, vsa_sparsity=None, **unknown):
        if unknown:
            raise _args.unknown("forward_batch", unknown)
        o = _args.check("forward_batch", dict(batch_size=batch_size, negative=negative,
                                              vsa_sparsity=vsa_sparsity))
        super().__init__(_new(_L().sta_forward_batch_create, o["batch_size"]))
        self.negative = o.get("negative", False)
        self.vsa_sparsity = o.get("vsa_sparsity", 0.0)

    @property
    def vsa_sparsity(self):
        """The sparsity of VSA layers (SGLang's VSA_sparsity), in [0, 1): the
        fraction of key cubes each query cube leaves out; set it per step."""
        return float(_L().sta_forward_batch_vsa_sparsity(self.handle))

    @vsa_sparsity.setter
    def vsa_sparsity(self, s):
        s = _args.check_value("vsa_sparsity", s, _args.OPTIONS["vsa_sparsity"])
        _L().check(_L().sta_forward_batch_set_vsa_sparsity(self.handle, s))

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
        flat = [x for i, w in enumerate(candidates) for x in triple(w, "candidates[%d]" % i)]
        n = len(flat) // 3
        heads = len(l1[0]) if n and hasattr(l1, "__len__") and len(l1) and \
            hasattr(l1[0], "__len__") else 0
        a, b = _floats("l1", l1, n, heads), _floats("l2", l2, n, heads)
        _L().check(_L().sta_forward_batch_record(self.handle, 1 if negative else 0,
                                                 _i32("step", step), _i32("layer", layer),
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

# This thread's (and asyncio task's) stack: a tuple of (weakref to a
# ForwardContext, its step), innermost last; a dead weakref is a context
# collected while pushed.
_stack = contextvars.ContextVar("sta_forward_contexts", default=())


def _release(md, fb):
    L = _capi._lib
    if L is not None:
        L.sta_metadata_destroy(md)
        L.sta_forward_batch_destroy(fb)


class ForwardContext:
    """A forward context (STA.md section 6): pushed on __enter__ (or push()),
    popped on __exit__ (or pop()), also when an exception unwinds.  The
    contexts form the calling thread's (and asyncio task's) stack; the
    innermost is live.  A pushed context holds its metadata and batch."""

    def __init__(self, step=None, metadata=None, batch=None, **unknown):
        if unknown:
            raise _args.unknown("forward_context", unknown)
        o = _args.check("forward_context", dict(step=step, metadata=metadata, batch=batch),
                        _is_a)
        self.step = o["step"]
        self.metadata = metadata
        self.batch = batch
        self._level = 0
        self._refs = self._finalizer = None

    @property
    def live(self):
        return self._level != 0

    def push(self):
        if self._level:
            raise StateError("forward context: already pushed", 200, "STA_ERR_STATE")
        L = _L()
        md = self.metadata.handle if self.metadata is not None else None
        fb = self.batch.handle if self.batch is not None else None
        L.sta_metadata_retain(md)  # the context's own references (NULL: nothing)
        L.sta_forward_batch_retain(fb)
        self._refs = (md, fb)
        self._finalizer = weakref.finalize(self, _release, md, fb)
        st = _stack.get()
        if len(st) >= 1 << 16:
            raise StateError("forward context: stack too deep (%d contexts)" % len(st), 200,
                             "STA_ERR_STATE")
        _stack.set(st + ((weakref.ref(self), self.step),))
        self._level = len(st) + 1
        return self

    def pop(self):
        """Pop; it must be the innermost (StateError otherwise, nothing changed;
        contexts above it that were collected go with it).  Popping a popped
        context does nothing."""
        if not self._level:
            return
        st = _stack.get()
        if len(st) < self._level or st[self._level - 1][0]() is not self:
            raise StateError("forward context: pop of a context of another thread or task "
                             "(step %d)" % self.step, 200, "STA_ERR_STATE")
        if any(e[0]() is not None for e in st[self._level:]):
            raise StateError("forward context: pop of a context that is not the innermost (it "
                             "is at level %d of depth %d)" % (self._level, len(st)), 200,
                             "STA_ERR_STATE")
        _stack.set(st[:self._level - 1])
        self._level = 0
        self._finalizer()

    def __enter__(self):
        return self.push()

    def __exit__(self, *exc):
        self.pop()
        return False

    def __repr__(self):
        return "sta.ForwardContext(step %d, %s)" % (self.step, "live" if self.live else
                                                    "not pushed")


def _innermost():
    """The innermost ForwardContext of this thread and task, or None;
    raises StateError naming a context collected while pushed (and drops it,
    with the collected ones right below it)."""
    st = _stack.get()
    if not st:
        return None
    ctx = st[-1][0]()
    if ctx is not None:
        return ctx
    below = len(st) - 1
    while below > 0 and st[below - 1][0]() is None:
        below -= 1
    _stack.set(st[:below])
    step, level, more = st[-1][1], len(st), len(st) - 1 - below
    raise StateError(
        "forward context: the context of step %d (level %d)%s garbage-collected without being "
        "popped; %s been popped (open contexts with `with sta.forward_context(...):`)"
        % (step, level, " and %d below it were" % more if more else " was",
           "they have" if more else "it has"), 200, "STA_ERR_STATE")


def _enter():
    """Push the innermost context on the core's stack for one call; returns
    the core's handle (None: no context of ours: the core's own stack
    decides)."""
    ctx = _innermost()
    if ctx is None:
        return None
    return _new(_L().sta_context_push, ctx.step, *ctx._refs)


def _leave(h):
    if h is not None:
        _L().sta_context_pop(h)


def forward_context(step=None, metadata=None, batch=None, *, strategy=None, layers=None,
                    heads=None, **unknown):
    """A ForwardContext for `with`: metadata given, or built from strategy for
    step (layers x heads), as sta.forward_context{strategy=...} in Lua."""
    if unknown:
        raise _args.unknown("forward_context", unknown)
    o = _args.check("forward_context", dict(step=step, metadata=metadata, batch=batch,
                                            strategy=strategy, layers=layers, heads=heads),
                    _is_a)
    if strategy is not None:
        metadata = Metadata.from_strategy(strategy, o["step"], o["layers"], o.get("heads", 1))
    return ForwardContext(step, metadata, batch)


def _live():
    """The live contexts of this thread and task, innermost first (collected
    ones skipped)."""
    return [c for c in (e[0]() for e in reversed(_stack.get())) if c is not None]


def current_context():
    """The innermost live ForwardContext of this thread and task, or None."""
    live = _live()
    return live[0] if live else None


def context_depth():
    """Live contexts of this thread and task, plus any pushed from C."""
    return len(_live()) + int(_L().sta_context_depth())


def in_forward_pass():
    """True when the live context has a forward batch."""
    c = current_context()
    return c.batch is not None if c is not None else bool(_L().sta_in_forward_pass())


# ---- layers -----------------------------------------------------------------------

def layer_index_from_prefix(prefix):
    """SGLang's rule: int(prefix.split('.')[-3])."""
    i = C.c_int32()
    _L().check(_L().sta_layer_index_from_prefix(_path(prefix, "prefix"), C.byref(i)))
    return i.value


# ---- tuning -------------------------------------------------------------------------

def tune(files=None, skip_steps=None, full=None, **unknown):
    """Average L2 over saved search files; full window below skip_steps, the
    argmin afterwards (absent: sta_tune_defaults', FastVideo's).  Returns
    (Strategy, report dict: sparsity, windows, counts)."""
    if unknown:
        raise _args.unknown("tune", unknown)
    o = _args.check("tune", dict(files=files, skip_steps=skip_steps, full=full))
    L = _L()
    dfull, dskip = (C.c_int32 * 3)(), C.c_int32()
    L.sta_tune_defaults(dfull, C.byref(dskip))
    paths = [p.encode() for p in o["files"]]
    arr = (C.c_char_p * max(len(paths), 1))(*paths)
    rep = TuneReport()
    h = _new(L.sta_tune, len(paths), arr, o.get("skip_steps", dskip.value),
             ints(o["full"]) if "full" in o else dfull, C.byref(rep))
    n = min(rep.n_windows, 16)
    return Strategy(h), {"sparsity": rep.sparsity,
                         "windows": [tuple(rep.windows[i]) for i in range(n)],
                         "counts": [int(rep.counts[i]) for i in range(n)]}


from ._layer import Layer  # noqa: E402  (it builds on the classes above)
