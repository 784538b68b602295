/*
** cpu_attention.c -- the CPU STA forward: blocked, OpenMP + OpenBLAS.
**
** Per (batch, head): K and V are gathered once (f32) into the compact
** order of cpu_common.h (from the untiled or the tiled order in place, or
** the valid rows of a block list's key blocks), so the key tiles of one
** window row along w are one contiguous block, a full window is a single
** block, and so is a run of listed key blocks.  Query work items (a query
** tile or block, split into blocks of at most QB rows, or a block of text
** rows) then run in parallel: gather and pre-scale Q, and for each chunk of
** at most KC contiguous keys of the plan's key ranges S = Q K^T (sgemm), an
** online softmax in base 2, O += P V (sgemm); finally normalise and store
** (a query block with no keys: out 0, lse -inf).
** OpenBLAS's thread count is process-wide: the first of any concurrent
** forwards sets it to 1, the last one out restores it, so forwards run at
** once from several caller threads all see single-threaded GEMMs.
*/
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

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

typedef struct scratch {
  float *q, *o, *s, *m, *l;
  float *kc, *vc; /* KC x D: short key ranges gathered into one block */
  int64_t *lo, *hi;
} scratch;

/* One work item of head (b, h); kf, vf: that head's keys x D. */
static void run_item(const sta_cpu_plan *pl, int64_t b, int64_t h, const sta_cpu_item *it,
                     const float *kf, const float *vf, scratch *w) {
  const sta_attn_params *p = pl->p;
  const int64_t D = p->head_dim, nb = it->count;
  const size_t es = sta_dtype_size(p->dtype);
  const float qscale = p->scale * 1.44269504088896341f; /* log2(e) */
  for (int64_t i = 0; i < nb; i++) {
    int64_t t = sta_cpu_row_token(pl, it->row + i);
    sta_cpu_load_row(w->q + i * D,
             (const char *)p->q + (b * p->q_sb + t * p->q_ss + h * p->q_sh) * (int64_t)es,
             p->dtype, D, qscale);
    w->m[i] = -INFINITY;
    w->l[i] = 0;
  }
  memset(w->o, 0, sizeof(float) * (size_t)(nb * D));
  int64_t nr = sta_cpu_key_ranges(pl, b, h, it->tile, w->lo, w->hi), total = 0;
  if (nr == 0) { /* an empty block list: out 0, lse -inf */
    for (int64_t i = 0; i < nb; i++) {
      int64_t t = sta_cpu_row_token(pl, it->row + i);
      sta_cpu_zero_row(p, p->o, p->o_sb, p->o_ss, p->o_sh, b, t, h);
      if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] = -INFINITY;
    }
    return;
  }
  for (int64_t r = 0; r < nr; r++) total += w->hi[r] - w->lo[r];
  if (nr > 1 && total <= STA_CPU_KC && total < 16 * nr) {
    /* many short ranges (small tiles): one block, one GEMM pair, instead
    ** of a pair of tiny GEMMs per range */
    for (int64_t r = 0, n = 0; r < nr; n += w->hi[r] - w->lo[r], r++) {
      size_t bytes = sizeof(float) * (size_t)((w->hi[r] - w->lo[r]) * D);
      memcpy(w->kc + n * D, kf + w->lo[r] * D, bytes);
      memcpy(w->vc + n * D, vf + w->lo[r] * D, bytes);
    }
    kf = w->kc;
    vf = w->vc;
    w->lo[0] = 0;
    w->hi[0] = total;
    nr = 1;
  }
  for (int64_t r = 0; r < nr; r++) {
    /* equal chunks of at most KC keys: 1152 = 3 x 384, not 512+512+128 */
    int64_t len = w->hi[r] - w->lo[r], parts = (len + STA_CPU_KC - 1) / STA_CPU_KC;
    for (int64_t c = 0, k0 = w->lo[r]; c < parts; c++) {
      int64_t nc = (w->hi[r] - k0) / (parts - c);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nb, (int)nc, (int)D,
                  1.0f, w->q, (int)D, kf + k0 * D, (int)D, 0.0f, w->s, (int)nc);
      for (int64_t i = 0; i < nb; i++) {
        float alpha = softmax_step(w->s + i * nc, nc, &w->m[i], &w->l[i]);
        if (alpha != 1.0f) {
          float *o = w->o + i * D;
          for (int64_t d = 0; d < D; d++) o[d] *= alpha;
        }
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nb, (int)D, (int)nc,
                  1.0f, w->s, (int)nc, vf + k0 * D, (int)D, 1.0f, w->o, (int)D);
      k0 += nc;
    }
  }
  for (int64_t i = 0; i < nb; i++) {
    int64_t t = sta_cpu_row_token(pl, it->row + i);
    sta_cpu_store_row((char *)p->o + (b * p->o_sb + t * p->o_ss + h * p->o_sh) * (int64_t)es,
                      p->dtype, w->o + i * D, D, 1.0f / w->l[i]);
    if (p->lse)
      p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] =
          (w->m[i] + log2f(w->l[i])) * 0.69314718055994531f;
  }
}


