/* test_small_tiles.c -- with tiny tiles (a token or two each) and many
** heads the fast CPU path gathers heads per pass and short key ranges per
** GEMM (once it was slower than the brute-force reference: 5x6x10 tokens,
** tile 1x1x1, 24 heads, D 64, 84 ms against 43).  Here: on such
** geometries the forward and the backward agree with the reference.  Their
** speed against it is bench_cpu's "tiny tiles" table (a timed test fails
** on a loaded machine: speed lives in benchmarks). */
#include <time.h>

#include "test_util.h"

static void agree(int32_t T, int32_t H, int32_t W, int32_t tt, int32_t th, int32_t tw,
                 int32_t win, int64_t heads, int64_t text, int backward) {
  int64_t S = (int64_t)T * H * W + text, shape[4] = {1, S, heads, 64}, ls[3] = {1, heads, S};
  /* q k v out dout | dq dk dv | the reference's out, dq, dk, dv */
  sta_tensor *t[12], *lse = NULL;
  for (int i = 0; i < 12; i++) {
    assert_int_equal(sta_tensor_create(&t[i], STA_F32, STA_CPU, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_randn(t[i], (uint64_t)time(NULL) * 11 + (uint64_t)i, 0, 1), STA_OK);
  }
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, T, H, W);
  d.geom.tile[0] = tt; d.geom.tile[1] = th; d.geom.tile[2] = tw;
  int32_t w[3] = {win, win, win};
  d.n_windows = 1;
  d.windows = w;
  if (backward) assert_int_equal(sta_attention_forward(&d, t[0], t[1], t[2], t[3], lse), STA_OK);
  if (backward) {
    assert_int_equal(sta_attention_backward(&d, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6],
                                            t[7]), STA_OK);
    assert_int_equal(sta_attention_backward_reference(&d, t[0], t[1], t[2], t[4], t[9], t[10],
                                                      t[11]), STA_OK);
  } else {
    assert_int_equal(sta_attention_forward(&d, t[0], t[1], t[2], t[3], NULL), STA_OK);
    assert_int_equal(sta_attention_reference(&d, t[0], t[1], t[2], t[8], NULL), STA_OK);
  }
  double m = -1;
  for (int i = 0; i < (backward ? 3 : 1); i++) {
    double mi = -1;
    assert_int_equal(sta_tensor_compare(t[backward ? 5 + i : 3], t[backward ? 9 + i : 8], &mi, NULL),
                     STA_OK);
    m = mi > m ? mi : m;
  }
  printf("# %dx%dx%d tile %dx%dx%d window %d, %lld heads: %s max |diff| %.2g\n", (int)T,
         (int)H, (int)W, (int)tt, (int)th, (int)tw, (int)win, (long long)heads,
         backward ? "backward" : "forward", m);
  assert_true(m < 1e-4);
  for (int i = 0; i < 12; i++) sta_tensor_destroy(t[i]);
  sta_tensor_destroy(lse);
}

static void test_tiny_tiles_agree(void **state) {
  (void)state;
  for (int backward = 0; backward < 2; backward++) {
    agree(5, 6, 10, 1, 1, 1, 3, 24, 0, backward); /* the case once slower than the reference */
    agree(5, 6, 10, 1, 1, 1, 1, 24, 0, backward);
    agree(4, 6, 8, 1, 2, 1, 3, 16, 4, backward);  /* with text rows */
    agree(3, 5, 7, 2, 1, 1, 5, 8, 0, backward);   /* partial border tiles */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_tiny_tiles_agree)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
