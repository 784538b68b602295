/* test_attention.c -- the CPU STA forward against the brute-force
** reference: tile sizes, partial tiles, border and whole-axis windows, text,
** per-head windows, layouts and views, batch, dtypes, random geometries,
** threads and concurrent callers.  The reference against hand computations,
** flops and head diff: test_attention_hand.c; errors:
** test_attention_errors.c. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "attention_util.h"

#define MAXH 8

/* ---- one forward against the reference ---------------------------------- */

typedef struct cfg {
  int32_t canvas[3], tile[3];
  int64_t text;      /* rows after the video */
  int64_t text_len;  /* -1: all of them */
  int64_t B, H, D;
  sta_dtype dtype;
  sta_layout layout;
  int order, pad;    /* storage of q, k, v (out uses the other order) */
  int32_t n_windows;
  int32_t windows[3 * MAXH];
  float scale;
  int lse;           /* 0 none, 1 contiguous, 2 permuted view */
  uint64_t seed;
} cfg;

static void cfg_init(cfg *c, int32_t t, int32_t h, int32_t w) {
  memset(c, 0, sizeof *c);
  c->canvas[0] = t; c->canvas[1] = h; c->canvas[2] = w;
  c->tile[0] = 6; c->tile[1] = 8; c->tile[2] = 8;
  c->text_len = -1;
  c->B = 1; c->H = 2; c->D = 64;
  c->dtype = STA_F32;
  c->layout = STA_BSHD;
  c->n_windows = 1;
  c->windows[0] = c->windows[1] = c->windows[2] = 3;
  c->lse = 1;
  c->seed = 1;
}

static void cfg_desc(const cfg *c, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  for (int i = 0; i < 3; i++) d->geom.tile[i] = c->tile[i];
  d->geom.text_len = c->text_len;
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
  d->scale = c->scale;
}

static void make_lse(held *x, int kind, int64_t B, int64_t H, int64_t S) {
  memset(x, 0, sizeof *x);
  if (kind == 1) {
    int64_t shape[3] = {B, H, S};
    assert_int_equal(sta_tensor_create(&x->base, STA_F32, STA_CPU, 3, shape), STA_OK);
    x->view = NULL;
  } else {
    static const int32_t swap[3] = {0, 2, 1};
    int64_t shape[3] = {B, S, H};
    assert_int_equal(sta_tensor_create(&x->base, STA_F32, STA_CPU, 3, shape), STA_OK);
    assert_int_equal(sta_tensor_permute(&x->view, x->base, swap), STA_OK);
  }
}

static sta_tensor *lse_of(held *x) { return x->view ? x->view : x->base; }

static double tol_for(sta_dtype dt) {
  return dt == STA_F32 ? 2e-5 : dt == STA_F16 ? 6e-4 : 4e-3;
}

