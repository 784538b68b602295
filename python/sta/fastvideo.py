"""FastVideo's sliding_tile_attention, with its signature and semantics.

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
"""
import ctypes as C
import torch

from . import _capi
from ._capi import Geometry, STA_BSHD
from ._args import _E_WINDOW, _bad, triple
from ._op import attention

__all__ = ["sliding_tile_attention", "tiled_order"]

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
