/* test_gpu_attention.c -- the CUDA backend against the CPU: STA forward on
** many fresh random geometries (odd canvases, partial tiles, non-default
** tiles, border and whole-axis windows, text with padding rows, per-head
** windows, BSHD/BHSD and strided views, batch, D 64/128, bf16/f16, LSE,
** the untiled and FastVideo's tiled token order with NaN in its padding);
** the wave gate; which kernel a call launches; head_diff, device
** copy/fill, and the dtype refusal (the error against float64:
** test_gpu_accuracy.c).  Skips cleanly when no CUDA device answers.
** STA_TEST_SEED fixes the seed; STA_GPU_CASES the number of random
** geometries (default 150); STA_GPU_QUICK skips the large fixed cases (for
** compute-sanitizer). */
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
#include "gpu_case.h"
#include "gpu_hooks.h"

/* A [B,S,H,D] or [B,H,S,D] device tensor of dtype whose storage is
** contiguous in layout (order 0) or in the other layout, permuted (order
** 1); base keeps the storage. */
typedef struct dev4 {
  sta_tensor *base, *view;
} dev4;

static void dev4_make(dev4 *x, sta_dtype dt, sta_device dev, sta_layout layout, int order,
                      int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int store_bshd = (layout == STA_BSHD) != (order == 1);
  int64_t shape[4] = {B, store_bshd ? S : H, store_bshd ? H : S, D};
  memset(x, 0, sizeof *x);
  assert_int_equal(sta_tensor_create(&x->base, dt, dev, 4, shape), STA_OK);
  if (order == 1)
    assert_int_equal(sta_tensor_permute(&x->view, x->base, swap), STA_OK);
  else
    assert_int_equal(sta_tensor_narrow(&x->view, x->base, 3, 0, D), STA_OK);
}

static void dev4_free(dev4 *x) {
  sta_tensor_destroy(x->view);
  sta_tensor_destroy(x->base);
}

static void describe(const gcase *c, char *buf, size_t n) {
  snprintf(buf, n,
           "canvas %dx%dx%d tile %dx%dx%d text %lld/%lld B%lld H%lld D%lld %s %s order %d "
           "%s lse %d windows(%d) %d,%d,%d scale %g seed %llu",
           c->canvas[0], c->canvas[1], c->canvas[2], c->tile[0], c->tile[1], c->tile[2],
           (long long)c->text, (long long)c->text_len, (long long)c->B, (long long)c->H,
           (long long)c->D, sta_dtype_name(c->dtype), c->layout == STA_BSHD ? "BSHD" : "BHSD",
           c->order, c->tiled ? "tiled" : "untiled", c->lse, c->n_windows, c->windows[0], c->windows[1], c->windows[2],
           (double)c->scale, (unsigned long long)c->seed);
}

/* lse a (device) against b (host): within 1e-3, and -inf exactly where b
** is (the tiled order's padding rows). */
static void lse_close(const char *what, const sta_tensor *a, const sta_tensor *b) {
  sta_tensor *h = NULL;
  assert_int_equal(sta_tensor_to(&h, a, STA_F32, STA_CPU), STA_OK);
  const float *x = sta_tensor_data(h), *y = sta_tensor_data(b);
  for (int64_t i = 0; i < sta_tensor_numel(h); i++)
    if (x[i] != y[i] && !(fabsf(x[i] - y[i]) < 1e-3f))
      fail_msg("%s: lse[%lld] = %g, CPU %g", what, (long long)i, (double)x[i], (double)y[i]);
  sta_tensor_destroy(h);
}

