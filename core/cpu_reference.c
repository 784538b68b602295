/*
** cpu_reference.c -- the brute-force oracle: one query row at a time, in
** double, over the key set of STA.md sections 2-3 and 12 decided per key
** row -- the window from token coordinates, a block list from the row's
** block index and the blocks' sizes -- independently of the fast path's
** tiles, plans and mask.h; and the per-head difference used by mask search.
*/
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "internal.h"

/* Is key tile kt inside the window of query tile qt on an axis of c tiles?
** The centred form of STA.md section 2: center = clamp(q, r, c-1-r).  Kept
** apart from mask.h's rule (start = clamp(q - r, 0, c - k)) on purpose:
** this file is the tests' oracle, and an oracle that shared the rule with
** the fast paths could not catch a mistake in it. */
static int axis_member(int64_t qt, int64_t kt, int64_t k, int64_t c) {
  if (k >= c) return 1;
  int64_t r = k / 2, center = qt;
  if (center < r) center = r;
  if (center > c - 1 - r) center = c - 1 - r;
  int64_t d = kt - center;
  return d >= -r && d <= r;
}

/* Sequence row s: 1 a video token (coordinates c), 0 a text row, -1 a
** padding row of the tiled order (no token). */
static int row_coords(const sta_attn_params *p, int64_t s, int64_t c[3]) {
  int64_t H = p->canvas[1], W = p->canvas[2];
  if (s >= p->video_rows) return 0;
  if (p->tiled && (s = sta_tiled_token(p->canvas, p->tile, p->grid, s)) < 0) return -1;
  c[0] = s / (H * W); c[1] = (s / W) % H; c[2] = s % W;
  return 1;
}

/* What one query row sees: kind (row_coords; for block lists 1, or -1 on
** a padding row), its coordinates (window), its block m and which key
** blocks its list names (lists). */
typedef struct qrow {
  int kind;
  int64_t qc[3];
  int64_t m;
  unsigned char *listed; /* Mk flags (lists) */
} qrow;

/* Rows of block n that are valid: the first sizes[n], or all. */
static int64_t valid_rows(const sta_attn_params *p, const int32_t *sizes, int64_t n) {
  return sizes ? sizes[n] : p->block_rows;
}

/* The query row s of (b, h) into r (r->listed: Mk flags of scratch). */
static void query_row(const sta_attn_params *p, int64_t b, int64_t h, int64_t s, qrow *r) {
  if (p->mask == STA_MASK_WINDOW) {
    r->kind = row_coords(p, s, r->qc);
    return;
  }
  r->m = s / p->block_rows;
  r->kind = s % p->block_rows < valid_rows(p, p->q_sizes, r->m) ? 1 : -1;
  if (r->kind < 0) return;
  int64_t list = (b * p->heads + h) * p->q_blocks + r->m;
  memset(r->listed, 0, (size_t)p->kv_blocks);
  for (int32_t i = 0; i < p->num[list]; i++) r->listed[p->idx[list * p->list_len + i]] = 1;
}

/* Is key tile kn inside the window win of query tile qm (tile ids)? */
static int tile_member(const sta_attn_params *p, const int32_t *win, int64_t qm, int64_t kn) {
  const int64_t g[3] = {p->grid[0], p->grid[1], p->grid[2]};
  int64_t qc[3] = {qm / (g[1] * g[2]), (qm / g[2]) % g[1], qm % g[2]};
  int64_t kc[3] = {kn / (g[1] * g[2]), (kn / g[2]) % g[1], kn % g[2]};
  for (int i = 0; i < 3; i++)
    if (!axis_member(qc[i], kc[i], win[i], g[i])) return 0;
  return 1;
}

