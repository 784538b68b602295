/*
** bsa_bwd_params.h -- the block-sparse backward's arguments (built by
** bsa_bwd_api.cu alone), its shapes and the per-(dtype, head dim) entry.
** The pass (bsa_bwd_api.cu): the key-to-query inversion of the lists on the
** device, prep (LSE * log2 e and D_i = dO_i . O_i per query row, the dQ
** accumulator zeroed), the main kernel (one CTA per key block of 64 rows,
** or per 128 rows of a larger block), post (dq from the accumulator).
*/
#ifndef STA_BSA_BWD_PARAMS_H
#define STA_BSA_BWD_PARAMS_H

#include <cuda.h> /* CUtensorMap (types only) */
#include <cuda_runtime.h>
#include <stdint.h>

#include "sta_cuda.h"

namespace sta {

struct BsaBwdArgs {
  CUtensorMap rmq, rmdo; /* row maps of Q and dO: 64 rows x 64 columns */
  int tma, tma_fused;
  const void *q, *k, *v, *dout;
  void *dk, *dv;
  float *dqacc;        /* [B][H][Mq * bv / 64][2][64][D / 2] (bwd_slots.cuh's dq_acc_at) */
  int *turn;           /* deterministic: [B][H][slots][2] adds done, zeroed; else NULL */
  const float *lse2;   /* [B][H][Sq]: LSE * log2 e, 0 on padding rows */
  const float *dd;     /* [B][H][Sq]: D_i, 0 on padding rows */
  const int *k2q_off;  /* [B * H * Mk + 1]: each key block's query blocks in k2q_idx */
  const int *k2q_idx;  /* query blocks, ascending per key block */
  const int *k2q_rank; /* deterministic: key block's place among the query block's */
  int64_t q_sb, q_ss, q_sh, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, do_sb, do_ss, do_sh;
  int64_t dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh;
  int heads, batch, vec;
  int pair4;     /* dk, dv: 4-byte aligned pairs (bases and strides) */
  int bv, Mq, Mk;
  int subs;      /* CTAs per key block: 1 (bv 64) or bv / 128 */
  const int32_t *q_sizes, *kv_sizes;
  float scale, scale_log2;
};

/* What the row kernels (prep, post) read and write besides BsaBwdArgs. */
struct BsaRowArgs {
  const void *o, *dout;
  const float *lse;
  void *dq;
  int64_t o_sb, o_ss, o_sh, do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh, lse_sb, lse_sh, lse_ss;
  int64_t rows; /* B * H * Sq */
  int Sq;
};

/* prep, the main kernel, post of one (dtype, head dim) (kernel_bsa_bwd.cuh;
** instantiated in bsa_bwd_<dtype>_d<D>.cu): 64-row blocks by the split
** kernel, multiples of 128 by the shared one.  The inverse of the lists is
** built before (bsa_bwd_api.cu). */
template <typename T, int D>
sta_status run_bsa_bwd(const BsaBwdArgs &x, const BsaRowArgs &r, cudaStream_t st);

} /* namespace sta */

/* The block-sparse backward on device tensors (mask != WINDOW). */
sta_status sta_cuda_block_attention_backward(const sta_attn_params *p);

#endif
