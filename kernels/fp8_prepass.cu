/*
** fp8_prepass.cu -- the fp8 quantize pre-pass at bandwidth (the default
** where it applies: head_dim 64 or 128, bf16/f16/f32, q, k, v rows 16-byte
** aligned; else fp8_quant.cu's kernels): the same bits as core/cpu_fp8.c's
** sta_cpu_fp8_quantize, 16-byte loads, many more threads in flight.
**   fp8_src      a thread per row: the input row of each (one table for
**                both passes instead of integer divisions per block)
**   fp8_stats_v  a thread per (batch * head, chunk, 4 channels), 64 per
**                block: the chunk's rows in order (the host's order), U
**                rows' loads issued ahead of their sums, their input rows
**                (fp8_src's table) a step ahead of those
**   fp8_finish   fp8_quant.cuh's
**   fp8_rows_v   a block of 2 D threads per (batch * head, 64 rows: one
**                key group, STA_FP8_KGROUP), the item decoded once in
**                32-bit divisions: the block's q, k and v rows by
**                cp.async into shared memory first (a fixed count of
**                passes, one input-row load a row, each row's state
**                (past R, padding, no key, key) into shared memory; a
**                pitch of the row + 16 bytes: conflict-free 16-byte reads
**                along rows and down columns), k_mean (float and double),
**                2^e, 2^-e and v's inverse amax staged beside them by one
**                coalesced load; q and k by D / 8 threads per row (8
**                channels each, amax by shuffles, 8-byte code stores), k
**                coded after the group's amax (sta_fp8_group_amax by a
**                warp's shuffles, sta_fp8_key_amax) is known; V by (4 rows,
**                8 channels) per thread into a [D][72-byte] tile (4-byte
**                stores), written out transposed in 8-byte chunks; 32-bit
**                offsets off hoisted bases, the stage's zero fill and masks
**                instead of a branch an element, a scale m / 127 by a
**                product and two fmas (sta_fp8_scale127: spec/test_fp8.c
**                checks every finite m >= 0 against the division); q_bias
**                (fp8_bias's channel-order double sum) by a thread per row
**                of warps 0 and 1 after the last barrier, while the others
**                store v8, so no warp waits at a barrier on its chain.
** V's e4m3 by cvt.rn.satfinite.e4m3x2: internal.h's values by PTX's
** definition (RNE, subnormals, saturation to 448), a non-finite input
** forced to 0x7f as the host writes it (sta_fp8_vcode).  At D 128 bf16
** fp8_rows_v takes 63.5 KB of shared memory, 3 blocks per SM, 72 registers
** (BENCHMARKS.md's ledger: the software e4m3, loads into registers a few
** rows at a time and persistent blocks with the next group in flight
** measured slower; this form 1.95 against 2.19 ms for the pre-pass at
** hunyuan-720p).
*/
#include "fp8_quant.cuh"
#include "ptx.cuh" /* cp.async */

using namespace sta_fp8q;

