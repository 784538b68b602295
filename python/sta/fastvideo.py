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
(their padding rows are never keys and come out zero) and all heads run in
one launch; no padding of S to a multiple of 384 is needed.

libsta reads untiled token order only, so far: reading the tiled order in
place needs a tiled layout in the core and kernels (a layout flag, e.g.
STA_BHSD_TILED).  Until it lands, a call whose tiled order differs from the
untiled one raises NotImplementedError, unless conversion copies are
allowed (allow_conversion_copies = True, or STA_FASTVIDEO_COPIES=1): then
q, k, v are gathered into untiled order and the output scattered back (two
extra passes over q, k, v and out; differentiable).
"""
import ctypes as C
import os

import torch

from . import _capi
from ._capi import Geometry, STA_BSHD
from ._args import _E_WINDOW, _bad, _triple
from ._op import attention
from .errors import UnsupportedError

__all__ = ["sliding_tile_attention", "allow_conversion_copies", "tiled_order"]

allow_conversion_copies = os.environ.get("STA_FASTVIDEO_COPIES", "") not in ("", "0")

TILE = (6, 8, 8)
_orders = {}  # tiled_order's
_device_orders = {}  # _indices'


def _geometry(canvas, tile):
    g = Geometry()
    g.canvas[:] = canvas
    g.tile[:] = tile
    g.text_len = -1
    return g


def tiled_order(canvas, tile=TILE, text_rows=0):
    """FastVideo's tiled order of a canvas, from libsta's sta_tensor_tile:
    a CPU int64 tensor src of tiled_len + text_rows entries, src[j] = the
    untiled row at tiled row j, -1 for the padding rows of partial tiles."""
    key = (tuple(canvas), tuple(tile), text_rows)
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


def _indices(canvas, text_rows, device):
    """(src, pos, any padding) on device: src as tiled_order, pos[i] = the
    tiled row of untiled row i."""
    key = (canvas, text_rows, str(device))
    hit = _device_orders.get(key)
    if hit is None:
        src = tiled_order(canvas, TILE, text_rows)
        pad = src < 0
        pos = torch.empty(int((~pad).sum()), dtype=torch.int64)
        pos[src[~pad]] = torch.nonzero(~pad).view(-1)
        hit = (src.to(device), pos.to(device), pad.to(device), bool(pad.any()))
        if len(_device_orders) >= 64:
            _device_orders.clear()
        _device_orders[key] = hit
    return hit


def sliding_tile_attention(q, k, v, window_size, text_length, has_text=True,
                           seq_shape="30x48x80"):
    """fastvideo_kernel.sliding_tile_attention on libsta (see the module doc)."""
    canvas = _triple(seq_shape, "seq_shape")
    if q.dim() != 4:
        raise _bad(101, "q: expected a 4-D [B, heads, S, D] tensor, got %d-D" % q.dim())
    B, H, S, D = q.shape
    wins = [_triple(w, "window_size[%d]" % i) for i, w in enumerate(window_size)]
    if len(wins) != H:
        raise _bad(_E_WINDOW, "window_size: expected one window per head (%d), got %d"
                   % (H, len(wins)))
    L = _capi.lib()
    g = _geometry(canvas, TILE)
    V = int(L.sta_geometry_video_tokens(C.byref(g)))
    Vt = int(L.sta_geometry_tiled_len(C.byref(g), V))
    if S < Vt:
        raise UnsupportedError("seq_len %d not supported for STA" % S, 301, "STA_ERR_SEQ_LEN")
    text_rows = S - Vt
    text_len = text_length if has_text else 0
    kw = dict(canvas=canvas, tile=TILE, window=wins, text_len=text_len, layout="bhsd")
    if Vt == V and _untiled_is_tiled(canvas):
        return attention(q, k, v, **kw)
    if not allow_conversion_copies:
        raise NotImplementedError(
            "sta.fastvideo.sliding_tile_attention: libsta has no tiled token layout yet: "
            "FastVideo's tiled order (each 6x8x8 tile's rows contiguous) read in place "
            "needs a layout flag in the core and kernels (e.g. STA_BHSD_TILED). Set "
            "sta.fastvideo.allow_conversion_copies = True (or STA_FASTVIDEO_COPIES=1) to "
            "convert with copies meanwhile")
    src, pos, pad, any_pad = _indices(canvas, text_rows, q.device)
    out = attention(q.index_select(2, pos), k.index_select(2, pos), v.index_select(2, pos),
                    **kw)
    out = out.index_select(2, src.clamp(min=0))
    if any_pad:
        out = out.masked_fill(pad.view(1, 1, -1, 1), 0)
    return out


def _untiled_is_tiled(canvas):
    """Tiled order equals the untiled one: one tile across H and W, whole tiles in T."""
    T, Hc, W = canvas
    return Hc == TILE[1] and W == TILE[2] and T % TILE[0] == 0

