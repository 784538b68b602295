"""Block-sparse attention and VSA on torch tensors (STA.md section 12): the
forward, the backward and autograd, as _op.py does for sta.attention.

  block_sparse_attention(q, k, v, q2k_idx, q2k_num, kv_sizes, q_sizes, block_rows, ...)
  vsa(q, k, v, canvas=, cube=, sparsity= | topk=, gate=, ...)
  vsa_reference / vsa_backward_reference (float64, host), vsa_coarse (no autograd)
  cube_sizes(canvas=, cube=), to_cubes(x, canvas=, ...), from_cubes(x, canvas=, ...)

A call is described by a named Spec (BlockSpec, VsaSpec: the options
checked against sta's option schema) and its tensors (the lists, the
sizes, the gate), which are also the op's arguments.  With torch >= 2.4 the
ops are torch.ops.sta.block_sparse and torch.ops.sta.vsa (and their
_backward), defined as sta::attention is (_op.py: kernels for CPU and
CUDA, fake implementations, an Autograd kernel), so torch.compile(
fullgraph=True) keeps them whole and CUDA graphs capture them (the
lists and sizes are tensors; VSA's selection is computed on the device).
Older torch gets a torch.autograd.Function.  Lists and sizes are int32
tensors on q's device (other integer dtypes, and Python lists, are
converted).

The cube order's index, the cube sizes and topk are computed here in torch
and Python (traceable), by the formulas of STA.md section 12; the tests
hold them equal to the core's (sta_tensor_to_cubes, sta_vsa_cube_sizes,
sta_vsa_topk).
"""
import ctypes as C
import math
from typing import NamedTuple

import torch

from . import _args, _capi
from ._args import _E_ARGUMENT, _E_DTYPE, _E_SHAPE, _bad
from ._capi import AttentionDesc, BlockList, STA_MASK_BLOCKS, VsaDesc
from ._op import (CUSTOM_OP, _LSE_NONE, _LSE_RETURNED, _LSE_SAVED, _PLAIN, _backward_with,
                  _bhs, _check_tensors, _compiling, _handles, _host_only, _last_dim_dense,
                  _lse_mode, _run, _set_stream)

__all__ = ["block_sparse_attention", "vsa", "vsa_reference", "vsa_backward_reference",
           "vsa_coarse", "cube_sizes", "to_cubes", "from_cubes", "BlockSpec", "VsaSpec"]


class BlockSpec(NamedTuple):
    """A block-list call (sta_attention_desc with STA_MASK_BLOCKS) besides
    its tensors; also the op's arguments after them."""
    block_rows: int      # rows per block; 0: 64
    layout: int          # sta_layout
    deterministic: int   # 0 or 1
    scale: float         # 0.0: 1/sqrt(D)


class VsaSpec(NamedTuple):
    """A VSA call (sta_vsa_desc) besides its tensors; also the op's
    arguments after them."""
    block_rows: int      # rows per cube: 64 or 256
    topk: int            # key cubes per query cube
    layout: int
    deterministic: int
    scale: float


def _spec_args(spec_type):
    return ", ".join(("float " if t is float else "int ") + n
                     for n, t in spec_type.__annotations__.items())


# ---- calling the library --------------------------------------------------------

def _invoke(fn, make_desc, tensors, aux, device):
    """fn(desc, *handles of tensors) on device, desc = make_desc(handles of
    aux) (None for an absent one), which returns the descriptor and what
    must live with it."""
    L = _capi.lib()
    hs = _handles(L, tuple(tensors) + tuple(aux))
    main, ah = hs[:len(tensors)], hs[len(tensors):]
    desc, keep = make_desc(ah)
    f = getattr(L, fn)
    ref = C.byref(desc)

    def call():
        return f(ref, *main)

    if device.type == "cuda" and _set_stream(L, device) is not None:
        return _run(device, call)
    rc = call()
    if rc:
        raise L.error(rc)
    del keep


def _block_desc(spec, hs):
    idx, num, kvs, qs = hs
    bl = BlockList()
    bl.block_rows, bl.idx, bl.num, bl.kv_sizes, bl.q_sizes = spec.block_rows, idx, num, kvs, qs
    d = AttentionDesc()
    d.layout, d.deterministic, d.scale = spec.layout, spec.deterministic, spec.scale
    d.mask = STA_MASK_BLOCKS
    d.blocks = C.pointer(bl)
    return d, bl


