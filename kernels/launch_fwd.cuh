/*
** launch_fwd.cuh -- the launch of sta_fwd (kernel_fwd.cuh) and the choice
** of kernel for one (dtype, head dim); included once per instantiation
** file, fwd_<dtype>_d<D>.cu.
*/
#ifndef STA_LAUNCH_FWD_CUH
#define STA_LAUNCH_FWD_CUH

#include <type_traits>

#include "kernel_fwd.cuh"

namespace sta {

/* The launch of sta_fwd<K, PERSIST>: items counted for K's rows, a grid
** of min(SMs, items) on the counters in a.sched with the wave gate where
** it applies (PERSIST), or one CTA per item. */
template <class K, bool PERSIST>
sta_status launch_fwd(FwdParams &a) {
  constexpr int BR = K::BR;
  auto kern = sta_fwd<K, PERSIST>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)K::SMEM);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaFuncSetAttribute");
  a.qbpt = a.tma_q ? a.tt / (BR / 64) : (a.tile_vol + BR - 1) / BR;
  sta_status cs = count_items(a, BR);
  if (cs != STA_OK || a.n_items == 0) return cs;
  const int n = a.n_items;
  int grid = n;
  a.gate_nkb = 0;
  if (PERSIST) {
    grid = sta_cuda_sm_count() < n ? sta_cuda_sm_count() : n;
    if (!K::GATHER || (a.tma && a.tma_q && a.tma_rows)) /* produce_tma: the gate's */
      a.gate_nkb = wave_gate_nkb(a, grid, K::BK, (int64_t)K::BK * 2 * K::D * sizeof(typename K::T));
  }
  kern<<<(unsigned)grid, K::THREADS, K::SMEM, sta_cuda_stream()>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, "attention kernel launch");
  fwd_note_launch(a, K::BK == 192 ? "Wide" : BR == 192 ? "Tall" : "Square",
                  std::is_same<typename K::T, __half>::value ? "f16" : "bf16", K::D, BR, K::BK,
                  K::GATHER, PERSIST, grid);
  return STA_OK;
}

/* The kernels of one (dtype, head dim): the default where the TMA paths and
** 3 | tt allow it (D 128: Wide, the 192-key blocks and their 192-row maps;
** D 64: Tall, the 192-row items and their maps), else Square; persistent
** on the counters of sched_slot, one CTA per item where there are none (a
** first launch under capture).  Variant (sta_cuda_set_variant_test, for
** tests and benchmarks) 2: one CTA per item; 9: Square. */
template <typename T, int D>
sta_status run_fwd(FwdParams &a, int variant) {
  using Big = typename std::conditional<D == 128, Wide<T>, Tall<T>>::type;
  const bool big = variant != 9 && a.tma && a.tma_q && a.tma_rows && (D == 128 ? a.tma_k3 : a.tma_q3);
  a.sched = NULL;
  if (variant != 2) {
    sta_status st = sched_slot(&a.sched);
    if (st != STA_OK) return st;
  }
  if (!a.sched) return big ? launch_fwd<Big, false>(a) : launch_fwd<Square<T, D>, false>(a);
  return big ? launch_fwd<Big, true>(a) : launch_fwd<Square<T, D>, true>(a);
}

} /* namespace sta */

#endif
