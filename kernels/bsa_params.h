/*
** bsa_params.h -- the block-sparse forward's one argument (BsaParams),
** built from the core's resolved problem (sta_attn_params with mask BLOCKS
** or WINDOW_OR_BLOCKS) by bsa_api.cu alone, and the entry to each (dtype,
** head dim)'s kernels.  Host and device; nvcc only.
*/
#ifndef STA_BSA_PARAMS_H
#define STA_BSA_PARAMS_H

#include <cuda.h> /* CUtensorMap (types only) */
#include <stdint.h>

#include "sta_cuda.h"

#define STA_BSA_MAX_HEADS 1024

namespace sta {

struct BsaParams {
  /* TMA maps, boxes of 64 columns, 128-byte swizzle: Q rows (3-D: C0, Sq,
  ** N; box 64 x QR rows), K and V by block (4-D: C0, block_rows, Mk, N;
  ** box 64 x BK rows: a box may start before its block, bsa_walk.h).  C0 =
  ** heads * D and N = batch (tma_fused: head stride D), else C0 = D and N
  ** = batch * heads (the batch folded into the heads' stride). */
  CUtensorMap tmq, tmk, tmv;
  int tma;       /* every load by TMA; else the producer warpgroup gathers */
  int tma_fused;
  const void *q, *k, *v;
  void *o;
  float *lse;
  int *sched; /* persistent: [next item, CTAs done], reset at exit; NULL: a CTA an item */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh, lse_sb, lse_sh, lse_ss;
  int heads, batch, vec; /* vec: 16-byte aligned rows (q, k, v, o) */
  /* the lists (core/backend.h: device pointers, validated) */
  int bv;       /* block rows */
  int Mq, Mk;   /* query and key blocks */
  int64_t L;    /* idx entries per query block */
  const int32_t *num, *idx, *q_sizes, *kv_sizes;
  int uni;      /* WINDOW_OR_BLOCKS: the window's tiles, then the list's others */
  int grid[3];  /* the union's tile grid (blocks are its tiles) */
  /* work items (bsa_walk.h's bsa_item), set by the launch */
  int parts;    /* items per query block */
  int n_items;
  float scale_log2;
  float rescale_th; /* softmax_block's threshold: 0 exact, 8 fast */
  int16_t win[3 * STA_BSA_MAX_HEADS]; /* the union: min(K, grid) per head and axis */
  /* the paired kernel (pairs set; bsa_pairs.cu's pre-pass): an item is the
  ** query blocks 2p and 2p + 1 (Mp = ceil(Mq / 2) pairs a head); row r =
  ** (b heads + h) Mp + p of uidx (ustride entries) the union of their
  ** lists, ascending, each entry n << 2 | bit 0 (2p lists n) | bit 1
  ** (2p + 1 does); ucnt[4 r ..]: the union's entries, 2p's, 2p + 1's. */
  int pairs, Mp; /* pairs: 1, or 2 (tests: the pre-pass's rank path at any Mk) */
  int64_t ustride;
  const int32_t *uidx, *ucnt;
};

/* The block-sparse forward of one (dtype, head dim) on x (kernel_bsa.cuh;
** instantiated once each in bsa_<dtype>_d<D>.cu): 64-row blocks by the
** split kernel, multiples of 128 by the shared one.  persist: the
** scheduler's counters when they can be had. */
template <typename T, int D> sta_status run_bsa(BsaParams &x);

/* The paired kernel's pre-pass (bsa_pairs.cu): a workspace from
** cudaMallocAsync on the library's stream (*ws; release it with
** bsa_pairs_release after the forward) holding x's uidx and ucnt, filled
** by a kernel on that stream.  x: BLOCKS, block_rows 64. */
sta_status bsa_pairs_prepass(BsaParams &x, void **ws);
sta_status bsa_pairs_release(void *ws);
/* The lists sorted ascending (sta_cuda_set_bsa_sort_test): a workspace as
** bsa_pairs_prepass's (release it with bsa_pairs_release) holding a copy
** of x's idx, each list's first num entries ascending (the rest never
** read), and x.idx pointed at it; where Mk's bitmap would not fit in
** shared memory, x untouched and *ws NULL. */
sta_status bsa_sort_prepass(BsaParams &x, void **ws);

/* Records a launch for sta_cuda_last_launch (bsa_api.cu). */
void bsa_note_launch(const BsaParams &x, const char *kernel, const char *dtype, int d, int qr,
                     int bk, int grid);

} /* namespace sta */

/* The block-sparse forward on device tensors (mask != WINDOW; bsa_api.cu). */
sta_status sta_cuda_block_attention(const sta_attn_params *p);
/* The resolved lists of p checked on the device (bsa_check.cu): the CUDA
** backend's check_lists (core/backend.h), core/mask.c's messages. */
sta_status sta_cuda_check_lists(const sta_attn_params *p);

#endif
