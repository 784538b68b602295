#!/usr/bin/env python3
"""bench_backward.py -- sta's CUDA backward against what a user would
otherwise run, in one process on the GPU machine (python3 there has torch).

libsta.so is called through ctypes on its public API (sta.h): torch tensors
are wrapped as sta device tensors and sta_attention_forward /
sta_attention_backward run on them.  FlexAttention (STA block mask on
FastVideo's tiled order, its fastest form) and cuDNN dense SDPA run through
torch autograd on the same inputs; their backward time is the median of
forward+backward minus the median of the forward.

  bench_backward.py [--lib build/libsta.so] [--reps N] [--accuracy]
                    [--deterministic] [--no-peers] [--workloads a,b] [--out DIR]

--accuracy  at hunyuan-720p: sta's and Flex bf16's dq, dk, dv against Flex in
            float32 (the reference), rel L2 and max abs, on randn inputs.
--deterministic  also time the deterministic mode (bit-identical gradients).
--no-peers  sta only (no FlexAttention, no cuDNN).
"""
import argparse
import ctypes as C
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sta_bench as bg  # noqa: E402  (mask helpers, flops, timing)

STA_BF16, STA_F16, STA_CUDA, STA_BSHD = 2, 1, 1, 0
DT = {torch.bfloat16: STA_BF16, torch.float16: STA_F16}


class Pool:
    """The device's default memory pool (libcuda), where sta's stream-ordered
    workspace (cudaMallocAsync) lives: its high watermark of used bytes is
    the backward's peak memory beyond the inputs and gradients."""
    USED_MEM_HIGH = 8  # CU_MEMPOOL_ATTR_USED_MEM_HIGH

    def __init__(self):
        self.cu, self.pool = None, C.c_void_p()
        try:
            cu = C.CDLL("libcuda.so.1")
            if cu.cuDeviceGetDefaultMemPool(C.byref(self.pool), torch.cuda.current_device()) == 0:
                self.cu = cu
        except (OSError, RuntimeError, AssertionError):
            pass

    def reset_peak(self):
        if self.cu:
            z = C.c_uint64(0)
            self.cu.cuMemPoolSetAttribute(self.pool, self.USED_MEM_HIGH, C.byref(z))

    def peak(self):
        x = C.c_uint64(0)
        if not self.cu or self.cu.cuMemPoolGetAttribute(self.pool, self.USED_MEM_HIGH, C.byref(x)):
            return float("nan")
        return x.value


POOL = None  # made by run(), on the device

Desc = bg.Desc  # the checked mirrors of sta.h's structs (sta_bench.check_mirrors)


class Sta:
    def __init__(self, path):
        bg.check_mirrors()
        L = self.lib = C.CDLL(path)
        L.sta_tensor_wrap.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_int, C.c_int,
                                      C.c_int32, C.POINTER(C.c_int64), C.POINTER(C.c_int64)]
        L.sta_attention_forward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 5
        L.sta_attention_backward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 9
        L.sta_tensor_destroy.argtypes = [C.c_void_p]
        L.sta_last_error.restype = C.c_char_p
        L.sta_backend_describe.restype = C.c_char_p
        if not L.sta_backend_available(STA_CUDA):
            raise SystemExit("sta: no CUDA backend: %s" % L.sta_backend_describe(STA_CUDA).decode())
        self.describe = L.sta_backend_describe(STA_CUDA).decode()

    def wrap(self, t):
        h = C.c_void_p()
        nd = t.dim()
        rc = self.lib.sta_tensor_wrap(C.byref(h), C.c_void_p(t.data_ptr()),
                                      DT.get(t.dtype, 0), STA_CUDA, nd,
                                      (C.c_int64 * nd)(*t.shape), (C.c_int64 * nd)(*t.stride()))
        if rc:
            raise RuntimeError("sta_tensor_wrap: " + self.lib.sta_last_error().decode())
        return h

    def desc(self, g, deterministic=0):
        w = (C.c_int32 * len(g["windows"]))(*g["windows"])
        d = Desc()
        d.geom.canvas[:] = list(g["canvas"])
        d.geom.tile[:] = list(g["tile"])
        d.geom.text_len = g["text_len"]
        d.layout = STA_BSHD
        d.n_windows = len(g["windows"]) // 3
        d.windows = C.cast(w, C.POINTER(C.c_int32))
        d.deterministic = deterministic
        return d, w

    def call(self, fn, g, tensors, **kw):
        d, keep = self.desc(g, **kw)
        hs = [self.wrap(t) for t in tensors]
        rc = fn(C.byref(d), *hs)
        for h in hs:
            self.lib.sta_tensor_destroy(h)
        if rc:
            raise RuntimeError(self.lib.sta_last_error().decode())

    def forward(self, g, q, k, v, o, lse):
        self.call(self.lib.sta_attention_forward, g, (q, k, v, o, lse))

    def backward(self, g, q, k, v, o, lse, do, dq, dk, dv, deterministic=0):
        self.call(self.lib.sta_attention_backward, g, (q, k, v, o, lse, do, dq, dk, dv),
                  deterministic=deterministic)


