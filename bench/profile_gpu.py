#!/usr/bin/env python3
"""profile_gpu.py -- one warm-up and one profiled STA forward of a canonical
workload, for ncu / compute-sanitizer (the kernel of the 2nd launch).

  ncu --clock-control none -k regex:sta_fwd --launch-skip 1 --launch-count 1 \\
      python3 bench/profile_gpu.py --lib build/libsta.so [--workload hunyuan-720p]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sta_bench as bg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(os.environ.get("BUILD", "build"), "libsta.so"))
    ap.add_argument("--workload", default="hunyuan-720p")
    a = ap.parse_args()
    sta = bg.Sta(a.lib)
    name, canvas, text, win = next(w for w in bg.WORKLOADS if w[0] == a.workload)
    S = canvas[0] * canvas[1] * canvas[2] + text
    g = dict(canvas=canvas, tile=(6, 8, 8), text_len=text, windows=list(win))
    q, k, v = (torch.randn(1, S, 24, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.empty_like(q)
    for _ in range(2):
        sta.forward(g, q, k, v, o)
    torch.cuda.synchronize()
    print("profiled", name, "variant", os.environ.get("STA_CUDA_VARIANT", "0"))


if __name__ == "__main__":
    main()
