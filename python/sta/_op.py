"""sta.attention on torch tensors: the forward, the backward and autograd.

Torch tensors are handed to libsta in place: their memory is wrapped
(sta_tensor_wrap with torch's strides; the wraps are cached per thread), so
strided views cost no copy.  Outputs (out, lse, dq, dk, dv) are allocated by
torch.  CUDA work runs on torch's current stream of the tensors' device
(sta_cuda_set_stream, left set for the calling thread).

With torch >= 2.4 the op is registered as torch.ops.sta.attention (and
torch.ops.sta.attention_backward), with fake implementations and registered
autograd, so torch.compile(fullgraph=True) keeps it as one node; eager calls
that need no gradient skip the dispatcher and call the library directly.
A call is described by a Spec (named fields: the options checked against
sta's option schema, _args.check), which is also the op's argument list
after q, k, v.  Older torch (Debian 12's 1.13) gets a
torch.autograd.Function.
"""
import ctypes as C
import threading
from typing import NamedTuple

import torch

from . import _args, _capi
from ._capi import (AttentionDesc, Geometry, STA_BF16, STA_BSHD, STA_CPU, STA_CUDA, STA_F16,
                    STA_F32, STA_F8E4M3, STA_I32, STA_PRECISION_FP8)
from ._args import _E_ARGUMENT, _E_DTYPE, _E_SHAPE, _bad

__all__ = ["attention", "attention_fp8", "reference", "reference_backward", "CUSTOM_OP"]

_DTYPES = {torch.float32: STA_F32, torch.float16: STA_F16, torch.bfloat16: STA_BF16}
# what _wrap takes: also 8-bit e4m3 operands (attention_fp8), as torch's
# float8_e4m3fn where it exists or as their raw codes in uint8
_F8 = tuple(t for t in (getattr(torch, "float8_e4m3fn", None), torch.uint8) if t is not None)
_WRAP_DTYPES = dict(_DTYPES)
_WRAP_DTYPES.update({t: STA_F8E4M3 for t in _F8})
_WRAP_DTYPES[torch.int32] = STA_I32  # block lists and sizes (sta_block_list, sta_vsa_desc)
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _version_at_least(major, minor):
    try:
        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


CUSTOM_OP = _version_at_least(2, 4) and hasattr(torch, "library") and \
    hasattr(torch.library, "register_fake")

# ---- arguments --------------------------------------------------------------


class Spec(NamedTuple):
    """One call's description, hashable, in sta_attention_desc's terms; an
    unset field is the core's default.  Also the op's arguments after q, k,
    v, in this order (torch.ops.sta.attention's schema names them)."""
    canvas: tuple        # (T, H, W); (): the known shape of q's length
    tile: tuple          # (tt, th, tw); (): sta_geometry_init's
    text_len: int        # -1: every row after the video (sta_geometry)
    layout: int          # sta_layout
    softmax: int         # sta_softmax
    deterministic: int   # 0 or 1
    order: int           # sta_order
    precision: int       # sta_precision
    windows: tuple       # Kt, Kh, Kw per window, flat: one window or one per head
    scale: float         # 0.0: 1/sqrt(D) (sta_attention_desc.scale)


def _spec(call, is_a=None, **given):
    """The Spec of call's options (checked: _args.check), and the checked
    options."""
    o = _args.check(call, given, is_a)
    w = o["window"]
    return Spec(o.get("canvas", ()), o.get("tile", ()), o.get("text_len", -1),
                _args.enum("layout", o.get("layout")), _args.enum("softmax", o.get("softmax")),
                1 if o.get("deterministic") else 0, _args.enum("order", o.get("order")),
                _args.enum("precision", o.get("precision")),
                w if type(w[0]) is int else tuple([x for t in w for x in t]),
                o.get("scale", 0.0)), o


