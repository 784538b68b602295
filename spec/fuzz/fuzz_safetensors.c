/*
** fuzz_safetensors.c -- the .safetensors reader: open, then read every
** entry.  Invariants: failures carry a status and message; names are
** distinct and non-NULL; a read tensor's bytes fit inside the file.
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file("st", data, size);
  sta_safetensors *f = NULL;
  sta_clear_error();
  if (fuzz_status(sta_safetensors_open(&f, path)) != STA_OK) {
    FUZZ_CHECK(f == NULL);
    return 0;
  }
  int32_t n = sta_safetensors_count(f);
  FUZZ_CHECK(n >= 0);
  FUZZ_CHECK(sta_safetensors_name(f, n) == NULL && sta_safetensors_name(f, -1) == NULL);
  size_t total = 0;
  for (int32_t i = 0; i < n; i++) {
    const char *name = sta_safetensors_name(f, i);
    FUZZ_CHECK(name != NULL);
    for (int32_t j = 0; j < i; j++) FUZZ_CHECK(strcmp(name, sta_safetensors_name(f, j)) != 0);
    sta_tensor *t = NULL;
    sta_clear_error();
    sta_status rc = fuzz_status(sta_safetensors_read(f, name, &t));
    /* only dtypes and ranks sta does not read are refused after open */
    FUZZ_CHECK(rc == STA_OK || rc == STA_ERR_DTYPE || rc == STA_ERR_SHAPE);
    if (rc != STA_OK) continue;
    total += (size_t)sta_tensor_numel(t) * sta_dtype_size(sta_tensor_dtype(t));
    FUZZ_CHECK(total <= size);
    sta_tensor_destroy(t);
  }
  sta_tensor *t = NULL;
  FUZZ_CHECK(fuzz_status(sta_safetensors_read(f, "\x01no such tensor", &t)) == STA_ERR_KEY);
  sta_safetensors_close(f);
  return 0;
}
