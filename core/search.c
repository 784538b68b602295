/* search.c -- Forward batch and search results (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_forward_batch_create(sta_forward_batch **out, int32_t batch_size) {
  (void)out;
  (void)batch_size;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_forward_batch_create: not implemented yet");
}

void sta_forward_batch_destroy(sta_forward_batch *fb) {
  (void)fb;
}

int32_t sta_forward_batch_size(const sta_forward_batch *fb) {
  (void)fb;
  return 0;
}

void sta_forward_batch_set_negative(sta_forward_batch *fb, int32_t negative) {
  (void)fb;
  (void)negative;
}

int32_t sta_forward_batch_is_negative(const sta_forward_batch *fb) {
  (void)fb;
  return 0;
}

int32_t sta_forward_batch_records(const sta_forward_batch *fb, int32_t negative) {
  (void)fb;
  (void)negative;
  return 0;
}

sta_status sta_forward_batch_record(sta_forward_batch *fb, int32_t negative, int32_t step, int32_t layer, int32_t n, const int32_t *candidates, int32_t heads, const float *l1, const float *l2) {
  (void)fb;
  (void)negative;
  (void)step;
  (void)layer;
  (void)n;
  (void)candidates;
  (void)heads;
  (void)l1;
  (void)l2;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_forward_batch_record: not implemented yet");
}

sta_status sta_forward_batch_save_search(const sta_forward_batch *fb, int32_t negative, const char *path) {
  (void)fb;
  (void)negative;
  (void)path;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_forward_batch_save_search: not implemented yet");
}

void sta_forward_batch_clear(sta_forward_batch *fb) {
  (void)fb;
}
