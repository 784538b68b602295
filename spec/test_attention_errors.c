/* test_attention_errors.c -- every error path of sta_attention_forward /
** sta_attn_resolve and sta_head_diff: the exact status and message, and
** out and lse unchanged. */
#include <math.h>
#include <stdlib.h>

#include "attention_util.h"

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