namespace {

/* 8 consecutive elements of ES bytes (16-byte aligned). */
template <int ES> struct Row8 {
  uint4 w[ES / 2];
};

template <int ES> __device__ __forceinline__ uint32_t word(const Row8<ES> &r, int i) {
  const uint4 &u = r.w[i / 4];
  const int j = i % 4;
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

/* float of element c (0..7) of r: dt's exact conversion. */
template <int ES> __device__ __forceinline__ float elt(const Row8<ES> &r, int c, int dt) {
  if (ES == 4) return __uint_as_float(word<ES>(r, c));
  const uint32_t w = word<ES>(r, c / 2);
  return to_f32((uint16_t)(c & 1 ? w >> 16 : w & 0xffffu), dt);
}

__global__ void fp8_src(const __grid_constant__ QuantArgs a) {
  const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (r < a.R) a.src[r] = (int)sta_fp8_source(&a.g, r);
}

/* 4 consecutive elements of ES bytes (4 ES-byte aligned): fp8_stats_v's
** unit, which keeps twice the threads of 8 in flight at half the registers. */
template <int ES> struct Row4 {
  uint32_t w[ES];
};

template <int ES> __device__ __forceinline__ void ld4(Row4<ES> &r, const char *p) {
  if (ES == 4) {
    const uint4 u = __ldg((const uint4 *)p);
    r.w[0] = u.x; r.w[1] = u.y; r.w[ES - 2] = u.z; r.w[ES - 1] = u.w;
  } else {
    const uint2 u = __ldg((const uint2 *)p);
    r.w[0] = u.x; r.w[1] = u.y;
  }
}

template <int ES> __device__ __forceinline__ float elt4(const Row4<ES> &r, int c, int dt) {
  if (ES == 4) return __uint_as_float(r.w[c]);
  return to_f32((uint16_t)(c & 1 ? r.w[c / 2] >> 16 : r.w[c / 2] & 0xffffu), dt);
}

template <int D, int DT> /* DT: the input dtype (STA_BF16, STA_F16, STA_F32) */
__global__ void __launch_bounds__(64) fp8_stats_v(const __grid_constant__ QuantArgs a) {
  constexpr int ES = DT == STA_F32 ? 4 : 2;
  constexpr int TPR = D / 4, U = ES == 2 ? 6 : 4;
  const int g = threadIdx.x % TPR;
  const int64_t bh = (int64_t)blockIdx.y * (64 / TPR) + threadIdx.x / TPR, c = blockIdx.x;
  if (bh >= a.bh) return;
  const int64_t b = bh / a.heads, h = bh % a.heads, r0 = c * STA_FP8_CHUNK;
  const int nr = (int)(a.R - r0 < STA_FP8_CHUNK ? a.R - r0 : STA_FP8_CHUNK);
  const int64_t kend = a.g.keys_end - r0; /* rows i < kend are keys */
  const char *qb = a.q + (b * a.q_sb + h * a.q_sh + 4 * g) * ES,
             *kb = a.k + (b * a.k_sb + h * a.k_sh + 4 * g) * ES,
             *vb = a.v + (b * a.v_sb + h * a.v_sh + 4 * g) * ES;
  double s[4];
  float mx[4], mn[4], qa[4], va[4];
#pragma unroll
  for (int j = 0; j < 4; j++) {
    s[j] = 0;
    mx[j] = -INFINITY; mn[j] = INFINITY; qa[j] = 0.0f; va[j] = 0.0f;
  }
  long long n = 0;
  int srcn[U]; /* the next U rows' input rows, loaded a step ahead (their loads wait on them) */
#pragma unroll
  for (int u = 0; u < U; u++) srcn[u] = u < nr ? __ldg(a.src + r0 + u) : -1;
  for (int i0 = 0; i0 < nr; i0 += U) {
    Row4<ES> xq[U], xk[U], xv[U];
    int src[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      src[u] = srcn[u];
      srcn[u] = i0 + U + u < nr ? __ldg(a.src + r0 + i0 + U + u) : -1;
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = i0 + u;
      if (src[u] >= 0) ld4<ES>(xq[u], qb + (int64_t)src[u] * a.q_ss * ES);
      if (src[u] >= 0 && i < kend) {
        ld4<ES>(xk[u], kb + (int64_t)src[u] * a.k_ss * ES);
        ld4<ES>(xv[u], vb + (int64_t)src[u] * a.v_ss * ES);
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (src[u] < 0) continue;
#pragma unroll
      for (int j = 0; j < 4; j++) qa[j] = sta_amax_finite(qa[j], elt4<ES>(xq[u], j, DT));
      if (i0 + u >= kend) continue;
      n++;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float kv = elt4<ES>(xk[u], j, DT);
        s[j] += (double)sta_finite_or0(kv);
        if (kv > mx[j] && kv < INFINITY) mx[j] = kv;
        if (kv < mn[j] && kv > -INFINITY) mn[j] = kv;
        va[j] = sta_amax_finite(va[j], elt4<ES>(xv[u], j, DT));
      }
    }
  }
  const int64_t i = (bh * a.nchunks + c) * D + 4 * g;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    a.psum[i + j] = s[j];
    a.pmax[i + j] = mx[j];
    a.pmin[i + j] = mn[j];
    a.pqam[i + j] = qa[j];
    a.pvam[i + j] = va[j];
  }
  if (g == 0) a.pcount[bh * a.nchunks + c] = n;
}

/* The amax of a row whose 8 channels y this thread holds, TPR threads per
** row (aligned lanes): cpu_fp8.c's row_amax. */
template <int TPR> __device__ __forceinline__ float amax8(const float y[8]) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; j++) m = sta_amax_nan(m, y[j]);
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) m = sta_amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