/* GPU forward vs CPU forward on f32 copies of the same (rounded) inputs;
** tiled order: NaN in the padding rows of q, k, v. */
static void run_case(const gcase *c, double *worst) {
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
  d.scale = c->scale;
  d.geom.order = c->tiled ? STA_ORDER_TILED : STA_ORDER_UNTILED;
  int64_t S = sta_geometry_video_rows(&d.geom) + c->text;

  /* host inputs in the device dtype (so both sides see the same values) */
  dev4 hq, hk, hv, q, k, v, o;
  dev4_make(&hq, c->dtype, STA_CPU, c->layout, 0, c->B, S, c->H, c->D);
  dev4_make(&hk, c->dtype, STA_CPU, c->layout, 0, c->B, S, c->H, c->D);
  dev4_make(&hv, c->dtype, STA_CPU, c->layout, 0, c->B, S, c->H, c->D);
  assert_int_equal(sta_tensor_randn(hq.view, c->seed * 3 + 0, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(hk.view, c->seed * 3 + 1, 0.0, 1.0), STA_OK);
  assert_int_equal(sta_tensor_randn(hv.view, c->seed * 3 + 2, 0.3, 1.0), STA_OK);
  if (c->tiled) {
    sta_test_fill_pad(hq.view, &d.geom, c->layout, NAN);
    sta_test_fill_pad(hk.view, &d.geom, c->layout, NAN);
    sta_test_fill_pad(hv.view, &d.geom, c->layout, NAN);
  }
  dev4_make(&q, c->dtype, STA_CUDA, c->layout, c->order, c->B, S, c->H, c->D);
  dev4_make(&k, c->dtype, STA_CUDA, c->layout, c->order, c->B, S, c->H, c->D);
  dev4_make(&v, c->dtype, STA_CUDA, c->layout, 1 - c->order, c->B, S, c->H, c->D);
  dev4_make(&o, c->dtype, STA_CUDA, c->layout, c->order, c->B, S, c->H, c->D);
  assert_int_equal(sta_tensor_copy(q.view, hq.view), STA_OK);
  assert_int_equal(sta_tensor_copy(k.view, hk.view), STA_OK);
  assert_int_equal(sta_tensor_copy(v.view, hv.view), STA_OK);
  assert_int_equal(sta_tensor_fill(o.base, NAN), STA_OK); /* poison */
  sta_tensor *lse = NULL;
  int64_t lshape[3] = {c->B, c->H, S};
  if (c->lse) {
    assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CUDA, 3, lshape), STA_OK);
    assert_int_equal(sta_tensor_fill(lse, NAN), STA_OK);
  }
  sta_status rc = sta_attention_forward(&d, q.view, k.view, v.view, o.view, lse);
  if (rc != STA_OK) fail_msg("%s: forward failed: %s", what, sta_last_error());
  assert_int_equal(sta_cuda_synchronize(), STA_OK);

  /* CPU on f32 copies */
  sta_tensor *fq = NULL, *fk = NULL, *fv = NULL, *fo = NULL, *fl = NULL;
  assert_int_equal(sta_tensor_to(&fq, hq.view, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&fk, hk.view, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&fv, hv.view, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_create(&fo, STA_F32, STA_CPU, 4, fq->shape), STA_OK);
  assert_int_equal(sta_tensor_create(&fl, STA_F32, STA_CPU, 3, lshape), STA_OK);
  assert_int_equal(sta_attention_forward(&d, fq, fk, fv, fo, fl), STA_OK);

  double mx, rel;
  assert_int_equal(sta_tensor_compare(o.view, fo, &mx, &rel), STA_OK);
  double tol = c->dtype == STA_BF16 ? 1e-2 : 2e-3;
  if (!(rel < tol)) fail_msg("%s: rel L2 %g (tol %g), max %g", what, rel, tol, mx);
  if (rel > *worst) *worst = rel;
  if (c->lse && c->tiled) lse_close(what, lse, fl);
  else if (c->lse) {
    assert_int_equal(sta_tensor_compare(lse, fl, &mx, &rel), STA_OK);
    if (!(mx < 1e-3)) fail_msg("%s: lse max err %g rel %g", what, mx, rel);
  }
  sta_tensor_destroy(fq); sta_tensor_destroy(fk); sta_tensor_destroy(fv);
  sta_tensor_destroy(fo); sta_tensor_destroy(fl); sta_tensor_destroy(lse);
  dev4_free(&hq); dev4_free(&hk); dev4_free(&hv);
  dev4_free(&q); dev4_free(&k); dev4_free(&v); dev4_free(&o);
}

/* ---- fixed cases -------------------------------------------------------- */

static void test_default_tiles(void **state) {
  NEED_GPU();
  if (getenv("STA_GPU_QUICK")) skip(); /* sanitizer runs */
  double worst = 0;
  gcase c;
  case_init(&c, 18, 24, 32); /* 3x3x4 full tiles */
  c.text = 70; c.text_len = 50;
  run_case(&c, &worst);
  c.windows[0] = 1; c.windows[1] = 3; c.windows[2] = 5; c.seed = 2; c.D = 64;
  run_case(&c, &worst);
  c.windows[0] = 5; c.windows[1] = 5; c.windows[2] = 7; c.seed = 3; c.dtype = STA_F16;
  run_case(&c, &worst); /* whole axes */
  printf("# default tiles: worst rel L2 %.3e\n", worst);
}

