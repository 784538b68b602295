/* test_gpu_fp8.c -- the fp8 forward on CUDA (make test-gpu):
** the quantize pre-pass (kernels/fp8_quant.cu, fp8_prepass.cu) against the
** CPU quantizer (core/cpu_fp8.c) bit for bit -- every byte of every buffer,
** each prefilled with garbage -- on fresh random inputs over geometries
** (partial tiles, the tiled order with NaN in its padding rows, text past
** text_len, BSHD and BHSD, strided views, bf16 / f16 / f32, D 32 to 160,
** DiT-like offsets and outlier channels); and STA_PRECISION_FP8 on CUDA
** tensors (kernels/kernel_fp8.cuh): the forward's output and lse against
** the CPU's fp8 reference within a tolerance derived from what the kernel
** may differ in (FP8_REL below), and at least 2x closer to it than the
** native output (a silent native run fails), over random geometries and
** fixed multi-block ones, bf16, f16 and f32, a second run bit for bit the
** first's; its errors; a layer;
** sta_attention_forward_fp8 on CUDA against the host.  Skips cleanly
** without a device.  STA_TEST_SEED replays a run; STA_GPU_CASES sets the random
** cases (default 60). */
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

#define OK(call) do { sta_status r_ = (call); \
  if (r_ != STA_OK) fail_msg("%s: %s", #call, sta_last_error()); } while (0)

static int cases(void) {
  const char *s = getenv("STA_GPU_CASES");
  return s && atoi(s) > 0 ? atoi(s) : 60;
}

/* ---- one problem on the host and the device --------------------------------- */

typedef struct twin {
  sta_attention_desc d;
  int32_t win[3 * 4];
  int64_t B, S, H, D;
  sta_dtype dt;
  sta_tensor *hb[3], *h[3], *db[3], *dv[3]; /* storages and the views read */
} twin;

/* Operand views: contiguous in the layout, or padded rows (D + 8 wide,
** narrowed: a row stride that is not D).  kind 1: DiT-like offsets;
** kind 2: small values (every operand times 2^-7, so k' and its group
** amaxes lie below 1: a group's rows that are no keys, marked -1, must not
** raise its amax);
** kernel: only what the attention kernels take (D 64, 128; bf16, f16). */
static void twin_make(twin *t, int kind, int kernel) { /* kernel 1: bf16/f16; 2: and f32 */
  int32_t grid[3];
  static const int32_t tiles[4][3] = {{6, 8, 8}, {2, 4, 4}, {3, 4, 8}, {1, 2, 2}};
  const int32_t *tl = tiles[sta_test_rint(0, 3)];
  memset(t, 0, sizeof *t);
  sta_geometry_init(&t->d.geom, (int32_t)sta_test_rint(1, 13), (int32_t)sta_test_rint(1, 19), (int32_t)sta_test_rint(1, 21));
  for (int i = 0; i < 3; i++) t->d.geom.tile[i] = tl[i];
  t->d.geom.order = sta_test_rint(0, 1) ? STA_ORDER_TILED : STA_ORDER_UNTILED;
  int64_t text = sta_test_rint(0, 3) ? sta_test_rint(0, 40) : 0;
  t->d.geom.text_len = sta_test_rint(0, 1) ? -1 : sta_test_rint(0, text);
  t->d.layout = sta_test_rint(0, 1) ? STA_BHSD : STA_BSHD;
  t->d.precision = STA_PRECISION_FP8;
  t->B = sta_test_rint(1, 2);
  t->H = sta_test_rint(1, 3);
  static const int64_t dims[6] = {64, 128, 64, 128, 32, 160};
  t->D = dims[sta_test_rint(0, kernel ? 3 : 5)]; /* kernel 2: f32 too (the fp8 kernel's) */
  static const sta_dtype dts[3] = {STA_BF16, STA_F16, STA_F32};
  t->dt = dts[sta_test_rint(0, kernel == 1 ? 1 : 2)];
  sta_geometry_grid(&t->d.geom, grid);
  t->d.n_windows = (int32_t)t->H;
  for (int64_t h = 0; h < t->H; h++)
    for (int a = 0; a < 3; a++) {
      int32_t c = grid[a], w = (int32_t)(2 * sta_test_rint(0, 2) + 1);
      t->win[3 * h + a] = w > c ? c : w;
    }
  t->d.windows = t->win;
  t->S = (t->d.geom.order == STA_ORDER_TILED ? sta_geometry_video_rows(&t->d.geom)
                                               : sta_geometry_video_tokens(&t->d.geom)) + text;
  int pad = (int)sta_test_rint(0, 1) * 8;
  int bshd = t->d.layout == STA_BSHD;
  int64_t shape[4] = {t->B, bshd ? t->S : t->H, bshd ? t->H : t->S, t->D + pad};
  for (int i = 0; i < 3; i++) {
    sta_tensor *f = NULL;
    OK(sta_tensor_create(&f, STA_F32, STA_CPU, 4, shape));
    OK(sta_tensor_randn(f, sta_test_rnd(), 0.0, 1.0 + 2.0 * (double)i));
    if (kind == 2) { /* small values (exact: a power of two) */
      float *x = sta_tensor_data(f);
      for (int64_t e = 0; e < sta_tensor_numel(f); e++) x[e] *= 0.0078125f;
    }
    if (kind == 1 && i < 2) { /* shared offsets; k: outlier channels */
      float *x = sta_tensor_data(f);
      for (int64_t e = 0; e < sta_tensor_numel(f); e++) {
        int64_t c = e % (t->D + pad);
        x[e] += 0.3f * (float)(c % 7) - 1.0f;
        if (i == 1 && c % 29 == 3) x[e] = x[e] * 4.0f + 20.0f;
      }
    }
    OK(sta_tensor_to(&t->hb[i], f, t->dt, STA_CPU));
    sta_tensor_destroy(f);
    OK(sta_tensor_narrow(&t->h[i], t->hb[i], 3, 0, t->D));
    if (t->d.geom.order == STA_ORDER_TILED) sta_test_fill_pad(t->h[i], &t->d.geom, t->d.layout, NAN);
    OK(sta_tensor_to(&t->db[i], t->hb[i], t->dt, STA_CUDA));
    OK(sta_tensor_narrow(&t->dv[i], t->db[i], 3, 0, t->D));
  }
}

static void twin_free(twin *t) {
  for (int i = 0; i < 3; i++) {
    sta_tensor_destroy(t->hb[i]); sta_tensor_destroy(t->h[i]);
    sta_tensor_destroy(t->db[i]); sta_tensor_destroy(t->dv[i]);
  }
}

static const char *twin_str(const twin *t) {
  static char s[256];
  snprintf(s, sizeof s, "canvas %dx%dx%d tile %dx%dx%d %s S %lld text_len %lld B %lld H %lld "
           "D %lld %s %s", t->d.geom.canvas[0], t->d.geom.canvas[1], t->d.geom.canvas[2],
           t->d.geom.tile[0], t->d.geom.tile[1], t->d.geom.tile[2],
           t->d.geom.order == STA_ORDER_TILED ? "tiled" : "untiled", (long long)t->S,
           (long long)t->d.geom.text_len, (long long)t->B, (long long)t->H, (long long)t->D,
           sta_dtype_name(t->dt), t->d.layout == STA_BSHD ? "bshd" : "bhsd");
  return s;
}

/* ---- the pre-pass, bit for bit ------------------------------------------------ */

#ifdef STA_WITH_CUDA /* sta_cuda_fp8_quantize: the CUDA build's (a CPU build skips) */
/* The buffers of sta_fp8_ops as (pointer slot, bytes). */
static int ops_fields(sta_fp8_ops *o, void ***slot, size_t *bytes) {
  size_t bh = (size_t)(o->batch * o->heads), r = (size_t)o->rows, d = (size_t)o->head_dim;
  void **s[9] = {(void **)&o->q8, (void **)&o->k8, (void **)&o->v8, (void **)&o->q_scale,
                 (void **)&o->k_scale, (void **)&o->q_bias, (void **)&o->k_mean,
                 (void **)&o->v_scale, (void **)&o->eq};
  size_t n[9] = {bh * r * d, bh * r * d, bh * d * r, 4 * bh * r, 4 * bh * r, 4 * bh * r,
                 4 * bh * d, 4 * bh * d, bh * d};
  for (int i = 0; i < 9; i++) { slot[i] = s[i]; bytes[i] = n[i]; }
  return 9;
}

static const char *const FIELD[9] = {"q8", "k8", "v8", "q_scale", "k_scale", "q_bias",
                                     "k_mean", "v_scale", "eq"};

/* The pre-pass variants to run (STA_FP8_TEST_PREPASS, default "1,0": 1
** fp8_prepass.cu where it applies, 0 fp8_quant.cu's kernels, through
** sta_cuda_set_fp8_prepass_test), each checked bit for bit. */
static int prepass_variants(int *v) {
  const char *e = getenv("STA_FP8_TEST_PREPASS");
  int n = 0;
  for (const char *c = e && *e ? e : "1,0"; *c && n < 8; c++)
    if (*c >= '0' && *c <= '9') v[n++] = *c - '0';
  return n;
}

static void check_prepass(twin *t) {
  sta_tensor *ho = NULL, *dout = NULL;
  int64_t os[4];
  for (int i = 0; i < 4; i++) os[i] = sta_tensor_size(t->h[0], i);
  OK(sta_tensor_create(&ho, t->dt, STA_CPU, 4, os));
  OK(sta_tensor_create(&dout, t->dt, STA_CUDA, 4, os));
  sta_attn_params hp, dp;
  OK(sta_attn_resolve(&t->d, t->h[0], t->h[1], t->h[2], ho, NULL, &hp));
  OK(sta_attn_resolve(&t->d, t->dv[0], t->dv[1], t->dv[2], dout, NULL, &dp));
  sta_fp8_geom g;
  sta_fp8_geom_init(&g, &hp);
  sta_fp8_ops ho8, dev;
  OK(sta_fp8_ops_alloc(&ho8, t->B, t->H, g.rows, t->D));
  OK(sta_cpu_fp8_quantize(&hp, &ho8));
  void **hslot[9];
  size_t hbytes[9];
  ops_fields(&ho8, hslot, hbytes);
  int pv[8], npv = prepass_variants(pv);
  for (int v = 0; v < npv; v++) {
    memset(&dev, 0, sizeof dev);
    dev.batch = t->B; dev.heads = t->H; dev.rows = g.rows; dev.head_dim = t->D;
    void **slot[9];
    size_t bytes[9];
    sta_tensor *buf[9];
    int n = ops_fields(&dev, slot, bytes);
    for (int i = 0; i < n; i++) { /* garbage first: every byte must be written */
      sta_tensor *h = NULL;
      int64_t len = (int64_t)bytes[i];
      OK(sta_tensor_create(&h, STA_F8E4M3, STA_CPU, 1, &len));
      memset(sta_tensor_data(h), 0xab, bytes[i]);
      OK(sta_tensor_to(&buf[i], h, STA_F8E4M3, STA_CUDA));
      sta_tensor_destroy(h);
      *slot[i] = sta_tensor_data(buf[i]);
    }
    sta_cuda_set_fp8_prepass_test(pv[v]);
    sta_status rc = sta_cuda_fp8_quantize(&dp, &dev);
    sta_cuda_set_fp8_prepass_test(1);
    if (rc != STA_OK) fail_msg("%s: pre-pass %d: %s", twin_str(t), pv[v], sta_last_error());
    OK(sta_cuda_synchronize());
    for (int i = 0; i < n; i++) {
      sta_tensor *h = NULL;
      OK(sta_tensor_to(&h, buf[i], STA_F8E4M3, STA_CPU));
      const unsigned char *a = sta_tensor_data(h), *b = *hslot[i];
      for (size_t j = 0; j < bytes[i]; j++)
        if (a[j] != b[j])
          fail_msg("%s: pre-pass %d: %s byte %zu of %zu: device 0x%02x, host 0x%02x",
                   twin_str(t), pv[v], FIELD[i], j, bytes[i], a[j], b[j]);
      sta_tensor_destroy(h);
      sta_tensor_destroy(buf[i]);
    }
  }
  sta_fp8_ops_free(&ho8);
  free((void *)hp.windows);
  free((void *)dp.windows);
  sta_tensor_destroy(ho);
  sta_tensor_destroy(dout);
}
#else
static void check_prepass(twin *t) {
  (void)t;
  skip();
}
#endif

static void test_prepass_bits(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases(); c++) {
    twin t;
    twin_make(&t, c % 3, 0);
    check_prepass(&t);
    twin_free(&t);
  }
}

