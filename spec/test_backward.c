/* test_backward.c -- the STA backward on the CPU (STA.md section 10): the
** double reference against finite differences of the forward reference,
** the fast path against the reference on random geometries (odd canvases,
** partial tiles, border and per-head windows, text and padding rows, both
** layouts, strided views, batch, every dtype), determinism across runs and
** thread counts, and every error path of sta_attention_backward. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

#define MAXH 4

typedef struct prob {
  int32_t canvas[3], tile[3];
  int64_t text, text_len; /* rows after the video; valid ones (-1: all) */
  int64_t B, H, D;
  sta_dtype dtype;
  sta_layout layout;
  int permuted;           /* tensors stored in the other layout and permuted */
  int32_t n_windows, windows[3 * MAXH];
  float scale;
  uint64_t seed;
} prob;

static void prob_init(prob *c, int32_t t, int32_t h, int32_t w) {
  memset(c, 0, sizeof *c);
  c->canvas[0] = t; c->canvas[1] = h; c->canvas[2] = w;
  c->tile[0] = 2; c->tile[1] = 3; c->tile[2] = 3;
  c->text_len = -1;
  c->B = 1; c->H = 2; c->D = 8;
  c->dtype = STA_F32;
  c->n_windows = 1;
  c->windows[0] = c->windows[1] = c->windows[2] = 3;
  c->seed = 1;
}

static int64_t seq(const prob *c) {
  return (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2] + c->text;
}

static void desc_of(const prob *c, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(d->geom.tile, c->tile, sizeof c->tile);
  d->geom.text_len = c->text_len;
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
  d->scale = c->scale;
}

/* A [B, S, H, D] tensor in c's layout; permuted: stored in the other layout
** (a strided view).  The returned handle is the view; *base the storage. */
static sta_tensor *make4(const prob *c, sta_dtype dt, sta_tensor **base) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int store_bshd = (c->layout == STA_BSHD) != (c->permuted != 0);
  int64_t S = seq(c), shape[4] = {c->B, store_bshd ? S : c->H, store_bshd ? c->H : S, c->D};
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_create(base, dt, STA_CPU, 4, shape), STA_OK);
  if (c->permuted) assert_int_equal(sta_tensor_permute(&v, *base, swap), STA_OK);
  else assert_int_equal(sta_tensor_narrow(&v, *base, 3, 0, c->D), STA_OK);
  return v;
}

typedef struct set {
  sta_tensor *t[8], *base[8]; /* q k v dout out dq dk dv */
  sta_tensor *lse;
} set;

enum { Q, K, V, DO, O, DQ, DK, DV };

static void set_make(set *s, const prob *c) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < 8; i++) s->t[i] = make4(c, c->dtype, &s->base[i]);
  for (int i = 0; i < 4; i++)
    assert_int_equal(sta_tensor_randn(s->t[i], c->seed * 8 + (uint64_t)i, i == V ? 0.3 : 0.0, 1.0),
                     STA_OK);
  for (int i = O; i <= DV; i++) assert_int_equal(sta_tensor_fill(s->base[i], NAN), STA_OK);
  int64_t lshape[3] = {c->B, c->H, seq(c)};
  assert_int_equal(sta_tensor_create(&s->lse, STA_F32, STA_CPU, 3, lshape), STA_OK);
  assert_int_equal(sta_tensor_fill(s->lse, NAN), STA_OK);
}

static void set_free(set *s) {
  for (int i = 0; i < 8; i++) {
    sta_tensor_destroy(s->t[i]);
    sta_tensor_destroy(s->base[i]);
  }
  sta_tensor_destroy(s->lse);
}

static void forward_backward(const prob *c, set *s) {
  sta_attention_desc d;
  desc_of(c, &d);
  assert_int_equal(sta_attention_forward(&d, s->t[Q], s->t[K], s->t[V], s->t[O], s->lse), STA_OK);
  sta_status rc = sta_attention_backward(&d, s->t[Q], s->t[K], s->t[V], s->t[O], s->lse,
                                         s->t[DO], s->t[DQ], s->t[DK], s->t[DV]);
  if (rc != STA_OK) fail_msg("backward: %s", sta_last_error());
}

