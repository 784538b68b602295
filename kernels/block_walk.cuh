/*
** block_walk.cuh -- which keys a query tile sees (STA.md sections 2-3) and
** the walk over them in key blocks: the window plan of a query tile, the
** rows of a key block, the box origin of a TMA block, the block info the
** producer hands the consumers with each stage, and the one-division-free
** walk (item_blocks).  Templated on the parameter struct P, which needs the
** geometry fields of FwdParams (S, V, text_len, cT.. tw, NT, NH, NW,
** tile_vol, win, and tma for block_info).
**
** Key blocks of a query tile: for each key tile of the window, in (t, h, w)
** order of the tiles, bpt blocks of BK keys in the tile's (t, h, w) token
** order, then the valid text rows [V, V + text_len) in blocks of BK; for a
** text query block, the rows [0, V + text_len).  A TMA tile block is BK/64
** t-slices of an 8x8 tile (a box), which may run past the canvas: its keys
** are then masked by position.
**
** Rows: in the untiled order token (t, h, w) is row (t*cH + h)*cW + w; in
** FastVideo's tiled order (a.tiled) tile after tile, each padded to
** tile_vol rows, so a box of t-slices of an 8x8 tile is a run of rows
** (read by the row maps) and the text starts at row VR, after the padded
** tiles.  tok_row and video_row are the only places that tell them apart.
*/
#ifndef STA_BLOCK_WALK_CUH
#define STA_BLOCK_WALK_CUH

#include "mask.h" /* the window rule */
#include "ptx.cuh"

