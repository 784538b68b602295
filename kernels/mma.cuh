/*
** mma.cuh -- wgmma operands.  Shared tiles are stored as column halves of
** 64 elements (128 bytes) per row, 16-byte chunk c of row r at c ^ (r & 7):
** the 128-byte swizzle atom, 1024-byte aligned, as TMA writes them with
** CU_TENSOR_MAP_SWIZZLE_128B.  Descriptors address them; WgOps picks the
** instruction per (dtype, head dim); pack2 rounds accumulators to the
** register A operand.
*/
#ifndef STA_MMA_CUH
#define STA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "ptx.cuh"
#include "wgmma.cuh"

namespace sta {

/* element offset of (row r, 16-byte chunk ch) in a swizzled R-row tile */
__device__ __forceinline__ int swz(int r, int ch, int R) {
  return ((ch >> 3) * R + r) * 64 + (((ch & 7) ^ (r & 7)) << 3);
}

/* Shared-memory descriptors as two 32-bit words: lo = start address >> 4
** (14 bits: it never carries, shared memory < 256 KB) | LBO >> 4 << 16,
** hi = SBO >> 4 | 128-byte swizzle.  Offsets are added to lo in 32 bits:
** with warp-uniform inputs the compiler keeps them in uniform registers
** (64-bit adds had cost two moves to uniform registers per wgmma). */
__device__ __forceinline__ uint32_t sdesc_lo(const void *p, uint32_t lbo) {
  return ((smem_u32(p) & 0x3FFFF) >> 4) | ((lbo >> 4) << 16);
}
constexpr uint32_t SDESC_HI = (1024 >> 4) | (1u << 30); /* SBO 1024, SW128 */
__device__ __forceinline__ uint64_t sdesc_of(uint32_t lo) {
  return ((uint64_t)SDESC_HI << 32) | lo;
}

/* Two floats -> a packed pair of T (round to nearest). */
template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};
template <> struct Mma<__half> {
  static __device__ __forceinline__ uint32_t pack(float x, float y) {
    __half2 h = __floats2half2_rn(x, y);
    return *reinterpret_cast<uint32_t *>(&h);
  }
};

/* The wgmma of each GEMM: qk (S = Q K^T, both from shared memory, N = 128
** keys), qk192 (N = 192), pv (O += P V, P from registers, V transposed
** from shared memory, N = D). */
template <typename T, int D> struct WgOps;
template <> struct WgOps<__nv_bfloat16, 128> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_bf16(d, a, b, s); }
  static __device__ __forceinline__ void qk192(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n192_bf16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_bf16_tb(d, a, b, 1); }
};
template <> struct WgOps<__nv_bfloat16, 64> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_bf16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_bf16_tb(d, a, b, 1); }
};
template <> struct WgOps<__half, 128> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_f16(d, a, b, s); }
  static __device__ __forceinline__ void qk192(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n192_f16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n128_f16_tb(d, a, b, 1); }
};
template <> struct WgOps<__half, 64> {
  static __device__ __forceinline__ void qk(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n128_f16(d, a, b, s); }
  static __device__ __forceinline__ void pv(float *d, const uint32_t *a, uint64_t b) { sta_wgmma::rs_n64_f16_tb(d, a, b, 1); }
};

/* The backward's GEMMs from shared memory: s64 (S^T = K Q^T and dP^T = V
** dO^T, m64n64, both operands K-major); dQ = dS K, a warpgroup's D / 2
** columns: s64tt at D 128 (m64n64 from K, both MN-major), s32tn at D 64
** (m64n32 from K^T: A MN-major, B K-major). */
template <typename T> struct WgOps64;
template <> struct WgOps64<__nv_bfloat16> {
  static __device__ __forceinline__ void s64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16(d, a, b, s); }
  static __device__ __forceinline__ void s64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_bf16_tt(d, a, b, s); }
  static __device__ __forceinline__ void s32tn(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n32_bf16_tn(d, a, b, s); }
};
template <> struct WgOps64<__half> {
  static __device__ __forceinline__ void s64(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16(d, a, b, s); }
  static __device__ __forceinline__ void s64tt(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n64_f16_tt(d, a, b, s); }
  static __device__ __forceinline__ void s32tn(float *d, uint64_t a, uint64_t b, int s) { sta_wgmma::ss_n32_f16_tn(d, a, b, s); }
};

} /* namespace sta */


#endif
