/*
** producer_fwd.cuh -- the forward's producer warpgroup: Q and the K/V key
** blocks of each work item into shared memory, signalled on mbarriers.
** Where TMA takes every load (8x8 tiles with an even depth, 16-byte aligned
** rows, an addressable (batch, head)), one thread runs it all
** (produce_tma); otherwise the 128 threads gather by cp.async what TMA
** cannot take (produce_gather, the Square kernels only).
** L2 policy of the TMA loads: K and V evict_last, Q evict_first (and the
** output, store_o): every item of a head reads the same key blocks, Q and
** O are read or written once (FA3 loads K and V with EVICT_LAST too).
*/
#ifndef STA_PRODUCER_FWD_CUH
#define STA_PRODUCER_FWD_CUH

#include "kernel_traits.cuh"
#include "mma.cuh"
#include "tile_scheduler.cuh"

namespace sta {

constexpr int BW = 128; /* keys of a block of the 128-row maps and the gather */

/* Rows rowtab[0 .. nrows) of g (row stride ss) into a swizzled R-row tile
** at s, zeros for -1; vec: 16-byte cp.async (the caller commits), else
** element loads. */
template <typename T, int D, int NTH>
__device__ __forceinline__ void load_rows_sw(T *s, int R, const T *g,
                                             int64_t ss, const int *rowtab,
                                             int nrows, int tid, int vec) {
  constexpr int CH = D / 8;
  for (int c = tid; c < nrows * CH; c += NTH) {
    int r = c / CH, ch = c % CH, row = rowtab[r];
    T *dst = s + swz(r, ch, R);
    if (vec) {
      const T *src = row >= 0 ? g + (int64_t)row * ss + ch * 8 : g;
      cp_async16(smem_u32(dst), src, row >= 0 ? 16 : 0);
    } else {
      uint4 tmp = make_uint4(0, 0, 0, 0);
      uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
      if (row >= 0) {
        const uint16_t *src = reinterpret_cast<const uint16_t *>(
            g + (int64_t)row * ss + ch * 8);
#pragma unroll
        for (int e = 0; e < 8; e++) t16[e] = src[e];
      }
      *reinterpret_cast<uint4 *>(dst) = tmp;
    }
  }
}

/* How key block kb of an item is loaded: 1 tile map, 2 row map (first row
** *row0), 0 cp.async gather.  Tiled order: a tile block is a run of rows;
** a text query's keys are rows [0, V + text_len) only without padding
** rows (V = VR), else gathered. */
__device__ __forceinline__ int block_mode(const FwdParams &a, const Item &x,
                                          int kb, int *row0) {
  if (x.text) {
    *row0 = kb * BW;
    return a.tma_rows && a.VR == a.V ? 2 : 0;
  }
  if (kb < x.p.n_tblk) {
    if (!a.tma) return 0;
    if (!a.tiled) return 1;
    *row0 = tile_block_row<BW>(a, x.p, kb);
    return 2;
  }
  *row0 = a.VR + (kb - x.p.n_tblk) * BW;
  return a.tma_rows ? 2 : 0;
}

/* An item's Q tile by TMA (row map for text rows and in the tiled order,
** tile map otherwise), signalled on qfull; one thread; evict_first. */
template <typename T, int D, int BR = 128>
__device__ __forceinline__ void tma_load_q(const FwdParams &a, const Item &x, T *sQ,
                                           int c0, int c4, uint64_t *qfull) {
  const CUtensorMap *rm = BR == 128 ? &a.rmq : &a.rmq3, *tm = BR == 128 ? &a.tmq : &a.tmq3;
  const uint64_t pol = l2_policy<1>();
  mbar_expect_tx(qfull, BR * D * (int)sizeof(T));
#pragma unroll
  for (int hf = 0; hf < D / 64; hf++) {
    if (x.text)
      tma_load_3d<true>(sQ + hf * BR * 64, rm, c0 + hf * 64, a.VR + x.qrow0, c4, qfull, pol);
    else if (a.tiled) /* qrow0: the item's first t-slice of the tile */
      tma_load_3d<true>(sQ + hf * BR * 64, rm, c0 + hf * 64,
                        x.qtile * a.tile_vol + x.qrow0 * 64, c4, qfull, pol);
    else
      tma_load_5d<true>(sQ + hf * BR * 64, tm, c0 + hf * 64, x.qw0, x.qh0,
                        x.qt0 + x.qrow0, c4, qfull, pol);
  }
}

/* One 64-column half of a key block by TMA onto bar: a tile block (mode 1:
** tile map tm at bi's origin) or the block's rows from row0 (row map rm);
** evict_last. */
template <typename T>
__device__ __forceinline__ void tma_load_half(T *dst, const CUtensorMap *tm,
                                              const CUtensorMap *rm, const BlkInfo &bi,
                                              int mode, int row0, int c, int c4,
                                              uint64_t *bar) {
  const uint64_t pol = l2_policy<2>();
  if (mode == 1)
    tma_load_5d<true>(dst, tm, c, bi.w0, bi.h0, bi.t0, c4, bar, pol);
  else
    tma_load_3d<true>(dst, rm, c, row0, c4, bar, pol);
}

/* K and V of one key block by TMA into a stage, signalled on bar; one
** thread.  mode 1: tile maps at the box origin (bi.t0, bi.h0, bi.w0); else
** row maps at row0. */
template <typename T, int D>
__device__ __forceinline__ void tma_load_kv(const FwdParams &a, T *dk, T *dv,
                                            const BlkInfo &bi, int mode, int row0,
                                            int c0, int c4, uint64_t *bar) {
  mbar_expect_tx(bar, 2 * BW * D * (int)sizeof(T));
#pragma unroll
  for (int hf = 0; hf < D / 64; hf++) {
    tma_load_half<T>(dk + hf * BW * 64, &a.tmk, &a.rmk, bi, mode, row0, c0 + hf * 64, c4, bar);
    tma_load_half<T>(dv + hf * BW * 64, &a.tmv, &a.rmv, bi, mode, row0, c0 + hf * 64, c4, bar);
  }
}

/* The producer where every load goes by TMA, run by one thread: takes items,
** loads each item's Q, then its key blocks through the ring(s).  The tile
** blocks are visited in the order of tma_block_origin by stepping the
** coordinates (item_blocks), so no block costs an integer division.  Split
** rings: K(j) and V(j) are issued together (fewer registers in this thread,
** which spills at 24); V(j) waits for V(j - 2)'s release, after PV(j - 2),
** and K(j + 1) behind it for K(j - 1)'s, after S(j - 1).  PERSIST: an
** item's keys wait at the wave gate (tile_scheduler.cuh) when the launch
** set one. */
template <class K, bool PERSIST>
__device__ __forceinline__ void produce_tma(const FwdParams &a, const FwdSmem<K> &sm) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, STAGES = K::STAGES;
  int g = 0, s = 0, n = 0; /* blocks so far; their stage and lap */
  auto put = [&](const BlkInfo &bi, int mode, int row0, int c0, int c4) {
    if constexpr (K::SPLIT) {
      constexpr int BYTES = BK * D * (int)sizeof(T); /* one of K, V */
      auto load = [&](T *dst, const CUtensorMap *tm, const CUtensorMap *rm, uint64_t *bar) {
        mbar_expect_tx(bar, BYTES);
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++)
          tma_load_half<T>(dst + hf * BK * 64, tm, rm, bi, mode, row0, c0 + hf * 64, c4, bar);
      };
      const int sk = g % STAGES;
      if (g >= STAGES) mbar_wait(&sm.kempty[sk], (g / STAGES - 1) & 1);
      sm.binfo[sk] = pack_binfo(bi);
      load(sm.k + sk * BK * D, &a.tmk3, &a.rmk3, &sm.kfull[sk]);
      if (g >= STAGES) mbar_wait(&sm.vempty[sk], (g / STAGES - 1) & 1);
      load(sm.v + sk * BK * D, &a.tmv3, &a.rmv3, &sm.vfull[sk]);
      g++;
    } else {
      if (g >= STAGES) mbar_wait(&sm.kempty[s], (n - 1) & 1);
      sm.binfo[s] = pack_binfo(bi);
      tma_load_kv<T, D>(a, sm.k + s * BK * D, sm.v + s * BK * D, bi, mode, row0, c0, c4,
                        &sm.kfull[s]);
      g++;
      if (++s == STAGES) {
        s = 0;
        n++;
      }
    }
  };
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    const int item = next_item<PERSIST, PERSIST ? 3 : 2>(a, k); /* 3: the gate's count */
    *sm.sitem = item;
    if (item < 0) {
      mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      return;
    }
    Item x;
    decode_item<K::BR, BK>(a, item, x);
    if (x.qcount <= 0) {
      mbar_arrive(sm.qfull);
      if constexpr (PERSIST) wave_loaded(a);
      continue;
    }
    const int c0 = a.tma_fused ? x.head * D : 0;
    const int c4 = a.tma_fused ? x.b : x.b * a.heads + x.head;
    tma_load_q<T, D, K::BR>(a, x, sm.q, c0, c4, sm.qfull);
    if constexpr (PERSIST) wave_gate(a, item, x.p.nkb);
    item_blocks<BK>(a, x.p, [&](const BlkInfo &bi, int mode, int row0) {
      put(bi, mode, row0, c0, c4);
    });
    if constexpr (PERSIST) wave_loaded(a);
  }
}