static sta_tensor *new_like(const sta_tensor *t, sta_dtype dt) {
  sta_tensor *x = NULL;
  int64_t shape[4];
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(t, i);
  assert_int_equal(sta_tensor_create(&x, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_fill(x, NAN), STA_OK);
  return x;
}

static const char *GNAME[3] = {"dq", "dk", "dv"};

/* Tolerance on rel L2 of the fast path against the double reference:
** storage rounding of the inputs is shared, so what is left is the
** float32 arithmetic (f32) or the rounding of the stored out / gradients
** (f16, bf16), amplified by dS = P (dP - D)'s cancellation. */
static double bwd_tol(sta_dtype dt) {
  return dt == STA_F32 ? 1e-5 : dt == STA_F16 ? 4e-3 : 1.5e-2;
}

/* The fast backward against the reference, and dk = dv = 0 exactly on the
** rows that are never keys. */
static void check_backward(const prob *c) {
  set s;
  set_make(&s, c);
  forward_backward(c, &s);
  sta_attention_desc d;
  desc_of(c, &d);
  /* the reference on exact f32 copies (f16 and bf16 widen without rounding) */
  sta_tensor *r[3], *x[4];
  for (int i = 0; i < 3; i++) r[i] = new_like(s.t[Q], STA_F32);
  for (int i = 0; i < 4; i++) {
    x[i] = NULL;
    assert_int_equal(sta_tensor_to(&x[i], s.t[i], STA_F32, STA_CPU), STA_OK);
  }
  sta_status rc = sta_attention_backward_reference(&d, x[Q], x[K], x[V], x[DO], r[0], r[1],
                                                   r[2]);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(x[i]);

  if (rc != STA_OK) fail_msg("reference: %s", sta_last_error());
  for (int i = 0; i < 3; i++) {
    double mx, rel;
    assert_int_equal(sta_tensor_compare(s.t[DQ + i], r[i], &mx, &rel), STA_OK);
    if (getenv("STA_TEST_VERBOSE")) printf("# %s %s rel %.3g\n", sta_dtype_name(c->dtype), GNAME[i], rel);
    if (!(rel < bwd_tol(c->dtype)))
      fail_msg("%s: canvas %dx%dx%d tile %dx%dx%d text %lld/%lld B%lld H%lld D%lld %s layout %d "
               "permuted %d window %d,%d,%d (n %d) scale %g: rel L2 %g, max %g",
               GNAME[i], c->canvas[0], c->canvas[1], c->canvas[2], c->tile[0], c->tile[1],
               c->tile[2], (long long)c->text, (long long)c->text_len, (long long)c->B,
               (long long)c->H, (long long)c->D, sta_dtype_name(c->dtype), (int)c->layout,
               c->permuted, c->windows[0], c->windows[1], c->windows[2], (int)c->n_windows,
               (double)c->scale, rel, mx);
  }
  /* never-key rows: exactly zero, in the fast path and the reference */
  int64_t V0 = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2];
  int64_t valid = c->text_len < 0 ? c->text : c->text_len;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t row = V0 + valid; row < seq(c); row++)
      for (int64_t h = 0; h < c->H; h++)
        for (int64_t e = 0; e < c->D; e++) {
          int64_t at[4] = {b, c->layout == STA_BSHD ? row : h, c->layout == STA_BSHD ? h : row, e};
          double z;
          for (int g = 1; g < 3; g++) {
            assert_int_equal(sta_tensor_get(s.t[DQ + g], at, &z), STA_OK);
            if (z != 0.0) fail_msg("%s row %lld (never a key) = %g", GNAME[g], (long long)row, z);
            assert_int_equal(sta_tensor_get(r[g], at, &z), STA_OK);
            assert_true(z == 0.0);
          }
        }
  for (int i = 0; i < 3; i++) sta_tensor_destroy(r[i]);
  set_free(&s);
}

/* ---- the reference against finite differences --------------------------- */

/* sum(dout * O) with O from the forward reference, in double. */
static double loss(const prob *c, const set *s) {
  sta_attention_desc d;
  desc_of(c, &d);
  sta_tensor *o = new_like(s->t[Q], STA_F32);
  assert_int_equal(sta_attention_reference(&d, s->t[Q], s->t[K], s->t[V], o, NULL), STA_OK);
  double sum = 0, x, g;
  int64_t at[4];
  for (at[0] = 0; at[0] < sta_tensor_size(o, 0); at[0]++)
    for (at[1] = 0; at[1] < sta_tensor_size(o, 1); at[1]++)
      for (at[2] = 0; at[2] < sta_tensor_size(o, 2); at[2]++)
        for (at[3] = 0; at[3] < sta_tensor_size(o, 3); at[3]++) {
          assert_int_equal(sta_tensor_get(o, at, &x), STA_OK);
          assert_int_equal(sta_tensor_get(s->t[DO], at, &g), STA_OK);
          sum += x * g;
        }
  sta_tensor_destroy(o);
  return sum;
}