def _vsa_desc(spec, hs):
    d = VsaDesc()
    d.layout, d.block_rows, d.topk = spec.layout, spec.block_rows, spec.topk
    d.deterministic, d.scale = spec.deterministic, spec.scale
    d.kv_sizes, d.q_sizes = hs
    return d, None


def _bs_forward(q, k, v, idx, num, kvs, qs, spec, compute_lse):
    out = q.new_empty(q.shape)
    lse = q.new_empty(_bhs(q, spec.layout), dtype=torch.float32) if compute_lse else None
    _invoke("sta_attention_forward", lambda hs: _block_desc(spec, hs), (q, k, v, out, lse),
            (idx, num, kvs, qs), q.device)
    return out, lse


def _bs_backward(q, k, v, idx, num, kvs, qs, out, lse, dout, dlse, spec):
    def run(ts):
        _invoke("sta_attention_backward", lambda hs: _block_desc(spec, hs), ts,
                (idx, num, kvs, qs), q.device)
    return _backward_with(run, q, k, v, out, lse, dout, dlse, spec.layout)


def _vsa_forward(q, k, v, gate, kvs, qs, spec, compute_lse):
    out = q.new_empty(q.shape)
    lse = q.new_empty(_bhs(q, spec.layout), dtype=torch.float32) if compute_lse else None
    _invoke("sta_vsa_forward", lambda hs: _vsa_desc(spec, hs), (q, k, v, gate, out, lse),
            (kvs, qs), q.device)
    return out, lse


def _vsa_backward(q, k, v, gate, kvs, qs, out, lse, dout, dlse, spec):
    """dq, dk, dv, dgate (None without a gate); lse is not differentiable
    (dlse is None)."""
    dout = _last_dim_dense(dout)
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dv = torch.empty(k.shape, dtype=q.dtype, device=q.device)
    dg = torch.empty(q.shape, dtype=q.dtype, device=q.device) if gate is not None else None
    _invoke("sta_vsa_backward", lambda hs: _vsa_desc(spec, hs),
            (q, k, v, gate, out, lse, dout, dq, dk, dv, dg), (kvs, qs), q.device)
    return dq, dk, dv, dg


class _Info(NamedTuple):
    """One op: its name, tensor inputs (the first three differentiable, and
    the gate's place if any), Spec, and the library calls."""
    name: str
    n_tensors: int
    gate: int            # index of the gate among the tensors, or -1
    spec: type
    forward: object      # (*tensors, spec, compute_lse) -> out, lse
    backward: object     # (*tensors, out, lse, dout, dlse, spec) -> grads of the tensors' first 3 or 4
    lse_grad: bool       # lse differentiable when returned


_BLOCK = _Info("block_sparse", 7, -1, BlockSpec, _bs_forward, _bs_backward, True)
_VSA = _Info("vsa", 6, 3, VsaSpec, _vsa_forward, _vsa_backward, False)


def _grads(info, grads):
    """The gradients of every tensor input: q, k, v (and the gate), the rest None."""
    g = list(grads[:3]) + ([grads[3]] if info.gate >= 0 else [])
    return tuple(g) + (None,) * (info.n_tensors - len(g))


# ---- autograd ------------------------------------------------------------------------
#
# As sta::attention (_op.py): the ops are defined with torch.library at the
# level custom_op builds on; the Autograd kernel applies _SparseFunction
# when a gradient is wanted (its forward redispatches below autograd), else
# redispatches (or calls the kernel when nothing stands between).

