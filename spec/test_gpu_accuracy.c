/* test_gpu_accuracy.c -- the CUDA forward's error against the float64
** reference, on randn, peaked and outlier-channel inputs, for both softmax
** modes, held against an emulation of what a bf16/f16 attention kernel must
** round (below).  STA_ACC_CASES geometries per input distribution (default
** 6); skipped under STA_GPU_QUICK (compute-sanitizer: the CPU reference is
** slow there).  Skips cleanly when no CUDA device answers.  STA_TEST_SEED
** fixes the seed. */
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

/* ---- accuracy against float64 ----------------------------------------------
** The GPU's bf16/f16 output against the exact result: the CPU's float64
** reference (sta_attention_reference) on the same rounded inputs.  The
** yardstick is what a careful bf16/f16 attention kernel must round: P is
** rounded to the dtype before the P V product (FlexAttention's Triton
** kernel and FlashAttention do that; the row sums use the unrounded P) and
** the output is rounded once more.  emulate() computes exactly that in
** double, so its error against the reference is the floor any such kernel
** sits on; the output's own rounding (the reference rounded to the dtype)
** is printed beside it.  Inputs: randn; peaked rows as FastVideo's kernel
** tests draw them (each row of Q, K, V a random direction scaled to a norm
** drawn from N(0.1, 10)) and a wider N(0.1, 20); randn with four outlier
** channels of Q and K eight times larger.  The margin, per distribution
** over all its geometries (errors summed: a single small case's error is
** too noisy to compare at a few percent): the default (exact) softmax's
** relative L2 error at most 1.10 times the emulation's (the two differ only
** in where P is rounded, the running or the final row maximum: statistically
** the same, measured within a few percent), and its largest error at most
** the emulation's largest plus half a unit in the last place of the largest
** output (the outputs are quantised: one more ulp at the top is a real
** loss).  STA_SOFTMAX_FAST is checked against a wider bound (2 times, and 2
** ulps; its documented cost is up to twice the max error on peaked rows),
** and both are printed. */

enum { DIST_RANDN, DIST_PEAK10, DIST_PEAK20, DIST_OUTLIER, NDIST };
static const char *const DIST_NAME[NDIST] = {"randn", "peaked N(0.1,10)", "peaked N(0.1,20)",
                                             "outlier channels"};

/* Host f32 [B, S, H, D] contiguous, drawn from distribution dist. */
static sta_tensor *acc_input(int dist, int which, uint64_t seed, int64_t B, int64_t S,
                             int64_t H, int64_t D) {
  int64_t shape[4] = {B, S, H, D};
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed, 0.0, 1.0), STA_OK);
  float *x = sta_tensor_data(t);
  int64_t rows = B * S * H;
  if (dist == DIST_PEAK10 || dist == DIST_PEAK20) {
    double sd = dist == DIST_PEAK10 ? 10.0 : 20.0;
    for (int64_t r = 0; r < rows; r++) {
      double n2 = 0;
      for (int64_t i = 0; i < D; i++) n2 += (double)x[r * D + i] * x[r * D + i];
      double norm = 0.1 + sd * sta_randn_at(seed ^ 0x5eedu, (uint64_t)r);
      double f = n2 > 0 ? norm / sqrt(n2) : 0;
      for (int64_t i = 0; i < D; i++) x[r * D + i] = (float)(x[r * D + i] * f);
    }
  } else if (dist == DIST_OUTLIER && which < 2) { /* q and k */
    static const int ch[4] = {3, 17, 40, 61};
    for (int64_t r = 0; r < rows; r++)
      for (int c = 0; c < 4; c++) x[r * D + ch[c] % D] *= 8.0f;
  }
  return t;
}

static float round_to(float x, sta_dtype dt) {
  return dt == STA_BF16 ? sta_bf16_to_f32(sta_f32_to_bf16(x)) : sta_f16_to_f32(sta_f32_to_f16(x));
}

