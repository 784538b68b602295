/*
** vsa_coarse.cu -- VSA's coarse branch on the device (core/vsa_internal.h's
** contracts), per (batch, head) on the cube means (float32):
**   forward   S = Q_c K_c^T (gemm), then per query cube one CTA: the
**             softmax's lse, the exact top-k of S (radix select on the
**             order key sta_vsa_key, ties to the lower index) written in
**             ascending order, S overwritten by A = exp(s S - lse); then
**             out_c = A V_c (gemm);
**   backward  dV_c = A^T G; dS = A (G V_c^T - G . out_c) over A's place;
**             dQ_c = s dS K_c; dK_c = s dS^T Q_c (gemms), spread to the
**             rows (vsa_rows.cu).
** The gemm is a float32 SIMT kernel (128 x 128 tiles, 8 x 8 per thread,
** double-buffered shared memory): every output is one fma chain in k
** order, the same for every (m, n), so equal cubes give equal scores
** (exact ties) and reruns give the same bits.  float32 throughout, as the
** CPU's scores: the selections differ only where scores agree to rounding.
*/
#include "vsa.cuh"

using namespace vsa;

namespace {

/* ---- gemm: C = alpha op(A) op(B), batched over z ------------------------------ */

constexpr int GT = 256, BM = 128, BN = 128, BK = 8, PAD = 4;

enum Epi { EPI_STORE = 0, EPI_DS = 1 };

struct Gemm {
  const float *a, *b;
  float *c;
  int64_t lda, ldb, ldc, sa, sb, sc; /* leading dims and batch strides (elements) */
  int M, N, K;
  float alpha;
  const float *dc; /* EPI_DS: per (batch, row) G . out_c */
  int64_t sdc;
};

/* Tile k0 of A (BM x BK, as As[k][m]) and B (BK x BN, as Bs[k][n]) into
** registers: 4 elements each per thread, zero outside the matrices. */
template <bool TA, bool TB>
__device__ __forceinline__ void gemm_fetch(const Gemm &g, const float *A, const float *B, int m0,
                                           int n0, int k0, float ra[4], float rb[4]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    int m, k;
    if (TA) { k = t / 32; m = (t % 32) * 4 + i; } /* A is K x M */
    else { m = t / 2; k = (t % 2) * 4 + i; }      /* A is M x K */
    m += m0; k += k0;
    ra[i] = m < g.M && k < g.K ? (TA ? A[(int64_t)k * g.lda + m] : A[(int64_t)m * g.lda + k]) : 0.f;
    int n;
    if (TB) { n = t / 2; k = (t % 2) * 4 + i; }   /* B is N x K */
    else { k = t / 32; n = (t % 32) * 4 + i; }    /* B is K x N */
    n += n0; k += k0;
    rb[i] = n < g.N && k < g.K ? (TB ? B[(int64_t)n * g.ldb + k] : B[(int64_t)k * g.ldb + n]) : 0.f;
  }
}

template <bool TA, bool TB>
__device__ __forceinline__ void gemm_stash(float (*As)[BM + PAD], float (*Bs)[BN + PAD],
                                           const float ra[4], const float rb[4]) {
  const int t = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    if (TA) As[t / 32][(t % 32) * 4 + i] = ra[i];
    else As[(t % 2) * 4 + i][t / 2] = ra[i];
    if (TB) Bs[(t % 2) * 4 + i][t / 2] = rb[i];
    else Bs[t / 32][(t % 32) * 4 + i] = rb[i];
  }
}

template <bool TA, bool TB, int EPI>
__global__ void __launch_bounds__(GT) gemm_kernel(Gemm g) {
  __shared__ __align__(16) float As[2][BK][BM + PAD];
  __shared__ __align__(16) float Bs[2][BK][BN + PAD];
  const int64_t z = blockIdx.z;
  const float *A = g.a + z * g.sa, *B = g.b + z * g.sb;
  const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; i++)
