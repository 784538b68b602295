/* test_gpu_backward.c -- the CUDA backward against the CPU on fresh random
** geometries (odd canvases, partial tiles, non-default tiles, border and
** whole-axis windows, text with padding rows, per-head windows, BSHD/BHSD
** and strided views, batch, D 64/128, bf16/f16; the untiled and FastVideo's
** tiled token order, NaN in its padding rows).  The reference is the CPU
** backward in f32 on the same (rounded) inputs, with the CPU forward's out
** and LSE.  Outputs are poisoned (NaN) first: every element must be
** written.  Skips cleanly without a CUDA device.  STA_TEST_SEED fixes the
** seed; STA_GPU_CASES the number of random geometries (default 60);
** STA_GPU_QUICK skips the large fixed cases and most of the tiled order's
** random ones (compute-sanitizer); its fixed cases still hold D 64 and 128
** in both dtypes, TMA and the gather, and the deterministic mode. */
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
#include "test_util.h"
#include "gpu_hooks.h"

#define MAXH 4

typedef struct bcase {
  int32_t canvas[3], tile[3];
  int64_t text, text_len, B, H, D;
  sta_dtype dtype;
  sta_layout layout;
  int order;  /* storage: 0 contiguous, 1 permuted */
  int tiled;  /* the rows in FastVideo's tiled order */
  int32_t n_windows, windows[3 * MAXH];
  float scale;
  uint64_t seed;
} bcase;

static void describe(const bcase *c, char *buf, size_t n) {
  snprintf(buf, n,
           "canvas %dx%dx%d tile %dx%dx%d text %lld/%lld B%lld H%lld D%lld %s %s order %d "
           "%s windows(%d) %d,%d,%d scale %g seed %llu",
           c->canvas[0], c->canvas[1], c->canvas[2], c->tile[0], c->tile[1], c->tile[2],
           (long long)c->text, (long long)c->text_len, (long long)c->B, (long long)c->H,
           (long long)c->D, sta_dtype_name(c->dtype), c->layout == STA_BSHD ? "BSHD" : "BHSD",
           c->order, c->tiled ? "tiled" : "untiled", c->n_windows, c->windows[0], c->windows[1], c->windows[2],
           (double)c->scale, (unsigned long long)c->seed);
}

/* A 4-D tensor in layout on dev, stored contiguous in layout (order 0) or in
** the other layout and permuted (order 1); *base holds the storage. */
static sta_tensor *make4(sta_tensor **base, sta_dtype dt, sta_device dev, sta_layout layout,
                         int order, int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int store_bshd = (layout == STA_BSHD) != (order == 1);
  int64_t shape[4] = {B, store_bshd ? S : H, store_bshd ? H : S, D};
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_create(base, dt, dev, 4, shape), STA_OK);
  if (order == 1) assert_int_equal(sta_tensor_permute(&v, *base, swap), STA_OK);
  else assert_int_equal(sta_tensor_narrow(&v, *base, 3, 0, D), STA_OK);
  return v;
}

/* Tolerances on rel L2 against the f32 CPU backward: P and dS enter the
** tensor-core GEMMs rounded to the dtype, the gradients are stored in it. */
static double tol(sta_dtype dt) { return dt == STA_F16 ? 1e-2 : 3e-2; }

static double worst_rel[2][3];

/* The descriptor of case c. */
static void desc_of(const bcase *c, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(d->geom.tile, c->tile, sizeof c->tile);
  d->geom.text_len = c->text_len;
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
  d->scale = c->scale;
  d->geom.order = c->tiled ? STA_ORDER_TILED : STA_ORDER_UNTILED;
}