def _check_tensors(names, tensors):
    """torch-side checks the core cannot make: type, dtype, device (with index)."""
    q = tensors[0]
    ok = isinstance(q, torch.Tensor) and q.device.type in ("cpu", "cuda")
    for t in tensors:  # the common case in one pass (a plain loop: torch.compile traces it)
        ok = ok and isinstance(t, torch.Tensor) and t.dtype in _DTYPES and t.dim() == 4 and \
            t.device == q.device
    if ok:
        return
    for name, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise _bad(_E_ARGUMENT, "%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
        if t.dtype not in _DTYPES:
            raise _bad(_E_DTYPE, "%s: dtype %s is not supported (float32, float16, bfloat16)"
                       % (name, t.dtype))
        if t.device.type not in ("cpu", "cuda"):
            raise _bad(_E_ARGUMENT, "%s: device %s is not supported (cpu, cuda)" % (name, t.device))
        if t.device != q.device:
            raise _bad(_E_ARGUMENT, "%s: on %s while q is on %s" % (name, t.device, q.device))
        if t.dim() != 4:
            raise _bad(_E_SHAPE, "%s: expected a 4-D tensor, got %d-D %s"
                       % (name, t.dim(), list(t.shape)))


def _bhs(q, layout):
    b, x, y, _ = q.shape
    return (b, y, x) if layout == STA_BSHD else (b, x, y)


# ---- calling the library ------------------------------------------------------

_cache = threading.local()
_specs = {}  # attention()'s arguments (type-exact) -> Spec, eager calls


def _geometry(spec, seq_len):
    """sta_geometry of spec: the canvas with the core's defaults
    (sta_geometry_init), or the known shape of seq_len; then the fields spec
    sets."""
    L = _capi.lib()
    g = Geometry()
    if spec.canvas:
        L.sta_geometry_init(C.byref(g), *spec.canvas)
    else:
        L.check(L.sta_geometry_from_seq_len(C.byref(g), seq_len))
    if spec.tile:
        g.tile[:] = spec.tile
    g.text_len = spec.text_len
    g.order = spec.order
    return g


def _desc(spec, q=None):
    """A pointer to a (cached) sta_attention_desc for spec (q: for a spec
    with no canvas, the known shape of its sequence length)."""
    descs = getattr(_cache, "descs", None)
    if descs is None:
        descs = _cache.descs = {}
    seq_len = -1 if spec.canvas or q is None else _seq_len(q, spec)
    key = spec if spec.canvas else (spec, seq_len)
    hit = descs.get(key)
    if hit is not None:
        return hit[2]
    d = AttentionDesc()
    d.geom = _geometry(spec, seq_len)
    d.layout, d.softmax, d.deterministic, d.precision = \
        spec.layout, spec.softmax, spec.deterministic, spec.precision
    arr = _capi.ints(spec.windows)
    d.n_windows = len(spec.windows) // 3
    d.windows = C.cast(arr, C.POINTER(C.c_int32))
    d.scale = spec.scale
    if len(descs) >= 256:
        descs.clear()
    ref = C.byref(d)
    descs[key] = (d, arr, ref)
    return ref


def _seq_len(q, spec):
    return q.shape[1 if spec.layout == STA_BSHD else 2] if q.dim() == 4 else -1


_SIZES = {n: C.c_int64 * n for n in range(1, 9)}


def _wrap(lib, t):
    h = C.c_void_p()
    nd = t.dim()
    arr = _SIZES.get(nd) or C.c_int64 * nd
    rc = lib.sta_tensor_wrap(C.byref(h), t.data_ptr(), _WRAP_DTYPES[t.dtype],
                             STA_CUDA if t.is_cuda else STA_CPU, nd, arr(*t.shape),
                             arr(*t.stride()))
    if rc:
        raise lib.error(rc)
    return h


def _handles(lib, tensors):
    """Handles of tensors from this thread's cache of wraps.  A wrap holds
    only (address, dtype, device, shape, strides), so a cached one is the
    same as a fresh one for any tensor with that key: steady loops, where
    torch's allocator hands out the same blocks, wrap nothing.  (The
    address tells devices apart, one address space: is_cuda suffices.)"""
    cache = getattr(_cache, "wraps", None)
    if cache is None:
        cache = _cache.wraps = {}
    try:  # every tensor wrapped before: one pass
        return [None if t is None else cache[(t.data_ptr(), t.dtype, t.is_cuda, t.shape,
                                               t.stride())] for t in tensors]
    except KeyError:
        pass
    if len(cache) + len(tensors) > 64:  # evicted before: this call's handles stay valid
        for old in cache.values():
            lib.sta_tensor_destroy(old)
        cache.clear()
    hs = []
    for t in tensors:
        if t is None:
            hs.append(None)
            continue
        key = (t.data_ptr(), t.dtype, t.is_cuda, t.shape, t.stride())
        h = cache.get(key)
        if h is None:
            h = cache[key] = _wrap(lib, t)
        hs.append(h)
    return hs


_get_device = getattr(torch._C, "_cuda_getDevice", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object


def _set_stream(L, device):
    """Sets sta's stream to torch's current stream of CUDA device (a
    torch.device); returns the device's index when it is not the current
    device (the caller must run under its guard), else None."""
    cur = _get_device() if _get_device is not None else torch.cuda.current_device()
    idx = device.index
    if idx is not None and idx != cur:
        return idx
    L.sta_cuda_set_stream(_raw_stream(cur) if _raw_stream is not None
                          else torch.cuda.current_stream(cur).cuda_stream)
    return None


def _run(device, call):
    """call() (a libsta call returning a status) with sta's stream set to
    torch's current stream of device, under that device's guard; raises the
    status's exception."""
    L = _capi.lib()
    if device.type == "cuda":
        idx = _set_stream(L, device)
        if idx is not None:
            with torch.cuda.device(idx):
                return _run(device, call)
    rc = call()
    if rc:
        raise L.error(rc)


def _call(fn, desc, tensors, device):
    """fn(desc, *handles of tensors) on device; fn: a function's name in sta.h,
    desc: a pointer from _desc.  The common case inline, without _run's
    closure: host tensors, or CUDA ones on the current device."""
    L = _capi.lib()
    hs = _handles(L, tensors)
    if device.type == "cuda" and _set_stream(L, device) is not None:
        f = getattr(L, fn)
        return _run(device, lambda: f(desc, *hs))
    rc = getattr(L, fn)(desc, *hs)
    if rc:
        raise L.error(rc)


def _forward(q, k, v, spec, compute_lse):
    """out (and lse, else None) = STA(q, k, v), allocated by torch."""
    out = q.new_empty(q.shape)  # contiguous, q's dtype and device
    lse = q.new_empty(_bhs(q, spec.layout), dtype=torch.float32) if compute_lse else None
    _call("sta_attention_forward", _desc(spec, q), (q, k, v, out, lse), q.device)
    return out, lse


def _last_dim_dense(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _backward_with(run, q, k, v, out, lse, dout, dlse, layout):
    """dq, dk, dv of an attention whose sta_attention_backward run(tensors)
    calls (its descriptor fixed: the window's or a block list's); dlse (or
    None): the gradient reaching lse."""
    dout = _last_dim_dense(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    run((q, k, v, out, lse, dout, dq, dk, dv))
    if dlse is not None:
        # d lse_i / d s_ij = P_ij adds P_ij * dlse_i to dS_ij.  The backward
        # computes dS_ij = P_ij (dout_i . v_j - dout_i . out_i): with v' = 0,
        # out' = -e_0 and dout' = dlse_i e_0 that is exactly P_ij dlse_i.
        # (materialised, not stride-0 views: every kernel path takes them)
        g = dlse.to(q.dtype)  # [B, heads, S]
        g = g.transpose(1, 2) if layout == STA_BSHD else g
        dout2 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dout2[..., 0] = g
        zero = torch.zeros(k.shape, dtype=q.dtype, device=q.device)
        neg_e0 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        neg_e0[..., 0] = -1
        dq2 = torch.empty_like(dq)
        dk2 = torch.empty_like(dk)
        dv2 = torch.empty_like(dv)
        run((q, k, zero, neg_e0, lse, dout2, dq2, dk2, dv2))
        dq += dq2
        dk += dk2
    return dq, dk, dv


def _backward(q, k, v, out, lse, dout, dlse, spec):
    """dq, dk, dv of STA; dlse (or None): the gradient reaching lse."""
    desc = _desc(spec, q)
    return _backward_with(lambda ts: _call("sta_attention_backward", desc, ts, q.device),
                          q, k, v, out, lse, dout, dlse, spec.layout)


# ---- autograd ---------------------------------------------------------------------
#
# torch >= 2.4: sta::attention and sta::attention_backward are defined with
# torch.library at the level custom_op builds on (define, a kernel for CPU
# and CUDA, register_fake, a kernel for the Autograd key), so a call costs
# one dispatch into one Python kernel: custom_op's wrappers (its autograd
# wrapper's argument walk, the kernel's dynamo-disable guard and aliasing
# check) cost more than the rest of the call at small shapes.  The Autograd
# kernel does what custom_op's does: with a gradient wanted, an
# autograd.Function whose forward redispatches below autograd (so
# torch.compile traces it into the graph as this op); without, a redispatch,
# or the kernel directly when the redispatch would reach it (plain CPU or
# CUDA tensors: no mode, subclass or functionalization on the way).
#
# The op's lse argument: 0 no lse (an empty tensor stands in), 1 computed
# for the backward (not differentiable), 2 returned (differentiable).

_LSE_NONE, _LSE_SAVED, _LSE_RETURNED = 0, 1, 2


def _lse_mode(compute_lse, return_lse):
    return _LSE_RETURNED if return_lse else _LSE_SAVED if compute_lse else _LSE_NONE


def _spec_of(canvas, tile, text_len, layout, softmax, deterministic, order, precision, windows,
             scale):
    """The Spec of the op's arguments (its int[] arrive as lists)."""
    return Spec(tuple(canvas), tuple(tile), text_len, layout, softmax, deterministic, order,
                precision, tuple(windows), scale)


# the op's arguments after q, k, v (and out, lse, dout, dlse): Spec's fields
_SPEC_ARGS = ", ".join(("int[] " if t is tuple else "float " if t is float else "int ") + n
                       for n, t in Spec.__annotations__.items())

if CUSTOM_OP:
    _LIB = torch.library.Library("sta", "FRAGMENT")  # kept: registrations live with it
    _TAGS = tuple(getattr(torch.Tag, t) for t in ("pt2_compliant_tag", "needs_fixed_stride_order")
                  if hasattr(torch.Tag, t))
    _LIB.define("attention(Tensor q, Tensor k, Tensor v, %s, int lse) -> (Tensor, Tensor)"
                % _SPEC_ARGS, tags=_TAGS)
    _LIB.define("attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                "Tensor dout, Tensor? dlse, %s) -> (Tensor, Tensor, Tensor)" % _SPEC_ARGS,
                tags=_TAGS)
    _ATTENTION = torch.ops.sta.attention.default
    _ATTENTION_BACKWARD = torch.ops.sta.attention_backward.default
    _AFTER_AUTOGRAD = torch._C._after_autograd_keyset
    _AFTER_AUTOGRAD_RAW = _AFTER_AUTOGRAD.raw_repr()
    _BELOW_AUTOGRAD = torch._C._AutoDispatchBelowAutograd
    # the keysets below autograd of plain CPU and CUDA tensors (the dispatcher
    # leaves out fallthrough keys such as ADInplaceOrView: with or without)
    _DIRECT = frozenset(ks.raw_repr() for d in ("CPU", "CUDA") for ks in (
        torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, d)),
        torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, d)).add(
            torch._C.DispatchKey.ADInplaceOrView)))
    _grad_enabled = torch.is_grad_enabled

    def _attention_kernel(q, k, v, canvas, tile, text_len, layout, softmax, deterministic, order,
                          precision, windows, scale, lse):
        spec = _spec_of(canvas, tile, text_len, layout, softmax, deterministic, order, precision,
                        windows, scale)
        out, l = _forward(q, k, v, spec, lse != _LSE_NONE)
        return out, l if l is not None else q.new_empty(0, dtype=torch.float32)

    def _attention_fake(q, k, v, canvas, tile, text_len, layout, softmax, deterministic, order,
                        precision, windows, scale, lse):
        out = q.new_empty(q.shape)
        shape = _bhs(q, layout) if lse != _LSE_NONE else (0,)
        return out, q.new_empty(shape, dtype=torch.float32)

    def _attention_backward_kernel(q, k, v, out, lse, dout, dlse, canvas, tile, text_len, layout,
                                   softmax, deterministic, order, precision, windows, scale):
        return _backward(q, k, v, out, lse, dout, dlse,
                         _spec_of(canvas, tile, text_len, layout, softmax, deterministic, order,
                                  precision, windows, scale))

    def _attention_backward_fake(q, k, v, out, lse, dout, dlse, canvas, tile, text_len, layout,
                                 softmax, deterministic, order, precision, windows, scale):
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)

    def _below_autograd(op, kernel, keyset, args):
        """op(*args) below the Autograd key: kernel(*args) itself when the
        redispatch would reach it, else the redispatch."""
        if keyset.raw_repr() & _AFTER_AUTOGRAD_RAW in _DIRECT:
            return kernel(*args)
        with _BELOW_AUTOGRAD():
            return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    class _OpBackwardFunction(torch.autograd.Function):
        """An op's backward (sta::<name>_backward) under autograd: no double
        backward."""

        @staticmethod
        def forward(ctx, name, op, kernel, keyset, *args):
            ctx.name = name
            return _below_autograd(op, kernel, keyset, args)

        @staticmethod
        def backward(ctx, *grads):
            raise RuntimeError("sta.%s: the backward is not differentiable (no double "
                               "backward through sta::%s_backward)" % (ctx.name, ctx.name))

    def _backward_autograd(name, op, kernel, n_tensors):
        """The Autograd kernel of sta::<name>_backward (op; kernel below
        autograd), whose first n_tensors arguments may require grad."""
        def autograd(keyset, *args):
            if _grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                       for t in args[:n_tensors]):
                return _OpBackwardFunction.apply(name, op, kernel, keyset, *args)
            return _below_autograd(op, kernel, keyset, args)
        return autograd

    def _attention_autograd(keyset, q, k, v, *args):
        if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _AttentionFunction.apply(q, k, v, _spec_of(*args[:-1]), args[-1], keyset)
        return _below_autograd(_ATTENTION, _attention_kernel, keyset, (q, k, v) + args)

    _attention_backward_autograd = _backward_autograd(
        "attention", _ATTENTION_BACKWARD, _attention_backward_kernel, 7)

    for _name, _kernel, _fake, _autograd in (
            ("attention", _attention_kernel, _attention_fake, _attention_autograd),
            ("attention_backward", _attention_backward_kernel, _attention_backward_fake,
             _attention_backward_autograd)):
        _LIB.impl(_name, _kernel, "CPU")
        _LIB.impl(_name, _kernel, "CUDA")
        torch.library.register_fake("sta::" + _name, _fake, lib=_LIB)
        _LIB.impl(_name, _autograd, "Autograd", with_keyset=True)


