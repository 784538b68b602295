/*
** fp8_quant.cu -- the fp8 forward's quantize pre-pass (core/internal.h,
** sta_fp8_ops; the scheme: sta.h, sta_precision): the bits
** core/cpu_fp8.c's sta_cpu_fp8_quantize writes (spec/test_gpu_fp8.c
** compares them).  Every rounding goes through internal.h's STA_HD
** helpers, which the host shares; the sums whose order matters (the keys'
** channel sums, q . k_mean) run in the host's order.  Four launches on
** this thread's stream, a stream-ordered workspace of the chunks' partials:
**   fp8_stats   a block per (batch * head, chunk of STA_FP8_CHUNK rows), a
**               thread per channel: the keys' sum (double, row order), max
**               and min, the amax of q (every query row) and of v (keys);
**               the chunk's input rows looked up once, in shared memory
**   fp8_finish  a thread per (batch * head, channel): the chunks in order;
**               k_mean, the channel exponent, v_scale and 448 / amax of v
**   fp8_rows    a block per (batch * head, 64 rows), a warp per row at a
**               time, its q, k, v loaded into registers at once: q8 and k8
**               (int8, the row's amax by warp reduction), the row scales;
**               V_hi and V_lo staged in shared memory and stored
**               transposed, 64 rows of a channel at once
**   fp8_bias    a thread per (batch * head, row): q . k_mean (double,
**               channel order)
** Padding rows and the k, v of rows that are never keys are written as 0.
** Those four are STA_FP8_PREPASS=0's (and the fallback's); the default is
** the bandwidth pre-pass below (fp8_src, fp8_stats_v, fp8_finish,
** fp8_rows_v: the same bits).
*/
#include "ops.cuh"

namespace {

constexpr int QROWS = 64; /* rows per fp8_rows block */
constexpr int QWARPS = 8;

struct QuantArgs {
  const char *q, *k, *v;
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh; /* elements */
  int dt, es, D;
  int64_t heads, R, nchunks;
  sta_fp8_geom g;
  sta_fp8_ops o; /* device buffers */
  double *psum;  /* [BH][nchunks][D] */
  float *pmax, *pmin, *pqam, *pvam; /* [BH][nchunks][D] */
  long long *pcount; /* [BH][nchunks] */
  float *vinv;   /* [BH][D] */
  int *src;      /* [R]: sta_fp8_source of each row (the fast path's) */
  int64_t bh;    /* batch * heads */
  int heads_fast; /* grid x counts batch * head (else rows) */
};

__device__ __forceinline__ float ld(const char *base, int64_t off, const QuantArgs &a) {
  return ld1(base + off * a.es, a.dt);
}

/* The chunk's input rows first, once per block (sta_fp8_source's integer
** divisions, not per channel); then each thread's channel over them, the
** loads of SU rows issued before their sums (which stay in row order). */
constexpr int SU = 8;
__global__ void fp8_stats(const __grid_constant__ QuantArgs a) {
  __shared__ int srcs[STA_FP8_CHUNK];
  const int64_t bh = a.heads_fast ? blockIdx.x : blockIdx.y,
                c = a.heads_fast ? blockIdx.y : blockIdx.x, b = bh / a.heads, h = bh % a.heads;
  const int64_t r0 = c * STA_FP8_CHUNK, r1 = r0 + STA_FP8_CHUNK < a.R ? r0 + STA_FP8_CHUNK : a.R;
  const int nr = (int)(r1 - r0);
  const int64_t kend = a.g.keys_end - r0; /* rows i < kend are keys */
  for (int i = threadIdx.x; i < nr; i += blockDim.x) srcs[i] = (int)sta_fp8_source(&a.g, r0 + i);
  __syncthreads();
  for (int d = threadIdx.x; d < a.D; d += blockDim.x) {
    double s = 0;
    float mx = -INFINITY, mn = INFINITY, qa = 0.0f, va = 0.0f;
    long long n = 0;
    for (int i0 = 0; i0 < nr; i0 += SU) {
      float qv[SU], kv[SU], vv[SU];
#pragma unroll
      for (int u = 0; u < SU; u++) {
        const int i = i0 + u, src = i < nr ? srcs[i] : -1;
        const bool key = src >= 0 && i < kend;
        qv[u] = src >= 0 ? ld(a.q, b * a.q_sb + src * a.q_ss + h * a.q_sh + d, a) : 0.0f;
        kv[u] = key ? ld(a.k, b * a.k_sb + src * a.k_ss + h * a.k_sh + d, a) : 0.0f;
        vv[u] = key ? ld(a.v, b * a.v_sb + src * a.v_ss + h * a.v_sh + d, a) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < SU; u++) {
        const int i = i0 + u, src = i < nr ? srcs[i] : -1;
        if (src < 0) continue;
        qa = sta_amax_nan(qa, qv[u]);
        if (i >= kend) continue;
        n++;
        s += (double)kv[u];
        if (kv[u] > mx) mx = kv[u];
        if (kv[u] < mn) mn = kv[u];
        va = sta_amax_nan(va, vv[u]);
      }
    }
    const int64_t i = (bh * a.nchunks + c) * a.D + d;
    a.psum[i] = s;
    a.pmax[i] = mx;
    a.pmin[i] = mn;
    a.pqam[i] = qa;
    a.pvam[i] = va;
    if (d == 0) a.pcount[bh * a.nchunks + c] = n;
  }
}

__global__ void fp8_finish(const __grid_constant__ QuantArgs a, int64_t n) {
  const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= n) return;
  const int64_t bh = x / a.D, d = x % a.D;
  double sum = 0;
  float mx = -INFINITY, mn = INFINITY, qa = 0.0f, va = 0.0f;
  long long count = 0;
  for (int64_t c = 0; c < a.nchunks; c++) {
    const int64_t i = (bh * a.nchunks + c) * a.D + d;
    sum += a.psum[i];
    if (a.pmax[i] > mx) mx = a.pmax[i];
    if (a.pmin[i] < mn) mn = a.pmin[i];
    qa = sta_amax_nan(qa, a.pqam[i]);
    va = sta_amax_nan(va, a.pvam[i]);
    count += a.pcount[bh * a.nchunks + c];
  }
  const float mean = count > 0 ? (float)(sum / (double)count) : 0.0f;
  const float kam = sta_amax_nan(sta_amax_nan(0.0f, mx - mean), mean - mn);
  a.o.k_mean[x] = mean;
  a.o.eq[x] = (int8_t)sta_fp8_exponent(qa, kam);
  a.o.v_scale[x] = va / 448.0f;
  a.vinv[x] = sta_fp8_inv(448.0f, va);
}

