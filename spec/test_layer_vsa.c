/* test_layer_vsa.c -- a layer in VSA mode (sta.h, sta_layer_mode): its
** creation checks, the forward batch's sparsity (SGLang's VSA_sparsity)
** made a topk per step, dense steps, the forward and backward equal to
** sta_vsa_forward / _backward with that topk (the same bits), what
** sta_layer_resolve_vsa returns, and the errors of each call in order with
** nothing changed. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed_base;
static uint64_t next_seed(void) { return seed_base++ * 0x9e3779b97f4a7c15ull + 1; }

/* canvas 5x6x7 in 4x4x4 cubes: 2x2x2 = 8 cubes, every one partial but the
** first; 512 rows */
enum { T = 5, H = 6, W = 7, CUBES = 8, ROWS = CUBES * 64, HEADS = 2, D = 16 };

static sta_tensor *randn4(int64_t a, int64_t b, int64_t c, int64_t d) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {a, b, c, d};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

static sta_tensor *like(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_create(&c, sta_tensor_dtype(t), STA_CPU, sta_tensor_ndim(t),
                                     (int64_t[]){sta_tensor_size(t, 0), sta_tensor_size(t, 1),
                                                 sta_tensor_size(t, 2), sta_tensor_size(t, 3)}),
                   STA_OK);
  assert_int_equal(sta_tensor_randn(c, next_seed(), 0.0, 1.0), STA_OK);
  return c;
}

static sta_tensor *lse_of(int64_t b, int64_t h, int64_t s) {
  sta_tensor *t = NULL;
  int64_t shape[3] = {b, h, s};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 3, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

/* Contiguous host tensors of one shape and dtype, bit for bit (lse -inf
** included). */
static void assert_bits(const sta_tensor *a, const sta_tensor *b) {
  assert_int_equal(sta_tensor_numel(a), sta_tensor_numel(b));
  assert_memory_equal(sta_tensor_data(a), sta_tensor_data(b),
                      (size_t)sta_tensor_numel(a) * sta_dtype_size(sta_tensor_dtype(a)));
}

static sta_layer_desc vsa_desc(void) {
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.layer_index = 3;
  d.local_heads = HEADS;
  d.head_dim = D;
  d.sp_size = 1;
  sta_geometry_init(&d.geom, T, H, W);
  d.layout = STA_BSHD;
  d.backend = STA_CPU;
  d.mode = STA_LAYER_VSA;
  d.dense_steps = 2;
  return d;
}

static void test_create_errors(void **state) {
  (void)state;
  sta_layer *l = NULL;
  sta_layer_desc d;
#define BAD(field, value, status, msg)                    \
  do {                                                    \
    d = vsa_desc();                                       \
    d.field = value;                                      \
    EXPECT_ERR(sta_layer_create(&l, &d), status, msg);    \
    assert_null(l);                                       \
  } while (0)
  BAD(mode, (sta_layer_mode)7, STA_ERR_ARGUMENT,
      "mode: expected STA_LAYER_STA (0) or STA_LAYER_VSA (1), got 7");
  d = vsa_desc();
  d.geom.canvas[0] = d.geom.canvas[1] = d.geom.canvas[2] = 0;
  EXPECT_ERR(sta_layer_create(&l, &d), STA_ERR_WINDOW,
             "geom: a VSA layer needs its canvas (the cubes are cut from it), got 0x0x0");
  assert_null(l);
  BAD(cube[0], 3, STA_ERR_WINDOW, "cube: H = 0, expected 1..4096");
  d = vsa_desc();
  d.cube[0] = 3; d.cube[1] = 4; d.cube[2] = 4;
  EXPECT_ERR(sta_layer_create(&l, &d), STA_ERR_ARGUMENT,
             "cube: 3x4x4 holds 48 tokens, expected 64 (4x4x4) or 256 (4x8x8)");
  BAD(dense_steps, -1, STA_ERR_ARGUMENT, "dense_steps: expected >= 0, got -1");
  BAD(geom.text_len, 5, STA_ERR_UNSUPPORTED, "text_len: a VSA layer has no text rows, got 5");
  BAD(sp_size, 2, STA_ERR_UNSUPPORTED, "sp_size: a VSA layer runs on one rank, got 2");
  BAD(softmax, STA_SOFTMAX_FAST, STA_ERR_UNSUPPORTED,
      "softmax: a VSA layer computes the exact softmax");
  BAD(precision, STA_PRECISION_FP8, STA_ERR_UNSUPPORTED,
      "precision: a VSA layer computes in native precision (fp8 runs the window only)");
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_create(&s), STA_OK);
  BAD(strategy, s, STA_ERR_UNSUPPORTED,
      "strategy: a VSA layer takes its sparsity from the forward batch, not from a window "
      "strategy");
  /* and set later */
  d = vsa_desc();
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  EXPECT_ERR(sta_layer_set_strategy(l, s), STA_ERR_UNSUPPORTED,
             "strategy: a VSA layer takes its sparsity from the forward batch, not from a "
             "window strategy");
  assert_int_equal(sta_layer_set_strategy(l, NULL), STA_OK);
  sta_layer_destroy(l);
  sta_strategy_destroy(s);
#undef BAD
}

