/*
** cpu_backward.c -- the CPU STA backward (STA.md section 10): blocked,
** OpenMP + OpenBLAS, deterministic.
**
** Per (batch, head), Q, K, V, dO (f32), log2-domain LSE and D_i = dO_i.O_i
** are gathered once into the compact tiled order of cpu_common.h.  Two
** passes follow, each over work items that own their outputs, so no two
** threads ever add into the same row and the result does not depend on the
** schedule or the thread count:
**   1. key items (a key tile split into blocks of at most QB rows, or a
**      block of text keys) walk the query rows that see them -- on each
**      axis one contiguous range of query tiles, plus every text query --
**      in chunks of at most KC rows: S^T = K Q^T, P^T, dP^T = V dO^T,
**      dS^T = P^T (dP^T - D), then dV += P^T dO and dK += dS^T Q;
**   2. query items (the forward's) walk their key ranges: the same S^T,
**      P^T, dS^T, then dQ += dS K.
** Seven GEMMs per (query, key) block where a fused pass needs five (S and
** dP are computed in both passes): the price of owning every output row,
** which keeps the memory at the inputs' size and the gradients
** bit-identical run to run.
*/
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

typedef struct bwd {
  sta_cpu_plan pl;        /* query items, tile offsets, kf, vf */
  int64_t rows;           /* S: every row is a query */
  float *qf, *dof;        /* rows x D */
  float *l2, *dd;         /* rows: LSE * log2(e), D_i */
  sta_cpu_item *kitems;   /* key items */
  int64_t nkitems;
  int64_t max_qranges;
} bwd;

/* Query tiles [lo, hi] on one axis of c tiles whose window (k) holds key
** tile kt: contiguous, since a window's start never decreases with q. */
static void seen_by(int32_t kt, int32_t k, int32_t c, int32_t *lo, int32_t *hi) {
  int32_t s, n;
  *lo = c;
  *hi = -1;
  for (int32_t q = 0; q < c; q++) {
    sta_window_range(q, k, c, &s, &n);
    if (kt >= s && kt < s + n) {
      if (q < *lo) *lo = q;
      *hi = q;
    }
  }
}

/* Compact query row ranges [lo, hi) that see key tile `tile` (-1: a text
** key, seen by every row) for head's window, merged where adjacent. */
static int64_t query_ranges(const bwd *w, int64_t head, int64_t tile, int64_t *lo,
                            int64_t *hi) {
  const sta_attn_params *p = w->pl.p;
  int64_t n = 0;
  if (tile < 0) {
    lo[0] = 0;
    hi[0] = w->rows;
    return 1;
  }
  const int32_t *g = p->grid, *win = p->windows + 3 * head;
  int32_t kc[3] = {(int32_t)(tile / ((int64_t)g[1] * g[2])), (int32_t)((tile / g[2]) % g[1]),
                   (int32_t)(tile % g[2])};
  int32_t a[3], z[3];
  for (int i = 0; i < 3; i++) seen_by(kc[i], win[i], g[i], &a[i], &z[i]);
  for (int32_t t = a[0]; t <= z[0]; t++)
    for (int32_t hh = a[1]; hh <= z[1]; hh++) {
      int64_t t0 = ((int64_t)t * g[1] + hh) * g[2] + a[2];
      int64_t s = w->pl.tile_off[t0], e = w->pl.tile_off[t0 + z[2] - a[2] + 1];
      if (n > 0 && hi[n - 1] == s) hi[n - 1] = e;
      else { lo[n] = s; hi[n] = e; n++; }
    }
  if (w->rows > p->video_len) { /* every text query sees every video key */
    if (n > 0 && hi[n - 1] == p->video_len) hi[n - 1] = w->rows;
    else { lo[n] = p->video_len; hi[n] = w->rows; n++; }
  }
  return n;
}

/* For nk key rows x nq query columns of S^T (st) and dP^T (dpt), leading
** dimension ld: P^T = 2^(S^T c - l2[col]) into st, dS^T = P^T (dP^T -
** dd[col]) into dpt. */
static void p_and_ds(float *st, float *dpt, int64_t nk, int64_t nq, int64_t ld, float c,
                     const float *l2, const float *dd) {
  for (int64_t i = 0; i < nk; i++) {
    float *s = st + i * ld, *dp = dpt + i * ld;
    #pragma omp simd
    for (int64_t j = 0; j < nq; j++) {
      float x = s[j] * c - l2[j];
      float e = exp2_neg(x < 126.0f ? x : 126.0f); /* <= 0 but for rounding */
      s[j] = e;
      dp[j] = e * (dp[j] - dd[j]);
    }
  }
}

typedef struct scratch {
  float *st, *dpt, *acc0, *acc1; /* QB x KC, QB x KC, QB x D, QB x D */
  int64_t *lo, *hi;
} scratch;

