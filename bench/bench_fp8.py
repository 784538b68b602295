#!/usr/bin/env python3
"""bench_fp8.py -- sta's fp8 forward (STA_PRECISION_FP8, issue 20) against
bf16 sta and what a user would otherwise run, in one run on the GPU machine.

  bench_fp8.py [--lib build/libsta.so] [--reps N] [--out DIR] [--no-flex]
               [--no-accuracy] [--cases a,b,...] [--prepass 1,0]

Through sta_bench.py's ctypes mirrors (checked against core/sta.h), its
timing (CUDA events, median of REPS) and its FLOP count:
  1. the fp8 GEMM ceiling: torch._scaled_mm at 8192^3 in e4m3 (bf16 out),
     and torch.mm in bf16 beside it, TFLOP/s;
  2. per case (bench_gpu.py's variant_cases: hunyuan-720p, wan-720p,
     stepvideo, hunyuan-720p-d64, hunyuan-720p-mixed (per-head windows),
     hunyuan-720p-full; randn bf16 inputs): fp8 sta, bf16 sta (exact
     softmax), FlexAttention bf16 with the STA block mask (not with per-head
     windows), cuDNN dense SDPA; ms and TFLOP/s (the STA FLOPs for all);
     fp8 under each quantize pre-pass variant of --prepass (STA_FP8_PREPASS: 0 the
     portable kernels, 1 the bandwidth ones),
     the first reported, each one's pre-pass time beside it;
     the fp8 forward's quantize pre-pass and its attention kernel
     separately, by torch.profiler's kernel times;
  3. accuracy at full hunyuan-720p size (24 heads, D 128): fp8 and bf16 sta
     against a float32 reference -- FlexAttention in float32 with the STA
     block mask on FastVideo's tiled order (bench_gpu.py's accuracy()) --
     for randn and DiT-like inputs (bench/fp8_sim.py's "dit" generator, per
     head); relative L2 and cosine similarity.
Writes bench_fp8.log and bench_fp8.json under --out.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpu  # noqa: E402  (variant_cases, variant_inputs)
import sta_bench as bg  # noqa: E402

CASES = ["hunyuan-720p", "wan-720p", "stepvideo", "hunyuan-720p-d64", "hunyuan-720p-mixed",
         "hunyuan-720p-full"]
FP8 = bg.STA_PRECISION_FP8


def cases(names):
    old = os.environ.get("STA_CASES")
    os.environ["STA_CASES"] = "all"
    try:
        every = bench_gpu.variant_cases()
    finally:
        if old is None:
            del os.environ["STA_CASES"]
        else:
            os.environ["STA_CASES"] = old
    # hunyuan-720p-full is a WORKLOADS entry of variant_cases too
    byname = {c[0]: c for c in every}
    return [byname[n] for n in names if n in byname]


def gemm_ceiling(reps, log):
    n = 8192
    a = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device="cuda").to(torch.float8_e4m3fn).t()  # column-major
    one = torch.tensor(1.0, device="cuda")
    ms8, _ = bg.time_ms(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                                 out_dtype=torch.bfloat16), reps)
    x, y = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms16, _ = bg.time_ms(lambda: torch.mm(x, y), reps)
    r = dict(fp8_ms=ms8, fp8_tflops=2.0 * n ** 3 / ms8 / 1e9, bf16_ms=ms16,
             bf16_tflops=2.0 * n ** 3 / ms16 / 1e9)
    log("gemm %s" % json.dumps(r))
    del a, b, x, y
    torch.cuda.empty_cache()
    return r


def kernel_times(fn, reps):
    """ms per call of fn's CUDA kernels by kind: the pre-pass (fp8_src,
    fp8_stats(_v), fp8_finish, fp8_rows(_v), fp8_bias), the attention kernel,
    the rest."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = dict(prepass_ms=0.0, kernel_ms=0.0, other_ms=0.0, by_kernel={})
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0.0)
        if not us:
            continue
        names = ("fp8_src", "fp8_stats_v", "fp8_rows_v", "fp8_stats", "fp8_finish", "fp8_rows",
                 "fp8_bias", "sta_fp8_fwd")
        short = next((n for n in names if n in e.key), e.key[:40])
        key = ("prepass_ms" if short in names[:-1]
               else "kernel_ms" if short == "sta_fp8_fwd" else "other_ms")
        out[key] += us / 1e3 / reps
        out["by_kernel"][short] = out["by_kernel"].get(short, 0.0) + us / 1e3 / reps
    return out


def set_prepass(v):
    os.environ["STA_FP8_PREPASS"] = str(v)  # read by the library at each call


