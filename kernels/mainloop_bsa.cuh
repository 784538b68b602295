/*
** mainloop_bsa.cuh -- the block-sparse forward's consumer warpgroups and
** their output.  The loop is the STA kernels' (mainloop_fwd.cuh): S(i+1)
** and PV(i) issued together, the softmax of S(i+1) (softmax.cuh) while
** PV(i) runs, the two warpgroups taking turns to issue (named barriers 4
** and 5).  What differs: a warpgroup's blocks are every block of the item
** (BK 128) or every other one (BK 64: the split kernel, bsa_traits.cuh);
** the item's block count comes from the producer (0 is allowed: an empty
** list or no valid query row); the mask is the first lo columns of a block
** (bsa_walk.h); the split kernel merges its two partial results at the
** end (bsa_merge_store).
*/
#ifndef STA_MAINLOOP_BSA_CUH
#define STA_MAINLOOP_BSA_CUH

#include "bsa_params.h"
#include "bsa_traits.cuh"
#include "bsa_walk.h"
#include "mainloop_fwd.cuh" /* issue_pv */
#include "softmax.cuh"

namespace sta {

/* S = Q K^T of this warpgroup's 64 rows against BK keys, issued and
** committed.  Q's 64-column halves are QR rows apart, K's BK. */
template <typename T, int D, int QR, int BK>
__device__ __forceinline__ void bsa_issue_qk(float *s, uint32_t qlo, uint32_t klo) {
  sta_wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
    const uint32_t qo = (uint32_t)((((ks >> 2) * QR * 128) + (ks & 3) * 32) >> 4);
    const uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
    if constexpr (BK == 64)
      WgOps64<T>::s64(s, sdesc_of(qlo + qo), sdesc_of(klo + ko), ks > 0);
    else
      WgOps<T, D>::qk(s, sdesc_of(qlo + qo), sdesc_of(klo + ko), ks > 0);
  }
  sta_wgmma::commit();
}

/* S of a 64 x BK block: -inf in the first lo columns (bsa_walk.h). */
template <int BK>
__device__ __forceinline__ void mask_lo(float *s, int lo, int lane) {
  if (lo == 0) return;
#pragma unroll
  for (int j = 0; j < BK / 8; j++) {
    const int col = j * 8 + 2 * (lane & 3);
    if (col < lo) s[4 * j] = s[4 * j + 2] = -INFINITY;
    if (col + 1 < lo) s[4 * j + 1] = s[4 * j + 3] = -INFINITY;
  }
}

/* The issue turns of one item (named barriers 4: warpgroup 0's turn, 5:
** warpgroup 1's): both warpgroups take T turns, alternating, warpgroup 0
** first (warpgroup 1 lets it go at the item's start); a warpgroup with
** fewer blocks (the split kernel, an odd count) takes empty turns at the
** end. */
struct BsaTurns {
  int t, n, wg;
  __device__ __forceinline__ void take() const { bar_named(4 + wg, 256); }
  __device__ __forceinline__ void pass() {
    ++t;
    if (wg == 0 || t < n) bar_arrive_named(5 - wg, 256); /* 1's last turn ends the item */
  }
  __device__ __forceinline__ void finish() {
    while (t < n) {
      take();
      pass();
    }
  }
};

/* Element offset of query row qrow of (b, h) in the output. */
__device__ __forceinline__ int64_t bsa_out_off(const BsaParams &a, int b, int h, int64_t qrow) {
  return (int64_t)b * a.o_sb + (int64_t)h * a.o_sh + qrow * a.o_ss;
}

/* Store columns [8 J0, 8 J1) of this thread's two rows (item rows r[hr]),
** o scaled by inv[hr]; rows at or past qv (padding) get zeros; lse when
** asked (lane & 3 == 0). */
template <typename T, int D, int J0, int J1>
__device__ __forceinline__ void bsa_store(const BsaParams &a, int b, int h, int64_t qrow0,
                                          const int *r, int qv, const float *o, const float *inv,
                                          const float *lse, bool write_lse, int lane) {
  const uint64_t pol = l2_policy<1>();
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const bool ok = r[hr] < qv;
    T *dst = reinterpret_cast<T *>(a.o) + bsa_out_off(a, b, h, qrow0 + r[hr]) + 2 * (lane & 3);
#pragma unroll
    for (int j = J0; j < J1; j++) {
      const uint32_t v =
          ok ? Mma<T>::pack(o[4 * j + 2 * hr] * inv[hr], o[4 * j + 2 * hr + 1] * inv[hr]) : 0u;
      if (a.vec) {
        st_global_hint(dst + 8 * j, v, pol);
      } else {
        uint16_t *d16 = reinterpret_cast<uint16_t *>(dst + 8 * j);
        d16[0] = (uint16_t)(v & 0xffff);
        d16[1] = (uint16_t)(v >> 16);
      }
    }
    if (write_lse && a.lse && (lane & 3) == 0)
      a.lse[(int64_t)b * a.lse_sb + (int64_t)h * a.lse_sh + (qrow0 + r[hr]) * a.lse_ss] =
          ok ? lse[hr] : -INFINITY;
  }
}

