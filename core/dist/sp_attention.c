/*
** sp_attention.c -- the jobs of the Ulysses pipeline (ulysses.c):
** sta_sp_attention (the global windows, this rank's heads of them) and SP
** layers (sta_layer_forward on the gathered heads).
*/
#include <stdlib.h>

#include "dist.h"

/* FNV-1a over n bytes. */
static uint64_t fnv(const void *data, size_t n) {
  const unsigned char *b = data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* sp_attention: the desc of heads h0 .. h0 + hn - 1 of this rank. */
static void local_desc(const sp_job *j, sta_attention_desc *d, int64_t h0, int64_t hn) {
  *d = *j->desc;
  d->n_windows = j->desc->n_windows == 1 ? 1 : (int32_t)hn;
  d->windows = j->desc->n_windows == 1 ? j->desc->windows : j->windows + 3 * h0;
}

static int64_t heads_of(const sp_job *j, const sta_tensor *q) {
  return q->shape[j->desc->layout == STA_BSHD ? 2 : 1];
}

/* The windows: 1 or one per global head, each valid (named by its global
** head); this rank's copied. */
static sta_status attn_prepare(sp_job *j, const split *sp) {
  const sta_attention_desc *d = j->desc;
  int64_t nh = sp->h, hl = sp->hl;
  sta_status rc;
  if (d->mask != STA_MASK_WINDOW) /* the lists are per global head: not sharded yet */
    return sta_error(STA_ERR_UNSUPPORTED, "mask: sequence parallelism runs STA_MASK_WINDOW "
                     "only, got %d", (int)d->mask);
  if (d->n_windows != 1 && d->n_windows != nh)
    return sta_error(STA_ERR_WINDOW, "n_windows: expected 1 or heads (%lld), got %d",
                     (long long)nh, (int)d->n_windows);
  j->hash = fnv(d->windows, sizeof(int32_t) * 3 * (size_t)d->n_windows);
  if (d->n_windows == 1) return STA_OK;
  for (int64_t h = 0; h < nh; h++)
    if ((rc = sta_window_check(&d->geom, d->windows + 3 * h)) != STA_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "head %lld: %s", (long long)h, sta_last_error());
      return sta_error(rc, "%s", msg);
    }
  j->windows = sta_malloc(sizeof(int32_t) * 3 * (size_t)hl);
  if (!j->windows) return sta_error(STA_ERR_NOMEM, "out of host memory (windows)");
  memcpy(j->windows, d->windows + 3 * (size_t)sp->r * (size_t)hl,
         sizeof(int32_t) * 3 * (size_t)hl);
  return STA_OK;
}

static sta_status attn_check(sp_job *j, const sta_tensor *q, const sta_tensor *k,
                             const sta_tensor *v, const sta_tensor *out) {
  sta_attention_desc d;
  sta_attn_params p;
  local_desc(j, &d, 0, heads_of(j, q));
  sta_status rc = sta_attn_resolve(&d, q, k, v, out, NULL, &p);
  if (rc == STA_OK) free((void *)p.windows);
  return rc;
}

static sta_status attn_compute(sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                               const sta_tensor *v, sta_tensor *out) {
  sta_attention_desc d;
  local_desc(j, &d, h0, heads_of(j, q));
  return sta_attention_forward(&d, q, k, v, out, NULL);
}

sta_status sta_sp_attention(sta_comm *c, const sta_attention_desc *desc,
                            const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                            sta_tensor *out) {
  sta_status pre = STA_OK;
  sp_job job;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (!desc) pre = sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  else if (!desc->windows) pre = sta_error(STA_ERR_WINDOW, "windows: expected an array, got NULL");
  memset(&job, 0, sizeof job);
  job.prepare = attn_prepare;
  job.check = attn_check;
  job.compute = attn_compute;
  job.desc = desc;
  job.what = "sp attention";
  sta_status rc = sta_sp_run(c, desc ? &desc->geom : NULL, desc ? desc->layout : STA_BSHD, q,
                             k, v, out, &job, pre);
  free(job.windows);
  return rc;
}

