/*
** vsa_reference.c -- VSA by brute force in double (sta_vsa_reference,
** sta_vsa_backward_reference; STA.md section 12), sharing nothing with the
** fast path but the operands: per (batch, head) the means, the coarse
** scores and softmax, the selection by repeated maximum, every valid query
** row against every valid key of its selected cubes, the combine; the
** backward differentiates exactly that, term by term.
*/
#include <math.h>
#include <stdlib.h>

#include "internal.h"

typedef struct head {
  double *qc, *kc, *vc, *a, *s, *oc; /* Mq x D, Mk x D, Mk x D, Mq x Mk, Mq x Mk, Mq x D */
  int32_t *sel;                       /* Mq x topk */
  int64_t *ks;                        /* a query cube's key rows (topk x block_rows) */
  double *kb, *vb;                    /* their k and v rows (topk x block_rows x D) */
  double *pw, *os, *qr;               /* their weights; a row's out_s and q (D each) */
} head;

static double ld(const void *base, sta_dtype dt, int64_t off) {
  return (double)sta_load_f32((const char *)base + off * (int64_t)sta_dtype_size(dt), dt);
}
static void st(void *base, sta_dtype dt, int64_t off, double x) {
  sta_store_f32((char *)base + off * (int64_t)sta_dtype_size(dt), dt, (float)x);
}

/* n scores s better than m (STA.md section 12's order): larger first, a
** NaN above every number, equal (-0 == +0) or both NaN: the lower index. */
static int better(double x, int64_t i, double y, int64_t j) {
  const int xn = x != x, yn = y != y;
  if (xn || yn) return xn && yn ? i < j : xn;
  if (x != y) return x > y;
  return i < j;
}

static void head_free(head *w) {
  free(w->qc); free(w->kc); free(w->vc); free(w->a); free(w->s); free(w->oc); free(w->sel);
  free(w->ks); free(w->kb); free(w->vb); free(w->pw); free(w->os); free(w->qr);
}

