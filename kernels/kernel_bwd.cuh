/*
** kernel_bwd.cuh -- the backward's main kernel: one CTA per (batch, head,
** key block of 128 keys), a producer warpgroup streaming the query blocks
** that see the key tile (TMA or a cp.async gather, LSE and D by bulk copy)
** and two consumer warpgroups of 64 keys each (S^T, dP^T, P, dS, dV, dK in
** registers; dQ, D / 2 columns per warpgroup over all 128 keys, through
** shared memory into the f32 accumulator).  See bwd_api.cu for the whole
** pass.
*/
#ifndef STA_KERNEL_BWD_CUH
#define STA_KERNEL_BWD_CUH

#include "bwd_slots.cuh"
#include "mma.cuh"

namespace sta {

/* One 16-byte chunk of row `row` (-1: zeros) into a swizzled tile. */
template <typename T>
__device__ __forceinline__ void load_chunk(T *dst, const T *g, int64_t ss, int row, int ch,
                                           int vec) {
  if (vec) {
    cp_async16(smem_u32(dst), row >= 0 ? g + (int64_t)row * ss + ch * 8 : g, row >= 0 ? 16 : 0);
    return;
  }
  uint4 tmp = make_uint4(0, 0, 0, 0);
  if (row >= 0) {
    const uint16_t *src = reinterpret_cast<const uint16_t *>(g + (int64_t)row * ss + ch * 8);
    uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
#pragma unroll
    for (int e = 0; e < 8; e++) t16[e] = src[e];
  }
  *reinterpret_cast<uint4 *>(dst) = tmp;
}

/* dQ is split by columns between the consumer warpgroups: each sums its W =
** D / 2 columns over all 128 keys (dq_w; one bulk reduce-add of 64 x W f32
** per warpgroup and query block).  Its B operand: K's column half at D
** 128; at D 64 a K^T copy (K-major, [D][BK]) built once per CTA. */
template <int D> struct Smem {
  static constexpr int W = dq_w(D);                        /* dQ columns per staged block */
  static constexpr int K = 0;
  static constexpr int V = K + BK * D * 2;
  static constexpr int KT = V + BK * D * 2;                /* D 64: [D][BK] */
  static constexpr int Q = KT + (D == 64 ? D * BK * 2 : 0); /* [STAGES][BQ][D] */
  static constexpr int DO = Q + STAGES * BQ * D * 2;       /* [STAGES][BQ][D] */
  static constexpr int DS = DO + STAGES * BQ * D * 2;      /* [2][BK][BQ] */
  static constexpr int DQ = DS + 2 * BK * BQ * 2;          /* [2 warpgroups][2][64][W] f32 */
  static constexpr int LSE = DQ + 4 * 64 * W * 4;          /* [STAGES][BQ] */
  static constexpr int DD = LSE + STAGES * BQ * 4;         /* [STAGES][BQ] */
  static constexpr int BAR = DD + STAGES * BQ * 4;         /* full[STAGES], empty[STAGES] */
  static constexpr int KROW = BAR + 2 * STAGES * 8;        /* [BK] */
  static constexpr int SLOT = KROW + BK * 4;               /* [STAGES]; then the block count */
  static constexpr int BYTES = SLOT + (STAGES + 1) * 4 + 1024; /* + alignment */
};

template <typename T, int D, bool DET>
__global__ void __launch_bounds__(NTH, 1) sta_bwd_kernel(const __grid_constant__ BwdArgs a) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  using L = Smem<D>;
  constexpr int W = L::W;
  T *sK = reinterpret_cast<T *>(base + L::K), *sV = reinterpret_cast<T *>(base + L::V);
  T *sKt = reinterpret_cast<T *>(base + L::KT);
  T *sQ = reinterpret_cast<T *>(base + L::Q), *sdO = reinterpret_cast<T *>(base + L::DO);
  T *sdS = reinterpret_cast<T *>(base + L::DS);
  float *sdQ = reinterpret_cast<float *>(base + L::DQ);
  float *slse = reinterpret_cast<float *>(base + L::LSE), *sdd = reinterpret_cast<float *>(base + L::DD);
  uint64_t *full = reinterpret_cast<uint64_t *>(base + L::BAR), *empty = full + STAGES;
  int *skrow = reinterpret_cast<int *>(base + L::KROW);
  int *sslot = reinterpret_cast<int *>(base + L::SLOT), *snblk = sslot + STAGES;
  constexpr int CH = D / 8; /* 16-byte chunks per row */

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;