#pragma unroll
    for (int j = 0; j < 8; j++) acc[i][j] = 0.f;
  float ra[4], rb[4];
  gemm_fetch<TA, TB>(g, A, B, m0, n0, 0, ra, rb);
  gemm_stash<TA, TB>(As[0], Bs[0], ra, rb);
  __syncthreads();
  const int nk = (g.K + BK - 1) / BK;
  for (int kt = 0; kt < nk; kt++) {
    const int cur = kt & 1;
    if (kt + 1 < nk) gemm_fetch<TA, TB>(g, A, B, m0, n0, (kt + 1) * BK, ra, rb);
#pragma unroll
    for (int k = 0; k < BK; k++) {
      float a[8], b[8];
      const float4 a0 = *(const float4 *)&As[cur][k][ty * 4], a1 = *(const float4 *)&As[cur][k][64 + ty * 4];
      const float4 b0 = *(const float4 *)&Bs[cur][k][tx * 4], b1 = *(const float4 *)&Bs[cur][k][64 + tx * 4];
      a[0] = a0.x; a[1] = a0.y; a[2] = a0.z; a[3] = a0.w; a[4] = a1.x; a[5] = a1.y; a[6] = a1.z; a[7] = a1.w;
      b[0] = b0.x; b[1] = b0.y; b[2] = b0.z; b[3] = b0.w; b[4] = b1.x; b[5] = b1.y; b[6] = b1.z; b[7] = b1.w;
#pragma unroll
      for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (kt + 1 < nk) {
      gemm_stash<TA, TB>(As[cur ^ 1], Bs[cur ^ 1], ra, rb);
      __syncthreads();
    }
  }
  float *C = g.c + z * g.sc;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const int m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (m >= g.M) continue;
    const float dc = EPI == EPI_DS ? g.dc[z * g.sdc + m] : 0.f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
      const int n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (n >= g.N) continue;
      float *c = C + (int64_t)m * g.ldc + n;
      if (EPI == EPI_DS) *c = *c * (acc[i][j] - dc); /* A (dP - G . out_c) */
      else *c = g.alpha * acc[i][j];
    }
  }
}

template <bool TA, bool TB, int EPI>
sta_status gemm(const Gemm &g, int64_t batch, const char *what) {
  if (g.M <= 0 || g.N <= 0 || batch <= 0) return STA_OK;
  const int64_t gy = (g.M + BM - 1) / BM, gx = (g.N + BN - 1) / BN;
  if (batch > 65535 || gy > 65535)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: %s of %lld x %d too large for cuda", what,
                     (long long)batch, g.M);
  gemm_kernel<TA, TB, EPI><<<dim3((unsigned)gx, (unsigned)gy, (unsigned)batch), GT, 0,
                             sta_cuda_stream()>>>(g);
  return launched(what);
}

/* ---- the selection and the softmax of one row of S ---------------------------- */

constexpr int ST = 256;            /* threads per row */
constexpr int MAX_MK = 16384;      /* key cubes a row may have (keys in shared memory) */

/* Deterministic block sums and maxima: per-thread value, warp tree, then
** the warps in order. */
__device__ __forceinline__ float block_sum(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int w = 0; w < ST / 32; w++) t += red[w];
  return t;
}

__device__ __forceinline__ float nan_max(float a, float b) { return a > b || a != a ? a : b; }

__device__ __forceinline__ float block_max(float v, float *red) {
  for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int w = 0; w < ST / 32; w++) t = nan_max(t, red[w]);
  return t;
}

/* Exclusive prefix of v over the threads in order; *total the sum. */
__device__ __forceinline__ int block_scan(int v, int *sh, int *total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();
  if (lane == 31) sh[w] = x;
  __syncthreads();
  int before = 0, all = 0;
  for (int i = 0; i < ST / 32; i++) {
    if (i < w) before += sh[i];
    all += sh[i];
  }
  *total = all;
  return before + x - v;
}

struct Select {
  float *s;          /* [z][Mq][Mk]: S in, A out */
  float *lse;        /* [z][Mq] */
  int32_t *idx, *num; /* [z][Mq][topk], [z][Mq] */
  int Mq, Mk, topk;
  float scale;
};

