/*
** sta_backward.cu -- the STA backward on the GPU (STA.md section 10),
** sm_90a.
**
** Query rows are handled in blocks of 64, numbered by slot: each tile's
** blocks (one t-slice of an 8x8 tile where TMA reads the tile from untiled
** memory, else 64 rows of the tile's (t, h, w) order), then the text rows.
** The f32 dQ accumulator and the per-row LSE (log2 domain) and D_i live in
** slot order, so a block's are contiguous.  Three launches on the caller's
** stream:
**   1. prep: LSE * log2(e) and D_i = dO_i . O_i per slot row; dK = dV = 0 on
**      the rows that are never keys (>= V + text_len); the dQ accumulator is
**      zeroed;
**   2. the main kernel: one CTA per (batch, head, key block of 128 keys: a
**      third of a 6x8x8 tile, or 128 text keys), text key blocks first (every
**      query sees them: the longest items).  K and V stay in shared memory.
**      A producer warpgroup streams the query blocks that see the key tile --
**      on each axis one contiguous range of query tiles (STA.md section 10),
**      then every text block -- through a 2-stage ring: Q and dO by TMA (or
**      a cp.async gather by the whole warpgroup where TMA does not apply),
**      LSE and D by bulk copy.
**      Two consumer warpgroups own 64 keys each:
**        S^T = K Q^T, dP^T = V dO^T          (wgmma, both from shared memory)
**        P^T = 2^(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - D)
**        dV += P^T dO, dK += dS^T Q          (P^T, dS^T from registers)
**        dQ = dS K                           (dS^T through shared memory; at
**                                             D 128 each warpgroup takes 64
**                                             columns over all 128 keys)
**      and dQ goes to the accumulator by one bulk reduce-add (cp.reduce.
**      async.bulk) per warpgroup and block; dK (times the scale) and dV are
**      stored once at the end;
**   3. post: dq = scale * the accumulator, in the inputs' dtype and layout.
** Deterministic mode: the key blocks add into each dQ block in a fixed
** order (text key blocks, then the window's video key blocks in tile
** order: launch order, so a CTA only ever waits for earlier ones), each
** waiting for its turn on a per-block counter and waiting for its add to
** land before passing the turn on.
** Rows outside the canvas or past a partial tile are zero-filled: a zero Q,
** dO or K row adds nothing to any gradient, so no mask is needed.
*/
#include <cuda.h> /* CUtensorMap (types only) */
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

constexpr int BK = 128;   /* keys per CTA: two consumer warpgroups of 64 */
constexpr int BQ = 64;    /* query rows per block */
constexpr int STAGES = 2; /* Q / dO ring */
constexpr int CTH = 256;  /* consumer threads */
constexpr int NTH = 384;  /* + one producer warpgroup */
constexpr float LOG2E = 1.4426950408889634f;

struct BwdArgs {
  CUtensorMap tmq, tmdo; /* tile maps: one t-slice of an 8x8 tile, 64 columns */
  CUtensorMap rmq, rmdo; /* row maps: 64 consecutive rows, 64 columns */
  int tma;               /* tile and row maps of Q and dO in use */
  int tma_fused;         /* dim 0 = heads * D (coordinate head * D), last = batch */
  const void *q, *k, *v, *dout;
  void *dk, *dv;
  float *dqacc;      /* [B][H][nqb][D / 64][64][64] (swizzled columns), zeroed */
  int *turn;         /* deterministic: [B][H][nqb][D / 64] adds done, zeroed */
  const float *lse2; /* [B][H][nqb][64]: LSE * log2(e) */
  const float *dd;   /* [B][H][nqb][64]: D_i */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int S, V, text_len, heads, batch, vec;
  int cT, cH, cW, tt, th, tw, NT, NH, NW, tile_vol;
  int kbpt;      /* key blocks per tile */
  int n_text_kb; /* text key blocks per (batch, head) */
  int qbpt;      /* query block slots per tile: tt (TMA) or ceil(tile_vol / 64) */
  int nqb;       /* query block slots per (batch, head): tiles', then text */
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
__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE_%=;\nbra WAIT_%=;\nDONE_%=:\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *m, int c0, int c1,
                                            int c2, int c3, int c4, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4),
      "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *m, int c0, int c1,
                                            int c2, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
