/*
** fuzz_strategy.c -- the mask-strategy JSON reader (sta_strategy_parse).
** Invariants: a failure has a status and a message; a success writes JSON
** that parses back to an equal strategy, and every key it holds reads back.
*/
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  sta_strategy *s = NULL, *back = NULL;
  sta_clear_error();
  if (fuzz_status(sta_strategy_parse(&s, (const char *)data, size)) != STA_OK) {
    FUZZ_CHECK(s == NULL);
    return 0;
  }
  char *json = NULL;
  FUZZ_CHECK(sta_strategy_to_json(s, &json) == STA_OK);
  FUZZ_CHECK(sta_strategy_parse(&back, json, strlen(json)) == STA_OK);
  FUZZ_CHECK(sta_strategy_equal(s, back));
  int32_t steps, layers, heads, w[3];
  sta_strategy_extent(s, &steps, &layers, &heads);
  FUZZ_CHECK(sta_strategy_count(s) == 0 || (steps > 0 && layers > 0 && heads > 0));
  /* the corner keys: present or a clean STA_ERR_KEY */
  sta_status rc = fuzz_status(sta_strategy_get(s, steps > 0 ? steps - 1 : 0, 0, 0, w));
  FUZZ_CHECK(rc == STA_OK || rc == STA_ERR_KEY);
  int32_t grid[3] = {5, 6, 10};
  double sp = -1;
  FUZZ_CHECK(sta_strategy_sparsity(s, grid, &sp) == STA_OK && sp >= 0 && sp <= 1);
  sta_free(json);
  sta_strategy_destroy(back);
  sta_strategy_destroy(s);
  return 0;
}