WORKLOADS = [  # name, canvas, text, heads, D, windows (one, or one per head)
    ("hunyuan-720p", (30, 48, 80), 256, 24, 128, [3, 3, 3]),
    ("wan-720p", (18, 48, 80), 0, 24, 128, [3, 3, 5]),
    ("stepvideo", (36, 48, 48), 0, 24, 128, [3, 3, 3]),
    ("hunyuan-720p D64", (30, 48, 80), 256, 24, 64, [3, 3, 3]),
    ("hunyuan-720p mixed", (30, 48, 80), 256, 24, 128,
     sum(([3, 3, 3], [1, 5, 7], [3, 1, 10 - 1], [5, 6, 10]) * 6, [])),
    ("hunyuan-720p full", (30, 48, 80), 256, 24, 128, [5, 6, 10]),
]


def inputs(S, H, D, dt, seed):
    torch.manual_seed(seed)
    return [torch.randn(1, S, H, D, device="cuda", dtype=dt) for _ in range(4)]


def run(sta, reps, log, only, accuracy, det=False, peers=True):
    global POOL
    POOL = Pool()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch._dynamo
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    flex_c = torch.compile(flex_attention, dynamic=False)
    rows = []
    for name, canvas, text, H, D, win in WORKLOADS:
        if only and name not in only:
            continue
        V = canvas[0] * canvas[1] * canvas[2]
        S = V + text
        g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=list(win))
        q, k, v, do = inputs(S, H, D, torch.bfloat16, 1)
        o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
        lse = torch.empty(1, H, S, device="cuda")
        gg = dict(g, windows=win[:3]) if len(win) == 3 else g
        fl = bg.flops(gg, S, H, D) if len(win) == 3 else sum(
            bg.flops(dict(g, windows=win[3 * h:3 * h + 3]), S, 1, D) for h in range(H))
        sta.forward(g, q, k, v, o, lse)
        fwd_ms, _ = bg.time_ms(lambda: sta.forward(g, q, k, v, o, lse), reps)
        POOL.reset_peak()
        bwd_ms, ts = bg.time_ms(lambda: sta.backward(g, q, k, v, o, lse, do, dq, dk, dv), reps)
        ws_measured = POOL.peak()
        row = dict(name=name, S=S, heads=H, D=D, windows=win if len(win) == 3 else "per head",
                   fwd_tflop=fl / 1e12, bwd_tflop=2.5 * fl / 1e12, sta_fwd_ms=fwd_ms,
                   sta_bwd_ms=bwd_ms, sta_bwd_tflops=2.5 * fl / bwd_ms / 1e9,
                   sta_bwd_spread_ms=[min(ts), max(ts)],
                   workspace_mib=(S * H * (D + 1) * 4) / 2**20,
                   workspace_measured_mib=ws_measured / 2**20)
        if det:
            row["sta_bwd_det_ms"], _ = bg.time_ms(
                lambda: sta.backward(g, q, k, v, o, lse, do, dq, dk, dv, 1), reps)
        # cuDNN dense (the full window's natural comparison)
        if peers:
            try:
                qh, kh, vh = (t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v))
                doh = do.transpose(1, 2)

                def dense_fb():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        F.scaled_dot_product_attention(qh, kh, vh).backward(doh)

                def dense_f():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                        F.scaled_dot_product_attention(qh, kh, vh)
                n = max(3, reps // 4)
                row["dense_fwdbwd_ms"], _ = bg.time_ms(dense_fb, n)
                row["dense_fwd_ms"], _ = bg.time_ms(dense_f, n)
                row["dense_bwd_ms"] = row["dense_fwdbwd_ms"] - row["dense_fwd_ms"]
                del qh, kh, vh
            except Exception as ex:
                row["dense_error"] = repr(ex)[:300]
        # FlexAttention on the tiled order (one window for all heads only)
        if len(win) == 3 and peers:
            try:
                t0 = time.time()
                perm = bg.tiled_perm(g, S, q.device)
                qc, kc, vc = (t[:, perm].transpose(1, 2).contiguous().requires_grad_()
                              for t in (q, k, v))
                doc = do[:, perm].transpose(1, 2).contiguous()
                bm = create_block_mask(bg.flex_tiled_mask_mod(g, S), None, None, S, S,
                                       device="cuda", BLOCK_SIZE=128, _compile=True)
                flex_c(qc, kc, vc, block_mask=bm).backward(doc)
                torch.cuda.synchronize()
                row["flex_setup_s"] = time.time() - t0

                def flex_fb():
                    flex_c(qc, kc, vc, block_mask=bm).backward(doc)

                def flex_f():
                    with torch.no_grad():
                        flex_c(qc, kc, vc, block_mask=bm)
                n = max(3, reps // 2)
                row["flex_fwdbwd_ms"], _ = bg.time_ms(flex_fb, n)
                row["flex_fwd_ms"], _ = bg.time_ms(flex_f, n)
                row["flex_bwd_ms"] = row["flex_fwdbwd_ms"] - row["flex_fwd_ms"]
                if accuracy and name == "hunyuan-720p":
                    row.update(accuracy_vs_f32(sta, g, q, k, v, do, o, lse, dq, dk, dv, perm, bm,
                                               flex_c))
                del qc, kc, vc, doc, bm, perm
            except Exception as ex:
                row["flex_error"] = repr(ex)[:300]
        log("backward %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, do, o, dq, dk, dv, lse
        torch.cuda.empty_cache()
    log("")
    log("| workload | bwd TFLOP | sta bwd ms | sta TFLOP/s | deterministic ms | Flex bwd ms | "
        "vs Flex | cuDNN dense bwd ms | vs dense | sta fwd ms | workspace MiB (peak measured) |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda r, k, fmt: fmt % r[k] if k in r else "n/a"  # noqa: E731
    for r in rows:
        log("| %s | %.2f | %.2f | %.0f | %s | %s | %s | %s | %s | %.2f | %.0f (%.0f) |" % (
            r["name"], r["bwd_tflop"], r["sta_bwd_ms"], r["sta_bwd_tflops"],
            f(r, "sta_bwd_det_ms", "%.2f"), f(r, "flex_bwd_ms", "%.2f"),
            "%.2fx" % (r["flex_bwd_ms"] / r["sta_bwd_ms"]) if "flex_bwd_ms" in r else "n/a",
            f(r, "dense_bwd_ms", "%.1f"),
            "%.1fx" % (r["dense_bwd_ms"] / r["sta_bwd_ms"]) if "dense_bwd_ms" in r else "n/a",
            r["sta_fwd_ms"], r["workspace_mib"], r["workspace_measured_mib"]))
    return rows


def accuracy_vs_f32(sta, g, q, k, v, do, o, lse, dq, dk, dv, perm, bm, flex_c):
    """dq, dk, dv of sta (bf16) and Flex (bf16) against Flex in float32."""
    out = {}
    sta.forward(g, q, k, v, o, lse)
    sta.backward(g, q, k, v, o, lse, do, dq, dk, dv)
    ref, fb = {}, {}
    for dt, dst in ((torch.float32, ref), (torch.bfloat16, fb)):
        qc, kc, vc = (t[:, perm].transpose(1, 2).to(dt).contiguous().requires_grad_()
                      for t in (q, k, v))
        doc = do[:, perm].transpose(1, 2).to(dt).contiguous()
        flex_c(qc, kc, vc, block_mask=bm).backward(doc)
        for n, t in (("dq", qc), ("dk", kc), ("dv", vc)):
            u = torch.empty_like(q, dtype=torch.float32)
            u[:, perm] = t.grad.transpose(1, 2).float()
            dst[n] = u
        del qc, kc, vc, doc
    for n, t in (("dq", dq), ("dk", dk), ("dv", dv)):
        out["sta_%s_rel_vs_f32" % n], out["sta_%s_max_vs_f32" % n] = bg.rel_err(t, ref[n])
        out["flex_%s_rel_vs_f32" % n], out["flex_%s_max_vs_f32" % n] = bg.rel_err(fb[n], ref[n])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libsta.so")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--accuracy", action="store_true")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--workloads", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    sta = Sta(a.lib)
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)
    log("# sta backward benchmark: %s, torch %s, %s" % (
        sta.describe, torch.__version__, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    only = set(a.workloads.split(",")) if a.workloads else None
    rows = run(sta, a.reps, log, only, a.accuracy, a.deterministic, not a.no_peers)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "bench_backward.json"), "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(a.out, "bench_backward.log"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