  /* the work item: text key blocks of every (batch, head) first */
  const int item = blockIdx.x;
  int b, h, text, kb, kt = 0, khh = 0, kw = 0, kcount;
  const int n_text = a.batch * a.heads * a.n_text_kb;
  Ext ke;
  ke.t0 = ke.h0 = ke.w0 = ke.id = 0;
  ke.et = ke.eh = ke.ew = 1;
  if (item < n_text) {
    int bh = item / a.n_text_kb;
    kb = item - bh * a.n_text_kb;
    b = bh / a.heads;
    h = bh - b * a.heads;
    text = 1;
    kcount = min(BK, a.text_len - kb * BK);
  } else {
    int j = item - n_text, per = a.NT * a.NH * a.NW * a.kbpt;
    int bh = j / per, r = j - bh * per, tl = r / a.kbpt;
    b = bh / a.heads;
    h = bh - b * a.heads;
    kb = r - tl * a.kbpt;
    kt = tl / (a.NH * a.NW);
    khh = (tl / a.NW) % a.NH;
    kw = tl % a.NW;
    text = 0;
    ke = tile_ext(a, kt, khh, kw);
    kcount = min(BK, ke.et * ke.eh * ke.ew - kb * BK);
  }
  if (kcount <= 0) return; /* a block past a partial tile's end */
  const int64_t bh = (int64_t)b * a.heads + h;