/* Does query row q attend to key row j (j < the rows of k)? */
static int is_key(const sta_attn_params *p, const int32_t *win, const qrow *q, int64_t j) {
  int64_t kc[3];
  if (q->kind < 0) return 0;
  if (p->mask != STA_MASK_WINDOW) {
    int64_t n = j / p->block_rows;
    if (j % p->block_rows >= valid_rows(p, p->kv_sizes, n)) return 0;
    return q->listed[n] ||
           (p->mask == STA_MASK_WINDOW_OR_BLOCKS && tile_member(p, win, q->m, n));
  }
  if (j >= p->video_rows + p->text_len) return 0;
  int kk = row_coords(p, j, kc);
  if (kk <= 0 || q->kind == 0) return kk >= 0;
  for (int i = 0; i < 3; i++) {
    int64_t c = (p->canvas[i] + p->tile[i] - 1) / p->tile[i];
    if (!axis_member(q->qc[i] / p->tile[i], kc[i] / p->tile[i], win[i], c)) return 0;
  }
  return 1;
}

/* Rows of k and v that may be keys. */
static int64_t key_rows(const sta_attn_params *p) {
  return p->mask == STA_MASK_WINDOW ? p->video_rows + p->text_len : p->kv_len;
}

sta_status sta_cpu_attention_reference(const sta_attn_params *p) {
  int64_t S = p->seq_len, D = p->head_dim, keys = key_rows(p);
  int64_t rows = p->batch * p->heads * S;
  int nt = sta_get_num_threads();
  size_t es = sta_dtype_size(p->dtype);
  size_t per = (size_t)(keys + 2 * D) + (size_t)(p->kv_blocks + 7) / 8;
  double *buf = sta_malloc(sizeof(double) * per * (size_t)nt);
  if (!buf) return sta_error(STA_ERR_NOMEM, "out of host memory (reference buffers)");
  int64_t skipped = 0; /* rows not run: cancelled (sta_cancel) */
  #pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    double *logit = buf + per * (size_t)tid, *acc = logit + keys, *qd = acc + D;
    qrow qr;
    qr.listed = (unsigned char *)(qd + D);
    #pragma omp for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
      if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
      int64_t b = r / (p->heads * S), h = (r / S) % p->heads, s = r % S;
      const int32_t *win = p->windows ? p->windows + 3 * h : NULL;
      const char *q = (const char *)p->q + (b * p->q_sb + s * p->q_ss + h * p->q_sh) * (int64_t)es;
      double m = -INFINITY;
      int64_t nkeys = 0;
      query_row(p, b, h, s, &qr);
      char *o = (char *)p->o + (b * p->o_sb + s * p->o_ss + h * p->o_sh) * (int64_t)es;
      if (qr.kind < 0) { /* a padding row: no keys */
        for (int64_t d = 0; d < D; d++) sta_store_f32(o + d * es, p->dtype, 0.0f);
        if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + s * p->lse_ss] = -INFINITY;
        continue;
      }
      for (int64_t d = 0; d < D; d++) qd[d] = sta_load_f32(q + d * es, p->dtype);
      for (int64_t j = 0; j < keys; j++) {
        /* -Inf marks "not a key" (a real -Inf logit has weight 0 anyway);
        ** NaN logits must reach the sum, so NaN inputs give NaN rows */
        if (!is_key(p, win, &qr, j)) { logit[j] = -INFINITY; continue; }
        const char *k = (const char *)p->k + (b * p->k_sb + j * p->k_ss + h * p->k_sh) * (int64_t)es;
        double dot = 0;
        nkeys++;
        for (int64_t d = 0; d < D; d++) dot += qd[d] * (double)sta_load_f32(k + d * es, p->dtype);
        logit[j] = dot * (double)p->scale;
        if (logit[j] > m) m = logit[j];
      }
      double l = 0;
      for (int64_t d = 0; d < D; d++) acc[d] = 0;
      if (nkeys == 0) { /* an empty block list: out 0, lse -inf */
        for (int64_t d = 0; d < D; d++) sta_store_f32(o + d * es, p->dtype, 0.0f);
        if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + s * p->lse_ss] = -INFINITY;
        continue;
      }
      for (int64_t j = 0; j < keys; j++) {
        if (logit[j] == -INFINITY) continue;
        double e = exp(logit[j] - m);
        l += e;
        const char *v = (const char *)p->v + (b * p->v_sb + j * p->v_ss + h * p->v_sh) * (int64_t)es;
        for (int64_t d = 0; d < D; d++) acc[d] += e * (double)sta_load_f32(v + d * es, p->dtype);
      }
      for (int64_t d = 0; d < D; d++) sta_store_f32(o + d * es, p->dtype, (float)(acc[d] / l));
      if (p->lse) p->lse[b * p->lse_sb + h * p->lse_sh + s * p->lse_ss] = (float)(m + log(l));
    }
  }
  free(buf);
  if (skipped) return sta_cancelled("attention reference");
  return STA_OK;
}

