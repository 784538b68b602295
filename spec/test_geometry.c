/* test_geometry.c -- canvas, tiles, windows, text length, known shapes,
** FastVideo's tiled order (STA.md sections 1-3). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed_counter = 4242;

static void test_init_grid_tokens(void **state) {
  (void)state;
  sta_geometry g;
  memset(&g, 0x5a, sizeof g);
  sta_geometry_init(&g, 30, 48, 80);
  assert_int_equal(g.canvas[0], 30);
  assert_int_equal(g.canvas[1], 48);
  assert_int_equal(g.canvas[2], 80);
  assert_int_equal(g.tile[0], 6);
  assert_int_equal(g.tile[1], 8);
  assert_int_equal(g.tile[2], 8);
  assert_int_equal(g.text_len, -1);
  int32_t grid[3];
  sta_geometry_grid(&g, grid);
  assert_int_equal(grid[0], 5);
  assert_int_equal(grid[1], 6);
  assert_int_equal(grid[2], 10);
  assert_int_equal(sta_geometry_video_tokens(&g), 115200);
  assert_int_equal(sta_geometry_text_len(&g, 115456), 256);
  g.text_len = 100;
  assert_int_equal(sta_geometry_text_len(&g, 115456), 100);
  assert_int_equal(sta_geometry_check(&g, 115456), STA_OK);
  /* partial tiles: ceil on every axis */
  for (int32_t t = 1; t <= 13; t++)
    for (int32_t tt = 1; tt <= 7; tt++) {
      sta_geometry_init(&g, t, 2 * t + 1, 3 * t);
      g.tile[0] = tt;
      g.tile[1] = tt + 1;
      g.tile[2] = 2;
      sta_geometry_grid(&g, grid);
      assert_int_equal(grid[0], (t + tt - 1) / tt);
      assert_int_equal(grid[1], (2 * t + 1 + tt) / (tt + 1));
      assert_int_equal(grid[2], (3 * t + 1) / 2);
      assert_int_equal(sta_geometry_video_tokens(&g), (int64_t)t * (2 * t + 1) * 3 * t);
      /* tiled length: the padded grid plus the text rows */
      int64_t padded = (int64_t)grid[0] * grid[1] * grid[2] * tt * (tt + 1) * 2;
      assert_int_equal(sta_geometry_tiled_len(&g, sta_geometry_video_tokens(&g) + 7),
                       padded + 7);
    }
  sta_geometry_init(&g, 30, 48, 80);
  assert_int_equal(sta_geometry_tiled_len(&g, 115456), 115456);
  sta_geometry_init(&g, 31, 48, 81);
  assert_int_equal(sta_geometry_tiled_len(&g, 31 * 48 * 81 + 5), 6 * 6 * 11 * 384 + 5);
}

static void test_check(void **state) {
  (void)state;
  sta_geometry g, saved;
  sta_geometry_init(&g, 4, 8, 12);
  assert_int_equal(sta_geometry_check(&g, 384), STA_OK);
  assert_int_equal(sta_geometry_check(&g, 400), STA_OK);
  memcpy(&saved, &g, sizeof g);
  sta_expect_err(sta_geometry_check(&g, 383), STA_ERR_SEQ_LEN, "seq_len 383 not supported for STA");
  sta_expect_err(sta_geometry_check(&g, 0), STA_ERR_SEQ_LEN, "seq_len 0 not supported for STA");
  g.text_len = 17;
  sta_expect_err(sta_geometry_check(&g, 400), STA_ERR_ARGUMENT,
             "text_len: 17 is outside 0..16 (seq_len 400 - 384 video tokens)");
  g.text_len = 16;
  assert_int_equal(sta_geometry_check(&g, 400), STA_OK);
  g.text_len = 0;
  assert_int_equal(sta_geometry_check(&g, 400), STA_OK);
  g.text_len = -2;
  sta_expect_err(sta_geometry_check(&g, 400), STA_ERR_ARGUMENT,
             "text_len: -2 is outside 0..16 (seq_len 400 - 384 video tokens)");
  g.text_len = -1;
  static const char axis[3] = {'t', 'h', 'w'};
  for (int i = 0; i < 3; i++) {
    char msg[96];
    sta_geometry b = g;
    b.canvas[i] = 0;
    snprintf(msg, sizeof msg, "canvas: %c = 0, expected 1..1048576", axis[i]);
    sta_expect_err(sta_geometry_check(&b, 400), STA_ERR_WINDOW, msg);
    b.canvas[i] = (1 << 20) + 1;
    snprintf(msg, sizeof msg, "canvas: %c = 1048577, expected 1..1048576", axis[i]);
    sta_expect_err(sta_geometry_check(&b, 400), STA_ERR_WINDOW, msg);
    b = g;
    b.tile[i] = -3;
    snprintf(msg, sizeof msg, "tile: %c = -3, expected 1..1048576", axis[i]);
    sta_expect_err(sta_geometry_check(&b, 400), STA_ERR_WINDOW, msg);
  }
  sta_geometry_init(&g, 1 << 20, 1 << 20, 2);
  sta_expect_err(sta_geometry_check(&g, INT64_MAX), STA_ERR_WINDOW,
             "canvas: 1048576x1048576x2 has too many tokens");
  sta_expect_err(sta_geometry_check(NULL, 10), STA_ERR_ARGUMENT,
             "geometry: expected a geometry, got NULL");
}