static void check_finite_differences(const prob *c) {
  set s;
  set_make(&s, c);
  sta_attention_desc d;
  desc_of(c, &d);
  assert_int_equal(sta_attention_backward_reference(&d, s.t[Q], s.t[K], s.t[V], s.t[DO],
                                                    s.t[DQ], s.t[DK], s.t[DV]),
                   STA_OK);
  const double eps = 1e-2;
  int checked = 0;
  for (int which = 0; which < 3; which++)
    for (int n = 0; n < 24; n++) {
      int64_t at[4];
      for (int i = 0; i < 4; i++) {
        uint64_t u = (uint64_t)(fabs(sta_randn_at(c->seed + 77, (uint64_t)(100 * which + 4 * n + i))) * 1e6);
        at[i] = (int64_t)(u % (uint64_t)sta_tensor_size(s.t[which], i));
      }
      double x0, an;
      assert_int_equal(sta_tensor_get(s.t[which], at, &x0), STA_OK);
      assert_int_equal(sta_tensor_get(s.t[DQ + which], at, &an), STA_OK);
      assert_int_equal(sta_tensor_set(s.t[which], at, x0 + eps), STA_OK);
      double lp = loss(c, &s);
      assert_int_equal(sta_tensor_set(s.t[which], at, x0 - eps), STA_OK);
      double lm = loss(c, &s);
      assert_int_equal(sta_tensor_set(s.t[which], at, x0), STA_OK);
      double fd = (lp - lm) / (2 * eps);
      if (!(fabs(fd - an) <= 2e-3 + 2e-3 * fabs(an)))
        fail_msg("%s[%lld,%lld,%lld,%lld]: analytic %.6g, finite difference %.6g", GNAME[which],
                 (long long)at[0], (long long)at[1], (long long)at[2], (long long)at[3], an, fd);
      checked++;
    }
  assert_int_equal(checked, 72);
  set_free(&s);
}

static void test_reference_finite_differences(void **state) {
  (void)state;
  prob c;
  /* 3x2x2 tiles with partial ones, per-head windows, 3 text rows of which
  ** 2 valid, batch 2, both layouts */
  prob_init(&c, 5, 5, 6);
  c.text = 3; c.text_len = 2; c.B = 2; c.H = 2; c.D = 4;
  c.n_windows = 2;
  int32_t w[6] = {1, 1, 3, 3, 3, 1};
  memcpy(c.windows, w, sizeof w);
  c.seed = 3;
  check_finite_differences(&c);
  c.layout = STA_BHSD; c.permuted = 1; c.scale = 0.7f; c.seed = 4;
  check_finite_differences(&c);
  prob_init(&c, 4, 3, 7); /* full window, no text */
  c.tile[0] = 2; c.tile[1] = 2; c.tile[2] = 4;
  c.windows[0] = c.windows[1] = c.windows[2] = 9;
  c.H = 1; c.D = 3; c.seed = 5;
  check_finite_differences(&c);
}

/* ---- the fast path against the reference ---------------------------------- */

static void test_fixed_cases(void **state) {
  (void)state;
  prob c;
  prob_init(&c, 12, 16, 24); /* default 6x8x8 tiles: 2x2x3 */
  c.tile[0] = 6; c.tile[1] = 8; c.tile[2] = 8;
  c.H = 1; c.D = 16; c.windows[2] = 1; c.text = 5;
  check_backward(&c);
  prob_init(&c, 7, 9, 11); /* partial tiles on every axis, border windows */
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5;
  c.windows[0] = 3; c.windows[1] = 1; c.windows[2] = 3;
  c.D = 32; c.seed = 11; c.text = 9; c.text_len = 4;
  check_backward(&c);
  prob_init(&c, 5, 7, 9); /* tiles of one token */
  c.tile[0] = c.tile[1] = c.tile[2] = 1;
  c.windows[0] = 3; c.windows[1] = 5; c.windows[2] = 3;
  c.seed = 12;
  check_backward(&c);
  prob_init(&c, 10, 10, 13); /* whole-axis and border windows, per head */
  c.tile[0] = c.tile[1] = c.tile[2] = 2;
  c.H = 4; c.n_windows = 4;
  int32_t w[12] = {1, 5, 99, 9, 3, 1, 7, 7, 9, 3, 5, 13};
  memcpy(c.windows, w, sizeof w);
  c.text = 6; c.text_len = 0; c.seed = 13;
  check_backward(&c);
  prob_init(&c, 6, 11, 10); /* both layouts, views, batch, scale */
  for (int layout = 0; layout < 2; layout++)
    for (int perm = 0; perm < 2; perm++) {
      c.layout = (sta_layout)layout; c.permuted = perm;
      c.B = 2; c.D = 24; c.text = 7; c.text_len = 5;
      c.scale = perm ? 0.3f : 0.0f;
      c.seed = 20 + (uint64_t)(2 * layout + perm);
      check_backward(&c);
    }
  static const sta_dtype dts[] = {STA_F32, STA_F16, STA_BF16};
  static const int64_t dims[] = {64, 128, 1};
  for (int i = 0; i < 3; i++) { /* dtypes, the head dims that matter */
    prob_init(&c, 8, 9, 10);
    c.tile[0] = 4; c.tile[1] = 4; c.tile[2] = 4;
    c.dtype = dts[i]; c.D = dims[i]; c.H = 1; c.text = 11; c.text_len = 8;
    c.seed = 30 + (uint64_t)i;
    check_backward(&c);
  }
  /* more keys than one GEMM chunk and more text rows than one item */
  prob_init(&c, 4, 24, 24);
  c.tile[0] = 2; c.tile[1] = 8; c.tile[2] = 8;
  c.windows[0] = 1; c.windows[1] = 3; c.windows[2] = 3;
  c.H = 1; c.D = 8; c.text = 600; c.text_len = 530; c.seed = 40;
  check_backward(&c);
}

