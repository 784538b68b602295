/*
** cpu_backward.c -- the CPU STA backward (STA.md section 10): blocked,
** OpenMP + OpenBLAS, deterministic.
**
** Per (batch, head), Q, K, V, dO (f32), log2-domain LSE and D_i = dO_i.O_i
** are gathered once into the compact tiled order of cpu_common.h, as many
** heads at a time as fit in STA_CPU_KV_GROUP_BYTES (so many small heads run
** as one parallel loop, not a few barriers each).  Two passes follow, each
** over work items that own their outputs, so no two threads ever add into
** the same row and the result does not depend on the schedule or the
** thread count:
**   1. key items (a key tile or block split into blocks of at most QB
**      rows, or a block of text keys) walk the query rows that see them
**      (the plan's query ranges: the window's inverse -- on each axis one
**      contiguous range of query tiles, plus every text query -- or the
**      query blocks that list the key block, inverted on the host by a
**      counting sort, so in a fixed order) in chunks of at most KC rows:
**      S^T = K Q^T, P^T, dP^T = V dO^T, dS^T = P^T (dP^T - D), then dV +=
**      P^T dO and dK += dS^T Q;
**   2. query items (the forward's) walk their key ranges: the same S^T,
**      P^T, dS^T, then dQ += dS K.
** Seven GEMMs per (query, key) block where a fused pass needs five (S and
** dP are computed in both passes): the price of owning every output row,
** which keeps the memory at the inputs' size and the gradients
** bit-identical run to run.  A cancel (sta_cancel) skips the remaining
** items; the caller's outputs are scratch copies (attention.c).
*/
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

typedef struct bwd {
  sta_cpu_plan pl;        /* query items, tile offsets */
  int64_t rows;           /* compact rows (pl.rows): every row is a query */
  int64_t hg, per_head;   /* heads per pass; floats of one head's buffers */
  float *buf;             /* hg x per_head */
  sta_cpu_item *kitems;   /* key items */
  int64_t nkitems;
  int64_t max_qranges;
} bwd;

/* One (batch, head)'s gathered operands, compact order. */
typedef struct head_bufs {
  float *qf, *dof;        /* rows x D */
  float *kf, *vf;         /* keys x D */
  float *l2, *dd;         /* rows: LSE * log2(e), D_i */
} head_bufs;

static head_bufs head_of(const bwd *w, int64_t g) {
  const int64_t D = w->pl.p->head_dim, S = w->rows, K = w->pl.keys;
  head_bufs x;
  x.qf = w->buf + g * w->per_head;
  x.dof = x.qf + S * D;
  x.kf = x.dof + S * D;
  x.vf = x.kf + K * D;
  x.l2 = x.vf + K * D;
  x.dd = x.l2 + S;
  return x;
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
      /* x <= 0 but for rounding; the clamp keeps NaN (a NaN lse or score)
      ** NaN: written x < 126 ? x : 126 it turned NaN into 2^126 */
      float e = exp2_neg(x > 126.0f ? 126.0f : x);
      s[j] = e;
      dp[j] = e * (dp[j] - dd[j]);
    }
  }
}

/* C (M x N, ldc) = beta C + op(A) op(B), row-major, op = transpose when
** ta / tb: OpenBLAS for real blocks, plain loops for tiny ones (tiles of a
** few tokens make blocks of a few rows, where a library call costs more
** than its arithmetic). */
static void gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
  if (M * N * K > 4096) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, 1.0f, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
    return;
  }
  for (int64_t i = 0; i < M; i++) {
    float *c = C + i * ldc;
    if (beta == 0.0f) memset(c, 0, sizeof(float) * (size_t)N);
    if (tb) { /* C[i][j] += A[i] . B[j] (ta = 0 here) */
      for (int64_t j = 0; j < N; j++) {
        const float *a = A + i * lda, *b = B + j * ldb;
        float acc = 0;
        #pragma omp simd reduction(+ : acc)
        for (int64_t l = 0; l < K; l++) acc += a[l] * b[l];
        c[j] += acc;
      }
      continue;
    }
    for (int64_t l = 0; l < K; l++) { /* C[i] += A(i, l) B[l] */
      const float a = ta ? A[l * lda + i] : A[i * lda + l], *b = B + l * ldb;
      #pragma omp simd
      for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
    }
  }
}

typedef struct scratch {
  float *st, *dpt, *acc0, *acc1; /* QB x KC, QB x KC, QB x D, QB x D */
  int64_t *lo, *hi;
} scratch;

