/* test_vsa.c -- Video Sparse Attention on the CPU (STA.md section 12):
** topk from a sparsity, the cube order and sizes, the double reference
** against dense attention and against finite differences, the fast path
** (forward, backward, the coarse branch and its selection) against the
** reference on random problems (cube sizes 16..64, q with its own cubes,
** both cube sizes, gate, layouts, dtypes), ties and NaN in the selection,
** padding rows never read, determinism across runs and thread counts,
** cancellation, the timing's host code (spec/vsa_bench.h) walked at a
** small size, and the exact messages of bad inputs. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "vsa_bench.h"
#include "vsa_case.h"

/* ---- topk ------------------------------------------------------------------ */

static void test_topk(void **state) {
  (void)state;
  int32_t k = -7;
  assert_int_equal(sta_vsa_topk(0.875, 1800, &k), STA_OK);
  assert_int_equal(k, 225);
  assert_int_equal(sta_vsa_topk(0.0, 37, &k), STA_OK);
  assert_int_equal(k, 37);
  /* FastVideo's double expression: (1 - 0.7) * 10 = 3.0000000000000004 */
  assert_int_equal(sta_vsa_topk(0.7, 10, &k), STA_OK);
  assert_int_equal(k, (int32_t)ceil((1.0 - 0.7) * 10.0));
  assert_int_equal(k, 4);
  assert_int_equal(sta_vsa_topk(0.999999, 5, &k), STA_OK);
  assert_int_equal(k, 1);
  for (int i = 0; i < 200; i++) { /* random: always within 1..cubes, the ceil */
    const double s = (double)sta_test_rint(0, 999999) / 1e6;
    const int64_t n = sta_test_rint(1, 5000);
    assert_int_equal(sta_vsa_topk(s, n, &k), STA_OK);
    assert_true(k >= 1 && k <= n);
    assert_int_equal(k, (int32_t)ceil((1.0 - s) * (double)n));
  }
  k = 99;
  EXPECT_ERR(sta_vsa_topk(1.0, 10, &k), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got 1");
  EXPECT_ERR(sta_vsa_topk(-0.25, 10, &k), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got -0.25");
  EXPECT_ERR(sta_vsa_topk(NAN, 10, &k), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got nan");
  EXPECT_ERR(sta_vsa_topk(0.5, 0, &k), STA_ERR_ARGUMENT, "cubes: expected 1..2147483647, got 0");
  assert_int_equal(k, 99);
}

/* ---- the cube order ------------------------------------------------------------ */

/* FastVideo's tile_partition_indices, written out: the untiled index of
** every valid row of the cube order, cube after cube. */
static int64_t cube_rows(const int32_t cv[3], const int32_t cb[3], int64_t *src) {
  int64_t n = 0;
  for (int32_t t = 0; t < cv[0]; t += cb[0])
    for (int32_t h = 0; h < cv[1]; h += cb[1])
      for (int32_t w = 0; w < cv[2]; w += cb[2])
        for (int32_t a = t; a < t + cb[0] && a < cv[0]; a++)
          for (int32_t b = h; b < h + cb[1] && b < cv[1]; b++)
            for (int32_t e = w; e < w + cb[2] && e < cv[2]; e++)
              src[n++] = ((int64_t)a * cv[1] + b) * cv[2] + e;
  return n;
}

static void test_cubes(void **state) {
  (void)state;
  for (int iter = 0; iter < 12; iter++) {
    int32_t cv[3] = {(int32_t)sta_test_rint(1, 9), (int32_t)sta_test_rint(1, 13),
                     (int32_t)sta_test_rint(1, 11)};
    int32_t cb[3] = {4, iter % 2 ? 8 : 4, iter % 2 ? 8 : 4};
    const int64_t vol = (int64_t)cb[0] * cb[1] * cb[2], V = (int64_t)cv[0] * cv[1] * cv[2];
    int64_t count = -1;
    assert_int_equal(sta_vsa_cube_count(cv, cb, &count), STA_OK);
    assert_int_equal(count, (int64_t)((cv[0] + 3) / 4) * ((cv[1] + cb[1] - 1) / cb[1]) *
                                ((cv[2] + cb[2] - 1) / cb[2]));
    sta_tensor *sz = NULL;
    assert_int_equal(sta_tensor_create(&sz, STA_I32, STA_CPU, 1, &count), STA_OK);
    assert_int_equal(sta_vsa_cube_sizes(sz, cv, cb), STA_OK);
    /* each cube's size is the product of its clipped extents; the valid
    ** rows come cube after cube in FastVideo's order */
    int64_t *src = malloc(sizeof(int64_t) * (size_t)V), total = 0, seen = 0;
    assert_int_equal(cube_rows(cv, cb, src), V);
    vcase c;
    vcase_init(&c);
    c.H = 2; c.D = 3; c.B = 2;
    c.layout = iter % 3 ? STA_BSHD : STA_BHSD;
    sta_tensor *u = vsa_t4(&c, V, STA_F32), *cu = vsa_t4(&c, count * vol, STA_F32),
               *back = vsa_t4(&c, V, STA_F32);
    assert_int_equal(sta_tensor_randn(u, (uint64_t)iter + 5, 0, 1), STA_OK);
    assert_int_equal(sta_tensor_fill(cu, NAN), STA_OK);
    assert_int_equal(sta_tensor_to_cubes(cu, u, cv, cb, c.layout), STA_OK);
    for (int64_t m = 0; m < count; m++) {
      int64_t at = m;
      double s;
      assert_int_equal(sta_tensor_get(sz, &at, &s), STA_OK);
      assert_true(s >= 1 && s <= (double)vol);
      for (int64_t r = 0; r < vol; r++) {
        const int64_t row = m * vol + r;
        for (int64_t b = 0; b < c.B; b++)
          for (int64_t h = 0; h < c.H; h++)
            for (int64_t d = 0; d < c.D; d++) {
              const double x = vsa_at(&c, cu, b, row, h, d);
              if (r >= (int64_t)s) assert_true(x == 0.0); /* padding rows 0 */
              else assert_true(x == vsa_at(&c, u, b, src[seen + r], h, d));
            }
      }
      seen += (int64_t)s;
      total += (int64_t)s;
    }
    assert_int_equal(total, V);
    assert_int_equal(sta_tensor_fill(back, NAN), STA_OK);
    assert_int_equal(sta_tensor_from_cubes(back, cu, cv, cb, c.layout), STA_OK);
    double mx = 1;
    assert_int_equal(sta_tensor_compare(back, u, &mx, NULL), STA_OK);
    assert_true(mx == 0.0);
    free(src);
    sta_tensor_destroy(sz); sta_tensor_destroy(u); sta_tensor_destroy(cu);
    sta_tensor_destroy(back);
  }
  /* bad arguments */
  int32_t cv[3] = {5, 6, 7}, cb[3] = {4, 4, 4}, bad[3] = {4, 0, 4}, big[3] = {16, 16, 32};
  int64_t n = -1;
  EXPECT_ERR(sta_vsa_cube_count(bad, cb, &n), STA_ERR_WINDOW, "canvas: H = 0, expected >= 1");
  EXPECT_ERR(sta_vsa_cube_count(cv, bad, &n), STA_ERR_WINDOW, "cube: H = 0, expected 1..4096");
  EXPECT_ERR(sta_vsa_cube_count(cv, big, &n), STA_ERR_WINDOW,
             "cube: 16x16x32 = 8192 tokens, expected at most 4096");
  assert_int_equal(n, -1);
  sta_tensor *f = NULL, *i3 = NULL, *u = NULL, *o = NULL;
  int64_t three = 3, us[4] = {1, 210, 2, 4}, os[4] = {1, 8 * 64, 2, 4};
  assert_int_equal(sta_tensor_create(&f, STA_F32, STA_CPU, 1, &three), STA_OK);
  assert_int_equal(sta_tensor_create(&i3, STA_I32, STA_CPU, 1, &three), STA_OK);
  EXPECT_ERR(sta_vsa_cube_sizes(f, cv, cb), STA_ERR_DTYPE, "sizes: expected i32, got f32");
  EXPECT_ERR(sta_vsa_cube_sizes(i3, cv, cb), STA_ERR_SHAPE,
             "sizes: expected shape [8] (the cubes), got a 1-D tensor of 3 elements");
  assert_int_equal(sta_tensor_create(&u, STA_F32, STA_CPU, 4, us), STA_OK);
  assert_int_equal(sta_tensor_create(&o, STA_F32, STA_CPU, 4, os), STA_OK);
  EXPECT_ERR(sta_tensor_to_cubes(o, o, cv, cb, STA_BSHD), STA_ERR_SHAPE,
             "in: 512 rows, expected 210 (the canvas's tokens)");
  EXPECT_ERR(sta_tensor_from_cubes(o, u, cv, cb, STA_BSHD), STA_ERR_SHAPE,
             "in: 210 rows, expected 512 (cubes x cube volume)");
  EXPECT_ERR(sta_tensor_to_cubes(u, u, cv, cb, STA_BSHD), STA_ERR_SHAPE,
             "out: [B=1, S=210, heads=2, D=4], expected [B=1, S=512, heads=2, D=4]");
  sta_tensor_destroy(f); sta_tensor_destroy(i3); sta_tensor_destroy(u); sta_tensor_destroy(o);
}

/* ---- the reference -------------------------------------------------------------- */

static void reference(vset *s) {
  if (sta_vsa_reference(&s->d, s->q, s->k, s->v, s->gate, s->out, s->lse) != STA_OK)
    fail_msg("reference: %s", sta_last_error());
}

/* Sparsity 0 with gate 0: the fine branch alone, dense attention over the
** valid keys: the STA reference with one window over everything (whole
** cubes: every row a token). */
static void test_reference_dense(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.sizes = 0; c.gate = 1; c.mq = c.mk = 5; c.topk = 5; c.B = 2; c.D = 8;
  c.layout = STA_BHSD;
  c.scale = 0.4f;
  vset s;
  vset_make(&s, &c);
  assert_int_equal(sta_tensor_fill(s.gate, 0.0), STA_OK);
  reference(&s);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 1, 1, (int32_t)(c.mq * c.br));
  d.geom.tile[0] = d.geom.tile[1] = 1;
  d.geom.tile[2] = c.br;
  int32_t w[3] = {1, 1, 9};
  d.n_windows = 1; d.windows = w; d.layout = c.layout; d.scale = c.scale;
  sta_tensor *o = vsa_t4(&c, c.mq * c.br, STA_F32), *l = NULL;
  int64_t ls[3] = {c.B, c.H, c.mq * c.br};
  assert_int_equal(sta_tensor_create(&l, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_attention_reference(&d, s.q, s.k, s.v, o, l), STA_OK);
  double mx, rel = vsa_rel(&c, &s, s.out, o, 0, &mx);
  if (!(rel < 1e-6)) fail_msg("dense: rel %g max %g", rel, mx);
  if (!(vsa_lse_diff(&c, &s, s.lse, l) < 1e-5)) fail_msg("dense lse");
  sta_tensor_destroy(o); sta_tensor_destroy(l);
  vset_free(&s);
}

/* sum(W * out) of the forward reference (W: dout). */
static double ref_loss(const vcase *c, vset *s) {
  reference(s);
  double sum = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t m = 0; m < c->mq; m++)
      for (int64_t r = 0; r < s->qsz[m]; r++)
        for (int64_t h = 0; h < c->H; h++)
          for (int64_t d = 0; d < c->D; d++)
            sum += vsa_at(c, s->out, b, m * c->br + r, h, d) *
                   vsa_at(c, s->dout, b, m * c->br + r, h, d);
  return sum;
}

/* The double backward reference against central differences of the
** forward reference, on valid elements of q, k, v and gate. */
static void check_fd(vcase *c) {
  vset s;
  vset_make_clear(&s, c);
  if (sta_vsa_backward_reference(&s.d, s.q, s.k, s.v, s.gate, s.dout, s.dq, s.dk, s.dv, s.dg) !=
      STA_OK)
    fail_msg("backward reference: %s", sta_last_error());
  vsa_pad_zero(c, &s, s.dq, 0, "dq");
  vsa_pad_zero(c, &s, s.dk, 1, "dk");
  vsa_pad_zero(c, &s, s.dv, 1, "dv");
  if (s.dg) vsa_pad_zero(c, &s, s.dg, 0, "dgate");
  sta_tensor *x[4] = {s.q, s.k, s.v, s.gate}, *g[4] = {s.dq, s.dk, s.dv, s.dg};
  static const char *const GN[4] = {"dq", "dk", "dv", "dgate"};
  const double eps = 1e-2;
  for (int w = 0; w < 4; w++) {
    if (!x[w]) continue;
    const int kv = w == 1 || w == 2;
    for (int n = 0; n < 10; n++) {
      const int64_t M = kv ? c->mk : c->mq, m = sta_test_rint(0, M - 1);
      const int64_t r = sta_test_rint(0, (kv ? s.ksz : s.qsz)[m] - 1);
      const int64_t b = sta_test_rint(0, c->B - 1), h = sta_test_rint(0, c->H - 1),
                    d = sta_test_rint(0, c->D - 1), row = m * c->br + r;
      int64_t at[4] = {b, c->layout == STA_BSHD ? row : h, c->layout == STA_BSHD ? h : row, d};
      const double x0 = vsa_at(c, x[w], b, row, h, d), an = vsa_at(c, g[w], b, row, h, d);
      assert_int_equal(sta_tensor_set(x[w], at, x0 + eps), STA_OK);
      const double lp = ref_loss(c, &s);
      assert_int_equal(sta_tensor_set(x[w], at, x0 - eps), STA_OK);
      const double lm = ref_loss(c, &s);
      assert_int_equal(sta_tensor_set(x[w], at, x0), STA_OK);
      const double fd = (lp - lm) / (2 * eps);
      if (!(fabs(fd - an) <= 2e-3 + 2e-3 * fabs(an)))
        fail_msg("%s[b %lld, row %lld, h %lld, d %lld]: analytic %.6g, finite difference %.6g",
                 GN[w], (long long)b, (long long)row, (long long)h, (long long)d, an, fd);
    }
  }
  vset_free(&s);
}

static void test_reference_finite_differences(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.H = 1; c.D = 4; c.mq = c.mk = 4; c.topk = 2; c.gate = 1; c.seed = 11;
  check_fd(&c);
  c.mq = 3; c.mk = 5; c.topk = 3; c.B = 2; c.layout = STA_BHSD; c.scale = 0.8f; c.seed = 12;
  check_fd(&c);
  c.gate = 0; c.sizes = 0; c.mq = c.mk = 3; c.topk = 1; c.seed = 13;
  check_fd(&c);
}

/* ---- the fast path against the reference --------------------------------------------- */

static double fwd_tol(sta_dtype dt) { return dt == STA_F32 ? 2e-6 : dt == STA_F16 ? 2e-3 : 1e-2; }
static double bwd_tol(sta_dtype dt) { return dt == STA_F32 ? 1e-5 : dt == STA_F16 ? 4e-3 : 1.5e-2; }

static void check_fast(vcase *c) {
  vset s, r;
  vcase c32;
  vset_make_clear(&s, c);
  vsa_widen(c, &s, &c32, &r);
  sta_status rc = sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse);
  if (rc != STA_OK) fail_msg("forward: %s", sta_last_error());
  rc = sta_vsa_backward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse, s.dout, s.dq, s.dk, s.dv, s.dg);
  if (rc != STA_OK) fail_msg("backward: %s", sta_last_error());
  reference(&r);
  if (sta_vsa_backward_reference(&r.d, r.q, r.k, r.v, r.gate, r.dout, r.dq, r.dk, r.dv, r.dg) !=
      STA_OK)
    fail_msg("backward reference: %s", sta_last_error());
  const sta_tensor *got[6] = {s.out, s.dq, s.dk, s.dv, s.dg, s.lse};
  const sta_tensor *want[6] = {r.out, r.dq, r.dk, r.dv, r.dg, r.lse};
  vsa_check(c, &s, got, want, fwd_tol(c->dtype), bwd_tol(c->dtype),
            c->dtype == STA_F32 ? 1e-5 : 1e-2, sta_dtype_name(c->dtype));
  vset_free(&s);
  vset_free(&r);
}

