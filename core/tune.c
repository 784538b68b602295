/* tune.c -- Tuning (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_tune(sta_strategy **out, int32_t n_files, const char *const *paths, int32_t skip_steps, const int32_t full[3], sta_tune_report *report) {
  (void)out;
  (void)n_files;
  (void)paths;
  (void)skip_steps;
  (void)full;
  (void)report;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_tune: not implemented yet");
}
