/* test_gpu_vsa.c -- VSA on CUDA (STA.md section 12) against the CPU, in
** groups that run apart (scripts/device/gpu-check-vsa runs each in its own
** process, STA_TEST_FILTER, so that a failed fine backward, whose CUDA
** error is sticky, cannot take the forward's checks with it):
**   test_gpu_fwd_*: the coarse branch and selection (the same cubes
**     exactly, out_c and lse_c to float rounding), ties, the cube order,
**     the forward against the double reference on random problems (cube
**     sizes 16..64 and 60..256, q with its own cubes, gate, layouts, bf16
**     and f16, D 64 and 128; padding rows 0), bit-identical reruns;
**   test_gpu_bwd_*: the backward (its fine branch: the block-list
**     attention's backward) against the double reference, bit-identical
**     reruns;
**   test_gpu_bench_forward, test_gpu_bench_backward (STA_VSA_BENCH=1):
**     the timing at hunyuan-720p (30x48x80 canvas, 24 heads, D 128, bf16,
**     sparsity 0.875; spec/vsa_bench.h), STA_VSA_REPS calls (10).
** The inputs are drawn on each device from one seed (randn gives the same
** bits everywhere) and kept clear of near ties.  Skips without a CUDA
** device; STA_VSA_HOST=1 runs everything on the CPU instead (the test's
** own host code walked where there is no GPU: small sizes, STA_GPU_QUICK).
** STA_TEST_SEED replays a run; STA_GPU_CASES sets the forward's random
** cases (24), STA_GPU_BWD_CASES the backward's (24); STA_GPU_QUICK takes 3
** small ones (compute-sanitizer).  Each case is announced on stdout (line
** buffered) before it runs, so a cut-off log names the case it stopped in. */
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
#include "vsa_bench.h"
#include "vsa_case.h"

static int quick(void) { return getenv("STA_GPU_QUICK") != NULL; }

/* The device under test: CUDA, or the CPU under STA_VSA_HOST=1. */
static sta_device dut(void) { return sta_backend_available(STA_CUDA) ? STA_CUDA : STA_CPU; }
#define NEED_DEV()                                                           \
  do {                                                                       \
    (void)state;                                                             \
    if (!sta_backend_available(STA_CUDA) && !getenv("STA_VSA_HOST")) skip(); \
  } while (0)

/* Tests of the whole VSA need the fine branch, the block-list attention
** (the block-sparse kernels): skipped, saying so, without. */
#define NEED_FINE()                                                                  \
  do {                                                                               \
    const sta_backend_ops *be_ = sta_backend_get(dut());                             \
    if (dut() != STA_CPU && !(be_->masks & (1 << STA_MASK_BLOCKS))) {                \
      printf("# the block-list attention is not on cuda in this build: skipped\n"); \
      skip();                                                                        \
    }                                                                                \
  } while (0)

static int env_cases(const char *name, int dflt) {
  const char *s = getenv(name);
  if (quick() || (getenv("STA_VSA_HOST") && !sta_backend_available(STA_CUDA))) return 3;
  return s && atoi(s) > 0 ? atoi(s) : dflt;
}

/* A random case; *c settled (seed) on the host set h, g its device twin. */
static void random_case(vcase *c, int i) {
  const int small = quick() || dut() == STA_CPU;
  vcase_init(c);
  c->dtype = i % 2 ? STA_F16 : STA_BF16;
  c->layout = i % 3 ? STA_BSHD : STA_BHSD;
  c->br = i % 5 == 4 ? 256 : 64;
  c->lo = c->br == 256 ? 60 : 16;
  c->mk = sta_test_rint(2, small ? 5 : 24);
  c->mq = i % 4 == 1 ? sta_test_rint(1, small ? 5 : 24) : c->mk;
  c->qown = i % 3 == 2;
  c->topk = (int32_t)sta_test_rint(1, c->mk);
  c->B = sta_test_rint(1, 2);
  c->H = sta_test_rint(1, 3);
  c->D = i % 2 ? 64 : 128;
  c->gate = i % 4 != 3;
  c->scale = i % 5 == 2 ? 0.05f : 0.0f;
  c->seed = sta_test_rnd() % 1000000;
}

static void twins(vcase *c, vset *h, vset *g) {
  vset_make_clear(h, c);
  vcase cd = *c;
  cd.dev = dut();
  vset_make(g, &cd);
  double mx = 1;
  assert_int_equal(sta_tensor_compare(g->q, h->q, &mx, NULL), STA_OK);
  if (!(mx == 0.0) && !isnan(mx)) fail_msg("the device's inputs differ from the host's (%g)", mx);
}

