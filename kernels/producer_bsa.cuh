/*
** producer_bsa.cuh -- the block-sparse forward's producer warpgroup: takes
** work items (persistent: the scheduler's counter), counts each item's key
** blocks, loads its Q and streams its key blocks (the list's, for the union
** the window's tiles first) through the ring.  TMA: warp 0 walks the list
** (32 entries at a time, the next 32 read while these are issued) and its
** lane 0 issues every load; else the 128 threads gather rows by cp.async.
** Where each key block is read from and which of its columns are masked:
** bsa_walk.h.
*/
#ifndef STA_PRODUCER_BSA_CUH
#define STA_PRODUCER_BSA_CUH

#include "bsa_params.h"
#include "bsa_traits.cuh"
#include "bsa_walk.h"
#include "mma.cuh"
#include "tile_scheduler.cuh" /* next_item */

namespace sta {

__device__ __forceinline__ void tma_load_4d(void *dst, const CUtensorMap *m, int c0, int c1,
                                            int c2, int c3, uint64_t *bar, uint64_t pol) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::"
      "cache_hint [%0], [%1, {%2, %3, %4, %5}], [%6], %7;\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_u32(bar)), "l"(pol)
      : "memory");
}

/* Rows row0 + r (r < R; negative or r >= nvalid: zeros) of g (row stride
** ss) into a swizzled R-row tile at s, by NTH threads (tid); vec: 16-byte
** cp.async (the caller commits and waits), else element loads. */
template <typename T, int D, int NTH>
__device__ __forceinline__ void gather_rows(T *s, int R, const T *g, int64_t ss, int64_t row0,
                                            int lo, int nvalid, int tid, int vec) {
  constexpr int CH = D / 8;
  for (int c = tid; c < R * CH; c += NTH) {
    const int r = c / CH, ch = c - r * CH;
    const bool ok = r >= lo && r < nvalid;
    T *dst = s + swz(r, ch, R);
    const T *src = g + (ok ? (row0 + r) * ss + ch * 8 : 0);
    if (vec) {
      cp_async16(smem_u32(dst), src, ok ? 16 : 0);
    } else {
      uint4 tmp = make_uint4(0, 0, 0, 0);
      if (ok) {
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(src);
        uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
#pragma unroll
        for (int e = 0; e < 8; e++) t16[e] = s16[e];
      }
      *reinterpret_cast<uint4 *>(dst) = tmp;
    }
  }
}

/* The key blocks an item walks: the list's entries, for the union first
** the window's tiles and then the list's other entries. */
struct BsaEntries {
  const int32_t *lst; /* the item's list row */
  int nl, nw;         /* list entries; window tiles (0 but for the union) */
  int st[3], kw[3];   /* the union's window box */
};

/* Entry e: its block *n and valid rows (0: not walked, a list entry the
** window holds). */
__device__ __forceinline__ int bsa_entry(const BsaParams &a, const BsaEntries &w, int e,
                                         int *n) {
  if (e < w.nw) {
    *n = bsa_window_tile(e, a.grid, w.st, w.kw);
  } else {
    *n = w.lst[e - w.nw];
    if (a.uni && bsa_window_has(*n, a.grid, w.st, w.kw)) return 0;
  }
  return a.kv_sizes ? a.kv_sizes[*n] : a.bv;
}