/* Extreme values among the operands' elements (+-60000, the largest of
** every input dtype's range; 3e-5 and -1e-7, subnormal in f16 and below
** e4m3's; -0) and views an element off 16-byte alignment (the fast
** pre-pass's fallback): still the host's bits, every variant.  Finite
** only: NaN's payload is not a contract (the device's arithmetic gives
** the canonical NaN, the host's keeps the operand's). */
static void test_prepass_bits_extremes(void **state) {
  NEED_GPU();
  static const float odd[6] = {60000.0f, -60000.0f, 3e-5f, -1e-7f, -0.0f, 300.0f};
  for (int c = 0; c < 2 * (cases() < 8 ? cases() : 8); c++) {
    twin t;
    twin_make(&t, c & 1, 2);
    for (int i = 0; i < 3; i++) { /* a few odd elements, then the device copy again */
      size_t es = sta_dtype_size(t.dt);
      int64_t n = sta_tensor_numel(t.hb[i]);
      char *x = sta_tensor_data(t.hb[i]);
      for (int j = 0; j < 1 + (int)(n / 4096); j++)
        sta_store_f32(x + (size_t)sta_test_rint(0, n - 1) * es, t.dt, odd[sta_test_rint(0, 5)]);
      int64_t off = c >= 8 && t.D + 1 <= sta_tensor_size(t.hb[i], 3) ? 1 : 0;
      sta_tensor_destroy(t.h[i]); sta_tensor_destroy(t.db[i]); sta_tensor_destroy(t.dv[i]);
      OK(sta_tensor_narrow(&t.h[i], t.hb[i], 3, off, t.D));
      OK(sta_tensor_to(&t.db[i], t.hb[i], t.dt, STA_CUDA));
      OK(sta_tensor_narrow(&t.dv[i], t.db[i], 3, off, t.D));
    }
    check_prepass(&t);
    twin_free(&t);
  }
}

