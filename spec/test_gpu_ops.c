/* test_gpu_ops.c -- the CUDA elementwise operations and reductions against
** the host: copy (every dtype pair), fill, randn, axpby, scale, add on
** random shapes and views (contiguous, offset, permuted and padded, padded
** rows: each kernel path, the flat path's tail) must give the host's bits
** in the whole storage (so nothing outside a view is written either);
** stats must match the host's (exact counts, min, max; mean and std to
** float rounding) and repeat bit for bit; device work moves no bytes
** across (sta_transfer_bytes) while to("cpu") moves exactly the tensor.
** Skips cleanly without a CUDA device.  STA_TEST_SEED replays a run;
** STA_GPU_CASES sets the random cases per test (default 150); STA_GPU_QUICK
** skips the large ones (for compute-sanitizer). */
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

static int cases(void) {
  const char *s = getenv("STA_GPU_CASES");
  return s && atoi(s) > 0 ? atoi(s) : 150;
}

/* One operand: the same random storage on the host and the device, and the
** same view of each. */
typedef struct twin {
  ops_layout l;
  sta_tensor *hb, *db, *hv, *dv;
} twin;

static void twin_make(twin *t, sta_dtype dt, int32_t nd, const int64_t *shape, int kind) {
  t->l = ops_layout_of(nd, shape, kind);
  t->hb = ops_storage(dt, STA_CPU, &t->l, ops_rnd());
  assert_int_equal(sta_tensor_to(&t->db, t->hb, dt, STA_CUDA), STA_OK);
  t->hv = ops_view(t->hb, &t->l);
  t->dv = ops_view(t->db, &t->l);
}

static void twin_free(twin *t) {
  sta_tensor_destroy(t->hv);
  sta_tensor_destroy(t->dv);
  sta_tensor_destroy(t->hb);
  sta_tensor_destroy(t->db);
}

/* A random shape (up to `max` elements, now and then 50x more) and a
** layout kind for all its operands; rows layouts get a last dim of a
** multiple of 8. */
static int32_t random_case(int64_t *shape, int *kind, int64_t max) {
  int quick = getenv("STA_GPU_QUICK") != NULL;
  int32_t nd = ops_shape(shape, !quick && ops_in(0, 9) == 0 ? 50 * max : max);
  *kind = (int)ops_in(0, 4); /* 4: each operand its own kind */
  if (*kind == 3 || *kind == 4) shape[nd - 1] = 8 * ops_in(1, 24);
  return nd;
}

static int kind_of(int kind) { return kind == 4 ? (int)ops_in(0, 3) : kind; }

static void same_storage(const twin *t, const char *what, int c) {
  char msg[160];
  snprintf(msg, sizeof msg, "%s case %d", what, c);
  if (!ops_same(t->db, t->hb, msg)) fail_msg("%s: the device storage differs from the host's", msg);
}

/* ---- copy ------------------------------------------------------------------ */

static void test_copy(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases(); c++) {
    int64_t shape[4];
    int kind;
    int32_t nd = random_case(shape, &kind, 20000);
    twin d, s;
    twin_make(&d, ops_dtype(), nd, shape, kind_of(kind));
    twin_make(&s, ops_dtype(), nd, shape, kind_of(kind));
    assert_int_equal(sta_tensor_copy(d.hv, s.hv), STA_OK);
    sta_status rc = sta_tensor_copy(d.dv, s.dv);
    if (rc != STA_OK) fail_msg("copy case %d: %s", c, sta_last_error());
    same_storage(&d, "copy", c);
    same_storage(&s, "copy (source)", c);
    twin_free(&d);
    twin_free(&s);
  }
}

/* Across devices: non-contiguous views on both sides, converted. */
static void test_copy_across(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases() / 3; c++) {
    int64_t shape[4];
    int kind;
    int32_t nd = random_case(shape, &kind, 5000);
    twin d, s;
    twin_make(&d, ops_dtype(), nd, shape, kind_of(kind));
    twin_make(&s, ops_dtype(), nd, shape, kind_of(kind));
    assert_int_equal(sta_tensor_copy(d.hv, s.hv), STA_OK);
    assert_int_equal(sta_tensor_copy(d.dv, s.hv), STA_OK); /* host -> device */
    same_storage(&d, "copy host->device", c);
    sta_tensor *hb2 = NULL, *hv2 = NULL; /* device -> host into a fresh view */
    assert_int_equal(sta_tensor_to(&hb2, d.db, sta_tensor_dtype(d.db), STA_CPU), STA_OK);
    assert_int_equal(sta_tensor_randn(hb2, ops_rnd(), 0, 1), STA_OK);
    hv2 = ops_view(hb2, &d.l);
    assert_int_equal(sta_tensor_copy(hv2, s.dv), STA_OK);
    assert_true(ops_same(hv2, d.hv, "copy device->host"));
    sta_tensor_destroy(hv2);
    sta_tensor_destroy(hb2);
    twin_free(&d);
    twin_free(&s);
  }
}

