/*
** cpu_fp8.c -- STA_PRECISION_FP8 on the CPU: the quantize pre-pass exactly
** as the GPU runs it (kernels/fp8_quant.cu writes the same bits;
** spec/test_gpu_fp8.c compares them) and the attention over its 8-bit
** operands, one query row at a time in double.  The scheme is sta.h's
** (sta_precision) and fp8_internal.h's (sta_fp8_ops), chosen by
** research/fp8_sim.py; python/tests/test_fp8.py checks this file against
** that script's definition.  An emulation for tests and for measuring the
** scheme, not a fast path: every query row against each of its keys.
**
** What a kernel may differ in from this reference is only the order and
** width of its sums (float32 scores and ex2, Hopper's fp8 accumulator): P
** is taken against the running maximum over the kernel's own steps
** (key_rows: its walk, blocks of STA_FP8_BK in steps of sta_fp8_step(D):
** halves at D 128, whole blocks at D 64; sta_fp8_set_step_test: whole
** blocks at D 128, a kernel built with STA_FP8_HALF 0), as the kernel
** takes it, so each P's e4m3 code is the kernel's up to
** a rounding boundary.
*/
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "internal.h"

void sta_fp8_geom_init(sta_fp8_geom *g, const sta_attn_params *p) {
  memset(g, 0, sizeof *g);
  for (int i = 0; i < 3; i++) {
    g->canvas[i] = p->canvas[i];
    g->tile[i] = p->tile[i];
    g->grid[i] = p->grid[i];
  }
  g->tiled = p->tiled;
  g->video_len = p->video_len;
  g->video_rows = p->video_rows;
  g->tiled_video = (int64_t)p->grid[0] * p->grid[1] * p->grid[2] *
                   ((int64_t)p->tile[0] * p->tile[1] * p->tile[2]);
  g->rows = g->tiled_video + p->seq_len - p->video_rows;
  g->keys_end = g->tiled_video + p->text_len;
}

sta_status sta_fp8_ops_alloc(sta_fp8_ops *o, int64_t batch, int64_t heads, int64_t rows,
                             int64_t head_dim) {
  size_t bh = (size_t)(batch * heads), r = (size_t)rows, d = (size_t)head_dim;
  memset(o, 0, sizeof *o);
  o->batch = batch; o->heads = heads; o->rows = rows; o->head_dim = head_dim;
  o->q8 = sta_calloc(bh * r * d, 1);
  o->k8 = sta_calloc(bh * r * d, 1);
  o->v8 = sta_calloc(bh * d * r, 1);
  o->q_scale = sta_calloc(bh * r, sizeof(float));
  o->k_scale = sta_calloc(bh * r, sizeof(float));
  o->q_bias = sta_calloc(bh * r, sizeof(float));
  o->k_mean = sta_calloc(bh * d, sizeof(float));
  o->v_scale = sta_calloc(bh * d, sizeof(float));
  o->eq = sta_calloc(bh * d, 1);
  if (o->q8 && o->k8 && o->v8 && o->q_scale && o->k_scale && o->q_bias && o->k_mean &&
      o->v_scale && o->eq)
    return STA_OK;
  sta_fp8_ops_free(o);
  return STA_ERR_NOMEM;
}

void sta_fp8_ops_free(sta_fp8_ops *o) {
  free(o->q8); free(o->k8); free(o->v8);
  free(o->q_scale); free(o->k_scale); free(o->q_bias);
  free(o->k_mean); free(o->v_scale); free(o->eq);
  memset(o, 0, sizeof *o);
}

/* Element d of row s of head (b, h) of operand x (q, k or v of p). */
static inline float elem(const sta_attn_params *p, const void *x, int64_t sb, int64_t ss,
                         int64_t sh, int64_t b, int64_t s, int64_t h, int64_t d) {
  size_t es = sta_dtype_size(p->dtype);
  return sta_load_f32((const char *)x + (b * sb + s * ss + h * sh + d) * (int64_t)es, p->dtype);
}

