/*
** vsa_cpu.c -- VSA's pieces around the fine branch on the CPU (the
** contracts: core/vsa_internal.h, sta_cpu_vsa_*): the cube means (double sums),
** the coarse scores (one dot product loop for every pair, so equal cubes
** tie exactly), the selection (a partial sort per row), the coarse
** attention and its backward by OpenBLAS, the combine and the backward's
** preparation.  OpenMP over cubes or (batch, head); every sum has one
** order whatever the threads, so the results are bit-identical across
** runs and thread counts.
*/
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "cpu_common.h"

#define BH(p) ((p)->f.batch * (p)->f.heads)

/* Row r of (b, h) of an operand. */
static inline char *row_at(const void *base, sta_dtype dt, int64_t sb, int64_t ss, int64_t sh,
                           int64_t b, int64_t r, int64_t h) {
  return (char *)base + (b * sb + r * ss + h * sh) * (int64_t)sta_dtype_size(dt);
}

/* out[b][h][m][d] = the mean of x over the valid rows of cube m. */
static sta_status means_of(const sta_vsa_params *p, const void *x, int64_t sb, int64_t ss,
                           int64_t sh, int64_t M, const int32_t *sizes, float *out) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, br = f->block_rows;
  int fail = 0;
  #pragma omp parallel
  {
    double *acc = malloc(sizeof(double) * (size_t)D);
    float *row = malloc(sizeof(float) * (size_t)D);
    if (!acc || !row) {
      #pragma omp atomic write
      fail = 1;
    }
    #pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < f->batch; b++)
      for (int64_t m = 0; m < M; m++) {
        if (fail) continue;
        const int64_t n = sizes ? sizes[m] : br;
        for (int64_t h = 0; h < H; h++) {
          for (int64_t d = 0; d < D; d++) acc[d] = 0;
          for (int64_t r = 0; r < n; r++) {
            sta_cpu_load_row(row, row_at(x, f->dtype, sb, ss, sh, b, m * br + r, h), f->dtype, D,
                             1.0f);
            for (int64_t d = 0; d < D; d++) acc[d] += row[d];
          }
          float *o = out + ((b * H + h) * M + m) * D;
          for (int64_t d = 0; d < D; d++) o[d] = (float)(acc[d] / (double)n);
        }
      }
    free(acc);
    free(row);
  }
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA means)") : STA_OK;
}

sta_status sta_cpu_vsa_means(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  sta_status rc = means_of(p, f->q, f->q_sb, f->q_ss, f->q_sh, f->q_blocks, f->q_sizes, p->qc);
  if (rc == STA_OK)
    rc = means_of(p, f->k, f->k_sb, f->k_ss, f->k_sh, f->kv_blocks, f->kv_sizes, p->kc);
  if (rc == STA_OK)
    rc = means_of(p, f->v, f->v_sb, f->v_ss, f->v_sh, f->kv_blocks, f->kv_sizes, p->vc);
  return rc;
}

/* ---- selection ------------------------------------------------------------- */

/* The composite of key cube n's score: larger is chosen first (sta_vsa_key,
** then the lower index); all distinct. */
static inline uint64_t rank_of(float s, int64_t n) {
  return ((uint64_t)sta_vsa_key(s) << 32) | (uint64_t)(UINT32_MAX - (uint32_t)n);
}

static void swap64(uint64_t *a, uint64_t *b) {
  uint64_t t = *a;
  *a = *b;
  *b = t;
}

/* Partially order c[0..n) so that c[0..k) are its k largest (0 < k < n):
** quickselect on distinct values (median of three, Lomuto partition
** around the pivot moved to the end). */
static void select_top(uint64_t *c, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (c[mid] > c[lo]) swap64(&c[mid], &c[lo]);
    if (c[hi] > c[lo]) swap64(&c[hi], &c[lo]);
    if (c[mid] > c[hi]) swap64(&c[mid], &c[hi]); /* c[hi] the median */
    const uint64_t piv = c[hi];
    int64_t s = lo;
    for (int64_t i = lo; i < hi; i++)
      if (c[i] > piv) swap64(&c[i], &c[s++]);
    swap64(&c[s], &c[hi]);
    if (s == k - 1 || s == k) return;
    if (s < k) lo = s + 1;
    else hi = s - 1;
  }
}

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

