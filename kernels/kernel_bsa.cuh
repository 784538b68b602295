/*
** kernel_bsa.cuh -- the block-sparse forward (STA.md section 12: masks
** BLOCKS and WINDOW_OR_BLOCKS): the kernel sta_bsa_fwd<K> (a producer
** warpgroup, producer_bsa.cuh, feeding two consumer warpgroups,
** mainloop_bsa.cuh, through a K/V ring on mbarriers) and its launch
** (run_bsa: which kernel, persistent on the scheduler's counters or one CTA
** per item).  Included once per instantiation file, bsa_<dtype>_d<D>.cu.
*/
#ifndef STA_KERNEL_BSA_CUH
#define STA_KERNEL_BSA_CUH

#include <type_traits>

#include "mainloop_bsa.cuh"
#include "pairs_bsa.cuh"
#include "producer_bsa.cuh"

namespace sta {

template <class K>
__global__ void __launch_bounds__(K::THREADS, 1) sta_bsa_fwd(const __grid_constant__ BsaParams a) {
  using T = typename K::T;
  constexpr int ST = K::STAGES;
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  BsaSmem<K> sm;
  sm.q = reinterpret_cast<T *>(base + K::OQ);
  sm.k = reinterpret_cast<T *>(base + K::OK);
  sm.v = reinterpret_cast<T *>(base + K::OV);
  sm.x = reinterpret_cast<float *>(base + K::OX);
  sm.ml = reinterpret_cast<float *>(base + K::OML);
  sm.kfull = reinterpret_cast<uint64_t *>(base + K::OBAR);
  sm.kempty = sm.kfull + ST;
  sm.qfull = sm.kempty + ST;
  sm.qempty = sm.qfull + 1;
  sm.lo = reinterpret_cast<volatile int *>(base + K::OLO);
  sm.sitem = reinterpret_cast<volatile int *>(base + K::OITEM);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;
  if (tid == 0) {
    for (int s = 0; s < ST; s++) {
      mbar_init(&sm.kfull[s], a.tma ? 1 : 128); /* the gather's 128 threads arrive */
      mbar_init(&sm.kempty[s], K::SPLIT ? 128 : K::CTH); /* split: one warpgroup a block;
                                                          ** paired: both release every block */
    }
    mbar_init(sm.qfull, 1);
    mbar_init(sm.qempty, K::CTH);
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<K::PREG>();
    if constexpr (K::PAIRS)
      bsa_produce_pairs<K>(a, sm, tid - K::CTH);
    else
      bsa_produce<K>(a, sm, tid - K::CTH);
    return;
  }
  setmaxnreg_inc<K::CREG>();
  if constexpr (K::PAIRS)
    bsa_consume_pairs<K>(a, sm, wg, wq, lane);
  else
    bsa_consume<K>(a, sm, wg, wq, lane);
}

/* The launch of sta_bsa_fwd<K>: items counted, persistent (a grid of
** min(SMs, items) on the scheduler's counters) or, where the counters
** cannot be had (a first launch under graph capture), one CTA per item. */
template <class K>
sta_status launch_bsa(BsaParams &a) {
  auto kern = sta_bsa_fwd<K>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)K::SMEM);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaFuncSetAttribute");
  a.parts = K::PAIRS ? 1 : a.bv / K::QR;
  const int64_t n = (int64_t)a.batch * a.heads * (K::PAIRS ? a.Mp : a.Mq * a.parts);
  if (n > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld work items, too many for the CUDA backend", (long long)n);
  if (n == 0) return STA_OK;
  a.n_items = (int)n;
  sta_status st = sched_slot(&a.sched);
  if (st != STA_OK) return st;
  const int sms = sta_cuda_sm_count();
  const int grid = a.sched && sms < n ? sms : (int)n;
  kern<<<(unsigned)grid, K::THREADS, K::SMEM, sta_cuda_stream()>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, "block-sparse attention kernel launch");
  bsa_note_launch(a, K::PAIRS ? "BlockPairs" : K::SPLIT ? "BlockSplit" : "BlockShared",
                  std::is_same<typename K::T, __half>::value ? "f16" : "bf16", K::D, K::QR, K::BK,
                  grid);
  return STA_OK;
}

/* 64-row blocks: the split kernel, or the paired one where a.pairs
** (bsa_api.cu: the tests' setting, BLOCKS, TMA; the pre-pass done);
** multiples of 128: the shared one. */
template <typename T, int D>
sta_status run_bsa(BsaParams &a) {
  if (a.bv == 64 && a.pairs) return launch_bsa<BsaTraits<T, D, 64, true>>(a);
  if (a.bv == 64) return launch_bsa<BsaTraits<T, D, 64>>(a);
  return launch_bsa<BsaTraits<T, D, 128>>(a);
}

} /* namespace sta */

#endif