static void test_fast_random(void **state) {
  (void)state;
  static const sta_dtype DT[3] = {STA_F32, STA_BF16, STA_F16};
  for (int i = 0; i < 9; i++) {
    vcase c;
    vcase_init(&c);
    c.dtype = DT[i % 3];
    c.layout = i % 2 ? STA_BHSD : STA_BSHD;
    c.mk = sta_test_rint(2, 9);
    c.mq = i % 3 == 1 ? sta_test_rint(1, 9) : c.mk;
    c.qown = i % 4 == 0;
    c.topk = (int32_t)sta_test_rint(1, c.mk);
    c.B = sta_test_rint(1, 2); c.H = sta_test_rint(1, 3);
    c.D = i % 2 ? 16 : 8;
    c.gate = i % 3 != 2;
    c.scale = i % 4 == 3 ? 0.3f : 0.0f;
    c.seed = sta_test_rnd() % 100000;
    check_fast(&c);
  }
}

static void test_fast_cube256(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.br = 256; c.lo = 60; c.mq = c.mk = 4; c.topk = 2; c.gate = 1; c.seed = 21;
  check_fast(&c);
}

/* Sparsity 0 (topk = Mk) and 1 - 1/cubes (topk 1). */
static void test_fast_extremes(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.mq = c.mk = 7; c.topk = 7; c.gate = 1; c.seed = 31;
  check_fast(&c);
  int32_t k;
  assert_int_equal(sta_vsa_topk(1.0 - 1.0 / 7.0, 7, &k), STA_OK);
  c.topk = k; c.seed = 32;
  assert_int_equal(c.topk, 1);
  check_fast(&c);
}