/* Run the fast forward on c's inputs and the reference on exact f32 copies;
** compare outputs (rel L2 within storage rounding) and LSE. */
static void check_forward(const cfg *c) {
  sta_attention_desc d;
  cfg_desc(c, &d);
  int64_t V = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2], S = V + c->text;
  held q, k, v, o, lf;
  make4(&q, c->dtype, c->layout, c->order, c->pad, c->B, S, c->H, c->D);
  make4(&k, c->dtype, c->layout, c->order, c->pad, c->B, S, c->H, c->D);
  make4(&v, c->dtype, c->layout, 0, c->pad, c->B, S, c->H, c->D);
  make4(&o, c->dtype, c->layout, 1 - c->order, c->pad ? c->pad + 1 : 0, c->B, S, c->H, c->D);
  assert_int_equal(sta_tensor_randn(q.view, c->seed * 3 + 0, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(k.view, c->seed * 3 + 1, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(v.view, c->seed * 3 + 2, 0.5, 1.0), STA_OK);
  assert_int_equal(sta_tensor_fill(o.base, 7.0), STA_OK);
  assert_int_equal(sta_tensor_fill(o.view, NAN), STA_OK);
  memset(&lf, 0, sizeof lf);
  if (c->lse) {
    make_lse(&lf, c->lse, c->B, c->H, S);
    assert_int_equal(sta_tensor_fill(lf.base, NAN), STA_OK);
  }
  assert_int_equal(sta_attention_forward(&d, q.view, k.view, v.view, o.view,
                                         c->lse ? lse_of(&lf) : NULL), STA_OK);

  /* reference on f32 copies (exact: f16/bf16 widen without rounding) */
  sta_tensor *qr = snapshot(q.view), *kr = snapshot(k.view), *vr = snapshot(v.view), *orf = NULL,
             *lr = NULL;
  assert_int_equal(sta_tensor_create(&orf, STA_F32, STA_CPU, 4, qr->shape), STA_OK);
  assert_int_equal(sta_tensor_fill(orf, NAN), STA_OK);
  int64_t lshape[3] = {c->B, c->H, S};
  assert_int_equal(sta_tensor_create(&lr, STA_F32, STA_CPU, 3, lshape), STA_OK);
  assert_int_equal(sta_attention_reference(&d, qr, kr, vr, orf, lr), STA_OK);

  double mx, rel;
  assert_int_equal(sta_tensor_compare(o.view, orf, &mx, &rel), STA_OK);
  if (!(rel < tol_for(c->dtype)))
    fail_msg("canvas %dx%dx%d tile %dx%dx%d text %lld/%lld B%lld H%lld D%lld %s layout %d "
             "order %d pad %d window %d,%d,%d: rel L2 %g, max %g",
             c->canvas[0], c->canvas[1], c->canvas[2], c->tile[0], c->tile[1], c->tile[2],
             (long long)c->text, (long long)c->text_len, (long long)c->B, (long long)c->H,
             (long long)c->D, sta_dtype_name(c->dtype), (int)c->layout, c->order, c->pad,
             c->windows[0], c->windows[1], c->windows[2], rel, mx);
  if (c->lse) {
    assert_int_equal(sta_tensor_compare(lse_of(&lf), lr, &mx, &rel), STA_OK);
    if (!(rel < 2e-6 && mx < 1e-4)) fail_msg("lse: rel L2 %g, max %g", rel, mx);
  }
  if (c->pad) { /* the padding of out is untouched */
    sta_tensor *padv = NULL, *sev = NULL;
    assert_int_equal(sta_tensor_narrow(&padv, o.base, 3, c->D, c->pad + 1), STA_OK);
    assert_int_equal(sta_tensor_create(&sev, STA_F32, STA_CPU, 4, padv->shape), STA_OK);
    assert_int_equal(sta_tensor_fill(sev, 7.0), STA_OK);
    assert_same(padv, sev);
    sta_tensor_destroy(padv);
    sta_tensor_destroy(sev);
  }
  sta_tensor_destroy(qr); sta_tensor_destroy(kr); sta_tensor_destroy(vr);
  sta_tensor_destroy(orf); sta_tensor_destroy(lr);
  held_free(&q); held_free(&k); held_free(&v); held_free(&o); held_free(&lf);
}

/* ---- the fast forward against the reference ------------------------------ */

static void test_default_tile(void **state) {
  (void)state;
  cfg c;
  cfg_init(&c, 12, 16, 24); /* 2x2x3 tiles of 384 */
  c.H = 1; c.D = 16;
  c.windows[2] = 1;
  check_forward(&c);
  c.windows[0] = 1; c.windows[1] = 1; c.windows[2] = 1; c.seed = 2;
  check_forward(&c);
}

static void test_odd_canvas_partial_tiles(void **state) {
  (void)state;
  static const int32_t canv[][3] = {{7, 9, 11}, {13, 5, 17}, {1, 1, 1}, {5, 17, 3}, {11, 3, 29}};
  for (size_t i = 0; i < sizeof canv / sizeof canv[0]; i++) {
    cfg c;
    cfg_init(&c, canv[i][0], canv[i][1], canv[i][2]);
    c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5;
    c.windows[0] = 3; c.windows[1] = 1; c.windows[2] = 3;
    c.D = 16;
    c.seed = 10 + i;
    check_forward(&c);
  }
}

static void test_small_tiles(void **state) {
  (void)state;
  cfg c;
  cfg_init(&c, 5, 7, 9);
  c.tile[0] = 1; c.tile[1] = 1; c.tile[2] = 1;
  c.windows[0] = 3; c.windows[1] = 5; c.windows[2] = 3;
  c.D = 8; c.seed = 20;
  check_forward(&c);
  cfg_init(&c, 6, 9, 12);
  c.tile[0] = 2; c.tile[1] = 3; c.tile[2] = 4;
  c.windows[0] = 1; c.windows[1] = 3; c.windows[2] = 3;
  c.D = 32; c.seed = 21;
  check_forward(&c);
  c.tile[0] = 4; c.tile[1] = 2; c.tile[2] = 7; /* partial on every axis */
  c.seed = 22;
  check_forward(&c);
}

static void test_border_and_whole_axis_windows(void **state) {
  (void)state;
  /* 5x5x7 tile grid of 2x2x2 tiles on a 10x10x13 canvas (w partial) */
  static const int32_t wins[][3] = {{1, 1, 1}, {3, 3, 3}, {5, 5, 5}, {5, 1, 7},
                                    {9, 3, 1}, {1, 5, 99}, {7, 7, 9}, {3, 5, 13}};
  for (size_t i = 0; i < sizeof wins / sizeof wins[0]; i++) {
    cfg c;
    cfg_init(&c, 10, 10, 13);
    c.tile[0] = 2; c.tile[1] = 2; c.tile[2] = 2;
    memcpy(c.windows, wins[i], sizeof wins[i]);
    c.D = 8; c.H = 1; c.seed = 30 + i;
    check_forward(&c);
  }
}

static void test_text(void **state) {
  (void)state;
  cfg c;
  cfg_init(&c, 7, 10, 9);
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 4;
  c.D = 32;
  int64_t texts[][2] = {{0, -1}, {5, -1}, {5, 0}, {9, 4}, {17, 17}, {130, 100}, {3, 1}};
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    c.text = texts[i][0];
    c.text_len = texts[i][1];
    c.seed = 40 + i;
    check_forward(&c);
  }
}