  /* K and V of the block, by every thread (once per CTA); the barriers */
  if (tid < BK) {
    int r = tid, row = -1;
    if (r < kcount) {
      if (text) {
        row = a.VR + kb * BK + r;
      } else {
        int li = kb * BK + r, ehw = ke.eh * ke.ew, dt = li / ehw, rr = li - dt * ehw;
        int dh = rr / ke.ew, dw = rr - dh * ke.ew;
        row = tok_row(a, ke.id, ke.t0, ke.h0, ke.w0, dt, dh, dw);
      }
    }
    skrow[r] = row;
  }
  QWalk qw;
  if (text) {
    qw.ta = 0; qw.tz = a.NT - 1; qw.ha = 0; qw.hz = a.NH - 1; qw.wa = 0; qw.wz = a.NW - 1;
  } else {
    /* the query tiles that see key tile (kt, khh, kw): core/mask.h */
    sta_window_seen_by(kt, a.win[3 * h], a.NT, &qw.ta, &qw.tz);
    sta_window_seen_by(khh, a.win[3 * h + 1], a.NH, &qw.ha, &qw.hz);
    sta_window_seen_by(kw, a.win[3 * h + 2], a.NW, &qw.wa, &qw.wz);
  }
  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) {
      mbar_init(&full[s], a.tma ? 1 : 129);
      mbar_init(&empty[s], CTH);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    int n = 0; /* the consumers' loop count: the producer publishes each slot */
    for (qw.start(a); qw.kind != 2; qw.next(a)) n++;
    *snblk = n;
  }
  __syncthreads();
  {
    const T *gk = reinterpret_cast<const T *>(a.k) + b * a.k_sb + h * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + b * a.v_sb + h * a.v_sh;
    for (int c = tid; c < BK * CH; c += NTH) {
      int r = c / CH, ch = c - r * CH, row = skrow[r];
      load_chunk(sK + swz(r, ch, BK), gk, a.k_ss, row, ch, a.vec);
      load_chunk(sV + swz(r, ch, BK), gv, a.v_ss, row, ch, a.vec);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();
  if constexpr (D == 64) {
    /* K^T (D rows of BK keys, in column halves of 64 keys as the Q tiles):
    ** dQ's B operand, K-major, each warpgroup's 32 columns of D whole rows */
    const uint16_t *k16 = reinterpret_cast<const uint16_t *>(sK);
    for (int c = tid; c < D * (BK / 8); c += NTH) {
      const int d = c / (BK / 8), kc = c - d * (BK / 8);
      uint4 u;
      uint16_t *u16 = reinterpret_cast<uint16_t *>(&u);
#pragma unroll
      for (int e = 0; e < 8; e++) u16[e] = k16[swz(8 * kc + e, d >> 3, BK) + (d & 7)];
      *reinterpret_cast<uint4 *>(sKt + swz(d, kc, D)) = u;
    }
    fence_proxy_async();
    __syncthreads();
  }

  const float *glse = a.lse2 + bh * a.nqb * BQ, *gdd = a.dd + bh * a.nqb * BQ;

  if (wg == 2) {
    /* ---- producer ---- */
    setmaxnreg_dec<24>();
    const int pt = tid - CTH;
    const int c0 = a.tma_fused ? h * D : 0, c4 = a.tma_fused ? b : (int)bh;
    const T *gq = reinterpret_cast<const T *>(a.q) + b * a.q_sb + h * a.q_sh;
    const T *gdo = reinterpret_cast<const T *>(a.dout) + b * a.do_sb + h * a.do_sh;
    if (a.tma && pt > 0) return;
    qw.start(a);
    for (int it = 0; qw.kind != 2; it++, qw.next(a)) {
      const int st = it % STAGES, slot = qw.slot(a);
      if (it >= STAGES) mbar_wait(&empty[st], ((it / STAGES) - 1) & 1);
      T *q = sQ + st * BQ * D, *g = sdO + st * BQ * D;
      if (pt == 0) {
        sslot[st] = slot; /* read by the consumers after their wait */
        mbar_expect_tx(&full[st], 2 * BQ * 4 + (a.tma ? 2 * BQ * D * 2 : 0));
        bulk_load(slse + st * BQ, glse + (int64_t)slot * BQ, BQ * 4, &full[st]);
        bulk_load(sdd + st * BQ, gdd + (int64_t)slot * BQ, BQ * 4, &full[st]);
      }
      if (a.tma) {
#pragma unroll
        for (int hf = 0; hf < D / 64; hf++) {
          if (qw.kind == 1 || a.tiled) { /* text rows, or a t-slice of a tiled tile */
            const int r0 = qw.kind == 1 ? a.VR + qw.tb * BQ
                                        : ((qw.it * a.NH + qw.ih) * a.NW + qw.iw) * a.tile_vol +
                                              qw.blk * BQ;
            tma_load_3d(q + hf * BQ * 64, &a.rmq, c0 + hf * 64, r0, c4, &full[st]);
            tma_load_3d(g + hf * BQ * 64, &a.rmdo, c0 + hf * 64, r0, c4, &full[st]);
          } else {
            const int t0 = qw.it * a.tt + qw.blk, h0 = qw.ih * 8, w0 = qw.iw * 8;
            tma_load_5d(q + hf * BQ * 64, &a.tmq, c0 + hf * 64, w0, h0, t0, c4, &full[st]);
            tma_load_5d(g + hf * BQ * 64, &a.tmdo, c0 + hf * 64, w0, h0, t0, c4, &full[st]);
          }
        }
      } else {
        for (int c = pt; c < BQ * CH; c += NTH - CTH) {
          int r = c / CH, ch = c - r * CH, row = slot_row(a, slot, r);
          load_chunk(q + swz(r, ch, BQ), gq, a.q_ss, row, ch, a.vec);
          load_chunk(g + swz(r, ch, BQ), gdo, a.do_ss, row, ch, a.vec);
        }
        /* landed, then visible to the tensor cores' (async) proxy */
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        fence_proxy_async();
        mbar_arrive(&full[st]);
      }
    }
    return;
  }

  /* ---- consumers: warpgroup wg owns keys 64 wg .. 64 wg + 63 ---- */
  setmaxnreg_inc<240>();
  const float sl2 = a.scale_log2;
  const uint32_t dK0 = sdesc_lo(sK + wg * 64 * 64, 16), dV0 = sdesc_lo(sV + wg * 64 * 64, 16);
  /* dQ's B, this warpgroup's W columns of D over all 128 keys: K's column
  ** half wg (D 128) or K^T's rows 32 wg .. 32 wg + 31 (D 64) */
  const uint32_t dKq = D == 64 ? sdesc_lo(sKt + wg * 32 * 64, 16) : sdesc_lo(sK + wg * BK * 64, 16);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int e = 0; e < D / 2; e++) dk[e] = dv[e] = 0.f;

  const int nblk = *snblk;
  for (int it = 0; it < nblk; it++) {
    const int st = it % STAGES;
    mbar_wait(&full[st], (it / STAGES) & 1);
    const int slot = sslot[st];

    const uint32_t dQs = sdesc_lo(sQ + st * BQ * D, 16), dOs = sdesc_lo(sdO + st * BQ * D, 16);
    float s[BQ / 2], dp[BQ / 2];
    /* S^T and dP^T in two groups: P is computed while dP^T is still on the
    ** tensor cores */
    sta_wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      WgOps64<T>::s64(s, sdesc_of(dK0 + ko), sdesc_of(dQs + qo), ks > 0);
    }
    sta_wgmma::commit();
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
      uint32_t ko = (uint32_t)((((ks >> 2) * BK * 128) + (ks & 3) * 32) >> 4);
      uint32_t qo = (uint32_t)((((ks >> 2) * BQ * 128) + (ks & 3) * 32) >> 4);
      WgOps64<T>::s64(dp, sdesc_of(dV0 + ko), sdesc_of(dOs + qo), ks > 0);
    }
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<BQ / 2>(s);

    /* P^T (rows keys, columns queries c = 8j + 2(lane&3) + e), packed into
    ** A fragments 16 queries at a time; then dS^T = P^T (dP^T - D) */
    const float *ls = slse + st * BQ, *ds = sdd + st * BQ;
    uint32_t pa[BQ / 16][4], da[BQ / 16][4];
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
#pragma unroll
      for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = 2 * kk + jj, c = 8 * j + 2 * (lane & 3) + e;
          const float l2 = ls[c];