namespace sta {

struct KeyPlan {
  int text;              /* text query block: keys [0, V + text_len) */
  int st, sh, sw;        /* first key tile on each axis */
  int ct, ch, cw;        /* key tiles on each axis */
  int bpt;               /* key blocks per tile */
  int n_tblk;            /* key blocks from tiles */
  int nkb;               /* all key blocks */
};

/* Row of the token at (dt, dh, dw) in tile `tile` (its id (it*NH + ih)*NW
** + iw), whose first token is (t0, h0, w0). */
template <class P>
__device__ __forceinline__ int tok_row(const P &a, int tile, int t0, int h0, int w0, int dt,
                                       int dh, int dw) {
  return a.tiled ? tile * a.tile_vol + (dt * a.th + dh) * a.tw + dw
                 : ((t0 + dt) * a.cH + h0 + dh) * a.cW + w0 + dw;
}

/* Row of key x of a text query, x < V + text_len: the video tokens in
** untiled order (x < V), then the text rows. */
template <class P>
__device__ __forceinline__ int video_row(const P &a, int x) {
  if (x >= a.V) return a.VR + x - a.V;
  if (!a.tiled) return x;
  const int hw = a.cH * a.cW, t = x / hw, r = x - t * hw, h = r / a.cW, w = r - h * a.cW;
  const int it = t / a.tt, ih = h / a.th, iw = w / a.tw;
  return tok_row(a, (it * a.NH + ih) * a.NW + iw, 0, 0, 0, t - it * a.tt, h - ih * a.th,
                 w - iw * a.tw);
}

/* The key tiles of query tile (it, ih, iw) for a head's window (a.win:
** clamped to the grid), in key blocks of bk keys (tile blocks first, then
** the text). */
template <class P>
__device__ __forceinline__ void window_plan(const P &a, int head, int it,
                                            int ih, int iw, int bk, KeyPlan *p) {
  p->ct = a.win[3 * head];
  p->ch = a.win[3 * head + 1];
  p->cw = a.win[3 * head + 2];
  p->st = sta_window_start(it, p->ct, a.NT); /* the rule: core/mask.h */
  p->sh = sta_window_start(ih, p->ch, a.NH);
  p->sw = sta_window_start(iw, p->cw, a.NW);
  p->bpt = (a.tile_vol + bk - 1) / bk;
  p->n_tblk = p->ct * p->ch * p->cw * p->bpt;
  p->nkb = p->n_tblk + (a.text_len + bk - 1) / bk;
}

/* Global row of key j of key block kb (blocks of BK keys), or -1; *cnt =
** valid keys of the block (they form a prefix). */
template <int BK, class P>
__device__ __forceinline__ int key_row(const P &a, const KeyPlan &p,
                                       int kb, int j, int *cnt) {
  constexpr int BN = BK;
  if (p.text) {
    int lim = a.V + a.text_len, r0 = kb * BN;
    int c = lim - r0;
    *cnt = c < BN ? c : BN;
    return j < *cnt ? video_row(a, r0 + j) : -1;
  }
  if (kb >= p.n_tblk) {
    int r0 = (kb - p.n_tblk) * BN;
    int c = a.text_len - r0;
    *cnt = c < BN ? c : BN;
    return j < *cnt ? a.VR + r0 + j : -1;
  }
  int tl = kb / p.bpt, blk = kb - tl * p.bpt;
  int hw = p.ch * p.cw;
  int i0 = tl / hw, rem = tl - i0 * hw;
  int i1 = rem / p.cw, i2 = rem - i1 * p.cw;
  int t0 = (p.st + i0) * a.tt, h0 = (p.sh + i1) * a.th,
      w0 = (p.sw + i2) * a.tw;
  int et = min(a.tt, a.cT - t0), eh = min(a.th, a.cH - h0),
      ew = min(a.tw, a.cW - w0);
  int n = et * eh * ew - blk * BN;
  *cnt = n < 0 ? 0 : (n < BN ? n : BN);
  if (j >= *cnt) return -1;
  int li = blk * BN + j, ehw = eh * ew;
  int dt = li / ehw, r = li - dt * ehw;
  int dh = r / ew, dw = r - dh * ew;
  return tok_row(a, ((p.st + i0) * a.NH + p.sh + i1) * a.NW + p.sw + i2, t0, h0, w0, dt, dh, dw);
}

/* Tiled order: the first row of key block kb (< n_tblk) of BK keys, BK/64
** t-slices of an 8x8 tile. */
template <int BK, class P>
__device__ __forceinline__ int tile_block_row(const P &a, const KeyPlan &p, int kb) {
  int tl = kb / p.bpt, blk = kb - tl * p.bpt;
  int hw = p.ch * p.cw;
  int i0 = tl / hw, rem = tl - i0 * hw;
  int i1 = rem / p.cw, i2 = rem - i1 * p.cw;
  return (((p.st + i0) * a.NH + p.sh + i1) * a.NW + p.sw + i2) * a.tile_vol + blk * BK;
}

/* TMA key block kb (< n_tblk) of BK keys: origin of its BK/64 t-slices of
** an 8x8 tile. */
template <int BK, class P>
__device__ __forceinline__ void tma_block_origin(const P &a, const KeyPlan &p, int kb,
                                                 int *t0, int *h0, int *w0) {
  int tl = kb / p.bpt, blk = kb - tl * p.bpt;
  int hw = p.ch * p.cw;
  int i0 = tl / hw, rem = tl - i0 * hw;
  int i1 = rem / p.cw, i2 = rem - i1 * p.cw;
  *t0 = (p.st + i0) * a.tt + (BK / 64) * blk;
  *h0 = (p.sh + i1) * 8;
  *w0 = (p.sw + i2) * 8;
}

/* Block i of a key plan: its valid keys and, for tile-map (TMA) blocks,
** the box's origin: the producer's TMA coordinates, and the consumers'
** positional mask where the box runs past the canvas. */
struct BlkInfo {
  int cnt, posmask, t0, h0, w0;
};

/* Block i's info by divisions (the gather producer; item_blocks steps). */
template <int BK, class P>
__device__ __forceinline__ BlkInfo block_info(const P &a, const KeyPlan &p, int i) {
  BlkInfo r;
  r.posmask = 0;
  r.t0 = r.h0 = r.w0 = 0;
  if (a.tma && !p.text && i < p.n_tblk) {
    tma_block_origin<BK>(a, p, i, &r.t0, &r.h0, &r.w0);
    int nt = min(BK / 64, a.cT - r.t0), nh = min(8, a.cH - r.h0),
        nw = min(8, a.cW - r.w0);
    r.cnt = nt > 0 ? nt * nh * nw : 0;
    r.posmask = r.cnt > 0 && r.cnt < BK;
  } else {
    (void)key_row<BK>(a, p, i, 0, &r.cnt);
  }
  return r;
}

/* The producer publishes each block's BlkInfo with its stage (written
** before its arrive on the full barrier, read after the consumers' wait),
** so the consumers do not redo the divisions of block_info. */
__device__ __forceinline__ int4 pack_binfo(const BlkInfo &b) {
  return make_int4(b.cnt | (b.posmask << 30), b.t0, b.h0, b.w0);
}
__device__ __forceinline__ BlkInfo get_binfo(const int4 *bi) {
  int x, y, z, w;
  asm volatile("ld.shared.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(x), "=r"(y), "=r"(z), "=r"(w)
               : "r"(smem_u32(bi))
               : "memory");
  BlkInfo r;
  r.cnt = x & 0xffff;
  r.posmask = (x >> 30) & 1;
  r.t0 = y;
  r.h0 = z;
  r.w0 = w;
  return r;
}

/* Every key block of plan p in order, as put(bi, mode, row0): a text query
** block's rows [0, V + text_len) (mode 2: rows from row0; in the tiled
** order only without padding rows, V = VR), else the window's tile blocks
** of BK / 64 t-slices (mode 1: the box at bi's origin; tiled order: mode
** 2, the box's run of rows), their coordinates stepped like an odometer
** (no divisions per block), then the text rows (mode 2).  8x8 tiles (the
** TMA boxes). */
template <int BK, class P, typename F>
__device__ __forceinline__ void item_blocks(const P &a, const KeyPlan &p, F &&put) {
  BlkInfo bi;
  bi.t0 = bi.h0 = bi.w0 = 0;
  bi.posmask = 0;
  if (p.text) { /* rows [0, V + text_len) */
    const int lim = a.V + a.text_len;
    for (int r0 = 0; r0 < lim; r0 += BK) {
      bi.cnt = min(BK, lim - r0);
      put(bi, 2, r0);
    }
    return;
  }
  const int hb = p.sh * 8, wb = p.sw * 8;
  int ti = p.st, blk = 0, i1 = 0, i2 = 0;
  bi.t0 = ti * a.tt;
  bi.h0 = hb;
  bi.w0 = wb;
  for (int kb = 0; kb < p.n_tblk; kb++) {
    const int nt = min(BK / 64, a.cT - bi.t0), nh = min(8, a.cH - bi.h0),
              nw = min(8, a.cW - bi.w0);
    bi.cnt = nt > 0 ? nt * nh * nw : 0;
    bi.posmask = bi.cnt > 0 && bi.cnt < BK;
    if (a.tiled)
      put(bi, 2, ((ti * a.NH + (bi.h0 >> 3)) * a.NW + (bi.w0 >> 3)) * a.tile_vol +
                     blk * BK);
    else
      put(bi, 1, 0);
    if (++blk < p.bpt) {
      bi.t0 += BK / 64;
      continue;
    }
    blk = 0;
    if (++i2 < p.cw) {
      bi.w0 += 8;
    } else {
      i2 = 0;
      bi.w0 = wb;
      if (++i1 < p.ch) {
        bi.h0 += 8;
      } else {
        i1 = 0;
        bi.h0 = hb;
        ti++;
      }
    }
    bi.t0 = ti * a.tt;
  }
  bi.t0 = bi.h0 = bi.w0 = 0;
  bi.posmask = 0;
  for (int r0 = 0; r0 < a.text_len; r0 += BK) {
    bi.cnt = min(BK, a.text_len - r0);
    put(bi, 2, a.VR + r0);
  }
}

} /* namespace sta */

#endif