class _AttentionFunction(torch.autograd.Function):
    """sta.attention's autograd: inputs q, k, v, the Spec, the lse mode and
    keyset: the Autograd kernel's, whose op the forward redispatches below
    autograd and whose backward is sta::attention_backward (which refuses a
    double backward itself); None on torch < 2.4: the library directly,
    and the backward is once_differentiable (a double backward raises
    torch's error instead of a silently detached gradient)."""

    @staticmethod
    def forward(ctx, q, k, v, spec, lse, keyset):
        if keyset is None:
            out, l = _forward(q, k, v, spec, True)
        else:
            out, l = _below_autograd(_ATTENTION, _attention_kernel, keyset,
                                     (q, k, v) + tuple(spec) + (max(lse, _LSE_SAVED),))
        ctx.spec, ctx.op = spec, keyset is not None
        ctx.return_lse = lse == _LSE_RETURNED
        ctx.save_for_backward(q, k, v, out, l)
        if not ctx.return_lse:
            ctx.mark_non_differentiable(l)
        ctx.set_materialize_grads(False)
        return out, l

    @staticmethod
    def backward(ctx, dout, dlse):
        if ctx.op:
            return _op_backward(ctx, dout, dlse)
        return _plain_backward(ctx, dout, dlse)


def _op_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout
    dq, dk, dv = _ATTENTION_BACKWARD(q, k, v, out, lse, dout, dlse if ctx.return_lse else None,
                                     *ctx.spec)
    return dq, dk, dv, None, None, None


