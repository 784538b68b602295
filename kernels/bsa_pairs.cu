/*
** bsa_pairs.cu -- the paired block-sparse forward's pre-pass (bsa_params.h:
** bsa_pairs_prepass; the kernel: pairs_bsa.cuh).  Per (batch, head, pair p)
** the union of the lists of query blocks 2p and 2p + 1, ascending, each
** entry n << 2 | bit 0 (2p lists n) | bit 1 (2p + 1 does), and the counts
** (union, 2p's, 2p + 1's).  A query block without valid rows (q_sizes 0) or
** past Mq (odd Mq: the last pair's second) has an empty list.  Lists are
** duplicate-free (core/mask.c checks it).  One CTA of 256 threads a pair:
** two bitmaps of Mk bits in shared memory (Mk up to 163,840: 40 KB), set,
** then a scan of the words' popcounts writes the union in order; past that
** each entry's place is its rank (the distinct entries of both lists below
** it: O(L^2) a pair, lists read from global memory, a flag per entry of
** 2p + 1's list in the workspace).  Stream-ordered workspace
** (cudaMallocAsync on the library's stream: legal under graph capture).
*/
#include <stdint.h>

#include "bsa_params.h"

namespace sta {

namespace {

struct PairArgs {
  const int32_t *num, *idx, *q_sizes;
  int32_t *uidx, *ucnt;
  uint8_t *inb; /* the rank path: [rows][L] flags, B's entry is in A */
  int64_t L, ustride;
  int Mq, Mp, words; /* words: bitmap words a list (0: the rank path) */
};

constexpr int PT = 256;                /* threads a pair */
constexpr int MAX_WORDS = 40 * 1024 / 8; /* two bitmaps in 40 KB of shared memory */

/* Exclusive scan of v over the CTA (PT threads); *total the sum. */
__device__ int cta_exclusive_scan(int v, int *total) {
  __shared__ int warp_sum[PT / 32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sum[w] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int i = 0; i < PT / 32; i++) {
    before += i < w ? warp_sum[i] : 0;
    all += warp_sum[i];
  }
  *total = all;
  return before + x - v;
}

/* The set bits of W bitmap words, ascending, written out: word(w) the
** bits of word w (a bitmap in shared memory, or two of them or'ed), each
** thread its slice of the words, its place by the CTA's scan of their
** popcounts; emit(i, w, bit) writes entry i (bit `bit` of word w).  The
** count in *total.  (The union's and the sort's pass.) */
template <class Word, class Emit>
__device__ __forceinline__ void bitmap_emit(int W, const Word &word, const Emit &emit,
                                            int *total) {
  const int tid = threadIdx.x;
  const int per = (W + PT - 1) / PT, w0 = min(W, tid * per), w1 = min(W, w0 + per);
  int c = 0;
  for (int w = w0; w < w1; w++) c += __popc(word(w));
  int at = cta_exclusive_scan(c, total);
  for (int w = w0; w < w1; w++)
    for (uint32_t u = word(w); u; u &= u - 1u) emit(at++, w, __ffs((int)u) - 1);
}

__global__ void __launch_bounds__(PT) bsa_pairs_union(const PairArgs a) {
  extern __shared__ uint32_t bm[]; /* [2][words] */
  __shared__ int common;
  const int64_t r = blockIdx.x, bh = r / a.Mp;
  const int p = (int)(r - bh * a.Mp), tid = threadIdx.x;
  const int m0 = 2 * p, m1 = 2 * p + 1;
  const int64_t row0 = bh * a.Mq + m0;
  const int na = (a.q_sizes ? a.q_sizes[m0] : 64) > 0 ? a.num[row0] : 0;
  const int nb = m1 < a.Mq && (a.q_sizes ? a.q_sizes[m1] : 64) > 0 ? a.num[row0 + 1] : 0;
  const int32_t *A = a.idx + row0 * a.L, *B = A + a.L;
  int32_t *out = a.uidx + r * a.ustride;
  int total;
  if (a.words > 0) {
    const int W = a.words;
    for (int i = tid; i < 2 * W; i += PT) bm[i] = 0u;
    __syncthreads();
    for (int i = tid; i < na; i += PT) atomicOr(&bm[A[i] >> 5], 1u << (A[i] & 31));
    for (int i = tid; i < nb; i += PT) atomicOr(&bm[W + (B[i] >> 5)], 1u << (B[i] & 31));
    __syncthreads();
    bitmap_emit(
        W, [&](int w) { return bm[w] | bm[W + w]; },
        [&](int i, int w, int bit) {
          out[i] = (w * 32 + bit) << 2 | (int)(bm[w] >> bit & 1u) |
                   (int)(bm[W + w] >> bit & 1u) << 1;
        },
        &total);
  } else {
    /* the rank path: an entry's place is the number of distinct union
    ** entries below it, A's below it plus B's below it that A lacks (B's
    ** "in A" flags first, in the workspace's bytes beside the lists) */
    uint8_t *ina = a.inb + r * a.L;
    if (tid == 0) common = 0;
    __syncthreads(); /* zeroed before any thread counts */
    for (int i = tid; i < nb; i += PT) {
      const int32_t y = B[i];
      int f = 0;
      for (int j = 0; j < na; j++) f |= A[j] == y;
      ina[i] = (uint8_t)f;
      if (f) atomicAdd(&common, 1);
    }
    __syncthreads();
    /* below(x): distinct union entries below x */
    auto below = [&](int32_t x) {
      int lt = 0;
      for (int j = 0; j < na; j++) lt += A[j] < x;
      for (int j = 0; j < nb; j++) lt += B[j] < x && !ina[j];
      return lt;
    };
    for (int i = tid; i < na; i += PT) {
      const int32_t x = A[i];
      int inb = 0;
      for (int j = 0; j < nb; j++) inb |= B[j] == x;
      out[below(x)] = x << 2 | 1 | inb << 1;
    }
    for (int i = tid; i < nb; i += PT)
      if (!ina[i]) out[below(B[i])] = B[i] << 2 | 2;
    __syncthreads();
    total = na + nb - common;
  }
  if (tid == 0) {
    a.ucnt[4 * r] = total;
    a.ucnt[4 * r + 1] = na;
    a.ucnt[4 * r + 2] = nb;
    a.ucnt[4 * r + 3] = 0;
  }
}

/* Row r (b heads + h) Mq + m of idx, its first num[r] entries, ascending
** into out (same layout): a bitmap of Mk bits, then bitmap_emit. */
__global__ void __launch_bounds__(PT) bsa_sort_lists(const int32_t *num, const int32_t *idx,
                                                     int64_t L, int words, int32_t *out) {
  extern __shared__ uint32_t bm[];
  const int64_t r = blockIdx.x;
  const int tid = threadIdx.x, n = num[r];
  if (n <= 0) return;
  const int32_t *A = idx + r * L;
  int32_t *o = out + r * L;
  for (int i = tid; i < words; i += PT) bm[i] = 0u;
  __syncthreads();
  for (int i = tid; i < n; i += PT) atomicOr(&bm[A[i] >> 5], 1u << (A[i] & 31));
  __syncthreads();
  int total;
  bitmap_emit(
      words, [&](int w) { return bm[w]; }, [&](int i, int w, int bit) { o[i] = w * 32 + bit; },
      &total);
}

} /* namespace */

sta_status bsa_sort_prepass(BsaParams &x, void **ws) {
  *ws = NULL;
  const int64_t rows = (int64_t)x.batch * x.heads * x.Mq;
  const int words = (x.Mk + 31) / 32;
  if (words > 2 * MAX_WORDS || rows > 0x7fffffff || x.L < 1) return STA_OK; /* as given */
  const cudaStream_t sm = sta_cuda_stream();
  int32_t *w = NULL;
  cudaError_t e = cudaMallocAsync((void **)&w, (size_t)rows * (size_t)x.L * 4, sm);
  if (e != cudaSuccess) return sta_cuda_fail(e, "block-sparse lists sorted: workspace");
  *ws = w;
  bsa_sort_lists<<<(unsigned)rows, PT, (size_t)words * 4, sm>>>(x.num, x.idx, x.L, words, w);
  e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, "block-sparse lists sorted: the kernel");
  x.idx = w;
  return STA_OK;
}

