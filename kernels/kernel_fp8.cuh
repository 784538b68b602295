/*
** kernel_fp8.cuh -- sta_fp8_fwd, the fp8 forward kernel (sm_90a) over the
** quantize pre-pass's operands (core/fp8_internal.h, sta_fp8_ops; rows in the
** tiled order, so every query and key block is a run of rows).  384
** threads: warpgroup 2 the producer (producer_fp8.cuh: setmaxnreg down; Q
** and the key blocks by TMA, cp.async for the blocks TMA cannot take, into
** a ring of buffers on mbarriers), 0 and 1 the consumers of 64 query rows
** each (mainloop_fp8.cuh's fp8_blocks); persistent CTAs take work items
** (FP8_BM query rows of a query tile, or of the text rows, of a (batch,
** head)) from tile_scheduler.cuh's counter.  K rows are permuted within
** 16-key groups (fp8_col_key) so that a thread's S accumulators are its
** 8-bit A fragment of P: no byte shuffles.
*/
#ifndef STA_KERNEL_FP8_CUH
#define STA_KERNEL_FP8_CUH

#include "producer_fp8.cuh"
#include "tile_scheduler.cuh" /* next_item, sched_slot */

namespace sta {

/* This thread's quantized row i (0, 1) of an item from q0 (warpgroup wg,
** warp w). */
__device__ __forceinline__ int64_t fp8_row(int64_t q0, int wg, int w, int lane, int i) {
  return q0 + wg * 64 + w * 16 + (lane >> 2) + 8 * i;
}

/* The running state before an item's first key block. */
template <int D>
__device__ __forceinline__ void fp8_rows_init(Fp8Rows<D> &st, const Fp8Params &a, int64_t bh,
                                              int64_t q0, int wg, int w, int lane) {
  for (int i = 0; i < 2; i++) {
    const int64_t r = fp8_row(q0, wg, w, lane, i);
    st.qsc[i] = r < a.R ? a.q_scale[bh * a.R + r] * a.scale_log2 : 0.0f;
    st.m[i] = -INFINITY;
    st.l[i] = 0.0f;
  }
  /* O starts in shared memory (fp8_blocks) */
}

/* The item's output rows of this thread (rows past q1: -1) stored. */
template <int D>
__device__ __forceinline__ void fp8_finish_item(const Fp8Params &a, Fp8Rows<D> &st, int64_t bh,
                                                int64_t q0, int64_t q1, int wg, int w, int lane) {
  int64_t rows[2];
  for (int i = 0; i < 2; i++) {
    const int64_t r = fp8_row(q0, wg, w, lane, i);
    rows[i] = r < q1 ? r : -1;
  }
  fp8_store<D>(a, st, bh, rows, lane & 3);
}

/* The number of key blocks Fp8Walk gives over runs r. */
__device__ __forceinline__ int fp8_nblocks(const Fp8Params &a, const Fp8Runs &r) {
  const int64_t text = a.g.keys_end - a.g.tiled_video;
  if (r.text_item) return (int)((a.g.keys_end + FP8_BK - 1) / FP8_BK);
  return r.cnt[0] * r.cnt[1] * (int)(((int64_t)r.cnt[2] * a.vol + FP8_BK - 1) / FP8_BK) +
         (text > 0 ? (int)((text + FP8_BK - 1) / FP8_BK) : 0);
}

/* The consumer warpgroups (tid below FP8_CT): per item, its blocks
** (fp8_blocks), Q released after the last one, then the output rows. */
template <int D>
__device__ __forceinline__ void fp8_consume(const Fp8Params &a, unsigned char *sm, int tid) {
  using L = Fp8Smem<D>;
  constexpr int NB = L::NB;
  /* the warpgroup warp-uniform (a shuffle), so that its Q descriptors
  ** live in uniform registers (no R2UR a GEMM) */
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), lane = tid & 31, w = (tid >> 5) & 3;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *empty = full + NB, *qfull = empty + NB,
           *qempty = qfull + 2;
  const int *sitem = (const int *)(sm + L::ITEM);
  const uint32_t dk0 = sdesc_lo(sm + L::K, 16), dv0 = sdesc_lo(sm + L::V, 16);
  constexpr uint32_t KSTEP = L::KB >> 4, VSTEP = L::VB >> 4;
  int g = 0;
  for (int k = 0;; k++) {
    const int qb = k & 1;
    mbar_wait(&qfull[qb], (k >> 1) & 1);
    /* j and nb by a shuffle: values the compiler knows to be warp-uniform,
    ** so the step loop, its ring index and the wgmma descriptors stay in
    ** uniform registers (4 % faster than loaded per thread, spills 64 -> 28
    ** bytes) */
    const int j = __shfl_sync(0xffffffffu, sitem[qb], 0);
    if (j < 0) return;
    int64_t bh, it, q0, q1;
    fp8_item(a, j, bh, it);
    Fp8Runs runs;
    fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, true);
    const int nb = __shfl_sync(0xffffffffu, fp8_nblocks(a, runs), 0);
    fence_proxy_async();
    Fp8Rows<D> st;
    fp8_rows_init<D>(st, a, bh, q0, wg, w, lane);
    const uint32_t dq = sdesc_lo(sm + L::Q + qb * L::QB + wg * 64 * L::QP, 16);
    const auto at = [&](int b) {
      return Fp8Stage{dk0 + b * KSTEP, dv0 + b * VSTEP, L::info(sm, b, a.has_pad)};
    };
    fp8_blocks<D, L::HI, NB, fp8_h<D>()>(st, dq, nb, g, full, empty, at, wg, lane & 3,
                                         smem_u32(sm + L::OS) + 16 * tid);
    mbar_arrive(&qempty[qb]);
    fp8_finish_item<D>(a, st, bh, q0, q1, wg, w, lane);
  }
}

