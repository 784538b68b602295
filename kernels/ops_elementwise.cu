/*
** ops_elementwise.cu -- copy with conversion, fill, randn and lincomb
** (axpby, scale, add) on device tensors: one kernel per operation and path
** (ops.cuh).
*/
#include "ops.cuh"

namespace {

enum Op { COPY, FILL, RANDN, LINCOMB };

struct Args {
  sta_iter it;
  int64_t units;
  float a, b, value;
  uint64_t seed;
  double mean, std;
};

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

