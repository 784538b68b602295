/*
** shard.c -- the token split of one problem over P ranks: the checks of a
** rank's operands against the global geometry (shared with the SP
** pipeline), and sta_sp_shard / sta_sp_unshard.
*/
#include "dist.h"

/* View of t (4-D in layout) restricted to rows [s0, s0+sn) and heads
** [h0, h0+hn). */
static sta_status block(sta_tensor **out, const sta_tensor *t, sta_layout layout,
                        int64_t s0, int64_t sn, int64_t h0, int64_t hn) {
  int32_t sd = layout == STA_BSHD ? 1 : 2, hd = layout == STA_BSHD ? 2 : 1;
  sta_tensor *a = NULL;
  sta_status rc = sta_tensor_narrow(&a, t, sd, s0, sn);
  if (rc == STA_OK) rc = sta_tensor_narrow(out, a, hd, h0, hn);
  sta_tensor_destroy(a);
  return rc;
}

sta_status sta_split_untiled(const sta_geometry *g) {
  if (g->order == STA_ORDER_UNTILED) return STA_OK;
  return sta_error(STA_ERR_UNSUPPORTED,
                   "order: sequence parallelism takes the untiled order (shards are ranges "
                   "of untiled tokens), got %d", (int)g->order);
}

sta_status sta_split_check(split *sp, const sta_geometry *g, sta_layout layout,
                           const sta_tensor *const t[4], const char *const names[4],
                           int32_t rank, int32_t size) {
  sta_bshd x[4];
  sta_status rc;
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  if (layout != STA_BSHD && layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)layout);
  if (size < 1) return sta_error(STA_ERR_ARGUMENT, "size: expected >= 1 ranks, got %d", (int)size);
  if (rank < 0 || rank >= size)
    return sta_error(STA_ERR_ARGUMENT, "rank: expected 0..%d, got %d", (int)size - 1, (int)rank);
  for (int i = 0; i < 4; i++) {
    if (!t[i]) continue;
    if ((rc = sta_tensor_bshd(t[i], layout, names[i], &x[i])) != STA_OK) return rc;
  }
  if ((rc = sta_split_untiled(g)) != STA_OK) return rc;
  memset(sp, 0, sizeof *sp);
  sp->p = size;
  sp->r = rank;
  for (int i = 0; i < 3; i++)
    if (g->canvas[i] < 1)
      return sta_error(STA_ERR_WINDOW, "canvas: %dx%dx%d, expected each >= 1",
                       (int)g->canvas[0], (int)g->canvas[1], (int)g->canvas[2]);
  sp->v = sta_geometry_video_tokens(g);
  if (sp->v % size != 0)
    return sta_error(STA_ERR_SHAPE,
                     "canvas: V = %lld video tokens (%dx%dx%d) is not divisible by "
                     "the %d ranks", (long long)sp->v, (int)g->canvas[0],
                     (int)g->canvas[1], (int)g->canvas[2], (int)size);
  sp->vr = sp->v / size;
  return STA_OK;
}

sta_status sta_split_local(split *sp, const sta_geometry *g, const sta_bshd *x,
                           const char *name) {
  sta_status rc;
  sp->b = x->b; sp->h = x->h; sp->d = x->d; sp->sl = x->s;
  if (sp->h % sp->p != 0)
    return sta_error(STA_ERR_SHAPE, "heads: %lld heads are not divisible by the %d ranks",
                     (long long)sp->h, (int)sp->p);
  sp->hl = sp->h / sp->p;
  if (sp->sl < sp->vr)
    return sta_error(STA_ERR_SEQ_LEN,
                     "%s: %lld rows on rank %d, expected V/P = %lld video rows "
                     "(+ text rows)", name, (long long)sp->sl, (int)sp->r,
                     (long long)sp->vr);
  sp->text = sp->sl - sp->vr;
  sp->s = sp->v + sp->text;
  if ((rc = sta_geometry_check(g, sp->s)) != STA_OK) return rc;
  return STA_OK;
}

static sta_status shard_common(sta_tensor *full, const sta_tensor *local,
                               const sta_geometry *g, sta_layout layout, int32_t rank,
                               int32_t size, int to_local) {
  static const char *const names[4] = {"local", "full", "", ""};
  const sta_tensor *t[4] = {local, full, NULL, NULL};
  sta_bshd xl, xf;
  split sp;
  sta_status rc;
  STA_CHECK_HANDLE(local, STA_KIND_TENSOR, "local");
  STA_CHECK_HANDLE(full, STA_KIND_TENSOR, "full");
  if ((rc = sta_split_check(&sp, g, layout, t, names, rank, size)) != STA_OK) return rc;
  sta_tensor_bshd(local, layout, "local", &xl);
  sta_tensor_bshd(full, layout, "full", &xf);
  if (xf.s < sp.v)
    return sta_error(STA_ERR_SEQ_LEN, "seq_len %lld not supported for STA", (long long)xf.s);
  int64_t text = xf.s - sp.v;
  if (xl.b != xf.b || xl.h != xf.h || xl.d != xf.d || xl.s != sp.vr + text)
    return sta_error(STA_ERR_SHAPE,
                     "local: shape [B=%lld, S=%lld, heads=%lld, D=%lld], expected "
                     "[B=%lld, S=%lld (V/P %lld + text %lld), heads=%lld, D=%lld]",
                     (long long)xl.b, (long long)xl.s, (long long)xl.h, (long long)xl.d,
                     (long long)xf.b, (long long)(sp.vr + text), (long long)sp.vr,
                     (long long)text, (long long)xf.h, (long long)xf.d);
  /* views first, copies after: a failure leaves the destination as it was */
  sta_tensor *lv = NULL, *fv = NULL, *lt = NULL, *ft = NULL;
  rc = block(&lv, local, layout, 0, sp.vr, 0, xf.h);
  if (rc == STA_OK) rc = block(&fv, full, layout, rank * sp.vr, sp.vr, 0, xf.h);
  if (rc == STA_OK && text > 0) rc = block(&lt, local, layout, sp.vr, text, 0, xf.h);
  if (rc == STA_OK && text > 0) rc = block(&ft, full, layout, sp.v, text, 0, xf.h);
  if (rc == STA_OK) rc = to_local ? sta_tensor_copy(lv, fv) : sta_tensor_copy(fv, lv);
  if (rc == STA_OK && text > 0) rc = to_local ? sta_tensor_copy(lt, ft) : sta_tensor_copy(ft, lt);
  sta_tensor_destroy(lv);
  sta_tensor_destroy(fv);
  sta_tensor_destroy(lt);
  sta_tensor_destroy(ft);
  return rc;
}

sta_status sta_sp_shard(sta_tensor *local, const sta_tensor *full, const sta_geometry *g,
                        sta_layout layout, int32_t rank, int32_t size) {
  return shard_common((sta_tensor *)full, local, g, layout, rank, size, 1);
}

sta_status sta_sp_unshard(sta_tensor *full, const sta_tensor *local, const sta_geometry *g,
                          sta_layout layout, int32_t rank, int32_t size) {
  return shard_common(full, local, g, layout, rank, size, 0);
}

