/*
** kernel_bsa_bwd.cuh -- the block-sparse backward (masks BLOCKS and
** WINDOW_OR_BLOCKS): prep, the main kernel, post, and their launch
** (run_bsa_bwd).  The main kernel: one CTA per key block of BKC keys
** (K and V in shared memory, once), a producer warpgroup streaming the
** 64-row query blocks that see it (the device-built inverse of the lists,
** bsa_bwd_api.cu: ascending) through a ring: Q and dO by TMA where the 64
** rows are all valid, else gathered with zeros; LSE and D by bulk copy.
** The consumers compute as the window backward (kernel_bwd.cuh) does:
**   S^T = K Q^T, dP^T = V dO^T, P^T = 2^(S^T scale log2e - LSE log2e),
**   dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q, dQ = dS K
** and add dQ to the f32 accumulator by bulk reduce-add.  Two shapes:
**   split (block_rows 64, BKC 64): both warpgroups hold the block's 64 keys
**     and take the query blocks in turn (0, 2, 4.. and 1, 3, 5..); each
**     adds a whole 64 x D dQ block (two 64 x D/2 halves) per query block;
**     their partial dK, dV are summed through shared memory at the end;
**   shared (block_rows a multiple of 128, BKC 128): the window backward's
**     shape, 64 keys a warpgroup, every query block through both, dQ split
**     by columns (D/2 each over all 128 keys).
** Zero rows (padding keys, gathered as zeros; padding query rows with LSE
** and D 0) add nothing to any stored gradient, so nothing is masked.
** Deterministic: the adds into a dQ block in the order of the key blocks
** (k2q_rank), each waiting for its turn, as the window backward's.
*/
#ifndef STA_KERNEL_BSA_BWD_CUH
#define STA_KERNEL_BSA_BWD_CUH

#include "bsa_bwd_params.h"
#include "bsa_inv.h"
#include "mma.cuh"

/* STA_BSA_BWD_CHECK (a diagnosis build, gpu-check-blocks --prep): the
** walk's invariants checked on the device; the first violation prints what
** and where, and traps (a wild slot would send the bulk copies, which no
** sanitizer sees, to a wild address). */
/* The registers a thread after setmaxnreg: the producer warpgroup's and
** the consumers', per head dim (compile-time; STA_BSA_BWD_PREG / CREG
** override both for an A/B: gpu-check-bsa-ab --prep-variant).  setmaxnreg
** moves registers only within what the launch gave the CTA, 384 x 168
** (kernel_traits.cuh): a split past it waits in setmaxnreg.inc forever
** (32 / 240 hung every backward on the H200).  D 128: 24 / 240, the window
** backward's split (ptxas: the consumers' spills of the split kernel 120 ->
** 68 bytes, the producer's 0 -> 80; at hunyuan-720p -2.0 % with 64-row
** blocks, -16.8 % with 256-row ones, deterministic bits unchanged; H200
** 2026-12-02); D 64: 40 / 232 (no consumer spills there, and 24 would make
** the producer spill 80 bytes). */
template <int D> struct BsaBwdRegs {
#ifdef STA_BSA_BWD_PREG
  static constexpr int P = STA_BSA_BWD_PREG;
#else
  static constexpr int P = D == 128 ? 24 : 40;
#endif
#ifdef STA_BSA_BWD_CREG
  static constexpr int C = STA_BSA_BWD_CREG;
#else
  static constexpr int C = D == 128 ? 240 : 232;
#endif
  static_assert(128 * P + 256 * C <= (65536 / 384) / 8 * 8 * 384,
                "setmaxnreg: more registers than the launch gives the CTA");
};
#ifdef STA_BSA_BWD_CHECK
#define BSA_CHECK(cond, v1, v2, v3)                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      printf("bsa_bwd check failed: %s (block %d tid %d: %d %d %d)\n", #cond, (int)blockIdx.x, \
             (int)threadIdx.x, (int)(v1), (int)(v2), (int)(v3));                               \
      __trap();                                                                                \
    }                                                                                          \
  } while (0)
