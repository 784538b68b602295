/*
** test_numerics.c -- bad numbers and absurd sizes.
**
** The NaN/Inf rule (RELIABILITY.md), per batch b and head h, keys(s) the key
** set of query row s (STA.md sections 2-3):
**   Q  a NaN or +-Inf anywhere in q[b,s,h,:]  -> out[b,s,h,:] all NaN, lse NaN.
**   K  NaN in k[b,j,h,d]                     -> every row s with j in keys(s)
**                                              all NaN, lse NaN;
**      +-Inf in k[b,j,h,d]: the logit of (s, j) is +-Inf * q[b,s,h,d]:
**        +Inf -> row NaN, lse NaN (softmax of +Inf is Inf/Inf);
**        -Inf -> key j gets weight 0, the row stays finite.
**   V  NaN in v[b,j,h,d]                     -> out[b,s,h,d] NaN for every s
**                                              with j in keys(s), only column d;
**      +-Inf in v[b,j,h,d]                   -> out[b,s,h,d] = +-Inf there
**                                              (every softmax weight is > 0).
**   Rows j >= V + text_len are never keys: non-finite values there only
**   matter as queries.  Everything else stays finite and equals the clean
**   run.  The fast CPU path and the double reference both follow it.
** Plus: huge or negative sizes in arguments and files are refused before
** any large allocation.
*/
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed;
static char dir[64];

static const char *tpath(const char *name) {
  static char buf[4][160];
  static int k;
  char *p = buf[k++ % 4];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

static sta_tensor *randn(sta_dtype dt, int32_t nd, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, nd, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, ++seed, 0.0, 1.0), STA_OK);
  return t;
}

static double get4(const sta_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d) {
  int64_t i[4] = {a, b, c, d};
  double x;
  assert_int_equal(sta_tensor_get(t, i, &x), STA_OK);
  return x;
}

/* ---- the key set, from STA.md directly ------------------------------------ */

typedef struct problem {
  int32_t canvas[3], tile[3], grid[3];
  int64_t V, S, text_len, B, H, D;
  int32_t win[2][3];
} problem;

static int axis_in(int32_t q, int32_t k, int32_t c, int32_t key) {
  if (k >= c) return 1;
  int32_t r = k / 2, start = q - r;
  if (start < 0) start = 0;
  if (start > c - k) start = c - k;
  return key >= start && key < start + k;
}

static int is_key(const problem *p, int64_t h, int64_t s, int64_t j) {
  if (j >= p->V + p->text_len) return 0;
  if (s >= p->V || j >= p->V) return 1;
  int64_t qc[3] = {s / (p->canvas[1] * p->canvas[2]), (s / p->canvas[2]) % p->canvas[1],
                   s % p->canvas[2]};
  int64_t kc[3] = {j / (p->canvas[1] * p->canvas[2]), (j / p->canvas[2]) % p->canvas[1],
                   j % p->canvas[2]};
  for (int i = 0; i < 3; i++)
    if (!axis_in((int32_t)(qc[i] / p->tile[i]), p->win[h][i], p->grid[i],
                 (int32_t)(kc[i] / p->tile[i])))
      return 0;
  return 1;
}

/* Expected class of out[b,s,h,d]: 0 finite, 1 NaN, 2 +Inf, 3 -Inf;
** lse class 0 or 1. */
typedef struct plant {
  int which;     /* 0 q, 1 k, 2 v */
  int64_t b, s, h, d;
  double value;  /* NaN, +Inf, -Inf */
} plant;

static int cls(double x) {
  if (isnan(x)) return 1;
  if (isinf(x)) return x > 0 ? 2 : 3;
  return 0;
}

static int expect(const problem *p, const plant *pl, const sta_tensor *q, int64_t b,
                  int64_t s, int64_t h, int64_t d, int *lse_cls, int *touched) {
  *lse_cls = 0;
  *touched = 0;
  if (b != pl->b || h != pl->h) return 0;
  if (pl->which == 0) {
    if (s != pl->s) return 0;
    *lse_cls = 1;
    return 1;
  }
  if (!is_key(p, h, s, pl->s)) return 0;
  *touched = pl->which == 1; /* a dropped (-Inf logit) key changes the row */
  if (pl->which == 1) {
    int row_nan = isnan(pl->value);
    if (!row_nan) { /* logit +-Inf * q[d] */
      double qd = get4(q, b, s, h, pl->d);
      row_nan = (pl->value > 0) == (qd > 0);
    }
    *lse_cls = row_nan;
    return row_nan;
  }
  return d == pl->d ? cls(pl->value) : 0;
}