/* The int8 codes (8 bytes) of those 8 channels coded with amax m:
** cpu_fp8.c's quantize_with (its scale: sta_fp8_scale127). */
__device__ __forceinline__ void quant8_with(const float y[8], float m, uint2 &codes) {
  const float inv = sta_fp8_inv(127.0f, m);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; j++)
    w[j / 4] |= (uint32_t)(uint8_t)sta_f32_to_i8(sta_fmul(y[j], inv)) << (8 * (j % 4));
  codes = make_uint2(w[0], w[1]);
}

/* sta_fp8_vcode of v0, v1 (inverse amax i0, i1) in the low and high byte
** (fp8_rows_v masks a row that is no key to 0). */
__device__ __forceinline__ uint32_t vcodes(float v0, float v1, float i0, float i1) {
  uint16_t h;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(__fmul_rn(v1, i1)),
      "f"(__fmul_rn(v0, i0)));
  uint32_t c = h;
  if (!(fabsf(v0) < INFINITY)) c = (c & 0xff00u) | 0x7fu;
  if (!(fabsf(v1) < INFINITY)) c = (c & 0x00ffu) | 0x7f00u;
  return c;
}

constexpr int VP = 72; /* bytes per channel of the V tile: 64 rows + 8 */

/* The staged rows' pitch in shared memory: 16 bytes past a row, so that
** 16-byte reads are conflict-free both along a row (8 threads, one row)
** and down a column (8 threads, 8 rows: q_bias, V). */
template <int D, int ES> constexpr int rows_pitch() { return D * ES + 16; }

template <int D, int ES> constexpr size_t rows_v_stage() { return 3 * (size_t)QROWS * rows_pitch<D, ES>(); }
/* k_mean in double, k_mean, 2^e, 2^-e, v's inverse amax; rs, ka */
template <int D, int ES> constexpr size_t rows_v_smem() {
  return rows_v_stage<D, ES>() + (size_t)D * VP + (size_t)D * 24 + 2 * QROWS * 4;
}
static_assert(QROWS == STA_FP8_KGROUP, "a block's rows are one key group");

/* 8 elements from shared memory (16-byte aligned). */
template <int ES> __device__ __forceinline__ void lds8(Row8<ES> &r, const unsigned char *p) {
#pragma unroll
  for (int i = 0; i < ES / 2; i++) r.w[i] = ((const uint4 *)p)[i];
}

/* A block's item, decoded once (rows_item): its (batch * head), first
** row, the input row of each operand's (batch, head) and how many of its
** rows are rows (nr) and keys (kn). */
struct RowsItem {
  int64_t bh, r0;
  const char *qb, *kb, *vb;
  int nr, kn;
};