#else
#define BSA_CHECK(cond, v1, v2, v3) \
  do {                              \
  } while (0)
#endif

namespace sta {

template <int D> __device__ __forceinline__ int64_t bsa_dq_at(int64_t sbh, int rr, int c) {
  constexpr int W = D / 2, LW = W == 64 ? 6 : 5;
  return (sbh * 2 + (c >> LW)) * 64 * W + bsa_dq_off(W, rr, c & (W - 1));
}

template <int D, int BKC> struct BsaBwdShape {
  static constexpr bool SPLIT = BKC == 64;
  static constexpr int BQ = 64, W = D / 2;
  static constexpr int ST = SPLIT ? (D == 128 ? 3 : 6) : 2;    /* Q / dO ring */
  static constexpr int NDS = SPLIT ? 2 : 2;                    /* dS^T buffers */
  static constexpr int K = 0;
  static constexpr int V = K + BKC * D * 2;
  static constexpr int KT = V + BKC * D * 2;                   /* D 64: K^T [D][BKC] */
  static constexpr int Q = KT + (D == 64 ? D * BKC * 2 : 0);   /* [ST][BQ][D] */
  static constexpr int DO = Q + ST * BQ * D * 2;
  static constexpr int DS = DO + ST * BQ * D * 2;              /* split: [wg][BKC][BQ]; shared: [2][BKC][BQ] */
  static constexpr int DQ = DS + NDS * BKC * BQ * 2;           /* [wg][2][64][W] f32 */
  static constexpr int LSE = DQ + 4 * 64 * W * 4;              /* [ST][BQ] */
  static constexpr int DD = LSE + ST * BQ * 4;
  /* full barriers: split, one per (consumer warpgroup, stage) (below);
  ** shared, one per stage; then empty[ST] */
  static constexpr int NF = SPLIT ? 2 : 1;
  /* the period of a (warpgroup, stage) pair: iteration it fills stage
  ** it % ST for warpgroup it % 2 (split), so a full barrier's phases are
  ** it / P: P = ST where ST is even (each stage one warpgroup's), 2 ST
  ** where it is odd */
  static constexpr int P = SPLIT && (ST & 1) ? 2 * ST : ST;
  static constexpr int BAR = DD + ST * BQ * 4;                 /* full[NF][ST], empty[ST] */
  static constexpr int SLOT = BAR + (NF + 1) * ST * 8;         /* [ST] slot, [ST] rank, count */
  static constexpr int KROW = SLOT + (2 * ST + 2) * 4;         /* [BKC] */
  static constexpr int BYTES = KROW + BKC * 4 + 1024;
  static_assert(BYTES <= 232448, "more shared memory than an sm_90 CTA has");
  /* the split kernel's dK, dV exchange at the end: the Q / dO ring */
  static_assert(!SPLIT || 2 * 64 * D * 4 <= 2 * ST * BQ * D * 2, "exchange fits the ring");
};

/* One 16-byte chunk of row `row` (-1: zeros) into a swizzled tile. */
template <typename T>
__device__ __forceinline__ void bsa_chunk(T *dst, const T *g, int64_t ss, int64_t row, int ch,
                                          int vec) {
  if (vec) {
    cp_async16(smem_u32(dst), row >= 0 ? g + row * ss + ch * 8 : g, row >= 0 ? 16 : 0);
    return;
  }
  uint4 tmp = make_uint4(0, 0, 0, 0);
  if (row >= 0) {
    const uint16_t *src = reinterpret_cast<const uint16_t *>(g + row * ss + ch * 8);
    uint16_t *t16 = reinterpret_cast<uint16_t *>(&tmp);
#pragma unroll
    for (int e = 0; e < 8; e++) t16[e] = src[e];
  }
  *reinterpret_cast<uint4 *>(dst) = tmp;
}

template <typename T, int D, int BKC>
__global__ void __launch_bounds__(384, 1) sta_bsa_bwd(const __grid_constant__ BsaBwdArgs a) {
  using L = BsaBwdShape<D, BKC>;
  constexpr bool SPLIT = L::SPLIT;
  constexpr int BQ = L::BQ, W = L::W, ST = L::ST, CH = D / 8, CTH = 256, NTH = 384;
  extern __shared__ unsigned char smem_raw[];
  unsigned char *base = reinterpret_cast<unsigned char *>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~(uintptr_t)1023);
  T *sK = reinterpret_cast<T *>(base + L::K), *sV = reinterpret_cast<T *>(base + L::V);
  T *sKt = reinterpret_cast<T *>(base + L::KT);
  T *sQ = reinterpret_cast<T *>(base + L::Q), *sdO = reinterpret_cast<T *>(base + L::DO);
  T *sdS = reinterpret_cast<T *>(base + L::DS);
  float *sdQ = reinterpret_cast<float *>(base + L::DQ);
  float *slse = reinterpret_cast<float *>(base + L::LSE), *sdd = reinterpret_cast<float *>(base + L::DD);
  uint64_t *full = reinterpret_cast<uint64_t *>(base + L::BAR), *empty = full + L::NF * ST;
  volatile int *sslot = reinterpret_cast<volatile int *>(base + L::SLOT);
  volatile int *srank = sslot + ST, *snblk = srank + ST;
  int *skrow = reinterpret_cast<int *>(base + L::KROW);