/* idx[0..topk) of one score row s[0..mk), ascending; c: mk scratch. */
static void select_row(const float *s, int64_t mk, int32_t topk, uint64_t *c, int32_t *idx) {
  if (topk >= mk) {
    for (int64_t n = 0; n < mk; n++) idx[n] = (int32_t)n;
    return;
  }
  for (int64_t n = 0; n < mk; n++) c[n] = rank_of(s[n], n);
  select_top(c, mk, topk);
  for (int32_t i = 0; i < topk; i++) idx[i] = (int32_t)(UINT32_MAX - (uint32_t)c[i]);
  qsort(idx, (size_t)topk, sizeof *idx, cmp_i32);
}

/* lse of the row scale * s (NaN propagates); the row becomes the
** probabilities exp(scale * s - lse). */
static float softmax_row(float *s, int64_t mk, float scale) {
  double mx = -INFINITY, sum = 0;
  for (int64_t n = 0; n < mk; n++) {
    const double x = (double)scale * s[n];
    if (x > mx || x != x) mx = x;
    if (mx != mx) break;
  }
  for (int64_t n = 0; n < mk; n++) sum += exp((double)scale * s[n] - mx);
  const double lse = mx + log(sum);
  for (int64_t n = 0; n < mk; n++) s[n] = (float)exp((double)scale * s[n] - lse);
  return (float)lse;
}

sta_status sta_cpu_vsa_coarse(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t D = f->head_dim, mq = f->q_blocks, mk = f->kv_blocks;
  int fail = 0;
  sta_cpu_blas_single(1);
  #pragma omp parallel
  {
    uint64_t *c = malloc(sizeof(uint64_t) * (size_t)mk);
    if (!c) {
      #pragma omp atomic write
      fail = 1;
    }
    #pragma omp for schedule(static)
    for (int64_t g = 0; g < BH(p); g++) {
      if (fail) continue;
      const float *qc = p->qc + g * mq * D, *kc = p->kc + g * mk * D, *vc = p->vc + g * mk * D;
      float *s = p->sc + g * mq * mk;
      for (int64_t m = 0; m < mq; m++) {
        float *srow = s + m * mk;
        const float *a = qc + m * D;
        for (int64_t n = 0; n < mk; n++) { /* one loop for every pair: ties stay ties */
          const float *b = kc + n * D;
          float acc = 0;
          #pragma omp simd reduction(+ : acc)
          for (int64_t d = 0; d < D; d++) acc += a[d] * b[d];
          srow[n] = acc;
        }
        select_row(srow, mk, p->topk, c, p->idx + (g * mq + m) * p->topk);
        p->num[g * mq + m] = p->topk;
        p->lsec[g * mq + m] = softmax_row(srow, mk, f->scale);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mq, (int)D, (int)mk, 1.0f, s,
                  (int)mk, vc, (int)D, 0.0f, p->oc + g * mq * D, (int)D);
    }
    free(c);
  }
  sta_cpu_blas_single(0);
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA selection)") : STA_OK;
}

/* ---- combine and the backward's preparation ------------------------------- */