static void test_random_geometries(void **state) {
  (void)state;
  for (int n = 0; n < 48; n++) {
    prob c;
    double r[16];
    for (int i = 0; i < 16; i++) r[i] = fabs(sta_randn_at(777, (uint64_t)(16 * n + i)));
    prob_init(&c, 1 + (int32_t)(r[0] * 4) % 9, 1 + (int32_t)(r[1] * 5) % 13,
              1 + (int32_t)(r[2] * 7) % 17);
    int32_t grid[3];
    for (int i = 0; i < 3; i++) {
      c.tile[i] = 1 + (int32_t)(r[3 + i] * 3) % 5;
      grid[i] = (c.canvas[i] + c.tile[i] - 1) / c.tile[i];
    }
    c.H = 1 + (int64_t)(r[6] * 3) % 3;
    c.n_windows = n % 2 ? (int32_t)c.H : 1;
    for (int h = 0; h < c.n_windows; h++)
      for (int i = 0; i < 3; i++) {
        int32_t k = 1 + 2 * ((int32_t)(r[7 + i] * 3 + h) % 3);
        if ((int)(r[10] * 10 + h + i) % 5 == 0) k = grid[i] + (int32_t)(r[11] * 2);
        if (k < grid[i] && k % 2 == 0) k++;
        c.windows[3 * h + i] = k;
      }
    c.text = (int64_t)(r[12] * 6) % 13;
    c.text_len = n % 3 == 0 ? -1 : (int64_t)(r[13] * 5) % (c.text + 1);
    c.D = 1 + (int64_t)(r[14] * 20) % 40;
    c.B = 1 + n % 2;
    c.layout = (sta_layout)(n % 2);
    c.permuted = (n / 2) % 2;
    c.dtype = (sta_dtype)(n % 3);
    c.scale = n % 4 == 3 ? 0.25f : 0.0f;
    c.seed = 1000 + (uint64_t)n;
    check_backward(&c);
  }
}

/* ---- determinism ------------------------------------------------------------ */

static void test_deterministic(void **state) {
  (void)state;
  prob c;
  prob_init(&c, 12, 24, 24);
  c.tile[0] = 6; c.tile[1] = 8; c.tile[2] = 8;
  c.H = 2; c.D = 32; c.text = 40; c.text_len = 33; c.B = 2;
  c.n_windows = 2;
  int32_t w[6] = {1, 3, 3, 3, 1, 3};
  memcpy(c.windows, w, sizeof w);
  set a, b;
  set_make(&a, &c);
  int32_t before = sta_get_num_threads();
  sta_set_num_threads(1);
  forward_backward(&c, &a);
  for (int32_t t = 2; t <= 3; t++) {
    for (int run = 0; run < 2; run++) {
      sta_set_num_threads(t);
      set_make(&b, &c);
      forward_backward(&c, &b);
      for (int i = O; i <= DV; i++) {
        double mx, rel;
        assert_int_equal(sta_tensor_compare(a.t[i], b.t[i], &mx, &rel), STA_OK);
        if (mx != 0.0) fail_msg("threads %d run %d: tensor %d differs by %g", t, run, i, mx);
      }
      set_free(&b);
    }
  }
  sta_set_num_threads(before);
  set_free(&a);
}

/* ---- errors ------------------------------------------------------------------ */