/* Attention of f32 [B, S, H, D] inputs in double with P rounded to dt
** (round_p) and the output rounded to dt; round_p 0 and dt STA_F32 give
** the exact result, to check this code against the reference. */
static void emulate(const sta_attention_desc *d, const float *q, const float *k, const float *v,
                    int64_t B, int64_t S, int64_t H, int64_t D, sta_dtype dt, int round_p,
                    float *out) {
  int32_t grid[3];
  sta_geometry_grid(&d->geom, grid);
  const int64_t V = sta_geometry_video_tokens(&d->geom), tl = sta_geometry_text_len(&d->geom, S);
  const int32_t *cv = d->geom.canvas, *tile = d->geom.tile;
  const double scale = d->scale > 0 ? d->scale : 1.0 / sqrt((double)D);
  #pragma omp parallel
  {
    double *lg = malloc(sizeof(double) * (size_t)S), *acc = malloc(sizeof(double) * (size_t)D);
    #pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < B * S * H; r++) {
      int64_t b = r / (S * H), s = (r / H) % S, h = r % H;
      const int32_t *w = d->windows + (d->n_windows == 1 ? 0 : 3 * h);
      int32_t st[3] = {0, 0, 0}, n[3] = {0, 0, 0};
      if (s < V) {
        int64_t qc[3] = {s / ((int64_t)cv[1] * cv[2]), (s / cv[2]) % cv[1], s % cv[2]};
        for (int a = 0; a < 3; a++)
          assert_int_equal(sta_window_range((int32_t)(qc[a] / tile[a]), w[a], grid[a], &st[a], &n[a]),
                           STA_OK);
      }
      const float *qr = q + ((b * S + s) * H + h) * D;
      double m = -INFINITY, l = 0;
      for (int64_t j = 0; j < S; j++) {
        int key = j < V + tl;
        if (key && s < V && j < V) {
          int64_t kc[3] = {j / ((int64_t)cv[1] * cv[2]), (j / cv[2]) % cv[1], j % cv[2]};
          for (int a = 0; a < 3; a++) {
            int64_t t = kc[a] / tile[a];
            key &= t >= st[a] && t < st[a] + n[a];
          }
        }
        lg[j] = -INFINITY;
        if (!key) continue;
        const float *kr = k + ((b * S + j) * H + h) * D;
        double dot = 0;
        for (int64_t i = 0; i < D; i++) dot += (double)qr[i] * kr[i];
        lg[j] = dot * scale;
        if (lg[j] > m) m = lg[j];
      }
      for (int64_t i = 0; i < D; i++) acc[i] = 0;
      for (int64_t j = 0; j < S; j++) {
        if (lg[j] == -INFINITY) continue;
        double p = exp(lg[j] - m);
        l += p;
        if (round_p) p = round_to((float)p, dt);
        const float *vr = v + ((b * S + j) * H + h) * D;
        for (int64_t i = 0; i < D; i++) acc[i] += p * vr[i];
      }
      float *o = out + ((b * S + s) * H + h) * D;
      for (int64_t i = 0; i < D; i++)
        o[i] = dt == STA_F32 ? (float)(acc[i] / l) : round_to((float)(acc[i] / l), dt);
    }
    free(lg);
    free(acc);
  }
}

typedef struct errsum {
  double se, sr, sa, mx, top; /* sum (o-r)^2, sum r^2, sum |o-r|, max |o-r|, max |r| */
  int64_t n;
} errsum;

static void err_add(errsum *e, const float *o, const float *r, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    double x = (double)o[i] - r[i];
    if (isnan(x)) x = INFINITY;
    e->se += x * x;
    e->sr += (double)r[i] * r[i];
    e->sa += fabs(x);
    if (!(fabs(x) <= e->mx)) e->mx = fabs(x);
    if (fabs(r[i]) > e->top) e->top = fabs(r[i]);
  }
  e->n += n;
}

static double err_rel(const errsum *e) { return sqrt(e->se / (e->sr > 0 ? e->sr : 1)); }