/* Work item x of fp8_rows_v (the heads of one row group next to each
** other where heads_fast) in 32-bit divisions: the grid's x dimension
** (a.bh * row groups) is below 2^31, so x, a.bh, a.heads and the row
** groups are. */
template <int ES> __device__ __forceinline__ RowsItem rows_item(const QuantArgs &a) {
  RowsItem t;
  const uint32_t x = blockIdx.x, nbh = (uint32_t)a.bh,
                 nrb = (uint32_t)((a.R + QROWS - 1) / QROWS), dv = a.heads_fast ? nbh : nrb;
  const uint32_t qt = x / dv, rm = x - qt * dv;
  const uint32_t bh = a.heads_fast ? rm : qt, rb = a.heads_fast ? qt : rm;
  const uint32_t b = bh / (uint32_t)a.heads, h = bh - b * (uint32_t)a.heads;
  t.bh = bh;
  t.r0 = (int64_t)rb * QROWS;
  t.qb = a.q + ((int64_t)b * a.q_sb + (int64_t)h * a.q_sh) * ES;
  t.kb = a.k + ((int64_t)b * a.k_sb + (int64_t)h * a.k_sh) * ES;
  t.vb = a.v + ((int64_t)b * a.v_sb + (int64_t)h * a.v_sh) * ES;
  const int64_t nr = a.R - t.r0, kn = a.g.keys_end - t.r0;
  t.nr = (int)(nr < QROWS ? nr : QROWS);
  t.kn = (int)(kn < 0 ? 0 : kn < QROWS ? kn : QROWS);
  return t;
}

/* The item's q, k and v rows by cp.async into stage st ([3][QROWS][P]:
** q, k, v; zero where there is no row or no key), one commit group: a
** thread takes 16-byte chunk tid % CH of rows tid / CH + RS j (a fixed
** count); the thread of chunk 0 writes each row's state to rs (-2 past
** R, -1 padding, 0 a row that is no key, 1 a key). */
template <int D, int ES>
__device__ __forceinline__ void rows_load(const QuantArgs &a, const RowsItem &t,
                                          unsigned char *st, int *rs) {
  constexpr int P = rows_pitch<D, ES>(), CH = D * ES / 16, RS = 2 * D / CH, NJ = QROWS / RS;
  static_assert(2 * D % CH == 0 && QROWS % RS == 0, "whole rows a pass");
  const int c = threadIdx.x % CH, i0 = threadIdx.x / CH;
  const int64_t qss = a.q_ss * ES, kss = a.k_ss * ES, vss = a.v_ss * ES;
  const char *qb = t.qb + 16 * c, *kb = t.kb + 16 * c, *vb = t.vb + 16 * c;
  const int *sp = a.src + t.r0 + i0;
  int s[NJ];
#pragma unroll
  for (int j = 0; j < NJ; j++) s[j] = i0 + RS * j < t.nr ? __ldg(sp + RS * j) : -2;
  const uint32_t d0 = sta::smem_u32(st + i0 * P + 16 * c);
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const int i = i0 + RS * j;
    const bool key = s[j] >= 0 && i < t.kn;
    const uint32_t d = d0 + RS * j * P;
    sta::cp_async16(d, s[j] >= 0 ? qb + s[j] * qss : qb, s[j] >= 0 ? 16 : 0);
    sta::cp_async16(d + QROWS * P, key ? kb + s[j] * kss : kb, key ? 16 : 0);
    sta::cp_async16(d + 2 * QROWS * P, key ? vb + s[j] * vss : vb, key ? 16 : 0);
    if (c == 0) rs[i] = s[j] == -2 ? -2 : s[j] < 0 ? -1 : key ? 1 : 0;
  }
  sta::cp_async_commit();
}

/* x where mask is all ones, +0 where it is 0 (the reference's 0.0f). */
__device__ __forceinline__ float fmask(float x, uint32_t mask) {
  return __uint_as_float(__float_as_uint(x) & mask);
}

