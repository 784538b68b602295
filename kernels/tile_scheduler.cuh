/*
** tile_scheduler.cuh -- the forward's work items and the persistent
** scheduler.  Items are numbered longest first: the text query blocks of
** every (batch, head) (dense over all keys), then, head by head in horder
** (largest window first) and batch by batch, the query blocks of the
** tiles.  A CTA takes one item (grid of n_items) or, persistent, takes
** items from a global counter until none is left (next_item); the host
** side (tile_scheduler.cu) counts the items and hands each launch its
** counters.  Also the persistent forward's wave gate.
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

/* ---- the wave gate (the persistent forward's produce_tma) ------------------
** Where items walk more keys than the L2 keeps well (hunyuan-720p's full
** window: 602 blocks of 192 keys, 59 MB of K and V a head, the H200's L2
** 50 MB), the L2 serves a key block to every CTA of the head that reads it
** before it is evicted, so what it keeps depends on how far apart in the
** walk those CTAs are; items there are all alike, so a CTA's phase persists
** from item to item and small differences in speed accumulate.  The gate
** makes the items of a wave (items [w G, w G + G), G the grid) start their
** keys together: an item of at least a.gate_nkb key blocks (0: no gate;
** launch_fwd sets it from WAVE_GATE_BYTES) starts loading its keys only
** once every item before its wave has issued its last loads (a.sched[2],
** counted by wave_loaded).  Then each key block comes from DRAM about
** once a wave.  It moves only when keys are read, never what an item
** computes or in which order: the output's bits do not depend on it. */

/* Wait (this producer thread) until the items before item's wave have
** issued their loads, or 2^18 clocks have passed: a CTA of the grid may
** not be resident yet (another kernel on the SMs) or a wave may be slow;
** the gate only delays, it never waits for more than that. */
__device__ __forceinline__ void wave_gate(const FwdParams &a, int item, int nkb) {
  const int before = item / (int)gridDim.x * (int)gridDim.x;
  if (!a.gate_nkb || before == 0 || nkb < a.gate_nkb) return;
  const long long t0 = clock64();
  while (ld_acquire(a.sched + 2) < before && clock64() - t0 < (1ll << 18)) __nanosleep(64);
}
/* This item's loads are issued (called before the CTA's next next_item,
** whose last CTA resets the count). */
__device__ __forceinline__ void wave_loaded(const FwdParams &a) {
  if (a.gate_nkb) {
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

/* The wave gate's threshold: items whose K and V are at least this many
** bytes wait for their wave.  A head's K/V stream larger than a good part
** of the 50 MB L2 is read again from DRAM whenever the persistent CTAs
** walking it drift apart; the gate keeps a wave together (kernels/
** README.md: on the H200, hunyuan-720p's full window, 59 MB an item, read
** 359 GB from DRAM without it, 13 GB with it).  wan-720p 3,6,10 (35 MB an
** item) is gated too; hunyuan-720p 3,3,3 (5.4 MB) is not. */
constexpr int64_t WAVE_GATE_BYTES = (int64_t)16 << 20;
/* a.gate_nkb for a persistent launch of grid CTAs over a's items (counted)
** in key blocks of bk keys, blk bytes of K and V each: the blocks of
** WAVE_GATE_BYTES (or the tests' sta_cuda_wave_gate_test), 0 where no item
** can reach it or all items fit in one wave. */
int wave_gate_nkb(const FwdParams &a, int grid, int bk, int64_t blk);

} /* namespace sta */

#endif
