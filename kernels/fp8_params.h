/*
** fp8_params.h -- the fp8 forward kernel's one argument (Fp8Params), built
** by fp8_api.cu alone from the core's resolved problem and the quantize
** pre-pass's device buffers (core/fp8_internal.h, sta_fp8_ops), with the TMA
** maps over those buffers, and the entry to each head dim's kernel.  Host
** and device; nvcc only.
*/
#ifndef STA_FP8_PARAMS_H
#define STA_FP8_PARAMS_H

#include "params.h" /* STA_MAX_HEADS */

namespace sta {

/* consumer warpgroups of 64 query rows (compile-time: 3, the default,
** needs STA_FP8_HALF's registers; 2 the variant with whole blocks,
** kernels/README.md), their threads, the CTA's threads (a producer
** warpgroup more), query rows per work item */
#ifndef STA_FP8_NWG
#define STA_FP8_NWG 3
#endif
static_assert(STA_FP8_NWG == 2 || STA_FP8_NWG == 3, "two or three consumer warpgroups");
constexpr int FP8_NWG = STA_FP8_NWG;
constexpr int FP8_CT = 128 * FP8_NWG;
constexpr int FP8_THREADS = FP8_CT + 128;
constexpr int FP8_BM = 64 * FP8_NWG;
constexpr int FP8_BK = 128; /* keys per block */

struct Fp8Params {
  /* 3-D uint8 maps: q8 and k8 [B*H][R][D], boxes D x 128 rows; V
  ** [B*H][D][R], boxes 128 keys x D (only where v_vec) */
  CUtensorMap mq, mk, mv;
  const int8_t *q8, *k8;   /* [B*H][R][D], k8 (and k_scale) rows in sta_fp8_kslot's order */
  const uint8_t *v8;       /* [B*H][D][R] */
  const float *q_scale, *k_scale, *q_bias; /* [B*H][R] */
  const float *v_scale;    /* [B*H][D] */
  void *o;                 /* out_dt, the caller's strides */
  float *lse;              /* NULL: not asked for */
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh, lse_ss;
  sta_fp8_geom g;
  int64_t R;               /* g.rows */
  int heads, out_dt;       /* STA_BF16, STA_F16 or STA_F32 */
  int vol, qbpt;           /* tile volume, query blocks per tile */
  int n_video_items;       /* tiles * qbpt; text query blocks after them */
  int v_vec;               /* R % 16 == 0: mv; whole key blocks from a 16-row
                           ** boundary by TMA, other V rows by 16-byte copies where aligned */
  int has_pad;             /* partial tiles: padding rows among the tiles' rows */
  float scale_log2, scale;
  /* items over every (batch, head), longest first (producer_fp8.cuh,
  ** fp8_item); sched: tile_scheduler.cuh's counters (NULL: a CTA per item) */
  int items_per_bh, n_items;
  int *sched;
  int16_t win[3 * STA_MAX_HEADS]; /* min(K, C) per head and axis */
};

/* The kernel over x's n_items x bh work items on this thread's stream
** (kernel_fp8.cuh: a TMA producer warpgroup, persistent CTAs; instantiated
** in fp8_api.cu); fills in x's item counts and scheduler slot. */
template <int D> sta_status run_fp8(Fp8Params &x, int64_t bh, int64_t n_items);

} /* namespace sta */

#endif
