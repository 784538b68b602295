/*
** ops.cuh -- what the CUDA backend's elementwise operations (ops_elementwise.cu:
** copy with conversion, fill, randn, lincomb for axpby, scale and add) and
** reductions (ops_stats.cu: stats) share: element conversions, 16-byte
** units, addressing and the choice of path (core/ops.c checks the
** operands; sta_iter gives the iteration space).
** Bandwidth-bound, three paths chosen per call:
**   flat     every operand one contiguous run, 16-byte aligned: 8 elements
**            per unit, 16-byte loads and stores (two for f32);
**   rows     the last dim contiguous in every operand, rows of a multiple
**            of 8 elements starting 16-byte aligned: the same per row;
**   strided  anything else: 4 consecutive elements per unit, addressed
**            from their coordinates.
** Arithmetic as on the host (core/cpu_ops.c): float32, each product and sum
** rounded once (no fma contraction), stored round-to-nearest-even, so
** copy, fill, randn and lincomb give the host's bits; stats sums in a
** fixed order (deterministic for a device and a tensor).
*/
#ifndef STA_OPS_CUH
#define STA_OPS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "sta_cuda.h"

namespace {

constexpr int THREADS = 256;
constexpr int VEC = 8;   /* elements per unit of the vector paths */
constexpr int GROUP = 4; /* elements per unit of the strided path */

enum Path { FLAT, ROWS, STRIDED };

/* ---- one element ------------------------------------------------------------ */

__device__ __forceinline__ float to_f32(uint16_t h, int dt) {
  return dt == STA_F16 ? __half2float(__ushort_as_half(h)) : __uint_as_float((uint32_t)h << 16);
}

/* The host's conversions (core/internal.h): RNE, the same NaN bits. */
__device__ __forceinline__ uint16_t from_f32(float f, int dt) {
  uint32_t u = __float_as_uint(f);
  if (dt == STA_F16)
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u)
                                           : __half_as_ushort(__float2half_rn(f));
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__device__ __forceinline__ float ld1(const char *p, int dt) {
  return dt == STA_F32 ? *(const float *)p : to_f32(*(const uint16_t *)p, dt);
}

__device__ __forceinline__ void st1(char *p, int dt, float v) {
  if (dt == STA_F32) *(float *)p = v;
  else *(uint16_t *)p = from_f32(v, dt);
}

__device__ __forceinline__ int esize(int dt) { return dt == STA_F32 ? 4 : 2; }

/* ---- eight elements, 16-byte aligned ----------------------------------------- */

/* The bits of 8 elements: 16 bytes, 32 for f32 (w[1]). */
struct Raw {
  uint4 w[2];
};

__device__ __forceinline__ void ld_raw(Raw &r, const char *p, int dt) {
  r.w[0] = ((const uint4 *)p)[0];
  if (dt == STA_F32) r.w[1] = ((const uint4 *)p)[1];
}

__device__ __forceinline__ void st_raw(char *p, int dt, const Raw &r) {
  ((uint4 *)p)[0] = r.w[0];
  if (dt == STA_F32) ((uint4 *)p)[1] = r.w[1];
}

__device__ __forceinline__ void unpack(float v[VEC], const Raw &r, int dt) {
  const uint32_t w[8] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w,
                         r.w[1].x, r.w[1].y, r.w[1].z, r.w[1].w};
#pragma unroll
  for (int i = 0; i < VEC; i++)
    v[i] = dt == STA_F32 ? __uint_as_float(w[i])
                         : to_f32((uint16_t)(i & 1 ? w[i / 2] >> 16 : w[i / 2] & 0xffffu), dt);
}

