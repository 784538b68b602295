"""FastVideo's attention calls with their signatures and semantics:
sliding_tile_attention, video_sparse_attn (VSA) and block_sparse_attn
(block lists), on libsta.

    from sta.fastvideo import sliding_tile_attention
    out = sliding_tile_attention(q, k, v, window_size, text_length,
                                 has_text=True, seq_shape="30x48x80")

As fastvideo_kernel.sliding_tile_attention: q, k, v are [B, heads, S, D]
with the video rows in FastVideo's tiled token order (tile after tile, each
tile's tt*th*tw rows contiguous, tile 6x8x8) and the text rows after them;
window_size holds one (Kt, Kh, Kw) per head; text_length is the number of
valid text rows (the rest are padding, never keys); has_text=False means no
text keys at all.  The output is [B, heads, S, D] in the same tiled order.
Unlike FastVideo, any canvas ("TxHxW") works, border tiles may be partial
(each padded to the full tile volume: S = NT*NH*NW*384 + text rows; the
padding rows are never keys, may hold anything, and come out zero, their
gradients zero), all heads run in one launch, and no padding of S to a
multiple of 384 is needed.

libsta reads the tiled order in place (sta_geometry.order =
STA_ORDER_TILED): q, k, v are handed to the kernels as they are, strided
views included, with no conversion copy; the call is sta.attention(...,
layout="bhsd", order="tiled") and differentiable like it.

    from sta.fastvideo import video_sparse_attn, block_sparse_attn
    out = video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes,
                            topk, block_size=(4, 4, 4), compress_attn_weight=gate)
    out, lse = block_sparse_attn(q, k, v, q2k_idx, q2k_num, variable_block_sizes)

As fastvideo_kernel's: q, k, v [B, heads, S, D] in VSA's cube order (each
cube's tokens first, padding rows after), variable_block_sizes the valid
tokens of each key cube ([Mk]; q_variable_block_sizes of each query cube),
block_size a cube (4, 4, 4) / (4, 8, 8) or its tokens (64 / 256; an int
b other than 64 and 256 is the cube (b, b, b), as FastVideo reads it),
compress_attn_weight the gate of the coarse branch (q's shape; None: 1);
q2k_idx [B, heads, Mq, L] and q2k_num [B, heads, Mq] the key blocks of each
query block (or, as FastVideo's newer block_sparse_attn, a bool block map
[B, heads, Mq, Mk] in q2k_idx's place and variable_block_sizes in
q2k_num's).  Any integer dtype, on any device: converted to int32 on q's.
Both are differentiable in q, k, v (and the gate), as FastVideo's.

Where sta differs (STA.md section 12, "Differences from FastVideo"): the
top-k is exactly topk per query cube, ties to the lower index (FastVideo's
fused top-k may keep more on ties); padding rows (the places of a border
cube with no token) come out 0 and get zero gradients, where FastVideo
leaves the coarse output there and lets the gradient of a mean reach them
(callers drop padding rows when they return to the untiled order, so a
drop-in user sees no difference); the means read only valid rows and stay
float32 (FastVideo sums the zero-filled cube and rounds to the input
dtype, its scores bf16), so near-ties may select differently; topk above
the key cubes is clamped here, as FastVideo does; block_sparse_attn's lse
is [B, heads, S] in natural log (FastVideo's kernels return theirs in
their own formats) and differentiable; a query block with an empty list
outputs 0.
"""
import ctypes as C
import torch

from . import _capi
from ._capi import Geometry, STA_BSHD
from ._args import _E_ARGUMENT, _E_SHAPE, _E_WINDOW, _bad, check_value, triple
from ._capi import STA_BHSD
from ._op import _check_tensors, attention
from ._sparse import BlockSpec, VsaSpec, _block_call, _i32, _vsa_call

__all__ = ["sliding_tile_attention", "tiled_order", "video_sparse_attn", "block_sparse_attn",
           "block_sparse_attn_from_indices"]

_orders = {}  # tiled_order's


def _geometry(canvas, tile):
    """canvas with the core's defaults (sta_geometry_init: its tile, 6x8x8,
    FastVideo's), tile when given."""
    g = Geometry()
    _capi.lib().sta_geometry_init(C.byref(g), *triple(canvas, "canvas"))
    if tile is not None:
        g.tile[:] = triple(tile, "tile")
    return g


def tiled_order(canvas, tile=None, text_rows=0):
    """FastVideo's tiled order of a canvas, from libsta's sta_tensor_tile:
    a CPU int64 tensor src of tiled_len + text_rows entries, src[j] = the
    untiled row at tiled row j, -1 for the padding rows of partial tiles.
    For a model that tiles its sequence once (as FastVideo's pipelines do:
    x[:, src.clamp(min=0)] before the blocks, the inverse after them); the
    attention itself reads the tiled rows in place."""
    key = (tuple(canvas), tuple(tile) if tile is not None else None, text_rows)
    src = _orders.get(key)
    if src is not None:
        return src
    L = _capi.lib()
    g = _geometry(canvas, tile)
    s = int(L.sta_geometry_video_tokens(C.byref(g))) + text_rows
    L.check(L.sta_geometry_check(C.byref(g), s))
    n = int(L.sta_geometry_tiled_len(C.byref(g), s))
    if s >= 1 << 24:
        raise _bad(_E_WINDOW, "canvas: %d tokens are too many for the tiled order's index "
                   "(float32 exact up to 2^24)" % s)
    rows = torch.arange(1, s + 1, dtype=torch.float32).view(1, s, 1, 1)
    tiled = torch.empty((1, n, 1, 1), dtype=torch.float32)
    from ._op import _handles
    ht, hr = _handles(L, (tiled, rows))
    L.check(L.sta_tensor_tile(ht, hr, C.byref(g), STA_BSHD))
    src = tiled.view(n).to(torch.int64) - 1
    if len(_orders) >= 64:
        _orders.clear()
    _orders[key] = src
    return src