constexpr int QJMAX = 8; /* channels per lane: D <= 32 * QJMAX */

/* The int8 codes and scale of a row held in registers, channel d = lane +
** 32 j in x[j]: y = (x - sub[d]) * 2^(sgn * eq[d]) (sub: NULL for none),
** amax over the row (warp shuffles; order-free), code = rint(y * inv). */
template <int QJ>
__device__ __forceinline__ void quantize_row(const float *x, const int8_t *eq, const float *sub,
                                             int sgn, int D, int lane, int8_t *code,
                                             float *scale) {
  float y[QJ], m = 0.0f;
#pragma unroll
  for (int j = 0; j < QJ; j++) {
    const int d = lane + 32 * j;
    y[j] = d < D ? sta_fmul(sub ? x[j] - sub[d] : x[j], sta_pow2f(sgn * eq[d])) : 0.0f;
    if (d < D) m = sta_amax_nan(m, y[j]);
  }
  for (int o = 16; o > 0; o >>= 1) m = sta_amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float inv = sta_fp8_inv(127.0f, m);
#pragma unroll
  for (int j = 0; j < QJ; j++) {
    const int d = lane + 32 * j;
    if (d < D) code[d] = sta_f32_to_i8(sta_fmul(y[j], inv));
  }
  if (lane == 0) *scale = m / 127.0f;
}

