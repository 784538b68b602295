/*
** sta_attention.cu -- the STA forward on the GPU (STA.md sections 1-4).
**
** One launch covers every (query block, head, batch): blockIdx.x below
** n_text_qblocks is a block of text query rows (dense over V + text_len
** keys; these are the long ones, so they start first), the rest are blocks
** of BR rows of one query tile of the STA grid.  A CTA gathers its rows by
** coordinate straight from untiled memory (any strides: BSHD, BHSD, views),
** so no tile/untile pass is needed, and walks the key blocks of its head's
** window: BK keys at a time from each key tile (in the tile's (t,h,w)
** order), then the valid text rows.  Keys past a partial border tile or
** past text_len are zero-filled and masked.
**
** The kernels are warp-specialised wgmma kernels (sm_90a), persistent: one CTA per SM takes work items (128 query
** rows of one head) from a counter, longest first.  A producer warpgroup
** fills a 3-stage K/V ring (TMA straight from untiled memory: 5-D tile
** boxes of 2 t-slices of an 8x8 tile, 128-row boxes for text, issued by
** a single thread when TMA takes every load; a cp.async gather for what
** TMA cannot take) and loads the next item's Q while the
** consumers finish; two consumer warpgroups issue S(i+1) with PV(i) and
** take turns (ping-pong), the softmax of one under the other's GEMMs.
** BENCHMARKS.md has the measurements behind each choice.
*/
#include <cuda.h> /* CUtensorMap (types only: no -lcuda) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "sta_cuda.h"
#include "wgmma.cuh"

#define STA_MAX_HEADS 1024

namespace {

struct AttnArgs {
  /* TMA maps (sm_90a kernels), each read in boxes of 64 columns with the
  ** 128-byte swizzle.  Tile maps: 2 t-slices of an 8x8 tile of K, V or Q
  ** straight from untiled memory; row maps: 128 consecutive rows (text
  ** keys and queries, the keys of text queries).  Either the heads are
  ** fused with D in dim 0 (head stride D: BSHD, any batch), or dim 4 / 2
  ** counts heads (batch folded in when the batch stride allows, else
  ** batch 1); the producer derives a work item's coordinates c0 / c4. */
  CUtensorMap tmk; /* 64-byte (or more) aligned type */
  CUtensorMap tmv;
  CUtensorMap tmq;
  CUtensorMap rmk, rmv, rmq;
  CUtensorMap tmq3, rmq3; /* Q in items of 192 rows: 3 t-slices, 192 rows */
  CUtensorMap tmk3, tmv3, rmk3, rmv3; /* K, V in blocks of 192 (Wide) */
  int tma;       /* tile maps of K and V: the tile key blocks */
  int tma_q;     /* tile map of Q: query blocks of 2 t-slices of a box */
  int tma_rows;  /* row maps: text key blocks, text query blocks */
  int tma_fused; /* dim 0 = heads*D (coordinate head*D), last dim = batch */
  int tma_q3;    /* tmq3 and rmq3 (D 64, tt a multiple of 3) */
  int tma_k3;    /* tmk3, tmv3, rmk3, rmv3 (D 128, tt a multiple of 3) */
  const void *q, *k, *v;
  void *o;
  float *lse;
  int *sched; /* persistent kernel: [next item, CTAs done], reset at exit */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh, lse_ss;
  int S, V, text_len, vec, heads, batch;
  int cT, cH, cW, tt, th, tw, NT, NH, NW, tile_vol;
  int qbpt;           /* query blocks per tile */
  int n_text_qblocks; /* blocks of text query rows (per head and batch) */
  int n_text_items;   /* batch * heads * n_text_qblocks: they come first */
  int n_items;        /* all work items of the sm_90a kernels */
  float scale_log2;
  float rescale_th;   /* online softmax: 0 exact maximum, 8 fast (softmax_block) */
  int16_t win[3 * STA_MAX_HEADS];  /* min(K, C) per head and axis */
  int16_t horder[STA_MAX_HEADS];   /* heads, largest window first */
};

/* ---- PTX helpers -------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src,
                                           int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(nbytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
/* Two floats -> a packed pair of T (round to nearest). */
template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};
template <> struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* ---- which keys a CTA sees ---------------------------------------------- */

struct KeyPlan {
  int text;              /* text query block: keys [0, V + text_len) */
  int st, sh, sw;        /* first key tile on each axis */
  int ct, ch, cw;        /* key tiles on each axis */
  int bpt;               /* key blocks per tile */
  int n_tblk;            /* key blocks from tiles */
  int nkb;               /* all key blocks */
};

__device__ __forceinline__ int axis_start(int q, int k, int c) {
  int s = q - k / 2;
  s = s < 0 ? 0 : s;
  return s < c - k ? s : c - k;
}

/* The key tiles of query tile (it, ih, iw) for a head's window, in key
** blocks of bk keys (tile blocks first, then the text). */
__device__ __forceinline__ void window_plan(const AttnArgs &a, int head, int it,
                                            int ih, int iw, int bk, KeyPlan *p) {
  p->ct = a.win[3 * head];
  p->ch = a.win[3 * head + 1];
  p->cw = a.win[3 * head + 2];
  p->st = axis_start(it, p->ct, a.NT);
  p->sh = axis_start(ih, p->ch, a.NH);
  p->sw = axis_start(iw, p->cw, a.NW);
  p->bpt = (a.tile_vol + bk - 1) / bk;
  p->n_tblk = p->ct * p->ch * p->cw * p->bpt;
  p->nkb = p->n_tblk + (a.text_len + bk - 1) / bk;
}

/* Global row of key j of key block kb (blocks of BK keys), or -1; *cnt =
** valid keys of the block (they form a prefix). */
template <int BK>
__device__ __forceinline__ int key_row(const AttnArgs &a, const KeyPlan &p,
                                       int kb, int j, int *cnt) {
  constexpr int BN = BK;
  if (p.text) {
    int lim = a.V + a.text_len, r0 = kb * BN;
    int c = lim - r0;
    *cnt = c < BN ? c : BN;
    return j < *cnt ? r0 + j : -1;
  }
  if (kb >= p.n_tblk) {
    int r0 = (kb - p.n_tblk) * BN;
    int c = a.text_len - r0;
    *cnt = c < BN ? c : BN;
    return j < *cnt ? a.V + r0 + j : -1;
  }
  int tl = kb / p.bpt, blk = kb - tl * p.bpt;
  int hw = p.ch * p.cw;
  int i0 = tl / hw, rem = tl - i0 * hw;
  int i1 = rem / p.cw, i2 = rem - i1 * p.cw;
  int t0 = (p.st + i0) * a.tt, h0 = (p.sh + i1) * a.th,
      w0 = (p.sw + i2) * a.tw;
  int et = min(a.tt, a.cT - t0), eh = min(a.th, a.cH - h0),
      ew = min(a.tw, a.cW - w0);
  int n = et * eh * ew - blk * BN;
  *cnt = n < 0 ? 0 : (n < BN ? n : BN);
  if (j >= *cnt) return -1;
  int li = blk * BN + j, ehw = eh * ew;
  int dt = li / ehw, r = li - dt * ehw;
  int dh = r / ew, dw = r - dh * ew;
  return ((t0 + dt) * a.cH + h0 + dh) * a.cW + w0 + dw;
}