/* Sizes from random canvases (border cubes partial on every axis), both
** cube sizes. */
static void test_fast_canvas(void **state) {
  (void)state;
  for (int i = 0; i < 4; i++) {
    vcase c;
    vcase_init(&c);
    c.br = i % 2 ? 256 : 64;
    do {
      for (int a = 0; a < 3; a++) c.canvas[a] = (int32_t)sta_test_rint(2, a ? 14 : 9);
      c.mk = c.mq = vsa_canvas_sizes(c.canvas, c.br, NULL);
    } while (c.mk < 2 || c.mk > 12);
    c.topk = (int32_t)sta_test_rint(1, c.mk);
    c.gate = i < 2;
    c.dtype = i == 3 ? STA_BF16 : STA_F32;
    c.seed = sta_test_rnd() % 100000;
    check_fast(&c);
  }
}

/* Sparsity 0 with gate 0 on a canvas: the untiled tokens, put in cube
** order, through VSA and back equal dense attention over the tokens (the
** STA reference with one tile holding the canvas): padding rows are no
** tokens, the cube order loses none. */
static void test_dense_canvas(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    vcase c;
    vcase_init(&c);
    c.br = i ? 256 : 64;
    c.canvas[0] = 6; c.canvas[1] = i ? 10 : 7; c.canvas[2] = i ? 9 : 5;
    c.mq = c.mk = vsa_canvas_sizes(c.canvas, c.br, NULL);
    c.topk = (int32_t)c.mk;
    c.gate = 1; c.layout = i ? STA_BHSD : STA_BSHD; c.seed = 90 + (uint64_t)i;
    int32_t cube[3];
    vsa_cube_of(c.br, cube);
    const int64_t V = (int64_t)c.canvas[0] * c.canvas[1] * c.canvas[2];
    vset s;
    vset_make(&s, &c);
    assert_int_equal(sta_tensor_fill(s.gate, 0.0), STA_OK);
    sta_tensor *u[3], *cu[3] = {s.q, s.k, s.v};
    for (int j = 0; j < 3; j++) {
      u[j] = vsa_t4(&c, V, c.dtype);
      assert_int_equal(sta_tensor_randn(u[j], 300 + (uint64_t)j, 0, 1), STA_OK);
      assert_int_equal(sta_tensor_to_cubes(cu[j], u[j], c.canvas, cube, c.layout), STA_OK);
    }
    assert_int_equal(sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse), STA_OK);
    sta_tensor *o = vsa_t4(&c, V, c.dtype), *ref = vsa_t4(&c, V, c.dtype);
    assert_int_equal(sta_tensor_from_cubes(o, s.out, c.canvas, cube, c.layout), STA_OK);
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    sta_geometry_init(&d.geom, c.canvas[0], c.canvas[1], c.canvas[2]);
    memcpy(d.geom.tile, c.canvas, sizeof c.canvas);
    const int32_t w[3] = {1, 1, 1};
    d.layout = c.layout; d.n_windows = 1; d.windows = w;
    assert_int_equal(sta_attention_reference(&d, u[0], u[1], u[2], ref, NULL), STA_OK);
    double mx, rel;
    assert_int_equal(sta_tensor_compare(o, ref, &mx, &rel), STA_OK);
    if (!(rel < 2e-6)) fail_msg("cube %d: rel %g max %g against dense attention", c.br, rel, mx);
    for (int j = 0; j < 3; j++) sta_tensor_destroy(u[j]);
    sta_tensor_destroy(o); sta_tensor_destroy(ref);
    vset_free(&s);
  }
}

