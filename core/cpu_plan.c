/*
** cpu_plan.c -- the plan the CPU forward and backward walk (cpu_common.h):
** the compact row order, work items, and for every mask kind (mask.h) the
** key ranges of a query block and the query ranges of a key block: the
** window's box of tiles, a block list's listed blocks, or both merged.
*/
#include <cblas.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

/* Append rows [s, e) to the n ranges lo/hi, merged with the last where
** they meet; returns the new count. */
static inline int64_t add_range(int64_t *lo, int64_t *hi, int64_t n, int64_t s, int64_t e) {
  if (n > 0 && hi[n - 1] == s) {
    hi[n - 1] = e;
    return n;
  }
  lo[n] = s;
  hi[n] = e;
  return n + 1;
}

/* Tile coordinates (t, h, w) of tile id on grid g. */
static void tile_coords(const int32_t g[3], int64_t id, int32_t c[3]) {
  c[0] = (int32_t)(id / ((int64_t)g[1] * g[2]));
  c[1] = (int32_t)((id / g[2]) % g[1]);
  c[2] = (int32_t)(id % g[2]);
}

/* The window box of query tile `tile` for window win: first tile and
** count per axis (mask.h's rule). */
static void window_box(const int32_t g[3], const int32_t *win, int64_t tile, int32_t st[3],
                       int32_t cn[3]) {
  int32_t qc[3];
  tile_coords(g, tile, qc);
  for (int i = 0; i < 3; i++) {
    cn[i] = sta_window_span(win[i], g[i]);
    st[i] = sta_window_start(qc[i], cn[i], g[i]);
  }
}

/* ---- key ranges of a query block ----------------------------------------- */

static int64_t window_key_ranges(const sta_cpu_plan *pl, int64_t head, int64_t tile,
                                 int64_t *lo, int64_t *hi) {
  const sta_attn_params *p = pl->p;
  int64_t n = 0;
  if (tile < 0) {
    lo[0] = 0; hi[0] = pl->keys;
    return 1;
  }
  const int32_t *g = p->grid;
  int32_t st[3], cn[3];
  window_box(g, p->windows + 3 * head, tile, st, cn);
  for (int32_t a = st[0]; a < st[0] + cn[0]; a++)
    for (int32_t c = st[1]; c < st[1] + cn[1]; c++) {
      int64_t t0 = ((int64_t)a * g[1] + c) * g[2] + st[2];
      n = add_range(lo, hi, n, pl->tile_off[t0], pl->tile_off[t0 + cn[2]]);
    }
  if (p->text_len > 0) n = add_range(lo, hi, n, p->video_len, pl->keys);
  return n;
}

/* The rows of the blocks of box [a, e) on grid g (per axis; tile ids
** ascending) and of the sorted blocks ids[0, cnt) (none in the box), in
** block order; off: the blocks' row offsets. */
static int64_t box_and_list(const int32_t g[3], const int32_t a[3], const int32_t e[3],
                            const int32_t *ids, int64_t cnt, const int64_t *off, int64_t *lo,
                            int64_t *hi) {
  int64_t n = 0, j = 0;
  for (int32_t t = a[0]; t < e[0]; t++)
    for (int32_t c = a[1]; c < e[1]; c++)
      for (int32_t w = a[2]; w < e[2]; w++) {
        int64_t id = ((int64_t)t * g[1] + c) * g[2] + w;
        for (; j < cnt && ids[j] < id; j++) n = add_range(lo, hi, n, off[ids[j]], off[ids[j] + 1]);
        n = add_range(lo, hi, n, off[id], off[id + 1]);
      }
  for (; j < cnt; j++) n = add_range(lo, hi, n, off[ids[j]], off[ids[j] + 1]);
  return n;
}

/* The listed key blocks of query block m (sorted; the union: the window's
** blocks merged in). */
static int64_t list_key_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t m,
                               int64_t *lo, int64_t *hi) {
  const sta_attn_params *p = pl->p;
  const int64_t row = sta_list_row(b, head, m, p->heads, p->q_blocks);
  int32_t a[3] = {0, 0, 0}, e[3] = {0, 0, 0};
  if (p->mask == STA_MASK_WINDOW_OR_BLOCKS) {
    window_box(p->grid, p->windows + 3 * head, m, a, e);
    for (int i = 0; i < 3; i++) e[i] += a[i];
  }
  return box_and_list(p->grid, a, e, pl->lids + row * p->list_len, pl->ln[row], pl->key_off,
                      lo, hi);
}

