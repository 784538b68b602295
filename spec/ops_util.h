/* ops_util.h -- random views for the elementwise-operation tests
** (test_ops.c on the host, test_gpu_ops.c against it).  Header-only. */
#ifndef STA_OPS_UTIL_H
#define STA_OPS_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "test_util.h"

static uint64_t ops_rng = 88172645463325252ull;

static inline uint64_t ops_rnd(void) {
  ops_rng ^= ops_rng << 13;
  ops_rng ^= ops_rng >> 7;
  ops_rng ^= ops_rng << 17;
  return ops_rng;
}
static inline int64_t ops_in(int64_t lo, int64_t hi) { /* inclusive */
  return lo + (int64_t)(ops_rnd() % (uint64_t)(hi - lo + 1));
}

/* Seed from STA_TEST_SEED or the clock; printed so a failure can be
** replayed. */
static inline void ops_seed(const char *name) {
  const char *s = getenv("STA_TEST_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
  printf("# %s: STA_TEST_SEED=%llu\n", name, (unsigned long long)seed);
  ops_rng = seed * 2654435761ull + 1;
  for (int i = 0; i < 8; i++) ops_rnd();
}

/* Where a view lies in its storage: dims stored in a random order, each
** padded, a leading offset; `total` elements of storage. */
typedef struct ops_layout {
  int32_t nd;
  int64_t shape[4], stride[4], offset, total;
} ops_layout;

/* A random layout of shape.  kind 0: contiguous at offset 0; 1: contiguous
** at a random offset (an odd one breaks 16-byte alignment); 2: permuted
** and padded (any strides); 3: rows (the last dim innermost, rows padded
** by 0 or 8 elements, offset a multiple of 8: with a last dim of a
** multiple of 8, every row starts 16-byte aligned). */
static inline ops_layout ops_layout_of(int32_t nd, const int64_t *shape, int kind) {
  ops_layout l;
  int32_t perm[4] = {0, 1, 2, 3};
  int64_t pad[4] = {0, 0, 0, 0};
  memset(&l, 0, sizeof l);
  l.nd = nd;
  memcpy(l.shape, shape, sizeof(int64_t) * (size_t)nd);
  if (kind == 2)
    for (int32_t i = nd - 1; i > 0; i--) {
      int32_t j = (int32_t)ops_in(0, i), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
      pad[i] = ops_in(0, 2);
    }
  if (kind == 2) pad[0] = ops_in(0, 2);
  if (kind == 3)
    for (int32_t i = 0; i < nd; i++) pad[i] = i == nd - 1 ? 8 * ops_in(0, 1) : ops_in(0, 2);
  int64_t s = 1;
  for (int32_t i = nd - 1; i >= 0; i--) { /* perm[nd-1] is innermost */
    l.stride[perm[i]] = s;
    s *= shape[perm[i]] + pad[perm[i]];
  }
  l.offset = kind == 0 ? 0 : kind == 3 ? 8 * ops_in(0, 2) : ops_in(0, 9);
  l.total = l.offset + s;
  return l;
}

/* A random shape of 1..4 dims, numel up to about max. */
static inline int32_t ops_shape(int64_t *shape, int64_t max) {
  int32_t nd = (int32_t)ops_in(1, 4);
  int64_t n = 1;
  for (int32_t i = 0; i < nd; i++) {
    int64_t hi = max / n;
    shape[i] = ops_in(1, hi < 1 ? 1 : hi > 64 ? 64 : hi);
    if (ops_in(0, 9) == 0) shape[i] = 1;
    n *= shape[i];
  }
  return nd;
}

/* The view of layout l over the 1-D storage tensor base. */
static inline sta_tensor *ops_view(const sta_tensor *base, const ops_layout *l) {
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_view(&v, base, l->offset, l->nd, l->shape, l->stride), STA_OK);
  return v;
}

/* A fresh storage for l on dev, every element random (not zeros). */
static inline sta_tensor *ops_storage(sta_dtype dt, sta_device dev, const ops_layout *l, uint64_t seed) {
  sta_tensor *b = NULL;
  assert_int_equal(sta_tensor_create(&b, dt, dev, 1, &l->total), STA_OK);
  assert_int_equal(sta_tensor_randn(b, seed, 0.5, 2.0), STA_OK);
  return b;
}

static inline sta_dtype ops_dtype(void) { return (sta_dtype)ops_in(0, 2); }

/* 1 when a and b (same shape, any devices) hold the same bits, or both
** NaN, at every element; else prints the first difference. */
static inline int ops_same(const sta_tensor *a, const sta_tensor *b, const char *what) {
  sta_tensor *ha = NULL, *hb = NULL;
  assert_int_equal(sta_tensor_to(&ha, a, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&hb, b, STA_F32, STA_CPU), STA_OK);
  const uint32_t *x = sta_tensor_data(ha), *y = sta_tensor_data(hb);
  int64_t n = sta_tensor_numel(ha);
  int ok = 1;
  for (int64_t i = 0; i < n && ok; i++) {
    float fx, fy;
    memcpy(&fx, &x[i], 4);
    memcpy(&fy, &y[i], 4);
    if (x[i] != y[i] && !(isnan(fx) && isnan(fy))) {
      printf("# %s: element %lld differs: %.9g vs %.9g\n", what, (long long)i, (double)fx,
             (double)fy);
      ok = 0;
    }
  }
  sta_tensor_destroy(ha);
  sta_tensor_destroy(hb);
  return ok;
}

/* mask[i] = 1 for the storage elements layout l addresses (free()). */
static inline char *ops_mask(const ops_layout *l) {
  char *m = calloc((size_t)l->total, 1);
  int64_t n = 1;
  assert_non_null(m);
  for (int32_t d = 0; d < l->nd; d++) n *= l->shape[d];
  for (int64_t i = 0; i < n; i++) {
    int64_t r = i, off = l->offset;
    for (int32_t d = l->nd - 1; d >= 0; d--) {
      off += (r % l->shape[d]) * l->stride[d];
      r /= l->shape[d];
    }
    m[off] = 1;
  }
  return m;
}

/* The values of t (any device, dtype, strides) as a host float array in
** row-major order (free()). */
static inline float *ops_values(const sta_tensor *t) {
  sta_tensor *h = NULL;
  assert_int_equal(sta_tensor_to(&h, t, STA_F32, STA_CPU), STA_OK);
  size_t n = (size_t)sta_tensor_numel(h);
  float *v = malloc((n ? n : 1) * sizeof *v);
  assert_non_null(v);
  memcpy(v, sta_tensor_data(h), n * sizeof *v);
  sta_tensor_destroy(h);
  return v;
}

/* Storage elements outside mask kept their bits (before: ops_values of
** the storage taken before the call). */
static inline void ops_outside_kept(const sta_tensor *base, const float *before, const char *mask,
                             const char *what) {
  float *after = ops_values(base);
  int64_t n = sta_tensor_numel(base);
  for (int64_t i = 0; i < n; i++)
    if (!mask[i] && memcmp(&before[i], &after[i], 4) != 0)
      fail_msg("%s: storage element %lld outside the view changed", what, (long long)i);
  free(after);
}

#endif