/* D 64 on 6x8x8 tiles with text (the TMA paths and the default kernel's
** 192-row items): small enough for the sanitizer runs, so not skipped by
** STA_GPU_QUICK. */
static void test_d64_tiles(void **state) {
  NEED_GPU();
  double worst = 0;
  gcase c;
  case_init(&c, 12, 16, 20); /* 2x2x3 tiles, the last w tile partial */
  c.D = 64;
  c.text = 45; c.text_len = 40;
  c.seed = 21;
  run_case(&c, &worst);
  c.dtype = STA_F16; c.windows[2] = 1; c.seed = 22;
  run_case(&c, &worst);
  printf("# d64 tiles: worst rel L2 %.3e\n", worst);
}

/* Scores far wider than randn's at the default scale (scale 0.5 and 1 on
** D 128 and 64: the running row maximum still jumps by more than the
** kernels' rescale threshold, 8 in the exp2 domain, after the first key
** blocks), so the output is rescaled in the middle of an item; on 6x8x8
** tiles with text (the default kernels' TMA paths), bf16 and f16. */
static void test_large_scores(void **state) {
  NEED_GPU();
  double worst = 0;
  gcase c;
  case_init(&c, 12, 16, 24); /* 2x2x3 tiles: windows 3,3,3 see every key */
  c.text = 40; c.text_len = 40;
  for (int i = 0; i < 4; i++) {
    c.scale = i & 1 ? 1.0f : 0.5f;
    c.D = i & 2 ? 64 : 128;
    c.dtype = i == 3 ? STA_F16 : STA_BF16;
    c.seed = 40 + (uint64_t)i;
    run_case(&c, &worst);
  }
  printf("# large scores: worst rel L2 %.3e\n", worst);
}

static void test_layouts(void **state) {
  NEED_GPU();
  double worst = 0;
  gcase c;
  case_init(&c, 7, 13, 17);
  c.tile[0] = 2; c.tile[1] = 4; c.tile[2] = 8;
  c.text = 33;
  for (int i = 0; i < 4; i++) {
    c.layout = (i & 1) ? STA_BHSD : STA_BSHD;
    c.order = i >> 1;
    c.B = 2;
    c.seed = 10 + i;
    run_case(&c, &worst);
  }
  printf("# layouts: worst rel L2 %.3e\n", worst);
}

/* ---- random geometries (random_case: gpu_case.h) ------------------------- */

static void test_random_geometries(void **state) {
  NEED_GPU();
  const char *ns = getenv("STA_GPU_CASES");
  int n = ns ? atoi(ns) : 150;
  double worst = 0;
  for (int i = 0; i < n; i++) {
    gcase c;
    random_case(&c);
    run_case(&c, &worst);
  }
  printf("# %d random geometries: worst rel L2 %.3e\n", n, worst);
}

/* FastVideo's tiled token order read in place: whole 6x8x8
** tiles take the default kernels' row-map paths (D 128: Wide, D 64: Tall;
** variant 9: the 128 x 128 kernel with every load by TMA, 2: one CTA per
** item; sta_cuda_set_variant_test), whole 2x8x8 tiles the 128 x 128 kernel's, partial tiles
** and other tiles the gather (the padding rows, NaN in q, k, v, are never
** keys; out 0 and lse -inf there). */
static void test_tiled_order(void **state) {
  NEED_GPU();
  double worst = 0;
  gcase c;
  case_init(&c, 18, 24, 32); /* 3x3x4 whole tiles: Wide */
  c.tiled = 1; c.text = 70; c.text_len = 50;
  run_case(&c, &worst);
  c.D = 64; c.seed = 2; c.windows[2] = 1; /* Tall */
  run_case(&c, &worst);
  c.D = 128; c.dtype = STA_F16; c.layout = STA_BHSD; c.order = 1; c.B = 2; c.seed = 3;
  run_case(&c, &worst);
  static const int32_t variants[] = {9, 2};
  const int32_t was = sta_cuda_variant_test(); /* make test-gpu sets it per run */
  for (int i = 0; i < 2; i++) {
    sta_cuda_set_variant_test(variants[i]);
    case_init(&c, 12, 16, 24);
    c.tiled = 1; c.text = 33; c.seed = 4 + (uint64_t)i; c.D = i ? 64 : 128;
    run_case(&c, &worst);
  }
  sta_cuda_set_variant_test(was);
  case_init(&c, 6, 16, 16); /* 2x8x8 whole tiles: 128 x 128 */
  c.tile[0] = 2; c.tiled = 1; c.text = 9; c.seed = 6;
  run_case(&c, &worst);
  case_init(&c, 13, 21, 19); /* partial 6x8x8 tiles: padding rows, gathered */
  c.tiled = 1; c.text = 40; c.text_len = 31; c.H = 3; c.n_windows = 3;
  int32_t w[9] = {1, 3, 3, 3, 1, 1, 3, 3, 5};
  memcpy(c.windows, w, sizeof w);
  c.seed = 7;
  run_case(&c, &worst);
  c.D = 64; c.lse = 1; c.seed = 8;
  run_case(&c, &worst);
  case_init(&c, 7, 9, 11); /* 3x4x5 tiles */
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 5; c.tiled = 1; c.text = 5; c.seed = 9;
  run_case(&c, &worst);
  const int nr = getenv("STA_GPU_QUICK") ? 3 : 20; /* racecheck: 20 took minutes */
  for (int i = 0; i < nr; i++) {
    random_case(&c);
    c.tiled = 1;
    run_case(&c, &worst);
  }
  printf("# tiled order: worst rel L2 %.3e\n", worst);
}