/* The split kernel's output: both warpgroups hold the same 64 rows (thread
** t of each the same rows and columns) with their own (m, l, O); merged
** through shared memory, warpgroup 0 storing columns [0, D/2) and 1 the
** rest.  Named barrier 7 (both warpgroups). */
template <class K>
__device__ __forceinline__ void bsa_merge_store(const BsaParams &a, const BsaSmem<K> &sm,
                                                int item, int qv, float *o, const float *m,
                                                const float *l, int wg, int wq, int lane) {
  using T = typename K::T;
  constexpr int D = K::D, H = D / 4; /* a half's registers */
  const int t = wq * 32 + lane;
  const int r[2] = {wq * 16 + (lane >> 2), wq * 16 + (lane >> 2) + 8};
  float lr[2];
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    lr[hr] = l[hr];
    lr[hr] += __shfl_xor_sync(0xffffffffu, lr[hr], 1);
    lr[hr] += __shfl_xor_sync(0xffffffffu, lr[hr], 2);
    if ((lane & 3) == 0) {
      sm.ml[(wg * 64 + r[hr]) * 2] = m[hr];
      sm.ml[(wg * 64 + r[hr]) * 2 + 1] = lr[hr];
    }
  }
  if (wg == 1) {
#pragma unroll
    for (int e = 0; e < H; e++) sm.x[e * 128 + t] = o[e];
  }
  bar_named(7, 256);
  float ss[2], so[2], inv[2], lse[2];
  const float ln2 = 0.69314718055994530942f;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const float mo = sm.ml[((wg ^ 1) * 64 + r[hr]) * 2], lo = sm.ml[((wg ^ 1) * 64 + r[hr]) * 2 + 1];
    const float mx = fmaxf(m[hr], mo);
    ss[hr] = mx == -INFINITY ? 0.f : ex2(m[hr] - mx);
    so[hr] = mx == -INFINITY ? 0.f : ex2(mo - mx);
    const float sum = lr[hr] * ss[hr] + lo * so[hr];
    /* a NaN sum stays NaN in out and lse, as in epilogue_fwd.cuh */
    inv[hr] = sum > 0.f ? 1.f / sum : sum == 0.f ? 0.f : sum;
    lse[hr] = sum == 0.f ? -INFINITY : (mx + log2f(sum)) * ln2;
  }
  int b, h, mb, part;
  bsa_item(item, a.Mq, a.parts, a.heads, &b, &h, &mb, &part);
  const int64_t qrow0 = (int64_t)mb * a.bv;
  if (wg == 0) {
#pragma unroll
    for (int e = 0; e < H; e++) {
      const int hr = (e >> 1) & 1;
      o[e] = o[e] * ss[hr] + sm.x[e * 128 + t] * so[hr];
    }
    bsa_store<T, D, 0, D / 16>(a, b, h, qrow0, r, qv, o, inv, lse, true, lane);
#pragma unroll
    for (int e = 0; e < H; e++) sm.x[e * 128 + t] = o[H + e];
  }
  bar_named(7, 256);
  if (wg == 1) {
#pragma unroll
    for (int e = 0; e < H; e++) {
      const int hr = (e >> 1) & 1;
      o[H + e] = o[H + e] * ss[hr] + sm.x[e * 128 + t] * so[hr];
    }
    bsa_store<T, D, D / 16, D / 8>(a, b, h, qrow0, r, qv, o, inv, lse, false, lane);
  }
}

/* A warpgroup's own 64 rows of output: rows r0 + [0, 64) of the item's,
** qv of them valid; where(&b, &h, &qrow0) names the (batch, head) and the
** query row they start at, called after the row sums (the order the shared
** kernel's store had before the paired kernel shared it: its machine code
** stays the same). */
template <class K, class Where>
__device__ __forceinline__ void bsa_out_rows(const BsaParams &a, Where where, int r0, int qv,
                                             const float *o, const float *m, const float *l,
                                             int wq, int lane) {
  using T = typename K::T;
  constexpr int D = K::D;
  const int r[2] = {r0 + wq * 16 + (lane >> 2), r0 + wq * 16 + (lane >> 2) + 8};
  float inv[2], lse[2];
  const float ln2 = 0.69314718055994530942f;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float sum = l[hr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[hr] = sum > 0.f ? 1.f / sum : sum == 0.f ? 0.f : sum; /* NaN stays NaN */
    lse[hr] = sum == 0.f ? -INFINITY : (m[hr] + log2f(sum)) * ln2;
  }
  int b, h;
  int64_t qrow0;
  where(&b, &h, &qrow0);
  bsa_store<T, D, 0, D / 8>(a, b, h, qrow0, r, qv, o, inv, lse, true, lane);
}

