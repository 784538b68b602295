/*
** ops_stats.cu -- stats on device tensors: mean, std, min, max and the
** non-finite count, per-block parts merged in a fixed order (ops.cuh).
*/
#include "ops.cuh"

namespace {

/* ---- stats ------------------------------------------------------------------------- */

struct Part {
  double s1, s2; /* sums of (x - shift) and its square over finite x */
  float lo, hi;
  long long bad;
};

/* The shift: element 0 when finite, else 0 (as core/cpu_ops.c). */
__device__ __forceinline__ float stats_shift(const sta_iter &it) {
  float v = ld1(it.data[0], it.dtype[0]);
  return isfinite(v) ? v : 0.f;
}

__device__ __forceinline__ void part_init(Part &p) {
  p.s1 = p.s2 = 0;
  p.lo = INFINITY;
  p.hi = -INFINITY;
  p.bad = 0;
}

/* n values into p, in double as core/cpu_ops.c's stats_row: float
** deviations squared lost the variance wherever the shift is far from the
** data (element 0 non-finite: shift 0; one finite value -0.76 gave std
** 1.3e-4 instead of 0). */
template <int N>
__device__ __forceinline__ void part_add(Part &p, const float *v, int n, float shift) {
  double s = 0, q = 0;
#pragma unroll
  for (int i = 0; i < N; i++) {
    if (i >= n) break;
    if (!isfinite(v[i])) { p.bad++; continue; }
    const double d = (double)v[i] - shift;
    s += d;
    q += d * d;
    p.lo = fminf(p.lo, v[i]);
    p.hi = fmaxf(p.hi, v[i]);
  }
  p.s1 += s;
  p.s2 += q;
}

__device__ __forceinline__ void part_merge(Part &p, const Part &o) {
  p.s1 += o.s1;
  p.s2 += o.s2;
  p.lo = fminf(p.lo, o.lo);
  p.hi = fmaxf(p.hi, o.hi);
  p.bad += o.bad;
}

/* Block-wide merge in a fixed order; the result in thread 0. */
__device__ void block_merge(Part &p) {
  __shared__ Part sh[THREADS / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Part q;
    q.s1 = __shfl_down_sync(0xffffffffu, p.s1, o);
    q.s2 = __shfl_down_sync(0xffffffffu, p.s2, o);
    q.lo = __shfl_down_sync(0xffffffffu, p.lo, o);
    q.hi = __shfl_down_sync(0xffffffffu, p.hi, o);
    q.bad = __shfl_down_sync(0xffffffffu, p.bad, o);
    part_merge(p, q);
  }
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = p;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < THREADS / 32; w++) part_merge(p, sh[w]);
}

template <int PATH>
__global__ void __launch_bounds__(THREADS) stats_kernel(const sta_iter it, int64_t units,
                                                        Part *parts) {
  const float shift = stats_shift(it);
  const int dt = it.dtype[0];
  Part p;
  float v[VEC];
  part_init(p);
  if constexpr (PATH == STRIDED)
    for (int64_t u = blockIdx.x * (int64_t)THREADS + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * THREADS) {
      int64_t g = u * GROUP, c[4];
      int n = it.numel - g < GROUP ? (int)(it.numel - g) : GROUP;
      coords(it, g, c);
      for (int i = 0; i < n; i++) {
        v[i] = ld1(addr(it, 0, c), dt);
        if (++c[3] == it.shape[3]) {
          c[3] = 0;
          if (++c[2] == it.shape[2]) {
            c[2] = 0;
            if (++c[1] == it.shape[1]) { c[1] = 0; c[0]++; }
          }
        }
      }
      part_add<GROUP>(p, v, n, shift);
    }
  else /* two units in flight, as ew_kernel */
    for (int64_t u = blockIdx.x * (int64_t)(2 * THREADS) + threadIdx.x; u < units;
         u += (int64_t)gridDim.x * (2 * THREADS)) {
      int64_t c[4];
      Raw r0, r1;
      const bool two = u + THREADS < units;
      vec_coords<PATH>(it, u, c);
      ld_raw(r0, vec_addr<PATH>(it, 0, c), dt);
      if (two) {
        vec_coords<PATH>(it, u + THREADS, c);
        ld_raw(r1, vec_addr<PATH>(it, 0, c), dt);
      }
      unpack(v, r0, dt);
      part_add<VEC>(p, v, VEC, shift);
      if (two) {
        unpack(v, r1, dt);
        part_add<VEC>(p, v, VEC, shift);
      }
    }
  if (PATH == FLAT && blockIdx.x == 0 && threadIdx.x < it.numel - units * VEC) {
    float v = ld1(it.data[0] + (units * VEC + threadIdx.x) * esize(dt), dt);
    part_add<1>(p, &v, 1, shift);
  }
  block_merge(p);
  if (threadIdx.x == 0) parts[blockIdx.x] = p;
}

/* One block: the parts in order, then the numbers. */
__global__ void __launch_bounds__(THREADS) stats_final(const sta_iter it, const Part *parts,
                                                       int n, sta_stats *out) {
  Part p;
  part_init(p);
  for (int i = threadIdx.x; i < n; i += THREADS) part_merge(p, parts[i]);
  block_merge(p);
  if (threadIdx.x != 0) return;
  sta_stats r;
  memset(&r, 0, sizeof r);
  r.nonfinite = p.bad;
  r.count = it.numel - p.bad;
  if (r.count > 0) {
    double m = p.s1 / (double)r.count, var = p.s2 / (double)r.count - m * m;
    r.mean = (double)stats_shift(it) + m;
    r.std = var > 0 ? sqrt(var) : 0;
    r.min = p.lo;
    r.max = p.hi;
  }
  *out = r;
}

} /* namespace */

/* ---- the backend's entry -------------------------------------------------------- */
sta_status sta_cuda_stats(const sta_tensor *t, sta_stats *out) {
  const sta_tensor *tt[1] = {t};
  sta_iter it;
  sta_iter_init(&it, 1, tt);
  if (it.numel == 0) {
    memset(out, 0, sizeof *out);
    return STA_OK;
  }
  int64_t units;
  Path path = pick(it, &units);
  unsigned blocks = blocks_for(units, path == STRIDED ? 1 : 2, 4);
  cudaStream_t s = sta_cuda_stream();
  char *buf = NULL;
  size_t nb = sizeof(Part) * blocks + sizeof(sta_stats);
  cudaError_t e = cudaMallocAsync((void **)&buf, nb, s);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaMallocAsync");
  Part *parts = (Part *)buf;
  sta_stats *res = (sta_stats *)(buf + sizeof(Part) * blocks), r;
  switch (path) {
  case FLAT: stats_kernel<FLAT><<<blocks, THREADS, 0, s>>>(it, units, parts); break;
  case ROWS: stats_kernel<ROWS><<<blocks, THREADS, 0, s>>>(it, units, parts); break;
  default: stats_kernel<STRIDED><<<blocks, THREADS, 0, s>>>(it, units, parts); break;
  }
  e = cudaGetLastError();
  if (e == cudaSuccess) {
    stats_final<<<1, THREADS, 0, s>>>(it, parts, (int)blocks, res);
    e = cudaGetLastError();
  }
  /* only the numbers cross: sizeof(sta_stats) bytes */
  if (e == cudaSuccess) e = cudaMemcpyAsync(&r, res, sizeof r, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  sta_status rc = e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "stats");
  (void)cudaFreeAsync(buf, s);
  if (rc == STA_OK) *out = r;
  return rc;
}