/* ---- the wave gate ------------------------------------------------------
** kernels/tile_scheduler.cuh: the persistent forward holds an item's keys
** until the waves before its own have issued their loads.  It applies to
** items of 16 MB of K and V and more, which no geometry of a test reaches,
** so the tests' hook (sta_cuda_set_wave_gate_test, backend.h) lowers the
** threshold to 1 byte (every item past the first wave waits) or turns the
** gate off; the gate must change no bit of out or lse, and the gated
** output must match the CPU's.  Geometries with more items than SMs (the
** gate waits from the second wave on) for each kernel whose producer
** takes the gate (Wide, Tall, Square with every load by TMA), per-head
** windows of whole and partial canvases, text with padding rows, the
** untiled order with batch 1 and the tiled order with batch 2; the
** gathering Square kernel never gates. */

/* out and lse of c's forward (fresh randn q, k, v of seed c->seed) on the
** GPU, as host copies; the launch's line in line (n bytes) */
static void gate_forward(const gcase *c, sta_tensor **ho, sta_tensor **hl, char *line,
                         size_t n) {
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(d.geom.tile, c->tile, sizeof c->tile);
  d.geom.text_len = c->text_len;
  d.geom.order = c->tiled ? STA_ORDER_TILED : STA_ORDER_UNTILED;
  d.layout = STA_BSHD;
  d.n_windows = c->n_windows;
  d.windows = c->windows;
  int64_t S = sta_geometry_video_rows(&d.geom) + c->text;
  int64_t shape[4] = {c->B, S, c->H, c->D}, lshape[3] = {c->B, c->H, S};
  sta_tensor *t[4] = {NULL, NULL, NULL, NULL}, *lse = NULL;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sta_tensor_create(&t[i], c->dtype, STA_CUDA, 4, shape), STA_OK);
    if (i < 3) assert_int_equal(sta_tensor_randn(t[i], c->seed * 3 + (uint64_t)i, 0.0, 1.0), STA_OK);
  }
  assert_int_equal(sta_tensor_fill(t[3], NAN), STA_OK);
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CUDA, 3, lshape), STA_OK);
  assert_int_equal(sta_tensor_fill(lse, NAN), STA_OK);
  if (sta_attention_forward(&d, t[0], t[1], t[2], t[3], lse) != STA_OK)
    fail_msg("gate forward: %s", sta_last_error());
  snprintf(line, n, "%s", sta_cuda_last_launch());
  assert_int_equal(sta_tensor_to(ho, t[3], c->dtype, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(hl, lse, STA_F32, STA_CPU), STA_OK);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(t[i]);
  sta_tensor_destroy(lse);
}

