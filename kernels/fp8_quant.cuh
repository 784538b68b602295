/*
** fp8_quant.cuh -- what the fp8 quantize pre-pass's two files share
** (fp8_quant.cu: the entry point, the portable kernels and the dequantize;
** fp8_prepass.cu: the bandwidth kernels, the default where they apply):
** the launch arguments and fp8_finish, the step both paths run.
*/
#ifndef STA_FP8_QUANT_CUH
#define STA_FP8_QUANT_CUH

#include "ops.cuh"

namespace sta_fp8q {


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

/* A thread per (batch * head, channel): the chunks' partials in order;
** k_mean, the channel exponent, v_scale and 448 / amax of v. */
static __global__ void fp8_finish(const __grid_constant__ QuantArgs a, int64_t n) {
  const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (x >= n) return;
  const int64_t bh = x / a.D, d = x % a.D;
  double sum = 0;
  float mx = -INFINITY, mn = INFINITY, qa = 0.0f, va = 0.0f;
  long long count = 0;
  for (int64_t c = 0; c < a.nchunks; c++) { /* the partials are finite (or +-inf) */
    const int64_t i = (bh * a.nchunks + c) * a.D + d;
    sum += a.psum[i];
    if (a.pmax[i] > mx) mx = a.pmax[i];
    if (a.pmin[i] < mn) mn = a.pmin[i];
    qa = sta_amax_finite(qa, a.pqam[i]);
    va = sta_amax_finite(va, a.pvam[i]);
    count += a.pcount[bh * a.nchunks + c];
  }
  const float mean = count > 0 ? (float)(sum / (double)count) : 0.0f;
  const float kam = sta_amax_nan(sta_amax_nan(0.0f, mx - mean), mean - mn);
  a.o.k_mean[x] = mean;
  a.o.eq[x] = (int8_t)sta_fp8_exponent(qa, kam);
  a.o.v_scale[x] = va / 448.0f;
  a.vinv[x] = sta_fp8_inv(448.0f, va);
}

/* The bandwidth pre-pass (fp8_prepass.cu) applies to p: head_dim 64 or
** 128, bf16/f16/f32, q, k, v rows 16-byte aligned, the codes 8-byte
** aligned. */
bool prepass_fast_ok(const sta_attn_params *p, const sta_fp8_ops *o);

/* The bandwidth pre-pass on stream sm (a's workspace set). */
sta_status prepass_fast(const QuantArgs &a, cudaStream_t sm);

} /* namespace sta_fp8q */

#endif
