/*
** fp8_internal.h -- the fp8 forward (sta.h, sta_precision): the quantizer's
** rules (host and device), the operands its pre-pass writes, the CPU's
** pre-pass and forward, the CUDA pre-pass.  Part of internal.h (which
** includes it); not installed.
*/
#ifndef STA_FP8_INTERNAL_H
#define STA_FP8_INTERNAL_H

#ifndef STA_INTERNAL_H
#error "include internal.h: it includes this header after what this one needs"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the fp8 forward's operands ------------------------------------------ */

/* int8 code of f: round to nearest even, saturated to +-127, NaN to 0
** (on the device one cvt.rni.sat.s8, which saturates to -128..127 and
** takes NaN to 0, and a max: the same codes; the pre-pass 8 % faster than
** with the host's arithmetic). */
STA_HD int8_t sta_f32_to_i8(float f) {
#ifdef __CUDA_ARCH__
  int r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(f));
  return (int8_t)(r > -127 ? r : -127);
#else
  if (!(f == f)) return 0;
  if (f >= 127.0f) return 127;
  if (f <= -127.0f) return -127;
  return (int8_t)sta_fadd(sta_fadd(f, 12582912.0f), -12582912.0f); /* nearest even */
#endif
}
/* max(m, |x|), NaN once either is NaN: the quantizer's amax of a row on
** the host and the device (order-free, so a warp may reduce it in any
** order): a non-finite element makes its own row's scale NaN or Inf. */
STA_HD float sta_amax_nan(float m, float x) {
  float a = fabsf(x);
  return a > m || a != a ? a : m;
}
/* max(m, |x|) over the finite x only: the per-channel amax (q, v) and the
** keys' max / min, which every row of a head shares, so that a NaN or Inf
** element moves no other row (order-free as sta_amax_nan). */
STA_HD float sta_amax_finite(float m, float x) {
  float a = fabsf(x);
  return a > m && a < INFINITY ? a : m;
}
/* x where finite, else 0: the keys' channel sums (k_mean). */
STA_HD float sta_finite_or0(float x) { return fabsf(x) < INFINITY ? x : 0.0f; }
/* 2^e, |e| <= 63, as a float: x * sta_pow2f(e) is exact. */
STA_HD float sta_pow2f(int e) {
  uint32_t u = (uint32_t)(e + 127) << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* qmax / amax, 0 when amax is not > 0 (NaN included). */
STA_HD float sta_fp8_inv(float qmax, float amax) { return amax > 0.0f ? qmax / amax : 0.0f; }
/* The e4m3 code of v (V's element, inv = 448 / the channel's amax): the
** NaN code for a non-finite v (e4m3 has no Inf; saturating would hide it). */
STA_HD uint8_t sta_fp8_vcode(float v, float inv) {
  return fabsf(v) < INFINITY ? sta_f32_to_e4m3(sta_fmul(v, inv)) : (uint8_t)0x7f;
}
/* The channel exponent of sta_fp8_ops.eq from the channel's amax of q
** (qam) and of the smoothed k (kam). */
STA_HD int sta_fp8_exponent(float qam, float kam) {
  if (!(qam > 0.0f && kam > 0.0f)) return 0;
  float ratio = kam / qam;
  if (!(ratio > 0.0f && ratio < INFINITY)) return 0;
  int ex;
  (void)frexpf(ratio, &ex);
  ex /= 2;
  return ex > 63 ? 63 : ex < -63 ? -63 : ex;
}

/* The fp8 forward's operands, as its quantize pre-pass writes them (the
** scheme: sta.h, sta_precision; research/fp8_sim.py).  Rows in FastVideo's
** tiled order, partial tiles padded (the kernel loads every block by TMA
** as rows), text after: `rows` = NT*NH*NW*tile volume + the input's text
** rows.  Per (batch, head), in this order:
**   k_mean[D]   the mean of k over the keys (video tokens, valid text):
**               sums in double over the rows' chunks of STA_FP8_CHUNK in
**               row order, chunk sums in order, / count, to float; a
**               non-finite element adds 0 (any offset leaves the softmax
**               as it is: one bad key moves no other row)
**   eq[D]       channel exponents e: q * 2^e, k * 2^-e (q . k unchanged):
**               the frexp exponent of f32(amax k' / amax q) halved toward
**               zero (amax over the finite elements: k' from the keys'
**               finite max and min less k_mean, q over every query row),
**               |e| <= 63; 0 where either amax is 0 or the ratio not finite
**   q8, k8 [rows][D]  int8: x' = q * 2^e (or k' * 2^-e, k' = f32(k -
**               k_mean)); a row's amax a (NaN if any is NaN:
**               sta_amax_nan); the amax it is coded with: q's a; a key's
**               sta_fp8_key_amax(a, its group's amax), the group the
**               STA_FP8_KGROUP rows [64 G, 64 G + 64) of the quantized order
**               (sta_fp8_kslot permutes within 16, so the same rows in k8),
**               the group's amax the largest finite a of its keys (0 for
**               none); inv = 127 / amax (0 when amax is 0 or NaN), code =
**               rint(f32(x' * inv)), scale = amax / 127 (a row with a NaN
**               or Inf keeps its own NaN or Inf scale: only the rows that
**               see it come out NaN); k8's (and k_scale's) row of key r is
**               sta_fp8_kslot(r, rows).  One k_scale for 64 keys lets the
**               kernel fold it into the softmax's one multiply-add
**               (kernels/mainloop_fp8.cuh)
**   q_scale, k_scale [rows]; q_bias[rows] = q . k_mean (double, channel
**               order, to float): lse = ln(l) + m ln 2 + scale * q_bias
**   v_scale[D]  the finite amax of v over the keys / 448
**   v8 [D][rows]  e4m3 of y = f32(v * (448 / amax)) (inv 0 when amax is
**               0), transposed (K-major for wgmma's 8-bit B); a non-finite
**               v the NaN code 0x7f (sta_fp8_vcode)
** Padding rows are all 0 (codes, scales, bias); rows that are never keys
** (text past text_len) have k8 = v8 = 0 and k_scale 0.
** The attention over them (cpu_fp8.c, kernels/mainloop_fp8.cuh): s = (q8 .
** k8) q_scale k_scale * scale log2(e), key blocks of STA_FP8_BK rows in the
** kernel's walk, each block taken in steps of sta_fp8_step(D) keys (its
** two halves at D 128, whole at D 64); m the running maximum after the
** key's step; P = exp2(s -
** m), its row sum l; P8 = e4m3(P * STA_FP8_PSCALE); out = (sum P8 V8) /
** (STA_FP8_PSCALE l) * v_scale, every block's sums rescaled by 2^(its m -
** the next m) as the maximum moves. */
#define STA_FP8_PSCALE 448.0f
#define STA_FP8_BK 128
/* keys a step of the online softmax (the running maximum moves once a
** step) at D 128: the halves of a block, as the CUDA kernel walks them
** (kernels/mainloop_fp8.cuh, STA_FP8_HALF); at D 64 the kernel takes
** whole blocks (fp8_h: its three warpgroups have the registers), so the
** scheme does: sta_fp8_step */
#define STA_FP8_STEP 64
/* the scheme's keys a step at head dim head_dim */
STA_HD int32_t sta_fp8_step(int64_t head_dim) { return head_dim == 64 ? STA_FP8_BK : STA_FP8_STEP; }
#define STA_FP8_CHUNK 1024
/* rows of a group of keys that share their amax (k_scale) */
#define STA_FP8_KGROUP 64
/* The amax key row r is coded with: its group's (the largest finite row
** amax of the group's keys) where its own amax a is finite, else a (NaN
** or Inf: the key's own scale, so that no other key's scores move). */
STA_HD float sta_fp8_key_amax(float a, float group) { return fabsf(a) < INFINITY ? group : a; }
/* A group's amax (start 0) with one more row amax a taken in: the
** largest finite a of the group's keys; a row that is no key has a = -1
** (the pre-passes' mark) and a NaN row is skipped, so neither moves it.
** The CPU quantizer and both GPU pre-passes take the group's amax by this
** one function. */
STA_HD float sta_fp8_group_amax(float group, float a) {
  return a >= 0.0f ? sta_amax_finite(group, a) : group;
}
typedef struct sta_fp8_geom {
  int32_t canvas[3], tile[3], grid[3];
  int32_t tiled;          /* the input's rows are in the tiled order */
  int64_t video_len;      /* V */
  int64_t video_rows;     /* the input's video rows */
  int64_t tiled_video;    /* NT*NH*NW*tile volume */
  int64_t rows;           /* tiled_video + the input's text rows */
  int64_t keys_end;       /* tiled_video + text_len: rows past it are no keys */
} sta_fp8_geom;
typedef struct sta_fp8_ops {
  int64_t batch, heads, rows, head_dim;
  int8_t *q8, *k8;        /* [B][H][rows][D]; k8 and k_scale rows in sta_fp8_kslot's order */
  uint8_t *v8;            /* [B][H][D][rows] */
  float *q_scale, *k_scale, *q_bias; /* [B][H][rows] */
  float *k_mean, *v_scale; /* [B][H][D] */
  int8_t *eq;             /* [B][H][D] */
} sta_fp8_ops;

/* Input row of quantized row r, or -1 for a padding row. */
STA_HD int64_t sta_fp8_source(const sta_fp8_geom *g, int64_t r) {
  if (r >= g->tiled_video) return r - g->tiled_video + g->video_rows;
  if (g->tiled) return sta_tiled_token(g->canvas, g->tile, g->grid, r) < 0 ? -1 : r;
  return sta_tiled_token(g->canvas, g->tile, g->grid, r);
}
/* The kernel's key order (kernels/producer_fp8.cuh): in each 16 keys of a
** block, S accumulator column c holds key sta_fp8_col_key(c), the k order
** of the thread's 8-bit A fragment of P.  The pre-pass stores k8 and
** k_scale so (TMA copies blocks that start on a 16-row boundary as they
** are): key r at row sta_fp8_kslot(r, rows), the inverse permutation
** within each whole 16 rows, the last partial 16 in order. */
STA_HD int sta_fp8_col_key(int c) {
  const int cc = c & 15;
  return (c & ~15) + 4 * ((cc >> 1) & 3) + 2 * (cc >> 3) + (cc & 1);
}
/* m / 127 (m >= 0, or NaN; a code's scale): for finite m by a product
** and two fmas, which give the division's bits for every finite m >= 0
** (spec/test_fp8.c checks all 2^31 of them), Inf and NaN by the division
** (fp8_prepass.cu takes it: cheaper than the division's sequence). */
STA_HD float sta_fp8_scale127(float m) {
  if (!(m < INFINITY)) return m / 127.0f;
  const float c = 1.0f / 127.0f, q = sta_fmul(m, c);
  return sta_ffma(sta_ffma(-q, 127.0f, m), c, q);
}

/* the slot within its whole 16 rows of key k (0..15) of them, in k's own
** integer type (a macro: the pre-pass takes it in 32 bits) */
#define STA_FP8_KSLOT16(k) (8 * (((k) >> 1) & 1) + 4 * ((k) >> 3) + 2 * (((k) >> 2) & 1) + ((k) & 1))
STA_HD int64_t sta_fp8_kslot(int64_t r, int64_t rows) {
  const int64_t k = r & 15;
  if (r >= (rows & ~(int64_t)15)) return r;
  return (r & ~(int64_t)15) + STA_FP8_KSLOT16(k);
}

/* The fp8 geometry of resolved params. */
void sta_fp8_geom_init(sta_fp8_geom *g, const sta_attn_params *p);
/* Host buffers for o (one block, freed by sta_fp8_ops_free; o zeroed
** first, so freeing a failed alloc is fine).  STA_ERR_NOMEM on failure. */
sta_status sta_fp8_ops_alloc(sta_fp8_ops *o, int64_t batch, int64_t heads, int64_t rows,
                             int64_t head_dim);
void sta_fp8_ops_free(sta_fp8_ops *o);
/* The pre-pass on the host (p's q, k, v on the host, any dtype). */
sta_status sta_cpu_fp8_quantize(const sta_attn_params *p, sta_fp8_ops *o);
/* The FP8 forward on the host: the pre-pass, then every query row against
** its keys in double (sta.h, sta_precision). */
sta_status sta_cpu_fp8_attention(const sta_attn_params *p);
/* For tests only (no user setting): the keys a step of the reference's
** online softmax takes (core/cpu_fp8.c: its running maximum moves per
** step) at head dim head_dim (64 or 128; 0: both), on this thread: 0
** the scheme's (sta_fp8_step), STA_FP8_STEP (64, a block's halves) or
** STA_FP8_BK (whole blocks: a CUDA kernel built with STA_FP8_HALF 0 at
** D 128; sta_cuda_fp8_step_test says which).  Other values are
** ignored. */
void sta_fp8_set_step_test(int32_t head_dim, int32_t keys);
/* The backend table's fp8_dequantize on the host. */
sta_status sta_cpu_fp8_dequantize(float *dst, const sta_bshd *bd, const uint8_t *x8,
                                  const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                                  int per_row);
#if defined(STA_WITH_CUDA) || defined(__CUDACC__)
/* The pre-pass on the device (kernels/fp8_quant.cu): o's buffers device
** memory of sta_fp8_ops_alloc's sizes; on this thread's stream. */
sta_status sta_cuda_fp8_quantize(const sta_attn_params *p, const sta_fp8_ops *o);
/* For tests only (spec/test_gpu_fp8.c), no user setting: 1 (the default)
** lets this thread's fp8 forwards take the bandwidth pre-pass where it
** applies (kernels/fp8_prepass.cu), 0 forces the portable one
** (fp8_quant.cu's kernels); the two write the same bits. */
void sta_cuda_set_fp8_prepass_test(int fast);
/* For tests only: the keys a step of the CUDA fp8 kernel's online softmax
** takes at head dim head_dim (64 or 128; kernels/fp8_api.cu):
** sta_fp8_step(head_dim), or STA_FP8_BK where it was built with
** STA_FP8_HALF 0. */
int32_t sta_cuda_fp8_step_test(int32_t head_dim);
#endif

#ifdef __cplusplus
}
#endif

#endif
