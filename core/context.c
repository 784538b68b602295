/*
** context.c -- forward contexts (STA.md section 6): a per-thread stack;
** the innermost context is the live one.  A context holds a reference to
** its metadata and forward batch until it is popped.
*/
#include <stdlib.h>

#include "internal.h"

struct sta_context {
  int32_t step;
  sta_metadata *md;
  sta_forward_batch *fb;
};

static _Thread_local sta_context **stack = NULL;
static _Thread_local int32_t depth = 0, cap = 0;

sta_status sta_context_push(sta_context **out, int32_t step,
                            sta_metadata *md, sta_forward_batch *fb) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (step < 0) return sta_error(STA_ERR_ARGUMENT, "step: expected >= 0, got %d", (int)step);
  if (md) STA_CHECK_HANDLE(md, STA_KIND_METADATA, "metadata");
  if (fb) STA_CHECK_HANDLE(fb, STA_KIND_BATCH, "forward batch");
  if (depth >= (1 << 16))
    return sta_error(STA_ERR_STATE, "forward context: stack too deep (%d contexts)", (int)depth);
  if (depth == cap) {
    int32_t ncap = cap ? cap * 2 : 8;
    sta_context **s = sta_realloc(stack, sizeof *s * (size_t)ncap);
    if (!s) return sta_error(STA_ERR_NOMEM, "out of host memory (forward context stack)");
    stack = s;
    cap = ncap;
  }
  sta_context *c = sta_malloc(sizeof *c);
  if (!c) return sta_error(STA_ERR_NOMEM, "out of host memory (forward context)");
  sta_status rc = sta_handle_add(c, STA_KIND_CONTEXT);
  if (rc != STA_OK) { free(c); return rc; }
  c->step = step;
  c->md = md;
  c->fb = fb;
  if (md) sta_metadata_retain(md);
  if (fb) sta_forward_batch_retain(fb);
  stack[depth++] = c;
  *out = c;
  return STA_OK;
}

sta_status sta_context_pop(sta_context *ctx) {
  STA_CHECK_HANDLE(ctx, STA_KIND_CONTEXT, "ctx");
  if (depth == 0)
    return sta_error(STA_ERR_STATE, "forward context: pop on an empty stack");
  if (stack[depth - 1] != ctx) {
    for (int32_t i = 0; i < depth - 1; i++)
      if (stack[i] == ctx)
        return sta_error(STA_ERR_STATE,
                         "forward context: pop of a context that is not the innermost "
                         "(it is at level %d of depth %d)", (int)i + 1, (int)depth);
    return sta_error(STA_ERR_STATE,
                     "forward context: pop of a context that is not on this thread's stack "
                     "(depth %d)", (int)depth);
  }
  sta_handle_remove(ctx);
  sta_metadata_destroy(ctx->md); /* this context's references */
  sta_forward_batch_destroy(ctx->fb);
  free(ctx);
  stack[--depth] = NULL;
  if (depth == 0) { /* nothing left behind at thread exit */
    free(stack);
    stack = NULL;
    cap = 0;
  }
  return STA_OK;
}

sta_context *sta_context_current(void) { return depth ? stack[depth - 1] : NULL; }
int32_t sta_context_depth(void) { return depth; }

int32_t sta_in_forward_pass(void) {
  return depth > 0 && stack[depth - 1]->fb != NULL;
}

static int live(const sta_context *ctx) {
  return sta_handle_check(ctx, STA_KIND_CONTEXT, "ctx") == STA_OK;
}

int32_t sta_context_step(const sta_context *ctx) { return live(ctx) ? ctx->step : -1; }
sta_metadata *sta_context_metadata(const sta_context *ctx) { return live(ctx) ? ctx->md : NULL; }
sta_forward_batch *sta_context_batch(const sta_context *ctx) { return live(ctx) ? ctx->fb : NULL; }
