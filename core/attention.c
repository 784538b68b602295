/*
** attention.c -- the STA forward entry points: every check of STA.md
** sections 1-4 on the arguments, then dispatch to the tensors' backend.
*/
#include <math.h>
#include <stdlib.h>

#include "internal.h"

static const char *ARG[4] = {"q", "k", "v", "out"};

/* The memory checks of a forward (sta_attention_forward and _fp8 alike):
** out and lse have distinct elements, share none with each other or with
** the n tensors it reads (names rn). */
static sta_status check_forward_writes(const sta_tensor *out, const sta_tensor *lse,
                                       const sta_tensor *const *r, const char *const *rn,
                                       int n) {
  const sta_tensor *w[2] = {out, lse};
  static const char *const WN[2] = {"out", "lse"};
  return sta_check_writes("forward", 0, 2, w, WN, n, r, rn);
}

sta_status sta_check_operand4(const sta_tensor *t, const char *name, sta_layout layout,
                              sta_bshd *o) {
  sta_status rc = sta_tensor_bshd(t, layout, name, o);
  if (rc != STA_OK) return rc;
  if (o->d > 1 && o->sd != 1)
    return sta_error(STA_ERR_SHAPE,
                     "%s: the head dimension must be contiguous (stride 1), got stride %lld",
                     name, (long long)o->sd);
  return STA_OK;
}

/* internal.h: t (named name) is 4-D in layout with the shape bq of ref
** (named rn; its S too unless any_s), ref's dtype and device. */
sta_status sta_check_like(const sta_tensor *t, const char *name, sta_layout layout,
                          const sta_tensor *ref, const char *rn, const sta_bshd *bq, sta_bshd *bt,
                          int any_s) {
  sta_status rc = sta_check_operand4(t, name, layout, bt);
  if (rc != STA_OK) return rc;
  if (bt->b != bq->b || (!any_s && bt->s != bq->s) || bt->h != bq->h || bt->d != bq->d)
    return sta_error(STA_ERR_SHAPE,
                     "%s: shape [B=%lld, S=%lld, heads=%lld, D=%lld] differs from "
                     "%s's [B=%lld, S=%lld, heads=%lld, D=%lld]%s",
                     name, (long long)bt->b, (long long)bt->s, (long long)bt->h,
                     (long long)bt->d, rn, (long long)bq->b, (long long)bq->s,
                     (long long)bq->h, (long long)bq->d,
                     any_s ? " (STA_MASK_BLOCKS: only S may differ)" : "");
  if (t->dtype != ref->dtype)
    return sta_error(STA_ERR_DTYPE, "%s: dtype %s differs from %s's %s", name,
                     sta_dtype_name(t->dtype), rn, sta_dtype_name(ref->dtype));
  if (t->storage->device != ref->storage->device)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s while %s is on %s", name,
                     sta_device_name(t->storage->device), rn,
                     sta_device_name(ref->storage->device));
  return STA_OK;
}

/* t (named name) is 4-D in layout with q's shape bq, dtype and device. */
static sta_status check_like_q(const sta_tensor *t, const char *name, sta_layout layout,
                               const sta_tensor *q, const sta_bshd *bq, sta_bshd *bt) {
  return sta_check_like(t, name, layout, q, "q", bq, bt, 0);
}

/* t (named name) is f32 [B, heads, n] of bq's B and heads, on device dev
** (that of `ref`, named so in the message); last names n ("S", "D"). */
static sta_status check_f32_3d(const sta_tensor *t, const char *name, const sta_bshd *bq,
                               int64_t n, const char *last, sta_device dev, const char *ref) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, name);
  if (t->dtype != STA_F32)
    return sta_error(STA_ERR_DTYPE, "%s: expected f32, got %s", name, sta_dtype_name(t->dtype));
  if (t->ndim != 3 || t->shape[0] != bq->b || t->shape[1] != bq->h || t->shape[2] != n) {
    char got[96];
    int k = 0;
    got[0] = '\0';
    for (int32_t i = 0; i < t->ndim; i++)
      k += snprintf(got + k, sizeof got - (size_t)k, "%s%lld", i ? ", " : "",
                    (long long)t->shape[i]);
    return sta_error(STA_ERR_SHAPE, "%s: expected shape [B=%lld, heads=%lld, %s=%lld], got [%s]",
                     name, (long long)bq->b, (long long)bq->h, last, (long long)n, got);
  }
  if (t->storage->device != dev)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s while %s is on %s", name,
                     sta_device_name(t->storage->device), ref, sta_device_name(dev));
  return STA_OK;
}