/* The shared kernel's output: each warpgroup its own 64 rows. */
template <class K>
__device__ __forceinline__ void bsa_store_rows(const BsaParams &a, int item, int qv,
                                               const float *o, const float *m, const float *l,
                                               int wg, int wq, int lane) {
  bsa_out_rows<K>(
      a,
      [&](int *b, int *h, int64_t *qrow0) {
        int mb, part;
        bsa_item(item, a.Mq, a.parts, a.heads, b, h, &mb, &part);
        *qrow0 = (int64_t)mb * a.bv + (int64_t)part * K::QR;
      },
      wg * 64, qv, o, m, l, wq, lane);
}

template <class K>
__device__ __forceinline__ void bsa_consume(const BsaParams &a, const BsaSmem<K> &sm,
                                            const int wg, const int wq, const int lane) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, ST = K::STAGES, QR = K::QR;
  constexpr bool SPLIT = K::SPLIT;
  constexpr int STEP = SPLIT ? 2 : 1; /* a warpgroup's blocks: every STEP-th */
  const float sl2 = a.scale_log2, th = a.rescale_th;
  const uint32_t dq0 = sdesc_lo(SPLIT ? sm.q : sm.q + wg * 64 * 64, 16);
  const uint32_t dk0 = sdesc_lo(sm.k, 16), dv0 = sdesc_lo(sm.v, BK * 128);
  constexpr uint32_t SOFF = (uint32_t)((BK * D * 2) >> 4); /* one stage */
  float o[D / 2];
  float s[BK / 2];
  uint32_t pa[BK / 16][4];
  int g = 0; /* blocks of the items before */
  for (int k = 0;; k++) {
    mbar_wait(sm.qfull, k & 1);
    /* the item and its block count by __shfl_sync, values ptxas knows to
    ** be warp-uniform (as the window forward's: 2-7 % faster than loaded
    ** per thread, BENCHMARKS.md's ledger) */
    const int item = __shfl_sync(0xffffffffu, sm.sitem[0], 0);
    if (item < 0) break;
    const int n = __shfl_sync(0xffffffffu, sm.sitem[1], 0), qv = sm.sitem[2];
    const int nb = SPLIT ? (n + 1 - wg) >> 1 : n; /* this warpgroup's blocks */
    BsaTurns tn;
    tn.t = 0;
    tn.n = n > 0 ? (SPLIT ? (n + 1) >> 1 : n) + 1 : 0;
    tn.wg = wg;
#pragma unroll
    for (int e = 0; e < D / 2; e++) o[e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float al[2];
    if (n > 0 && wg == 1) bar_arrive_named(4, 256); /* warpgroup 0 goes first */
    if (nb == 0) {
      mbar_arrive(sm.qempty);
    } else {
      int gi = g + (SPLIT ? wg : 0); /* this block's place in the ring */
      mbar_wait(&sm.kfull[gi % ST], (gi / ST) & 1);
      int lo = sm.lo[gi % ST];
      tn.take();
      bsa_issue_qk<T, D, QR, BK>(s, dq0, dk0 + (gi % ST) * SOFF);
      tn.pass();
      sta_wgmma::wait<0>();
      sta_wgmma::pin<BK / 2>(s);
      if (nb == 1) mbar_arrive(sm.qempty); /* Q free */
      mask_lo<BK>(s, lo, lane);
      softmax_block<BK>(s, m, l, al, sl2, th);
      pack_p<T, BK>(s, pa);
      for (int j = 0; j + 1 < nb; j++, gi += STEP) {
        const int gn = gi + STEP, kn = gn % ST, vs = gi % ST;
        mbar_wait(&sm.kfull[kn], (gn / ST) & 1);
        lo = sm.lo[kn];
        tn.take();
        bsa_issue_qk<T, D, QR, BK>(s, dq0, dk0 + kn * SOFF);
        rescale_o<D>(o, al);
        issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
        tn.pass();
        sta_wgmma::wait<1>();
        sta_wgmma::pin<BK / 2>(s);
        if (j + 2 == nb) mbar_arrive(sm.qempty); /* the last S is done: Q free */
        mask_lo<BK>(s, lo, lane);
        softmax_block<BK>(s, m, l, al, sl2, th);
        sta_wgmma::pin<BK / 2>(s);
        sta_wgmma::wait<0>();
        sta_wgmma::pin<D / 2>(o);
        sta_wgmma::pin_r<BK / 4>(&pa[0][0]); /* live until PV(j) is done */
        mbar_arrive(&sm.kempty[vs]);
        pack_p<T, BK>(s, pa);
      }
      const int vs = gi % ST;
      rescale_o<D>(o, al);
      tn.take();
      issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
      tn.pass();
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(o);
      mbar_arrive(&sm.kempty[vs]);
    }
    tn.finish();
    g += n;
    if constexpr (SPLIT)
      bsa_merge_store<K>(a, sm, item, qv, o, m, l, wg, wq, lane);
    else
      bsa_store_rows<K>(a, item, qv, o, m, l, wg, wq, lane);
  }
}

} /* namespace sta */

#endif