static void test_per_head_windows(void **state) {
  (void)state;
  cfg c;
  cfg_init(&c, 9, 12, 15);
  c.tile[0] = 3; c.tile[1] = 3; c.tile[2] = 3; /* 3x4x5 tiles */
  c.H = 4; c.D = 16; c.text = 6; c.text_len = 4;
  c.n_windows = 4;
  int32_t w[12] = {1, 1, 1, 3, 3, 3, 3, 9, 1, 1, 3, 5};
  memcpy(c.windows, w, sizeof w);
  c.seed = 50;
  check_forward(&c);
}

static void test_layouts_and_views(void **state) {
  (void)state;
  for (int layout = 0; layout < 2; layout++)
    for (int order = 0; order < 2; order++)
      for (int pad = 0; pad < 2; pad++) {
        cfg c;
        cfg_init(&c, 6, 11, 10);
        c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 4;
        c.layout = (sta_layout)layout;
        c.order = order;
        c.pad = pad * 3;
        c.H = 2; c.D = 24; c.B = 2; c.text = 7; c.text_len = 5;
        c.lse = 1 + order;
        c.seed = 60 + layout * 4 + order * 2 + pad;
        check_forward(&c);
      }
}

static void test_batch_dims_scale(void **state) {
  (void)state;
  static const int64_t dims[] = {64, 128, 1, 13, 67};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
    cfg c;
    cfg_init(&c, 6, 9, 17);
    c.B = 2; c.H = 1; c.D = dims[i];
    c.text = 3;
    c.scale = i % 2 ? 0.37f : 0.0f;
    c.lse = (int)(i % 3);
    c.seed = 70 + i;
    check_forward(&c);
  }
}

static void test_dtypes(void **state) {
  (void)state;
  static const sta_dtype dts[] = {STA_F32, STA_F16, STA_BF16};
  for (size_t i = 0; i < 3; i++) {
    cfg c;
    cfg_init(&c, 8, 9, 10);
    c.tile[0] = 4; c.tile[1] = 4; c.tile[2] = 4;
    c.windows[2] = 1;
    c.dtype = dts[i];
    c.text = 11; c.text_len = 8;
    c.D = 64; c.H = 1;
    c.seed = 80 + i;
    check_forward(&c);
    c.layout = STA_BHSD; c.order = 1; c.pad = 2; c.D = 128; c.seed = 90 + i;
    check_forward(&c);
  }
}