/* ---- SP layers ------------------------------------------------------------------- */

struct sta_sp_layer {
  sta_comm *comm;
  sta_layer *layer;
  sta_geometry geom;
  sta_layout layout;
  int32_t local_heads;
};

static sta_status layer_compute(sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                                const sta_tensor *v, sta_tensor *out) {
  (void)h0; /* one chunk */
  return sta_layer_forward(j->layer, q, k, v, out);
}

sta_status sta_sp_layer_create(sta_sp_layer **out, sta_comm *c, const sta_layer_desc *desc) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a layer description, got NULL");
  const int32_t *cv = desc->geom.canvas;
  if (cv[0] == 0 && cv[1] == 0 && cv[2] == 0)
    return sta_error(STA_ERR_WINDOW,
                     "geom: sequence parallelism needs the canvas (0x0x0 picks a known "
                     "shape by sequence length, which a rank's shard does not have)");
  sta_status rc = sta_split_untiled(&desc->geom);
  if (rc != STA_OK) return rc;
  sta_layer_desc d = *desc;
  d.sp_rank = sta_comm_rank(c);
  d.sp_size = sta_comm_size(c);
  if (!(c->t.devices & (1u << (desc->backend == STA_CUDA ? STA_CUDA : STA_CPU))))
    return sta_error(STA_ERR_ARGUMENT, "backend: the %s communicator does not move %s memory",
                     c->t.name, sta_device_name(desc->backend));
  sta_sp_layer *l = sta_calloc(1, sizeof *l);
  if (!l) return sta_error(STA_ERR_NOMEM, "out of host memory (SP layer)");
  if ((rc = sta_handle_add(l, STA_KIND_SP_LAYER)) != STA_OK) {
    free(l);
    return rc;
  }
  if ((rc = sta_layer_create(&l->layer, &d)) != STA_OK) {
    sta_handle_remove(l);
    free(l);
    return rc;
  }
  l->comm = c;
  sta_comm_retain(c);
  l->geom = desc->geom;
  l->layout = desc->layout;
  l->local_heads = desc->local_heads;
  *out = l;
  return STA_OK;
}

void sta_sp_layer_destroy(sta_sp_layer *l) {
  if (!sta_handle_live(l, STA_KIND_SP_LAYER)) return;
  sta_handle_remove(l);
  sta_layer_destroy(l->layer);
  sta_comm_destroy(l->comm); /* the layer's reference */
  free(l);
}

sta_layer *sta_sp_layer_base(const sta_sp_layer *l) {
  return sta_handle_check(l, STA_KIND_SP_LAYER, "layer") == STA_OK ? l->layer : NULL;
}

sta_status sta_sp_layer_forward(sta_sp_layer *l, const sta_tensor *q, const sta_tensor *k,
                                const sta_tensor *v, sta_tensor *out) {
  STA_CHECK_HANDLE(l, STA_KIND_SP_LAYER, "layer");
  STA_CHECK_HANDLE(l->comm, STA_KIND_COMM, "comm (the SP layer's)");
  sp_job job;
  memset(&job, 0, sizeof job);
  job.compute = layer_compute;
  job.layer = l->layer;
  job.what = "sp layer forward";
  sta_bshd x;
  sta_status pre = STA_OK;
  int32_t p = sta_comm_size(l->comm);
  if (q && sta_tensor_bshd(q, l->layout, "q", &x) == STA_OK &&
      x.h != (int64_t)l->local_heads * p)
    pre = sta_error(STA_ERR_SHAPE, "q: expected %lld heads (local_heads %d x %d ranks), got %lld",
                    (long long)l->local_heads * p, (int)l->local_heads, (int)p, (long long)x.h);
  return sta_sp_run(l->comm, &l->geom, l->layout, q, k, v, out, &job, pre);
}