sta_status sta_cpu_vsa_combine(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, br = f->block_rows, mq = f->q_blocks;
  int fail = 0;
  #pragma omp parallel
  {
    float *o = malloc(sizeof(float) * (size_t)D), *g = malloc(sizeof(float) * (size_t)D);
    if (!o || !g) {
      #pragma omp atomic write
      fail = 1;
    }
    #pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < f->batch; b++)
      for (int64_t m = 0; m < mq; m++) {
        if (fail) continue;
        const int64_t n = sta_vsa_qsize(p, m);
        for (int64_t r = 0; r < br; r++)
          for (int64_t h = 0; h < H; h++) {
            char *orow = row_at(f->o, f->dtype, f->o_sb, f->o_ss, f->o_sh, b, m * br + r, h);
            if (r >= n) {
              memset(orow, 0, (size_t)D * sta_dtype_size(f->dtype));
              continue;
            }
            const float *oc = p->oc + ((b * H + h) * mq + m) * D;
            sta_cpu_load_row(o, orow, f->dtype, D, 1.0f);
            if (p->gate) {
              sta_cpu_load_row(g, row_at(p->gate, f->dtype, p->g_sb, p->g_ss, p->g_sh, b,
                                         m * br + r, h), f->dtype, D, 1.0f);
              for (int64_t d = 0; d < D; d++) o[d] += g[d] * oc[d];
            } else {
              for (int64_t d = 0; d < D; d++) o[d] += oc[d];
            }
            sta_cpu_store_row(orow, f->dtype, o, D, 1.0f);
          }
      }
    free(o);
    free(g);
  }
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA combine)") : STA_OK;
}

sta_status sta_cpu_vsa_backward_prep(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, br = f->block_rows, mq = f->q_blocks;
  const size_t rowb = (size_t)D * sta_dtype_size(f->dtype);
  int fail = 0;
  #pragma omp parallel
  {
    float *buf = malloc(sizeof(float) * 4 * (size_t)D);
    double *acc = malloc(sizeof(double) * (size_t)D);
    if (!buf || !acc) {
      #pragma omp atomic write
      fail = 1;
    }
    float *o = buf, *g = buf + D, *dy = buf + 2 * D, *t = buf + 3 * D;
    #pragma omp for collapse(3) schedule(static)
    for (int64_t b = 0; b < f->batch; b++)
      for (int64_t m = 0; m < mq; m++)
        for (int64_t h = 0; h < H; h++) {
          if (fail) continue;
          const int64_t n = sta_vsa_qsize(p, m);
          const float *oc = p->oc + ((b * H + h) * mq + m) * D;
          for (int64_t d = 0; d < D; d++) acc[d] = 0;
          for (int64_t r = 0; r < br; r++) {
            const int64_t row = m * br + r;
            char *os = row_at(f->o, f->dtype, f->o_sb, f->o_ss, f->o_sh, b, row, h);
            char *dg = p->dgate ? row_at(p->dgate, f->dtype, p->dg_sb, p->dg_ss, p->dg_sh, b,
                                         row, h) : NULL;
            if (r >= n) {
              memset(os, 0, rowb);
              if (dg) memset(dg, 0, rowb);
              continue;
            }
            sta_cpu_load_row(o, row_at(p->out, f->dtype, p->out_sb, p->out_ss, p->out_sh, b, row,
                                       h), f->dtype, D, 1.0f);
            sta_cpu_load_row(dy, row_at(f->dout, f->dtype, f->do_sb, f->do_ss, f->do_sh, b, row,
                                        h), f->dtype, D, 1.0f);
            if (p->gate)
              sta_cpu_load_row(g, row_at(p->gate, f->dtype, p->g_sb, p->g_ss, p->g_sh, b, row, h),
                               f->dtype, D, 1.0f);
            else
              for (int64_t d = 0; d < D; d++) g[d] = 1.0f;
            for (int64_t d = 0; d < D; d++) {
              t[d] = o[d] - g[d] * oc[d];
              acc[d] += (double)dy[d] * g[d];
            }
            sta_cpu_store_row(os, f->dtype, t, D, 1.0f);
            if (dg) {
              for (int64_t d = 0; d < D; d++) t[d] = dy[d] * oc[d];
              sta_cpu_store_row(dg, f->dtype, t, D, 1.0f);
            }
          }
          float *gc = p->gc + ((b * H + h) * mq + m) * D;
          for (int64_t d = 0; d < D; d++) gc[d] = (float)acc[d];
        }
    free(buf);
    free(acc);
  }
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA backward)") : STA_OK;
}

