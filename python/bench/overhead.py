#!/usr/bin/env python3
"""overhead.py -- what sta.attention costs over calling libsta's C API directly.

  python3 python/bench/overhead.py [--device cuda|cpu] [--reps N] [--calls N]
                                   [--shapes hunyuan-720p,small] [--paths ...]
                                   [--out DIR]

For each shape, the same forward up to five ways, on the same inputs:
  direct     sta_attention_forward through ctypes on tensors wrapped once,
             one descriptor built once: the least any caller pays;
  eager      sta.attention(q, k, v, ...) with no gradient (the inference path);
  grad       sta.attention on inputs that require grad (the training
             forward: the custom op with autograd on torch >= 2.4, else
             torch.autograd.Function; the backward is not run);
  op         torch.ops.sta.attention (the custom op: dispatcher, the path of
             torch.compile; torch >= 2.4);
  graph      sta.attention captured in a CUDA graph and replayed (cuda only).
The shape "tiny" (one 1x2x2 tile, D 64) does almost no work: on the cpu its
us/call is the host cost of issuing a call (OMP_NUM_THREADS=1 python3
python/bench/overhead.py --device cpu --shapes tiny; one thread keeps
OpenMP's wake-ups out of it).
Columns: host us/call (the CPU time to issue one call, calls back to back,
no synchronisation: the per-call overhead) and us/call end to end (calls
issued back to back, then one synchronisation, divided by the calls; the
median of --reps, the paths alternated within each repetition), and the end-to-end overhead against direct.  Targets:
within 2 % at hunyuan-720p, under 20 us per call at the small
shape.  Prints a table; writes overhead.json to --out.
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import sta  # noqa: E402
from sta import _capi, _op  # noqa: E402

SHAPES = {  # name: canvas, tile, text, heads, D, window
    "hunyuan-720p": ((30, 48, 80), (6, 8, 8), 256, 24, 128, (3, 3, 3)),
    "small": ((6, 8, 8), (6, 8, 8), 0, 2, 64, (1, 1, 1)),
    "medium": ((12, 16, 16), (6, 8, 8), 16, 8, 128, (1, 1, 1)),
    "tiny": ((1, 2, 2), (1, 2, 2), 0, 1, 64, (1, 1, 1)),
}
PATHS = ("direct", "eager", "grad", "op", "graph")


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def measure(fns, calls, reps, device):
    """{label: (median host us/call, median end-to-end us/call)}: the paths
    alternated within each repetition (the same clock and temperature
    drift for each), after 3 warm-up calls of each."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    sync(device)
    host = {k: [] for k in fns}
    e2e = {k: [] for k in fns}
    for _ in range(reps):
        for label, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            t1 = time.perf_counter()
            sync(device)
            t2 = time.perf_counter()
            host[label].append((t1 - t0) / calls * 1e6)
            e2e[label].append((t2 - t0) / calls * 1e6)
    return {k: (statistics.median(host[k]), statistics.median(e2e[k])) for k in fns}


def run_shape(name, device, dtype, calls, reps, paths):
    canvas, tile, text, H, D, window = SHAPES[name]
    S = canvas[0] * canvas[1] * canvas[2] + text
    q, k, v = (torch.randn(1, S, H, D, device=device).to(dtype) for _ in range(3))
    args = dict(canvas=canvas, window=window, tile=tile, text_len=text)
    L = _capi.lib()
    spec = _op._spec("attention", canvas=canvas, window=window, tile=tile, text_len=text)[0]
    desc = _op._desc(spec)
    out = torch.empty_like(q)
    hs = [_op._wrap(L, t) for t in (q, k, v, out)]  # its own: the op's cache evicts
    fwd = L.sta_attention_forward
    if device == "cuda":
        L.sta_cuda_set_stream(torch.cuda.current_stream().cuda_stream)

    def direct():
        rc = fwd(desc, hs[0], hs[1], hs[2], hs[3], None)
        if rc:
            raise L.error(rc)

    def eager():
        sta.attention(q, k, v, **args)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def grad():
        sta.attention(qg, kg, vg, **args)

    fns = {"direct": direct, "eager": eager, "grad": grad}
    if _op.CUSTOM_OP:
        op_args = (*spec, 0)  # the Spec's fields, then no lse
        op_fn = torch.ops.sta.attention.default

        def op():
            op_fn(q, k, v, *op_args)
        fns["op"] = op
    if device == "cuda" and "graph" in paths:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            eager()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            eager()
        fns["graph"] = graph.replay
        L.sta_cuda_set_stream(torch.cuda.current_stream().cuda_stream)
    order = [p for p in ["direct"] + [p for p in paths if p != "direct"] if p in fns]
    n = max(1, calls if name != "hunyuan-720p" else min(calls, 20))
    res = measure({label: fns[label] for label in order}, n, reps, device)
    base = res["direct"][1]
    rows = []
    for label in order:
        host, e2e = res[label]
        rows.append(dict(shape=name, path=label, host_us=host, e2e_us=e2e,
                         overhead_us=e2e - base, overhead_pct=100 * (e2e - base) / base))
    for h in hs:
        L.sta_tensor_destroy(h)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="hunyuan-720p,small")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--paths", default=",".join(PATHS),
                    help="of %s (direct always runs: the baseline)" % ",".join(PATHS))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    print("sta %s (%s), torch %s, %s, custom op: %s" % (
        sta.version(), sta.library_path(), torch.__version__,
        torch.cuda.get_device_name() if a.device == "cuda" else "cpu", _op.CUSTOM_OP))
    rows = []
    print("%-14s %-7s %12s %12s %12s %9s" % ("shape", "path", "host us/call", "us/call",
                                             "overhead us", "overhead"))
    for p in a.paths.split(","):
        if p not in PATHS:
            ap.error("--paths: %r is not one of %s" % (p, ",".join(PATHS)))
    for name in a.shapes.split(","):
        if name not in SHAPES:
            ap.error("--shapes: %r is not one of %s" % (name, ",".join(SHAPES)))
        if a.device == "cpu" and name == "hunyuan-720p":
            print("%-14s (skipped on the cpu: seconds per call)" % name)
            continue
        for r in run_shape(name, a.device, dtype, a.calls, a.reps, a.paths.split(",")):
            rows.append(r)
            print("%-14s %-7s %12.1f %12.1f %12.1f %8.2f%%" % (
                r["shape"], r["path"], r["host_us"], r["e2e_us"], r["overhead_us"],
                r["overhead_pct"]))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "overhead.json"), "w") as f:
            json.dump(dict(device=a.device, torch=torch.__version__, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