/* One unit in the last place of x in dt. */
static double ulp_of(double x, sta_dtype dt) {
  int ex;
  frexp(x > 0 ? x : 1e-30, &ex); /* x = f * 2^ex, f in [0.5, 1) */
  return ldexp(1.0, ex - 1 - (dt == STA_BF16 ? 7 : 10));
}

/* A geometry for the accuracy runs: 400 <= S <= 1800, BSHD; a third on
** whole 6x8x8 tiles (the default kernels' TMA paths). */
static void acc_case(gcase *c) {
  do {
    random_case(c);
    if (sta_test_rnd() % 3 == 0) {
      c->tile[0] = 6; c->tile[1] = 8; c->tile[2] = 8;
      c->canvas[0] = 6 * (int32_t)sta_test_rint(1, 2);
      c->canvas[1] = 8 * (int32_t)sta_test_rint(1, 3);
      c->canvas[2] = 8 * (int32_t)sta_test_rint(1, 3);
      int32_t grid[3] = {c->canvas[0] / 6, c->canvas[1] / 8, c->canvas[2] / 8};
      for (int h = 0; h < c->n_windows; h++)
        for (int i = 0; i < 3; i++) c->windows[3 * h + i] = 1 + 2 * (int32_t)sta_test_rint(0, (grid[i] - 1) / 2);
    }
  } while ((int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2] + c->text < 400 ||
           (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2] + c->text > 1800);
  c->layout = STA_BSHD;
  c->order = 0;
  c->lse = 0;
  c->B = 1;
  c->H = sta_test_rint(1, 2);
  if (c->n_windows > 1) c->n_windows = (int32_t)c->H;
}

/* The case's exact, fast and emulated errors into e[0..2] (and e[3]: the
** reference rounded to the dtype, the output's own rounding). */
static void acc_run(const gcase *c, int dist, errsum e[4]) {
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  memcpy(d.geom.tile, c->tile, sizeof c->tile);
  d.geom.text_len = c->text_len;
  d.layout = STA_BSHD;
  d.n_windows = c->n_windows;
  d.windows = c->windows;
  d.scale = c->scale;
  const int64_t V = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2], S = V + c->text;
  const int64_t B = c->B, H = c->H, D = c->D, n = B * S * H * D;
  int64_t shape[4] = {B, S, H, D};
  sta_tensor *x32[3], *xr[3], *xf[3], *xd[3];
  for (int i = 0; i < 3; i++) {
    x32[i] = acc_input(dist, i, c->seed * 3 + (uint64_t)i, B, S, H, D);
    assert_int_equal(sta_tensor_to(&xr[i], x32[i], c->dtype, STA_CPU), STA_OK); /* rounded */
    assert_int_equal(sta_tensor_to(&xf[i], xr[i], STA_F32, STA_CPU), STA_OK);
    assert_int_equal(sta_tensor_to(&xd[i], xr[i], c->dtype, STA_CUDA), STA_OK);
  }
  sta_tensor *ref = NULL, *chk = NULL, *od = NULL, *oh = NULL;
  assert_int_equal(sta_tensor_create(&ref, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_attention_reference(&d, xf[0], xf[1], xf[2], ref, NULL), STA_OK);
  const float *r = sta_tensor_data(ref);
  const float *qf = sta_tensor_data(xf[0]), *kf = sta_tensor_data(xf[1]), *vf = sta_tensor_data(xf[2]);
  float *emu = malloc(sizeof(float) * (size_t)n);
  assert_non_null(emu);
  /* this file's mask and arithmetic against the reference first */
  emulate(&d, qf, kf, vf, B, S, H, D, STA_F32, 0, emu);
  assert_int_equal(sta_tensor_create(&chk, STA_F32, STA_CPU, 4, shape), STA_OK);
  memcpy(sta_tensor_data(chk), emu, sizeof(float) * (size_t)n);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(chk, ref, &mx, &rel), STA_OK);
  if (!(rel < 1e-5)) fail_msg("emulation disagrees with the reference: rel %g", rel);
  emulate(&d, qf, kf, vf, B, S, H, D, c->dtype, 1, emu);
  err_add(&e[2], emu, r, n);
  for (int64_t i = 0; i < n; i++) emu[i] = round_to(r[i], c->dtype);
  err_add(&e[3], emu, r, n);
  free(emu);
  assert_int_equal(sta_tensor_create(&od, c->dtype, STA_CUDA, 4, shape), STA_OK);
  for (int mode = 0; mode < 2; mode++) {
    d.softmax = mode ? STA_SOFTMAX_FAST : STA_SOFTMAX_EXACT;
    assert_int_equal(sta_tensor_fill(od, NAN), STA_OK);
    sta_status rc = sta_attention_forward(&d, xd[0], xd[1], xd[2], od, NULL);
    if (rc != STA_OK) fail_msg("forward failed: %s", sta_last_error());
    assert_int_equal(sta_tensor_to(&oh, od, STA_F32, STA_CPU), STA_OK);
    err_add(&e[mode], sta_tensor_data(oh), r, n);
    sta_tensor_destroy(oh);
    oh = NULL;
  }
  for (int i = 0; i < 3; i++) {
    sta_tensor_destroy(x32[i]); sta_tensor_destroy(xr[i]);
    sta_tensor_destroy(xf[i]); sta_tensor_destroy(xd[i]);
  }
  sta_tensor_destroy(ref); sta_tensor_destroy(chk); sta_tensor_destroy(od);
}