/* hunyuan-720p's shape at one head: 30x48x80 + 256 text, D 128, bf16. */
static void test_prepass_bits_large(void **state) {
  NEED_GPU();
  if (getenv("STA_GPU_QUICK")) skip();
  twin t;
  memset(&t, 0, sizeof t);
  sta_geometry_init(&t.d.geom, 30, 48, 80);
  t.d.layout = STA_BSHD;
  t.d.precision = STA_PRECISION_FP8;
  t.d.n_windows = 1;
  t.win[0] = t.win[1] = t.win[2] = 3;
  t.d.windows = t.win;
  t.B = 1; t.H = 2; t.D = 128; t.dt = STA_BF16;
  t.S = 30 * 48 * 80 + 256;
  int64_t shape[4] = {1, t.S, 2, 128};
  for (int i = 0; i < 3; i++) {
    OK(sta_tensor_create(&t.hb[i], STA_BF16, STA_CPU, 4, shape));
    OK(sta_tensor_randn(t.hb[i], sta_test_rnd(), 0.5, 2.0));
    OK(sta_tensor_narrow(&t.h[i], t.hb[i], 3, 0, 128));
    OK(sta_tensor_to(&t.db[i], t.hb[i], STA_BF16, STA_CUDA));
    OK(sta_tensor_narrow(&t.dv[i], t.db[i], 3, 0, 128));
  }
  check_prepass(&t);
  twin_free(&t);
}

