/*
** kernel_fp8.cuh -- sta_fp8_fwd_ws, the fp8 forward kernel (sm_90a) over
** the quantize pre-pass's operands (core/internal.h, sta_fp8_ops; rows in
** the tiled order, so every query and key block is a run of rows).  384
** threads: warpgroup 2 the producer (setmaxnreg down; Q and the key blocks
** by cp.async into a ring of buffers, mbarriers), 0 and 1 the consumers of
** 64 query rows each (mainloop_fp8.cuh's fp8_block); persistent CTAs take
** work items (FP8_BM query rows of a query tile, or of the text rows, of
** a (batch, head)) from tile_scheduler.cuh's counter.
**
** Shared tiles are rows of 128 bytes (D 64 fills the first half), 16-byte
** chunk c of row r at c ^ (r & 7): mma.cuh's 128-byte swizzle.  V planes
** are rows of d, 128 keys each (K-major B of the PV GEMM).  K rows are
** permuted within 16-key groups (fp8_col_key) so that a thread's S
** accumulators are its 8-bit A fragment of P: no byte shuffles.
*/
#ifndef STA_KERNEL_FP8_CUH
#define STA_KERNEL_FP8_CUH

#include "mainloop_fp8.cuh"
#include "tile_scheduler.cuh" /* next_item, sched_slot */