static void run_case(const bcase *c) {
  char what[320];
  describe(c, what, sizeof what);
  sta_attention_desc d;
  desc_of(c, &d);
  const int64_t V = sta_geometry_video_rows(&d.geom), S = V + c->text; /* V: video rows */
  enum { NT = 8 };
  sta_tensor *hb[4], *h[4], *hf[4], *gb[NT], *g[NT]; /* q k v dout | out dq dk dv */
  for (int i = 0; i < 4; i++) {
    h[i] = make4(&hb[i], c->dtype, STA_CPU, c->layout, 0, c->B, S, c->H, c->D);
    assert_int_equal(sta_tensor_randn(h[i], c->seed * 5 + (uint64_t)i, i == 2 ? 0.3 : 0.0, 1.0),
                     STA_OK);
    if (c->tiled) sta_test_fill_pad(h[i], &d.geom, c->layout, NAN); /* never read */
    hf[i] = NULL;
    assert_int_equal(sta_tensor_to(&hf[i], h[i], STA_F32, STA_CPU), STA_OK);
  }
  for (int i = 0; i < NT; i++) {
    g[i] = make4(&gb[i], c->dtype, STA_CUDA, c->layout, (c->order + i) & 1, c->B, S, c->H, c->D);
    if (i < 4) assert_int_equal(sta_tensor_copy(g[i], h[i]), STA_OK);
    else assert_int_equal(sta_tensor_fill(gb[i], NAN), STA_OK); /* poison */
  }
  sta_tensor *glse = NULL, *clse = NULL;
  int64_t ls[3] = {c->B, c->H, S};
  assert_int_equal(sta_tensor_create(&glse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(&clse, STA_F32, STA_CPU, 3, ls), STA_OK);
  sta_status rc = sta_attention_forward(&d, g[0], g[1], g[2], g[4], glse);
  if (rc != STA_OK) fail_msg("%s: GPU forward: %s", what, sta_last_error());
  rc = sta_attention_backward(&d, g[0], g[1], g[2], g[4], glse, g[3], g[5], g[6], g[7]);
  if (rc != STA_OK) fail_msg("%s: GPU backward: %s", what, sta_last_error());
  assert_int_equal(sta_cuda_synchronize(), STA_OK);

  /* the CPU in f32 on the same values */
  sta_tensor *co = NULL, *cg[3];
  int64_t shape[4];
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(hf[0], i);
  assert_int_equal(sta_tensor_create(&co, STA_F32, STA_CPU, 4, shape), STA_OK);
  for (int i = 0; i < 3; i++) {
    cg[i] = NULL;
    assert_int_equal(sta_tensor_create(&cg[i], STA_F32, STA_CPU, 4, shape), STA_OK);
  }
  assert_int_equal(sta_attention_forward(&d, hf[0], hf[1], hf[2], co, clse), STA_OK);
  assert_int_equal(sta_attention_backward(&d, hf[0], hf[1], hf[2], co, clse, hf[3], cg[0], cg[1],
                                          cg[2]),
                   STA_OK);
  static const char *name[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    double mx, rel;
    assert_int_equal(sta_tensor_compare(g[5 + i], cg[i], &mx, &rel), STA_OK);
    int di = c->dtype == STA_F16;
    if (rel > worst_rel[di][i]) worst_rel[di][i] = rel;
    if (!(rel < tol(c->dtype))) fail_msg("%s: %s rel L2 %g, max %g", what, name[i], rel, mx);
  }
  /* never-key rows: dk = dv = 0 exactly */
  const int64_t valid = c->text_len < 0 ? c->text : c->text_len;
  if (V + valid < S) {
    sta_tensor *nk = NULL, *hz = NULL;
    for (int gi = 6; gi < 8; gi++) {
      assert_int_equal(sta_tensor_narrow(&nk, g[gi], c->layout == STA_BSHD ? 1 : 2, V + valid,
                                         S - V - valid),
                       STA_OK);
      assert_int_equal(sta_tensor_to(&hz, nk, STA_F32, STA_CPU), STA_OK);
      double mx = -1, rel;
      sta_tensor *zero = NULL;
      int64_t zs[4];
      for (int i = 0; i < 4; i++) zs[i] = sta_tensor_size(hz, i);
      assert_int_equal(sta_tensor_create(&zero, STA_F32, STA_CPU, 4, zs), STA_OK);
      assert_int_equal(sta_tensor_fill(zero, 0.0), STA_OK);
      assert_int_equal(sta_tensor_compare(hz, zero, &mx, &rel), STA_OK);
      if (mx != 0.0) fail_msg("%s: %s on never-key rows: max %g", what, name[gi - 5], mx);
      sta_tensor_destroy(zero);
      sta_tensor_destroy(hz);
      sta_tensor_destroy(nk);
      hz = nk = NULL;
    }
  }
  for (int i = 0; i < 4; i++) {
    sta_tensor_destroy(h[i]);
    sta_tensor_destroy(hb[i]);
    sta_tensor_destroy(hf[i]);
  }
  for (int i = 0; i < NT; i++) {
    sta_tensor_destroy(g[i]);
    sta_tensor_destroy(gb[i]);
  }
  for (int i = 0; i < 3; i++) sta_tensor_destroy(cg[i]);
  sta_tensor_destroy(co);
  sta_tensor_destroy(glse);
  sta_tensor_destroy(clse);
}

static void case_init(bcase *c, int32_t t, int32_t hh, int32_t w) {
  memset(c, 0, sizeof *c);
  c->canvas[0] = t; c->canvas[1] = hh; c->canvas[2] = w;
  c->tile[0] = 6; c->tile[1] = 8; c->tile[2] = 8;
  c->text_len = -1;
  c->B = 1; c->H = 2; c->D = 128;
  c->dtype = STA_BF16;
  c->n_windows = 1;
  c->windows[0] = c->windows[1] = c->windows[2] = 3;
  c->seed = sta_test_rnd();
}

static void test_fixed(void **state) {
  NEED_GPU();
  bcase c;
  case_init(&c, 12, 24, 24); /* 2x3x3 default tiles, text with padding */
  c.text = 70; c.text_len = 50;
  run_case(&c);
  c.D = 64; c.dtype = STA_F16; c.seed = sta_test_rnd();
  run_case(&c);
  case_init(&c, 13, 21, 19); /* partial default tiles on every axis, per head */
  c.H = 3; c.n_windows = 3;
  int32_t w[9] = {1, 3, 3, 3, 1, 1, 3, 3, 5};
  memcpy(c.windows, w, sizeof w);
  c.text = 9;
  run_case(&c);
  c.layout = STA_BHSD; c.order = 1; c.B = 2; c.scale = 0.05f; c.D = 64; c.seed = sta_test_rnd();
  run_case(&c);
  if (!getenv("STA_GPU_QUICK")) {
    case_init(&c, 30, 48, 80); /* hunyuan's canvas, one head */
    c.H = 1; c.text = 256;
    run_case(&c);
  }
}

static void test_random_geometries(void **state) {
  NEED_GPU();
  const char *ns = getenv("STA_GPU_CASES");
  int n = ns ? atoi(ns) : 60;
  for (int i = 0; i < n; i++) {
    bcase c;
    case_init(&c, (int32_t)sta_test_rint(1, 20), (int32_t)sta_test_rint(1, 30), (int32_t)sta_test_rint(1, 30));
    if (i % 3) for (int a = 0; a < 3; a++) c.tile[a] = (int32_t)sta_test_rint(1, 9);
    int32_t grid[3];
    for (int a = 0; a < 3; a++) grid[a] = (c.canvas[a] + c.tile[a] - 1) / c.tile[a];
    c.H = sta_test_rint(1, MAXH);
    c.n_windows = i % 2 ? (int32_t)c.H : 1;
    for (int hh = 0; hh < c.n_windows; hh++)
      for (int a = 0; a < 3; a++) {
        int32_t k = (int32_t)(2 * sta_test_rint(0, 2) + 1);
        if (sta_test_rint(0, 4) == 0) k = grid[a] + (int32_t)sta_test_rint(0, 1);
        if (k < grid[a] && k % 2 == 0) k++;
        c.windows[3 * hh + a] = k;
      }
    c.text = sta_test_rint(0, 3) ? sta_test_rint(0, 300) : 0;
    c.text_len = sta_test_rint(0, 2) ? -1 : sta_test_rint(0, c.text);
    c.B = sta_test_rint(1, 2);
    c.D = sta_test_rint(0, 1) ? 128 : 64;
    c.dtype = sta_test_rint(0, 1) ? STA_BF16 : STA_F16;
    c.layout = (sta_layout)sta_test_rint(0, 1);
    c.order = (int)sta_test_rint(0, 1);
    c.scale = sta_test_rint(0, 3) ? 0.0f : 0.06f;
    run_case(&c);
  }
  printf("# worst rel L2 (dq, dk, dv): bf16 %.3g %.3g %.3g; f16 %.3g %.3g %.3g\n",
         worst_rel[0][0], worst_rel[0][1], worst_rel[0][2], worst_rel[1][0], worst_rel[1][1],
         worst_rel[1][2]);
}

/* FastVideo's tiled token order read in place: whole 6x8x8 tiles
** take the row maps (a t-slice is a run of 64 rows), partial and other
** tiles the gather; padding rows hold NaN in q, k, v, dout and get dq = dk
** = dv = 0 (compared with the CPU's, which are 0: every gradient element
** is checked, the poison included). */
static void test_tiled_order(void **state) {
  NEED_GPU();
  bcase c;
  case_init(&c, 12, 24, 24); /* whole tiles: TMA */
  c.tiled = 1; c.text = 70; c.text_len = 50;
  run_case(&c);
  c.D = 64; c.dtype = STA_F16; c.layout = STA_BHSD; c.order = 1; c.B = 2; c.seed = sta_test_rnd();
  run_case(&c);
  case_init(&c, 13, 21, 19); /* partial tiles: padding rows, gathered */
  c.tiled = 1; c.H = 3; c.n_windows = 3; c.text = 9;
  int32_t w[9] = {1, 3, 3, 3, 1, 1, 3, 3, 5};
  memcpy(c.windows, w, sizeof w);
  run_case(&c);
  case_init(&c, 7, 9, 11); /* 3x4x5 tiles */
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5; c.tiled = 1; c.text = 6; c.text_len = 4;
  c.D = 64;
  run_case(&c);
  const int nr = getenv("STA_GPU_QUICK") ? 3 : 12; /* racecheck: 12 took minutes */
  for (int i = 0; i < nr; i++) {
    case_init(&c, (int32_t)sta_test_rint(1, 16), (int32_t)sta_test_rint(1, 20), (int32_t)sta_test_rint(1, 20));
    if (i % 2) for (int a = 0; a < 3; a++) c.tile[a] = (int32_t)sta_test_rint(1, 6);
    c.tiled = 1;
    c.text = sta_test_rint(0, 1) ? sta_test_rint(0, 150) : 0;
    c.text_len = sta_test_rint(0, 1) ? -1 : sta_test_rint(0, c.text);
    c.D = sta_test_rint(0, 1) ? 128 : 64;
    c.dtype = sta_test_rint(0, 1) ? STA_BF16 : STA_F16;
    c.layout = (sta_layout)sta_test_rint(0, 1);
    c.windows[0] = c.windows[1] = c.windows[2] = 99; /* the whole canvas */
    if (i % 3) c.windows[0] = c.windows[1] = c.windows[2] = 1;
    run_case(&c);
  }
}

/* deterministic = 1: the same gradients bit for bit on every run, and
** within rounding of the default's (partial default tiles: TMA; odd tiles:
** the gather; text with padding rows; per-head windows; batch 2). */
static void det_case(const bcase *c) {
  char what[320];
  describe(c, what, sizeof what);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(d.geom.tile, c->tile, sizeof c->tile);
  d.geom.text_len = c->text_len;
  d.layout = c->layout;
  d.n_windows = c->n_windows;
  d.windows = c->windows;
  d.geom.order = c->tiled ? STA_ORDER_TILED : STA_ORDER_UNTILED;
  const int64_t S = sta_geometry_video_rows(&d.geom) + c->text;
  sta_tensor *t[4], *b[4], *g[3][3], *gb[3][3], *lse = NULL, *o = NULL, *ob = NULL;
  for (int i = 0; i < 4; i++) {
    t[i] = make4(&b[i], c->dtype, STA_CUDA, c->layout, 0, c->B, S, c->H, c->D);
    sta_tensor *h = NULL, *hb = NULL;
    h = make4(&hb, c->dtype, STA_CPU, c->layout, 0, c->B, S, c->H, c->D);
    assert_int_equal(sta_tensor_randn(h, c->seed * 7 + (uint64_t)i, 0.0, 1.0), STA_OK);
    assert_int_equal(sta_tensor_copy(t[i], h), STA_OK);
    sta_tensor_destroy(h);
    sta_tensor_destroy(hb);
  }
  o = make4(&ob, c->dtype, STA_CUDA, c->layout, 0, c->B, S, c->H, c->D);
  int64_t ls[3] = {c->B, c->H, S};
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  assert_int_equal(sta_attention_forward(&d, t[0], t[1], t[2], o, lse), STA_OK);
  for (int run = 0; run < 3; run++) { /* runs 0, 1 deterministic; 2 the default */
    d.deterministic = run < 2;
    for (int i = 0; i < 3; i++) {
      g[run][i] = make4(&gb[run][i], c->dtype, STA_CUDA, c->layout, 0, c->B, S, c->H, c->D);
      assert_int_equal(sta_tensor_fill(gb[run][i], NAN), STA_OK);
    }
    sta_status rc = sta_attention_backward(&d, t[0], t[1], t[2], o, lse, t[3], g[run][0],
                                           g[run][1], g[run][2]);
    if (rc != STA_OK) fail_msg("%s: backward (deterministic %d): %s", what, d.deterministic,
                               sta_last_error());
  }
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  for (int i = 0; i < 3; i++) {
    double mx, rel;
    assert_int_equal(sta_tensor_compare(g[0][i], g[1][i], &mx, &rel), STA_OK);
    if (mx != 0.0) fail_msg("%s: deterministic runs differ (gradient %d, max %g)", what, i, mx);
    assert_int_equal(sta_tensor_compare(g[0][i], g[2][i], &mx, &rel), STA_OK);
    if (!(rel < 1e-2)) fail_msg("%s: deterministic vs default: gradient %d rel %g", what, i, rel);
  }
  for (int run = 0; run < 3; run++)
    for (int i = 0; i < 3; i++) {
      sta_tensor_destroy(g[run][i]);
      sta_tensor_destroy(gb[run][i]);
    }
  for (int i = 0; i < 4; i++) {
    sta_tensor_destroy(t[i]);
    sta_tensor_destroy(b[i]);
  }
  sta_tensor_destroy(o);
  sta_tensor_destroy(ob);
  sta_tensor_destroy(lse);
}

static void test_deterministic(void **state) {
  NEED_GPU();
  bcase c;
  case_init(&c, 12, 21, 24);
  c.B = 2; c.text = 70; c.text_len = 50; c.n_windows = 2;
  int32_t w[6] = {3, 1, 3, 1, 3, 3};
  memcpy(c.windows, w, sizeof w);
  det_case(&c);
  case_init(&c, 7, 9, 11);
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5;
  c.D = 64; c.dtype = STA_F16; c.text = 5;
  det_case(&c);
  c.tiled = 1; /* the tiled order, padding rows */
  det_case(&c);
  case_init(&c, 12, 16, 24);
  c.tiled = 1; c.text = 20;
  det_case(&c);
  /* an odd count of query blocks (3): the LSE and D after the turn
  ** counters in the workspace must stay 16-byte aligned for the bulk
  ** copies (misaligned address before the fix) */
  case_init(&c, 3, 8, 8);
  c.tile[0] = 3; c.H = 1; c.windows[0] = c.windows[1] = c.windows[2] = 1;
  c.D = 64;
  det_case(&c);
  c.H = 3; c.D = 128;
  det_case(&c);
}

/* Non-finite values propagate: one NaN planted in q, k, v or
** dout reaches on the GPU exactly the elements of out, lse, dq, dk, dv that
** it reaches on the CPU (whose rule test_nonfinite checks element by
** element): the same elements non-finite, the rest finite.  The GPU
** forward once turned a NaN row's lse into -inf. */
static int64_t nonfinite_mismatch(const sta_tensor *gpu, const sta_tensor *cpu, int64_t *bad) {
  sta_tensor *a = NULL, *b = NULL;
  assert_int_equal(sta_tensor_to(&a, gpu, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&b, cpu, STA_F32, STA_CPU), STA_OK);
  const float *x = sta_tensor_data(a), *y = sta_tensor_data(b);
  int64_t n = sta_tensor_numel(a), diff = 0;
  for (int64_t i = 0; i < n; i++) {
    diff += !isfinite(x[i]) != !isfinite(y[i]);
    *bad += !isfinite(y[i]);
  }
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  return diff;
}

/* A NaN in input `which` (q, k, v, dout) at fix (NULL: anywhere, drawn):
** GPU and CPU non-finite at the same elements of every output. */
static void nonfinite_case(const bcase *c, int which, const int64_t *fix) {
  char what[400];
  describe(c, what, sizeof what);
  sta_attention_desc d;
  desc_of(c, &d);
  const int64_t S = sta_geometry_video_rows(&d.geom) + c->text;
  int64_t shape[4] = {c->B, c->layout == STA_BSHD ? S : c->H, c->layout == STA_BSHD ? c->H : S,
                      c->D}, ls[3] = {c->B, c->H, S};
  sta_tensor *h[4], *g[8], *glse = NULL, *clse = NULL, *co = NULL, *cg[3];
  for (int i = 0; i < 4; i++) {
    h[i] = NULL;
    assert_int_equal(sta_tensor_create(&h[i], c->dtype, STA_CPU, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_randn(h[i], c->seed * 7 + (uint64_t)i, 0.0, 1.0), STA_OK);
  }
  int64_t at[4] = {sta_test_rint(0, shape[0] - 1), sta_test_rint(0, shape[1] - 1),
                   sta_test_rint(0, shape[2] - 1), sta_test_rint(0, shape[3] - 1)};
  if (fix) memcpy(at, fix, sizeof at);
  assert_int_equal(sta_tensor_set(h[which], at, NAN), STA_OK);
  char where[120];
  static const char *const WN[4] = {"q", "k", "v", "dout"};
  snprintf(where, sizeof where, ", NaN at %s[%lld, %lld, %lld, %lld]", WN[which],
           (long long)at[0], (long long)at[1], (long long)at[2], (long long)at[3]);
  strncat(what, where, sizeof what - strlen(what) - 1);
  for (int i = 0; i < 8; i++) {
    g[i] = NULL;
    assert_int_equal(sta_tensor_create(&g[i], c->dtype, STA_CUDA, 4, shape), STA_OK);
    if (i < 4) assert_int_equal(sta_tensor_copy(g[i], h[i]), STA_OK);
  }
  assert_int_equal(sta_tensor_create(&glse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(&clse, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(&co, c->dtype, STA_CPU, 4, shape), STA_OK);
  for (int i = 0; i < 3; i++) {
    cg[i] = NULL;
    assert_int_equal(sta_tensor_create(&cg[i], c->dtype, STA_CPU, 4, shape), STA_OK);
  }
  if (sta_attention_forward(&d, g[0], g[1], g[2], g[4], glse) != STA_OK ||
      sta_attention_backward(&d, g[0], g[1], g[2], g[4], glse, g[3], g[5], g[6], g[7]) != STA_OK ||
      sta_cuda_synchronize() != STA_OK)
    fail_msg("%s: GPU: %s", what, sta_last_error());
  if (sta_attention_forward(&d, h[0], h[1], h[2], co, clse) != STA_OK ||
      sta_attention_backward(&d, h[0], h[1], h[2], co, clse, h[3], cg[0], cg[1], cg[2]) != STA_OK)
    fail_msg("%s: CPU: %s", what, sta_last_error());
  const sta_tensor *gpu[5] = {g[4], glse, g[5], g[6], g[7]}, *cpu[5] = {co, clse, cg[0], cg[1], cg[2]};
  static const char *const ON[5] = {"out", "lse", "dq", "dk", "dv"};
  for (int i = 0; i < 5; i++) {
    int64_t bad = 0, diff = nonfinite_mismatch(gpu[i], cpu[i], &bad);
    if (diff) fail_msg("%s: %s: %lld elements finite on one side only (%lld non-finite on the "
                       "CPU)", what, ON[i], (long long)diff, (long long)bad);
  }
  for (int i = 0; i < 4; i++) sta_tensor_destroy(h[i]);
  for (int i = 0; i < 8; i++) sta_tensor_destroy(g[i]);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(cg[i]);
  sta_tensor_destroy(co);
  sta_tensor_destroy(glse);
  sta_tensor_destroy(clse);
}

static void test_nonfinite(void **state) {
  NEED_GPU();
  /* the rows past the valid text are never keys: a NaN in their k or v must
  ** reach no output (their TMA row boxes read them as zeros; found by the
  ** drawn cases below on the H200, 2026-12-02: 66 NaN outputs of a NaN at
  ** v[1, 60, 0, 30], text 38 rows, 1 valid) */
  for (int i = 0; i < 8; i++) {
    bcase c;
    case_init(&c, 7, 4, (int32_t)(i < 4 ? 1 : 16));
    c.tile[0] = 7; c.tile[1] = 4; c.tile[2] = i < 4 ? 2 : 8;
    c.H = 1;
    c.n_windows = 1;
    c.windows[0] = c.windows[1] = c.windows[2] = 1;
    c.text = i % 2 ? 38 : 200;
    c.text_len = i / 2 % 2 ? 1 : 0;
    c.B = 2;
    c.D = i % 2 ? 64 : 128;
    c.dtype = STA_BF16;
    c.layout = STA_BSHD;
    const int64_t V = 7 * 4 * (i < 4 ? 1 : 16), row = V + c.text_len + (i % 3);
    const int64_t fix[4] = {1, row, 0, 30};
    nonfinite_case(&c, 1 + (i + i / 4) % 2, fix); /* k or v, each at both D */
  }
  const int n = getenv("STA_GPU_QUICK") ? 4 : 24;
  for (int i = 0; i < n; i++) {
    bcase c;
    case_init(&c, (int32_t)sta_test_rint(1, 12), (int32_t)sta_test_rint(1, 20),
              (int32_t)sta_test_rint(1, 20));
    for (int a = 0; a < 3; a++) c.tile[a] = (int32_t)sta_test_rint(1, 8);
    int32_t grid[3];
    for (int a = 0; a < 3; a++) grid[a] = (c.canvas[a] + c.tile[a] - 1) / c.tile[a];
    c.H = sta_test_rint(1, 2);
    c.n_windows = (int32_t)c.H;
    for (int hh = 0; hh < c.n_windows; hh++)
      for (int a = 0; a < 3; a++) {
        int32_t k = (int32_t)(2 * sta_test_rint(0, 2) + 1);
        c.windows[3 * hh + a] = k < grid[a] ? k : grid[a];
      }
    c.text = sta_test_rint(0, 40);
    c.text_len = sta_test_rint(0, c.text);
    c.B = sta_test_rint(1, 2);
    c.D = sta_test_rint(0, 1) ? 128 : 64;
    c.dtype = sta_test_rint(0, 1) ? STA_BF16 : STA_F16;
    c.layout = (sta_layout)sta_test_rint(0, 1);
    c.tiled = (int)sta_test_rint(0, 1);
    nonfinite_case(&c, i % 4, NULL);
  }
  printf("# non-finite propagation: %d planted NaNs (and 8 in rows that are never keys), GPU "
         "and CPU non-finite at the same elements of out, lse, dq, dk, dv\n", n);
}

static void test_refusals(void **state) {
  NEED_GPU();
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 8, 8);
  int32_t w[3] = {1, 1, 1};
  d.n_windows = 1;
  d.windows = w;
  int64_t shape[4] = {1, 256, 1, 64}, ls[3] = {1, 1, 256};
  sta_tensor *t[8], *lse = NULL;
  for (int i = 0; i < 8; i++) {
    t[i] = NULL;
    assert_int_equal(sta_tensor_create(&t[i], STA_F32, STA_CUDA, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_fill(t[i], 0.5), STA_OK);
  }
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  assert_int_equal(sta_attention_backward(&d, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6], t[7]),
                   STA_ERR_DTYPE);
  assert_string_equal(sta_last_error(),
                      "backward: dtype f32 not supported on cuda (use bf16 or f16)");
  for (int i = 0; i < 8; i++) sta_tensor_destroy(t[i]);
  sta_tensor_destroy(lse);
}

int main(void) {
  sta_test_begin(2654435761ull, 88172645463325252ull);
  sta_test_kernel_settings();
  if (!sta_backend_available(STA_CUDA))
    printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_fixed),
      cmocka_unit_test(test_random_geometries),
      cmocka_unit_test(test_tiled_order),
      cmocka_unit_test(test_deterministic),
      cmocka_unit_test(test_nonfinite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