def _plain_backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    return _once(ctx, dout, dlse, q, k, v, out, lse)


@torch.autograd.function.once_differentiable
def _once(ctx, dout, dlse, q, k, v, out, lse):
    """The gradients, once: once_differentiable sees q, k, v among its
    arguments, so a double backward through them raises too, not only one
    through dout."""
    dout = torch.zeros_like(out) if dout is None else dout
    return _backward(q, k, v, out, lse, dout, dlse if ctx.return_lse else None, ctx.spec) + \
        (None, None, None)


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _compiling():
    return _is_compiling is not None and bool(_is_compiling())


def _spec_key(canvas, window, tile, text_len, layout, scale, softmax, deterministic, order,
              precision):
    """attention()'s arguments as a cache key that only equal checks can
    share, or None (not cached: checked every call).  Cached: strings, None,
    and triples of exact ints for canvas, window and tile (a window per head
    is checked every call), with the types of the scalars in the key.  So
    (1, 1, 1) never finds the entry of (True, 1, 1), nor text_len 2 that of
    2.0: a check never depends on an earlier call."""
    t = type
    for x in (canvas, window, tile):
        if x is not None and t(x) is not str and not (
                t(x) is tuple and len(x) == 3 and t(x[0]) is int and t(x[1]) is int and
                t(x[2]) is int):
            return None
    return (canvas, window, tile, text_len, t(text_len), layout, scale, t(scale), softmax,
            deterministic, t(deterministic), order, precision)


