/*
** epilogue_fwd.cuh -- the forward's output: each consumer warp normalises
** its rows and stores them (and their log-sum-exp) straight from the
** accumulators.
*/
#ifndef STA_EPILOGUE_FWD_CUH
#define STA_EPILOGUE_FWD_CUH

#include "mma.cuh"
#include "tile_scheduler.cuh"

namespace sta {

/* A consumer warp's output rows, normalised and stored straight from the
** accumulators (lane holds rows r0 + lane / 4 and + 8, column pairs
** 8j + 2 (lane & 3)), and their LSE; 16-byte aligned rows with the L2
** policy evict_first (written once: the L2 keeps the keys instead). */
template <typename T, int D, int BR>
__device__ __forceinline__ void store_o(const FwdParams &a, int item, const float *o,
                                        const float *m, const float *l, int r0,
                                        int lane) {
  Item x;
  decode_item<BR>(a, item, x); /* again: cheaper than keeping it live */
  const uint64_t pol = l2_policy<1>();
  T *go = reinterpret_cast<T *>(a.o) + x.b * a.o_sb + x.head * a.o_sh;
  const float ln2 = 0.69314718055994530942f;
#pragma unroll
  for (int hr = 0; hr < 2; hr++) {
    float sum = l[hr];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    /* a NaN sum (a NaN or +Inf score in the row) stays NaN in out and
    ** lse: as written before (sum > 0 ? ... : 0, : -inf) it made lse -inf */
    float inv = sum > 0.f ? 1.f / sum : sum == 0.f ? 0.f : sum;
    const int row = q_row(a, x, r0 + (lane >> 2) + 8 * hr);
    if (row < 0) continue;
    T *dst = go + (int64_t)row * a.o_ss + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < D / 8; j++) {
      uint32_t v = Mma<T>::pack(o[4 * j + 2 * hr] * inv, o[4 * j + 2 * hr + 1] * inv);
      if (a.vec) {
        st_global_hint(dst + 8 * j, v, pol);
      } else {
        uint16_t *d16 = reinterpret_cast<uint16_t *>(dst + 8 * j);
        d16[0] = (uint16_t)(v & 0xffff);
        d16[1] = (uint16_t)(v >> 16);
      }
    }
    if (a.lse && (lane & 3) == 0)
      a.lse[x.b * a.lse_sb + x.head * a.lse_sh + (int64_t)row * a.lse_ss] =
          sum == 0.f ? -INFINITY : (m[hr] + log2f(sum)) * ln2;
  }
}

} /* namespace sta */

#endif
