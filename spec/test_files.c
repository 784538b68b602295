/* test_files.c -- what every file sta writes or reads holds to, whatever
** its format: device tensors save as their host copies; (more below). */
#define IO_TEST_NAME "test-files"
#include "io_util.h"

static void test_save_device(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA)) skip();
  int64_t shape[3] = {3, 5, 8};
  int32_t perm[3] = {1, 0, 2};
  for (int d = 0; d < 3; d++) {
    sta_tensor *h = rand_tensor((sta_dtype)d, 3, shape), *dev = NULL, *dp = NULL, *hp = NULL;
    sta_tensor *a = NULL, *b = NULL;
    assert_int_equal(sta_tensor_to(&dev, h, (sta_dtype)d, STA_CUDA), STA_OK);
    assert_int_equal(sta_tensor_permute(&dp, dev, perm), STA_OK);
    assert_int_equal(sta_tensor_permute(&hp, h, perm), STA_OK);
    assert_int_equal(sta_npy_save(dp, tpath("dev.npy")), STA_OK);
    assert_int_equal(sta_npy_load(&a, tpath("dev.npy"), 1), STA_OK);
    assert_same(hp, a);
    const char *names[2] = {"dev", "host"};
    const sta_tensor *ts[2] = {dp, h};
    assert_int_equal(sta_safetensors_save(tpath("dev.safetensors"), 2, names, ts), STA_OK);
    sta_safetensors *f = NULL;
    assert_int_equal(sta_safetensors_open(&f, tpath("dev.safetensors")), STA_OK);
    assert_int_equal(sta_safetensors_read(f, "dev", &b), STA_OK);
    assert_same(hp, b);
    sta_safetensors_close(f);
    sta_tensor_destroy(a);
    sta_tensor_destroy(b);
    sta_tensor_destroy(h);
    sta_tensor_destroy(hp);
    sta_tensor_destroy(dev);
    sta_tensor_destroy(dp);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_save_device),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