/* STA.md's "seq_len N not supported for STA" (sta_last_error(), as
** sta_geometry_check left it), with what was expected added: the
** canvas's video rows and the rows q has, and a layout hint when q's other
** middle dimension could hold them ([B, heads, S, D] read as BSHD). */
static sta_status seq_len_hint(const sta_geometry *g, sta_layout layout, const sta_tensor *q,
                               int64_t s) {
  char base[512], hint[200] = "";
  int64_t rows = sta_geometry_video_rows(g), other = q->shape[layout == STA_BSHD ? 2 : 1];
  snprintf(base, sizeof base, "%s", sta_last_error());
  if (other >= rows)
    snprintf(hint, sizeof hint, "; q's dim %d has %lld: %s needs layout %s", layout == STA_BSHD ? 2 : 1,
             (long long)other, layout == STA_BSHD ? "[B, heads, S, D]" : "[B, S, heads, D]",
             layout == STA_BSHD ? "bhsd" : "bshd");
  size_t n = strlen(base);
  if (n > 0 && base[n - 1] == ')') { /* the tiled order's rows are there already */
    base[n - 1] = '\0';
    return sta_error(STA_ERR_SEQ_LEN, "%s%s)", base, hint);
  }
  return sta_error(STA_ERR_SEQ_LEN, "%s (canvas %dx%dx%d has %lld video rows, q has %lld%s)",
                   base, (int)g->canvas[0], (int)g->canvas[1], (int)g->canvas[2],
                   (long long)rows, (long long)s, hint);
}

/* desc's geometry for q (bq) and its windows: 1 or one per head. */
static sta_status check_windows(const sta_attention_desc *desc, const sta_tensor *q,
                                 const sta_bshd *bq) {
  sta_status rc;
  if ((rc = sta_geometry_check(&desc->geom, bq->s)) != STA_OK)
    return rc == STA_ERR_SEQ_LEN ? seq_len_hint(&desc->geom, desc->layout, q, bq->s) : rc;
  if (desc->n_windows != 1 && desc->n_windows != bq->h)
    return sta_error(STA_ERR_WINDOW, "n_windows: expected 1 or heads (%lld), got %d",
                     (long long)bq->h, (int)desc->n_windows);
  if (!desc->windows) return sta_error(STA_ERR_WINDOW, "windows: expected an array, got NULL");
  for (int32_t i = 0; i < desc->n_windows; i++)
    if ((rc = sta_window_check(&desc->geom, desc->windows + 3 * i)) != STA_OK) {
      if (desc->n_windows > 1) {
        char msg[512];
        snprintf(msg, sizeof msg, "head %d: %s", (int)i, sta_last_error());
        return sta_error(rc, "%s", msg);
      }
      return rc;
    }
  return STA_OK;
}

