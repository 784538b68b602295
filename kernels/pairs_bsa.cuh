/*
** pairs_bsa.cuh -- the paired block-sparse forward (BsaTraits<T, D, 64,
** true>; sta_cuda_set_bsa_pairs_test; mask BLOCKS, block_rows 64, TMA): a
** work item is the query blocks 2p and 2p + 1 of a (batch, head), 128 Q
** rows in shared memory, warpgroup w holding block 2p + w with its own
** online softmax; the producer walks the union of the two lists
** (bsa_pairs.cu's pre-pass: ascending, two flag bits an entry), loading
** each key block ONCE, and publishes the entry's flags with the stage's
** mask (sm.lo[stage] = lo | flags << 8, written before the full barrier's
** arrive).  A warpgroup computes the stages whose flag has its bit and
** releases the others at once; no turns (the warpgroups work on different
** rows).  Why: a 64-row key block (32 KB at D 128) served to one query
** block is the split kernel's L2 traffic per FLOP; neighbouring query
** blocks share most of their keys on VSA-like lists
** (research/bsa_groups.py: 0.61-0.63 loads a computed block).
**
** The consumer's loop keeps the split kernel's overlap (S of this block
** issued with PV of the one before, the softmax under PV), holding the
** pending block's stage; since skipped stages are released as they come,
** the producer may need that stage back before this warpgroup's next block
** arrives: when the walk reaches ST entries past the pending one, its PV is
** finished first (the flush).  No deadlock: a warpgroup waiting on entry i
** has released every entry before it but the pending one, which lies fewer
** than ST entries back, so the entry i - ST the producer waits for is free.
*/
#ifndef STA_PAIRS_BSA_CUH
#define STA_PAIRS_BSA_CUH

#include "mainloop_bsa.cuh"
#include "producer_bsa.cuh"

namespace sta {

template <class K>
__device__ __forceinline__ void bsa_produce_pairs(const BsaParams &a, const BsaSmem<K> &sm,
                                                  const int pt) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, ST = K::STAGES;
  constexpr uint32_t FULL = 0xffffffffu;
  static_assert(K::PAIRS && BK == 64 && K::QR == 128, "the paired kernel");
  if (pt >= 32) return; /* warp 0 walks, lane 0 issues */
  const int lane = pt;
  const uint64_t pol_k = l2_policy<2>(), pol_q = l2_policy<1>();
  int g = 0; /* key blocks through the ring so far (lane 0) */
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    int item = 0;
    if (lane == 0) item = a.sched ? next_item<true>(a, k) : next_item<false>(a, k);
    item = __shfl_sync(FULL, item, 0);
    if (item < 0) {
      if (lane == 0) {
        sm.sitem[0] = -1;
        mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      }
      return;
    }
    int b, h, p, part;
    bsa_item(item, a.Mp, 1, a.heads, &b, &h, &p, &part);
    const int64_t r = ((int64_t)b * a.heads + h) * a.Mp + p;
    const int n = a.ucnt[4 * r], m0 = 2 * p;
    const int c0 = a.tma_fused ? h * D : 0, c4 = a.tma_fused ? b : b * a.heads + h;
    if (lane == 0) {
      sm.sitem[0] = item;
      sm.sitem[1] = n;
      sm.sitem[2] = a.q_sizes ? a.q_sizes[m0] : a.bv;
      sm.sitem[3] = m0 + 1 < a.Mq ? (a.q_sizes ? a.q_sizes[m0 + 1] : a.bv) : -1;
      sm.sitem[4] = a.ucnt[4 * r + 1];
      sm.sitem[5] = a.ucnt[4 * r + 2];
      if (n == 0) {
        mbar_arrive(sm.qfull); /* nothing to load: no Q either */
      } else {
        /* 128 rows from block 2p's first (odd Mq: the last pair's second
        ** block lies past the rows, TMA fills zeros; nobody reads them) */
        mbar_expect_tx(sm.qfull, 128 * D * (int)sizeof(T));
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++)
          tma_load_3d<true>(sm.q + hf * 128 * 64, &a.tmq, c0 + hf * 64, m0 * a.bv, c4, sm.qfull,
                            pol_q);
      }
    }
    if (n == 0) continue;
    /* the union's entries in chunks of 32, one per lane (entry, its block's
    ** valid rows); the next chunk's reads are issued before this one's loads */
    const int32_t *lst = a.uidx + r * a.ustride;
    auto read = [&](int e, int *s) {
      const int x = lst[e];
      *s = a.kv_sizes ? a.kv_sizes[x >> 2] : a.bv;
      return x;
    };
    int sx = 0, ex = lane < n ? read(lane, &sx) : 0;
    for (int e0 = 0; e0 < n; e0 += 32) {
      const int ec_ = ex, sc = sx;
      ex = sx = 0;
      if (e0 + 32 + lane < n) ex = read(e0 + 32 + lane, &sx);
      const int ec = min(32, n - e0);
      for (int j = 0; j < ec; j++) {
        const int x = __shfl_sync(FULL, ec_, j), s = __shfl_sync(FULL, sc, j);
        if (lane == 0) {
          int r0, lo; /* sizes are 1..64 (core/mask.c): one sub-block */
          bsa_sub(s, 0, BK, &r0, &lo);
          const int st = g % ST;
          if (g >= ST) mbar_wait(&sm.kempty[st], ((g / ST) - 1) & 1);
          sm.lo[st] = lo | (x & 3) << 8;
          mbar_expect_tx(&sm.kfull[st], 2 * BK * D * (int)sizeof(T));
          T *dk = sm.k + st * BK * D, *dv = sm.v + st * BK * D;
#pragma unroll
          for (int hf = 0; hf < D / 64; hf++) {
            tma_load_4d(dk + hf * BK * 64, &a.tmk, c0 + hf * 64, r0, x >> 2, c4, &sm.kfull[st],
                        pol_k);
            tma_load_4d(dv + hf * BK * 64, &a.tmv, c0 + hf * 64, r0, x >> 2, c4, &sm.kfull[st],
                        pol_k);
          }
          g++;
        }
        __syncwarp();
      }
    }
  }
}