int64_t sta_cpu_key_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t tile,
                           int64_t *lo, int64_t *hi) {
  return pl->p->mask == STA_MASK_WINDOW ? window_key_ranges(pl, head, tile, lo, hi)
                                        : list_key_ranges(pl, b, head, tile, lo, hi);
}

/* ---- query ranges of a key block (the backward) ---------------------------- */

static int64_t window_query_ranges(const sta_cpu_plan *pl, int64_t head, int64_t tile,
                                   int64_t *lo, int64_t *hi) {
  const sta_attn_params *p = pl->p;
  int64_t n = 0;
  if (tile < 0) {
    lo[0] = 0;
    hi[0] = pl->rows;
    return 1;
  }
  const int32_t *g = p->grid, *win = p->windows + 3 * head;
  int32_t kc[3], a[3], z[3];
  tile_coords(g, tile, kc);
  for (int i = 0; i < 3; i++) /* the rule's inverse: mask.h */
    sta_window_seen_by(kc[i], sta_window_span(win[i], g[i]), g[i], &a[i], &z[i]);
  for (int32_t t = a[0]; t <= z[0]; t++)
    for (int32_t hh = a[1]; hh <= z[1]; hh++) {
      int64_t t0 = ((int64_t)t * g[1] + hh) * g[2] + a[2];
      n = add_range(lo, hi, n, pl->tile_off[t0], pl->tile_off[t0 + z[2] - a[2] + 1]);
    }
  if (pl->rows > p->video_len) /* every text query sees every video key */
    n = add_range(lo, hi, n, p->video_len, pl->rows);
  return n;
}

/* The query blocks that list key block kb (sorted; the union: merged with
** those whose window holds it). */
static int64_t list_query_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t kb,
                                 int64_t *lo, int64_t *hi) {
  const sta_attn_params *p = pl->p;
  const int64_t bh = b * p->heads + head, *off = pl->ioff + bh * (p->kv_blocks + 1);
  const int32_t *g = p->grid;
  int32_t a[3] = {0, 0, 0}, e[3] = {0, 0, 0}, kc[3];
  if (p->mask == STA_MASK_WINDOW_OR_BLOCKS) {
    const int32_t *win = p->windows + 3 * head;
    tile_coords(g, kb, kc);
    for (int i = 0; i < 3; i++) {
      sta_window_seen_by(kc[i], sta_window_span(win[i], g[i]), g[i], &a[i], &e[i]);
      e[i]++;
    }
  }
  return box_and_list(g, a, e, pl->inv + bh * p->q_blocks * p->list_len + off[kb],
                      off[kb + 1] - off[kb], pl->tile_off, lo, hi);
}

int64_t sta_cpu_query_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t kb,
                             int64_t *lo, int64_t *hi) {
  return pl->p->mask == STA_MASK_WINDOW ? window_query_ranges(pl, head, kb, lo, hi)
                                        : list_query_ranges(pl, b, head, kb, lo, hi);
}

/* ---- rows ------------------------------------------------------------------- */

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

void sta_cpu_store_row(char *dst, sta_dtype dt, const float *src, int64_t D, float s) {
  if (dt == STA_F32)
    for (int64_t d = 0; d < D; d++) ((float *)dst)[d] = src[d] * s;
  else
    for (int64_t d = 0; d < D; d++) sta_store_f32(dst + d * 2, dt, src[d] * s);
}

/* ---- the plan ----------------------------------------------------------------- */