static void test_wave_gate(void **state) {
  NEED_GPU();
  const sta_test_kernels was = sta_test_kernels_default(); /* test-gpu's passes set them */
  const int quick = getenv("STA_GPU_QUICK") != NULL;
  gcase c[5];
  const char *kern[5] = {"Wide<bf16", "Wide<bf16", "Tall<f16", "Square<bf16", "Square<f16"};
  case_init(&c[0], 12, 32, 48); /* 2x4x6 tiles: 145 items a head */
  c[0].H = 3; c[0].text = 70; c[0].text_len = 50; c[0].seed = 61;
  c[0].n_windows = 3;
  const int32_t w[9] = {2, 4, 6, 1, 3, 3, 3, 5, 7};
  memcpy(c[0].windows, w, sizeof w);
  c[1] = c[0]; /* the tiled order, batch 2, whole windows */
  c[1].tiled = 1; c[1].B = 2; c[1].H = 2; c[1].n_windows = 1; c[1].seed = 62;
  c[2] = c[0]; /* D 64: 192-row items, 97 a head */
  c[2].D = 64; c[2].dtype = STA_F16; c[2].seed = 63;
  c[3] = c[0]; /* tile depth 4: the 128 x 128 kernel, every load by TMA */
  c[3].tile[0] = 4; c[3].seed = 64;
  const int32_t w3[9] = {3, 5, 6, 1, 3, 3, 3, 5, 7}; /* valid on 3x4x6 and 3x8x6 tiles */
  memcpy(c[3].windows, w3, sizeof w3);
  c[4] = c[3]; /* 4x4x8 tiles: the gather, no gate */
  c[4].tile[1] = 4; c[4].dtype = STA_F16; c[4].seed = 65;
  double worst = 0;
  for (int g = 0; g < 5; g++) {
    if (quick && (g == 1 || g == 4)) continue; /* sanitizer runs */
    const int gated = g < 4;
    sta_tensor *o[3], *l[3];
    char line[3][512];
    static const int64_t how[3] = {1, -1, 0}; /* every item, none, the default */
    for (int i = 0; i < 3; i++) {
      sta_cuda_set_wave_gate_test(how[i]);
      gate_forward(&c[g], &o[i], &l[i], line[i], sizeof line[i]);
    }
    sta_cuda_set_wave_gate_test(0);
    printf("# wave gate, geometry %d: %s\n", g, line[0]);
    if (!strstr(line[0], kern[g]) || !strstr(line[0], "persistent"))
      fail_msg("geometry %d: not %s, persistent: %s", g, kern[g], line[0]);
    if (gated != (strstr(line[0], "wave gate from 1 key blocks") != NULL))
      fail_msg("geometry %d: the gate %s: %s", g, gated ? "is off" : "is on", line[0]);
    if (strstr(line[1], "wave gate") || strstr(line[2], "wave gate")) /* below 16 MB */
      fail_msg("geometry %d: gated without the hook: %s / %s", g, line[1], line[2]);
    sta_tensor *f = NULL; /* every row written (no NaN left), not zeros */
    assert_int_equal(sta_tensor_to(&f, o[0], STA_F32, STA_CPU), STA_OK);
    const float *x = sta_tensor_data(f);
    double sum = 0;
    for (int64_t i = 0; i < sta_tensor_numel(f); i++) {
      if (!isfinite(x[i])) fail_msg("geometry %d: out[%lld] = %g", g, (long long)i, (double)x[i]);
      sum += fabs(x[i]);
    }
    assert_true(sum > 0);
    sta_tensor_destroy(f);
    const size_t on = (size_t)sta_tensor_numel(o[0]) * 2, ln = (size_t)sta_tensor_numel(l[0]) * 4;
    for (int i = 1; i < 3; i++) {
      if (memcmp(sta_tensor_data(o[i]), sta_tensor_data(o[0]), on))
        fail_msg("geometry %d: out gated and %s differ", g, i == 1 ? "ungated" : "default");
      if (memcmp(sta_tensor_data(l[i]), sta_tensor_data(l[0]), ln))
        fail_msg("geometry %d: lse gated and %s differ", g, i == 1 ? "ungated" : "default");
    }
    for (int i = 0; i < 3; i++) {
      sta_tensor_destroy(o[i]);
      sta_tensor_destroy(l[i]);
    }
    sta_cuda_set_wave_gate_test(1); /* gated, against the CPU */
    run_case(&c[g], &worst);
    sta_cuda_set_wave_gate_test(0);
  }
  sta_test_kernels_put(was);
  printf("# wave gate: bit-identical gated, ungated and by default; worst rel L2 %.3e\n", worst);
}

/* ---- head_diff, copy/fill, refusal ---------------------------------------- */