/* One planted value: fast forward and reference against the rule. */
static void check_plant(const problem *p, sta_dtype dt, const plant *pl,
                        int use_reference) {
  sta_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  for (int i = 0; i < 3; i++) {
    desc.geom.canvas[i] = p->canvas[i];
    desc.geom.tile[i] = p->tile[i];
  }
  desc.geom.text_len = p->text_len;
  desc.layout = STA_BSHD;
  desc.n_windows = 2;
  desc.windows = &p->win[0][0];
  int64_t shape[4] = {p->B, p->S, p->H, p->D}, ls[3] = {p->B, p->H, p->S};
  sta_tensor *t[3] = {randn(dt, 4, shape), randn(dt, 4, shape), randn(dt, 4, shape)};
  sta_tensor *out = NULL, *clean = NULL, *lse = NULL;
  assert_int_equal(sta_tensor_create(&out, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&clean, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  sta_status (*fwd)(const sta_attention_desc *, const sta_tensor *, const sta_tensor *,
                    const sta_tensor *, sta_tensor *, sta_tensor *) =
      use_reference ? sta_attention_reference : sta_attention_forward;
  assert_int_equal(fwd(&desc, t[0], t[1], t[2], clean, NULL), STA_OK);
  int64_t idx[4] = {pl->b, pl->s, pl->h, pl->d};
  assert_int_equal(sta_tensor_set(t[pl->which], idx, pl->value), STA_OK);
  assert_int_equal(fwd(&desc, t[0], t[1], t[2], out, lse), STA_OK);
  int64_t bad = 0;
  for (int64_t b = 0; b < p->B; b++)
    for (int64_t h = 0; h < p->H; h++)
      for (int64_t s = 0; s < p->S; s++) {
        int lc, want_l, touched;
        for (int64_t d = 0; d < p->D; d++) {
          int want = expect(p, pl, t[0], b, s, h, d, &want_l, &touched);
          double x = get4(out, b, s, h, d);
          if (cls(x) != want) {
            if (bad++ < 5)
              print_message("%s dt %s plant %c[%lld,%lld,%lld,%lld]=%g: out[%lld,%lld,%lld,%lld]"
                            " = %g, expected class %d\n", use_reference ? "reference" : "forward",
                            sta_dtype_name(dt), "qkv"[pl->which], (long long)pl->b,
                            (long long)pl->s, (long long)pl->h, (long long)pl->d, pl->value,
                            (long long)b, (long long)s, (long long)h, (long long)d, x, want);
            continue;
          }
          if (want == 0 && !touched) { /* untouched values equal the clean run */
            double c = get4(clean, b, s, h, d);
            if (fabs(x - c) > 1e-5 * (1 + fabs(c)) && bad++ < 5)
              print_message("out[%lld,%lld,%lld,%lld] = %g, clean run %g\n", (long long)b,
                            (long long)s, (long long)h, (long long)d, x, c);
          }
        }
        int64_t li[3] = {b, h, s};
        double l;
        assert_int_equal(sta_tensor_get(lse, li, &l), STA_OK);
        expect(p, pl, t[0], b, s, h, 0, &want_l, &touched);
        lc = isnan(l) ? 1 : isinf(l) ? 2 : 0;
        if (lc != want_l && bad++ < 5)
          print_message("lse[%lld,%lld,%lld] = %g, expected class %d\n", (long long)b,
                        (long long)h, (long long)s, l, want_l);
      }
  assert_int_equal(bad, 0);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(t[i]);
  sta_tensor_destroy(out);
  sta_tensor_destroy(clean);
  sta_tensor_destroy(lse);
}

static void make_problem(problem *p) {
  memset(p, 0, sizeof *p);
  int32_t c[3] = {6, 9, 8}, tl[3] = {2, 3, 3}; /* grid 3x3x3, last w tile partial */
  for (int i = 0; i < 3; i++) {
    p->canvas[i] = c[i];
    p->tile[i] = tl[i];
    p->grid[i] = (c[i] + tl[i] - 1) / tl[i];
  }
  p->V = 6 * 9 * 8;
  p->text_len = 5;
  p->S = p->V + 7; /* 2 padding rows */
  p->B = 2;
  p->H = 2;
  p->D = 16;
  int32_t w[2][3] = {{1, 3, 1}, {3, 1, 3}};
  memcpy(p->win, w, sizeof w);
}

static void run_rule(int use_reference) {
  problem p;
  make_problem(&p);
  const double vals[3] = {NAN, INFINITY, -INFINITY};
  int rounds = 0;
  for (int dt = 0; dt < 3; dt++)
    for (int which = 0; which < 3; which++)
      for (int vi = 0; vi < 3; vi++)
        for (int rep = 0; rep < (use_reference ? 1 : 2); rep++) {
          plant pl;
          uint64_t r = (uint64_t)(fabs(sta_randn_at(++seed, 0)) * 1e9);
          pl.which = which;
          pl.b = (int64_t)(r % 2);
          pl.h = (int64_t)((r / 2) % 2);
          pl.d = (int64_t)((r / 4) % 16);
          /* video rows, text rows and (sometimes) padding rows */
          pl.s = rep == 0 ? (int64_t)((r / 64) % (uint64_t)p.S)
                          : p.V + (int64_t)((r / 64) % (uint64_t)(p.S - p.V));
          pl.value = vals[vi];
          check_plant(&p, (sta_dtype)dt, &pl, use_reference);
          rounds++;
        }
  printf("# numerics: %d planted values checked (%s)\n", rounds,
         use_reference ? "reference" : "CPU forward");
}

static void test_nan_inf_forward(void **state) { (void)state; run_rule(0); }
static void test_nan_inf_reference(void **state) { (void)state; run_rule(1); }

/* Many non-finite values at once: no hang, no crash, NaN stays in its rows. */
static void test_all_nan(void **state) {
  (void)state;
  problem p;
  make_problem(&p);
  sta_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  sta_geometry_init(&desc.geom, 6, 9, 8);
  desc.geom.tile[0] = 2; desc.geom.tile[1] = 3; desc.geom.tile[2] = 3;
  desc.n_windows = 1;
  int32_t w[3] = {3, 3, 3};
  desc.windows = w;
  int64_t shape[4] = {1, p.S, 1, 64};
  sta_tensor *q = randn(STA_BF16, 4, shape), *k = randn(STA_BF16, 4, shape),
             *v = randn(STA_BF16, 4, shape), *out = NULL;
  assert_int_equal(sta_tensor_create(&out, STA_BF16, STA_CPU, 4, shape), STA_OK);
  double fills[3] = {NAN, INFINITY, -INFINITY};
  for (int f = 0; f < 3; f++) {
    assert_int_equal(sta_tensor_fill(k, fills[f]), STA_OK);
    assert_int_equal(sta_attention_forward(&desc, q, k, v, out, NULL), STA_OK);
    /* every logit non-finite: NaN everywhere (+-Inf keys of mixed sign) */
    for (int64_t s = 0; s < p.S; s += 37)
      assert_true(isnan(get4(out, 0, s, 0, (s * 7) % 64)));
    assert_int_equal(sta_tensor_randn(k, ++seed, 0, 1), STA_OK);
  }
  sta_tensor_destroy(q);
  sta_tensor_destroy(k);
  sta_tensor_destroy(v);
  sta_tensor_destroy(out);
}

/* Large logits (scale 1e4): the online softmax must not overflow to Inf. */
static void test_huge_logits(void **state) {
  (void)state;
  sta_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  sta_geometry_init(&desc.geom, 4, 8, 8);
  desc.geom.tile[0] = 2; desc.geom.tile[1] = 4; desc.geom.tile[2] = 4;
  desc.n_windows = 1;
  int32_t w[3] = {1, 1, 1};
  desc.windows = w;
  desc.scale = 1e4f;
  int64_t shape[4] = {1, 256 + 3, 2, 32};
  sta_tensor *q = randn(STA_F32, 4, shape), *k = randn(STA_F32, 4, shape),
             *v = randn(STA_F32, 4, shape), *out = NULL, *ref = NULL;
  assert_int_equal(sta_tensor_create(&out, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&ref, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_attention_forward(&desc, q, k, v, out, NULL), STA_OK);
  assert_int_equal(sta_attention_reference(&desc, q, k, v, ref, NULL), STA_OK);
  double m, r;
  assert_int_equal(sta_tensor_compare(out, ref, &m, &r), STA_OK);
  assert_true(isfinite(m)); /* no overflow, no NaN */
  assert_true(r < 0.1);     /* float logits of size ~1e4 vs double: loose */
  sta_tensor_destroy(q);
  sta_tensor_destroy(k);
  sta_tensor_destroy(v);
  sta_tensor_destroy(out);
  sta_tensor_destroy(ref);
}

/* ---- absurd sizes: refused before any large allocation -------------------- */

static void test_huge_tensor_args(void **state) {
  (void)state;
  sta_tensor *sentinel = (sta_tensor *)&seed, *t = sentinel;
  int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 20};
  sta_fault_arm(0);
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 2, huge), STA_ERR_SHAPE);
  assert_int_equal(sta_fault_count(), 0);
  assert_string_equal(sta_last_error(), "shape[1]: 1048576 makes the tensor too large");
  int64_t neg[3] = {2, -3, 4};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 3, neg), STA_ERR_SHAPE);
  assert_string_equal(sta_last_error(), "shape[1]: expected >= 0, got -3");
  int64_t big[4] = {INT64_MAX, INT64_MAX, 2, 2};
  assert_int_equal(sta_tensor_create(&t, STA_BF16, STA_CPU, 4, big), STA_ERR_SHAPE);
  float x[4];
  int64_t st[1] = {INT64_MAX / 2}, s2[1] = {3};
  assert_int_equal(sta_tensor_wrap(&t, x, STA_F32, STA_CPU, 1, s2, st), STA_ERR_SHAPE);
  assert_int_equal(sta_fault_count(), 0);
  assert_ptr_equal(t, sentinel);
  /* strategies, metadata, records, layers */
  int32_t w[3] = {3, 3, 3};
  sta_strategy *s = (sta_strategy *)&seed;
  assert_int_equal(sta_strategy_uniform(&s, 1 << 20, 1 << 10, 1 << 10, w, NULL, 0),
                   STA_ERR_ARGUMENT);
  assert_string_equal(sta_last_error(),
                      "steps x layers x heads: 1099511627776 entries is too many");
  sta_metadata *md = (sta_metadata *)&seed;
  assert_int_equal(sta_metadata_create(&md, INT32_MAX), STA_ERR_ARGUMENT);
  assert_int_equal(sta_metadata_search(&md, 1, INT32_MAX, w), STA_ERR_ARGUMENT);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  int64_t before = sta_fault_count();
  float l = 1;
  assert_int_equal(sta_forward_batch_record(fb, 0, 0, 0, 1, w, INT32_MAX, &l, &l),
                   STA_ERR_ARGUMENT);
  assert_int_equal(sta_fault_count(), before);
  sta_forward_batch_destroy(fb);
  assert_ptr_equal(s, &seed);
  assert_ptr_equal(md, &seed);
  sta_fault_arm(0);
}

