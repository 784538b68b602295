/*
** params.h -- the forward kernels' one argument (FwdParams), derived from
** the core's resolved problem (sta_attn_params, core/backend.h) by
** fwd_params_init alone, and the entry to each (dtype, head dim)'s
** kernels.  Host and device; nvcc only.
*/
#ifndef STA_PARAMS_H
#define STA_PARAMS_H

#include <cuda.h> /* CUtensorMap (types only: no -lcuda) */
#include <stdint.h>

#include "sta_cuda.h"

#define STA_MAX_HEADS 1024

namespace sta {

/* Passed by value as a __grid_constant__ kernel parameter (about 10 KB).
** The block walk (block_walk.cuh) and the tile scheduler read the
** geometry fields by name, so a backward's parameter struct can reuse them
** by naming its fields the same. */
struct FwdParams {
  /* TMA maps, each read in boxes of 64 columns with the 128-byte swizzle
  ** (tma_map.h).  Tile maps: 2 t-slices of an 8x8 tile of K, V or Q
  ** straight from untiled memory; row maps: 128 consecutive rows (text
  ** keys and queries, the keys of text queries; in the tiled order also
  ** the tiles' blocks, which are runs of rows there: no tile maps).  Either the heads are
  ** fused with D in dim 0 (head stride D: BSHD, any batch), or dim 4 / 2
  ** counts heads (batch folded in when the batch stride allows, else
  ** batch 1); the producer derives a work item's coordinates c0 / c4. */
  CUtensorMap tmk; /* 64-byte (or more) aligned type */
  CUtensorMap tmv;
  CUtensorMap tmq;
  CUtensorMap rmk, rmv, rmq;
  CUtensorMap tmq3, rmq3; /* Q in items of 192 rows: 3 t-slices, 192 rows (Tall) */
  CUtensorMap tmk3, tmv3, rmk3, rmv3; /* K, V in blocks of 192 (Wide) */
  int tma;       /* tile maps of K and V: the tile key blocks */
  int tma_q;     /* tile map of Q: query blocks of 2 t-slices of a box */
  int tma_rows;  /* row maps: text key blocks, text query blocks */
  int tma_fused; /* dim 0 = heads*D (coordinate head*D), last dim = batch */
  int tma_q3;    /* tmq3 and rmq3 (D 64, tt a multiple of 3) */
  int tma_k3;    /* tmk3, tmv3, rmk3, rmv3 (D 128, tt a multiple of 3) */
  /* tensors: element strides of [B, S, heads, D] views (d stride 1) */
  const void *q, *k, *v;
  void *o;
  float *lse;
  int *sched; /* persistent kernel: [next item, CTAs done, items loaded], reset at exit */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh, lse_ss;
  /* geometry (STA.md sections 1-3) */
  int S, V, text_len, vec, heads, batch; /* vec: 16-byte aligned rows */
  int cT, cH, cW, tt, th, tw, NT, NH, NW, tile_vol;
  int tiled, VR; /* FastVideo's tiled order (sta_order); video rows (text from VR) */
  /* work items (tile_scheduler.cuh), set by the launch */
  int qbpt;           /* query blocks per tile */
  int n_text_qblocks; /* blocks of text query rows (per head and batch) */
  int n_text_items;   /* batch * heads * n_text_qblocks: they come first */
  int n_items;        /* all work items */
  int gate_nkb;       /* the wave gate: items of this many key blocks or more (0: none) */
  /* softmax */
  float scale_log2;
  float rescale_th;   /* 0 exact running maximum, 8 fast (softmax_block) */
  int16_t win[3 * STA_MAX_HEADS];  /* min(K, C) per head and axis */
  int16_t horder[STA_MAX_HEADS];   /* heads, largest window first */
};

/* Everything of x from p (which has passed the core's checks and the CUDA
** backend's limits): pointers, strides, geometry, windows and the order of
** heads, the softmax constants, the TMA maps the call can use (variant 9:
** not the 192-row ones). */
void fwd_params_init(FwdParams &x, const sta_attn_params *p, int variant);

/* Records a launch of x for sta_cuda_last_launch: the kernel's name, dtype
** and head dim, its rows and keys per block, whether it has the gather
** producer, the grid, and why setup_tma (this thread's last
** fwd_params_init) left a TMA path out. */
void fwd_note_launch(const FwdParams &x, const char *kernel, const char *dtype, int d, int br,
                     int bk, int gather, int persist, int grid);

/* Runs one (dtype, head dim)'s forward on x (launch_fwd.cuh; instantiated
** once each in fwd_<dtype>_d<D>.cu).  variant: sta_cuda_variant_test(). */
template <typename T, int D> sta_status run_fwd(FwdParams &x, int variant);

} /* namespace sta */

#endif
