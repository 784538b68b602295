/*
** sta_backward.cu -- the STA backward on the GPU (STA.md section 10),
** sm_90a.
**
** Three launches on the caller's stream:
**   1. prep: D_i = dO_i . O_i per row (f32), dK = dV = 0 on the rows that
**      are never keys (>= V + text_len); the f32 dQ accumulator is zeroed;
**   2. the main kernel: one CTA per (batch, head, key block of 128 keys: a
**      third of a 6x8x8 tile, or 128 text keys), text key blocks first (every
**      query sees them: the longest items).  Two warpgroups own 64 keys each;
**      K and V stay in shared memory while the CTA walks the query rows that
**      see its key tile -- on each axis one contiguous range of query tiles
**      (STA.md section 10), then every text row -- in blocks of 64, the next
**      block's Q, dO (cp.async, 128-byte swizzle) and LSE, D prefetched while
**      the current one computes:
**        S^T = K Q^T, dP^T = V dO^T          (wgmma, both from shared memory)
**        P^T = 2^(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - D)
**        dV += P^T dO, dK += dS^T Q          (P^T, dS^T from registers)
**        dQ += dS K                          (dS^T through shared memory),
**      dQ added into the f32 accumulator (red.global.add), dK (times the
**      scale) and dV stored once at the end, in the inputs' dtype;
**   3. post: dq = scale * the accumulator, in the inputs' dtype.
** Rows outside the canvas or past a partial tile are zero-filled: a zero Q
** or K row adds nothing to any gradient, so no mask is needed.
*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sta_cuda.h"
#include "wgmma.cuh"

#define STA_BWD_MAX_HEADS 1024

namespace {

constexpr int BK = 128; /* keys per CTA: two warpgroups of 64 */
constexpr int BQ = 64;  /* query rows per step */
constexpr int NTH = 256;
constexpr float LOG2E = 1.4426950408889634f;

struct BwdArgs {
  const void *q, *k, *v, *dout;
  const float *lse;
  void *dk, *dv;
  float *dqacc;    /* [B][H][S][D], zeroed */
  const float *dd; /* [B][H][S]: D_i */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, lse_sb, lse_sh, lse_ss;
  int S, V, text_len, heads, batch, vec;
  int cT, cH, cW, tt, th, tw, NT, NH, NW, tile_vol;
  int kbpt;      /* key blocks per tile */
  int n_text_kb; /* text key blocks per (batch, head) */
  float scale, scale_log2;
  int16_t win[3 * STA_BWD_MAX_HEADS]; /* min(K, C) per head and axis */
};

/* ---- PTX helpers ------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(src), "r"(nbytes));
}
__device__ __forceinline__ void cp_async_commit_wait() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bar_named(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void red_add2(float *p, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}

template <typename T> __device__ __forceinline__ uint32_t pack2(float x, float y);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float x, float y) {
  __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  return *reinterpret_cast<uint32_t *>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float x, float y) {
  __half2 h = __floats2half2_rn(x, y);
  return *reinterpret_cast<uint32_t *>(&h);
}
template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

/* element offset of (row r, 16-byte chunk ch) in a swizzled R-row tile of
** 64-column halves: the 128-byte swizzle atom, 1024-byte aligned */
__device__ __forceinline__ int swz(int r, int ch, int R) {
  return ((ch >> 3) * R + r) * 64 + (((ch & 7) ^ (r & 7)) << 3);
}

/* Shared-memory descriptors (see sta_attention.cu): lo = address >> 4 |
** LBO >> 4 << 16; hi = SBO 1024 | 128-byte swizzle. */
__device__ __forceinline__ uint32_t sdesc_lo(const void *p, uint32_t lbo) {
  return ((smem_u32(p) & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
}
__device__ __forceinline__ uint64_t sdesc(uint32_t lo) {
  return ((uint64_t)((1024 >> 4) | (1u << 30)) << 32) | lo;
}

template <typename T, int D> struct Ops;
template <> struct Ops<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void ss64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16(d, a, b, s); }
  static __device__ __forceinline__ void ss64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16_tt(d, a, b, s); }
  static __device__ __forceinline__ void rsD(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_bf16_tb(d, a, b, 1); }
};
template <> struct Ops<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void ss64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16(d, a, b, s); }
  static __device__ __forceinline__ void ss64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16_tt(d, a, b, s); }
  static __device__ __forceinline__ void rsD(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_bf16_tb(d, a, b, 1); }
};
template <> struct Ops<__half, 128> {
  static __device__ __forceinline__ void ss64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16(d, a, b, s); }
  static __device__ __forceinline__ void ss64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16_tt(d, a, b, s); }
  static __device__ __forceinline__ void rsD(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_f16_tb(d, a, b, 1); }
};
template <> struct Ops<__half, 64> {
  static __device__ __forceinline__ void ss64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16(d, a, b, s); }
  static __device__ __forceinline__ void ss64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16_tt(d, a, b, s); }
  static __device__ __forceinline__ void rsD(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_f16_tb(d, a, b, 1); }
};