static void test_huge_attention_args(void **state) {
  (void)state;
  int64_t shape[4] = {1, 64, 1, 8};
  sta_tensor *q = randn(STA_F32, 4, shape), *k = randn(STA_F32, 4, shape),
             *v = randn(STA_F32, 4, shape), *out = randn(STA_F32, 4, shape);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  int32_t w[3] = {1, 1, 1};
  d.windows = w;
  d.n_windows = 1;
  struct { int32_t c[3], t[3]; int64_t text; sta_status rc; const char *msg; } bad[] = {
    {{1 << 20, 1 << 20, 1 << 20}, {6, 8, 8}, -1, STA_ERR_WINDOW,
     "canvas: 1048576x1048576x1048576 has too many tokens"},
    {{1 << 21, 1, 1}, {6, 8, 8}, -1, STA_ERR_WINDOW, "canvas: t = 2097152, expected 1..1048576"},
    {{4, 4, 4}, {INT32_MAX, 1, 1}, -1, STA_ERR_WINDOW, "tile: t = 2147483647, expected 1..1048576"},
    {{-4, 4, 4}, {6, 8, 8}, -1, STA_ERR_WINDOW, "canvas: t = -4, expected 1..1048576"},
    {{4, 4, 8}, {6, 8, 8}, -1, STA_ERR_SEQ_LEN,
     "seq_len 64 not supported for STA (canvas 4x4x8 has 128 video rows, q has 64)"},
    {{4, 4, 4}, {6, 8, 8}, INT64_MAX, STA_ERR_ARGUMENT,
     "text_len: 9223372036854775807 is outside 0..0 (seq_len 64 - 64 video tokens)"},
    {{4, 4, 4}, {6, 8, 8}, -7, STA_ERR_ARGUMENT,
     "text_len: -7 is outside 0..0 (seq_len 64 - 64 video tokens)"},
  };
  sta_tensor *out0 = NULL;
  assert_int_equal(sta_tensor_to(&out0, out, STA_F32, STA_CPU), STA_OK);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    for (int a = 0; a < 3; a++) { d.geom.canvas[a] = bad[i].c[a]; d.geom.tile[a] = bad[i].t[a]; }
    d.geom.text_len = bad[i].text;
    sta_fault_arm(0);
    assert_int_equal(sta_attention_forward(&d, q, k, v, out, NULL), bad[i].rc);
    assert_int_equal(sta_fault_count(), 0);
    assert_string_equal(sta_last_error(), bad[i].msg);
  }
  double m, r;
  assert_int_equal(sta_tensor_compare(out, out0, &m, &r), STA_OK);
  assert_true(m == 0);
  /* a NaN scale and a huge window count */
  sta_geometry_init(&d.geom, 4, 4, 4);
  d.scale = NAN;
  assert_int_equal(sta_attention_forward(&d, q, k, v, out, NULL), STA_ERR_ARGUMENT);
  assert_string_equal(sta_last_error(), "scale: expected a finite value, got nan");
  d.scale = 0;
  d.n_windows = INT32_MAX;
  assert_int_equal(sta_attention_forward(&d, q, k, v, out, NULL), STA_ERR_WINDOW);
  assert_string_equal(sta_last_error(), "n_windows: expected 1 or heads (1), got 2147483647");
  w[0] = INT32_MAX; /* a window far larger than the grid is the full axis */
  d.n_windows = 1;
  assert_int_equal(sta_attention_forward(&d, q, k, v, out, NULL), STA_OK);
  sta_fault_arm(0);
  sta_tensor_destroy(q);
  sta_tensor_destroy(k);
  sta_tensor_destroy(v);
  sta_tensor_destroy(out);
  sta_tensor_destroy(out0);
}

