/* test_attention.c -- the CPU STA forward against the brute-force
** reference, the reference against hand computations, flops, head diff,
** and every error path of sta_attention_forward / sta_attn_resolve. */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

#define MAXH 8

/* ---- building inputs ---------------------------------------------------- */

/* A 4-D tensor [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD) as seen through
** desc layout, stored as: order 0 = contiguous in that layout, order 1 =
** contiguous in the other layout and permuted; pad > 0 = each row of D has
** pad extra elements (a narrowed view). */
typedef struct held {
  sta_tensor *base, *mid, *view;
} held;

static void held_free(held *x) {
  sta_tensor_destroy(x->view);
  sta_tensor_destroy(x->mid);
  sta_tensor_destroy(x->base);
  memset(x, 0, sizeof *x);
}

static void make4(held *x, sta_dtype dt, sta_layout layout, int order, int64_t pad,
                  int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int store_bshd = (layout == STA_BSHD) != (order == 1);
  int64_t shape[4] = {B, store_bshd ? S : H, store_bshd ? H : S, D + pad};
  memset(x, 0, sizeof *x);
  assert_int_equal(sta_tensor_create(&x->base, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_narrow(&x->mid, x->base, 3, 0, D), STA_OK);
  if (order == 1) assert_int_equal(sta_tensor_permute(&x->view, x->mid, swap), STA_OK);
  else assert_int_equal(sta_tensor_narrow(&x->view, x->mid, 3, 0, D), STA_OK);
}

/* A copy of t: same shape, contiguous, f32. */
static sta_tensor *snapshot(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_to(&c, t, STA_F32, STA_CPU), STA_OK);
  return c;
}

static void assert_same(const sta_tensor *a, const sta_tensor *b) {
  double mx = -1, rel = -1;
  assert_int_equal(sta_tensor_compare(a, b, &mx, &rel), STA_OK);
  assert_true(mx == 0.0);
}

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

