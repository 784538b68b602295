/*
** kernel_fp8_tma.cuh -- sta_fp8_fwd_tma, the fp8 forward with a TMA
** producer (STA_FP8_VARIANT=3, and 4 with S(n+1) issued before P V(n):
** mainloop_fp8.cuh's fp8_blocks_ovl; fp8_api.cu; kernel_fp8.cuh's
** sta_fp8_fwd_ws is the default): the same items, blocks, consumers and
** bits, the loads by the copy engine.  The pre-pass writes k8 and k_scale
** in the kernels' key order (sta_fp8_ops.kperm: core/internal.h's
** sta_fp8_kslot), so a block of 128 keys from a 16-row boundary is one
** box of a 3-D map as it is.
**
** Producer warpgroup (setmaxnreg down to FP8_TMA_PREG, no spills: 32
** spills), the walker (its thread 0) and 96 helpers (warps 1..3; lanes
** 1..31 of warp 0 leave).  The walker takes the items, loads each one's Q
** by TMA (map mq, box D x 128 rows; rows past R zero) onto qfull, and per
** key block, once its buffer is free (empty), publishes the block
** (Fp8BlockDesc, dfull) and, where the block is 128 keys from a 16-row
** boundary and R % 16 == 0 (tma_kv), loads K (mk), both V planes (mv, box
** 128 keys x 2 D) and its k_scale (a 512-byte bulk copy) onto full[b].
** The helpers write each column's mask (0, or -inf for a key past the
** block or a padding row) and load the blocks TMA does not take by
** cp.async (fp8_load_krow, fp8_load_vrow, through sta_fp8_kslot); full[b]
** counts the walker (its arrival carries the bytes) and the 96 helpers.
**
** Shared memory: Q and K rows of D bytes (128-byte swizzle at D 128, 64-byte
** at D 64: what TMA writes; the S descriptors' high word HI says which), V
** planes and the ring as kernel_fp8.cuh's, the info as two arrays (k_scale,
** mask: mainloop_fp8.cuh's Fp8KeyInfo).
*/
#ifndef STA_KERNEL_FP8_TMA_CUH
#define STA_KERNEL_FP8_TMA_CUH

#include "kernel_fp8.cuh"

