/* test_ops.c -- elementwise operations and reductions on the host:
** axpby, scale, add, copy, fill, randn and stats on random shapes, views
** (permuted, padded, offset) and mixed dtypes against references in
** double; the iteration space's dim merging; every error path (NULL,
** shape, device, backend, overlap, coefficients) with its exact message
** and nothing changed.  STA_TEST_SEED replays a run. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "ops_util.h"

/* Relative rounding unit of a dtype. */
static double unit(sta_dtype dt) {
  return dt == STA_F32 ? 0x1p-24 : dt == STA_F16 ? 0x1p-11 : 0x1p-8;
}

/* ---- axpby, scale, add ---------------------------------------------------- */

enum { AXPBY, SCALE, ADD, ADD_ALIAS };

static void lincomb_case(int c) {
  int64_t shape[4];
  int32_t nd = ops_shape(shape, 3000);
  int op = (int)ops_in(0, 3);
  sta_dtype dt[3] = {ops_dtype(), ops_dtype(), ops_dtype()};
  ops_layout l[3];
  sta_tensor *base[3], *v[3];
  for (int k = 0; k < 3; k++) {
    l[k] = ops_layout_of(nd, shape, (int)ops_in(0, 2));
    base[k] = ops_storage(dt[k], STA_CPU, &l[k], ops_rnd());
    v[k] = ops_view(base[k], &l[k]);
  }
  double a = (double)ops_in(-300, 300) / 100, b = (double)ops_in(-300, 300) / 100;
  float *x = ops_values(v[1]), *y = ops_values(v[2]), *o = ops_values(v[0]);
  float *before = ops_values(base[0]);
  char *mask = ops_mask(&l[0]);
  char what[96];
  snprintf(what, sizeof what, "case %d op %d dtypes %s %s %s", c, op, sta_dtype_name(dt[0]),
           sta_dtype_name(dt[1]), sta_dtype_name(dt[2]));
  sta_status rc;
  switch (op) {
  case AXPBY: rc = sta_tensor_axpby(v[0], a, v[1], b); break;
  case SCALE: rc = sta_tensor_scale(v[0], a); break;
  case ADD: rc = sta_tensor_add(v[0], v[1], v[2]); break;
  default: rc = sta_tensor_add(v[0], v[0], v[2]); break; /* out is x */
  }
  if (rc != STA_OK) fail_msg("%s: %s", what, sta_last_error());
  float *got = ops_values(v[0]);
  int64_t n = sta_tensor_numel(v[0]);
  for (int64_t i = 0; i < n; i++) {
    double p, q;
    switch (op) {
    case AXPBY: p = (double)(float)a * x[i]; q = (double)(float)b * o[i]; break;
    case SCALE: p = (double)(float)a * o[i]; q = 0; break;
    case ADD: p = x[i]; q = y[i]; break;
    default: p = o[i]; q = y[i]; break;
    }
    double want = p + q, tol = fabs(want) * unit(dt[0]) + (fabs(p) + fabs(q)) * 0x1p-23 + 1e-7;
    if (!(fabs(got[i] - want) <= tol))
      fail_msg("%s: element %lld is %.9g, want %.9g", what, (long long)i, (double)got[i], want);
  }
  ops_outside_kept(base[0], before, mask, what);
  free(x); free(y); free(o); free(got); free(before); free(mask);
  for (int k = 0; k < 3; k++) {
    sta_tensor_destroy(v[k]);
    sta_tensor_destroy(base[k]);
  }
}

static void test_lincomb_views(void **state) {
  (void)state;
  for (int c = 0; c < 120; c++) lincomb_case(c);
}

/* ---- copy, fill, randn ------------------------------------------------------ */

/* Any dtype a host tensor holds values of, f8e4m3 (1 byte) included: the
** loops that store elements must take every element size (a fill that
** stored 2 bytes per f8e4m3 element wrote past the view). */
static sta_dtype any_dtype(void) { return (sta_dtype)ops_in(STA_F32, STA_F8E4M3); }