/* Per pass over the heads, the K and V of several (batch, head) pairs are
** gathered at once (as many as fit in STA_CPU_KV_GROUP_BYTES), so a small
** problem runs as one parallel loop over all heads' items instead of two
** barriers per head: with many heads of few tokens the barriers, not the
** math, took the time (5x6x10 tokens, tile 1x1x1, 24 heads was slower
** than the reference). */
sta_status sta_cpu_attention(const sta_attn_params *p) {
  sta_cpu_plan pl;
  const int64_t D = p->head_dim, BH = p->batch * p->heads;
  const int nt = sta_get_num_threads();
  const size_t es = sta_dtype_size(p->dtype);
  size_t per = (size_t)(STA_CPU_QB * (2 * D + STA_CPU_KC + 2) + 2 * STA_CPU_KC * D);
  float *fbuf = NULL, *kvg = NULL;
  int64_t *rbuf = NULL, hg = 1;
  sta_status rc = sta_cpu_plan_make(&pl, p);
  if (rc == STA_OK) {
    size_t head_bytes = sizeof(float) * 2 * (size_t)(pl.keys * D) + 1;
    hg = (int64_t)(STA_CPU_KV_GROUP_BYTES / head_bytes);
    hg = hg < 1 ? 1 : hg > BH ? BH : hg;
    fbuf = sta_malloc(sizeof(float) * per * (size_t)nt);
    rbuf = sta_malloc(sizeof(int64_t) * 2 * (size_t)(pl.max_ranges * nt));
    if (hg > 1) kvg = sta_malloc(head_bytes * (size_t)hg);
    if (!fbuf || !rbuf || (hg > 1 && !kvg)) rc = STA_ERR_NOMEM;
  }
  if (rc != STA_OK) {
    sta_cpu_plan_free(&pl);
    free(fbuf);
    free(rbuf);
    free(kvg);
    return sta_error(STA_ERR_NOMEM, "out of host memory (CPU attention buffers)");
  }
  /* group slot g: K at kf + g * stride, V at vf + g * stride */
  float *kf = hg > 1 ? kvg : pl.kf, *vf = hg > 1 ? kvg + hg * pl.keys * D : pl.vf;
  const int64_t stride = pl.keys * D, ni = pl.nitems;
  /* items of a few rows (small tiles) are handed out several at a time */
  int64_t rows_per_item = ni ? (p->seq_len + ni - 1) / ni : 1;
  int chunk = rows_per_item >= 32 ? 1 : (int)(32 / rows_per_item);
  /* the GEMMs run inside the OpenMP region: one BLAS thread each (the
  ** pthread build would otherwise start its own pool per call) */
  sta_cpu_blas_single(1);
  int64_t skipped = 0; /* work items not run: cancelled (sta_cancel) */
  #pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    scratch w;
    w.q = fbuf + per * (size_t)tid;
    w.o = w.q + STA_CPU_QB * D;
    w.s = w.o + STA_CPU_QB * D;
    w.m = w.s + STA_CPU_QB * STA_CPU_KC;
    w.l = w.m + STA_CPU_QB;
    w.kc = w.l + STA_CPU_QB;
    w.vc = w.kc + STA_CPU_KC * D;
    w.lo = rbuf + 2 * pl.max_ranges * tid;
    w.hi = w.lo + pl.max_ranges;
    for (int64_t g0 = 0; g0 < BH; g0 += hg) {
      int64_t ng = BH - g0 < hg ? BH - g0 : hg;
      #pragma omp for schedule(static)
      for (int64_t x = 0; x < ng * pl.keys; x++) {
        int64_t g = x / pl.keys, r = x % pl.keys, bh = g0 + g;
        int64_t b = bh / p->heads, h = bh % p->heads, t = sta_cpu_key_token(&pl, r);
        sta_cpu_load_row(kf + g * stride + r * D,
                 (const char *)p->k + (b * p->k_sb + t * p->k_ss + h * p->k_sh) * (int64_t)es,
                 p->dtype, D, 1.0f);
        sta_cpu_load_row(vf + g * stride + r * D,
                 (const char *)p->v + (b * p->v_sb + t * p->v_ss + h * p->v_sh) * (int64_t)es,
                 p->dtype, D, 1.0f);
      }
      #pragma omp for schedule(dynamic, chunk)
      for (int64_t x = 0; x < ng * ni; x++) {
        if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
        int64_t g = x / ni, bh = g0 + g;
        run_item(&pl, bh / p->heads, bh % p->heads, &pl.items[x % ni], kf + g * stride,
                 vf + g * stride, &w);
      }
    }
  }
  sta_cpu_blas_single(0);
  /* padding rows (of the tiled order, of partial blocks): no keys, out 0
  ** and lse -inf */
  for (int64_t bh = 0; bh < BH && !skipped; bh++)
    for (int64_t i = 0; i < pl.npad; i++) {
      int64_t b = bh / p->heads, h = bh % p->heads, t = pl.pad[i];
      sta_cpu_zero_row(p, p->o, p->o_sb, p->o_ss, p->o_sh, b, t, h);
      if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + t * p->lse_ss] = -INFINITY;
    }
  sta_cpu_plan_free(&pl);
  free(fbuf);
  free(rbuf);
  free(kvg);
  if (skipped) return sta_cancelled("attention");
  return STA_OK;
}