def sliding_tile_attention(q, k, v, window_size, text_length, has_text=True,
                           seq_shape="30x48x80"):
    """fastvideo_kernel.sliding_tile_attention on libsta (see the module doc)."""
    canvas = triple(seq_shape, "seq_shape")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise _bad(101, "q: expected a 4-D [B, heads, S, D] tensor, got %s"
                   % ("%d-D" % q.dim() if isinstance(q, torch.Tensor) else type(q).__name__))
    wins = [triple(w, "window_size[%d]" % i) for i, w in enumerate(window_size)]
    if len(wins) != q.shape[1]:
        raise _bad(_E_WINDOW, "window_size: expected one window per head (%d), got %d"
                   % (q.shape[1], len(wins)))
    return attention(q, k, v, canvas=canvas, window=wins,  # the core's tile: FastVideo's
                     text_len=text_length if has_text else 0, layout="bhsd", order="tiled")


_TOPK = {"kind": "int32", "min": 1}


def _block_elements(block_size):
    """The rows of a cube: block_size's product, or 64 / 256 as given."""
    if isinstance(block_size, bool) or not isinstance(block_size, (int, tuple, list)):
        raise _bad(_E_ARGUMENT, "block_size: expected a cube (t, h, w) or its tokens (64 or "
                                "256), got %r" % (block_size,))
    if isinstance(block_size, int):
        return block_size if block_size in (64, 256) else block_size ** 3
    t = triple(block_size, "block_size")
    return t[0] * t[1] * t[2]


def video_sparse_attn(q, k, v, variable_block_sizes, q_variable_block_sizes=None, topk=None,
                      block_size=64, compress_attn_weight=None):
    """fastvideo_kernel.video_sparse_attn on libsta (see the module doc):
    out [B, heads, Sq, D]."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    br = _block_elements(block_size)
    if k.shape[2] % br:
        raise _bad(_E_SHAPE, "k: %d rows, expected a multiple of the cube's %d"
                   % (k.shape[2], br))
    mk = k.shape[2] // br
    topk = min(check_value("topk", topk, _TOPK), max(mk, 1))  # FastVideo clamps it
    kvs = _i32("variable_block_sizes", variable_block_sizes, q.device).reshape(-1)
    qs = _i32("q_variable_block_sizes", q_variable_block_sizes, q.device)
    if compress_attn_weight is not None:
        _check_tensors(("q", "compress_attn_weight"), (q, compress_attn_weight))
    return _vsa_call(q, k, v, compress_attn_weight, kvs, qs.reshape(-1) if qs is not None else None,
                     VsaSpec(br, topk, STA_BHSD, 0, 0.0))


def block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes=None):
    """Attention over each query block's listed key blocks, FastVideo's
    block_sparse_attn_from_indices: (out, lse), q, k, v [B, heads, S, D]."""
    _check_tensors(("q", "k", "v"), (q, k, v))
    kvs = _i32("variable_block_sizes", variable_block_sizes, q.device)
    br = 64
    if kvs is not None:
        kvs = kvs.reshape(-1)
        if kvs.numel() < 1 or k.shape[2] % kvs.numel():
            raise _bad(_E_SHAPE, "variable_block_sizes: %d blocks do not divide k's %d rows"
                       % (kvs.numel(), k.shape[2]))
        br = k.shape[2] // kvs.numel()
    for name, t in (("q2k_idx", q2k_idx), ("q2k_num", q2k_num)):
        if not isinstance(t, torch.Tensor):
            raise _bad(_E_ARGUMENT, "%s: expected a torch.Tensor, got %s"
                       % (name, type(t).__name__))
    return _block_call(q, k, v, _i32("q2k_idx", q2k_idx, q.device),
                       _i32("q2k_num", q2k_num, q.device), kvs, None,
                       BlockSpec(br, STA_BHSD, 0, 0.0), True)


def block_sparse_attn(q, k, v, q2k_idx, q2k_num, variable_block_sizes=None):
    """FastVideo's block_sparse_attn: (out, lse) of q, k, v [B, heads, S, D]
    over the key blocks of q2k_idx / q2k_num (block_sparse_attn_from_indices);
    or, FastVideo's newer form, block_sparse_attn(q, k, v, block_map,
    variable_block_sizes) with a bool block map [B, heads, Mq, Mk] (or
    [heads, Mq, Mk])."""
    if isinstance(q2k_idx, torch.Tensor) and q2k_idx.dtype == torch.bool:
        if variable_block_sizes is not None:
            raise _bad(_E_ARGUMENT, "variable_block_sizes: given twice (a block map takes the "
                                    "sizes in q2k_num's place)")
        m = q2k_idx.unsqueeze(0) if q2k_idx.dim() == 3 else q2k_idx
        # the listed blocks first, ascending: a stable sort of "not listed"
        idx = torch.sort((~m).to(torch.uint8), dim=-1, stable=True).indices
        return block_sparse_attn_from_indices(q, k, v, idx, m.sum(-1), q2k_num)
    return block_sparse_attn_from_indices(q, k, v, q2k_idx, q2k_num, variable_block_sizes)
