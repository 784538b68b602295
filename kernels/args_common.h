/*
** args_common.h -- what every kernel argument struct (FwdParams, BwdArgs,
** Fp8Params) takes from the core's resolved problem (sta_attn_params) the
** same way, written once: 16-byte alignment, windows clamped to the tile
** grid, and (common_args_init) q, k, v with their strides and the geometry
** of a struct with the forward's and backward's field names.  Host code.
*/
#ifndef STA_ARGS_COMMON_H
#define STA_ARGS_COMMON_H

#include <stdint.h>

#include "sta_cuda.h"

namespace sta {

inline bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

/* win[3 h + axis] = min(window, tiles on the axis) for every head. */
inline void clamp_windows(int16_t *win, const sta_attn_params *p) {
  for (int64_t h = 0; h < p->heads; h++)
    for (int ax = 0; ax < 3; ax++) {
      const int k = p->windows[3 * h + ax], c = p->grid[ax];
      win[3 * h + ax] = (int16_t)(k < c ? k : c);
    }
}

/* q, k, v, their strides, the sequence, batch, heads and tile geometry. */
template <class X> void common_args_init(X &x, const sta_attn_params *p) {
  x.q = p->q; x.k = p->k; x.v = p->v;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.S = (int)p->seq_len;
  x.V = (int)p->video_len;
  x.text_len = (int)p->text_len;
  x.heads = (int)p->heads;
  x.batch = (int)p->batch;
  x.cT = p->canvas[0]; x.cH = p->canvas[1]; x.cW = p->canvas[2];
  x.tt = p->tile[0]; x.th = p->tile[1]; x.tw = p->tile[2];
  x.NT = p->grid[0]; x.NH = p->grid[1]; x.NW = p->grid[2];
  x.tile_vol = x.tt * x.th * x.tw;
  x.tiled = p->tiled;
  x.VR = (int)p->video_rows;
  clamp_windows(x.win, p);
}

} /* namespace sta */

#endif
