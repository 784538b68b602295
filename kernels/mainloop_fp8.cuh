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
** O is kept in shared memory (each thread's own slots, os_flush): a
** step's P V goes into a fresh wgmma accumulator that carries
** STA_FP8_FLUSH blocks (rescaled in registers when the maximum moves) and
** is then added to O in float32 (Hopper's fp8 accumulator keeps about 22
** bits: research/fp8_sim.py); S of the next step is issued with P V of
** this one, the softmax of the next under it; the consumer warpgroups
** take turns issuing their GEMMs (named barriers 4..), so one's softmax
** runs under the others' GEMMs; a step whose keys share one k_scale (the
** pre-pass's groups of 64 keys: producer_fp8.cuh's ku) takes
** fp8_softmax_u (k_scale, q_scale and the maximum in one multiply-add a
** score), any other the per-key path: the per-key info by ld.shared, the
** integer to float conversion folded into the k_scale multiply-add, the
** mask added only to blocks that have masked keys.
**
** Compile-time variants (the device A/B, scripts/device/gpu-check-fp8;
** the losers are deleted once measured: BENCHMARKS.md's ledger):
**   STA_FP8_FLUSH     N >= 1: the blocks a fresh accumulator carries (16;
**                     each halving measured slower: 4 3.7 % than 8, 8
**                     1.4 % than 16; 32 was 2.0 % faster than 16 at the
**                     same accuracy against float32 (rel L2 on randn at
**                     hunyuan-720p 3.848e-2 at 8, 3.849e-2 at 16, 3.850e-2
**                     at 32) but 4.9e-3 from the CPU's fp8 reference on
**                     test_fp8_forward_tiles' 12x16x24 case, past the
**                     test's 4e-3: 16 is the default)
**   STA_FP8_HALF      1 (the default; the CPU reference's STA_FP8_STEP):
**                     at D 128 each 128-key block as two halves of 64
**                     keys (S of a half: 32 registers, not 64; the online
**                     softmax per half), so that with STA_FP8_NWG 3
**                     (fp8_params.h, the default) three consumer
**                     warpgroups fit at 160 registers (kernels/README.md);
**                     0: whole blocks (with STA_FP8_NWG 2; tests then set
**                     the reference's step).  D 64 takes whole blocks
**                     either way (fp8_h)
*/
#ifndef STA_MAINLOOP_FP8_CUH
#define STA_MAINLOOP_FP8_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "fp8_params.h"
#include "mma.cuh"
#include "wgmma_fp8.cuh"

#ifndef STA_FP8_FLUSH
#define STA_FP8_FLUSH 16
#endif
static_assert(STA_FP8_FLUSH >= 1, "a fresh accumulator carries at least one block");
/* STA_FP8_P2 1 (a variant, prepared 2026-12-02, not yet timed): two P
** arrays taking turns (the step loop two steps an iteration), each step's
** P packed right after its softmax while the P V before it still reads
** the other: at D 64 ptxas had spilled 7 of P's floats across the wait
** every step (ptxas: D 64 180 -> 120 bytes of spill; static STL 46 -> 29
** for twice the loop code) */
#ifndef STA_FP8_P2
#define STA_FP8_P2 0
#endif
#ifndef STA_FP8_HALF /* the reference's step (core/fp8_internal.h): 64, the halves */
#define STA_FP8_HALF (STA_FP8_STEP == 64)
#endif

namespace sta {

constexpr float FP8_LOG2_PSCALE = 8.807354922057604f;  /* log2(STA_FP8_PSCALE) */
constexpr float FP8_LN_PSCALE = 6.104793232414985f;    /* ln(STA_FP8_PSCALE) */
static_assert(STA_FP8_PSCALE == 448.0f, "the constants above are of 448");

/* sta_fp8_source (core/fp8_internal.h) in 32-bit arithmetic (rows < 2^30:
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

/* acc = P V (fresh) or acc += P V over NKC chunks of 32 keys from chunk
** c0 of the V block dv (4 from 0: a block; 2 from 2h: its half h),
** issued and committed, not waited for; pa: P's A fragments. */
template <int D, int NKC = 4>
__device__ __forceinline__ void issue_pv(float *acc, uint32_t (*pa)[4], uint32_t dv, int c0,
                                         int fresh) {
  sta_wgmma::fence();
#pragma unroll
  for (int kc = 0; kc < NKC; kc++) {
    const uint64_t b = sdesc_of(dv + (uint32_t)(((c0 + kc) * 32) >> 4));
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

/* A block's per-key info: k_scale (it arrives by a bulk copy) and the
** mask (0, or -inf where no key), two float arrays; masked: whether the
** block has a key to mask (else the mask is all 0: the softmax skips it).
** INFO 1: shared-memory addresses (ld.shared); 0: generic pointers. */
struct Fp8KeyInfo {
  uint32_t ks, bias;
  int masked;
  uint32_t ku; /* the step's ku (half h: + 4 h): its keys' one k_scale, or -1 */
};
__device__ __forceinline__ float lds_f1(uint32_t a) {
  float v;
  asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(a));
  return v;
}
__device__ __forceinline__ float2 lds_f2(uint32_t a) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ float4 lds_f4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ void sts_f4(uint32_t a, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w) : "memory");
}

/* 1.5 * 2^23 as float and as its bits: for |x| < 2^22 the float with the
** bits x + FP8_MAGIC_BITS is exactly FP8_MAGIC + x */
constexpr float FP8_MAGIC = 12582912.0f;
constexpr int32_t FP8_MAGIC_BITS = 0x4B400000;

/* Row i's running maximum moved to cand (the step's largest score; NaN:
** no move): alpha[i] = 2^(old - new), and the P reference m - log2
** PSCALE (0 while no key has come) returned. */
template <int D>
__device__ __forceinline__ float move_max(Fp8Rows<D> &st, int i, float cand, float *alpha) {
  const float mn = fmaxf(st.m[i], cand);
  alpha[i] = mn == st.m[i] ? 1.0f : st.m[i] == -INFINITY ? 0.0f : ex2(st.m[i] - mn);
  st.m[i] = mn;
  return mn == -INFINITY ? 0.0f : mn - FP8_LOG2_PSCALE;
}

/* fp8_softmax of a step whose keys share one k_scale a half (ku[h] of
** half h, finite, >= 0: fp8_helpers' ku; NJ / 8 halves: 1 for a
** STA_FP8_HALF step, 2 for a whole block): the maximum on the integer
** accumulators, then per score one integer add, one multiply-add (c = ku
** q_scale scale log2 e, e = MAGIC c + m - log2 PSCALE: k_scale, q_scale and
** the maximum folded), the ex2 and the sum -- fp8_softmax's 6.5
** instructions a score less the k_scale's multiply-add and its per-column
** loads; the same scores up to the rounding of c and e (a few units in
** the last place of the exponent). */
template <int D, int NJ>
__device__ __forceinline__ void fp8_softmax_u(Fp8Rows<D> &st, int32_t *sp, float *alpha,
                                              const float *ku) {
  constexpr int NH = NJ / 8;
  /* in place first (the raw and the biased never both live): sp = the bits
  ** of MAGIC + acc, a positive float, so the integer maximum of the bits is
  ** the float's */
#pragma unroll
  for (int x = 0; x < 4 * NJ; x++) sp[x] += FP8_MAGIC_BITS;
  int m4[NH][2][4]; /* four chains per row and half */
#pragma unroll
  for (int h = 0; h < NH; h++)
#pragma unroll
    for (int j = 8 * h; j < 8 * h + 8; j++)
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int v = max(sp[4 * j + 2 * i], sp[4 * j + 2 * i + 1]);
        m4[h][i][j & 3] = j < 8 * h + 4 ? v : max(m4[h][i][j & 3], v);
      }
  float c[NH][2], e[NH][2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    float mx = -INFINITY; /* the largest acc of each half, exactly, times its c */
#pragma unroll
    for (int h = 0; h < NH; h++) {
      c[h][i] = ku[h] * st.qsc[i];
      const int mi = max(max(m4[h][i][0], m4[h][i][1]), max(m4[h][i][2], m4[h][i][3]));
      mx = fmaxf(mx, (__int_as_float(mi) - FP8_MAGIC) * c[h][i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float mref = move_max(st, i, mx, alpha); /* NaN (a NaN q_scale): no move */
#pragma unroll
    for (int h = 0; h < NH; h++) e[h][i] = fmaf(FP8_MAGIC, c[h][i], mref);
  }
  float ps[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* two chains per row */
#pragma unroll
  for (int x = 0; x < 4 * NJ; x++) {
    const int i = (x >> 1) & 1, h = x >> 5;
    const float p = ex2(fmaf(__int_as_float(sp[x]), c[h][i], -e[h][i]));
    ps[i][(x >> 2) & 1] += p;
    sp[x] = __float_as_int(p);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) st.l[i] = fmaf(st.l[i], alpha[i], ps[i][0] + ps[i][1]);
}

/* Whether a step's keys share one k_scale a half (u, the same in every
** thread) and those k_scales (ku: fp8_helpers' words, -1 where not):
** taken on a vote, which the compiler knows to be warp-uniform (no
** divergent branch: 1.9 % faster). */
struct Fp8Uni {
  float ku[2];
  bool u;
};
template <int NJ> __device__ __forceinline__ Fp8Uni fp8_uni(const Fp8KeyInfo &info) {
  Fp8Uni r;
#pragma unroll
  for (int h = 0; h < NJ / 8; h++) r.ku[h] = lds_f1(info.ku + 4 * h);
  r.u = __all_sync(0xffffffffu, r.ku[0] >= 0.0f && r.ku[NJ / 8 - 1] >= 0.0f);
  return r;
}

/* The softmax of one block's S (sp, waited for), in place: the s32
** accumulators become the float bits of P * STA_FP8_PSCALE =
** exp2(score - m + log2 STA_FP8_PSCALE) (one array for both: the wgmma's
** "+r" operands keep it live throughout); the running max st.m, alpha =
** 2^(old m - new m), the row sums st.l; info: (k_scale,
** 0) or (0, -inf) per S column; NJ: S's columns / 8 (16: a block of 128
** keys; 8: a half, STA_FP8_HALF).  Per score: the integer to float (2), its
** k_scale and mask (1), the max (1), q_scale and m (1), ex2, the sum (1). */
template <int D, int NJ = 16>
__device__ __forceinline__ void fp8_softmax(Fp8Rows<D> &st, int32_t *sp, float *alpha,
                                            const Fp8KeyInfo &info, int t, const Fp8Uni &uni) {
  if (uni.u) {
    fp8_softmax_u<D, NJ>(st, sp, alpha, uni.ku);
    return;
  }
  /* u = acc * k_scale (the score over q_scale * scale * log2 e), -inf
  ** where info masks the key */
  float mx[2] = {-INFINITY, -INFINITY};
  /* u = (MAGIC + acc) k_scale - MAGIC k_scale: one IADD and one FFMA per
  ** score, the product MAGIC k_scale once per column (it differs from
  ** acc * k_scale by at most k_scale, a unit of acc); then + the mask
  ** where the block has masked keys */
#pragma unroll
  for (int j = 0; j < NJ; j++) {
    const float2 k = lds_f2(info.ks + 8 * (4 * j + t)); /* columns 8j + 2t, 8j + 2t + 1 */
    const float c0 = -FP8_MAGIC * k.x, c1 = -FP8_MAGIC * k.y;
#pragma unroll
    for (int i = 0; i < 2; i++) {
      const int x = 4 * j + 2 * i;
      sp[x] = __float_as_int(fmaf(__int_as_float(sp[x] + FP8_MAGIC_BITS), k.x, c0));
      sp[x + 1] = __float_as_int(fmaf(__int_as_float(sp[x + 1] + FP8_MAGIC_BITS), k.y, c1));
    }
  }
  if (__any_sync(0xffffffffu, info.masked)) { /* the same in every thread: a uniform branch */
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      const float2 b = lds_f2(info.bias + 8 * (4 * j + t));
#pragma unroll
      for (int i = 0; i < 2; i++) {
        const int x = 4 * j + 2 * i;
        sp[x] = __float_as_int(__int_as_float(sp[x]) + b.x);
        sp[x + 1] = __float_as_int(__int_as_float(sp[x + 1]) + b.y);
      }
    }
  }
  { /* four chains per row (fmaxf drops NaN whatever the order) */
    float m4[2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
      for (int c = 0; c < 4; c++)
        m4[i][c] = fmaxf(__int_as_float(sp[4 * c + 2 * i]), __int_as_float(sp[4 * c + 2 * i + 1]));
#pragma unroll
    for (int j = 4; j < NJ; j++)
#pragma unroll
      for (int i = 0; i < 2; i++)
        m4[i][j & 3] = fmaxf(m4[i][j & 3], fmaxf(__int_as_float(sp[4 * j + 2 * i]),
                                                 __int_as_float(sp[4 * j + 2 * i + 1])));
#pragma unroll
    for (int i = 0; i < 2; i++) mx[i] = fmaxf(fmaxf(m4[i][0], m4[i][1]), fmaxf(m4[i][2], m4[i][3]));
  }
  float mref[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    /* qsc > 0, so the largest u gives the largest score (NaN: no move) */
    mref[i] = move_max(st, i, mx[i] * st.qsc[i], alpha);
  }
  /* P * PSCALE = exp2(u qsc - m + log2 PSCALE); the row sum unrounded */
  float ps[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; /* two chains per row */
#pragma unroll
  for (int x = 0; x < 4 * NJ; x++) {
    const int i = (x >> 1) & 1;
    const float p = ex2(fmaf(__int_as_float(sp[x]), st.qsc[i], -mref[i]));
    ps[i][(x >> 2) & 1] += p;
    sp[x] = __float_as_int(p);
  }
#pragma unroll
  for (int i = 0; i < 2; i++) st.l[i] = fmaf(st.l[i], alpha[i], ps[i][0] + ps[i][1]);
}

/* P * PSCALE in e4m3 as the A fragment: chunk kc of 32 keys, register r:
** row i = r & 1, the columns of j = 4kc + 2(r >> 1) and j + 1 (fp8_col_key
** puts key 4t + b there). */
template <int NKC = 4> /* chunks of 32 keys */
__device__ __forceinline__ void pack_p(const int32_t *sp, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kc = 0; kc < NKC; kc++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int x = 4 * (4 * kc + 2 * (r >> 1)) + 2 * (r & 1);
      pa[kc][r] = e4m3x2(__int_as_float(sp[x]), __int_as_float(sp[x + 1])) |
                  (e4m3x2(__int_as_float(sp[x + 4]), __int_as_float(sp[x + 5])) << 16);
    }
}

/* The warpgroups' turns: warpgroup wg waits on named barrier 4 + wg
** before it issues, then lets the next one go (two: barrier 5 - wg; three:
** 0 -> 1 -> 2 -> 0 on barriers 4..6); the last warpgroup opens each item
** with an arrival on 4, so 0 goes first, and its last turn of an item
** arrives on nothing. */
__device__ __forceinline__ void fp8_turn(int wg) { bar_named(4 + wg, 256); }
__device__ __forceinline__ void fp8_turn_done(int wg) {
  bar_arrive_named(FP8_NWG == 2 ? 5 - wg : 4 + (wg + 1) % FP8_NWG, 256);
}

/* What the consumers read of ring buffer b: the K and V descriptor words,
** the per-key info. */
struct Fp8Stage {
  uint32_t dk, dv;
  Fp8KeyInfo info;
};

/* The steps a block of head dim D takes: at D 128 2 (STA_FP8_HALF,
** halves of 64 keys) or 1; at D 64 1, whole blocks (S's 64 registers, P's
** 16 and a D 64 accumulator's 32 fit three warpgroups' 160: half the
** steps' fixed cost a score, where D 64's softmax is most of the kernel's
** time; 9 % faster than halves, BENCHMARKS.md's ledger). */
template <int D> constexpr int fp8_h() { return STA_FP8_HALF && D == 128 ? 2 : 1; }
static_assert(STA_FP8_NWG == 2 || fp8_h<128>() == 2,
              "three consumer warpgroups need STA_FP8_HALF's registers at D 128");

/* Whether any row of the warp moved its maximum (alpha != 1): the same in
** every thread, so rescale_acc's branch is warp-uniform. */
__device__ __forceinline__ bool rescale_vote(const float *alpha) {
  return __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
}
/* acc *= alpha (rows), skipped where no row of the warp moved (moved:
** rescale_vote's): the fresh P V accumulator between its blocks. */
template <int D>
__device__ __forceinline__ void rescale_acc(float *acc, const float *alpha, bool moved) {
  if (!moved) return;
#pragma unroll
  for (int x = 0; x < D / 2; x++) acc[x] *= alpha[(x >> 1) & 1];
}

/* O in shared memory: this thread's D / 2 floats, float4 k
** (registers 4k..4k+3: row 0, row 0, row 1, row 1) at os + 16 FP8_CT k
** (4096 k), os = the region + 16 tid: a warp's 32 float4 are 512
** contiguous bytes.  O
** is kept at the maximum mo (per row), the accumulator ob at mob >= mo:
** O = O 2^(mo - mob) + ob (first: O = ob).  out: the registers it goes to
** (NULL: back to shared memory). */
template <int D>
__device__ __forceinline__ void os_flush(uint32_t os, const float *ob, const float *mo,
                                         const float *mob, bool first, float *out) {
  if (first && !out) { /* O = ob: straight from the accumulator registers */
#pragma unroll
    for (int k = 0; k < D / 8; k++)
      sts_f4(os + 16 * FP8_CT * k, make_float4(ob[4 * k], ob[4 * k + 1], ob[4 * k + 2], ob[4 * k + 3]));
    return;
  }
  if (first) { /* out: O = ob */
#pragma unroll
    for (int x = 0; x < D / 2; x++) out[x] = ob[x];
    return;
  }
  float f[2];
#pragma unroll
  for (int i = 0; i < 2; i++) f[i] = mo[i] == mob[i] ? 1.0f : ex2(mo[i] - mob[i]);
#pragma unroll
  for (int k = 0; k < D / 8; k++) {
    const float4 o = lds_f4(os + 16 * FP8_CT * k);
    const float4 v = make_float4(fmaf(o.x, f[0], ob[4 * k]), fmaf(o.y, f[0], ob[4 * k + 1]),
                                 fmaf(o.z, f[1], ob[4 * k + 2]), fmaf(o.w, f[1], ob[4 * k + 3]));
    if (out) {
      out[4 * k] = v.x; out[4 * k + 1] = v.y; out[4 * k + 2] = v.z; out[4 * k + 3] = v.w;
    } else {
      sts_f4(os + 16 * FP8_CT * k, v);
    }
  }
}

/* S of keys 64h..64h+63 of a block (dk: the block's K descriptor word),
** issued and committed, not waited for. */
template <int D, uint32_t HI>
__device__ __forceinline__ void issue_s_half(int32_t *sacc, uint32_t dq, uint32_t dk, int h) {
  const uint32_t dkh = dk + (uint32_t)((64 * D * h) >> 4); /* 64 rows of D bytes */
  sta_wgmma::fence();
#pragma unroll
  for (int ks = 0; ks < D / 32; ks++)
    sta_wgmma::ss_n64_s8(sacc, ((uint64_t)HI << 32) | (dq + ks * 2),
                         ((uint64_t)HI << 32) | (dkh + ks * 2), ks > 0);
  sta_wgmma::commit();
}

/* Half h's per-key info: columns 64h on. */
__device__ __forceinline__ Fp8KeyInfo info_half(const Fp8KeyInfo &x, int h) {
  return Fp8KeyInfo{x.ks + 256u * h, x.bias + 256u * h, x.masked, x.ku + 4u * h};
}

/* One step of H a block (STA_FP8_HALF: H 2, the halves; else 1, the
** block): its S issued, its P V issued, its per-key info. */
template <int D, uint32_t HI, int H>
__device__ __forceinline__ void issue_s_step(int32_t *sacc, uint32_t dq, uint32_t dk, int h) {
  if constexpr (H == 1) issue_s<D, HI>(sacc, dq, dk);
  else issue_s_half<D, HI>(sacc, dq, dk, h);
}
template <int D, int H>
__device__ __forceinline__ void issue_pv_step(float *acc, uint32_t (*pa)[4], uint32_t dv, int h,
                                              int fresh) {
  issue_pv<D, 4 / H>(acc, pa, dv, (4 / H) * h, fresh);
}
template <int H> __device__ __forceinline__ Fp8KeyInfo info_step(const Fp8KeyInfo &x, int h) {
  if constexpr (H == 1) return x;
  else return info_half(x, h);
}

/* One item's key blocks for this warpgroup (nb >= 1): the ring's blocks
** from g on (g advanced past them), st the running state; at(b): buffer
** b's Fp8Stage; full / empty: the ring's barriers (NB buffers).  In H
** steps a block (STA_FP8_HALF: H 2, halves of 64 keys, the
** online softmax per half; else 1): P V(q - 1) into the fresh accumulator
** ob (fresh every STA_FP8_FLUSH blocks, else ob rescaled by the step's
** alpha first), issued with S(q); block b's buffer released once the P V
** of its last step is done; after each STA_FP8_FLUSH blocks ob goes to O
** (os_flush), after the last into st.o.  os: this thread's O slots. */
template <int D, uint32_t HI, int NB, int H, class At>
__device__ __forceinline__ void fp8_blocks(Fp8Rows<D> &st, uint32_t dq, int nb, int &g,
                                           uint64_t *full, uint64_t *empty, const At &at,
                                           int wg, int t, uint32_t os) {
  static_assert(H == 1 || H == 2, "a block whole or in halves");
  constexpr int N = H * STA_FP8_FLUSH; /* steps a flush */
  int32_t sacc[64 / H];
  uint32_t pa[4 / H][4];
  float alpha[2], ob[D / 2], mo[2] = {-INFINITY, -INFINITY}, mob[2];
  bool first = true; /* nothing in O yet */
  /* g >= 0: unsigned, so that % and / by NB (2 at D 128) are masks and shifts */
  int b = (int)((unsigned)g % NB), grp = 0; /* steps in ob */
  /* no proxy fence after a block's full barrier: TMA's writes are the
  ** async proxy's, as wgmma's reads; fp8_helpers fence their own cp.async
  ** writes before they arrive (the writer's fence; a fence here too was
  ** 1 % slower, BENCHMARKS.md's ledger) */
  mbar_wait(&full[b], ((unsigned)g / NB) & 1);
  if (wg == FP8_NWG - 1) bar_arrive_named(4, 256); /* warpgroup 0 first */
  fp8_turn(wg);
  issue_s_step<D, HI, H>(sacc, dq, at(b).dk, 0);
  fp8_turn_done(wg);
  /* the step's uniform-k_scale test before the wait for S, not after it
  ** (ncu: 4 % of the consumers' stall samples were on its load's
  ** latency); the vote on the accumulator's rescale at the end of the
  ** softmax (3 %: its dependent chain came right after the turn) */
  Fp8Uni uni = fp8_uni<16 / H>(info_step<H>(at(b).info, 0));
  sta_wgmma::wait<0>();
  sta_wgmma::pin_i<64 / H>(sacc);
  fp8_softmax<D, 16 / H>(st, sacc, alpha, info_step<H>(at(b).info, 0), t, uni);
  bool moved = rescale_vote(alpha);
  pack_p<4 / H>(sacc, pa);
  /* step q's S with step q - 1's P V (pa, alpha; block b, step hp) */
  int hp = 0;
#if STA_FP8_P2
  /* two P arrays taking turns (pin read by step q's P V, pout written by
  ** its pack, right after the softmax) */
  uint32_t pb[4 / H][4];
  const auto step = [&](uint32_t(*pin)[4], uint32_t(*pout)[4], int q) {
    const int h = q % H;
    const int bn = h ? b : (int)((unsigned)(g + 1) % NB);
    if (!h) {
      mbar_wait(&full[bn], ((unsigned)(g + 1) / NB) & 1);
    }
    float anext[2];
    fp8_turn(wg);
    issue_s_step<D, HI, H>(sacc, dq, at(bn).dk, h);
    if (grp > 0) rescale_acc<D>(ob, alpha, moved);
    issue_pv_step<D, H>(ob, pin, at(b).dv, hp, grp == 0);
    fp8_turn_done(wg);
    mob[0] = st.m[0];
    mob[1] = st.m[1];
    uni = fp8_uni<16 / H>(info_step<H>(at(bn).info, h));
    sta_wgmma::wait<1>(); /* S(q) done, P V(q - 1) may still run */
    sta_wgmma::pin_i<64 / H>(sacc);
    fp8_softmax<D, 16 / H>(st, sacc, anext, info_step<H>(at(bn).info, h), t, uni);
    moved = rescale_vote(anext);
    pack_p<4 / H>(sacc, pout); /* while P V(q - 1) still reads pin */
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(ob);
    sta_wgmma::pin_r<16 / H>(&pin[0][0]);
    if (!h) { /* the P V of block b's last step is done */
      mbar_arrive(&empty[b]);
      g++;
    }
    if (++grp == N) {
      os_flush<D>(os, ob, mo, mob, first, nullptr);
      first = false;
      mo[0] = mob[0];
      mo[1] = mob[1];
      grp = 0;
    }
    alpha[0] = anext[0];
    alpha[1] = anext[1];
    b = bn;
    hp = h;
  };
  const auto last = [&](uint32_t(*pin)[4]) {
    fp8_turn(wg);
    if (grp > 0) rescale_acc<D>(ob, alpha, moved);
    issue_pv_step<D, H>(ob, pin, at(b).dv, hp, grp == 0);
    if (FP8_NWG == 2 ? wg == 0 : wg != FP8_NWG - 1) fp8_turn_done(wg);
    mob[0] = st.m[0];
    mob[1] = st.m[1];
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(ob);
    sta_wgmma::pin_r<16 / H>(&pin[0][0]);
    mbar_arrive(&empty[b]);
    g++;
    os_flush<D>(os, ob, mo, mob, first, st.o);
  };
  int q = 1;
  for (; q + 1 < H * nb; q += 2) {
    step(pa, pb, q);
    step(pb, pa, q + 1);
  }
  if (q < H * nb) {
    step(pa, pb, q);
    last(pb);
  } else {
    last(pa);
  }
#else
  for (int q = 1; q < H * nb; q++) {
    const int h = q % H;
    const int bn = h ? b : (int)((unsigned)(g + 1) % NB);
    if (!h) {
      mbar_wait(&full[bn], ((unsigned)(g + 1) / NB) & 1);
    }
    float anext[2];
    fp8_turn(wg);
    issue_s_step<D, HI, H>(sacc, dq, at(bn).dk, h);
    if (grp > 0) rescale_acc<D>(ob, alpha, moved);
    issue_pv_step<D, H>(ob, pa, at(b).dv, hp, grp == 0);
    fp8_turn_done(wg);
    mob[0] = st.m[0];
    mob[1] = st.m[1];
    uni = fp8_uni<16 / H>(info_step<H>(at(bn).info, h));
    sta_wgmma::wait<1>(); /* S(q) done, P V(q - 1) may still run */
    sta_wgmma::pin_i<64 / H>(sacc);
    fp8_softmax<D, 16 / H>(st, sacc, anext, info_step<H>(at(bn).info, h), t, uni);
    moved = rescale_vote(anext);
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(ob);
    sta_wgmma::pin_r<16 / H>(&pa[0][0]);
    if (!h) { /* the P V of block b's last step is done */
      mbar_arrive(&empty[b]);
      g++;
    }
    if (++grp == N) {
      os_flush<D>(os, ob, mo, mob, first, nullptr);
      first = false;
      mo[0] = mob[0];
      mo[1] = mob[1];
      grp = 0;
    }
    alpha[0] = anext[0];
    alpha[1] = anext[1];
    pack_p<4 / H>(sacc, pa);
    b = bn;
    hp = h;
  }
  /* the last step's P V; the last warpgroup's last turn of the item lets
  ** no one go (it opens the next item instead) */
  fp8_turn(wg);
  if (grp > 0) rescale_acc<D>(ob, alpha, moved);
  issue_pv_step<D, H>(ob, pa, at(b).dv, hp, grp == 0);
  if (FP8_NWG == 2 ? wg == 0 : wg != FP8_NWG - 1) fp8_turn_done(wg);
  mob[0] = st.m[0];
  mob[1] = st.m[1];
  sta_wgmma::wait<0>();
  sta_wgmma::pin<D / 2>(ob);
  sta_wgmma::pin_r<16 / H>(&pa[0][0]);
  mbar_arrive(&empty[b]);
  g++;
  os_flush<D>(os, ob, mo, mob, first, st.o);
#endif
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
