#!/usr/bin/env python3
"""bench_gpu.py -- sta's CUDA forward against what a user would otherwise run.

Runs on the GPU machine (python3 there has torch).  libsta.so is called
through ctypes and its public API only (core/sta.h): torch tensors are
wrapped as sta device tensors (sta_tensor_wrap, STA_CUDA) and
sta_attention_forward runs on them.

  bench_gpu.py [--lib build/libsta.so] [--check N] [--bench] [--accuracy]
               [--sweep] [--variants] [--ab LIB,...] [--set KNOB=V,...] [--dtypes]
               [--clocks S] [--graph] [--reps N] [--out DIR]

--check N  N fresh random geometries against a float32 torch reference of
           the STA mask (odd canvases, partial tiles, per-head windows,
           text, BSHD/BHSD, bf16/f16, D 64/128, LSE).
--bench    STA.md section 8 workloads: sta (exact and fast softmax) vs
           cuDNN dense SDPA vs FlexAttention with an STA block mask, same
           inputs, same run; at wan-720p and hunyuan-720p the errors of sta
           and of FlexAttention bf16 against float32 (--accuracy's).
--accuracy at full size (STA_ACC_WORKLOADS, default hunyuan-720p and
           wan-720p): sta exact, sta fast and FlexAttention bf16 against
           FlexAttention in float32 with the same block mask (itself checked
           against float64 on sampled rows), randn and peaked inputs
           (FastVideo's: each row a random direction with a norm from
           N(0.1, 10)); rel L2, mean and max abs error.
--sweep    canvas sweep at window 3,3,3: sta vs dense.
--variants kernel variants (the library's test-only setting: 0 the default,
           2 one CTA per work item, 9 the 128 x 128 kernel) on the cases STA_CASES names
           (default hunyuan-720p, wan-720p; "all": the section 8 workloads
           plus mixed per-head windows, D 64 and fp16 at hunyuan-720p);
           STA_VARIANTS picks the variants (the first is the reference for
           rel_vs_first), STA_SOFTMAX the softmax modes ("exact,fast").
--ab LIBS  the same cases with --lib and each library of LIBS (comma-
           separated) loaded in this one process, alternated STA_AB_ROUNDS
           times (3) per softmax mode on the same inputs: ms per library
           and round, and whether the outputs are bit-identical.
--set KNOB=V1,V2,...  the same A/B over the library's test-only kernel
           settings (variant=0,9, no_tma=0,1 or no_tma_q=0,1: the first is
           the reference), with --lib.
--variant V, --no-tma  with --ab or --set: every config runs variant V, or
           loads everything by the gather.
--graph    CUDA graph capture of the forward (first call captured, eager,
           captured again): outputs equal bit for bit.
--dtypes   bf16 against fp16 at hunyuan-720p, sta, cuDNN dense and a plain
           GEMM, twice alternated: whether a gap between the dtypes is sta's
           or the card's.
--clocks S the same question by the card's SM clock and power: sta and the
           GEMM each run S seconds per dtype while nvidia-smi samples them.
"""
import argparse
import ctypes as C
import json
import math
import os
import random
import statistics
import sys
import time

import torch


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    STA_BSHD, STA_BHSD, STA_SOFTMAX_FAST, SOFTMAX, Sta, dense_mask, reference, flops, rel_err,
    time_ms, WORKLOADS, flex_mask_mod, tiled_perm, flex_tiled_mask_mod, flex_setup, workload,
    peaked, errors, file_log)


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


