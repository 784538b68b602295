/*
** mainloop_fp8.cuh -- one consumer warpgroup's work in the fp8 forward
** (kernel_fp8.cuh): per key block S = Q K^T in int8 (s32 accumulators),
** the scores as core/cpu_fp8.c takes them, the online softmax against the
** running maximum rounded up to an integer (rescales are exact powers of
** two), P * 448 in e4m3 straight from the accumulators into wgmma's 8-bit
** A fragment (the key order of producer_fp8.cuh's fp8_col_key makes the
** two one), O += P V_hi + P V_lo; then the output rows.
**
** Accumulator fragments (m64nN, per warp w and lane 4g+t): register
** x = 4j + 2i + e holds row 16w + g + 8i, column 8j + 2t + e.
*/
#ifndef STA_MAINLOOP_FP8_CUH
#define STA_MAINLOOP_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp8_params.h"
#include "mma.cuh"
#include "wgmma_fp8.cuh"

namespace sta {

/* Two-level PV accumulation (scheme V of bench/fp8_sim.py, the default):
** each block's P V into a fresh accumulator, added to O in float32, so
** Hopper's fp8 accumulator (about 22 bits) sums 2 x 128 products only.
** 0: P V straight into O (64 registers fewer per thread at D 128). */
#ifndef STA_FP8_TWO_LEVEL
#define STA_FP8_TWO_LEVEL 1
#endif

/* sta_fp8_source (core/internal.h) in 32-bit arithmetic (rows < 2^30:
** fp8_api.cu's limit; its 64-bit divisions cost about 1000 instructions):
** the input row of quantized row r, or -1 for a padding place. */
__device__ __forceinline__ int fp8_source(const sta_fp8_geom &g, int r) {
  if (r >= g.tiled_video) return r - (int)g.tiled_video + (int)g.video_rows;
  const int tv = g.tile[0] * g.tile[1] * g.tile[2], id = r / tv, in = r % tv;
  const int t = id / (g.grid[1] * g.grid[2]) * g.tile[0] + in / (g.tile[1] * g.tile[2]);
  const int h = (id / g.grid[2]) % g.grid[1] * g.tile[1] + (in / g.tile[2]) % g.tile[1];
  const int w = id % g.grid[2] * g.tile[2] + in % g.tile[2];
  if (t >= g.canvas[0] || h >= g.canvas[1] || w >= g.canvas[2]) return -1;
  return g.tiled ? r : (t * g.canvas[1] + h) * g.canvas[2] + w;
}

/* (float)x for |x| < 2^22 (S's dot products: at most 127 * 127 * 128), by
** an integer and a float add at full rate instead of I2F, which shares
** the quarter-rate pipe with ex2 and the e4m3 conversions (exact: the
** same bits). */
__device__ __forceinline__ float i2f(int32_t x) {
  return __int_as_float(x + 0x4B400000) - 12582912.0f;
}

/* e4m3 codes of (lo, hi) in the low and high byte. */
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

/* One warpgroup's running state over its 64 rows (2 per thread). */
template <int D> struct Fp8Rows {
  float o[D / 2];
  float m[2], l[2], qsc[2];
};

/* acc (fresh: overwritten, else added to) += P V_hi + P V_lo, issued and
** committed, not waited for; pa: P's A fragments of the 4 chunks of 32
** keys, dv: the V planes. */
template <int D>
__device__ __forceinline__ void issue_pv(float *acc, uint32_t (*pa)[4], uint32_t dv, int fresh) {
  sta_wgmma::fence();
#pragma unroll
  for (int pl = 0; pl < 2; pl++)
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
      const uint64_t b = sdesc_of(dv + (uint32_t)((pl * D * 128 + kc * 32) >> 4));
      const int sd = fresh ? pl | kc : 1;
      if constexpr (D == 128) sta_wgmma::rs_n128_e4m3(acc, pa[kc], b, sd);
      else sta_wgmma::rs_n64_e4m3(acc, pa[kc], b, sd);
    }
  sta_wgmma::commit();
}