namespace sta {

/* The kernel's argument: the maps first (64-byte aligned), then the
** default kernel's. */
struct Fp8TmaParams {
  CUtensorMap mq, mk, mv; /* q8, k8 [B*H][R][D]; V planes [B*H][2 D][R] (tma_kv only) */
  Fp8Params p;
  int tma_kv;             /* R % 16 == 0: mk, mv used for whole aligned blocks */
};

template <int D, int NB> struct Fp8TmaSmem {
  static constexpr int QP = D, QB = FP8_BM * QP; /* a Q or K row's bytes; a Q buffer */
  /* descriptors: SBO 8 rows, 128- or 64-byte swizzle */
  static constexpr uint32_t HI = ((8 * QP) >> 4) | ((D == 128 ? 1u : 2u) << 30);
  static constexpr int KB = FP8_BK * QP, VB = 2 * D * 128;
  static constexpr int Q = 0;
  static constexpr int K = Q + 2 * QB;
  static constexpr int V = K + NB * KB;
  static constexpr int KS = V + NB * VB;           /* k_scale [NB][FP8_BK] */
  static constexpr int MASK = KS + NB * FP8_BK * 4; /* 0 or -inf [NB][FP8_BK] */
  static constexpr int BAR = MASK + NB * FP8_BK * 4; /* full, empty, qfull, qempty, dfull */
  static constexpr int ITEM = BAR + (3 * NB + 4) * 8;
  static constexpr int DESC = ITEM + 8;              /* Fp8BlockDesc [NB] */
  static constexpr int BYTES = DESC + NB * 16;
  static constexpr int RING = NB;
  static_assert(D == 64 || D == 128, "rows of 64 or 128 bytes");
  /* 16-byte chunk ch of K row c, as the swizzle puts it */
  static __device__ __forceinline__ int kswz(int c, int ch) {
    return c * QP + ((ch ^ ((c * QP >> 7) & (QP / 16 - 1))) << 4);
  }
  static __device__ __forceinline__ Fp8KeyInfo info(const unsigned char *sm, int b) {
    return Fp8KeyInfo{(const float2 *)(sm + KS) + b * (FP8_BK / 2),
                      (const float2 *)(sm + MASK) + b * (FP8_BK / 2)};
  }
};
constexpr int FP8_TMA_PREG = 40, FP8_TMA_CREG = 232; /* 32 / 224 spill */
static_assert(128 * (FP8_TMA_PREG + 2 * FP8_TMA_CREG) <= (65536 / 384) / 8 * 8 * 384,
              "setmaxnreg: more registers than the launch gives the CTA");

/* The block's key row c and its k_scale (ok: its key is a key) by cp.async
** through the permuted layout: smem row c holds key start + fp8_col_key(c);
** zeros past len. */
template <int D, class L>
__device__ __forceinline__ void fp8_load_krow(const Fp8Params &a, unsigned char *sm, int buf,
                                              int64_t bh, int start, int len, int c, bool ok) {
  const int kp = fp8_col_key(c);
  const int r = kp < len ? (int)sta_fp8_kslot(start + kp, a.R) : 0;
  const int8_t *src = a.k8 + (bh * a.R + r) * D;
  const uint32_t dst = smem_u32(sm + L::K + buf * L::KB);
#pragma unroll
  for (int ch = 0; ch < D / 16; ch++)
    cp_async16(dst + L::kswz(c, ch), src + ch * 16, kp < len ? 16 : 0);
  cp_async4(smem_u32(sm + L::KS + 4 * (buf * FP8_BK + c)), a.k_scale + bh * a.R + (ok ? r : 0),
            ok ? 4 : 0);
}

/* The block's V row vr (plane * D + d) by cp.async (16 bytes at a time
** where the block starts 16-byte aligned and R % 16 == 0, else bytewise),
** zeros past len. */
template <int D, class L>
__device__ __forceinline__ void fp8_load_vrow(const Fp8Params &a, unsigned char *sm, int buf,
                                              int64_t bh, int start, int len, int vr) {
  const uint8_t *src = a.v8 + (bh * 2 * D + vr) * a.R + start;
  unsigned char *dst = sm + L::V + buf * L::VB + vr * 128;
  const bool vec = a.v_vec && (start & 15) == 0;
#pragma unroll 1
  for (int ch = 0; ch < 8; ch++) {
    const int n = len - ch * 16, o = (ch ^ (vr & 7)) << 4;
    if (vec) {
      cp_async16(smem_u32(dst + o), src + ch * 16, n <= 0 ? 0 : n < 16 ? n : 16);
    } else {
#pragma unroll 1
      for (int e = 0; e < 16; e++) dst[o + e] = e < n ? src[ch * 16 + e] : 0;
    }
  }
}

/* A key block as the producer's walker publishes it (Fp8TmaSmem::DESC). */
struct Fp8BlockDesc {
  int start, len, bh, tma; /* len -1: no more blocks */
};

/* The producer's walker (thread 0 of warpgroup 2): items from the
** scheduler, each one's Q by TMA, its key blocks through the ring: per
** block, once the buffer is free, the block's Fp8BlockDesc for the helpers
** (dfull) and, where TMA takes the block, its K, V and k_scale onto full. */
template <int D, bool PERSIST>
__device__ __forceinline__ void fp8_walk_tma(const Fp8TmaParams &x, unsigned char *sm) {
  using L = Fp8TmaSmem<D, FP8_WS_NB>;
  constexpr int NB = FP8_WS_NB;
  const Fp8Params &a = x.p;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *empty = full + NB, *qfull = empty + NB,
           *qempty = qfull + 2, *dfull = qempty + 2;
  int *sitem = (int *)(sm + L::ITEM);
  Fp8BlockDesc *desc = (Fp8BlockDesc *)(sm + L::DESC);
  int g = 0; /* key blocks so far */
  for (int k = 0;; k++) {
    const int qb = k & 1;
    if (k >= 2) mbar_wait(&qempty[qb], ((k >> 1) - 1) & 1);
    const int j = next_item<PERSIST>(a, k);
    sitem[qb] = j;
    if (j < 0) {
      mbar_arrive(&qfull[qb]); /* the consumers read -1 and stop */
      const int b = g % NB;
      if (g >= NB) mbar_wait(&empty[b], (g / NB - 1) & 1); /* desc[b] read */
      desc[b] = Fp8BlockDesc{0, -1, 0, 0};                  /* the helpers stop */
      mbar_arrive(&dfull[b]);
      return;
    }
    int64_t bh, it, q0, q1, ks;
    int kl;
    fp8_ws_item(a, j, bh, it);
    Fp8Runs runs;
    Fp8Walk wk = {0, 0};
    fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, true);
    mbar_expect_tx(&qfull[qb], FP8_BM * D);
    tma_load_3d(sm + L::Q + qb * L::QB, &x.mq, 0, (int)q0, (int)bh, &qfull[qb]);
    while (wk.next(a, runs, ks, kl)) {
      const int b = g % NB;
      const bool tma = x.tma_kv && kl == FP8_BK && (ks & 15) == 0;
      if (g >= NB) mbar_wait(&empty[b], (g / NB - 1) & 1);
      desc[b] = Fp8BlockDesc{(int)ks, kl, (int)bh, tma};
      mbar_arrive(&dfull[b]);
      if (tma) {
        mbar_expect_tx(&full[b], L::KB + L::VB + FP8_BK * 4);
        tma_load_3d(sm + L::K + b * L::KB, &x.mk, 0, (int)ks, (int)bh, &full[b]);
        tma_load_3d(sm + L::V + b * L::VB, &x.mv, (int)ks, 0, (int)bh, &full[b]);
        bulk_load(sm + L::KS + b * FP8_BK * 4, a.k_scale + bh * a.R + ks, FP8_BK * 4, &full[b]);
      } else {
        mbar_arrive(&full[b]);
      }
      g++;
    }
  }
}