/* ---- sm_90a building blocks: wgmma operands -------------------------------
** Warpgroups of 64 query rows; key blocks of BW = 128 keys.
** S = Q K^T: wgmma m64n128k16, Q and K from shared memory (K-major,
** 128-byte swizzle).  O += P V: wgmma m64nDk16 with P from registers and V
** from shared memory (MN-major, transposed B).  Shared tiles are stored as
** D/64 column halves of rows x 128 bytes, 16-byte chunk c of row r at
** c ^ (r & 7): the 128-byte swizzle atom, 1024-byte aligned. */

constexpr int BW = 128; /* keys per block, wgmma kernel */

/* element offset of (row r, 16-byte chunk ch) in a swizzled R-row tile */
__device__ __forceinline__ int swz(int r, int ch, int R) {
  return ((ch >> 3) * R + r) * 64 + (((ch & 7) ^ (r & 7)) << 3);
}


__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void bar_named(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

template <typename T, int D, int NTH>
__device__ __forceinline__ void load_rows_sw(T *s, int R, const T *g,
                                             int64_t ss, const int *rowtab,
                                             int nrows, int tid, int vec) {
  constexpr int CH = D / 8;
  for (int c = tid; c < nrows * CH; c += NTH) {
    int r = c / CH, ch = c % CH, row = rowtab[r];
    T *dst = s + swz(r, ch, R);
    if (vec) {
      const T *src = row >= 0 ? g + (int64_t)row * ss + ch * 8 : g;
      cp_async16(smem_u32(dst), src, row >= 0 ? 16 : 0);
    } else {
      uint4 tmp = make_uint4(0, 0, 0, 0);
      uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
      if (row >= 0) {
        const uint16_t *src = reinterpret_cast<const uint16_t *>(
            g + (int64_t)row * ss + ch * 8);
#pragma unroll
        for (int e = 0; e < 8; e++) t16[e] = src[e];
      }
      *reinterpret_cast<uint4 *>(dst) = tmp;
    }
  }
}

template <typename T, int D> struct WgOps;
template <> struct WgOps<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_bf16(d, a, b, s); }
  static __device__ __forceinline__ void qk192(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n192_bf16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_bf16_tb(d, a, b, 1); }
};
template <> struct WgOps<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_bf16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_bf16_tb(d, a, b, 1); }
};
template <> struct WgOps<__half, 128> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_f16(d, a, b, s); }
  static __device__ __forceinline__ void qk192(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n192_f16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_f16_tb(d, a, b, 1); }
};
template <> struct WgOps<__half, 64> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_f16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_f16_tb(d, a, b, 1); }
};

/* ---- warp-specialised sm_90a kernel: building blocks -----------------------
** A producer warpgroup fills a STAGES-deep K/V ring (full/empty
** mbarriers): one thread issues TMA loads where setup_tma allowed them
** (tile maps: 2 t-slices of an 8x8 tile, zero-filled past the canvas; row
** maps: 128 consecutive rows), otherwise all producer threads gather rows
** with cp.async (other tiles, strides TMA cannot take).  Where TMA takes
** every load (Q, tile and row blocks), one thread runs the whole producer
** (produce_tma) and the other 127 leave: no spinning warps and no
** per-block divisions beside the consumers' warps.  The consumer
** warpgroups (64 query rows each) run the wgmma loop without a CTA-wide
** barrier: S(i+1) is issued with PV(i), its softmax overlaps PV(i), and
** the warpgroups take turns issuing (ping-pong). */

__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b))
               : "memory");
}
#ifdef STA_HANG_TRAP
/* debug builds only: a wait that has spun for ~1 s prints which barrier
** (its offset from the 1024-aligned shared-memory base, the parity; lane 0
** of each warp, 48 prints in all) and gives up, so the kernel ends, wrong,
** and the prints flush (it found the producer of the 192-key kernel
** waiting for consumers that were stuck in setmaxnreg) */
__device__ int sta_hang_prints;
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  const long long t0 = clock64();
  for (;;) {
    uint32_t ok;
    asm volatile("{\n.reg .pred P1;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, P1;\n}\n"
                 : "=r"(ok) : "r"(smem_u32(b)), "r"(parity) : "memory");
    if (ok) return;
    if (clock64() - t0 > 2000000000LL) {
      extern __shared__ unsigned char smem_raw[];
      if ((threadIdx.x & 31) == 0 && atomicAdd(&sta_hang_prints, 1) < 48)
        printf("hang: block %d tid %d barrier at +%u parity %d\n", blockIdx.x, threadIdx.x,
               (unsigned)(smem_u32(b) - ((smem_u32(smem_raw) + 1023) & ~1023u)), parity);
      return;
    }
  }
}
#else
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE_%=;\nbra WAIT_%=;\nDONE_%=:\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
#endif
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_u32(b)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *m,
                                            int c0, int c1, int c2, int c3,
                                            int c4, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::"
      "bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(c4), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *m,
                                            int c0, int c1, int c2,
                                            uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::"
      "bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2),
      "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void bar_arrive_named(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
/* setmaxnreg: this warpgroup's registers per thread down or up to N (the
** kernel needs a register cap at entry: __launch_bounds__(threads, 1)). */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void cp_async_wait_1() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

/* TMA key block kb (< n_tblk): origin of its 2 t-slices of an 8x8 tile.
** The box may run past the canvas (zero-filled there): its valid keys are
** those inside, by position. */
__device__ __forceinline__ void tma_block_origin(const AttnArgs &a,
                                                 const KeyPlan &p, int kb,
                                                 int *t0, int *h0, int *w0) {
  int tl = kb / p.bpt, blk = kb - tl * p.bpt;
  int hw = p.ch * p.cw;
  int i0 = tl / hw, rem = tl - i0 * hw;
  int i1 = rem / p.cw, i2 = rem - i1 * p.cw;
  *t0 = (p.st + i0) * a.tt + 2 * blk;
  *h0 = (p.sh + i1) * 8;
  *w0 = (p.sw + i2) * 8;
}

/* Block i of a key plan: its valid keys and, for tile-map (TMA) blocks,
** the box's origin: the producer's TMA coordinates, and the consumers'
** positional mask where the box runs past the canvas. */
struct BlkInfo {
  int cnt, posmask, t0, h0, w0;
};

__device__ __forceinline__ BlkInfo block_info(const AttnArgs &a,
                                              const KeyPlan &p, int i) {
  BlkInfo r;
  r.posmask = 0;
  r.t0 = r.h0 = r.w0 = 0;
  if (a.tma && !p.text && i < p.n_tblk) {
    tma_block_origin(a, p, i, &r.t0, &r.h0, &r.w0);
    int nt = min(2, a.cT - r.t0), nh = min(8, a.cH - r.h0),
        nw = min(8, a.cW - r.w0);
    r.cnt = nt > 0 ? nt * nh * nw : 0;
    r.posmask = r.cnt > 0 && r.cnt < BW;
  } else {
    (void)key_row<BW>(a, p, i, 0, &r.cnt);
  }
  return r;
}