if CUSTOM_OP:
    from ._op import _LIB, _TAGS, _backward_autograd, _below_autograd, _grad_enabled

    _LIB.define("block_sparse(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor num, "
                "Tensor? kv_sizes, Tensor? q_sizes, %s, int lse) -> (Tensor, Tensor)"
                % _spec_args(BlockSpec), tags=_TAGS)
    _LIB.define("block_sparse_backward(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor num, "
                "Tensor? kv_sizes, Tensor? q_sizes, Tensor out, Tensor lse, Tensor dout, "
                "Tensor? dlse, %s) -> (Tensor, Tensor, Tensor)" % _spec_args(BlockSpec),
                tags=_TAGS)
    _LIB.define("vsa(Tensor q, Tensor k, Tensor v, Tensor? gate, Tensor kv_sizes, "
                "Tensor? q_sizes, %s, int lse) -> (Tensor, Tensor)" % _spec_args(VsaSpec),
                tags=_TAGS)
    _LIB.define("vsa_backward(Tensor q, Tensor k, Tensor v, Tensor? gate, Tensor kv_sizes, "
                "Tensor? q_sizes, Tensor out, Tensor lse, Tensor dout, Tensor? dlse, %s) -> "
                "(Tensor, Tensor, Tensor, Tensor)" % _spec_args(VsaSpec), tags=_TAGS)
    _OPS = {"block_sparse": torch.ops.sta.block_sparse.default,
            "vsa": torch.ops.sta.vsa.default}
    _BACKWARD_OPS = {"block_sparse": torch.ops.sta.block_sparse_backward.default,
                     "vsa": torch.ops.sta.vsa_backward.default}

    def _kernel(info):
        n = info.n_tensors

        def kernel(*args):
            out, lse = info.forward(*args[:n], info.spec(*args[n:-1]), args[-1] != _LSE_NONE)
            return out, lse if lse is not None else args[0].new_empty(0, dtype=torch.float32)
        return kernel

    def _fake(info):
        n = info.n_tensors

        def fake(*args):
            q, spec, lse = args[0], info.spec(*args[n:-1]), args[-1]
            shape = _bhs(q, spec.layout) if lse != _LSE_NONE else (0,)
            return q.new_empty(q.shape), q.new_empty(shape, dtype=torch.float32)
        return fake

    def _backward_kernel(info):
        n = info.n_tensors

        def kernel(*args):
            ts, (out, lse, dout, dlse), spec = args[:n], args[n:n + 4], info.spec(*args[n + 4:])
            g = info.backward(*ts, out, lse, dout, dlse, spec)
            if info.gate >= 0:  # the op returns an empty dgate without a gate
                g = g[:3] + (g[3] if g[3] is not None else ts[0].new_empty(0),)
            return g
        return kernel

    def _backward_fake(info):
        def fake(*args):
            q, k = args[0], args[1]
            g = (q.new_empty(q.shape), q.new_empty(k.shape), q.new_empty(k.shape))
            if info.gate >= 0:
                g += (q.new_empty(q.shape) if args[info.gate] is not None else q.new_empty(0),)
            return g
        return fake

    def _autograd(info, op, kernel):
        n = info.n_tensors

        def autograd(keyset, *args):
            ts = args[:n]
            if _grad_enabled() and any(t is not None and t.requires_grad for t in _diff(info, ts)):
                return _SparseFunction.apply(info, info.spec(*args[n:-1]), args[-1], keyset, *ts)
            return _below_autograd(op, kernel, keyset, args)
        return autograd

    _KERNELS = {}
    for _info in (_BLOCK, _VSA):
        _op, _bop = _OPS[_info.name], _BACKWARD_OPS[_info.name]
        _k, _bk = _kernel(_info), _backward_kernel(_info)
        _KERNELS[_info.name] = _k
        for _name, _kern, _fk, _ag in (
                (_info.name, _k, _fake(_info), _autograd(_info, _op, _k)),
                (_info.name + "_backward", _bk, _backward_fake(_info),
                 _backward_autograd(_info.name, _bop, _bk, _info.n_tensors + 4))):
            _LIB.impl(_name, _kern, "CPU")
            _LIB.impl(_name, _kern, "CUDA")
            torch.library.register_fake("sta::" + _name, _fk, lib=_LIB)
            _LIB.impl(_name, _ag, "Autograd", with_keyset=True)


def _diff(info, ts):
    """The differentiable tensor inputs: q, k, v and the gate."""
    return ts[:3] + ((ts[info.gate],) if info.gate >= 0 else ())