/* The amax of x[0..D) (NaN if any is NaN). */
static float row_amax(const float *x, int64_t D) {
  float m = 0.0f;
  for (int64_t d = 0; d < D; d++) m = sta_amax_nan(m, x[d]);
  return m;
}

/* int8 codes and scale of x[0..D) (already equalized) coded with amax m. */
static void quantize_with(const float *x, int64_t D, float m, int8_t *code, float *scale) {
  float inv = sta_fp8_inv(127.0f, m);
  for (int64_t d = 0; d < D; d++) code[d] = sta_f32_to_i8(sta_fmul(x[d], inv));
  *scale = m / 127.0f;
}

/* Scratch of quantize_head per thread: 5*D floats, 2*D doubles, a key
** group's rows (STA_FP8_KGROUP * D floats) and their amaxes. */
#define QUANT_SCRATCH(D)                                                                      \
  ((size_t)(D) * (5 * sizeof(float) + 2 * sizeof(double)) +                                  \
   (size_t)STA_FP8_KGROUP * ((size_t)(D) + 1) * sizeof(float))

/* The pre-pass of one (batch, head); w: QUANT_SCRATCH(D) bytes. */
static void quantize_head(const sta_attn_params *p, const sta_fp8_geom *g, const sta_fp8_ops *o,
                          int64_t b, int64_t h, char *w) {
  int64_t D = p->head_dim, R = g->rows, bh = b * p->heads + h;
  float *k_mean = o->k_mean + bh * D, *v_scale = o->v_scale + bh * D;
  int8_t *eq = o->eq + bh * D;
  double *sum = (double *)w, *part = sum + D;
  float *x = (float *)(part + D), *qam = x + D, *kmax = qam + D, *kmin = kmax + D, *vam = kmin + D;
  int64_t count = 0;
  for (int64_t d = 0; d < D; d++) {
    sum[d] = 0; qam[d] = 0; vam[d] = 0; kmax[d] = -INFINITY; kmin[d] = INFINITY;
  }
  for (int64_t c0 = 0; c0 < R; c0 += STA_FP8_CHUNK) {
    for (int64_t d = 0; d < D; d++) part[d] = 0;
    for (int64_t r = c0; r < R && r < c0 + STA_FP8_CHUNK; r++) {
      int64_t s = sta_fp8_source(g, r);
      if (s < 0) continue;
      for (int64_t d = 0; d < D; d++)
        qam[d] = sta_amax_finite(qam[d], elem(p, p->q, p->q_sb, p->q_ss, p->q_sh, b, s, h, d));
      if (r >= g->keys_end) continue;
      count++;
      for (int64_t d = 0; d < D; d++) {
        float kv = elem(p, p->k, p->k_sb, p->k_ss, p->k_sh, b, s, h, d);
        part[d] += (double)sta_finite_or0(kv);
        if (kv > kmax[d] && kv < INFINITY) kmax[d] = kv;
        if (kv < kmin[d] && kv > -INFINITY) kmin[d] = kv;
        vam[d] = sta_amax_finite(vam[d], elem(p, p->v, p->v_sb, p->v_ss, p->v_sh, b, s, h, d));
      }
    }
    for (int64_t d = 0; d < D; d++) sum[d] += part[d];
  }
  for (int64_t d = 0; d < D; d++) {
    float mean = count > 0 ? (float)(sum[d] / (double)count) : 0.0f;
    float kam = sta_amax_nan(sta_amax_nan(0.0f, kmax[d] - mean), mean - kmin[d]);
    k_mean[d] = mean;
    eq[d] = (int8_t)sta_fp8_exponent(qam[d], kam);
    v_scale[d] = vam[d] / 448.0f;
    vam[d] = sta_fp8_inv(448.0f, vam[d]); /* now the inverse */
  }
  /* a group of STA_FP8_KGROUP rows at a time: its keys' k' rows (kx) and
  ** amaxes (ka; -1 for a row that is no key) first, then their codes with
  ** the group's amax (fp8_internal.h, sta_fp8_key_amax) */
  float *kx = vam + D, *ka = kx + STA_FP8_KGROUP * D;
  for (int64_t r0 = 0; r0 < R; r0 += STA_FP8_KGROUP) {
    int64_t r1 = r0 + STA_FP8_KGROUP < R ? r0 + STA_FP8_KGROUP : R;
    float gam = 0.0f;
    for (int64_t r = r0; r < r1; r++) {
      int64_t s = sta_fp8_source(g, r), row = bh * R + r;
      float *y = kx + (r - r0) * D;
      ka[r - r0] = -1.0f;
      if (s < 0) continue;
      double bias = 0;
      for (int64_t d = 0; d < D; d++) {
        float qv = elem(p, p->q, p->q_sb, p->q_ss, p->q_sh, b, s, h, d);
        bias += (double)qv * (double)k_mean[d];
        x[d] = sta_fmul(qv, sta_pow2f(eq[d]));
      }
      o->q_bias[row] = (float)bias;
      quantize_with(x, D, row_amax(x, D), o->q8 + row * D, &o->q_scale[row]);
      if (r >= g->keys_end) continue;
      for (int64_t d = 0; d < D; d++) {
        float kv = elem(p, p->k, p->k_sb, p->k_ss, p->k_sh, b, s, h, d);
        y[d] = sta_fmul(kv - k_mean[d], sta_pow2f(-eq[d]));
        o->v8[(bh * D + d) * R + r] =
            sta_fp8_vcode(elem(p, p->v, p->v_sb, p->v_ss, p->v_sh, b, s, h, d), vam[d]);
      }
      ka[r - r0] = row_amax(y, D);
      gam = sta_fp8_group_amax(gam, ka[r - r0]);
    }
    for (int64_t r = r0; r < r1; r++) {
      if (ka[r - r0] < 0.0f) continue; /* no key (NaN is one) */
      int64_t krow = bh * R + sta_fp8_kslot(r, R);
      quantize_with(kx + (r - r0) * D, D, sta_fp8_key_amax(ka[r - r0], gam), o->k8 + krow * D,
                    &o->k_scale[krow]);
    }
  }
}