/* The producer publishes each block's BlkInfo with its stage (written
** before its arrive on the full barrier, read after the consumers' wait),
** so the consumers do not redo the divisions of block_info. */
__device__ __forceinline__ int4 pack_binfo(const BlkInfo &b) {
  return make_int4(b.cnt | (b.posmask << 30), b.t0, b.h0, b.w0);
}
__device__ __forceinline__ BlkInfo get_binfo(const int4 *bi) {
  int x, y, z, w;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
               : "r"(smem_u32(bi))
               : "memory");
  BlkInfo r;
  r.cnt = x & 0xffff;
  r.posmask = (x >> 30) & 1;
  r.t0 = y;
  r.h0 = z;
  r.w0 = w;
  return r;
}

/* S of a 64 x BK block (wgmma accumulator layout): -inf where no key. */
template <int BK = BW>
__device__ __forceinline__ void mask_block(float *s, const BlkInfo &bi,
                                           const AttnArgs &a, int lane) {
  constexpr int NJ = BK / 8;
  if (bi.posmask) {
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int col = j * 8 + 2 * (lane & 3) + e;
        if (bi.t0 + (col >> 6) >= a.cT || bi.h0 + ((col >> 3) & 7) >= a.cH ||
            bi.w0 + (col & 7) >= a.cW)
          s[4 * j + e] = s[4 * j + 2 + e] = -INFINITY;
      }
  } else if (bi.cnt < BK) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int col = j * 8 + 2 * (lane & 3);
      if (col >= bi.cnt) s[4 * j] = s[4 * j + 2] = -INFINITY;
      if (col + 1 >= bi.cnt) s[4 * j + 1] = s[4 * j + 3] = -INFINITY;
    }
  }
}

/* Online softmax of one block in place (S -> P), exp2 domain; m, l of the
** thread's two rows updated; alpha: the factor for the old O and l.
** th: the rescale threshold (AttnArgs::rescale_th).  0 (STA_SOFTMAX_EXACT,
** the default) keeps the exact running maximum, so every row's largest P
** is exactly 1.  8 (STA_SOFTMAX_FAST) moves the maximum only when a
** block's exceeds it by more than 8: P and l may then reach 2^8, which
** bf16/f16 P and the f32 sums hold, and O is rescaled only on such jumps
** (after the first blocks, almost never); the same softmax, since the
** maximum is only the stabiliser, but P is rounded at another scale (up to
** twice the max error on peaked rows, BENCHMARKS.md). */
template <int BK = BW>
__device__ __forceinline__ void softmax_block(float *s, float *m, float *l,
                                              float *alpha, float sl2, float th) {
  constexpr int NJ = BK / 8;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; j++)
      mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float bmx = mx * sl2;
    const float mnew = bmx > m[hr] + th ? bmx : m[hr];
    float muse = mnew == -INFINITY ? 0.f : mnew;
    alpha[hr] = ex2(m[hr] - muse);
    m[hr] = mnew;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      float p0 = fmaf(s[4 * j + 2 * hr], sl2, -muse);
      float p1 = fmaf(s[4 * j + 2 * hr + 1], sl2, -muse);
      p0 = ex2(p0);
      p1 = ex2(p1);
      s[4 * j + 2 * hr] = p0;
      s[4 * j + 2 * hr + 1] = p1;
      sum += p0 + p1;
    }
    l[hr] = l[hr] * alpha[hr] + sum;
  }
}