/* ---- STA_PRECISION_FP8 on CUDA --------------------------------------------------- */

static void expect_fill(const sta_tensor *t, double v, const char *what) {
  sta_tensor *h = NULL;
  OK(sta_tensor_to(&h, t, STA_F32, STA_CPU));
  const float *x = sta_tensor_data(h);
  for (int64_t i = 0; i < sta_tensor_numel(h); i++)
    if (!(x[i] == (float)v)) fail_msg("%s: element %lld is %g, not %g", what, (long long)i,
                                      (double)x[i], v);
  sta_tensor_destroy(h);
}

/* rel L2 of a against b over the elements finite in b. */
static double rel_l2(const sta_tensor *a, const sta_tensor *b) {
  sta_tensor *x = NULL, *y = NULL;
  OK(sta_tensor_to(&x, a, STA_F32, STA_CPU));
  OK(sta_tensor_to(&y, b, STA_F32, STA_CPU));
  const float *u = sta_tensor_data(x), *w = sta_tensor_data(y);
  double e = 0, n = 0;
  for (int64_t i = 0; i < sta_tensor_numel(x); i++)
    if (isfinite(w[i])) {
      e += ((double)u[i] - w[i]) * ((double)u[i] - w[i]);
      n += (double)w[i] * w[i];
    }
  sta_tensor_destroy(x);
  sta_tensor_destroy(y);
  return sqrt(e / n);
}

/* max |a - b| over the elements where a and b differ (equal infinities:
** the tiled order's padding rows agree); a NaN on one side only is inf. */
static double max_diff(const sta_tensor *a, const sta_tensor *b) {
  sta_tensor *x = NULL, *y = NULL;
  OK(sta_tensor_to(&x, a, STA_F32, STA_CPU));
  OK(sta_tensor_to(&y, b, STA_F32, STA_CPU));
  const float *u = sta_tensor_data(x), *w = sta_tensor_data(y);
  double m = 0;
  for (int64_t i = 0; i < sta_tensor_numel(x); i++) {
    if (u[i] == w[i] || (isnan(u[i]) && isnan(w[i]))) continue;
    double d = fabs((double)u[i] - w[i]);
    if (!(d <= m)) m = isnan(d) ? INFINITY : d;
  }
  sta_tensor_destroy(x);
  sta_tensor_destroy(y);
  return m;
}

/* Tolerances against the CPU's fp8 reference (core/cpu_fp8.c), which the
** kernel matches up to the order and width of its sums: the same key
** blocks and running maximum, so P's e4m3 code differs only where float32
** scores and ex2.approx (2 ulp) move P across a rounding boundary (one
** e4m3 ulp, 2^-3 relative, of a rare P); each block's P V sums 128
** products in Hopper's fp8 accumulator (about 2^-13 relative per add of
** 32, then added to O in float32: STA_FP8_FLUSH, the default); the output
** is rounded to bf16 (2^-9) or f16.  Together well under 4e-3 rel L2 in
** the worst case; the quantization itself (fp8 against exact) is ~4e-2, and a
** native (bf16) run lands there too, so the fp8 output must also be at
** least 2x closer to the fp8 reference than the native output is (a
** silent native run fails) wherever the two references are told apart
** (native at least FP8_APART from the fp8 reference: not so with a handful
** of keys per row; the fixed cases always are).  lse: ln l + m ln 2 in
** float32 against double. */
#define FP8_REL fp8_rel()
/* 4e-3; STA_FP8_TEST_REL widens it for a kernel variant that keeps O in
** the fp8 accumulator across blocks (scripts/device/gpu-check-fp8's quick
** runs of the variants: its error grows with the keys a row sees). */
static double fp8_rel(void) {
  const char *s = getenv("STA_FP8_TEST_REL");
  return s && atof(s) > 0 ? atof(s) : 4e-3;
}
#define FP8_LSE 2e-3
#define FP8_APART 8e-3
static double worst_rel, worst_lse, worst_ratio;
static int n_apart;