static void test_head_diff(void **state) {
  NEED_GPU();
  for (int rep = 0; rep < 4; rep++) {
    int64_t B = sta_test_rint(1, 2), S = sta_test_rint(1, 5000), H = sta_test_rint(1, 5), D = rep % 2 ? 64 : 128;
    sta_layout layout = rep < 2 ? STA_BSHD : STA_BHSD;
    sta_dtype dt = rep == 3 ? STA_F16 : STA_BF16;
    dev4 ha, hb, a, b;
    dev4_make(&ha, dt, STA_CPU, layout, 0, B, S, H, D);
    dev4_make(&hb, dt, STA_CPU, layout, 0, B, S, H, D);
    assert_int_equal(sta_tensor_randn(ha.view, sta_test_rnd(), 0.0, 1.0), STA_OK);
    assert_int_equal(sta_tensor_randn(hb.view, sta_test_rnd(), 0.1, 0.5), STA_OK);
    dev4_make(&a, dt, STA_CUDA, layout, rep & 1, B, S, H, D);
    dev4_make(&b, dt, STA_CUDA, layout, 0, B, S, H, D);
    assert_int_equal(sta_tensor_copy(a.view, ha.view), STA_OK);
    assert_int_equal(sta_tensor_copy(b.view, hb.view), STA_OK);
    float g1[8], g2[8], c1[8], c2[8];
    assert_int_equal(sta_head_diff(a.view, b.view, layout, g1, g2), STA_OK);
    assert_int_equal(sta_head_diff(ha.view, hb.view, layout, c1, c2), STA_OK);
    for (int64_t h = 0; h < H; h++) {
      if (!(fabsf(g1[h] - c1[h]) <= 1e-4f * fabsf(c1[h]) + 1e-7f) ||
          !(fabsf(g2[h] - c2[h]) <= 1e-4f * fabsf(c2[h]) + 1e-7f))
        fail_msg("head_diff head %lld: gpu %g %g cpu %g %g", (long long)h, (double)g1[h],
                 (double)g2[h], (double)c1[h], (double)c2[h]);
    }
    dev4_free(&ha); dev4_free(&hb); dev4_free(&a); dev4_free(&b);
  }
}

static void test_copy_fill(void **state) {
  NEED_GPU();
  int64_t shape[4] = {2, 37, 3, 24};
  sta_tensor *h = NULL, *d32 = NULL, *dbf = NULL, *back = NULL, *hbf = NULL;
  assert_int_equal(sta_tensor_create(&h, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(h, 99, 0.0, 3.0), STA_OK);
  /* f32 device -> strided bf16 device (conversion on the GPU) -> host */
  assert_int_equal(sta_tensor_to(&d32, h, STA_F32, STA_CUDA), STA_OK);
  dev4 p;
  dev4_make(&p, STA_BF16, STA_CUDA, STA_BSHD, 1, 2, 37, 3, 24);
  assert_int_equal(sta_tensor_copy(p.view, d32), STA_OK);
  assert_int_equal(sta_tensor_to(&back, p.view, STA_BF16, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&hbf, h, STA_BF16, STA_CPU), STA_OK);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(back, hbf, &mx, &rel), STA_OK);
  assert_true(mx == 0.0); /* same rounding as the host */
  assert_int_equal(sta_tensor_fill(p.view, 1.5), STA_OK);
  assert_int_equal(sta_tensor_copy(back, p.view), STA_OK);
  int64_t idx[4] = {1, 36, 2, 23};
  double val = 0;
  assert_int_equal(sta_tensor_get(back, idx, &val), STA_OK);
  assert_true(val == 1.5);
  sta_tensor_destroy(h); sta_tensor_destroy(d32); sta_tensor_destroy(dbf);
  sta_tensor_destroy(back); sta_tensor_destroy(hbf);
  dev4_free(&p);
  /* same dtype, permuted source: D 24 takes the 16-byte row path, D 25 the
  ** element path; both bitwise equal to the host's permuted copy */
  for (int64_t dd = 24; dd <= 25; dd++) {
    int64_t s2[4] = {2, 37, 3, dd}, s3[4] = {2, 3, 37, dd};
    int32_t perm[4] = {0, 2, 1, 3};
    sta_tensor *hs = NULL, *ds = NULL, *dq = NULL, *dp = NULL, *hp = NULL, *hb = NULL;
    assert_int_equal(sta_tensor_create(&hs, STA_BF16, STA_CPU, 4, s2), STA_OK);
    assert_int_equal(sta_tensor_randn(hs, 100 + (uint64_t)dd, 0.0, 1.0), STA_OK);
    assert_int_equal(sta_tensor_to(&ds, hs, STA_BF16, STA_CUDA), STA_OK);
    assert_int_equal(sta_tensor_permute(&dq, ds, perm), STA_OK);
    assert_int_equal(sta_tensor_create(&dp, STA_BF16, STA_CUDA, 4, s3), STA_OK);
    assert_int_equal(sta_tensor_copy(dp, dq), STA_OK);
    assert_int_equal(sta_tensor_to(&hb, dp, STA_BF16, STA_CPU), STA_OK);
    assert_int_equal(sta_tensor_permute(&hp, hs, perm), STA_OK);
    assert_int_equal(sta_tensor_compare(hb, hp, &mx, &rel), STA_OK);
    assert_true(mx == 0.0);
    sta_tensor_destroy(hs); sta_tensor_destroy(ds); sta_tensor_destroy(dq);
    sta_tensor_destroy(dp); sta_tensor_destroy(hp); sta_tensor_destroy(hb);
  }
}

