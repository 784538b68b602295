/*
** mainloop_fp8.cuh -- one consumer warpgroup's work in the fp8 forward
** (kernel_fp8.cuh): per key block S = Q K^T in int8 (s32 accumulators),
** the scores as core/cpu_fp8.c takes them, the online softmax (the running
** maximum over the blocks, as the reference takes it), P * STA_FP8_PSCALE
** in e4m3 straight from the accumulators into
** wgmma's 8-bit A fragment (the key order of producer_fp8.cuh's
** fp8_col_key makes the two one), O += P V; then the output rows.
**
** Accumulator fragments (m64nN, per warp w and lane 4g+t): register
** x = 4j + 2i + e holds row 16w + g + 8i, column 8j + 2t + e.
**
** Compile-time variants (the device A/B, scripts/device/gpu-check-fp8;
** the losers are deleted once measured):
**   STA_FP8_FLUSH     1: each block's P V in a fresh accumulator, added to
**                     O in float32 (Hopper's fp8 accumulator keeps about
**                     22 bits: research/fp8_sim.py); 0: O stays in the
**                     wgmma accumulator across blocks (64 registers fewer)
**   STA_FP8_OVERLAP   1: S(n+1) issued with P V(n), the softmax of n+1
**                     under P V(n) (the bf16 kernel's order); 0: S, its
**                     softmax, P V one after the other
**   STA_FP8_PINGPONG  1: the two consumer warpgroups take turns issuing
**                     their GEMMs (named barriers 4 and 5), so one's
**                     softmax runs under the other's GEMMs
*/
#ifndef STA_MAINLOOP_FP8_CUH
#define STA_MAINLOOP_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp8_params.h"
#include "mma.cuh"
#include "wgmma_fp8.cuh"

#ifndef STA_FP8_FLUSH
#define STA_FP8_FLUSH 1
#endif
#ifndef STA_FP8_OVERLAP
#define STA_FP8_OVERLAP 0
#endif
#ifndef STA_FP8_PINGPONG
#define STA_FP8_PINGPONG 1
#endif

namespace sta {

constexpr float FP8_LOG2_PSCALE = 8.807354922057604f;  /* log2(STA_FP8_PSCALE) */
constexpr float FP8_LN_PSCALE = 6.104793232414985f;    /* ln(STA_FP8_PSCALE) */
static_assert(STA_FP8_PSCALE == 448.0f, "the constants above are of 448");

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

/* One warpgroup's running state over its 64 rows (2 per thread): O, the
** running maximum m (exp2 domain, or -inf), the row sums l of
** P * STA_FP8_PSCALE, q_scale * scale * log2 e. */
template <int D> struct Fp8Rows {
  float o[D / 2];
  float m[2], l[2], qsc[2];
};

/* acc = P V (fresh) or acc += P V, issued and committed, not waited for;
** pa: P's A fragments of the 4 chunks of 32 keys, dv: the V block. */
template <int D>
__device__ __forceinline__ void issue_pv(float *acc, uint32_t (*pa)[4], uint32_t dv, int fresh) {
  sta_wgmma::fence();
#pragma unroll
  for (int kc = 0; kc < 4; kc++) {
    const uint64_t b = sdesc_of(dv + (uint32_t)((kc * 32) >> 4));
    const int sd = fresh ? kc > 0 : 1;
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
** accumulators become the float bits of P * STA_FP8_PSCALE =
** exp2(score - m + log2 STA_FP8_PSCALE) (one array for both: the wgmma's
** "+r" operands keep it live throughout); the running max st.m, alpha =
** 2^(old m - new m), the row sums st.l; info: (k_scale,
** 0) or (0, -inf) per S column.  Per score: the integer to float (2), its
** k_scale and mask (1), the max (1), q_scale and m (1), ex2, the sum (1). */
template <int D>
__device__ __forceinline__ void fp8_softmax(Fp8Rows<D> &st, int32_t *sp, float *alpha,
                                            const Fp8KeyInfo &info, int t) {
  /* u = acc * k_scale (the score over q_scale * scale * log2 e), -inf
  ** where info masks the key */
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const float4 ki = fp8_info(info, 4 * j + t); /* columns 8j + 2t, 8j + 2t + 1 */
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int x = 4 * j + 2 * i;
      const float u0 = fmaf(i2f(sp[x]), ki.x, ki.y), u1 = fmaf(i2f(sp[x + 1]), ki.z, ki.w);
      sp[x] = __float_as_int(u0);
      sp[x + 1] = __float_as_int(u1);
      mx[i] = fmaxf(mx[i], fmaxf(u0, u1));
    }
  }
  float mref[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    /* qsc > 0, so the largest u gives the largest score (NaN: no move) */
    const float mn = fmaxf(st.m[i], mx[i] * st.qsc[i]);
    alpha[i] = mn == st.m[i] ? 1.0f : st.m[i] == -INFINITY ? 0.0f : ex2(st.m[i] - mn);
    st.m[i] = mn;
    mref[i] = mn == -INFINITY ? 0.0f : mn - FP8_LOG2_PSCALE;
  }
  /* P * PSCALE = exp2(u qsc - m + log2 PSCALE); the row sum unrounded */
  float ps[2] = {0.0f, 0.0f};
#pragma unroll
  for (int x = 0; x < 64; x++) {
    const int i = (x >> 1) & 1;
    const float p = ex2(fmaf(__int_as_float(sp[x]), st.qsc[i], -mref[i]));
    ps[i] += p;
    sp[x] = __float_as_int(p);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) st.l[i] = fmaf(st.l[i], alpha[i], ps[i]);
}

/* P * PSCALE in e4m3 as the A fragment: chunk kc of 32 keys, register r:
** row i = r & 1, the columns of j = 4kc + 2(r >> 1) and j + 1 (fp8_col_key
** puts key 4t + b there). */
__device__ __forceinline__ void pack_p(const int32_t *sp, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kc = 0; kc < 4; kc++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int x = 4 * (4 * kc + 2 * (r >> 1)) + 2 * (r & 1);
      pa[kc][r] = e4m3x2(__int_as_float(sp[x]), __int_as_float(sp[x + 1])) |
                  (e4m3x2(__int_as_float(sp[x + 4]), __int_as_float(sp[x + 5])) << 16);
    }
}