/* sta_attn_resolve; out_optional: out may be NULL (the backward reference,
** which has no forward output); f8: q, k, v are sta_attention_forward_fp8's
** (checked already). */
static sta_status resolve(const sta_attention_desc *desc, const sta_tensor *q,
                          const sta_tensor *k, const sta_tensor *v, const sta_tensor *out,
                          const sta_tensor *lse, sta_attn_params *p, int out_optional, int f8) {
  const sta_tensor *t[4] = {q, k, v, out};
  sta_bshd b[4];
  sta_status rc;
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (desc->layout != STA_BSHD && desc->layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)desc->layout);
  if ((rc = sta_check_operand4(q, "q", desc->layout, &b[0])) != STA_OK) return rc;
  if (q->dtype == STA_F8E4M3 && !f8)
    return sta_error(STA_ERR_DTYPE, "q: f8e4m3 operands go to sta_attention_forward_fp8 (with "
                     "their scales)");
  if (q->dtype == STA_I32)
    return sta_error(STA_ERR_DTYPE, "q: expected f32, f16 or bf16, got i32");
  if (desc->mask != STA_MASK_WINDOW && desc->mask != STA_MASK_BLOCKS &&
      desc->mask != STA_MASK_WINDOW_OR_BLOCKS)
    return sta_error(STA_ERR_ARGUMENT, "mask: expected STA_MASK_WINDOW (0), STA_MASK_BLOCKS (1) "
                     "or STA_MASK_WINDOW_OR_BLOCKS (2), got %d", (int)desc->mask);
  /* BLOCKS: k and v have their own length (v k's); out is q's */
  const int own = desc->mask == STA_MASK_BLOCKS;
  if ((rc = sta_check_like(k, "k", desc->layout, q, "q", &b[0], &b[1], own)) != STA_OK ||
      (rc = own ? sta_check_like(v, "v", desc->layout, k, "k", &b[1], &b[2], 0)
                : check_like_q(v, "v", desc->layout, q, &b[0], &b[2])) != STA_OK)
    return rc;
  if ((out || !out_optional) &&
      (rc = check_like_q(out, ARG[3], desc->layout, q, &b[0], &b[3])) != STA_OK)
    return rc;
  if (b[0].b < 1 || b[0].h < 1 || b[0].d < 1)
    return sta_error(STA_ERR_SHAPE,
                     "q: batch, heads and D must be >= 1, got B=%lld heads=%lld D=%lld",
                     (long long)b[0].b, (long long)b[0].h, (long long)b[0].d);
  if (!own && (rc = check_windows(desc, q, &b[0])) != STA_OK) return rc;
  if (desc->softmax != STA_SOFTMAX_EXACT && desc->softmax != STA_SOFTMAX_FAST)
    return sta_error(STA_ERR_ARGUMENT,
                     "softmax: expected STA_SOFTMAX_EXACT (0) or STA_SOFTMAX_FAST (1), got %d",
                     (int)desc->softmax);
  if (desc->precision != STA_PRECISION_NATIVE && desc->precision != STA_PRECISION_FP8)
    return sta_error(STA_ERR_ARGUMENT,
                     "precision: expected STA_PRECISION_NATIVE (0) or STA_PRECISION_FP8 (1), "
                     "got %d", (int)desc->precision);
  if (desc->deterministic != 0 && desc->deterministic != 1)
    return sta_error(STA_ERR_ARGUMENT, "deterministic: expected 0 or 1, got %d",
                     (int)desc->deterministic);
  if (isnan(desc->scale) || isinf(desc->scale))
    return sta_error(STA_ERR_ARGUMENT, "scale: expected a finite value, got %g",
                     (double)desc->scale);
  if (lse && (rc = check_f32_3d(lse, "lse", &b[0], b[0].s, "S", q->storage->device, "q")) !=
                 STA_OK)
    return rc;
  if ((rc = check_forward_writes(out, lse, t, ARG, 3)) != STA_OK) return rc;
  if (q->storage->device != STA_CPU && !sta_backend_available(q->storage->device))
    return sta_backend_missing(q->storage->device);
  int32_t *w = NULL; /* BLOCKS: no windows, no geometry */
  if (!own && !(w = sta_malloc(sizeof(int32_t) * 3 * (size_t)b[0].h)))
    return sta_error(STA_ERR_NOMEM, "out of host memory (windows)");
  for (int64_t h = 0; h < b[0].h && w; h++)
    for (int i = 0; i < 3; i++)
      w[3 * h + i] = desc->windows[(desc->n_windows == 1 ? 0 : 3 * h) + i];

  memset(p, 0, sizeof *p);
  p->q = sta_tensor_data(q); p->k = sta_tensor_data(k); p->v = sta_tensor_data(v);
  p->o = out ? sta_tensor_data(out) : NULL;
  p->dtype = q->dtype;
  p->batch = b[0].b; p->seq_len = b[0].s; p->heads = b[0].h; p->head_dim = b[0].d;
  p->q_sb = b[0].sb; p->q_ss = b[0].ss; p->q_sh = b[0].sh;
  p->k_sb = b[1].sb; p->k_ss = b[1].ss; p->k_sh = b[1].sh;
  p->v_sb = b[2].sb; p->v_ss = b[2].ss; p->v_sh = b[2].sh;
  if (out) { p->o_sb = b[3].sb; p->o_ss = b[3].ss; p->o_sh = b[3].sh; }
  if (lse) {
    p->lse = sta_tensor_data(lse);
    p->lse_sb = lse->stride[0]; p->lse_sh = lse->stride[1]; p->lse_ss = lse->stride[2];
  }
  if (!own) {
    for (int i = 0; i < 3; i++) { p->canvas[i] = desc->geom.canvas[i]; p->tile[i] = desc->geom.tile[i]; }
    sta_geometry_grid(&desc->geom, p->grid);
    p->video_len = sta_geometry_video_tokens(&desc->geom);
    p->video_rows = sta_geometry_video_rows(&desc->geom);
    p->tiled = desc->geom.order == STA_ORDER_TILED;
    p->text_len = sta_geometry_text_len(&desc->geom, b[0].s);
  }
  p->windows = w;
  p->scale = desc->scale > 0 ? desc->scale : (float)(1.0 / sqrt((double)b[0].d));
  p->fast_softmax = desc->softmax == STA_SOFTMAX_FAST;
  p->precision = desc->precision;
  p->deterministic = desc->deterministic;
  p->kv_len = b[1].s;
  if (desc->mask != STA_MASK_WINDOW && (rc = sta_mask_resolve(desc, q, p)) != STA_OK) {
    free(w);
    return rc;
  }
  return STA_OK;
}