/* A host copy of a device tensor (NULL for NULL). */
static sta_tensor *host(const sta_tensor *t) {
  sta_tensor *x = NULL;
  if (t && sta_tensor_to(&x, t, sta_tensor_dtype(t), STA_CPU) != STA_OK)
    fail_msg("copy to the host: %s", sta_last_error());
  return x;
}

/* A call's status, and on CUDA its kernels' (a fault surfaces at the next
** synchronization): what failed is named here, not at a later copy. */
static void call_ok(sta_status rc, const char *what, const char *which) {
  if (rc == STA_OK && dut() == STA_CUDA) rc = sta_cuda_synchronize();
  if (rc != STA_OK) fail_msg("%s: %s: %s", what, sta_last_error(), which);
}

/* sta_vsa_coarse of a set into fresh tensors on its device. */
static void coarse(const vcase *c, vset *s, sta_device dev, sta_tensor **t) {
  const int64_t n4[4] = {c->B, c->H, c->mq, c->D}, ni[4] = {c->B, c->H, c->mq, c->topk};
  assert_int_equal(sta_tensor_create(&t[0], STA_F32, dev, 4, n4), STA_OK);
  assert_int_equal(sta_tensor_create(&t[1], STA_F32, dev, 3, n4), STA_OK);
  assert_int_equal(sta_tensor_create(&t[2], STA_I32, dev, 4, ni), STA_OK);
  assert_int_equal(sta_tensor_create(&t[3], STA_I32, dev, 3, ni), STA_OK);
  if (sta_vsa_coarse(&s->d, s->q, s->k, s->v, t[0], t[1], t[2], t[3]) != STA_OK)
    fail_msg("coarse on %s: %s", sta_device_name(dev), sta_last_error());
}

/* ---- what needs no fine backward -------------------------------------------------- */

static void test_gpu_fwd_coarse(void **state) {
  NEED_DEV();
  const int n = env_cases("STA_GPU_CASES", 24);
  for (int i = 0; i < n; i++) {
    vcase c;
    vset h, g;
    random_case(&c, i);
    twins(&c, &h, &g);
    sta_tensor *th[4], *tg[4], *back[4];
    coarse(&c, &h, STA_CPU, th);
    coarse(&c, &g, dut(), tg);
    for (int j = 0; j < 4; j++) back[j] = host(tg[j]);
    const size_t ni = (size_t)(c.B * c.H * c.mq);
    if (memcmp(sta_tensor_data(back[2]), sta_tensor_data(th[2]), ni * (size_t)c.topk * 4))
      fail_msg("selection differs from the CPU's: %s", vsa_describe(&c));
    assert_memory_equal(sta_tensor_data(back[3]), sta_tensor_data(th[3]), ni * 4);
    double rel = 1, mx = 1;
    assert_int_equal(sta_tensor_compare(back[0], th[0], NULL, &rel), STA_OK);
    assert_int_equal(sta_tensor_compare(back[1], th[1], &mx, NULL), STA_OK);
    if (!(rel < 2e-5) || !(mx < 2e-5))
      fail_msg("out_c rel %g, lse_c max %g: %s", rel, mx, vsa_describe(&c));
    for (int j = 0; j < 4; j++) {
      sta_tensor_destroy(th[j]); sta_tensor_destroy(tg[j]); sta_tensor_destroy(back[j]);
    }
    vset_free(&h);
    vset_free(&g);
  }
}

/* Copies of one key cube tie exactly on the device too: the lower index. */
static void test_gpu_fwd_ties(void **state) {
  NEED_DEV();
  vcase c;
  vcase_init(&c);
  c.dev = dut(); c.dtype = STA_BF16; c.D = 64; c.mq = c.mk = 9; c.topk = 4; c.sizes = 0;
  c.seed = 5;
  vset g;
  vset_make(&g, &c);
  for (int64_t n = 1; n < c.mk; n++) vsa_copy_cube(&c, &g, 0, n);
  sta_tensor *t[4], *idx;
  coarse(&c, &g, c.dev, t);
  idx = host(t[2]);
  const int32_t *x = sta_tensor_data(idx);
  for (int64_t i = 0; i < c.B * c.H * c.mq; i++)
    for (int32_t j = 0; j < c.topk; j++) assert_int_equal(x[i * c.topk + j], j);
  sta_tensor_destroy(idx);
  for (int j = 0; j < 4; j++) sta_tensor_destroy(t[j]);
  vset_free(&g);
}