/* STA.md section 2 by brute force: center = clamp(q, r, C-1-r), keys
** |k - center| <= r; K >= C: all. */
static void test_window_range_brute(void **state) {
  (void)state;
  int checked = 0;
  for (int32_t c = 1; c <= 20; c++)
    for (int32_t k = 1; k <= 23; k++)
      for (int32_t q = 0; q < c; q++) {
        int32_t start = -7, count = -7;
        sta_status rc = sta_window_range(q, k, c, &start, &count);
        if (k < c && k % 2 == 0) {
          sta_expect_err(rc, STA_ERR_WINDOW, NULL);
          assert_int_equal(start, -7);
          assert_int_equal(count, -7);
          continue;
        }
        assert_int_equal(rc, STA_OK);
        int in[32] = {0}, lo = -1, n = 0;
        if (k >= c)
          for (int32_t j = 0; j < c; j++) in[j] = 1;
        else {
          int32_t r = k / 2, center = q < r ? r : q > c - 1 - r ? c - 1 - r : q;
          for (int32_t j = 0; j < c; j++) in[j] = abs(j - center) <= r;
        }
        for (int32_t j = 0; j < c; j++)
          if (in[j]) { if (lo < 0) lo = j; n++; }
        for (int32_t j = lo; j < lo + n; j++) assert_true(in[j]); /* one range */
        assert_int_equal(start, lo);
        assert_int_equal(count, n);
        assert_int_equal(count, k < c ? k : c); /* every query sees K tiles */
        checked++;
      }
  assert_true(checked > 2000);
  int32_t s = 5, n = 5;
  sta_expect_err(sta_window_range(0, 4, 5, &s, &n), STA_ERR_WINDOW,
             "window: K = 4 is even and smaller than 5 tiles");
  sta_expect_err(sta_window_range(0, 0, 5, &s, &n), STA_ERR_WINDOW, "window: K = 0, expected >= 1");
  sta_expect_err(sta_window_range(0, -3, 5, &s, &n), STA_ERR_WINDOW, "window: K = -3, expected >= 1");
  sta_expect_err(sta_window_range(5, 3, 5, &s, &n), STA_ERR_WINDOW, "window: query tile 5 outside 0..4");
  sta_expect_err(sta_window_range(-1, 3, 5, &s, &n), STA_ERR_WINDOW,
             "window: query tile -1 outside 0..4");
  sta_expect_err(sta_window_range(0, 3, 0, &s, &n), STA_ERR_WINDOW,
             "window: query tile 0 outside 0..-1");
  assert_int_equal(s, 5);
  assert_int_equal(n, 5);
  /* even K >= C is the whole axis */
  assert_int_equal(sta_window_range(2, 6, 6, &s, &n), STA_OK);
  assert_int_equal(s, 0);
  assert_int_equal(n, 6);
}

