/*
** cpu_attention.c -- the CPU STA forward: blocked, OpenMP + OpenBLAS.
**
** Per (batch, head): K and V are gathered once (f32) into a compact tiled
** order -- tile by tile, each tile holding only its existing tokens, text
** rows after the video -- so the key tiles of one window row along w are
** one contiguous block, and a full window is a single block.  Query work
** items (a query tile, split into blocks of at most QB rows, or a block of
** text rows) then run in parallel: gather and pre-scale Q, and for each
** chunk of at most KC contiguous keys S = Q K^T (sgemm), an online softmax
** in base 2, O += P V (sgemm); finally normalise and store.
** OpenBLAS's thread count is process-wide: the first of any concurrent
** forwards sets it to 1, the last one out restores it, so forwards run at
** once from several caller threads all see single-threaded GEMMs.
*/
#include <cblas.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "internal.h"

#ifndef STA_CPU_QB
#define STA_CPU_QB 256 /* query rows per work item (a 384 tile: 2 x 192) */
#endif
#ifndef STA_CPU_KC
#define STA_CPU_KC 512 /* keys per GEMM chunk */
#endif

typedef struct item {
  int64_t row;   /* first row in the compact query order */
  int64_t count; /* rows */
  int64_t tile;  /* query tile id, -1 for text rows */
} item;

typedef struct plan {
  const sta_attn_params *p;
  int64_t ntiles, keys;   /* keys: V + text_len */
  int64_t *tile_off;      /* ntiles + 1 row offsets, compact order */
  int64_t *token;         /* compact video row -> token index */
  item *items;
  int64_t nitems, max_ranges;
  float *kf, *vf;         /* keys x D */
} plan;

/* 2^x for x <= 0, branch-free so loops over it vectorise; relative error
** ~2e-7.  Below -126 it returns 2^-126, which only meets zero sums. */
static inline float exp2_neg(float v) {
  /* NaN (a NaN or +Inf logit) comes back as NaN without reaching the int
  ** conversion below, which is undefined for NaN (UBSan); selects, so the
  ** loops still vectorise */
  int nan = v != v;
  float x = nan || v < -126.0f ? -126.0f : v;
  float n = (x + 12582912.0f) - 12582912.0f; /* round to nearest */
  float f = x - n;                           /* [-0.5, 0.5] */
  float y = 1.535336188319500e-4f; /* Cephes exp2f */
  y = y * f + 1.339887440266574e-3f;
  y = y * f + 9.618437357674640e-3f;
  y = y * f + 5.550332471162809e-2f;
  y = y * f + 2.402264791363012e-1f;
  y = y * f + 6.931472028550421e-1f;
  y = y * f + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, 4);
  return nan ? v : y * s;
}

#ifdef __AVX512F__
/* 2^x of 16 lanes (x <= 0): the same polynomial, scalef does the exponent
** and flushes below 2^-149 to zero; NaN stays NaN. */
static inline __m512 exp2_neg16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x); /* -Inf -> 0, NaN stays */
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(1.535336188319500e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.339887440266574e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.618437357674640e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550332471162809e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402264791363012e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931472028550421e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}
#endif

/* One softmax step on a row of n logits (base 2): update the running max
** *m and sum *l, overwrite the row with its weights; returns the factor the
** row's accumulated output must be multiplied by. */
static float softmax_step(float *row, int64_t n, float *m, float *l) {
  float mx = *m, sum = 0;
  int64_t j = 0;
#ifdef __AVX512F__
  /* two accumulators each, to hide the add and max latencies */
  __m512 m0 = _mm512_set1_ps(mx), m1 = m0;
  for (; j + 32 <= n; j += 32) {
    m0 = _mm512_max_ps(m0, _mm512_loadu_ps(row + j));
    m1 = _mm512_max_ps(m1, _mm512_loadu_ps(row + j + 16));
  }
  for (; j < n; j += 16) {
    __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
    m0 = _mm512_mask_max_ps(m0, k, m0, _mm512_maskz_loadu_ps(k, row + j));
  }
  mx = _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
  __m512 vm = _mm512_set1_ps(mx), s0 = _mm512_setzero_ps(), s1 = s0;
  for (j = 0; j + 32 <= n; j += 32) {
    __m512 e0 = exp2_neg16(_mm512_sub_ps(_mm512_loadu_ps(row + j), vm));
    __m512 e1 = exp2_neg16(_mm512_sub_ps(_mm512_loadu_ps(row + j + 16), vm));
    _mm512_storeu_ps(row + j, e0);
    _mm512_storeu_ps(row + j + 16, e1);
    s0 = _mm512_add_ps(s0, e0);
    s1 = _mm512_add_ps(s1, e1);
  }
  for (; j < n; j += 16) {
    __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
    __m512 e = exp2_neg16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), vm));
    _mm512_mask_storeu_ps(row + j, k, e);
    s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(k, e));
  }
  sum = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
