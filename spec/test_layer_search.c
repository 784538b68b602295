/* test_layer_search.c -- a layer in search mode (a search row of the
** metadata): the full window's output, the candidates' per-head losses
** recorded into the forward batch and saved, under sequence parallelism
** each rank's own heads. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "layer_util.h"

/* ---- search mode ------------------------------------------------------------ */

/* What a search row {cand[0], cand[1], full} should give: the full-window
** output into full, the two candidates' per-head losses into l1, l2
** ([2][heads]).  c0, c1: scratch of q's shape. */
static void expected_search(const int32_t *cand, const sta_tensor *q, const sta_tensor *k,
                            const sta_tensor *v, sta_tensor *full, sta_tensor *c0,
                            sta_tensor *c1, float *l1, float *l2) {
  sta_attention_desc ad;
  memset(&ad, 0, sizeof ad);
  geometry(&ad.geom);
  ad.layout = STA_BSHD;
  ad.n_windows = 1;
  ad.windows = cand + 6;
  assert_int_equal(sta_attention_forward(&ad, q, k, v, full, NULL), STA_OK);
  ad.windows = cand;
  assert_int_equal(sta_attention_forward(&ad, q, k, v, c0, NULL), STA_OK);
  ad.windows = cand + 3;
  assert_int_equal(sta_attention_forward(&ad, q, k, v, c1, NULL), STA_OK);
  int64_t heads = sta_tensor_size(q, 2);
  assert_int_equal(sta_head_diff(c0, full, STA_BSHD, l1, l2), STA_OK);
  assert_int_equal(sta_head_diff(c1, full, STA_BSHD, l1 + heads, l2 + heads), STA_OK);
}

static void test_search_mode(void **state) {
  (void)state;
  int32_t cand[9] = {1, 1, 1, 3, 1, 3, 3, 2, 6}; /* full (3x2x6 grid) last */
  sta_metadata *md = NULL;
  assert_int_equal(sta_metadata_search(&md, 2, 3, cand), STA_OK);
  sta_layer_desc d = base_desc();
  d.layer_index = 1;
  d.local_heads = 4; /* 3 candidates < 4 heads: a search row */
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  for (int neg = 0; neg < 2; neg++) {
    sta_forward_batch_set_negative(fb, neg);
    sta_tensor *q = randn4(1, S, 4, D), *k = randn4(1, S, 4, D), *v = randn4(1, S, 4, D),
               *out = randn4(1, S, 4, D), *full = randn4(1, S, 4, D), *c0 = randn4(1, S, 4, D),
               *c1 = randn4(1, S, 4, D);
    float l1[2][4], l2[2][4];
    expected_search(cand, q, k, v, full, c0, c1, &l1[0][0], &l2[0][0]);
    sta_context *c = NULL;
    assert_int_equal(sta_context_push(&c, 4 + neg, md, fb), STA_OK);
    assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
    assert_int_equal(sta_context_pop(c), STA_OK);
    assert_same(out, full, 0.0); /* the trajectory stays dense */
    assert_int_equal(sta_forward_batch_records(fb, neg), 1);
    assert_int_equal(sta_forward_batch_records(fb, !neg), neg ? 1 : 0);
    for (int h = 0; h < 4; h++) {
      assert_true(l2[0][h] > l2[1][h]);
      assert_true(l2[1][h] > 0);
    }
    /* the saved record holds the same losses */
    char path[256];
    snprintf(path, sizeof path, "/tmp/sta-test-layer-%d-search.json", (int)getpid());
    assert_int_equal(sta_forward_batch_save_search(fb, neg, path), STA_OK);
    char *text = NULL;
    size_t len;
    assert_int_equal(sta_read_text_file(path, "test", &text, &len), STA_OK);
    remove(path);
    /* the first L2 is head 0's loss of [1, 1, 1], as the same float */
    char *at = strstr(text, "\"L2_loss\": {\"[1, 1, 1]\": [[[");
    assert_non_null(at);
    double got = strtod(at + strlen("\"L2_loss\": {\"[1, 1, 1]\": [[["), NULL);
    assert_true((float)got == l2[0][0]);
    at = strstr(text, "\"L1_loss\": {\"[1, 1, 1]\": [[[");
    assert_non_null(at);
    got = strtod(at + strlen("\"L1_loss\": {\"[1, 1, 1]\": [[["), NULL);
    assert_true((float)got == l1[0][0]);
    assert_non_null(strstr(text, "\"[3, 1, 3]\""));
    assert_null(strstr(text, "\"[3, 2, 6]\"")); /* the full window is not a candidate */
    free(text);
    sta_tensor *all[] = {q, k, v, out, full, c0, c1};
    for (size_t i = 0; i < 7; i++) sta_tensor_destroy(all[i]);
  }
  /* a bad candidate fails before any work: out and the records unchanged */
  int32_t bad[9] = {1, 1, 1, 2, 3, 3, 3, 2, 6};
  assert_int_equal(sta_metadata_set_row(md, 1, 3, bad), STA_OK);
  sta_tensor *q = randn4(1, S, 4, D), *out = randn4(1, S, 4, D), *poison = NULL;
  assert_int_equal(sta_tensor_to(&poison, out, STA_F32, STA_CPU), STA_OK);
  sta_context *c = NULL;
  assert_int_equal(sta_context_push(&c, 9, md, fb), STA_OK);
  EXPECT_ERR(sta_layer_forward(l, q, q, q, out), STA_ERR_WINDOW,
             "search candidate 1 [2, 3, 3]: window: Kt = 2 is even and smaller than the 3 "
             "tiles on the t axis (use an odd window, or >= 3 for the whole axis)");
  assert_same(out, poison, 0.0);
  assert_int_equal(sta_forward_batch_records(fb, 1), 1);
  /* so does a bad lse (the operands are resolved once, before any run) */
  assert_int_equal(sta_metadata_set_row(md, 1, 3, cand), STA_OK);
  int64_t lshape[3] = {1, 4, S + 1};
  sta_tensor *badlse = NULL;
  assert_int_equal(sta_tensor_create(&badlse, STA_F32, STA_CPU, 3, lshape), STA_OK);
  char want[128];
  snprintf(want, sizeof want, "lse: expected shape [B=1, heads=4, S=%d], got [1, 4, %d]", (int)S,
           (int)S + 1);
  EXPECT_ERR(sta_layer_forward_lse(l, q, q, q, out, badlse), STA_ERR_SHAPE, want);
  assert_same(out, poison, 0.0);
  assert_int_equal(sta_forward_batch_records(fb, 1), 1);
  sta_tensor_destroy(badlse);
  /* an allocation failing anywhere in search mode changes nothing */
  int ok = 0;
  for (int64_t n = 1; n < 200 && !ok; n++) {
    sta_fault_arm(n);
    sta_status rc = sta_layer_forward(l, q, q, q, out);
    sta_fault_arm(0);
    if (rc == STA_OK) { ok = 1; break; }
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_same(out, poison, 0.0);
    assert_int_equal(sta_forward_batch_records(fb, 1), 1);
  }
  assert_true(ok);
  assert_int_equal(sta_forward_batch_records(fb, 1), 2);
  assert_int_equal(sta_context_pop(c), STA_OK);
  sta_tensor_destroy(q); sta_tensor_destroy(out); sta_tensor_destroy(poison);
  sta_layer_destroy(l);
  sta_metadata_destroy(md);
  sta_forward_batch_destroy(fb);
}