/* The coarse branch and the selection of (b, h), and the head's scratch. */
static int coarse(const sta_vsa_params *p, int64_t b, int64_t h, head *w) {
  const sta_attn_params *f = &p->f;
  const int64_t D = f->head_dim, mq = f->q_blocks, mk = f->kv_blocks, br = f->block_rows;
  const int32_t K = p->topk;
  memset(w, 0, sizeof *w);
  w->qc = malloc(sizeof(double) * (size_t)(mq * D));
  w->kc = malloc(sizeof(double) * (size_t)(mk * D));
  w->vc = malloc(sizeof(double) * (size_t)(mk * D));
  w->oc = calloc((size_t)(mq * D), sizeof(double));
  w->a = malloc(sizeof(double) * (size_t)(mq * mk));
  w->s = malloc(sizeof(double) * (size_t)(mq * mk));
  w->sel = malloc(sizeof(int32_t) * (size_t)(mq * K));
  w->ks = malloc(sizeof(int64_t) * (size_t)K * (size_t)br);
  w->pw = malloc(sizeof(double) * (size_t)K * (size_t)br);
  w->os = malloc(sizeof(double) * (size_t)D);
  w->qr = malloc(sizeof(double) * (size_t)D);
  w->kb = malloc(sizeof(double) * (size_t)K * (size_t)br * (size_t)D);
  w->vb = malloc(sizeof(double) * (size_t)K * (size_t)br * (size_t)D);
  if (!w->qc || !w->kc || !w->vc || !w->oc || !w->a || !w->s || !w->sel || !w->ks || !w->pw ||
      !w->os || !w->qr || !w->kb || !w->vb)
    return 0;
  for (int64_t m = 0; m < mq; m++) {
    const int64_t n = sta_vsa_qsize(p, m);
    for (int64_t d = 0; d < D; d++) {
      double s = 0;
      for (int64_t r = 0; r < n; r++) s += ld(f->q, f->dtype, b * f->q_sb + (m * br + r) * f->q_ss + h * f->q_sh + d);
      w->qc[m * D + d] = s / (double)n;
    }
  }
  for (int64_t c = 0; c < mk; c++) {
    const int64_t n = sta_vsa_kvsize(p, c);
    for (int64_t d = 0; d < D; d++) {
      double sk = 0, sv = 0;
      for (int64_t r = 0; r < n; r++) {
        sk += ld(f->k, f->dtype, b * f->k_sb + (c * br + r) * f->k_ss + h * f->k_sh + d);
        sv += ld(f->v, f->dtype, b * f->v_sb + (c * br + r) * f->v_ss + h * f->v_sh + d);
      }
      w->kc[c * D + d] = sk / (double)n;
      w->vc[c * D + d] = sv / (double)n;
    }
  }
  for (int64_t m = 0; m < mq; m++) {
    double *s = w->s + m * mk, *a = w->a + m * mk, mx = -INFINITY, sum = 0;
    for (int64_t c = 0; c < mk; c++) {
      double x = 0;
      for (int64_t d = 0; d < D; d++) x += w->qc[m * D + d] * w->kc[c * D + d];
      s[c] = x;
      if (f->scale * x > mx || x != x) mx = f->scale * x;
    }
    for (int64_t c = 0; c < mk; c++) sum += exp(f->scale * s[c] - mx);
    for (int64_t c = 0; c < mk; c++) {
      a[c] = exp(f->scale * s[c] - mx) / sum;
      for (int64_t d = 0; d < D; d++) w->oc[m * D + d] += a[c] * w->vc[c * D + d];
    }
    int32_t *sel = w->sel + m * K;
    for (int32_t i = 0; i < K; i++) { /* the best cube not taken yet */
      int64_t best = -1;
      for (int64_t c = 0; c < mk; c++) {
        int taken = 0;
        for (int32_t j = 0; j < i && !taken; j++) taken = sel[j] == c;
        if (!taken && (best < 0 || better(s[c], c, s[best], best))) best = c;
      }
      sel[i] = (int32_t)best;
    }
  }
  return 1;
}

/* The fine branch of valid query row `row`: q's row into w->qr, the
** weights of the keys (keys_of's nk rows) into w->pw, out_s into w->os;
** returns its lse. */
static double fine_row(const sta_vsa_params *p, int64_t b, int64_t h, int64_t row, int64_t nk,
                       head *w) {
  const sta_attn_params *f = &p->f;
  const int64_t D = f->head_dim;
  double mx = -INFINITY, sum = 0, *pw = w->pw, *os = w->os, *qr = w->qr;
  for (int64_t d = 0; d < D; d++)
    qr[d] = ld(f->q, f->dtype, b * f->q_sb + row * f->q_ss + h * f->q_sh + d);
  for (int64_t j = 0; j < nk; j++) {
    const double *kr = w->kb + j * D;
    double x = 0;
    for (int64_t d = 0; d < D; d++) x += qr[d] * kr[d];
    pw[j] = f->scale * x;
    if (pw[j] > mx || pw[j] != pw[j]) mx = pw[j];
  }
  for (int64_t j = 0; j < nk; j++) sum += exp(pw[j] - mx);
  const double lse = mx + log(sum);
  for (int64_t d = 0; d < D; d++) os[d] = 0;
  for (int64_t j = 0; j < nk; j++) {
    const double *vr = w->vb + j * D;
    pw[j] = exp(pw[j] - lse);
    for (int64_t d = 0; d < D; d++) os[d] += pw[j] * vr[d];
  }
  return lse;
}

