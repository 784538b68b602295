/* test_tiled.c -- FastVideo's tiled token order read in place (STA.md
** section 1, sta_geometry.order): on random geometries (partial tiles,
** per-head windows, text and encoder padding, both layouts, batch), the
** CPU forward, backward and both references in the tiled order equal the
** untiled computation on the same tokens permuted (the fast paths bit for
** bit: they share the compact order); padding rows hold NaN going in and
** come out with out 0, lse -inf, dq = dk = dv = 0; a wrong length, a bad
** order and the tiled order under sequence parallelism are refused with
** messages naming them, nothing written. */
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

#define MAXH 3

typedef struct prob {
  int32_t canvas[3], tile[3];
  int64_t text, text_len; /* rows after the video; valid ones (-1: all) */
  int64_t B, H, D;
  sta_dtype dtype;
  sta_layout layout;
  int32_t n_windows, windows[3 * MAXH];
  uint64_t seed;
} prob;

static int64_t vtok(const prob *c) { return (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2]; }

static void geom_of(const prob *c, sta_order order, sta_geometry *g) {
  sta_geometry_init(g, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(g->tile, c->tile, sizeof c->tile);
  g->text_len = c->text_len;
  g->order = order;
}

static void desc_of(const prob *c, sta_order order, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  geom_of(c, order, &d->geom);
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
}

/* Rows of the sequence in an order. */
static int64_t rows_of(const prob *c, sta_order order) {
  sta_geometry g;
  geom_of(c, order, &g);
  return sta_geometry_video_rows(&g) + c->text;
}

static sta_tensor *make4(const prob *c, sta_dtype dt, int64_t S) {
  int64_t shape[4] = {c->B, c->layout == STA_BSHD ? S : c->H, c->layout == STA_BSHD ? c->H : S,
                      c->D};
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_fill(t, NAN), STA_OK);
  return t;
}

/* The padding rows of c's tiled order, via the core's own map; *n rows. */
static int64_t *pad_rows(const prob *c, int64_t *n) {
  int32_t grid[3];
  sta_geometry g;
  geom_of(c, STA_ORDER_TILED, &g);
  sta_geometry_grid(&g, grid);
  int64_t pv = sta_geometry_video_rows(&g), k = 0;
  int64_t *r = malloc(sizeof(int64_t) * (size_t)(pv + 1));
  assert_non_null(r);
  for (int64_t j = 0; j < pv; j++)
    if (sta_tiled_token(c->canvas, c->tile, grid, j) < 0) r[k++] = j;
  assert_int_equal(k, pv - vtok(c));
  *n = k;
  return r;
}

/* The tiled copy of an untiled tensor, its padding rows NaN. */
static sta_tensor *tiled_copy(const prob *c, const sta_tensor *u) {
  sta_geometry g;
  geom_of(c, STA_ORDER_TILED, &g); /* sta_tensor_tile ignores g's order */
  sta_tensor *t = make4(c, sta_tensor_dtype(u), rows_of(c, STA_ORDER_TILED));
  assert_int_equal(sta_tensor_tile(t, u, &g, c->layout), STA_OK);
  assert_int_equal(sta_test_fill_pad(t, &g, c->layout, NAN), rows_of(c, STA_ORDER_TILED) -
                                                              rows_of(c, STA_ORDER_UNTILED));
  return t;
}

/* The untiled view of a tiled result. */
static sta_tensor *untiled_copy(const prob *c, const sta_tensor *t) {
  sta_geometry g;
  geom_of(c, STA_ORDER_TILED, &g);
  sta_tensor *u = make4(c, sta_tensor_dtype(t), rows_of(c, STA_ORDER_UNTILED));
  assert_int_equal(sta_tensor_untile(u, t, &g, c->layout), STA_OK);
  return u;
}

static sta_tensor *new_lse(const prob *c, int64_t S) {
  int64_t shape[3] = {c->B, c->H, S};
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 3, shape), STA_OK);
  assert_int_equal(sta_tensor_fill(t, NAN), STA_OK);
  return t;
}

static void describe(const prob *c, char *buf, size_t n) {
  snprintf(buf, n,
           "canvas %dx%dx%d tile %dx%dx%d text %lld/%lld B%lld H%lld D%lld %s layout %d "
           "windows %d (%d,%d,%d) seed %llu",
           c->canvas[0], c->canvas[1], c->canvas[2], c->tile[0], c->tile[1], c->tile[2],
           (long long)c->text, (long long)c->text_len, (long long)c->B, (long long)c->H,
           (long long)c->D, sta_dtype_name(c->dtype), (int)c->layout, (int)c->n_windows,
           c->windows[0], c->windows[1], c->windows[2], (unsigned long long)c->seed);
}