/* bytes (multiple of 16) from global to shared, completing on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, int bytes, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
/* f32 add of bytes from shared into global (asynchronous, bulk group) */
__device__ __forceinline__ void bulk_reduce_add(float *dst, const float *src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_wait_read1() {
  asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ int ld_acquire(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int *p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
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
** 64-column halves: the 128-byte swizzle atom, 1024-byte aligned (what TMA
** writes with CU_TENSOR_MAP_SWIZZLE_128B) */
__device__ __forceinline__ int swz(int r, int ch, int R) {
  return ((ch >> 3) * R + r) * 64 + (((ch & 7) ^ (r & 7)) << 3);
}
/* f32 offset of (row r, column c) in a 64 x 64 dQ block: 8-float chunks
** XOR-swizzled by row, so the accumulator's stores are conflict-free */
__host__ __device__ __forceinline__ int dq_off(int r, int c) {
  return r * 64 + ((((c >> 3) ^ (r & 7))) << 3) + (c & 7);
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

/* ---- query block slots ---------------------------------------------------- */

/* Extents of tile (it, ih, iw) on each axis (partial at the borders). */
struct Ext {
  int t0, h0, w0, et, eh, ew;
};
__device__ __forceinline__ Ext tile_ext(const BwdArgs &a, int it, int ih, int iw) {
  Ext e;
  e.t0 = it * a.tt;
  e.h0 = ih * a.th;
  e.w0 = iw * a.tw;
  e.et = min(a.tt, a.cT - e.t0);
  e.eh = min(a.th, a.cH - e.h0);
  e.ew = min(a.tw, a.cW - e.w0);
  return e;
}
/* Global row of row r of block blk of a tile, or -1: TMA blocks are one
** t-slice of the 8x8 box (rows outside the canvas are -1), gather blocks 64
** rows of the tile's (t, h, w) order. */
__device__ __forceinline__ int tile_row(const BwdArgs &a, const Ext &e, int blk, int r) {
  int dt, dh, dw;
  if (a.tma) {
    dt = blk;
    dh = r >> 3;
    dw = r & 7;
    if (dh >= e.eh || dw >= e.ew || dt >= e.et) return -1;
  } else {
    int li = blk * BQ + r, ehw = e.eh * e.ew;
    if (li >= e.et * ehw) return -1;
    dt = li / ehw;
    int rr = li - dt * ehw;
    dh = rr / e.ew;
    dw = rr - dh * e.ew;
  }
  return ((e.t0 + dt) * a.cH + e.h0 + dh) * a.cW + e.w0 + dw;
}
/* Global row of row r of slot s, or -1. */
__device__ __forceinline__ int slot_row(const BwdArgs &a, int s, int r) {
  const int tiles = a.NT * a.NH * a.NW;
  if (s >= tiles * a.qbpt) {
    int row = a.V + (s - tiles * a.qbpt) * BQ + r;
    return row < a.S ? row : -1;
  }
  int tl = s / a.qbpt, blk = s - tl * a.qbpt;
  Ext e = tile_ext(a, tl / (a.NH * a.NW), (tl / a.NW) % a.NH, tl % a.NW);
  return tile_row(a, e, blk, r);
}

/* Deterministic mode: the place of key block kb (of key tile (kt, kh, kw),
** or of the text keys) among the key blocks that add into query block slot
** s, in launch order: the text key blocks first, then the non-empty video
** key blocks of the query tile's window (of every tile for a text query
** block) in tile order.  A CTA waits only for CTAs launched before it. */
__device__ __forceinline__ int dq_turn(const BwdArgs &a, const int16_t *win, int kt, int kh,
                                       int kw, int text, int kb, int s) {
  if (text) return kb;
  const int tiles = a.NT * a.NH * a.NW;
  int lo[3] = {0, 0, 0}, hi[3] = {a.NT - 1, a.NH - 1, a.NW - 1};
  if (s < tiles * a.qbpt) { /* the query tile's window */
    const int tl = s / a.qbpt;
    const int q[3] = {tl / (a.NH * a.NW), (tl / a.NW) % a.NH, tl % a.NW}, c[3] = {a.NT, a.NH, a.NW};
    for (int i = 0; i < 3; i++) {
      int x = q[i] - win[i] / 2;
      x = x < 0 ? 0 : x;
      lo[i] = x < c[i] - win[i] ? x : c[i] - win[i];
      hi[i] = lo[i] + win[i] - 1;
    }
  }
  int n = a.n_text_kb; /* key blocks of the window's tiles before (kt, kh, kw) */
  for (int it = lo[0]; it <= hi[0]; it++)
    for (int ih = lo[1]; ih <= hi[1]; ih++)
      for (int iw = lo[2]; iw <= hi[2]; iw++) {
        if (it == kt && ih == kh && iw == kw) return n + kb;
        Ext e = tile_ext(a, it, ih, iw);
        n += (e.et * e.eh * e.ew + BK - 1) / BK;
      }
  return n + kb; /* not reached: the key tile is in the window */
}

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
** (t slowest), each in its blocks, then the text blocks. */
struct QWalk {
  int ta, tz, ha, hz, wa, wz; /* tile ranges */
  int it, ih, iw, blk, nblk;
  int tb;   /* text block */
  int kind; /* 0 tiles, 1 text rows, 2 done */

  __device__ __forceinline__ void enter(const BwdArgs &a) {
    Ext e = tile_ext(a, it, ih, iw);
    nblk = a.tma ? e.et : (e.et * e.eh * e.ew + BQ - 1) / BQ;
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
  __device__ __forceinline__ int slot(const BwdArgs &a) const {
    return kind == 1 ? a.NT * a.NH * a.NW * a.qbpt + tb
                     : ((it * a.NH + ih) * a.NW + iw) * a.qbpt + blk;
  }
};

/* ---- the main kernel ------------------------------------------------------ */

template <int D> struct Smem {
  static constexpr int K = 0;
  static constexpr int V = K + BK * D * 2;
  static constexpr int Q = V + BK * D * 2;             /* [STAGES][BQ][D] */
  static constexpr int DO = Q + STAGES * BQ * D * 2;   /* [STAGES][BQ][D] */
  static constexpr int DS = DO + STAGES * BQ * D * 2;  /* [2][BK][BQ] */
  static constexpr int DQ = DS + 2 * BK * BQ * 2;      /* [2 warpgroups][2][64][64] f32 */
  static constexpr int LSE = DQ + 4 * 64 * 64 * 4;     /* [STAGES][BQ] */
  static constexpr int DD = LSE + STAGES * BQ * 4;     /* [STAGES][BQ] */
  static constexpr int BAR = DD + STAGES * BQ * 4;     /* full[STAGES], empty[STAGES] */
  static constexpr int KROW = BAR + 2 * STAGES * 8;    /* [BK] */
  static constexpr int SLOT = KROW + BK * 4;           /* [STAGES]; then the block count */
  static constexpr int BYTES = SLOT + (STAGES + 1) * 4 + 1024; /* + alignment */
};

template <typename T, int D, bool DET>
__global__ void __launch_bounds__(NTH, 1) sta_bwd_kernel(const __grid_constant__ BwdArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  using L = Smem<D>;
  T *sK = reinterpret_cast<T *>(base + L::K), *sV = reinterpret_cast<T *>(base + L::V);
  T *sQ = reinterpret_cast<T *>(base + L::Q), *sdO = reinterpret_cast<T *>(base + L::DO);
  T *sdS = reinterpret_cast<T *>(base + L::DS);
  float *sdQ = reinterpret_cast<float *>(base + L::DQ);
  float *slse = reinterpret_cast<float *>(base + L::LSE), *sdd = reinterpret_cast<float *>(base + L::DD);
  uint64_t *full = reinterpret_cast<uint64_t *>(base + L::BAR), *empty = full + STAGES;
  int *skrow = reinterpret_cast<int *>(base + L::KROW);
  int *sslot = reinterpret_cast<int *>(base + L::SLOT), *snblk = sslot + STAGES;
  constexpr int CH = D / 8; /* 16-byte chunks per row */

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;

  /* the work item: text key blocks of every (batch, head) first */
  const int item = blockIdx.x;
  int b, h, text, kb, kt = 0, khh = 0, kw = 0, kcount;
  const int n_text = a.batch * a.heads * a.n_text_kb;
  Ext ke;
  ke.t0 = ke.h0 = ke.w0 = 0;
  ke.et = ke.eh = ke.ew = 1;
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
    text = 0;
    ke = tile_ext(a, kt, khh, kw);
    kcount = min(BK, ke.et * ke.eh * ke.ew - kb * BK);
  }
  if (kcount <= 0) return; /* a block past a partial tile's end */
  const int64_t bh = (int64_t)b * a.heads + h;

  /* K and V of the block, by every thread (once per CTA); the barriers */
  if (tid < BK) {
    int r = tid, row = -1;
    if (r < kcount) {
      if (text) {
        row = a.V + kb * BK + r;
      } else {
        int li = kb * BK + r, ehw = ke.eh * ke.ew, dt = li / ehw, rr = li - dt * ehw;
        int dh = rr / ke.ew, dw = rr - dh * ke.ew;
        row = ((ke.t0 + dt) * a.cH + ke.h0 + dh) * a.cW + ke.w0 + dw;
      }
    }
    skrow[r] = row;
  }
  QWalk qw;
  if (text) {
    qw.ta = 0; qw.tz = a.NT - 1; qw.ha = 0; qw.hz = a.NH - 1; qw.wa = 0; qw.wz = a.NW - 1;
  } else {
    seen_by(kt, a.win[3 * h], a.NT, &qw.ta, &qw.tz);
    seen_by(khh, a.win[3 * h + 1], a.NH, &qw.ha, &qw.hz);
    seen_by(kw, a.win[3 * h + 2], a.NW, &qw.wa, &qw.wz);
  }
  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) {
      mbar_init(&full[s], a.tma ? 1 : 129);
      mbar_init(&empty[s], CTH);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    int n = 0; /* the consumers' loop count: the producer publishes each slot */
    for (qw.start(a); qw.kind != 2; qw.next(a)) n++;
    *snblk = n;
  }
  __syncthreads();
  {
    const T *gk = reinterpret_cast<const T *>(a.k) + b * a.k_sb + h * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + b * a.v_sb + h * a.v_sh;
    for (int c = tid; c < BK * CH; c += NTH) {
      int r = c / CH, ch = c - r * CH, row = skrow[r];
      load_chunk(sK + swz(r, ch, BK), gk, a.k_ss, row, ch, a.vec);
      load_chunk(sV + swz(r, ch, BK), gv, a.v_ss, row, ch, a.vec);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();

  const float *glse = a.lse2 + bh * a.nqb * BQ, *gdd = a.dd + bh * a.nqb * BQ;

  if (wg == 2) {
    /* ---- producer ---- */
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    const int pt = tid - CTH;
    const int c0 = a.tma_fused ? h * D : 0, c4 = a.tma_fused ? b : (int)bh;
    const T *gq = reinterpret_cast<const T *>(a.q) + b * a.q_sb + h * a.q_sh;
    const T *gdo = reinterpret_cast<const T *>(a.dout) + b * a.do_sb + h * a.do_sh;
    if (a.tma && pt > 0) return;
    qw.start(a);
    for (int it = 0; qw.kind != 2; it++, qw.next(a)) {
      const int st = it % STAGES, slot = qw.slot(a);
      if (it >= STAGES) mbar_wait(&empty[st], ((it / STAGES) - 1) & 1);
      T *q = sQ + st * BQ * D, *g = sdO + st * BQ * D;
      if (pt == 0) {
        sslot[st] = slot; /* read by the consumers after their wait */
        mbar_expect_tx(&full[st], 2 * BQ * 4 + (a.tma ? 2 * BQ * D * 2 : 0));
        bulk_load(slse + st * BQ, glse + (int64_t)slot * BQ, BQ * 4, &full[st]);
        bulk_load(sdd + st * BQ, gdd + (int64_t)slot * BQ, BQ * 4, &full[st]);
      }
      if (a.tma) {
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++) {
          if (qw.kind == 1) {
            tma_load_3d(q + hf * BQ * 64, &a.rmq, c0 + hf * 64, a.V + qw.tb * BQ, c4, &full[st]);
            tma_load_3d(g + hf * BQ * 64, &a.rmdo, c0 + hf * 64, a.V + qw.tb * BQ, c4, &full[st]);
          } else {
            const int t0 = qw.it * a.tt + qw.blk, h0 = qw.ih * 8, w0 = qw.iw * 8;
            tma_load_5d(q + hf * BQ * 64, &a.tmq, c0 + hf * 64, w0, h0, t0, c4, &full[st]);
            tma_load_5d(g + hf * BQ * 64, &a.tmdo, c0 + hf * 64, w0, h0, t0, c4, &full[st]);
          }
        }
      } else {
        for (int c = pt; c < BQ * CH; c += NTH - CTH) {
          int r = c / CH, ch = c - r * CH, row = slot_row(a, slot, r);
          load_chunk(q + swz(r, ch, BQ), gq, a.q_ss, row, ch, a.vec);
          load_chunk(g + swz(r, ch, BQ), gdo, a.do_ss, row, ch, a.vec);
        }
        /* landed, then visible to the tensor cores' (async) proxy */
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        fence_proxy_async();
        mbar_arrive(&full[st]);
      }
    }
    return;
  }

  /* ---- consumers: warpgroup wg owns keys 64 wg .. 64 wg + 63 ---- */
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
  const float sl2 = a.scale_log2;
  const uint32_t dK0 = sdesc_lo(sK + wg * 64 * 64, 16), dV0 = sdesc_lo(sV + wg * 64 * 64, 16);
  /* dQ's B: K's column half wg (D 128: each warpgroup takes 64 of D over all
  ** 128 keys) or K's rows of this warpgroup (D 64: all of D over its own 64
  ** keys; the two partial sums add in the accumulator) */
  const uint32_t dKq = D == 128 ? sdesc_lo(sK + wg * BK * 64, 16) : sdesc_lo(sK + wg * 64 * 64, 16);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int e = 0; e < D / 2; e++) dk[e] = dv[e] = 0.f;

  const int nblk = *snblk;
  for (int it = 0; it < nblk; it++) {
    const int st = it % STAGES;
    mbar_wait(&full[st], (it / STAGES) & 1);
    const int slot = sslot[st];

    const uint32_t dQs = sdesc_lo(sQ + st * BQ * D, 16), dOs = sdesc_lo(sdO + st * BQ * D, 16);
    float s[BQ / 2], dp[BQ / 2];
    /* S^T and dP^T in two groups: P is computed while dP^T is still on the
    ** tensor cores */
    sta_wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      Ops<T, D>::ss64(s, sdesc(dK0 + ko), sdesc(dQs + qo), ks > 0);
    }
    sta_wgmma::commit();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      Ops<T, D>::ss64(dp, sdesc(dV0 + ko), sdesc(dOs + qo), ks > 0);
    }
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<BQ / 2>(s);

    /* P^T (rows keys, columns queries c = 8j + 2(lane&3) + e), packed into
    ** A fragments 16 queries at a time; then dS^T = P^T (dP^T - D) */
    const float *ls = slse + st * BQ, *ds = sdd + st * BQ;
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
#pragma unroll
      for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = 2 * kk + jj, c = 8 * j + 2 * (lane & 3) + e;
          const float l2 = ls[c];
#pragma unroll
          for (int hr = 0; hr < 2; hr++) s[4 * j + 2 * hr + e] = ex2(fmaf(s[4 * j + 2 * hr + e], sl2, -l2));
        }
#pragma unroll
      for (int i = 0; i < 4; i++) pa[kk][i] = pack2<T>(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    }
    sta_wgmma::wait<0>();
    sta_wgmma::pin<BQ / 2>(dp);
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
#pragma unroll
      for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = 2 * kk + jj, c = 8 * j + 2 * (lane & 3) + e;
          const float di = ds[c];
#pragma unroll
          for (int hr = 0; hr < 2; hr++) {
            const int x = 4 * j + 2 * hr + e;
            dp[x] = s[x] * (dp[x] - di);
          }
        }
#pragma unroll
      for (int i = 0; i < 4; i++) da[kk][i] = pack2<T>(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
    }

    /* dS^T into shared memory (row = key, column = query); the buffer
    ** alternates, and both warpgroups pass the barrier below every block,
    ** so the other one is done reading it from two blocks ago */
    T *sds = sdS + (it & 1) * BK * BQ;
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = 2 * kk + (i >> 1), hr = i & 1;
        const int r = wg * 64 + wq * 16 + (lane >> 2) + 8 * hr, c = 8 * j + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sds + swz(r, c >> 3, BK) + (c & 7)) = da[kk][i];
      }
    /* dV += P^T dO (dO as MN-major B), under the barrier */
    const uint32_t dOt = sdesc_lo(sdO + st * BQ * D, BQ * 128), dQt = sdesc_lo(sQ + st * BQ * D, BQ * 128);
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      Ops<T, D>::rsD(dv, pa[kk], sdesc(dOt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    fence_proxy_async();
    bar_named(1, CTH); /* dQ reads both warpgroups' dS^T (D 128) */

    /* dQ (queries x 64 columns), then dK += dS^T Q: dQ goes to shared
    ** memory while dK is still on the tensor cores */
    float dq[32];
    const uint32_t dSt = sdesc_lo(D == 128 ? sds : sds + wg * 64 * 64, 16);
    constexpr int KQ = D == 128 ? BK / 16 : 4;
#pragma unroll
    for (int kk = 0; kk < KQ; kk++)
      Ops<T, D>::ss64tt(dq, sdesc(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                        sdesc(dKq + (uint32_t)((kk * 16 * 128) >> 4)), kk > 0);
    sta_wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      Ops<T, D>::rsD(dk, da[kk], sdesc(dQt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<D / 2>(dv);
    sta_wgmma::pin<32>(dq);
    sta_wgmma::pin_r<BQ / 4>(&pa[0][0]);

    /* this warpgroup's 64 x 64 dQ block into its buffer of two (the bulk
    ** reduce of two blocks ago has read it: its issuer waited for that
    ** before the barrier above), then one bulk add into the accumulator */
    float *sdq = sdQ + (wg * 2 + (it & 1)) * 64 * 64;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int r = wq * 16 + (lane >> 2) + 8 * hr;
#pragma unroll
      for (int j = 0; j < 8; j++)
        *reinterpret_cast<float2 *>(sdq + dq_off(r, 8 * j + 2 * (lane & 3))) =
            make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
    }
    fence_proxy_async();
    bar_named(2 + wg, 128);
    if ((tid & 127) == 0) {
      const int64_t blk = (bh * a.nqb + slot) * (D / 64) + (D == 128 ? wg : 0);
      float *dst = a.dqacc + blk * 64 * 64;
      if (DET) {
        /* every key block adds in a fixed order: wait for this one's turn,
        ** add, wait for the add to land, pass the turn on */
        const int turn = dq_turn(a, a.win + 3 * h, kt, khh, kw, text, kb, slot) * (D == 64 ? 2 : 1) +
                         (D == 64 ? wg : 0);
        while (ld_acquire(a.turn + blk) != turn) {}
        bulk_reduce_add(dst, sdq, 64 * 64 * 4);
        bulk_wait();
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        st_release(a.turn + blk, turn + 1);
      } else {
        bulk_reduce_add(dst, sdq, 64 * 64 * 4);
        bulk_wait_read1(); /* the one before has read its buffer */
      }
    }
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(dk);
    sta_wgmma::pin_r<BQ / 4>(&da[0][0]);
    mbar_arrive(&empty[st]); /* Q, dO, LSE, D of this stage read */
  }
  if ((tid & 127) == 0) bulk_wait();

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
  const float *lse;
  void *dk, *dv, *dq;
  int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int64_t dq_sb, dq_ss, dq_sh, lse_sb, lse_sh, lse_ss;
  int keys;       /* V + text_len */
  int64_t rows;   /* B * heads * nqb * 64 slot rows */
};

/* One warp per slot row: LSE * log2(e) and D_i = dO . O in slot order. */
template <typename T, int D>
__global__ void sta_bwd_prep(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= r.rows) return;
  const int lane = threadIdx.x & 31, rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  float acc = 0.f, l2 = 0.f;
  if (s >= 0) {
    const T *o = reinterpret_cast<const T *>(r.o) + b * r.o_sb + s * r.o_ss + h * r.o_sh;
    const T *g = reinterpret_cast<const T *>(r.dout) + b * r.do_sb + s * r.do_ss + h * r.do_sh;
#pragma unroll
    for (int d = lane; d < D; d += 32) acc += to_f<T>(o[d]) * to_f<T>(g[d]);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    l2 = r.lse[b * r.lse_sb + h * r.lse_sh + s * r.lse_ss] * LOG2E;
  }
  if (lane == 0) {
    const_cast<float *>(a.dd)[i] = acc;
    const_cast<float *>(a.lse2)[i] = l2;
  }
}

/* One warp per (batch, head, sequence row): dK = dV = 0 on the rows that
** are never keys. */
template <typename T, int D>
__global__ void sta_bwd_zero(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  const int64_t n = (int64_t)a.batch * a.heads * (a.S - r.keys);
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= n) return;
  const int lane = threadIdx.x & 31;
  const int64_t bh = i / (a.S - r.keys), b = bh / a.heads, h = bh % a.heads;
  const int s = r.keys + (int)(i % (a.S - r.keys));
  T *k = reinterpret_cast<T *>(r.dk) + b * r.dk_sb + s * r.dk_ss + h * r.dk_sh;
  T *v = reinterpret_cast<T *>(r.dv) + b * r.dv_sb + s * r.dv_ss + h * r.dv_sh;
  for (int d = lane; d < D; d += 32) {
    k[d] = T(0.f);
    v[d] = T(0.f);
  }
}

