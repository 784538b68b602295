/*
** fp8_quant.cu -- the fp8 forward's quantize pre-pass (core/fp8_internal.h,
** sta_fp8_ops; the scheme: sta.h, sta_precision): the bits
** core/cpu_fp8.c's sta_cpu_fp8_quantize writes (spec/test_gpu_fp8.c
** compares them).  Every rounding goes through internal.h's and
** fp8_internal.h's STA_HD helpers, which the host shares; the sums whose order matters (the keys'
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
**               V's codes staged in shared memory and stored transposed,
**               64 rows of a channel at once
**   fp8_bias    a thread per (batch * head, row): q . k_mean (double,
**               channel order)
** Padding rows and the k, v of rows that are never keys are written as 0.
** Those four (fp8_finish in fp8_quant.cuh) are the fallback (the tests
** force them: sta_cuda_set_fp8_prepass_test); the default, where it
** applies, is fp8_prepass.cu's bandwidth pre-pass (the same bits).
*/
#include "fp8_quant.cuh"

using namespace sta_fp8q;

namespace {

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
        qa = sta_amax_finite(qa, qv[u]);
        if (i >= kend) continue;
        n++;
        s += (double)sta_finite_or0(kv[u]);
        if (kv[u] > mx && kv[u] < INFINITY) mx = kv[u];
        if (kv[u] < mn && kv[u] > -INFINITY) mn = kv[u];
        va = sta_amax_finite(va, vv[u]);
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

constexpr int QJMAX = 8; /* channels per lane: D <= 32 * QJMAX */

/* y and the amax (warp shuffles; order-free) of a row held in registers,
** channel d = lane + 32 j in x[j]: y = (x - sub[d]) * 2^(sgn * eq[d])
** (sub: NULL for none). */
template <int QJ>
__device__ __forceinline__ float row_y(const float *x, const int8_t *eq, const float *sub, int sgn,
                                       int D, int lane, float *y) {
  float m = 0.0f;
#pragma unroll
  for (int j = 0; j < QJ; j++) {
    const int d = lane + 32 * j;
    y[j] = d < D ? sta_fmul(sub ? x[j] - sub[d] : x[j], sta_pow2f(sgn * eq[d])) : 0.0f;
    if (d < D) m = sta_amax_nan(m, y[j]);
  }
  for (int o = 16; o > 0; o >>= 1) m = sta_amax_nan(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;
}

/* The int8 codes and scale of that row coded with amax m: code =
** rint(y * inv). */
template <int QJ>
__device__ __forceinline__ void code_row(const float *y, float m, int D, int lane, int8_t *code,
                                         float *scale) {
  const float inv = sta_fp8_inv(127.0f, m);
#pragma unroll
  for (int j = 0; j < QJ; j++) {
    const int d = lane + 32 * j;
    if (d < D) code[d] = sta_f32_to_i8(sta_fmul(y[j], inv));
  }
  if (lane == 0) *scale = m / 127.0f;
}

/* Dynamic shared memory: V's codes [D][QROWS] bytes.  A warp per row
** at a time, the row's q, k and v loaded into registers at once (QJ per
** lane: D <= 32 QJ); k's row amaxes first, then (the block's 64 rows one
** key group, STA_FP8_KGROUP) each key's k loaded again and coded with
** sta_fp8_key_amax of the group's amax. */
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
  __shared__ float ka[QROWS];  /* k's row amax, -1: no key */
  static_assert(QROWS == STA_FP8_KGROUP, "a block's rows are one key group");
  if (threadIdx.x < QROWS && r0 + threadIdx.x < a.R)
    rsrc[threadIdx.x] = (int)sta_fp8_source(&a.g, r0 + threadIdx.x);
  __syncthreads();
  for (int i = w; i < QROWS; i += QWARPS) {
    const int64_t r = r0 + i, row = bh * a.R + r;
    if (r >= a.R) break;
    const int64_t krow = bh * a.R + sta_fp8_kslot(r, a.R);
    int8_t *q8 = a.o.q8 + row * D, *k8 = a.o.k8 + krow * D;
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
    float y[QJ];
    if (src < 0) {
      for (int d = lane; d < D; d += 32) q8[d] = 0;
      if (lane == 0) a.o.q_scale[row] = 0.0f;
    } else {
      code_row<QJ>(y, row_y<QJ>(xq, eq, nullptr, 1, D, lane, y), D, lane, q8, &a.o.q_scale[row]);
    }
    if (lane == 0) ka[i] = -1.0f;
    if (!key) {
      for (int d = lane; d < D; d += 32) {
        k8[d] = 0;
        vt[d * QROWS + i] = 0;
      }
      if (lane == 0) a.o.k_scale[krow] = 0.0f;
      continue;
    }
    const float m = row_y<QJ>(xk, eq, mean, -1, D, lane, y);
    if (lane == 0) ka[i] = m;
#pragma unroll
    for (int j = 0; j < QJ; j++) {
      const int d = lane + 32 * j;
      if (d >= D) continue;
      vt[d * QROWS + i] = sta_fp8_vcode(xv[j], vinv[d]);
    }
  }
  __syncthreads();
  float gam = 0.0f; /* the group's amax: the largest finite row amax of its keys */
  for (int i = 0; i < QROWS && r0 + i < a.R; i++) gam = sta_fp8_group_amax(gam, ka[i]);
  for (int i = w; i < QROWS; i += QWARPS) {
    const int64_t r = r0 + i;
    if (r >= a.R) break;
    if (ka[i] < 0.0f) continue; /* no key (NaN is one) */
    const int64_t src = rsrc[i], krow = bh * a.R + sta_fp8_kslot(r, a.R);
    float xk[QJ], y[QJ];
#pragma unroll
    for (int j = 0; j < QJ; j++) {
      const int d = lane + 32 * j;
      xk[j] = d < D ? ld(a.k, b * a.k_sb + src * a.k_ss + h * a.k_sh + d, a) : 0.0f;
    }
    (void)row_y<QJ>(xk, eq, mean, -1, D, lane, y);
    code_row<QJ>(y, sta_fp8_key_amax(ka[i], gam), D, lane, a.o.k8 + krow * D,
                 &a.o.k_scale[krow]);
  }
  const int n = (int)(a.R - r0 < QROWS ? a.R - r0 : QROWS);
  if (n == QROWS && a.R % 16 == 0) { /* 16-byte stores */
    for (int x = threadIdx.x; x < D * (QROWS / 16); x += blockDim.x) {
      const int d = x / (QROWS / 16), c = x % (QROWS / 16);
      *(uint4 *)(a.o.v8 + (bh * D + d) * a.R + r0 + c * 16) =
          *(const uint4 *)(vt + d * QROWS + c * 16);
    }
    return;
  }
  for (int x = threadIdx.x; x < D * QROWS; x += blockDim.x) {
    const int i = x % QROWS, d = x / QROWS;
    if (i < n) a.o.v8[(bh * D + d) * a.R + r0 + i] = vt[x];
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

static thread_local int fast_prepass = 1;
void sta_cuda_set_fp8_prepass_test(int fast) { fast_prepass = fast; }

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
  cudaError_t e = sta_cuda_ws_alloc(&ws, bytes, sm);
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
  if (fast_prepass && prepass_fast_ok(p, o)) {
    s = prepass_fast(a, sm);
    e = cudaFreeAsync(ws, sm);
    if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "fp8 quantize: freeing the workspace");
    return s;
  }
  fp8_stats<<<a.heads_fast ? dim3((unsigned)bh, (unsigned)a.nchunks)
                           : dim3((unsigned)a.nchunks, (unsigned)bh),
              threads, 0, sm>>>(a);
  const int64_t n = bh * a.D;
  fp8_finish<<<(unsigned)((n + 255) / 256), 256, 0, sm>>>(a, n);
  const size_t shm = (size_t)a.D * QROWS;
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
