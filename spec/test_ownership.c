/* test_ownership.c -- sta.h's ownership rules: a context holds its
** metadata and forward batch, a layer its strategy, an SP layer its
** communicator, so the caller may destroy them in any order (both
** were use-after-free once).  The freed memory is handed
** straight to a look-alike object with other windows, so a holder that
** kept only a pointer computes with the wrong windows even without ASan.
** A handle whose last reference went is refused by every call, and
** destroying it again does nothing. */
#include <time.h>

#include "internal.h"
#include "test_util.h"

enum { T = 4, H = 8, W = 8, V = T * H * W, TEXT = 4, S = V + TEXT, HEADS = 2, D = 8 };
static uint64_t seed = 1;

static sta_tensor *randn(void) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {1, S, HEADS, D};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed++ * 7919 + (uint64_t)time(NULL), 0, 1), STA_OK);
  return t;
}

static sta_geometry geom(void) {
  sta_geometry g;
  sta_geometry_init(&g, T, H, W);
  g.tile[0] = 2; g.tile[1] = 2; g.tile[2] = 2; /* grid 2x4x4 */
  return g;
}

static sta_layer *make_layer(const sta_strategy *s) {
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.local_heads = HEADS;
  d.head_dim = D;
  d.sp_size = 1;
  d.geom = geom();
  d.strategy = s;
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  return l;
}

/* out must equal the reference with window w on every head. */
static void expect_window(const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                          const sta_tensor *out, const int32_t w[3]) {
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  d.geom = geom();
  d.n_windows = 1;
  d.windows = w;
  sta_tensor *ref = randn();
  assert_int_equal(sta_attention_reference(&d, q, k, v, ref, NULL), STA_OK);
  double m, r;
  assert_int_equal(sta_tensor_compare(out, ref, &m, &r), STA_OK);
  if (m > 1e-4) fail_msg("output differs from window %d,%d,%d by %g", w[0], w[1], w[2], m);
  sta_tensor_destroy(ref);
}

static const int32_t W1[3] = {1, 3, 1}, W2[3] = {3, 1, 3};

/* Metadata released while a live context holds it. */
static void test_context_holds_metadata_and_batch(void **state) {
  (void)state;
  sta_metadata *md = NULL, *other = NULL;
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  int32_t row[6] = {W1[0], W1[1], W1[2], W1[0], W1[1], W1[2]};
  int32_t row2[6] = {W2[0], W2[1], W2[2], W2[0], W2[1], W2[2]};
  assert_int_equal(sta_metadata_create(&md, 1), STA_OK);
  assert_int_equal(sta_metadata_set_row(md, 0, 2, row), STA_OK);
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 0, md, fb), STA_OK);
  sta_metadata_destroy(md);       /* the caller's reference only */
  sta_forward_batch_destroy(fb);
  assert_int_equal(sta_metadata_create(&other, 1), STA_OK); /* takes freed memory, if any */
  assert_int_equal(sta_metadata_set_row(other, 0, 2, row2), STA_OK);
  assert_true(sta_in_forward_pass()); /* the batch is still there */
  assert_ptr_equal(sta_context_metadata(ctx), md);
  sta_layer *l = make_layer(NULL);
  sta_tensor *q = randn(), *k = randn(), *v = randn(), *out = randn();
  assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
  expect_window(q, k, v, out, W1);
  /* popping drops the last references: the handles are dead now */
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  if (md != other) { /* (the allocator may hand the address out again) */
    EXPECT_ERR(sta_metadata_set_row(md, 0, 2, row), STA_ERR_ARGUMENT,
               "metadata: not a live sta_metadata (released already, or not made by sta)");
    assert_int_equal(sta_metadata_layers(md), 0);
    sta_metadata_destroy(md); /* again: nothing */
  }
  EXPECT_ERR(sta_forward_batch_save_search(fb, 0, "/nonexistent/x.json"), STA_ERR_ARGUMENT,
             "forward batch: not a live sta_forward_batch (released already, or not made by sta)");
  assert_int_equal(sta_forward_batch_size(fb), 0);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(other);
  sta_layer_destroy(l);
  sta_tensor *all[] = {q, k, v, out};
  for (int i = 0; i < 4; i++) sta_tensor_destroy(all[i]);
  assert_int_equal(sta_handle_count(), 0);
}