def accuracy(sta, name, inputs, flexfns, log):
    """Errors against float32 at full size: FlexAttention in float32 on the
    bf16 inputs, with the exact STA block mask of FastVideo's tiled order
    (128-row blocks are thirds of tiles), is the reference; it is checked
    against float64 on 256 sampled query rows.  sta (exact and fast softmax)
    and Flex bf16 (same mask) are measured against it.  Returns
    {which: {rel, mean, max}}."""
    flex_c, create_block_mask = flexfns
    g, S = workload(name)
    q, k, v = inputs
    H, D = q.shape[2], q.shape[3]
    perm = tiled_perm(g, S, q.device)
    bm = create_block_mask(flex_tiled_mask_mod(g, S), None, None, S, S, device="cuda",
                           BLOCK_SIZE=128, _compile=True)
    qt, kt, vt = (t[:, perm].transpose(1, 2).contiguous() for t in (q, k, v))

    def untile(ot):
        u = torch.empty(1, S, H, D, device="cuda", dtype=ot.dtype)
        u[:, perm] = ot.transpose(1, 2)
        return u
    ref = untile(flex_c(qt.float(), kt.float(), vt.float(), block_mask=bm))
    res = {"flex bf16": errors(untile(flex_c(qt, kt, vt, block_mask=bm)), ref)}
    del qt, kt, vt, bm
    # the reference itself, on sampled rows, against float64
    gen = torch.Generator(device="cuda").manual_seed(7)
    rows = torch.randint(0, S, (256,), device="cuda", generator=gen)
    heads = torch.randint(0, H, (256,), device="cuda", generator=gen)
    m = dense_mask(g, S, H, q.device, rows)  # [H, 256, S]
    worst = 0.0
    for i in range(0, 256, 8):
        r, h = rows[i:i + 8], heads[i:i + 8]
        qs = q[0, r, h].double()                                   # [8, D]
        s_ = torch.einsum("rd,rsd->rs", qs, k[0, :, h].double().transpose(0, 1))
        s_ = s_ / math.sqrt(D)
        s_ = s_.masked_fill(~m[h, torch.arange(i, i + 8, device="cuda")], float("-inf"))
        o64 = torch.einsum("rs,rsd->rd", torch.softmax(s_, -1), v[0, :, h].double().transpose(0, 1))
        worst = max(worst, (ref[0, r, h].double() - o64).abs().max().item())
    res["reference vs float64 (256 rows, max abs)"] = worst
    o = torch.empty_like(q)
    for mode in ("exact", "fast"):
        sta.forward(g, q, k, v, o, softmax=SOFTMAX[mode])
        torch.cuda.synchronize()
        res["sta " + mode] = errors(o, ref)
    del ref, o
    torch.cuda.empty_cache()
    log("accuracy %s %s" % (name, json.dumps(res)))
    return res


ACC_WORKLOADS = ["hunyuan-720p", "wan-720p"]