/* ---- the selection ------------------------------------------------------------------- */

/* sta_vsa_coarse's idx (host) for s. */
static int32_t *coarse_idx(const vcase *c, vset *s) {
  const int64_t n[4] = {c->B, c->H, c->mq, c->topk};
  sta_tensor *idx = NULL, *num = NULL;
  assert_int_equal(sta_tensor_create(&idx, STA_I32, STA_CPU, 4, n), STA_OK);
  assert_int_equal(sta_tensor_create(&num, STA_I32, STA_CPU, 3, n), STA_OK);
  if (sta_vsa_coarse(&s->d, s->q, s->k, s->v, NULL, NULL, idx, num) != STA_OK)
    fail_msg("coarse: %s", sta_last_error());
  const int32_t *nm = sta_tensor_data(num);
  for (int64_t i = 0; i < c->B * c->H * c->mq; i++) assert_int_equal(nm[i], c->topk);
  int32_t *out = malloc(sizeof(int32_t) * (size_t)(c->B * c->H * c->mq * c->topk));
  memcpy(out, sta_tensor_data(idx), sizeof(int32_t) * (size_t)(c->B * c->H * c->mq * c->topk));
  sta_tensor_destroy(idx);
  sta_tensor_destroy(num);
  return out;
}

/* Key cubes that repeat another's rows tie exactly: the lower index wins;
** a cube whose mean is NaN ranks above every number. */
static void test_selection_ties(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.mq = c.mk = 8; c.topk = 3; c.H = 2; c.seed = 41;
  c.sizes = 0; /* equal sizes, so copies have equal means */
  vset s;
  vset_make(&s, &c);
  /* every key cube a copy of cube 0: all scores tie, topk = 0, 1, 2 */
  for (int64_t n = 1; n < c.mk; n++) vsa_copy_cube(&c, &s, 0, n);
  int32_t *idx = coarse_idx(&c, &s);
  for (int64_t i = 0; i < c.B * c.H * c.mq; i++)
    for (int32_t j = 0; j < c.topk; j++) assert_int_equal(idx[i * c.topk + j], j);
  free(idx);
  /* cube 6 NaN: chosen by every query cube, with 0 and 1 */
  int64_t at[4] = {0, 6 * c.br + 3, 1, 2};
  assert_int_equal(sta_tensor_set(s.k, at, NAN), STA_OK);
  idx = coarse_idx(&c, &s);
  for (int64_t m = 0; m < c.mq; m++) {
    const int32_t *row = idx + (1 * c.mq + m) * c.topk;
    assert_int_equal(row[0], 0); assert_int_equal(row[1], 1); assert_int_equal(row[2], 6);
  }
  free(idx);
  vset_free(&s);
  /* random keys with cube 5 a copy of cube 2: the double scores' order,
  ** equal ones by index, is the selection */
  vcase_init(&c);
  c.mq = c.mk = 9; c.sizes = 0; c.H = 1;
  for (int trial = 0; trial < 6; trial++) {
    c.topk = (int32_t)sta_test_rint(1, 8);
    c.seed = 50 + (uint64_t)trial;
    vset_make(&s, &c);
    vsa_copy_cube(&c, &s, 2, 5);
    double sc[81];
    vsa_scores(&c, &s, 0, 0, sc);
    idx = coarse_idx(&c, &s);
    for (int64_t m = 0; m < c.mq; m++) {
      int taken[9] = {0};
      for (int32_t j = 0; j < c.topk; j++) { /* the rule, by repeated maximum */
        int best = -1;
        for (int n = 0; n < 9; n++)
          if (!taken[n] && (best < 0 || sc[m * 9 + n] > sc[m * 9 + best])) best = n;
        taken[best] = 1;
      }
      for (int32_t j = 0; j < c.topk; j++) {
        if (j) assert_true(idx[m * c.topk + j] > idx[m * c.topk + j - 1]); /* ascending */
        assert_true(taken[idx[m * c.topk + j]]);
      }
    }
    free(idx);
    vset_free(&s);
  }
}