/* ---- the coarse branch's backward ----------------------------------------- */

/* x[b, m*br + r, h] += g[m] / size for the valid rows r of cube m. */
static void spread(const sta_vsa_params *p, void *x, int64_t sb, int64_t ss, int64_t sh,
                   int64_t b, int64_t h, int64_t M, const int32_t *sizes, const float *g,
                   float *row) {
  const sta_attn_params *f = &p->f;
  const int64_t D = f->head_dim, br = f->block_rows;
  for (int64_t m = 0; m < M; m++) {
    const int64_t n = sizes ? sizes[m] : br;
    const float inv = (float)(1.0 / (double)n), *gm = g + m * D;
    for (int64_t r = 0; r < n; r++) {
      char *xr = row_at(x, f->dtype, sb, ss, sh, b, m * br + r, h);
      sta_cpu_load_row(row, xr, f->dtype, D, 1.0f);
      for (int64_t d = 0; d < D; d++) row[d] += gm[d] * inv;
      sta_cpu_store_row(xr, f->dtype, row, D, 1.0f);
    }
  }
}

sta_status sta_cpu_vsa_backward_coarse(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, mq = f->q_blocks, mk = f->kv_blocks;
  int fail = 0;
  sta_cpu_blas_single(1);
  #pragma omp parallel
  {
    float *dp = malloc(sizeof(float) * (size_t)(mq * mk)), *row = malloc(sizeof(float) * (size_t)D);
    if (!dp || !row) {
      #pragma omp atomic write
      fail = 1;
    }
    #pragma omp for schedule(static)
    for (int64_t g = 0; g < BH(p); g++) {
      if (fail) continue;
      const int64_t b = g / H, h = g % H;
      float *a = p->sc + g * mq * mk;
      const float *gc = p->gc + g * mq * D, *oc = p->oc + g * mq * D;
      const float *qc = p->qc + g * mq * D, *kc = p->kc + g * mk * D, *vc = p->vc + g * mk * D;
      float *dqc = p->dqc + g * mq * D, *dkc = p->dkc + g * mk * D, *dvc = p->dvc + g * mk * D;
      /* dv_c = A^T G; dP = G v_c^T */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)mk, (int)D, (int)mq, 1.0f, a,
                  (int)mk, gc, (int)D, 0.0f, dvc, (int)D);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)mq, (int)mk, (int)D, 1.0f, gc,
                  (int)D, vc, (int)D, 0.0f, dp, (int)mk);
      for (int64_t m = 0; m < mq; m++) { /* dS = A (dP - G . out_c), into A's place */
        double dc = 0;
        for (int64_t d = 0; d < D; d++) dc += (double)gc[m * D + d] * oc[m * D + d];
        for (int64_t n = 0; n < mk; n++)
          a[m * mk + n] = a[m * mk + n] * (float)((double)dp[m * mk + n] - dc);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)mq, (int)D, (int)mk, f->scale,
                  a, (int)mk, kc, (int)D, 0.0f, dqc, (int)D);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)mk, (int)D, (int)mq, f->scale, a,
                  (int)mk, qc, (int)D, 0.0f, dkc, (int)D);
      spread(p, f->dq, f->dq_sb, f->dq_ss, f->dq_sh, b, h, mq, f->q_sizes, dqc, row);
      spread(p, f->dk, f->dk_sb, f->dk_ss, f->dk_sh, b, h, mk, f->kv_sizes, dkc, row);
      spread(p, f->dv, f->dv_sb, f->dv_ss, f->dv_sh, b, h, mk, f->kv_sizes, dvc, row);
    }
    free(dp);
    free(row);
  }
  sta_cpu_blas_single(0);
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA backward)") : STA_OK;
}