/* One warp per slot row: dq = scale * the accumulator, at the row's place. */
template <typename T, int D>
__global__ void sta_bwd_post(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= r.rows) return;
  const int lane = threadIdx.x & 31, rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  if (s < 0) return;
  T *q = reinterpret_cast<T *>(r.dq) + b * r.dq_sb + s * r.dq_ss + h * r.dq_sh;
  const float *acc = a.dqacc + sbh * (D / 64) * 64 * 64;
  for (int d = lane; d < D; d += 32)
    q[d] = T(acc[(d >> 6) * 64 * 64 + dq_off(rr, d & 63)] * a.scale);
}

template <typename T, int D>
sta_status run(const sta_attn_params *p, const BwdArgs &x, const RowArgs &ra, cudaStream_t st) {
  const int smem = Smem<D>::BYTES;
  void (*kern)(const BwdArgs) = p->deterministic ? sta_bwd_kernel<T, D, true>
                                                 : sta_bwd_kernel<T, D, false>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "backward: shared memory attribute");
  const unsigned rblocks = (unsigned)((ra.rows + 7) / 8);
  sta_bwd_prep<T, D><<<rblocks, 256, 0, st>>>(x, ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: prep launch");
  const int64_t nz = p->batch * p->heads * (p->seq_len - ra.keys);
  if (nz > 0) {
    sta_bwd_zero<T, D><<<(unsigned)((nz + 7) / 8), 256, 0, st>>>(x, ra);
    if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: zero launch");
  }
  const int64_t items = (int64_t)p->batch * p->heads *
                        (x.n_text_kb + (int64_t)x.NT * x.NH * x.NW * x.kbpt);
  if (items > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld key blocks exceed one launch",
                     (long long)items);
  if (items > 0) {
    kern<<<(unsigned)items, NTH, smem, st>>>(x);
    if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: launch");
  }
  sta_bwd_post<T, D><<<rblocks, 256, 0, st>>>(x, ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: post launch");
  return STA_OK;
}

int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* TMA maps of Q and dO where the geometry and strides allow them (as the
** forward's setup_tma): 8x8 tiles in h and w, 16-byte rows, heads fused
** with D or a batch stride that folds into the head count. */
void setup_tma(BwdArgs &x, const sta_attn_params *p) {
  x.tma = 0;
  if (getenv("STA_NO_TMA") || !x.vec || p->tile[1] != 8 || p->tile[2] != 8) return;
  const int64_t D = p->head_dim;
  int fused = p->q_sh == D && p->do_sh == D;
  int fold = p->batch == 1 || (p->q_sb == p->heads * p->q_sh && p->do_sb == p->heads * p->do_sh);
  if (!fused && !fold) return;
  if (p->heads * p->batch > 0x7fffffff || p->heads * D > 0x7fffffff) return;
  int64_t nhb = p->heads * p->batch;
  x.tma_fused = fused;
  x.tma = sta_cuda_encode_map(&x.tmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1, 64) &&
          sta_cuda_encode_map(&x.tmdo, p->dout, p, p->do_sb, p->do_ss, p->do_sh, fused, nhb, 1, 64) &&
          sta_cuda_encode_map(&x.rmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0, 64) &&
          sta_cuda_encode_map(&x.rmdo, p->dout, p, p->do_sb, p->do_ss, p->do_sh, fused, nhb, 0, 64);
}

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
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;

  const size_t al = alignof(BwdArgs);
  BwdArgs *xp = (BwdArgs *)aligned_alloc(al, (sizeof(BwdArgs) + al - 1) & ~(al - 1));
  if (!xp) return sta_error(STA_ERR_NOMEM, "backward: out of host memory");
  memset(xp, 0, sizeof *xp);
  BwdArgs &x = *xp;
  x.q = p->q; x.k = p->k; x.v = p->v; x.dout = p->dout;
  x.dk = p->dk; x.dv = p->dv;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.do_sb = p->do_sb; x.do_ss = p->do_ss; x.do_sh = p->do_sh;
  x.dk_sb = p->dk_sb; x.dk_ss = p->dk_ss; x.dk_sh = p->dk_sh;
  x.dv_sb = p->dv_sb; x.dv_ss = p->dv_ss; x.dv_sh = p->dv_sh;
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
  setup_tma(x, p);
  x.qbpt = x.tma ? x.tt : (x.tile_vol + BQ - 1) / BQ;
  const int64_t nqb = (int64_t)x.NT * x.NH * x.NW * x.qbpt + (p->seq_len - p->video_len + BQ - 1) / BQ;
  x.nqb = (int)nqb;
  for (int64_t h = 0; h < p->heads; h++)
    for (int ax = 0; ax < 3; ax++) {
      int k = p->windows[3 * h + ax], c = p->grid[ax];
      x.win[3 * h + ax] = (int16_t)(k < c ? k : c);
    }

  RowArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.o = p->o; ra.dout = p->dout; ra.lse = p->lse; ra.dk = p->dk; ra.dv = p->dv; ra.dq = p->dq;
  ra.o_sb = p->o_sb; ra.o_ss = p->o_ss; ra.o_sh = p->o_sh;
  ra.do_sb = p->do_sb; ra.do_ss = p->do_ss; ra.do_sh = p->do_sh;
  ra.dk_sb = p->dk_sb; ra.dk_ss = p->dk_ss; ra.dk_sh = p->dk_sh;
  ra.dv_sb = p->dv_sb; ra.dv_ss = p->dv_ss; ra.dv_sh = p->dv_sh;
  ra.dq_sb = p->dq_sb; ra.dq_ss = p->dq_ss; ra.dq_sh = p->dq_sh;
  ra.lse_sb = p->lse_sb; ra.lse_sh = p->lse_sh; ra.lse_ss = p->lse_ss;
  ra.keys = x.V + x.text_len;
  ra.rows = p->batch * p->heads * nqb * BQ;

  /* workspace, stream-ordered: the f32 dQ accumulator, LSE2 and D */
  cudaStream_t sm = sta_cuda_stream();
  const size_t acc_bytes = sizeof(float) * (size_t)ra.rows * (size_t)p->head_dim;
  const size_t turn_bytes = p->deterministic ? sizeof(int) * (size_t)(ra.rows / BQ) * (size_t)(p->head_dim / 64) : 0;
  const size_t zero_bytes = acc_bytes + turn_bytes;
  const size_t ws_bytes = zero_bytes + 2 * sizeof(float) * (size_t)ra.rows;
  void *ws = NULL;
  cudaError_t e = cudaMallocAsync(&ws, ws_bytes, sm);
  sta_status s;
  if (e != cudaSuccess) {
    ws = NULL;
    s = sta_cuda_fail(e, "backward: workspace");
  } else if ((e = cudaMemsetAsync(ws, 0, zero_bytes, sm)) != cudaSuccess) {
    s = sta_cuda_fail(e, "backward: zeroing the dQ accumulator");
  } else {
    x.dqacc = (float *)ws;
    x.turn = p->deterministic ? (int *)((char *)ws + acc_bytes) : NULL;
    x.lse2 = (const float *)((char *)ws + zero_bytes);
    x.dd = x.lse2 + ra.rows;
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
