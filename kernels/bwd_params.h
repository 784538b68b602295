/*
** bwd_params.h -- the STA backward's kernel arguments (bwd_api.cu builds
** them, kernel_bwd.cuh and bwd_rows.cuh read them), its block sizes, and
** the per-(dtype, head dim) entry point.
*/
#ifndef STA_BWD_PARAMS_H
#define STA_BWD_PARAMS_H

#include <cuda.h> /* CUtensorMap (types only) */
#include <cuda_runtime.h>
#include <stdint.h>

#include "sta_cuda.h"

#define STA_BWD_MAX_HEADS 1024

namespace sta {

constexpr int BK = 128;   /* keys per CTA: two consumer warpgroups of 64 */
constexpr int BQ = 64;    /* query rows per block */
constexpr int STAGES = 2; /* Q / dO ring */
constexpr int CTH = 256;  /* consumer threads */
constexpr int NTH = 384;  /* + one producer warpgroup */
constexpr float LOG2E = 1.4426950408889634f;
/* dQ columns per consumer warpgroup: each sums its D / 2 columns over all
** BK keys and adds them as a 64 x dq_w(D) f32 block (two blocks a query
** block, at either head dim) */
constexpr int dq_w(int D) { return D / 2; }

struct BwdArgs {
  CUtensorMap tmq, tmdo; /* tile maps: one t-slice of an 8x8 tile, 64 columns */
  CUtensorMap rmq, rmdo; /* row maps: 64 consecutive rows, 64 columns (the
                            tiled order's t-slices too: no tile maps) */
  int tma;               /* tile and row maps of Q and dO in use */
  int tma_fused;         /* dim 0 = heads * D (coordinate head * D), last = batch */
  const void *q, *k, *v, *dout;
  void *dk, *dv;
  float *dqacc;      /* [B][H][nqb][2][64][D / 2] (swizzled columns: dq_off), zeroed */
  int *turn;         /* deterministic: [B][H][nqb][2] adds done, zeroed */
  const float *lse2; /* [B][H][nqb][64]: LSE * log2(e) */
  const float *dd;   /* [B][H][nqb][64]: D_i */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int S, V, text_len, heads, batch, vec;
  int cT, cH, cW, tt, th, tw, NT, NH, NW, tile_vol;
  int tiled, VR; /* FastVideo's tiled order; video rows (text from VR) */
  int kbpt;      /* key blocks per tile */
  int n_text_kb; /* text key blocks per (batch, head) */
  int qbpt;      /* query block slots per tile: tt (TMA) or ceil(tile_vol / 64) */
  int nqb;       /* query block slots per (batch, head): tiles', then text */
  float scale, scale_log2;
  int16_t win[3 * STA_BWD_MAX_HEADS]; /* min(K, C) per head and axis */
};

struct RowArgs {
  const void *o, *dout;
  const float *lse;
  void *dk, *dv, *dq;
  int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int64_t dq_sb, dq_ss, dq_sh, lse_sb, lse_sh, lse_ss;
  int keys;       /* VR + text_len: rows from there are never keys */
  int64_t rows;   /* B * heads * nqb * 64 slot rows */
  int vec_od;     /* o and dout: 16-byte loads (aligned, strides multiples of 8) */
  int vec_dq;     /* dq: 16-byte stores */
};

/* The three launches for one (dtype, head dim): bwd_{bf16,f16}_d{64,128}.cu. */
template <typename T, int D>
sta_status run_bwd(const sta_attn_params *p, const BwdArgs &x, const RowArgs &ra,
                   cudaStream_t st);

} /* namespace sta */

#endif