/* Contiguous f32 q, k, v of shape (BSHD), drawn from N(0, 1) with seeds
** seed, seed + 1, seed + 2. */
static void f32_qkv(const int64_t shape[4], uint64_t seed, sta_tensor **q, sta_tensor **k,
                    sta_tensor **v) {
  sta_tensor **t[3] = {q, k, v};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(sta_tensor_create(t[i], STA_F32, STA_CPU, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_randn(*t[i], seed + (uint64_t)i, 0, 1), STA_OK);
  }
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

/* ---- the reference against hand computations --------------------------- */

/* out[b, s, h, :] by plain softmax over keys keep(s, j), in double, from
** the tensors' values (BSHD, contiguous f32). */
typedef int (*keep_fn)(int64_t s, int64_t j);

static void hand_attention(const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                           double scale, keep_fn keep, sta_tensor *out, sta_tensor *lse) {
  int64_t B = q->shape[0], S = q->shape[1], H = q->shape[2], D = q->shape[3];
  for (int64_t b = 0; b < B; b++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t s = 0; s < S; s++) {
        double *lg = calloc((size_t)S, sizeof(double)), m = -INFINITY, l = 0;
        for (int64_t j = 0; j < S; j++) {
          if (!keep(s, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; d++) {
            double a, c;
            int64_t iq[4] = {b, s, h, d}, ik[4] = {b, j, h, d};
            sta_tensor_get(q, iq, &a);
            sta_tensor_get(k, ik, &c);
            dot += a * c;
          }
          lg[j] = dot * scale;
          if (lg[j] > m) m = lg[j];
        }
        for (int64_t j = 0; j < S; j++)
          if (keep(s, j)) l += exp(lg[j] - m);
        for (int64_t d = 0; d < D; d++) {
          double acc = 0;
          for (int64_t j = 0; j < S; j++) {
            if (!keep(s, j)) continue;
            double x;
            int64_t iv[4] = {b, j, h, d};
            sta_tensor_get(v, iv, &x);
            acc += exp(lg[j] - m) / l * x;
          }
          int64_t io[4] = {b, s, h, d};
          sta_tensor_set(out, io, acc);
        }
        int64_t il[3] = {b, h, s};
        sta_tensor_set(lse, il, m + log(l));
        free(lg);
      }
}

static int keep_all_but_padding(int64_t s, int64_t j) { (void)s; return j < 24 + 3; }

/* canvas 1x1x6, tile 1x1x2 (3 tiles along w), window 1,1,1 -> own tile;
** plus 2 text rows, 1 valid. */
static int keep_own_pair(int64_t s, int64_t j) {
  if (j >= 6) return j == 6;
  if (s >= 6) return 1;
  return s / 2 == j / 2;
}

/* canvas 1x1x5, tile 1x1x1, window 1,1,3: the clamp shifts border windows
** inward (query 0 sees 0..2, query 4 sees 2..4). */
static int keep_clamped(int64_t s, int64_t j) {
  int64_t lo = s - 1 < 0 ? 0 : s - 1;
  if (lo > 2) lo = 2;
  return j >= lo && j <= lo + 2;
}

static void hand_case(int32_t t, int32_t h, int32_t w, int32_t tt, int32_t th, int32_t tw,
                      int64_t text, int64_t text_len, const int32_t win[3], keep_fn keep,
                      uint64_t seed) {
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, t, h, w);
  d.geom.tile[0] = tt; d.geom.tile[1] = th; d.geom.tile[2] = tw;
  d.geom.text_len = text_len;
  d.layout = STA_BSHD;
  d.n_windows = 1;
  d.windows = win;
  int64_t S = (int64_t)t * h * w + text;
  int64_t shape[4] = {2, S, 2, 5}, lshape[3] = {2, 2, S};
  sta_tensor *q, *k, *v, *o, *oh, *l, *lh, *of, *lf;
  f32_qkv(shape, seed, &q, &k, &v);
  assert_int_equal(sta_tensor_create(&o, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&oh, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&of, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&l, STA_F32, STA_CPU, 3, lshape), STA_OK);
  assert_int_equal(sta_tensor_create(&lh, STA_F32, STA_CPU, 3, lshape), STA_OK);
  assert_int_equal(sta_tensor_create(&lf, STA_F32, STA_CPU, 3, lshape), STA_OK);
  sta_tensor_fill(o, NAN); sta_tensor_fill(oh, NAN); sta_tensor_fill(of, NAN);
  sta_tensor_fill(l, NAN); sta_tensor_fill(lh, NAN); sta_tensor_fill(lf, NAN);
  assert_int_equal(sta_attention_reference(&d, q, k, v, o, l), STA_OK);
  assert_int_equal(sta_attention_forward(&d, q, k, v, of, lf), STA_OK);
  hand_attention(q, k, v, 1.0 / sqrt(5.0), keep, oh, lh);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(o, oh, &mx, &rel), STA_OK);
  assert_true(rel < 1e-6);
  assert_int_equal(sta_tensor_compare(l, lh, &mx, &rel), STA_OK);
  assert_true(mx < 1e-5);
  assert_int_equal(sta_tensor_compare(of, oh, &mx, &rel), STA_OK);
  assert_true(rel < 2e-6);
  assert_int_equal(sta_tensor_compare(lf, lh, &mx, &rel), STA_OK);
  assert_true(mx < 1e-5);
  sta_tensor *all[] = {q, k, v, o, oh, of, l, lh, lf};
  for (size_t i = 0; i < 9; i++) sta_tensor_destroy(all[i]);
}

static void test_reference_by_hand(void **state) {
  (void)state;
  static const int32_t full[3] = {9, 9, 9}, one[3] = {1, 1, 1}, clamp3[3] = {1, 1, 3};
  /* full window: plain softmax attention (2x3x4 canvas, 5 text, 3 valid) */
  hand_case(2, 3, 4, 1, 2, 3, 5, 3, full, keep_all_but_padding, 200);
  hand_case(1, 1, 6, 1, 1, 2, 2, 1, one, keep_own_pair, 210);
  hand_case(1, 1, 5, 1, 1, 1, 0, 0, clamp3, keep_clamped, 220);
}

/* ---- flops against a pair count ----------------------------------------- */