class _SparseFunction(torch.autograd.Function):
    """A sparse op's autograd: inputs the op's _Info, its Spec, the lse mode,
    the Autograd kernel's keyset (None on torch < 2.4: the library directly,
    once differentiable), then the op's tensors."""

    @staticmethod
    def forward(ctx, info, spec, lse, keyset, *ts):
        if keyset is None:
            out, l = info.forward(*ts, spec, True)
        else:
            out, l = _below_autograd(_OPS[info.name], _KERNELS[info.name], keyset,
                                     ts + tuple(spec) + (max(lse, _LSE_SAVED),))
        ctx.info, ctx.spec, ctx.op = info, spec, keyset is not None
        ctx.return_lse = lse == _LSE_RETURNED and info.lse_grad
        ctx.save_for_backward(*ts, out, l)
        if not ctx.return_lse:
            ctx.mark_non_differentiable(l)
        ctx.set_materialize_grads(False)
        return out, l

    @staticmethod
    def backward(ctx, dout, dlse):
        saved = ctx.saved_tensors
        if ctx.op:
            ts, out, lse = saved[:-2], saved[-2], saved[-1]
            dout = torch.zeros_like(out) if dout is None else dout
            g = _BACKWARD_OPS[ctx.info.name](*ts, out, lse, dout,
                                             dlse if ctx.return_lse else None, *ctx.spec)
            if ctx.info.gate >= 0 and ts[ctx.info.gate] is None:
                g = g[:3] + (None,)  # the op's empty dgate
        else:
            g = _once(ctx, dout, dlse, *saved)
        return (None, None, None, None) + _grads(ctx.info, g)


@torch.autograd.function.once_differentiable
def _once(ctx, dout, dlse, *saved):
    """The gradients, once (torch < 2.4): once_differentiable sees the
    inputs among its arguments, so a double backward through them raises."""
    ts, out, lse = saved[:-2], saved[-2], saved[-1]
    dout = torch.zeros_like(out) if dout is None else dout
    return ctx.info.backward(*ts, out, lse, dout, dlse if ctx.return_lse else None, ctx.spec)


def _run_op(info, ts, spec, return_lse):
    """The op on its tensors ts and spec: out (and lse)."""
    diff = _diff(info, ts)
    need_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in diff)
    if CUSTOM_OP and (need_grad or _compiling() or
                      any(t is not None and type(t) not in _PLAIN for t in diff)):
        out, lse = _OPS[info.name](*ts, *spec, _lse_mode(need_grad, return_lse))
    elif need_grad:
        out, lse = _SparseFunction.apply(info, spec, _lse_mode(True, return_lse), None, *ts)
    else:
        out, lse = info.forward(*ts, spec, return_lse)
    return (out, lse) if return_lse else out


# ---- arguments -------------------------------------------------------------------------

def _is_tensor(v, cls):
    return isinstance(v, torch.Tensor)


