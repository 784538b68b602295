/* context.c -- Forward contexts (skeleton). */
#include <stdlib.h>

#include "internal.h"

sta_status sta_context_push(sta_context **out, int32_t step, sta_metadata *md, sta_forward_batch *fb) {
  (void)out;
  (void)step;
  (void)md;
  (void)fb;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_context_push: not implemented yet");
}

sta_status sta_context_pop(sta_context *ctx) {
  (void)ctx;
  return sta_error(STA_ERR_UNSUPPORTED, "sta_context_pop: not implemented yet");
}

sta_context *sta_context_current(void) {
  return NULL;
}

int32_t sta_context_depth(void) {
  return 0;
}

int32_t sta_in_forward_pass(void) {
  return 0;
}

int32_t sta_context_step(const sta_context *ctx) {
  (void)ctx;
  return 0;
}

sta_metadata *sta_context_metadata(const sta_context *ctx) {
  (void)ctx;
  return NULL;
}

sta_forward_batch *sta_context_batch(const sta_context *ctx) {
  (void)ctx;
  return NULL;
}
