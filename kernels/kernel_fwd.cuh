/*
** kernel_fwd.cuh -- the STA forward kernel (STA.md sections 1-4), one
** for every shape (kernel_traits.cuh): warp-specialised, a producer
** warpgroup (producer_fwd.cuh) feeding K::NWG consumer warpgroups
** (mainloop_fwd.cuh) through mbarrier rings in shared memory.
*/
#ifndef STA_KERNEL_FWD_CUH
#define STA_KERNEL_FWD_CUH

#include "producer_fwd.cuh"
#include "mainloop_fwd.cuh"

namespace sta {

/* One producer warpgroup (the last), K::NWG consumer warpgroups of 64 query
** rows.  PERSIST: one CTA per SM takes items from a global counter; the
** producer runs ahead into the next item's Q and keys while the consumers
** finish the last item and write its output.  Otherwise one CTA per item. */
template <class K, bool PERSIST>
__global__ void __launch_bounds__(K::THREADS, 1) sta_fwd(const __grid_constant__ FwdParams a) {
  using T = typename K::T;
  constexpr int D = K::D, BR = K::BR, BK = K::BK, STAGES = K::STAGES, CTH = K::CTH;
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  FwdSmem<K> sm;
  sm.q = reinterpret_cast<T *>(base);
  sm.k = sm.q + BR * D;
  sm.v = sm.k + STAGES * BK * D;
  sm.kfull = reinterpret_cast<uint64_t *>(sm.v + STAGES * BK * D);
  sm.kempty = sm.kfull + STAGES;
  sm.vfull = K::SPLIT ? sm.kempty + STAGES : sm.kfull;
  sm.vempty = K::SPLIT ? sm.vfull + STAGES : sm.kempty;
  sm.qfull = (K::SPLIT ? sm.vempty : sm.kempty) + STAGES;
  sm.qempty = sm.qfull + 1;
  sm.binfo = reinterpret_cast<int4 *>(sm.qempty + 1);
  sm.rowtab = reinterpret_cast<int *>(sm.binfo + STAGES);
  sm.qrow = sm.rowtab + 2 * BK;
  sm.sitem = K::SPLIT ? sm.rowtab : sm.qrow + BR;

  const int tid = threadIdx.x, lane = tid & 31;
  /* warp-uniform by construction (the shuffle tells the compiler so) */
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) {
      if constexpr (K::SPLIT) {
        mbar_init(&sm.kfull[s], 1);
        mbar_init(&sm.kempty[s], CTH);
        mbar_init(&sm.vfull[s], 1);
        mbar_init(&sm.vempty[s], CTH);
      } else { /* the gather producer's 128 threads arrive on full */
        mbar_init(&sm.kfull[s], a.tma && a.tma_q && a.tma_rows ? 1 : 128);
        mbar_init(&sm.kempty[s], CTH);
      }
    }
    mbar_init(sm.qfull, 1);
    mbar_init(sm.qempty, CTH);
  }
  __syncthreads();
  if (wg >= K::NWG) { /* the producer */
    setmaxnreg_dec<K::PREG>();
    if constexpr (K::GATHER) {
      const int pt = tid - CTH;
      if (a.tma && a.tma_q && a.tma_rows) {
        if (pt == 0) produce_tma<K, PERSIST>(a, sm);
        return;
      }
      produce_gather<K, PERSIST>(a, sm, pt);
    } else if (tid == CTH) {
      produce_tma<K, PERSIST>(a, sm); /* the launch checked that TMA takes every load */
    }
    return;
  }
  setmaxnreg_inc<K::CREG>();
  consume<K>(a, sm, wg, wq, lane);
}

} /* namespace sta */

#endif