/* O = O alpha + ob (a block's P V, STA_FP8_FLUSH), or O *= alpha before
** the next P V goes into O itself. */
template <int D>
__device__ __forceinline__ void add_pv(Fp8Rows<D> &st, const float *ob, const float *alpha) {
#pragma unroll
  for (int x = 0; x < D / 2; x++) st.o[x] = fmaf(st.o[x], alpha[(x >> 1) & 1], ob[x]);
}
template <int D>
__device__ __forceinline__ void rescale_o(Fp8Rows<D> &st, const float *alpha) {
  /* once the maxima settle most blocks leave them: skip where no row of
  ** the warp moved (a warp-uniform branch) */
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int x = 0; x < D / 2; x++) st.o[x] *= alpha[(x >> 1) & 1];
}

/* The warpgroups' turns (STA_FP8_PINGPONG): warpgroup wg waits on named
** barrier 4 + wg before it issues, then lets the other one go (barrier
** 5 - wg); warpgroup 1 opens each item with an arrival on 4, so 0 goes
** first, and its last turn of an item arrives on nothing. */
__device__ __forceinline__ void fp8_turn(int wg) {
  if (STA_FP8_PINGPONG) bar_named(4 + wg, 256);
}
__device__ __forceinline__ void fp8_turn_done(int wg) {
  if (STA_FP8_PINGPONG) bar_arrive_named(5 - wg, 256);
}

/* A block's P V (pa: its P, alpha: its rescale of O), issued: STA_FP8_FLUSH
** into ob, fresh; else O rescaled, then P V into O itself.  Then, once
** waited for, added to O. */
template <int D>
__device__ __forceinline__ void pv_issue(Fp8Rows<D> &st, float *ob, uint32_t (*pa)[4],
                                         uint32_t dv, const float *alpha) {
  if constexpr (STA_FP8_FLUSH) {
    issue_pv<D>(ob, pa, dv, 1);
  } else {
    rescale_o<D>(st, alpha);
    issue_pv<D>(st.o, pa, dv, 0);
  }
}
template <int D>
__device__ __forceinline__ void pv_done(Fp8Rows<D> &st, float *ob, uint32_t (*pa)[4],
                                        const float *alpha) {
  if constexpr (STA_FP8_FLUSH) {
    sta_wgmma::pin<D / 2>(ob);
    add_pv<D>(st, ob, alpha);
  } else {
    sta_wgmma::pin<D / 2>(st.o);
  }
  sta_wgmma::pin_r<16>(&pa[0][0]);
}