__device__ __forceinline__ void st8(char *p, int dt, const float v[VEC]) {
  Raw r;
  if (dt == STA_F32) {
    r.w[0] = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                        __float_as_uint(v[3]));
    r.w[1] = make_uint4(__float_as_uint(v[4]), __float_as_uint(v[5]), __float_as_uint(v[6]),
                        __float_as_uint(v[7]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
      w[i] = (uint32_t)from_f32(v[2 * i], dt) | ((uint32_t)from_f32(v[2 * i + 1], dt) << 16);
    r.w[0] = make_uint4(w[0], w[1], w[2], w[3]);
  }
  st_raw(p, dt, r);
}

/* ---- addressing --------------------------------------------------------------- */

/* q = n / d, n - q*d; 32-bit when both fit (the usual case). */
__device__ __forceinline__ int64_t divmod(int64_t n, int64_t d, int64_t *r) {
  if (((uint64_t)n | (uint64_t)d) >> 32 == 0) {
    uint32_t q = (uint32_t)n / (uint32_t)d;
    *r = (int64_t)((uint32_t)n - q * (uint32_t)d);
    return q;
  }
  int64_t q = n / d;
  *r = n - q * d;
  return q;
}

/* Coordinates of logical element g in the iteration space. */
__device__ __forceinline__ void coords(const sta_iter &it, int64_t g, int64_t c[4]) {
  int64_t r = divmod(g, it.shape[3], &c[3]);
  r = divmod(r, it.shape[2], &c[2]);
  c[0] = divmod(r, it.shape[1], &c[1]);
}

__device__ __forceinline__ char *addr(const sta_iter &it, int k, const int64_t c[4]) {
  const int64_t *s = it.stride[k];
  return it.data[k] + (c[0] * s[0] + c[1] * s[1] + c[2] * s[2] + c[3] * s[3]) * esize(it.dtype[k]);
}

/* Coordinates (and logical index) of vector unit u's first element. */
template <int PATH>
__device__ __forceinline__ int64_t vec_coords(const sta_iter &it, int64_t u, int64_t c[4]) {
  if (PATH == FLAT) {
    c[0] = c[1] = c[2] = 0;
    c[3] = u * VEC;
    return c[3];
  }
  int64_t row = divmod(u, it.shape[3] / VEC, &c[3]);
  c[3] *= VEC;
  int64_t r = divmod(row, it.shape[2], &c[2]);
  c[0] = divmod(r, it.shape[1], &c[1]);
  return row * it.shape[3] + c[3];
}

/* Operand k's address at coordinates c (FLAT: c[3] alone). */
template <int PATH>
__device__ __forceinline__ char *vec_addr(const sta_iter &it, int k, const int64_t c[4]) {
  if (PATH == FLAT) return it.data[k] + c[3] * esize(it.dtype[k]);
  return addr(it, k, c);
}

/* ---- launching -------------------------------------------------------------------- */

inline bool aligned16(const sta_iter &it) {
  for (int k = 0; k < it.nops; k++)
    if ((uintptr_t)it.data[k] % 16) return false;
  return true;
}

/* The path of an iteration space, and its units. */
inline Path pick(const sta_iter &it, int64_t *units) {
  bool last1 = true, outer8 = true;
  for (int k = 0; k < it.nops; k++) {
    last1 = last1 && it.stride[k][3] == 1;
    for (int d = 0; d < 3; d++) outer8 = outer8 && it.stride[k][d] % VEC == 0;
  }
  if (last1 && aligned16(it)) {
    if (it.ndim == 1) {
      *units = it.numel / VEC;
      return FLAT;
    }
    if (it.shape[3] % VEC == 0 && outer8) {
      *units = it.numel / VEC;
      return ROWS;
    }
  }
  *units = (it.numel + GROUP - 1) / GROUP;
  return STRIDED;
}

/* Blocks for units of work, per_thread units per thread, at most per_sm
** blocks per SM (the kernels loop over the rest). */
inline unsigned blocks_for(int64_t units, int per_thread, int per_sm) {
  int64_t b = (units + (int64_t)THREADS * per_thread - 1) / ((int64_t)THREADS * per_thread);
  int64_t cap = (int64_t)sta_cuda_sm_count() * per_sm;
  return (unsigned)(b < 1 ? 1 : b < cap ? b : cap);
}

} /* namespace */

#endif
