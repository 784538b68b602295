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
Older torch (Debian 12's 1.13) gets a torch.autograd.Function.
"""
import ctypes as C
import numbers
import threading

import torch

from . import _capi
from ._capi import (AttentionDesc, STA_BF16, STA_BSHD, STA_CPU, STA_CUDA,
                    STA_F16, STA_F32, STA_PRECISION_FP8, STA_PRECISION_NATIVE,
                    STA_SOFTMAX_EXACT, STA_SOFTMAX_FAST)
from ._args import (_E_ARGUMENT, _E_DTYPE, _E_SHAPE, _E_WINDOW, _bad, _is_int, _layout,
                    _order, _text_len, _triple)

__all__ = ["attention", "reference", "reference_backward", "CUSTOM_OP"]

_DTYPES = {torch.float32: STA_F32, torch.float16: STA_F16, torch.bfloat16: STA_BF16}
_SOFTMAX = {"exact": STA_SOFTMAX_EXACT, "fast": STA_SOFTMAX_FAST}
_PRECISION = {"native": STA_PRECISION_NATIVE, "fp8": STA_PRECISION_FP8}
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _version_at_least(major, minor):
    try:
        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


CUSTOM_OP = _version_at_least(2, 4) and hasattr(torch, "library") and \
    hasattr(torch.library, "custom_op")

# ---- arguments --------------------------------------------------------------


def _windows(window):
    """window (3 ints or "KtxKhxKw") or one window per head -> a flat tuple."""
    if isinstance(window, str):
        return _triple(window, "window")
    try:
        items = list(window)
    except TypeError:
        raise _bad(_E_WINDOW, "window: expected 3 integers or a list of them (one per "
                   "head), got %r" % (window,)) from None
    if items and _is_int(items[0]):  # one window (else _triple names the bad part)
        return _triple(items, "window")
    if not items:
        raise _bad(_E_WINDOW, "window: expected 3 integers or a list of them (one per head), "
                   "got an empty list")
    flat = []
    for i, w in enumerate(items):
        flat.extend(_triple(w, "window[%d]" % i))
    return tuple(flat)


def _spec(canvas, window, tile, text_len, layout, scale, softmax, deterministic,
          order="untiled", precision="native"):
    """The hashable description of one call (what sta_attention_desc holds)."""
    canvas = _triple(canvas, "canvas")
    order = _order(order)
    tile = _triple(tile, "tile")
    windows = _windows(window)
    text_len = _text_len(text_len)
    lay = _layout(layout)
    if scale is None:
        scale = 0.0
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not scale > 0:
        raise _bad(_E_ARGUMENT, "scale: expected a positive number or None, got %r" % (scale,))
    sm = _SOFTMAX.get(softmax) if isinstance(softmax, str) else None
    if sm is None:
        raise _bad(_E_ARGUMENT, "softmax: expected \"exact\" or \"fast\", got %r" % (softmax,))
    pr = _PRECISION.get(precision) if isinstance(precision, str) else None
    if pr is None:
        raise _bad(_E_ARGUMENT, "precision: expected \"native\" or \"fp8\", got %r"
                   % (precision,))
    return (canvas, tile, text_len, windows, lay, float(scale), sm, int(bool(deterministic)),
            order, pr)


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
_specs = {}  # attention()'s arguments -> _spec, eager calls


def _desc(spec):
    """A pointer to a (cached) sta_attention_desc for spec."""
    descs = getattr(_cache, "descs", None)
    if descs is None:
        descs = _cache.descs = {}
    hit = descs.get(spec)
    if hit is not None:
        return hit[2]
    canvas, tile, text_len, windows, layout, scale, softmax, det, order, precision = spec
    d = AttentionDesc()
    d.geom.canvas[:] = canvas
    d.geom.tile[:] = tile
    d.geom.text_len = text_len
    d.geom.order = order
    d.layout = layout
    arr = _capi.ints(windows)
    d.n_windows = len(windows) // 3
    d.windows = C.cast(arr, C.POINTER(C.c_int32))
    d.scale = scale
    d.softmax = softmax
    d.deterministic = det
    d.precision = precision
    if len(descs) >= 256:
        descs.clear()
    ref = C.byref(d)
    descs[spec] = (d, arr, ref)
    return ref


def _wrap(lib, t):
    h = C.c_void_p()
    nd = t.dim()
    rc = lib.sta_tensor_wrap(C.byref(h), t.data_ptr(), _DTYPES[t.dtype],
                             STA_CUDA if t.is_cuda else STA_CPU, nd,
                             (C.c_int64 * nd)(*t.shape), (C.c_int64 * nd)(*t.stride()))
    if rc:
        raise lib.error(rc)
    return h


def _handles(lib, tensors):
    """Handles of tensors from this thread's cache of wraps.  A wrap holds
    only (address, dtype, device, shape, strides), so a cached one is the
    same as a fresh one for any tensor with that key: steady loops, where
    torch's allocator hands out the same blocks, wrap nothing."""
    cache = getattr(_cache, "wraps", None)
    if cache is None:
        cache = _cache.wraps = {}
    if len(cache) + len(tensors) > 64:  # evicted before: this call's handles stay valid
        for old in cache.values():
            lib.sta_tensor_destroy(old)
        cache.clear()
    hs = []
    for t in tensors:
        if t is None:
            hs.append(None)
            continue
        key = (t.data_ptr(), t.dtype, t.device, t.shape, t.stride())
        h = cache.get(key)
        if h is None:
            h = cache[key] = _wrap(lib, t)
        hs.append(h)
    return hs


def _run(device, call):
    """call() (a libsta call returning a status) with sta's stream set to
    torch's current stream of device, under that device's guard; raises the
    status's exception."""
    L = _capi.lib()
    if device.type == "cuda":
        cur = torch.cuda.current_device()
        idx = cur if device.index is None else device.index
        if idx != cur:
            with torch.cuda.device(idx):
                return _run(torch.device("cuda", idx), call)
        L.sta_cuda_set_stream(torch.cuda.current_stream(idx).cuda_stream)
    rc = call()
    if rc:
        raise L.error(rc)


def _call(fn, desc, tensors, device):
    """fn(desc, *handles of tensors) on device; desc: a pointer from _desc."""
    hs = _handles(_capi.lib(), tensors)
    _run(device, lambda: fn(desc, *hs))


def _forward(q, k, v, spec, compute_lse):
    """out (and lse, else an empty tensor) = STA(q, k, v), allocated by torch."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(_bhs(q, spec[4]), dtype=torch.float32, device=q.device) \
        if compute_lse else None
    _call(_capi.lib().sta_attention_forward, _desc(spec), (q, k, v, out, lse), q.device)
    return out, lse


def _last_dim_dense(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _backward(q, k, v, out, lse, dout, dlse, spec):
    """dq, dk, dv of STA; dlse (or None): the gradient reaching lse."""
    L = _capi.lib()
    desc = _desc(spec)
    dout = _last_dim_dense(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _call(L.sta_attention_backward, desc, (q, k, v, out, lse, dout, dq, dk, dv), q.device)
    if dlse is not None:
        # d lse_i / d s_ij = P_ij adds P_ij * dlse_i to dS_ij.  The backward
        # computes dS_ij = P_ij (dout_i . v_j - dout_i . out_i): with v' = 0,
        # out' = -e_0 and dout' = dlse_i e_0 that is exactly P_ij dlse_i.
        # (materialised, not stride-0 views: every kernel path takes them)
        g = dlse.to(q.dtype)  # [B, heads, S]
        g = g.transpose(1, 2) if spec[4] == STA_BSHD else g
        dout2 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dout2[..., 0] = g
        zero = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        neg_e0 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        neg_e0[..., 0] = -1
        dq2 = torch.empty_like(dq)
        dk2 = torch.empty_like(dk)
        dv2 = torch.empty_like(dv)
        _call(L.sta_attention_backward, desc, (q, k, zero, neg_e0, lse, dout2, dq2, dk2, dv2),
              q.device)
        dq += dq2
        dk += dk2
    return dq, dk, dv


# ---- autograd ---------------------------------------------------------------------

def _unspec(canvas, tile, text_len, windows, layout, scale, softmax, det, order, precision):
    return (tuple(canvas), tuple(tile), int(text_len), tuple(windows), int(layout),
            float(scale), int(softmax), int(det), int(order), int(precision))


if CUSTOM_OP:
    import inspect
    from typing import List, Optional, Tuple

    _kw = {"mutates_args": ()}
    if "tags" in inspect.signature(torch.library.custom_op).parameters:
        _kw["tags"] = (torch.Tag.needs_fixed_stride_order,)

    @torch.library.custom_op("sta::attention", **_kw)
    def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, canvas: List[int],
                      tile: List[int], text_len: int, windows: List[int], layout: int,
                      scale: float, softmax: int, deterministic: bool, order: int,
                      precision: int, compute_lse: bool,
                      return_lse: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        spec = _unspec(canvas, tile, text_len, windows, layout, scale, softmax, deterministic,
                       order, precision)
        out, lse = _forward(q, k, v, spec, compute_lse)
        return out, lse if lse is not None else q.new_empty(0, dtype=torch.float32)

    @_attention_op.register_fake
    def _attention_fake(q, k, v, canvas, tile, text_len, windows, layout, scale, softmax,
                        deterministic, order, precision, compute_lse, return_lse):
        out = q.new_empty(q.shape)
        shape = _bhs(q, layout) if compute_lse else (0,)
        return out, q.new_empty(shape, dtype=torch.float32)

    @torch.library.custom_op("sta::attention_backward", **_kw)
    def _attention_backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               out: torch.Tensor, lse: torch.Tensor, dout: torch.Tensor,
                               dlse: Optional[torch.Tensor], canvas: List[int],
                               tile: List[int], text_len: int, windows: List[int],
                               layout: int, scale: float, softmax: int,
                               deterministic: bool, order: int,
                               precision: int) -> Tuple[torch.Tensor, torch.Tensor,
                                                        torch.Tensor]:
        spec = _unspec(canvas, tile, text_len, windows, layout, scale, softmax, deterministic,
                       order, precision)
        return _backward(q, k, v, out, lse, dout, dlse, spec)

    @_attention_backward_op.register_fake
    def _attention_backward_fake(q, k, v, out, lse, dout, dlse, canvas, tile, text_len,
                                 windows, layout, scale, softmax, deterministic, order,
                                 precision):
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)

    def _setup_context(ctx, inputs, output):
        q, k, v = inputs[:3]
        ctx.args = inputs[3:13]  # canvas .. precision
        ctx.return_lse = inputs[14]
        out, lse = output
        ctx.save_for_backward(q, k, v, out, lse)
        if not ctx.return_lse:
            ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)

    def _op_backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = torch.ops.sta.attention_backward(
            q, k, v, out, lse, dout, dlse if ctx.return_lse else None, *ctx.args)
        return (dq, dk, dv) + (None,) * 12

    _attention_op.register_autograd(_op_backward, setup_context=_setup_context)


class _AttentionFunction(torch.autograd.Function):
    """The autograd of torch < 2.4 (and of eager calls there)."""

    @staticmethod
    def forward(ctx, q, k, v, spec, return_lse):
        out, lse = _forward(q, k, v, spec, True)
        ctx.spec, ctx.return_lse = spec, return_lse
        ctx.save_for_backward(q, k, v, out, lse)
        if not return_lse:
            ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv = _backward(q, k, v, out, lse, dout, dlse if ctx.return_lse else None,
                               ctx.spec)
        return dq, dk, dv, None, None


def _compiling():
    comp = getattr(torch, "compiler", None)
    return bool(comp is not None and hasattr(comp, "is_compiling") and comp.is_compiling())


def attention(q, k, v, *, canvas, window, tile=(6, 8, 8), text_len=None, layout="bshd",
              scale=None, return_lse=False, softmax="exact", deterministic=False,
              order="untiled", precision="native"):
    """Sliding Tile Attention of torch tensors (STA.md sections 1-4, 10).

    q, k, v: 4-D [B, S, heads, D] (layout "bshd") or [B, heads, S, D]
    ("bhsd"), one shape, dtype and device; any strides with the last dim
    contiguous (views are read in place).  float32 on the CPU; bfloat16 and
    float16 (D 64, 128) on CUDA, float32 too on the CPU backend.
    canvas: (T, H, W) video tokens, text rows after the video.
    order: the rows' token order, "untiled" (t slowest, w fastest) or
    "tiled" (FastVideo's: tile after tile, each padded to tt*th*tw rows,
    S = NT*NH*NW*tt*th*tw + text), read in place; the output comes out in
    it, padding rows 0 (they are never keys, and their gradients are 0).
    window: (Kt, Kh, Kw) in tiles for all heads, or a list of them, one per head.
    tile: (tt, th, tw); text_len: valid text rows (None: all after the video).
    scale: None for 1/sqrt(D).  softmax: "exact" or "fast" (GPU, opt-in).
    deterministic: bit-identical gradients run to run (slower on the GPU).
    precision: "native" (the inputs' dtype, float32 accumulation) or "fp8"
    (opt-in, never chosen for you: Q, K, V quantized to 8 bits by sta.h's
    scheme, rel L2 about 3e-2; on the CPU an emulation for tests, on CUDA
    the sm_90a fp8 kernel; no backward).

    Returns out (torch-allocated, q's shape, dtype, device), and with
    return_lse=True also lse, float32 [B, heads, S] (natural log).
    Differentiable in q, k, v (and through lse).  Errors raise sta.Error
    subclasses with sta's exact message.
    """
    _check_tensors(("q", "k", "v"), (q, k, v))
    compiling = _compiling()
    spec = None
    if not compiling:  # eager: the normalised arguments from a cache
        key = (canvas, window, tile, text_len, layout, scale, softmax, deterministic, order,
               precision)
        try:
            spec = _specs.get(key)
        except TypeError:  # unhashable (lists): parsed every call
            key = None
    if spec is None:
        spec = _spec(canvas, window, tile, text_len, layout, scale, softmax, deterministic,
                     order, precision)
        if not compiling and key is not None:
            if len(_specs) >= 256:
                _specs.clear()
            _specs[key] = spec
    need_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or
                                             v.requires_grad)
    if CUSTOM_OP and (need_grad or compiling or type(q) not in _PLAIN or
                      type(k) not in _PLAIN or type(v) not in _PLAIN):
        canvas_, tile_, text_len_, windows, lay, scale_, sm, det, order_, prec = spec
        out, lse = torch.ops.sta.attention(q, k, v, list(canvas_), list(tile_), text_len_,
                                           list(windows), lay, scale_, sm, bool(det), order_,
                                           prec, bool(return_lse or need_grad),
                                           bool(return_lse))
    elif need_grad:
        out, lse = _AttentionFunction.apply(q, k, v, spec, bool(return_lse))
    else:
        out, lse = _forward(q, k, v, spec, return_lse)
    return (out, lse) if return_lse else out


def _host_only(names, tensors):
    for name, t in zip(names, tensors):
        if t.device.type != "cpu":
            raise _bad(_E_ARGUMENT, "%s: the reference runs on host tensors only, got %s"
                       % (name, t.device))


def reference(q, k, v, *, canvas, window, tile=(6, 8, 8), text_len=None, layout="bshd",
              scale=None, return_lse=False, order="untiled"):
    """sta_attention_reference: the brute-force dense masked attention, in
    double, of host tensors (slow; for tests).  Arguments as attention()."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    _host_only(("q", "k", "v"), (q, k, v))
    spec = _spec(canvas, window, tile, text_len, layout, scale, "exact", False, order)
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(_bhs(q, spec[4]), dtype=torch.float32) if return_lse else None
    with torch.no_grad():
        _call(_capi.lib().sta_attention_reference, _desc(spec), (q, k, v, out, lse), q.device)
    return (out, lse) if return_lse else out


def reference_backward(q, k, v, dout, *, canvas, window, tile=(6, 8, 8), text_len=None,
                       layout="bshd", scale=None, order="untiled"):
    """sta_attention_backward_reference: dq, dk, dv of reference(), in double,
    of host tensors (slow; for tests)."""
    _check_tensors(("q", "k", "v", "dout"), (q, k, v, dout))
    _host_only(("q", "k", "v", "dout"), (q, k, v, dout))
    spec = _spec(canvas, window, tile, text_len, layout, scale, "exact", False, order)
    grads = [torch.empty(q.shape, dtype=q.dtype) for _ in range(3)]
    with torch.no_grad():
        _call(_capi.lib().sta_attention_backward_reference, _desc(spec),
              (q, k, v, _last_dim_dense(dout), *grads), q.device)
    return tuple(grads)