/* The key rows of query cube m's selection into w->ks, their k and v rows
** into w->kb and w->vb; returns their count. */
static int64_t keys_of(const sta_vsa_params *p, int64_t b, int64_t h, head *w, int64_t m) {
  const sta_attn_params *f = &p->f;
  const int64_t D = f->head_dim;
  int64_t nk = 0;
  for (int32_t i = 0; i < p->topk; i++) {
    const int64_t c = w->sel[m * p->topk + i], n = sta_vsa_kvsize(p, c);
    for (int64_t r = 0; r < n; r++, nk++) {
      const int64_t kr = c * f->block_rows + r;
      w->ks[nk] = kr;
      for (int64_t d = 0; d < D; d++) {
        w->kb[nk * D + d] = ld(f->k, f->dtype, b * f->k_sb + kr * f->k_ss + h * f->k_sh + d);
        w->vb[nk * D + d] = ld(f->v, f->dtype, b * f->v_sb + kr * f->v_ss + h * f->v_sh + d);
      }
    }
  }
  return nk;
}

static double gate_at(const sta_vsa_params *p, int64_t b, int64_t row, int64_t h, int64_t d) {
  return p->gate ? ld(p->gate, p->f.dtype, b * p->g_sb + row * p->g_ss + h * p->g_sh + d) : 1.0;
}

sta_status sta_cpu_vsa_reference(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, br = f->block_rows;
  int fail = 0;
  #pragma omp parallel for schedule(dynamic)
  for (int64_t g = 0; g < f->batch * H; g++) {
    const int64_t b = g / H, h = g % H;
    head w;
    if (!coarse(p, b, h, &w)) {
      #pragma omp atomic write
      fail = 1;
    } else {
      for (int64_t m = 0; m < f->q_blocks; m++) {
        const int64_t n = sta_vsa_qsize(p, m), nk = keys_of(p, b, h, &w, m);
        for (int64_t r = 0; r < br; r++) {
          const int64_t row = m * br + r;
          double lse = -INFINITY;
          if (r < n) lse = fine_row(p, b, h, row, nk, &w);
          for (int64_t d = 0; d < D; d++)
            st(f->o, f->dtype, b * f->o_sb + row * f->o_ss + h * f->o_sh + d,
               r < n ? gate_at(p, b, row, h, d) * w.oc[m * D + d] + w.os[d] : 0.0);
          if (f->lse) f->lse[b * f->lse_sb + h * f->lse_sh + row * f->lse_ss] = (float)lse;
        }
      }
    }
    head_free(&w);
  }
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA reference)") : STA_OK;
}