  const int tid = threadIdx.x, lane = tid & 31;
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wq = (tid >> 5) & 3;

  /* the key rows: CTA (b, h, key block n, part j of BKC rows) */
  const int cta = blockIdx.x;
  const int per = a.Mk * a.subs, bh = cta / per, r0 = cta - bh * per;
  const int n = r0 / a.subs, kj = r0 - n * a.subs;
  const int b = bh / a.heads, h = bh - b * a.heads;
  const int ks = a.kv_sizes ? a.kv_sizes[n] : a.bv;
  const int kc = max(0, min(BKC, ks - kj * BKC)); /* valid keys of this CTA */
  const int det = a.turn != NULL;
  const int64_t krow0 = (int64_t)n * a.bv + (int64_t)kj * BKC;
  if (tid < BKC) skrow[tid] = tid < kc ? tid : -1;
  if (tid == 0) {
    for (int s = 0; s < L::NF * ST; s++)
      mbar_init(&full[s], 129); /* the expect_tx and the producer's 128 threads */
    for (int s = 0; s < ST; s++) mbar_init(&empty[s], SPLIT ? 128 : CTH);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    /* the query blocks' 64-row parts: the consumers' loop count (a CTA
    ** without keys takes its turns all the same when deterministic) */
    BSA_CHECK(a.k2q_off[(int64_t)bh * a.Mk + n] <= a.k2q_off[(int64_t)bh * a.Mk + n + 1],
              a.k2q_off[(int64_t)bh * a.Mk + n], a.k2q_off[(int64_t)bh * a.Mk + n + 1], n);
    *snblk = kc > 0 || det ? bsa_qwalk_count(a.k2q_off[(int64_t)bh * a.Mk + n],
                                             a.k2q_off[(int64_t)bh * a.Mk + n + 1], a.k2q_idx,
                                             a.q_sizes, a.bv)
                           : 0;
  }
  __syncthreads();
  {
    const T *gk = reinterpret_cast<const T *>(a.k) + (int64_t)b * a.k_sb + (int64_t)h * a.k_sh;
    const T *gv = reinterpret_cast<const T *>(a.v) + (int64_t)b * a.v_sb + (int64_t)h * a.v_sh;
    for (int c = tid; c < BKC * CH; c += NTH) {
      const int r = c / CH, ch = c - r * CH;
      const int64_t row = skrow[r] >= 0 ? krow0 + r : -1;
      bsa_chunk(sK + swz(r, ch, BKC), gk, a.k_ss, row, ch, a.vec);
      bsa_chunk(sV + swz(r, ch, BKC), gv, a.v_ss, row, ch, a.vec);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
    fence_proxy_async();
  }
  __syncthreads();
  if constexpr (D == 64) { /* K^T, dQ's B operand at D 64 (kernel_bwd.cuh) */
    const uint16_t *k16 = reinterpret_cast<const uint16_t *>(sK);
    for (int c = tid; c < D * (BKC / 8); c += NTH) {
      const int d = c / (BKC / 8), kc8 = c - d * (BKC / 8);
      uint4 u;
      uint16_t *u16 = reinterpret_cast<uint16_t *>(&u);
#pragma unroll
      for (int e = 0; e < 8; e++) u16[e] = k16[swz(8 * kc8 + e, d >> 3, BKC) + (d & 7)];
      *reinterpret_cast<uint4 *>(sKt + swz(d, kc8, D)) = u;
    }
    fence_proxy_async();
    __syncthreads();
  }
  const int nslots = a.Mq * (a.bv / 64);
  const float *glse = a.lse2 + (int64_t)bh * a.Mq * a.bv, *gdd = a.dd + (int64_t)bh * a.Mq * a.bv;
  const int nblk = *snblk;

  if (wg == 2) {
    /* ---- producer: all 128 threads (TMA by thread 0 where the rows allow) ---- */
    setmaxnreg_dec<BsaBwdRegs<D>::P>();
    const int pt = tid - CTH;
    const int c0 = a.tma_fused ? h * D : 0, c4 = a.tma_fused ? b : bh;
    const T *gq = reinterpret_cast<const T *>(a.q) + (int64_t)b * a.q_sb + (int64_t)h * a.q_sh;
    const T *gdo = reinterpret_cast<const T *>(a.dout) + (int64_t)b * a.do_sb + (int64_t)h * a.do_sh;
    bsa_qwalk qw;
    bsa_qwalk_start(&qw, a.k2q_off[(int64_t)bh * a.Mk + n], a.k2q_off[(int64_t)bh * a.Mk + n + 1],
                    a.k2q_idx, a.q_sizes, a.bv);
    for (int it = 0; it < nblk; it++, bsa_qwalk_next(&qw, a.k2q_idx, a.q_sizes, a.bv)) {
      const int st = it % ST;
      uint64_t *fb = &full[(SPLIT ? (it & 1) : 0) * ST + st]; /* the consuming warpgroup's */
      if (it >= ST) mbar_wait(&empty[st], ((it / ST) - 1) & 1);
      const int slot = qw.m * (a.bv / 64) + qw.j;
      BSA_CHECK(qw.e < qw.e1 && qw.m >= 0 && qw.m < a.Mq && slot >= 0 && slot < nslots, it, qw.e,
                qw.m);
      const int qs = a.q_sizes ? a.q_sizes[qw.m] : a.bv;
      const int nv = min(64, qs - 64 * qw.j); /* valid rows of the part */
      const int64_t qrow0 = (int64_t)qw.m * a.bv + 64 * qw.j;
      const bool bytma = a.tma && nv == 64;
      T *q = sQ + st * BQ * D, *g = sdO + st * BQ * D;
      if (pt == 0) {
        sslot[st] = slot;
        srank[st] = det ? (SPLIT ? a.k2q_rank[qw.e] : a.k2q_rank[qw.e] * a.subs + kj) : 0;
        mbar_expect_tx(fb, 2 * BQ * 4 + (bytma ? 2 * BQ * D * 2 : 0));
        bulk_load(slse + st * BQ, glse + (int64_t)slot * BQ, BQ * 4, fb);
        bulk_load(sdd + st * BQ, gdd + (int64_t)slot * BQ, BQ * 4, fb);
        if (bytma) {
#pragma unroll
          for (int hf = 0; hf < D / 64; hf++) {
            tma_load_3d(q + hf * BQ * 64, &a.rmq, c0 + hf * 64, (int)qrow0, c4, fb);
            tma_load_3d(g + hf * BQ * 64, &a.rmdo, c0 + hf * 64, (int)qrow0, c4, fb);
          }
        }
      }
      if (!bytma) {
        for (int c = pt; c < BQ * CH; c += NTH - CTH) {
          const int r = c / CH, ch = c - r * CH;
          const int64_t row = r < nv ? qrow0 + r : -1;
          bsa_chunk(q + swz(r, ch, BQ), gq, a.q_ss, row, ch, a.vec);
          bsa_chunk(g + swz(r, ch, BQ), gdo, a.do_ss, row, ch, a.vec);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        fence_proxy_async();
      }
      mbar_arrive(fb);
    }
    return;
  }

  /* ---- consumers ---- */
  setmaxnreg_inc<BsaBwdRegs<D>::C>();
  const float sl2 = a.scale_log2;
  /* this warpgroup's keys: all 64 (split) or its half of 128 */
  const uint32_t dK0 = sdesc_lo(sK + (SPLIT ? 0 : wg * 64 * 64), 16);
  const uint32_t dV0 = sdesc_lo(sV + (SPLIT ? 0 : wg * 64 * 64), 16);
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int e = 0; e < D / 2; e++) dk[e] = dv[e] = 0.f;
  const int krow[2] = {(SPLIT ? 0 : wg * 64) + wq * 16 + (lane >> 2),
                       (SPLIT ? 0 : wg * 64) + wq * 16 + (lane >> 2) + 8}; /* this thread's keys */

  for (int it = SPLIT ? wg : 0; it < nblk; it += SPLIT ? 2 : 1) {
    const int st = it % ST;
    /* split at an odd ST: a stage serves both warpgroups in turn, so each
    ** waits on its own barrier of the stage, whose phases it sees all of
    ** (on one shared barrier a warpgroup could see the phase two ahead of
    ** its last one complete and take the other's) */
    mbar_wait(&full[(SPLIT ? wg : 0) * ST + st], (it / L::P) & 1);
    const int slot = sslot[st], rank = srank[st];
    BSA_CHECK(slot >= 0 && slot < nslots && rank >= 0, it, slot, rank);
    const uint32_t dQs = sdesc_lo(sQ + st * BQ * D, 16), dOs = sdesc_lo(sdO + st * BQ * D, 16);
    float s[BQ / 2], dp[BQ / 2];
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const uint32_t ko = (uint32_t)((((kk >> 2) * BKC * 128) + (kk & 3) * 32) >> 4);
      const uint32_t qo = (uint32_t)((((kk >> 2) * BQ * 128) + (kk & 3) * 32) >> 4);
      WgOps64<T>::s64(s, sdesc_of(dK0 + ko), sdesc_of(dQs + qo), kk > 0);
    }
    sta_wgmma::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
      const uint32_t ko = (uint32_t)((((kk >> 2) * BKC * 128) + (kk & 3) * 32) >> 4);
      const uint32_t qo = (uint32_t)((((kk >> 2) * BQ * 128) + (kk & 3) * 32) >> 4);
      WgOps64<T>::s64(dp, sdesc_of(dV0 + ko), sdesc_of(dOs + qo), kk > 0);
    }
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<BQ / 2>(s);

