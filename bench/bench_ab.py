#!/usr/bin/env python3
"""bench_ab.py -- kernel variants, kernel settings and libraries side by side
in one process, on the kernel work's cases (sta_bench.variant_cases).

Runs on the GPU machine (python3 there has torch); libsta.so through ctypes.

  bench_ab.py [--lib build/libsta.so] [--variants] [--ab LIB,...]
              [--set KNOB=V,...] [--variant V] [--no-tma] [--reps N] [--out DIR]

--variants kernel variants (the library's test-only setting: 0 the default,
           2 one CTA per work item, 9 the 128 x 128 kernel) on the cases
           STA_CASES names (default hunyuan-720p, wan-720p; "all": the
           section 8 workloads plus mixed per-head windows, D 64 and fp16 at
           hunyuan-720p); STA_VARIANTS picks the variants (the first is the
           reference for rel_vs_first), STA_SOFTMAX the softmax modes
           ("exact,fast").
--ab LIBS  the same cases with --lib and each library of LIBS (comma-
           separated) loaded in this one process, alternated STA_AB_ROUNDS
           times (3) per softmax mode on the same inputs: ms per library
           and round, and whether the outputs are bit-identical.
--set KNOB=V1,V2,...  the same A/B over the library's test-only kernel
           settings (variant=0,9, no_tma=0,1 or no_tma_q=0,1: the first is
           the reference), with --lib.
--variant V, --no-tma  with --ab or --set: every config runs variant V, or
           loads everything by the gather.
Neither --ab nor --set: --variants.
"""
import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    SOFTMAX, Sta, rel_err, time_ms, variant_cases, variant_inputs, softmax_modes, common_args,
    session, save)


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


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--ab", default="", help="comma-separated libraries to A/B against --lib")
    ap.add_argument("--set", default="", help="KNOB=V1,V2,...: kernel settings to A/B with --lib")
    ap.add_argument("--variant", type=int, default=0, help="the kernel variant of every A/B config")
    ap.add_argument("--no-tma", action="store_true", help="every A/B config loads by the gather")
    a = ap.parse_args()
    sta, log, results = session(a, "bench_ab")
    if a.variants or not (a.ab or a.set):
        variants(sta, a.reps, log, results)
    if a.ab or a.set:
        base = dict(variant=a.variant, no_tma=int(a.no_tma))
        ab(ab_configs(sta, a.ab, a.set, base), a.reps, log, results)
    save(a, "bench_ab", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