/* The producer for what TMA cannot load (K::GATHER kernels; other tiles,
** strides TMA cannot take), all 128 threads of the producer warpgroup
** (pt: this thread's index there): TMA where a block or Q allows it, else
** a cp.async gather of the rows by coordinate. */
template <class K, bool PERSIST>
__device__ __forceinline__ void produce_gather(const FwdParams &a, const FwdSmem<K> &sm,
                                               const int pt) {
  using T = typename K::T;
  constexpr int D = K::D, BR = K::BR, STAGES = K::STAGES, PTH = 128;
  T *const sQ = sm.q, *const sK = sm.k, *const sV = sm.v;
  uint64_t *const full = sm.kfull, *const empty = sm.kempty;
  int *const rowtab = sm.rowtab, *const qrow = sm.qrow;
  int g = 0; /* key blocks through the ring so far */
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    bar_named(3, PTH); /* every producer thread has read the last sitem */
    if (pt == 0) *sm.sitem = next_item<PERSIST>(a, k);
    bar_named(3, PTH);
    const int item = *sm.sitem;
    if (item < 0) {
      if (pt == 0) mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      break;
    }
    Item x;
    decode_item(a, item, x);
    if (x.qcount <= 0) {
      if (pt == 0) mbar_arrive(sm.qfull);
      continue;
    }
    const int c0 = a.tma_fused ? x.head * D : 0;
    const int c4 = a.tma_fused ? x.b : x.b * a.heads + x.head;
    const T *gq = reinterpret_cast<const T *>(a.q) + x.b * a.q_sb + x.head * a.q_sh;
    const T *gk = reinterpret_cast<const T *>(a.k) + x.b * a.k_sb + x.head * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + x.b * a.v_sb + x.head * a.v_sh;
    /* Q */
    if ((a.tma_q && !x.text) || (a.tma_rows && x.text)) {
      if (pt == 0) tma_load_q<T, D>(a, x, sQ, c0, c4, sm.qfull);
    } else {
      for (int r = pt; r < BR; r += PTH) qrow[r] = q_row(a, x, r);
      bar_named(3, PTH);
      load_rows_sw<T, D, PTH>(sQ, BR, gq, a.q_ss, qrow, BR, pt, a.vec);
      cp_async_commit();
      cp_async_wait_all();
      fence_proxy_async();
      bar_named(3, PTH);
      if (pt == 0) mbar_arrive(sm.qfull);
    }
    /* keys: a gather block is signalled once the next one is under way */
    int pend = -1;
    for (int kb = 0; kb < x.p.nkb; kb++, g++) {
      const int s = g % STAGES, n = g / STAGES;
      /* the block's bookkeeping (integer divisions) before the wait for
      ** its stage, not between the consumers' release and the loads */
      BlkInfo bi = {0, 0, 0, 0, 0};
      if (pt == 0) bi = block_info<BW>(a, x.p, kb); /* with the tile box's origin */
      int row0 = 0;
      const int mode = block_mode(a, x, kb, &row0);
      if (g >= STAGES) mbar_wait(&empty[s], (n - 1) & 1);
      if (pt == 0) sm.binfo[s] = pack_binfo(bi);
      if (mode) {
        if (pend >= 0) {
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(&full[pend]);
          pend = -1;
        }
        if (pt == 0) {
          tma_load_kv<T, D>(a, sK + s * BW * D, sV + s * BW * D, bi, mode, row0, c0, c4,
                            &full[s]);
        } else {
          mbar_arrive(&full[s]);
        }
        continue;
      }
      int *rt = rowtab + (g & 1) * BW;
      int c;
      if (pt < BW) rt[pt] = key_row<BW>(a, x.p, kb, pt, &c);
      bar_named(3, PTH);
      load_rows_sw<T, D, PTH>(sK + s * BW * D, BW, gk, a.k_ss, rt, BW, pt, a.vec);
      load_rows_sw<T, D, PTH>(sV + s * BW * D, BW, gv, a.v_ss, rt, BW, pt, a.vec);
      cp_async_commit();
      if (pend >= 0) {
        cp_async_wait_1();
        fence_proxy_async();
        mbar_arrive(&full[pend]);
      }
      pend = s;
    }
    if (pend >= 0) {
      cp_async_wait_all();
      fence_proxy_async();
      mbar_arrive(&full[pend]);
    }
  }
}

} /* namespace sta */

#endif
