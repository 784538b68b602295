/*
** bwd_rows.cuh -- the backward's row kernels (prep: LSE and D in slot order,
** the dQ accumulator zeroed;
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

/* The row kernels take a slot row per RT = D / 8 threads, 8 columns (16
** bytes of T) each: 256 / RT rows per 256-thread block. */
template <int D> struct Rows {
  static constexpr int RT = D / 8, PER_BLOCK = 256 / RT;
};

/* 8 elements of T from p (one 16-byte load when vec) as floats. */
template <typename T>
__device__ __forceinline__ void load8(const T *p, int vec, float *f) {
  if (vec) {
    const uint4 u = *reinterpret_cast<const uint4 *>(p);
    const T *t = reinterpret_cast<const T *>(&u);
#pragma unroll
    for (int e = 0; e < 8; e++) f[e] = to_f<T>(t[e]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) f[e] = to_f<T>(p[e]);
  }
}

/* Slot row i (RT threads, columns c .. c + 7 each): LSE * log2(e) and D_i =
** dO . O in slot order, and the row's part of the f32 dQ accumulator
** zeroed (dq_acc_at). */
template <typename T, int D>
__global__ void sta_bwd_prep(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  constexpr int RT = Rows<D>::RT;
  const int64_t i = (int64_t)blockIdx.x * Rows<D>::PER_BLOCK + threadIdx.x / RT;
  const int c = (int)(threadIdx.x % RT) * 8;
  if (i >= r.rows) return; /* whole warps: rows is a multiple of 64 */
  const int rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  float acc = 0.f, l2 = 0.f;
  if (s >= 0) {
    const T *o = reinterpret_cast<const T *>(r.o) + b * r.o_sb + s * r.o_ss + h * r.o_sh + c;
    const T *g = reinterpret_cast<const T *>(r.dout) + b * r.do_sb + s * r.do_ss + h * r.do_sh + c;
    float fo[8], fg[8];
    load8<T>(o, r.vec_od, fo);
    load8<T>(g, r.vec_od, fg);
#pragma unroll
    for (int e = 0; e < 8; e++) acc += fo[e] * fg[e];
    l2 = r.lse[b * r.lse_sb + h * r.lse_sh + s * r.lse_ss] * LOG2E;
  }
#pragma unroll
  for (int m = RT / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  float4 *z = reinterpret_cast<float4 *>(a.dqacc + dq_acc_at<D>(sbh, rr, c));
  z[0] = make_float4(0.f, 0.f, 0.f, 0.f);
  z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (c == 0) {
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

/* Slot row i (RT threads, 8 columns each): dq = scale * the accumulator,
** at the row's place. */
template <typename T, int D>
__global__ void sta_bwd_post(const __grid_constant__ BwdArgs a, const __grid_constant__ RowArgs r) {
  constexpr int RT = Rows<D>::RT;
  const int64_t i = (int64_t)blockIdx.x * Rows<D>::PER_BLOCK + threadIdx.x / RT;
  const int c = (int)(threadIdx.x % RT) * 8;
  if (i >= r.rows) return;
  const int rr = (int)(i % BQ);
  const int64_t sbh = i / BQ, bh = sbh / a.nqb, b = bh / a.heads, h = bh % a.heads;
  const int slot = (int)(sbh % a.nqb), s = slot_row(a, slot, rr);
  if (s < 0) return;
  const float4 *acc = reinterpret_cast<const float4 *>(a.dqacc + dq_acc_at<D>(sbh, rr, c));
  const float4 x0 = acc[0], x1 = acc[1];
  const float f[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  T *q = reinterpret_cast<T *>(r.dq) + b * r.dq_sb + s * r.dq_ss + h * r.dq_sh + c;
  if (r.vec_dq) {
    uint4 u;
    uint32_t *w = reinterpret_cast<uint32_t *>(&u);
#pragma unroll
    for (int e = 0; e < 4; e++) w[e] = Mma<T>::pack(f[2 * e] * a.scale, f[2 * e + 1] * a.scale);
    *reinterpret_cast<uint4 *>(q) = u;
  } else {
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = T(f[e] * a.scale);
  }
}

template <typename T, int D>
sta_status run_bwd(const sta_attn_params *p, const BwdArgs &x, const RowArgs &ra,
                   cudaStream_t st) {
  const int smem = Smem<D>::BYTES;
  void (*kern)(const BwdArgs) = p->deterministic ? sta_bwd_kernel<T, D, true>
                                                 : sta_bwd_kernel<T, D, false>;
  cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return sta_cuda_fail(e, "backward: shared memory attribute");
  const unsigned rblocks = (unsigned)((ra.rows + Rows<D>::PER_BLOCK - 1) / Rows<D>::PER_BLOCK);
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