template <int D>
__device__ __forceinline__ void rescale_o(float *o, const float *alpha) {
  /* once the row maxima settle, most blocks leave them unchanged: skip the
  ** 64 multiplies when no row of the warp moved (a warp-uniform branch) */
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

/* P (accumulator layout) -> wgmma A fragments, one per 16 keys. */
template <typename T, int BK = BW>
__device__ __forceinline__ void pack_p(const float *s, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++) {
    pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

/* Shared-memory descriptors as two 32-bit words: lo = start address >> 4
** (14 bits: it never carries, shared memory < 256 KB) | LBO >> 4 << 16,
** hi = SBO >> 4 | 128-byte swizzle.  Offsets are added to lo in 32 bits:
** with warp-uniform inputs the compiler keeps them in uniform registers
** (64-bit adds had cost two moves to uniform registers per wgmma). */
__device__ __forceinline__ uint32_t sdesc_lo(const void *p, uint32_t lbo) {
  return ((smem_u32(p) & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
}
constexpr uint32_t SDESC_HI = (1024 >> 4) | (1u << 30); /* SBO 1024, SW128 */
__device__ __forceinline__ uint64_t sdesc_of(uint32_t lo) {
  return ((uint64_t)SDESC_HI << 32) | lo;
}

/* S = Q K^T for this warpgroup's 64 rows (Q tile of 128 rows), issued and
** committed, not waited for. */
template <typename T, int D, int BK = BW>
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
template <typename T, int D, int BK = BW>
__device__ __forceinline__ void issue_pv(float *o, uint32_t (*pa)[4],
                                         uint32_t vlo) {
  sta_wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++)
    WgOps<T, D>::pv(o, pa[kk], sdesc_of(vlo + (uint32_t)((kk * 16 * 128) >> 4)));
  sta_wgmma::commit();
}

/* ---- work items ------------------------------------------------------------
** The sm_90a kernels number their work items longest first: the text query
** blocks of every (batch, head) (dense over all keys), then, head by head
** in horder (largest window first) and batch by batch, the query blocks of
** the tiles.  A CTA takes one item (grid of n_items) or, persistent, takes
** items until none is left. */

struct Item {
  int b, head, text;
  int qrow0, qcount;   /* text: rows V + qrow0 + r; tile: see q_row */
  int qt0, qh0, qw0, qet, qeh, qew;
  KeyPlan p;
};

template <int BR = 128, int BK = BW>
__device__ __forceinline__ void decode_item(const AttnArgs &a, int item,
                                            Item &x) {
  KeyPlan &p = x.p;
  x.qt0 = x.qh0 = x.qw0 = x.qet = x.qeh = x.qew = 0;
  if (item < a.n_text_items) {
    int hb = item / a.n_text_qblocks, tb = item - hb * a.n_text_qblocks;
    x.head = hb % a.heads;
    x.b = hb / a.heads;
    x.text = 1;
    x.qrow0 = tb * BR;
    x.qcount = min(BR, a.S - a.V - x.qrow0);
    p.text = 1;
    p.st = p.sh = p.sw = p.ct = p.ch = p.cw = p.bpt = p.n_tblk = 0;
    p.nkb = (a.V + a.text_len + BK - 1) / BK;
    return;
  }
  const int per = a.NT * a.NH * a.NW * a.qbpt;
  int j = item - a.n_text_items;
  int hb = j / per, vb = j - hb * per;
  x.b = hb % a.batch;
  x.head = a.horder[hb / a.batch];
  x.text = 0;
  int tl = vb / a.qbpt, qb = vb - tl * a.qbpt;
  int it = tl / (a.NH * a.NW), rem = tl - it * (a.NH * a.NW);
  int ih = rem / a.NW, iw = rem - ih * a.NW;
  x.qt0 = it * a.tt;
  x.qh0 = ih * a.th;
  x.qw0 = iw * a.tw;
  x.qet = min(a.tt, a.cT - x.qt0);
  x.qeh = min(a.th, a.cH - x.qh0);
  x.qew = min(a.tw, a.cW - x.qw0);
  if (a.tma_q) { /* box layout: t-slices qrow0 .. qrow0 + BR / 64 - 1 of the 8x8 tile */
    x.qrow0 = (BR / 64) * qb;
    x.qcount = max(0, min(BR / 64, x.qet - x.qrow0)) * x.qeh * x.qew;
  } else {
    x.qrow0 = qb * BR;
    x.qcount = min(BR, x.qet * x.qeh * x.qew - x.qrow0);
  }
  p.text = 0;
  window_plan(a, x.head, it, ih, iw, BK, &p);
}

/* Global row of query row r (< the item's rows, 128 or 192) of an item, or -1. */
__device__ __forceinline__ int q_row(const AttnArgs &a, const Item &x, int r) {
  if (x.text) return r < x.qcount ? a.V + x.qrow0 + r : -1;
  if (a.tma_q) {
    int dt = x.qrow0 + (r >> 6), dh = (r >> 3) & 7, dw = r & 7;
    if (dt >= x.qet || dh >= x.qeh || dw >= x.qew) return -1;
    return ((x.qt0 + dt) * a.cH + x.qh0 + dh) * a.cW + x.qw0 + dw;
  }
  if (r >= x.qcount) return -1;
  int li = x.qrow0 + r, ehw = x.qeh * x.qew;
  int dt = li / ehw, rr = li - dt * ehw;
  int dh = rr / x.qew, dw = rr - dh * x.qew;
  return ((x.qt0 + dt) * a.cH + x.qh0 + dh) * a.cW + x.qw0 + dw;
}

/* How key block kb of an item is loaded: 1 tile map, 2 row map (first row
** *row0), 0 cp.async gather. */
__device__ __forceinline__ int block_mode(const AttnArgs &a, const Item &x,
                                          int kb, int *row0) {
  if (x.text) {
    *row0 = kb * BW;
    return a.tma_rows ? 2 : 0;
  }
  if (kb < x.p.n_tblk) return a.tma ? 1 : 0;
  *row0 = a.V + (kb - x.p.n_tblk) * BW;
  return a.tma_rows ? 2 : 0;
}

/* The producer's next work item (k: items taken so far), or -1 when none
** is left; the last CTA out resets the persistent kernel's counters. */
template <bool PERSIST>
__device__ __forceinline__ int next_item(const AttnArgs &a, int k) {
  int item = k == 0 ? (int)blockIdx.x
                    : (PERSIST ? atomicAdd(a.sched, 1) + (int)gridDim.x : -1);
  if (item >= a.n_items) item = -1;
  if (item < 0 && PERSIST && atomicAdd(a.sched + 1, 1) == (int)gridDim.x - 1) {
    a.sched[0] = 0;
    a.sched[1] = 0;
  }
  return item;
}

/* An item's Q tile by TMA (row map for text rows, tile map otherwise),
** signalled on qfull; one thread. */
template <typename T, int D, int BR = 128>
__device__ __forceinline__ void tma_load_q(const AttnArgs &a, const Item &x, T *sQ,
                                           int c0, int c4, uint64_t *qfull) {
  const CUtensorMap *rm = BR == 128 ? &a.rmq : &a.rmq3, *tm = BR == 128 ? &a.tmq : &a.tmq3;
  mbar_expect_tx(qfull, BR * D * (int)sizeof(T));
#pragma unroll
  for (int hf = 0; hf < D / 64; hf++) {
    if (x.text)
      tma_load_3d(sQ + hf * BR * 64, rm, c0 + hf * 64, a.V + x.qrow0, c4, qfull);
    else
      tma_load_5d(sQ + hf * BR * 64, tm, c0 + hf * 64, x.qw0, x.qh0,
                  x.qt0 + x.qrow0, c4, qfull);
  }
}

/* One 64-column half of a key block by TMA onto bar: a tile block (mode 1:
** tile map tm at bi's origin) or the block's rows from row0 (row map rm). */
template <typename T>
__device__ __forceinline__ void tma_load_half(T *dst, const CUtensorMap *tm,
                                              const CUtensorMap *rm, const BlkInfo &bi,
                                              int mode, int row0, int c, int c4,
                                              uint64_t *bar) {
  if (mode == 1)
    tma_load_5d(dst, tm, c, bi.w0, bi.h0, bi.t0, c4, bar);
  else
    tma_load_3d(dst, rm, c, row0, c4, bar);
}

/* K and V of one key block by TMA into a stage, signalled on bar; one
** thread.  mode 1: tile maps at the box origin (bi.t0, bi.h0, bi.w0); else
** row maps at row0. */
template <typename T, int D>
__device__ __forceinline__ void tma_load_kv(const AttnArgs &a, T *dk, T *dv,
                                            const BlkInfo &bi, int mode, int row0,
                                            int c0, int c4, uint64_t *bar) {
  mbar_expect_tx(bar, 2 * BW * D * (int)sizeof(T));
#pragma unroll
  for (int hf = 0; hf < D / 64; hf++) {
    tma_load_half<T>(dk + hf * BW * 64, &a.tmk, &a.rmk, bi, mode, row0, c0 + hf * 64, c4, bar);
    tma_load_half<T>(dv + hf * BW * 64, &a.tmv, &a.rmv, bi, mode, row0, c0 + hf * 64, c4, bar);
  }
}

/* Every key block of item x in order, as put(bi, mode, row0): a text query
** item's rows [0, V + text_len) (mode 2), else the window's tile blocks of
** BK / 64 t-slices (mode 1), their coordinates stepped like an odometer (no
** divisions per block), then the text rows (mode 2). */
template <int BK, typename F>
__device__ __forceinline__ void item_blocks(const AttnArgs &a, const Item &x, F &&put) {
  const KeyPlan &p = x.p;
  BlkInfo bi;
  bi.t0 = bi.h0 = bi.w0 = 0;
  bi.posmask = 0;
  if (x.text) { /* rows [0, V + text_len) */
    const int lim = a.V + a.text_len;
    for (int r0 = 0; r0 < lim; r0 += BK) {
      bi.cnt = min(BK, lim - r0);
      put(bi, 2, r0);
    }
    return;
  }
  const int tb = p.st * a.tt, hb = p.sh * 8, wb = p.sw * 8;
  int tbase = tb, blk = 0, i1 = 0, i2 = 0;
  bi.t0 = tb;
  bi.h0 = hb;
  bi.w0 = wb;
  for (int kb = 0; kb < p.n_tblk; kb++) {
    const int nt = min(BK / 64, a.cT - bi.t0), nh = min(8, a.cH - bi.h0),
              nw = min(8, a.cW - bi.w0);
    bi.cnt = nt > 0 ? nt * nh * nw : 0;
    bi.posmask = bi.cnt > 0 && bi.cnt < BK;
    put(bi, 1, 0);
    if (++blk < p.bpt) {
      bi.t0 += BK / 64;
      continue;
    }
    blk = 0;
    if (++i2 < p.cw) {
      bi.w0 += 8;
    } else {
      i2 = 0;
      bi.w0 = wb;
      if (++i1 < p.ch) {
        bi.h0 += 8;
      } else {
        i1 = 0;
        bi.h0 = hb;
        tbase += a.tt;
      }
    }
    bi.t0 = tbase;
  }
  bi.t0 = bi.h0 = bi.w0 = 0;
  bi.posmask = 0;
  for (int r0 = 0; r0 < a.text_len; r0 += BK) {
    bi.cnt = min(BK, a.text_len - r0);
    put(bi, 2, a.V + r0);
  }
}

/* A consumer warp's output rows, normalised and stored straight from the
** accumulators (lane holds rows r0 + lane / 4 and + 8, column pairs
** 8j + 2 (lane & 3)), and their LSE. */
template <typename T, int D, int BR>
__device__ __forceinline__ void store_o(const AttnArgs &a, int item, const float *o,
                                        const float *m, const float *l, int r0,
                                        int lane) {
  Item x;
  decode_item<BR>(a, item, x); /* again: cheaper than keeping it live */
  T *go = reinterpret_cast<T *>(a.o) + x.b * a.o_sb + x.head * a.o_sh;
  const float ln2 = 0.69314718055994530942f;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float sum = l[hr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int row = q_row(a, x, r0 + (lane >> 2) + 8 * hr);
    if (row < 0) continue;
    T *dst = go + (int64_t)row * a.o_ss + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      uint32_t v = Mma<T>::pack(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
      if (a.vec) {
        *reinterpret_cast<uint32_t *>(dst + 8 * j) = v;
      } else {
        uint16_t *d16 = reinterpret_cast<uint16_t *>(dst + 8 * j);
        d16[0] = (uint16_t)(v & 0xffff);
        d16[1] = (uint16_t)(v >> 16);
      }
    }
    if (a.lse && (lane & 3) == 0)
      a.lse[x.b * a.lse_sb + x.head * a.lse_sh + (int64_t)row * a.lse_ss] =
          sum > 0.f ? (m[hr] + log2f(sum)) * ln2 : -INFINITY;
  }
}

/* ---- kernel traits -----------------------------------------------------------
** What varies between the forward kernels.  One kernel (sta_fwd) and one
** mainloop serve all three shapes:
**   Square<T, D>: 128 query rows (two consumer warpgroups) x 128-key blocks,
**     K and V of a block in one ring of 3 stages, registers 64 / 216; the
**     only one with the 128-thread gather producer (for what TMA cannot
**     load), so the fallback wherever the tiles or strides rule out the
**     others;
**   Wide<T>: D 128, 128 query rows x 192-key blocks (3 t-slices of an 8x8
**     tile), so the per-block work of the loop is spread over 1.5 times the
**     keys; only two 96 KB K + V blocks fit beside Q, so K and V have rings
**     of their own (2 stages each, as in FA3: K(i + 1) is released once
**     S(i + 1) is done, V(i) once PV(i) is); registers 24 / 240;
**   Tall<T>: D 64, 192 query rows (three consumer warpgroups) x 128-key
**     blocks, 6 stages, registers 32 / 160.
** setmaxnreg moves registers only within what the launch gives the CTA
** (65536 / threads, rounded down to a multiple of 8, per thread); an
** increase beyond it never returns and the consumers hang, hence the
** static_assert. */
template <typename T_, int D_, int BR_, int BK_, int STAGES_, bool SPLIT_, int PREG_, int CREG_,
          bool GATHER_>
struct FwdTraits {
  using T = T_;
  static constexpr int D = D_;           /* head dim */
  static constexpr int BR = BR_;         /* query rows per work item */
  static constexpr int BK = BK_;         /* keys per block */
  static constexpr int STAGES = STAGES_; /* per ring */
  static constexpr bool SPLIT = SPLIT_;  /* K and V in rings of their own */
  static constexpr int PREG = PREG_, CREG = CREG_; /* setmaxnreg: producer, consumers */
  static constexpr bool GATHER = GATHER_; /* the cp.async producer where TMA cannot load */
  static constexpr int NWG = BR / 64;     /* consumer warpgroups */
  static constexpr int CTH = 128 * NWG;   /* consumer threads */
  static constexpr int THREADS = CTH + 128;
  static_assert(BR % 64 == 0 && BK % 64 == 0 && D % 64 == 0, "64-row and 64-column units");
  static_assert(!GATHER || (BK == 128 && !SPLIT), "the gather producer fills 128-key joint stages");
  static_assert(128 * (PREG + NWG * CREG) <= (65536 / THREADS) / 8 * 8 * THREADS,
                "setmaxnreg: more registers than the launch gives the CTA");
  /* dynamic shared memory: 1024 for the alignment, Q, the K and V stages,
  ** the barriers, the stages' block info, (joint rings) the gather's row
  ** tables, the item number */
  static constexpr size_t SMEM =
      1024 + (size_t)(BR * D + 2 * STAGES * BK * D) * sizeof(T) +
      ((SPLIT ? 4 : 2) * STAGES + 2) * sizeof(uint64_t) + STAGES * sizeof(int4) +
      (SPLIT ? 0 : (size_t)(2 * BK + BR) * sizeof(int)) + sizeof(int);
};
template <typename T, int D> using Square = FwdTraits<T, D, 128, 128, 3, false, 64, 216, true>;
template <typename T> using Wide = FwdTraits<T, 128, 128, 192, 2, true, 24, 240, false>;
template <typename T> using Tall = FwdTraits<T, 64, 192, 128, 6, false, 32, 160, false>;

/* Where the kernel's shared memory is (sta_fwd lays it out). */
template <class K> struct FwdSmem {
  using T = typename K::T;
  T *q, *k, *v;            /* Q [BR][D]; K, V [STAGES][BK][D] */
  uint64_t *kfull, *kempty; /* per stage; joint rings: K and V of the stage */
  uint64_t *vfull, *vempty; /* split rings: V's; joint: kfull, kempty */
  uint64_t *qfull, *qempty; /* Q of the item loaded and sitem set / both free */
  int4 *binfo;              /* [STAGES]: pack_binfo of each (K) stage's block */
  int *rowtab, *qrow;       /* joint rings: the gather's [2][BK] and [BR] */
  volatile int *sitem;      /* the item being computed, -1 at the end */
};

/* The producer where every load goes by TMA, run by one thread: takes items,
** loads each item's Q, then its key blocks through the ring(s).  The tile
** blocks are visited in the order of tma_block_origin by stepping the
** coordinates (item_blocks), so no block costs an integer division.  Split
** rings: K(j) and V(j) are issued together (fewer registers in this thread,
** which spills at 24); V(j) waits for V(j - 2)'s release, after PV(j - 2),
** and K(j + 1) behind it for K(j - 1)'s, after S(j - 1). */
template <class K, bool PERSIST>
__device__ __forceinline__ void produce_tma(const AttnArgs &a, const FwdSmem<K> &sm) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, STAGES = K::STAGES;
  int g = 0, s = 0, n = 0; /* blocks so far; their stage and lap */
  auto put = [&](const BlkInfo &bi, int mode, int row0, int c0, int c4) {
    if constexpr (K::SPLIT) {
      constexpr int BYTES = BK * D * (int)sizeof(T); /* one of K, V */
      auto load = [&](T *dst, const CUtensorMap *tm, const CUtensorMap *rm, uint64_t *bar) {
        mbar_expect_tx(bar, BYTES);
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++)
          tma_load_half<T>(dst + hf * BK * 64, tm, rm, bi, mode, row0, c0 + hf * 64, c4, bar);
      };
      const int sk = g % STAGES;
      if (g >= STAGES) mbar_wait(&sm.kempty[sk], (g / STAGES - 1) & 1);
      sm.binfo[sk] = pack_binfo(bi);
      load(sm.k + sk * BK * D, &a.tmk3, &a.rmk3, &sm.kfull[sk]);
      if (g >= STAGES) mbar_wait(&sm.vempty[sk], (g / STAGES - 1) & 1);
      load(sm.v + sk * BK * D, &a.tmv3, &a.rmv3, &sm.vfull[sk]);
      g++;
    } else {
      if (g >= STAGES) mbar_wait(&sm.kempty[s], (n - 1) & 1);
      sm.binfo[s] = pack_binfo(bi);
      tma_load_kv<T, D>(a, sm.k + s * BK * D, sm.v + s * BK * D, bi, mode, row0, c0, c4,
                        &sm.kfull[s]);
      g++;
      if (++s == STAGES) {
        s = 0;
        n++;
      }
    }
  };
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    const int item = next_item<PERSIST>(a, k);
    *sm.sitem = item;
    if (item < 0) {
      mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      return;
    }
    Item x;
    decode_item<K::BR, BK>(a, item, x);
    if (x.qcount <= 0) {
      mbar_arrive(sm.qfull);
      continue;
    }
    const int c0 = a.tma_fused ? x.head * D : 0;
    const int c4 = a.tma_fused ? x.b : x.b * a.heads + x.head;
    tma_load_q<T, D, K::BR>(a, x, sm.q, c0, c4, sm.qfull);
    item_blocks<BK>(a, x, [&](const BlkInfo &bi, int mode, int row0) {
      put(bi, mode, row0, c0, c4);
    });
  }
}

