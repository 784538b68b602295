/*
** ops.cu -- the CUDA backend's elementwise operations and reductions:
** copy with conversion, fill, randn, lincomb (axpby, scale, add) and stats
** (core/ops.c checks the operands; sta_iter gives the iteration space).
** Bandwidth-bound, three paths chosen per call:
**   flat     every operand one contiguous run, 16-byte aligned: 8 elements
**            per unit, 16-byte loads and stores (two for f32);
**   rows     the last dim contiguous in every operand, rows of a multiple
**            of 8 elements starting 16-byte aligned: the same per row;
**   strided  anything else: 4 consecutive elements per unit, addressed
**            from their coordinates.
** Arithmetic as on the host (core/ops.c): float32, each product and sum
** rounded once (no fma contraction), stored round-to-nearest-even, so
** copy, fill, randn and lincomb give the host's bits; stats sums in a
** fixed order (deterministic for a device and a tensor).
*/
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "sta_cuda.h"

namespace {

constexpr int THREADS = 256;
constexpr int VEC = 8;   /* elements per unit of the vector paths */
constexpr int GROUP = 4; /* elements per unit of the strided path */

enum Op { COPY, FILL, RANDN, LINCOMB };
enum Path { FLAT, ROWS, STRIDED };

struct Args {
  sta_iter it;
  int64_t units;
  float a, b, value;
  uint64_t seed;
  double mean, std;
};

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

/* ---- the values ------------------------------------------------------------------ */

/* N stored randn values of logical elements g.. (g and N even). */
template <int N>
__device__ __forceinline__ void randn_values(float v[N], const Args &a, int64_t g) {
#pragma unroll
  for (int i = 0; i < N; i += 2) {
    double e, o;
    sta_randn_pair(a.seed, (uint64_t)(g + i) >> 1, &e, &o);
    v[i] = sta_randn_value(e, a.mean, a.std);
    v[i + 1] = sta_randn_value(o, a.mean, a.std);
  }
}

__device__ __forceinline__ float combine(const Args &a, float x, float y, int has_y) {
  float ax = __fmul_rn(a.a, x);
  return has_y ? __fadd_rn(ax, __fmul_rn(a.b, y)) : ax;
}

/* One element, logical index g, operand addresses p. */
template <int OP>
__device__ __forceinline__ void one(const Args &a, char *const *p, int64_t g) {
  const int dt0 = a.it.dtype[0], dt1 = a.it.dtype[1];
  float v = a.value;
  if (OP == COPY && dt0 == dt1) {
    if (dt0 == STA_F32) *(uint32_t *)p[0] = *(const uint32_t *)p[1];
    else *(uint16_t *)p[0] = *(const uint16_t *)p[1];
    return;
  }
  if (OP == COPY) v = ld1(p[1], dt1);
  if (OP == LINCOMB) {
    int has_y = a.it.nops > 2;
    v = combine(a, ld1(p[1], dt1), has_y ? ld1(p[2], a.it.dtype[2]) : 0.f, has_y);
  }
  if (OP == RANDN) {
    double e, o;
    sta_randn_pair(a.seed, (uint64_t)g >> 1, &e, &o);
    v = sta_randn_value((g & 1) ? o : e, a.mean, a.std);
  }
  st1(p[0], dt0, v);
}

/* ---- the elementwise kernel ------------------------------------------------------ */

/* A vector unit between its loads and its store. */
struct Unit {
  char *out;
  int64_t g;
  Raw x, y;
};

template <int OP, int PATH>
__device__ __forceinline__ void unit_load(Unit &n, const Args &a, int64_t u) {
  const sta_iter &it = a.it;
  int64_t c[4];
  n.g = vec_coords<PATH>(it, u, c);
  n.out = vec_addr<PATH>(it, 0, c);
  if (OP == COPY || OP == LINCOMB) ld_raw(n.x, vec_addr<PATH>(it, 1, c), it.dtype[1]);
  if (OP == LINCOMB && it.nops > 2) ld_raw(n.y, vec_addr<PATH>(it, 2, c), it.dtype[2]);
}

template <int OP>
__device__ __forceinline__ void unit_store(const Unit &n, const Args &a) {
  const sta_iter &it = a.it;
  const int dt0 = it.dtype[0];
  float v[VEC], w[VEC];
  if (OP == COPY && dt0 == it.dtype[1]) { /* the bits */
    st_raw(n.out, dt0, n.x);
    return;
  }
  if (OP == COPY || OP == LINCOMB) unpack(v, n.x, it.dtype[1]);
  if (OP == LINCOMB) {
    int has_y = it.nops > 2;
    if (has_y) unpack(w, n.y, it.dtype[2]);
#pragma unroll
    for (int i = 0; i < VEC; i++) v[i] = combine(a, v[i], has_y ? w[i] : 0.f, has_y);
  }
  if (OP == FILL)
#pragma unroll
    for (int i = 0; i < VEC; i++) v[i] = a.value;
  if (OP == RANDN) randn_values<VEC>(v, a, n.g);
  st8(n.out, dt0, v);
}

/* Vector paths: each thread loads two units (THREADS apart: both loads
** coalesced) before it stores either, so two are in flight.  Units are
** disjoint elements, and an output is its input's very view or disjoint
** from it, so the early second load reads nothing the first store writes. */
template <int OP, int PATH>
__global__ void __launch_bounds__(THREADS) ew_kernel(const Args a) {
  const sta_iter &it = a.it;
  if constexpr (PATH == STRIDED) {
    for (int64_t u = blockIdx.x * (int64_t)THREADS + threadIdx.x; u < a.units;
         u += (int64_t)gridDim.x * THREADS) {
      int64_t g = u * GROUP, c[4];
      int n = it.numel - g < GROUP ? (int)(it.numel - g) : GROUP;
      coords(it, g, c);
      for (int i = 0; i < n; i++) {
        char *p[STA_ITER_OPS];
        for (int k = 0; k < it.nops; k++) p[k] = addr(it, k, c);
        one<OP>(a, p, g + i);
        if (++c[3] == it.shape[3]) { /* carry */
          c[3] = 0;
          if (++c[2] == it.shape[2]) {
            c[2] = 0;
            if (++c[1] == it.shape[1]) { c[1] = 0; c[0]++; }
          }
        }
      }
    }
  } else {
    for (int64_t u = blockIdx.x * (int64_t)(2 * THREADS) + threadIdx.x; u < a.units;
         u += (int64_t)gridDim.x * (2 * THREADS)) {
      Unit n0, n1;
      const bool two = u + THREADS < a.units;
      unit_load<OP, PATH>(n0, a, u);
      if (two) unit_load<OP, PATH>(n1, a, u + THREADS);
      unit_store<OP>(n0, a);
      if (two) unit_store<OP>(n1, a);
    }
    /* flat: the last numel % 8 elements, one per thread of block 0 */
    if (PATH == FLAT && blockIdx.x == 0 && threadIdx.x < it.numel - a.units * VEC) {
      int64_t g = a.units * VEC + threadIdx.x;
      char *p[STA_ITER_OPS];
      for (int k = 0; k < it.nops; k++) p[k] = it.data[k] + g * esize(it.dtype[k]);
      one<OP>(a, p, g);
    }
  }
}

/* ---- stats ------------------------------------------------------------------------- */

struct Part {
  double s1, s2; /* sums of (x - shift) and its square over finite x */
  float lo, hi;
  long long bad;
};

/* The shift: element 0 when finite, else 0 (as core/ops.c). */
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

/* n values into p: float sums of the few, then double. */
template <int N>
__device__ __forceinline__ void part_add(Part &p, const float *v, int n, float shift) {
  float s = 0.f, q = 0.f;
#pragma unroll
  for (int i = 0; i < N; i++) {
    if (i >= n) break;
    if (!isfinite(v[i])) { p.bad++; continue; }
    float d = v[i] - shift;
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

/* ---- launching -------------------------------------------------------------------- */

bool aligned16(const sta_iter &it) {
  for (int k = 0; k < it.nops; k++)
    if ((uintptr_t)it.data[k] % 16) return false;
  return true;
}

/* The path of an iteration space, and its units. */
Path pick(const sta_iter &it, int64_t *units) {
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
unsigned blocks_for(int64_t units, int per_thread, int per_sm) {
  int64_t b = (units + (int64_t)THREADS * per_thread - 1) / ((int64_t)THREADS * per_thread);
  int64_t cap = (int64_t)sta_cuda_sm_count() * per_sm;
  return (unsigned)(b < 1 ? 1 : b < cap ? b : cap);
}

template <int OP>
sta_status launch(Args &a, const char *what) {
  if (a.it.numel == 0) return STA_OK;
  int64_t units;
  Path path = pick(a.it, &units);
  cudaStream_t s = sta_cuda_stream();
  a.units = units;
  switch (path) {
  case FLAT: ew_kernel<OP, FLAT><<<blocks_for(units, 2, 16), THREADS, 0, s>>>(a); break;
  case ROWS: ew_kernel<OP, ROWS><<<blocks_for(units, 2, 16), THREADS, 0, s>>>(a); break;
  default: ew_kernel<OP, STRIDED><<<blocks_for(units, 1, 16), THREADS, 0, s>>>(a); break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, what);
  return STA_OK;
}

Args args_of(int32_t nops, const sta_tensor *const *t) {
  Args a;
  memset(&a, 0, sizeof a);
  sta_iter_init(&a.it, nops, t);
  return a;
}

} /* namespace */

/* ---- the backend's entries ------------------------------------------------------ */

sta_status sta_cuda_copy(sta_tensor *dst, const sta_tensor *src) {
  const sta_tensor *t[2] = {dst, src};
  Args a = args_of(2, t);
  return launch<COPY>(a, "copy kernel launch");
}

sta_status sta_cuda_fill(sta_tensor *t, double value) {
  const sta_tensor *tt[1] = {t};
  Args a = args_of(1, tt);
  a.value = (float)value;
  return launch<FILL>(a, "fill kernel launch");
}

sta_status sta_cuda_lincomb(sta_tensor *out, float ca, const sta_tensor *x, float cb,
                            const sta_tensor *y) {
  const sta_tensor *t[3] = {out, x, y};
  Args a = args_of(y ? 3 : 2, t);
  a.a = ca;
  a.b = cb;
  return launch<LINCOMB>(a, "lincomb kernel launch");
}

sta_status sta_cuda_randn(sta_tensor *t, uint64_t seed, double mean, double std) {
  const sta_tensor *tt[1] = {t};
  Args a = args_of(1, tt);
  a.seed = seed;
  a.mean = mean;
  a.std = std;
  return launch<RANDN>(a, "randn kernel launch");
}

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