/* One 16-byte chunk of row `row` (-1: zeros) into a swizzled tile. */
template <typename T>
__device__ __forceinline__ void load_chunk(T *dst, const T *g, int64_t ss, int row, int ch,
                                           int vec) {
  if (vec) {
    cp_async16(dst, row >= 0 ? g + (int64_t)row * ss + ch * 8 : g, row >= 0 ? 16 : 0);
    return;
  }
  uint4 tmp = make_uint4(0, 0, 0, 0);
  if (row >= 0) {
    const uint16_t *src = reinterpret_cast<const uint16_t *>(g + (int64_t)row * ss + ch * 8);
    uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
#pragma unroll
    for (int e = 0; e < 8; e++) t16[e] = src[e];
  }
  *reinterpret_cast<uint4 *>(dst) = tmp;
}

/* ---- the query blocks that see a key tile -------------------------------- */

/* Query tiles [*lo, *hi] on one axis of c tiles whose window (k, already
** min(K, c)) holds key tile kt: contiguous, since the start of a window
** never decreases with the query tile. */
__device__ __forceinline__ void seen_by(int kt, int k, int c, int *lo, int *hi) {
  *lo = c;
  *hi = -1;
  for (int q = 0; q < c; q++) {
    int s = q - k / 2;
    s = s < 0 ? 0 : s;
    s = s < c - k ? s : c - k;
    if (kt >= s && kt < s + k) {
      *lo = min(*lo, q);
      *hi = q;
    }
  }
}

/* An odometer over the query blocks of one CTA: the tiles of the ranges
** (t slowest), each in blocks of BQ rows of its (t, h, w) order, then the
** text rows in blocks of BQ. */
struct QWalk {
  int ta, tz, ha, hz, wa, wz; /* tile ranges */
  int it, ih, iw, blk, nblk, et, eh, ew;
  int tb;   /* text block */
  int kind; /* 0 tiles, 1 text rows, 2 done */

  __device__ __forceinline__ void enter(const BwdArgs &a) {
    et = min(a.tt, a.cT - it * a.tt);
    eh = min(a.th, a.cH - ih * a.th);
    ew = min(a.tw, a.cW - iw * a.tw);
    nblk = (et * eh * ew + BQ - 1) / BQ;
    blk = 0;
  }
  __device__ __forceinline__ void start(const BwdArgs &a) {
    kind = 0;
    it = ta;
    ih = ha;
    iw = wa;
    tb = 0;
    enter(a);
  }
  __device__ __forceinline__ void next(const BwdArgs &a) {
    if (kind == 0) {
      if (++blk < nblk) return;
      if (++iw > wz) {
        iw = wa;
        if (++ih > hz) {
          ih = ha;
          if (++it > tz) {
            kind = a.S > a.V ? 1 : 2;
            return;
          }
        }
      }
      enter(a);
    } else if (kind == 1) {
      if (++tb * BQ >= a.S - a.V) kind = 2;
    }
  }
  /* global row of query r (< BQ) of the current block, or -1 */
  __device__ __forceinline__ int row(const BwdArgs &a, int r) const {
    if (kind == 1) {
      int s = a.V + tb * BQ + r;
      return s < a.S ? s : -1;
    }
    int li = blk * BQ + r, ehw = eh * ew;
    if (li >= et * ehw) return -1;
    int dt = li / ehw, rr = li - dt * ehw, dh = rr / ew, dw = rr - dh * ew;
    return ((it * a.tt + dt) * a.cH + ih * a.th + dh) * a.cW + iw * a.tw + dw;
  }
};