/* The producer's helpers (warps 1..3 of warpgroup 2, h: 0..95): per block
** published by the walker, the mask of columns h and h + 96 (0, or -inf
** for a key past the block or a padding row) and, where TMA does not take
** the block, its K rows, V rows and k_scale by cp.async; then each arrives
** on full[b]. */
template <int D>
__device__ __forceinline__ void fp8_help_tma(const Fp8Params &a, unsigned char *sm, int h) {
  using L = Fp8TmaSmem<D, FP8_WS_NB>;
  constexpr int NB = FP8_WS_NB, NH = 96;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *dfull = full + 2 * NB + 4;
  const Fp8BlockDesc *desc = (const Fp8BlockDesc *)(sm + L::DESC);
  float *mask = (float *)(sm + L::MASK);
  for (int g = 0;; g++) {
    const int b = g % NB;
    mbar_wait(&dfull[b], (g / NB) & 1);
    const Fp8BlockDesc d = desc[b];
    if (d.len < 0) return;
    for (int c = h; c < FP8_BK; c += NH) {
      const int kp = fp8_col_key(c);
      const bool ok = kp < d.len && (!a.has_pad || fp8_source(a.g, d.start + kp) >= 0);
      mask[b * FP8_BK + c] = ok ? 0.0f : -INFINITY;
      if (!d.tma) fp8_load_krow<D, L>(a, sm, b, d.bh, d.start, d.len, c, ok);
    }
    if (!d.tma) {
      for (int vr = h; vr < 2 * D; vr += NH) fp8_load_vrow<D, L>(a, sm, b, d.bh, d.start, d.len, vr);
      cp_async_commit();
      cp_async_wait_all();
      fence_proxy_async();
    }
    mbar_arrive(&full[b]);
  }
}

/* 384 threads, warpgroup 2 the producer (setmaxnreg down), 0 and 1 the
** consumers (kernel_fp8.cuh's fp8_consume over this layout; OVL: its
** blocks by mainloop_fp8.cuh's fp8_blocks_ovl); PERSIST as sta_fp8_fwd_ws. */
template <int D, bool PERSIST, bool OVL>
__global__ void __launch_bounds__(384, 1) sta_fp8_fwd_tma(const __grid_constant__ Fp8TmaParams x) {
  using L = Fp8TmaSmem<D, FP8_WS_NB>;
  constexpr int NB = FP8_WS_NB;
  extern __shared__ unsigned char fp8_smem_raw[];
  unsigned char *sm = (unsigned char *)(((uintptr_t)fp8_smem_raw + 1023) & ~(uintptr_t)1023);
  const int tid = threadIdx.x;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0); /* warp-uniform */
  if (tid == 0) {
    uint64_t *bar = (uint64_t *)(sm + L::BAR);
    for (int b = 0; b < NB; b++) {
      mbar_init(&bar[b], 97);           /* full: the walker and the 96 helpers */
      mbar_init(&bar[NB + b], 256);     /* empty: the consumer threads */
      mbar_init(&bar[2 * NB + 4 + b], 1); /* dfull: the walker */
    }
    for (int b = 0; b < 2; b++) {
      mbar_init(&bar[2 * NB + b], 1);       /* qfull: the walker */
      mbar_init(&bar[2 * NB + 2 + b], 256); /* qempty */
    }
  }
  __syncthreads();
  if (wg == 2) {
    setmaxnreg_dec<FP8_TMA_PREG>();
    if (tid == 256) fp8_walk_tma<D, PERSIST>(x, sm);
    else if (tid >= 288) fp8_help_tma<D>(x.p, sm, tid - 288);
    return;
  }
  setmaxnreg_inc<FP8_TMA_CREG>();
  fp8_consume<D, L, OVL && STA_FP8_TWO_LEVEL>(x.p, sm, tid);
}

/* The kernel over bh x n_items items (run_fp8's launch, with x's maps);
** OVL: S(n+1) before P V(n). */
template <int D, bool OVL>
sta_status run_fp8_tma(const Fp8TmaParams &x0, int64_t bh, int64_t n_items) {
  Fp8TmaParams *x = (Fp8TmaParams *)aligned_alloc(alignof(Fp8TmaParams), sizeof(Fp8TmaParams));
  if (!x) return sta_error(STA_ERR_NOMEM, "attention: out of host memory");
  *x = x0;
  int grid = 0;
  sta_status s = fp8_items(&x->p, bh, n_items, &grid);
  if (s == STA_OK) {
    const int smem = Fp8TmaSmem<D, FP8_WS_NB>::BYTES + 1024;
    s = x->p.sched ? fp8_launch(sta_fp8_fwd_tma<D, true, OVL>, *x, grid, smem)
                   : fp8_launch(sta_fp8_fwd_tma<D, false, OVL>, *x, grid, smem);
  }
  free(x);
  return s;
}

} /* namespace sta */

#endif