/* 1 when a and b (same shape and dtype) hold the same bits. */
static int same_bits(const sta_tensor *a, const sta_tensor *b) {
  sta_tensor *x = NULL, *y = NULL;
  OK(sta_tensor_to(&x, a, sta_tensor_dtype(a), STA_CPU));
  OK(sta_tensor_to(&y, b, sta_tensor_dtype(b), STA_CPU));
  int same = memcmp(sta_tensor_data(x), sta_tensor_data(y),
                    (size_t)sta_tensor_numel(x) * sta_dtype_size(sta_tensor_dtype(x))) == 0;
  sta_tensor_destroy(x);
  sta_tensor_destroy(y);
  return same;
}

/* The fp8 forward of t on the device into o, l (filled with 7 first). */
static void fp8_run(twin *t, sta_tensor *o, sta_tensor *l) {
  OK(sta_tensor_fill(o, 7.0));
  OK(sta_tensor_fill(l, 7.0));
  sta_status rc = sta_attention_forward(&t->d, t->dv[0], t->dv[1], t->dv[2], o, l);
  if (rc != STA_OK) fail_msg("%s: %s", twin_str(t), sta_last_error());
}

/* The fp8 forward of t on the device against the CPU's fp8 reference and
** away from the native output; a second run the same bits (the persistent
** CTAs take the items in whatever order they come). */
static void check_fp8_forward(twin *t) {
  int64_t os[4], ls[3] = {t->B, t->H, t->S};
  for (int i = 0; i < 4; i++) os[i] = sta_tensor_size(t->h[0], i);
  sta_tensor *o = NULL, *l = NULL, *o1 = NULL, *l1 = NULL;
  OK(sta_tensor_create(&o, t->dt, STA_CUDA, 4, os));
  OK(sta_tensor_create(&l, STA_F32, STA_CUDA, 3, ls));
  OK(sta_tensor_create(&o1, t->dt, STA_CUDA, 4, os));
  OK(sta_tensor_create(&l1, STA_F32, STA_CUDA, 3, ls));
  fp8_run(t, o, l);
  sta_tensor *hq = NULL, *hk = NULL, *hv = NULL, *ro = NULL, *rl = NULL, *no = NULL;
  OK(sta_tensor_to(&hq, t->h[0], STA_F32, STA_CPU));
  OK(sta_tensor_to(&hk, t->h[1], STA_F32, STA_CPU));
  OK(sta_tensor_to(&hv, t->h[2], STA_F32, STA_CPU));
  OK(sta_tensor_create(&ro, STA_F32, STA_CPU, 4, os));
  OK(sta_tensor_create(&rl, STA_F32, STA_CPU, 3, ls));
  OK(sta_attention_forward(&t->d, hq, hk, hv, ro, rl));
  const double r = rel_l2(o, ro), mx = max_diff(l, rl);
  sta_attention_desc nd = t->d;
  nd.precision = STA_PRECISION_NATIVE;
  OK(sta_tensor_create(&no, t->dt, STA_CUDA, 4, os));
  double rn = 0; /* f32: the native kernels refuse it, so nothing can run natively */
  if (t->dt == STA_F32)
    assert_int_equal(sta_attention_forward(&nd, t->dv[0], t->dv[1], t->dv[2], no, NULL),
                     STA_ERR_DTYPE);
  else {
    OK(sta_attention_forward(&nd, t->dv[0], t->dv[1], t->dv[2], no, NULL));
    rn = rel_l2(no, ro);
  }
  if (r > worst_rel) worst_rel = r;
  if (mx > worst_lse) worst_lse = mx;
  if (rn >= FP8_APART) {
    n_apart++;
    if (r / rn > worst_ratio) worst_ratio = r / rn;
  }
  if (!(r < FP8_REL && mx < FP8_LSE))
    fail_msg("%s: against the CPU's fp8 reference: rel L2 %g (at most %g), lse max %g (at "
             "most %g)", twin_str(t), r, FP8_REL, mx, FP8_LSE);
  if (rn >= FP8_APART && !(r * 2 < rn))
    fail_msg("%s: the fp8 output is as far from the fp8 reference (rel %g) as the native one "
             "(rel %g): fp8 silently not run", twin_str(t), r, rn);
  fp8_run(t, o1, l1);
  if (!same_bits(o, o1) || !same_bits(l, l1))
    fail_msg("%s: a second run differs from the first (out rel %g, lse max %g)", twin_str(t),
             rel_l2(o1, o), max_diff(l1, l));
  sta_tensor_destroy(hq); sta_tensor_destroy(hk); sta_tensor_destroy(hv);
  sta_tensor_destroy(ro); sta_tensor_destroy(rl); sta_tensor_destroy(no);
  sta_tensor_destroy(o); sta_tensor_destroy(l);
  sta_tensor_destroy(o1); sta_tensor_destroy(l1);
}

static void test_fp8_forward(void **state) {
  NEED_GPU();
  for (int c = 0; c < cases() / 4 + 1; c++) {
    twin t;
    twin_make(&t, c % 3, 2);
    check_fp8_forward(&t);
    twin_free(&t);
  }
  printf("# fp8 forward: worst rel L2 %.3e, lse %.3e, fp8/native distance ratio %.3f "
         "(%d cases told apart)\n", worst_rel, worst_lse, worst_ratio, n_apart);
}

