/*
** cpu_plan.c -- the compact row order, work items and key ranges shared by
** the CPU forward and backward (cpu_common.h).
*/
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

int64_t sta_cpu_key_ranges(const sta_cpu_plan *pl, int64_t head, int64_t tile,
                          int64_t *lo, int64_t *hi) {
  const sta_attn_params *p = pl->p;
  int64_t n = 0;
  if (tile < 0) {
    lo[0] = 0; hi[0] = pl->keys;
    return 1;
  }
  const int32_t *g = p->grid, *win = p->windows + 3 * head;
  int32_t qc[3] = {(int32_t)(tile / ((int64_t)g[1] * g[2])),
                   (int32_t)((tile / g[2]) % g[1]), (int32_t)(tile % g[2])};
  int32_t st[3], cn[3];
  for (int i = 0; i < 3; i++) sta_window_range(qc[i], win[i], g[i], &st[i], &cn[i]);
  for (int32_t a = st[0]; a < st[0] + cn[0]; a++)
    for (int32_t c = st[1]; c < st[1] + cn[1]; c++) {
      int64_t t0 = ((int64_t)a * g[1] + c) * g[2] + st[2];
      int64_t s = pl->tile_off[t0], e = pl->tile_off[t0 + cn[2]];
      if (n > 0 && hi[n - 1] == s) hi[n - 1] = e;
      else { lo[n] = s; hi[n] = e; n++; }
    }
  if (p->text_len > 0) {
    if (n > 0 && hi[n - 1] == p->video_len) hi[n - 1] = pl->keys;
    else { lo[n] = p->video_len; hi[n] = pl->keys; n++; }
  }
  return n;
}

void sta_cpu_load_row(float *dst, const char *src, sta_dtype dt, int64_t D,
                     float s) {
  if (dt == STA_F32) {
    const float *f = (const float *)src;
    for (int64_t d = 0; d < D; d++) dst[d] = f[d] * s;
    return;
  }
  const uint16_t *h = (const uint16_t *)src;
  if (dt == STA_BF16)
    for (int64_t d = 0; d < D; d++) dst[d] = sta_bf16_to_f32(h[d]) * s;
  else
    for (int64_t d = 0; d < D; d++) dst[d] = sta_f16_to_f32(h[d]) * s;
}

sta_status sta_cpu_plan_make(sta_cpu_plan *pl, const sta_attn_params *p) {
  const int32_t *g = p->grid, *tl = p->tile, *cv = p->canvas;
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  pl->ntiles = (int64_t)g[0] * g[1] * g[2];
  pl->keys = p->video_len + p->text_len;
  pl->rows = p->video_len + p->seq_len - p->video_rows;
  pl->npad = p->video_rows - p->video_len;
  pl->max_ranges = (int64_t)g[0] * g[1] + 1;
  pl->tile_off = sta_malloc(sizeof(int64_t) * (size_t)(pl->ntiles + 1));
  pl->token = sta_malloc(sizeof(int64_t) * (size_t)p->video_len);
  pl->pad = sta_malloc(sizeof(int64_t) * (size_t)pl->npad + 1);
  if (!pl->tile_off || !pl->token || !pl->pad) return STA_ERR_NOMEM;
  int64_t r = 0;
  for (int64_t id = 0; id < pl->ntiles; id++) {
    int64_t it = id / ((int64_t)g[1] * g[2]), ih = (id / g[2]) % g[1], iw = id % g[2];
    int64_t t0 = it * tl[0], h0 = ih * tl[1], w0 = iw * tl[2];
    int64_t t1 = t0 + tl[0] < cv[0] ? t0 + tl[0] : cv[0];
    int64_t h1 = h0 + tl[1] < cv[1] ? h0 + tl[1] : cv[1];
    int64_t w1 = w0 + tl[2] < cv[2] ? w0 + tl[2] : cv[2];
    pl->tile_off[id] = r;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t hh = h0; hh < h1; hh++)
        for (int64_t ww = w0; ww < w1; ww++) {
          int64_t x = (t * cv[1] + hh) * cv[2] + ww;
          pl->token[r++] = p->tiled ? sta_tiled_row(cv, tl, g, x) : x;
        }
  }
  pl->tile_off[pl->ntiles] = r;
  for (int64_t j = 0, n = 0; n < pl->npad; j++)
    if (sta_tiled_token(cv, tl, g, j) < 0) pl->pad[n++] = j;
  if (sta_cpu_items(pl, p->seq_len - p->video_rows, &pl->items, &pl->nitems) != STA_OK)
    return STA_ERR_NOMEM;
  pl->kf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  pl->vf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  if (!pl->kf || !pl->vf) return STA_ERR_NOMEM;
  return STA_OK;
}

sta_status sta_cpu_items(const sta_cpu_plan *pl, int64_t text_rows, sta_cpu_item **out,
                         int64_t *count) {
  int64_t n = (text_rows + STA_CPU_QB - 1) / STA_CPU_QB;
  for (int64_t id = 0; id < pl->ntiles; id++)
    n += (pl->tile_off[id + 1] - pl->tile_off[id] + STA_CPU_QB - 1) / STA_CPU_QB;
  sta_cpu_item *it = sta_malloc(sizeof(sta_cpu_item) * (size_t)(n > 0 ? n : 1));
  if (!it) return STA_ERR_NOMEM;
  n = 0;
  /* text rows first: the largest items start first */
  for (int64_t s = 0; s < text_rows; s += STA_CPU_QB) {
    it[n].row = pl->p->video_len + s;
    it[n].count = text_rows - s < STA_CPU_QB ? text_rows - s : STA_CPU_QB;
    it[n++].tile = -1;
  }
  for (int64_t id = 0; id < pl->ntiles; id++) {
    int64_t c = pl->tile_off[id + 1] - pl->tile_off[id];
    int64_t parts = (c + STA_CPU_QB - 1) / STA_CPU_QB, done = 0;
    for (int64_t k = 0; k < parts; k++) {
      int64_t len = (c - done) / (parts - k);
      it[n].row = pl->tile_off[id] + done;
      it[n].count = len;
      it[n++].tile = id;
      done += len;
    }
  }
  *out = it;
  *count = n;
  return STA_OK;
}

#ifdef OPENBLAS_VERSION
static int blas_users = 0, blas_saved = 1;
#endif

void sta_cpu_blas_single(int enter) {
#ifdef OPENBLAS_VERSION
  #pragma omp critical(sta_blas_threads)
  {
    if (enter && blas_users++ == 0) {
      blas_saved = openblas_get_num_threads();
      openblas_set_num_threads(1);
    } else if (!enter && --blas_users == 0)
      openblas_set_num_threads(blas_saved);
  }
#else
  (void)enter;
#endif
}

void sta_cpu_plan_free(sta_cpu_plan *pl) {
  free(pl->tile_off);
  free(pl->token);
  free(pl->pad);
  free(pl->items);
  free(pl->kf);
  free(pl->vf);
}


void sta_cpu_store_row(char *dst, sta_dtype dt, const float *src, int64_t D, float s) {
  if (dt == STA_F32)
    for (int64_t d = 0; d < D; d++) ((float *)dst)[d] = src[d] * s;
  else
    for (int64_t d = 0; d < D; d++) sta_store_f32(dst + d * 2, dt, src[d] * s);
}