/* Dynamic shared memory: the V planes [2][D][QROWS] bytes.  A warp per row
** at a time, the row's q, k and v loaded into registers at once (QJ per
** lane: D <= 32 QJ). */
template <int QJ>
__global__ void __launch_bounds__(QWARPS * 32, QJ <= 4 ? 3 : 1) fp8_rows(const __grid_constant__ QuantArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = a.D, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const int64_t bh = a.heads_fast ? blockIdx.x : blockIdx.y, b = bh / a.heads, h = bh % a.heads,
                r0 = (int64_t)(a.heads_fast ? blockIdx.y : blockIdx.x) * QROWS;
  uint8_t *vt = smem;
  const int8_t *eq = a.o.eq + bh * D;
  const float *mean = a.o.k_mean + bh * D, *vinv = a.vinv + bh * D;
  __shared__ int rsrc[QROWS]; /* the rows' input rows, looked up once */
  if (threadIdx.x < QROWS && r0 + threadIdx.x < a.R)
    rsrc[threadIdx.x] = (int)sta_fp8_source(&a.g, r0 + threadIdx.x);
  __syncthreads();
  for (int i = w; i < QROWS; i += QWARPS) {
    const int64_t r = r0 + i, row = bh * a.R + r;
    if (r >= a.R) break;
    int8_t *q8 = a.o.q8 + row * D, *k8 = a.o.k8 + row * D;
    const int64_t src = rsrc[i];
    const bool key = src >= 0 && r < a.g.keys_end;
    float xq[QJ], xk[QJ], xv[QJ];
#pragma unroll
    for (int j = 0; j < QJ; j++) {
      const int d = lane + 32 * j;
      xq[j] = src >= 0 && d < D ? ld(a.q, b * a.q_sb + src * a.q_ss + h * a.q_sh + d, a) : 0.0f;
      xk[j] = key && d < D ? ld(a.k, b * a.k_sb + src * a.k_ss + h * a.k_sh + d, a) : 0.0f;
      xv[j] = key && d < D ? ld(a.v, b * a.v_sb + src * a.v_ss + h * a.v_sh + d, a) : 0.0f;
    }
    if (src < 0) {
      for (int d = lane; d < D; d += 32) q8[d] = 0;
      if (lane == 0) a.o.q_scale[row] = 0.0f;
    } else {
      quantize_row<QJ>(xq, eq, nullptr, 1, D, lane, q8, &a.o.q_scale[row]);
    }
    if (!key) {
      for (int d = lane; d < D; d += 32) {
        k8[d] = 0;
        vt[d * QROWS + i] = 0;
        vt[(D + d) * QROWS + i] = 0;
      }
      if (lane == 0) a.o.k_scale[row] = 0.0f;
      continue;
    }
    quantize_row<QJ>(xk, eq, mean, -1, D, lane, k8, &a.o.k_scale[row]);
#pragma unroll
    for (int j = 0; j < QJ; j++) {
      const int d = lane + 32 * j;
      if (d >= D) continue;
      const float y = sta_fmul(xv[j], vinv[d]);
      const uint8_t hi = sta_f32_to_e4m3(y);
      vt[d * QROWS + i] = hi;
      vt[(D + d) * QROWS + i] = sta_f32_to_e4m3(y - sta_e4m3_to_f32(hi));
    }
  }
  __syncthreads();
  const int n = (int)(a.R - r0 < QROWS ? a.R - r0 : QROWS);
  if (n == QROWS && a.R % 16 == 0) { /* 16-byte stores */
    for (int x = threadIdx.x; x < 2 * D * (QROWS / 16); x += blockDim.x) {
      const int pd = x / (QROWS / 16), c = x % (QROWS / 16);
      *(uint4 *)(a.o.v8 + (bh * 2 * D + pd) * a.R + r0 + c * 16) =
          *(const uint4 *)(vt + pd * QROWS + c * 16);
    }
    return;
  }
  for (int x = threadIdx.x; x < 2 * D * QROWS; x += blockDim.x) {
    const int i = x % QROWS, pd = x / QROWS; /* pd = plane * D + d */
    if (i < n) a.o.v8[(bh * 2 * D + pd) * a.R + r0 + i] = vt[x];
  }
}

/* q_bias = q . k_mean in double, channel order (the host's), a thread per
** (batch * head, row): the sum's chain off fp8_rows' warps; 0 for padding. */
__global__ void fp8_bias(const __grid_constant__ QuantArgs a, int64_t n) {
  const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= n) return;
  const int64_t bh = x / a.R, r = x % a.R, b = bh / a.heads, h = bh % a.heads;
  const int64_t src = sta_fp8_source(&a.g, r);
  if (src < 0) {
    a.o.q_bias[x] = 0.0f;
    return;
  }
  const float *mean = a.o.k_mean + bh * a.D;
  const char *q = a.q + (b * a.q_sb + src * a.q_ss + h * a.q_sh) * a.es;
  double bias = 0;
#pragma unroll 8
  for (int d = 0; d < a.D; d++) bias += (double)ld1(q + (int64_t)d * a.es, a.dt) * (double)mean[d];
  a.o.q_bias[x] = (float)bias;
}

