#!/usr/bin/env python3
"""gpu_torch_check.py -- sta's CUDA forward against torch, through ctypes
(scripts/test/test-gpu runs it on the GPU machine, where python3 has torch):

  gpu_torch_check.py [--lib build/libsta.so] [--check N] [--graph] [--seed S]
                     [--out DIR]

--check N  N fresh random geometries against a float32 torch reference of
           the STA mask (odd canvases, partial tiles, per-head windows,
           text, BSHD/BHSD, bf16/f16, D 64/128, LSE).
--graph    CUDA graph capture of the forward (first call captured, eager,
           captured again): outputs equal bit for bit.  First, in a process
           where sta has not run on the GPU yet.
Exit status 1 when a check failed.
"""
import argparse
import ctypes as C
import math
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    STA_BSHD, STA_BHSD, reference, rel_err, common_args, session, save)


# ---- check -------------------------------------------------------------------

TILES = [(6, 8, 8), (2, 3, 4), (3, 4, 5), (1, 8, 8), (4, 4, 4), (2, 2, 16), (6, 8, 8)]


def random_geometry(rng):
    while True:
        tile = rng.choice(TILES)
        canvas = (rng.randint(1, 14), rng.randint(1, 20), rng.randint(1, 22))
        if rng.random() < 0.25:  # exact tiling
            canvas = tuple(t * rng.randint(1, 3) for t in tile)
        if rng.random() < 0.25:  # the TMA path: whole 8x8 tiles, even tt
            tile = rng.choice([(6, 8, 8), (2, 8, 8), (4, 8, 8)])
            canvas = (tile[0] * rng.randint(1, 3), 8 * rng.randint(1, 4), 8 * rng.randint(1, 4))
        V = canvas[0] * canvas[1] * canvas[2]
        text = rng.choice([0, 0, rng.randint(1, 90), rng.randint(1, 200)])
        pad = rng.choice([0, 0, rng.randint(1, 40)])
        S = V + text + pad
        if 16 <= S <= 3500:
            break
    grid = [-(-c // t) for c, t in zip(canvas, tile)]
    heads = rng.randint(1, 3)

    def win():
        w = []
        for c in grid:
            opts = [k for k in range(1, c + 1, 2)] + [c + rng.randint(0, 3)]
            w.append(rng.choice(opts))
        return w
    windows = win() if rng.random() < 0.4 else sum((win() for _ in range(heads)), [])
    text_len = text if (pad or rng.random() < 0.5) else -1
    return dict(canvas=canvas, tile=tile, text_len=text_len, windows=windows,
                scale=rng.choice([0.0, 0.0, 0.07])), S, heads


def check(sta, n, seed, log):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    worst = 0.0
    fails = 0
    for i in range(n):
        g, S, H = random_geometry(rng)
        B = rng.choice([1, 1, 2])
        D = rng.choice([64, 128])
        dt = rng.choice([torch.bfloat16, torch.float16])
        layout = rng.choice([STA_BSHD, STA_BHSD])
        want_lse = rng.random() < 0.6
        shp = (B, S, H, D) if layout == STA_BSHD else (B, H, S, D)
        if layout == STA_BHSD and rng.random() < 0.5:
            # a permuted view of BSHD storage (strided BHSD)
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=dt).permute(0, 2, 1, 3) for _ in range(3))
        else:
            q, k, v = (torch.randn(*shp, device="cuda", dtype=dt) for _ in range(3))
        o = torch.full(shp, float("nan"), device="cuda", dtype=dt)
        lse = torch.full((B, H, S), float("nan"), device="cuda") if want_lse else None
        scale = g["scale"] or 1.0 / math.sqrt(D)
        sta.forward(g, q, k, v, o, lse, layout)
        torch.cuda.synchronize()
        ro, rl = reference(g, q, k, v, layout, scale)
        e, mx = rel_err(o, ro)
        el = 0.0
        if want_lse:
            el = (lse - rl).abs().max().item()
        bad = not (e < 1.2e-2) or torch.isnan(o.float()).any().item() or not (el < 2e-2)
        worst = max(worst, e)
        line = ("check %3d %s canvas=%s tile=%s text_len=%d S=%d B=%d H=%d D=%d %s %s lse=%s "
                "win=%s rel=%.2e max=%.2e lse_err=%.2e %s" % (
                    i, "BAD" if bad else "ok", "x".join(map(str, g["canvas"])),
                    "x".join(map(str, g["tile"])), g["text_len"], S, B, H, D,
                    "bf16" if dt == torch.bfloat16 else "f16",
                    "BSHD" if layout == STA_BSHD else "BHSD", want_lse, g["windows"], e, mx, el,
                    "FAIL" if bad else ""))
        log(line)
        fails += bad
    log("check: %d geometries, %d failed, worst rel err %.3e" % (n, fails, worst))
    return fails


def graph_check(sta, log, results):
    """CUDA graph capture of sta's forward, in a process where sta has not run
    on the GPU yet: the first capture cannot allocate the persistent kernel's
    counters (it takes the one-CTA-per-item kernel), an eager call then
    allocates them, a second capture takes the persistent kernel.  All three
    outputs must be equal bit for bit and finite."""
    canvas, text, H, D = (12, 24, 40), 64, 4, 128
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=[3, 3, 3])
    torch.manual_seed(3)
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    st = torch.cuda.Stream()
    sta.lib.sta_cuda_set_stream(C.c_void_p(st.cuda_stream))
    outs = []
    try:
        o1 = torch.zeros_like(q)
        g1 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1, stream=st):
            sta.forward(g, q, k, v, o1)
        g1.replay()
        torch.cuda.synchronize()
        o2 = torch.zeros_like(q)
        with torch.cuda.stream(st):
            sta.forward(g, q, k, v, o2)
        torch.cuda.synchronize()
        o3 = torch.zeros_like(q)
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, stream=st):
            sta.forward(g, q, k, v, o3)
        for _ in range(3):
            g2.replay()
        torch.cuda.synchronize()
        outs = [o1, o2, o3]
    finally:
        sta.lib.sta_cuda_set_stream(None)
    ok = all(torch.isfinite(o.float()).all().item() for o in outs) and \
        torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2]) and \
        outs[1].float().abs().sum().item() > 0
    results["graph"] = dict(ok=ok)
    log("graph capture: first capture, eager, persistent capture x3 replays: %s" %
        ("equal, finite" if ok else "MISMATCH"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--check", type=int, default=0)
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--seed", type=int, default=int(time.time()) & 0xffff)
    a = ap.parse_args()
    sta, log, results = session(a, "gpu_torch_check", seed=a.seed)
    fails = 0
    if a.graph:  # first: it needs a process where sta has not run yet
        fails += graph_check(sta, log, results)
    if a.check:
        fails += check(sta, a.check, a.seed, log)
    save(a, "gpu_torch_check", results)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
