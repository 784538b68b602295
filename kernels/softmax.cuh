/*
** softmax.cuh -- the online softmax of the forward on wgmma accumulators
** (m64nN, f32): a thread holds rows lane / 4 and lane / 4 + 8 of its
** warp's 16, columns 8j + 2 (lane & 3) + {0, 1}; exp2 domain (scores
** scaled by scale * log2 e).  Masking of a key block, the block's softmax
** with the running maximum and sum, the rescale of O, P packed for PV.
*/
#ifndef STA_SOFTMAX_CUH
#define STA_SOFTMAX_CUH

#include <math.h>

#include "block_walk.cuh"
#include "mma.cuh"

namespace sta {

/* S of a 64 x BK block (wgmma accumulator layout): -inf where no key. */
template <int BK, class P>
__device__ __forceinline__ void mask_block(float *s, const BlkInfo &bi, const P &a, int lane) {
  constexpr int NJ = BK / 8;
  if (bi.posmask) {
#pragma unroll
    for (int j = 0; j < NJ; j++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        int col = j * 8 + 2 * (lane & 3) + e;
        if (bi.t0 + (col >> 6) >= a.cT || bi.h0 + ((col >> 3) & 7) >= a.cH ||
            bi.w0 + (col & 7) >= a.cW)
          s[4 * j + e] = s[4 * j + 2 + e] = -INFINITY;
      }
  } else if (bi.cnt < BK) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      int col = j * 8 + 2 * (lane & 3);
      if (col >= bi.cnt) s[4 * j] = s[4 * j + 2] = -INFINITY;
      if (col + 1 >= bi.cnt) s[4 * j + 1] = s[4 * j + 3] = -INFINITY;
    }
  }
}

/* Online softmax of one block in place (S -> P), exp2 domain; m, l of the
** thread's two rows updated; alpha: the factor for the old O and l.
** th: the rescale threshold (FwdParams::rescale_th).  0 (STA_SOFTMAX_EXACT,
** the default) keeps the exact running maximum, so every row's largest P
** is exactly 1.  8 (STA_SOFTMAX_FAST) moves the maximum only when a
** block's exceeds it by more than 8: P and l may then reach 2^8, which
** bf16/f16 P and the f32 sums hold, and O is rescaled only on such jumps
** (after the first blocks, almost never); the same softmax, since the
** maximum is only the stabiliser, but P is rounded at another scale (up to
** twice the max error on peaked rows, BENCHMARKS.md). */
template <int BK>
__device__ __forceinline__ void softmax_block(float *s, float *m, float *l,
                                              float *alpha, float sl2, float th) {
  constexpr int NJ = BK / 8;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < NJ; j++)
      mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hr], s[4 * j + 2 * hr + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float bmx = mx * sl2;
    const float mnew = bmx > m[hr] + th ? bmx : m[hr];
    float muse = mnew == -INFINITY ? 0.f : mnew;
    alpha[hr] = ex2(m[hr] - muse);
    m[hr] = mnew;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      float p0 = fmaf(s[4 * j + 2 * hr], sl2, -muse);
      float p1 = fmaf(s[4 * j + 2 * hr + 1], sl2, -muse);
      p0 = ex2(p0);
      p1 = ex2(p1);
      s[4 * j + 2 * hr] = p0;
      s[4 * j + 2 * hr + 1] = p1;
      sum += p0 + p1;
    }
    l[hr] = l[hr] * alpha[hr] + sum;
  }
}

template <int D>
__device__ __forceinline__ void rescale_o(float *o, const float *alpha) {
  /* once the row maxima settle, most blocks leave them unchanged: skip the
  ** 64 multiplies when no row of the warp moved (a warp-uniform branch) */
  if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int j = 0; j < D / 8; j++) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

/* P (accumulator layout) -> wgmma A fragments, one per 16 keys. */
template <typename T, int BK>
__device__ __forceinline__ void pack_p(const float *s, uint32_t (*pa)[4]) {
#pragma unroll
  for (int kk = 0; kk < BK / 16; kk++) {
    pa[kk][0] = Mma<T>::pack(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = Mma<T>::pack(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = Mma<T>::pack(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = Mma<T>::pack(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

} /* namespace sta */

#endif