sta_status bsa_pairs_prepass(BsaParams &x, void **ws) {
  *ws = NULL;
  const cudaStream_t sm = sta_cuda_stream();
  x.Mp = (x.Mq + 1) / 2;
  const int64_t rows = (int64_t)x.batch * x.heads * x.Mp;
  if (rows > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld query block pairs, too many for the CUDA backend",
                     (long long)rows);
  x.ustride = 2 * x.L < x.Mk ? 2 * x.L : x.Mk;
  if (x.ustride < 1) x.ustride = 1;
  const size_t b_idx = ((size_t)rows * (size_t)x.ustride * 4 + 255) & ~(size_t)255;
  const int words = (x.Mk + 31) / 32;
  const int bitmaps = words <= MAX_WORDS && x.pairs != 2; /* 2: the tests' rank path */
  const size_t b_cnt = (b_idx + (size_t)rows * 16 + 255) & ~(size_t)255;
  const size_t total = b_cnt + (bitmaps ? 0 : (size_t)rows * (size_t)x.L);
  char *w = NULL;
  cudaError_t e = cudaMallocAsync((void **)&w, total, sm);
  if (e != cudaSuccess) return sta_cuda_fail(e, "block-sparse pairs: workspace");
  *ws = w;
  x.uidx = (const int32_t *)w;
  x.ucnt = (const int32_t *)(w + b_idx);
  PairArgs pa;
  pa.num = x.num;
  pa.idx = x.idx;
  pa.q_sizes = x.q_sizes;
  pa.uidx = (int32_t *)w;
  pa.ucnt = (int32_t *)(w + b_idx);
  pa.L = x.L;
  pa.ustride = x.ustride;
  pa.Mq = x.Mq;
  pa.Mp = x.Mp;
  pa.inb = bitmaps ? NULL : (uint8_t *)(w + b_cnt);
  pa.words = bitmaps ? words : 0;
  bsa_pairs_union<<<(unsigned)rows, PT, (size_t)pa.words * 8, sm>>>(pa);
  e = cudaGetLastError();
  if (e != cudaSuccess) return sta_cuda_fail(e, "block-sparse pairs: the union's kernel");
  return STA_OK;
}

sta_status bsa_pairs_release(void *ws) {
  if (!ws) return STA_OK;
  const cudaError_t e = cudaFreeAsync(ws, sta_cuda_stream());
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "block-sparse pairs: freeing the workspace");
}

} /* namespace sta */
