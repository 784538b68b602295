/*
** producer_fp8.cuh -- the fp8 forward kernel's (kernel_fp8.cuh) work items,
** key blocks, shared memory and producer warpgroup.  The pre-pass writes
** k8 and k_scale in the kernel's key order (core/fp8_internal.h's
** sta_fp8_kslot), so a block of 128 keys from a 16-row boundary is one box
** of a 3-D map as it lies.
**
** Producer warpgroup (setmaxnreg down to FP8_PREG, no spills: 32 spills):
** the walker (its thread 0) and 96 helpers (warps 1..3; lanes 1..31 of
** warp 0 leave).  The walker takes the items, loads each one's Q by TMA
** (map mq, box D x 128 rows; rows past R zero) onto qfull, and per key
** block, once its buffer is free (empty), publishes the block
** (Fp8BlockDesc, dfull) and, where the block is 128 keys from a 16-row
** boundary and R % 16 == 0 (v_vec), loads K (mk), V (mv, box 128 keys x
** D) and its k_scale (a 512-byte bulk copy) onto full[b].
** The helpers write each column's mask (0, or -inf for a key past the
** block or a padding row) and load the blocks TMA does not take by
** cp.async (fp8_load_krow, fp8_load_vrow, through sta_fp8_kslot); full[b]
** counts the walker (its arrival carries the bytes) and the 96 helpers.
**
** Shared memory (Fp8Smem): two Q buffers (item k of a CTA in k & 1, so the
** next item's Q loads under this one's blocks), a ring of FP8_NB key
** blocks.  Q and K rows of D bytes (128-byte swizzle at D 128, 64-byte at
** D 64: what TMA writes; the S descriptors' high word HI says which), V
** as rows of d, 128 keys each (K-major B of the PV GEMM, 128-byte
** swizzle), the per-key info as two arrays (k_scale, mask:
** mainloop_fp8.cuh's Fp8KeyInfo).
*/
#ifndef STA_PRODUCER_FP8_CUH
#define STA_PRODUCER_FP8_CUH

#include "mainloop_fp8.cuh"
#include "tile_scheduler.cuh" /* next_item */