/* A failing backward leaves dq, dk, dv as they were (NaN here). */
static void expect_untouched(set *s) {
  for (int i = DQ; i <= DV; i++) {
    double x;
    int64_t at[4] = {0, 0, 0, 0};
    assert_int_equal(sta_tensor_get(s->t[i], at, &x), STA_OK);
    assert_true(isnan(x));
  }
}

static void test_errors(void **state) {
  (void)state;
  prob c;
  prob_init(&c, 4, 6, 6);
  c.text = 2;
  set s;
  set_make(&s, &c);
  sta_attention_desc d;
  desc_of(&c, &d);
  assert_int_equal(sta_attention_forward(&d, s.t[Q], s.t[K], s.t[V], s.t[O], s.lse), STA_OK);
  sta_tensor **t = s.t;
#define BWD(dd, q, k, v, o, l, g, a, b, e) sta_attention_backward(dd, q, k, v, o, l, g, a, b, e)
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], NULL, t[DO], t[DQ], t[DK], t[DV]), STA_ERR_ARGUMENT,
             "lse: expected the forward's f32 [B, heads, S] log-sum-exp, got NULL");
  expect_untouched(&s);
  EXPECT_ERR(BWD(NULL, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DK], t[DV]),
             STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  /* dout of another shape, dtype or a missing gradient */
  sta_tensor *small = NULL, *half = NULL;
  int64_t sh[4] = {1, seq(&c) - 1, c.H, c.D}, full[4] = {1, seq(&c), c.H, c.D};
  assert_int_equal(sta_tensor_create(&small, STA_F32, STA_CPU, 4, sh), STA_OK);
  assert_int_equal(sta_tensor_create(&half, STA_BF16, STA_CPU, 4, full), STA_OK);
  assert_int_equal(sta_tensor_fill(small, 1.0), STA_OK);
  assert_int_equal(sta_tensor_fill(half, 1.0), STA_OK);
  char want[256];
  snprintf(want, sizeof want,
           "dout: shape [B=1, S=%lld, heads=2, D=8] differs from q's [B=1, S=%lld, heads=2, D=8]",
           (long long)seq(&c) - 1, (long long)seq(&c));
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, small, t[DQ], t[DK], t[DV]), STA_ERR_SHAPE,
             want);
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], half, t[DV]), STA_ERR_DTYPE,
             "dk: dtype bf16 differs from q's f32");
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DK], NULL), STA_ERR_ARGUMENT,
             NULL);
  assert_non_null(strstr(sta_last_error(), "dv"));
  expect_untouched(&s);
  /* written gradients that overlap an input or each other */
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DQ], t[DV]), STA_ERR_ARGUMENT,
             "dk: shares memory with dq (the backward writes dk while writing dq; use a separate "
             "tensor)");
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DK], t[V]), STA_ERR_ARGUMENT,
             "dv: shares memory with v (the backward writes dv while reading v; use a separate "
             "tensor)");
  EXPECT_ERR(BWD(&d, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DO], t[DK], t[DV]), STA_ERR_ARGUMENT,
             "dq: shares memory with dout (the backward writes dq while reading dout; use a "
             "separate tensor)");
  expect_untouched(&s);
  /* bad windows and descriptor fields, as for the forward */
  int32_t even[3] = {0, 1, 1};
  sta_attention_desc bad = d;
  bad.windows = even;
  EXPECT_ERR(BWD(&bad, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DK], t[DV]), STA_ERR_WINDOW,
             NULL);
  bad = d;
  bad.deterministic = 2;
  EXPECT_ERR(BWD(&bad, t[Q], t[K], t[V], t[O], s.lse, t[DO], t[DQ], t[DK], t[DV]),
             STA_ERR_ARGUMENT, "deterministic: expected 0 or 1, got 2");
  expect_untouched(&s);
  /* the reference: host only, the same operand checks */
  EXPECT_ERR(sta_attention_backward_reference(&d, t[Q], t[K], t[V], small, t[DQ], t[DK], t[DV]),
             STA_ERR_SHAPE, want);
  EXPECT_ERR(sta_attention_backward_reference(&d, t[Q], t[K], t[V], t[DO], t[DQ], t[DK], t[K]),
             STA_ERR_ARGUMENT,
             "dv: shares memory with k (the backward writes dv while reading k; use a separate "
             "tensor)");
  expect_untouched(&s);
#undef BWD
  sta_tensor_destroy(small);
  sta_tensor_destroy(half);
  set_free(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_reference_finite_differences),
      cmocka_unit_test(test_fixed_cases),
      cmocka_unit_test(test_random_geometries),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