static void test_copy_views(void **state) {
  (void)state;
  for (int c = 0; c < 120; c++) {
    int64_t shape[4];
    int32_t nd = ops_shape(shape, 3000);
    sta_dtype dd = any_dtype(), sd = any_dtype();
    ops_layout ld = ops_layout_of(nd, shape, (int)ops_in(0, 2));
    ops_layout ls = ops_layout_of(nd, shape, (int)ops_in(0, 2));
    sta_tensor *bd = ops_storage(dd, STA_CPU, &ld, ops_rnd()), *dst = ops_view(bd, &ld);
    sta_tensor *bs = ops_storage(sd, STA_CPU, &ls, ops_rnd()), *src = ops_view(bs, &ls);
    float *s = ops_values(src), *before = ops_values(bd);
    char *mask = ops_mask(&ld);
    assert_int_equal(sta_tensor_copy(dst, src), STA_OK);
    float *got = ops_values(dst);
    for (int64_t i = 0; i < sta_tensor_numel(dst); i++) {
      uint32_t w = 0; /* the value stored in dst's dtype */
      sta_store_f32(&w, dd, s[i]);
      float want = sta_load_f32(&w, dd);
      if (memcmp(&want, &got[i], 4) != 0)
        fail_msg("copy case %d %s <- %s: element %lld is %.9g, want %.9g", c, sta_dtype_name(dd),
                 sta_dtype_name(sd), (long long)i, (double)got[i], (double)want);
    }
    ops_outside_kept(bd, before, mask, "copy");
    free(s); free(before); free(got); free(mask);
    sta_tensor_destroy(dst); sta_tensor_destroy(bd);
    sta_tensor_destroy(src); sta_tensor_destroy(bs);
  }
}

static void test_fill_randn_views(void **state) {
  (void)state;
  for (int c = 0; c < 80; c++) {
    int64_t shape[4];
    int32_t nd = ops_shape(shape, 3000);
    sta_dtype dt = any_dtype();
    ops_layout l = ops_layout_of(nd, shape, (int)ops_in(0, 2));
    sta_tensor *b = ops_storage(dt, STA_CPU, &l, ops_rnd()), *v = ops_view(b, &l);
    float *before = ops_values(b);
    char *mask = ops_mask(&l);
    uint64_t seed = ops_rnd();
    double mean = (double)ops_in(-50, 50) / 10, sd = (double)ops_in(1, 40) / 10;
    assert_int_equal(sta_tensor_randn(v, seed, mean, sd), STA_OK);
    float *got = ops_values(v);
    for (int64_t i = 0; i < sta_tensor_numel(v); i++) {
      uint32_t w = 0; /* draw i by logical index, whatever the strides */
      sta_store_f32(&w, dt, (float)(mean + sd * sta_randn_at(seed, (uint64_t)i)));
      float want = sta_load_f32(&w, dt);
      if (memcmp(&want, &got[i], 4) != 0)
        fail_msg("randn case %d %s: element %lld is %.9g, want %.9g", c, sta_dtype_name(dt),
                 (long long)i, (double)got[i], (double)want);
    }
    ops_outside_kept(b, before, mask, "randn");
    double value = (double)ops_in(-1000, 1000) / 7;
    assert_int_equal(sta_tensor_fill(v, value), STA_OK);
    free(got);
    got = ops_values(v);
    uint32_t w = 0;
    sta_store_f32(&w, dt, (float)value);
    float want = sta_load_f32(&w, dt);
    for (int64_t i = 0; i < sta_tensor_numel(v); i++) assert_memory_equal(&got[i], &want, 4);
    ops_outside_kept(b, before, mask, "fill");
    free(got); free(before); free(mask);
    sta_tensor_destroy(v);
    sta_tensor_destroy(b);
  }
}