#pragma unroll
          for (int hr = 0; hr < 2; hr++) s[4 * j + 2 * hr + e] = ex2(fmaf(s[4 * j + 2 * hr + e], sl2, -l2));
        }
#pragma unroll
      for (int i = 0; i < 4; i++) pa[kk][i] = Mma<T>::pack(s[8 * kk + 2 * i], s[8 * kk + 2 * i + 1]);
    }
    sta_wgmma::wait<0>();
    sta_wgmma::pin<BQ / 2>(dp);
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++) {
#pragma unroll
      for (int jj = 0; jj < 2; jj++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int j = 2 * kk + jj, c = 8 * j + 2 * (lane & 3) + e;
          const float di = ds[c];
#pragma unroll
          for (int hr = 0; hr < 2; hr++) {
            const int x = 4 * j + 2 * hr + e;
            dp[x] = s[x] * (dp[x] - di);
          }
        }
#pragma unroll
      for (int i = 0; i < 4; i++) da[kk][i] = Mma<T>::pack(dp[8 * kk + 2 * i], dp[8 * kk + 2 * i + 1]);
    }

    /* dS^T into shared memory (row = key, column = query); the buffer
    ** alternates, and both warpgroups pass the barrier below every block,
    ** so the other one is done reading it from two blocks ago */
    T *sds = sdS + (it & 1) * BK * BQ;
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = 2 * kk + (i >> 1), hr = i & 1;
        const int r = wg * 64 + wq * 16 + (lane >> 2) + 8 * hr, c = 8 * j + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sds + swz(r, c >> 3, BK) + (c & 7)) = da[kk][i];
      }
    /* dV += P^T dO (dO as MN-major B), under the barrier */
    const uint32_t dOt = sdesc_lo(sdO + st * BQ * D, BQ * 128), dQt = sdesc_lo(sQ + st * BQ * D, BQ * 128);
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      WgOps<T, D>::pv(dv, pa[kk], sdesc_of(dOt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    fence_proxy_async();
    bar_named(1, CTH); /* dQ reads both warpgroups' dS^T */

    /* dQ (queries x W columns), then dK += dS^T Q: dQ goes to shared
    ** memory while dK is still on the tensor cores */
    float dq[W / 2];
    const uint32_t dSt = sdesc_lo(sds, 16);
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
      if constexpr (D == 64) /* K^T's keys 16 kk.. : column half kk / 4, 32 bytes a step in it */
        WgOps64<T>::s32tn(dq, sdesc_of(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                          sdesc_of(dKq + (uint32_t)((((kk >> 2) * D * 128) + (kk & 3) * 32) >> 4)),
                          kk > 0);
      else
        WgOps64<T>::s64tt(dq, sdesc_of(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                          sdesc_of(dKq + (uint32_t)((kk * 16 * 128) >> 4)), kk > 0);
    }
    sta_wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      WgOps<T, D>::pv(dk, da[kk], sdesc_of(dQt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<D / 2>(dv);
    sta_wgmma::pin<W / 2>(dq);
    sta_wgmma::pin_r<BQ / 4>(&pa[0][0]);

    /* this warpgroup's 64 x W dQ block into its buffer of two (the bulk
    ** reduce of two blocks ago has read it: its issuer waited for that
    ** before the barrier above), then one bulk add into the accumulator */
    float *sdq = sdQ + (wg * 2 + (it & 1)) * 64 * W;
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
      const int r = wq * 16 + (lane >> 2) + 8 * hr;
#pragma unroll
      for (int j = 0; j < W / 8; j++)
        *reinterpret_cast<float2 *>(sdq + dq_off<W>(r, 8 * j + 2 * (lane & 3))) =
            make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
    }
    fence_proxy_async();
    bar_named(2 + wg, 128);
    if ((tid & 127) == 0) {
      const int64_t blk = (bh * a.nqb + slot) * (D / W) + wg;
      float *dst = a.dqacc + blk * 64 * W;
      if (DET) {
        /* every key block adds in a fixed order: wait for this one's turn,
        ** add, wait for the add to land, pass the turn on */
        const int turn = dq_turn(a, a.win + 3 * h, kt, khh, kw, text, kb, slot);
        while (ld_acquire(a.turn + blk) != turn) {}
        bulk_reduce_add(dst, sdq, 64 * W * 4);
        bulk_wait();
        asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
        st_release(a.turn + blk, turn + 1);
      } else {
        bulk_reduce_add(dst, sdq, 64 * W * 4);
        bulk_wait_read1(); /* the one before has read its buffer */
      }
    }
    sta_wgmma::wait<0>();
    sta_wgmma::pin<D / 2>(dk);
    sta_wgmma::pin_r<BQ / 4>(&da[0][0]);
    mbar_arrive(&empty[st]); /* Q, dO, LSE, D of this stage read */
  }
  if ((tid & 127) == 0) bulk_wait();

  /* dK (times the scale) and dV of this warpgroup's keys */
  T *gdk = reinterpret_cast<T *>(a.dk) + b * a.dk_sb + h * a.dk_sh;
  T *gdv = reinterpret_cast<T *>(a.dv) + b * a.dv_sb + h * a.dv_sh;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int row = skrow[wg * 64 + wq * 16 + (lane >> 2) + 8 * hr];
    if (row < 0) continue;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      const int c = 8 * j + 2 * (lane & 3);
      *reinterpret_cast<uint32_t *>(gdk + (int64_t)row * a.dk_ss + c) =
          Mma<T>::pack(dk[4 * j + 2 * hr] * a.scale, dk[4 * j + 2 * hr + 1] * a.scale);
      *reinterpret_cast<uint32_t *>(gdv + (int64_t)row * a.dv_ss + c) =
          Mma<T>::pack(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]);
    }
  }
}

} /* namespace sta */

#endif
