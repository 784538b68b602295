"""Swap sta into a FastVideo-style attention module.

FastVideo's DiTs call fastvideo_kernel's STA on q, k, v [B, heads, S, D]
whose video rows are in FastVideo's tiled order (the model tiles its
sequence once, before the blocks):

    from fastvideo_kernel import sliding_tile_attention          # before
    from sta.fastvideo import sliding_tile_attention             # after

Same signature and semantics; sta reads the tiled rows in place (q, k, v
below are strided views of one qkv GEMM: no copy), takes any canvas
(partial tiles are padded, their rows come out 0) and runs all heads in
one launch, forward and backward.  This script runs one such block both
ways, sta and a dense masked attention with the same signature, and
prints the difference, the gradients' and the time.

    python3 examples/fastvideo_dropin.py [--canvas 7x10x9] [--text 16]
        [--dim 128] [--heads 2] [--window 1x3x3] [--device cpu|cuda]
"""
import argparse
import math
import os
import sys
import time

import torch

try:
    import sta
except ImportError:  # run from a checkout, sta not installed: the checkout's package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import sta
from sta.fastvideo import sliding_tile_attention, tiled_order

TILE = (6, 8, 8)


class TiledSelfAttention(torch.nn.Module):
    """A DiT block's self-attention as FastVideo writes it: x [B, S, dim] in
    the tiled order (video rows, then text) -> q, k, v -> the STA kernel
    (any function with fastvideo_kernel's signature) -> projection."""

    def __init__(self, dim, heads, window_size, seq_shape, text_length, kernel):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.window_size, self.seq_shape, self.text_length = window_size, seq_shape, text_length
        self.kernel = kernel

    def forward(self, x):
        B, S, _ = x.shape
        # [3, B, heads, S, D] views of the one GEMM output, last dim contiguous
        q, k, v = self.qkv(x).view(B, S, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out = self.kernel(q, k, v, self.window_size, self.text_length, True, self.seq_shape)
        return self.proj(out.transpose(1, 2).reshape(B, S, -1))


def dense_kernel(q, k, v, window_size, text_length, has_text=True, seq_shape="30x48x80"):
    """FastVideo's STA as a dense masked attention (STA.md sections 1-3), on
    the tiled rows: what the kernel computes, written out for comparison."""
    canvas = tuple(int(c) for c in seq_shape.split("x"))
    src = tiled_order(canvas, TILE, q.shape[2] - tiled_order(canvas, TILE).numel()).to(q.device)
    tok = src.clamp(min=0)
    T, H, W = canvas
    V, grid = T * H * W, [math.ceil(c / t) for c, t in zip(canvas, TILE)]
    text_len = text_length if has_text else 0
    coord = [tok // (H * W) // TILE[0], tok // W % H // TILE[1], tok % W // TILE[2]]
    video, valid = (src >= 0) & (tok < V), (src >= 0) & (tok < V + text_len)
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
    for h, win in enumerate(window_size):
        see = valid.expand(len(src), -1).clone()
        for c, kw, n in zip(coord, win, grid):
            if kw < n:
                start = (c - kw // 2).clamp(0, n - kw)
                see &= ~(video[:, None] & video[None, :]) | \
                    ((c[None, :] >= start[:, None]) & (c[None, :] < start[:, None] + kw))
        s[:, h] = s[:, h].masked_fill(~see, float("-inf"))
    out = torch.softmax(s, dim=-1).nan_to_num(0.0) @ v.float()  # padding rows: no keys, 0
    return out.masked_fill((src < 0)[:, None], 0.0).to(q.dtype)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="fastvideo_dropin.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n    python3 ")[0].rstrip() +
        "\n\nWrites no files.  Defaults are shown with each option.")
    ap.add_argument("--canvas", default="7x10x9", help="T x H x W latent tokens (default %(default)s)")
    ap.add_argument("--text", type=int, default=16,
                    help="text tokens after the video (default %(default)s)")
    ap.add_argument("--dim", type=int, default=128, help="model width (default %(default)s)")
    ap.add_argument("--heads", type=int, default=2, help="attention heads (default %(default)s)")
    ap.add_argument("--window", default="1x3x3",
                    help="Kt x Kh x Kw tiles, every head (default %(default)s)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu or cuda (default: cuda when torch sees a GPU; here %(default)s)")
    a = ap.parse_args(argv)
    canvas = tuple(int(c) for c in a.canvas.split("x"))
    window = tuple(int(c) for c in a.window.split("x"))
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    # the model tiles its sequence once, before the blocks (FastVideo does too)
    src = tiled_order(canvas, TILE, a.text)
    tokens = torch.randn(1, math.prod(canvas) + a.text, a.dim)
    x = tokens[:, src.clamp(min=0)].masked_fill((src < 0)[:, None], 0.0)
    x = x.to(a.device, dtype).requires_grad_(True)
    block = TiledSelfAttention(a.dim, a.heads, [window] * a.heads, a.canvas, a.text,
                               sliding_tile_attention).to(a.device, dtype)
    results = []
    for name, kernel in (("sta", sliding_tile_attention), ("dense", dense_kernel)):
        block.kernel = kernel
        x.grad = None
        t0 = time.perf_counter()
        y = block(x)
        y.float().square().mean().backward()
        if a.device == "cuda":
            torch.cuda.synchronize()
        results.append((y.detach().float(), x.grad.float(), time.perf_counter() - t0))
        print("%-5s forward + backward: %.1f ms" % (name, results[-1][2] * 1e3))
    (y1, g1, _), (y2, g2, _) = results
    rel = [float((p - r).norm() / r.norm()) for p, r in ((y1, y2), (g1, g2))]
    print("sta vs dense, canvas %s (%d rows, %d padding), window %s: out rel %.2e, "
          "grad rel %.2e" % (a.canvas, src.numel(), int((src < 0).sum()), a.window, *rel))
    return rel


if __name__ == "__main__":
    try:
        main()
    except sta.Error as e:
        sys.exit("fastvideo_dropin: %s" % e)
