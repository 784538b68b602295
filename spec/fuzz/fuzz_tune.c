/*
** fuzz_tune.c -- the search-results reader, through sta_tune on one file
** (and the same file twice).  The first byte picks skip_steps; the rest is
** the file.  Invariants: failures carry a status and message; a result is
** a complete strategy over the file's [step][layer][head] table whose
** windows are candidates or the full window, sparsity in [0, 1].
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int32_t skip = data[0] % 4;
  const char *path = fuzz_file("tune", data + 1, size - 1);
  const char *paths[2] = {path, path};
  static const int32_t full[3] = {3, 6, 10};
  for (int32_t nf = 1; nf <= 2; nf++) {
    sta_strategy *s = NULL;
    sta_tune_report rep;
    sta_clear_error();
    if (fuzz_status(sta_tune(&s, nf, paths, skip, full, &rep)) != STA_OK) {
      FUZZ_CHECK(s == NULL);
      continue;
    }
    int32_t steps, layers, heads;
    sta_strategy_extent(s, &steps, &layers, &heads);
    FUZZ_CHECK(sta_strategy_check(s, steps, layers, heads) == STA_OK);
    FUZZ_CHECK(sta_strategy_count(s) == (int64_t)steps * layers * heads);
    FUZZ_CHECK(rep.sparsity >= 0 && rep.sparsity <= 1);
    FUZZ_CHECK(rep.n_windows >= 1 && rep.n_windows <= 16);
    int64_t counted = 0;
    for (int32_t i = 0; i < rep.n_windows; i++) counted += rep.counts[i];
    FUZZ_CHECK(counted <= sta_strategy_count(s));
    int32_t w[3];
    if (skip > 0 && steps > 0) { /* skipped steps take the full window */
      FUZZ_CHECK(sta_strategy_get(s, 0, 0, 0, w) == STA_OK);
      FUZZ_CHECK(!memcmp(w, full, sizeof w));
    }
    sta_strategy_destroy(s);
  }
  return 0;
}
