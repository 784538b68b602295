#!/usr/bin/env python3
"""bsa_groups.py -- how many key-block loads a block-sparse forward saves when
one CTA serves G neighbouring query blocks and loads the union of their
lists once (each consumer warpgroup computing only the blocks its own query
block lists), against today's split kernel, which loads every query block's
list on its own (kernels/README.md, "Block-sparse attention").

The question it answers: the 64-row kernel at hunyuan-720p is bound by the
L2's bandwidth (ncu: L2 throughput 97 %, BENCHMARKS.md), each key block
read for 64 rows of work.  Grouping only helps where neighbouring query
blocks' lists overlap; this measures the overlap on three kinds of lists at
hunyuan-720p's cube grid (30x48x80 in 4x4x4 cubes: 8x12x20 = 1920 cubes),
top 240 (sparsity 0.875):
  random  drawn uniformly (bench_blocks.py's "random");
  local   nearest cubes by centre distance plus noise (bench_blocks.py's
          "local", VSA-like);
  vsa     VSA's own selection (STA.md section 12: top-k of the coarse
          scores, mean q and k over each cube) on smooth video-like inputs:
          q and k a low-pass field over the canvas (a per-head random
          mixture of separable cosines) plus white noise.
For each kind and each G in {1, 2, 4} (neighbours along W, then 2x2 in
H and W), r = (key blocks loaded) / (key blocks computed): 1 for today's
kernel; the bytes per FLOP scale by r, so an L2-bound kernel's time would
too, down to the tensor cores' floor.

CPU, torch; about a minute:  /usr/bin/python3 research/bsa_groups.py
"""
import math
import sys

import torch

GRID = (8, 12, 20)  # cubes along T, H, W
TOPK = 240
HEADS = 4


def centres():
    t, h, w = torch.meshgrid(*[torch.arange(n) for n in GRID], indexing="ij")
    return torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)], 1).float()


def lists(kind, gen):
    M = GRID[0] * GRID[1] * GRID[2]
    if kind == "random":
        score = torch.rand(HEADS, M, M, generator=gen)
    elif kind == "local":
        c = centres()
        score = -torch.cdist(c, c)[None] + 2.0 * torch.rand(HEADS, M, M, generator=gen)
    else:  # vsa: coarse scores of cube means of smooth fields
        T, Hh, W = 30, 48, 80
        D = 64
        tt, hh, ww = torch.meshgrid(torch.arange(T).float(), torch.arange(Hh).float(),
                                    torch.arange(W).float(), indexing="ij")
        means = []
        for _ in range(2):  # q, k
            x = torch.zeros(HEADS, T, Hh, W, D)
            for _ in range(6):  # a mixture of low-frequency separable cosines
                f = torch.rand(3, generator=gen) * torch.tensor([2.0, 3.0, 4.0]) * math.pi
                ph = torch.rand(3, generator=gen) * 2 * math.pi
                wave = (torch.cos(f[0] * tt / T + ph[0]) * torch.cos(f[1] * hh / Hh + ph[1]) *
                        torch.cos(f[2] * ww / W + ph[2]))
                amp = torch.randn(HEADS, 1, 1, 1, D, generator=gen)
                x += wave[None, ..., None] * amp
            x += 0.5 * torch.randn(x.shape, generator=gen)
            # cube means (4x4x4; the border cubes of T = 30 are partial: 2 rows)
            cubes = []
            for a in range(GRID[0]):
                for b in range(GRID[1]):
                    for c in range(GRID[2]):
                        cubes.append(x[:, 4 * a:4 * a + 4, 4 * b:4 * b + 4,
                                       4 * c:4 * c + 4].reshape(HEADS, -1, D).mean(1))
            means.append(torch.stack(cubes, 1))  # [H, M, D]
        score = means[0] @ means[1].transpose(1, 2) / math.sqrt(D)
    return torch.topk(score, TOPK, dim=-1).indices  # [H, M, TOPK]


def groups(G):
    """Query blocks by group: G = 1 each alone, 2 pairs along W, 4 2x2
    squares in H and W (cube order: T, then H, then W)."""
    T, Hh, W = GRID
    out = []
    for t in range(T):
        for h in range(0, Hh, 1 if G < 4 else 2):
            for w in range(0, W, 1 if G == 1 else 2):
                hs = [h] if G < 4 else [h, h + 1]
                ws = [w] if G == 1 else [w, w + 1]
                out.append([(t * Hh + a) * W + b for a in hs for b in ws])
    return out


def ratio(idx, G):
    M = idx.shape[1]
    loaded = computed = 0
    for hd in range(idx.shape[0]):
        bits = torch.zeros(M, M, dtype=torch.bool)
        bits[torch.arange(M)[:, None], idx[hd]] = True
        for g in groups(G):
            loaded += int(bits[g].any(0).sum())
            computed += len(g) * TOPK
    return loaded / computed


def main():
    gen = torch.Generator().manual_seed(2026)
    print("# hunyuan-720p cube grid %s (%d cubes), top %d, %d heads" % (
        "x".join(map(str, GRID)), GRID[0] * GRID[1] * GRID[2], TOPK, HEADS))
    print("# r = key blocks loaded / key blocks computed (today's split kernel: 1)")
    print("| lists | G = 1 | G = 2 (pairs along W) | G = 4 (2x2 in H, W) |")
    print("|---|---|---|---|")
    for kind in ("random", "local", "vsa"):
        idx = lists(kind, gen)
        print("| %s | %s |" % (kind, " | ".join("%.3f" % ratio(idx, G) for G in (1, 2, 4))))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