/* The producer for what TMA cannot load (K::GATHER kernels; other tiles,
** strides TMA cannot take), all 128 threads of the producer warpgroup
** (pt: this thread's index there): TMA where a block or Q allows it, else
** a cp.async gather of the rows by coordinate. */
template <class K, bool PERSIST>
__device__ __forceinline__ void produce_gather(const AttnArgs &a, const FwdSmem<K> &sm,
                                               const int pt) {
  using T = typename K::T;
  constexpr int D = K::D, BR = K::BR, STAGES = K::STAGES, PTH = 128;
  T *const sQ = sm.q, *const sK = sm.k, *const sV = sm.v;
  uint64_t *const full = sm.kfull, *const empty = sm.kempty;
  int *const rowtab = sm.rowtab, *const qrow = sm.qrow;
  int g = 0; /* key blocks through the ring so far */
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    bar_named(3, PTH); /* every producer thread has read the last sitem */
    if (pt == 0) *sm.sitem = next_item<PERSIST>(a, k);
    bar_named(3, PTH);
    const int item = *sm.sitem;
    if (item < 0) {
      if (pt == 0) mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      break;
    }
    Item x;
    decode_item(a, item, x);
    if (x.qcount <= 0) {
      if (pt == 0) mbar_arrive(sm.qfull);
      continue;
    }
    const int c0 = a.tma_fused ? x.head * D : 0;
    const int c4 = a.tma_fused ? x.b : x.b * a.heads + x.head;
    const T *gq = reinterpret_cast<const T *>(a.q) + x.b * a.q_sb + x.head * a.q_sh;
    const T *gk = reinterpret_cast<const T *>(a.k) + x.b * a.k_sb + x.head * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + x.b * a.v_sb + x.head * a.v_sh;
    /* Q */
    if ((a.tma_q && !x.text) || (a.tma_rows && x.text)) {
      if (pt == 0) tma_load_q<T, D>(a, x, sQ, c0, c4, sm.qfull);
    } else {
      for (int r = pt; r < BR; r += PTH) qrow[r] = q_row(a, x, r);
      bar_named(3, PTH);
      load_rows_sw<T, D, PTH>(sQ, BR, gq, a.q_ss, qrow, BR, pt, a.vec);
      cp_async_commit();
      cp_async_wait_all();
      fence_proxy_async();
      bar_named(3, PTH);
      if (pt == 0) mbar_arrive(sm.qfull);
    }
    /* keys: a gather block is signalled once the next one is under way */
    int pend = -1;
    for (int kb = 0; kb < x.p.nkb; kb++, g++) {
      const int s = g % STAGES, n = g / STAGES;
      /* the block's bookkeeping (integer divisions) before the wait for
      ** its stage, not between the consumers' release and the loads */
      BlkInfo bi = {0, 0, 0, 0, 0};
      if (pt == 0) bi = block_info(a, x.p, kb); /* with the tile box's origin */
      int row0 = 0;
      const int mode = block_mode(a, x, kb, &row0);
      if (g >= STAGES) mbar_wait(&empty[s], (n - 1) & 1);
      if (pt == 0) sm.binfo[s] = pack_binfo(bi);
      if (mode) {
        if (pend >= 0) {
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(&full[pend]);
          pend = -1;
        }
        if (pt == 0) {
          tma_load_kv<T, D>(a, sK + s * BW * D, sV + s * BW * D, bi, mode, row0, c0, c4,
                            &full[s]);
        } else {
          mbar_arrive(&full[s]);
        }
        continue;
      }
      int *rt = rowtab + (g & 1) * BW;
      int c;
      if (pt < BW) rt[pt] = key_row<BW>(a, x.p, kb, pt, &c);
      bar_named(3, PTH);
      load_rows_sw<T, D, PTH>(sK + s * BW * D, BW, gk, a.k_ss, rt, BW, pt, a.vec);
      load_rows_sw<T, D, PTH>(sV + s * BW * D, BW, gv, a.v_ss, rt, BW, pt, a.vec);
      cp_async_commit();
      if (pend >= 0) {
        cp_async_wait_1();
        fence_proxy_async();
        mbar_arrive(&full[pend]);
      }
      pend = s;
    }
    if (pend >= 0) {
      cp_async_wait_all();
      fence_proxy_async();
      mbar_arrive(&full[pend]);
    }
  }
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
__device__ __forceinline__ void consume(const AttnArgs &a, const FwdSmem<K> &sm, const int wg,
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
    const int item = *sm.sitem;
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

/* ---- the kernel --------------------------------------------------------------
** One producer warpgroup (the last), K::NWG consumer warpgroups of 64 query
** rows.  PERSIST: one CTA per SM takes items from a global counter; the
** producer runs ahead into the next item's Q and keys while the consumers
** finish the last item and write its output.  Otherwise one CTA per item. */
template <class K, bool PERSIST>
__global__ void __launch_bounds__(K::THREADS, 1) sta_fwd(const __grid_constant__ AttnArgs a) {
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

int sm_count() {
  static int n[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 132;
  }
  if (!n[dev]) {
    int c = 0;
    if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c <= 0) {
      (void)cudaGetLastError();
      c = 132;
    }
    n[dev] = c;
  }
  return n[dev];
}

/* The persistent kernel's counters: a ring of slots per device, zeroed
** once; each launch takes the next slot and its last CTA zeroes it again,
** so launches in flight on different streams do not share one.  The ring
** is allocated by the first launch on a device; *slot = NULL (use the
** one-CTA-per-item kernel) when that launch is being captured into a CUDA
** graph, where cudaMalloc is not allowed.  The allocation runs in relaxed
** capture mode so that another thread's capture is not invalidated. */
constexpr int SCHED_SLOTS = 256;
sta_status sched_slot(int **slot) {
  static int *ring[64];
  static unsigned next[64];
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  *slot = NULL;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaGetDevice");
  if (dev < 0 || dev >= 64) return STA_OK;
  pthread_mutex_lock(&mu);
  if (!ring[dev]) {
    cudaStream_t st = sta_cuda_stream();
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
      (void)cudaGetLastError();
      cs = cudaStreamCaptureStatusActive;
    }
    if (cs != cudaStreamCaptureStatusNone) {
      pthread_mutex_unlock(&mu);
      return STA_OK;
    }
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    int *r = NULL;
    e = cudaMalloc((void **)&r, SCHED_SLOTS * 2 * sizeof(int));
    if (e == cudaSuccess) e = cudaMemsetAsync(r, 0, SCHED_SLOTS * 2 * sizeof(int), st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st); /* for every stream */
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
      if (r) cudaFree(r);
      pthread_mutex_unlock(&mu);
      return sta_cuda_fail(e, "attention scheduler counters");
    }
    ring[dev] = r;
  }
  *slot = ring[dev] + 2 * (next[dev]++ % SCHED_SLOTS);
  pthread_mutex_unlock(&mu);
  return STA_OK;
}