/* ---- fill and randn ------------------------------------------------------------ */

static void test_fill_randn(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases(); c++) {
    int64_t shape[4];
    int kind;
    int32_t nd = random_case(shape, &kind, 20000);
    twin t;
    twin_make(&t, ops_dtype(), nd, shape, kind_of(kind));
    uint64_t seed = ops_rnd();
    double mean = (double)ops_in(-50, 50) / 10, sd = (double)ops_in(0, 40) / 10;
    assert_int_equal(sta_tensor_randn(t.hv, seed, mean, sd), STA_OK);
    assert_int_equal(sta_tensor_randn(t.dv, seed, mean, sd), STA_OK);
    same_storage(&t, "randn", c); /* the same bits as the host's generator */
    double value = (double)ops_in(-100000, 100000) / 7;
    assert_int_equal(sta_tensor_fill(t.hv, value), STA_OK);
    assert_int_equal(sta_tensor_fill(t.dv, value), STA_OK);
    same_storage(&t, "fill", c);
    twin_free(&t);
  }
}

/* ---- axpby, scale, add ------------------------------------------------------------ */

static void test_lincomb(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases(); c++) {
    int64_t shape[4];
    int kind, op = (int)ops_in(0, 4);
    int32_t nd = random_case(shape, &kind, 20000);
    twin t[3];
    for (int k = 0; k < 3; k++) twin_make(&t[k], ops_dtype(), nd, shape, kind_of(kind));
    double a = (double)ops_in(-3000, 3000) / 1000, b = (double)ops_in(-3000, 3000) / 1000;
    for (int dev = 0; dev < 2; dev++) {
      sta_tensor *o = dev ? t[0].dv : t[0].hv, *x = dev ? t[1].dv : t[1].hv,
                 *y = dev ? t[2].dv : t[2].hv;
      sta_status rc;
      switch (op) {
      case 0: rc = sta_tensor_axpby(o, a, x, b); break;
      case 1: rc = sta_tensor_scale(o, a); break;
      case 2: rc = sta_tensor_add(o, x, y); break;
      case 3: rc = sta_tensor_add(o, o, y); break;
      default: rc = sta_tensor_axpby(o, a, o, b); break;
      }
      if (rc != STA_OK) fail_msg("lincomb case %d op %d: %s", c, op, sta_last_error());
    }
    same_storage(&t[0], "lincomb", c);
    for (int k = 0; k < 3; k++) twin_free(&t[k]);
  }
}

/* ---- stats ----------------------------------------------------------------------- */

/* The shift far from the data (element 0 NaN: shift 0) and a spread far
** below the mean: 1000 + uniform noise of spread ~1e-3, in f32.  With the
** deviations squared in float (before ops_stats.cu summed in double) each
** square of ~1e6 carried ~0.06 of rounding against a variance of ~1e-6;
** one finite value -0.76 gave std 1.3e-4 instead of 0 (seen on the H200). */
static void stats_far_shift(void) {
  for (int n = 1; n <= 4097; n += 4096) {
    const int64_t shape[1] = {n + 1};
    sta_tensor *h = NULL, *d = NULL;
    assert_int_equal(sta_tensor_create(&h, STA_F32, STA_CPU, 1, shape), STA_OK);
    float *x = sta_tensor_data(h);
    x[0] = NAN;
    for (int i = 1; i <= n; i++) x[i] = 1000.0f + 1e-3f * (float)(ops_in(-1000, 1000)) / 577.0f;
    if (n == 1) x[1] = -0.764431655f;
    assert_int_equal(sta_tensor_to(&d, h, STA_F32, STA_CUDA), STA_OK);
    sta_stats hs, gs;
    assert_int_equal(sta_tensor_stats(h, &hs), STA_OK);
    assert_int_equal(sta_tensor_stats(d, &gs), STA_OK);
    assert_int_equal(gs.count, n);
    assert_int_equal(gs.nonfinite, 1);
    double scale = hs.std + fabs(hs.mean);
    if (fabs(gs.mean - hs.mean) > 1e-6 * scale || fabs(gs.std - hs.std) > 1e-6 * scale ||
        (n == 1 && gs.std != 0))
      fail_msg("stats, shift far from the data (%d values): mean %.9g std %.9g, host %.9g %.9g",
               n, gs.mean, gs.std, hs.mean, hs.std);
    sta_tensor_destroy(d);
    sta_tensor_destroy(h);
  }
}