namespace sta {

/* The key (within its block) that S column / K row c holds: in each
** 32-key chunk, a thread's accumulator columns 2t, 2t+1, 8+2t, 9+2t (and
** 16 more) hold keys 4t..4t+3 (and 16 more), its A fragment's k order
** (core/internal.h's sta_fp8_col_key, which the pre-pass's permuted key
** layout follows). */
__device__ __forceinline__ int fp8_col_key(int c) { return sta_fp8_col_key(c); }

/* The key blocks of one item: runs of key rows (a window's rows of tiles
** along w, then the text keys; text queries: every row below keys_end),
** each cut into blocks of FP8_BK.  The runs (Fp8Runs) are in shared
** memory, written once; every thread walks them with its own cursor
** (Fp8Walk: the same blocks in the same order, at its own pace). */
struct Fp8Runs {
  int lo[3], cnt[3], nruns, text_item;
};
struct Fp8Walk {
  int64_t pos; /* offset in the current run */
  int ri;
  __device__ static void run(const Fp8Params &a, const Fp8Runs &r, int i, int64_t &start,
                             int64_t &len) {
    if (r.text_item) { start = 0; len = a.g.keys_end; return; }
    if (i < r.cnt[0] * r.cnt[1]) {
      const int t = r.lo[0] + i / r.cnt[1], hh = r.lo[1] + i % r.cnt[1];
      start = (((int64_t)t * a.g.grid[1] + hh) * a.g.grid[2] + r.lo[2]) * a.vol;
      len = (int64_t)r.cnt[2] * a.vol;
      return;
    }
    start = a.g.tiled_video;
    len = a.g.keys_end - a.g.tiled_video;
  }
  __device__ bool next(const Fp8Params &a, const Fp8Runs &r, int64_t &start, int &len) {
    for (; ri < r.nruns; ri++, pos = 0) {
      int64_t s, n;
      run(a, r, ri, s, n);
      if (pos < n) {
        start = s + pos;
        len = (int)(n - pos < FP8_BK ? n - pos : FP8_BK);
        pos += FP8_BK;
        return true;
      }
    }
    return false;
  }
};

/* Load key block (start, len) into buffer buf: K rows and V planes by
** cp.async (bytewise where V's rows are not 16-byte aligned), keys past
** len zero; the per-column (k_scale, 0) or (0, -inf) for keys that are not
** keys (past len, padding rows of partial tiles: looked up only where the
** canvas has partial tiles).  L: the layout; NT threads (tid < NT) load. */
template <int D, class L, int NT = 256>
__device__ __forceinline__ void fp8_load_block(const Fp8Params &a, unsigned char *sm, int buf,
                                               int64_t bh, int64_t start, int len, int tid) {
  static_assert(NT >= FP8_BK, "a thread per key's info");
  unsigned char *sk = sm + L::K + buf * L::KB, *sv = sm + L::V + buf * L::VB;
  const int8_t *k8 = a.k8 + (bh * a.R + start) * D;
  for (int x = tid; x < FP8_BK * (D / 16); x += NT) {
    const int c = x / (D / 16), ch = x % (D / 16), kp = fp8_col_key(c);
    cp_async16(smem_u32(sk + c * 128 + ((ch ^ (c & 7)) << 4)), kp < len ? k8 + kp * D + ch * 16 : a.k8,
               kp < len ? 16 : 0);
  }
  const uint8_t *v8 = a.v8 + bh * 2 * D * a.R + start;
  const bool vec = a.v_vec && (start & 15) == 0;
  for (int x = tid; x < 2 * D * 8; x += NT) {
    const int r = x >> 3, ch = x & 7, n = len - ch * 16; /* r = plane * D + d */
    const uint8_t *src = v8 + (int64_t)r * a.R + ch * 16;
    unsigned char *dst = sv + r * 128 + ((ch ^ (r & 7)) << 4);
    if (vec) {
      cp_async16(smem_u32(dst), n > 0 ? src : a.v8, n <= 0 ? 0 : n < 16 ? n : 16);
    } else {
      uint32_t w[4] = {0, 0, 0, 0};
      for (int e = 0; e < 16 && e < n; e++) w[e >> 2] |= (uint32_t)src[e] << (8 * (e & 3));
      *(uint4 *)dst = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
  if (tid < FP8_BK) { /* k_scale by cp.async too: a plain load would stall here */
    const int kp = fp8_col_key(tid);
    const int64_t r = start + kp;
    const bool ok = kp < len && (!a.has_pad || fp8_source(a.g, (int)r) >= 0);
    float *ki = (float *)(sm + L::INFO) + 2 * (buf * FP8_BK + tid);
    cp_async4(smem_u32(ki), ok ? a.k_scale + bh * a.R + r : a.k_scale, ok ? 4 : 0);
    ki[1] = ok ? 0.0f : -INFINITY;
  }
}

/* The item's query rows [q0, q1) and its key runs (wk: written only where
** runs is set; every thread computes them, in its registers). */
__device__ __forceinline__ void fp8_item_runs(const Fp8Params &a, int64_t item, int h,
                                              Fp8Runs &wk, int64_t &q0, int64_t &q1, bool runs) {
  if (item < a.n_video_items) {
    const int64_t tq = item / a.qbpt;
    q0 = tq * a.vol + (item % a.qbpt) * FP8_BM;
    q1 = q0 + FP8_BM < (tq + 1) * a.vol ? q0 + FP8_BM : (tq + 1) * a.vol;
    if (!runs) return;
    const int tc[3] = {(int)(tq / ((int64_t)a.g.grid[1] * a.g.grid[2])),
                       (int)((tq / a.g.grid[2]) % a.g.grid[1]), (int)(tq % a.g.grid[2])};
#pragma unroll
    for (int ax = 0; ax < 3; ax++) {
      const int k = a.win[3 * h + ax], c = a.g.grid[ax];
      int s = tc[ax] - k / 2;
      s = s < 0 ? 0 : s > c - k ? c - k : s;
      wk.lo[ax] = k >= c ? 0 : s;
      wk.cnt[ax] = k >= c ? c : k;
    }
    wk.text_item = 0;
    wk.nruns = wk.cnt[0] * wk.cnt[1] + (a.g.keys_end > a.g.tiled_video ? 1 : 0);
  } else {
    q0 = a.g.tiled_video + (item - a.n_video_items) * FP8_BM;
    q1 = q0 + FP8_BM < a.R ? q0 + FP8_BM : a.R;
    if (!runs) return;
    wk.text_item = 1;
    wk.nruns = 1;
  }
}
/* Q's FP8_BM rows from q0 into dst (rows past R zero) by NT threads. */
template <int D, int NT>
__device__ __forceinline__ void fp8_load_q(const Fp8Params &a, unsigned char *dst, int64_t bh,
                                           int64_t q0, int tid) {
  for (int x = tid; x < FP8_BM * (D / 16); x += NT) {
    const int r = x / (D / 16), ch = x % (D / 16);
    const bool ok = q0 + r < a.R;
    cp_async16(smem_u32(dst + r * 128 + ((ch ^ (r & 7)) << 4)),
               ok ? a.q8 + (bh * a.R + q0 + r) * D + ch * 16 : a.q8, ok ? 16 : 0);
  }
}

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
#pragma unroll
  for (int x = 0; x < D / 2; x++) st.o[x] = 0.0f;
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

/* Its shared memory: two Q buffers (item k of a CTA in k & 1, so the next
** item's Q loads under this one's blocks), NB key-block buffers (K
** rows, both V planes, the keys' info), the barriers (full[NB], empty[NB], qfull[2], qempty[2]) and
** the items of the Q buffers. */
template <int D, int NB> struct Fp8WsSmem {
  static constexpr int QP = 128, QB = FP8_BM * QP; /* a Q or K row's bytes; a Q buffer */
  static constexpr uint32_t HI = SDESC_HI;        /* descriptors: 128-byte swizzle */
  static constexpr int KB = FP8_BK * 128, VB = 2 * D * 128;
  static constexpr int Q = 0;
  static constexpr int K = Q + 2 * FP8_BM * 128;
  static constexpr int V = K + NB * KB;
  static constexpr int INFO = V + NB * VB;
  static constexpr int BAR = INFO + NB * FP8_BK * 8;
  static constexpr int ITEM = BAR + (2 * NB + 4) * 8;
  static constexpr int BYTES = ITEM + 8;
  /* buffer b's per-key info (mainloop_fp8.cuh's fp8_info) */
  static __device__ __forceinline__ const float4 *info(const unsigned char *sm, int b) {
    return (const float4 *)(sm + INFO) + b * (FP8_BK / 2);
  }
};
constexpr int FP8_WS_NB = 3, FP8_WS_PREG = 88, FP8_WS_CREG = 208;
static_assert(128 * (FP8_WS_PREG + 2 * FP8_WS_CREG) <= (65536 / 384) / 8 * 8 * 384,
              "setmaxnreg: more registers than the launch gives the CTA");

/* Work item j of a launch: (batch * head, item of fp8_item_runs).
** The text query blocks of every head first (each over all keys: the
** longest), then head by head its tile items in order (neighbours share
** key blocks in L2). */
__device__ __forceinline__ void fp8_ws_item(const Fp8Params &a, int j, int64_t &bh,
                                            int64_t &it) {
  const int nt = a.items_per_bh - a.n_video_items;
  const int64_t nbh = a.n_items / a.items_per_bh;
  if (j < nbh * nt) {
    bh = j / nt;
    it = a.n_video_items + j % nt;
  } else {
    const int64_t x = j - nbh * nt;
    bh = x / a.n_video_items;
    it = x % a.n_video_items;
  }
}

/* The number of key blocks Fp8Walk gives over runs r. */
__device__ __forceinline__ int fp8_nblocks(const Fp8Params &a, const Fp8Runs &r) {
  const int64_t text = a.g.keys_end - a.g.tiled_video;
  if (r.text_item) return (int)((a.g.keys_end + FP8_BK - 1) / FP8_BK);
  return r.cnt[0] * r.cnt[1] * (int)(((int64_t)r.cnt[2] * a.vol + FP8_BK - 1) / FP8_BK) +
         (text > 0 ? (int)((text + FP8_BK - 1) / FP8_BK) : 0);
}

/* The producer warpgroup (pt: 0..127): items from the scheduler, each one's
** Q into its buffer, then its key blocks through the ring, all by cp.async
** (fp8_load_block).  A group is signalled (every producer thread arrives:
** full, qfull count 128) once the next group is issued, as produce_gather
** in producer_fwd.cuh; the last one before the end. */
template <int D, bool PERSIST>
__device__ __forceinline__ void fp8_produce(const Fp8Params &a, unsigned char *sm, int pt) {
  using L = Fp8WsSmem<D, FP8_WS_NB>;
  constexpr int NB = FP8_WS_NB;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *empty = full + NB, *qfull = empty + NB,
           *qempty = qfull + 2;
  int *sitem = (int *)(sm + L::ITEM);
  uint64_t *pend = nullptr;
  int g = 0; /* key blocks so far */
  for (int k = 0;; k++) {
    const int qb = k & 1;
    if (k >= 2) mbar_wait(&qempty[qb], ((k >> 1) - 1) & 1);
    bar_named(1, 128); /* every producer thread has read sitem[qb] of item k - 2 */
    if (pt == 0) sitem[qb] = next_item<PERSIST>(a, k);
    bar_named(1, 128);
    const int j = sitem[qb];
    if (j < 0) {
      if (pend) {
        cp_async_wait_all();
        fence_proxy_async();
        mbar_arrive(pend);
      }
      mbar_arrive(&qfull[qb]); /* the consumers read -1 and stop */
      return;
    }
    int64_t bh, it, q0, q1, ks;
    int kl;
    fp8_ws_item(a, j, bh, it);
    Fp8Runs runs;
    Fp8Walk wk = {0, 0};
    fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, true);
    fp8_load_q<D, 128>(a, sm + L::Q + qb * FP8_BM * 128, bh, q0, pt);
    cp_async_commit();
    if (pend) {
      cp_async_wait_1();
      fence_proxy_async();
      mbar_arrive(pend);
    }
    pend = &qfull[qb];
    while (wk.next(a, runs, ks, kl)) {
      const int b = g % NB;
      if (g >= NB) mbar_wait(&empty[b], (g / NB - 1) & 1);
      fp8_load_block<D, L, 128>(a, sm, b, bh, ks, kl, pt);
      cp_async_commit();
      cp_async_wait_1();
      fence_proxy_async();
      mbar_arrive(pend);
      pend = &full[b];
      g++;
    }
  }
}

/* The two consumer warpgroups (tid 0..255): per item, its blocks
** (fp8_block; OVL: fp8_blocks_ovl, S(n+1) before P V(n)), Q released after
** the last S, then the output rows.  L: the shared memory's layout
** (Fp8WsSmem, kernel_fp8_tma.cuh's Fp8TmaSmem). */
template <int D, class L, bool OVL = false>
__device__ __forceinline__ void fp8_consume(const Fp8Params &a, unsigned char *sm, int tid) {
  constexpr int NB = FP8_WS_NB;
  const int wg = tid >> 7, lane = tid & 31, w = (tid >> 5) & 3;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *empty = full + NB, *qfull = empty + NB,
           *qempty = qfull + 2;
  const int *sitem = (const int *)(sm + L::ITEM);
  const uint32_t dk0 = sdesc_lo(sm + L::K, 16), dv0 = sdesc_lo(sm + L::V, 16);
  constexpr uint32_t KSTEP = L::KB >> 4, VSTEP = L::VB >> 4;
  int g = 0;
  for (int k = 0;; k++) {
    const int qb = k & 1;
    mbar_wait(&qfull[qb], (k >> 1) & 1);
    const int j = sitem[qb];
    if (j < 0) return;
    int64_t bh, it, q0, q1;
    fp8_ws_item(a, j, bh, it);
    Fp8Runs runs;
    fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, true);
    const int nb = fp8_nblocks(a, runs);
    fence_proxy_async();
    Fp8Rows<D> st;
    fp8_rows_init<D>(st, a, bh, q0, wg, w, lane);
    const uint32_t dq = sdesc_lo(sm + L::Q + qb * L::QB + wg * 64 * L::QP, 16);
    if constexpr (OVL) {
      fp8_blocks_ovl<D, L>(st, sm, dq, g, nb, &qempty[qb], lane & 3);
      fp8_ws_item(a, j, bh, it); /* again: fewer registers live over the blocks */
      fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, false);
    } else {
      for (int n = 0; n < nb; n++, g++) {
        const int b = g % NB;
        mbar_wait(&full[b], (g / NB) & 1);
        fence_proxy_async();
        fp8_block<D, L::HI>(st, dq, dk0 + b * KSTEP, dv0 + b * VSTEP, L::info(sm, b), lane & 3);
        mbar_arrive(&empty[b]);
      }
      mbar_arrive(&qempty[qb]);
    }
    fp8_finish_item<D>(a, st, bh, q0, q1, wg, w, lane);
  }
}

