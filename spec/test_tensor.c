/* test_tensor.c -- tensors: storage lifetime across views, accessors,
** contiguity, strided copies and conversions (against an independent
** rounding in double), sta_tensor_to, randn, fill, element access, compare,
** and every error path with its exact message and nothing changed. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed_counter = 77;

static sta_tensor *make(sta_dtype dt, int32_t nd, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, nd, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_counter++, 0.0, 1.0), STA_OK);
  return t;
}

static double at(const sta_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3) {
  int64_t idx[4] = {i0, i1, i2, i3};
  double v = NAN;
  assert_int_equal(sta_tensor_get(t, idx, &v), STA_OK);
  return v;
}

/* ---- independent rounding ---------------------------------------------
** Round x to a binary format with m fraction bits, minimum normal exponent
** emin and largest finite value maxf, ties to even, in double. */
static double ref_round(double x, int m, int emin, double maxf) {
  if (isnan(x) || x == 0 || isinf(x)) return x;
  int k;
  frexp(fabs(x), &k); /* |x| = f * 2^k, f in [0.5, 1) */
  int e = k - 1;
  if (e < emin) e = emin;
  double q = ldexp(1.0, e - m);
  double r = nearbyint(fabs(x) / q) * q; /* default mode: ties to even */
  if (r > maxf) r = INFINITY;
  return copysign(r, x);
}
static double ref_f16(double x) { return ref_round(x, 10, -14, 65504.0); }
static double ref_bf16(double x) { return ref_round(x, 7, -126, 0x1.fep127); }

/* Value of 16-bit pattern h with ebits exponent bits (5: f16, 8: bf16). */
static double ref_decode(uint16_t h, int ebits) {
  int m = 15 - ebits, bias = (1 << (ebits - 1)) - 1;
  int e = (h >> m) & ((1 << ebits) - 1);
  int f = h & ((1 << m) - 1);
  double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == (1 << ebits) - 1) return f ? NAN : s * INFINITY;
  if (e == 0) return s * ldexp(f, 1 - bias - m);
  return s * ldexp(f + (1 << m), e - bias - m);
}

/* ---- lifetime and views -------------------------------------------- */

static void test_views_any_order(void **state) {
  (void)state;
  int64_t shape[3] = {4, 5, 6};
  for (int order = 0; order < 6; order++) {
    sta_tensor *a = make(STA_F32, 3, shape), *v = NULL, *p = NULL, *n = NULL;
    double a123 = at(a, 1, 2, 3, 0), a304 = at(a, 3, 0, 4, 0);
    int64_t vs[2] = {5, 6}, vst[2] = {6, 1};
    assert_int_equal(sta_tensor_view(&v, a, 30, 2, vs, vst), STA_OK); /* a[1] */
    int32_t perm[3] = {2, 0, 1};
    assert_int_equal(sta_tensor_permute(&p, a, perm), STA_OK);       /* [6,4,5] */
    assert_int_equal(sta_tensor_narrow(&n, p, 1, 3, 1), STA_OK);     /* a[3] as [6,1,5] */
    sta_tensor *h[3] = {a, v, p};
    /* destroy three handles in one of the 6 orders; the rest must read */
    int idx[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int i = 0; i < 2; i++) {
      sta_tensor_destroy(h[idx[order][i]]);
      h[idx[order][i]] = NULL;
    }
    if (h[0]) assert_true(at(h[0], 1, 2, 3, 0) == a123);
    if (h[1]) assert_true(at(h[1], 2, 3, 0, 0) == a123);
    if (h[2]) assert_true(at(h[2], 3, 1, 2, 0) == a123);
    assert_true(at(n, 4, 0, 0, 0) == a304);
    sta_tensor_destroy(h[idx[order][2]]);
    assert_true(at(n, 4, 0, 0, 0) == a304);
    sta_tensor_destroy(n);
  }
  sta_tensor_destroy(NULL);
}