/* One CTA per (query cube x, z).  Each thread owns the contiguous indices
** [t E, t E + E), so prefix sums over the threads run in index order. */
__global__ void __launch_bounds__(ST) select_kernel(Select a) {
  extern __shared__ uint32_t keys[];
  __shared__ float red[ST / 32];
  __shared__ int hist[256], scan[ST / 32];
  __shared__ uint32_t sh_digit;
  __shared__ int sh_need;
  const int64_t row = (int64_t)blockIdx.y * a.Mq + blockIdx.x;
  float *s = a.s + row * a.Mk;
  const int E = (a.Mk + ST - 1) / ST, lo = threadIdx.x * E, hi = min(a.Mk, lo + E);
  float mx = -INFINITY;
  for (int n = lo; n < hi; n++) {
    const float v = s[n];
    keys[n] = sta_vsa_key(v);
    mx = nan_max(mx, a.scale * v);
  }
  mx = block_max(mx, red);
  float part = 0.f;
  for (int n = lo; n < hi; n++) part += expf(a.scale * s[n] - mx);
  const float lse = mx + logf(block_sum(part, red));
  /* the topk-th largest key: 8 bits at a time from the top */
  uint32_t prefix = 0, pmask = 0;
  int need = a.topk;
  if (a.topk < a.Mk) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int i = threadIdx.x; i < 256; i += ST) hist[i] = 0;
      __syncthreads();
      for (int n = lo; n < hi; n++)
        if ((keys[n] & pmask) == prefix) atomicAdd(&hist[(keys[n] >> shift) & 255u], 1);
      __syncthreads();
      if (threadIdx.x < 32) { /* the digit where the count from the top reaches need */
        int c[8], sum = 0;
        for (int i = 0; i < 8; i++) { c[i] = hist[255 - (threadIdx.x * 8 + i)]; sum += c[i]; }
        int x = sum;
        for (int o = 1; o < 32; o <<= 1) {
          const int y = __shfl_up_sync(0xffffffffu, x, o);
          if (threadIdx.x >= o) x += y;
        }
        int before = x - sum; /* keys with larger digits, before this lane's 8 */
        for (int i = 0; i < 8; i++) {
          if (before < need && before + c[i] >= need) {
            sh_digit = 255u - (uint32_t)(threadIdx.x * 8 + i);
            sh_need = need - before;
          }
          before += c[i];
        }
      }
      __syncthreads();
      prefix |= sh_digit << shift;
      pmask |= 255u << shift;
      need = sh_need;
      __syncthreads();
    }
  } else {
    prefix = 0; /* every key: those > 0 and the first `need` of key 0 */
    need = a.topk;
  }
  /* chosen: key > T, or key == T among the first `need` in index order */
  const uint32_t T = prefix;
  int eq = 0;
  for (int n = lo; n < hi; n++) eq += keys[n] == T;
  int tot;
  int eq_before = block_scan(eq, scan, &tot);
  int chosen = 0;
  for (int n = lo; n < hi; n++) {
    const bool e = keys[n] == T;
    chosen += keys[n] > T || (e && eq_before < need);
    eq_before += e;
  }
  int at = block_scan(chosen, scan, &tot);
  eq_before -= eq;
  int32_t *out = a.idx + row * a.topk;
  for (int n = lo; n < hi; n++) {
    const bool e = keys[n] == T;
    if (keys[n] > T || (e && eq_before < need)) out[at++] = n;
    eq_before += e;
  }
  for (int n = lo; n < hi; n++) s[n] = expf(a.scale * s[n] - lse);
  if (threadIdx.x == 0) {
    a.lse[row] = lse;
    a.num[row] = a.topk;
  }
}

/* dc[row] = G[row] . out_c[row]: one warp per row, lanes in d order then
** a fixed tree. */
__global__ void dot_rows_kernel(const float *g, const float *oc, float *dc, int64_t rows, int D) {
  const int64_t row = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float v = 0.f;
  for (int d = lane; d < D; d += 32) v = fmaf(g[row * D + d], oc[row * D + d], v);
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) dc[row] = v;
}

Gemm gemm_of(const float *a, int64_t lda, int64_t sa, const float *b, int64_t ldb, int64_t sb,
             float *c, int64_t ldc, int64_t sc, int64_t M, int64_t N, int64_t K, float alpha) {
  Gemm g;
  memset(&g, 0, sizeof g);
  g.a = a; g.lda = lda; g.sa = sa;
  g.b = b; g.ldb = ldb; g.sb = sb;
  g.c = c; g.ldc = ldc; g.sc = sc;
  g.M = (int)M; g.N = (int)N; g.K = (int)K;
  g.alpha = alpha;
  return g;
}

sta_status check_sizes(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  if (f->kv_blocks > MAX_MK)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: %lld key cubes; the CUDA selection takes up to %d",
                     (long long)f->kv_blocks, MAX_MK);
  if (f->q_blocks > INT32_MAX / 2 || f->head_dim > INT32_MAX / 2)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: %lld query cubes too many for cuda",
                     (long long)f->q_blocks);
  return STA_OK;
}

} /* namespace */