/* S = Q K^T in int8 (dq, dk: descriptor words of this warpgroup's Q rows
** and the block's K rows; HI: the descriptors' high word, Fp8Smem::HI),
** issued and committed, not waited for. */
template <int D, uint32_t HI>
__device__ __forceinline__ void issue_s(int32_t *sacc, uint32_t dq, uint32_t dk) {
  sta_wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < D / 32; ks++)
    sta_wgmma::ss_n128_s8(sacc, ((uint64_t)HI << 32) | (dq + ks * 2),
                          ((uint64_t)HI << 32) | (dk + ks * 2), ks > 0);
  sta_wgmma::commit();
}

/* A block's per-key info as (k_scale, 0) or (0, -inf) per S column, the
** columns 2i and 2i + 1 at once, from two arrays: k_scale (it arrives by
** a bulk copy) and the bias. */
struct Fp8KeyInfo {
  const float2 *ks, *bias;
};
__device__ __forceinline__ float4 fp8_info(const Fp8KeyInfo &x, int i) {
  const float2 k = x.ks[i], b = x.bias[i];
  return make_float4(k.x, b.x, k.y, b.y);
}

/* The softmax of one block's S (sp, waited for), in place: the s32
** accumulators become the float bits of P = exp2(score - m) (one array for
** both: the wgmma's "+r" operands keep it live throughout); the running
** max st.m (an integer), alpha = 2^(old m - new m), the row sums st.l;
** info: (k_scale, 0) or (0, -inf) per S column. */
template <int D>
__device__ __forceinline__ void fp8_softmax(Fp8Rows<D> &st, int32_t *sp, float *alpha,
                                            const Fp8KeyInfo &info, int t) {
  float s[64];
  /* scores s = acc * (q_scale * scale * log2 e) * k_scale (cpu_fp8.c's
  ** order), -inf where info masks the key */
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const float4 ki = fp8_info(info, 4 * j + t); /* columns 8j + 2t, 8j + 2t + 1 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int x = 4 * j + 2 * i;
      s[x] = fmaf(i2f(sp[x]) * st.qsc[i], ki.x, ki.y);
      s[x + 1] = fmaf(i2f(sp[x + 1]) * st.qsc[i], ki.z, ki.w);
      mx[i] = fmaxf(mx[i], fmaxf(s[x], s[x + 1]));
    }
  }
  float mref[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float mn = fmaxf(st.m[i], ceilf(mx[i])); /* an integer (or -inf) */
    alpha[i] = mn == st.m[i] ? 1.0f
               : st.m[i] == -INFINITY ? 0.0f
                                      : ldexpf(1.0f, (int)fmaxf(st.m[i] - mn, -256.0f));
    st.m[i] = mn;
    mref[i] = mn == -INFINITY ? 0.0f : mn;
  }
  /* P = exp2(s - m); the row sum of P unrounded */
  float ps[2] = {0.0f, 0.0f};
#pragma unroll
  for (int x = 0; x < 64; x++) {
    s[x] = ex2(s[x] - mref[(x >> 1) & 1]);
    ps[(x >> 1) & 1] += s[x];
    sp[x] = __float_as_int(s[x]);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) st.l[i] = st.l[i] * alpha[i] + ps[i];
}

/* P * 448 in e4m3 as the A fragment: chunk kc of 32 keys, register r: row
** i = r & 1, the columns of j = 4kc + 2(r >> 1) and j + 1 (fp8_col_key
** puts key 4t + b there). */
__device__ __forceinline__ void pack_p(const int32_t *sp, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kc = 0; kc < 4; kc++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int x = 4 * (4 * kc + 2 * (r >> 1)) + 2 * (r & 1);
      pa[kc][r] = e4m3x2(__int_as_float(sp[x]) * 448.0f, __int_as_float(sp[x + 1]) * 448.0f) |
                  (e4m3x2(__int_as_float(sp[x + 4]) * 448.0f,
                          __int_as_float(sp[x + 5]) * 448.0f) << 16);
    }
}