static void test_batch_sparsity(void **state) {
  (void)state;
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_true(sta_forward_batch_vsa_sparsity(fb) == 0.0);
  assert_int_equal(sta_forward_batch_set_vsa_sparsity(fb, 0.875), STA_OK);
  EXPECT_ERR(sta_forward_batch_set_vsa_sparsity(fb, 1.0), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got 1");
  EXPECT_ERR(sta_forward_batch_set_vsa_sparsity(fb, -0.5), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got -0.5");
  EXPECT_ERR(sta_forward_batch_set_vsa_sparsity(fb, NAN), STA_ERR_ARGUMENT,
             "sparsity: expected a value in [0, 1), got nan");
  assert_true(sta_forward_batch_vsa_sparsity(fb) == 0.875);
  sta_forward_batch_destroy(fb);
  assert_true(sta_forward_batch_vsa_sparsity(NULL) == 0.0);
}

/* The layer (cube c, canvas t x h x w, cubes n) against sta_vsa_forward and
** _backward at each step of a context with sparsity s: the same bits. */
static void run_steps(const int32_t cube[3], int32_t t, int32_t h, int32_t w, int64_t n,
                      double s, sta_layout layout) {
  sta_layer_desc d = vsa_desc();
  memcpy(d.cube, cube, sizeof d.cube);
  sta_geometry_init(&d.geom, t, h, w);
  d.layout = layout;
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  const int64_t br = (int64_t)cube[0] * cube[1] * cube[2], rows = n * br;
  const int bshd = layout == STA_BSHD;
  sta_tensor *q = bshd ? randn4(2, rows, HEADS, D) : randn4(2, HEADS, rows, D);
  sta_tensor *k = like(q), *v = like(q), *dout = like(q);
  sta_tensor *sizes = NULL;
  assert_int_equal(sta_tensor_create(&sizes, STA_I32, STA_CPU, 1, &n), STA_OK);
  int32_t canvas[3] = {t, h, w};
  assert_int_equal(sta_vsa_cube_sizes(sizes, canvas, cube), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_forward_batch_set_vsa_sparsity(fb, s), STA_OK);
  for (int32_t step = 0; step < 4; step++) {
    sta_context *c = NULL;
    assert_int_equal(sta_context_push(&c, step, NULL, fb), STA_OK);
    int32_t topk = 0;
    assert_int_equal(sta_vsa_topk(step < 2 ? 0.0 : s, n, &topk), STA_OK);
    sta_vsa_desc got;
    int32_t gc[3] = {0, 0, 0}, gcube[3] = {0, 0, 0};
    assert_int_equal(sta_layer_resolve_vsa(l, q, &got, gc, gcube), STA_OK);
    assert_int_equal(got.topk, topk);
    assert_int_equal(got.block_rows, (int32_t)br);
    assert_int_equal(got.layout, layout);
    assert_memory_equal(gc, canvas, sizeof gc);
    assert_memory_equal(gcube, cube, sizeof gcube);
    sta_vsa_desc want = {0};
    want.layout = layout; want.block_rows = (int32_t)br; want.topk = topk; want.kv_sizes = sizes;
    sta_tensor *o1 = like(q), *o2 = like(q);
    sta_tensor *l1 = lse_of(2, HEADS, rows), *l2 = lse_of(2, HEADS, rows);
    assert_int_equal(sta_layer_forward_lse(l, q, k, v, o1, l1), STA_OK);
    assert_int_equal(sta_vsa_forward(&want, q, k, v, NULL, o2, l2), STA_OK);
    assert_bits(o1, o2);
    assert_bits(l1, l2);
    sta_tensor *g1[3] = {like(q), like(q), like(q)}, *g2[3] = {like(q), like(q), like(q)};
    assert_int_equal(sta_layer_backward(l, q, k, v, o1, l1, dout, g1[0], g1[1], g1[2]), STA_OK);
    assert_int_equal(sta_vsa_backward(&want, q, k, v, NULL, o2, l2, dout, g2[0], g2[1], g2[2],
                                      NULL), STA_OK);
    for (int i = 0; i < 3; i++) {
      assert_bits(g1[i], g2[i]);
      sta_tensor_destroy(g1[i]);
      sta_tensor_destroy(g2[i]);
    }
    sta_tensor_destroy(o1); sta_tensor_destroy(o2);
    sta_tensor_destroy(l1); sta_tensor_destroy(l2);
    assert_int_equal(sta_context_pop(c), STA_OK);
  }
  sta_tensor *ts[6] = {q, k, v, dout, sizes, NULL};
  for (int i = 0; ts[i]; i++) sta_tensor_destroy(ts[i]);
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(l);
}

static void test_steps_64(void **state) {
  (void)state;
  /* 0.6 of 8 cubes leaves ceil(3.2) = 4; the dense steps 8 */
  run_steps((int32_t[]){4, 4, 4}, T, H, W, CUBES, 0.6, STA_BSHD);
  run_steps((int32_t[]){4, 4, 4}, T, H, W, CUBES, 0.875, STA_BHSD);
}

static void test_steps_256(void **state) {
  (void)state;
  /* 4x8x8 cubes of a 6x9x17 canvas: 2x2x3 = 12 cubes */
  run_steps((int32_t[]){4, 8, 8}, 6, 9, 17, 12, 0.5, STA_BSHD);
}

static void test_forward_errors(void **state) {
  (void)state;
  sta_layer_desc d = vsa_desc();
  sta_layer *l = NULL, *sta = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  sta_tensor *q = randn4(1, ROWS, HEADS, D), *k = like(q), *v = like(q), *out = like(q);
  sta_tensor *poison = like(q);
  assert_int_equal(sta_tensor_copy(poison, out), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  sta_context *c = NULL;
  sta_vsa_desc vd;
#define FWD_ERR(status, msg)                                        \
  do {                                                              \
    EXPECT_ERR(sta_layer_forward(l, q, k, v, out), status, msg);    \
    assert_bits(out, poison);                                       \
  } while (0)
  FWD_ERR(STA_ERR_STATE, "VSA forward called outside a forward context (no context is live)");
  assert_int_equal(sta_context_push(&c, 0, NULL, NULL), STA_OK);
  FWD_ERR(STA_ERR_NO_BATCH, "forward_batch cannot be None");
  assert_int_equal(sta_context_pop(c), STA_OK);
  assert_int_equal(sta_context_push(&c, 5, NULL, fb), STA_OK);
  sta_tensor *k3 = randn4(1, ROWS, 3, D), *kshort = randn4(1, ROWS - 64, HEADS, D);
  EXPECT_ERR(sta_layer_forward(l, q, k3, v, out), STA_ERR_SHAPE,
             "k: expected 2 heads (local_heads), got 3");
  EXPECT_ERR(sta_layer_forward(l, q, kshort, v, out), STA_ERR_SHAPE,
             "k: 448 rows, expected 512 (the canvas 5x6x7 in 8 cubes of 64 rows, cube order)");
  assert_bits(out, poison);
  int32_t wins[6];
  sta_attention_desc ad;
  EXPECT_ERR(sta_layer_resolve(l, q, &ad, wins), STA_ERR_STATE,
             "sta_layer_resolve: layer 3 runs VSA (sta_layer_resolve_vsa gives what its forward "
             "runs)");
  sta_layer_desc sd = vsa_desc();
  sd.mode = STA_LAYER_STA;
  EXPECT_ERR(sta_layer_create(&sta, &sd), STA_ERR_ARGUMENT,
             "dense_steps: a layer in STA mode has no cubes (VSA mode: STA_LAYER_VSA)");
  sd.dense_steps = 0;
  sd.cube[1] = 8;
  EXPECT_ERR(sta_layer_create(&sta, &sd), STA_ERR_ARGUMENT,
             "cube: a layer in STA mode has no cubes (VSA mode: STA_LAYER_VSA)");
  sd.cube[1] = 0;
  assert_int_equal(sta_layer_create(&sta, &sd), STA_OK);
  EXPECT_ERR(sta_layer_resolve_vsa(sta, q, &vd, NULL, NULL), STA_ERR_STATE,
             "sta_layer_resolve_vsa: layer 3 runs STA (sta_layer_resolve gives what its forward "
             "runs)");
  EXPECT_ERR(sta_layer_resolve_vsa(l, q, NULL, NULL, NULL), STA_ERR_ARGUMENT,
             "desc: expected a descriptor, got NULL");
  /* the batch's sparsity past the dense steps; the step's topk */
  assert_int_equal(sta_forward_batch_set_vsa_sparsity(fb, 0.99), STA_OK);
  assert_int_equal(sta_layer_resolve_vsa(l, q, &vd, NULL, NULL), STA_OK);
  assert_int_equal(vd.topk, 1);
  assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
  assert_int_equal(sta_context_pop(c), STA_OK);
#undef FWD_ERR
  sta_tensor *ts[] = {q, k, v, out, poison, k3, kshort, NULL};
  for (int i = 0; ts[i]; i++) sta_tensor_destroy(ts[i]);
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(l);
  sta_layer_destroy(sta);
}

int main(void) {
  seed_base = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
  printf("# test_layer_vsa seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_create_errors),
    cmocka_unit_test(test_batch_sparsity),
    cmocka_unit_test(test_steps_64),
    cmocka_unit_test(test_steps_256),
    cmocka_unit_test(test_forward_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