static void write_npy(const char *path, const char *dict, size_t data_bytes) {
  char hdr[256];
  int n = snprintf(hdr, sizeof hdr, "%s", dict);
  size_t total = ((size_t)10 + (size_t)n + 1 + 63) / 64 * 64, hl = total - 10;
  memset(hdr + n, ' ', hl - 1 - (size_t)n);
  hdr[hl - 1] = '\n';
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)hl, 0};
  assert_int_equal(fwrite(pre, 1, 10, f), 10);
  assert_int_equal(fwrite(hdr, 1, hl, f), hl);
  for (size_t i = 0; i < data_bytes; i++) fputc((int)(i * 37 % 251), f);
  assert_int_equal(fclose(f), 0);
}

static void test_huge_npy(void **state) {
  (void)state;
  struct { const char *dict; const char *msg_part; } bad[] = {
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (1152921504606846976,), }",
     "needs 4611686018427387904 data bytes, the file holds 16"},
    {"{'descr': '<f2', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
     "shape (4294967296, 4294967296) is too large"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
     "size in 'shape' overflows"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (-4,), }", "negative size in 'shape'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2, 2, 1), }",
     "'shape' has more than 4 dimensions"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (0, 1152921504606846976), }",
     "needs 0 data bytes, the file holds 16"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_npy(tpath("h.npy"), bad[i].dict, 16);
    sta_tensor *sentinel = (sta_tensor *)&seed, *t = sentinel;
    sta_fault_arm(0);
    assert_int_equal(sta_npy_load(&t, tpath("h.npy"), 0), STA_ERR_FORMAT);
    /* only the header text was allocated */
    assert_true(sta_fault_count() <= 1);
    if (!strstr(sta_last_error(), bad[i].msg_part))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", i, sta_last_error(), bad[i].msg_part);
    assert_ptr_equal(t, sentinel);
  }
  /* a header length past the end of a tiny file */
  unsigned char tiny[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0x7f};
  FILE *f = fopen(tpath("t.npy"), "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(tiny, 1, sizeof tiny, f), sizeof tiny);
  assert_int_equal(fclose(f), 0);
  sta_tensor *t = NULL;
  sta_fault_arm(0);
  assert_int_equal(sta_npy_load(&t, tpath("t.npy"), 0), STA_ERR_FORMAT);
  assert_int_equal(sta_fault_count(), 0);
  assert_non_null(strstr(sta_last_error(), "truncated header (header length 2147483647"));
}