/* 6x8x8 tiles (whole, then partial) over several key blocks: runs 16-byte
** aligned (whole blocks by TMA, the rest by 16-byte cp.async), D 128 and
** 64, text keys, windows per head; the last with rows % 16 != 0 (every
** block by cp.async). */
static void test_fp8_forward_tiles(void **state) {
  NEED_GPU();
  /* the last: 576 items of 32 rows, several per CTA of the persistent
  ** launch (both Q buffers, the barriers' phases turning) */
  static const struct {
    int32_t c[3], tl[3];
    int64_t text, D;
    sta_dtype dt;
    int order, bhsd;
  } cs[] = {{{12, 16, 24}, {0, 0, 0}, 256, 128, STA_BF16, STA_ORDER_UNTILED, 0},
            {{12, 16, 24}, {0, 0, 0}, 48, 64, STA_F16, STA_ORDER_TILED, 1},
            {{10, 14, 20}, {0, 0, 0}, 16, 128, STA_F16, STA_ORDER_TILED, 0},
            {{12, 24, 32}, {2, 4, 4}, 40, 128, STA_BF16, STA_ORDER_UNTILED, 0}};
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    if (getenv("STA_GPU_QUICK") && c > 0) break;
    twin t;
    int32_t grid[3];
    memset(&t, 0, sizeof t);
    sta_geometry_init(&t.d.geom, cs[c].c[0], cs[c].c[1], cs[c].c[2]);
    if (cs[c].tl[0])
      for (int a = 0; a < 3; a++) t.d.geom.tile[a] = cs[c].tl[a];
    t.d.geom.order = cs[c].order;
    t.d.geom.text_len = cs[c].text - 3;
    t.d.layout = cs[c].bhsd ? STA_BHSD : STA_BSHD;
    t.d.precision = STA_PRECISION_FP8;
    t.B = 1; t.H = 2; t.D = cs[c].D; t.dt = cs[c].dt;
    sta_geometry_grid(&t.d.geom, grid);
    t.d.n_windows = 2;
    for (int a = 0; a < 3; a++) { t.win[a] = 3; t.win[3 + a] = a == 2 ? grid[2] : 1; }
    t.d.windows = t.win;
    t.S = (cs[c].order == STA_ORDER_TILED ? sta_geometry_video_rows(&t.d.geom)
                                          : sta_geometry_video_tokens(&t.d.geom)) + cs[c].text;
    int64_t shape[4] = {1, cs[c].bhsd ? 2 : t.S, cs[c].bhsd ? t.S : 2, t.D};
    for (int i = 0; i < 3; i++) {
      OK(sta_tensor_create(&t.hb[i], t.dt, STA_CPU, 4, shape));
      OK(sta_tensor_randn(t.hb[i], sta_test_rnd(), 0.2 * i, 1.0 + i));
      if (cs[c].order == STA_ORDER_TILED) sta_test_fill_pad(t.hb[i], &t.d.geom, t.d.layout, NAN);
      OK(sta_tensor_narrow(&t.h[i], t.hb[i], 3, 0, t.D));
      OK(sta_tensor_to(&t.db[i], t.hb[i], t.dt, STA_CUDA));
      OK(sta_tensor_narrow(&t.dv[i], t.db[i], 3, 0, t.D));
    }
    check_fp8_forward(&t);
    twin_free(&t);
  }
  assert_true(n_apart > 0); /* the silent-native check ran */
}

/* Rows of t (a 4-D [B, S, H, D] or BHSD output, host or device) with a
** non-finite element: flags[(b * S + s) * H + h] (layout lay). */
static void nonfinite_rows(const sta_tensor *t, sta_layout lay, char *flags) {
  sta_tensor *h = NULL;
  OK(sta_tensor_to(&h, t, STA_F32, STA_CPU));
  sta_bshd b;
  OK(sta_tensor_bshd(h, lay, "out", &b));
  const float *x = sta_tensor_data(h);
  for (int64_t i = 0; i < b.b * b.s * b.h; i++) {
    const int64_t bb = i / (b.s * b.h), ss = (i / b.h) % b.s, hh = i % b.h;
    const float *r = x + bb * b.sb + ss * b.ss + hh * b.sh;
    flags[i] = 0;
    for (int64_t d = 0; d < b.d; d++) flags[i] |= !isfinite(r[d]);
  }
  sta_tensor_destroy(h);
}