static void test_wrap(void **state) {
  (void)state;
  float buf[24];
  for (int i = 0; i < 24; i++) buf[i] = (float)i * 0.5f - 3.0f;
  int64_t shape[2] = {4, 6};
  sta_tensor *w = NULL, *n = NULL, *r = NULL;
  assert_int_equal(sta_tensor_wrap(&w, buf, STA_F32, STA_CPU, 2, shape, NULL), STA_OK);
  assert_ptr_equal(sta_tensor_data(w), buf);
  assert_true(sta_tensor_is_contiguous(w));
  assert_int_equal(sta_tensor_narrow(&n, w, 1, 2, 3), STA_OK);
  sta_tensor_destroy(w); /* the view keeps the (caller's) storage described */
  assert_true(at(n, 3, 1, 0, 0) == buf[3 * 6 + 3]);
  assert_ptr_equal(sta_tensor_data(n), buf + 2);
  sta_tensor_destroy(n);
  /* negative strides: a reversed view of caller memory */
  int64_t rs[1] = {8}, rst[1] = {-3};
  assert_int_equal(sta_tensor_wrap(&r, buf + 21, STA_F32, STA_CPU, 1, rs, rst), STA_OK);
  assert_ptr_equal(sta_tensor_data(r), buf + 21);
  for (int i = 0; i < 8; i++) assert_true(at(r, i, 0, 0, 0) == buf[21 - 3 * i]);
  assert_int_equal(sta_tensor_is_contiguous(r), 0);
  /* a view may reach the whole wrapped span, not past it */
  sta_tensor *v = NULL;
  int64_t one[1] = {1}, st1[1] = {1};
  assert_int_equal(sta_tensor_view(&v, r, -21, 1, one, st1), STA_OK);
  assert_true(at(v, 0, 0, 0, 0) == buf[0]);
  sta_tensor_destroy(v);
  v = (sta_tensor *)0x1;
  sta_expect_err(sta_tensor_view(&v, r, -22, 1, one, st1), STA_ERR_SHAPE,
             "view: offset -22 with these shape and strides reaches elements -1..-1 "
             "outside the storage of 22");
  assert_ptr_equal(v, (sta_tensor *)0x1);
  sta_tensor_destroy(r);
}

static void test_accessors(void **state) {
  (void)state;
  int64_t shape[4] = {2, 3, 4, 5};
  sta_tensor *t = make(STA_BF16, 4, shape), *p = NULL, *n = NULL;
  assert_int_equal(sta_tensor_dtype(t), STA_BF16);
  assert_int_equal(sta_tensor_device(t), STA_CPU);
  assert_int_equal(sta_tensor_ndim(t), 4);
  assert_int_equal(sta_tensor_numel(t), 120);
  static const int64_t st[4] = {60, 20, 5, 1};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sta_tensor_size(t, i), shape[i]);
    assert_int_equal(sta_tensor_stride(t, i), st[i]);
  }
  assert_int_equal(sta_tensor_size(t, 4), -1);
  assert_int_equal(sta_tensor_size(t, -1), -1);
  assert_int_equal(sta_tensor_stride(t, 4), 0);
  assert_true(sta_tensor_is_contiguous(t));
  int32_t perm[4] = {0, 2, 1, 3};
  assert_int_equal(sta_tensor_permute(&p, t, perm), STA_OK);
  assert_false(sta_tensor_is_contiguous(p));
  assert_int_equal(sta_tensor_stride(p, 1), 5);
  assert_int_equal(sta_tensor_stride(p, 2), 20);
  assert_int_equal(sta_tensor_narrow(&n, t, 0, 1, 1), STA_OK);
  assert_true(sta_tensor_is_contiguous(n)); /* t[1:2] is still contiguous */
  assert_ptr_equal(sta_tensor_data(n), (char *)sta_tensor_data(t) + 60 * 2);
  sta_tensor_destroy(n);
  assert_int_equal(sta_tensor_narrow(&n, t, 2, 1, 2), STA_OK);
  assert_false(sta_tensor_is_contiguous(n));
  sta_tensor_destroy(n);
  assert_int_equal(sta_tensor_narrow(&n, t, 2, 4, 0), STA_OK); /* empty */
  assert_int_equal(sta_tensor_numel(n), 0);
  assert_true(sta_tensor_is_contiguous(n));
  sta_tensor_destroy(n);
  /* size-1 dims do not break contiguity whatever their stride */
  int64_t vs[2] = {1, 5}, vst[2] = {999, 1};
  assert_int_equal(sta_tensor_view(&n, t, 0, 2, vs, vst), STA_OK);
  assert_true(sta_tensor_is_contiguous(n));
  sta_tensor_destroy(n);
  assert_int_equal(sta_dtype_size(STA_F32), 4);
  assert_int_equal(sta_dtype_size(STA_F16), 2);
  assert_int_equal(sta_dtype_size(STA_BF16), 2);
  assert_string_equal(sta_dtype_name(STA_F32), "f32");
  assert_string_equal(sta_dtype_name(STA_F16), "f16");
  assert_string_equal(sta_dtype_name(STA_BF16), "bf16");
  static const char *names[] = {"f32", "float32", "f16", "float16", "fp16", "bf16",
                                "bfloat16"};
  static const sta_dtype want[] = {STA_F32, STA_F32, STA_F16, STA_F16, STA_F16, STA_BF16,
                                   STA_BF16};
  for (int i = 0; i < 7; i++) {
    sta_dtype d = (sta_dtype)99;
    assert_int_equal(sta_dtype_parse(names[i], &d), STA_OK);
    assert_int_equal(d, want[i]);
  }
  sta_dtype d = STA_F16;
  sta_expect_err(sta_dtype_parse("f64", &d), STA_ERR_DTYPE,
             "dtype: unknown dtype 'f64' (expected f32, f16, bf16, f8e4m3 or i32)");
  sta_expect_err(sta_dtype_parse(NULL, &d), STA_ERR_DTYPE, "dtype: expected a name, got NULL");
  assert_int_equal(d, STA_F16);
  sta_tensor_destroy(p);
  sta_tensor_destroy(t);
}