/* ---- determinism, cancellation ------------------------------------------------------- */

static void test_deterministic(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.mq = c.mk = 6; c.topk = 3; c.gate = 1; c.B = 2; c.H = 3; c.dtype = STA_BF16; c.seed = 61;
  vset a, b;
  vset_make(&a, &c);
  vset_make(&b, &c);
  const int32_t nt = sta_get_num_threads();
  sta_set_num_threads(1);
  assert_int_equal(sta_vsa_forward(&a.d, a.q, a.k, a.v, a.gate, a.out, a.lse), STA_OK);
  assert_int_equal(sta_vsa_backward(&a.d, a.q, a.k, a.v, a.gate, a.out, a.lse, a.dout, a.dq, a.dk,
                                    a.dv, a.dg), STA_OK);
  sta_set_num_threads(3);
  assert_int_equal(sta_vsa_forward(&b.d, b.q, b.k, b.v, b.gate, b.out, b.lse), STA_OK);
  assert_int_equal(sta_vsa_backward(&b.d, b.q, b.k, b.v, b.gate, b.out, b.lse, b.dout, b.dq, b.dk,
                                    b.dv, b.dg), STA_OK);
  sta_set_num_threads(nt);
  const sta_tensor *x[6] = {a.out, a.lse, a.dq, a.dk, a.dv, a.dg}, *y[6] = {b.out, b.lse, b.dq, b.dk, b.dv, b.dg};
  for (int i = 0; i < 6; i++) {
    const size_t n = (size_t)sta_tensor_numel(x[i]) * sta_dtype_size(sta_tensor_dtype(x[i]));
    assert_memory_equal(sta_tensor_data(x[i]), sta_tensor_data(y[i]), n);
  }
  vset_free(&a);
  vset_free(&b);
}