/* Non-finite inputs on CUDA (the host's test_fp8_nonfinite): one NaN or Inf
** element makes the same output rows non-finite in the fp8 forward on the
** device, the CPU's fp8 reference and the native (bf16) forward on the
** device, and no others (the pre-pass keeps it out of the channel stats). */
static void test_fp8_nonfinite(void **state) {
  NEED_GPU();
  static const struct { int which; float v; const char *what; } cs[] = {
    {1, NAN, "NaN in k"}, {2, NAN, "NaN in v"}, {2, INFINITY, "Inf in v"}, {0, NAN, "NaN in q"}};
  for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    sta_geometry_init(&d.geom, 6, 16, 16);
    int32_t w[3] = {1, 1, 1};
    d.n_windows = 1;
    d.windows = w;
    d.precision = STA_PRECISION_FP8;
    const int64_t S = 6 * 16 * 16 + 8, H = 2, D = 128;
    int64_t shape[4] = {1, S, H, D};
    sta_tensor *hx[3], *dx[3], *o[3];
    for (int i = 0; i < 3; i++) {
      sta_tensor *f = NULL;
      OK(sta_tensor_create(&f, STA_F32, STA_CPU, 4, shape));
      OK(sta_tensor_randn(f, sta_test_rnd(), 0.0, 1.0));
      if (i == cs[c].which)
        ((float *)sta_tensor_data(f))[(sta_test_rint(0, S - 1) * H + sta_test_rint(0, H - 1)) * D +
                                      sta_test_rint(0, D - 1)] = cs[c].v;
      OK(sta_tensor_to(&hx[i], f, STA_BF16, STA_CPU));
      OK(sta_tensor_to(&dx[i], f, STA_BF16, STA_CUDA));
      sta_tensor_destroy(f);
    }
    OK(sta_tensor_create(&o[0], STA_BF16, STA_CUDA, 4, shape));
    OK(sta_tensor_create(&o[1], STA_BF16, STA_CUDA, 4, shape));
    /* the output's dtype is the inputs' (bf16), on the host too */
    OK(sta_tensor_create(&o[2], STA_BF16, STA_CPU, 4, shape));
    OK(sta_attention_forward(&d, dx[0], dx[1], dx[2], o[0], NULL));
    OK(sta_attention_forward(&d, hx[0], hx[1], hx[2], o[2], NULL));
    d.precision = STA_PRECISION_NATIVE;
    OK(sta_attention_forward(&d, dx[0], dx[1], dx[2], o[1], NULL));
    char *fl[3];
    int64_t bad = 0;
    for (int i = 0; i < 3; i++) {
      fl[i] = malloc((size_t)(S * H));
      nonfinite_rows(o[i], STA_BSHD, fl[i]);
    }
    for (int64_t i = 0; i < S * H; i++) {
      if (fl[0][i] != fl[1][i] || fl[0][i] != fl[2][i])
        fail_msg("%s: row %lld head %lld: fp8 on cuda %d, native on cuda %d, fp8 on the host %d "
                 "(1: non-finite)", cs[c].what, (long long)(i / H), (long long)(i % H), fl[0][i],
                 fl[1][i], fl[2][i]);
      bad += fl[0][i];
    }
    if (!(bad > 0 && bad < S * H / 2))
      fail_msg("%s: %lld non-finite rows of %lld", cs[c].what, (long long)bad, (long long)(S * H));
    for (int i = 0; i < 3; i++) {
      free(fl[i]);
      sta_tensor_destroy(hx[i]); sta_tensor_destroy(dx[i]); sta_tensor_destroy(o[i]);
    }
  }
}

/* Bad input on CUDA at FP8: the backend's limits, out and lse untouched. */
static void test_fp8_errors(void **state) {
  NEED_GPU();
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 2, 8, 8);
  int32_t w[3] = {1, 1, 1};
  d.n_windows = 1;
  d.windows = w;
  d.precision = STA_PRECISION_FP8;
  static const struct { sta_dtype dt; int64_t D; sta_status rc; const char *msg; } cs[] = {
    {STA_F16, 160, STA_ERR_UNSUPPORTED,
     "attention: head_dim 160 not supported on cuda (64 or 128)"},
    {STA_BF16, 32, STA_ERR_UNSUPPORTED,
     "attention: head_dim 32 not supported on cuda (64 or 128)"}};
  for (int c = 0; c < 2; c++) {
    int64_t shape[4] = {1, 128, 1, cs[c].D}, ls[3] = {1, 1, 128};
    sta_tensor *h = NULL, *q = NULL, *o = NULL, *l = NULL;
    OK(sta_tensor_create(&h, STA_F32, STA_CPU, 4, shape));
    OK(sta_tensor_randn(h, sta_test_rnd(), 0, 1));
    OK(sta_tensor_to(&q, h, cs[c].dt, STA_CUDA));
    OK(sta_tensor_create(&o, cs[c].dt, STA_CUDA, 4, shape));
    OK(sta_tensor_create(&l, STA_F32, STA_CUDA, 3, ls));
    OK(sta_tensor_fill(o, 7.0));
    OK(sta_tensor_fill(l, 7.0));
    assert_int_equal(sta_attention_forward(&d, q, q, q, o, l), cs[c].rc);
    assert_string_equal(sta_last_error(), cs[c].msg);
    expect_fill(o, 7.0, "out");
    expect_fill(l, 7.0, "lse");
    sta_tensor_destroy(h); sta_tensor_destroy(q); sta_tensor_destroy(o); sta_tensor_destroy(l);
  }
}