sta_status sta_attn_resolve(const sta_attention_desc *desc, const sta_tensor *q,
                            const sta_tensor *k, const sta_tensor *v, const sta_tensor *out,
                            const sta_tensor *lse, sta_attn_params *p) {
  return resolve(desc, q, k, v, out, lse, p, 0, 0);
}

/* The tensors a call writes: out, lse (forward), dq, dk, dv (backward). */
enum { W_OUT, W_LSE, W_DQ, W_DK, W_DV, W_N };

/* Point p's output w at t (its data and strides). */
static void point_output(sta_attn_params *p, int w, const sta_tensor *t, const sta_bshd *b) {
  void *d = sta_tensor_data(t);
  switch (w) {
  case W_OUT: p->o = d; p->o_sb = b->sb; p->o_ss = b->ss; p->o_sh = b->sh; break;
  case W_LSE:
    p->lse = d;
    p->lse_sb = t->stride[0]; p->lse_sh = t->stride[1]; p->lse_ss = t->stride[2];
    break;
  case W_DQ: p->dq = d; p->dq_sb = b->sb; p->dq_ss = b->ss; p->dq_sh = b->sh; break;
  case W_DK: p->dk = d; p->dk_sb = b->sb; p->dk_ss = b->ss; p->dk_sh = b->sh; break;
  default: p->dv = d; p->dv_sb = b->sb; p->dv_ss = b->ss; p->dv_sh = b->sh; break;
  }
}

/* Run a CPU attention (forward or backward) into scratch copies of the
** tensors it writes (outs[w], NULL where it writes none), copied over them
** only when it finishes: a cancelled (or failed) call changes nothing. */
static sta_status run_scratch(const sta_attn_params *p, sta_layout layout,
                              sta_tensor *const *outs, sta_status (*fn)(const sta_attn_params *)) {
  sta_tensor *sc[W_N] = {NULL, NULL, NULL, NULL, NULL};
  sta_attn_params s = *p;
  sta_status rc = STA_OK;
  for (int w = 0; w < W_N && rc == STA_OK; w++) {
    sta_bshd b;
    if (!outs[w]) continue;
    rc = sta_tensor_create(&sc[w], outs[w]->dtype, STA_CPU, outs[w]->ndim, outs[w]->shape);
    if (rc == STA_OK && w != W_LSE) rc = sta_tensor_bshd(sc[w], layout, "out", &b);
    if (rc == STA_OK) point_output(&s, w, sc[w], &b);
  }
  if (rc == STA_OK) rc = fn(&s);
  for (int w = 0; w < W_N && rc == STA_OK; w++)
    if (outs[w]) rc = sta_tensor_copy(outs[w], sc[w]);
  for (int w = 0; w < W_N; w++) sta_tensor_destroy(sc[w]);
  return rc;
}

sta_status sta_attention_forward(const sta_attention_desc *desc,
                                 const sta_tensor *q, const sta_tensor *k,
                                 const sta_tensor *v, sta_tensor *out,
                                 sta_tensor *lse) {
  sta_attn_params p;
  sta_status rc = sta_attn_resolve(desc, q, k, v, out, lse, &p);
  if (rc != STA_OK) return rc;
  sta_tensor *outs[W_N] = {out, lse, NULL, NULL, NULL};
  rc = q->storage->device == STA_CPU
           ? run_scratch(&p, desc->layout, outs,
                         p.precision == STA_PRECISION_FP8 ? sta_cpu_fp8_attention
                                                          : sta_cpu_attention)
           : sta_attn_run(&p, q->storage->device);
  free((void *)p.windows);
  return rc;
}

