#!/usr/bin/env python3
"""dtype_clocks.py -- is sta's fp16 slower than its bf16, or the card's?
(README "bf16 or fp16": the same kernels run at the same speed per clock,
but at its power limit the card gives fp16 a lower clock, as it does
cuBLAS's GEMM.)  On the GPU machine, libsta.so through ctypes:

  dtype_clocks.py [--lib build/libsta.so] [--dtypes] [--clocks S] [--reps N] [--out DIR]

--dtypes   bf16 against fp16 at hunyuan-720p, sta, cuDNN dense and a plain
           GEMM, twice alternated.
--clocks S sta and the GEMM each run S seconds per dtype while nvidia-smi
           samples the SM clock and the board power.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    flops, time_ms, WORKLOADS, common_args, session, save)


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


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--dtypes", action="store_true")
    ap.add_argument("--clocks", type=float, default=0,
                    help="seconds per phase of the bf16/fp16 clock and power probe")
    a = ap.parse_args()
    sta, log, results = session(a, "dtype_clocks")
    if a.dtypes or not a.clocks:
        dtypes(sta, a.reps, log, results)
    if a.clocks > 0:
        clocks(sta, a.clocks, log, results)
    save(a, "dtype_clocks", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