/* A layer at FP8 on CUDA: the bits of sta_attention_forward at FP8; and
** sta_attention_forward_fp8 on CUDA tensors (dequantized on the device)
** against the same on the host, random scales. */
static void test_fp8_layer_and_8bit_operands(void **state) {
  NEED_GPU();
  int32_t w[3] = {1, 3, 1};
  sta_strategy *st = NULL;
  OK(sta_strategy_uniform(&st, 1, 1, 2, w, NULL, 0));
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 2; ld.head_dim = 64; ld.sp_size = 1; ld.backend = STA_CUDA;
  sta_geometry_init(&ld.geom, 6, 24, 16);
  ld.strategy = st;
  ld.precision = STA_PRECISION_FP8;
  sta_layer *ly = NULL;
  OK(sta_layer_create(&ly, &ld));
  const int64_t S = 6 * 24 * 16;
  int64_t shape[4] = {1, S, 2, 64}, ls[3] = {1, 2, S}, cs[3] = {1, 2, 64};
  sta_tensor *h = NULL, *q = NULL, *o = NULL, *o2 = NULL, *q8h = NULL, *q8 = NULL;
  sta_tensor *sch = NULL, *vsh = NULL, *sc = NULL, *vs = NULL, *oh = NULL;
  OK(sta_tensor_create(&h, STA_F32, STA_CPU, 4, shape));
  OK(sta_tensor_randn(h, sta_test_rnd(), 0, 1));
  OK(sta_tensor_to(&q, h, STA_BF16, STA_CUDA));
  OK(sta_tensor_to(&q8h, h, STA_F8E4M3, STA_CPU));
  OK(sta_tensor_to(&q8, q8h, STA_F8E4M3, STA_CUDA));
  OK(sta_tensor_create(&o, STA_BF16, STA_CUDA, 4, shape));
  OK(sta_tensor_create(&o2, STA_BF16, STA_CUDA, 4, shape));
  OK(sta_tensor_create(&sch, STA_F32, STA_CPU, 3, ls));
  OK(sta_tensor_randn(sch, sta_test_rnd(), 1.0, 0.2));
  OK(sta_tensor_create(&vsh, STA_F32, STA_CPU, 3, cs));
  OK(sta_tensor_randn(vsh, sta_test_rnd(), 1.0, 0.2));
  OK(sta_tensor_to(&sc, sch, STA_F32, STA_CUDA));
  OK(sta_tensor_to(&vs, vsh, STA_F32, STA_CUDA));
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  OK(sta_forward_batch_create(&fb, 1));
  OK(sta_context_push(&ctx, 0, NULL, fb));
  OK(sta_layer_forward(ly, q, q, q, o));
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  d.geom = ld.geom;
  d.n_windows = 1;
  d.windows = w;
  d.precision = STA_PRECISION_FP8;
  OK(sta_attention_forward(&d, q, q, q, o2, NULL));
  if (!same_bits(o, o2)) fail_msg("fp8 layer: not the forward's bits (rel %g)", rel_l2(o, o2));
  OK(sta_tensor_fill(o, 7.0));
  OK(sta_attention_forward_fp8(&d, q8, q8, q8, sc, sc, vs, o, NULL));
  OK(sta_tensor_create(&oh, STA_F32, STA_CPU, 4, shape));
  OK(sta_attention_forward_fp8(&d, q8h, q8h, q8h, sch, sch, vsh, oh, NULL));
  const double r = rel_l2(o, oh);
  if (!(r < FP8_REL)) fail_msg("forward_fp8 on cuda against the host: rel L2 %g", r);
  OK(sta_context_pop(ctx));
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(ly);
  sta_strategy_destroy(st);
  sta_tensor_destroy(h); sta_tensor_destroy(q); sta_tensor_destroy(o); sta_tensor_destroy(o2);
  sta_tensor_destroy(q8h); sta_tensor_destroy(q8); sta_tensor_destroy(sc);
  sta_tensor_destroy(vs); sta_tensor_destroy(sch); sta_tensor_destroy(vsh);
  sta_tensor_destroy(oh);
}

int main(void) {
  sta_test_begin(1, 0);
  if (sta_backend_available(STA_CUDA)) printf("# %s\n", sta_backend_describe(STA_CUDA));
  else printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
#ifdef STA_WITH_CUDA
  /* the CPU reference steps its running maximum as this build's kernel
  ** does (128 keys; 64 where built with STA_FP8_HALF): the tests run on
  ** this thread */
  for (int32_t d = 64; d <= 128; d += 64) {
    sta_fp8_set_step_test(d, sta_cuda_fp8_step_test(d));
    printf("# fp8 kernel: %d keys a softmax step at D %d\n", (int)sta_cuda_fp8_step_test(d), (int)d);
  }
#endif
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prepass_bits),
    cmocka_unit_test(test_prepass_bits_extremes),
    cmocka_unit_test(test_prepass_bits_large),
    cmocka_unit_test(test_fp8_forward),
    cmocka_unit_test(test_fp8_forward_tiles),
    cmocka_unit_test(test_fp8_nonfinite),
    cmocka_unit_test(test_fp8_errors),
    cmocka_unit_test(test_fp8_layer_and_8bit_operands),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