/* A block of 2 D threads per work item (batch * head, 64 rows: one key
** group): the item decoded once, the per-channel operands (k_mean
** as float and double, 2^e, 2^-e, v's inverse amax) staged in shared
** memory by a coalesced load, 32-bit offsets off hoisted bases, the
** rows' zero fill standing in for q's "0 where no row" and no branches
** per element; q_bias's chain after the last barrier (warps 0 and 1 run
** it while the others store v8 and leave). */
template <int D, int DT> /* DT: the input dtype (STA_BF16, STA_F16, STA_F32) */
__global__ void __launch_bounds__(2 * D, 768 / (2 * D))
    fp8_rows_v(const __grid_constant__ QuantArgs a) {
  constexpr int ES = DT == STA_F32 ? 4 : 2, TPR = D / 8, P = rows_pitch<D, ES>();
  extern __shared__ __align__(16) unsigned char smem[];
  const unsigned char *qs = smem, *ks = qs + QROWS * P, *vs = ks + QROWS * P; /* [QROWS][P] each */
  uint8_t *vt = smem + rows_v_stage<D, ES>(); /* [D][VP]: v's codes, transposed */
  double *kmd = (double *)(vt + D * VP);  /* [D] k_mean in double (q_bias) */
  float *km = (float *)(kmd + D);         /* [D] k_mean */
  float *pqs = km + D, *pks = pqs + D;    /* [D] 2^e, 2^-e */
  float *vis = pks + D;                   /* [D] 448 / v's amax */
  int *rs = (int *)(vis + D);             /* [QROWS]: the row's state (rows_load) */
  float *ka = (float *)(rs + QROWS);      /* [QROWS]: k's row amax, -1: no key */
  const int tid = threadIdx.x;
  const int64_t R = a.R;
  const RowsItem t = rows_item<ES>(a);
  rows_load<D, ES>(a, t, smem, rs);
  const int64_t bh = t.bh, r0 = t.r0;
  if (tid < D) {
    const float m = a.o.k_mean[bh * D + tid];
    const int e = a.o.eq[bh * D + tid];
    km[tid] = m;
    kmd[tid] = (double)m;
    pqs[tid] = sta_pow2f(e);
    pks[tid] = sta_pow2f(-e);
    vis[tid] = a.vinv[bh * D + tid];
  }
  const int g = tid % TPR, ri = tid / TPR; /* q, k: channels 8 g.., rows ri + 16 p */
  sta::cp_async_wait_all(); /* the rows here */
  __syncthreads();
  float pq[8], pk[8], mk[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    pq[j] = pqs[8 * g + j];
    pk[j] = pks[8 * g + j];
    mk[j] = km[8 * g + j];
  }
  /* k' = (k - k_mean) 2^-e of this thread's 8 channels of row i (0 where
  ** no key): its row amax first, its codes after the group's */
  const auto kprime = [&](int i, bool key, float *y) {
    Row8<ES> xr;
    lds8<ES>(xr, ks + i * P + 8 * ES * g);
    const uint32_t mask = key ? 0xffffffffu : 0u;
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = fmask(sta_fmul(elt<ES>(xr, j, DT) - mk[j], pk[j]), mask);
  };
  /* this thread's rows' codes and scales: i * D + 8 g bytes and i past
  ** these */
  const int64_t orow = bh * R + r0;
  int8_t *q8 = a.o.q8 + (orow + ri) * D + 8 * g, *k8 = a.o.k8 + orow * D + 8 * g;
  float *qsc = a.o.q_scale + orow + ri, *ksc = a.o.k_scale + orow;
#pragma unroll
  for (int p = 0; p < 4; p++) { /* q's codes, k's row amaxes */
    const int i = 16 * p + ri, st = rs[i];
    Row8<ES> xr;
    lds8<ES>(xr, qs + i * P + 8 * ES * g);
    float y[8];
    uint2 c;
    /* a row without input is zero in the stage: y = +0 as the host's */
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = sta_fmul(elt<ES>(xr, j, DT), pq[j]);
    const float m = amax8<TPR>(y);
    quant8_with(y, m, c);
    if (st != -2) {
      *(uint2 *)(q8 + 16 * p * D) = c;
      if (g == 0) qsc[16 * p] = sta_fp8_scale127(m);
    }
    kprime(i, st > 0, y);
    const float mkr = amax8<TPR>(y);
    if (g == 0) ka[i] = st > 0 ? mkr : -1.0f;
  }
  __syncthreads(); /* ka whole */
  { /* V: thread (gv, rq) codes channels 8 gv.. of rows 4 rq.. 4 rq + 3 into
    ** vt (a 4-byte word a channel); a warp's lanes take gv's low two bits
    ** and rq's low three, so that each 8-thread phase of its 16-byte
    ** reads meets 8 different bank groups */
    const int w = tid >> 5, l = tid & 31;
    const int gv = (l & 3) + 4 * (w % (D / 32)), rq = ((l >> 2) & 7) + 8 * (w / (D / 32));
    float vi[8];
#pragma unroll
    for (int j = 0; j < 8; j++) vi[j] = vis[8 * gv + j];
    uint32_t hw[8];
#pragma unroll
    for (int j = 0; j < 8; j++) hw[j] = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int i = 4 * rq + j;
      const uint32_t mask = rs[i] > 0 ? 0xffffu : 0u;
      Row8<ES> xr;
      lds8<ES>(xr, vs + i * P + 8 * ES * gv);
#pragma unroll
      for (int c = 0; c < 8; c += 2) {
        const uint32_t h2 =
            vcodes(elt<ES>(xr, c, DT), elt<ES>(xr, c + 1, DT), vi[c], vi[c + 1]) & mask;
        hw[c] |= (h2 & 0xffu) << (8 * j);
        hw[c + 1] |= (h2 >> 8) << (8 * j);
      }
    }
#pragma unroll
    for (int c = 0; c < 8; c++) *(uint32_t *)(vt + (8 * gv + c) * VP + 4 * rq) = hw[c];
  }
  { /* k's codes with the group's amax (the largest finite row amax of
    ** its keys: a max, so a warp's shuffles give the host's sequential
    ** bits); key r's row sta_fp8_kslot(r, R): r0 is a multiple of 64, so
    ** r & 15 is ri, and the rows from lim on (the last partial 16) keep
    ** their order */
    const int l = tid & 31;
    float gam = sta_fp8_group_amax(sta_fp8_group_amax(0.0f, ka[l]), ka[l + 32]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      gam = sta_fp8_group_amax(gam, __shfl_xor_sync(0xffffffffu, gam, o));
    const int64_t lr = (R & ~(int64_t)15) - r0;
    const int lim = (int)(lr < QROWS ? lr : QROWS);
    const int pr = STA_FP8_KSLOT16(ri);
#pragma unroll
    for (int p = 0; p < 4; p++) {
      const int i = 16 * p + ri, st = rs[i];
      const bool key = st > 0;
      float y[8];
      kprime(i, key, y);
      uint2 c;
      const float am = key ? sta_fp8_key_amax(ka[i], gam) : 0.0f;
      quant8_with(y, am, c);
      const int slot = 16 * p + (i >= lim ? ri : pr);
      if (st != -2) {
        *(uint2 *)(k8 + slot * D) = c;
        if (g == 0) ksc[slot] = sta_fp8_scale127(am);
      }
    }
  }
  __syncthreads(); /* vt whole */
  const int nr = t.nr;
  uint8_t *v8 = a.o.v8 + bh * D * R + r0;
  if (nr == QROWS && R % 8 == 0) { /* 8-byte stores: chunk tid % 8 of channels tid / 8 + D / 4 j */
    constexpr int DS = 2 * D / (QROWS / 8);
    const int c = tid % (QROWS / 8), d = tid / (QROWS / 8);
    uint8_t *o = v8 + d * R + 8 * c;
    const int64_t os = DS * R;
#pragma unroll
    for (int j = 0; j < D / DS; j++)
      *(uint2 *)(o + j * os) = *(const uint2 *)(vt + (d + DS * j) * VP + 8 * c);
  } else {
    for (int y = tid; y < D * QROWS; y += 2 * D) {
      const int i = y % QROWS, d = y / QROWS;
      if (i < nr) v8[d * R + i] = vt[d * VP + i];
    }
  }
  if (tid < QROWS) { /* q_bias: fp8_bias's sum, channel order (one double
                     ** chain a row: warps 0 and 1, after the barrier) */
    const int st = rs[tid];
    if (st != -2) {
      double bias = 0;
      if (st >= 0) {
        const unsigned char *xq = qs + tid * P;
#pragma unroll 4
        for (int c = 0; c < D / 8; c++) {
          Row8<ES> xr;
          lds8<ES>(xr, xq + 8 * ES * c);
#pragma unroll
          for (int j = 0; j < 8; j++) bias += (double)elt<ES>(xr, j, DT) * kmd[8 * c + j];
        }
      }
      a.o.q_bias[bh * R + r0 + tid] = st >= 0 ? (float)bias : 0.0f;
    }
  }
}

