/* test_attention_hand.c -- the CPU forward and the reference against
** independent computations: hand-computed attention on small canvases
** (padding, own tile, clamped border windows), sta_attention_flops against
** the pairs the reference counts and a count by tiles, sta_head_diff
** against direct sums. */
#include <math.h>
#include <stdlib.h>

#include "attention_util.h"

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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_reference_by_hand),
    cmocka_unit_test(test_flops),
    cmocka_unit_test(test_head_diff),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
