/*
** bwd_api.cu -- the STA backward on the GPU (STA.md section 10), sm_90a:
** sta_cuda_attention_backward, the backend's limits, the kernel arguments
** (built only here), the workspace, and the (dtype, head dim) dispatch.
**
** Query rows are handled in blocks of 64, numbered by slot: each tile's
** blocks (one t-slice of an 8x8 tile where TMA reads the tile from untiled
** memory, else 64 rows of the tile's (t, h, w) order), then the text rows.
** The f32 dQ accumulator and the per-row LSE (log2 domain) and D_i live in
** slot order, so a block's are contiguous.  Three launches on the caller's
** stream:
**   1. prep: LSE * log2(e) and D_i = dO_i . O_i per slot row; dK = dV = 0 on
**      the rows that are never keys (>= V + text_len); the dQ accumulator is
**      zeroed;
**   2. the main kernel: one CTA per (batch, head, key block of 128 keys: a
**      third of a 6x8x8 tile, or 128 text keys), text key blocks first (every
**      query sees them: the longest items).  K and V stay in shared memory.
**      A producer warpgroup streams the query blocks that see the key tile --
**      on each axis one contiguous range of query tiles (STA.md section 10),
**      then every text block -- through a 2-stage ring: Q and dO by TMA (or
**      a cp.async gather by the whole warpgroup where TMA does not apply),
**      LSE and D by bulk copy.
**      Two consumer warpgroups own 64 keys each:
**        S^T = K Q^T, dP^T = V dO^T          (wgmma, both from shared memory)
**        P^T = 2^(S^T scale log2e - LSE log2e), dS^T = P^T (dP^T - D)
**        dV += P^T dO, dK += dS^T Q          (P^T, dS^T from registers)
**        dQ = dS K                           (dS^T through shared memory;
**                                             each warpgroup takes D / 2
**                                             columns over all 128 keys)
**      and dQ goes to the accumulator by one bulk reduce-add (cp.reduce.
**      async.bulk) per warpgroup and block; dK (times the scale) and dV are
**      stored once at the end;
**   3. post: dq = scale * the accumulator, in the inputs' dtype and layout.
** Deterministic mode: the key blocks add into each dQ block in a fixed
** order (text key blocks, then the window's video key blocks in tile
** order: launch order, so a CTA only ever waits for earlier ones), each
** waiting for its turn on a per-block counter and waiting for its add to
** land before passing the turn on.
** Rows outside the canvas or past a partial tile are zero-filled: a zero Q,
** dO or K row adds nothing to any gradient, so no mask is needed.  In the
** tiled order (rows tile by tile, partial tiles padded) a t-slice is a run
** of 64 rows, read by the row maps when every tile is whole; with padding
** rows (which may hold anything) queries are gathered by token, and the
** padding rows' dq, dk, dv are zeroed by one more launch (tiled_pad.cu).
*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "args_common.h"
#include "bwd_params.h"

namespace {

using namespace sta;

/* TMA maps of Q and dO where the geometry and strides allow them (as the
** forward's setup_tma): 8x8 tiles in h and w, 16-byte rows, heads fused
** with D or a batch stride that folds into the head count. */
void setup_tma(BwdArgs &x, const sta_attn_params *p) {
  x.tma = 0;
  if ((sta_cuda_tma_test() & STA_TEST_NO_TMA) || !x.vec || p->tile[1] != 8 || p->tile[2] != 8) return;
  if (p->tiled && p->video_rows != p->video_len) return;
  const int64_t D = p->head_dim;
  int fused = p->q_sh == D && p->do_sh == D;
  int fold = p->batch == 1 || (p->q_sb == p->heads * p->q_sh && p->do_sb == p->heads * p->do_sh);
  if (!fused && !fold) return;
  if (p->heads * p->batch > 0x7fffffff || p->heads * D > 0x7fffffff) return;
  int64_t nhb = p->heads * p->batch;
  x.tma_fused = fused;
  const int tl = !p->tiled; /* tile maps: untiled order only */
  x.tma = (!tl || sta_cuda_encode_map(&x.tmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1, 64)) &&
          (!tl || sta_cuda_encode_map(&x.tmdo, p->dout, p, p->do_sb, p->do_ss, p->do_sh, fused, nhb, 1, 64)) &&
          sta_cuda_encode_map(&x.rmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0, 64) &&
          sta_cuda_encode_map(&x.rmdo, p->dout, p, p->do_sb, p->do_ss, p->do_sh, fused, nhb, 0, 64);
}

} /* namespace */