/* ---- the fast pre-pass (STA_FP8_PREPASS 1 and 2; D 64 and 128, rows 16-byte
** aligned): the same bits, 16-byte loads, many more threads in flight.
**   fp8_src      a thread per row: the input row of each (one table for
**                both passes instead of integer divisions per block)
**   fp8_stats_v  a thread per (batch * head, chunk, 4 channels), 64 per
**                block: the chunk's rows in order (the host's order), U
**                rows' loads issued ahead of their sums
**   fp8_finish   as above
**   fp8_rows_v   a block of 2 D threads per (batch * head, 64 rows): q and k
**                by D / 8 threads per row (8 channels each, amax by
**                shuffles, 8-byte code stores); V by (4 rows, 8 channels)
**                per thread into a [2][D][72-byte] tile (4-byte stores,
**                conflict-free), written out transposed in 8-byte chunks;
**                q_bias (fp8_bias's channel-order double sum) by a thread
**                per row over the q rows staged in shared memory.
** Variant 2 converts V to e4m3 (and back) by cvt.rn.satfinite.e4m3x2 and
** cvt.rn.f16x2.e4m3x2 instead of internal.h's integer routines: the same
** values by PTX's definition (RNE, subnormals, saturation to 448), NaN
** forced to 0x7f as the host writes it.  Variant 3: 2 with fp8_rows_v's
** LOW layout (72 registers at D 128: 3 blocks per SM, against 97 and 2). */

/* 8 consecutive elements of ES bytes (16-byte aligned). */
template <int ES> struct Row8 {
  uint4 w[ES / 2];
};

template <int ES> __device__ __forceinline__ void ld8(Row8<ES> &r, const char *p) {
#pragma unroll
  for (int i = 0; i < ES / 2; i++) r.w[i] = __ldg((const uint4 *)p + i);
}

template <int ES> __device__ __forceinline__ void zero8(Row8<ES> &r) {
#pragma unroll
  for (int i = 0; i < ES / 2; i++) r.w[i] = make_uint4(0, 0, 0, 0);
}

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

template <int D, int ES>
__global__ void __launch_bounds__(64) fp8_stats_v(const __grid_constant__ QuantArgs a) {
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
  for (int i0 = 0; i0 < nr; i0 += U) {
    Row4<ES> xq[U], xk[U], xv[U];
    int src[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int i = i0 + u;
      src[u] = i < nr ? a.src[r0 + i] : -1;
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
      for (int j = 0; j < 4; j++) qa[j] = sta_amax_nan(qa[j], elt4<ES>(xq[u], j, a.dt));
      if (i0 + u >= kend) continue;
      n++;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float kv = elt4<ES>(xk[u], j, a.dt);
        s[j] += (double)kv;
        if (kv > mx[j]) mx[j] = kv;
        if (kv < mn[j]) mn[j] = kv;
        va[j] = sta_amax_nan(va[j], elt4<ES>(xv[u], j, a.dt));
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

/* The int8 codes (8 bytes) and scale of a row whose 8 channels y this
** thread holds, TPR threads per row (aligned lanes): quantize_row's math. */
template <int TPR>
__device__ __forceinline__ float quant8(const float y[8], uint2 &codes) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; j++) m = sta_amax_nan(m, y[j]);
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) m = sta_amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  const float inv = sta_fp8_inv(127.0f, m);
  uint32_t w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 8; j++)
    w[j / 4] |= (uint32_t)(uint8_t)sta_f32_to_i8(sta_fmul(y[j], inv)) << (8 * (j % 4));
  codes = make_uint2(w[0], w[1]);
  return m / 127.0f;
}

/* V_hi and V_lo codes of y (0 for a row that is no key). */
template <bool HW>
__device__ __forceinline__ void vcodes(float y0, float y1, bool key, uint32_t &hi, uint32_t &lo) {
  if (!key) {
    hi = lo = 0;
  } else if (HW) {
    uint16_t h, l;
    uint32_t f2;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(y1), "f"(y0));
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(f2) : "h"(h));
    const float d0 = __half2float(__ushort_as_half((unsigned short)(f2 & 0xffffu))),
                d1 = __half2float(__ushort_as_half((unsigned short)(f2 >> 16)));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(l) : "f"(y1 - d1), "f"(y0 - d0));
    hi = h; lo = l;
    if (y0 != y0) { hi = (hi & 0xff00u) | 0x7fu; lo = (lo & 0xff00u) | 0x7fu; }
    if (y1 != y1) { hi = (hi & 0x00ffu) | 0x7f00u; lo = (lo & 0x00ffu) | 0x7f00u; }
  } else {
    const uint8_t h0 = sta_f32_to_e4m3(y0), h1 = sta_f32_to_e4m3(y1);
    hi = (uint32_t)h0 | (uint32_t)h1 << 8;
    lo = (uint32_t)sta_f32_to_e4m3(y0 - sta_e4m3_to_f32(h0)) |
         (uint32_t)sta_f32_to_e4m3(y1 - sta_e4m3_to_f32(h1)) << 8;
  }
}