static void write_st(const char *path, const char *json, size_t data_bytes) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  uint64_t n = strlen(json);
  unsigned char len[8];
  for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
  assert_int_equal(fwrite(len, 1, 8, f), 8);
  assert_int_equal(fwrite(json, 1, n, f), n);
  for (size_t i = 0; i < data_bytes; i++) fputc((int)(i * 13 % 256), f);
  assert_int_equal(fclose(f), 0);
}

static void test_huge_safetensors(void **state) {
  (void)state;
  struct { const char *json; const char *msg_part; } bad[] = {
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
     "entry 'x': shape is too large"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1152921504606846976],\"data_offsets\":[0,16]}}",
     "entry 'x': shape[0] must be an integer >= 0"},
    {"{\"x\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,9007199254740992]}}",
     "are outside the 16 data bytes"},
    {"{\"x\":{\"dtype\":\"F16\",\"shape\":[-8],\"data_offsets\":[0,16]}}",
     "shape[0] must be an integer >= 0"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,16]}}",
     "shape[0] must be an integer >= 0"},
    {"{\"x\":{\"dtype\":\"F32\",\"shape\":[2,2,2,2,2,2,2,2,2],\"data_offsets\":[0,16]}}",
     "9 dimensions (at most 8)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_st(tpath("h.safetensors"), bad[i].json, 16);
    sta_safetensors *sentinel = (sta_safetensors *)&seed, *f = sentinel;
    sta_fault_arm(0);
    assert_int_equal(sta_safetensors_open(&f, tpath("h.safetensors")), STA_ERR_FORMAT);
    assert_true(sta_fault_count() < 40); /* handle, path, header text, cJSON nodes */
    if (!strstr(sta_last_error(), bad[i].msg_part))
      fail_msg("case %zu: \"%s\" lacks \"%s\"", i, sta_last_error(), bad[i].msg_part);
    assert_ptr_equal(f, sentinel);
  }
  /* header length 2^63 in a 16-byte file */
  FILE *fp = fopen(tpath("t.safetensors"), "wb");
  assert_non_null(fp);
  unsigned char b[16] = {0, 0, 0, 0, 0, 0, 0, 0x80, '{', '}'};
  assert_int_equal(fwrite(b, 1, 16, fp), 16);
  assert_int_equal(fclose(fp), 0);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("t.safetensors")), STA_ERR_FORMAT);
  assert_non_null(strstr(sta_last_error(), "header length 9223372036854775808 is impossible"));
  sta_fault_arm(0);
}

static int setup(void **state) {
  (void)state;
  seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("# test_numerics seed %llu\n", (unsigned long long)seed);
  return sta_test_mkdtemp(dir, sizeof dir, "numerics");
}

static int teardown(void **state) {
  (void)state;
  return sta_test_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_nan_inf_forward),
    cmocka_unit_test(test_nan_inf_reference),
    cmocka_unit_test(test_all_nan),
    cmocka_unit_test(test_huge_logits),
    cmocka_unit_test(test_huge_tensor_args),
    cmocka_unit_test(test_huge_attention_args),
    cmocka_unit_test(test_huge_npy),
    cmocka_unit_test(test_huge_safetensors),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