sta_status sta_cuda_attention_backward(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE, "backward: dtype %s not supported on cuda (use bf16 or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: head_dim %lld not supported on cuda (64 or 128)",
                     (long long)p->head_dim);
  if (p->heads > STA_BWD_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_BWD_MAX_HEADS);
  if (p->seq_len > 0x3fffffff || p->grid[0] > 32767 || p->grid[1] > 32767 || p->grid[2] > 32767)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: seq_len %lld or tile grid %dx%dx%d too large for the CUDA backend",
                     (long long)p->seq_len, p->grid[0], p->grid[1], p->grid[2]);
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;

  const size_t al = alignof(BwdArgs);
  BwdArgs *xp = (BwdArgs *)aligned_alloc(al, (sizeof(BwdArgs) + al - 1) & ~(al - 1));
  if (!xp) return sta_error(STA_ERR_NOMEM, "backward: out of host memory");
  memset(xp, 0, sizeof *xp);
  BwdArgs &x = *xp;
  common_args_init(x, p);
  x.dout = p->dout;
  x.dk = p->dk; x.dv = p->dv;
  x.do_sb = p->do_sb; x.do_ss = p->do_ss; x.do_sh = p->do_sh;
  x.dk_sb = p->dk_sb; x.dk_ss = p->dk_ss; x.dk_sh = p->dk_sh;
  x.dv_sb = p->dv_sb; x.dv_ss = p->dv_ss; x.dv_sh = p->dv_sh;
  x.kbpt = (x.tile_vol + BK - 1) / BK;
  x.n_text_kb = (x.text_len + BK - 1) / BK;
  x.scale = p->scale;
  x.scale_log2 = p->scale * LOG2E;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->do_sb, p->do_ss, p->do_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) && aligned16(p->dout);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  setup_tma(x, p);
  x.qbpt = x.tma ? x.tt : (x.tile_vol + BQ - 1) / BQ;
  const int64_t nqb = (int64_t)x.NT * x.NH * x.NW * x.qbpt + (p->seq_len - p->video_rows + BQ - 1) / BQ;
  x.nqb = (int)nqb;

  RowArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.o = p->o; ra.dout = p->dout; ra.lse = p->lse; ra.dk = p->dk; ra.dv = p->dv; ra.dq = p->dq;
  ra.o_sb = p->o_sb; ra.o_ss = p->o_ss; ra.o_sh = p->o_sh;
  ra.do_sb = p->do_sb; ra.do_ss = p->do_ss; ra.do_sh = p->do_sh;
  ra.dk_sb = p->dk_sb; ra.dk_ss = p->dk_ss; ra.dk_sh = p->dk_sh;
  ra.dv_sb = p->dv_sb; ra.dv_ss = p->dv_ss; ra.dv_sh = p->dv_sh;
  ra.dq_sb = p->dq_sb; ra.dq_ss = p->dq_ss; ra.dq_sh = p->dq_sh;
  ra.lse_sb = p->lse_sb; ra.lse_sh = p->lse_sh; ra.lse_ss = p->lse_ss;
  ra.keys = x.VR + x.text_len;
  ra.rows = p->batch * p->heads * nqb * BQ;
  ra.vec_od = aligned16(p->o) && aligned16(p->dout) && p->o_sb % 8 == 0 && p->o_ss % 8 == 0 &&
              p->o_sh % 8 == 0 && p->do_sb % 8 == 0 && p->do_ss % 8 == 0 && p->do_sh % 8 == 0;
  ra.vec_dq = aligned16(p->dq) && p->dq_sb % 8 == 0 && p->dq_ss % 8 == 0 && p->dq_sh % 8 == 0;

  /* workspace, stream-ordered: the f32 dQ accumulator, LSE2 and D */
  cudaStream_t sm = sta_cuda_stream();
  const size_t acc_bytes = sizeof(float) * (size_t)ra.rows * (size_t)p->head_dim;
  /* the turn counters (one per dQ block: two per query block) rounded up
  ** to 256 bytes: LSE2 and D after them are read by 16-byte-aligned bulk
  ** copies */
  const size_t turn_bytes =
      p->deterministic ? (sizeof(int) * (size_t)(ra.rows / BQ) * 2 + 255) & ~(size_t)255 : 0;
  const size_t ws_bytes = acc_bytes + turn_bytes + 2 * sizeof(float) * (size_t)ra.rows;
  void *ws = NULL;
  cudaError_t e = sta_cuda_ws_alloc(&ws, ws_bytes, sm);
  sta_status s;
  if (e != cudaSuccess) {
    ws = NULL;
    s = sta_cuda_fail(e, "backward: workspace");
  } else if (turn_bytes &&
             (e = cudaMemsetAsync((char *)ws + acc_bytes, 0, turn_bytes, sm)) != cudaSuccess) {
    /* (the dQ accumulator is zeroed by the prep kernel, row by row) */
    s = sta_cuda_fail(e, "backward: zeroing the turn counters");
  } else {
    x.dqacc = (float *)ws;
    x.turn = p->deterministic ? (int *)((char *)ws + acc_bytes) : NULL;
    x.lse2 = (const float *)((char *)ws + acc_bytes + turn_bytes);
    x.dd = x.lse2 + ra.rows;
    const int D = (int)p->head_dim;
    if (p->dtype == STA_BF16)
      s = D == 128 ? run_bwd<__nv_bfloat16, 128>(p, x, ra, sm) : run_bwd<__nv_bfloat16, 64>(p, x, ra, sm);
    else
      s = D == 128 ? run_bwd<__half, 128>(p, x, ra, sm) : run_bwd<__half, 64>(p, x, ra, sm);
    if (p->video_rows > p->video_len) /* the tiled order's padding rows */
      for (int i = 0; i < 3 && s == STA_OK; i++) {
        void *g[3] = {p->dq, p->dk, p->dv};
        const int64_t st3[3][3] = {{p->dq_sb, p->dq_ss, p->dq_sh}, {p->dk_sb, p->dk_ss, p->dk_sh},
                                   {p->dv_sb, p->dv_ss, p->dv_sh}};
        s = sta_cuda_pad_rows(p, g[i], st3[i][0], st3[i][1], st3[i][2], NULL);
      }
  }
  if (ws) {
    e = cudaFreeAsync(ws, sm);
    if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "backward: freeing the workspace");
  }
  free(xp);
  return s;
}