static void test_f32_refused(void **state) {
  NEED_GPU();
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 6, 8, 8);
  int32_t w[3] = {1, 1, 1};
  d.n_windows = 1;
  d.windows = w;
  dev4 q, o;
  dev4_make(&q, STA_F32, STA_CUDA, STA_BSHD, 0, 1, 384, 1, 64);
  dev4_make(&o, STA_F32, STA_CUDA, STA_BSHD, 0, 1, 384, 1, 64);
  assert_int_equal(sta_tensor_fill(q.view, 0.25), STA_OK);
  assert_int_equal(sta_tensor_fill(o.view, 7.0), STA_OK);
  assert_int_equal(sta_attention_forward(&d, q.view, q.view, q.view, o.view, NULL),
                   STA_ERR_DTYPE);
  assert_non_null(strstr(sta_last_error(), "f32"));
  sta_tensor *h = NULL;
  assert_int_equal(sta_tensor_to(&h, o.view, STA_F32, STA_CPU), STA_OK);
  int64_t idx[4] = {0, 100, 0, 5};
  double val = 0;
  assert_int_equal(sta_tensor_get(h, idx, &val), STA_OK);
  assert_true(val == 7.0); /* out unchanged */
  sta_tensor_destroy(h);
  dev4_free(&q); dev4_free(&o);
}

/* ---- which kernel a call launches (sta_cuda_last_launch) ---------------- */

/* A device tensor [1, S, H, D] of bf16 randn (seed), a view of a base of
** row pitch D + pad (pad 0: contiguous) starting at element off. */
static sta_tensor *dev_randn(int64_t S, int64_t H, int64_t D, int64_t pad, int64_t off,
                             uint64_t seed, sta_tensor **base) {
  int64_t shape[4] = {1, S, H, D + pad};
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_create(base, STA_BF16, STA_CUDA, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_narrow(&v, *base, 3, off, D), STA_OK);
  assert_int_equal(sta_tensor_randn(v, seed, 0.0, 1.0), STA_OK);
  return v;
}

/* The kernel line of sta_attention_forward on (q, k, v) into o with one
** window of 3, 3, 3, in line (n bytes). */
static void bare_launch(const sta_geometry *g, sta_tensor *q, sta_tensor *k, sta_tensor *v,
                        sta_tensor *o, char *line, size_t n) {
  sta_attention_desc d;
  int32_t w[3] = {3, 3, 3};
  memset(&d, 0, sizeof d);
  d.geom = *g;
  d.n_windows = 1;
  d.windows = w;
  if (sta_attention_forward(&d, q, k, v, o, NULL) != STA_OK)
    fail_msg("forward: %s", sta_last_error());
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  snprintf(line, n, "%s", sta_cuda_last_launch());
}

/* The line of one call must hold each of want[] (NULL-terminated) and, if
** not NULL, lack miss. */
static void launch_has(const char *what, const char *line, const char *const *want,
                       const char *miss) {
  printf("# %s: %s\n", what, line);
  for (int i = 0; want[i]; i++)
    if (!strstr(line, want[i])) fail_msg("%s: no \"%s\" in \"%s\"", what, want[i], line);
  if (miss && strstr(line, miss)) fail_msg("%s: \"%s\" in \"%s\"", what, miss, line);
}