/* ---- conversions ----------------------------------------------------- */

/* Every f16 and bf16 pattern decodes to the independent value. */
static void test_decode_all_patterns(void **state) {
  (void)state;
  static uint16_t bits[65536];
  for (int i = 0; i < 65536; i++) bits[i] = (uint16_t)i;
  int64_t n = 65536;
  for (int k = 0; k < 2; k++) {
    sta_dtype dt = k ? STA_BF16 : STA_F16;
    sta_tensor *w = NULL, *f = NULL;
    assert_int_equal(sta_tensor_wrap(&w, bits, dt, STA_CPU, 1, &n, NULL), STA_OK);
    assert_int_equal(sta_tensor_to(&f, w, STA_F32, STA_CPU), STA_OK);
    const float *x = sta_tensor_data(f);
    for (int i = 0; i < 65536; i++) {
      double r = ref_decode((uint16_t)i, k ? 8 : 5);
      if (isnan(r)) assert_true(isnan(x[i]));
      else if ((double)x[i] != r || !signbit(x[i]) != !signbit(r))
        fail_msg("%s 0x%04x: got %a, want %a", sta_dtype_name(dt), i, (double)x[i], r);
    }
    sta_tensor_destroy(w);
    sta_tensor_destroy(f);
  }
}

/* f32 -> f16/bf16 through sta_tensor_copy: specials, every value and
** every midpoint (ties) of the target format, and random patterns. */
static void test_round_to_half(void **state) {
  (void)state;
  int64_t n = 0, cap = 65536 * 2 + 400000 + 64;
  float *src = malloc(sizeof(float) * (size_t)cap);
  assert_non_null(src);
  static const float specials[] = {
    0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1.0f, -1.0f, 65504.0f, 65519.99f,
    65520.0f, -65520.0f, 1e10f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1.8p-24f,
    0x1p-14f, 0x1.ff8p-15f, 0x1.ffcp-15f, 1e-30f, -1e-30f, 0x1p-126f, 0x1p-149f,
    0x1.fffffep127f, -0x1.fffffep127f, 0x1.fep127f, 0x1.ff8p127f, 1.00048828125f,
    1.00146484375f, 3.14159265f, 2049.0f, 2051.0f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) src[n++] = specials[i];
  for (int k = 0; k < 2; k++) /* every finite value and the midpoint above it */
    for (int i = 0; i < 65536; i++) {
      double v = ref_decode((uint16_t)i, k ? 8 : 5), w = ref_decode((uint16_t)(i + 1), k ? 8 : 5);
      if (!isfinite(v) || (i & 0x7fff) == 0x7fff) continue;
      if (n + 2 > cap) break;
      if (k == 0) src[n++] = (float)v;
      if (isfinite(w) && ((i + 1) & 0x8000) == (i & 0x8000)) src[n++] = (float)((v + w) / 2);
    }
  uint64_t s = 0x243f6a8885a308d3ull;
  while (n < cap) { /* random bit patterns */
    s ^= s << 13; s ^= s >> 7; s ^= s << 17;
    uint32_t u = (uint32_t)(s >> 11);
    memcpy(&src[n++], &u, 4);
  }
  sta_tensor *ts = NULL;
  assert_int_equal(sta_tensor_wrap(&ts, src, STA_F32, STA_CPU, 1, &n, NULL), STA_OK);
  for (int k = 0; k < 2; k++) {
    sta_dtype dt = k ? STA_BF16 : STA_F16;
    sta_tensor *h = NULL;
    assert_int_equal(sta_tensor_create(&h, dt, STA_CPU, 1, &n), STA_OK);
    assert_int_equal(sta_tensor_copy(h, ts), STA_OK);
    const uint16_t *b = sta_tensor_data(h);
    for (int64_t i = 0; i < n; i++) {
      double want = k ? ref_bf16(src[i]) : ref_f16(src[i]);
      double got = ref_decode(b[i], k ? 8 : 5);
      if (isnan(want)) {
        if (!isnan(got)) fail_msg("%s(%a): got 0x%04x, want NaN", sta_dtype_name(dt),
                                  (double)src[i], b[i]);
      } else if (got != want || !signbit(got) != !signbit(want))
        fail_msg("%s(%a): got 0x%04x = %a, want %a", sta_dtype_name(dt), (double)src[i], b[i],
                 got, want);
    }
    sta_tensor_destroy(h);
  }
  sta_tensor_destroy(ts);
  free(src);
}