/* ---- the main kernel ------------------------------------------------------ */

template <int D> struct Smem {
  static constexpr int K = 0;
  static constexpr int V = K + BK * D * 2;
  static constexpr int Q = V + BK * D * 2;       /* [2][BQ][D] */
  static constexpr int DO = Q + 2 * BQ * D * 2;  /* [2][BQ][D] */
  static constexpr int DS = DO + 2 * BQ * D * 2; /* [2][BK][BQ] */
  static constexpr int LSE = DS + 2 * BK * BQ * 2;
  static constexpr int DD = LSE + 2 * BQ * 4;
  static constexpr int ROW = DD + 2 * BQ * 4;
  static constexpr int KROW = ROW + 2 * BQ * 4;
  static constexpr int BYTES = KROW + BK * 4 + 1024; /* + alignment */
};

template <typename T, int D>
__global__ void __launch_bounds__(NTH, 1) sta_bwd_kernel(const __grid_constant__ BwdArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  using L = Smem<D>;
  T *sK = reinterpret_cast<T *>(base + L::K), *sV = reinterpret_cast<T *>(base + L::V);
  T *sQ = reinterpret_cast<T *>(base + L::Q), *sdO = reinterpret_cast<T *>(base + L::DO);
  T *sdS = reinterpret_cast<T *>(base + L::DS);
  float *slse = reinterpret_cast<float *>(base + L::LSE), *sdd = reinterpret_cast<float *>(base + L::DD);
  int *srow = reinterpret_cast<int *>(base + L::ROW), *skrow = reinterpret_cast<int *>(base + L::KROW);
  constexpr int CH = D / 8; /* 16-byte chunks per row */

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;

  /* the work item: text key blocks of every (batch, head) first */
  int item = blockIdx.x, b, h, text;
  int kt0 = 0, kh0 = 0, kw0 = 0, kt = 0, khh = 0, kw = 0, kb = 0, kcount;
  const int n_text = a.batch * a.heads * a.n_text_kb;
  if (item < n_text) {
    int bh = item / a.n_text_kb;
    kb = item - bh * a.n_text_kb;
    b = bh / a.heads;
    h = bh - b * a.heads;
    text = 1;
    kcount = min(BK, a.text_len - kb * BK);
  } else {
    int j = item - n_text, per = a.NT * a.NH * a.NW * a.kbpt;
    int bh = j / per, r = j - bh * per, tl = r / a.kbpt;
    b = bh / a.heads;
    h = bh - b * a.heads;
    kb = r - tl * a.kbpt;
    kt = tl / (a.NH * a.NW);
    khh = (tl / a.NW) % a.NH;
    kw = tl % a.NW;
    kt0 = kt * a.tt;
    kh0 = khh * a.th;
    kw0 = kw * a.tw;
    text = 0;
    int vol = min(a.tt, a.cT - kt0) * min(a.th, a.cH - kh0) * min(a.tw, a.cW - kw0);
    kcount = min(BK, vol - kb * BK);
  }
  if (kcount <= 0) return; /* a block past a partial tile's end */

  QWalk qw;
  if (text) {
    qw.ta = 0; qw.tz = a.NT - 1; qw.ha = 0; qw.hz = a.NH - 1; qw.wa = 0; qw.wz = a.NW - 1;
  } else {
    seen_by(kt, a.win[3 * h], a.NT, &qw.ta, &qw.tz);
    seen_by(khh, a.win[3 * h + 1], a.NH, &qw.ha, &qw.hz);
    seen_by(kw, a.win[3 * h + 2], a.NW, &qw.wa, &qw.wz);
  }

  const T *gq = reinterpret_cast<const T *>(a.q) + b * a.q_sb + h * a.q_sh;
  const T *gk = reinterpret_cast<const T *>(a.k) + b * a.k_sb + h * a.k_sh;
  const T *gv = reinterpret_cast<const T *>(a.v) + b * a.v_sb + h * a.v_sh;
  const T *gdo = reinterpret_cast<const T *>(a.dout) + b * a.do_sb + h * a.do_sh;
  const float *glse = a.lse + b * a.lse_sb + h * a.lse_sh;
  const int64_t bhS = ((int64_t)b * a.heads + h) * a.S;
  const float *gdd = a.dd + bhS;

  /* key rows of the block */
  if (tid < BK) {
    int r = tid, row = -1;
    if (r < kcount) {
      if (text) {
        row = a.V + kb * BK + r;
      } else {
        int et = min(a.tt, a.cT - kt0), eh = min(a.th, a.cH - kh0), ew = min(a.tw, a.cW - kw0);
        int li = kb * BK + r, ehw = eh * ew, dt = li / ehw, rr = li - dt * ehw;
        int dh = rr / ew, dw = rr - dh * ew;
        (void)et;
        row = ((kt0 + dt) * a.cH + kh0 + dh) * a.cW + kw0 + dw;
      }
    }
    skrow[r] = row;
  }
  __syncthreads();
  for (int c = tid; c < BK * CH; c += NTH) {
    int r = c / CH, ch = c - r * CH, row = skrow[r];
    load_chunk(sK + swz(r, ch, BK), gk, a.k_ss, row, ch, a.vec);
    load_chunk(sV + swz(r, ch, BK), gv, a.v_ss, row, ch, a.vec);
  }

  /* block `st` of the walk into stage st: Q, dO by cp.async; the LSE (log2
  ** domain), D and row of each query by thread r < BQ (returned, stored by
  ** store_meta once the stage is free) */
  auto load_q = [&](const QWalk &w, int st) {
    T *q = sQ + st * BQ * D, *g = sdO + st * BQ * D;
    for (int c = tid; c < BQ * CH; c += NTH) {
      int r = c / CH, ch = c - r * CH, row = w.row(a, r);
      load_chunk(q + swz(r, ch, BQ), gq, a.q_ss, row, ch, a.vec);
      load_chunk(g + swz(r, ch, BQ), gdo, a.do_ss, row, ch, a.vec);
    }
  };
  auto store_meta = [&](const QWalk &w, int st) {
    if (tid < BQ) {
      int row = w.row(a, tid);
      srow[st * BQ + tid] = row;
      slse[st * BQ + tid] = row >= 0 ? glse[(int64_t)row * a.lse_ss] * LOG2E : 0.f;
      sdd[st * BQ + tid] = row >= 0 ? gdd[row] : 0.f;
    }
  };

  qw.start(a);
  load_q(qw, 0);
  store_meta(qw, 0);
  cp_async_commit_wait();
  fence_proxy_async();
  __syncthreads();

  const float sl2 = a.scale_log2;
  const uint32_t dK0 = sdesc_lo(sK + wg * 64 * 64, 16), dV0 = sdesc_lo(sV + wg * 64 * 64, 16);
  /* dQ's B: K's column half wg (D 128: each warpgroup takes 64 of D over all
  ** 128 keys) or K's rows of this warpgroup (D 64: all of D over its own 64
  ** keys) */
  const uint32_t dKq = D == 128 ? sdesc_lo(sK + wg * BK * 64, 16) : sdesc_lo(sK + wg * 64 * 64, 16);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int e = 0; e < D / 2; e++) dk[e] = dv[e] = 0.f;

  for (int it = 0; qw.kind != 2; it++) {
    const int st = it & 1;
    QWalk nx = qw;
    nx.next(a);
    if (nx.kind != 2) load_q(nx, st ^ 1); /* the next block, under this one */
    asm volatile("cp.async.commit_group;\n" ::: "memory");

    const uint32_t dQs = sdesc_lo(sQ + st * BQ * D, 16), dOs = sdesc_lo(sdO + st * BQ * D, 16);
    float s[BQ / 2], dp[BQ / 2];
    sta_wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      Ops<T, D>::ss64(s, sdesc(dK0 + ko), sdesc(dQs + qo), ks > 0);
    }
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      Ops<T, D>::ss64(dp, sdesc(dV0 + ko), sdesc(dOs + qo), ks > 0);
    }
    sta_wgmma::commit();
    sta_wgmma::wait<0>();
    sta_wgmma::pin<BQ / 2>(s);
    sta_wgmma::pin<BQ / 2>(dp);

    /* P^T and dS^T: rows keys, columns queries c = 8j + 2(lane&3) + e */
    const float *ls = slse + st * BQ, *ds = sdd + st * BQ;