sta_status sta_cpu_vsa_backward_reference(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const int64_t H = f->heads, D = f->head_dim, br = f->block_rows;
  const int64_t mq = f->q_blocks, mk = f->kv_blocks, sq = f->seq_len, sk = f->kv_len;
  int fail = 0;
  #pragma omp parallel for schedule(dynamic)
  for (int64_t g = 0; g < f->batch * H; g++) {
    const int64_t b = g / H, h = g % H;
    head w;
    double *dq = calloc((size_t)(sq * D), sizeof(double)), *dk = calloc((size_t)(sk * D), sizeof(double));
    double *dv = calloc((size_t)(sk * D), sizeof(double)), *gm = calloc((size_t)(mq * D), sizeof(double));
    double *dy = malloc(sizeof(double) * (size_t)D), *dc = calloc((size_t)((mq + 2 * mk) * D), sizeof(double));
    if (!coarse(p, b, h, &w) || !dq || !dk || !dv || !gm || !dy || !dc) {
      #pragma omp atomic write
      fail = 1;
    } else {
      double *dqc = dc, *dkc = dc + mq * D, *dvc = dc + (mq + mk) * D;
      const int64_t *ks = w.ks;
      const double *pw = w.pw, *os = w.os, *qr = w.qr;
      for (int64_t m = 0; m < mq; m++) {
        const int64_t n = sta_vsa_qsize(p, m), nk = keys_of(p, b, h, &w, m);
        for (int64_t r = 0; r < n; r++) {
          const int64_t row = m * br + r;
          fine_row(p, b, h, row, nk, &w);
          double di = 0;
          for (int64_t d = 0; d < D; d++) {
            dy[d] = ld(f->dout, f->dtype, b * f->do_sb + row * f->do_ss + h * f->do_sh + d);
            di += dy[d] * os[d];
            const double gt = gate_at(p, b, row, h, d);
            gm[m * D + d] += dy[d] * gt;
            if (p->dgate)
              st(p->dgate, f->dtype, b * p->dg_sb + row * p->dg_ss + h * p->dg_sh + d,
                 dy[d] * w.oc[m * D + d]);
          }
          for (int64_t j = 0; j < nk; j++) {
            const double *kr = w.kb + j * D, *vr = w.vb + j * D;
            double dp = 0, *dkr = dk + ks[j] * D, *dvr = dv + ks[j] * D, *dqr = dq + row * D;
            for (int64_t d = 0; d < D; d++) dp += dy[d] * vr[d];
            const double ds = pw[j] * (dp - di) * f->scale;
            for (int64_t d = 0; d < D; d++) {
              dqr[d] += ds * kr[d];
              dkr[d] += ds * qr[d];
              dvr[d] += pw[j] * dy[d];
            }
          }
        }
        for (int64_t r = n; r < br && p->dgate; r++)
          for (int64_t d = 0; d < D; d++)
            st(p->dgate, f->dtype, b * p->dg_sb + (m * br + r) * p->dg_ss + h * p->dg_sh + d, 0.0);
      }
      /* the coarse branch: dv_c = A^T G, dS = A (G v_c^T - G . out_c) */
      for (int64_t m = 0; m < mq; m++) {
        double gdo = 0;
        for (int64_t d = 0; d < D; d++) gdo += gm[m * D + d] * w.oc[m * D + d];
        for (int64_t c = 0; c < mk; c++) {
          const double a = w.a[m * mk + c];
          double gv = 0;
          for (int64_t d = 0; d < D; d++) {
            dvc[c * D + d] += a * gm[m * D + d];
            gv += gm[m * D + d] * w.vc[c * D + d];
          }
          const double ds = a * (gv - gdo) * f->scale;
          for (int64_t d = 0; d < D; d++) {
            dqc[m * D + d] += ds * w.kc[c * D + d];
            dkc[c * D + d] += ds * w.qc[m * D + d];
          }
        }
      }
      for (int64_t m = 0; m < mq; m++)
        for (int64_t r = 0; r < sta_vsa_qsize(p, m); r++)
          for (int64_t d = 0; d < D; d++)
            dq[(m * br + r) * D + d] += dqc[m * D + d] / (double)sta_vsa_qsize(p, m);
      for (int64_t c = 0; c < mk; c++)
        for (int64_t r = 0; r < sta_vsa_kvsize(p, c); r++)
          for (int64_t d = 0; d < D; d++) {
            dk[(c * br + r) * D + d] += dkc[c * D + d] / (double)sta_vsa_kvsize(p, c);
            dv[(c * br + r) * D + d] += dvc[c * D + d] / (double)sta_vsa_kvsize(p, c);
          }
      for (int64_t r = 0; r < sq; r++)
        for (int64_t d = 0; d < D; d++)
          st(f->dq, f->dtype, b * f->dq_sb + r * f->dq_ss + h * f->dq_sh + d, dq[r * D + d]);
      for (int64_t r = 0; r < sk; r++)
        for (int64_t d = 0; d < D; d++) {
          st(f->dk, f->dtype, b * f->dk_sb + r * f->dk_ss + h * f->dk_sh + d, dk[r * D + d]);
          st(f->dv, f->dtype, b * f->dv_sb + r * f->dv_ss + h * f->dv_sh + d, dv[r * D + d]);
        }
    }
    head_free(&w);
    free(dq); free(dk); free(dv); free(gm); free(dy); free(dc);
  }
  return fail ? sta_error(STA_ERR_NOMEM, "out of host memory (VSA reference)") : STA_OK;
}