namespace sta {

/* The key (within its block) that S column / K row c holds: in each
** 32-key chunk, a thread's accumulator columns 2t, 2t+1, 8+2t, 9+2t (and
** 16 more) hold keys 4t..4t+3 (and 16 more), its A fragment's k order
** (core/fp8_internal.h's sta_fp8_col_key, which the pre-pass's key layout
** follows). */
__device__ __forceinline__ int fp8_col_key(int c) { return sta_fp8_col_key(c); }

/* The key blocks of one item: runs of key rows (a window's rows of tiles
** along w, then the text keys; text queries: every row below keys_end),
** each cut into blocks of FP8_BK.  Every thread that needs them computes
** the runs (Fp8Runs) in its registers and walks them with its own cursor
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

/* The item's query rows [q0, q1) and its key runs (wk: written only where
** runs is set). */
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
      const int k = a.win[3 * h + ax]; /* clamped to the grid (clamp_windows) */
      wk.lo[ax] = sta_window_start(tc[ax], k, a.g.grid[ax]); /* the rule: core/mask.h */
      wk.cnt[ax] = k;
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

/* Work item j of a launch: (batch * head, item of fp8_item_runs).
** The text query blocks of every head first (each over all keys: the
** longest), then head by head its tile items in order (neighbours share
** key blocks in L2). */
__device__ __forceinline__ void fp8_item(const Fp8Params &a, int j, int64_t &bh, int64_t &it) {
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

/* key blocks in the ring: 4, 3 where O in shared memory would not fit
** beside 4 at D 128 (2 for three consumer warpgroups' O) */
template <int D> struct Fp8Smem {
  static constexpr int NB = D == 128 ? (FP8_NWG == 3 ? 2 : 3) : 4;
  static constexpr int QP = D, QB = FP8_BM * QP; /* a Q or K row's bytes; a Q buffer */
  /* descriptors: SBO 8 rows, 128- or 64-byte swizzle */
  static constexpr uint32_t HI = ((8 * QP) >> 4) | ((D == 128 ? 1u : 2u) << 30);
  static constexpr int KB = FP8_BK * QP, VB = D * 128;
  static constexpr int Q = 0;
  static constexpr int K = Q + 2 * QB;
  static constexpr int V = K + NB * KB;
  static constexpr int OS = V + NB * VB; /* O: [D / 8][FP8_CT] float4 */
  static constexpr int KS = OS + FP8_CT * D / 2 * 4; /* k_scale [NB][FP8_BK] */
  static constexpr int MASK = KS + NB * FP8_BK * 4; /* 0 or -inf [NB][FP8_BK] */
  static constexpr int KU = MASK + NB * FP8_BK * 4;  /* [NB][2]: fp8_helpers' ku */
  static constexpr int BAR = KU + NB * 2 * 4; /* full, empty, qfull, qempty, dfull */
  static constexpr int ITEM = BAR + (3 * NB + 4) * 8;
  static constexpr int DESC = ITEM + 8;              /* Fp8BlockDesc [NB] */
  static constexpr int BYTES = DESC + NB * 16;
  static_assert(D == 64 || D == 128, "rows of 64 or 128 bytes");
  static_assert(BYTES + 1024 <= 232448, "more shared memory than a CTA may have");
  /* 16-byte chunk ch of K row c, as the swizzle puts it */
  static __device__ __forceinline__ int kswz(int c, int ch) {
    return c * QP + ((ch ^ ((c * QP >> 7) & (QP / 16 - 1))) << 4);
  }
  /* buffer b's per-key info (mainloop_fp8.cuh's Fp8KeyInfo); has_pad:
  ** Fp8Params::has_pad */
  static __device__ __forceinline__ Fp8KeyInfo info(const unsigned char *sm, int b, int has_pad) {
    const uint32_t s0 = smem_u32(sm);
    int len; /* Fp8BlockDesc::len of the buffer's block */
    asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(len) : "r"(s0 + DESC + 16 * b + 4));
    return Fp8KeyInfo{s0 + KS + 4 * FP8_BK * b, s0 + MASK + 4 * FP8_BK * b,
                      has_pad || len < FP8_BK, s0 + KU + 8 * b};
  }
};
/* setmaxnreg: producer, consumers (two consumer warpgroups over whole
** blocks hold a block's S, P and the fresh P V accumulator; three over
** halves: what 512 threads leave) */
constexpr int FP8_PREG = FP8_NWG == 3 ? 32 : 40;
constexpr int FP8_CREG = FP8_NWG == 3 ? 160 : 232;
static_assert(128 * (FP8_PREG + FP8_NWG * FP8_CREG) <=
                  (65536 / FP8_THREADS) / 8 * 8 * FP8_THREADS,
              "setmaxnreg: more registers than the launch gives the CTA");

/* The block's key row c and its k_scale (ok: its key is a key) by cp.async
** through the key layout: smem row c holds key start + fp8_col_key(c);
** zeros past len. */
template <int D>
__device__ __forceinline__ void fp8_load_krow(const Fp8Params &a, unsigned char *sm, int buf,
                                              int64_t bh, int start, int len, int c, bool ok) {
  using L = Fp8Smem<D>;
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

/* The block's V row vr (channel d) by cp.async (16 bytes at a time
** where the block starts 16-byte aligned and R % 16 == 0, else bytewise),
** zeros past len. */
template <int D>
__device__ __forceinline__ void fp8_load_vrow(const Fp8Params &a, unsigned char *sm, int buf,
                                              int64_t bh, int start, int len, int vr) {
  using L = Fp8Smem<D>;
  const uint8_t *src = a.v8 + (bh * D + vr) * a.R + start;
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

/* A key block as the walker publishes it (Fp8Smem::DESC). */
struct Fp8BlockDesc {
  int start, len, bh, tma; /* len -1: no more blocks */
};

/* The producer's walker (thread 0 of warpgroup 2): items from the
** scheduler, each one's Q by TMA, its key blocks through the ring: per
** block, once the buffer is free, the block's Fp8BlockDesc for the helpers
** (dfull) and, where TMA takes the block, its K, V and k_scale onto full. */
template <int D, bool PERSIST>
__device__ __forceinline__ void fp8_walker(const Fp8Params &a, unsigned char *sm) {
  using L = Fp8Smem<D>;
  constexpr int NB = L::NB;
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
    fp8_item(a, j, bh, it);
    Fp8Runs runs;
    Fp8Walk wk = {0, 0};
    fp8_item_runs(a, it, (int)(bh % a.heads), runs, q0, q1, true);
    mbar_expect_tx(&qfull[qb], FP8_BM * D);
    tma_load_3d(sm + L::Q + qb * L::QB, &a.mq, 0, (int)q0, (int)bh, &qfull[qb]);
    while (wk.next(a, runs, ks, kl)) {
      const int b = g % NB;
      const bool tma = a.v_vec && kl == FP8_BK && (ks & 15) == 0;
      if (g >= NB) mbar_wait(&empty[b], (g / NB - 1) & 1);
      desc[b] = Fp8BlockDesc{(int)ks, kl, (int)bh, tma};
      mbar_arrive(&dfull[b]);
      if (tma) {
        mbar_expect_tx(&full[b], L::KB + L::VB + FP8_BK * 4);
        tma_load_3d(sm + L::K + b * L::KB, &a.mk, 0, (int)ks, (int)bh, &full[b]);
        tma_load_3d(sm + L::V + b * L::VB, &a.mv, (int)ks, 0, (int)bh, &full[b]);
        bulk_load(sm + L::KS + b * FP8_BK * 4, a.k_scale + bh * a.R + ks, FP8_BK * 4, &full[b]);
      } else {
        mbar_arrive(&full[b]);
      }
      g++;
    }
  }
}

/* The producer's helpers (warps 1..3 of the producer warpgroup, h:
** 0..95): per block published by the walker, the mask of columns h and
** h + 96 (0, or -inf for a key past the block or a padding row); ku of
** half 0 (warp h / 32 = 0) and 1 (1): the k_scale all its 64 keys share
** where they share one (finite) and the block is whole, unmasked and
** TMA's (its keys 64 rows of k_scale from start + 64 half: the pre-pass's
** key groups where start is a multiple of 64), else -1 (mainloop_fp8.cuh,
** fp8_softmax_u); where TMA does not take the block, its K rows, V rows
** and k_scale by cp.async; then each arrives on full[b]. */
template <int D>
__device__ __forceinline__ void fp8_helpers(const Fp8Params &a, unsigned char *sm, int h) {
  using L = Fp8Smem<D>;
  constexpr int NB = L::NB, NH = 96;
  uint64_t *full = (uint64_t *)(sm + L::BAR), *dfull = full + 2 * NB + 4;
  const Fp8BlockDesc *desc = (const Fp8BlockDesc *)(sm + L::DESC);
  float *mask = (float *)(sm + L::MASK), *ku = (float *)(sm + L::KU);
  const int lane = h & 31, half = h >> 5;
  for (int g = 0;; g++) {
    const int b = g % NB;
    mbar_wait(&dfull[b], (g / NB) & 1);
    const Fp8BlockDesc d = desc[b];
    if (d.len < 0) return;
    if (half < 2) { /* warp-uniform */
      bool one = false;
      float v = -1.0f;
      if (d.tma && !a.has_pad) { /* tma: len FP8_BK, start % 16 == 0, R % 16 == 0 */
        const float2 x = __ldg((const float2 *)(a.k_scale + (int64_t)d.bh * a.R + d.start +
                                                64 * half) + lane);
        v = __shfl_sync(0xffffffffu, x.x, 0);
        one = __all_sync(0xffffffffu, x.x == v && x.y == v && v >= 0.0f && v < INFINITY);
      }
      if (lane == 0) ku[2 * b + half] = one ? v : -1.0f;
    }
    for (int c = h; c < FP8_BK; c += NH) {
      const int kp = fp8_col_key(c);
      const bool ok = kp < d.len && (!a.has_pad || fp8_source(a.g, d.start + kp) >= 0);
      mask[b * FP8_BK + c] = ok ? 0.0f : -INFINITY;
      if (!d.tma) fp8_load_krow<D>(a, sm, b, d.bh, d.start, d.len, c, ok);
    }
    if (!d.tma) {
      for (int vr = h; vr < D; vr += NH) fp8_load_vrow<D>(a, sm, b, d.bh, d.start, d.len, vr);
      cp_async_commit();
      cp_async_wait_all();
      fence_proxy_async();
    }
    mbar_arrive(&full[b]);
  }
}

} /* namespace sta */

#endif