def accuracy_table(sta, log, results, flexfns, names=None, kinds=("randn", "peaked N(0.1,10)"),
                   rows=None):
    """--accuracy: randn and peaked inputs at full size, one table (rows:
    results already measured, e.g. --bench's randn ones)."""
    names = names or os.environ.get("STA_ACC_WORKLOADS", ",".join(ACC_WORKLOADS)).split(",")
    rows = list(rows or [])
    for name in names:
        g, S = workload(name)
        for kind in kinds:
            torch.manual_seed(1)
            shape = (1, S, 24, 128)
            if kind == "randn":
                inputs = [torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
            else:
                inputs = [peaked(shape, 10.0, torch.bfloat16) for _ in range(3)]
            try:
                r = accuracy(sta, name, inputs, flexfns, log)
                rows.append(dict(workload=name, inputs=kind, **r))
            except Exception as ex:  # keep the rest of the table
                log("accuracy %s %s failed: %s" % (name, kind, repr(ex)[:300]))
            del inputs
            torch.cuda.empty_cache()
    results.setdefault("accuracy", []).extend(rows)
    log("")
    log("Errors against float32 (FlexAttention in float32, same block mask), bf16, 24 heads, D 128:")
    log("")
    log("| workload | inputs | which | rel L2 | mean abs | max abs |")
    log("|---|---|---|---|---|---|")
    for r in rows:
        for which in ("sta exact", "sta fast", "flex bf16"):
            e = r[which]
            log("| %s | %s | %s | %.3e | %.3e | %.3e |" % (r["workload"], r["inputs"], which,
                                                            e["rel"], e["mean"], e["max"]))
    log("")
    log("reference against float64 on sampled rows, max abs: %s" % ", ".join(
        "%.1e" % r["reference vs float64 (256 rows, max abs)"] for r in rows))
    return rows


def bench(sta, reps, log, results, flex=True):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    flexfns = flex_setup() if flex else None
    H, D = 24, 128
    rows = []
    only = os.environ.get("STA_WORKLOADS")
    for name, canvas, text, win in WORKLOADS:
        if only and name not in only.split(","):
            continue
        g, S = workload(name)
        torch.manual_seed(1)
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(1, H, S, device="cuda")
        fl = flops(g, S, H, D)
        ms, ms_fast = [], []
        for _ in range(2):  # exact and fast alternated, twice
            ms.append(time_ms(lambda: sta.forward(g, q, k, v, o), reps)[0])
            ms_fast.append(time_ms(lambda: sta.forward(g, q, k, v, o, softmax=STA_SOFTMAX_FAST),
                                   reps)[0])
        ms_lse, _ = time_ms(lambda: sta.forward(g, q, k, v, o, lse), max(3, reps // 3))
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            dense_ms, _ = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh), max(3, reps // 4))
        row = dict(name=name, S=S, window=win, tflop=fl / 1e12, sta_ms=min(ms), sta_ms_all=ms,
                   sta_fast_ms=min(ms_fast), sta_fast_ms_all=ms_fast, sta_lse_ms=ms_lse,
                   sta_tflops=fl / min(ms) / 1e9, dense_ms=dense_ms)
        if flexfns:
            flex_c, create_block_mask = flexfns
            try:
                t0 = time.time()
                bm = create_block_mask(flex_mask_mod(g, S), None, None, S, S, device="cuda",
                                       BLOCK_SIZE=128, _compile=True)
                qc, kc, vc = (t.contiguous() for t in (qh, kh, vh))
                flex_c(qc, kc, vc, block_mask=bm)
                torch.cuda.synchronize()
                row["flex_setup_s"] = time.time() - t0
                row["flex_sparsity"] = bm.sparsity()
                row["flex_ms"], _ = time_ms(lambda: flex_c(qc, kc, vc, block_mask=bm), max(3, reps // 2))
                del qc, kc, vc, bm
            except Exception as ex:  # keep the rest of the table
                row["flex_error"] = repr(ex)[:300]
            try:  # Flex on FastVideo's tiled order: 128-blocks align with tiles
                perm = tiled_perm(g, S, q.device)
                qc, kc, vc = (t[:, perm].transpose(1, 2).contiguous() for t in (q, k, v))
                bm = create_block_mask(flex_tiled_mask_mod(g, S), None, None, S, S, device="cuda",
                                       BLOCK_SIZE=128, _compile=True)
                flex_c(qc, kc, vc, block_mask=bm)
                torch.cuda.synchronize()
                row["flex_tiled_sparsity"] = bm.sparsity()
                row["flex_tiled_ms"], _ = time_ms(lambda: flex_c(qc, kc, vc, block_mask=bm), max(3, reps // 2))
                del qc, kc, vc, bm, perm
            except Exception as ex:
                row["flex_tiled_error"] = repr(ex)[:300]
            if name in ACC_WORKLOADS:
                try:
                    row["acc"] = accuracy(sta, name, (q, k, v), flexfns, log)
                except Exception as ex:
                    row["acc_error"] = repr(ex)[:300]
        log("bench %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, o, lse, qh, kh, vh
        torch.cuda.empty_cache()
    results["bench"] = rows
    log("")
    log("sta ms: the better of two runs (median of REPS each), exact and fast softmax "
        "alternated; errors against float32 (FlexAttention in float32, same block mask), "
        "mean abs / max abs, randn inputs")
    log("")
    log("| workload | window | TFLOP | sta ms | sta TFLOP/s | sta fast ms | fast vs exact | "
        "sta+lse ms | Flex untiled ms | Flex tiled ms | vs best Flex | cuDNN dense ms | vs dense | "
        "sta err vs f32 | Flex bf16 err vs f32 |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    f2 = lambda r, k, f: f % r[k] if k in r else "n/a"  # noqa: E731
    err = lambda r, w: ("%.2e / %.1e" % (r["acc"][w]["mean"], r["acc"][w]["max"])  # noqa: E731
                        if "acc" in r else "n/a")
    for r in rows:
        best = min([r[k] for k in ("flex_ms", "flex_tiled_ms") if k in r] or [0])
        log("| %s | %s | %.2f | %.2f | %.0f | %.2f | %+.1f %% | %.2f | %s | %s | %s | %.1f | %.1fx | %s | %s |" % (
            r["name"], ",".join(map(str, r["window"])), r["tflop"], r["sta_ms"], r["sta_tflops"],
            r["sta_fast_ms"], 100 * (r["sta_fast_ms"] / r["sta_ms"] - 1), r["sta_lse_ms"],
            f2(r, "flex_ms", "%.2f"), f2(r, "flex_tiled_ms", "%.2f"),
            "%.2fx" % (best / r["sta_ms"]) if best else "n/a",
            r["dense_ms"], r["dense_ms"] / r["sta_ms"], err(r, "sta exact"), err(r, "flex bf16")))
    if flexfns:
        names = [r["name"] for r in rows if "acc" in r]
        if names:
            accuracy_table(sta, log, results, flexfns, names, ("peaked N(0.1,10)",),
                           [dict(workload=r["name"], inputs="randn", **r["acc"])
                            for r in rows if "acc" in r])


def sweep(sta, reps, log, results):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    H, D, text = 24, 128, 256
    rows = []
    for canvas in [(30, 30, 52), (30, 48, 80), (30, 68, 120)]:
        V = canvas[0] * canvas[1] * canvas[2]
        S = V + text
        g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=[3, 3, 3])
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        lse = torch.empty(1, H, S, device="cuda")
        sta.forward(g, q, k, v, o, lse)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        io_bytes = 4 * q.numel() * 2 + lse.numel() * 4
        fl = flops(g, S, H, D)
        ms, _ = time_ms(lambda: sta.forward(g, q, k, v, o), reps)
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        torch.cuda.reset_peak_memory_stats()
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            dense_ms, _ = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh), 3, warmup=1)
        dense_peak = torch.cuda.max_memory_allocated() - base
        row = dict(canvas="x".join(map(str, canvas)), tokens=S, sta_ms=ms, sta_tflops=fl / ms / 1e9,
                   dense_ms=dense_ms, speedup=dense_ms / ms, sta_peak_mib=peak / 2**20,
                   io_mib=io_bytes / 2**20, dense_peak_mib=dense_peak / 2**20)
        log("sweep %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, o, lse, qh, kh, vh
    results["sweep"] = rows
    log("")
    log("| canvas | tokens | sta ms | sta TFLOP/s | cuDNN dense ms | speedup | sta peak MiB (inputs+out+lse = MiB) | dense peak MiB |")
    log("|---|---|---|---|---|---|---|---|")
    for r in rows:
        log("| %s | %d | %.2f | %.0f | %.1f | %.1fx | %.0f (%.0f) | %.0f |" % (
            r["canvas"], r["tokens"], r["sta_ms"], r["sta_tflops"], r["dense_ms"], r["speedup"],
            r["sta_peak_mib"], r["io_mib"], r["dense_peak_mib"]))


# The kernel work's cases: the canonical workloads plus a searched-like mix of
# per-head windows, D 64 and fp16 (each at hunyuan-720p).  STA_CASES picks
# them by name (comma-separated), STA_VARIANTS the kernel variants.
MIXED_WINDOWS = [(3, 3, 3), (1, 3, 3), (3, 6, 10), (1, 3, 5), (1, 1, 1), (3, 3, 5),
                 (5, 6, 10), (3, 5, 7)]


def variant_cases():
    cases = []
    for name, canvas, text, win in WORKLOADS:
        cases.append((name, canvas, text, list(win), 24, 128, torch.bfloat16))
    hy = WORKLOADS[0]
    mixed = []
    for h in range(24):
        mixed += list(MIXED_WINDOWS[h % len(MIXED_WINDOWS)])
    cases.append(("hunyuan-720p-mixed", hy[1], hy[2], mixed, 24, 128, torch.bfloat16))
    cases.append(("hunyuan-720p-d64", hy[1], hy[2], list(hy[3]), 48, 64, torch.bfloat16))
    cases.append(("hunyuan-720p-fp16", hy[1], hy[2], list(hy[3]), 24, 128, torch.float16))
    want = os.environ.get("STA_CASES", "hunyuan-720p,wan-720p")
    if want != "all":
        names = want.split(",")
        cases = [c for c in cases if c[0] in names]
    return cases


def softmax_modes():
    return [m for m in os.environ.get("STA_SOFTMAX", "exact,fast").split(",") if m]


def variant_inputs(case):
    name, canvas, text, win, H, D, dt = case
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=win)
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, S, H, D, device="cuda", dtype=dt) for _ in range(3))
    return g, S, (q, k, v, torch.empty_like(q)), flops(g, S, H, D)


def variants(sta, reps, log, results):
    rows = []
    for case in variant_cases():
        name, H, D, dt = case[0], case[4], case[5], case[6]
        g, S, (q, k, v, o), fl = variant_inputs(case)
        for mode in softmax_modes():
            ref = None
            for var in [int(x) for x in os.environ.get('STA_VARIANTS', '0,9').split(',')]:
                sta.set_kernels(variant=var)
                o.fill_(float("nan"))  # this variant's output, or NaN
                ms, _ = time_ms(lambda: sta.forward(g, q, k, v, o, softmax=SOFTMAX[mode]), reps)
                torch.cuda.synchronize()
                if ref is None:
                    ref = o.clone()
                e, _ = rel_err(o, ref)
                rows.append(dict(workload=name, heads=H, head_dim=D, dtype=str(dt).split(".")[-1],
                                 softmax=mode, variant=var, ms=ms, tflop=fl / 1e12,
                                 tflops=fl / ms / 1e9, rel_vs_first=e))
                log("variant %s" % json.dumps(rows[-1]))
            sta.set_kernels()
        del q, k, v, o
    results["variants"] = rows


def ab(configs, reps, log, results):
    """Libraries or settings side by side in this process: every case of
    variant_cases and softmax mode, the configs (name, library, kernel
    settings) alternated STA_AB_ROUNDS times on the same inputs; outputs
    compared bit for bit with the first config's."""
    rounds = int(os.environ.get("STA_AB_ROUNDS", "3"))
    names = [c[0] for c in configs]

    def run(cfg, fn):
        _, lib, knobs = cfg
        lib.set_kernels(**knobs)
        try:
            return fn(lib)
        finally:
            lib.set_kernels()
    rows = []
    for case in variant_cases():
        g, S, (q, k, v, o), fl = variant_inputs(case)
        for mode in softmax_modes():
            ms = [[] for _ in configs]
            outs = []
            for rnd in range(rounds):
                for i, cfg in enumerate(configs):
                    if rnd == 0:
                        o.fill_(float("nan"))  # each config's own output, or NaN
                    ms[i].append(run(cfg, lambda lib: time_ms(
                        lambda: lib.forward(g, q, k, v, o, softmax=SOFTMAX[mode]), reps)[0]))
                    if rnd == 0:
                        torch.cuda.synchronize()
                        outs.append(o.clone())
            same = [bool(torch.equal(x, outs[0])) for x in outs]
            diff = [(x.float() - outs[0].float()).abs().max().item() for x in outs]
            row = dict(workload=case[0], softmax=mode, libs=names, ms=ms, identical=same,
                       max_diff=diff, tflop=fl / 1e12)
            rows.append(row)
            log("ab %s" % json.dumps(row))
            del outs
        del q, k, v, o
        torch.cuda.empty_cache()
    results["ab"] = rows
    log("")
    log("A/B in one process, %d rounds alternated, median of %d runs each, ms (round by round); "
        "last column: the later configs' median against the first's" % (rounds, reps))
    log("")
    log("| case | softmax | " + " | ".join(names) + " | change | outputs |")
    log("|---|---|" + "---|" * len(names) + "---|---|")
    for r in rows:
        med = [statistics.median(m) for m in r["ms"]]
        log("| %s | %s | %s | %s | %s |" % (
            r["workload"], r["softmax"], " | ".join(" / ".join("%.2f" % x for x in m) for m in r["ms"]),
            ", ".join("%+.2f %%" % (100 * (x / med[0] - 1)) for x in med[1:]),
            "bit-identical" if all(r["identical"]) else "differ (max %s)" % ", ".join(
                "%.1e" % d for d in r["max_diff"])))


KNOBS = ("variant", "no_tma", "no_tma_q")  # Sta.set_kernels


def ab_configs(sta, libs, knob, base):
    """--ab: (name, library, base) for --lib and each of libs; --set
    KNOB=V1,V2: (KNOB=Vi, --lib's library, base with KNOB = Vi) for each
    setting.  base: the kernel settings every config runs (--variant,
    --no-tma)."""
    if knob:
        if libs:
            raise SystemExit("--set and --ab: one or the other")
        name, _, vals = knob.partition("=")
        if name not in KNOBS or not vals:
            raise SystemExit("--set wants KNOB=V1,V2,... with KNOB one of %s; got %r" %
                             (", ".join(KNOBS), knob))
        return [("%s=%s" % (name, x), sta, dict(base, **{name: int(x)})) for x in vals.split(",")]
    out = []
    for lib in [sta] + [Sta(x) for x in libs.split(",")]:
        path = os.path.abspath(lib.path)
        out.append((os.path.basename(os.path.dirname(path)) + "/" + os.path.basename(path), lib,
                    dict(base)))
    return out


def hunyuan_case():
    """hunyuan-720p at 3,3,3, 24 heads of D 128: name, geometry, S, FLOPs."""
    name, canvas, text, win = WORKLOADS[0]
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=list(win))
    return name, g, S, flops(g, S, 24, 128)


def hunyuan_inputs(S, dt):
    """The same fresh randn q, k, v for each dtype (seeded), and an output."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, S, 24, 128, device="cuda", dtype=dt) for _ in range(3))
    return q, k, v, torch.empty_like(q)


def dtypes(sta, reps, log, results):
    """bf16 against fp16, sta, cuDNN dense and a plain 8192^3 GEMM, hunyuan-720p,
    alternated twice in one run: is a gap between the two dtypes sta's or the card's?"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    name, g, S, fl = hunyuan_case()
    rows = []
    for rnd in range(2):
        for dt in (torch.bfloat16, torch.float16):
            q, k, v, o = hunyuan_inputs(S, dt)
            ms, _ = time_ms(lambda: sta.forward(g, q, k, v, o), reps)
            qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                dense_ms, _ = time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh),
                                      max(3, reps // 4))
            # a plain GEMM of randn operands, 8192^3: the tensor cores alone
            a_, b_ = (torch.randn(8192, 8192, device="cuda", dtype=dt) for _ in range(2))
            gemm_ms, _ = time_ms(lambda: a_ @ b_, reps)
            rows.append(dict(workload=name, round=rnd, dtype=str(dt).split(".")[-1], sta_ms=ms,
                             sta_tflops=fl / ms / 1e9, dense_ms=dense_ms, gemm_ms=gemm_ms,
                             gemm_tflops=2 * 8192 ** 3 / gemm_ms / 1e9))
            del a_, b_
            log("dtype %s" % json.dumps(rows[-1]))
            del q, k, v, o, qh, kh, vh
    results["dtypes"] = rows


def clocks(sta, secs, log, results):
    """SM clock and board power while sta (hunyuan-720p) and a plain 8192^3 GEMM
    each run back to back for secs seconds, bf16 then fp16, twice; nvidia-smi
    samples every 100 ms during each phase (its first 0.5 s left out).  Does
    fp16 run the card at a lower clock than bf16 (power), or as fast?"""
    import subprocess
    import tempfile
    _, g, S, fl = hunyuan_case()
    rows = []
    for rnd in range(2):
        for dt in (torch.bfloat16, torch.float16):
            q, k, v, o = hunyuan_inputs(S, dt)
            a_, b_ = (torch.randn(8192, 8192, device="cuda", dtype=dt) for _ in range(2))
            for what, fn, work, per in (("sta", lambda: sta.forward(g, q, k, v, o), fl, 4),
                                        ("gemm", lambda: a_ @ b_, 2 * 8192 ** 3, 32)):
                fn()
                torch.cuda.synchronize()
                with tempfile.TemporaryFile("w+") as smi:
                    mon = subprocess.Popen(
                        ["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                         "--format=csv,noheader,nounits", "-lms", "100"],
                        stdout=smi, stderr=subprocess.DEVNULL)
                    n, ts = 0, time.time()
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record()
                    while time.time() - ts < secs:
                        for _ in range(per):
                            fn()
                        n += per
                        torch.cuda.synchronize()
                    e1.record()
                    e1.synchronize()
                    mon.terminate()
                    mon.wait()
                    smi.seek(0)
                    samples = []
                    for line in smi.read().splitlines():
                        try:
                            samples.append(tuple(float(x) for x in line.split(",")))
                        except ValueError:
                            pass
                ms = e0.elapsed_time(e1) / n
                sel = samples[5:]
                row = dict(round=rnd, dtype=str(dt).split(".")[-1], op=what, runs=n, ms=ms,
                           tflops=work / ms / 1e9, samples=len(sel))
                if sel:
                    row["sm_mhz"] = statistics.median(x[0] for x in sel)
                    row["power_w"] = statistics.median(x[1] for x in sel)
                    row["temp_c"] = max(x[2] for x in sel)
                rows.append(row)
                log("clocks %s" % json.dumps(row))
            del q, k, v, o, a_, b_
    results["clocks"] = rows


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
    ap.add_argument("--lib", default=os.path.join(os.environ.get("BUILD", "build"), "libsta.so"))
    ap.add_argument("--check", type=int, default=0)
    ap.add_argument("--seed", type=int, default=int(time.time()) & 0xffff)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--ab", default="", help="comma-separated libraries to A/B against --lib")
    ap.add_argument("--set", default="", help="KNOB=V1,V2,...: kernel settings to A/B with --lib")
    ap.add_argument("--variant", type=int, default=0, help="the kernel variant of every A/B config")
    ap.add_argument("--no-tma", action="store_true", help="every A/B config loads by the gather")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--dtypes", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--clocks", type=float, default=0,
                    help="seconds per phase of the bf16/fp16 clock and power probe")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    log = file_log(a.out, "bench_gpu.log")
    sta = Sta(a.lib)
    results = dict(gpu=torch.cuda.get_device_name(), sta=sta.describe, torch=torch.__version__,
                   date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   command=" ".join(sys.argv), seed=a.seed)
    log("# %s | %s | torch %s | %s | seed %d" % (results["gpu"], sta.describe, torch.__version__,
                                                 results["date"], a.seed))
    fails = 0
    if a.graph:  # first: it needs a process where sta has not run yet
        fails += graph_check(sta, log, results)
    if a.check:
        fails += check(sta, a.check, a.seed, log)
    if a.variants:
        variants(sta, a.reps, log, results)
    if a.ab or a.set:
        base = dict(variant=a.variant, no_tma=int(a.no_tma))
        ab(ab_configs(sta, a.ab, a.set, base), a.reps, log, results)
    if a.accuracy:
        fx = flex_setup()
        if not fx:
            raise SystemExit("--accuracy needs torch's FlexAttention")
        accuracy_table(sta, log, results, fx)
    if a.dtypes:
        dtypes(sta, a.reps, log, results)
    if a.clocks > 0:
        clocks(sta, a.clocks, log, results)
    if a.bench:
        bench(sta, a.reps, log, results, flex=not a.no_flex)
    if a.sweep:
        sweep(sta, max(5, a.reps // 2), log, results)
    with open(os.path.join(a.out, "bench_gpu.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