/* The work items of a launch with BR-row query items (a.qbpt set by the
** caller): text query blocks first, then the tiles' query blocks; sets
** a.n_text_qblocks, a.n_text_items, a.n_items (0: nothing to launch). */
sta_status count_items(AttnArgs &a, int BR) {
  a.n_text_qblocks = (a.S - a.V + BR - 1) / BR;
  int64_t nt = (int64_t)a.batch * a.heads * a.n_text_qblocks;
  int64_t n = nt + (int64_t)a.batch * a.heads * a.NT * a.NH * a.NW * a.qbpt;
  a.n_items = 0;
  if (n <= 0) return STA_OK;
  if (n > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld work items, too many for the CUDA backend",
                     (long long)n);
  a.n_text_items = (int)nt;
  a.n_items = (int)n;
  return STA_OK;
}

/* The launch of sta_fwd<K, PERSIST>: items counted for K's rows, the
** persistent kernel's counters (none under a first capture: one CTA per
** item then), a grid of min(SMs, items) or one CTA per item. */
template <class K, bool PERSIST>
sta_status launch_fwd(AttnArgs &a) {
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
  if (PERSIST) {
    sta_status st = sched_slot(&a.sched);
    if (st != STA_OK) return st;
    if (!a.sched) /* no counters (first launch under capture) */
      return launch_fwd<K, false>(a);
    grid = sm_count() < n ? sm_count() : n;
  }
  kern<<<(unsigned)grid, K::THREADS, K::SMEM, sta_cuda_stream()>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, "attention kernel launch");
  return STA_OK;
}

