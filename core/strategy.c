/* strategy.c -- Mask strategies (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_strategy_create(sta_strategy **out) {
  (void)out;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_create: not implemented yet");
}

void sta_strategy_destroy(sta_strategy *s) {
  (void)s;
}

sta_status sta_strategy_parse(sta_strategy **out, const char *json, size_t len) {
  (void)out;
  (void)json;
  (void)len;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_parse: not implemented yet");
}

sta_status sta_strategy_load(sta_strategy **out, const char *path) {
  (void)out;
  (void)path;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_load: not implemented yet");
}

sta_status sta_strategy_load_default(sta_strategy **out) {
  (void)out;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_load_default: not implemented yet");
}

sta_status sta_strategy_to_json(const sta_strategy *s, char **json) {
  (void)s;
  (void)json;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_to_json: not implemented yet");
}

sta_status sta_strategy_save(const sta_strategy *s, const char *path) {
  (void)s;
  (void)path;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_save: not implemented yet");
}

sta_status sta_strategy_uniform(sta_strategy **out, int32_t steps, int32_t layers, int32_t heads, const int32_t window[3], const int32_t full[3], int32_t full_steps) {
  (void)out;
  (void)steps;
  (void)layers;
  (void)heads;
  (void)window;
  (void)full;
  (void)full_steps;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_uniform: not implemented yet");
}

sta_status sta_strategy_set(sta_strategy *s, int32_t step, int32_t layer, int32_t head, const int32_t window[3]) {
  (void)s;
  (void)step;
  (void)layer;
  (void)head;
  (void)window;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_set: not implemented yet");
}

sta_status sta_strategy_get(const sta_strategy *s, int32_t step, int32_t layer, int32_t head, int32_t window[3]) {
  (void)s;
  (void)step;
  (void)layer;
  (void)head;
  (void)window;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_get: not implemented yet");
}

int64_t sta_strategy_count(const sta_strategy *s) {
  (void)s;
  return 0;
}

void sta_strategy_extent(const sta_strategy *s, int32_t *steps, int32_t *layers, int32_t *heads) {
  (void)s;
  (void)steps;
  (void)layers;
  (void)heads;
}

sta_status sta_strategy_check(const sta_strategy *s, int32_t steps, int32_t layers, int32_t heads) {
  (void)s;
  (void)steps;
  (void)layers;
  (void)heads;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_check: not implemented yet");
}

sta_status sta_strategy_sparsity(const sta_strategy *s, const int32_t grid[3], double *sparsity) {
  (void)s;
  (void)grid;
  (void)sparsity;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_strategy_sparsity: not implemented yet");
}

int32_t sta_strategy_equal(const sta_strategy *a, const sta_strategy *b) {
  (void)a;
  (void)b;
  return 0;
}
