/*
** bsa_check.cu -- the block lists checked where they live (the CUDA
** backend's check_lists, core/backend.h; sta_mask_check_lists' seam):
** sizes in 1..block_rows, num in 0..L, indices in [0, Mk) and none twice in
** one list, the first fault in the host check's order (kv_sizes, q_sizes,
** then (b, h, m, entry)) reported with its messages (core/mask.c).  Two
** kernels write the first faulting place of each kind by atomicMin; one
** readback of 24 bytes; the details of a fault (its value, the earlier
** entry of a repeat) are read back only then.  Under a CUDA graph capture
** (no read-back possible) a third kernel in the graph checks the keys at
** each replay and stops it at a fault (bsa_check_gate).
*/
#include <limits.h>
#include <stdlib.h>

#include "sta_cuda.h"
#include "vsa.cuh" /* sta_cuda_vsa_capturing: is this thread's stream being captured */

namespace {

constexpr unsigned long long NONE = ~0ull;

/* keys[0], keys[1]: the first kv / q size outside 1..bv */
__global__ void bsa_check_sizes(const int32_t *ks, int64_t nk, const int32_t *qs, int64_t nq,
                                int bv, unsigned long long *keys) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (ks && t < nk && (ks[t] < 1 || ks[t] > bv)) atomicMin(&keys[0], (unsigned long long)t);
  if (qs && t < nq && (qs[t] < 1 || qs[t] > bv)) atomicMin(&keys[1], (unsigned long long)t);
}

/* keys[2]: the first faulting (row, entry) as row (L + 1) + (0: num, else
** entry + 1); a block a row at a time, first[] (Mk ints of shared memory)
** the first entry of each key block in the row, or, where Mk does not fit
** (big), every entry against the earlier ones. */
__global__ void bsa_check_rows(const int32_t *num, const int32_t *idx, int64_t L, int Mk,
                               int64_t rows, int big, unsigned long long *keys) {
  extern __shared__ int first[];
  __shared__ int red[32];
  const int tid = threadIdx.x, bd = blockDim.x;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int n = num[row];
    if (n < 0 || n > L) {
      if (tid == 0) atomicMin(&keys[2], (unsigned long long)row * (L + 1));
      continue;
    }
    const int32_t *x = idx + row * L;
    if (!big) {
      for (int k = tid; k < Mk; k += bd) first[k] = INT_MAX;
      __syncthreads();
      for (int i = tid; i < n; i += bd)
        if (x[i] >= 0 && x[i] < Mk) atomicMin(&first[x[i]], i);
      __syncthreads();
    }
    int best = INT_MAX;
    for (int i = tid; i < n; i += bd) {
      const int v = x[i];
      int bad = v < 0 || v >= Mk;
      if (!bad && !big) bad = first[v] < i;
      for (int j = 0; big && !bad && j < i; j++) bad = x[j] == v;
      if (bad) best = min(best, i);
    }
    best = __reduce_min_sync(0xffffffffu, best);
    if ((tid & 31) == 0) red[tid >> 5] = best;
    __syncthreads();
    if (tid < 32) {
      int b = tid < bd / 32 ? red[tid] : INT_MAX;
      b = __reduce_min_sync(0xffffffffu, b);
      if (tid == 0 && b < INT_MAX)
        atomicMin(&keys[2], (unsigned long long)row * (L + 1) + (unsigned long long)b + 1);
    }
    __syncthreads(); /* first[] and red[] again */
  }
}

/* Under a CUDA graph capture nothing can be read back: the two kernels
** above run in the graph and this one after them, before the attention's
** kernels.  A fault stops the replay here, before any kernel reads a list
** out of range: the message core/mask.c's host check gives (device
** printf, on the process's stdout) and a trap, which the next
** synchronizing call reports as a CUDA error (the context is lost, as with
** a device-side assertion). */
__global__ void bsa_check_gate(const unsigned long long *keys, const int32_t *ks,
                               const int32_t *qs, const int32_t *num, const int32_t *idx,
                               int64_t L, int64_t Mk, int64_t heads, int64_t Mq, int bv) {
  const char *const sn[2] = {"blocks.kv_sizes", "blocks.q_sizes"};
  const int32_t *sz[2] = {ks, qs};
  for (int i = 0; i < 2; i++)
    if (keys[i] != NONE) {
      printf("sta: %s[%lld]: %d is outside 1..%d (block_rows) (a CUDA graph's replay)\n", sn[i],
             (long long)keys[i], (int)sz[i][keys[i]], bv);
      __trap();
    }
  if (keys[2] == NONE) return;
  const int64_t row = (int64_t)(keys[2] / (unsigned long long)(L + 1));
  const int64_t pos = (int64_t)(keys[2] % (unsigned long long)(L + 1));
  const long long b = (long long)(row / (heads * Mq)), h = (long long)(row / Mq % heads),
                  m = (long long)(row % Mq);
  if (pos == 0) {
    printf("sta: blocks.num[b=%lld, h=%lld, m=%lld]: %d is outside 0..%lld (L, the entries of "
           "idx per query block) (a CUDA graph's replay)\n", b, h, m, (int)num[row],
           (long long)L);
    __trap();
  }
  const int i = (int)(pos - 1);
  const int32_t *x = idx + row * L;
  const int v = x[i];
  int j = 0;
  while (j < i && x[j] != v) j++;
  if (v < 0 || v >= Mk)
    printf("sta: blocks.idx[b=%lld, h=%lld, m=%lld]: entry %d is key block %d, outside 0..%lld "
           "(a CUDA graph's replay)\n", b, h, m, i, v, (long long)(Mk - 1));
  else
    printf("sta: blocks.idx[b=%lld, h=%lld, m=%lld]: key block %d is listed twice (entries %d "
           "and %d) (a CUDA graph's replay)\n", b, h, m, v, j, i);
  __trap();
}

