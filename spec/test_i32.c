/* test_i32.c -- STA_I32 tensors (sta.h), the dtype of block lists: exact
** element access and fills, copies between i32 tensors (strided too),
** wrapped memory; every refusal (conversion, arithmetic, randn, compare,
** files) with its exact message and nothing changed. */
#include "test_util.h"

static sta_tensor *i32(int32_t ndim, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, STA_I32, STA_CPU, ndim, shape), STA_OK);
  return t;
}

/* STA_I32 tensors: exact element access and fills, copies between i32
** tensors, views; no arithmetic, no conversion. */
static void test_i32(void **state) {
  (void)state;
  int64_t sh[2] = {3, 5};
  sta_tensor *a = i32(2, sh), *b = i32(2, sh), *f = NULL, *tv = NULL, *c = NULL;
  const int32_t fillv = (int32_t)sta_test_rint(-100000, 100000);
  assert_int_equal(sta_tensor_fill(a, fillv), STA_OK);
  int64_t ix[2] = {2, 4};
  double x;
  assert_int_equal(sta_tensor_set(a, ix, 2147483647.0), STA_OK);
  assert_int_equal(sta_tensor_get(a, ix, &x), STA_OK);
  assert_true(x == 2147483647.0); /* exact, beyond float */
  ix[1] = 0;
  assert_int_equal(sta_tensor_get(a, ix, &x), STA_OK);
  assert_true(x == fillv);
  sta_expect_err(sta_tensor_set(a, ix, 2.5), STA_ERR_ARGUMENT,
                 "value: 2.5 is not an i32 (an integer in -2147483648..2147483647)");
  sta_expect_err(sta_tensor_fill(a, 3e9), STA_ERR_ARGUMENT,
                 "value: 3e+09 is not an i32 (an integer in -2147483648..2147483647)");
  assert_int_equal(sta_tensor_get(a, ix, &x), STA_OK);
  assert_true(x == fillv); /* the refused calls changed nothing */
  int32_t perm[2] = {1, 0};
  assert_int_equal(sta_tensor_permute(&tv, a, perm), STA_OK);
  int64_t ts[2] = {5, 3};
  assert_int_equal(sta_tensor_create(&c, STA_I32, STA_CPU, 2, ts), STA_OK);
  assert_int_equal(sta_tensor_copy(c, tv), STA_OK); /* strided i32 -> i32 */
  int64_t t2[2] = {4, 2};
  assert_int_equal(sta_tensor_get(c, t2, &x), STA_OK);
  assert_true(x == 2147483647.0);
  assert_int_equal(sta_tensor_copy(b, a), STA_OK);
  assert_int_equal(sta_tensor_create(&f, STA_F32, STA_CPU, 2, sh), STA_OK);
  sta_expect_err(sta_tensor_copy(f, a), STA_ERR_DTYPE,
                 "copy: dst is f32 and src is i32 (i32 converts to no other dtype)");
  sta_expect_err(sta_tensor_copy(a, f), STA_ERR_DTYPE,
                 "copy: dst is i32 and src is f32 (i32 converts to no other dtype)");
  sta_expect_err(sta_tensor_axpby(a, 1, b, 1), STA_ERR_UNSUPPORTED,
                 "axpby: y is i32 (no operation computes on i32: it holds block lists)");
  sta_expect_err(sta_tensor_scale(a, 2), STA_ERR_UNSUPPORTED,
                 "scale: t is i32 (no operation computes on i32: it holds block lists)");
  sta_stats st;
  sta_expect_err(sta_tensor_stats(a, &st), STA_ERR_UNSUPPORTED,
                 "stats: t is i32 (no operation computes on i32: it holds block lists)");
  sta_expect_err(sta_tensor_randn(a, 1, 0, 1), STA_ERR_UNSUPPORTED,
                 "t: randn of an i32 tensor (i32 holds block lists: created, copied, filled and "
                 "set, never computed on)");
  sta_expect_err(sta_tensor_compare(a, b, &x, NULL), STA_ERR_UNSUPPORTED,
                 "compare: a is i32 (compare computes on f32, f16, bf16 and f8e4m3; i32 holds "
                 "block lists)");
  sta_tensor *to = NULL;
  sta_expect_err(sta_tensor_to(&to, a, STA_F32, STA_CPU), STA_ERR_DTYPE,
                 "copy: dst is f32 and src is i32 (i32 converts to no other dtype)");
  assert_null(to);
  assert_int_equal(sta_tensor_to(&to, a, STA_I32, STA_CPU), STA_OK);
  assert_int_equal(sta_dtype_size(STA_I32), 4);
  assert_string_equal(sta_dtype_name(STA_I32), "i32");
  sta_expect_err(sta_npy_save(a, "/nonexistent/x.npy"), STA_ERR_DTYPE,
                 "t: sta writes .npy files of f32, f16 and bf16, not i32");
  const char *nm[1] = {"a"};
  const sta_tensor *ts1[1] = {a};
  sta_expect_err(sta_safetensors_save("/nonexistent/x.st", 1, nm, ts1), STA_ERR_DTYPE,
                 "tensors[0]: sta writes safetensors of f32, f16, bf16 and f8e4m3, not i32");
  int32_t raw[6] = {1, 2, 3, 4, 5, 6};
  sta_tensor *w = NULL;
  int64_t ws[1] = {6};
  assert_int_equal(sta_tensor_wrap(&w, raw, STA_I32, STA_CPU, 1, ws, NULL), STA_OK);
  assert_int_equal(sta_tensor_fill(w, 9), STA_OK);
  assert_true(raw[0] == 9 && raw[5] == 9);
  sta_tensor *cu = NULL;
  if (!sta_backend_available(STA_CUDA))
    sta_expect_err(sta_tensor_create(&cu, STA_I32, STA_CUDA, 1, ws), STA_ERR_BACKEND,
                   "st attn not supported");
  sta_tensor_destroy(cu);
  sta_tensor_destroy(w);
  sta_tensor_destroy(to);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  sta_tensor_destroy(c);
  sta_tensor_destroy(tv);
  sta_tensor_destroy(f);
}

int main(void) {
  sta_test_begin(2862933555777941757ull, 3037000493ull);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_i32),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