/* 384 threads (FP8_THREADS), warpgroup 2 the producer (setmaxnreg down),
** 0 and 1 the consumers (up; STA_FP8_NWG 3: 512, warpgroup 3 the
** producer); PERSIST: one CTA per SM taking items from tile_scheduler.cuh's
** counter, else one per item. */
template <int D, bool PERSIST>
__global__ void __launch_bounds__(FP8_THREADS, 1) sta_fp8_fwd(const __grid_constant__ Fp8Params a) {
  using L = Fp8Smem<D>;
  constexpr int NB = L::NB;
  extern __shared__ unsigned char fp8_smem_raw[];
  unsigned char *sm = (unsigned char *)(((uintptr_t)fp8_smem_raw + 1023) & ~(uintptr_t)1023);
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0); /* warp-uniform */
  if (tid == 0) {
    uint64_t *bar = (uint64_t *)(sm + L::BAR);
    for (int b = 0; b < NB; b++) {
      mbar_init(&bar[b], 97);             /* full: the walker and the 96 helpers */
      mbar_init(&bar[NB + b], FP8_CT);    /* empty: the consumer threads */
      mbar_init(&bar[2 * NB + 4 + b], 1); /* dfull: the walker */
    }
    for (int b = 0; b < 2; b++) {
      mbar_init(&bar[2 * NB + b], 1);       /* qfull: the walker */
      mbar_init(&bar[2 * NB + 2 + b], FP8_CT); /* qempty */
    }
  }
  __syncthreads();
  if (wg == FP8_NWG) {
    setmaxnreg_dec<FP8_PREG>();
    if (tid == FP8_CT) fp8_walker<D, PERSIST>(a, sm);
    else if (tid >= FP8_CT + 32) fp8_helpers<D>(a, sm, tid - (FP8_CT + 32));
    return;
  }
  setmaxnreg_inc<FP8_CREG>();
  fp8_consume<D>(a, sm, tid);
}

/* The kernel over bh x n_items items (x: the caller's, maps encoded; its
** item counts and scheduler slot filled in here): persistent CTAs (one per
** SM at most) where the scheduler's counters are there (sched_slot), else
** a CTA per item; 384 threads each, on this thread's stream. */
template <int D> sta_status run_fp8(Fp8Params &x, int64_t bh, int64_t n_items) {
  if (bh * n_items > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: %lld fp8 work items, too many for the "
                     "CUDA backend", (long long)(bh * n_items));
  x.items_per_bh = (int)n_items;
  x.n_items = (int)(bh * n_items);
  const sta_status s = sched_slot(&x.sched);
  if (s != STA_OK) return s;
  const int n = x.n_items, sms = sta_cuda_sm_count();
  const int grid = x.sched && sms < n ? sms : n, smem = Fp8Smem<D>::BYTES + 1024;
  void (*k)(Fp8Params) = x.sched ? sta_fp8_fwd<D, true> : sta_fp8_fwd<D, false>;
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "fp8 attention: shared memory");
  k<<<(unsigned)grid, FP8_THREADS, smem, sta_cuda_stream()>>>(x);
  e = cudaGetLastError();
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "fp8 attention: kernel launch");
}

} /* namespace sta */

#endif
