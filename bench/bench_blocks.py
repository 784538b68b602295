#!/usr/bin/env python3
"""bench_blocks.py -- block-sparse attention (STA.md section 12, mask BLOCKS)
on the GPU through libsta's public API (ctypes), against FlexAttention with
the same block mask (BlockMask.from_kv_blocks) and cuDNN dense attention in
the same process.

Cases: hunyuan-720p (30x48x80 = 115,200 tokens, 24 heads, bf16) at 87.5 %
sparsity: 64-row blocks (1,800 of them, 225 key blocks per query block) and
256-row blocks (450, 57 each), D 128 and 64; lists random from a fixed seed
("random") or VSA-like ("local": the nearest cubes of a 4x4x4 / 4x8x8 cube
grid with some noise, partial border cubes and their valid sizes); an
L2-resident size (49,152 tokens, a head's K and V 25 MB) to tell the L2
from DRAM.  Times are medians of --reps (CUDA events); TFLOP/s count the
selected (query, key) pairs of valid tokens, 4 D FLOP each (backward 2.5x).
Writes bench_blocks.log and bench_blocks.json under --out.

  python3 bench/bench_blocks.py --lib build-dev/libsta.so --out $OUT
"""
import argparse
import ctypes as C
import json
import math
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sta_bench as bg  # noqa: E402  (time_ms, file_log)

STA_I32 = 4
STA_MASK_BLOCKS = 1
DT = {torch.bfloat16: 2, torch.float16: 1, torch.float32: 0, torch.int32: STA_I32}


class BlockList(C.Structure):  # core/sta.h sta_block_list
    _fields_ = [("block_rows", C.c_int32), ("num", C.c_void_p), ("idx", C.c_void_p),
                ("kv_sizes", C.c_void_p), ("q_sizes", C.c_void_p)]


class Desc(C.Structure):  # core/sta.h sta_attention_desc
    _fields_ = [("geom", bg.Geometry), ("layout", C.c_int), ("n_windows", C.c_int32),
                ("windows", C.POINTER(C.c_int32)), ("scale", C.c_float),
                ("softmax", C.c_int), ("deterministic", C.c_int32), ("precision", C.c_int),
                ("mask", C.c_int), ("blocks", C.POINTER(BlockList))]


def check_mirrors(header=os.path.join(bg.HERE, "..", "core", "sta.h")):
    """Refuse to run when sta.h's structs have other fields than these mirrors."""
    try:
        text = open(header).read()
    except OSError:
        return
    for cls, name in ((BlockList, "sta_block_list"), (Desc, "sta_attention_desc")):
        m = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), text, re.S)
        body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S) if m else ""
        fields = [re.search(r"(\w+)\s*(\[\w*\])?\s*$", d).group(1)
                  for d in body.split(";") if d.strip()]
        if fields != [f[0] for f in cls._fields_]:
            raise SystemExit("bench_blocks.py: %s mirrors %s as %s, sta.h has %s" %
                             (cls.__name__, name, [f[0] for f in cls._fields_], fields))


class Sta:
    def __init__(self, path):
        check_mirrors()
        L = self.lib = C.CDLL(os.path.abspath(path))
        L.sta_tensor_wrap.argtypes = [C.POINTER(C.c_void_p), C.c_void_p, C.c_int, C.c_int,
                                      C.c_int32, C.POINTER(C.c_int64), C.POINTER(C.c_int64)]
        L.sta_attention_forward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 5
        L.sta_attention_backward.argtypes = [C.POINTER(Desc)] + [C.c_void_p] * 9
        L.sta_tensor_destroy.argtypes = [C.c_void_p]
        L.sta_last_error.restype = C.c_char_p
        L.sta_backend_describe.restype = C.c_char_p
        L.sta_cuda_last_launch.restype = C.c_char_p
        if not L.sta_backend_available(1):
            raise SystemExit("sta: no CUDA backend: %s" % L.sta_backend_describe(1).decode())
        self.describe = L.sta_backend_describe(1).decode()

    def wrap(self, t):
        h = C.c_void_p()
        nd = t.dim()
        rc = self.lib.sta_tensor_wrap(C.byref(h), C.c_void_p(t.data_ptr()), DT[t.dtype], 1, nd,
                                      (C.c_int64 * nd)(*t.shape), (C.c_int64 * nd)(*t.stride()))
        if rc:
            raise RuntimeError("sta_tensor_wrap: " + self.lib.sta_last_error().decode())
        return h

    def call(self, fn, lists, tensors, deterministic=0):
        bl = BlockList()
        bl.block_rows = lists["bv"]
        lh = [self.wrap(lists[n]) if lists.get(n) is not None else None
              for n in ("num", "idx", "kv_sizes", "q_sizes")]
        bl.num, bl.idx, bl.kv_sizes, bl.q_sizes = lh
        d = Desc()
        d.layout = 0  # BSHD
        d.mask = STA_MASK_BLOCKS
        d.blocks = C.pointer(bl)
        d.deterministic = deterministic
        hs = [self.wrap(t) for t in tensors]
        rc = fn(C.byref(d), *hs)
        for h in hs + lh:
            if h is not None:
                self.lib.sta_tensor_destroy(h)
        if rc:
            raise RuntimeError(self.lib.sta_last_error().decode())

    def forward(self, lists, q, k, v, o, lse):
        self.call(self.lib.sta_attention_forward, lists, (q, k, v, o, lse))

    def backward(self, lists, q, k, v, o, lse, do, dq, dk, dv, det=0):
        self.call(self.lib.sta_attention_backward, lists, (q, k, v, o, lse, do, dq, dk, dv), det)