/* Keys of each query counted from the reference itself: with a tiny scale
** every logit is ~0, so exp(lse) is the number of keys. */
static double pairs_by_lse(const sta_attention_desc *d, int64_t S, int64_t H, int fast) {
  int64_t shape[4] = {1, S, H, 3}, lshape[3] = {1, H, S};
  sta_tensor *q, *k, *v, *o, *l;
  f32_qkv(shape, 5, &q, &k, &v);
  sta_tensor_create(&o, STA_F32, STA_CPU, 4, shape);
  sta_tensor_create(&l, STA_F32, STA_CPU, 3, lshape);
  sta_tensor_fill(l, NAN);
  sta_attention_desc dd = *d;
  dd.scale = 1e-20f;
  if (fast) assert_int_equal(sta_attention_forward(&dd, q, k, v, o, l), STA_OK);
  else assert_int_equal(sta_attention_reference(&dd, q, k, v, o, l), STA_OK);
  double pairs = 0;
  const float *lp = sta_tensor_data(l);
  for (int64_t i = 0; i < H * S; i++) {
    double n = exp((double)lp[i]);
    assert_true(fabs(n - floor(n + 0.5)) < 1e-3 * n);
    pairs += floor(n + 0.5);
  }
  sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
  sta_tensor_destroy(o); sta_tensor_destroy(l);
  return pairs;
}

/* An independent count: enumerate each query's window tiles. */
static double pairs_by_tiles(const sta_attention_desc *d, int64_t S, int64_t H) {
  const sta_geometry *g = &d->geom;
  int64_t V = (int64_t)g->canvas[0] * g->canvas[1] * g->canvas[2];
  int64_t tl = g->text_len < 0 ? S - V : g->text_len;
  double pairs = 0;
  for (int64_t h = 0; h < H; h++) {
    const int32_t *w = d->windows + (d->n_windows == 1 ? 0 : 3 * h);
    for (int64_t s = 0; s < V; s++) {
      int64_t c[3] = {s / ((int64_t)g->canvas[1] * g->canvas[2]),
                      (s / g->canvas[2]) % g->canvas[1], s % g->canvas[2]};
      double n = 1;
      for (int i = 0; i < 3; i++) {
        int64_t C = (g->canvas[i] + g->tile[i] - 1) / g->tile[i], q = c[i] / g->tile[i];
        int64_t lo = 0, hi = C;
        if (w[i] < C) {
          lo = q - w[i] / 2;
          if (lo > C - w[i]) lo = C - w[i];
          if (lo < 0) lo = 0;
          hi = lo + w[i];
        }
        int64_t tlo = lo * g->tile[i], thi = hi * g->tile[i];
        if (thi > g->canvas[i]) thi = g->canvas[i];
        n *= (double)(thi - tlo);
      }
      pairs += n + (double)tl;
    }
    pairs += (double)(S - V) * (double)(V + tl);
  }
  return pairs;
}

static void test_flops(void **state) {
  (void)state;
  struct { int32_t c[3], t[3]; int64_t text, tl; int32_t nw, w[6]; } cases[] = {
    {{5, 7, 9}, {2, 3, 4}, 0, -1, 1, {1, 3, 3}},
    {{6, 8, 10}, {2, 2, 2}, 4, 2, 2, {3, 3, 3, 1, 9, 5}},
    {{3, 11, 4}, {3, 4, 1}, 3, -1, 1, {1, 3, 99}},
    {{7, 7, 7}, {1, 1, 1}, 5, 0, 2, {5, 3, 1, 7, 1, 3}},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    sta_geometry_init(&d.geom, cases[i].c[0], cases[i].c[1], cases[i].c[2]);
    for (int a = 0; a < 3; a++) d.geom.tile[a] = cases[i].t[a];
    d.geom.text_len = cases[i].tl;
    d.n_windows = cases[i].nw;
    d.windows = cases[i].w;
    int64_t H = 2, S = (int64_t)cases[i].c[0] * cases[i].c[1] * cases[i].c[2] + cases[i].text;
    double pr = pairs_by_lse(&d, S, H, 0), pf = pairs_by_lse(&d, S, H, 1);
    double pt = pairs_by_tiles(&d, S, H);
    assert_true(pr == pt);
    assert_true(pf == pt);
    double fl = sta_attention_flops(&d, 3, S, H, 40);
    assert_true(fabs(fl - 4.0 * 40 * 3 * pr) <= 1e-9 * fl);
  }
  /* STA.md section 8: hunyuan-720p at 3,3,3 is 15.40 TFLOP */
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  static const int32_t w333[3] = {3, 3, 3};
  sta_geometry_init(&d.geom, 30, 48, 80);
  d.n_windows = 1;
  d.windows = w333;
  double fl = sta_attention_flops(&d, 1, 115200 + 256, 24, 128);
  assert_true(fabs(fl / 1e12 - 15.40) < 0.005);
}

/* ---- head diff ------------------------------------------------------------ */