static void test_cancel(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.gate = 1; c.seed = 71;
  vset s;
  vset_make(&s, &c);
  sta_cancel();
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse), STA_ERR_CANCELLED, NULL);
  EXPECT_ERR(sta_vsa_backward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse, s.dout, s.dq, s.dk, s.dv,
                              s.dg), STA_ERR_CANCELLED, NULL);
  sta_cancel_clear();
  sta_tensor *o[6] = {s.out, s.lse, s.dq, s.dk, s.dv, s.dg};
  for (int i = 0; i < 6; i++) { /* untouched: NaN as made */
    sta_stats st;
    assert_int_equal(sta_tensor_stats(o[i], &st), STA_OK);
    assert_int_equal(st.nonfinite, sta_tensor_numel(o[i]));
  }
  vset_free(&s);
}

/* ---- the timing's host code (spec/vsa_bench.h; test_gpu_vsa runs it on CUDA) ---------- */

/* 270 cubes (more than any fixed array held; partial on every axis),
** topk 3: every piece of both tables, timed by the host clock. */
static void test_bench_walk(void **state) {
  (void)state;
  const vbench b = {"walk", {9, 17, 70}, 1, 16, STA_BF16, 0.99, STA_CPU, 1};
  const double f = vb_bench_forward(&b), g = vb_bench_backward(&b);
  assert_true(f > 0 && isfinite(f));
  assert_true(g > 0 && isfinite(g));
}

