#!/usr/bin/env python3
"""bwd_cols_check.py -- the index arithmetic of the backward's dQ at D 64
(kernels/kernel_bwd.cuh: dQ split by columns between the two consumer
warpgroups, 32 columns each over all 128 keys, B from a K^T copy) checked
without a GPU.

A model of shared memory and of how wgmma reads a 128-byte-swizzled
operand through its descriptor (K-major: element (mn, k) at start + (mn %
8) 128 + (mn / 8) SBO + 2 k; MN-major: start + (k % 8) 128 + (k / 8) SBO +
2 mn; then bits 4-6 of the address XOR bits 7-9) is first checked on
GEMMs that run correctly on the device (S^T = K Q^T at D 64 and 128, the
K-major 32-byte steps inside a swizzle row and the column halves; dQ = dS
K at D 128 from dS^T and K, both MN-major).  The same model then runs the
D 64 dQ with the kernel's index expressions: K^T built from the swizzled
K tile, dQ's 32 columns per warpgroup from K^T (K-major, N = 32, 4 KB and
8 KB row offsets, 32-byte steps), the accumulator fragments staged by
dq_off<32>, the bulk reduce-add of each 64 x 32 block at its place, and
post's and prep's reads and zeroing of the accumulator: dq must equal dS K
for every (query, column), prep must zero each f32 of a slot once, and the
staging stores must be free of bank conflicts.  Integer inputs: every sum
is exact.

  python3 research/bwd_cols_check.py [--seed S]
"""
import argparse
import random
import sys

BK, BQ, SBO = 128, 64, 1024


def swz(r, ch, R):
    """mma.cuh's swz: element offset of (row r, 16-byte chunk ch), R rows."""
    return ((ch >> 3) * R + r) * 64 + (((ch & 7) ^ (r & 7)) << 3)