static void test_head_diff(void **state) {
  (void)state;
  for (int layout = 0; layout < 2; layout++)
    for (int dt = 0; dt < 3; dt++) {
      int64_t B = 2, S = 37, H = 3, D = 19;
      held a, b;
      make4(&a, (sta_dtype)dt, (sta_layout)layout, 0, 0, B, S, H, D);
      make4(&b, (sta_dtype)dt, (sta_layout)layout, 1, 2, B, S, H, D);
      sta_tensor_randn(a.view, 300 + (uint64_t)(layout * 3 + dt), 0, 1);
      sta_tensor_randn(b.view, 310 + (uint64_t)(layout * 3 + dt), 0.1, 1);
      float l1[3], l2[3];
      assert_int_equal(sta_head_diff(a.view, b.view, (sta_layout)layout, l1, l2), STA_OK);
      for (int64_t h = 0; h < H; h++) {
        double s1 = 0, s2 = 0;
        for (int64_t bb = 0; bb < B; bb++)
          for (int64_t s = 0; s < S; s++)
            for (int64_t d = 0; d < D; d++) {
              int64_t idx[4] = {bb, layout ? h : s, layout ? s : h, d};
              double x, y;
              sta_tensor_get(a.view, idx, &x);
              sta_tensor_get(b.view, idx, &y);
              s1 += fabs(x - y);
              s2 += (x - y) * (x - y);
            }
        double n = (double)(B * S * D);
        assert_true(fabs(l1[h] - s1 / n) < 1e-5 * (s1 / n));
        assert_true(fabs(l2[h] - s2 / n) < 1e-5 * (s2 / n));
      }
      held_free(&a);
      held_free(&b);
    }
}

/* ---- errors ------------------------------------------------------------- */

typedef struct bad {
  sta_attention_desc d;
  int32_t w[6];
  sta_tensor *q, *k, *v, *o, *l, *o0, *l0;
} bad;

/* canvas 4x4x8, tile 2x2x2 (2x2x4 tiles), 6 text rows, B1 S134 H2 D8. */
static void bad_init(bad *x) {
  memset(x, 0, sizeof *x);
  sta_geometry_init(&x->d.geom, 4, 4, 8);
  x->d.geom.tile[0] = x->d.geom.tile[1] = x->d.geom.tile[2] = 2;
  x->d.layout = STA_BSHD;
  x->d.n_windows = 1;
  x->w[0] = x->w[1] = x->w[2] = 1;
  x->d.windows = x->w;
  int64_t shape[4] = {1, 134, 2, 8}, lshape[3] = {1, 2, 134};
  sta_tensor **t[4] = {&x->q, &x->k, &x->v, &x->o};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sta_tensor_create(t[i], STA_F32, STA_CPU, 4, shape), STA_OK);
    sta_tensor_randn(*t[i], 400 + (uint64_t)i, 0, 1);
  }
  assert_int_equal(sta_tensor_create(&x->l, STA_F32, STA_CPU, 3, lshape), STA_OK);
  sta_tensor_randn(x->l, 410, 0, 1);
  x->o0 = snapshot(x->o);
  x->l0 = snapshot(x->l);
}

static void bad_free(bad *x) {
  sta_tensor *t[] = {x->q, x->k, x->v, x->o, x->l, x->o0, x->l0};
  for (size_t i = 0; i < 7; i++) sta_tensor_destroy(t[i]);
}

/* The forward with these arguments fails with status and message; out and
** lse are unchanged. */
static void expect_fail(bad *x, const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                        sta_tensor *o, sta_tensor *l, sta_status st, const char *msg) {
  sta_clear_error();
  sta_status rc = sta_attention_forward(&x->d, q, k, v, o, l);
  if (rc != st || strcmp(sta_last_error(), msg) != 0)
    fail_msg("expected %s \"%s\", got %s \"%s\"", sta_status_name(st), msg,
             sta_status_name(rc), sta_last_error());
  assert_same(x->o, x->o0);
  assert_same(x->l, x->l0);
}