/* Copies between every dtype pair and stride pattern agree with a
** per-element get/convert/set. */
static void test_copy_strided_dtypes(void **state) {
  (void)state;
  int64_t shape[4] = {3, 4, 5, 6};
  int32_t perm[4] = {3, 1, 0, 2};
  for (int sd = 0; sd < 3; sd++)
    for (int dd = 0; dd < 3; dd++) {
      sta_tensor *a = make((sta_dtype)sd, 4, shape), *p = NULL, *dst = NULL, *dp = NULL;
      assert_int_equal(sta_tensor_randn(a, seed_counter++, 3.0, 1000.0), STA_OK);
      assert_int_equal(sta_tensor_permute(&p, a, perm), STA_OK); /* [6,4,3,5] */
      int64_t ds[4] = {5, 3, 4, 6};
      assert_int_equal(sta_tensor_create(&dst, (sta_dtype)dd, STA_CPU, 4, ds), STA_OK);
      int32_t dperm[4] = {3, 2, 1, 0}; /* dp[i,j,k,l] = dst[l,k,j,i] */
      assert_int_equal(sta_tensor_permute(&dp, dst, dperm), STA_OK);
      assert_int_equal(sta_tensor_copy(dp, p), STA_OK);
      for (int64_t i = 0; i < 6; i++)
        for (int64_t j = 0; j < 4; j++)
          for (int64_t k = 0; k < 3; k++)
            for (int64_t l = 0; l < 5; l++) {
              double x = at(a, k, j, l, i), y = at(dst, l, k, j, i);
              double want = dd == STA_F32 ? x : dd == STA_F16 ? ref_f16(x) : ref_bf16(x);
              if (y != want)
                fail_msg("%s->%s: %a became %a, want %a", sta_dtype_name((sta_dtype)sd),
                         sta_dtype_name((sta_dtype)dd), x, y, want);
            }
      /* sta_tensor_to: contiguous, same values */
      sta_tensor *c = NULL;
      assert_int_equal(sta_tensor_to(&c, p, (sta_dtype)dd, STA_CPU), STA_OK);
      assert_true(sta_tensor_is_contiguous(c));
      assert_int_equal(sta_tensor_dtype(c), dd);
      double m = -1;
      assert_int_equal(sta_tensor_compare(c, dp, &m, NULL), STA_OK);
      assert_true(m == 0);
      sta_tensor_destroy(c);
      sta_tensor_destroy(a);
      sta_tensor_destroy(p);
      sta_tensor_destroy(dst);
      sta_tensor_destroy(dp);
    }
}

static void test_to_device(void **state) {
  (void)state;
  int64_t shape[2] = {3, 7};
  sta_tensor *a = make(STA_F32, 2, shape), *d = (sta_tensor *)0x1;
  if (!sta_backend_available(STA_CUDA)) {
    char nb[320]; /* STA.md's text, then why */
    snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
    sta_expect_err(sta_tensor_to(&d, a, STA_BF16, STA_CUDA), STA_ERR_BACKEND, nb);
    assert_ptr_equal(d, (sta_tensor *)0x1);
  } else {
    sta_tensor *b = NULL;
    assert_int_equal(sta_tensor_to(&d, a, STA_BF16, STA_CUDA), STA_OK);
    assert_int_equal(sta_tensor_device(d), STA_CUDA);
    assert_int_equal(sta_tensor_to(&b, d, STA_F32, STA_CPU), STA_OK);
    double m;
    assert_int_equal(sta_tensor_compare(a, b, &m, NULL), STA_OK);
    assert_true(m < 0.02 * 5);
    sta_tensor_destroy(b);
    sta_tensor_destroy(d);
  }
  sta_expect_err(sta_tensor_to(&d, a, STA_F32, (sta_device)9), STA_ERR_ARGUMENT,
             "device: unknown device 9");
  sta_expect_err(sta_tensor_to(&d, a, (sta_dtype)9, STA_CPU), STA_ERR_DTYPE,
             "dtype: unknown dtype 9");
  sta_expect_err(sta_tensor_to(NULL, a, STA_F32, STA_CPU), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_to(&d, NULL, STA_F32, STA_CPU), STA_ERR_ARGUMENT,
             "src: expected a tensor, got NULL");
  sta_tensor_destroy(a);
}