/* A strategy released while a layer holds it. */
static void test_layer_holds_strategy(void **state) {
  (void)state;
  sta_strategy *s = NULL, *other = NULL, *third = NULL;
  assert_int_equal(sta_strategy_uniform(&s, 2, 1, HEADS, W1, NULL, 0), STA_OK);
  sta_layer *l = make_layer(s);
  sta_strategy_destroy(s);
  assert_int_equal(sta_strategy_uniform(&other, 2, 1, HEADS, W2, NULL, 0), STA_OK);
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 1, NULL, fb), STA_OK);
  sta_tensor *q = randn(), *k = randn(), *v = randn(), *out = randn();
  assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
  expect_window(q, k, v, out, W1);
  /* replacing the strategy drops the layer's reference to the old one */
  assert_int_equal(sta_layer_set_strategy(l, other), STA_OK);
  sta_strategy_destroy(other);
  assert_int_equal(sta_strategy_uniform(&third, 2, 1, HEADS, W1, NULL, 0), STA_OK);
  assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
  expect_window(q, k, v, out, W2);
  EXPECT_ERR(sta_layer_set_strategy(l, (const sta_strategy *)q), STA_ERR_ARGUMENT,
             "strategy: not a live sta_strategy (released already, or not made by sta)");
  assert_int_equal(sta_layer_set_strategy(l, NULL), STA_OK);
  EXPECT_ERR(sta_layer_forward(l, q, k, v, out), STA_ERR_NO_STRATEGY,
             "mask_strategy cannot be None for SlidingTileAttention");
  sta_layer_destroy(l);
  sta_layer_destroy(l); /* again: nothing */
  EXPECT_ERR(sta_layer_forward(l, q, k, v, out), STA_ERR_ARGUMENT,
             "layer: not a live sta_layer (released already, or not made by sta)");
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  sta_forward_batch_destroy(fb);
  sta_strategy_destroy(third);
  sta_tensor *all[] = {q, k, v, out};
  for (int i = 0; i < 4; i++) sta_tensor_destroy(all[i]);
  /* a released tensor: refused by every call that takes one */
  EXPECT_ERR(sta_tensor_fill(q, 1.0), STA_ERR_ARGUMENT,
             "t: not a live sta_tensor (released already, or not made by sta)");
  assert_int_equal(sta_tensor_ndim(q), 0);
  assert_null(sta_tensor_data(q));
  sta_tensor_destroy(q);
  assert_int_equal(sta_handle_count(), 0);
}

static sta_status one_rank(void *arg, int32_t rank, sta_comm *comm) {
  (void)rank;
  sta_tensor **t = arg;
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.local_heads = HEADS;
  d.head_dim = D;
  d.geom = geom();
  sta_strategy *s = NULL;
  sta_status rc = sta_strategy_uniform(&s, 1, 1, HEADS, W2, NULL, 0);
  d.strategy = s;
  sta_sp_layer *l = NULL;
  if (rc == STA_OK) rc = sta_sp_layer_create(&l, comm, &d);
  sta_strategy_destroy(s);
  sta_comm_destroy(comm); /* the SP layer keeps it */
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  if (rc == STA_OK) rc = sta_forward_batch_create(&fb, 1);
  if (rc == STA_OK) rc = sta_context_push(&ctx, 0, NULL, fb);
  sta_forward_batch_destroy(fb);
  if (rc == STA_OK) rc = sta_sp_layer_forward(l, t[0], t[1], t[2], t[3]);
  if (ctx) sta_context_pop(ctx);
  sta_sp_layer_destroy(l);
  return rc;
}

static void test_sp_layer_holds_comm(void **state) {
  (void)state;
  sta_comm *c[1] = {NULL};
  assert_int_equal(sta_comm_loopback(c, 1), STA_OK);
  sta_tensor *t[4] = {randn(), randn(), randn(), randn()};
  assert_int_equal(sta_comm_loopback_run(c, 1, one_rank, t), STA_OK);
  expect_window(t[0], t[1], t[2], t[3], W2);
  EXPECT_ERR(sta_comm_barrier(c[0]), STA_ERR_ARGUMENT,
             "comm: not a live sta_comm (released already, or not made by sta)");
  for (int i = 0; i < 4; i++) sta_tensor_destroy(t[i]);
  assert_int_equal(sta_handle_count(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_context_holds_metadata_and_batch),
    cmocka_unit_test(test_layer_holds_strategy),
    cmocka_unit_test(test_sp_layer_holds_comm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