/* The pipeline's call (examples/pipeline.lua: one tensor as q, k and v, per
** head windows from a forward context's metadata, through a layer) takes
** the same kernel, loads, tensor maps and items as the bare forward on
** separate q, k, v (bench_gpu.py's call): Wide, every load by TMA; the same
** output bit for bit.  D 64 takes Tall.  No TMA, rows 8 bytes off
** 16-byte alignment and a tile depth of 4 fall back, naming why. */
static void test_kernel_choice(void **state) {
  NEED_GPU();
  const sta_test_kernels was = sta_test_kernels_default(); /* test-gpu's passes set them */
  const int64_t H = 3, D = 128, T = 40;
  sta_geometry g;
  sta_geometry_init(&g, 12, 16, 24);
  g.text_len = T;
  const int64_t S = sta_geometry_video_rows(&g) + T;
  sta_tensor *bq, *bk, *bv, *bx, *bo1, *bo2;
  sta_tensor *q = dev_randn(S, H, D, 0, 0, 11, &bq), *k = dev_randn(S, H, D, 0, 0, 12, &bk);
  sta_tensor *v = dev_randn(S, H, D, 0, 0, 13, &bv), *x = dev_randn(S, H, D, 0, 0, 14, &bx);
  sta_tensor *o1 = dev_randn(S, H, D, 0, 0, 15, &bo1), *o2 = dev_randn(S, H, D, 0, 0, 16, &bo2);
  char bare[512], lay[512], line[512];
  bare_launch(&g, q, k, v, o1, bare, sizeof bare);
  const char *const wide[] = {"Wide<bf16, D 128>", "persistent", "loads by TMA;",
                              "K/V tiles yes, Q tiles yes, rows yes, 192-row yes", NULL};
  launch_has("bare q, k, v", bare, wide, "left out");

  /* the pipeline's call */
  sta_strategy *st = NULL;
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  sta_layer *l = NULL;
  sta_context *ctx = NULL;
  int32_t w[3] = {3, 3, 3};
  assert_int_equal(sta_strategy_uniform(&st, 1, 1, (int32_t)H, w, NULL, 0), STA_OK);
  assert_int_equal(sta_metadata_from_strategy(&md, st, 0, 1, (int32_t)H), STA_OK);
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = (int32_t)H;
  ld.head_dim = (int32_t)D;
  ld.sp_size = 1;
  ld.geom = g;
  ld.backend = STA_CUDA;
  assert_int_equal(sta_layer_create(&l, &ld), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 0, md, fb), STA_OK);
  if (sta_layer_forward(l, x, x, x, o2) != STA_OK) fail_msg("layer: %s", sta_last_error());
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  snprintf(lay, sizeof lay, "%s", sta_cuda_last_launch());
  printf("# layer x, x, x: %s\n", lay);
  assert_string_equal(lay, bare);
  bare_launch(&g, x, x, x, o1, line, sizeof line);
  assert_string_equal(line, bare);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(o1, o2, &mx, &rel), STA_OK);
  assert_true(mx == 0.0);
  sta_layer_destroy(l);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(md);
  sta_strategy_destroy(st);

  /* fallbacks, each naming its reason */
  sta_cuda_set_tma_test(STA_TEST_NO_TMA);
  bare_launch(&g, q, k, v, o1, line, sizeof line);
  sta_cuda_set_tma_test(0);
  const char *const notma[] = {"Square<bf16, D 128>", "TMA and the cp.async gather",
                               "K/V tiles no", "left out: off by the tests' setting (no TMA)",
                               NULL};
  launch_has("no TMA", line, notma, NULL);
  sta_tensor *bm, *m = dev_randn(S, H, D, 4, 4, 17, &bm); /* rows 8 bytes off */
  bare_launch(&g, m, k, v, o1, line, sizeof line);
  const char *const unal[] = {"Square<bf16, D 128>", "not a multiple of 16 bytes", NULL};
  launch_has("misaligned q", line, unal, NULL);
  sta_geometry g4 = g;
  g4.tile[0] = 4;
  bare_launch(&g4, q, k, v, o1, line, sizeof line);
  const char *const by4[] = {"Square<bf16, D 128>", "loads by TMA;", "K/V tiles yes",
                             "left out: tile depth not a multiple of 3", NULL};
  launch_has("tile depth 4", line, by4, NULL);
  sta_tensor *b6[4], *t6[4];
  for (int i = 0; i < 4; i++) t6[i] = dev_randn(S, 2 * H, 64, 0, 0, 20 + (uint64_t)i, &b6[i]);
  bare_launch(&g, t6[0], t6[1], t6[2], t6[3], line, sizeof line);
  const char *const tall[] = {"Tall<bf16, D 64>", "loads by TMA;", NULL};
  launch_has("D 64", line, tall, "left out");
  for (int i = 0; i < 4; i++) { sta_tensor_destroy(t6[i]); sta_tensor_destroy(b6[i]); }
  sta_tensor *all[] = {q, k, v, x, o1, o2, m, bq, bk, bv, bx, bo1, bo2, bm};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
  sta_test_kernels_put(was);
}

int main(void) {
  sta_test_begin(0x9e3779b97f4a7c15ull, 1);
  sta_test_kernel_settings();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_copy_fill),       cmocka_unit_test(test_f32_refused),
      cmocka_unit_test(test_default_tiles),   cmocka_unit_test(test_d64_tiles),
      cmocka_unit_test(test_layouts),         cmocka_unit_test(test_large_scores),
      cmocka_unit_test(test_random_geometries), cmocka_unit_test(test_tiled_order),
      cmocka_unit_test(test_wave_gate),
      cmocka_unit_test(test_head_diff),       cmocka_unit_test(test_kernel_choice),
  };
  return cmocka_run_group_tests(tests, gpu_setup, NULL);
}