/* a (untiled, converted back from the tiled result) against b (untiled):
** exactly equal, or within rel L2 tol. */
static void same(const prob *c, const char *what, const sta_tensor *a, const sta_tensor *b,
                 double tol) {
  double mx, rel;
  char buf[256];
  assert_int_equal(sta_tensor_compare(a, b, &mx, &rel), STA_OK);
  if (tol == 0 ? mx == 0 : rel <= tol) return;
  describe(c, buf, sizeof buf);
  fail_msg("%s: tiled differs from untiled (max %g, rel L2 %g): %s", what, mx, rel, buf);
}

/* The lse of a tiled call against the untiled one's: equal (exactly when
** exact) on every token's row, -inf on the padding rows. */
static void same_lse(const prob *c, const sta_tensor *lt, const sta_tensor *lu, int exact) {
  int32_t grid[3];
  sta_geometry g;
  geom_of(c, STA_ORDER_TILED, &g);
  sta_geometry_grid(&g, grid);
  int64_t pv = sta_geometry_video_rows(&g), V = vtok(c);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t j = 0; j < pv + c->text; j++) {
        int64_t x = j < pv ? sta_tiled_token(c->canvas, c->tile, grid, j) : V + j - pv;
        int64_t at[3] = {b, h, j}, au[3] = {b, h, x};
        double a, e = -INFINITY;
        assert_int_equal(sta_tensor_get(lt, at, &a), STA_OK);
        if (x >= 0) assert_int_equal(sta_tensor_get(lu, au, &e), STA_OK);
        if (a != e && (exact || !(fabs(a - e) <= 1e-5 * (1 + fabs(e)))))
          fail_msg("lse [%lld, %lld, tiled row %lld] = %g, untiled %g", (long long)b,
                   (long long)h, (long long)j, a, e);
      }
}

/* Each row of the padding rows of t: exactly 0. */
static void zero_pad(const prob *c, const char *what, const sta_tensor *t) {
  int64_t n, *pad = pad_rows(c, &n);
  for (int64_t i = 0; i < n; i++)
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t h = 0; h < c->H; h++)
        for (int64_t e = 0; e < c->D; e++) {
          int64_t row = pad[i];
          int64_t at[4] = {b, c->layout == STA_BSHD ? row : h, c->layout == STA_BSHD ? h : row, e};
          double z;
          assert_int_equal(sta_tensor_get(t, at, &z), STA_OK);
          if (z != 0.0) fail_msg("%s: padding row %lld = %g, expected exactly 0", what,
                                 (long long)row, z);
        }
  free(pad);
}

enum { Q, K, V, DO };

