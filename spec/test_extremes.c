/*
** test_extremes.c -- what the API-sequence fuzzer found once its generator
** took extreme sizes, strides, offsets and counts (spec/fuzz/api_extreme.h:
** integer arithmetic overflow-checked, in messages too), each
** kept as a regression: the call is refused with a message (or answers),
** and under UBSan (make sanitize) no signed overflow, no pointer that wraps,
** no endless loop.
*/
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A wrap whose view reaches below address 0, or past the top: the storage
** pointer computed from it wrapped around (UBSan: pointer overflow). */
static void test_wrap_outside_address_space(void **state) {
  (void)state;
  sta_tensor *t = (sta_tensor *)0x1;
  int64_t shape[2] = {4, 3}, down[2] = {-4096, 1}, up[2] = {1, 1};
  EXPECT_ERR(sta_tensor_wrap(&t, (void *)(uintptr_t)0x1000, STA_F32, STA_CPU, 2, shape, down),
             STA_ERR_SHAPE, NULL);
  assert_non_null(strstr(sta_last_error(), "outside the address space"));
  EXPECT_ERR(sta_tensor_wrap(&t, (void *)(UINTPTR_MAX - 7), STA_F32, STA_CUDA, 2, shape, up),
             STA_ERR_SHAPE, NULL);
  assert_ptr_equal(t, (sta_tensor *)0x1);
  /* the same views where they fit are fine (never read here) */
  assert_int_equal(sta_tensor_wrap(&t, (void *)(uintptr_t)0x100000, STA_F32, STA_CPU, 2, shape,
                                   down), STA_OK);
  assert_int_equal(sta_tensor_numel(t), 12);
  sta_tensor_destroy(t);
}

/* Strides of INT64_MIN: |stride| was taken by negating it. */
static void test_stride_int64_min(void **state) {
  (void)state;
  float buf[8];
  sta_tensor *t = NULL, *base = NULL;
  int64_t shape[2] = {2, 2}, st[2] = {INT64_MIN, 1}, n = 8;
  EXPECT_ERR(sta_tensor_wrap(&t, buf, STA_F32, STA_CPU, 2, shape, st), STA_ERR_SHAPE,
             "strides[0]: -9223372036854775808 is out of range");
  assert_int_equal(sta_tensor_create(&base, STA_F32, STA_CPU, 1, &n), STA_OK);
  EXPECT_ERR(sta_tensor_view(&t, base, 0, 2, shape, st), STA_ERR_SHAPE,
             "strides[0]: -9223372036854775808 is out of range");
  assert_null(t);
  sta_tensor_destroy(base);
}

/* An empty tensor beside huge sizes: its contiguous strides overflowed;
** now the nonzero sizes are bounded as for any tensor. */
static void test_empty_with_huge_sizes(void **state) {
  (void)state;
  sta_tensor *t = NULL;
  int64_t shape[4] = {2, INT64_MAX / 3, 0, 4};
  EXPECT_ERR(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_ERR_SHAPE,
             "shape[1]: 3074457345618258602 makes the tensor too large");
  int64_t ok[3] = {0, 1 << 20, 1 << 20};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 3, ok), STA_OK);
  assert_int_equal(sta_tensor_numel(t), 0);
  assert_int_equal(sta_tensor_stride(t, 0), (int64_t)1 << 40);
  sta_tensor_destroy(t);
}

/* narrow's message printed start + len, which overflowed. */
static void test_narrow_message_sum(void **state) {
  (void)state;
  sta_tensor *t = NULL, *v = (sta_tensor *)0x1;
  int64_t n = 4;
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 1, &n), STA_OK);
  EXPECT_ERR(sta_tensor_narrow(&v, t, 0, (int64_t)1 << 62, (int64_t)1 << 62), STA_ERR_ARGUMENT,
             "narrow: [4611686018427387904, 4611686018427387904 + 4611686018427387904) is "
             "outside dim 0 of size 4");
  EXPECT_ERR(sta_tensor_narrow(&v, t, 0, 3, 2), STA_ERR_ARGUMENT,
             "narrow: [3, 5) is outside dim 0 of size 4");
  assert_ptr_equal(v, (sta_tensor *)0x1);
  sta_tensor_destroy(t);
}

/* steps x layers x heads overflowed int64 and passed the size check: a
** strategy was filled past its allocation. */
static void test_uniform_product(void **state) {
  (void)state;
  sta_strategy *s = (sta_strategy *)0x1;
  int32_t w[3] = {3, 3, 3};
  EXPECT_ERR(sta_strategy_uniform(&s, 3, INT32_MAX - 1, INT32_MAX, w, w, 0), STA_ERR_ARGUMENT,
             "steps x layers x heads: 3 x 2147483646 x 2147483647 entries is too many");
  EXPECT_ERR(sta_strategy_uniform(&s, 1 << 20, 1 << 10, 1 << 3, w, w, 0), STA_ERR_ARGUMENT,
             "steps x layers x heads: 8589934592 entries is too many");
  assert_ptr_equal(s, (sta_strategy *)0x1);
}

/* Calls whose time grew with a count that asks for nothing or for more
** than the arguments hold: answered at once. */
static void test_no_endless_loops(void **state) {
  (void)state;
  sta_strategy *s = NULL;
  int32_t w[3] = {3, 3, 3};
  assert_int_equal(sta_strategy_uniform(&s, 2, 2, 2, w, w, 0), STA_OK);
  double t0 = seconds();
  assert_int_equal(sta_strategy_check(s, INT32_MAX, 0, 2), STA_OK); /* nothing asked */
  EXPECT_ERR(sta_strategy_check(s, INT32_MAX, 1, 1), STA_ERR_KEY,
             "mask strategy has no window for \"2_0_0\" (step 2, layer 0, head 0)");
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 8, 8);
  d.n_windows = 1;
  d.windows = w;
  /* one window for 2^63 - 1 heads: the work of one head times the heads */
  double one = sta_attention_flops(&d, 1, 256, 1, 8), many = sta_attention_flops(&d, 1, 256,
                                                                                INT64_MAX, 8);
  assert_true(one > 0);
  assert_true(many == one * (double)INT64_MAX);
  /* windows per head must be one per head: reading past them is refused */
  d.n_windows = 3;
  assert_true(sta_attention_flops(&d, 1, 256, INT64_MAX, 8) == 0);
  /* a geometry the forward refuses has no work */
  d.n_windows = 1;
  d.geom.canvas[0] = INT32_MAX;
  assert_true(sta_attention_flops(&d, 1, 256, 1, 8) == 0);
  if (seconds() - t0 > 2.0) fail_msg("took %.1f s", seconds() - t0);
  sta_strategy_destroy(s);
}

/* The tiled length of an untiled one summed past INT64_MAX. */
static void test_tiled_len_range(void **state) {
  (void)state;
  sta_geometry g;
  sta_geometry_init(&g, 5, 5, 5); /* 125 tokens, 1 tile of 6x8x8 = 384 rows */
  assert_int_equal(sta_geometry_tiled_len(&g, 125 + 7), 384 + 7);
  assert_int_equal(sta_geometry_tiled_len(&g, INT64_MAX), -1);
  assert_int_equal(sta_geometry_tiled_len(&g, 124), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_wrap_outside_address_space),
    cmocka_unit_test(test_stride_int64_min),
    cmocka_unit_test(test_empty_with_huge_sizes),
    cmocka_unit_test(test_narrow_message_sum),
    cmocka_unit_test(test_uniform_product),
    cmocka_unit_test(test_no_endless_loops),
    cmocka_unit_test(test_tiled_len_range),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
