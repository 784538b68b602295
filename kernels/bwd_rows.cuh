/*
** bwd_rows.cuh -- the backward's row kernels (prep: LSE and D in slot order;
** zero: dK = dV = 0 on the rows that are never keys; post: dq from the
** accumulator) and run_bwd, the three launches of one (dtype, head dim).
*/
#ifndef STA_BWD_ROWS_CUH
#define STA_BWD_ROWS_CUH

#include "kernel_bwd.cuh"

namespace sta {

template <typename T> __device__ __forceinline__ float to_f(T x);
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <> __device__ __forceinline__ float to_f<__half>(__half x) { return __half2float(x); }

/* One warp per slot row: LSE * log2(e) and D_i = dO . O in slot order. */
template <typename T, int D>
__global__ void sta_bwd_prep(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= r.rows) return;
  const int lane = threadIdx.x & 31, rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  float acc = 0.f, l2 = 0.f;
  if (s >= 0) {
    const T *o = reinterpret_cast<const T *>(r.o) + b * r.o_sb + s * r.o_ss + h * r.o_sh;
    const T *g = reinterpret_cast<const T *>(r.dout) + b * r.do_sb + s * r.do_ss + h * r.do_sh;
#pragma unroll
    for (int d = lane; d < D; d += 32) acc += to_f<T>(o[d]) * to_f<T>(g[d]);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    l2 = r.lse[b * r.lse_sb + h * r.lse_sh + s * r.lse_ss] * LOG2E;
  }
  if (lane == 0) {
    const_cast<float *>(a.dd)[i] = acc;
    const_cast<float *>(a.lse2)[i] = l2;
  }
}

/* One warp per (batch, head, sequence row): dK = dV = 0 on the rows that
** are never keys. */
template <typename T, int D>
__global__ void sta_bwd_zero(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  const int64_t n = (int64_t)a.batch * a.heads * (a.S - r.keys);
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= n) return;
  const int lane = threadIdx.x & 31;
  const int64_t bh = i / (a.S - r.keys), b = bh / a.heads, h = bh % a.heads;
  const int s = r.keys + (int)(i % (a.S - r.keys));
  T *k = reinterpret_cast<T *>(r.dk) + b * r.dk_sb + s * r.dk_ss + h * r.dk_sh;
  T *v = reinterpret_cast<T *>(r.dv) + b * r.dv_sb + s * r.dv_ss + h * r.dv_sh;
  for (int d = lane; d < D; d += 32) {
    k[d] = T(0.f);
    v[d] = T(0.f);
  }
}

/* One warp per slot row: dq = scale * the accumulator, at the row's place. */
template <typename T, int D>
__global__ void sta_bwd_post(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  int64_t i = (int64_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (i >= r.rows) return;
  const int lane = threadIdx.x & 31, rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  if (s < 0) return;
  T *q = reinterpret_cast<T *>(r.dq) + b * r.dq_sb + s * r.dq_ss + h * r.dq_sh;
  const float *acc = a.dqacc + sbh * (D / 64) * 64 * 64;
  for (int d = lane; d < D; d += 32)
    q[d] = T(acc[(d >> 6) * 64 * 64 + dq_off(rr, d & 63)] * a.scale);
}

template <typename T, int D>
sta_status run_bwd(const sta_attn_params *p, const BwdArgs &x, const RowArgs &ra,
                   cudaStream_t st) {
  const int smem = Smem<D>::BYTES;
  void (*kern)(const BwdArgs) = p->deterministic ? sta_bwd_kernel<T, D, true>
                                                 : sta_bwd_kernel<T, D, false>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "backward: shared memory attribute");
  const unsigned rblocks = (unsigned)((ra.rows + 7) / 8);
  sta_bwd_prep<T, D><<<rblocks, 256, 0, st>>>(x, ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: prep launch");
  const int64_t nz = p->batch * p->heads * (p->seq_len - ra.keys);
  if (nz > 0) {
    sta_bwd_zero<T, D><<<(unsigned)((nz + 7) / 8), 256, 0, st>>>(x, ra);
    if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: zero launch");
  }
  const int64_t items = (int64_t)p->batch * p->heads *
                        (x.n_text_kb + (int64_t)x.NT * x.NH * x.NW * x.kbpt);
  if (items > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld key blocks exceed one launch",
                     (long long)items);
  if (items > 0) {
    kern<<<(unsigned)items, NTH, smem, st>>>(x);
    if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: launch");
  }
  sta_bwd_post<T, D><<<rblocks, 256, 0, st>>>(x, ra);
  if ((e = cudaGetLastError()) != cudaSuccess) return sta_cuda_fail(e, "backward: post launch");
  return STA_OK;
}

} /* namespace sta */

#endif