/* ---- randn and fill ------------------------------------------------- */

static void test_randn(void **state) {
  (void)state;
  int64_t n = 100000;
  sta_tensor *a = NULL, *b = NULL, *c = NULL;
  assert_int_equal(sta_tensor_create(&a, STA_F32, STA_CPU, 1, &n), STA_OK);
  assert_int_equal(sta_tensor_create(&b, STA_F32, STA_CPU, 1, &n), STA_OK);
  assert_int_equal(sta_tensor_create(&c, STA_F32, STA_CPU, 1, &n), STA_OK);
  assert_int_equal(sta_tensor_randn(a, 12345, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(b, 12345, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(c, 12346, 0.0, 1.0), STA_OK);
  assert_memory_equal(sta_tensor_data(a), sta_tensor_data(b), (size_t)n * 4);
  const float *x = sta_tensor_data(a), *z = sta_tensor_data(c);
  double s = 0, s2 = 0, s4 = 0, cross = 0;
  int64_t same = 0, within1 = 0;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
    s4 += (double)x[i] * x[i] * x[i] * x[i];
    cross += (double)x[i] * z[i];
    same += x[i] == z[i];
    within1 += fabs(x[i]) < 1;
  }
  double mean = s / n, var = s2 / n - mean * mean;
  assert_true(fabs(mean) < 0.02);            /* 5 sigma is 0.016 */
  assert_true(fabs(sqrt(var) - 1) < 0.02);
  assert_true(fabs(s4 / n - 3) < 0.15);      /* kurtosis of a normal */
  assert_true(fabs((double)within1 / n - 0.6827) < 0.01);
  assert_true(fabs(cross / n) < 0.02);       /* different seeds: uncorrelated */
  assert_true(same < 10);
  /* the threads do not matter, and mean/std scale */
  sta_set_num_threads(1);
  assert_int_equal(sta_tensor_randn(b, 12345, 2.0, 3.0), STA_OK);
  sta_set_num_threads(0);
  const float *y = sta_tensor_data(b);
  for (int64_t i = 0; i < n; i += 997) assert_true(fabs(y[i] - (2.0 + 3.0 * x[i])) < 1e-5);
  /* a strided view gets the same values in logical order */
  int64_t sh2[2] = {100, 1000}, tsh[2] = {1000, 100};
  sta_tensor *m = NULL, *mt = NULL, *w = NULL;
  int32_t perm[2] = {1, 0};
  assert_int_equal(sta_tensor_create(&m, STA_F32, STA_CPU, 2, tsh), STA_OK);
  assert_int_equal(sta_tensor_permute(&mt, m, perm), STA_OK);
  assert_int_equal(sta_tensor_randn(mt, 12345, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_wrap(&w, (void *)x, STA_F32, STA_CPU, 2, sh2, NULL), STA_OK);
  double diff = -1;
  assert_int_equal(sta_tensor_compare(mt, w, &diff, NULL), STA_OK);
  assert_true(diff == 0);
  /* bf16 randn is the rounding of the f32 draws */
  sta_tensor *h = NULL;
  assert_int_equal(sta_tensor_create(&h, STA_BF16, STA_CPU, 1, &n), STA_OK);
  assert_int_equal(sta_tensor_randn(h, 12345, 0.0, 1.0), STA_OK);
  const uint16_t *hb = sta_tensor_data(h);
  for (int64_t i = 0; i < n; i += 101) assert_true(ref_decode(hb[i], 8) == ref_bf16(x[i]));
  /* errors change nothing */
  float before = x[5];
  sta_expect_err(sta_tensor_randn(a, 1, 0.0, -1.0), STA_ERR_ARGUMENT,
             "std: expected a finite value >= 0, got -1");
  sta_expect_err(sta_tensor_randn(a, 1, 0.0, NAN), STA_ERR_ARGUMENT,
             "std: expected a finite value >= 0, got nan");
  sta_expect_err(sta_tensor_randn(a, 1, INFINITY, 1.0), STA_ERR_ARGUMENT,
             "mean: expected a finite value, got inf");
  sta_expect_err(sta_tensor_randn(NULL, 1, 0.0, 1.0), STA_ERR_ARGUMENT,
             "t: expected a tensor, got NULL");
  assert_true(x[5] == before);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  sta_tensor_destroy(c);
  sta_tensor_destroy(m);
  sta_tensor_destroy(mt);
  sta_tensor_destroy(w);
  sta_tensor_destroy(h);
}

static void test_fill_get_set(void **state) {
  (void)state;
  int64_t shape[3] = {3, 4, 5};
  sta_tensor *t = make(STA_F16, 3, shape), *n = NULL;
  assert_int_equal(sta_tensor_narrow(&n, t, 1, 1, 2), STA_OK);
  assert_int_equal(sta_tensor_fill(n, -2.5), STA_OK);
  double before = at(t, 0, 0, 0, 0);
  for (int64_t i = 0; i < 3; i++)
    for (int64_t j = 0; j < 4; j++)
      for (int64_t k = 0; k < 5; k++) {
        double v = at(t, i, j, k, 0);
        if (j == 1 || j == 2) assert_true(v == -2.5);
        else assert_true(v != -2.5);
      }
  int64_t idx[3] = {2, 3, 4};
  assert_int_equal(sta_tensor_set(t, idx, 1.0 / 3.0), STA_OK);
  assert_true(at(t, 2, 3, 4, 0) == ref_f16((float)(1.0 / 3.0)));
  assert_int_equal(sta_tensor_set(t, idx, 1e6), STA_OK); /* f16 overflow */
  assert_true(isinf(at(t, 2, 3, 4, 0)));
  int64_t bad[3] = {2, 4, 0}, neg[3] = {-1, 0, 0};
  double v = 42;
  sta_expect_err(sta_tensor_get(t, bad, &v), STA_ERR_ARGUMENT, "index[1]: 4 is outside 0..3");
  sta_expect_err(sta_tensor_get(t, neg, &v), STA_ERR_ARGUMENT, "index[0]: -1 is outside 0..2");
  sta_expect_err(sta_tensor_set(n, bad, 1.0), STA_ERR_ARGUMENT, "index[1]: 4 is outside 0..1");
  sta_expect_err(sta_tensor_get(NULL, idx, &v), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_get(t, NULL, &v), STA_ERR_ARGUMENT, "index: expected an array, got NULL");
  sta_expect_err(sta_tensor_set(NULL, idx, 1.0), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_get(t, idx, NULL), STA_ERR_ARGUMENT, "value: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_fill(NULL, 1.0), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL");
  assert_true(v == 42);
  assert_true(at(t, 0, 0, 0, 0) == before);
  sta_tensor_destroy(n);
  sta_tensor_destroy(t);
}

static void test_compare(void **state) {
  (void)state;
  int64_t shape[2] = {2, 3};
  sta_tensor *a = make(STA_F32, 2, shape), *b = NULL, *c = NULL;
  assert_int_equal(sta_tensor_to(&b, a, STA_F32, STA_CPU), STA_OK);
  double m = -1, r = -1;
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  assert_true(m == 0 && r == 0);
  int64_t idx[2] = {1, 2};
  double v = at(b, 1, 2, 0, 0);
  assert_int_equal(sta_tensor_set(b, idx, v + 0.5), STA_OK);
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  const float *y = sta_tensor_data(b);
  double den = 0;
  for (int i = 0; i < 6; i++) den += (double)y[i] * y[i];
  assert_true(fabs(m - 0.5) < 1e-6);
  assert_true(fabs(r - 0.5 / sqrt(den)) < 1e-6);
  assert_int_equal(sta_tensor_set(b, idx, NAN), STA_OK);
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  assert_true(isnan(m) && isnan(r));
  /* across dtypes and strides */
  int32_t perm[2] = {1, 0};
  sta_tensor *p = NULL, *pt = NULL;
  assert_int_equal(sta_tensor_permute(&p, a, perm), STA_OK);
  assert_int_equal(sta_tensor_to(&pt, p, STA_BF16, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_compare(p, pt, &m, &r), STA_OK);
  assert_true(m > 0 && m < 0.02 && r < 0.005);
  /* errors leave the outputs alone */
  m = r = 7;
  sta_expect_err(sta_tensor_compare(a, p, &m, &r), STA_ERR_SHAPE, "compare: shapes differ (2x3 vs 3x2)");
  sta_expect_err(sta_tensor_compare(NULL, a, &m, &r), STA_ERR_ARGUMENT, "a: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_compare(a, NULL, &m, &r), STA_ERR_ARGUMENT, "b: expected a tensor, got NULL");
  assert_true(m == 7 && r == 7);
  int64_t s3[3] = {2, 3, 1};
  assert_int_equal(sta_tensor_create(&c, STA_F32, STA_CPU, 3, s3), STA_OK);
  sta_expect_err(sta_tensor_copy(c, a), STA_ERR_SHAPE, "copy: shapes differ (2x3x1 vs 2x3)");
  sta_expect_err(sta_tensor_copy(NULL, a), STA_ERR_ARGUMENT, "dst: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_copy(c, NULL), STA_ERR_ARGUMENT, "src: expected a tensor, got NULL");
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  sta_tensor_destroy(c);
  sta_tensor_destroy(p);
  sta_tensor_destroy(pt);
}

/* ---- errors -------------------------------------------------------- */

static void test_create_errors(void **state) {
  (void)state;
  sta_tensor *t = (sta_tensor *)0x1;
  int64_t ok[2] = {2, 3}, neg[2] = {2, -2}, big[3] = {1 << 20, 1 << 20, 1 << 20};
  float buf[6] = {1, 2, 3, 4, 5, 6};
  sta_expect_err(sta_tensor_create(NULL, STA_F32, STA_CPU, 2, ok), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_create(&t, (sta_dtype)7, STA_CPU, 2, ok), STA_ERR_DTYPE,
             "dtype: unknown dtype 7");
  sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CPU, 0, ok), STA_ERR_SHAPE,
             "ndim: expected 1..4, got 0");
  sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CPU, 5, ok), STA_ERR_SHAPE,
             "ndim: expected 1..4, got 5");
  sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CPU, 2, NULL), STA_ERR_SHAPE,
             "shape: expected an array, got NULL");
  sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CPU, 2, neg), STA_ERR_SHAPE,
             "shape[1]: expected >= 0, got -2");
  sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CPU, 3, big), STA_ERR_SHAPE,
             "shape[2]: 1048576 makes the tensor too large");
  sta_expect_err(sta_tensor_create(&t, STA_F32, (sta_device)3, 2, ok), STA_ERR_ARGUMENT,
             "device: unknown device 3");
  if (!sta_backend_available(STA_CUDA)) {
    char nb[320];
    snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
    sta_expect_err(sta_tensor_create(&t, STA_F32, STA_CUDA, 2, ok), STA_ERR_BACKEND, nb);
  }
  for (int64_t k = 1; k <= 3; k++) {
    sta_fault_arm(k);
    sta_status rc = sta_tensor_create(&t, STA_F32, STA_CPU, 2, ok);
    sta_fault_arm(0);
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_non_null(strstr(sta_last_error(), "out of host memory"));
  }
  sta_expect_err(sta_tensor_wrap(&t, NULL, STA_F32, STA_CPU, 2, ok, NULL), STA_ERR_ARGUMENT,
             "data: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_wrap(NULL, buf, STA_F32, STA_CPU, 2, ok, NULL), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_wrap(&t, buf, STA_F32, (sta_device)4, 2, ok, NULL), STA_ERR_ARGUMENT,
             "device: unknown device 4");
  int64_t huge[2] = {1, INT64_MAX / 2};
  sta_expect_err(sta_tensor_wrap(&t, buf, STA_F32, STA_CPU, 2, ok, huge), STA_ERR_SHAPE,
             "strides[1]: 4611686018427387903 is out of range");
  assert_ptr_equal(t, (sta_tensor *)0x1);
  /* an empty wrap needs no data */
  int64_t zero[1] = {0};
  t = NULL;
  assert_int_equal(sta_tensor_wrap(&t, NULL, STA_F32, STA_CPU, 1, zero, NULL), STA_OK);
  assert_int_equal(sta_tensor_numel(t), 0);
  sta_tensor_destroy(t);
}