/* Pass 1: dK and dV of one key item. */
static void key_item(const bwd *w, const head_bufs *hb, int64_t b, int64_t h,
                     const sta_cpu_item *it, scratch *x) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim, nk = it->count, k0 = it->row;
  const float c = p->scale * 1.44269504088896341f;
  const float *kb = hb->kf + k0 * D, *vb = hb->vf + k0 * D;
  const size_t es = sta_dtype_size(p->dtype);
  memset(x->acc0, 0, sizeof(float) * (size_t)(nk * D)); /* dK */
  memset(x->acc1, 0, sizeof(float) * (size_t)(nk * D)); /* dV */
  int64_t nr = sta_cpu_query_ranges(&w->pl, b, h, it->tile, x->lo, x->hi);
  for (int64_t r = 0; r < nr; r++) {
    int64_t len = x->hi[r] - x->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t part = 0, q0 = x->lo[r]; part < parts; part++) {
      int64_t nq = (x->hi[r] - q0) / (parts - part);
      const float *qc = hb->qf + q0 * D, *dc = hb->dof + q0 * D;
      gemm(0, 1, nk, nq, D, kb, D, qc, D, 0.0f, x->st, nq);
      gemm(0, 1, nk, nq, D, vb, D, dc, D, 0.0f, x->dpt, nq);
      p_and_ds(x->st, x->dpt, nk, nq, nq, c, hb->l2 + q0, hb->dd + q0);
      gemm(0, 0, nk, D, nq, x->dpt, nq, qc, D, 1.0f, x->acc0, D);
      gemm(0, 0, nk, D, nq, x->st, nq, dc, D, 1.0f, x->acc1, D);
      q0 += nq;
    }
  }
  for (int64_t i = 0; i < nk; i++) {
    int64_t t = sta_cpu_key_token(&w->pl, k0 + i);
    sta_cpu_store_row((char *)p->dk + (b * p->dk_sb + t * p->dk_ss + h * p->dk_sh) * (int64_t)es,
                      p->dtype, x->acc0 + i * D, D, p->scale);
    sta_cpu_store_row((char *)p->dv + (b * p->dv_sb + t * p->dv_ss + h * p->dv_sh) * (int64_t)es,
                      p->dtype, x->acc1 + i * D, D, 1.0f);
  }
}

/* Pass 2: dQ of one query item. */
static void query_item(const bwd *w, const head_bufs *hb, int64_t b, int64_t h,
                       const sta_cpu_item *it, scratch *x) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim, nq = it->count, q0 = it->row;
  const float c = p->scale * 1.44269504088896341f;
  const float *qc = hb->qf + q0 * D, *dc = hb->dof + q0 * D;
  const size_t es = sta_dtype_size(p->dtype);
  memset(x->acc0, 0, sizeof(float) * (size_t)(nq * D));
  int64_t nr = sta_cpu_key_ranges(&w->pl, b, h, it->tile, x->lo, x->hi);
  for (int64_t r = 0; r < nr; r++) {
    int64_t len = x->hi[r] - x->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t part = 0, k0 = x->lo[r]; part < parts; part++) {
      int64_t nk = (x->hi[r] - k0) / (parts - part);
      const float *kb = hb->kf + k0 * D, *vb = hb->vf + k0 * D;
      gemm(0, 1, nk, nq, D, kb, D, qc, D, 0.0f, x->st, nq);
      gemm(0, 1, nk, nq, D, vb, D, dc, D, 0.0f, x->dpt, nq);
      p_and_ds(x->st, x->dpt, nk, nq, nq, c, hb->l2 + q0, hb->dd + q0);
      /* dQ (nq x D) += dS (nq x nk) K = (dS^T)^T K */
      gemm(1, 0, nq, D, nk, x->dpt, nq, kb, D, 1.0f, x->acc0, D);
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
  free(w->buf);
  free(w->kitems);
}

/* Gather compact row r of (b, h) into hb: as a query row (r < rows) q,
** dO, LSE and D, as a key row (r < keys) k and v. */
static void gather_row(const bwd *w, const head_bufs *hb, int64_t b, int64_t h, int64_t r) {
  const sta_attn_params *p = w->pl.p;
  const int64_t D = p->head_dim;
  const size_t es = sta_dtype_size(p->dtype);
  int64_t t;
#define AT(base, sb, ss, sh) ((const char *)(base) + (b * (sb) + t * (ss) + h * (sh)) * (int64_t)es)
  if (r < w->rows) {
    t = sta_cpu_row_token(&w->pl, r); /* only for query rows: the map has w->rows entries */
    float *q = hb->qf + r * D, *g = hb->dof + r * D;
    sta_cpu_load_row(q, AT(p->q, p->q_sb, p->q_ss, p->q_sh), p->dtype, D, 1.0f);
    sta_cpu_load_row(g, AT(p->dout, p->do_sb, p->do_ss, p->do_sh), p->dtype, D, 1.0f);
    const char *o = AT(p->o, p->o_sb, p->o_ss, p->o_sh);
    double di = 0;
    for (int64_t d = 0; d < D; d++) di += (double)g[d] * (double)sta_load_f32(o + d * es, p->dtype);
    hb->dd[r] = (float)di;
    hb->l2[r] = p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] * 1.44269504088896341f;
  }
  if (r < w->pl.keys) {
    t = sta_cpu_key_token(&w->pl, r);
    sta_cpu_load_row(hb->kf + r * D, AT(p->k, p->k_sb, p->k_ss, p->k_sh), p->dtype, D, 1.0f);
    sta_cpu_load_row(hb->vf + r * D, AT(p->v, p->v_sb, p->v_ss, p->v_sh), p->dtype, D, 1.0f);
  }