/* out or lse sharing memory with an input is refused; disjoint views of
** one storage are fine. */
static void test_errors_alias(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  expect_fail(&x, x.q, x.k, x.v, x.q, NULL, STA_ERR_ARGUMENT,
              "out: shares memory with q (the forward writes out while reading q; "
              "use a separate tensor)");
  expect_fail(&x, x.q, x.k, x.v, x.v, NULL, STA_ERR_ARGUMENT,
              "out: shares memory with v (the forward writes out while reading v; "
              "use a separate tensor)");
  /* q, k, v and out as four slices of one [4, 134, 2, 8] block */
  int64_t big[4] = {4, 134, 2, 8};
  sta_tensor *blk = NULL, *sl[4] = {NULL}, *ov = NULL;
  assert_int_equal(sta_tensor_create(&blk, STA_F32, STA_CPU, 4, big), STA_OK);
  sta_tensor_randn(blk, 77, 0, 1);
  for (int i = 0; i < 4; i++)
    assert_int_equal(sta_tensor_narrow(&sl[i], blk, 0, i, 1), STA_OK);
  assert_int_equal(sta_attention_forward(&x.d, sl[0], sl[1], sl[2], sl[3], NULL), STA_OK);
  double m, r;
  assert_int_equal(sta_attention_reference(&x.d, sl[0], sl[1], sl[2], x.o, NULL), STA_OK);
  assert_int_equal(sta_tensor_compare(sl[3], x.o, &m, &r), STA_OK);
  assert_true(r < 1e-5);
  /* an out that straddles k and v */
  assert_int_equal(sta_tensor_narrow(&ov, blk, 0, 1, 1), STA_OK);
  sta_tensor *ov2 = NULL;
  int64_t off = 134 * 2 * 8 / 2; /* half a batch row into k */
  int64_t shape[4] = {1, 134, 2, 8}, st[4] = {134 * 2 * 8, 16, 8, 1};
  assert_int_equal(sta_tensor_view(&ov2, ov, off, 4, shape, st), STA_OK);
  sta_clear_error();
  assert_int_equal(sta_attention_forward(&x.d, sl[0], sl[1], sl[3], ov2, NULL), STA_ERR_ARGUMENT);
  assert_non_null(strstr(sta_last_error(), "out: shares memory with k"));
  sta_tensor_destroy(ov2);
  sta_tensor_destroy(ov);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(sl[i]);
  sta_tensor_destroy(blk);
  bad_free(&x);
}