/* The window: tiles in the compact order, text after. */
static sta_status plan_window(sta_cpu_plan *pl) {
  const sta_attn_params *p = pl->p;
  const int32_t *g = p->grid, *tl = p->tile, *cv = p->canvas;
  pl->ntiles = pl->nkb = (int64_t)g[0] * g[1] * g[2];
  pl->keys = p->video_len + p->text_len;
  pl->rows = p->video_len + p->seq_len - p->video_rows;
  pl->npad = pl->nkpad = p->video_rows - p->video_len;
  pl->nmap = p->video_len;
  pl->tail = p->video_rows;
  pl->keys_end = p->video_rows + p->text_len;
  pl->max_ranges = pl->max_qranges = (int64_t)g[0] * g[1] + 1;
  pl->tile_off = pl->key_off = sta_malloc(sizeof(int64_t) * (size_t)(pl->ntiles + 1));
  pl->token = pl->ktoken = sta_malloc(sizeof(int64_t) * (size_t)p->video_len);
  pl->pad = pl->kpad = sta_malloc(sizeof(int64_t) * (size_t)pl->npad + 1);
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
  return sta_cpu_items(pl->tile_off, pl->ntiles, p->seq_len - p->video_rows, &pl->items,
                       &pl->nitems);
}

/* Blocks of bv rows whose first sizes[n] (NULL: all) are valid: offsets of
** the valid rows, their sequence rows (tok) and the others' (pad). */
static sta_status block_offsets(int64_t nb, int32_t bv, const int32_t *sizes, int64_t **off,
                             int64_t **tok, int64_t **pad, int64_t *npad) {
  *off = sta_malloc(sizeof(int64_t) * (size_t)(nb + 1));
  if (!*off) return STA_ERR_NOMEM;
  (*off)[0] = 0;
  for (int64_t n = 0; n < nb; n++) (*off)[n + 1] = (*off)[n] + sta_block_valid(sizes, n, bv);
  *npad = nb * bv - (*off)[nb];
  *tok = sta_malloc(sizeof(int64_t) * (size_t)(*off)[nb] + 1);
  *pad = sta_malloc(sizeof(int64_t) * (size_t)*npad + 1);
  if (!*tok || !*pad) return STA_ERR_NOMEM;
  for (int64_t n = 0, k = 0; n < nb; n++)
    for (int64_t i = 0; i < bv; i++) {
      if (i < (*off)[n + 1] - (*off)[n]) (*tok)[(*off)[n] + i] = n * bv + i;
      else (*pad)[k++] = n * bv + i;
    }
  return STA_OK;
}

/* The lists of (b, h) pair bh, sorted, and their inverse (pos: Mk + 1
** scratch): the entries each list keeps (the union: those its window
** lacks, the rule asked once each) are counted by key block, the inverse
** filled by a counting sort (query blocks ascending), and the lists
** rebuilt from it (key blocks ascending). */
static void build_lists(const sta_cpu_plan *pl, int64_t bh, int64_t *pos) {
  const sta_attn_params *p = pl->p;
  const int64_t L = p->list_len, Mq = p->q_blocks, Mk = p->kv_blocks;
  const int32_t *win = p->windows ? p->windows + 3 * (bh % p->heads) : NULL;
  const int uni = p->mask == STA_MASK_WINDOW_OR_BLOCKS;
  int64_t *off = pl->ioff + bh * (Mk + 1);
  int32_t *inv = pl->inv + bh * Mq * L;
  for (int64_t n = 0; n <= Mk; n++) off[n] = 0;
  for (int64_t m = 0; m < Mq; m++) {
    const int64_t row = bh * Mq + m;
    int32_t kept = 0;
    for (int32_t i = 0; i < sta_list_count(p->num, row); i++) {
      const int32_t n = sta_list_block(p->idx, L, row, i);
      if (uni && sta_window_holds_tile(p->grid, win, m, n)) continue;
      pl->lids[row * L + kept++] = n;
      off[n + 1]++;
    }
    pl->ln[row] = kept;
  }
  for (int64_t n = 0; n < Mk; n++) off[n + 1] += off[n];
  for (int64_t n = 0; n < Mk; n++) pos[n] = off[n];
  for (int64_t m = 0; m < Mq; m++) {
    const int64_t row = bh * Mq + m;
    for (int32_t j = 0; j < pl->ln[row]; j++) inv[pos[pl->lids[row * L + j]]++] = (int32_t)m;
    pl->ln[row] = 0;
  }
  for (int64_t n = 0; n < Mk; n++)
    for (int64_t j = off[n]; j < off[n + 1]; j++) {
      const int64_t row = bh * Mq + inv[j];
      pl->lids[row * L + pl->ln[row]++] = (int32_t)n;
    }
}