static void test_accuracy_f64(void **state) {
  NEED_GPU();
  if (getenv("STA_GPU_QUICK")) skip(); /* sanitizer runs: the CPU reference is slow there */
  const char *ns = getenv("STA_ACC_CASES");
  int n = ns ? atoi(ns) : 6, bad = 0;
  static const char *const WHAT[4] = {"exact", "fast", "emulated", "output rounding"};
  for (int dist = 0; dist < NDIST; dist++) {
    errsum e[2][4]; /* [bf16, f16][exact, fast, emulated, rounding] */
    memset(e, 0, sizeof e);
    sta_dtype dt = STA_BF16;
    for (int i = 0; i < n; i++) {
      gcase c;
      acc_case(&c);
      c.dtype = i % 2 ? STA_F16 : STA_BF16;
      acc_run(&c, dist, e[i % 2]);
    }
    for (int k = 0; k < 2; k++, dt = STA_F16) {
      if (!e[k][0].n) continue;
      const errsum *x = e[k];
      printf("# accuracy %-17s %s: rel L2 / mean abs / max abs against float64\n",
             DIST_NAME[dist], sta_dtype_name(dt));
      for (int w = 0; w < 4; w++)
        printf("#   %-15s %.3e / %.3e / %.3e\n", WHAT[w], err_rel(&x[w]), x[w].sa / (double)x[w].n,
               x[w].mx);
      const double ulp = ulp_of(x[2].top, dt), er = err_rel(&x[2]);
      const double lim[2][2] = {{1.10 * er, x[2].mx + 0.5 * ulp}, {2.0 * er, x[2].mx + 2.0 * ulp}};
      for (int mode = 0; mode < 2; mode++)
        if (!(err_rel(&x[mode]) <= lim[mode][0]) || !(x[mode].mx <= lim[mode][1])) {
          printf("!! %s %s %s: rel %.3e (limit %.3e), max %.3e (limit %.3e)\n", DIST_NAME[dist],
                 sta_dtype_name(dt), WHAT[mode], err_rel(&x[mode]), lim[mode][0], x[mode].mx,
                 lim[mode][1]);
          bad++;
        }
    }
  }
  if (bad) fail_msg("%d accuracy bounds exceeded (see above)", bad);
}

int main(void) {
  sta_test_begin(0x9e3779b97f4a7c15ull, 1);
  sta_test_kernel_settings();
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_accuracy_f64)};
  return cmocka_run_group_tests(tests, gpu_setup, NULL);
}