#pragma unroll
    for (int j = 0; j < BQ / 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int c = 8 * j + 2 * (lane & 3) + e;
        const float l2 = ls[c], di = ds[c];
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
          const int x = 4 * j + 2 * hr + e;
          const float p = ex2(fmaf(s[x], sl2, -l2));
          s[x] = p;
          dp[x] = p * (dp[x] - di);
        }
      }
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        pa[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
        da[kk][i] = pack2<T>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
      }
    /* dV += P^T dO, dK += dS^T Q (dO and Q as MN-major B) */
    const uint32_t dOt = sdesc_lo(sdO + st * BQ * D, BQ * 128), dQt = sdesc_lo(sQ + st * BQ * D, BQ * 128);
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      Ops<T, D>::rsD(dv, pa[kk], sdesc(dOt + (uint32_t)((kk * 16 * 128) >> 4)));
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      Ops<T, D>::rsD(dk, da[kk], sdesc(dQt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();

    /* dS^T into shared memory: row = key, column = query */
    T *sds = sdS + st * BK * BQ;
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = 2 * kk + (i >> 1), hr = i & 1;
        const int r = wg * 64 + wq * 16 + (lane >> 2) + 8 * hr, c = 8 * j + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sds + swz(r, c >> 3, BK) + (c & 7)) = da[kk][i];
      }
    fence_proxy_async();
    if (D == 128) bar_named(1, NTH); /* dQ reads both warpgroups' dS^T */
    else __syncwarp();

    /* dQ: queries x (D 128: 64 columns of D over all 128 keys; D 64: all of
    ** D over this warpgroup's 64 keys) */
    float dq[32];
    const uint32_t dSt = sdesc_lo(D == 128 ? sds : sds + wg * 64 * 64, 16);
    constexpr int KQ = D == 128 ? BK / 16 : 4;
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < KQ; kk++)
      Ops<T, D>::ss64tt(dq, sdesc(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                        sdesc(dKq + (uint32_t)((kk * 16 * 128) >> 4)), kk > 0);
    sta_wgmma::commit();
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(dv);
    sta_wgmma::pin<D / 2>(dk);
    sta_wgmma::pin<32>(dq);
    sta_wgmma::pin_r<BQ / 4>(&pa[0][0]);
    sta_wgmma::pin_r<BQ / 4>(&da[0][0]);

    /* dQ into the f32 accumulator */
    const int *rows = srow + st * BQ;
    const int col0 = D == 128 ? wg * 64 : 0;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int row = rows[wq * 16 + (lane >> 2) + 8 * hr];
      if (row < 0) continue;
      float *dst = a.dqacc + (bhS + row) * D + col0 + 2 * (lane & 3);
#pragma unroll
      for (int j = 0; j < 8; j++) red_add2(dst + 8 * j, dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
    }

    /* the next block's Q and dO landed; its LSE, D and rows into the stage
    ** this one leaves once every thread is past it */
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    fence_proxy_async();
    __syncthreads();
    if (nx.kind != 2) store_meta(nx, st ^ 1);
    __syncthreads();
    qw = nx;
  }

  /* dK (times the scale) and dV of this warpgroup's keys */
  T *gdk = reinterpret_cast<T *>(a.dk) + b * a.dk_sb + h * a.dk_sh;
  T *gdv = reinterpret_cast<T *>(a.dv) + b * a.dv_sb + h * a.dv_sh;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = skrow[wg * 64 + wq * 16 + (lane >> 2) + 8 * hr];
    if (row < 0) continue;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      const int c = 8 * j + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(gdk + (int64_t)row * a.dk_ss + c) =
          pack2<T>(dk[4 * j + 2 * hr] * a.scale, dk[4 * j + 2 * hr + 1] * a.scale);
      *reinterpret_cast<uint32_t *>(gdv + (int64_t)row * a.dv_ss + c) =
          pack2<T>(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]);
    }
  }
}