sta_status sta_attn_run(const sta_attn_params *p, sta_device device) {
  sta_status rc = sta_cancel_point("attention"); /* before each launch */
  const sta_backend_ops *be = sta_backend_get(device);
  if (rc != STA_OK) return rc;
  return p->precision == STA_PRECISION_FP8 ? be->attention_fp8(p) : be->attention(p);
}

/* f32 [B, S, heads, D] (in desc's layout, contiguous, on x8's device) of
** x8 * scale: rows scaled by rs ([B, heads, S]) or channels by cs ([B,
** heads, D]), by the device's backend (fp8_dequantize). */
static sta_status dequantize(sta_tensor **out, sta_layout layout, const sta_tensor *x8,
                             const sta_bshd *bx, const sta_tensor *rs, const sta_tensor *cs) {
  sta_tensor *t = NULL;
  sta_bshd bt;
  const sta_device dev = x8->storage->device;
  sta_status rc = sta_tensor_create(&t, STA_F32, dev, 4, x8->shape);
  if (rc == STA_OK) rc = sta_tensor_bshd(t, layout, "dequantized", &bt);
  if (rc != STA_OK) { sta_tensor_destroy(t); return rc; }
  const uint8_t *x = sta_tensor_data(x8);
  const float *sc = sta_tensor_data(rs ? rs : cs);
  const int64_t *ss = (rs ? rs : cs)->stride;
  rc = sta_backend_get(dev)->fp8_dequantize(sta_tensor_data(t), &bt, x, bx, sc, ss, rs != NULL);
  if (rc != STA_OK) {
    sta_tensor_destroy(t);
    return rc;
  }
  *out = t;
  return STA_OK;
}

sta_status sta_attention_forward_fp8(const sta_attention_desc *desc, const sta_tensor *q8,
                                     const sta_tensor *k8, const sta_tensor *v8,
                                     const sta_tensor *q_scale, const sta_tensor *k_scale,
                                     const sta_tensor *v_scale, sta_tensor *out,
                                     sta_tensor *lse) {
  static const char *const N8[3] = {"q8", "k8", "v8"};
  const sta_tensor *x8[3] = {q8, k8, v8}, *sc[3] = {q_scale, k_scale, v_scale};
  static const char *const NS[3] = {"q_scale", "k_scale", "v_scale"};
  sta_bshd b[4];
  sta_status rc;
  for (int i = 0; i < 3; i++) STA_CHECK_HANDLE(x8[i], STA_KIND_TENSOR, N8[i]);
  for (int i = 0; i < 3; i++) STA_CHECK_HANDLE(sc[i], STA_KIND_TENSOR, NS[i]);
  STA_CHECK_HANDLE(out, STA_KIND_TENSOR, "out");
  if (lse) STA_CHECK_HANDLE(lse, STA_KIND_TENSOR, "lse");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (desc->precision != STA_PRECISION_FP8)
    return sta_error(STA_ERR_ARGUMENT, "precision: sta_attention_forward_fp8 computes in fp8: "
                     "expected STA_PRECISION_FP8 (1), got %d", (int)desc->precision);
  if (desc->layout != STA_BSHD && desc->layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)desc->layout);
  for (int i = 0; i < 3; i++)
    if (x8[i]->dtype != STA_F8E4M3)
      return sta_error(STA_ERR_DTYPE, "%s: expected f8e4m3, got %s", N8[i],
                       sta_dtype_name(x8[i]->dtype));
  if ((rc = sta_check_operand4(q8, "q8", desc->layout, &b[0])) != STA_OK) return rc;
  for (int i = 1; i < 3; i++)
    if ((rc = check_like_q(x8[i], N8[i], desc->layout, q8, &b[0], &b[i])) != STA_OK) return rc;
  if ((rc = sta_check_operand4(out, "out", desc->layout, &b[3])) != STA_OK) return rc;
  if (b[3].b != b[0].b || b[3].s != b[0].s || b[3].h != b[0].h || b[3].d != b[0].d)
    return sta_error(STA_ERR_SHAPE, "out: shape [B=%lld, S=%lld, heads=%lld, D=%lld] differs "
                     "from q8's [B=%lld, S=%lld, heads=%lld, D=%lld]", (long long)b[3].b,
                     (long long)b[3].s, (long long)b[3].h, (long long)b[3].d, (long long)b[0].b,
                     (long long)b[0].s, (long long)b[0].h, (long long)b[0].d);
  if (out->dtype == STA_F8E4M3)
    return sta_error(STA_ERR_DTYPE, "out: expected f32, f16 or bf16, got f8e4m3");
  sta_device dev = q8->storage->device;
  if (out->storage->device != dev)
    return sta_error(STA_ERR_ARGUMENT, "out: on %s while q8 is on %s",
                     sta_device_name(out->storage->device), sta_device_name(dev));
  for (int i = 0; i < 3; i++)
    if ((rc = check_f32_3d(sc[i], NS[i], &b[0], i < 2 ? b[0].s : b[0].d, i < 2 ? "S" : "D", dev,
                           "q8")) != STA_OK)
      return rc;
  const sta_tensor *in[6] = {q8, k8, v8, q_scale, k_scale, v_scale};
  static const char *const IN[6] = {"q8", "k8", "v8", "q_scale", "k_scale", "v_scale"};
  if ((rc = check_forward_writes(out, lse, in, IN, 6)) != STA_OK) return rc;
  sta_attn_params p; /* the forward's checks: geometry, windows, lse, the backend */
  if ((rc = resolve(desc, q8, k8, v8, NULL, lse, &p, 1, 1)) != STA_OK) return rc;
  free((void *)p.windows);
  sta_tensor *t[4] = {NULL, NULL, NULL, NULL};
  for (int i = 0; i < 3 && (rc = dequantize(&t[i], desc->layout, x8[i], &b[i],
                                            i < 2 ? sc[i] : NULL, i < 2 ? NULL : sc[i])) == STA_OK;
       i++) {}
  if (rc == STA_OK) rc = sta_tensor_create(&t[3], STA_F32, dev, 4, out->shape);
  if (rc == STA_OK) rc = sta_attention_forward(desc, t[0], t[1], t[2], t[3], lse);
  if (rc == STA_OK) rc = sta_tensor_copy(out, t[3]);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(t[i]);
  return rc;
}