static void test_stats(void **state) {
  NEED_GPU();
  stats_far_shift();
  for (int c = 0; c < cases(); c++) {
    int64_t shape[4];
    int kind;
    int32_t nd = random_case(shape, &kind, 40000);
    ops_layout l = ops_layout_of(nd, shape, kind_of(kind));
    sta_dtype dt = ops_dtype();
    sta_tensor *hb = ops_storage(dt, STA_CPU, &l, ops_rnd()), *hv = ops_view(hb, &l);
    int odd = (int)ops_in(0, 3); /* non-finite values: none, few, many, all */
    if (odd) {
      int64_t n = sta_tensor_numel(hv);
      for (int64_t i = 0; i < n; i++) {
        if (odd == 1 ? ops_in(0, 500) != 0 : odd == 2 ? ops_in(0, 3) != 0 : 0) continue;
        int64_t ix[4], r = i;
        for (int32_t d = nd - 1; d >= 0; d--) { ix[d] = r % shape[d]; r /= shape[d]; }
        static const double v[3] = {NAN, INFINITY, -INFINITY};
        assert_int_equal(sta_tensor_set(hv, ix, v[ops_in(0, 2)]), STA_OK);
      }
    }
    sta_tensor *db = NULL, *dv = NULL;
    assert_int_equal(sta_tensor_to(&db, hb, dt, STA_CUDA), STA_OK);
    dv = ops_view(db, &l);
    sta_stats h, g, g2;
    assert_int_equal(sta_tensor_stats(hv, &h), STA_OK);
    int64_t moved = sta_transfer_bytes();
    sta_status rc = sta_tensor_stats(dv, &g);
    if (rc != STA_OK) fail_msg("stats case %d: %s", c, sta_last_error());
    assert_int_equal(sta_transfer_bytes(), moved);
    assert_int_equal(sta_tensor_stats(dv, &g2), STA_OK);
    assert_memory_equal(&g, &g2, sizeof g); /* deterministic */
    assert_int_equal(g.count, h.count);
    assert_int_equal(g.nonfinite, h.nonfinite);
    if (g.min != h.min || g.max != h.max)
      fail_msg("stats case %d: min/max %g %g, host %g %g", c, g.min, g.max, h.min, h.max);
    double scale = h.std + fabs(h.mean) + 1e-30;
    if (fabs(g.mean - h.mean) > 1e-6 * scale || fabs(g.std - h.std) > 1e-6 * scale)
      fail_msg("stats case %d (%s, %lld elements): mean %.9g std %.9g, host %.9g %.9g", c,
               sta_dtype_name(dt), (long long)h.count, g.mean, g.std, h.mean, h.std);
    sta_tensor_destroy(dv);
    sta_tensor_destroy(db);
    sta_tensor_destroy(hv);
    sta_tensor_destroy(hb);
  }
}

/* ---- no hidden transfers ------------------------------------------------------------ */