# ---- lists ------------------------------------------------------------------

def cube_grid(canvas, cube):
    return [-(-c // e) for c, e in zip(canvas, cube)]


def cube_sizes(canvas, cube):
    """Valid tokens of each cube of the padded cube grid, in cube order."""
    g = cube_grid(canvas, cube)
    ext = [torch.tensor([min(e, c - i * e) for i in range(n)]) for c, e, n in zip(canvas, cube, g)]
    return (ext[0][:, None, None] * ext[1][None, :, None] * ext[2][None, None, :]).reshape(-1)


def make_lists(kind, H, M, topk, seed, grid=None, bv=64, sizes=None):
    """idx [1, H, M, topk] int32 (distinct per row), num [1, H, M]."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "random":
        score = torch.rand(1, H, M, M, generator=gen, device="cuda")
    else:  # local: minus the distance between cube centres, plus noise
        t, h, w = torch.meshgrid(*[torch.arange(n, device="cuda") for n in grid], indexing="ij")
        c = torch.stack([t.reshape(-1), h.reshape(-1), w.reshape(-1)], 1).float()
        dist = torch.cdist(c, c)
        score = -dist[None, None] + 2.0 * torch.rand(1, H, M, M, generator=gen, device="cuda")
    idx = torch.topk(score, topk, dim=-1).indices.to(torch.int32).contiguous()
    num = torch.full((1, H, M), topk, dtype=torch.int32, device="cuda")
    del score
    lists = dict(bv=bv, num=num, idx=idx, kv_sizes=sizes, q_sizes=None)
    return lists


def selected_pairs(lists, H, M):
    bv, idx = lists["bv"], lists["idx"].long()
    ks = lists["kv_sizes"]
    if ks is None:
        return float(H) * M * idx.shape[-1] * bv * bv
    ksz = ks.double()
    qsz = ksz  # q_sizes: kv_sizes (Mq == Mk)
    per_row = ksz[idx].sum(-1)  # [1, H, M]
    return float((per_row * qsz[None, None, :]).sum().item())


# ---- FlexAttention with the same blocks ---------------------------------------

def flex_block_mask(lists, H, M, S):
    from torch.nn.attention.flex_attention import BlockMask
    bv, idx = lists["bv"], lists["idx"].long()
    ks = lists["kv_sizes"]
    topk = idx.shape[-1]
    if ks is None:  # every block whole: all "full", no mask_mod needed
        full_n = torch.full((1, H, M), topk, dtype=torch.int32, device="cuda")
        full_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
        full_i[..., :topk] = idx.to(torch.int32)
        part_n = torch.zeros(1, H, M, dtype=torch.int32, device="cuda")
        part_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
        return BlockMask.from_kv_blocks(part_n, part_i, full_n, full_i, BLOCK_SIZE=bv,
                                        seq_lengths=(S, S))
    whole = (ks == bv)[idx]  # [1, H, M, topk]
    qwhole = (ks == bv)[None, None, :].expand(1, H, M)
    whole = whole & qwhole[..., None]
    # stable order: whole first, then partial, by a sort on ~whole
    order = torch.sort((~whole).to(torch.int8), dim=-1, stable=True).indices
    srt = torch.gather(idx, -1, order).to(torch.int32)
    nfull = whole.sum(-1).to(torch.int32)
    full_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
    part_i = torch.zeros(1, H, M, M, dtype=torch.int32, device="cuda")
    full_i[..., :topk] = srt
    # the partial ones start at nfull in srt: shift them to the front
    ar = torch.arange(topk, device="cuda")[None, None, None, :]
    src = (ar + nfull[..., None]).clamp(max=topk - 1)
    part_i[..., :topk] = torch.gather(srt, -1, src.long())
    part_n = (topk - nfull).to(torch.int32)
    kvs = ks.to(torch.int64)

    def mask_mod(b, h, q_idx, kv_idx):
        return ((kv_idx % bv) < kvs[kv_idx // bv]) & ((q_idx % bv) < kvs[q_idx // bv])
    return BlockMask.from_kv_blocks(part_n, part_i, nfull, full_i, BLOCK_SIZE=bv,
                                    mask_mod=mask_mod, seq_lengths=(S, S))


# ---- the run ----------------------------------------------------------------

CASES = [  # name, canvas or tokens, cube, bv, heads, D, lists, sparsity
    ("hunyuan-720p bv64 random", 115200, None, 64, 24, 128, "random", 0.875),
    ("hunyuan-720p bv256 random", 115200, None, 256, 24, 128, "random", 0.875),
    ("hunyuan-720p bv64 local", (30, 48, 80), (4, 4, 4), 64, 24, 128, "local", 0.875),
    ("hunyuan-720p bv256 local", (30, 48, 80), (4, 8, 8), 256, 24, 128, "local", 0.875),
    ("hunyuan-720p bv64 random D64", 115200, None, 64, 24, 64, "random", 0.875),
    ("hunyuan-720p bv256 random D64", 115200, None, 256, 24, 64, "random", 0.875),
    ("l2-resident bv64 random", 49152, None, 64, 24, 128, "random", 0.875),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libsta.so")
    ap.add_argument("--out", default="bench-out")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--cases", default="", help="comma-separated substrings of case names")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--no-bwd", action="store_true")
    ap.add_argument("--budget", type=float, default=330.0, help="seconds; peers stop past it")
    a = ap.parse_args()
    log = bg.file_log(a.out, "bench_blocks.log")
    t_start = time.time()
    sta = Sta(a.lib)
    log("# %s; torch %s; %s" % (sta.describe, torch.__version__, torch.cuda.get_device_name()))
    # the L2: a copy that stays in it, read + write bytes
    x = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms, _ = bg.time_ms(lambda: [y.copy_(x) for _ in range(20)], 5)
    log("# L2-resident copy (16 MB, read + write): %.0f GB/s" % (2 * 20 * x.numel() / ms / 1e6))
    del x, y
    want = [s for s in a.cases.split(",") if s]
    rows = []
    for name, tok, cube, bv, H, D, kind, sp in CASES:
        if want and not any(w in name for w in want):
            continue
        row = dict(name=name, bv=bv, heads=H, D=D, lists=kind, sparsity=sp)
        if isinstance(tok, tuple):
            grid = cube_grid(tok, cube)
            M = grid[0] * grid[1] * grid[2]
            sizes = cube_sizes(tok, cube).to(torch.int32).cuda()
        else:
            M, grid, sizes = tok // bv, None, None
        S = M * bv
        topk = math.ceil((1 - sp) * M)
        row.update(S=S, blocks=M, topk=topk)
        lists = make_lists(kind, H, M, topk, 1234, grid, bv, sizes)
        pairs = selected_pairs(lists, H, M)
        fl = 4.0 * D * pairs
        row["fwd_tflop"] = fl / 1e12
        gen = torch.Generator(device="cuda").manual_seed(7)
        q, k, v, do = (torch.randn(1, S, H, D, generator=gen, device="cuda", dtype=torch.bfloat16)
                       for _ in range(4))
        o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
        lse = torch.empty(1, H, S, device="cuda")
        try:
            sta.forward(lists, q, k, v, o, lse)
            row["launch"] = sta.lib.sta_cuda_last_launch().decode()
            row["sta_fwd_ms"], ts = bg.time_ms(lambda: sta.forward(lists, q, k, v, o, lse), a.reps)
            row["sta_fwd_spread_ms"] = [min(ts), max(ts)]
            row["sta_fwd_tflops"] = fl / row["sta_fwd_ms"] / 1e9
        except Exception as ex:
            row["sta_fwd_error"] = repr(ex)[:300]
        if not a.no_bwd and "sta_fwd_ms" in row:
            try:
                sta.backward(lists, q, k, v, o, lse, do, dq, dk, dv)
                row["sta_bwd_ms"], _ = bg.time_ms(
                    lambda: sta.backward(lists, q, k, v, o, lse, do, dq, dk, dv), a.reps)
                row["sta_bwd_tflops"] = 2.5 * fl / row["sta_bwd_ms"] / 1e9
            except Exception as ex:
                row["sta_bwd_error"] = repr(ex)[:300]
        if not a.no_flex and time.time() - t_start < a.budget:
            try:
                from torch.nn.attention.flex_attention import flex_attention
                import torch._dynamo
                for knob in ("cache_size_limit", "recompile_limit"):
                    if hasattr(torch._dynamo.config, knob):
                        setattr(torch._dynamo.config, knob, 256)
                flex_c = torch.compile(flex_attention, dynamic=False)
                t0 = time.time()
                bm = flex_block_mask(lists, H, M, S)
                qh, kh, vh = (t.transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
                doh = do.transpose(1, 2).contiguous()
                opts = {"BLOCK_M": 64, "BLOCK_N": 64} if bv == 64 else None

                def flex_f():
                    with torch.no_grad():
                        flex_c(qh, kh, vh, block_mask=bm, kernel_options=opts)
                flex_f()
                torch.cuda.synchronize()
                row["flex_setup_s"] = time.time() - t0
                row["flex_fwd_ms"], _ = bg.time_ms(flex_f, max(3, a.reps // 2))
                row["flex_fwd_tflops"] = fl / row["flex_fwd_ms"] / 1e9
                if "sta_fwd_ms" in row:  # the same function: Flex's out against sta's
                    with torch.no_grad():
                        fo = flex_c(qh, kh, vh, block_mask=bm, kernel_options=opts)
                    row["sta_vs_flex_rel"], _ = bg.rel_err(o.transpose(1, 2), fo)
                if not a.no_bwd and time.time() - t_start < a.budget:
                    def flex_fb():
                        flex_c(qh, kh, vh, block_mask=bm, kernel_options=opts).backward(doh)
                    flex_fb()
                    row["flex_fwdbwd_ms"], _ = bg.time_ms(flex_fb, max(3, a.reps // 2))
                    row["flex_bwd_ms"] = row["flex_fwdbwd_ms"] - row["flex_fwd_ms"]
                    row["flex_bwd_tflops"] = 2.5 * fl / row["flex_bwd_ms"] / 1e9
                del qh, kh, vh, doh, bm
            except Exception as ex:
                row["flex_error"] = repr(ex)[:300]
        if "l2" not in name and time.time() - t_start < a.budget:
            try:  # cuDNN dense, forward only (the reference line)
                import torch.nn.functional as F
                from torch.nn.attention import SDPBackend, sdpa_kernel
                qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))

                def dense_f():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.no_grad():
                        F.scaled_dot_product_attention(qh, kh, vh)
                row["dense_fwd_ms"], _ = bg.time_ms(dense_f, 3)
            except Exception as ex:
                row["dense_error"] = repr(ex)[:300]
        log("blocks %s" % json.dumps(row))
        rows.append(row)
        del q, k, v, do, o, dq, dk, dv, lse, lists
        torch.cuda.empty_cache()

    def f(r, key, fmt):
        return fmt % r[key] if key in r else "-"
    log("")
    log("| case | TFLOP | sta fwd ms | TFLOP/s | Flex fwd ms | TFLOP/s | vs Flex | sta bwd ms | "
        "TFLOP/s | Flex bwd ms | vs Flex | cuDNN dense fwd ms |")
    log("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        vs = "%.2fx" % (r["flex_fwd_ms"] / r["sta_fwd_ms"]) if "flex_fwd_ms" in r and "sta_fwd_ms" in r else "-"
        vb = "%.2fx" % (r["flex_bwd_ms"] / r["sta_bwd_ms"]) if "flex_bwd_ms" in r and "sta_bwd_ms" in r else "-"
        log("| %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            r["name"], r["fwd_tflop"], f(r, "sta_fwd_ms", "%.2f"), f(r, "sta_fwd_tflops", "%.0f"),
            f(r, "flex_fwd_ms", "%.2f"), f(r, "flex_fwd_tflops", "%.0f"), vs,
            f(r, "sta_bwd_ms", "%.2f"), f(r, "sta_bwd_tflops", "%.0f"), f(r, "flex_bwd_ms", "%.2f"),
            vb, f(r, "dense_fwd_ms", "%.1f")))
        for key in ("sta_fwd_error", "sta_bwd_error", "flex_error", "dense_error"):
            if key in r:
                log("  %s: %s" % (key, r[key]))
    with open(os.path.join(a.out, "bench_blocks.json"), "w") as fjs:
        json.dump(rows, fjs, indent=1)


if __name__ == "__main__":
    main()
