/*
** tiled_pad.cu -- the padding rows of FastVideo's tiled order (sta.h,
** sta_order): the places of partial tiles that hold no token.  The
** attention kernels never store them (their items hold tokens only), so
** the forward's out and lse (0, -inf: a query with no keys) and the
** backward's dq, dk, dv (0) are written here, one launch per operand.
*/
#include "sta_cuda.h"

namespace {

struct PadArgs {
  uint16_t *t; /* bf16 or f16: zero is the zero bit pattern */
  float *lse;
  int64_t sb, ss, sh, lse_sb, lse_sh, lse_ss;
  int64_t rows; /* B * heads * padded video rows */
  int heads, D, cT, cH, cW, tt, th, tw, NH, NW, tile_vol, pv;
};

/* One warp per (batch, head, video row of the tiled order): a padding row
** gets 0 (and lse -inf), a token's row is left alone. */
__global__ void sta_pad_rows(const __grid_constant__ PadArgs a) {
  const int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= a.rows) return;
  const int lane = threadIdx.x & 31;
  const int j = (int)(i % a.pv);
  const int64_t bh = i / a.pv, b = bh / a.heads, h = bh % a.heads;
  const int id = j / a.tile_vol, in = j - id * a.tile_vol;
  const int it = id / (a.NH * a.NW), ih = (id / a.NW) % a.NH, iw = id % a.NW;
  const int lt = in / (a.th * a.tw), lh = (in / a.tw) % a.th, lw = in % a.tw;
  if (it * a.tt + lt < a.cT && ih * a.th + lh < a.cH && iw * a.tw + lw < a.cW) return;
  uint16_t *row = a.t + b * a.sb + (int64_t)j * a.ss + h * a.sh;
  for (int d = lane; d < a.D; d += 32) row[d] = 0;
  if (a.lse && lane == 0) a.lse[b * a.lse_sb + h * a.lse_sh + (int64_t)j * a.lse_ss] = -INFINITY;
}

} /* namespace */

sta_status sta_cuda_pad_rows(const sta_attn_params *p, void *t, int64_t sb, int64_t ss,
                             int64_t sh, float *lse) {
  PadArgs a;
  a.t = (uint16_t *)t;
  a.lse = lse;
  a.sb = sb; a.ss = ss; a.sh = sh;
  a.lse_sb = p->lse_sb; a.lse_sh = p->lse_sh; a.lse_ss = p->lse_ss;
  a.pv = (int)p->video_rows;
  a.rows = p->batch * p->heads * p->video_rows;
  a.heads = (int)p->heads;
  a.D = (int)p->head_dim;
  a.cT = p->canvas[0]; a.cH = p->canvas[1]; a.cW = p->canvas[2];
  a.tt = p->tile[0]; a.th = p->tile[1]; a.tw = p->tile[2];
  a.NH = p->grid[1]; a.NW = p->grid[2];
  a.tile_vol = a.tt * a.th * a.tw;
  if (a.rows == 0) return STA_OK;
  /* no cancel point: part of a call whose kernels have run */
  sta_pad_rows<<<(unsigned)((a.rows + 7) / 8), 256, 0, sta_cuda_stream()>>>(a);
  cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "padding rows kernel launch");
}