#undef AT
}

/* dQ = 0 on the rows that are no queries (padding), dK = dV = 0 on the
** rows that are never keys (padding, and past the valid text). */
static void zero_pad_rows(const sta_cpu_plan *pl, int64_t b, int64_t h) {
  const sta_attn_params *p = pl->p;
  for (int64_t t = pl->keys_end; t < p->kv_len; t++) {
    sta_cpu_zero_row(p, p->dk, p->dk_sb, p->dk_ss, p->dk_sh, b, t, h);
    sta_cpu_zero_row(p, p->dv, p->dv_sb, p->dv_ss, p->dv_sh, b, t, h);
  }
  for (int64_t i = 0; i < pl->nkpad; i++) {
    int64_t t = pl->kpad[i];
    sta_cpu_zero_row(p, p->dk, p->dk_sb, p->dk_ss, p->dk_sh, b, t, h);
    sta_cpu_zero_row(p, p->dv, p->dv_sb, p->dv_ss, p->dv_sh, b, t, h);
  }
  for (int64_t i = 0; i < pl->npad; i++)
    sta_cpu_zero_row(p, p->dq, p->dq_sb, p->dq_ss, p->dq_sh, b, pl->pad[i], h);
}

sta_status sta_cpu_attention_backward(const sta_attn_params *p) {
  bwd w;
  const int64_t D = p->head_dim, BH = p->batch * p->heads;
  const int nt = sta_get_num_threads();
  memset(&w, 0, sizeof w);
  size_t per = (size_t)(2 * STA_CPU_QB * STA_CPU_KC + 2 * STA_CPU_KC * D);
  float *fbuf = NULL;
  int64_t *rbuf = NULL;
  sta_status rc = sta_cpu_plan_make(&w.pl, p);
  const int64_t S = w.rows = w.pl.rows; /* the tiled order's padding rows: none */
  if (rc == STA_OK) rc = sta_cpu_items(w.pl.key_off, w.pl.nkb, p->text_len, &w.kitems, &w.nkitems);
  const int64_t G = S > w.pl.keys ? S : w.pl.keys; /* rows gathered per head */
  if (rc == STA_OK) {
    int64_t nrng = w.pl.max_qranges > w.pl.max_ranges ? w.pl.max_qranges : w.pl.max_ranges;
    w.per_head = 2 * S * D + 2 * w.pl.keys * D + 2 * S;
    w.hg = (int64_t)(STA_CPU_KV_GROUP_BYTES / (sizeof(float) * (size_t)w.per_head + 1));
    w.hg = w.hg < 1 ? 1 : w.hg > BH ? BH : w.hg;
    w.buf = sta_malloc(sizeof(float) * (size_t)(w.hg * w.per_head) + 1);
    fbuf = sta_malloc(sizeof(float) * per * (size_t)nt);
    rbuf = sta_malloc(sizeof(int64_t) * 2 * (size_t)(nrng * nt));
    if (!w.buf || !fbuf || !rbuf) rc = STA_ERR_NOMEM;
    w.max_qranges = nrng;
  }
  if (rc != STA_OK) {
    free_bwd(&w);
    free(fbuf);
    free(rbuf);
    return sta_error(STA_ERR_NOMEM, "out of host memory (CPU backward buffers)");
  }
  const int64_t nk = w.nkitems, nq = w.pl.nitems;
  int64_t skipped = 0; /* work items not run: cancelled (sta_cancel) */
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
    /* a pass gathers the heads of a group, then runs every key item and
    ** every query item of all of them as one parallel loop each */
    for (int64_t g0 = 0; g0 < BH; g0 += w.hg) {
      const int64_t ng = BH - g0 < w.hg ? BH - g0 : w.hg;
      #pragma omp for schedule(static)
      for (int64_t i = 0; i < ng * G; i++) {
        const int64_t bh = g0 + i / G;
        head_bufs hb = head_of(&w, i / G);
        gather_row(&w, &hb, bh / p->heads, bh % p->heads, i % G);
      }
      #pragma omp for schedule(dynamic, 1) nowait
      for (int64_t i = 0; i < ng * nk; i++) {
        if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
        const int64_t bh = g0 + i / nk;
        head_bufs hb = head_of(&w, i / nk);
        key_item(&w, &hb, bh / p->heads, bh % p->heads, &w.kitems[i % nk], &x);
      }
      #pragma omp for schedule(dynamic, 1) nowait
      for (int64_t i = 0; i < ng * nq; i++) {
        if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
        const int64_t bh = g0 + i / nq;
        head_bufs hb = head_of(&w, i / nq);
        query_item(&w, &hb, bh / p->heads, bh % p->heads, &w.pl.items[i % nq], &x);
      }
      #pragma omp for schedule(static)
      for (int64_t g = 0; g < ng; g++) zero_pad_rows(&w.pl, (g0 + g) / p->heads,
                                                    (g0 + g) % p->heads);
    }
  }
  sta_cpu_blas_single(0);
  free_bwd(&w);
  free(fbuf);
  free(rbuf);
  if (skipped) return sta_cancelled("backward");
  return STA_OK;
}
