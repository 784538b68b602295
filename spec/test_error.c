/* test_error.c -- status codes, groups, names and the last-error channel. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

static void test_groups(void **state) {
  (void)state;
  assert_int_equal(sta_status_group(STA_OK), 0);
  assert_int_equal(sta_status_group(STA_ERR_SHAPE), 100);
  assert_int_equal(sta_status_group(STA_ERR_KEY), 100);
  assert_int_equal(sta_status_group(STA_ERR_NO_BATCH), 200);
  assert_int_equal(sta_status_group(STA_ERR_STA_PARAM), 200);
  assert_int_equal(sta_status_group(STA_ERR_SEQ_LEN), 300);
  assert_int_equal(sta_status_group(STA_ERR_BACKEND), 300);
  assert_int_equal(sta_status_group(STA_ERR_DEVICE_NOMEM), 400);
  assert_int_equal(sta_status_group(STA_ERR_DEVICE), 500);
  assert_int_equal(sta_status_group(STA_ERR_ENV), 600);
}

static void test_names(void **state) {
  (void)state;
  static const sta_status all[] = {
    STA_OK, STA_ERR_ARGUMENT, STA_ERR_SHAPE, STA_ERR_DTYPE, STA_ERR_WINDOW,
    STA_ERR_KEY, STA_ERR_STATE, STA_ERR_NO_BATCH, STA_ERR_NO_STRATEGY,
    STA_ERR_NO_STEP0, STA_ERR_STA_PARAM, STA_ERR_UNSUPPORTED, STA_ERR_SEQ_LEN,
    STA_ERR_BACKEND, STA_ERR_NOMEM, STA_ERR_DEVICE_NOMEM, STA_ERR_DEVICE,
    STA_ERR_IO, STA_ERR_FORMAT, STA_ERR_ENV};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    const char *n = sta_status_name(all[i]);
    assert_non_null(n);
    assert_true(strncmp(n, "STA_", 4) == 0);
    for (size_t j = 0; j < i; j++) assert_string_not_equal(n, sta_status_name(all[j]));
  }
  assert_string_equal(sta_status_name(STA_ERR_SEQ_LEN), "STA_ERR_SEQ_LEN");
  assert_string_equal(sta_status_name((sta_status)12345), "STA_ERR_UNKNOWN");
}

static void test_last_error(void **state) {
  (void)state;
  sta_clear_error();
  assert_string_equal(sta_last_error(), "");
  assert_int_equal(sta_last_status(), STA_OK);
  assert_int_equal(sta_error(STA_ERR_SHAPE, "q: got %d dims", 3), STA_ERR_SHAPE);
  assert_string_equal(sta_last_error(), "q: got 3 dims");
  assert_int_equal(sta_last_status(), STA_ERR_SHAPE);
  /* a failing public call replaces the message */
  sta_tensor *t = NULL;
  int64_t shape[1] = {-5};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 1, shape), STA_ERR_SHAPE);
  assert_null(t);
  assert_string_equal(sta_last_error(), "shape[0]: expected >= 0, got -5");
  sta_clear_error();
  assert_string_equal(sta_last_error(), "");
  assert_string_equal(sta_version(), "0.1.0");
}

static void test_fault_injection(void **state) {
  (void)state;
  int64_t shape[2] = {4, 4};
  sta_tensor *t = NULL;
  /* count the allocations of a create, then fail each in turn */
  sta_fault_arm(0);
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 2, shape), STA_OK);
  int64_t n = sta_fault_count();
  sta_tensor_destroy(t);
  assert_true(n >= 2);
  for (int64_t i = 1; i <= n; i++) {
    t = NULL;
    sta_fault_arm(i);
    assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 2, shape), STA_ERR_NOMEM);
    assert_null(t);
    assert_non_null(strstr(sta_last_error(), "out of host memory"));
  }
  sta_fault_arm(0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_groups),
    cmocka_unit_test(test_names),
    cmocka_unit_test(test_last_error),
    cmocka_unit_test(test_fault_injection),
  };
  return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
