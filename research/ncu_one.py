#!/usr/bin/env python3
"""ncu_one.py -- one STA forward or backward call at a named workload, for
profilers (ncu -k regex:sta_ -c 1 python3 research/ncu_one.py ...), plus two
small timing modes.

  ncu_one.py --lib LIB --what fwd|bwd
             [--workload hunyuan-720p|full|wan-720p|d64] [--softmax exact|fast]
             [--calls N] [--ab LIB2] [--pool-ab N] [--fp8]

--ab LIB2: time --calls calls of LIB and LIB2 alternated, 3 rounds each
(median per round, ms), and the largest relative difference of their
outputs (out, or dq, dk, dv).
--pool-ab N: N calls per round, 2 rounds each, of the device's default
memory pool as is and with its release threshold at the maximum (libcuda).
--fp8: the forward in STA_PRECISION_FP8 (its ~1 GB operand workspace comes
from that pool on every call).
"""
import argparse
import ctypes as C
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import sta_bench as bg  # noqa: E402

WORKLOADS = {  # canvas, text, heads, D, window
    "hunyuan-720p": ((30, 48, 80), 256, 24, 128, (3, 3, 3)),
    "full": ((30, 48, 80), 256, 24, 128, (5, 6, 10)),
    "wan-720p": ((21, 48, 80), 512, 24, 128, (3, 6, 10)),
    "d64": ((30, 48, 80), 256, 24, 64, (3, 3, 3)),
}


class Runner:
    """One library: forward and backward on fixed tensors."""

    def __init__(self, path, a, t):
        bg.check_mirrors()
        self.L = L = C.CDLL(os.path.abspath(path))
        L.sta_tensor_wrap.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_int, C.c_int,
                                      C.c_int32, C.POINTER(C.c_int64), C.POINTER(C.c_int64)]
        L.sta_tensor_destroy.argtypes = [C.c_void_p]
        L.sta_last_error.restype = C.c_char_p
        canvas, text, H, D, win = WORKLOADS[a.workload]
        self.w = (C.c_int32 * 3)(*win)
        d = self.d = bg.Desc()
        d.geom.canvas[:] = list(canvas)
        d.geom.tile[:] = [6, 8, 8]
        d.geom.text_len = text
        d.n_windows = 1
        d.windows = C.cast(self.w, C.POINTER(C.c_int32))
        d.softmax = 1 if a.softmax == "fast" else 0
        d.precision = bg.STA_PRECISION_FP8 if a.fp8 else bg.STA_PRECISION_NATIVE
        self.t = t

    def _call(self, fn, ts):
        L = self.L
        hs = []
        for x in ts:
            h = C.c_void_p()
            if L.sta_tensor_wrap(C.byref(h), C.c_void_p(x.data_ptr()),
                                 2 if x.dtype == torch.bfloat16 else 0, 1, x.dim(),
                                 (C.c_int64 * x.dim())(*x.shape), (C.c_int64 * x.dim())(*x.stride())):
                raise SystemExit("sta_tensor_wrap: " + L.sta_last_error().decode())
            hs.append(h)
        rc = fn(C.byref(self.d), *hs)
        for h in hs:
            L.sta_tensor_destroy(h)
        if rc:
            raise SystemExit(L.sta_last_error().decode())

    def fwd(self):
        t = self.t
        self._call(self.L.sta_attention_forward, (t["q"], t["k"], t["v"], t["o"], t["lse"]))

    def bwd(self):
        t = self.t
        self._call(self.L.sta_attention_backward, tuple(t[n] for n in (
            "q", "k", "v", "o", "lse", "do", "dq", "dk", "dv")))


def pool_ab(a, fn):
    cu = C.CDLL("libcuda.so.1")
    pool = C.c_void_p()
    if cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0):
        raise SystemExit("cuDeviceGetDefaultMemPool failed")

    def set_th(v):
        x = C.c_uint64(v)
        if cu.cuMemPoolSetAttribute(pool, 4, C.byref(x)):  # RELEASE_THRESHOLD
            raise SystemExit("cuMemPoolSetAttribute failed")
    res = {"default": [], "keep": []}
    for _ in range(2):
        for mode in ("default", "keep"):
            set_th(0 if mode == "default" else 2**64 - 1)
            if mode == "default":
                cu.cuMemPoolTrimTo(pool, C.c_size_t(0))
            res[mode].append(round(bg.time_ms(fn, a.pool_ab)[0], 3))
    set_th(0)
    print("pool_ab %s %s: ms per call, 2 rounds: threshold 0 (default) %s, max %s" %
          (a.what, a.workload, res["default"], res["keep"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--what", default="fwd", choices=("fwd", "bwd"))
    ap.add_argument("--workload", default="hunyuan-720p", choices=sorted(WORKLOADS))
    ap.add_argument("--softmax", default="exact", choices=("exact", "fast"))
    ap.add_argument("--calls", type=int, default=2)
    ap.add_argument("--ab", default="")
    ap.add_argument("--pool-ab", type=int, default=0)
    ap.add_argument("--fp8", action="store_true")
    a = ap.parse_args()
    canvas, text, H, D, win = WORKLOADS[a.workload]
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda: torch.randn(1, S, H, D, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    t = dict(q=mk(), k=mk(), v=mk(), do=mk())
    for n in ("o", "dq", "dk", "dv"):
        t[n] = torch.empty_like(t["q"])
    t["lse"] = torch.empty(1, H, S, device="cuda", dtype=torch.float32)
    r = Runner(a.lib, a, t)
    r.fwd()  # the backward's out and lse
    step = r.fwd if a.what == "fwd" else r.bwd
    if a.pool_ab:
        pool_ab(a, step)
        return
    if a.ab:
        r2 = Runner(a.ab, a, t)
        outs = ("o",) if a.what == "fwd" else ("dq", "dk", "dv")
        step()
        ref = [t[n].clone() for n in outs]
        (r2.fwd if a.what == "fwd" else r2.bwd)()
        diff = max(bg.rel_err(t[n], x)[0] for n, x in zip(outs, ref))
        res = {a.lib: [], a.ab: []}
        for _ in range(3):
            for lib, f in ((a.lib, step), (a.ab, r2.fwd if a.what == "fwd" else r2.bwd)):
                res[lib].append(round(bg.time_ms(f, max(a.calls, 3))[0], 3))
        print("ab %s %s %s: %s %s | %s %s | rel diff %.2e" % (
            a.what, a.workload, a.softmax, a.lib, res[a.lib], a.ab, res[a.ab], diff))
        return
    for _ in range(a.calls):
        step()
    torch.cuda.synchronize()
    print("ncu_one: %s %s %s x%d: out %.4g" % (a.what, a.workload, a.softmax, a.calls,
                                               float(t["o"].float().abs().mean())))


if __name__ == "__main__":
    main()
