/*
** fuzz_npy.c -- the .npy reader (sta_npy_load), both '<u2' modes.
** Invariants: failures carry a status and message; a loaded tensor is
** contiguous, of at most 4 dims, and its data size fits inside the file.
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file("npy", data, size);
  for (int32_t bf16 = 0; bf16 < 2; bf16++) {
    sta_tensor *t = NULL;
    sta_clear_error();
    if (fuzz_status(sta_npy_load(&t, path, bf16)) != STA_OK) {
      FUZZ_CHECK(t == NULL);
      continue;
    }
    int32_t nd = sta_tensor_ndim(t);
    FUZZ_CHECK(nd >= 1 && nd <= 4);
    FUZZ_CHECK(sta_tensor_is_contiguous(t));
    FUZZ_CHECK((size_t)sta_tensor_numel(t) * sta_dtype_size(sta_tensor_dtype(t)) <= size);
    if (sta_tensor_numel(t) > 0) { /* touch the first and last element */
      int64_t idx[4];
      double x;
      for (int32_t i = 0; i < nd; i++) idx[i] = 0;
      FUZZ_CHECK(sta_tensor_get(t, idx, &x) == STA_OK);
      for (int32_t i = 0; i < nd; i++) idx[i] = sta_tensor_size(t, i) - 1;
      FUZZ_CHECK(sta_tensor_get(t, idx, &x) == STA_OK);
    }
    sta_tensor_destroy(t);
  }
  return 0;
}
