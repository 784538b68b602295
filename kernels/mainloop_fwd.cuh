/*
** mainloop_fwd.cuh -- the forward's consumer warpgroups: for each work
** item, S = Q K^T and O += P V over its key blocks with the online softmax
** (softmax.cuh), the two GEMMs of consecutive blocks overlapped and the
** warpgroups taking turns, then the output (epilogue_fwd.cuh).
*/
#ifndef STA_MAINLOOP_FWD_CUH
#define STA_MAINLOOP_FWD_CUH

#include "epilogue_fwd.cuh"
#include "kernel_traits.cuh"
#include "softmax.cuh"

namespace sta {

/* S = Q K^T for this warpgroup's 64 rows (qlo: their first row), issued
** and committed, not waited for.  Q's 64-column halves are 128 rows apart
** (D 128 runs 128-row items; D 64 has one half), K's BK rows. */
template <typename T, int D, int BK>
__device__ __forceinline__ void issue_qk(float *s, uint32_t qlo, uint32_t klo) {
  sta_wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
    uint32_t qo = (uint32_t)((((ks >> 2) * 128 * 128) + (ks & 3) * 32) >> 4);
    uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
    if constexpr (BK == 192)
      WgOps<T, D>::qk192(s, sdesc_of(qlo + qo), sdesc_of(klo + ko), ks > 0);
    else
      WgOps<T, D>::qk(s, sdesc_of(qlo + qo), sdesc_of(klo + ko), ks > 0);
  }
  sta_wgmma::commit();
}

/* O += P V, issued and committed, not waited for. */
template <typename T, int D, int BK>
__device__ __forceinline__ void issue_pv(float *o, uint32_t (*pa)[4],
                                         uint32_t vlo) {
  sta_wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++)
    WgOps<T, D>::pv(o, pa[kk], sdesc_of(vlo + (uint32_t)((kk * 16 * 128) >> 4)));
  sta_wgmma::commit();
}

/* The consumer warpgroups' loop: for each item, S = Q K^T and O += P V over
** its key blocks with the online softmax, then the output (store_o).  S(i+1)
** and PV(i) are issued together; the softmax of S(i+1) runs while PV(i) is
** still on the tensor cores.  The warpgroups take turns issuing (named
** barriers 4, 5, 6: a ping-pong), so one's softmax runs under the others'
** GEMMs.  Blocks without keys are computed too (all -inf: P = 0), to keep
** the loop free of branches around the wgmmas.  Q is released once this
** warpgroup's last S is done; K (split rings) once S has read it, V once
** PV has. */
template <class K>
__device__ __forceinline__ void consume(const FwdParams &a, const FwdSmem<K> &sm, const int wg,
                                        const int wq, const int lane) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, STAGES = K::STAGES, NWG = K::NWG;
  const float sl2 = a.scale_log2, th = a.rescale_th;
  const uint32_t dq0 = sdesc_lo(sm.q + wg * 64 * 64, 16);
  const uint32_t dk0 = sdesc_lo(sm.k, 16);
  const uint32_t dv0 = sdesc_lo(sm.v, BK * 128);
  constexpr uint32_t SOFF = (uint32_t)((BK * D * 2) >> 4); /* one stage */
  float o[D / 2];
  float s[BK / 2];
  uint32_t pa[BK / 16][4];
  int g = 0;
  for (int k = 0;; k++) {
    mbar_wait(sm.qfull, k & 1);
    /* the item and its block count by __shfl_sync, values ptxas knows to
    ** be warp-uniform, so that the step loop's ring index and wgmma
    ** descriptors stay off the vector registers (2-4 % faster than loaded
    ** per thread, BENCHMARKS.md's ledger) */
    const int item = __shfl_sync(0xffffffffu, *sm.sitem, 0);
    if (item < 0) break;
    KeyPlan p;
    {
      Item x;
      decode_item<K::BR, BK>(a, item, x);
      if (x.qcount <= 0) {
        mbar_arrive(sm.qempty);
        continue;
      }
      p = x.p;
    }
    p.nkb = __shfl_sync(0xffffffffu, p.nkb, 0);
#pragma unroll
    for (int e = 0; e < D / 2; e++) o[e] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    float al[2];
    if (wg == NWG - 1) bar_arrive_named(4, 256); /* WG 0 goes first */
    mbar_wait(&sm.kfull[g % STAGES], (g / STAGES) & 1);
    BlkInfo b0;
    /* split rings: K's stage (and its block info) is released before the mask */
    if constexpr (K::SPLIT) b0 = get_binfo(&sm.binfo[g % STAGES]);
    bar_named(4 + wg, 256);
    issue_qk<T, D, BK>(s, dq0, dk0 + (g % STAGES) * SOFF);
    bar_arrive_named(wg + 1 == NWG ? 4 : 5 + wg, 256);
    sta_wgmma::wait<0>();
    sta_wgmma::pin<BK / 2>(s);
    if constexpr (K::SPLIT) mbar_arrive(&sm.kempty[g % STAGES]);
    if (p.nkb == 1) mbar_arrive(sm.qempty); /* Q free (see below) */
    if constexpr (!K::SPLIT) b0 = get_binfo(&sm.binfo[g % STAGES]);
    mask_block<BK>(s, b0, a, lane);
    softmax_block<BK>(s, m, l, al, sl2, th);
    pack_p<T, BK>(s, pa);
    int i = 0;
    for (; i + 1 < p.nkb; i++) {
      const int vs = (g + i) % STAGES, gn = g + i + 1, kn = gn % STAGES;
      mbar_wait(&sm.kfull[kn], (gn / STAGES) & 1);
      const BlkInfo bn = get_binfo(&sm.binfo[kn]);
      if constexpr (K::SPLIT) mbar_wait(&sm.vfull[vs], ((g + i) / STAGES) & 1);
      bar_named(4 + wg, 256);
      issue_qk<T, D, BK>(s, dq0, dk0 + kn * SOFF);
      rescale_o<D>(o, al);
      issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
      bar_arrive_named(wg + 1 == NWG ? 4 : 5 + wg, 256);
      sta_wgmma::wait<1>();
      sta_wgmma::pin<BK / 2>(s);
      if constexpr (K::SPLIT) mbar_arrive(&sm.kempty[kn]); /* K(i + 1) read */
      if (i + 2 == p.nkb) mbar_arrive(sm.qempty); /* the last S is done: Q free */
      mask_block<BK>(s, bn, a, lane);
      softmax_block<BK>(s, m, l, al, sl2, th);
      sta_wgmma::pin<BK / 2>(s);
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(o);
      sta_wgmma::pin_r<BK / 4>(&pa[0][0]); /* live until PV(i) is done */
      mbar_arrive(&sm.vempty[vs]);
      pack_p<T, BK>(s, pa);
    }
    {
      const int vs = (g + i) % STAGES;
      if constexpr (K::SPLIT) mbar_wait(&sm.vfull[vs], ((g + i) / STAGES) & 1);
      rescale_o<D>(o, al);
      bar_named(4 + wg, 256);
      issue_pv<T, D, BK>(o, pa, dv0 + vs * SOFF);
      if (wg + 1 < NWG) bar_arrive_named(5 + wg, 256); /* the next WG's last turn */
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(o);
      mbar_arrive(&sm.vempty[vs]);
    }
    g += p.nkb;
    store_o<T, D, K::BR>(a, item, o, m, l, wg * 64 + wq * 16, lane);
  }
}

} /* namespace sta */

#endif