/* ---- prep and post ---------------------------------------------------------- */

struct RowArgs {
  const void *o, *dout;
  void *dk, *dv, *dq;
  float *dd;
  const float *dqacc;
  int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int64_t dq_sb, dq_ss, dq_sh;
  int S, heads, keys; /* keys: V + text_len */
  int64_t rows;       /* B * heads * S */
  float scale;
};

/* One warp per (batch, head, row): D_i = dO . O; dK = dV = 0 past the keys. */
template <typename T, int D>
__global__ void sta_bwd_prep(const __grid_constant__ RowArgs a) {
  int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  const int lane = threadIdx.x & 31, s = (int)(r % a.S);
  const int64_t bh = r / a.S, b = bh / a.heads, h = bh % a.heads;
  const T *o = reinterpret_cast<const T *>(a.o) + b * a.o_sb + s * a.o_ss + h * a.o_sh;
  const T *g = reinterpret_cast<const T *>(a.dout) + b * a.do_sb + s * a.do_ss + h * a.do_sh;
  float acc = 0.f;
#pragma unroll
  for (int d = lane; d < D; d += 32) acc += to_f<T>(o[d]) * to_f<T>(g[d]);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (lane == 0) a.dd[r] = acc;
  if (s >= a.keys) {
    T *k = reinterpret_cast<T *>(a.dk) + b * a.dk_sb + s * a.dk_ss + h * a.dk_sh;
    T *v = reinterpret_cast<T *>(a.dv) + b * a.dv_sb + s * a.dv_ss + h * a.dv_sh;
    for (int d = lane; d < D; d += 32) {
      k[d] = T(0.f);
      v[d] = T(0.f);
    }
  }
}