#else
  #pragma omp simd reduction(max : mx)
  for (j = 0; j < n; j++) mx = row[j] > mx ? row[j] : mx;
  #pragma omp simd reduction(+ : sum)
  for (j = 0; j < n; j++) {
    float e = exp2_neg(row[j] - mx);
    row[j] = e;
    sum += e;
  }
#endif
  float alpha = *m == -INFINITY ? 0.0f : exp2f(*m - mx);
  *l = *l * alpha + sum;
  *m = mx;
  return alpha;
}

/* Key row ranges [lo, hi) of a work item, merged where adjacent. */
static int64_t key_ranges(const plan *pl, int64_t head, int64_t tile,
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

static int64_t row_token(const plan *pl, int64_t r) {
  return r < pl->p->video_len ? pl->token[r] : r;
}

/* Convert one row of D elements at src (dtype dt) into f32 dst, times s. */
static void load_row(float *dst, const char *src, sta_dtype dt, int64_t D,
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

typedef struct scratch {
  float *q, *o, *s, *m, *l;
  int64_t *lo, *hi;
} scratch;

static void run_item(const plan *pl, int64_t b, int64_t h, const item *it,
                     scratch *w) {
  const sta_attn_params *p = pl->p;
  const int64_t D = p->head_dim, nb = it->count;
  const size_t es = sta_dtype_size(p->dtype);
  const float qscale = p->scale * 1.44269504088896341f; /* log2(e) */
  for (int64_t i = 0; i < nb; i++) {
    int64_t t = row_token(pl, it->row + i);
    load_row(w->q + i * D,
             (const char *)p->q + (b * p->q_sb + t * p->q_ss + h * p->q_sh) * (int64_t)es,
             p->dtype, D, qscale);
    w->m[i] = -INFINITY;
    w->l[i] = 0;
  }
  memset(w->o, 0, sizeof(float) * (size_t)(nb * D));
  int64_t nr = key_ranges(pl, h, it->tile, w->lo, w->hi);
  for (int64_t r = 0; r < nr; r++) {
    /* equal chunks of at most KC keys: 1152 = 3 x 384, not 512+512+128 */
    int64_t len = w->hi[r] - w->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t c = 0, k0 = w->lo[r]; c < parts; c++) {
      int64_t nc = (w->hi[r] - k0) / (parts - c);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nc, (int)D,
                  1.0f, w->q, (int)D, pl->kf + k0 * D, (int)D, 0.0f, w->s, (int)nc);
      for (int64_t i = 0; i < nb; i++) {
        float alpha = softmax_step(w->s + i * nc, nc, &w->m[i], &w->l[i]);
        if (alpha != 1.0f) {
          float *o = w->o + i * D;
          for (int64_t d = 0; d < D; d++) o[d] *= alpha;
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)D, (int)nc,
                  1.0f, w->s, (int)nc, pl->vf + k0 * D, (int)D, 1.0f, w->o, (int)D);
      k0 += nc;
    }
  }
  for (int64_t i = 0; i < nb; i++) {
    int64_t t = row_token(pl, it->row + i);
    float inv = 1.0f / w->l[i], *o = w->o + i * D;
    char *dst = (char *)p->o + (b * p->o_sb + t * p->o_ss + h * p->o_sh) * (int64_t)es;
    if (p->dtype == STA_F32)
      for (int64_t d = 0; d < D; d++) ((float *)dst)[d] = o[d] * inv;
    else
      for (int64_t d = 0; d < D; d++) sta_store_f32(dst + d * (int64_t)es, p->dtype, o[d] * inv);
    if (p->lse)
      p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] =
          (w->m[i] + log2f(w->l[i])) * 0.69314718055994531f;
  }
}