/* The draws are standard normals: moments of 2^18 of them. */
static void test_randn_moments(void **state) {
  (void)state;
  int64_t n = 1 << 18;
  sta_tensor *t = NULL;
  sta_stats s;
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 1, &n), STA_OK);
  assert_int_equal(sta_tensor_randn(t, ops_rnd(), 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_stats(t, &s), STA_OK);
  assert_true(fabs(s.mean) < 0.01);      /* 5 sigma: 5 / 512 */
  assert_true(fabs(s.std - 1) < 0.007);
  assert_true(s.min < -3.5 && s.max > 3.5);
  const float *v = sta_tensor_data(t);
  int64_t within1 = 0;
  for (int64_t i = 0; i < n; i++) within1 += fabsf(v[i]) < 1;
  assert_true(fabs((double)within1 / (double)n - 0.682689) < 0.005);
  sta_tensor_destroy(t);
}

/* ---- stats -------------------------------------------------------------------- */

static void test_stats_views(void **state) {
  (void)state;
  for (int c = 0; c < 100; c++) {
    int64_t shape[4];
    int32_t nd = ops_shape(shape, 5000);
    sta_dtype dt = ops_dtype();
    ops_layout l = ops_layout_of(nd, shape, (int)ops_in(0, 2));
    sta_tensor *b = ops_storage(dt, STA_CPU, &l, ops_rnd()), *v = ops_view(b, &l);
    int64_t n = sta_tensor_numel(v), bad = 0;
    int nonfinite = (int)ops_in(0, 3); /* 0: none; 3: all of them */
    if (nonfinite) {
      for (int64_t i = 0; i < n; i++) {
        if (nonfinite < 3 && ops_in(0, 20)) continue;
        int64_t ix[4], r = i;
        for (int32_t d = nd - 1; d >= 0; d--) { ix[d] = r % shape[d]; r /= shape[d]; }
        static const double odd[3] = {NAN, INFINITY, -INFINITY};
        assert_int_equal(sta_tensor_set(v, ix, odd[ops_in(0, 2)]), STA_OK);
      }
    }
    float *x = ops_values(v);
    double sum = 0, sq = 0, lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
      if (!isfinite(x[i])) { bad++; continue; }
      sum += x[i];
      lo = fmin(lo, x[i]);
      hi = fmax(hi, x[i]);
    }
    int64_t good = n - bad;
    double mean = good ? sum / (double)good : 0;
    for (int64_t i = 0; i < n; i++)
      if (isfinite(x[i])) sq += (x[i] - mean) * (x[i] - mean);
    double sd = good ? sqrt(sq / (double)good) : 0;
    sta_stats s;
    memset(&s, 0xff, sizeof s);
    assert_int_equal(sta_tensor_stats(v, &s), STA_OK);
    assert_int_equal(s.count, good);
    assert_int_equal(s.nonfinite, bad);
    if (good == 0) {
      assert_true(s.mean == 0 && s.std == 0 && s.min == 0 && s.max == 0);
    } else {
      assert_true(fabs(s.mean - mean) <= 1e-12 * (fabs(mean) + sd + 1));
      assert_true(fabs(s.std - sd) <= 1e-10 * (sd + fabs(mean)) + 1e-14);
      assert_true(s.min == lo && s.max == hi);
    }
    /* the same bits again */
    sta_stats s2;
    assert_int_equal(sta_tensor_stats(v, &s2), STA_OK);
    assert_memory_equal(&s, &s2, sizeof s);
    free(x);
    sta_tensor_destroy(v);
    sta_tensor_destroy(b);
  }
}