    /* P^T; 0 on padding keys (zero rows: S^T 0, and 2^-LSE may overflow) */
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
          for (int hr = 0; hr < 2; hr++)
            s[4 * j + 2 * hr + e] = krow[hr] < kc ? ex2(fmaf(s[4 * j + 2 * hr + e], sl2, -l2)) : 0.f;
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

    /* dS^T (row key, column query) into shared memory: split, this
    ** warpgroup's own buffer (its last dQ GEMM was waited for); shared,
    ** alternating buffers of both warpgroups' rows (kernel_bwd.cuh) */
    T *sds = SPLIT ? sdS + wg * BKC * BQ : sdS + (it & 1) * BKC * BQ;
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = 2 * kk + (i >> 1), hr = i & 1;
        const int r = (SPLIT ? 0 : wg * 64) + wq * 16 + (lane >> 2) + 8 * hr, c = 8 * j + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(sds + swz(r, c >> 3, BKC) + (c & 7)) = da[kk][i];
      }
    const uint32_t dOt = sdesc_lo(sdO + st * BQ * D, BQ * 128), dQt = sdesc_lo(sQ + st * BQ * D, BQ * 128);
    sta_wgmma::fence();
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      WgOps<T, D>::pv(dv, pa[kk], sdesc_of(dOt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    fence_proxy_async();
    if constexpr (SPLIT) bar_named(2 + wg, 128); /* this warpgroup's dS^T */
    else bar_named(1, CTH);                      /* both warpgroups' dS^T */

    const uint32_t dSt = sdesc_lo(sds, 16);
    /* dQ, W columns from column half hf of D over the CTA's keys: issued */
    auto issue_dq = [&](float *dq, int hf) {
      sta_wgmma::fence(); /* dq's registers were read since */
      const uint32_t kq = D == 64 ? sdesc_lo(sKt + hf * 32 * 64, 16) : sdesc_lo(sK + hf * BKC * 64, 16);
#pragma unroll
      for (int kk = 0; kk < BKC / 16; kk++) {
        if constexpr (D == 64)
          WgOps64<T>::s32tn(dq, sdesc_of(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                            sdesc_of(kq + (uint32_t)((((kk >> 2) * D * 128) + (kk & 3) * 32) >> 4)),
                            kk > 0);
        else
          WgOps64<T>::s64tt(dq, sdesc_of(dSt + (uint32_t)((kk * 16 * 128) >> 4)),
                            sdesc_of(kq + (uint32_t)((kk * 16 * 128) >> 4)), kk > 0);
      }
      sta_wgmma::commit();
    };
    /* dq into this warpgroup's staging buffer u, then one bulk add into
    ** column block hf of the slot (in turn when deterministic) */
    auto add_dq = [&](const float *dq, int u, int hf) {
      float *sdq = sdQ + (wg * 2 + u) * 64 * W;
#pragma unroll
      for (int hr = 0; hr < 2; hr++) {
        const int r = wq * 16 + (lane >> 2) + 8 * hr;
#pragma unroll
        for (int j = 0; j < W / 8; j++)
          *reinterpret_cast<float2 *>(sdq + bsa_dq_off(W, r, 8 * j + 2 * (lane & 3))) =
              make_float2(dq[4 * j + 2 * hr], dq[4 * j + 2 * hr + 1]);
      }
      fence_proxy_async();
      bar_named(2 + wg, 128);
      if (det) {
        /* in turn: warp 0 of the warpgroup waits, converged, then its lane
        ** 0 adds (the wait by lane 0 alone, the other lanes parked at the
        ** join, faulted at D 64 with a misaligned or out-of-range address
        ** on the add: the H200, 2026-12-02, every D 64 deterministic case) */
        if ((tid & 127) < 32) {
          const int64_t blk = ((int64_t)bh * nslots + slot) * 2 + hf;
          while (ld_acquire(a.turn + blk) != rank) {
          }
          __syncwarp();
          if (lane == 0) {
            bulk_reduce_add(a.dqacc + blk * 64 * W, sdq, 64 * W * 4);
            bulk_wait();
            asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
            st_release(a.turn + blk, rank + 1);
          }
          __syncwarp();
        }
      } else if ((tid & 127) == 0) {
        const int64_t blk = ((int64_t)bh * nslots + slot) * 2 + hf;
        bulk_reduce_add(a.dqacc + blk * 64 * W, sdq, 64 * W * 4);
        bulk_wait_read1(); /* the one before has read its buffer */
      }
    };
    float dq[W / 2];
    issue_dq(dq, SPLIT ? 0 : wg);
#pragma unroll
    for (int kk = 0; kk < BQ / 16; kk++)
      WgOps<T, D>::pv(dk, da[kk], sdesc_of(dQt + (uint32_t)((kk * 16 * 128) >> 4)));
    sta_wgmma::commit();
    sta_wgmma::wait<1>();
    sta_wgmma::pin<D / 2>(dv);
    sta_wgmma::pin<W / 2>(dq);
    sta_wgmma::pin_r<BQ / 4>(&pa[0][0]);
    add_dq(dq, SPLIT ? 0 : it & 1, SPLIT ? 0 : wg);
    if constexpr (SPLIT) {
      issue_dq(dq, 1); /* the other column half */
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(dk);
      sta_wgmma::pin<W / 2>(dq);
      sta_wgmma::pin_r<BQ / 4>(&da[0][0]);
      bar_named(2 + wg, 128); /* buffer 1's last bulk read is done (its issuer waited) */
      add_dq(dq, 1, 1);
    } else {
      sta_wgmma::wait<0>();
      sta_wgmma::pin<D / 2>(dk);
      sta_wgmma::pin_r<BQ / 4>(&da[0][0]);
    }
    mbar_arrive(&empty[st]); /* Q, dO, LSE, D of this stage read */
  }
  if ((tid & 127) == 0) bulk_wait();

  T *gdk = reinterpret_cast<T *>(a.dk) + (int64_t)b * a.dk_sb + (int64_t)h * a.dk_sh;
  T *gdv = reinterpret_cast<T *>(a.dv) + (int64_t)b * a.dv_sb + (int64_t)h * a.dv_sh;
  if constexpr (SPLIT) {
    /* warpgroup 1's partial dK, dV to warpgroup 0 through the (consumed) ring */
    float *xk = reinterpret_cast<float *>(sQ), *xv = xk + 64 * D;
    const int t = wq * 32 + lane;
    bar_named(1, CTH); /* both are done with the ring */
    if (wg == 1) {
#pragma unroll
      for (int e = 0; e < D / 2; e++) {
        xk[e * 128 + t] = dk[e];
        xv[e * 128 + t] = dv[e];
      }
    }
    bar_named(1, CTH);
    if (wg == 1) return;
#pragma unroll
    for (int e = 0; e < D / 2; e++) {
      dk[e] += xk[e * 128 + t];
      dv[e] += xv[e * 128 + t];
    }
  }
  /* dK (times the scale) and dV of this warpgroup's keys; zeros on padding rows */
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    const int r = (SPLIT ? 0 : wg * 64) + wq * 16 + (lane >> 2) + 8 * hr;
    const bool ok = r < kc;
    const int64_t row = krow0 + r;
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      const int c = 8 * j + 2 * (lane & 3);
      const uint32_t vk =
          ok ? Mma<T>::pack(dk[4 * j + 2 * hr] * a.scale, dk[4 * j + 2 * hr + 1] * a.scale) : 0u;
      const uint32_t vv = ok ? Mma<T>::pack(dv[4 * j + 2 * hr], dv[4 * j + 2 * hr + 1]) : 0u;
      T *pk = gdk + row * a.dk_ss + c, *pv = gdv + row * a.dv_ss + c;
      if (a.pair4) {
        *reinterpret_cast<uint32_t *>(pk) = vk;
        *reinterpret_cast<uint32_t *>(pv) = vv;
      } else { /* odd strides: element stores */
        reinterpret_cast<uint16_t *>(pk)[0] = (uint16_t)(vk & 0xffff);
        reinterpret_cast<uint16_t *>(pk)[1] = (uint16_t)(vk >> 16);
        reinterpret_cast<uint16_t *>(pv)[0] = (uint16_t)(vv & 0xffff);
        reinterpret_cast<uint16_t *>(pv)[1] = (uint16_t)(vv >> 16);
      }
    }
  }
}