template <class K>
__device__ __forceinline__ void bsa_produce(const BsaParams &a, const BsaSmem<K> &sm,
                                            const int pt) {
  using T = typename K::T;
  constexpr int D = K::D, BK = K::BK, QR = K::QR, ST = K::STAGES;
  constexpr uint32_t FULL = 0xffffffffu;
  const int tma = a.tma;
  if (tma && pt >= 32) return; /* warp 0 walks, lane 0 issues */
  const int np = tma ? 32 : 128, lane = pt & 31;
  const uint64_t pol_k = l2_policy<2>(), pol_q = l2_policy<1>();
  int g = 0; /* key blocks through the ring so far */
  for (int k = 0;; k++) {
    if (k > 0) mbar_wait(sm.qempty, (k - 1) & 1);
    bar_named(3, np); /* every producer thread has read the last item */
    if (pt == 0) sm.sitem[0] = a.sched ? next_item<true>(a, k) : next_item<false>(a, k);
    bar_named(3, np);
    const int item = sm.sitem[0];
    if (item < 0) {
      if (pt == 0) mbar_arrive(sm.qfull); /* the consumers read -1 and stop */
      return;
    }
    int b, h, m, part;
    bsa_item(item, a.Mq, a.parts, a.heads, &b, &h, &m, &part);
    const int64_t row = ((int64_t)b * a.heads + h) * a.Mq + m;
    const int qv = bsa_part_rows(a.q_sizes ? a.q_sizes[m] : a.bv, part, QR);
    BsaEntries w;
    w.lst = a.idx + row * a.L;
    w.nl = qv > 0 ? a.num[row] : 0;
    w.nw = 0;
    if (a.uni && qv > 0) {
      bsa_window_box(m, a.grid, a.win + 3 * h, w.st, w.kw);
      w.nw = w.kw[0] * w.kw[1] * w.kw[2];
    }
    const int ne = w.nw + w.nl;
    /* the item's key blocks, for the consumers (warp 0 counts) */
    if (pt < 32) {
      int cnt;
      if (!a.uni && (BK == a.bv || !a.kv_sizes)) {
        cnt = ne * (a.bv / BK);
      } else {
        cnt = 0;
        for (int e = lane; e < ne; e += 32) {
          int n;
          const int s = bsa_entry(a, w, e, &n);
          cnt += s > 0 ? bsa_subs(s, BK) : 0;
        }
        cnt = __reduce_add_sync(FULL, cnt);
      }
      if (pt == 0) {
        sm.sitem[1] = cnt;
        sm.sitem[2] = qv;
      }
      if (cnt == 0) w.nl = w.nw = 0; /* nothing to load: no Q either */
    }
    const int c0 = a.tma_fused ? h * D : 0, c4 = a.tma_fused ? b : b * a.heads + h;
    const int64_t qrow0 = (int64_t)m * a.bv + (int64_t)part * QR;
    if (tma) {
      if (pt == 0) {
        if (w.nl + w.nw == 0) {
          mbar_arrive(sm.qfull);
        } else {
          mbar_expect_tx(sm.qfull, QR * D * (int)sizeof(T));
#pragma unroll
          for (int hf = 0; hf < D / 64; hf++)
            tma_load_3d<true>(sm.q + hf * QR * 64, &a.tmq, c0 + hf * 64, (int)qrow0, c4, sm.qfull,
                              pol_q);
        }
      }
    } else {
      bar_named(3, np); /* warp 0's count is in shared memory */
      const int cnt = sm.sitem[1];
      if (cnt > 0) {
        const T *gq = reinterpret_cast<const T *>(a.q) + (int64_t)b * a.q_sb + (int64_t)h * a.q_sh;
        gather_rows<T, D, 128>(sm.q, QR, gq, a.q_ss, qrow0, 0, qv, pt, a.vec);
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();
      }
      bar_named(3, np);
      if (pt == 0) mbar_arrive(sm.qfull);
      if (cnt == 0) continue;
    }
    if (tma && __shfl_sync(FULL, w.nl + w.nw, 0) == 0) continue;

    /* the key blocks */
    const T *gk = reinterpret_cast<const T *>(a.k) + (int64_t)b * a.k_sb + (int64_t)h * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + (int64_t)b * a.v_sb + (int64_t)h * a.v_sh;
    auto put = [&](int n, int r0, int lo) {
      const int s = g % ST;
      if (g >= ST) mbar_wait(&sm.kempty[s], ((g / ST) - 1) & 1);
      T *dk = sm.k + s * BK * D, *dv = sm.v + s * BK * D;
      if (tma) {
        sm.lo[s] = lo;
        mbar_expect_tx(&sm.kfull[s], 2 * BK * D * (int)sizeof(T));
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++) {
          tma_load_4d(dk + hf * BK * 64, &a.tmk, c0 + hf * 64, r0, n, c4, &sm.kfull[s], pol_k);
          tma_load_4d(dv + hf * BK * 64, &a.tmv, c0 + hf * 64, r0, n, c4, &sm.kfull[s], pol_k);
        }
      } else {
        if (pt == 0) sm.lo[s] = lo;
        const int64_t r = (int64_t)n * a.bv + r0; /* rows lo.. only: the others are masked */
        gather_rows<T, D, 128>(dk, BK, gk, a.k_ss, r, lo, BK, pt, a.vec);
        gather_rows<T, D, 128>(dv, BK, gv, a.v_ss, r, lo, BK, pt, a.vec);
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();
        mbar_arrive(&sm.kfull[s]); /* 128 arrivals */
      }
      g++;
    };
    /* entries in chunks of 32, one per lane; the next chunk's reads are
    ** issued before this one's blocks */
    int nx = 0, sx = 0;
    if (lane < ne) sx = bsa_entry(a, w, lane, &nx);
    for (int e0 = 0; e0 < ne; e0 += 32) {
      const int nc = nx, sc = sx;
      nx = sx = 0;
      if (e0 + 32 + lane < ne) sx = bsa_entry(a, w, e0 + 32 + lane, &nx);
      const int ec = min(32, ne - e0);
      for (int j = 0; j < ec; j++) {
        const int n = __shfl_sync(FULL, nc, j), s = __shfl_sync(FULL, sc, j);
        if (s <= 0) continue;
        const int nsub = bsa_subs(s, BK);
        for (int u = 0; u < nsub; u++) {
          int r0, lo;
          bsa_sub(s, u, BK, &r0, &lo);
          if (!tma || pt == 0) put(n, r0, lo);
          __syncwarp();
        }
      }
    }
  }
}

} /* namespace sta */

#endif