static void test_view_errors(void **state) {
  (void)state;
  int64_t shape[2] = {4, 6};
  sta_tensor *a = make(STA_F32, 2, shape), *v = (sta_tensor *)0x1;
  int64_t vs[2] = {2, 6}, st[2] = {6, 1}, big[1] = {25}, one[1] = {1};
  sta_expect_err(sta_tensor_view(NULL, a, 0, 2, vs, st), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  sta_expect_err(sta_tensor_view(&v, NULL, 0, 2, vs, st), STA_ERR_ARGUMENT,
             "base: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_view(&v, a, 0, 2, vs, NULL), STA_ERR_SHAPE,
             "strides: expected an array, got NULL");
  sta_expect_err(sta_tensor_view(&v, a, 13, 2, vs, st), STA_ERR_SHAPE,
             "view: offset 13 with these shape and strides reaches elements 13..24 "
             "outside the storage of 24");
  sta_expect_err(sta_tensor_view(&v, a, 0, 1, big, one), STA_ERR_SHAPE,
             "view: offset 0 with these shape and strides reaches elements 0..24 "
             "outside the storage of 24");
  sta_expect_err(sta_tensor_view(&v, a, -1, 1, one, one), STA_ERR_SHAPE,
             "view: offset -1 with these shape and strides reaches elements -1..-1 "
             "outside the storage of 24");
  sta_expect_err(sta_tensor_view(&v, a, INT64_MAX, 1, one, one), STA_ERR_SHAPE,
             "view: offset 9223372036854775807 is outside the storage of 24");
  sta_expect_err(sta_tensor_view(&v, a, INT64_MIN, 1, one, one), STA_ERR_SHAPE,
             "view: offset -9223372036854775808 is outside the storage of 24");
  /* from a view that starts inside the storage: no overflow either */
  sta_tensor *nv = NULL;
  assert_int_equal(sta_tensor_narrow(&nv, a, 0, 2, 2), STA_OK);
  sta_expect_err(sta_tensor_view(&v, nv, INT64_MAX, 1, one, one), STA_ERR_SHAPE,
             "view: offset 9223372036854775807 is outside the storage of 24");
  sta_expect_err(sta_tensor_view(&v, nv, -13, 1, one, one), STA_ERR_SHAPE,
             "view: offset -13 with these shape and strides reaches elements -1..-1 "
             "outside the storage of 24");
  sta_tensor *ok = NULL;
  assert_int_equal(sta_tensor_view(&ok, nv, -12, 1, one, one), STA_OK);
  assert_true(at(ok, 0, 0, 0, 0) == at(a, 0, 0, 0, 0));
  sta_tensor_destroy(ok);
  sta_tensor_destroy(nv);
  int32_t p1[2] = {0, 0}, p2[2] = {1, 2};
  sta_expect_err(sta_tensor_permute(&v, a, p1), STA_ERR_ARGUMENT,
             "perm[1]: 0 is not a permutation of 0..1");
  sta_expect_err(sta_tensor_permute(&v, a, p2), STA_ERR_ARGUMENT,
             "perm[1]: 2 is not a permutation of 0..1");
  sta_expect_err(sta_tensor_permute(&v, a, NULL), STA_ERR_ARGUMENT,
             "perm: expected an array, got NULL");
  sta_expect_err(sta_tensor_permute(&v, NULL, p2), STA_ERR_ARGUMENT,
             "base: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_narrow(&v, a, 2, 0, 1), STA_ERR_ARGUMENT, "dim: expected 0..1, got 2");
  sta_expect_err(sta_tensor_narrow(&v, a, -1, 0, 1), STA_ERR_ARGUMENT, "dim: expected 0..1, got -1");
  sta_expect_err(sta_tensor_narrow(&v, a, 0, 2, 3), STA_ERR_ARGUMENT,
             "narrow: [2, 5) is outside dim 0 of size 4");
  sta_expect_err(sta_tensor_narrow(&v, a, 1, -1, 2), STA_ERR_ARGUMENT,
             "narrow: [-1, 1) is outside dim 1 of size 6");
  sta_expect_err(sta_tensor_narrow(&v, a, 1, 0, -1), STA_ERR_ARGUMENT,
             "narrow: [0, -1) is outside dim 1 of size 6");
  sta_expect_err(sta_tensor_narrow(&v, NULL, 0, 0, 1), STA_ERR_ARGUMENT,
             "base: expected a tensor, got NULL");
  assert_ptr_equal(v, (sta_tensor *)0x1);
  /* a failed view takes no reference: destroying a frees everything
  ** (checked by the sanitizer build) */
  sta_fault_arm(1);
  sta_expect_err(sta_tensor_narrow(&v, a, 0, 0, 1), STA_ERR_NOMEM, "out of host memory (tensor header)");
  sta_fault_arm(0);
  assert_ptr_equal(v, (sta_tensor *)0x1);
  sta_tensor_destroy(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_views_any_order),
    cmocka_unit_test(test_wrap),
    cmocka_unit_test(test_accessors),
    cmocka_unit_test(test_decode_all_patterns),
    cmocka_unit_test(test_round_to_half),
    cmocka_unit_test(test_copy_strided_dtypes),
    cmocka_unit_test(test_to_device),
    cmocka_unit_test(test_randn),
    cmocka_unit_test(test_fill_get_set),
    cmocka_unit_test(test_compare),
    cmocka_unit_test(test_create_errors),
    cmocka_unit_test(test_view_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