/* Pass 1: dK and dV of one key item. */
static void key_item(const bwd *w, int64_t b, int64_t h, const sta_cpu_item *it,
                     scratch *x) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim, nk = it->count, k0 = it->row;
  const float c = p->scale * 1.44269504088896341f;
  const float *kb = w->pl.kf + k0 * D, *vb = w->pl.vf + k0 * D;
  const size_t es = sta_dtype_size(p->dtype);
  memset(x->acc0, 0, sizeof(float) * (size_t)(nk * D)); /* dK */
  memset(x->acc1, 0, sizeof(float) * (size_t)(nk * D)); /* dV */
  int64_t nr = query_ranges(w, h, it->tile, x->lo, x->hi);
  for (int64_t r = 0; r < nr; r++) {
    int64_t len = x->hi[r] - x->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t part = 0, q0 = x->lo[r]; part < parts; part++) {
      int64_t nq = (x->hi[r] - q0) / (parts - part);
      const float *qc = w->qf + q0 * D, *dc = w->dof + q0 * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nk, (int)nq, (int)D, 1.0f, kb,
                  (int)D, qc, (int)D, 0.0f, x->st, (int)nq);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nk, (int)nq, (int)D, 1.0f, vb,
                  (int)D, dc, (int)D, 0.0f, x->dpt, (int)nq);
      p_and_ds(x->st, x->dpt, nk, nq, nq, c, w->l2 + q0, w->dd + q0);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nk, (int)D, (int)nq, 1.0f,
                  x->dpt, (int)nq, qc, (int)D, 1.0f, x->acc0, (int)D);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nk, (int)D, (int)nq, 1.0f,
                  x->st, (int)nq, dc, (int)D, 1.0f, x->acc1, (int)D);
      q0 += nq;
    }
  }
  for (int64_t i = 0; i < nk; i++) {
    int64_t t = sta_cpu_row_token(&w->pl, k0 + i);
    sta_cpu_store_row((char *)p->dk + (b * p->dk_sb + t * p->dk_ss + h * p->dk_sh) * (int64_t)es,
                      p->dtype, x->acc0 + i * D, D, p->scale);
    sta_cpu_store_row((char *)p->dv + (b * p->dv_sb + t * p->dv_ss + h * p->dv_sh) * (int64_t)es,
                      p->dtype, x->acc1 + i * D, D, 1.0f);
  }
}

/* Pass 2: dQ of one query item. */
static void query_item(const bwd *w, int64_t b, int64_t h, const sta_cpu_item *it,
                       scratch *x) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim, nq = it->count, q0 = it->row;
  const float c = p->scale * 1.44269504088896341f;
  const float *qc = w->qf + q0 * D, *dc = w->dof + q0 * D;
  const size_t es = sta_dtype_size(p->dtype);
  memset(x->acc0, 0, sizeof(float) * (size_t)(nq * D));
  int64_t nr = sta_cpu_key_ranges(&w->pl, h, it->tile, x->lo, x->hi);
  for (int64_t r = 0; r < nr; r++) {
    int64_t len = x->hi[r] - x->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t part = 0, k0 = x->lo[r]; part < parts; part++) {
      int64_t nk = (x->hi[r] - k0) / (parts - part);
      const float *kb = w->pl.kf + k0 * D, *vb = w->pl.vf + k0 * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nk, (int)nq, (int)D, 1.0f, kb,
                  (int)D, qc, (int)D, 0.0f, x->st, (int)nq);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nk, (int)nq, (int)D, 1.0f, vb,
                  (int)D, dc, (int)D, 0.0f, x->dpt, (int)nq);
      p_and_ds(x->st, x->dpt, nk, nq, nq, c, w->l2 + q0, w->dd + q0);
      /* dQ (nq x D) += dS (nq x nk) K = (dS^T)^T K */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, 1.0f,
                  x->dpt, (int)nq, kb, (int)D, 1.0f, x->acc0, (int)D);
      k0 += nk;
    }
  }
  for (int64_t i = 0; i < nq; i++) {
    int64_t t = sta_cpu_row_token(&w->pl, q0 + i);
    sta_cpu_store_row((char *)p->dq + (b * p->dq_sb + t * p->dq_ss + h * p->dq_sh) * (int64_t)es,
                      p->dtype, x->acc0 + i * D, D, p->scale);
  }
}

static void free_bwd(bwd *w) {
  sta_cpu_plan_free(&w->pl);
  free(w->qf);
  free(w->dof);
  free(w->l2);
  free(w->dd);
  free(w->kitems);
}

/* Gather row r (compact order) of (b, h): q, dO, LSE, D (and, for key
** rows, k and v). */
static void gather_row(bwd *w, int64_t b, int64_t h, int64_t r) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim;
  const size_t es = sta_dtype_size(p->dtype);
  int64_t t = sta_cpu_row_token(&w->pl, r);