static void test_errors_arguments(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  sta_clear_error();
  assert_int_equal(sta_attention_forward(NULL, x.q, x.k, x.v, x.o, x.l), STA_ERR_ARGUMENT);
  assert_string_equal(sta_last_error(), "desc: expected a descriptor, got NULL");
  assert_same(x.o, x.o0);
  x.d.layout = (sta_layout)7;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT,
              "layout: expected STA_BSHD (0) or STA_BHSD (1), got 7");
  x.d.layout = STA_BSHD;
  expect_fail(&x, NULL, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT, "q: expected a tensor, got NULL");
  expect_fail(&x, x.q, x.k, NULL, x.o, x.l, STA_ERR_ARGUMENT, "v: expected a tensor, got NULL");
  /* wrong ndim */
  sta_tensor *t3 = NULL;
  int64_t s3[3] = {134, 2, 8};
  assert_int_equal(sta_tensor_create(&t3, STA_F32, STA_CPU, 3, s3), STA_OK);
  sta_tensor_randn(t3, 1, 0, 1);
  expect_fail(&x, x.q, t3, x.v, x.o, x.l, STA_ERR_SHAPE, "k: expected a 4-D tensor, got 3-D");
  sta_tensor_destroy(t3);
  /* non-contiguous head dimension */
  sta_tensor *big = NULL, *strided = NULL;
  int64_t sb[4] = {1, 134, 2, 16}, vs[4] = {1, 134, 2, 8}, st[4] = {4288, 32, 16, 2};
  assert_int_equal(sta_tensor_create(&big, STA_F32, STA_CPU, 4, sb), STA_OK);
  sta_tensor_randn(big, 2, 0, 1);
  assert_int_equal(sta_tensor_view(&strided, big, 0, 4, vs, st), STA_OK);
  expect_fail(&x, x.q, x.k, strided, x.o, x.l, STA_ERR_SHAPE,
              "v: the head dimension must be contiguous (stride 1), got stride 2");
  sta_tensor_destroy(strided);
  sta_tensor_destroy(big);
  /* mismatched shapes */
  int64_t shapes[3][4] = {{2, 134, 2, 8}, {1, 130, 2, 8}, {1, 134, 2, 4}};
  const char *msgs[3] = {
    "k: shape [B=2, S=134, heads=2, D=8] differs from q's [B=1, S=134, heads=2, D=8]",
    "k: shape [B=1, S=130, heads=2, D=8] differs from q's [B=1, S=134, heads=2, D=8]",
    "k: shape [B=1, S=134, heads=2, D=4] differs from q's [B=1, S=134, heads=2, D=8]"};
  for (int i = 0; i < 3; i++) {
    sta_tensor *kk = NULL;
    assert_int_equal(sta_tensor_create(&kk, STA_F32, STA_CPU, 4, shapes[i]), STA_OK);
    sta_tensor_randn(kk, 3, 0, 1);
    expect_fail(&x, x.q, kk, x.v, x.o, x.l, STA_ERR_SHAPE, msgs[i]);
    sta_tensor_destroy(kk);
  }
  /* out of another shape: BHSD layout reading BSHD tensors sees heads=134 */
  x.d.layout = STA_BHSD;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_SEQ_LEN,
              "seq_len 2 not supported for STA (canvas 4x4x8 has 128 video rows, q has 2; "
              "q's dim 1 has 134: [B, S, heads, D] needs layout bshd)");
  x.d.layout = STA_BSHD;
  /* dtypes */
  sta_tensor *h16 = NULL;
  int64_t s4[4] = {1, 134, 2, 8};
  assert_int_equal(sta_tensor_create(&h16, STA_F16, STA_CPU, 4, s4), STA_OK);
  sta_tensor_randn(h16, 4, 0, 1);
  expect_fail(&x, x.q, x.k, h16, x.o, x.l, STA_ERR_DTYPE, "v: dtype f16 differs from q's f32");
  expect_fail(&x, h16, x.k, x.v, x.o, x.l, STA_ERR_DTYPE, "k: dtype f32 differs from q's f16");
  sta_tensor_destroy(h16);
  /* empty batch */
  sta_tensor *e[4];
  int64_t s0[4] = {0, 134, 2, 8};
  for (int i = 0; i < 4; i++) assert_int_equal(sta_tensor_create(&e[i], STA_F32, STA_CPU, 4, s0), STA_OK);
  expect_fail(&x, e[0], e[1], e[2], e[3], NULL, STA_ERR_SHAPE,
              "q: batch, heads and D must be >= 1, got B=0 heads=2 D=8");
  for (int i = 0; i < 4; i++) sta_tensor_destroy(e[i]);
  bad_free(&x);
}

static void test_errors_geometry_windows(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  /* seq_len shorter than the canvas: exactly FastVideo's message */
  x.d.geom.canvas[0] = 5; /* V = 160 > 134 */
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_SEQ_LEN,
              "seq_len 134 not supported for STA (canvas 5x4x8 has 160 video rows, q has 134)");
  x.d.geom.canvas[0] = 0;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "canvas: t = 0, expected 1..1048576");
  x.d.geom.canvas[0] = 4;
  x.d.geom.tile[2] = -1;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "tile: w = -1, expected 1..1048576");
  x.d.geom.tile[2] = 2;
  /* text_len out of range */
  x.d.geom.text_len = 7;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT,
              "text_len: 7 is outside 0..6 (seq_len 134 - 128 video tokens)");
  x.d.geom.text_len = -2;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT,
              "text_len: -2 is outside 0..6 (seq_len 134 - 128 video tokens)");
  x.d.geom.text_len = -1;
  /* windows */
  x.d.n_windows = 3;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "n_windows: expected 1 or heads (2), got 3");
  x.d.n_windows = 0;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "n_windows: expected 1 or heads (2), got 0");
  x.d.n_windows = 1;
  x.d.windows = NULL;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "windows: expected an array, got NULL");
  x.d.windows = x.w;
  x.w[2] = 2; /* 4 tiles on w */
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW,
              "window: Kw = 2 is even and smaller than the 4 tiles on the w axis "
              "(use an odd window, or >= 4 for the whole axis)");
  x.w[2] = 4; /* even but whole axis: fine, tested below */
  x.w[0] = 0;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "window: Kt = 0, expected >= 1");
  x.w[0] = -3;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "window: Kt = -3, expected >= 1");
  x.w[0] = 1;
  x.d.n_windows = 2;
  x.w[3] = 1; x.w[4] = 2; x.w[5] = 1; /* head 1: Kh 2 < 2 tiles? no: 2 >= 2 is whole axis */
  x.w[5] = 0;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_WINDOW, "head 1: window: Kw = 0, expected >= 1");
  x.w[5] = 3; x.w[0] = 3; x.w[1] = 1; x.w[2] = 1; /* head 0: Kt 3 >= 2 tiles is fine */
  x.d.n_windows = 1;
  /* scale */
  x.d.scale = NAN;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT, "scale: expected a finite value, got nan");
  x.d.scale = INFINITY;
  expect_fail(&x, x.q, x.k, x.v, x.o, x.l, STA_ERR_ARGUMENT, "scale: expected a finite value, got inf");
  x.d.scale = 0;
  /* a valid call with even whole-axis windows does run */
  x.w[0] = 2; x.w[1] = 4; x.w[2] = 4;
  assert_int_equal(sta_attention_forward(&x.d, x.q, x.k, x.v, x.o, x.l), STA_OK);
  double mx;
  assert_int_equal(sta_tensor_compare(x.o, x.o0, &mx, NULL), STA_OK);
  assert_true(mx > 0);
  bad_free(&x);
}