sta_status sta_cuda_vsa_coarse(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t z = f->batch * f->heads, D = f->head_dim, mq = f->q_blocks, mk = f->kv_blocks;
  sta_status rc = check_sizes(p);
  if (rc != STA_OK) return rc;
  /* S = Q_c K_c^T */
  if ((rc = gemm<false, true, EPI_STORE>(gemm_of(p->qc, D, mq * D, p->kc, D, mk * D, p->sc, mk,
                                                 mq * mk, mq, mk, D, 1.0f),
                                         z, "vsa scores")) != STA_OK)
    return rc;
  if (z > 65535)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: batch x heads %lld too large for cuda",
                     (long long)z);
  const size_t smem = sizeof(uint32_t) * (size_t)mk;
  if (smem > 40 * 1024) { /* past the default 48 KB with the static part */
    cudaError_t e = cudaFuncSetAttribute(select_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem);
    if (e != cudaSuccess) return sta_cuda_fail(e, "vsa selection: shared memory");
  }
  Select a = {p->sc, p->lsec, p->idx, p->num, (int)mq, (int)mk, p->topk, f->scale};
  select_kernel<<<dim3((unsigned)mq, (unsigned)z), ST, smem, sta_cuda_stream()>>>(a);
  if ((rc = launched("vsa selection")) != STA_OK) return rc;
  /* out_c = A V_c */
  return gemm<false, false, EPI_STORE>(gemm_of(p->sc, mk, mq * mk, p->vc, D, mk * D, p->oc, D,
                                               mq * D, mq, D, mk, 1.0f),
                                       z, "vsa coarse attention");
}

sta_status sta_cuda_vsa_backward_coarse(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t z = f->batch * f->heads, D = f->head_dim, mq = f->q_blocks, mk = f->kv_blocks;
  sta_status rc = check_sizes(p);
  if (rc != STA_OK) return rc;
  /* dV_c = A^T G */
  if ((rc = gemm<true, false, EPI_STORE>(gemm_of(p->sc, mk, mq * mk, p->gc, D, mq * D, p->dvc, D,
                                                 mk * D, mk, D, mq, 1.0f),
                                         z, "vsa coarse dv")) != STA_OK)
    return rc;
  /* G . out_c per query cube, into lse_c's place (the forward's lse_c is
  ** not needed again) */
  const int64_t rows = z * mq;
  dot_rows_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, sta_cuda_stream()>>>(p->gc, p->oc,
                                                                            p->lsec, rows, (int)D);
  if ((rc = launched("vsa coarse dot")) != STA_OK) return rc;
  /* dS = A (G V_c^T - G . out_c), over A */
  Gemm g = gemm_of(p->gc, D, mq * D, p->vc, D, mk * D, p->sc, mk, mq * mk, mq, mk, D, 1.0f);
  g.dc = p->lsec;
  g.sdc = mq;
  if ((rc = gemm<false, true, EPI_DS>(g, z, "vsa coarse ds")) != STA_OK) return rc;
  /* dQ_c = s dS K_c, dK_c = s dS^T Q_c */
  if ((rc = gemm<false, false, EPI_STORE>(gemm_of(p->sc, mk, mq * mk, p->kc, D, mk * D, p->dqc, D,
                                                  mq * D, mq, D, mk, f->scale),
                                          z, "vsa coarse dq")) != STA_OK ||
      (rc = gemm<true, false, EPI_STORE>(gemm_of(p->sc, mk, mq * mk, p->qc, D, mq * D, p->dkc, D,
                                                 mk * D, mk, D, mq, f->scale),
                                         z, "vsa coarse dk")) != STA_OK)
    return rc;
  if ((rc = sta_cuda_vsa_spread(p, 0, f->dq, f->dq_sb, f->dq_ss, f->dq_sh, p->dqc)) != STA_OK ||
      (rc = sta_cuda_vsa_spread(p, 1, f->dk, f->dk_sb, f->dk_ss, f->dk_sh, p->dkc)) != STA_OK)
    return rc;
  return sta_cuda_vsa_spread(p, 1, f->dv, f->dv_sb, f->dv_ss, f->dv_sh, p->dvc);
}