def dq_off(r, c, W=64):
    """bwd_slots.cuh's dq_off<W>."""
    return r * W + ((((c >> 3) ^ (r & (W // 8 - 1)))) << 3) + (c & 7)


def smem_layout(D, ns=2):
    """kernel_bwd.cuh's Smem<D> (byte offsets; ns: bwd_params.h's STAGES)."""
    W = D // 2  # dq_w
    L = {"K": 0}
    L["V"] = L["K"] + BK * D * 2
    L["KT"] = L["V"] + BK * D * 2
    L["Q"] = L["KT"] + (D * BK * 2 if D == 64 else 0)
    L["DO"] = L["Q"] + ns * BQ * D * 2
    L["DS"] = L["DO"] + ns * BQ * D * 2
    L["DQ"] = L["DS"] + 2 * BK * BQ * 2
    L["LSE"] = L["DQ"] + 4 * 64 * W * 4
    L["DD"] = L["LSE"] + ns * BQ * 4
    L["BAR"] = L["DD"] + ns * BQ * 4
    L["KROW"] = L["BAR"] + 2 * ns * 8
    L["SLOT"] = L["KROW"] + BK * 4
    L["BYTES"] = L["SLOT"] + (ns + 1) * 4 + 1024
    return L


class Smem:
    """16-bit elements by byte address (the operand tiles)."""

    def __init__(self):
        self.m = {}

    def put(self, tile_byte, elem_off, val):
        self.m[tile_byte + 2 * elem_off] = val

    def get(self, byte):
        if byte not in self.m:
            raise AssertionError("wgmma read of unwritten shared memory at %d" % byte)
        return self.m[byte]


def sdesc_lo(byte):
    return (byte & 0x3FFFF) >> 4  # the LBO field is never read here


def gmma_addr(lo, mn, k, major):
    start = (lo & 0x3FFF) << 4
    if major == "K":
        a = start + (mn % 8) * 128 + (mn // 8) * SBO + 2 * k
        assert (start & 127) + 2 * k < 128, "a K step leaves its swizzle row"
    else:
        assert mn < 64, "MN beyond one swizzle atom"
        a = start + (k % 8) * 128 + (k // 8) * SBO + 2 * mn
        assert (start & 127) + 2 * mn < 128
    return a ^ (((a >> 7) & 7) << 4)


def wgmma(acc, sm, a_lo, a_major, b_lo, b_major, N, scale_d):
    """m64nNk16: acc[m][n] (+)= sum_k A(m, k) B(n, k)."""
    for m in range(64):
        arow = [sm.get(gmma_addr(a_lo, m, k, a_major)) for k in range(16)]
        for n in range(N):
            s = sum(arow[k] * sm.get(gmma_addr(b_lo, n, k, b_major)) for k in range(16))
            acc[m][n] = (acc[m][n] if scale_d else 0) + s


def rnd_mat(rng, r, c):
    return [[rng.randint(-3, 3) for _ in range(c)] for _ in range(r)]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def run(seed):
    rng = random.Random(seed)
    # ---- the model on what the device already runs correctly ------------
    for D in (64, 128):
        L = smem_layout(D)
        sm = Smem()
        K, Q = rnd_mat(rng, BK, D), rnd_mat(rng, BQ, D)
        dST = rnd_mat(rng, BK, BQ)  # dS^T: keys x queries
        for r in range(BK):
            for d in range(D):
                sm.put(L["K"], swz(r, d >> 3, BK) + (d & 7), K[r][d])
            for c in range(BQ):
                sm.put(L["DS"], swz(r, c >> 3, BK) + (c & 7), dST[r][c])
        for r in range(BQ):
            for d in range(D):
                sm.put(L["Q"], swz(r, d >> 3, BQ) + (d & 7), Q[r][d])
        for wg in range(2):
            # S^T = K Q^T (kernel_bwd.cuh: dK0 + ko, dQs + qo)
            s = [[0] * 64 for _ in range(64)]
            dK0, dQs = sdesc_lo(L["K"] + 2 * wg * 64 * 64), sdesc_lo(L["Q"])
            for ks in range(D // 16):
                ko = (((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4
                qo = (((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4
                wgmma(s, sm, dK0 + ko, "K", dQs + qo, "K", 64, ks > 0)
            for i in range(64):
                for j in range(64):
                    check(s[i][j] == sum(K[64 * wg + i][d] * Q[j][d] for d in range(D)),
                          "model: S^T at D %d" % D)
            if D == 64:
                continue
            # dQ = dS K at D 128 (MN-major A and B, N = 64)
            dq = [[0] * 64 for _ in range(64)]
            dSt, dKq = sdesc_lo(L["DS"]), sdesc_lo(L["K"] + 2 * wg * BK * 64)
            for kk in range(BK // 16):
                wgmma(dq, sm, dSt + ((kk * 16 * 128) >> 4), "MN", dKq + ((kk * 16 * 128) >> 4),
                      "MN", 64, kk > 0)
            for q in range(64):
                for j, d in enumerate(range(64 * wg, 64 * wg + 64)):
                    check(dq[q][j] == sum(dST[key][q] * K[key][d] for key in range(BK)),
                          "model: dQ at D 128")
    print("the wgmma operand model reproduces the kernels' S^T (D 64, 128) and dQ at D 128")

    # ---- dQ at D 64: by columns, from K^T -----------------------------------
    D, W = 64, 32
    L = smem_layout(D)
    for key in ("K", "V", "KT", "Q", "DO", "DS", "DQ"):
        check(L[key] % 1024 == 0, "%s not 1024-aligned" % key)
    check(L["LSE"] % 16 == 0 and L["DD"] % 16 == 0 and L["BAR"] % 8 == 0, "alignment")
    check(L["BYTES"] <= 232448, "shared memory %d > 227 KB" % L["BYTES"])
    print("Smem<64>: %d bytes (%.1f KB)" % (L["BYTES"], L["BYTES"] / 1024))
    sm = Smem()
    K, dST = rnd_mat(rng, BK, D), rnd_mat(rng, BK, BQ)
    k16 = {}
    for r in range(BK):
        for d in range(D):
            k16[swz(r, d >> 3, BK) + (d & 7)] = K[r][d]
        for c in range(BQ):
            sm.put(L["DS"], swz(r, c >> 3, BK) + (c & 7), dST[r][c])
    # K^T, as the kernel's loop builds it (NTH threads, 16-byte chunks)
    seen = set()
    for tid in range(384):
        for c in range(tid, D * (BK // 8), 384):
            d, kc = c // (BK // 8), c - (c // (BK // 8)) * (BK // 8)
            dst = swz(d, kc, D)
            check(dst % 8 == 0 and dst not in seen, "K^T chunk written twice / unaligned")
            seen.add(dst)
            for e in range(8):
                sm.put(L["KT"], dst + e, k16[swz(8 * kc + e, d >> 3, BK) + (d & 7)])
    check(len(seen) == D * BK // 8, "K^T not covered")
    dQ = [[sum(dST[key][q] * K[key][d] for key in range(BK)) for d in range(D)]
          for q in range(BQ)]
    # the accumulator of 3 slots, zeroed by prep (sbh = 1 is the block added)
    nslot, sbh = 3, 1
    acc = [None] * (nslot * 64 * D)
    for i in range(nslot * 64):
        rr, s_bh = i % BQ, i // BQ
        for t in range(D // 8):
            c = t * 8
            off = (s_bh * (D // W) + (c >> 5)) * 64 * W + dq_off(rr, c & (W - 1), W)
            for e in range(8):
                check(acc[off + e] is None, "prep zeroes an f32 twice")
                acc[off + e] = 0
    check(all(x == 0 for x in acc), "prep leaves an f32 of the accumulator")
    for wg in range(2):
        dq = [[0] * W for _ in range(64)]
        dSt = sdesc_lo(L["DS"])
        dKq = sdesc_lo(L["KT"] + 2 * wg * 32 * 64)
        for kk in range(BK // 16):
            wgmma(dq, sm, dSt + ((kk * 16 * 128) >> 4), "MN",
                  dKq + ((((kk >> 2) * D * 128) + (kk & 3) * 32) >> 4), "K", W, kk > 0)
        # fragments (thread = wq, lane) -> staging, by dq_off<32>
        stage = [None] * (64 * W)
        for wq in range(4):
            for hr in range(2):
                for j in range(W // 8):
                    banks = [set(), set()]
                    for lane in range(32):
                        r, c = wq * 16 + (lane >> 2) + 8 * hr, 8 * j + 2 * (lane & 3)
                        o = dq_off(r, c, W)
                        for e in range(2):
                            check(stage[o + e] is None, "staging f32 written twice")
                            stage[o + e] = dq[r][c + e]  # dq[4j + 2hr + e] of the thread
                            banks[lane >> 4].add((o + e) % 32)
                    check(len(banks[0]) == 32 and len(banks[1]) == 32,
                          "bank conflict in the staging stores")
        check(None not in stage, "staging block not covered")
        blk = sbh * (D // W) + wg  # (bh * nqb + slot) * (D / W) + wg
        for i in range(64 * W):  # the bulk reduce-add: 64 x W floats, linear
            acc[blk * 64 * W + i] += stage[i]
    # post: slot row rr, 8 columns from c
    for rr in range(BQ):
        for c in range(0, D, 8):
            off = (sbh * (D // W) + (c >> 5)) * 64 * W + dq_off(rr, c & (W - 1), W)
            for e in range(8):
                check(acc[off + e] == dQ[rr][c + e], "dq (%d, %d) wrong" % (rr, c + e))
    others = [x for i, x in enumerate(acc) if not (sbh * 64 * D <= i < (sbh + 1) * 64 * D)]
    check(all(x == 0 for x in others), "an add outside its slot's block")
    print("D 64: K^T, dQ's column halves from it, the staging (conflict-free), the bulk "
          "adds and post give dq = dS K exactly; prep zeroes each f32 of a slot once")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    try:
        run(a.seed)
    except AssertionError as ex:
        print("FAILED: %s" % ex)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