template <class K>
__device__ __forceinline__ void bsa_consume_pairs(const BsaParams &a, const BsaSmem<K> &sm,
                                                  const int wg, const int wq, const int lane) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, ST = K::STAGES, QR = K::QR;
  const float sl2 = a.scale_log2, th = a.rescale_th;
  const uint32_t dq0 = sdesc_lo(sm.q + wg * 64 * 64, 16); /* this warpgroup's 64 rows */
  const uint32_t dk0 = sdesc_lo(sm.k, 16), dv0 = sdesc_lo(sm.v, BK * 128);
  constexpr uint32_t SOFF = (uint32_t)((BK * D * 2) >> 4); /* one stage */
  float o[D / 2];
  float s[BK / 2];
  uint32_t pa[BK / 16][4];
  int g = 0; /* entries of the items before */
  for (int k = 0;; k++) {
    mbar_wait(sm.qfull, k & 1);
    /* warp-uniform by __shfl_sync, as mainloop_bsa.cuh's */
    const int item = __shfl_sync(0xffffffffu, sm.sitem[0], 0);
    if (item < 0) break;
    const int n = __shfl_sync(0xffffffffu, sm.sitem[1], 0), qv = sm.sitem[2 + wg],
              nb = __shfl_sync(0xffffffffu, sm.sitem[4 + wg], 0);
#pragma unroll
    for (int e = 0; e < D / 2; e++) o[e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float al[2] = {1.f, 1.f};
    if (nb == 0) mbar_arrive(sm.qempty);
    bool pend = false; /* a block's PV not yet issued: stage vs, entry vg */
    int vs = 0, vg = 0, c = 0;
    for (int i = 0; i < n; i++) {
      const int gi = g + i, st = gi % ST;
      if (pend && gi >= vg + ST) { /* the producer needs stage vs back first: the flush */
        rescale_o<D>(o, al);
        issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
        sta_wgmma::wait<0>();
        sta_wgmma::pin<D / 2>(o);
        mbar_arrive(&sm.kempty[vs]);
        pend = false;
      }
      mbar_wait(&sm.kfull[st], (gi / ST) & 1);
      const int lf = sm.lo[st];
      if (!((lf >> (8 + wg)) & 1)) { /* not this block's: released at once */
        mbar_arrive(&sm.kempty[st]);
        continue;
      }
      /* every wgmma waited for on the path that issued it (ptxas serializes
      ** wgmmas in flight across a divergent join: C7518) */
      if (pend) {
        bsa_issue_qk<T, D, QR, BK>(s, dq0, dk0 + st * SOFF);
        rescale_o<D>(o, al);
        issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
        sta_wgmma::wait<1>();
        sta_wgmma::pin<BK / 2>(s);
        if (++c == nb) mbar_arrive(sm.qempty); /* the last S is done: Q free */
        mask_lo<BK>(s, lf & 255, lane);
        softmax_block<BK>(s, m, l, al, sl2, th);
        sta_wgmma::pin<BK / 2>(s);
        sta_wgmma::wait<0>();
        sta_wgmma::pin<D / 2>(o);
        sta_wgmma::pin_r<BK / 4>(&pa[0][0]); /* live until the PV is done */
        mbar_arrive(&sm.kempty[vs]);
      } else {
        bsa_issue_qk<T, D, QR, BK>(s, dq0, dk0 + st * SOFF);
        sta_wgmma::wait<0>();
        sta_wgmma::pin<BK / 2>(s);
        if (++c == nb) mbar_arrive(sm.qempty);
        mask_lo<BK>(s, lf & 255, lane);
        softmax_block<BK>(s, m, l, al, sl2, th);
      }
      pack_p<T, BK>(s, pa);
      pend = true;
      vs = st;
      vg = gi;
    }
    if (pend) {
      rescale_o<D>(o, al);
      issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(o);
      mbar_arrive(&sm.kempty[vs]);
    }
    g += n;
    if (qv < 0) continue; /* odd Mq: no block 2p + 1 */
    bsa_out_rows<K>(
        a,
        [&](int *b, int *h, int64_t *qrow0) {
          int p, part;
          bsa_item(item, a.Mp, 1, a.heads, b, h, &p, &part);
          *qrow0 = (int64_t)(2 * p + wg) * a.bv;
        },
        0, qv, o, m, l, wq, lane);
  }
}

} /* namespace sta */

#endif
