/* metadata.c -- Attention metadata (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_metadata_create(sta_metadata **out, int32_t layers) {
  (void)out;
  (void)layers;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_metadata_create: not implemented yet");
}

void sta_metadata_destroy(sta_metadata *m) {
  (void)m;
}

int32_t sta_metadata_layers(const sta_metadata *m) {
  (void)m;
  return 0;
}

sta_status sta_metadata_set_row(sta_metadata *m, int32_t layer, int32_t n, const int32_t *windows) {
  (void)m;
  (void)layer;
  (void)n;
  (void)windows;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_metadata_set_row: not implemented yet");
}

sta_status sta_metadata_row(const sta_metadata *m, int32_t layer, int32_t *n, const int32_t **windows) {
  (void)m;
  (void)layer;
  (void)n;
  (void)windows;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_metadata_row: not implemented yet");
}

sta_status sta_metadata_from_strategy(sta_metadata **out, const sta_strategy *s, int32_t step, int32_t layers, int32_t heads) {
  (void)out;
  (void)s;
  (void)step;
  (void)layers;
  (void)heads;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_metadata_from_strategy: not implemented yet");
}

sta_status sta_metadata_search(sta_metadata **out, int32_t layers, int32_t n_candidates, const int32_t *candidates) {
  (void)out;
  (void)layers;
  (void)n_candidates;
  (void)candidates;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_metadata_search: not implemented yet");
}