/* Forward, backward and both references in both orders on the same
** tokens: tiled results converted back equal the untiled ones. */
static void check(const prob *c) {
  sta_attention_desc du, dt;
  desc_of(c, STA_ORDER_UNTILED, &du);
  desc_of(c, STA_ORDER_TILED, &dt);
  const int64_t Su = rows_of(c, STA_ORDER_UNTILED), St = rows_of(c, STA_ORDER_TILED);
  sta_tensor *u[4], *t[4];
  for (int i = 0; i < 4; i++) {
    u[i] = make4(c, c->dtype, Su);
    assert_int_equal(sta_tensor_randn(u[i], c->seed * 4 + (uint64_t)i, i == V ? 0.3 : 0.0, 1.0),
                     STA_OK);
    t[i] = tiled_copy(c, u[i]);
  }
  /* forward: the fast path bit for bit, the reference to its rounding */
  for (int ref = 0; ref < 2; ref++) {
    sta_tensor *ou = make4(c, c->dtype, Su), *ot = make4(c, c->dtype, St);
    sta_tensor *lu = new_lse(c, Su), *lt = new_lse(c, St);
    sta_status (*fwd)(const sta_attention_desc *, const sta_tensor *, const sta_tensor *,
                      const sta_tensor *, sta_tensor *, sta_tensor *) =
        ref ? sta_attention_reference : sta_attention_forward;
    assert_int_equal(fwd(&du, u[Q], u[K], u[V], ou, lu), STA_OK);
    if (fwd(&dt, t[Q], t[K], t[V], ot, lt) != STA_OK) fail_msg("tiled: %s", sta_last_error());
    zero_pad(c, ref ? "reference out" : "out", ot);
    sta_tensor *back = untiled_copy(c, ot);
    same(c, ref ? "reference out" : "out", back, ou, ref ? 1e-6 : 0);
    same_lse(c, lt, lu, !ref);
    sta_tensor_destroy(back);
    if (!ref) { /* the backward of this forward */
      sta_tensor *gu[3], *gt[3];
      for (int i = 0; i < 3; i++) {
        gu[i] = make4(c, c->dtype, Su);
        gt[i] = make4(c, c->dtype, St);
      }
      assert_int_equal(sta_attention_backward(&du, u[Q], u[K], u[V], ou, lu, u[DO], gu[0], gu[1],
                                              gu[2]),
                       STA_OK);
      if (sta_attention_backward(&dt, t[Q], t[K], t[V], ot, lt, t[DO], gt[0], gt[1], gt[2]) !=
          STA_OK)
        fail_msg("tiled backward: %s", sta_last_error());
      static const char *const GN[3] = {"dq", "dk", "dv"};
      for (int i = 0; i < 3; i++) {
        zero_pad(c, GN[i], gt[i]);
        back = untiled_copy(c, gt[i]);
        same(c, GN[i], back, gu[i], 0);
        sta_tensor_destroy(back);
      }
      /* the backward reference (f32 inputs only: it is slow) */
      if (c->dtype == STA_F32) {
        for (int i = 0; i < 3; i++) {
          assert_int_equal(sta_tensor_fill(gu[i], NAN), STA_OK);
          assert_int_equal(sta_tensor_fill(gt[i], NAN), STA_OK);
        }
        assert_int_equal(sta_attention_backward_reference(&du, u[Q], u[K], u[V], u[DO], gu[0],
                                                          gu[1], gu[2]),
                         STA_OK);
        if (sta_attention_backward_reference(&dt, t[Q], t[K], t[V], t[DO], gt[0], gt[1],
                                             gt[2]) != STA_OK)
          fail_msg("tiled backward reference: %s", sta_last_error());
        for (int i = 0; i < 3; i++) {
          zero_pad(c, GN[i], gt[i]);
          back = untiled_copy(c, gt[i]);
          same(c, GN[i], back, gu[i], 1e-6);
          sta_tensor_destroy(back);
        }
      }
      for (int i = 0; i < 3; i++) {
        sta_tensor_destroy(gu[i]);
        sta_tensor_destroy(gt[i]);
      }
    }
    sta_tensor_destroy(ou);
    sta_tensor_destroy(ot);
    sta_tensor_destroy(lu);
    sta_tensor_destroy(lt);
  }
  for (int i = 0; i < 4; i++) {
    sta_tensor_destroy(u[i]);
    sta_tensor_destroy(t[i]);
  }
}

/* Uniform integer in [lo, hi] from the counter-based generator. */
static int32_t pick(uint64_t seed, uint64_t i, int32_t lo, int32_t hi) {
  double g = fabs(sta_randn_at(seed, i)) * 1e6;
  return lo + (int32_t)((uint64_t)g % (uint64_t)(hi - lo + 1));
}

static void random_prob(prob *c, uint64_t seed) {
  memset(c, 0, sizeof *c);
  uint64_t k = 0;
  for (int i = 0; i < 3; i++) {
    c->tile[i] = pick(seed, k++, 1, 4);
    c->canvas[i] = pick(seed, k++, 1, 3 * c->tile[i] + 1);
  }
  c->text = pick(seed, k++, 0, 6);
  c->text_len = pick(seed, k++, 0, 2) == 0 ? -1 : pick(seed, k++, 0, (int32_t)c->text);
  c->B = pick(seed, k++, 1, 2);
  c->H = pick(seed, k++, 1, MAXH);
  c->D = pick(seed, k++, 0, 1) ? 16 : 8;
  c->dtype = pick(seed, k++, 0, 3) == 0 ? STA_BF16 : STA_F32;
  c->layout = (sta_layout)pick(seed, k++, 0, 1);
  c->n_windows = pick(seed, k++, 0, 1) ? (int32_t)c->H : 1;
  for (int h = 0; h < c->n_windows; h++)
    for (int i = 0; i < 3; i++) {
      int32_t n = (c->canvas[i] + c->tile[i] - 1) / c->tile[i];
      c->windows[3 * h + i] = pick(seed, k++, 0, 3) == 0 ? n + pick(seed, k++, 0, 2)
                                                          : 2 * pick(seed, k++, 0, (n - 1) / 2) + 1;
    }
  c->seed = seed;
}

