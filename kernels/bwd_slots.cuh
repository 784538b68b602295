/*
** bwd_slots.cuh -- which query rows the backward visits and where their
** state lives: query blocks of 64 rows numbered by slot (each tile's blocks,
** then the text rows'), the walk over a CTA's blocks (the query tiles
** that see a key tile: core/mask.h's sta_window_seen_by), the dQ
** accumulator's block layout, and the deterministic mode's order of adds.
*/
#ifndef STA_BWD_SLOTS_CUH
#define STA_BWD_SLOTS_CUH

#include "block_walk.cuh" /* tok_row */
#include "bwd_params.h"

namespace sta {

/* f32 offset of (row r, column c) in a 64 x W dQ block (W = dq_w(D): 64
** at D 128, 32 at D 64): 8-float chunks XOR-swizzled by row, so the
** staging stores are conflict-free */
template <int W> __host__ __device__ __forceinline__ int dq_off(int r, int c) {
  return r * W + ((((c >> 3) ^ (r & (W / 8 - 1)))) << 3) + (c & 7);
}

/* f32 index in the dQ accumulator of slot-row rr, column c (a multiple of
** 8) of query block sbh: D / W blocks of 64 x W a query block. */
template <int D> __device__ __forceinline__ int64_t dq_acc_at(int64_t sbh, int rr, int c) {
  constexpr int W = dq_w(D), LW = W == 64 ? 6 : 5;
  return (sbh * (D / W) + (c >> LW)) * 64 * W + dq_off<W>(rr, c & (W - 1));
}

/* Extents of tile (it, ih, iw) on each axis (partial at the borders), and
** its id. */
struct Ext {
  int t0, h0, w0, et, eh, ew, id;
};
__device__ __forceinline__ Ext tile_ext(const BwdArgs &a, int it, int ih, int iw) {
  Ext e;
  e.id = (it * a.NH + ih) * a.NW + iw;
  e.t0 = it * a.tt;
  e.h0 = ih * a.th;
  e.w0 = iw * a.tw;
  e.et = min(a.tt, a.cT - e.t0);
  e.eh = min(a.th, a.cH - e.h0);
  e.ew = min(a.tw, a.cW - e.w0);
  return e;
}
/* Global row of row r of block blk of a tile, or -1: TMA blocks are one
** t-slice of the 8x8 box (rows outside the canvas are -1), gather blocks 64
** rows of the tile's (t, h, w) order. */
__device__ __forceinline__ int tile_row(const BwdArgs &a, const Ext &e, int blk, int r) {
  int dt, dh, dw;
  if (a.tma) {
    dt = blk;
    dh = r >> 3;
    dw = r & 7;
    if (dh >= e.eh || dw >= e.ew || dt >= e.et) return -1;
  } else {
    int li = blk * BQ + r, ehw = e.eh * e.ew;
    if (li >= e.et * ehw) return -1;
    dt = li / ehw;
    int rr = li - dt * ehw;
    dh = rr / e.ew;
    dw = rr - dh * e.ew;
  }
  return tok_row(a, e.id, e.t0, e.h0, e.w0, dt, dh, dw);
}
/* Global row of row r of slot s, or -1. */
__device__ __forceinline__ int slot_row(const BwdArgs &a, int s, int r) {
  const int tiles = a.NT * a.NH * a.NW;
  if (s >= tiles * a.qbpt) {
    int row = a.VR + (s - tiles * a.qbpt) * BQ + r;
    return row < a.S ? row : -1;
  }
  int tl = s / a.qbpt, blk = s - tl * a.qbpt;
  Ext e = tile_ext(a, tl / (a.NH * a.NW), (tl / a.NW) % a.NH, tl % a.NW);
  return tile_row(a, e, blk, r);
}

/* Deterministic mode: the place of key block kb (of key tile (kt, kh, kw),
** or of the text keys) among the key blocks that add into query block slot
** s, in launch order: the text key blocks first, then the non-empty video
** key blocks of the query tile's window (of every tile for a text query
** block) in tile order.  A CTA waits only for CTAs launched before it. */
__device__ __forceinline__ int dq_turn(const BwdArgs &a, const int16_t *win, int kt, int kh,
                                       int kw, int text, int kb, int s) {
  if (text) return kb;
  const int tiles = a.NT * a.NH * a.NW;
  int lo[3] = {0, 0, 0}, hi[3] = {a.NT - 1, a.NH - 1, a.NW - 1};
  if (s < tiles * a.qbpt) { /* the query tile's window */
    const int tl = s / a.qbpt;
    const int q[3] = {tl / (a.NH * a.NW), (tl / a.NW) % a.NH, tl % a.NW}, c[3] = {a.NT, a.NH, a.NW};
    for (int i = 0; i < 3; i++) {
      lo[i] = sta_window_start(q[i], win[i], c[i]); /* the rule: core/mask.h */
      hi[i] = lo[i] + win[i] - 1;
    }
  }
  int n = a.n_text_kb; /* key blocks of the window's tiles before (kt, kh, kw) */
  for (int it = lo[0]; it <= hi[0]; it++)
    for (int ih = lo[1]; ih <= hi[1]; ih++)
      for (int iw = lo[2]; iw <= hi[2]; iw++) {
        if (it == kt && ih == kh && iw == kw) return n + kb;
        Ext e = tile_ext(a, it, ih, iw);
        n += (e.et * e.eh * e.ew + BK - 1) / BK;
      }
  return n + kb; /* not reached: the key tile is in the window */
}

/* An odometer over the query blocks of one CTA: the tiles of the ranges
** (t slowest), each in its blocks, then the text blocks. */
struct QWalk {
  int ta, tz, ha, hz, wa, wz; /* tile ranges */
  int it, ih, iw, blk, nblk;
  int tb;   /* text block */
  int kind; /* 0 tiles, 1 text rows, 2 done */

  __device__ __forceinline__ void enter(const BwdArgs &a) {
    Ext e = tile_ext(a, it, ih, iw);
    nblk = a.tma ? e.et : (e.et * e.eh * e.ew + BQ - 1) / BQ;
    blk = 0;
  }
  __device__ __forceinline__ void start(const BwdArgs &a) {
    kind = 0;
    it = ta;
    ih = ha;
    iw = wa;
    tb = 0;
    enter(a);
  }
  __device__ __forceinline__ void next(const BwdArgs &a) {
    if (kind == 0) {
      if (++blk < nblk) return;
      if (++iw > wz) {
        iw = wa;
        if (++ih > hz) {
          ih = ha;
          if (++it > tz) {
            kind = a.S > a.VR ? 1 : 2;
            return;
          }
        }
      }
      enter(a);
    } else if (kind == 1) {
      if (++tb * BQ >= a.S - a.VR) kind = 2;
    }
  }
  __device__ __forceinline__ int slot(const BwdArgs &a) const {
    return kind == 1 ? a.NT * a.NH * a.NW * a.qbpt + tb
                     : ((it * a.NH + ih) * a.NW + iw) * a.qbpt + blk;
  }
};

} /* namespace sta */

#endif