/* Operand x of p (element size es) readable by 16-byte cp.async: 16-byte aligned at
** every (b, s, h) it is read at. */
bool rows16(const void *x, int64_t sb, int64_t ss, int64_t sh, const sta_attn_params *p,
            int64_t es) {
  return (uintptr_t)x % 16 == 0 && (p->batch == 1 || sb * es % 16 == 0) && ss * es % 16 == 0 &&
         (p->heads == 1 || sh * es % 16 == 0);
}

} /* namespace */

namespace sta_fp8q {

bool prepass_fast_ok(const sta_attn_params *p, const sta_fp8_ops *o) {
  const int64_t es = (int64_t)sta_dtype_size(p->dtype);
  if (p->head_dim != 64 && p->head_dim != 128) return false;
  if (p->dtype != STA_BF16 && p->dtype != STA_F16 && p->dtype != STA_F32) return false;
  if (!rows16(p->q, p->q_sb, p->q_ss, p->q_sh, p, es) ||
      !rows16(p->k, p->k_sb, p->k_ss, p->k_sh, p, es) ||
      !rows16(p->v, p->v_sb, p->v_ss, p->v_sh, p, es))
    return false;
  return (uintptr_t)o->q8 % 8 == 0 && (uintptr_t)o->k8 % 8 == 0 && (uintptr_t)o->v8 % 8 == 0;
}

/* The kernels are made per input dtype DT (its conversions fixed at compile
** time: the runtime choice cost both conversions' instructions). */
template <int D, int DT> static sta_status prepass_fast_d(const QuantArgs &a, cudaStream_t sm) {
  constexpr size_t shm = rows_v_smem<D, DT == STA_F32 ? 4 : 2>();
  void (*rows)(QuantArgs) = fp8_rows_v<D, DT>;
  cudaError_t e;
  if (shm > 48 * 1024 &&
      (e = cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm)) !=
          cudaSuccess)
    return sta_cuda_fail(e, "fp8 quantize: shared memory");
  fp8_src<<<(unsigned)((a.R + 255) / 256), 256, 0, sm>>>(a);
  constexpr int hpb = 64 / (D / 4); /* fp8_stats_v's heads per block */
  fp8_stats_v<D, DT><<<dim3((unsigned)a.nchunks, (unsigned)((a.bh + hpb - 1) / hpb)), 64, 0, sm>>>(a);
  const int64_t n = a.bh * D, nrb = (a.R + QROWS - 1) / QROWS;
  fp8_finish<<<(unsigned)((n + 255) / 256), 256, 0, sm>>>(a, n);
  rows<<<(unsigned)(a.bh * nrb), 2 * D, shm, sm>>>(a);
  return (e = cudaGetLastError()) == cudaSuccess ? STA_OK
                                                 : sta_cuda_fail(e, "fp8 quantize: kernel launch");
}

sta_status prepass_fast(const QuantArgs &a, cudaStream_t sm) {
  if (a.D == 64)
    return a.dt == STA_F32   ? prepass_fast_d<64, STA_F32>(a, sm)
           : a.dt == STA_F16 ? prepass_fast_d<64, STA_F16>(a, sm)
                             : prepass_fast_d<64, STA_BF16>(a, sm);
  return a.dt == STA_F32   ? prepass_fast_d<128, STA_F32>(a, sm)
         : a.dt == STA_F16 ? prepass_fast_d<128, STA_F16>(a, sm)
                           : prepass_fast_d<128, STA_BF16>(a, sm);
}

} /* namespace sta_fp8q */