static void test_window_check(void **state) {
  (void)state;
  sta_geometry g;
  sta_geometry_init(&g, 30, 48, 80); /* grid 5 x 6 x 10 */
  static const int32_t good[][3] = {{3, 3, 3}, {5, 6, 10}, {1, 1, 1}, {3, 1, 10}, {1, 5, 7},
                                    {6, 6, 12}, {99, 99, 99}, {5, 7, 9}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
    if (sta_window_check(&g, good[i]) != STA_OK)
      fail_msg("window %d,%d,%d: %s", good[i][0], good[i][1], good[i][2], sta_last_error());
  int32_t w[3] = {4, 3, 3};
  sta_expect_err(sta_window_check(&g, w), STA_ERR_WINDOW,
             "window: Kt = 4 is even and smaller than the 5 tiles on the t axis (use an odd "
             "window, or >= 5 for the whole axis)");
  int32_t w2[3] = {3, 4, 3};
  sta_expect_err(sta_window_check(&g, w2), STA_ERR_WINDOW,
             "window: Kh = 4 is even and smaller than the 6 tiles on the h axis (use an odd "
             "window, or >= 6 for the whole axis)");
  int32_t w3[3] = {3, 3, 8};
  sta_expect_err(sta_window_check(&g, w3), STA_ERR_WINDOW,
             "window: Kw = 8 is even and smaller than the 10 tiles on the w axis (use an odd "
             "window, or >= 10 for the whole axis)");
  int32_t w4[3] = {3, 0, 3};
  sta_expect_err(sta_window_check(&g, w4), STA_ERR_WINDOW, "window: Kh = 0, expected >= 1");
  int32_t w5[3] = {-1, 3, 3};
  sta_expect_err(sta_window_check(&g, w5), STA_ERR_WINDOW, "window: Kt = -1, expected >= 1");
  sta_expect_err(sta_window_check(&g, NULL), STA_ERR_WINDOW, "window: expected 3 ints, got NULL");
  sta_expect_err(sta_window_check(NULL, w), STA_ERR_ARGUMENT,
             "geometry: expected a geometry, got NULL");
  g.tile[1] = 0; /* a broken geometry is reported, not divided by */
  sta_expect_err(sta_window_check(&g, good[0]), STA_ERR_WINDOW, "tile: h = 0, expected 1..1048576");
  /* partial grid: 31 frames are 6 tiles, so 6 is the whole axis */
  sta_geometry_init(&g, 31, 8, 8);
  int32_t w6[3] = {6, 1, 1};
  assert_int_equal(sta_window_check(&g, w6), STA_OK);
  w6[0] = 4;
  sta_expect_err(sta_window_check(&g, w6), STA_ERR_WINDOW, NULL);
}

static void test_from_seq_len(void **state) {
  (void)state;
  static const struct { int64_t s; int32_t t, h, w; } known[] = {
    {115456, 30, 48, 80}, {115200, 30, 48, 80}, {82944, 36, 48, 48}, {69120, 18, 48, 80}};
  for (int i = 0; i < 4; i++) {
    sta_geometry g;
    memset(&g, 0x77, sizeof g);
    assert_int_equal(sta_geometry_from_seq_len(&g, known[i].s), STA_OK);
    assert_int_equal(g.canvas[0], known[i].t);
    assert_int_equal(g.canvas[1], known[i].h);
    assert_int_equal(g.canvas[2], known[i].w);
    assert_int_equal(g.tile[0], 6);
    assert_int_equal(g.tile[1], 8);
    assert_int_equal(g.tile[2], 8);
    assert_int_equal(g.text_len, -1);
    assert_int_equal(sta_geometry_check(&g, known[i].s), STA_OK);
    assert_int_equal(sta_geometry_text_len(&g, known[i].s), known[i].s - 115200 * (i < 2) -
                     (i == 2 ? 82944 : i == 3 ? 69120 : 0));
  }
  sta_geometry g, saved;
  sta_geometry_init(&g, 2, 3, 4);
  memcpy(&saved, &g, sizeof g);
  static const int64_t unknown[] = {12345, 0, -1, 115457, 69121, 115200 * 2};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    char msg[64];
    snprintf(msg, sizeof msg, "seq_len %lld not supported for STA", (long long)unknown[i]);
    sta_expect_err(sta_geometry_from_seq_len(&g, unknown[i]), STA_ERR_SEQ_LEN, msg);
    assert_memory_equal(&g, &saved, sizeof g);
  }
  sta_expect_err(sta_geometry_from_seq_len(NULL, 115456), STA_ERR_ARGUMENT,
             "geometry: expected a geometry, got NULL");
}

/* ---- tiled order ---------------------------------------------------- */

/* A random [B, S, H, D] tensor in layout (BHSD built as a permuted view of
** a contiguous [B, H, S, D] tensor, so it is a real strided layout). */
static sta_tensor *qkv(sta_layout layout, int64_t b, int64_t s, int64_t h, int64_t d,
                       sta_dtype dt) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_counter++, 0.0, 1.0), STA_OK);
  return t;
}