/* 384 threads, warpgroup 2 the producer
** (setmaxnreg down), 0 and 1 the consumers (up); PERSIST: one CTA per SM
** taking items from tile_scheduler.cuh's counter, else one per item. */
template <int D, bool PERSIST>
__global__ void __launch_bounds__(384, 1) sta_fp8_fwd_ws(const __grid_constant__ Fp8Params a) {
  using L = Fp8WsSmem<D, FP8_WS_NB>;
  constexpr int NB = FP8_WS_NB;
  extern __shared__ unsigned char fp8_smem_raw[];
  unsigned char *sm = (unsigned char *)(((uintptr_t)fp8_smem_raw + 1023) & ~(uintptr_t)1023);
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0); /* warp-uniform */
  if (tid == 0) {
    uint64_t *bar = (uint64_t *)(sm + L::BAR);
    for (int b = 0; b < NB; b++) {
      mbar_init(&bar[b], 128);      /* full: the producer threads */
      mbar_init(&bar[NB + b], 256); /* empty: the consumer threads */
    }
    for (int b = 0; b < 2; b++) {
      mbar_init(&bar[2 * NB + b], 128);     /* qfull */
      mbar_init(&bar[2 * NB + 2 + b], 256); /* qempty */
    }
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<FP8_WS_PREG>();
    fp8_produce<D, PERSIST>(a, sm, tid - 256);
    return;
  }
  setmaxnreg_inc<FP8_WS_CREG>();
  fp8_consume<D, L>(a, sm, tid);
}