/* One warp per (batch, head, row): dq = scale * the accumulator. */
template <typename T, int D>
__global__ void sta_bwd_post(const __grid_constant__ RowArgs a) {
  int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (r >= a.rows) return;
  const int lane = threadIdx.x & 31, s = (int)(r % a.S);
  const int64_t bh = r / a.S, b = bh / a.heads, h = bh % a.heads;
  T *q = reinterpret_cast<T *>(a.dq) + b * a.dq_sb + s * a.dq_ss + h * a.dq_sh;
  const float *acc = a.dqacc + r * D;
  for (int d = lane; d < D; d += 32) q[d] = T(acc[d] * a.scale);
}

template <typename T, int D>
sta_status run(const sta_attn_params *p, BwdArgs &x, RowArgs &ra, cudaStream_t st) {
  const int smem = Smem<D>::BYTES;
  cudaError_t e = cudaFuncSetAttribute(sta_bwd_kernel<T, D>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "backward: shared memory attribute");
  const int64_t rows = ra.rows;
  const unsigned rblocks = (unsigned)((rows + 7) / 8);
  sta_bwd_prep<T, D><<<rblocks, 256, 0, st>>>(ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: prep launch");
  const int64_t items = (int64_t)p->batch * p->heads *
                        (x.n_text_kb + (int64_t)x.NT * x.NH * x.NW * x.kbpt);
  if (items > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld key blocks exceed one launch",
                     (long long)items);
  if (items > 0) {
    sta_bwd_kernel<T, D><<<(unsigned)items, NTH, smem, st>>>(x);
    if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: launch");
  }
  sta_bwd_post<T, D><<<rblocks, 256, 0, st>>>(ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: post launch");
  return STA_OK;
}

int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

} /* namespace */

sta_status sta_cuda_attention_backward(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE, "backward: dtype %s not supported on cuda (use bf16 or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: head_dim %lld not supported on cuda (64 or 128)",
                     (long long)p->head_dim);
  if (p->heads > STA_BWD_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_BWD_MAX_HEADS);
  if (p->seq_len > 0x3fffffff || p->grid[0] > 32767 || p->grid[1] > 32767 || p->grid[2] > 32767)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: seq_len %lld or tile grid %dx%dx%d too large for the CUDA backend",
                     (long long)p->seq_len, p->grid[0], p->grid[1], p->grid[2]);
  if (p->deterministic)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: deterministic mode is not implemented on cuda yet (the CPU "
                     "backward is always deterministic)");
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;

  BwdArgs *xp = (BwdArgs *)calloc(1, sizeof(BwdArgs));
  if (!xp) return sta_error(STA_ERR_NOMEM, "backward: out of host memory");
  BwdArgs &x = *xp;
  x.q = p->q; x.k = p->k; x.v = p->v; x.dout = p->dout; x.lse = p->lse;
  x.dk = p->dk; x.dv = p->dv;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.do_sb = p->do_sb; x.do_ss = p->do_ss; x.do_sh = p->do_sh;
  x.dk_sb = p->dk_sb; x.dk_ss = p->dk_ss; x.dk_sh = p->dk_sh;
  x.dv_sb = p->dv_sb; x.dv_ss = p->dv_ss; x.dv_sh = p->dv_sh;
  x.lse_sb = p->lse_sb; x.lse_sh = p->lse_sh; x.lse_ss = p->lse_ss;
  x.S = (int)p->seq_len;
  x.V = (int)p->video_len;
  x.text_len = (int)p->text_len;
  x.heads = (int)p->heads;
  x.batch = (int)p->batch;
  x.cT = p->canvas[0]; x.cH = p->canvas[1]; x.cW = p->canvas[2];
  x.tt = p->tile[0]; x.th = p->tile[1]; x.tw = p->tile[2];
  x.NT = p->grid[0]; x.NH = p->grid[1]; x.NW = p->grid[2];
  x.tile_vol = x.tt * x.th * x.tw;
  x.kbpt = (x.tile_vol + BK - 1) / BK;
  x.n_text_kb = (x.text_len + BK - 1) / BK;
  x.scale = p->scale;
  x.scale_log2 = p->scale * LOG2E;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->do_sb, p->do_ss, p->do_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) && aligned16(p->dout);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  for (int64_t h = 0; h < p->heads; h++)
    for (int ax = 0; ax < 3; ax++) {
      int k = p->windows[3 * h + ax], c = p->grid[ax];
      x.win[3 * h + ax] = (int16_t)(k < c ? k : c);
    }

  RowArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.o = p->o; ra.dout = p->dout; ra.dk = p->dk; ra.dv = p->dv; ra.dq = p->dq;
  ra.o_sb = p->o_sb; ra.o_ss = p->o_ss; ra.o_sh = p->o_sh;
  ra.do_sb = p->do_sb; ra.do_ss = p->do_ss; ra.do_sh = p->do_sh;
  ra.dk_sb = p->dk_sb; ra.dk_ss = p->dk_ss; ra.dk_sh = p->dk_sh;
  ra.dv_sb = p->dv_sb; ra.dv_ss = p->dv_ss; ra.dv_sh = p->dv_sh;
  ra.dq_sb = p->dq_sb; ra.dq_ss = p->dq_ss; ra.dq_sh = p->dq_sh;
  ra.S = x.S;
  ra.heads = x.heads;
  ra.keys = x.V + x.text_len;
  ra.rows = p->batch * p->heads * p->seq_len;
  ra.scale = p->scale;

  /* workspace: the f32 dQ accumulator and D, stream-ordered */
  cudaStream_t sm = sta_cuda_stream();
  const size_t acc_bytes = sizeof(float) * (size_t)ra.rows * (size_t)p->head_dim;
  const size_t ws_bytes = acc_bytes + sizeof(float) * (size_t)ra.rows;
  void *ws = NULL;
  cudaError_t e = cudaMallocAsync(&ws, ws_bytes, sm);
  sta_status s;
  if (e != cudaSuccess) {
    s = sta_cuda_fail(e, "backward: workspace");
  } else if ((e = cudaMemsetAsync(ws, 0, acc_bytes, sm)) != cudaSuccess) {
    s = sta_cuda_fail(e, "backward: zeroing the dQ accumulator");
  } else {
    x.dqacc = (float *)ws;
    x.dd = (const float *)((char *)ws + acc_bytes);
    ra.dqacc = x.dqacc;
    ra.dd = (float *)x.dd;
    const int D = (int)p->head_dim;
    if (p->dtype == STA_BF16)
      s = D == 128 ? run<__nv_bfloat16, 128>(p, x, ra, sm) : run<__nv_bfloat16, 64>(p, x, ra, sm);
    else
      s = D == 128 ? run<__half, 128>(p, x, ra, sm) : run<__half, 64>(p, x, ra, sm);
  }
  if (ws) {
    e = cudaFreeAsync(ws, sm);
    if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "backward: freeing the workspace");
  }
  free(xp);
  return s;
}