static void test_random_geometries(void **state) {
  (void)state;
  uint64_t x = 12345;
  for (int n = 0; n < 40; n++) {
    cfg c;
    double r[16];
    for (int i = 0; i < 16; i++) r[i] = fabs(sta_randn_at(x, (uint64_t)(16 * n + i)));
    cfg_init(&c, 1 + (int32_t)(r[0] * 4) % 9, 1 + (int32_t)(r[1] * 5) % 13,
             1 + (int32_t)(r[2] * 7) % 17);
    for (int i = 0; i < 3; i++) c.tile[i] = 1 + (int32_t)(r[3 + i] * 3) % 5;
    int32_t grid[3];
    for (int i = 0; i < 3; i++) grid[i] = (c.canvas[i] + c.tile[i] - 1) / c.tile[i];
    c.H = 1 + (int64_t)(r[6] * 3) % 3;
    c.n_windows = n % 2 ? (int32_t)c.H : 1;
    for (int h = 0; h < c.n_windows; h++)
      for (int i = 0; i < 3; i++) {
        int32_t k = 1 + 2 * ((int32_t)(r[7 + i] * 3 + h) % 3);
        if ((int)(r[10] * 10 + h + i) % 5 == 0) k = grid[i] + (int32_t)(r[11] * 2); /* whole axis */
        c.windows[3 * h + i] = k < grid[i] || k % 2 ? k : k + 1;
        if (c.windows[3 * h + i] < grid[i] && c.windows[3 * h + i] % 2 == 0) c.windows[3 * h + i]++;
      }
    c.text = (int64_t)(r[12] * 6) % 13;
    c.text_len = n % 3 == 0 ? -1 : (int64_t)(r[13] * 5) % (c.text + 1);
    c.D = 1 + (int64_t)(r[14] * 20) % 40;
    c.B = 1 + n % 2;
    c.layout = (sta_layout)(n % 2);
    c.order = (n / 2) % 2;
    c.pad = n % 3 == 1 ? 2 : 0;
    c.dtype = (sta_dtype)(n % 3);
    c.lse = n % 3;
    c.scale = n % 4 == 3 ? 0.25f : 0.0f;
    c.seed = 1000 + n;
    check_forward(&c);
  }
}

static void test_threads(void **state) {
  (void)state;
  cfg c;
  cfg_init(&c, 6, 16, 16);
  c.text = 9;
  c.D = 16;
  int32_t before = sta_get_num_threads();
  for (int32_t t = 1; t <= 3; t++) {
    sta_set_num_threads(t);
    assert_int_equal(sta_get_num_threads(), t);
    c.seed = 100 + t;
    check_forward(&c);
  }
  sta_set_num_threads(0);
  assert_true(sta_get_num_threads() >= 1);
  (void)before;
}

/* Forwards run at once from several caller threads give the sequential
** result bit for bit, and OpenBLAS's thread setting is restored after. */
typedef struct conc {
  const sta_attention_desc *d;
  sta_tensor *q, *k, *v, *o;
  sta_status rc;
} conc;

static void *conc_run(void *arg) {
  conc *c = arg;
  for (int i = 0; i < 3 && c->rc == STA_OK; i++)
    c->rc = sta_attention_forward(c->d, c->q, c->k, c->v, c->o, NULL);
  return NULL;
}


static void test_concurrent_callers(void **state) {
  (void)state;
  sta_attention_desc d;
  static const int32_t win[3] = {1, 3, 3};
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 6, 16, 24);
  d.geom.tile[0] = 3;
  d.n_windows = 1;
  d.windows = win;
  int64_t shape[4] = {1, 6 * 16 * 24 + 5, 2, 32};
  sta_tensor *q, *k, *v, *ref, *o[4];
  f32_qkv(shape, 501, &q, &k, &v);
  sta_tensor_create(&ref, STA_F32, STA_CPU, 4, shape);
  int blas_before = openblas_get_num_threads();
  assert_int_equal(sta_attention_forward(&d, q, k, v, ref, NULL), STA_OK);
  assert_int_equal(openblas_get_num_threads(), blas_before);
  pthread_t th[4];
  conc c[4];
  for (int i = 0; i < 4; i++) {
    sta_tensor_create(&o[i], STA_F32, STA_CPU, 4, shape);
    sta_tensor_fill(o[i], NAN);
    c[i] = (conc){&d, q, k, v, o[i], STA_OK};
    assert_int_equal(pthread_create(&th[i], NULL, conc_run, &c[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_int_equal(c[i].rc, STA_OK);
    assert_same(o[i], ref);
    sta_tensor_destroy(o[i]);
  }
  assert_int_equal(openblas_get_num_threads(), blas_before);
  sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
  sta_tensor_destroy(ref);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_default_tile),
    cmocka_unit_test(test_odd_canvas_partial_tiles),
    cmocka_unit_test(test_small_tiles),
    cmocka_unit_test(test_border_and_whole_axis_windows),
    cmocka_unit_test(test_text),
    cmocka_unit_test(test_per_head_windows),
    cmocka_unit_test(test_layouts_and_views),
    cmocka_unit_test(test_batch_dims_scale),
    cmocka_unit_test(test_dtypes),
    cmocka_unit_test(test_random_geometries),
    cmocka_unit_test(test_threads),
    cmocka_unit_test(test_concurrent_callers),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