#define AT(base, sb, ss, sh) ((const char *)(base) + (b * (sb) + t * (ss) + h * (sh)) * (int64_t)es)
  float *q = w->qf + r * D, *g = w->dof + r * D;
  sta_cpu_load_row(q, AT(p->q, p->q_sb, p->q_ss, p->q_sh), p->dtype, D, 1.0f);
  sta_cpu_load_row(g, AT(p->dout, p->do_sb, p->do_ss, p->do_sh), p->dtype, D, 1.0f);
  const char *o = AT(p->o, p->o_sb, p->o_ss, p->o_sh);
  double di = 0;
  for (int64_t d = 0; d < D; d++) di += (double)g[d] * (double)sta_load_f32(o + d * es, p->dtype);
  w->dd[r] = (float)di;
  w->l2[r] = p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] * 1.44269504088896341f;
  if (r < w->pl.keys) {
    sta_cpu_load_row(w->pl.kf + r * D, AT(p->k, p->k_sb, p->k_ss, p->k_sh), p->dtype, D, 1.0f);
    sta_cpu_load_row(w->pl.vf + r * D, AT(p->v, p->v_sb, p->v_ss, p->v_sh), p->dtype, D, 1.0f);
  }
#undef AT
}

/* dK = dV = 0 on the rows that are never keys (>= V + text_len). */
static void zero_pad_rows(const sta_attn_params *p, int64_t b, int64_t h, int64_t r0) {
  const size_t es = sta_dtype_size(p->dtype);
  for (int64_t t = r0; t < p->seq_len; t++) {
    memset((char *)p->dk + (b * p->dk_sb + t * p->dk_ss + h * p->dk_sh) * (int64_t)es, 0,
           es * (size_t)p->head_dim);
    memset((char *)p->dv + (b * p->dv_sb + t * p->dv_ss + h * p->dv_sh) * (int64_t)es, 0,
           es * (size_t)p->head_dim);
  }
}

sta_status sta_cpu_attention_backward(const sta_attn_params *p) {
  bwd w;
  const int64_t D = p->head_dim, S = p->seq_len;
  const int nt = sta_get_num_threads();
  memset(&w, 0, sizeof w);
  w.rows = S;
  size_t per = (size_t)(2 * STA_CPU_QB * STA_CPU_KC + 2 * STA_CPU_KC * D);
  float *fbuf = NULL;
  int64_t *rbuf = NULL;
  sta_status rc = sta_cpu_plan_make(&w.pl, p);
  if (rc == STA_OK) rc = sta_cpu_items(&w.pl, p->text_len, &w.kitems, &w.nkitems);
  if (rc == STA_OK) {
    w.max_qranges = (int64_t)p->grid[0] * p->grid[1] + 1;
    int64_t nrng = w.max_qranges > w.pl.max_ranges ? w.max_qranges : w.pl.max_ranges;
    w.qf = sta_malloc(sizeof(float) * (size_t)(S * D) + 1);
    w.dof = sta_malloc(sizeof(float) * (size_t)(S * D) + 1);
    w.l2 = sta_malloc(sizeof(float) * (size_t)S + 1);
    w.dd = sta_malloc(sizeof(float) * (size_t)S + 1);
    fbuf = sta_malloc(sizeof(float) * per * (size_t)nt);
    rbuf = sta_malloc(sizeof(int64_t) * 2 * (size_t)(nrng * nt));
    if (!w.qf || !w.dof || !w.l2 || !w.dd || !fbuf || !rbuf) rc = STA_ERR_NOMEM;
    w.max_qranges = nrng;
  }
  if (rc != STA_OK) {
    free_bwd(&w);
    free(fbuf);
    free(rbuf);
    return sta_error(STA_ERR_NOMEM, "out of host memory (CPU backward buffers)");
  }
  sta_cpu_blas_single(1);
  #pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    scratch x;
    x.st = fbuf + per * (size_t)tid;
    x.dpt = x.st + STA_CPU_QB * STA_CPU_KC;
    x.acc0 = x.dpt + STA_CPU_QB * STA_CPU_KC;
    x.acc1 = x.acc0 + STA_CPU_KC * D;
    x.lo = rbuf + 2 * w.max_qranges * tid;
    x.hi = x.lo + w.max_qranges;
    for (int64_t bh = 0; bh < p->batch * p->heads; bh++) {
      int64_t b = bh / p->heads, h = bh % p->heads;
      #pragma omp for schedule(static)
      for (int64_t r = 0; r < S; r++) gather_row(&w, b, h, r);
      #pragma omp for schedule(dynamic, 1) nowait
      for (int64_t i = 0; i < w.nkitems; i++) key_item(&w, b, h, &w.kitems[i], &x);
      #pragma omp for schedule(dynamic, 1)
      for (int64_t i = 0; i < w.pl.nitems; i++) query_item(&w, b, h, &w.pl.items[i], &x);
      #pragma omp single
      zero_pad_rows(p, b, h, w.pl.keys);
    }
  }
  sta_cpu_blas_single(0);
  free_bwd(&w);
  free(fbuf);
  free(rbuf);
  return STA_OK;
}
