/* layer.c -- The STA layer (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_layer_index_from_prefix(const char *prefix, int32_t *layer) {
  (void)prefix;
  (void)layer;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_layer_index_from_prefix: not implemented yet");
}

sta_status sta_layer_create(sta_layer **out, const sta_layer_desc *desc) {
  (void)out;
  (void)desc;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_layer_create: not implemented yet");
}

void sta_layer_destroy(sta_layer *l) {
  (void)l;
}

int32_t sta_layer_index(const sta_layer *l) {
  (void)l;
  return 0;
}

void sta_layer_set_strategy(sta_layer *l, const sta_strategy *s) {
  (void)l;
  (void)s;
}

sta_status sta_layer_forward(sta_layer *l, const sta_tensor *q, const sta_tensor *k, const sta_tensor *v, sta_tensor *out) {
  (void)l;
  (void)q;
  (void)k;
  (void)v;
  (void)out;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_layer_forward: not implemented yet");
}