sta_status sta_cpu_fp8_quantize(const sta_attn_params *p, sta_fp8_ops *o) {
  sta_fp8_geom g;
  sta_fp8_geom_init(&g, p);
  int64_t D = p->head_dim, heads = p->batch * p->heads;
  int nt = sta_get_num_threads();
  size_t per = QUANT_SCRATCH(D);
  char *buf = sta_malloc(per * (size_t)nt);
  if (!buf) return sta_error(STA_ERR_NOMEM, "out of host memory (fp8 quantize buffers)");
  #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t i = 0; i < heads; i++)
    quantize_head(p, &g, o, i / p->heads, i % p->heads,
                  buf + per * (size_t)omp_get_thread_num());
  free(buf);
  return STA_OK;
}

/* sta_fp8_set_step_test's keys a step at D 64 and at D 128, this
** thread's (0: the scheme's, sta_fp8_step) */
static _Thread_local int32_t fp8_step_test[2];

void sta_fp8_set_step_test(int32_t head_dim, int32_t keys) {
  if (keys != 0 && keys != STA_FP8_BK && keys != STA_FP8_STEP) return;
  for (int i = 0; i < 2; i++)
    if (head_dim == 0 || head_dim == (i ? 128 : 64)) fp8_step_test[i] = keys;
}

