#!/usr/bin/env python3
"""bench_gpu.py -- the speed of sta's CUDA forward against what a user would
otherwise run.

Runs on the GPU machine (python3 there has torch).  libsta.so is called
through ctypes and its public API only (core/sta.h): torch tensors are
wrapped as sta device tensors (sta_tensor_wrap, STA_CUDA) and
sta_attention_forward runs on them.

  bench_gpu.py [--lib build/libsta.so] [--bench] [--sweep] [--no-flex]
               [--reps N] [--out DIR]

--bench    STA.md section 8 workloads: sta (exact and fast softmax) vs
           cuDNN dense SDPA vs FlexAttention with an STA block mask, same
           inputs, same run; at wan-720p and hunyuan-720p the errors of sta
           and of FlexAttention bf16 against float32 (bench_accuracy.py's).
           STA_WORKLOADS picks workloads by name.
--sweep    canvas sweep at window 3,3,3: sta vs dense, peak memory.
Neither given: both.  Kernel variants and libraries side by side are
bench_ab.py; accuracy alone bench_accuracy.py.
"""
import argparse
import json
import os
import sys
import time

import torch


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    STA_SOFTMAX_FAST, flops, time_ms, WORKLOADS, flex_mask_mod, tiled_perm, flex_tiled_mask_mod,
    flex_setup, workload, common_args, session, save,
    variant_cases, variant_inputs)  # noqa: F401  (bench_fp8.py takes these from here)
from bench_accuracy import ACC_WORKLOADS, accuracy, accuracy_table  # noqa: E402


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


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--no-flex", action="store_true")
    a = ap.parse_args()
    if not (a.bench or a.sweep):
        a.bench = a.sweep = True
    sta, log, results = session(a, "bench_gpu")
    if a.bench:
        bench(sta, a.reps, log, results, flex=not a.no_flex)
    if a.sweep:
        sweep(sta, max(5, a.reps // 2), log, results)
    save(a, "bench_gpu", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