sta_status fetch(void *dst, const void *src, size_t bytes, cudaStream_t s) {
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "block list check: readback");
}

} /* namespace */

sta_status sta_cuda_check_lists(const sta_attn_params *p) {
  cudaStream_t s = sta_cuda_stream();
  const int64_t rows = p->batch * p->heads * p->q_blocks, L = p->list_len, Mk = p->kv_blocks;
  const int32_t *qs = p->q_sizes != p->kv_sizes ? p->q_sizes : NULL;
  unsigned long long *keys = NULL, h[3];
  cudaError_t e = cudaMallocAsync((void **)&keys, sizeof h, s);
  if (e != cudaSuccess) return sta_cuda_fail(e, "block list check: workspace");
  sta_status rc = STA_OK;
  if ((e = cudaMemsetAsync(keys, 0xff, sizeof h, s)) != cudaSuccess)
    rc = sta_cuda_fail(e, "block list check");
  const int64_t ns = Mk > p->q_blocks ? Mk : p->q_blocks;
  if (rc == STA_OK && ns > 0)
    bsa_check_sizes<<<(unsigned)((ns + 255) / 256), 256, 0, s>>>(p->kv_sizes, Mk, qs, p->q_blocks,
                                                                  p->block_rows, keys);
  const int big = Mk * 4 > 160 * 1024;
  if (rc == STA_OK && rows > 0) {
    const size_t sm = big ? 0 : (size_t)Mk * 4;
    if (sm > 48 * 1024 &&
        (e = cudaFuncSetAttribute(bsa_check_rows, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)sm)) != cudaSuccess)
      rc = sta_cuda_fail(e, "block list check");
    const int64_t grid = rows < 8 * sta_cuda_sm_count() ? rows : 8 * sta_cuda_sm_count();
    if (rc == STA_OK)
      bsa_check_rows<<<(unsigned)grid, 256, sm, s>>>(p->num, p->idx, L, (int)Mk, rows, big, keys);
  }
  if (rc == STA_OK && sta_cuda_vsa_capturing()) { /* no read-back: the gate above */
    bsa_check_gate<<<1, 1, 0, s>>>(keys, p->kv_sizes, qs, p->num, p->idx, L, Mk, p->heads,
                                   p->q_blocks, p->block_rows);
    if ((e = cudaGetLastError()) != cudaSuccess) rc = sta_cuda_fail(e, "block list check");
    cudaFreeAsync(keys, s);
    return rc;
  }
  if (rc == STA_OK && (e = cudaGetLastError()) != cudaSuccess)
    rc = sta_cuda_fail(e, "block list check");
  if (rc == STA_OK) rc = fetch(h, keys, sizeof h, s);
  cudaFreeAsync(keys, s);
  if (rc != STA_OK) return rc;
  /* the messages of core/mask.c's host check */
  static const char *const SN[2] = {"blocks.kv_sizes", "blocks.q_sizes"};
  const int32_t *sz[2] = {p->kv_sizes, qs};
  for (int i = 0; i < 2; i++)
    if (h[i] != NONE) {
      int32_t v = 0;
      if ((rc = fetch(&v, sz[i] + h[i], 4, s)) != STA_OK) return rc;
      return sta_error(STA_ERR_ARGUMENT, "%s[%lld]: %d is outside 1..%d (block_rows)", SN[i],
                       (long long)h[i], (int)v, (int)p->block_rows);
    }
  if (h[2] == NONE) return STA_OK;
  const int64_t row = (int64_t)(h[2] / (unsigned long long)(L + 1));
  const int64_t pos = (int64_t)(h[2] % (unsigned long long)(L + 1));
  const long long b = (long long)(row / (p->heads * p->q_blocks)),
                  hh = (long long)(row / p->q_blocks % p->heads), m = (long long)(row % p->q_blocks);
  int32_t v = 0;
  if (pos == 0) {
    if ((rc = fetch(&v, p->num + row, 4, s)) != STA_OK) return rc;
    return sta_error(STA_ERR_ARGUMENT, "blocks.num[b=%lld, h=%lld, m=%lld]: %d is outside "
                     "0..%lld (L, the entries of idx per query block)", b, hh, m, (int)v,
                     (long long)L);
  }
  const int i = (int)(pos - 1);
  int32_t *rowv = (int32_t *)malloc(sizeof(int32_t) * (size_t)(i + 1));
  if (!rowv) return sta_error(STA_ERR_NOMEM, "out of host memory (block list check)");
  if ((rc = fetch(rowv, p->idx + row * L, sizeof(int32_t) * (size_t)(i + 1), s)) != STA_OK) {
    free(rowv);
    return rc;
  }
  v = rowv[i];
  int j = 0;
  while (j < i && rowv[j] != v) j++;
  free(rowv);
  if (v < 0 || v >= Mk)
    return sta_error(STA_ERR_ARGUMENT, "blocks.idx[b=%lld, h=%lld, m=%lld]: entry %d is key "
                     "block %d, outside 0..%lld", b, hh, m, i, (int)v, (long long)(Mk - 1));
  return sta_error(STA_ERR_ARGUMENT, "blocks.idx[b=%lld, h=%lld, m=%lld]: key block %d is "
                   "listed twice (entries %d and %d)", b, hh, m, (int)v, j, i);
}