/* A row whose length is not a multiple of 8, all negative, its first
** element NaN (so the sums' shift is 0): the bounds are the data's (the GPU
** suite found the host's max at 0, the padding lanes' value). */
static void test_stats_bounds_not_padding(void **state) {
  (void)state;
  for (int64_t n = 1; n <= 19; n += 3) {
    sta_tensor *t = NULL;
    int64_t shape[1] = {n};
    assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 1, shape), STA_OK);
    assert_int_equal(sta_tensor_randn(t, 40 + (uint64_t)n, -5.0, 0.5), STA_OK);
    int64_t i0 = 0;
    assert_int_equal(sta_tensor_set(t, &i0, NAN), STA_OK);
    double hi = -INFINITY, lo = INFINITY, x;
    for (int64_t i = 1; i < n; i++) {
      assert_int_equal(sta_tensor_get(t, &i, &x), STA_OK);
      hi = x > hi ? x : hi;
      lo = x < lo ? x : lo;
    }
    sta_stats s;
    assert_int_equal(sta_tensor_stats(t, &s), STA_OK);
    assert_int_equal(s.nonfinite, 1);
    assert_int_equal(s.count, n - 1);
    if (n > 1) {
      assert_true(s.max == (float)hi && s.min == (float)lo);
      assert_true(s.max < -2.0);
    }
    sta_tensor_destroy(t);
  }
}

static void test_stats_empty(void **state) {
  (void)state;
  int64_t shape[2] = {3, 0};
  sta_tensor *t = NULL;
  sta_stats s;
  memset(&s, 0xff, sizeof s);
  assert_int_equal(sta_tensor_create(&t, STA_BF16, STA_CPU, 2, shape), STA_OK);
  assert_int_equal(sta_tensor_stats(t, &s), STA_OK);
  assert_true(s.count == 0 && s.nonfinite == 0 && s.mean == 0 && s.std == 0);
  assert_int_equal(sta_tensor_axpby(t, 2, t, 3), STA_OK);
  sta_tensor_destroy(t);
}

/* ---- the iteration space -------------------------------------------------------- */

static void test_iter_merges_dims(void **state) {
  (void)state;
  int64_t shape[4] = {2, 3, 4, 5}, one[3] = {4, 1, 6};
  sta_tensor *a = NULL, *b = NULL, *p = NULL, *n = NULL, *c = NULL;
  sta_iter it;
  assert_int_equal(sta_tensor_create(&a, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&b, STA_BF16, STA_CPU, 4, shape), STA_OK);
  const sta_tensor *ab[2] = {a, b};
  sta_iter_init(&it, 2, ab); /* both contiguous: one run */
  assert_int_equal(it.ndim, 1);
  assert_int_equal(it.shape[3], 120);
  assert_int_equal(it.stride[1][3], 1);
  assert_int_equal(it.shape[0] * it.shape[1] * it.shape[2], 1);
  int32_t perm[4] = {0, 1, 3, 2};
  assert_int_equal(sta_tensor_permute(&p, b, perm), STA_OK); /* [2,3,5,4] */
  assert_int_equal(sta_tensor_permute(&n, a, perm), STA_OK);
  const sta_tensor *pn[2] = {n, p};
  sta_iter_init(&it, 2, pn); /* the same permutation */
  assert_int_equal(it.ndim, 3);   /* [6, 5, 4]: dims 0 and 1 merge */
  assert_int_equal(it.shape[1], 6);
  assert_int_equal(it.stride[0][2], 1);
  assert_int_equal(it.stride[1][3], 5);
  assert_int_equal(sta_tensor_narrow(&c, a, 3, 1, 3), STA_OK); /* rows of 3 in 5 */
  const sta_tensor *cc[1] = {c};
  sta_iter_init(&it, 1, cc);
  assert_int_equal(it.ndim, 2);
  assert_int_equal(it.shape[2], 24);
  assert_int_equal(it.shape[3], 3);
  assert_int_equal(it.stride[0][2], 5);
  sta_tensor *s = NULL; /* size-1 dims vanish */
  assert_int_equal(sta_tensor_create(&s, STA_F16, STA_CPU, 3, one), STA_OK);
  const sta_tensor *ss[1] = {s};
  sta_iter_init(&it, 1, ss);
  assert_int_equal(it.ndim, 1);
  assert_int_equal(it.shape[3], 24);
  sta_tensor *tensors[6] = {a, b, p, n, c, s};
  for (int i = 0; i < 6; i++) sta_tensor_destroy(tensors[i]);
}