/* Block lists: blocks of block_rows rows, valid rows a prefix. */
static sta_status plan_lists(sta_cpu_plan *pl) {
  const sta_attn_params *p = pl->p;
  const int64_t Mq = p->q_blocks, Mk = p->kv_blocks, BH = p->batch * p->heads;
  pl->ntiles = Mq;
  pl->nkb = Mk;
  if (block_offsets(Mq, p->block_rows, p->q_sizes, &pl->tile_off, &pl->token, &pl->pad,
                 &pl->npad) != STA_OK ||
      block_offsets(Mk, p->block_rows, p->kv_sizes, &pl->key_off, &pl->ktoken, &pl->kpad,
                 &pl->nkpad) != STA_OK)
    return STA_ERR_NOMEM;
  pl->rows = pl->tile_off[Mq];
  pl->keys = pl->key_off[Mk];
  pl->nmap = pl->rows > pl->keys ? pl->rows : pl->keys; /* no text rows */
  pl->keys_end = p->kv_len;
  pl->max_ranges = Mk + 1;
  pl->max_qranges = Mq + 1;
  const size_t ent = (size_t)(BH * Mq * p->list_len) + 1;
  const int nt = sta_get_num_threads();
  pl->ln = sta_malloc(sizeof(int32_t) * (size_t)(BH * Mq) + 1);
  pl->lids = sta_malloc(sizeof(int32_t) * ent);
  pl->inv = sta_malloc(sizeof(int32_t) * ent);
  pl->ioff = sta_malloc(sizeof(int64_t) * (size_t)(BH * (Mk + 1)));
  int64_t *pos = sta_malloc(sizeof(int64_t) * (size_t)((Mk + 1) * nt));
  if (!pl->ln || !pl->lids || !pl->inv || !pl->ioff || !pos) {
    free(pos);
    return STA_ERR_NOMEM;
  }
  #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t bh = 0; bh < BH; bh++) build_lists(pl, bh, pos + (Mk + 1) * omp_get_thread_num());
  free(pos);
  return sta_cpu_items(pl->tile_off, Mq, 0, &pl->items, &pl->nitems);
}

sta_status sta_cpu_plan_make(sta_cpu_plan *pl, const sta_attn_params *p) {
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  sta_status rc = p->mask == STA_MASK_WINDOW ? plan_window(pl) : plan_lists(pl);
  if (rc != STA_OK) return STA_ERR_NOMEM;
  pl->kf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  pl->vf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  if (!pl->kf || !pl->vf) return STA_ERR_NOMEM;
  return STA_OK;
}

sta_status sta_cpu_items(const int64_t *off, int64_t nblocks, int64_t text_rows,
                         sta_cpu_item **out, int64_t *count) {
  int64_t n = (text_rows + STA_CPU_QB - 1) / STA_CPU_QB;
  for (int64_t id = 0; id < nblocks; id++)
    n += (off[id + 1] - off[id] + STA_CPU_QB - 1) / STA_CPU_QB;
  sta_cpu_item *it = sta_malloc(sizeof(sta_cpu_item) * (size_t)(n > 0 ? n : 1));
  if (!it) return STA_ERR_NOMEM;
  n = 0;
  /* text rows first: the largest items start first */
  for (int64_t s = 0; s < text_rows; s += STA_CPU_QB) {
    it[n].row = off[nblocks] + s;
    it[n].count = text_rows - s < STA_CPU_QB ? text_rows - s : STA_CPU_QB;
    it[n++].tile = -1;
  }
  for (int64_t id = 0; id < nblocks; id++) {
    int64_t c = off[id + 1] - off[id];
    int64_t parts = (c + STA_CPU_QB - 1) / STA_CPU_QB, done = 0;
    for (int64_t k = 0; k < parts; k++) {
      int64_t len = (c - done) / (parts - k);
      it[n].row = off[id] + done;
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
  if (pl->key_off != pl->tile_off) free(pl->key_off);
  if (pl->ktoken != pl->token) free(pl->ktoken);
  if (pl->kpad != pl->pad) free(pl->kpad);
  free(pl->tile_off);
  free(pl->token);
  free(pl->pad);
  free(pl->items);
  free(pl->kf);
  free(pl->vf);
  free(pl->ln);
  free(pl->lids);
  free(pl->inv);
  free(pl->ioff);
}