def attention(q=None, k=None, v=None, *, canvas=None, window=None, tile=None, text_len=None,
              layout=None, scale=None, return_lse=None, softmax=None, deterministic=None,
              order=None, precision=None, **unknown):
    """Sliding Tile Attention of torch tensors (STA.md sections 1-4, 10).

    q, k, v: 4-D [B, S, heads, D] (layout "bshd") or [B, heads, S, D]
    ("bhsd"), one shape, dtype and device; any strides with the last dim
    contiguous (views are read in place).  float32 on the CPU; bfloat16 and
    float16 (D 64, 128) on CUDA, float32 too on the CPU backend.
    Options (sta's option schema, the same as the Lua module's; None or
    absent: the core's default):
    canvas: (T, H, W) video tokens, or "TxHxW" / "T,H,W"; absent: the known
    shape of q's length (FastVideo's); text rows after the video.
    window (required): (Kt, Kh, Kw) in tiles for all heads, or a list of
    them, one per head; strings "3x3x3", "3,3,3", "3,3,3:1,5,7",
    "1x1x1,3x3x3".
    tile: (tt, th, tw) (the core's 6x8x8); text_len: valid text rows (all
    after the video).
    order: the rows' token order, "untiled" (t slowest, w fastest) or
    "tiled" (FastVideo's: tile after tile, each padded to tt*th*tw rows,
    S = NT*NH*NW*tt*th*tw + text), read in place; the output comes out in
    it, padding rows 0 (they are never keys, and their gradients are 0).
    scale: > 0 (1/sqrt(D)).  softmax: "exact" or "fast" (GPU, opt-in).
    deterministic: bit-identical gradients run to run (slower on the GPU).
    precision: "native" (the inputs' dtype, float32 accumulation) or "fp8"
    (opt-in, never chosen for you: Q, K, V quantized to 8 bits by sta.h's
    scheme, rel L2 about 3e-2; on the CPU an emulation for tests, on CUDA
    the sm_90a fp8 kernel; no backward).

    Returns out (torch-allocated, q's shape, dtype, device), and with
    return_lse=True also lse, float32 [B, heads, S] (natural log).
    Differentiable in q, k, v (and through lse); a double backward raises.
    Every misuse raises an sta.Error subclass with sta's exact message.
    """
    if unknown:
        raise _args.unknown("attention", unknown)
    _check_tensors(("q", "k", "v"), (q, k, v))
    compiling = _compiling()
    spec = key = None
    if not compiling:  # eager: the checked arguments from a cache
        key = _spec_key(canvas, window, tile, text_len, layout, scale, softmax, deterministic,
                        order, precision)
        if key is not None:
            spec = _specs.get(key)
    if spec is None:
        spec = _spec("attention", canvas=canvas, window=window, tile=tile, text_len=text_len,
                     layout=layout, scale=scale, softmax=softmax, deterministic=deterministic,
                     order=order, precision=precision)[0]
        if key is not None:
            if len(_specs) >= 256:
                _specs.clear()
            _specs[key] = spec
    return _run_attention(q, k, v, spec, return_lse is not None and _want_lse(return_lse),
                          compiling)