constexpr int VP = 72; /* bytes per channel of the V tile: 64 rows + 8 (conflict-free) */

template <int D, int ES> constexpr size_t rows_v_smem() {
  return (size_t)2 * D * VP + (size_t)QROWS * (D * ES + 4) + (size_t)D * 4 + QROWS * 4;
}

/* LOW (variant 3): fewer registers for 3 blocks of 256 threads per SM at D
** 128: q and k loaded two passes at a time, V's loads after them. */
template <int D, int ES, bool HW, bool LOW>
__global__ void __launch_bounds__(2 * D, LOW ? 768 / (2 * D) : 1)
    fp8_rows_v(const __grid_constant__ QuantArgs a) {
  constexpr int TPR = D / 8, QP = D * ES + 4; /* q row pitch in shared memory */
  constexpr int PB = LOW ? 2 : 4;            /* passes loaded at once */
  extern __shared__ __align__(16) unsigned char smem[];
  uint8_t *vt = smem;                       /* [2][D][VP] */
  unsigned char *qs = smem + 2 * D * VP;    /* [QROWS][QP]: q's rows as loaded */
  float *km = (float *)(qs + QROWS * QP);   /* [D] k_mean */
  int *rs = (int *)(km + D);                /* [QROWS]: source row, -2 past R */
  const int tid = threadIdx.x;
  const int64_t bh = a.heads_fast ? blockIdx.x : blockIdx.y, b = bh / a.heads, h = bh % a.heads,
                r0 = (int64_t)(a.heads_fast ? blockIdx.y : blockIdx.x) * QROWS, R = a.R;
  if (tid < QROWS) rs[tid] = r0 + tid < R ? a.src[r0 + tid] : -2;
  if (tid < D) km[tid] = a.o.k_mean[bh * D + tid];
  __syncthreads();
  const int g = tid % TPR, ri = tid / TPR; /* q, k: channels 8 g.., rows ri + 16 p */
  const int gv = tid / 16, rq = tid % 16;  /* v: channels 8 gv.., rows 4 rq + j */
  const char *qb = a.q + (b * a.q_sb + h * a.q_sh + 8 * g) * ES,
             *kb = a.k + (b * a.k_sb + h * a.k_sh + 8 * g) * ES,
             *vb = a.v + (b * a.v_sb + h * a.v_sh + 8 * gv) * ES;
  Row8<ES> xq[PB], xk[PB], xv[4];
  auto load_qk = [&](int p0) {
#pragma unroll
    for (int p = p0; p < p0 + PB; p++) {
      const int i = 16 * p + ri, s = rs[i];
      zero8<ES>(xq[p - p0]); zero8<ES>(xk[p - p0]);
      if (s >= 0) ld8<ES>(xq[p - p0], qb + (int64_t)s * a.q_ss * ES);
      if (s >= 0 && r0 + i < a.g.keys_end) ld8<ES>(xk[p - p0], kb + (int64_t)s * a.k_ss * ES);
    }
  };
  auto load_v = [&] {
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int i = 4 * rq + j, s = rs[i];
      zero8<ES>(xv[j]);
      if (s >= 0 && r0 + i < a.g.keys_end) ld8<ES>(xv[j], vb + (int64_t)s * a.v_ss * ES);
    }
  };
  load_qk(0);
  if (!LOW) load_v();
  float pq[8], pk[8], mk[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    const int e = a.o.eq[bh * D + 8 * g + j];
    pq[j] = sta_pow2f(e);
    pk[j] = sta_pow2f(-e);
    mk[j] = km[8 * g + j];
  }