/* A pipeline step on the device (STA forward on the hidden sequence of
** latent + text rows, guidance axpby, latent update, stats) moves no
** tensor bytes between host and device; to("cpu") moves exactly the
** tensor's bytes. */
static void test_no_transfers(void **state) {
  NEED_GPU();
  int64_t V = 2 * 16 * 16, T = 24, H = 2, D = 64, S = V + T;
  int64_t lat_shape[4] = {1, V, H, D}, txt_shape[4] = {1, T, H, D}, seq[4] = {1, S, H, D};
  sta_tensor *latent = NULL, *text = NULL, *h = NULL, *pos = NULL, *neg = NULL, *lv = NULL,
             *tv = NULL, *pv = NULL, *host = NULL;
  assert_int_equal(sta_tensor_create(&latent, STA_BF16, STA_CUDA, 4, lat_shape), STA_OK);
  assert_int_equal(sta_tensor_create(&text, STA_BF16, STA_CUDA, 4, txt_shape), STA_OK);
  assert_int_equal(sta_tensor_create(&h, STA_BF16, STA_CUDA, 4, seq), STA_OK);
  assert_int_equal(sta_tensor_create(&pos, STA_BF16, STA_CUDA, 4, seq), STA_OK);
  assert_int_equal(sta_tensor_create(&neg, STA_BF16, STA_CUDA, 4, seq), STA_OK);
  int64_t moved = sta_transfer_bytes();
  assert_int_equal(sta_tensor_randn(latent, ops_rnd(), 0, 1), STA_OK);
  assert_int_equal(sta_tensor_randn(text, ops_rnd(), 0, 1), STA_OK);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 2, 16, 16);
  d.geom.tile[0] = 2;
  int32_t win[3] = {1, 1, 1};
  d.n_windows = 1;
  d.windows = win;
  assert_int_equal(sta_tensor_narrow(&lv, h, 1, 0, V), STA_OK);
  assert_int_equal(sta_tensor_narrow(&tv, h, 1, V, T), STA_OK);
  for (int pass = 0; pass < 2; pass++) {
    assert_int_equal(sta_tensor_copy(lv, latent), STA_OK);
    assert_int_equal(sta_tensor_copy(tv, text), STA_OK);
    sta_tensor *o = pass ? neg : pos;
    assert_int_equal(sta_attention_forward(&d, h, h, h, o, NULL), STA_OK);
  }
  assert_int_equal(sta_tensor_axpby(pos, 5.0, neg, -4.0), STA_OK);
  assert_int_equal(sta_tensor_narrow(&pv, pos, 1, 0, V), STA_OK);
  assert_int_equal(sta_tensor_axpby(latent, 0.1, pv, 0.9), STA_OK);
  assert_int_equal(sta_tensor_scale(text, 0.5), STA_OK);
  assert_int_equal(sta_tensor_add(text, text, text), STA_OK);
  assert_int_equal(sta_tensor_fill(h, 0.25), STA_OK);
  sta_stats st;
  assert_int_equal(sta_tensor_stats(latent, &st), STA_OK);
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  assert_int_equal(sta_transfer_bytes(), moved);
  assert_int_equal(st.count + st.nonfinite, V * H * D);
  assert_true(st.nonfinite == 0 && st.std > 0.1);
  /* asked-for transfers are counted, exactly */
  assert_int_equal(sta_tensor_to(&host, latent, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_transfer_bytes(), moved + V * H * D * 4);
  sta_tensor *all[9] = {latent, text, h, pos, neg, lv, tv, pv, host};
  for (int i = 0; i < 9; i++) sta_tensor_destroy(all[i]);
}

/* ---- errors on the device --------------------------------------------------------- */

static void test_device_errors(void **state) {
  NEED_GPU();
  int64_t s35[2] = {3, 5};
  sta_tensor *g = NULL, *c = NULL;
  assert_int_equal(sta_tensor_create(&g, STA_BF16, STA_CUDA, 2, s35), STA_OK);
  assert_int_equal(sta_tensor_create(&c, STA_BF16, STA_CPU, 2, s35), STA_OK);
  assert_int_equal(sta_tensor_randn(g, ops_rnd(), 0, 1), STA_OK);
  assert_int_equal(sta_tensor_randn(c, ops_rnd(), 0, 1), STA_OK);
  float *before = ops_values(g);
  EXPECT_ERR(sta_tensor_axpby(g, 1, c, 1), STA_ERR_ARGUMENT, "axpby: devices differ (y cuda vs x cpu)");
  EXPECT_ERR(sta_tensor_add(g, g, c), STA_ERR_ARGUMENT, "add: devices differ (out cuda vs y cpu)");
  EXPECT_ERR(sta_tensor_axpby(g, INFINITY, g, 1), STA_ERR_ARGUMENT,
             "a: expected a finite float32 value, got inf");
  float *after = ops_values(g);
  assert_memory_equal(before, after, 15 * sizeof(float));
  free(before);
  free(after);
  sta_tensor_destroy(g);
  sta_tensor_destroy(c);
}

static int setup(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA))
    printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
  else
    printf("# %s\n", sta_backend_describe(STA_CUDA));
  ops_seed("test_gpu_ops");
  return 0;
}

int main(void) {
  sta_test_filter();
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_copy),
    cmocka_unit_test(test_copy_across),
    cmocka_unit_test(test_fill_randn),
    cmocka_unit_test(test_lincomb),
    cmocka_unit_test(test_stats),
    cmocka_unit_test(test_no_transfers),
    cmocka_unit_test(test_device_errors),
  };
  return cmocka_run_group_tests(tests, setup, NULL);
}
