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
The op's arguments are q, k, v, the spec's ints (_spec), its scale and an
lse mode (_op_inputs): few arguments, each converted at every dispatch.
Older torch (Debian 12's 1.13) gets a torch.autograd.Function.
"""
import ctypes as C
import numbers
import threading

import torch

from . import _capi
from ._capi import (AttentionDesc, STA_BF16, STA_BSHD, STA_CPU, STA_CUDA,
                    STA_F16, STA_F32, STA_F8E4M3, STA_PRECISION_FP8, STA_PRECISION_NATIVE,
                    STA_SOFTMAX_EXACT, STA_SOFTMAX_FAST)
from ._args import (_E_ARGUMENT, _E_DTYPE, _E_SHAPE, _E_WINDOW, _bad, _is_int, _layout,
                    _order, _text_len, _triple)

__all__ = ["attention", "attention_fp8", "reference", "reference_backward", "CUSTOM_OP"]

_DTYPES = {torch.float32: STA_F32, torch.float16: STA_F16, torch.bfloat16: STA_BF16}
# what _wrap takes: also 8-bit e4m3 operands (attention_fp8), as torch's
# float8_e4m3fn where it exists or as their raw codes in uint8
_F8 = tuple(t for t in (getattr(torch, "float8_e4m3fn", None), torch.uint8) if t is not None)
_WRAP_DTYPES = dict(_DTYPES)
_WRAP_DTYPES.update({t: STA_F8E4M3 for t in _F8})
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
    hasattr(torch.library, "register_fake")

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


# A spec is the hashable description of one call, flat: the ints of
# sta_attention_desc, then the windows, then the scale (0.0: 1/sqrt(D)).
# torch.ops.sta.attention takes list(spec[:-1]) and spec[-1].
_LAYOUT, _WINDOWS = 7, 12  # spec[_LAYOUT]; the windows are spec[_WINDOWS:-1]


def _spec(canvas, window, tile, text_len, layout, scale, softmax, deterministic,
          order="untiled", precision="native"):
    """(T, H, W, tt, th, tw, text_len, layout, softmax, deterministic, order,
    precision, *windows, scale) from attention()'s arguments, checked."""
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
    return canvas + tile + (text_len, lay, sm, int(bool(deterministic)), order, pr) + \
        windows + (float(scale),)


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
    d = AttentionDesc()
    d.geom.canvas[:] = spec[0:3]
    d.geom.tile[:] = spec[3:6]
    d.geom.text_len, d.layout, d.softmax, d.deterministic, d.geom.order, d.precision = \
        spec[6:_WINDOWS]
    windows = spec[_WINDOWS:-1]
    arr = _capi.ints(windows)
    d.n_windows = len(windows) // 3
    d.windows = C.cast(arr, C.POINTER(C.c_int32))
    d.scale = spec[-1]
    if len(descs) >= 256:
        descs.clear()
    ref = C.byref(d)
    descs[spec] = (d, arr, ref)
    return ref


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
    if compute_lse:
        b, x, y, _ = q.shape
        lse = q.new_empty((b, y, x) if spec[_LAYOUT] == STA_BSHD else (b, x, y),
                          dtype=torch.float32)
    else:
        lse = None
    _call("sta_attention_forward", _desc(spec), (q, k, v, out, lse), q.device)
    return out, lse


def _last_dim_dense(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _backward(q, k, v, out, lse, dout, dlse, spec):
    """dq, dk, dv of STA; dlse (or None): the gradient reaching lse."""
    desc = _desc(spec)
    dout = _last_dim_dense(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    _call("sta_attention_backward", desc, (q, k, v, out, lse, dout, dq, dk, dv), q.device)
    if dlse is not None:
        # d lse_i / d s_ij = P_ij adds P_ij * dlse_i to dS_ij.  The backward
        # computes dS_ij = P_ij (dout_i . v_j - dout_i . out_i): with v' = 0,
        # out' = -e_0 and dout' = dlse_i e_0 that is exactly P_ij dlse_i.
        # (materialised, not stride-0 views: every kernel path takes them)
        g = dlse.to(q.dtype)  # [B, heads, S]
        g = g.transpose(1, 2) if spec[_LAYOUT] == STA_BSHD else g
        dout2 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        dout2[..., 0] = g
        zero = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        neg_e0 = torch.zeros(q.shape, dtype=q.dtype, device=q.device)
        neg_e0[..., 0] = -1
        dq2 = torch.empty_like(dq)
        dk2 = torch.empty_like(dk)
        dv2 = torch.empty_like(dv)
        _call("sta_attention_backward", desc, (q, k, zero, neg_e0, lse, dout2, dq2, dk2, dv2),
              q.device)
        dq += dq2
        dk += dk2
    return dq, dk, dv


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


def _op_inputs(spec, compute_lse, return_lse):
    """torch.ops.sta.attention's arguments after q, k, v for spec."""
    return (list(spec[:-1]), spec[-1],
            _LSE_RETURNED if return_lse else _LSE_SAVED if compute_lse else _LSE_NONE)


if CUSTOM_OP:
    _LIB = torch.library.Library("sta", "FRAGMENT")  # kept: registrations live with it
    _TAGS = tuple(getattr(torch.Tag, t) for t in ("pt2_compliant_tag", "needs_fixed_stride_order")
                  if hasattr(torch.Tag, t))
    _LIB.define("attention(Tensor q, Tensor k, Tensor v, int[] spec, float scale, int lse) "
                "-> (Tensor, Tensor)", tags=_TAGS)
    _LIB.define("attention_backward(Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
                "Tensor dout, Tensor? dlse, int[] spec, float scale) "
                "-> (Tensor, Tensor, Tensor)", tags=_TAGS)
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

    def _attention_kernel(q, k, v, spec, scale, lse):
        out, l = _forward(q, k, v, (*spec, scale), lse != _LSE_NONE)
        return out, l if l is not None else q.new_empty(0, dtype=torch.float32)

    def _attention_fake(q, k, v, spec, scale, lse):
        out = q.new_empty(q.shape)
        shape = _bhs(q, spec[_LAYOUT]) if lse != _LSE_NONE else (0,)
        return out, q.new_empty(shape, dtype=torch.float32)

    def _attention_backward_kernel(q, k, v, out, lse, dout, dlse, spec, scale):
        return _backward(q, k, v, out, lse, dout, dlse, (*spec, scale))

    def _attention_backward_fake(q, k, v, out, lse, dout, dlse, spec, scale):
        return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)

    def _below_autograd(op, kernel, keyset, args):
        """op(*args) below the Autograd key: kernel(*args) itself when the
        redispatch would reach it, else the redispatch."""
        if keyset.raw_repr() & _AFTER_AUTOGRAD_RAW in _DIRECT:
            return kernel(*args)
        with _BELOW_AUTOGRAD():
            return op.redispatch(keyset & _AFTER_AUTOGRAD, *args)

    class _OpBackwardFunction(torch.autograd.Function):
        """sta::attention_backward under autograd: no double backward."""

        @staticmethod
        def forward(ctx, keyset, *args):
            return _below_autograd(_ATTENTION_BACKWARD, _attention_backward_kernel, keyset, args)

        @staticmethod
        def backward(ctx, *grads):
            raise RuntimeError("sta.attention: the backward is not differentiable (no double "
                               "backward through sta::attention_backward)")

    def _attention_autograd(keyset, q, k, v, spec, scale, lse):
        if _grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
            return _AttentionFunction.apply(q, k, v, spec, scale, lse, keyset)
        return _below_autograd(_ATTENTION, _attention_kernel, keyset, (q, k, v, spec, scale, lse))

    def _attention_backward_autograd(keyset, *args):
        if _grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                   for t in args[:7]):
            return _OpBackwardFunction.apply(keyset, *args)
        return _below_autograd(_ATTENTION_BACKWARD, _attention_backward_kernel, keyset, args)

    for _name, _kernel, _fake, _autograd in (
            ("attention", _attention_kernel, _attention_fake, _attention_autograd),
            ("attention_backward", _attention_backward_kernel, _attention_backward_fake,
             _attention_backward_autograd)):
        _LIB.impl(_name, _kernel, "CPU")
        _LIB.impl(_name, _kernel, "CUDA")
        torch.library.register_fake("sta::" + _name, _fake, lib=_LIB)
        _LIB.impl(_name, _autograd, "Autograd", with_keyset=True)


class _AttentionFunction(torch.autograd.Function):
    """sta.attention's autograd (inputs: q, k, v, then _op_inputs, then
    keyset).  keyset: the Autograd kernel's, whose op the forward
    redispatches below autograd and whose backward is sta::attention_backward;
    None on torch < 2.4: the library directly."""

    @staticmethod
    def forward(ctx, q, k, v, spec, scale, lse, keyset):
        if keyset is None:
            out, l = _forward(q, k, v, (*spec, scale), True)
        else:
            out, l = _below_autograd(_ATTENTION, _attention_kernel, keyset,
                                     (q, k, v, spec, scale, max(lse, _LSE_SAVED)))
        ctx.args, ctx.op = (spec, scale), keyset is not None
        ctx.return_lse = lse == _LSE_RETURNED
        ctx.save_for_backward(q, k, v, out, l)
        if not ctx.return_lse:
            ctx.mark_non_differentiable(l)
        ctx.set_materialize_grads(False)
        return out, l

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dlse = dlse if ctx.return_lse else None
        spec, scale = ctx.args
        if ctx.op:
            dq, dk, dv = _ATTENTION_BACKWARD(q, k, v, out, lse, dout, dlse, spec, scale)
        else:
            dq, dk, dv = _backward(q, k, v, out, lse, dout, dlse, (*spec, scale))
        return dq, dk, dv, None, None, None, None


_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _compiling():
    return _is_compiling is not None and bool(_is_compiling())


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
        out, lse = _ATTENTION(q, k, v, *_op_inputs(spec, need_grad, return_lse))
    elif need_grad:
        out, lse = _AttentionFunction.apply(q, k, v, *_op_inputs(spec, True, return_lse), None)
    else:
        out, lse = _forward(q, k, v, spec, return_lse)
    return (out, lse) if return_lse else out


def attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale, *, canvas, window, tile=(6, 8, 8),
                  text_len=None, layout="bshd", scale=None, return_lse=False, order="untiled",
                  out_dtype=torch.float32):
    """sta_attention_forward_fp8: STA of operands already in 8 bits (e4m3:
    torch.float8_e4m3fn, or the raw codes as uint8), standing for q8 *
    q_scale, k8 * k_scale, v8 * v_scale: q_scale, k_scale float32 [B, heads,
    S] (a scale per row; stride-0 views give one per head), v_scale float32
    [B, heads, D] (per channel).  The fp8 forward (precision "fp8") on those
    values; out in out_dtype (float32, float16 or bfloat16), no autograd.
    Other arguments as attention()."""
    names = ("q8", "k8", "v8")
    for name, t in zip(names, (q8, k8, v8)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _F8:
            raise _bad(_E_DTYPE, "%s: expected an 8-bit e4m3 torch.Tensor (%s), got %s" % (
                name, ", ".join(str(d) for d in _F8),
                t.dtype if isinstance(t, torch.Tensor) else type(t).__name__))
    for name, t in zip(("q_scale", "k_scale", "v_scale"), (q_scale, k_scale, v_scale)):
        if not isinstance(t, torch.Tensor):
            raise _bad(_E_ARGUMENT, "%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if out_dtype not in _DTYPES:
        raise _bad(_E_DTYPE, "out_dtype: expected float32, float16 or bfloat16, got %s" % (out_dtype,))
    if q8.dim() != 4:
        raise _bad(_E_SHAPE, "q8: expected a 4-D tensor, got %d-D %s" % (q8.dim(), list(q8.shape)))
    spec = _spec(canvas, window, tile, text_len, layout, scale, "exact", False, order, "fp8")
    out = torch.empty(q8.shape, dtype=out_dtype, device=q8.device)
    lse = torch.empty(_bhs(q8, spec[_LAYOUT]), dtype=torch.float32, device=q8.device) \
        if return_lse else None
    _call("sta_attention_forward_fp8", _desc(spec),
          (q8, k8, v8, q_scale, k_scale, v_scale, out, lse), q8.device)
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
    lse = torch.empty(_bhs(q, spec[_LAYOUT]), dtype=torch.float32) if return_lse else None
    with torch.no_grad():
        _call("sta_attention_reference", _desc(spec), (q, k, v, out, lse), q.device)
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
        _call("sta_attention_backward_reference", _desc(spec),
              (q, k, v, _last_dim_dense(dout), *grads), q.device)
    return tuple(grads)