/* O after P V of a block (ob: it, or NULL where it went into O directly)
** with the block's alpha: two-level O = O alpha + ob (else O was rescaled
** before the PV: rescale_o). */
template <int D>
__device__ __forceinline__ void add_pv(Fp8Rows<D> &st, const float *ob, const float *alpha) {
#pragma unroll
  for (int x = 0; x < D / 2; x++) st.o[x] = fmaf(st.o[x], alpha[(x >> 1) & 1], ob[x]);
}
template <int D>
__device__ __forceinline__ void rescale_o(Fp8Rows<D> &st, const float *alpha) {
#pragma unroll
  for (int x = 0; x < D / 2; x++) st.o[x] *= alpha[(x >> 1) & 1];
}

/* One key block: S, its softmax, P V. */
template <int D, uint32_t HI>
__device__ __forceinline__ void fp8_block(Fp8Rows<D> &st, uint32_t dq, uint32_t dk, uint32_t dv,
                                          const Fp8KeyInfo &info, int t) {
  int32_t sacc[64];
  issue_s<D, HI>(sacc, dq, dk);
  sta_wgmma::wait<0>();
  sta_wgmma::pin_i<64>(sacc);
  float alpha[2];
  fp8_softmax<D>(st, sacc, alpha, info, t);
  uint32_t pa[4][4];
  pack_p(sacc, pa);
#if STA_FP8_TWO_LEVEL
  float ob[D / 2];
  issue_pv<D>(ob, pa, dv, 1);
  sta_wgmma::wait<0>();
  sta_wgmma::pin<D / 2>(ob);
  add_pv<D>(st, ob, alpha);
#else
  rescale_o<D>(st, alpha);
  issue_pv<D>(st.o, pa, dv, 0);
  sta_wgmma::wait<0>();
  sta_wgmma::pin<D / 2>(st.o);
#endif
  sta_wgmma::pin_r<16>(&pa[0][0]);
}

/* The output of this thread's two rows (rows[i]: quantized row, or -1
** where the row is not this item's): out = O / (448 l) * v_scale in the
** input dtype at the row's place in the caller's order and layout; lse =
** ln l + m ln 2 + scale * q_bias, its two multiply-adds spelled out (left
** to the compiler, two kernels that inlined this differed in the last
** bit).  A padding row of the tiled order (an input row without a token)
** gets 0 and lse -inf, as the reference. */
template <int D>
__device__ __forceinline__ void fp8_store(const Fp8Params &a, Fp8Rows<D> &st, int64_t bh,
                                          const int64_t rows[2], int t) {
  const int64_t b = bh / a.heads, h = bh % a.heads;
  const float *vs = a.v_scale + bh * D;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 1);
    st.l[i] += __shfl_xor_sync(0xffffffffu, st.l[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) {
    if (rows[i] < 0) continue;
    int64_t src = fp8_source(a.g, (int)rows[i]);
    const bool pad = src < 0;
    if (pad && !a.g.tiled) continue; /* a place of the untiled order's padded tiles */
    if (pad) src = rows[i];
    const float inv = pad ? 0.0f : 1.0f / (448.0f * st.l[i]);
    const int64_t off = b * a.o_sb + src * a.o_ss + h * a.o_sh;
#pragma unroll
    for (int j = 0; j < D / 8; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int d = 8 * j + 2 * t + e;
        const float v = pad ? 0.0f : st.o[4 * j + 2 * i + e] * inv * vs[d];
        if (a.out_dt == STA_F32) ((float *)a.o)[off + d] = v;
        else
          ((uint16_t *)a.o)[off + d] = a.out_dt == STA_F16
                                           ? __half_as_ushort(__float2half_rn(v))
                                           : __bfloat16_as_ushort(__float2bfloat16_rn(v));
      }
    if (a.lse && t == 0)
      a.lse[b * a.lse_sb + h * a.lse_sh + src * a.lse_ss] =
          pad ? -INFINITY
              : __fmaf_rn(a.scale, a.q_bias[bh * a.R + rows[i]],
                          __fmaf_rn(st.m[i], 0.6931471805599453f, logf(st.l[i])));
  }
}

} /* namespace sta */

#endif