sta_status sta_attention_reference(const sta_attention_desc *desc,
                                   const sta_tensor *q, const sta_tensor *k,
                                   const sta_tensor *v, sta_tensor *out,
                                   sta_tensor *lse) {
  if (sta_handle_live(q, STA_KIND_TENSOR) && q->storage->device != STA_CPU)
    return sta_error(STA_ERR_ARGUMENT, "q: the reference runs on host tensors only");
  sta_attn_params p;
  sta_status rc = sta_attn_resolve(desc, q, k, v, out, lse, &p);
  if (rc != STA_OK) return rc;
  sta_tensor *outs[W_N] = {out, lse, NULL, NULL, NULL};
  rc = run_scratch(&p, desc->layout, outs,
                   p.precision == STA_PRECISION_FP8 ? sta_cpu_fp8_attention
                                                    : sta_cpu_attention_reference);
  free((void *)p.windows);
  return rc;
}

/* The backward's operands beyond the forward's: dout read, dq dk dv
** written (names in order); dout and dq like q, dk and dv like k (like q
** but for STA_MASK_BLOCKS's own length), the written ones overlapping
** nothing else.  ro: the tensors only read (q, k, v, out or dout, ...). */
static sta_status bwd_operands(const sta_attention_desc *desc, const sta_tensor *q,
                               const sta_tensor *k, const sta_tensor *dout, sta_tensor *const *g,
                               const sta_tensor *const *ro, const char *const *ro_name,
                               int n_ro, sta_attn_params *p) {
  static const char *const GN[3] = {"dq", "dk", "dv"};
  sta_bshd bq, bk, bd, bg[3];
  sta_status rc;
  const int own = p->mask == STA_MASK_BLOCKS;
  if ((rc = sta_check_operand4(q, "q", desc->layout, &bq)) != STA_OK) return rc;
  if ((rc = sta_check_operand4(k, "k", desc->layout, &bk)) != STA_OK) return rc;
  if ((rc = check_like_q(dout, "dout", desc->layout, q, &bq, &bd)) != STA_OK) return rc;
  for (int i = 0; i < 3; i++)
    if ((rc = i > 0 && own ? sta_check_like(g[i], GN[i], desc->layout, k, "k", &bk, &bg[i], 0)
                           : check_like_q(g[i], GN[i], desc->layout, q, &bq, &bg[i])) != STA_OK)
      return rc;
  const sta_tensor *w[3] = {g[0], g[1], g[2]};
  if ((rc = sta_check_writes("backward", 0, 3, w, GN, n_ro, ro, ro_name)) != STA_OK) return rc;
  p->dout = sta_tensor_data(dout);
  p->dq = sta_tensor_data(g[0]); p->dk = sta_tensor_data(g[1]); p->dv = sta_tensor_data(g[2]);
  p->do_sb = bd.sb; p->do_ss = bd.ss; p->do_sh = bd.sh;
  p->dq_sb = bg[0].sb; p->dq_ss = bg[0].ss; p->dq_sh = bg[0].sh;
  p->dk_sb = bg[1].sb; p->dk_ss = bg[1].ss; p->dk_sh = bg[1].sh;
  p->dv_sb = bg[2].sb; p->dv_ss = bg[2].ss; p->dv_sh = bg[2].sh;
  return STA_OK;
}