/* Search under sequence parallelism: each rank records its own heads into
** its own batch; the losses are those of its global heads. */
static void test_search_sp(void **state) {
  (void)state;
  int32_t cand[9] = {1, 1, 1, 3, 1, 3, 3, 2, 6};
  sta_metadata *md = NULL;
  assert_int_equal(sta_metadata_search(&md, 1, 3, cand), STA_OK);
  sta_tensor *q = randn4(1, S, 6, D), *k = randn4(1, S, 6, D), *v = randn4(1, S, 6, D),
             *full = randn4(1, S, 6, D), *c0 = randn4(1, S, 6, D), *c1 = randn4(1, S, 6, D),
             *out = randn4(1, S, 6, D);
  float l1[2][6], l2[2][6];
  expected_search(cand, q, k, v, full, c0, c1, &l1[0][0], &l2[0][0]);
  for (int r = 0; r < 2; r++) {
    sta_layer_desc d = base_desc();
    d.local_heads = 3;
    d.sp_rank = r;
    d.sp_size = 2;
    sta_layer *l = NULL;
    assert_int_equal(sta_layer_create(&l, &d), STA_OK);
    sta_forward_batch *fb = NULL;
    assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
    sta_context *c = NULL;
    assert_int_equal(sta_context_push(&c, 0, md, fb), STA_OK);
    sta_tensor *qr = narrow(q, 2, 3 * r, 3), *kr = narrow(k, 2, 3 * r, 3),
               *vr = narrow(v, 2, 3 * r, 3), *outr = narrow(out, 2, 3 * r, 3),
               *fullr = narrow(full, 2, 3 * r, 3);
    assert_int_equal(sta_layer_forward(l, qr, kr, vr, outr), STA_OK);
    assert_int_equal(sta_context_pop(c), STA_OK);
    assert_same(outr, fullr, 0.0);
    char path[256];
    snprintf(path, sizeof path, "/tmp/sta-test-layer-%d-sp%d.json", (int)getpid(), r);
    assert_int_equal(sta_forward_batch_save_search(fb, 0, path), STA_OK);
    char *text = NULL;
    size_t len;
    assert_int_equal(sta_read_text_file(path, "test", &text, &len), STA_OK);
    remove(path);
    /* L2 of [3, 1, 3] for this rank's 3 heads */
    const char *key = "\"[3, 1, 3]\": [[[";
    char *at = strstr(text, key);
    assert_non_null(at);
    at += strlen(key);
    for (int h = 0; h < 3; h++) {
      char *end;
      double x = strtod(at, &end);
      assert_true((float)x == l2[1][3 * r + h]);
      at = end + 1;
    }
    assert_int_equal(at[-1], ']');
    free(text);
    sta_tensor *all[] = {qr, kr, vr, outr, fullr};
    for (int i = 0; i < 5; i++) sta_tensor_destroy(all[i]);
    sta_forward_batch_destroy(fb);
    sta_layer_destroy(l);
  }
  sta_tensor *all[] = {q, k, v, full, c0, c1, out};
  for (int i = 0; i < 7; i++) sta_tensor_destroy(all[i]);
  sta_metadata_destroy(md);
}

int main(void) {
  seed_base = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
  printf("# test_layer_search seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_search_mode),
    cmocka_unit_test(test_search_sp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