/* What the consumers read of ring buffer b: the K and V descriptor words,
** the per-key info. */
struct Fp8Stage {
  uint32_t dk, dv;
  Fp8KeyInfo info;
};

/* One item's key blocks for this warpgroup (nb >= 1): the ring's blocks
** from g on (g advanced past them), st the running state; at(b): buffer
** b's Fp8Stage; full / empty: the ring's barriers (NB buffers).  Each
** buffer is released (empty) once this warpgroup's P V of it is done. */
template <int D, uint32_t HI, int NB, class At>
__device__ __forceinline__ void fp8_blocks(Fp8Rows<D> &st, uint32_t dq, int nb, int &g,
                                           uint64_t *full, uint64_t *empty, const At &at,
                                           int wg, int t) {
  int32_t sacc[64];
  uint32_t pa[4][4];
  float alpha[2];
  float ob[STA_FP8_FLUSH ? D / 2 : 1];
  int b = g % NB;
  mbar_wait(&full[b], (g / NB) & 1);
  fence_proxy_async();
  if (STA_FP8_PINGPONG && wg == 1) bar_arrive_named(4, 256); /* warpgroup 0 first */
  fp8_turn(wg);
  issue_s<D, HI>(sacc, dq, at(b).dk);
  fp8_turn_done(wg);
  sta_wgmma::wait<0>();
  sta_wgmma::pin_i<64>(sacc);
  fp8_softmax<D>(st, sacc, alpha, at(b).info, t);
  pack_p(sacc, pa);
  /* block n's S with block n - 1's P V (pa, alpha) */
  for (int n = 1; n < nb; n++) {
    const int bn = (g + 1) % NB;
    mbar_wait(&full[bn], ((g + 1) / NB) & 1);
    fence_proxy_async();
    float anext[2];
#if STA_FP8_OVERLAP
    fp8_turn(wg);
    issue_s<D, HI>(sacc, dq, at(bn).dk);
    pv_issue<D>(st, ob, pa, at(b).dv, alpha);
    fp8_turn_done(wg);
    sta_wgmma::wait<1>(); /* S(n) done, P V(n - 1) may still run */
    sta_wgmma::pin_i<64>(sacc);
    fp8_softmax<D>(st, sacc, anext, at(bn).info, t);
    sta_wgmma::wait<0>();
#else
    fp8_turn(wg);
    pv_issue<D>(st, ob, pa, at(b).dv, alpha);
    fp8_turn_done(wg);
    sta_wgmma::wait<0>();
#endif
    pv_done<D>(st, ob, pa, alpha);
    mbar_arrive(&empty[b]);
#if !STA_FP8_OVERLAP
    fp8_turn(wg);
    issue_s<D, HI>(sacc, dq, at(bn).dk);
    fp8_turn_done(wg);
    sta_wgmma::wait<0>();
    sta_wgmma::pin_i<64>(sacc);
    fp8_softmax<D>(st, sacc, anext, at(bn).info, t);
#endif
    alpha[0] = anext[0];
    alpha[1] = anext[1];
    pack_p(sacc, pa);
    b = bn;
    g++;
  }
  /* the last block's P V; warpgroup 1's last turn of the item lets no one go */
  fp8_turn(wg);
  pv_issue<D>(st, ob, pa, at(b).dv, alpha);
  if (wg == 0) fp8_turn_done(wg);
  sta_wgmma::wait<0>();
  pv_done<D>(st, ob, pa, alpha);
  mbar_arrive(&empty[b]);
  g++;
}

/* The output of this thread's two rows (rows[i]: quantized row, or -1
** where the row is not this item's): out = O / l * v_scale (l: the sum of
** P * STA_FP8_PSCALE) in the input dtype at the row's place in the
** caller's order and layout; lse = ln l - ln PSCALE + m ln 2 + scale *
** q_bias, its multiply-adds spelled out (left to the compiler, two kernels
** that inlined this differed in the last bit).  A padding row of the tiled order (an input row without a token)
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
    const float inv = pad ? 0.0f : 1.0f / st.l[i];
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
                          __fmaf_rn(st.m[i], 0.6931471805599453f,
                                    __fadd_rn(logf(st.l[i]), -FP8_LN_PSCALE)));
  }
}

} /* namespace sta */

#endif