static double row_at(const sta_tensor *t, sta_layout layout, int64_t b, int64_t s, int64_t h,
                     int64_t d) {
  int64_t idx[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  double v;
  assert_int_equal(sta_tensor_get(t, idx, &v), STA_OK);
  return v;
}

static void tile_case(sta_layout layout, int32_t T, int32_t H, int32_t W, const int32_t tile[3],
                      int64_t text, sta_dtype dt) {
  sta_geometry g;
  sta_geometry_init(&g, T, H, W);
  memcpy(g.tile, tile, sizeof g.tile);
  int64_t V = (int64_t)T * H * W, S = V + text, TL = sta_geometry_tiled_len(&g, S);
  int64_t B = 2, NH = 3, D = 4;
  sta_tensor *in = qkv(layout, B, S, NH, D, dt), *tl = qkv(layout, B, TL, NH, D, dt);
  sta_tensor *back = qkv(layout, B, S, NH, D, dt);
  assert_int_equal(sta_tensor_tile(tl, in, &g, layout), STA_OK);
  int32_t grid[3];
  sta_geometry_grid(&g, grid);
  int64_t tv = (int64_t)tile[0] * tile[1] * tile[2];
  char *hit = calloc((size_t)TL, 1);
  /* FastVideo's formula, generalised to partial tiles (padding between) */
  for (int64_t t = 0; t < T; t++)
    for (int64_t h = 0; h < H; h++)
      for (int64_t w = 0; w < W; w++) {
        int64_t id = ((t / tile[0]) * grid[1] + h / tile[1]) * grid[2] + w / tile[2];
        int64_t inner = ((t % tile[0]) * tile[1] + h % tile[1]) * tile[2] + w % tile[2];
        int64_t j = id * tv + inner, src = (t * H + h) * W + w;
        hit[j] = 1;
        for (int64_t b = 0; b < B; b++)
          for (int64_t hd = 0; hd < NH; hd++)
            for (int64_t d = 0; d < D; d++)
              assert_true(row_at(tl, layout, b, j, hd, d) == row_at(in, layout, b, src, hd, d));
      }
  for (int64_t j = 0; j < TL; j++) {
    int64_t src = j >= TL - text ? V + (j - (TL - text)) : -1;
    if (src < 0 && hit[j]) continue;
    for (int64_t b = 0; b < B; b++)
      for (int64_t hd = 0; hd < NH; hd++)
        for (int64_t d = 0; d < D; d++) {
          double x = row_at(tl, layout, b, j, hd, d);
          if (src >= 0) assert_true(x == row_at(in, layout, b, src, hd, d)); /* text */
          else assert_true(x == 0); /* padding */
        }
  }
  free(hit);
  assert_int_equal(sta_tensor_untile(back, tl, &g, layout), STA_OK);
  double m = -1;
  assert_int_equal(sta_tensor_compare(back, in, &m, NULL), STA_OK);
  assert_true(m == 0);
  sta_tensor_destroy(in);
  sta_tensor_destroy(tl);
  sta_tensor_destroy(back);
}

static void test_tile_roundtrip(void **state) {
  (void)state;
  static const int32_t t688[3] = {6, 8, 8}, t234[3] = {2, 3, 4}, t111[3] = {1, 1, 1},
                       t345[3] = {3, 4, 5};
  for (int l = 0; l < 2; l++) {
    sta_layout layout = (sta_layout)l;
    tile_case(layout, 6, 8, 16, t688, 0, STA_F32);   /* divisible: FastVideo exactly */
    tile_case(layout, 12, 16, 8, t688, 5, STA_BF16); /* divisible + text */
    tile_case(layout, 4, 6, 8, t234, 3, STA_F16);
    tile_case(layout, 7, 9, 10, t688, 2, STA_F32);   /* partial on every axis */
    tile_case(layout, 5, 7, 11, t234, 0, STA_F32);
    tile_case(layout, 3, 2, 5, t111, 1, STA_F16);
    tile_case(layout, 4, 9, 6, t345, 4, STA_BF16);
  }
}

static void test_tile_bhsd_view(void **state) {
  (void)state;
  /* BHSD data held as a permuted view of BSHD memory: strides, not layout */
  sta_geometry g;
  sta_geometry_init(&g, 6, 8, 8);
  int64_t s[4] = {1, 384, 2, 8}, ts[4] = {1, 384, 2, 8};
  sta_tensor *a = NULL, *o = NULL, *av = NULL, *ov = NULL, *ref = NULL;
  assert_int_equal(sta_tensor_create(&a, STA_F32, STA_CPU, 4, s), STA_OK);
  assert_int_equal(sta_tensor_randn(a, seed_counter++, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_create(&o, STA_F32, STA_CPU, 4, ts), STA_OK);
  assert_int_equal(sta_tensor_create(&ref, STA_F32, STA_CPU, 4, ts), STA_OK);
  int32_t perm[4] = {0, 2, 1, 3};
  assert_int_equal(sta_tensor_permute(&av, a, perm), STA_OK);
  assert_int_equal(sta_tensor_permute(&ov, o, perm), STA_OK);
  assert_int_equal(sta_tensor_tile(ov, av, &g, STA_BHSD), STA_OK);
  assert_int_equal(sta_tensor_tile(ref, a, &g, STA_BSHD), STA_OK);
  double m = -1;
  assert_int_equal(sta_tensor_compare(o, ref, &m, NULL), STA_OK);
  assert_true(m == 0);
  sta_tensor_destroy(a);
  sta_tensor_destroy(o);
  sta_tensor_destroy(av);
  sta_tensor_destroy(ov);
  sta_tensor_destroy(ref);
}

static void test_tile_errors(void **state) {
  (void)state;
  sta_geometry g;
  sta_geometry_init(&g, 7, 9, 10); /* tiled length 2*2*2*384 = 3072 */
  int64_t S = 630 + 2;
  sta_tensor *in = qkv(STA_BSHD, 1, S, 2, 4, STA_F32);
  sta_tensor *out = qkv(STA_BSHD, 1, 3074, 2, 4, STA_F32);
  sta_tensor *bad = qkv(STA_BSHD, 1, 3073, 2, 4, STA_F32);
  sta_tensor *f16 = qkv(STA_BSHD, 1, 3074, 2, 4, STA_F16);
  sta_tensor *heads = qkv(STA_BSHD, 1, 3074, 3, 4, STA_F32);
  sta_tensor *copy = NULL;
  assert_int_equal(sta_tensor_to(&copy, out, STA_F32, STA_CPU), STA_OK);
  sta_expect_err(sta_tensor_tile(bad, in, &g, STA_BSHD), STA_ERR_SHAPE,
             "out: expected 3074 rows for the tiled order of 632 tokens (same batch, heads, "
             "D), got 3073");
  sta_expect_err(sta_tensor_tile(heads, in, &g, STA_BSHD), STA_ERR_SHAPE,
             "out: expected 3074 rows for the tiled order of 632 tokens (same batch, heads, "
             "D), got 3074");
  sta_expect_err(sta_tensor_untile(in, bad, &g, STA_BSHD), STA_ERR_SHAPE,
             "in: expected 3074 rows for the tiled order of 632 tokens (same batch, heads, "
             "D), got 3073");
  sta_expect_err(sta_tensor_tile(f16, in, &g, STA_BSHD), STA_ERR_DTYPE,
             "out: dtype f16 differs from in's f32");
  sta_expect_err(sta_tensor_tile(out, in, NULL, STA_BSHD), STA_ERR_ARGUMENT,
             "geometry: expected a geometry, got NULL");
  sta_expect_err(sta_tensor_untile(in, out, NULL, STA_BSHD), STA_ERR_ARGUMENT,
             "geometry: expected a geometry, got NULL");
  sta_expect_err(sta_tensor_tile(out, NULL, &g, STA_BSHD), STA_ERR_ARGUMENT,
             "in: expected a tensor, got NULL");
  sta_expect_err(sta_tensor_tile(NULL, in, &g, STA_BSHD), STA_ERR_ARGUMENT,
             "out: expected a tensor, got NULL");
  g.canvas[0] = 8; /* 640 video tokens > 632 */
  sta_expect_err(sta_tensor_tile(out, in, &g, STA_BSHD), STA_ERR_SEQ_LEN,
             "seq_len 632 not supported for STA");
  g.canvas[0] = 7;
  int64_t s3[3] = {1, 632, 8};
  sta_tensor *three = NULL;
  assert_int_equal(sta_tensor_create(&three, STA_F32, STA_CPU, 3, s3), STA_OK);
  sta_expect_err(sta_tensor_tile(out, three, &g, STA_BSHD), STA_ERR_SHAPE,
             "in: expected a 4-D tensor, got 3-D");
  sta_expect_err(sta_tensor_tile(out, in, &g, (sta_layout)5), STA_ERR_ARGUMENT,
             "layout: expected STA_BSHD (0) or STA_BHSD (1), got 5");
  double m = -1;
  assert_int_equal(sta_tensor_compare(out, copy, &m, NULL), STA_OK);
  assert_true(m == 0); /* no failed call wrote anything */
  sta_tensor_destroy(in);
  sta_tensor_destroy(out);
  sta_tensor_destroy(bad);
  sta_tensor_destroy(f16);
  sta_tensor_destroy(heads);
  sta_tensor_destroy(copy);
  sta_tensor_destroy(three);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_init_grid_tokens),
    cmocka_unit_test(test_check),
    cmocka_unit_test(test_window_range_brute),
    cmocka_unit_test(test_window_check),
    cmocka_unit_test(test_from_seq_len),
    cmocka_unit_test(test_tile_roundtrip),
    cmocka_unit_test(test_tile_bhsd_view),
    cmocka_unit_test(test_tile_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