def bench(sta, names, reps, log, flex, prepass):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F
    flexfns = bg.flex_setup() if flex else None
    rows = []
    for case in cases(names):
        name, canvas, text, win, H, D, dt = case
        g, S, (q, k, v, o), fl = bench_gpu.variant_inputs(case)
        row = dict(name=name, S=S, heads=H, D=D, windows=win[:3] if len(win) == 3 else "per head",
                   tflop=fl / 1e12)
        ms8, ms16, msp = [], [], {x: [] for x in prepass[1:]}
        for _ in range(2):  # alternated, twice
            set_prepass(prepass[0])
            ms8.append(bg.time_ms(lambda: sta.forward(g, q, k, v, o, precision=FP8), reps)[0])
            for x in prepass[1:]:
                set_prepass(x)
                msp[x].append(bg.time_ms(lambda: sta.forward(g, q, k, v, o, precision=FP8),
                                         reps)[0])
            set_prepass(prepass[0])
            ms16.append(bg.time_ms(lambda: sta.forward(g, q, k, v, o), reps)[0])
        row.update(fp8_ms=min(ms8), fp8_ms_all=ms8, bf16_ms=min(ms16), bf16_ms_all=ms16,
                   fp8_tflops=fl / min(ms8) / 1e9, bf16_tflops=fl / min(ms16) / 1e9,
                   fp8_ms_by_prepass=dict([(str(prepass[0]), min(ms8))] +
                                          [(str(x), min(msp[x])) for x in prepass[1:]]))
        try:
            row["prepass_ms_by_prepass"], row["by_kernel_by_prepass"] = {}, {}
            for x in reversed(prepass):  # the first last: its times are the row's
                set_prepass(x)
                kt = kernel_times(lambda: sta.forward(g, q, k, v, o, precision=FP8),
                                  max(3, reps // 4))
                row["prepass_ms_by_prepass"][str(x)] = kt["prepass_ms"]
                row["by_kernel_by_prepass"][str(x)] = kt["by_kernel"]
            row.update(kt)
        except Exception as ex:
            row["profile_error"] = repr(ex)[:300]
        qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            row["dense_ms"], _ = bg.time_ms(lambda: F.scaled_dot_product_attention(qh, kh, vh),
                                            max(3, reps // 4))
        if flexfns and len(win) == 3:
            flex_c, create_block_mask = flexfns
            try:
                bm = create_block_mask(bg.flex_mask_mod(g, S), None, None, S, S, device="cuda",
                                       BLOCK_SIZE=128, _compile=True)
                qc, kc, vc = (t.contiguous() for t in (qh, kh, vh))
                flex_c(qc, kc, vc, block_mask=bm)
                row["flex_ms"], _ = bg.time_ms(lambda: flex_c(qc, kc, vc, block_mask=bm),
                                               max(3, reps // 2))
                del qc, kc, vc, bm
            except Exception as ex:
                row["flex_error"] = repr(ex)[:300]
        log("bench %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, o, qh, kh, vh
        torch.cuda.empty_cache()
    log("")
    log("kernel times per call (ms, torch.profiler), per pre-pass variant:")
    for r in rows:
        for x, bk in r.get("by_kernel_by_prepass", {}).items():
            log("  %s STA_FP8_PREPASS=%s: %s" % (r["name"], x, ", ".join(
                "%s %.3f" % kv for kv in sorted(bk.items()))))
    log("")
    log("| case | pre-pass variant | fp8 ms | pre-pass ms |")
    log("|---|---|---|---|")
    for r in rows:
        for x, ms in r["fp8_ms_by_prepass"].items():
            pp = r.get("prepass_ms_by_prepass", {}).get(x)
            log("| %s | %s | %.2f | %s |" % (r["name"], x, ms, "%.3f" % pp if pp else "n/a"))
    log("")
    log("ms: the better of two alternated runs (median of REPS each); TFLOP/s of the STA "
        "FLOPs; pre-pass and kernel: torch.profiler kernel times per call")
    log("")
    log("| case | TFLOP | fp8 ms | fp8 TFLOP/s | pre-pass ms | fp8 kernel ms | "
        "bf16 ms | bf16 TFLOP/s | fp8 vs bf16 | Flex ms | cuDNN dense ms |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda r, k: "%.2f" % r[k] if k in r else "n/a"  # noqa: E731
    for r in rows:
        log("| %s | %.2f | %.2f | %.0f | %s | %s | %.2f | %.0f | %.2fx | %s | %.1f |" % (
            r["name"], r["tflop"], r["fp8_ms"], r["fp8_tflops"], f(r, "prepass_ms"),
            f(r, "kernel_ms"), r["bf16_ms"], r["bf16_tflops"], r["bf16_ms"] / r["fp8_ms"],
            f(r, "flex_ms"), r["dense_ms"]))
    return rows


def dit_inputs(S, H, D, gen):
    """bench/fp8_sim.py's "dit" inputs, per head: K with a shared per-channel
    bias, 4 channels of it 10-30x larger (plus their token part), Q with its
    own shared bias, V with per-channel scales exp(N(0, 0.5^2)); bf16."""
    r = lambda *s: torch.randn(*s, device="cuda", generator=gen)  # noqa: E731
    bk = r(H, D)
    out = torch.stack([torch.randperm(D, device="cuda", generator=gen)[:4] for _ in range(H)])
    mag = 10 + 20 * torch.rand(H, 4, device="cuda", generator=gen)
    sign = torch.where(torch.rand(H, 4, device="cuda", generator=gen) < 0.5, -1.0, 1.0)
    bk.scatter_(1, out, mag * sign)
    q = r(1, S, H, D) + r(H, D)
    k = r(1, S, H, D) + bk
    k.scatter_add_(3, out[None, None].expand(1, S, H, 4), r(1, S, H, 4))
    v = r(1, S, H, D) * torch.exp(0.5 * r(H, D))
    return [t.to(torch.bfloat16) for t in (q, k, v)]


def accuracy(sta, log, flexfns):
    """fp8 and bf16 sta against float32 at full hunyuan-720p size."""
    flex_c, create_block_mask = flexfns
    g, S = bg.workload("hunyuan-720p")
    H, D = 24, 128
    perm = bg.tiled_perm(g, S, "cuda")
    bm = create_block_mask(bg.flex_tiled_mask_mod(g, S), None, None, S, S, device="cuda",
                           BLOCK_SIZE=128, _compile=True)
    rows = []
    for kind in ("randn", "dit"):
        gen = torch.Generator(device="cuda").manual_seed(11)
        if kind == "randn":
            q, k, v = (torch.randn(1, S, H, D, device="cuda", generator=gen).to(torch.bfloat16)
                       for _ in range(3))
        else:
            q, k, v = dit_inputs(S, H, D, gen)
        qt, kt, vt = (t[:, perm].transpose(1, 2).contiguous().float() for t in (q, k, v))
        ref = torch.empty(1, S, H, D, device="cuda")
        ref[:, perm] = flex_c(qt, kt, vt, block_mask=bm).transpose(1, 2)
        del qt, kt, vt
        row = dict(inputs=kind)
        o = torch.empty_like(q)
        for which, prec in (("fp8", FP8), ("bf16", bg.STA_PRECISION_NATIVE)):
            sta.forward(g, q, k, v, o, precision=prec)
            torch.cuda.synchronize()
            d = o.float() - ref
            cos = torch.nn.functional.cosine_similarity(o.float().flatten(), ref.flatten(), dim=0)
            row[which] = dict(rel=(d.norm() / ref.norm()).item(), cos=cos.item())
        log("accuracy %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, o, ref
        torch.cuda.empty_cache()
    log("")
    log("Against float32 (FlexAttention in float32, STA block mask, tiled order), "
        "hunyuan-720p, 24 heads, D 128, bf16 inputs; target: rel L2 <= 3e-2, cos >= 0.999:")
    log("")
    log("| inputs | fp8 rel L2 | fp8 cos | bf16 rel L2 | bf16 cos |")
    log("|---|---|---|---|---|")
    for r in rows:
        log("| %s | %.3e | %.6f | %.3e | %.6f |" % (r["inputs"], r["fp8"]["rel"], r["fp8"]["cos"],
                                                    r["bf16"]["rel"], r["bf16"]["cos"]))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(os.environ.get("BUILD", "build"), "libsta.so"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-accuracy", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--prepass", default="1,0", help="STA_FP8_PREPASS values to time")
    a = ap.parse_args()
    log = bg.file_log(a.out, "bench_fp8.log")
    sta = bg.Sta(a.lib)
    res = dict(gpu=torch.cuda.get_device_name(), sta=sta.describe, torch=torch.__version__,
               date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
               command=" ".join(sys.argv))
    log("# %s | %s | torch %s | %s" % (res["gpu"], sta.describe, torch.__version__, res["date"]))
    res["gemm"] = gemm_ceiling(a.reps, log)
    prepass = [int(x) for x in a.prepass.split(",") if x]
    res["bench"] = bench(sta, a.cases.split(","), a.reps, log, not a.no_flex, prepass)
    set_prepass(prepass[0])
    log("")
    log("fp8 GEMM ceiling (torch._scaled_mm e4m3, 8192^3): %.0f TFLOP/s; bf16 torch.mm: %.0f" %
        (res["gemm"]["fp8_tflops"], res["gemm"]["bf16_tflops"]))
    if not a.no_accuracy:
        fx = bg.flex_setup()
        if fx:
            res["accuracy"] = accuracy(sta, log, fx)
        else:
            log("accuracy: no FlexAttention in this torch")
    with open(os.path.join(a.out, "bench_fp8.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