sta_status sta_cpu_head_diff(const sta_attn_params *p, float *l1, float *l2) {
  size_t es = sta_dtype_size(p->dtype);
  double n = (double)p->batch * (double)p->seq_len * (double)p->head_dim;
  for (int64_t h = 0; h < p->heads; h++) {
    double s1 = 0, s2 = 0;
    #pragma omp parallel for reduction(+ : s1, s2) schedule(static) num_threads(sta_get_num_threads())
    for (int64_t r = 0; r < p->batch * p->seq_len; r++) {
      int64_t b = r / p->seq_len, s = r % p->seq_len;
      const char *a = (const char *)p->q + (b * p->q_sb + s * p->q_ss + h * p->q_sh) * (int64_t)es;
      const char *c = (const char *)p->o + (b * p->o_sb + s * p->o_ss + h * p->o_sh) * (int64_t)es;
      float r1 = 0, r2 = 0;
      for (int64_t d = 0; d < p->head_dim; d++) {
        float x = sta_load_f32(a + d * es, p->dtype) - sta_load_f32(c + d * es, p->dtype);
        r1 += fabsf(x);
        r2 += x * x;
      }
      s1 += r1;
      s2 += r2;
    }
    l1[h] = n > 0 ? (float)(s1 / n) : 0.0f;
    l2[h] = n > 0 ? (float)(s2 / n) : 0.0f;
  }
  return STA_OK;
}