/* The kernels of one (dtype, head dim): the default where the TMA paths and
** 3 | tt allow it (D 128: Wide, the 192-key blocks and their 192-row maps;
** D 64: Tall, the 192-row items and their maps), else Square.  Variant
** (STA_CUDA_VARIANT, for tests and benchmarks) 2: one CTA per item, as
** under a first capture; 9: Square. */
template <typename T, int D>
sta_status run_fwd(AttnArgs &a, int variant) {
  using Big = typename std::conditional<D == 128, Wide<T>, Tall<T>>::type;
  const bool big = variant != 9 && a.tma && a.tma_q && a.tma_rows && (D == 128 ? a.tma_k3 : a.tma_q3);
  if (variant == 2) return big ? launch_fwd<Big, false>(a) : launch_fwd<Square<T, D>, false>(a);
  return big ? launch_fwd<Big, true>(a) : launch_fwd<Square<T, D>, true>(a);
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)f;
  }();
  return fn;
}

/* One tensor map of K, V or Q with 64-column boxes and the 128-byte
** swizzle: the layout the wgmma kernels read.  tile: dims (C0, W, H, T, N)
** with a 64x8x8x2x1 box; else rows: dims (C0, S, N) with a 64x128x1 box.
** fused: C0 = heads*D and N = batch (stride sb); else C0 = D and N = nhb
** heads (stride sh). */
bool encode_map(CUtensorMap *m, const void *base, const sta_attn_params *p,
                int64_t sb, int64_t ss, int64_t sh, int fused, int64_t nhb,
                int tile, int rows = 128) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!enc) return false;
  cuuint64_t c0 = (cuuint64_t)(fused ? p->heads * p->head_dim : p->head_dim);
  cuuint64_t nn = (cuuint64_t)(fused ? p->batch : nhb);
  cuuint64_t ns = (cuuint64_t)(fused ? sb : sh) * 2;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], es[5] = {1, 1, 1, 1, 1};
  cuuint32_t rank;
  if (tile) {
    rank = 5;
    dims[0] = c0; dims[1] = (cuuint64_t)p->canvas[2];
    dims[2] = (cuuint64_t)p->canvas[1]; dims[3] = (cuuint64_t)p->canvas[0];
    dims[4] = nn;
    strides[0] = (cuuint64_t)ss * 2;
    strides[1] = (cuuint64_t)(ss * p->canvas[2] * 2);
    strides[2] = (cuuint64_t)(ss * p->canvas[2] * p->canvas[1] * 2);
    strides[3] = ns;
    box[0] = 64; box[1] = 8; box[2] = 8; box[3] = (cuuint32_t)(rows / 64); box[4] = 1;
  } else {
    rank = 3;
    dims[0] = c0; dims[1] = (cuuint64_t)p->seq_len; dims[2] = nn;
    strides[0] = (cuuint64_t)ss * 2;
    strides[1] = ns;
    box[0] = 64; box[1] = (cuuint32_t)rows; box[2] = 1;
  }
  CUresult r = enc(m, p->dtype == STA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                   rank, const_cast<void *>(base), dims, strides, box, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

/* Which TMA paths a call can take.  All need 16-byte aligned bases and
** strides (vec) and one way to address (batch, head): fused when the head
** stride of q, k and v is D, else heads folded with the batch when the
** batch strides allow it (or batch 1).  Tile maps also need 8x8 h/w tiles
** and an even tt (key and query blocks are 2 t-slices); border tiles run
** past the canvas: zero-filled there, masked by position.
** STA_NO_TMA turns all of it off (the gather path), for tests. */
void setup_tma(AttnArgs &x, const sta_attn_params *p) {
  x.tma = x.tma_q = x.tma_rows = x.tma_q3 = x.tma_k3 = 0;
  if (getenv("STA_NO_TMA") || !x.vec) return;
  const int64_t D = p->head_dim;
  int fused = p->q_sh == D && p->k_sh == D && p->v_sh == D;
  int fold = p->batch == 1 || (p->q_sb == p->heads * p->q_sh && p->k_sb == p->heads * p->k_sh &&
                               p->v_sb == p->heads * p->v_sh);
  if (!fused && !fold) return;
  if (p->heads * p->batch > 0x7fffffff || p->heads * D > 0x7fffffff) return;
  int64_t nhb = p->heads * p->batch;
  x.tma_fused = fused;
  if (encode_map(&x.rmk, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 0) &&
      encode_map(&x.rmv, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 0) &&
      encode_map(&x.rmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0))
    x.tma_rows = 1;
  if (p->tile[1] != 8 || p->tile[2] != 8 || p->tile[0] % 2) return;
  if (encode_map(&x.tmk, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 1) &&
      encode_map(&x.tmv, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 1))
    x.tma = 1;
  if (x.tma && !getenv("STA_NO_TMA_Q") &&
      encode_map(&x.tmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1))
    x.tma_q = 1;
  /* the default kernel's 192-row maps (3 t-slices): Q in items of 192
  ** rows at D 64, K and V in blocks of 192 keys at D 128 */
  const bool by3 = x.tma_q && x.tma_rows && p->tile[0] % 3 == 0 &&
                   sta_cuda_attention_variant() != 9;
  if (by3 && D == 64 &&
      encode_map(&x.tmq3, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1, 192) &&
      encode_map(&x.rmq3, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0, 192))
    x.tma_q3 = 1;
  if (by3 && D == 128 &&
      encode_map(&x.tmk3, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 1, 192) &&
      encode_map(&x.tmv3, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 1, 192) &&
      encode_map(&x.rmk3, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 0, 192) &&
      encode_map(&x.rmv3, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 0, 192))
    x.tma_k3 = 1;
}

} /* namespace */