sta_status sta_attention_backward(const sta_attention_desc *desc, const sta_tensor *q,
                                  const sta_tensor *k, const sta_tensor *v,
                                  const sta_tensor *out, const sta_tensor *lse,
                                  const sta_tensor *dout, sta_tensor *dq, sta_tensor *dk,
                                  sta_tensor *dv) {
  sta_attn_params p;
  sta_status rc;
  if (!lse && desc && q && k && v && out)
    return sta_error(STA_ERR_ARGUMENT,
                     "lse: expected the forward's f32 [B, heads, S] log-sum-exp, got NULL");
  if ((rc = sta_attn_resolve(desc, q, k, v, out, lse, &p)) != STA_OK) return rc;
  if (p.precision == STA_PRECISION_FP8) {
    free((void *)p.windows);
    return sta_error(STA_ERR_UNSUPPORTED, "precision: the backward has no STA_PRECISION_FP8 "
                     "mode (it differentiates the exact forward): use STA_PRECISION_NATIVE");
  }
  sta_tensor *g[3] = {dq, dk, dv};
  const sta_tensor *ro[6] = {q, k, v, out, lse, dout};
  static const char *const RN[6] = {"q", "k", "v", "out", "lse", "dout"};
  rc = bwd_operands(desc, q, k, dout, g, ro, RN, 6, &p);
  sta_tensor *outs[W_N] = {NULL, NULL, dq, dk, dv};
  if (rc == STA_OK && q->storage->device == STA_CPU)
    rc = run_scratch(&p, desc->layout, outs, sta_cpu_attention_backward);
  else if (rc == STA_OK && (rc = sta_cancel_point("backward")) == STA_OK) {
    const sta_backend_ops *be = sta_backend_get(q->storage->device);
    rc = be->attention_backward
             ? be->attention_backward(&p)
             : sta_error(STA_ERR_UNSUPPORTED, "backward: not implemented on %s yet",
                         sta_device_name(q->storage->device));
  }
  free((void *)p.windows);
  return rc;
}

sta_status sta_attention_backward_reference(const sta_attention_desc *desc,
                                            const sta_tensor *q, const sta_tensor *k,
                                            const sta_tensor *v, const sta_tensor *dout,
                                            sta_tensor *dq, sta_tensor *dk, sta_tensor *dv) {
  if (sta_handle_live(q, STA_KIND_TENSOR) && q->storage->device != STA_CPU)
    return sta_error(STA_ERR_ARGUMENT, "q: the reference runs on host tensors only");
  sta_attn_params p;
  sta_status rc = resolve(desc, q, k, v, NULL, NULL, &p, 1, 0);
  if (rc != STA_OK) return rc;
  if (p.precision == STA_PRECISION_FP8) {
    free((void *)p.windows);
    return sta_error(STA_ERR_UNSUPPORTED, "precision: the backward has no STA_PRECISION_FP8 "
                     "mode (it differentiates the exact forward): use STA_PRECISION_NATIVE");
  }
  sta_tensor *g[3] = {dq, dk, dv};
  const sta_tensor *ro[4] = {q, k, v, dout};
  static const char *const RN[4] = {"q", "k", "v", "dout"};
  rc = bwd_operands(desc, q, k, dout, g, ro, RN, 4, &p);
  sta_tensor *outs[W_N] = {NULL, NULL, dq, dk, dv};
  if (rc == STA_OK) rc = run_scratch(&p, desc->layout, outs, sta_cpu_attention_backward_reference);
  free((void *)p.windows);
  return rc;
}