#pragma unroll
  for (int p = 0; p < 4; p++) {
    if (p % PB == 0 && p > 0) load_qk(p);
    const int x = p % PB; /* the pass's registers */
    const int i = 16 * p + ri, s = rs[i];
    const int64_t r = r0 + i, row = bh * R + r;
    const bool key = s >= 0 && r < a.g.keys_end;
    float y[8];
    uint2 c;
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = s >= 0 ? sta_fmul(elt<ES>(xq[x], j, a.dt), pq[j]) : 0.0f;
    float sc = quant8<TPR>(y, c);
    if (s != -2) {
      *(uint2 *)(a.o.q8 + row * D + 8 * g) = c;
      if (g == 0) a.o.q_scale[row] = sc;
    }
#pragma unroll
    for (int w = 0; w < 2 * ES; w++) /* 4-byte stores: QP is 4 mod 16 */
      *(uint32_t *)(qs + i * QP + 8 * ES * g + 4 * w) = word<ES>(xq[x], w);
#pragma unroll
    for (int j = 0; j < 8; j++)
      y[j] = key ? sta_fmul(elt<ES>(xk[x], j, a.dt) - mk[j], pk[j]) : 0.0f;
    sc = quant8<TPR>(y, c);
    if (s != -2) {
      *(uint2 *)(a.o.k8 + row * D + 8 * g) = c;
      if (g == 0) a.o.k_scale[row] = sc;
    }
  }
  if (LOW) load_v();
  {
    float vi[8];
#pragma unroll
    for (int j = 0; j < 8; j++) vi[j] = a.vinv[bh * D + 8 * gv + j];
    uint32_t hw[8], lw[8];
#pragma unroll
    for (int j = 0; j < 8; j++) hw[j] = lw[j] = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int i = 4 * rq + j, s = rs[i];
      const bool key = s >= 0 && r0 + i < a.g.keys_end;
#pragma unroll
      for (int c = 0; c < 8; c += 2) {
        uint32_t hi, lo;
        vcodes<HW>(sta_fmul(elt<ES>(xv[j], c, a.dt), vi[c]),
                   sta_fmul(elt<ES>(xv[j], c + 1, a.dt), vi[c + 1]), key, hi, lo);
        hw[c] |= (hi & 0xffu) << (8 * j);
        hw[c + 1] |= (hi >> 8) << (8 * j);
        lw[c] |= (lo & 0xffu) << (8 * j);
        lw[c + 1] |= (lo >> 8) << (8 * j);
      }
    }
#pragma unroll
    for (int c = 0; c < 8; c++) {
      const int d = 8 * gv + c;
      *(uint32_t *)(vt + d * VP + 4 * rq) = hw[c];
      *(uint32_t *)(vt + (D + d) * VP + 4 * rq) = lw[c];
    }
  }
  __syncthreads();
  if (tid < QROWS && rs[tid] != -2) { /* q_bias: fp8_bias's sum, channel order */
    const int s = rs[tid];
    double bias = 0;
    if (s >= 0) {
      const unsigned char *x = qs + tid * QP;
#pragma unroll 8
      for (int d = 0; d < D; d++)
        bias += (double)(ES == 4 ? *(const float *)(x + 4 * d)
                                 : to_f32(*(const uint16_t *)(x + 2 * d), a.dt)) *
                (double)km[d];
    }
    a.o.q_bias[bh * R + r0 + tid] = s >= 0 ? (float)bias : 0.0f;
  }
  const int n = (int)(R - r0 < QROWS ? R - r0 : QROWS);
  uint8_t *v8 = a.o.v8 + bh * 2 * D * R + r0;
  if (n == QROWS && R % 8 == 0) { /* 8-byte stores */
    for (int x = tid; x < 2 * D * (QROWS / 8); x += 2 * D) {
      const int pd = x / (QROWS / 8), c = x % (QROWS / 8);
      *(uint2 *)(v8 + pd * R + 8 * c) = *(const uint2 *)(vt + pd * VP + 8 * c);
    }
    return;
  }
  for (int x = tid; x < 2 * D * QROWS; x += 2 * D) {
    const int i = x % QROWS, pd = x / QROWS;
    if (i < n) v8[pd * R + i] = vt[pd * VP + i];
  }
}

struct DequantArgs {
  float *dst;
  const uint8_t *x8;
  const float *sc;
  sta_bshd bd, bx;
  int64_t sc_st[3], n;
  int per_row;
};

/* A thread per element, in [B][S][heads][D] order. */
__global__ void fp8_dequant(const __grid_constant__ DequantArgs a) {
  const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= a.n) return;
  const int64_t d = x % a.bx.d, h = (x / a.bx.d) % a.bx.h, s = (x / (a.bx.d * a.bx.h)) % a.bx.s,
                b = x / (a.bx.d * a.bx.h * a.bx.s);
  const float f = sta_e4m3_to_f32(a.x8[b * a.bx.sb + s * a.bx.ss + h * a.bx.sh + d * a.bx.sd]);
  a.dst[b * a.bd.sb + s * a.bd.ss + h * a.bd.sh + d * a.bd.sd] =
      f * a.sc[b * a.sc_st[0] + h * a.sc_st[1] + (a.per_row ? s : d) * a.sc_st[2]];
}


} /* namespace */