def _i32(name, v, device):
    """An ints option (a checked list, or a tensor) as a contiguous int32
    tensor on device; None stays None."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise _bad(_E_DTYPE, "%s: expected an integer tensor, got %s" % (name, v.dtype))
        return v.to(device=device, dtype=torch.int32).contiguous()
    try:
        t = torch.tensor(v, dtype=torch.int32)
    except (ValueError, TypeError):
        raise _bad(_E_SHAPE, "%s: expected nested lists of one length per level, got %s"
                   % (name, _args.show(v)))
    return t.to(device)


def _ragged(name, v):
    """idx as ragged lists idx[b][h][m] = (n, ...): (idx, num) lists padded
    with 0 to the longest list."""
    if not isinstance(v, tuple) or any(not isinstance(x, tuple) for x in v):
        return v, None
    lens, longest = [], 1
    for b in v:
        lens.append([])
        for h in b:
            if not isinstance(h, tuple):
                return v, None
            lens[-1].append([len(m) if isinstance(m, tuple) else -1 for m in h])
            longest = max([longest] + lens[-1][-1])
    if any(n < 0 for b in lens for h in b for n in h):
        return v, None
    idx = tuple(tuple(tuple(tuple(m) + (0,) * (longest - len(m)) for m in h) for h in b)
                for b in v)
    return idx, lens


def block_sparse_attention(q=None, k=None, v=None, q2k_idx=None, q2k_num=None, kv_sizes=None,
                           q_sizes=None, block_rows=64, *, layout=None, scale=None,
                           deterministic=None, return_lse=None, **unknown):
    """Attention over listed key blocks (STA.md section 12; FastVideo's
    block_sparse_attn with q2k_idx / q2k_num).

    q [B, Sq, heads, D], k, v [B, Sk, heads, D] (layout "bshd"; "bhsd" the
    other order), Sq = Mq * block_rows, Sk = Mk * block_rows.  q2k_idx
    [B, heads, Mq, L]: the key blocks each query block sees (distinct,
    0..Mk-1, any order; entries past q2k_num never read); q2k_num [B,
    heads, Mq]: how many; both integer tensors (or nested lists: idx as
    ragged lists idx[b][h][m] = [n, ...] with q2k_num None takes each
    list's length).  kv_sizes [Mk] / q_sizes [Mq]: valid rows of each block
    (a block's first rows; the rest padding, never a key, output 0);
    absent: whole blocks (q_sizes: kv_sizes when Mq == Mk).  A query block
    with an empty list outputs 0 and lse -inf.  Options as sta.attention:
    scale, deterministic, return_lse (lse [B, heads, Sq], differentiable).
    Differentiable in q, k, v."""
    if unknown:
        raise _args.unknown("block_sparse", unknown)
    _check_tensors(("q", "k", "v"), (q, k, v))
    o = _args.check("block_sparse", dict(kv_sizes=kv_sizes, q_sizes=q_sizes,
                                         block_rows=block_rows, layout=layout, scale=scale,
                                         deterministic=deterministic, return_lse=return_lse),
                    _is_tensor)
    el = {"kind": "ints", "min": 0}
    if q2k_idx is None:
        raise _bad(_E_ARGUMENT, "q2k_idx: required (the key blocks of each (batch, head, query "
                                "block): [B, heads, Mq, L])")
    idx = q2k_idx if isinstance(q2k_idx, torch.Tensor) else \
        _args.check_value("q2k_idx", q2k_idx, el, _is_tensor)
    num = q2k_num if q2k_num is None or isinstance(q2k_num, torch.Tensor) else \
        _args.check_value("q2k_num", q2k_num, el, _is_tensor)
    if num is None:
        idx, num = _ragged("q2k_idx", idx)
        if num is None:
            raise _bad(_E_ARGUMENT, "q2k_num: required (how many of each list's entries count: "
                                    "[B, heads, Mq]) unless q2k_idx is ragged lists")
    dev = q.device
    spec = BlockSpec(o.get("block_rows", 0), _args.enum("layout", o.get("layout")),
                     1 if o.get("deterministic") else 0, o.get("scale", 0.0))
    ts = (q, k, v, _i32("q2k_idx", idx, dev), _i32("q2k_num", num, dev),
          _i32("kv_sizes", o.get("kv_sizes"), dev), _i32("q_sizes", o.get("q_sizes"), dev))
    return _run_op(_BLOCK, ts, spec, bool(o.get("return_lse")))


# ---- VSA and the cube order ----------------------------------------------------------------

_CUBE = (4, 4, 4)
_cache = {}  # (what, canvas, cube[, device]) -> tensor


def _cached(key, make):
    t = _cache.get(key)
    if t is None:
        if len(_cache) >= 64:
            _cache.clear()
        t = _cache[key] = make()
    return t


def _grid(canvas, cube):
    return [math.ceil(c / b) for c, b in zip(canvas, cube)]


def _cube_sizes(canvas, cube):
    """Each cube's valid tokens (sta_vsa_cube_sizes), a list."""
    n = _grid(canvas, cube)
    ext = [[min(cube[a], canvas[a] - i * cube[a]) for i in range(n[a])] for a in range(3)]
    return [st * sh * sw for st in ext[0] for sh in ext[1] for sw in ext[2]]


def _cube_rows(canvas, cube):
    """The row in cube order of each untiled token (t slowest), int64 [T*H*W]
    (STA.md section 12: cube (it, ih, iw), then the token's place in the
    cube's own box)."""
    T, Hc, W = canvas
    ct, ch, cw = cube
    nt, nh, nw = _grid(canvas, cube)
    t = torch.arange(T).view(T, 1, 1)
    h = torch.arange(Hc).view(1, Hc, 1)
    w = torch.arange(W).view(1, 1, W)
    it, ih, iw = t // ct, h // ch, w // cw
    sh = torch.clamp(Hc - ih * ch, max=ch)
    sw = torch.clamp(W - iw * cw, max=cw)
    c = (it * nh + ih) * nw + iw
    return (c * (ct * ch * cw) + ((t - it * ct) * sh + (h - ih * ch)) * sw + (w - iw * cw)) \
        .reshape(-1)


def _cube_args(call, canvas, cube, **more):
    """call's options checked (the schema's), and the canvas and cube (the
    core's checks, sta_vsa_cube_count, outside torch.compile's tracing)."""
    o = _args.check(call, dict(canvas=canvas, cube=cube, **more), _is_tensor)
    cube = o.get("cube", _CUBE)
    if not _compiling():
        L = _capi.lib()
        n = C.c_int64()
        L.check(L.sta_vsa_cube_count(_capi.ints(o["canvas"]), _capi.ints(cube), C.byref(n)))
    return o, o["canvas"], cube


def cube_sizes(*, canvas=None, cube=None, device=None, **unknown):
    """Each cube's valid tokens (FastVideo's variable_block_sizes), int32
    [cubes], cube after cube (STA.md section 12); device "cpu" or "cuda"."""
    more = {"device": device}
    if "backend" in unknown:  # the schema's alias of device
        more["backend"] = unknown.pop("backend")
    if unknown:
        raise _args.unknown("cube_sizes", unknown)
    o, canvas, cube = _cube_args("cube_sizes", canvas, cube, **more)
    dev = o.get("device", "cpu")
    if dev == "cuda" and not (torch.cuda.is_available() and
                              _capi.lib().sta_backend_available(_capi.STA_CUDA)):
        from .errors import UnsupportedError
        raise UnsupportedError("st attn not supported", 302, "STA_ERR_BACKEND")
    return torch.tensor(_cube_sizes(canvas, cube), dtype=torch.int32, device=dev)


def _seq_dim(layout):
    return 1 if layout in (None, "bshd") else 2


def to_cubes(x=None, *, canvas=None, cube=None, layout=None, **unknown):
    """x [B, T*H*W, heads, D] (untiled rows; "bhsd": [B, heads, T*H*W, D])
    in the cube order of canvas: cubes * |cube| rows, each cube's tokens
    first, padding rows 0.  Differentiable (a gather)."""
    if unknown:
        raise _args.unknown("cubes", unknown)
    o, canvas, cube = _cube_args("cubes", canvas, cube, layout=layout)
    dim = _seq_dim(o.get("layout"))
    n = canvas[0] * canvas[1] * canvas[2]
    _check_rows("x", x, dim, n, "T*H*W = %d untiled tokens of the canvas" % n)
    rows = len(_cube_sizes(canvas, cube)) * cube[0] * cube[1] * cube[2]
    src = _cached(("src", canvas, cube), lambda: _gather_index(canvas, cube, rows, n))
    pad = list(x.shape)
    pad[dim] = 1
    return torch.cat([x, x.new_zeros(pad)], dim).index_select(dim, src.to(x.device))


def _gather_index(canvas, cube, rows, n):
    src = torch.full((rows,), n, dtype=torch.int64)  # n: the zero row after the tokens
    src[_cube_rows(canvas, cube)] = torch.arange(n)
    return src


def from_cubes(x=None, *, canvas=None, cube=None, layout=None, **unknown):
    """The cube order back to the untiled rows (padding rows dropped);
    differentiable."""
    if unknown:
        raise _args.unknown("cubes", unknown)
    o, canvas, cube = _cube_args("cubes", canvas, cube, layout=layout)
    dim = _seq_dim(o.get("layout"))
    rows = len(_cube_sizes(canvas, cube)) * cube[0] * cube[1] * cube[2]
    _check_rows("x", x, dim, rows, "the canvas's cube order")
    dst = _cached(("dst", canvas, cube), lambda: _cube_rows(canvas, cube))
    return x.index_select(dim, dst.to(x.device))


def _check_rows(name, t, dim, rows, what):
    if not isinstance(t, torch.Tensor):
        raise _bad(_E_ARGUMENT, "%s: expected a torch.Tensor, got %s" % (name, type(t).__name__))
    if t.dim() != 4:
        raise _bad(_E_SHAPE, "%s: expected a 4-D tensor, got %d-D %s"
                   % (name, t.dim(), list(t.shape)))
    if t.shape[dim] != rows:
        raise _bad(_E_SHAPE, "%s: %d rows, expected %d (%s)" % (name, t.shape[dim], rows, what))


def _topk(sparsity, cubes):
    """sta_vsa_topk: ceil((1 - sparsity) * cubes) in IEEE double, 1..cubes."""
    return min(max(int(math.ceil((1.0 - sparsity) * cubes)), 1), cubes)


def _vsa_setup(call, q, k, v, canvas, cube, **more):
    """call's options (canvas, cube and more, as given) and q, k, v (and
    more["gate"]) checked: the options, the VsaSpec and the cube sizes on
    q's device."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    o, canvas, cube = _cube_args(call, canvas, cube, **more)
    n = len(_cube_sizes(canvas, cube))
    br = cube[0] * cube[1] * cube[2]
    dim = _seq_dim(o.get("layout"))
    what = "the canvas %dx%dx%d in %d cubes of %d rows, cube order" % (canvas + (n, br))
    _check_rows("q", q, dim, n * br, what)
    _check_rows("k", k, dim, n * br, what)
    if more.get("gate") is not None:
        _check_tensors(("q", "gate"), (q, more["gate"]))
    spec = VsaSpec(br, o["topk"] if "topk" in o else _topk(o["sparsity"], n),
                   _args.enum("layout", o.get("layout")), 1 if o.get("deterministic") else 0,
                   o.get("scale", 0.0))
    kvs = _cached(("sizes", canvas, cube, q.device),
                  lambda: torch.tensor(_cube_sizes(canvas, cube), dtype=torch.int32,
                                       device=q.device))
    return o, spec, kvs


def vsa(q=None, k=None, v=None, *, canvas=None, cube=None, sparsity=None, topk=None, gate=None,
        layout=None, scale=None, deterministic=None, return_lse=None, **unknown):
    """Video Sparse Attention (STA.md section 12; FastVideo's
    video_sparse_attn): q, k, v [B, cubes * |cube|, heads, D] ("bhsd": [B,
    heads, S, D]) in the cube order of canvas (to_cubes); cube 4x4x4 (64
    rows, the default) or 4x8x8 (256).  The means of each cube's valid
    rows, dense attention between the cubes (out_c), the topk key cubes of
    each query cube by the coarse scores (exactly topk, ties to the lower
    index; topk = ceil((1 - sparsity) * cubes) from sparsity in [0, 1)),
    block-sparse attention over them (out_s); out = out_c * gate + out_s on
    valid rows (gate: q's shape, FastVideo's compress_attn_weight; absent:
    1), 0 on padding rows.  return_lse: also the fine branch's lse [B,
    heads, S] (not differentiable).  Differentiable in q, k, v and gate (the
    selection is not)."""
    if unknown:
        raise _args.unknown("vsa", unknown)
    o, spec, kvs = _vsa_setup("vsa", q, k, v, canvas, cube, sparsity=sparsity, topk=topk,
                              gate=gate, layout=layout, scale=scale,
                              deterministic=deterministic, return_lse=return_lse)
    return _run_op(_VSA, (q, k, v, gate, kvs, None), spec, bool(o.get("return_lse")))


def vsa_reference(q=None, k=None, v=None, *, canvas=None, cube=None, sparsity=None, topk=None,
                  gate=None, layout=None, scale=None, deterministic=None, return_lse=None,
                  **unknown):
    """sta_vsa_reference: VSA as vsa() computes it, brute force in double
    (means, scores, selection, every valid query row against its selected
    cubes' valid keys, the combine), of host tensors (slow; for tests).
    Options as vsa(); out in q's dtype (and lse, the fine branch's).  No
    autograd (the result does not require grad)."""
    if unknown:
        raise _args.unknown("vsa_reference", unknown)
    o, spec, kvs = _vsa_setup("vsa_reference", q, k, v, canvas, cube, sparsity=sparsity,
                              topk=topk, gate=gate, layout=layout, scale=scale,
                              deterministic=deterministic, return_lse=return_lse)
    _host_only(("q", "k", "v"), (q, k, v))
    out = torch.empty(q.shape, dtype=q.dtype)
    lse = torch.empty(_bhs(q, spec.layout), dtype=torch.float32) if o.get("return_lse") else None
    _invoke("sta_vsa_reference", lambda hs: _vsa_desc(spec, hs), (q, k, v, gate, out, lse),
            (kvs, None), q.device)
    return (out, lse) if lse is not None else out


def vsa_backward_reference(q=None, k=None, v=None, dout=None, *, canvas=None, cube=None,
                           sparsity=None, topk=None, gate=None, layout=None, scale=None,
                           deterministic=None, **unknown):
    """sta_vsa_backward_reference: dq, dk, dv (and dgate with a gate) of
    vsa_reference() against dout, in double, of host tensors (slow; for
    tests).  Options as vsa(); no autograd."""
    if unknown:
        raise _args.unknown("vsa_backward_reference", unknown)
    _check_tensors(("q", "dout"), (q, dout))
    _, spec, kvs = _vsa_setup("vsa_backward_reference", q, k, v, canvas, cube,
                              sparsity=sparsity, topk=topk, gate=gate, layout=layout, scale=scale,
                              deterministic=deterministic)
    _host_only(("q", "k", "v", "dout"), (q, k, v, dout))
    grads = [torch.empty(t.shape, dtype=q.dtype) for t in (q, k, k)]
    if gate is not None:
        grads.append(torch.empty(q.shape, dtype=q.dtype))
    _invoke("sta_vsa_backward_reference", lambda hs: _vsa_desc(spec, hs),
            (q, k, v, gate, _last_dim_dense(dout), *grads, *([None] * (4 - len(grads)))),
            (kvs, None), q.device)
    return tuple(grads)


def vsa_coarse(q=None, k=None, v=None, *, canvas=None, cube=None, sparsity=None, topk=None,
               layout=None, scale=None, **unknown):
    """sta_vsa_coarse: VSA's coarse branch and selection alone, on q's device
    (CPU or CUDA): out_c float32 [B, heads, Mq, D] (each query cube's coarse
    output), lse_c float32 [B, heads, Mq], idx int32 [B, heads, Mq, topk]
    (the selected key cubes, ascending: FastVideo's q2k_idx) and num int32
    [B, heads, Mq] (topk: q2k_num), a block list for
    block_sparse_attention.  The options of vsa() that choose them (no gate).
    No autograd."""
    if unknown:
        raise _args.unknown("vsa_coarse", unknown)
    _, spec, kvs = _vsa_setup("vsa_coarse", q, k, v, canvas, cube, sparsity=sparsity,
                              topk=topk, layout=layout, scale=scale)
    b, h, s = _bhs(q, spec.layout)
    mq = s // spec.block_rows
    f32, i32 = dict(dtype=torch.float32, device=q.device), dict(dtype=torch.int32, device=q.device)
    res = (torch.empty((b, h, mq, q.shape[3]), **f32), torch.empty((b, h, mq), **f32),
           torch.empty((b, h, mq, spec.topk), **i32), torch.empty((b, h, mq), **i32))
    _invoke("sta_vsa_coarse", lambda hs: _vsa_desc(spec, hs), (q, k, v) + res, (kvs, None),
            q.device)
    return res


def _vsa_call(q, k, v, gate, kv_sizes, q_sizes, spec, return_lse=False):
    """VSA of checked tensors (the FastVideo drop-in's and sta.Layer's)."""
    return _run_op(_VSA, (q, k, v, gate, kv_sizes, q_sizes), spec, return_lse)


def _block_call(q, k, v, idx, num, kv_sizes, q_sizes, spec, return_lse):
    """Block-sparse attention of checked tensors (the FastVideo drop-in's)."""
    return _run_op(_BLOCK, (q, k, v, idx, num, kv_sizes, q_sizes), spec, return_lse)