/* Tile offsets, compact-row -> token map and the work items. */
static sta_status make_plan(plan *pl, const sta_attn_params *p) {
  const int32_t *g = p->grid, *tl = p->tile, *cv = p->canvas;
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  pl->ntiles = (int64_t)g[0] * g[1] * g[2];
  pl->keys = p->video_len + p->text_len;
  pl->max_ranges = (int64_t)g[0] * g[1] + 1;
  pl->tile_off = sta_malloc(sizeof(int64_t) * (size_t)(pl->ntiles + 1));
  pl->token = sta_malloc(sizeof(int64_t) * (size_t)p->video_len);
  if (!pl->tile_off || !pl->token) return STA_ERR_NOMEM;
  int64_t nitems = 0, r = 0;
  for (int64_t id = 0; id < pl->ntiles; id++) {
    int64_t it = id / ((int64_t)g[1] * g[2]), ih = (id / g[2]) % g[1], iw = id % g[2];
    int64_t t0 = it * tl[0], h0 = ih * tl[1], w0 = iw * tl[2];
    int64_t t1 = t0 + tl[0] < cv[0] ? t0 + tl[0] : cv[0];
    int64_t h1 = h0 + tl[1] < cv[1] ? h0 + tl[1] : cv[1];
    int64_t w1 = w0 + tl[2] < cv[2] ? w0 + tl[2] : cv[2];
    pl->tile_off[id] = r;
    for (int64_t t = t0; t < t1; t++)
      for (int64_t hh = h0; hh < h1; hh++)
        for (int64_t ww = w0; ww < w1; ww++) pl->token[r++] = (t * cv[1] + hh) * cv[2] + ww;
    nitems += (r - pl->tile_off[id] + STA_CPU_QB - 1) / STA_CPU_QB;
  }
  pl->tile_off[pl->ntiles] = r;
  int64_t text_rows = p->seq_len - p->video_len;
  nitems += (text_rows + STA_CPU_QB - 1) / STA_CPU_QB;
  pl->items = sta_malloc(sizeof(item) * (size_t)nitems);
  if (!pl->items) return STA_ERR_NOMEM;
  /* text rows first: the largest items start first */
  int64_t n = 0;
  for (int64_t s = 0; s < text_rows; s += STA_CPU_QB) {
    pl->items[n].row = p->video_len + s;
    pl->items[n].count = text_rows - s < STA_CPU_QB ? text_rows - s : STA_CPU_QB;
    pl->items[n++].tile = -1;
  }
  for (int64_t id = 0; id < pl->ntiles; id++) {
    int64_t c = pl->tile_off[id + 1] - pl->tile_off[id];
    int64_t parts = (c + STA_CPU_QB - 1) / STA_CPU_QB, done = 0;
    for (int64_t k = 0; k < parts; k++) {
      int64_t len = (c - done) / (parts - k);
      pl->items[n].row = pl->tile_off[id] + done;
      pl->items[n].count = len;
      pl->items[n++].tile = id;
      done += len;
    }
  }
  pl->nitems = n;
  pl->kf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  pl->vf = sta_malloc(sizeof(float) * (size_t)(pl->keys * p->head_dim) + 1);
  if (!pl->kf || !pl->vf) return STA_ERR_NOMEM;
  return STA_OK;
}

#ifdef OPENBLAS_VERSION
static int blas_users = 0, blas_saved = 1;
#endif

/* Hold OpenBLAS at one thread while any forward runs (enter 1) and restore
** its setting when the last one leaves (enter 0). */
static void blas_single(int enter) {
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

static void free_plan(plan *pl) {
  free(pl->tile_off);
  free(pl->token);
  free(pl->items);
  free(pl->kf);
  free(pl->vf);
}

sta_status sta_cpu_attention(const sta_attn_params *p) {
  plan pl;
  const int64_t D = p->head_dim;
  const int nt = sta_get_num_threads();
  const size_t es = sta_dtype_size(p->dtype);
  size_t per = (size_t)(STA_CPU_QB * (2 * D + STA_CPU_KC + 2));
  float *fbuf = NULL;
  int64_t *rbuf = NULL;
  sta_status rc = make_plan(&pl, p);
  if (rc == STA_OK) {
    fbuf = sta_malloc(sizeof(float) * per * (size_t)nt);
    rbuf = sta_malloc(sizeof(int64_t) * 2 * (size_t)(pl.max_ranges * nt));
    if (!fbuf || !rbuf) rc = STA_ERR_NOMEM;
  }
  if (rc != STA_OK) {
    free_plan(&pl);
    free(fbuf);
    free(rbuf);
    return sta_error(STA_ERR_NOMEM, "out of host memory (CPU attention buffers)");
  }
  /* the GEMMs run inside the OpenMP region: one BLAS thread each (the
  ** pthread build would otherwise start its own pool per call) */
  blas_single(1);
  #pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    scratch w;
    w.q = fbuf + per * (size_t)tid;
    w.o = w.q + STA_CPU_QB * D;
    w.s = w.o + STA_CPU_QB * D;
    w.m = w.s + STA_CPU_QB * STA_CPU_KC;
    w.l = w.m + STA_CPU_QB;
    w.lo = rbuf + 2 * pl.max_ranges * tid;
    w.hi = w.lo + pl.max_ranges;
    for (int64_t bh = 0; bh < p->batch * p->heads; bh++) {
      int64_t b = bh / p->heads, h = bh % p->heads;
      #pragma omp for schedule(static)
      for (int64_t r = 0; r < pl.keys; r++) {
        int64_t t = row_token(&pl, r);
        load_row(pl.kf + r * D,
                 (const char *)p->k + (b * p->k_sb + t * p->k_ss + h * p->k_sh) * (int64_t)es,
                 p->dtype, D, 1.0f);
        load_row(pl.vf + r * D,
                 (const char *)p->v + (b * p->v_sb + t * p->v_ss + h * p->v_sh) * (int64_t)es,
                 p->dtype, D, 1.0f);
      }
      #pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < pl.nitems; i++) run_item(&pl, b, h, &pl.items[i], &w);
    }
  }
  blas_single(0);
  free_plan(&pl);
  free(fbuf);
  free(rbuf);
  return STA_OK;
}