sta_status sta_cuda_fp8_dequantize(float *dst, const sta_bshd *bd, const uint8_t *x8,
                                   const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                                   int per_row) {
  DequantArgs a;
  memset(&a, 0, sizeof a);
  a.dst = dst; a.x8 = x8; a.sc = sc; a.bd = *bd; a.bx = *bx; a.per_row = per_row;
  for (int i = 0; i < 3; i++) a.sc_st[i] = sc_st[i];
  a.n = bx->b * bx->s * bx->h * bx->d;
  if (a.n == 0) return STA_OK;
  fp8_dequant<<<(unsigned)((a.n + 255) / 256), 256, 0, sta_cuda_stream()>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "fp8 dequantize: kernel launch");
}

namespace {

/* Operand x of p (element size es) readable by ld8: 16-byte aligned at
** every (b, s, h) it is read at. */
bool rows16(const void *x, int64_t sb, int64_t ss, int64_t sh, const sta_attn_params *p,
            int64_t es) {
  return (uintptr_t)x % 16 == 0 && (p->batch == 1 || sb * es % 16 == 0) && ss * es % 16 == 0 &&
         (p->heads == 1 || sh * es % 16 == 0);
}

/* The pre-pass variant (STA_FP8_PREPASS, read per call: 0 the first
** kernels, 1 the fast path (the default), 2 it with V's e4m3 by cvt, 3 2
** with fp8_rows_v's fewer registers (LOW)),
** 0 where the fast path does not apply (head_dim not 64 or 128, rows not
** 16-byte aligned, output buffers not 8-byte aligned). */
int prepass_variant(const sta_attn_params *p, const sta_fp8_ops *o) {
  const char *v = getenv("STA_FP8_PREPASS");
  const int pv = v && *v ? atoi(v) : 1;
  const int64_t es = (int64_t)sta_dtype_size(p->dtype);
  if (pv < 1 || pv > 3) return 0;
  if (p->head_dim != 64 && p->head_dim != 128) return 0;
  if (p->dtype != STA_BF16 && p->dtype != STA_F16 && p->dtype != STA_F32) return 0;
  if (!rows16(p->q, p->q_sb, p->q_ss, p->q_sh, p, es) ||
      !rows16(p->k, p->k_sb, p->k_ss, p->k_sh, p, es) ||
      !rows16(p->v, p->v_sb, p->v_ss, p->v_sh, p, es))
    return 0;
  if ((uintptr_t)o->q8 % 8 || (uintptr_t)o->k8 % 8 || (uintptr_t)o->v8 % 8) return 0;
  return pv;
}

template <int D, int ES>
sta_status prepass_fast_d(const QuantArgs &a, int pv, cudaStream_t sm) {
  constexpr size_t shm = rows_v_smem<D, ES>();
  void (*rows)(QuantArgs) = pv == 3   ? fp8_rows_v<D, ES, true, true>
                            : pv == 2 ? fp8_rows_v<D, ES, true, false>
                                      : fp8_rows_v<D, ES, false, false>;
  cudaError_t e;
  if (shm > 48 * 1024 &&
      (e = cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm)) !=
          cudaSuccess)
    return sta_cuda_fail(e, "fp8 quantize: shared memory");
  fp8_src<<<(unsigned)((a.R + 255) / 256), 256, 0, sm>>>(a);
  constexpr int hpb = 64 / (D / 4); /* fp8_stats_v's heads per block */
  fp8_stats_v<D, ES><<<dim3((unsigned)a.nchunks, (unsigned)((a.bh + hpb - 1) / hpb)), 64, 0, sm>>>(a);
  const int64_t n = a.bh * D, nrb = (a.R + QROWS - 1) / QROWS;
  fp8_finish<<<(unsigned)((n + 255) / 256), 256, 0, sm>>>(a, n);
  rows<<<a.heads_fast ? dim3((unsigned)a.bh, (unsigned)nrb) : dim3((unsigned)nrb, (unsigned)a.bh),
         2 * D, shm, sm>>>(a);
  return (e = cudaGetLastError()) == cudaSuccess ? STA_OK
                                                 : sta_cuda_fail(e, "fp8 quantize: kernel launch");
}

sta_status prepass_fast(const QuantArgs &a, int pv, cudaStream_t sm) {
  if (a.D == 64) return a.es == 4 ? prepass_fast_d<64, 4>(a, pv, sm) : prepass_fast_d<64, 2>(a, pv, sm);
  return a.es == 4 ? prepass_fast_d<128, 4>(a, pv, sm) : prepass_fast_d<128, 2>(a, pv, sm);
}

} /* namespace */