/* Key rows (quantized order) of query row i into keys, in the kernel's walk
** (kernels/producer_fp8.cuh, Fp8Walk): the window's runs of tiles along w,
** then the text keys (a text query: one run of every row below keys_end),
** each run cut into blocks of STA_FP8_BK rows, each block into steps of
** BK rows (sta_fp8_step: 64, its halves, at D 128, STA_FP8_BK, whole
** blocks, at D 64; or sta_fp8_set_step_test's); blk[j]: key j's step (counted
** over the runs).  Returns the count. */
static int64_t key_rows(const sta_attn_params *p, const sta_fp8_geom *g, int64_t h, int64_t i,
                        int64_t BK, int64_t *keys, int64_t *blk) {
  int64_t n = 0, base = 0, vol = (int64_t)g->tile[0] * g->tile[1] * g->tile[2];
  int32_t lo[3] = {0, 0, 0}, cnt[3] = {g->grid[0], g->grid[1], g->grid[2]};
  if (i >= g->tiled_video) {
    for (int64_t r = 0; r < g->keys_end; r++)
      if (sta_fp8_source(g, r) >= 0) { keys[n] = r; blk[n++] = r / BK; }
    return n;
  }
  int64_t t = i / vol, q[3] = {t / ((int64_t)g->grid[1] * g->grid[2]),
                               (t / g->grid[2]) % g->grid[1], t % g->grid[2]};
  for (int a = 0; a < 3; a++) { /* the rule: mask.h */
    cnt[a] = sta_window_span(p->windows[3 * h + a], g->grid[a]);
    lo[a] = sta_window_start((int32_t)q[a], cnt[a], g->grid[a]);
  }
  for (int32_t a = lo[0]; a < lo[0] + cnt[0]; a++)
    for (int32_t b = lo[1]; b < lo[1] + cnt[1]; b++) {
      const int64_t start = (((int64_t)a * g->grid[1] + b) * g->grid[2] + lo[2]) * vol,
                    len = (int64_t)cnt[2] * vol;
      for (int64_t r = start; r < start + len; r++)
        if (sta_fp8_source(g, r) >= 0) { keys[n] = r; blk[n++] = base + (r - start) / BK; }
      base += (len + BK - 1) / BK;
    }
  for (int64_t r = g->tiled_video; r < g->keys_end; r++) {
    keys[n] = r;
    blk[n++] = base + (r - g->tiled_video) / BK;
  }
  return n;
}