/* ---- row kernels --------------------------------------------------------- */

template <typename T> __device__ __forceinline__ float bsa_to_f(T x);
template <> __device__ __forceinline__ float bsa_to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float bsa_to_f<__half>(__half x) { return __half2float(x); }


/* Query row i of (b, h) (D / 8 threads, 8 columns each): LSE * log2 e and
** D_i = dO . O (0 on padding rows and rows without keys), and the row of
** the dQ accumulator zeroed. */
template <typename T, int D>
__global__ void sta_bsa_bwd_prep(const __grid_constant__ BsaBwdArgs a,
                                 const __grid_constant__ BsaRowArgs r) {
  constexpr int RT = D / 8;
  const int64_t i = (int64_t)blockIdx.x * (256 / RT) + threadIdx.x / RT;
  const int c = (int)(threadIdx.x % RT) * 8;
  if (i >= r.rows) return; /* whole groups of RT: rows and 256 / RT both multiples */
  const int64_t bh = i / r.Sq, b = bh / a.heads, h = bh % a.heads;
  const int s = (int)(i % r.Sq), m = s / a.bv;
  const int valid = s - m * a.bv < (a.q_sizes ? a.q_sizes[m] : a.bv);
  float acc = 0.f, l2 = 0.f;
  if (valid) {
    const float lse = r.lse[b * r.lse_sb + h * r.lse_sh + (int64_t)s * r.lse_ss];
    if (lse > -INFINITY) {
      const T *o = reinterpret_cast<const T *>(r.o) + b * r.o_sb + (int64_t)s * r.o_ss + h * r.o_sh + c;
      const T *g = reinterpret_cast<const T *>(r.dout) + b * r.do_sb + (int64_t)s * r.do_ss + h * r.do_sh + c;
#pragma unroll
      for (int e = 0; e < 8; e++) acc += bsa_to_f<T>(o[e]) * bsa_to_f<T>(g[e]);
      l2 = lse * 1.4426950408889634f;
    }
  }
#pragma unroll
  for (int x = RT / 2; x > 0; x >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, x);
  float4 *z = reinterpret_cast<float4 *>(a.dqacc + bsa_dq_at<D>(i / 64, (int)(i % 64), c));
  z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
  z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c == 0) {
    const_cast<float *>(a.dd)[i] = acc;
    const_cast<float *>(a.lse2)[i] = l2;
  }
}