static void test_gpu_fwd_cubes(void **state) {
  NEED_DEV();
  for (int i = 0; i < (quick() ? 2 : 8); i++) {
    int32_t cv[3] = {(int32_t)sta_test_rint(1, 9), (int32_t)sta_test_rint(1, 17),
                     (int32_t)sta_test_rint(1, 17)};
    int32_t cb[3] = {4, i % 2 ? 8 : 4, i % 2 ? 8 : 4};
    int64_t count;
    assert_int_equal(sta_vsa_cube_count(cv, cb, &count), STA_OK);
    const int64_t V = (int64_t)cv[0] * cv[1] * cv[2], rows = count * cb[0] * cb[1] * cb[2];
    vcase c;
    vcase_init(&c);
    c.H = 3; c.D = 8; c.layout = i % 2 ? STA_BHSD : STA_BSHD;
    sta_tensor *u = vsa_t4(&c, V, STA_BF16), *ch = vsa_t4(&c, rows, STA_BF16), *du = NULL;
    assert_int_equal(sta_tensor_randn(u, (uint64_t)i + 1, 0, 1), STA_OK);
    assert_int_equal(sta_tensor_to_cubes(ch, u, cv, cb, c.layout), STA_OK);
    assert_int_equal(sta_tensor_to(&du, u, STA_BF16, dut()), STA_OK);
    c.dev = dut();
    sta_tensor *dc = vsa_t4(&c, rows, STA_BF16), *db = vsa_t4(&c, V, STA_BF16);
    assert_int_equal(sta_tensor_fill(dc, NAN), STA_OK);
    assert_int_equal(sta_tensor_to_cubes(dc, du, cv, cb, c.layout), STA_OK);
    assert_int_equal(sta_tensor_from_cubes(db, dc, cv, cb, c.layout), STA_OK);
    double m1 = 1, m2 = 1;
    assert_int_equal(sta_tensor_compare(dc, ch, &m1, NULL), STA_OK);
    assert_int_equal(sta_tensor_compare(db, u, &m2, NULL), STA_OK);
    assert_true(m1 == 0.0 && m2 == 0.0);
    sta_tensor *sz = NULL, *hs = NULL;
    assert_int_equal(sta_tensor_create(&sz, STA_I32, dut(), 1, &count), STA_OK);
    assert_int_equal(sta_vsa_cube_sizes(sz, cv, cb), STA_OK);
    hs = host(sz);
    int64_t total = 0;
    for (int64_t m = 0; m < count; m++) total += ((const int32_t *)sta_tensor_data(hs))[m];
    assert_int_equal(total, V);
    sta_tensor *t[7] = {u, ch, du, dc, db, sz, hs};
    for (int j = 0; j < 7; j++) sta_tensor_destroy(t[j]);
  }
}

/* The device's forward and backward (call_ok names a fault's call). */
static void run(vset *g, int backward, const char *which) {
  call_ok(sta_vsa_forward(&g->d, g->q, g->k, g->v, g->gate, g->out, g->lse), "forward", which);
  if (backward)
    call_ok(sta_vsa_backward(&g->d, g->q, g->k, g->v, g->gate, g->out, g->lse, g->dout, g->dq,
                             g->dk, g->dv, g->dg),
            "backward (its fine branch: the block-list attention's backward)", which);
}

/* The forward (backward 0: out, lse) or the backward (dq, dk, dv, dgate)
** against the double reference on random cases. */
static void against_reference(int backward) {
  const int n = env_cases(backward ? "STA_GPU_BWD_CASES" : "STA_GPU_CASES", 24);
  const char *what = backward ? "backward" : "forward";
  for (int i = 0; i < n; i++) {
    vcase c, c32;
    vset h, g, r;
    random_case(&c, i);
    twins(&c, &h, &g);
    printf("# %s case %d/%d: %s\n", what, i + 1, n, vsa_describe(&c));
    vsa_widen(&c, &h, &c32, &r);
    run(&g, backward, vsa_describe(&c));
    const sta_status rc =
        backward ? sta_vsa_backward_reference(&r.d, r.q, r.k, r.v, r.gate, r.dout, r.dq, r.dk, r.dv,
                                              r.dg)
                 : sta_vsa_reference(&r.d, r.q, r.k, r.v, r.gate, r.out, r.lse);
    if (rc != STA_OK) fail_msg("%s reference: %s", what, sta_last_error());
    const sta_tensor *got[6], *want[6];
    const sta_tensor *const gs[6] = {g.out, g.dq, g.dk, g.dv, g.dg, g.lse};
    const sta_tensor *const rs[6] = {r.out, r.dq, r.dk, r.dv, r.dg, r.lse};
    for (int j = 0; j < 6; j++) {
      const int mine = backward ? j >= 1 && j <= 4 : j == 0 || j == 5;
      got[j] = mine ? host(gs[j]) : NULL;
      want[j] = mine ? rs[j] : NULL;
    }
    vsa_check(&c, &h, got, want, c.dtype == STA_BF16 ? 1e-2 : 3e-3, /* as test_gpu_backward */
              c.dtype == STA_BF16 ? 3e-2 : 1e-2, 1e-2, what);
    for (int j = 0; j < 6; j++) sta_tensor_destroy((sta_tensor *)got[j]);
    vset_free(&h); vset_free(&g); vset_free(&r);
  }
}