int sta_cuda_attention_variant(void) {
  const char *s = getenv("STA_CUDA_VARIANT"); /* read per call: benchmarks */
  const int x = s ? atoi(s) : 0;
  return x == 2 || x == 9 ? x : 0;
}

sta_status sta_cuda_attention(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE,
                     "attention: dtype %s not supported on cuda (use bf16 "
                     "or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: head_dim %lld not supported on cuda (64 or "
                     "128)",
                     (long long)p->head_dim);
  if (p->heads > STA_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_MAX_HEADS);
  if (p->seq_len > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: seq_len %lld too long for the CUDA backend",
                     (long long)p->seq_len);
  if (p->grid[0] > 32767 || p->grid[1] > 32767 || p->grid[2] > 32767)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: tile grid %dx%dx%d too large for the CUDA "
                     "backend",
                     p->grid[0], p->grid[1], p->grid[2]);
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;

  /* 6 KB: off the stack; the launch copies it */
  const size_t al = alignof(AttnArgs);
  size_t asz = (sizeof(AttnArgs) + al - 1) & ~(al - 1);
  AttnArgs *ap = (AttnArgs *)aligned_alloc(al, asz); /* for CUtensorMap */
  if (ap) memset(ap, 0, asz);
  if (!ap) return sta_error(STA_ERR_NOMEM, "attention: out of host memory");
  AttnArgs &x = *ap;
  x.q = p->q;
  x.k = p->k;
  x.v = p->v;
  x.o = p->o;
  x.lse = p->lse;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.o_sb = p->o_sb; x.o_ss = p->o_ss; x.o_sh = p->o_sh;
  x.lse_sb = p->lse_sb; x.lse_sh = p->lse_sh; x.lse_ss = p->lse_ss;
  x.S = (int)p->seq_len;
  x.V = (int)p->video_len;
  x.text_len = (int)p->text_len;
  x.cT = p->canvas[0]; x.cH = p->canvas[1]; x.cW = p->canvas[2];
  x.tt = p->tile[0]; x.th = p->tile[1]; x.tw = p->tile[2];
  x.NT = p->grid[0]; x.NH = p->grid[1]; x.NW = p->grid[2];
  x.tile_vol = x.tt * x.th * x.tw;
  x.scale_log2 = p->scale * 1.4426950408889634f;
  x.rescale_th = p->fast_softmax ? 8.0f : 0.0f;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->o_sb, p->o_ss, p->o_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) &&
            aligned16(p->o);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  x.heads = (int)p->heads;
  x.batch = (int)p->batch;
  setup_tma(x, p);
  int64_t vol[STA_MAX_HEADS];
  for (int64_t h = 0; h < p->heads; h++) {
    vol[h] = 1;
    for (int ax = 0; ax < 3; ax++) {
      int k = p->windows[3 * h + ax], c = p->grid[ax];
      x.win[3 * h + ax] = (int16_t)(k < c ? k : c);
      vol[h] *= x.win[3 * h + ax];
    }
    /* insertion: largest window first, ties in head order (stable) */
    int64_t j = h;
    while (j > 0 && vol[x.horder[j - 1]] < vol[h]) {
      x.horder[j] = x.horder[j - 1];
      j--;
    }
    x.horder[j] = (int16_t)h;
  }
  const int var = sta_cuda_attention_variant();
  sta_status s;
  if (p->dtype == STA_BF16)
    s = p->head_dim == 128 ? run_fwd<__nv_bfloat16, 128>(x, var) : run_fwd<__nv_bfloat16, 64>(x, var);
  else
    s = p->head_dim == 128 ? run_fwd<__half, 128>(x, var) : run_fwd<__half, 64>(x, var);
  free(ap);
  return s;
}

/* The forward's tensor maps for other kernels (the backward's Q and dO):
** encode_map above, m a CUtensorMap. */
int sta_cuda_encode_map(void *m, const void *base, const sta_attn_params *p, int64_t sb,
                        int64_t ss, int64_t sh, int fused, int64_t nhb, int tile, int rows) {
  return encode_map((CUtensorMap *)m, base, p, sb, ss, sh, fused, nhb, tile, rows);
}