sta_status sta_cpu_fp8_attention(const sta_attn_params *p) {
  sta_fp8_geom g;
  sta_fp8_ops o;
  sta_fp8_geom_init(&g, p);
  int64_t D = p->head_dim, R = g.rows, H = p->heads;
  if (sta_fp8_ops_alloc(&o, p->batch, H, R, D) != STA_OK)
    return sta_error(STA_ERR_NOMEM, "out of host memory (fp8 operands)");
  sta_status rc = sta_cpu_fp8_quantize(p, &o);
  int nt = sta_get_num_threads();
  size_t per = (size_t)R * (sizeof(double) + 2 * sizeof(int64_t)) + 2 * (size_t)D * sizeof(double);
  char *buf = rc == STA_OK ? sta_malloc(per * (size_t)nt) : NULL;
  /* V8 of each key, [B*H][rows][D] (exact in float) */
  float *vv = rc == STA_OK ? sta_malloc(sizeof(float) * (size_t)(p->batch * H * R * D)) : NULL;
  if (rc == STA_OK && (!buf || !vv))
    rc = sta_error(STA_ERR_NOMEM, "out of host memory (fp8 buffers)");
  if (rc != STA_OK) { free(buf); free(vv); sta_fp8_ops_free(&o); return rc; }
  #pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t x = 0; x < p->batch * H * R; x++) {
    int64_t bh = x / R, r = x % R;
    const uint8_t *v8 = o.v8 + bh * D * R;
    for (int64_t d = 0; d < D; d++) vv[x * D + d] = sta_e4m3_to_f32(v8[d * R + r]);
  }
  size_t es = sta_dtype_size(p->dtype);
  double c = (double)p->scale * 1.4426950408889634; /* exp2 domain */
  const int32_t bk = fp8_step_test[D == 64 ? 0 : 1]; /* the caller's thread */
  const int64_t BK = bk ? bk : sta_fp8_step(D);
  int64_t skipped = 0, rows = p->batch * H * R;
  #pragma omp parallel num_threads(nt)
  {
    char *w = buf + per * (size_t)omp_get_thread_num();
    double *sc = (double *)w, *acc = sc + R, *bacc = acc + D;
    int64_t *keys = (int64_t *)(bacc + D), *blk = keys + R;
    #pragma omp for schedule(dynamic, 16)
    for (int64_t x = 0; x < rows; x++) {
      if (sta_cancel_requested()) { __atomic_add_fetch(&skipped, 1, __ATOMIC_RELAXED); continue; }
      int64_t bh = x / R, i = x % R, b = bh / H, h = bh % H, s = sta_fp8_source(&g, i);
      if (s < 0 && !g.tiled) continue;              /* padding: no input row */
      int64_t os = s < 0 ? i : s;
      char *out = (char *)p->o + (b * p->o_sb + os * p->o_ss + h * p->o_sh) * (int64_t)es;
      float *lse = p->lse ? p->lse + b * p->lse_sb + h * p->lse_sh + os * p->lse_ss : NULL;
      if (s < 0) { /* a padding row of the tiled order: no keys */
        for (int64_t d = 0; d < D; d++) sta_store_f32(out + d * (int64_t)es, p->dtype, 0.0f);
        if (lse) *lse = -INFINITY;
        continue;
      }
      const int8_t *q8 = o.q8 + (bh * R + i) * D;
      double qs = (double)o.q_scale[bh * R + i] * c, m = -INFINITY, l = 0;
      int64_t n = key_rows(p, &g, h, i, BK, keys, blk);
      for (int64_t j = 0; j < n; j++) {
        const int64_t kr = bh * R + sta_fp8_kslot(keys[j], R); /* the kernels' key layout */
        const int8_t *k8 = o.k8 + kr * D;
        int32_t dot = 0;
        for (int64_t d = 0; d < D; d++) dot += (int32_t)q8[d] * (int32_t)k8[d];
        sc[j] = (double)dot * qs * (double)o.k_scale[kr];
      }
      for (int64_t d = 0; d < D; d++) acc[d] = 0;
      for (int64_t j0 = 0, j1; j0 < n; j0 = j1) { /* block by block: the running max */
        double bm = m; /* the new running maximum (NaN scores do not move it) */
        for (j1 = j0; j1 < n && blk[j1] == blk[j0]; j1++) bm = sc[j1] > bm ? sc[j1] : bm;
        double alpha = m == -INFINITY ? 0.0 : exp2(m - bm), bl = 0;
        const double mref = bm == -INFINITY ? 0.0 : bm; /* the kernel's */
        m = bm;
        for (int64_t d = 0; d < D; d++) bacc[d] = 0;
        for (int64_t j = j0; j < j1; j++) {
          double pj = exp2(sc[j] - mref);
          double p8 = (double)sta_e4m3_to_f32(sta_f32_to_e4m3((float)pj * STA_FP8_PSCALE));
          const float *vk = vv + (bh * R + keys[j]) * D;
          bl += pj;
          for (int64_t d = 0; d < D; d++) bacc[d] += p8 * (double)vk[d];
        }
        l = l * alpha + bl;
        for (int64_t d = 0; d < D; d++) acc[d] = acc[d] * alpha + bacc[d];
      }
      const float *vs = o.v_scale + bh * D;
      for (int64_t d = 0; d < D; d++)
        sta_store_f32(out + d * (int64_t)es, p->dtype,
                      (float)(acc[d] / ((double)STA_FP8_PSCALE * l) * vs[d]));
      if (lse)
        *lse = (float)(log(l) + m * 0.6931471805599453 +
                       (double)p->scale * (double)o.q_bias[bh * R + i]);
    }
  }
  free(buf);
  free(vv);
  sta_fp8_ops_free(&o);
  if (skipped) return sta_cancelled("fp8 attention");
  return STA_OK;
}

sta_status sta_cpu_fp8_dequantize(float *dst, const sta_bshd *bd, const uint8_t *x8,
                                  const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                                  int per_row) {
  for (int64_t b = 0; b < bx->b; b++)
    for (int64_t s = 0; s < bx->s; s++)
      for (int64_t h = 0; h < bx->h; h++) {
        const uint8_t *xr = x8 + b * bx->sb + s * bx->ss + h * bx->sh;
        float *orow = dst + b * bd->sb + s * bd->ss + h * bd->sh;
        const float *sr = sc + b * sc_st[0] + h * sc_st[1];
        for (int64_t d = 0; d < bx->d; d++)
          orow[d * bd->sd] = sta_e4m3_to_f32(xr[d * bx->sd]) * sr[(per_row ? s : d) * sc_st[2]];
      }
  return STA_OK;
}