/* ---- errors --------------------------------------------------------------------- */

/* y's bits are what they were. */
static void expect_kept(const sta_tensor *y, const float *before) {
  float *now = ops_values(y);
  assert_memory_equal(now, before, (size_t)sta_tensor_numel(y) * 4);
  free(now);
}

static void test_errors(void **state) {
  (void)state;
  int64_t s35[2] = {3, 5}, s53[2] = {5, 3}, s8 = 8;
  sta_tensor *y = NULL, *x = NULL, *w = NULL, *r = NULL, *line = NULL, *lo = NULL, *hi = NULL;
  assert_int_equal(sta_tensor_create(&y, STA_BF16, STA_CPU, 2, s35), STA_OK);
  assert_int_equal(sta_tensor_create(&x, STA_F32, STA_CPU, 2, s35), STA_OK);
  assert_int_equal(sta_tensor_create(&w, STA_F32, STA_CPU, 2, s53), STA_OK);
  assert_int_equal(sta_tensor_randn(y, ops_rnd(), 0, 1), STA_OK);
  assert_int_equal(sta_tensor_randn(x, ops_rnd(), 0, 1), STA_OK);
  float *before = ops_values(y);
  int64_t moved = sta_transfer_bytes();
  sta_stats st;
  memset(&st, 0x5a, sizeof st);
  sta_stats st0 = st;

  EXPECT_ERR(sta_tensor_axpby(NULL, 1, x, 1), STA_ERR_ARGUMENT, "y: expected a tensor, got NULL");
  EXPECT_ERR(sta_tensor_axpby(y, 1, NULL, 1), STA_ERR_ARGUMENT, "x: expected a tensor, got NULL");
  EXPECT_ERR(sta_tensor_scale(NULL, 2), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL");
  EXPECT_ERR(sta_tensor_add(y, x, NULL), STA_ERR_ARGUMENT, "y: expected a tensor, got NULL");
  EXPECT_ERR(sta_tensor_stats(NULL, &st), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL");
  EXPECT_ERR(sta_tensor_stats(y, NULL), STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");

  /* shapes */
  EXPECT_ERR(sta_tensor_axpby(y, 1, w, 1), STA_ERR_SHAPE, "axpby: shapes differ (y 3x5 vs x 5x3)");
  EXPECT_ERR(sta_tensor_add(y, x, w), STA_ERR_SHAPE, "add: shapes differ (out 3x5 vs y 5x3)");
  EXPECT_ERR(sta_tensor_add(w, x, y), STA_ERR_SHAPE, "add: shapes differ (out 5x3 vs x 3x5)");
  expect_kept(y, before);

  /* devices: a CUDA pointer wrapped (never dereferenced: the checks fail
  ** first) */
  static char fake[64] __attribute__((aligned(16)));
  sta_tensor *gx = NULL, *gy = NULL;
  assert_int_equal(sta_tensor_wrap(&gx, fake, STA_F32, STA_CUDA, 2, s35, NULL), STA_OK);
  assert_int_equal(sta_tensor_wrap(&gy, fake + 32, STA_BF16, STA_CUDA, 1, &s8, NULL), STA_OK);
  EXPECT_ERR(sta_tensor_axpby(y, 1, gx, 1), STA_ERR_ARGUMENT, "axpby: devices differ (y cpu vs x cuda)");
  EXPECT_ERR(sta_tensor_add(y, x, gx), STA_ERR_ARGUMENT, "add: devices differ (out cpu vs y cuda)");
  EXPECT_ERR(sta_tensor_add(gx, x, y), STA_ERR_ARGUMENT, "add: devices differ (out cuda vs x cpu)");
  expect_kept(y, before);
  if (!sta_backend_available(STA_CUDA)) { /* no backend: an error, not a crash */
    char nb[320]; /* STA.md's text, then why */
    snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
    EXPECT_ERR(sta_tensor_scale(gy, 2), STA_ERR_BACKEND, nb);
    EXPECT_ERR(sta_tensor_stats(gy, &st), STA_ERR_BACKEND, nb);
    EXPECT_ERR(sta_tensor_copy(gx, gx), STA_ERR_BACKEND, nb);
    EXPECT_ERR(sta_tensor_copy(x, gx), STA_ERR_BACKEND, nb);
    EXPECT_ERR(sta_tensor_fill(gy, 1), STA_ERR_BACKEND, nb);
    EXPECT_ERR(sta_tensor_randn(gy, 1, 0, 1), STA_ERR_BACKEND, nb);
    double m, rel;
    EXPECT_ERR(sta_tensor_compare(gx, x, &m, &rel), STA_ERR_BACKEND, nb);
  }
  assert_memory_equal(&st, &st0, sizeof st);

  /* overlapping views of one storage; the same view is fine */
  assert_int_equal(sta_tensor_create(&line, STA_F32, STA_CPU, 1, &s8), STA_OK);
  assert_int_equal(sta_tensor_randn(line, ops_rnd(), 0, 1), STA_OK);
  assert_int_equal(sta_tensor_narrow(&lo, line, 0, 0, 4), STA_OK);
  assert_int_equal(sta_tensor_narrow(&hi, line, 0, 1, 4), STA_OK);
  float *lb = ops_values(line);
  EXPECT_ERR(sta_tensor_axpby(lo, 1, hi, 1), STA_ERR_ARGUMENT,
             "axpby: y overlaps x without being the same view");
  EXPECT_ERR(sta_tensor_add(hi, lo, lo), STA_ERR_ARGUMENT,
             "add: out overlaps x without being the same view");
  EXPECT_ERR(sta_tensor_copy(lo, hi), STA_ERR_ARGUMENT,
             "copy: dst overlaps src without being the same view");
  expect_kept(line, lb);
  assert_int_equal(sta_tensor_axpby(lo, 2, lo, 1), STA_OK); /* lo = 3 lo */
  float *la = ops_values(line);
  for (int i = 0; i < 8; i++) assert_true(la[i] == (i < 4 ? 3 * lb[i] : lb[i]));
  assert_int_equal(sta_tensor_narrow(&r, line, 0, 4, 4), STA_OK); /* disjoint: fine */
  assert_int_equal(sta_tensor_add(r, lo, r), STA_OK);

  /* coefficients */
  EXPECT_ERR(sta_tensor_axpby(y, NAN, x, 1), STA_ERR_ARGUMENT, "a: expected a finite float32 value, got nan");
  EXPECT_ERR(sta_tensor_axpby(y, 1, x, 1e39), STA_ERR_ARGUMENT,
             "b: expected a finite float32 value, got 1e+39");
  EXPECT_ERR(sta_tensor_scale(y, -INFINITY), STA_ERR_ARGUMENT, "a: expected a finite float32 value, got -inf");
  expect_kept(y, before);

  /* mixed dtypes are not an error: bf16 y, f32 x, f16 out */
  sta_tensor *h = NULL;
  assert_int_equal(sta_tensor_create(&h, STA_F16, STA_CPU, 2, s35), STA_OK);
  assert_int_equal(sta_tensor_add(h, y, x), STA_OK);
  assert_int_equal(sta_transfer_bytes(), moved); /* host work moves nothing */

  sta_tensor *all[10] = {y, x, w, r, line, lo, hi, gx, gy, h};
  for (int i = 0; i < 10; i++) sta_tensor_destroy(all[i]);
  free(before); free(lb); free(la);
}

static int setup(void **state) {
  (void)state;
  ops_seed("test_ops");
  return 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_lincomb_views),
    cmocka_unit_test(test_copy_views),
    cmocka_unit_test(test_fill_randn_views),
    cmocka_unit_test(test_randn_moments),
    cmocka_unit_test(test_stats_views),
    cmocka_unit_test(test_stats_bounds_not_padding),
    cmocka_unit_test(test_stats_empty),
    cmocka_unit_test(test_iter_merges_dims),
    cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