/* The gradient of sta_cpu_attention_reference (STA.md section 10), in
** double, from q, k, v and dout alone: each (batch, head) on one thread,
** its rows in order, dK and dV accumulated in double over every query row
** and stored once.  P is recomputed per row, exactly as the forward
** reference computes it. */
sta_status sta_cpu_attention_backward_reference(const sta_attn_params *p) {
  int64_t S = p->seq_len, D = p->head_dim, keys = key_rows(p), KS = p->kv_len;
  int nt = sta_get_num_threads();
  size_t es = sta_dtype_size(p->dtype);
  size_t per = (size_t)(2 * keys + 2 * keys * D + 4 * D) + (size_t)(p->kv_blocks + 7) / 8;
  double *buf = sta_malloc(sizeof(double) * per * (size_t)nt);
  if (!buf) return sta_error(STA_ERR_NOMEM, "out of host memory (backward reference buffers)");
  int64_t skipped = 0; /* (batch, head) pairs not run: cancelled (sta_cancel) */
#define ROW(base, sb, ss, sh, s) ((const char *)(base) + (b * (sb) + (s) * (ss) + h * (sh)) * (int64_t)es)
  #pragma omp parallel num_threads(nt)
  {
    int tid = omp_get_thread_num();
    double *pr = buf + per * (size_t)tid, *dpr = pr + keys, *dk = dpr + keys, *dv = dk + keys * D;
    double *qd = dv + keys * D, *dod = qd + D, *od = dod + D, *dq = od + D;
    qrow qr;
    qr.listed = (unsigned char *)(dq + D);
    #pragma omp for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < p->batch * p->heads; bh++) {
      if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
      int64_t b = bh / p->heads, h = bh % p->heads;
      const int32_t *win = p->windows ? p->windows + 3 * h : NULL;
      memset(dk, 0, sizeof(double) * (size_t)(2 * keys * D));
      for (int64_t s = 0; s < S; s++) {
        int64_t nkeys = 0;
        query_row(p, b, h, s, &qr);
        if (qr.kind < 0) { /* a padding row sees no keys: dq 0 */
          char *o = (char *)ROW(p->dq, p->dq_sb, p->dq_ss, p->dq_sh, s);
          for (int64_t d = 0; d < D; d++) sta_store_f32(o + d * es, p->dtype, 0.0f);
          continue;
        }
        for (int64_t d = 0; d < D; d++) {
          qd[d] = sta_load_f32(ROW(p->q, p->q_sb, p->q_ss, p->q_sh, s) + d * es, p->dtype);
          dod[d] = sta_load_f32(ROW(p->dout, p->do_sb, p->do_ss, p->do_sh, s) + d * es, p->dtype);
          od[d] = dq[d] = 0;
        }
        /* dpr[j] first marks the keys (1): a key's logit may be -inf too
        ** (an Inf in q), and with the row's sum NaN its P is NaN, not 0 */
        double m = -INFINITY, l = 0;
        for (int64_t j = 0; j < keys; j++) {
          dpr[j] = is_key(p, win, &qr, j);
          if (!dpr[j]) { pr[j] = -INFINITY; continue; }
          const char *kr = ROW(p->k, p->k_sb, p->k_ss, p->k_sh, j);
          double dot = 0;
          nkeys++;
          for (int64_t d = 0; d < D; d++) dot += qd[d] * (double)sta_load_f32(kr + d * es, p->dtype);
          pr[j] = dot * (double)p->scale;
          if (pr[j] > m) m = pr[j];
        }
        if (nkeys == 0) { /* an empty block list: dq 0 */
          char *o = (char *)ROW(p->dq, p->dq_sb, p->dq_ss, p->dq_sh, s);
          for (int64_t d = 0; d < D; d++) sta_store_f32(o + d * es, p->dtype, 0.0f);
          continue;
        }
        for (int64_t j = 0; j < keys; j++)
          if (pr[j] != -INFINITY) l += exp(pr[j] - m);
        /* P, O = P V, dP = dO . v_j, D_i = dO . O */
        for (int64_t j = 0; j < keys; j++) {
          if (!dpr[j]) { pr[j] = 0; continue; }
          pr[j] = pr[j] == -INFINITY && l > 0 ? 0 : exp(pr[j] - m) / l; /* l 0 or NaN: NaN */
          const char *vr = ROW(p->v, p->v_sb, p->v_ss, p->v_sh, j);
          double dp = 0;
          for (int64_t d = 0; d < D; d++) {
            double x = (double)sta_load_f32(vr + d * es, p->dtype);
            od[d] += pr[j] * x;
            dp += dod[d] * x;
          }
          dpr[j] = dp;
        }
        double di = 0;
        for (int64_t d = 0; d < D; d++) di += dod[d] * od[d];
        for (int64_t j = 0; j < keys; j++) {
          if (pr[j] == 0 && dpr[j] == 0) continue;
          double ds = pr[j] * (dpr[j] - di);
          const char *kr = ROW(p->k, p->k_sb, p->k_ss, p->k_sh, j);
          for (int64_t d = 0; d < D; d++) {
            dq[d] += ds * (double)sta_load_f32(kr + d * es, p->dtype);
            dk[j * D + d] += ds * qd[d];
            dv[j * D + d] += pr[j] * dod[d];
          }
        }
        char *o = (char *)ROW(p->dq, p->dq_sb, p->dq_ss, p->dq_sh, s);
        for (int64_t d = 0; d < D; d++)
          sta_store_f32(o + d * es, p->dtype, (float)(dq[d] * (double)p->scale));
      }
      for (int64_t j = 0; j < KS; j++) {
        char *ko = (char *)ROW(p->dk, p->dk_sb, p->dk_ss, p->dk_sh, j);
        char *vo = (char *)ROW(p->dv, p->dv_sb, p->dv_ss, p->dv_sh, j);
        for (int64_t d = 0; d < D; d++) {
          sta_store_f32(ko + d * es, p->dtype, j < keys ? (float)(dk[j * D + d] * (double)p->scale) : 0.0f);
          sta_store_f32(vo + d * es, p->dtype, j < keys ? (float)dv[j * D + d] : 0.0f);
        }
      }
    }
  }
#undef ROW
  free(buf);
  return skipped ? sta_cancelled("backward reference") : STA_OK;
}