sta_status sta_cuda_fp8_quantize(const sta_attn_params *p, const sta_fp8_ops *o) {
  QuantArgs a;
  memset(&a, 0, sizeof a);
  sta_fp8_geom_init(&a.g, p);
  a.q = (const char *)p->q; a.k = (const char *)p->k; a.v = (const char *)p->v;
  a.q_sb = p->q_sb; a.q_ss = p->q_ss; a.q_sh = p->q_sh;
  a.k_sb = p->k_sb; a.k_ss = p->k_ss; a.k_sh = p->k_sh;
  a.v_sb = p->v_sb; a.v_ss = p->v_ss; a.v_sh = p->v_sh;
  a.dt = (int)p->dtype;
  a.es = (int)sta_dtype_size(p->dtype);
  a.D = (int)p->head_dim;
  a.heads = p->heads;
  a.R = a.g.rows;
  a.nchunks = (a.R + STA_FP8_CHUNK - 1) / STA_FP8_CHUNK;
  a.o = *o;
  const int64_t bh = p->batch * p->heads;
  if (bh == 0 || a.R == 0 || a.D == 0) return STA_OK;
  if (bh > 65535)
    return sta_error(STA_ERR_UNSUPPORTED, "fp8 quantize: %lld batch x heads (at most 65535)",
                     (long long)bh);
  if (a.D > 32 * QJMAX)
    return sta_error(STA_ERR_UNSUPPORTED, "fp8 quantize: head_dim %d (at most %d)", a.D,
                     32 * QJMAX);
  const size_t part = (size_t)(bh * a.nchunks * a.D);
  const size_t bytes = part * (sizeof(double) + 4 * sizeof(float)) +
                       (size_t)(bh * a.nchunks) * sizeof(long long) +
                       (size_t)(bh * a.D) * sizeof(float) + (size_t)a.R * sizeof(int);
  cudaStream_t sm = sta_cuda_stream();
  void *ws = NULL;
  sta_status s = STA_OK;
  cudaError_t e = cudaMallocAsync(&ws, bytes, sm);
  if (e != cudaSuccess) return sta_cuda_fail(e, "fp8 quantize: workspace");
  a.psum = (double *)ws;
  a.pcount = (long long *)(a.psum + part);
  a.pmax = (float *)(a.pcount + bh * a.nchunks);
  a.pmin = a.pmax + part;
  a.pqam = a.pmin + part;
  a.pvam = a.pqam + part;
  a.vinv = a.pvam + part;
  a.src = (int *)(a.vinv + bh * a.D);
  a.bh = bh;
  const int threads = a.D < 256 ? ((a.D + 31) / 32) * 32 : 256;
  /* heads adjacent in memory (BSHD): blocks of the same rows and
  ** neighbouring heads run together (grid x), not one head's chunks */
  const int64_t nrb = (a.R + QROWS - 1) / QROWS;
  a.heads_fast = p->q_sh < p->q_ss && nrb <= 65535;
  const int pv = prepass_variant(p, o);
  if (pv) {
    s = prepass_fast(a, pv, sm);
    e = cudaFreeAsync(ws, sm);
    if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "fp8 quantize: freeing the workspace");
    return s;
  }
  fp8_stats<<<a.heads_fast ? dim3((unsigned)bh, (unsigned)a.nchunks)
                           : dim3((unsigned)a.nchunks, (unsigned)bh),
              threads, 0, sm>>>(a);
  const int64_t n = bh * a.D;
  fp8_finish<<<(unsigned)((n + 255) / 256), 256, 0, sm>>>(a, n);
  const size_t shm = (size_t)2 * a.D * QROWS;
  void (*rows)(QuantArgs) = a.D <= 64 ? fp8_rows<2> : a.D <= 128 ? fp8_rows<4> : fp8_rows<QJMAX>;
  if (shm > 48 * 1024 &&
      (e = cudaFuncSetAttribute(rows, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm)) !=
          cudaSuccess)
    s = sta_cuda_fail(e, "fp8 quantize: shared memory");
  if (s == STA_OK) {
    rows<<<a.heads_fast ? dim3((unsigned)bh, (unsigned)nrb) : dim3((unsigned)nrb, (unsigned)bh),
           QWARPS * 32, shm, sm>>>(a);
    const int64_t nr = bh * a.R;
    fp8_bias<<<(unsigned)((nr + 255) / 256), 256, 0, sm>>>(a, nr);
    if ((e = cudaGetLastError()) != cudaSuccess) s = sta_cuda_fail(e, "fp8 quantize: kernel launch");
  }
  e = cudaFreeAsync(ws, sm);
  if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "fp8 quantize: freeing the workspace");
  return s;
}
