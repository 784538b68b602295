#!/usr/bin/env python3
"""bench_accuracy.py -- sta's forward error against float32 at full size, next
to what users run today on the same inputs.

Runs on the GPU machine (python3 there has torch with FlexAttention).
FlexAttention in float32 with the exact STA block mask (FastVideo's tiled
order, 128-row blocks: thirds of tiles) is the reference, itself checked
against float64 on sampled rows; sta (exact and fast softmax) and
FlexAttention bf16 with the same mask are measured against it, on randn and
on FastVideo's peaked inputs (each row a random direction with a norm from
N(0.1, 10)): rel L2, mean and max abs error.

  bench_accuracy.py [--lib build/libsta.so] [--out DIR]

STA_ACC_WORKLOADS picks the workloads (default hunyuan-720p, wan-720p).
"""
import argparse
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sta_bench import (  # noqa: E402  (the benchmarks' shared pieces)
    SOFTMAX, dense_mask, tiled_perm, flex_tiled_mask_mod, flex_setup, workload, peaked, errors,
    common_args, session, save)


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


def main():
    ap = argparse.ArgumentParser()
    common_args(ap)
    a = ap.parse_args()
    sta, log, results = session(a, "bench_accuracy")
    fx = flex_setup()
    if not fx:
        raise SystemExit("bench_accuracy.py needs torch's FlexAttention")
    accuracy_table(sta, log, results, fx)
    save(a, "bench_accuracy", results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