static void test_random_geometries(void **state) {
  (void)state;
  int partial = 0;
  for (uint64_t s = 1; s <= 40; s++) {
    prob c;
    random_prob(&c, 1000 + s);
    if (rows_of(&c, STA_ORDER_TILED) != rows_of(&c, STA_ORDER_UNTILED)) partial++;
    check(&c);
  }
  assert_true(partial >= 20); /* most draws have padding rows */
}

static void test_fixed_cases(void **state) {
  (void)state;
  prob c;
  memset(&c, 0, sizeof c);
  /* FastVideo's tiles, whole (tiled = a permutation, no padding) */
  c.canvas[0] = 12; c.canvas[1] = 16; c.canvas[2] = 16;
  c.tile[0] = 6; c.tile[1] = 8; c.tile[2] = 8;
  c.text = 5; c.text_len = -1; c.B = 1; c.H = 2; c.D = 16;
  c.dtype = STA_F32; c.layout = STA_BHSD; c.n_windows = 1;
  c.windows[0] = 1; c.windows[1] = 1; c.windows[2] = 1; c.seed = 7;
  assert_int_equal(rows_of(&c, STA_ORDER_TILED), rows_of(&c, STA_ORDER_UNTILED));
  check(&c);
  /* partial tiles on every axis, encoder padding rows, the full window */
  c.canvas[0] = 7; c.canvas[1] = 9; c.canvas[2] = 11;
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5;
  c.text = 6; c.text_len = 2; c.windows[0] = c.windows[1] = c.windows[2] = 9;
  c.layout = STA_BSHD; c.seed = 8;
  check(&c);
}

/* The geometry of the tiled order and its errors; none writes out. */
static void test_geometry_and_errors(void **state) {
  (void)state;
  sta_geometry g;
  sta_geometry_init(&g, 7, 9, 11);
  assert_int_equal(g.order, STA_ORDER_UNTILED);
  g.tile[0] = 3; g.tile[1] = 4; g.tile[2] = 5;
  assert_int_equal(sta_geometry_video_rows(&g), 693);
  g.order = STA_ORDER_TILED; /* 3x3x3 tiles of 60 */
  assert_int_equal(sta_geometry_video_rows(&g), 1620);
  assert_int_equal(sta_geometry_text_len(&g, 1625), 5);
  assert_int_equal(sta_geometry_check(&g, 1620), STA_OK);
  assert_int_equal(sta_geometry_check(&g, 1625), STA_OK);
  /* the untiled length, or one short of the padded tiles: named */
  EXPECT_ERR(sta_geometry_check(&g, 698), STA_ERR_SEQ_LEN,
             "seq_len 698 not supported for STA (the tiled order of canvas 7x9x11 has 1620 "
             "video rows: 3x3x3 tiles of 3x4x5, partial ones padded; then the text)");
  EXPECT_ERR(sta_geometry_check(&g, 1619), STA_ERR_SEQ_LEN, NULL);
  g.text_len = 6;
  EXPECT_ERR(sta_geometry_check(&g, 1625), STA_ERR_ARGUMENT,
             "text_len: 6 is outside 0..5 (seq_len 1625 - 1620 video rows of the tiled order)");
  g.text_len = -1;
  g.order = (sta_order)7;
  EXPECT_ERR(sta_geometry_check(&g, 1625), STA_ERR_ARGUMENT,
             "order: expected STA_ORDER_UNTILED (0) or STA_ORDER_TILED (1), got 7");

  /* the attention calls: the same errors, out and dq unchanged */
  prob c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 7; c.canvas[1] = 9; c.canvas[2] = 11;
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5;
  c.text = 2; c.text_len = -1; c.B = 1; c.H = 1; c.D = 8; c.dtype = STA_F32;
  c.n_windows = 1; c.windows[0] = c.windows[1] = c.windows[2] = 3;
  sta_attention_desc d;
  desc_of(&c, STA_ORDER_TILED, &d);
  const int64_t Su = rows_of(&c, STA_ORDER_UNTILED);
  sta_tensor *q = make4(&c, STA_F32, Su), *o = make4(&c, STA_F32, Su);
  assert_int_equal(sta_tensor_randn(q, 5, 0, 1), STA_OK);
  assert_int_equal(sta_tensor_fill(o, 2.5), STA_OK);
  EXPECT_ERR(sta_attention_forward(&d, q, q, q, o, NULL), STA_ERR_SEQ_LEN,
             "seq_len 695 not supported for STA (the tiled order of canvas 7x9x11 has 1620 "
             "video rows: 3x3x3 tiles of 3x4x5, partial ones padded; then the text)");
  EXPECT_ERR(sta_attention_reference(&d, q, q, q, o, NULL), STA_ERR_SEQ_LEN, NULL);
  EXPECT_ERR(sta_attention_backward(&d, q, q, q, q, NULL, q, o, o, o), STA_ERR_ARGUMENT, NULL);
  sta_tensor *l = new_lse(&c, Su);
  EXPECT_ERR(sta_attention_backward(&d, q, q, q, q, l, q, o, o, o), STA_ERR_SEQ_LEN, NULL);
  EXPECT_ERR(sta_attention_backward_reference(&d, q, q, q, q, o, o, o), STA_ERR_SEQ_LEN, NULL);
  double mn;
  sta_stats st;
  assert_int_equal(sta_tensor_stats(o, &st), STA_OK);
  mn = st.min;
  assert_true(mn == 2.5 && st.max == 2.5);

  /* sequence parallelism takes the untiled order */
  sta_comm *comm[1] = {NULL};
  assert_int_equal(sta_comm_loopback(comm, 1), STA_OK);
  EXPECT_ERR(sta_sp_attention(comm[0], &d, q, q, q, o), STA_ERR_UNSUPPORTED,
             "order: sequence parallelism takes the untiled order (shards are ranges of "
             "untiled tokens), got 1");
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 1; ld.head_dim = 8; ld.sp_size = 1; ld.geom = d.geom;
  sta_sp_layer *sl = NULL;
  EXPECT_ERR(sta_sp_layer_create(&sl, comm[0], &ld), STA_ERR_UNSUPPORTED, NULL);
  assert_null(sl);
  sta_comm_destroy(comm[0]);
  sta_tensor_destroy(q);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
}