/* Two runs on two sets of the same inputs (deterministic asked for): the
** same bits of out and lse, or of the gradients. */
static void same_bits(int backward) {
  vcase c;
  vset a, b;
  vcase_init(&c);
  c.dev = dut(); c.dtype = STA_BF16; c.D = 128; c.mq = c.mk = quick() ? 4 : 16;
  c.topk = (int32_t)c.mk / 2; c.gate = 1; c.H = 2; c.seed = 9;
  vset_make(&a, &c);
  vset_make(&b, &c);
  a.d.deterministic = b.d.deterministic = 1;
  run(&a, backward, "the bits case");
  run(&b, backward, "the bits case");
  static const char *const N[6] = {"out", "lse", "dq", "dk", "dv", "dgate"};
  sta_tensor *x[6] = {a.out, a.lse, a.dq, a.dk, a.dv, a.dg}, *y[6] = {b.out, b.lse, b.dq, b.dk, b.dv, b.dg};
  for (int i = backward ? 2 : 0; i < (backward ? 6 : 2); i++) {
    sta_tensor *hx = host(x[i]), *hy = host(y[i]);
    const size_t bytes = (size_t)sta_tensor_numel(hx) * sta_dtype_size(sta_tensor_dtype(hx));
    if (memcmp(sta_tensor_data(hx), sta_tensor_data(hy), bytes))
      fail_msg("%s: two runs differ", N[i]);
    sta_tensor_destroy(hx); sta_tensor_destroy(hy);
  }
  vset_free(&a); vset_free(&b);
}

static void test_gpu_fwd_reference(void **state) {
  NEED_DEV();
  NEED_FINE();
  against_reference(0);
}

static void test_gpu_fwd_bits(void **state) {
  NEED_DEV();
  NEED_FINE();
  same_bits(0);
}

/* ---- the backward (the fine backward: the block-list attention's) ---------------- */

static void test_gpu_bwd_reference(void **state) {
  NEED_DEV();
  NEED_FINE();
  against_reference(1);
}

static void test_gpu_bwd_bits(void **state) {
  NEED_DEV();
  NEED_FINE();
  same_bits(1);
}

/* ---- timing at hunyuan-720p (STA_VSA_BENCH=1; spec/vsa_bench.h) ------------------ */

static vbench hunyuan(void) {
  const char *r = getenv("STA_VSA_REPS");
  vbench b = {"hunyuan-720p", {30, 48, 80}, 24, 128, STA_BF16, 0.875, dut(),
              r && atoi(r) > 0 ? atoi(r) : 10};
  if (dut() == STA_CPU) { /* the host walk: small */
    b.name = "host walk"; b.canvas[0] = 5; b.canvas[1] = 6; b.canvas[2] = 10; b.H = 2; b.D = 16;
    b.reps = 2;
  }
  return b;
}

static void test_gpu_bench_forward(void **state) {
  NEED_DEV();
  if (!getenv("STA_VSA_BENCH")) skip();
  NEED_FINE();
  const vbench b = hunyuan();
  const double r = vb_bench_forward(&b);
  assert_true(r > 0 && isfinite(r));
}

static void test_gpu_bench_backward(void **state) {
  NEED_DEV();
  if (!getenv("STA_VSA_BENCH")) skip();
  NEED_FINE();
  const vbench b = hunyuan();
  const double r = vb_bench_backward(&b);
  assert_true(r > 0 && isfinite(r));
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a log cut off or crashed keeps every line */
  sta_test_begin(40503u, 29);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_gpu_fwd_coarse),     cmocka_unit_test(test_gpu_fwd_ties),
      cmocka_unit_test(test_gpu_fwd_cubes),      cmocka_unit_test(test_gpu_fwd_reference),
      cmocka_unit_test(test_gpu_fwd_bits),       cmocka_unit_test(test_gpu_bwd_reference),
      cmocka_unit_test(test_gpu_bwd_bits),       cmocka_unit_test(test_gpu_bench_forward),
      cmocka_unit_test(test_gpu_bench_backward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
