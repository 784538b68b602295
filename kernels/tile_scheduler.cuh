/*
** tile_scheduler.cuh -- the forward's work items and the persistent
** scheduler.  Items are numbered longest first: the text query blocks of
** every (batch, head) (dense over all keys), then, head by head in horder
** (largest window first) and batch by batch, the query blocks of the
** tiles.  A CTA takes one item (grid of n_items) or, persistent, takes
** items from a global counter until none is left (next_item); the host
** side (tile_scheduler.cu) counts the items and hands each launch its
** counters.  Also the device side of the STA_FWD_L2 experiments
** (fwd_l2_bf16_d128.cu): L2 policies and the wave gate.
*/
#ifndef STA_TILE_SCHEDULER_CUH
#define STA_TILE_SCHEDULER_CUH

#include "block_walk.cuh"
#include "params.h"

namespace sta {

struct Item {
  int b, head, text;
  int qrow0, qcount;   /* text: rows VR + qrow0 + r; tile: see q_row */
  int qtile;           /* the query tile's id (it*NH + ih)*NW + iw */
  int qt0, qh0, qw0, qet, qeh, qew;
  KeyPlan p;           /* its keys in blocks of BK */
};

/* Item number item of items of BR query rows, keys in blocks of BK. */
template <int BR = 128, int BK = 128>
__device__ __forceinline__ void decode_item(const FwdParams &a, int item, Item &x) {
  KeyPlan &p = x.p;
  x.qt0 = x.qh0 = x.qw0 = x.qet = x.qeh = x.qew = x.qtile = 0;
  if (item < a.n_text_items) {
    int hb = item / a.n_text_qblocks, tb = item - hb * a.n_text_qblocks;
    x.head = hb % a.heads;
    x.b = hb / a.heads;
    x.text = 1;
    x.qrow0 = tb * BR;
    x.qcount = min(BR, a.S - a.VR - x.qrow0);
    p.text = 1;
    p.st = p.sh = p.sw = p.ct = p.ch = p.cw = p.bpt = p.n_tblk = 0;
    p.nkb = (a.V + a.text_len + BK - 1) / BK;
    return;
  }
  const int per = a.NT * a.NH * a.NW * a.qbpt;
  int j = item - a.n_text_items;
  int hb = j / per, vb = j - hb * per;
  x.b = hb % a.batch;
  x.head = a.horder[hb / a.batch];
  x.text = 0;
  int tl = vb / a.qbpt, qb = vb - tl * a.qbpt;
  x.qtile = tl;
  int it = tl / (a.NH * a.NW), rem = tl - it * (a.NH * a.NW);
  int ih = rem / a.NW, iw = rem - ih * a.NW;
  x.qt0 = it * a.tt;
  x.qh0 = ih * a.th;
  x.qw0 = iw * a.tw;
  x.qet = min(a.tt, a.cT - x.qt0);
  x.qeh = min(a.th, a.cH - x.qh0);
  x.qew = min(a.tw, a.cW - x.qw0);
  if (a.tma_q) { /* box layout: t-slices qrow0 .. qrow0 + BR / 64 - 1 of the 8x8 tile */
    x.qrow0 = (BR / 64) * qb;
    x.qcount = max(0, min(BR / 64, x.qet - x.qrow0)) * x.qeh * x.qew;
  } else {
    x.qrow0 = qb * BR;
    x.qcount = min(BR, x.qet * x.qeh * x.qew - x.qrow0);
  }
  p.text = 0;
  window_plan(a, x.head, it, ih, iw, BK, &p);
}

/* Global row of query row r (< the item's rows, 128 or 192) of an item, or
** -1 (past the canvas: no token, nothing stored; the tiled order's padding
** rows are written apart, tiled_pad.cu). */
__device__ __forceinline__ int q_row(const FwdParams &a, const Item &x, int r) {
  if (x.text) return r < x.qcount ? a.VR + x.qrow0 + r : -1;
  int dt, dh, dw;
  if (a.tma_q) {
    dt = x.qrow0 + (r >> 6), dh = (r >> 3) & 7, dw = r & 7;
    if (dt >= x.qet || dh >= x.qeh || dw >= x.qew) return -1;
  } else {
    if (r >= x.qcount) return -1;
    int li = x.qrow0 + r, ehw = x.qeh * x.qew;
    dt = li / ehw;
    int rr = li - dt * ehw;
    dh = rr / x.qew, dw = rr - dh * x.qew;
  }
  return tok_row(a, x.qtile, x.qt0, x.qh0, x.qw0, dt, dh, dw);
}

/* The producer's next work item (k: items taken so far), or -1 when none
** is left; the last CTA out resets the persistent kernel's NC counters
** (sched_slot's 4: next item, CTAs done, 2 more for the kernel). */
template <bool PERSIST, int NC = 2, class P>
__device__ __forceinline__ int next_item(const P &a, int k) {
  int item = k == 0 ? (int)blockIdx.x
                    : (PERSIST ? atomicAdd(a.sched, 1) + (int)gridDim.x : -1);
  if (item >= a.n_items) item = -1;
  if (item < 0 && PERSIST && atomicAdd(a.sched + 1, 1) == (int)gridDim.x - 1) {
#pragma unroll
    for (int i = 0; i < NC; i++) a.sched[i] = 0;
  }
  return item;
}

/* ---- the STA_FWD_L2 experiments (K::L2X kernels; a.l2's bits) ---------- */

/* Q's and the output's L2 policy: evict_first under bits 1 and 4 (read or
** written once: they leave room for the keys), else evict_normal. */
__device__ __forceinline__ uint64_t l2_policy_q(const FwdParams &a) {
  return a.l2 & 5 ? l2_policy<1>() : l2_policy<0>();
}

/* A K/V block's L2 policy: bit 4 (pin) evict_last for the blocks of the
** first l2_pin_t frames of the head (rows below l2_pin_row; the text
** rows: every item reads them) and evict_normal for the rest, so that the
** same part of a head's keys stays in the L2 however far apart the CTAs
** walking them are; else bit 1 evict_last for every block (FA3's choice),
** else evict_normal. */
__device__ __forceinline__ uint64_t l2_policy_kv(const FwdParams &a, const BlkInfo &bi,
                                                 int mode, int row0) {
  if (a.l2 & 4) {
    const bool pin = mode == 1 ? bi.t0 < a.l2_pin_t : row0 < a.l2_pin_row || row0 >= a.VR;
    return pin ? l2_policy<2>() : l2_policy<0>();
  }
  return a.l2 & 1 ? l2_policy<2>() : l2_policy<0>();
}

/* Bit 2, the wave gate: an item of at least l2_gate_nkb key blocks starts
** loading its keys only once as many items as come before its wave (waves
** of gridDim.x items in item order) have issued their last loads
** (a.sched[2], l2_loaded), so the CTAs of one wave, which walk the same
** keys of a head, start them together instead of drifting apart across
** the launch.  The wait gives up after 2^18 clocks (CTAs not resident, a
** slow wave); it moves only when keys are read, never what an item
** computes. */
__device__ __forceinline__ void l2_gate(const FwdParams &a, int item, int nkb) {
  const int before = item / (int)gridDim.x * (int)gridDim.x;
  if (!(a.l2 & 2) || before == 0 || nkb < a.l2_gate_nkb) return;
  const long long t0 = clock64();
  while (ld_acquire(a.sched + 2) < before && clock64() - t0 < (1ll << 18)) __nanosleep(64);
}
/* Bit 2: this item's loads are issued (before the CTA's next next_item,
** whose last CTA resets the count). */
__device__ __forceinline__ void l2_loaded(const FwdParams &a) {
  if (a.l2 & 2) {
    atomicAdd(a.sched + 2, 1);
    __threadfence();
  }
}

/* ---- host ---------------------------------------------------------------- */

/* The persistent kernel's counters for one launch: *slot = four zeroed
** ints that the launch's last CTA zeroes again (next_item), or NULL
** (launch one CTA per item) when the first launch on a device is being
** captured into a graph, where they cannot be allocated. */
sta_status sched_slot(int **slot);
/* The work items of a launch with BR-row query items (a.qbpt set by the
** caller): text query blocks first, then the tiles' query blocks; sets
** a.n_text_qblocks, a.n_text_items, a.n_items (0: nothing to launch). */
sta_status count_items(FwdParams &a, int BR);

} /* namespace sta */

#endif