/* A layer in the tiled order runs what sta_attention_forward runs. */
static void test_layer(void **state) {
  (void)state;
  prob c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 5; c.canvas[1] = 6; c.canvas[2] = 7;
  c.tile[0] = 2; c.tile[1] = 4; c.tile[2] = 3;
  c.text = 3; c.text_len = -1; c.B = 1; c.H = 2; c.D = 8; c.dtype = STA_F32;
  c.n_windows = 1; c.windows[0] = 1; c.windows[1] = 1; c.windows[2] = 3;
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_uniform(&s, 1, 1, 2, c.windows, NULL, 0), STA_OK);
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 2; ld.head_dim = 8; ld.sp_size = 1; ld.strategy = s;
  geom_of(&c, STA_ORDER_TILED, &ld.geom);
  sta_layer *layer = NULL;
  assert_int_equal(sta_layer_create(&layer, &ld), STA_OK);
  const int64_t St = rows_of(&c, STA_ORDER_TILED);
  sta_tensor *x[3], *o = make4(&c, STA_F32, St), *want = make4(&c, STA_F32, St);
  for (int i = 0; i < 3; i++) {
    x[i] = make4(&c, STA_F32, St);
    assert_int_equal(sta_tensor_randn(x[i], 40 + (uint64_t)i, 0, 1), STA_OK);
  }
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 0, NULL, fb), STA_OK);
  if (sta_layer_forward(layer, x[0], x[1], x[2], o) != STA_OK)
    fail_msg("layer: %s", sta_last_error());
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  sta_attention_desc d;
  desc_of(&c, STA_ORDER_TILED, &d);
  assert_int_equal(sta_attention_forward(&d, x[0], x[1], x[2], want, NULL), STA_OK);
  same(&c, "layer out", o, want, 0);
  zero_pad(&c, "layer out", o);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(x[i]);
  sta_tensor_destroy(o);
  sta_tensor_destroy(want);
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(layer);
  sta_strategy_destroy(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_geometry_and_errors),
      cmocka_unit_test(test_fixed_cases),
      cmocka_unit_test(test_random_geometries),
      cmocka_unit_test(test_layer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