/* Query row i: dq = scale * the accumulator (0 on padding rows). */
template <typename T, int D>
__global__ void sta_bsa_bwd_post(const __grid_constant__ BsaBwdArgs a,
                                 const __grid_constant__ BsaRowArgs r) {
  constexpr int RT = D / 8;
  const int64_t i = (int64_t)blockIdx.x * (256 / RT) + threadIdx.x / RT;
  const int c = (int)(threadIdx.x % RT) * 8;
  if (i >= r.rows) return;
  const int64_t bh = i / r.Sq, b = bh / a.heads, h = bh % a.heads;
  const int s = (int)(i % r.Sq), m = s / a.bv;
  const int valid = s - m * a.bv < (a.q_sizes ? a.q_sizes[m] : a.bv);
  const float4 *acc = reinterpret_cast<const float4 *>(a.dqacc + bsa_dq_at<D>(i / 64, (int)(i % 64), c));
  const float4 x0 = acc[0], x1 = acc[1];
  const float f[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  T *q = reinterpret_cast<T *>(r.dq) + b * r.dq_sb + (int64_t)s * r.dq_ss + h * r.dq_sh + c;
#pragma unroll
  for (int e = 0; e < 8; e++) q[e] = T(valid ? f[e] * a.scale : 0.f);
}

template <typename T, int D, int BKC>
sta_status launch_bsa_bwd(const BsaBwdArgs &x, cudaStream_t st) {
  using L = BsaBwdShape<D, BKC>;
  auto kern = sta_bsa_bwd<T, D, BKC>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, L::BYTES);
  if (e != cudaSuccess) return sta_cuda_fail(e, "backward: shared memory attribute");
  const int64_t ctas = (int64_t)x.batch * x.heads * x.Mk * x.subs;
  if (ctas > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld key blocks exceed one launch",
                     (long long)ctas);
  if (ctas > 0) kern<<<(unsigned)ctas, 384, L::BYTES, st>>>(x);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: launch");
  return STA_OK;
}

template <typename T, int D>
sta_status run_bsa_bwd(const BsaBwdArgs &x, const BsaRowArgs &r, cudaStream_t st) {
  constexpr int PER = 256 / (D / 8);
  const unsigned blocks = (unsigned)((r.rows + PER - 1) / PER);
  cudaError_t e;
  sta_bsa_bwd_prep<T, D><<<blocks, 256, 0, st>>>(x, r);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: prep launch");
  sta_status s = x.bv == 64 ? launch_bsa_bwd<T, D, 64>(x, st) : launch_bsa_bwd<T, D, 128>(x, st);
  if (s != STA_OK) return s;
  sta_bsa_bwd_post<T, D><<<blocks, 256, 0, st>>>(x, r);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: post launch");
  return STA_OK;
}

} /* namespace sta */

#endif