/* Kernel k over x on grid CTAs of 384 threads with smem bytes of shared
** memory, on this thread's stream. */
template <class P>
sta_status fp8_launch(void (*k)(P), const P &x, int grid, int smem) {
  cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "fp8 attention: shared memory");
  k<<<(unsigned)grid, 384, smem, sta_cuda_stream()>>>(x);
  e = cudaGetLastError();
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "fp8 attention: kernel launch");
}

/* x's bh x n_items work items and *grid: persistent CTAs (one per SM at
** most) where the scheduler's counters are there (sched_slot), else a CTA
** per item. */
inline sta_status fp8_items(Fp8Params *x, int64_t bh, int64_t n_items, int *grid) {
  if (bh * n_items > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: %lld fp8 work items, too many for the "
                     "CUDA backend", (long long)(bh * n_items));
  x->items_per_bh = (int)n_items;
  x->n_items = (int)(bh * n_items);
  const sta_status s = sched_slot(&x->sched);
  const int n = x->n_items, sms = sta_cuda_sm_count();
  *grid = x->sched && sms < n ? sms : n;
  return s;
}

/* The kernel over bh x n_items items (x: the caller's, its item counts and
** scheduler slot filled in here). */
template <int D> sta_status run_fp8(Fp8Params &x, int64_t bh, int64_t n_items) {
  int grid = 0;
  const sta_status s = fp8_items(&x, bh, n_items, &grid);
  if (s != STA_OK) return s;
  const int smem = Fp8WsSmem<D, FP8_WS_NB>::BYTES + 1024;
  return x.sched ? fp8_launch(sta_fp8_fwd_ws<D, true>, x, grid, smem)
                 : fp8_launch(sta_fp8_fwd_ws<D, false>, x, grid, smem);
}

} /* namespace sta */

#endif