_RETURN_LSE = _args.OPTIONS["return_lse"]


def _want_lse(return_lse):
    return _args.check_value("return_lse", return_lse, _RETURN_LSE)


def _run_attention(q, k, v, spec, return_lse, compiling=None):
    """attention() of a checked spec (also sta.Layer's)."""
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                             v.requires_grad)
    if compiling is None:
        compiling = _compiling()
    if CUSTOM_OP and (need_grad or compiling or type(q) not in _PLAIN or
                      type(k) not in _PLAIN or type(v) not in _PLAIN):
        out, lse = _ATTENTION(q, k, v, *spec, _lse_mode(need_grad, return_lse))
    elif need_grad:
        out, lse = _AttentionFunction.apply(q, k, v, spec, _lse_mode(True, return_lse), None)
    else:
        out, lse = _forward(q, k, v, spec, return_lse)
    return (out, lse) if return_lse else out


def _is_out_dtype(v, cls):
    return v in _DTYPES


def attention_fp8(q8=None, k8=None, v8=None, q_scale=None, k_scale=None, v_scale=None, *,
                  canvas=None, window=None, tile=None, text_len=None, layout=None, scale=None,
                  return_lse=None, order=None, precision=None, softmax=None, deterministic=None,
                  out_dtype=None, **unknown):
    """sta_attention_forward_fp8: STA of operands already in 8 bits (e4m3:
    torch.float8_e4m3fn, or the raw codes as uint8), standing for q8 *
    q_scale, k8 * k_scale, v8 * v_scale: q_scale, k_scale float32 [B, heads,
    S] (a scale per row; stride-0 views give one per head), v_scale float32
    [B, heads, D] (per channel).  The fp8 forward (precision "fp8") on those
    values; out in out_dtype (float32, the default, float16 or bfloat16), no
    autograd.  Other options as attention()."""
    if unknown:
        raise _args.unknown("attention_fp8", unknown)
    names = ("q8", "k8", "v8")
    for name, t in zip(names, (q8, k8, v8)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _F8:
            raise _bad(_E_DTYPE, "%s: expected an 8-bit e4m3 torch.Tensor (%s), got %s" % (
                name, ", ".join(str(d) for d in _F8),
                t.dtype if isinstance(t, torch.Tensor) else type(t).__name__))
    for name, t in zip(("q_scale", "k_scale", "v_scale"), (q_scale, k_scale, v_scale)):
        if not isinstance(t, torch.Tensor):
            raise _bad(_E_ARGUMENT, "%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if q8.dim() != 4:
        raise _bad(_E_SHAPE, "q8: expected a 4-D tensor, got %d-D %s" % (q8.dim(), list(q8.shape)))
    spec, o = _spec("attention_fp8", _is_out_dtype, canvas=canvas, window=window, tile=tile,
                    text_len=text_len, layout=layout, scale=scale, order=order, softmax=softmax,
                    deterministic=deterministic, return_lse=return_lse, out_dtype=out_dtype,
                    precision=precision)
    if precision is None:  # this call's default: the fp8 forward
        spec = spec._replace(precision=STA_PRECISION_FP8)
    out = torch.empty(q8.shape, dtype=o.get("out_dtype", torch.float32), device=q8.device)
    lse = torch.empty(_bhs(q8, spec.layout), dtype=torch.float32, device=q8.device) \
        if o.get("return_lse") else None
    _call("sta_attention_forward_fp8", _desc(spec, q8),
          (q8, k8, v8, q_scale, k_scale, v_scale, out, lse), q8.device)
    return (out, lse) if lse is not None else out


def _host_only(names, tensors):
    for name, t in zip(names, tensors):
        if t.device.type != "cpu":
            raise _bad(_E_ARGUMENT, "%s: the reference runs on host tensors only, got %s"
                       % (name, t.device))


def reference(q=None, k=None, v=None, *, canvas=None, window=None, tile=None, text_len=None,
              layout=None, scale=None, return_lse=None, order=None, softmax=None,
              deterministic=None, precision=None, **unknown):
    """sta_attention_reference: the brute-force dense masked attention, in
    double, of host tensors (slow; for tests).  Options as attention()."""
    if unknown:
        raise _args.unknown("reference", unknown)
    _check_tensors(("q", "k", "v"), (q, k, v))
    _host_only(("q", "k", "v"), (q, k, v))
    spec, o = _spec("reference", canvas=canvas, window=window, tile=tile, text_len=text_len,
                    layout=layout, scale=scale, order=order, softmax=softmax,
                    deterministic=deterministic, precision=precision, return_lse=return_lse)
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(_bhs(q, spec.layout), dtype=torch.float32) if o.get("return_lse") else None
    with torch.no_grad():
        _call("sta_attention_reference", _desc(spec, q), (q, k, v, out, lse),
              q.device)
    return (out, lse) if lse is not None else out


def reference_backward(q=None, k=None, v=None, dout=None, *, canvas=None, window=None, tile=None,
                       text_len=None, layout=None, scale=None, order=None, softmax=None,
                       deterministic=None, precision=None, **unknown):
    """sta_attention_backward_reference: dq, dk, dv of reference(), in double,
    of host tensors (slow; for tests).  Options as attention()."""
    if unknown:
        raise _args.unknown("attention_backward", unknown)
    _check_tensors(("q", "k", "v", "dout"), (q, k, v, dout))
    _host_only(("q", "k", "v", "dout"), (q, k, v, dout))
    spec = _spec("attention_backward", canvas=canvas, window=window, tile=tile,
                 text_len=text_len, layout=layout, scale=scale, order=order, softmax=softmax,
                 deterministic=deterministic, precision=precision)[0]
    grads = [torch.empty(q.shape, dtype=q.dtype) for _ in range(3)]
    with torch.no_grad():
        _call("sta_attention_backward_reference", _desc(spec, q),
              (q, k, v, _last_dim_dense(dout), *grads), q.device)
    return tuple(grads)