static void test_errors_lse(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  sta_tensor *l16 = NULL, *l2 = NULL, *lw = NULL;
  int64_t ls[3] = {1, 2, 134}, l2s[2] = {2, 134}, lws[3] = {1, 134, 2};
  assert_int_equal(sta_tensor_create(&l16, STA_F16, STA_CPU, 3, ls), STA_OK);
  sta_tensor_randn(l16, 9, 0, 1);
  sta_tensor *l16s = snapshot(l16);
  expect_fail(&x, x.q, x.k, x.v, x.o, l16, STA_ERR_DTYPE, "lse: expected f32, got f16");
  assert_same(l16, l16s);
  assert_int_equal(sta_tensor_create(&l2, STA_F32, STA_CPU, 2, l2s), STA_OK);
  sta_tensor_randn(l2, 10, 0, 1);
  expect_fail(&x, x.q, x.k, x.v, x.o, l2, STA_ERR_SHAPE, "lse: expected shape [B=1, heads=2, S=134], got [2, 134]");
  assert_int_equal(sta_tensor_create(&lw, STA_F32, STA_CPU, 3, lws), STA_OK);
  sta_tensor_randn(lw, 11, 0, 1);
  expect_fail(&x, x.q, x.k, x.v, x.o, lw, STA_ERR_SHAPE, "lse: expected shape [B=1, heads=2, S=134], got [1, 134, 2]");
  /* lse on another device */
  float dummy[268];
  sta_tensor *lc = NULL;
  assert_int_equal(sta_tensor_wrap(&lc, dummy, STA_F32, STA_CUDA, 3, ls, NULL), STA_OK);
  expect_fail(&x, x.q, x.k, x.v, x.o, lc, STA_ERR_ARGUMENT, "lse: on cuda while q is on cpu");
  sta_tensor_destroy(lc);
  sta_tensor_destroy(l16); sta_tensor_destroy(l16s);
  sta_tensor_destroy(l2); sta_tensor_destroy(lw);
  bad_free(&x);
}

static void test_errors_devices(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  /* tensors that claim to live on CUDA (wrapped host memory, never read) */
  int64_t s4[4] = {1, 134, 2, 8};
  static float mem[4][134 * 2 * 8];
  sta_tensor *c[4];
  for (int i = 0; i < 4; i++)
    assert_int_equal(sta_tensor_wrap(&c[i], mem[i], STA_F32, STA_CUDA, 4, s4, NULL), STA_OK);
  expect_fail(&x, x.q, c[1], x.v, x.o, x.l, STA_ERR_ARGUMENT, "k: on cuda while q is on cpu");
  expect_fail(&x, x.q, x.k, x.v, c[3], x.l, STA_ERR_ARGUMENT, "out: on cuda while q is on cpu");
  expect_fail(&x, c[0], c[1], c[2], x.o, x.l, STA_ERR_ARGUMENT, "out: on cpu while q is on cuda");
  /* all on CUDA with CUDA unavailable */
  setenv("STA_DISABLE_CUDA", "1", 1);
  assert_int_equal(sta_backend_available(STA_CUDA), 0);
  char nb[320]; /* STA.md's text, then why */
  snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
  expect_fail(&x, c[0], c[1], c[2], c[3], NULL, STA_ERR_BACKEND, nb);
  sta_clear_error();
  assert_int_equal(sta_attention_reference(&x.d, c[0], c[1], c[2], c[3], NULL), STA_ERR_ARGUMENT);
  assert_string_equal(sta_last_error(), "q: the reference runs on host tensors only");
  unsetenv("STA_DISABLE_CUDA");
  for (int i = 0; i < 4; i++) sta_tensor_destroy(c[i]);
  bad_free(&x);
}