/* ---- bad inputs ------------------------------------------------------------------------ */

static void test_errors(void **state) {
  (void)state;
  vcase c;
  vcase_init(&c);
  c.gate = 1; c.mq = c.mk = 4; c.seed = 81;
  vset s;
  vset_make(&s, &c);
  sta_vsa_desc d = s.d;
#define FWD(dd, o) sta_vsa_forward(&(dd), s.q, s.k, s.v, s.gate, (o), s.lse)
  d.block_rows = 100;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT,
             "block_rows: expected 64 (4x4x4 cubes) or 256 (4x8x8 cubes), got 100");
  d = s.d; d.topk = 0;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "topk: expected 1..4 (the key cubes), got 0");
  d.topk = 5;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "topk: expected 1..4 (the key cubes), got 5");
  d = s.d; d.scale = INFINITY;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "scale: expected a finite value, got inf");
  d = s.d; d.layout = (sta_layout)3;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got 3");
  d = s.d; d.block_rows = 256;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "topk: expected 1..1 (the key cubes), got 2");
  /* sizes */
  int32_t bad[4] = {64, 3, 65, 1}, zero[4] = {5, 0, 5, 5};
  sta_tensor *b1 = vsa_i32(&c, 4, bad), *b0 = vsa_i32(&c, 4, zero), *b3 = vsa_i32(&c, 3, bad);
  d = s.d; d.kv_sizes = b1;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "kv_sizes[2]: 65 valid rows, expected 1..64 (block_rows)");
  d.kv_sizes = s.ks; d.q_sizes = b0;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_ARGUMENT, "q_sizes[1]: 0 valid rows, expected 1..64 (block_rows)");
  d.q_sizes = b3;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_SHAPE, "q_sizes: expected shape [cubes] = [4], got [3]");
  d.q_sizes = s.out;
  EXPECT_ERR(FWD(d, s.out), STA_ERR_DTYPE, "q_sizes: expected i32, got f32");
  /* operands */
  sta_tensor *small = vsa_t4(&c, 2 * 64, STA_F32), *h16 = vsa_t4(&c, 4 * 64, STA_F16);
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, s.k, s.v, small, s.out, s.lse), STA_ERR_SHAPE,
             "gate: shape [B=1, S=128, heads=2, D=16] differs from q's [B=1, S=256, heads=2, D=16]");
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, h16, s.lse), STA_ERR_DTYPE,
             "out: dtype f16 differs from q's f32");
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.dq), STA_ERR_SHAPE,
             "lse: expected shape [B, heads, Sq] = [1, 2, 256], got [1, 256, 2, 16]");
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, s.k, s.v, s.gate, s.q, s.lse), STA_ERR_ARGUMENT,
             "out: shares memory with q (the forward writes out while it reads q; use a separate "
             "tensor)");
  d = s.d; d.block_rows = 256; d.topk = 1;
  EXPECT_ERR(sta_vsa_forward(&d, small, s.k, s.v, NULL, s.out, s.lse), STA_ERR_SHAPE,
             "q: 128 rows, expected a positive multiple of block_rows 256");
  EXPECT_ERR(sta_vsa_forward(&s.d, s.q, small, s.v, s.gate, s.out, s.lse), STA_ERR_SHAPE,
             "v: shape [B=1, S=256, heads=2, D=16] differs from k's [B=1, S=128, heads=2, D=16]");
  EXPECT_ERR(sta_vsa_backward(&s.d, s.q, s.k, s.v, NULL, s.out, s.lse, s.dout, s.dq, s.dk, s.dv,
                              s.dg), STA_ERR_ARGUMENT, "dgate: given without a gate (gate is NULL)");
  EXPECT_ERR(sta_vsa_backward(&s.d, s.q, s.k, s.v, s.gate, s.out, NULL, s.dout, s.dq, s.dk, s.dv,
                              s.dg), STA_ERR_ARGUMENT, "lse: expected a tensor, got NULL");
  EXPECT_ERR(sta_vsa_backward(&s.d, s.q, s.k, s.v, s.gate, s.out, s.lse, s.dout, s.dq, s.dq, s.dv,
                              s.dg), STA_ERR_ARGUMENT,
             "dk: shares memory with dq (the backward writes dk while it reads dq; use a separate "
             "tensor)");
  EXPECT_ERR(sta_vsa_coarse(&s.d, s.q, s.k, s.v, s.out, NULL, NULL, NULL), STA_ERR_SHAPE,
             "out_c: expected shape [B, heads, Mq, D] = [1, 2, 4, 16], got [1, 256, 2, 16]");
  EXPECT_ERR(sta_vsa_forward(NULL, s.q, s.k, s.v, s.gate, s.out, s.lse), STA_ERR_ARGUMENT,
             "desc: expected a descriptor, got NULL");
  /* nothing written by any of these */
  sta_stats st;
  assert_int_equal(sta_tensor_stats(s.out, &st), STA_OK);
  assert_int_equal(st.nonfinite, sta_tensor_numel(s.out));
  sta_tensor_destroy(b1); sta_tensor_destroy(b0); sta_tensor_destroy(b3);
  sta_tensor_destroy(small); sta_tensor_destroy(h16);
  vset_free(&s);
#undef FWD
}

int main(void) {
  sta_test_begin(2654435761u, 17);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_topk),
      cmocka_unit_test(test_cubes),
      cmocka_unit_test(test_reference_dense),
      cmocka_unit_test(test_reference_finite_differences),
      cmocka_unit_test(test_fast_random),
      cmocka_unit_test(test_fast_cube256),
      cmocka_unit_test(test_fast_extremes),
      cmocka_unit_test(test_fast_canvas),
      cmocka_unit_test(test_dense_canvas),
      cmocka_unit_test(test_selection_ties),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_cancel),
      cmocka_unit_test(test_bench_walk),
      cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
