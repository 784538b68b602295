/*
** vsa.cuh -- what VSA's CUDA pieces share (vsa_rows.cu: the memory-bound
** row passes; vsa_coarse.cu: the coarse branch, selection and their
** backward): the backend entries, and a row operand read and written in
** units of 8 elements (ops.cuh's 16-byte loads where the rows allow).
** Every kernel here is deterministic: each sum has one order, fixed by the
** shape, so the backward's recomputation gives the forward's bits.
*/
#ifndef STA_VSA_CUH
#define STA_VSA_CUH

#include "ops.cuh"

/* The backend entries (core/backend.h's and vsa_internal.h's contracts). */
sta_status sta_cuda_vsa_means(const sta_vsa_params *p);
sta_status sta_cuda_vsa_coarse(const sta_vsa_params *p);
sta_status sta_cuda_vsa_combine(const sta_vsa_params *p);
sta_status sta_cuda_vsa_backward_prep(const sta_vsa_params *p);
sta_status sta_cuda_vsa_backward_coarse(const sta_vsa_params *p);
sta_status sta_cuda_vsa_reorder(sta_tensor *dst, const sta_tensor *src, const sta_vsa_cubes *c,
                                sta_layout layout, int32_t to_cubes);
sta_status sta_cuda_vsa_workspace(void **p, size_t nbytes);
void sta_cuda_vsa_workspace_free(void *p);
int32_t sta_cuda_vsa_capturing(void);
/* x[b, m*br + r, h, :] += g[b][h][m] / size on the valid rows of each query
** cube (kv 0) or key cube (kv 1) (vsa_rows.cu). */
sta_status sta_cuda_vsa_spread(const sta_vsa_params *p, int kv, void *x, int64_t sb, int64_t ss,
                               int64_t sh, const float *g);

namespace vsa {

/* A [B, S, heads, D] operand: element strides, its dtype. */
struct Op {
  char *p;
  int64_t sb, ss, sh;
};

__device__ __forceinline__ char *row_of(const Op &o, int dt, int64_t b, int64_t r, int64_t h) {
  return o.p + (b * o.sb + r * o.ss + h * o.sh) * esize(dt);
}

/* Up to 8 elements d0.. of a row (n = min(8, D - d0)). */
template <bool V>
__device__ __forceinline__ void load8(float x[VEC], const char *row, int dt, int d0, int n) {
  if constexpr (V) {
    Raw r;
    ld_raw(r, row + (int64_t)d0 * esize(dt), dt);
    unpack(x, r, dt);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++) x[i] = i < n ? ld1(row + (int64_t)(d0 + i) * esize(dt), dt) : 0.f;
  }
}

template <bool V>
__device__ __forceinline__ void store8(char *row, int dt, int d0, int n, const float x[VEC]) {
  if constexpr (V) {
    st8(row + (int64_t)d0 * esize(dt), dt, x);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i++)
      if (i < n) st1(row + (int64_t)(d0 + i) * esize(dt), dt, x[i]);
  }
}

/* The valid rows of cube m (sizes NULL: whole); clamped into 1..br (a
** capture skips the host's check: memory-safe whatever they hold). */
__device__ __forceinline__ int cube_rows(const int32_t *sizes, int64_t m, int br) {
  if (!sizes) return br;
  const int n = sizes[m];
  return n < 1 ? 1 : n > br ? br : n;
}

/* 16-byte units fit operand o: 8-element units start 16-byte aligned. */
inline bool vec_ok(const void *p, int64_t sb, int64_t ss, int64_t sh, int64_t D, int dt) {
  const int64_t a = dt == STA_F32 ? 4 : 8;
  return (uintptr_t)p % 16 == 0 && D % VEC == 0 && sb % a == 0 && ss % a == 0 && sh % a == 0;
}

/* The launch's error, if any, as a status. */
inline sta_status launched(const char *what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, what);
}

} /* namespace vsa */

#endif