/* Sum over the query tiles of one axis of (query tokens * key tokens). */
static double axis_pairs(int32_t c_tok, int32_t tile, int32_t k) {
  int32_t c = (c_tok + tile - 1) / tile, s, n;
  double sum = 0;
  for (int32_t q = 0; q < c; q++) {
    if (sta_window_range(q, k, c, &s, &n) != STA_OK) return 0;
    int32_t qt = q == c - 1 ? c_tok - q * tile : tile;
    int32_t hi = (s + n) * tile < c_tok ? (s + n) * tile : c_tok;
    sum += (double)qt * (double)(hi - s * tile);
  }
  return sum;
}

double sta_attention_flops(const sta_attention_desc *desc, int64_t batch,
                           int64_t seq_len, int64_t heads, int64_t head_dim) {
  if (desc && desc->mask != STA_MASK_WINDOW)
    return sta_mask_flops(desc, batch, seq_len, heads, head_dim);
  /* a problem the forward would refuse has no work: this also bounds every
  ** size below (canvas <= 2^20 per axis, seq_len >= the video rows) and
  ** keeps the loop over heads to the windows given */
  if (!desc || !desc->windows || heads < 1 || batch < 0 || head_dim < 0 ||
      (desc->n_windows != 1 && desc->n_windows != heads))
    return 0;
  const sta_geometry *g = &desc->geom;
  if (sta_geometry_check(g, seq_len) != STA_OK) return 0;
  int64_t v = sta_geometry_video_tokens(g), tl = sta_geometry_text_len(g, seq_len);
  int64_t text_rows = seq_len - sta_geometry_video_rows(g); /* padding rows: no work */
  double total = 0;
  for (int64_t h = 0; h < (desc->n_windows == 1 ? 1 : heads); h++) {
    const int32_t *w = desc->windows + 3 * h;
    double pairs = 1;
    for (int i = 0; i < 3; i++) pairs *= axis_pairs(g->canvas[i], g->tile[i], w[i]);
    pairs += (double)v * (double)tl;                          /* video -> text */
    pairs += (double)text_rows * (double)(v + tl);            /* text queries */
    total += pairs;
  }
  if (desc->n_windows == 1) total *= (double)heads; /* one window: every head alike */
  return 4.0 * (double)head_dim * (double)batch * total;
}

sta_status sta_head_diff(const sta_tensor *a, const sta_tensor *b,
                         sta_layout layout, float *l1, float *l2) {
  sta_bshd x, y;
  sta_status rc;
  if ((rc = sta_check_operand4(a, "a", layout, &x)) != STA_OK) return rc;
  if ((rc = sta_check_operand4(b, "b", layout, &y)) != STA_OK) return rc;
  if (x.b != y.b || x.s != y.s || x.h != y.h || x.d != y.d)
    return sta_error(STA_ERR_SHAPE, "b: shape differs from a's");
  if (a->dtype != b->dtype)
    return sta_error(STA_ERR_DTYPE, "b: dtype %s differs from a's %s",
                     sta_dtype_name(b->dtype), sta_dtype_name(a->dtype));
  if (a->storage->device != b->storage->device)
    return sta_error(STA_ERR_ARGUMENT, "b: on a different device than a");
  if (!l1 || !l2) return sta_error(STA_ERR_ARGUMENT, "l1, l2: expected arrays, got NULL");
  sta_attn_params p;
  memset(&p, 0, sizeof p);
  p.q = sta_tensor_data(a);
  p.o = sta_tensor_data(b);
  p.dtype = a->dtype;
  p.batch = x.b; p.seq_len = x.s; p.heads = x.h; p.head_dim = x.d;
  p.q_sb = x.sb; p.q_ss = x.ss; p.q_sh = x.sh;
  p.o_sb = y.sb; p.o_ss = y.ss; p.o_sh = y.sh;
  if (a->storage->device != STA_CPU && !sta_backend_available(a->storage->device))
    return sta_backend_missing(a->storage->device);
  return sta_backend_get(a->storage->device)->head_diff(&p, l1, l2);
}