static void test_errors_out_of_memory(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  x.w[0] = 1; x.w[1] = 1; x.w[2] = 3;
  int64_t n = 0;
  sta_fault_arm(0);
  assert_int_equal(sta_attention_forward(&x.d, x.q, x.k, x.v, x.o, x.l), STA_OK);
  n = sta_fault_count();
  assert_true(n >= 2);
  sta_tensor *good = snapshot(x.o);
  sta_tensor_randn(x.o, 77, 0, 1);
  sta_tensor_destroy(x.o0);
  x.o0 = snapshot(x.o);
  sta_tensor_destroy(x.l0);
  x.l0 = snapshot(x.l);
  for (int64_t i = 1; i <= n; i++) {
    sta_fault_arm(i);
    sta_status rc = sta_attention_forward(&x.d, x.q, x.k, x.v, x.o, x.l);
    sta_fault_arm(0);
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_non_null(strstr(sta_last_error(), "out of host memory"));
    assert_same(x.o, x.o0);
    assert_same(x.l, x.l0);
  }
  sta_fault_arm(0);
  assert_int_equal(sta_attention_forward(&x.d, x.q, x.k, x.v, x.o, x.l), STA_OK);
  assert_same(x.o, good);
  sta_tensor_destroy(good);
  bad_free(&x);
}

static void test_errors_head_diff(void **state) {
  (void)state;
  bad x;
  bad_init(&x);
  float l1[2] = {5, 5}, l2[2] = {6, 6};
  sta_tensor *t3 = NULL, *h16 = NULL, *kk = NULL;
  int64_t s3[3] = {134, 2, 8}, s4[4] = {1, 134, 2, 8}, s5[4] = {1, 133, 2, 8};
  sta_tensor_create(&t3, STA_F32, STA_CPU, 3, s3);
  sta_tensor_create(&h16, STA_F16, STA_CPU, 4, s4);
  sta_tensor_create(&kk, STA_F32, STA_CPU, 4, s5);
  sta_tensor_randn(t3, 1, 0, 1);
  sta_tensor_randn(h16, 2, 0, 1);
  sta_tensor_randn(kk, 3, 0, 1);
  struct { const sta_tensor *a, *b; float *l1, *l2; sta_status st; const char *msg; } cases[] = {
    {t3, x.k, l1, l2, STA_ERR_SHAPE, "a: expected a 4-D tensor, got 3-D"},
    {x.q, NULL, l1, l2, STA_ERR_ARGUMENT, "b: expected a tensor, got NULL"},
    {x.q, kk, l1, l2, STA_ERR_SHAPE, "b: shape differs from a's"},
    {x.q, h16, l1, l2, STA_ERR_DTYPE, "b: dtype f16 differs from a's f32"},
    {x.q, x.k, NULL, l2, STA_ERR_ARGUMENT, "l1, l2: expected arrays, got NULL"},
    {x.q, x.k, l1, NULL, STA_ERR_ARGUMENT, "l1, l2: expected arrays, got NULL"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sta_clear_error();
    assert_int_equal(sta_head_diff(cases[i].a, cases[i].b, STA_BSHD, cases[i].l1, cases[i].l2),
                     cases[i].st);
    assert_string_equal(sta_last_error(), cases[i].msg);
    assert_true(l1[0] == 5 && l1[1] == 5 && l2[0] == 6 && l2[1] == 6);
  }
  sta_tensor_destroy(t3); sta_tensor_destroy(h16); sta_tensor_destroy(kk);
  bad_free(&x);
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
    cmocka_unit_test(test_reference_by_hand),
    cmocka_unit_test(test_flops),
    cmocka_unit_test(test_head_diff),
    cmocka_unit_test(test_errors_arguments),
    cmocka_unit_test(test_errors_alias),
    cmocka_unit_test(test_errors_geometry_windows),
    cmocka_unit_test(test_errors_lse),
    cmocka_unit_test(test_errors_devices),
    cmocka_unit_test(test_errors_out_of_memory),
    cmocka_unit_test(test_errors_head_diff),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
