/* fp8_prob.h -- what the host fp8 tests share (spec/test_fp8.c,
** spec/test_fp8_accuracy.c): a problem of random inputs of three kinds, its
** outputs, and the fp8 forward checked against the double reference. */
#ifndef STA_SPEC_FP8_PROB_H
#define STA_SPEC_FP8_PROB_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#ifndef OK
#define OK(call) assert_int_equal((call), STA_OK)
#endif

typedef struct prob {
  sta_attention_desc d;
  int32_t win[3 * 8];
  int64_t B, S, H, D;
  sta_tensor *q, *k, *v;
} prob;

/* A problem of canvas t x h x w (tile tt x th x tw), text rows, per-head
** windows win (n 1 or H), inputs of dtype in layout; kind 0 randn, 1
** DiT-like: a bias per channel shared by every row of q and of k, 4
** channels of k 10-30x larger, v with per-channel scales; 2 DiT-like as
** research/fp8_sim.py's "dit" draws it (one bias b ~ N(0, 2)
** shared by q, k and every row, then 4 channels of k times 20); 3 peaked
** (FastVideo's: every row a random direction, its norm from N(0.1, 10)). */
static inline void prob_make(prob *p, const int32_t cv[3], const int32_t tl[3], int64_t text,
                      int64_t text_len, int64_t B, int64_t H, int64_t D, int32_t n_win,
                      const int32_t *win, sta_dtype dt, sta_layout layout, sta_order order,
                      int kind, uint64_t seed) {
  memset(p, 0, sizeof *p);
  sta_geometry_init(&p->d.geom, cv[0], cv[1], cv[2]);
  for (int i = 0; i < 3; i++) p->d.geom.tile[i] = tl[i];
  p->d.geom.text_len = text_len;
  p->d.geom.order = order;
  p->d.layout = layout;
  p->d.n_windows = n_win;
  memcpy(p->win, win, sizeof(int32_t) * 3 * (size_t)n_win);
  p->d.windows = p->win;
  p->d.precision = STA_PRECISION_FP8;
  p->B = B; p->H = H; p->D = D;
  p->S = (order == STA_ORDER_TILED ? sta_geometry_video_rows(&p->d.geom)
                                   : sta_geometry_video_tokens(&p->d.geom)) + text;
  int64_t shape[4] = {B, layout == STA_BSHD ? p->S : H, layout == STA_BSHD ? H : p->S, D};
  sta_tensor *f[3];
  for (int i = 0; i < 3; i++) {
    OK(sta_tensor_create(&f[i], STA_F32, STA_CPU, 4, shape));
    OK(sta_tensor_randn(f[i], seed * 3 + (uint64_t)i, 0.0, 1.0));
  }
  if (kind == 1) {
    sta_tensor *g = NULL;
    int64_t gs[1] = {4 * D};
    OK(sta_tensor_create(&g, STA_F32, STA_CPU, 1, gs));
    OK(sta_tensor_randn(g, seed * 3 + 7, 0.0, 1.0));
    const float *r = sta_tensor_data(g);
    sta_bshd b;
    OK(sta_tensor_bshd(f[0], layout, "q", &b));
    for (int64_t x = 0; x < B * p->S * H; x++) {
      int64_t bb = x / (p->S * H), s = (x / H) % p->S, h = x % H;
      float *qr = (float *)sta_tensor_data(f[0]) + bb * b.sb + s * b.ss + h * b.sh;
      float *kr = (float *)sta_tensor_data(f[1]) + bb * b.sb + s * b.ss + h * b.sh;
      float *vr = (float *)sta_tensor_data(f[2]) + bb * b.sb + s * b.ss + h * b.sh;
      for (int64_t c = 0; c < D; c++) {
        qr[c] += r[c];
        kr[c] += r[D + c];
        vr[c] *= expf(0.5f * r[2 * D + c]);
      }
      for (int c = 0; c < 4; c++) {
        int64_t ch = (c * 37 + 5) % D;
        kr[ch] += (10.0f + 5.0f * (float)c) * (c & 1 ? -1.0f : 1.0f);
      }
    }
    sta_tensor_destroy(g);
  } else if (kind >= 2) {
    sta_tensor *g = NULL;
    int64_t gs[1] = {D + B * p->S * H * 3};
    OK(sta_tensor_create(&g, STA_F32, STA_CPU, 1, gs));
    OK(sta_tensor_randn(g, seed * 3 + 8, 0.0, 1.0));
    const float *r = sta_tensor_data(g);
    sta_bshd b;
    OK(sta_tensor_bshd(f[0], layout, "q", &b));
    for (int64_t x = 0; x < B * p->S * H; x++) {
      int64_t bb = x / (p->S * H), s = (x / H) % p->S, h = x % H;
      for (int i = 0; i < 3; i++) {
        float *row = (float *)sta_tensor_data(f[i]) + bb * b.sb + s * b.ss + h * b.sh;
        if (kind == 2 && i < 2) {
          for (int64_t c = 0; c < D; c++) row[c] += 2.0f * r[c];
          if (i == 1)
            for (int c = 0; c < 4; c++) row[(c * 37 + 5) % D] *= 20.0f;
        } else if (kind == 3) {
          double n2 = 0;
          for (int64_t c = 0; c < D; c++) n2 += (double)row[c] * row[c];
          float norm = 0.1f + 10.0f * r[D + 3 * x + i];
          for (int64_t c = 0; c < D; c++) row[c] = (float)(row[c] / sqrt(n2)) * norm;
        }
      }
    }
    sta_tensor_destroy(g);
  }
  sta_tensor **dst[3] = {&p->q, &p->k, &p->v};
  for (int i = 0; i < 3; i++) {
    OK(sta_tensor_to(dst[i], f[i], dt, STA_CPU));
    if (order == STA_ORDER_TILED) sta_test_fill_pad(*dst[i], &p->d.geom, layout, NAN);
    sta_tensor_destroy(f[i]);
  }
}

static inline void prob_free(prob *p) {
  sta_tensor_destroy(p->q); sta_tensor_destroy(p->k); sta_tensor_destroy(p->v);
}

static inline sta_tensor *new_like(const sta_tensor *t, sta_dtype dt, double fill) {
  sta_tensor *o = NULL;
  int64_t shape[4];
  for (int i = 0; i < sta_tensor_ndim(t); i++) shape[i] = sta_tensor_size(t, i);
  OK(sta_tensor_create(&o, dt, STA_CPU, sta_tensor_ndim(t), shape));
  OK(sta_tensor_fill(o, fill));
  return o;
}

static inline sta_tensor *new_lse(const prob *p, double fill) {
  sta_tensor *l = NULL;
  int64_t shape[3] = {p->B, p->H, p->S};
  OK(sta_tensor_create(&l, STA_F32, STA_CPU, 3, shape));
  OK(sta_tensor_fill(l, fill));
  return l;
}

/* rel L2 and cosine of a against b (host, any dtypes) over rows that are
** finite in b. */
static inline void rel_cos(const sta_tensor *a, const sta_tensor *b, double *rel, double *cos) {
  sta_tensor *x = NULL, *y = NULL;
  OK(sta_tensor_to(&x, a, STA_F32, STA_CPU));
  OK(sta_tensor_to(&y, b, STA_F32, STA_CPU));
  const float *u = sta_tensor_data(x), *w = sta_tensor_data(y);
  double e = 0, n2 = 0, m2 = 0, dot = 0;
  for (int64_t i = 0; i < sta_tensor_numel(x); i++) {
    if (!isfinite(w[i])) continue;
    e += ((double)u[i] - w[i]) * ((double)u[i] - w[i]);
    n2 += (double)w[i] * w[i];
    m2 += (double)u[i] * u[i];
    dot += (double)u[i] * w[i];
  }
  *rel = sqrt(e / n2);
  *cos = dot / sqrt(n2 * m2);
  sta_tensor_destroy(x);
  sta_tensor_destroy(y);
}

/* The fp8 forward of p against the double reference (native): rel L2 in
** [lo, hi], cosine >= cmin, lse within lse_tol; returns the rel L2. */
static inline double check_fp8(prob *p, sta_dtype out_dt, double lo, double hi, double cmin,
                        double lse_tol, const char *what) {
  sta_tensor *o = new_like(p->q, out_dt, NAN), *l = new_lse(p, NAN);
  OK(sta_attention_forward(&p->d, p->q, p->k, p->v, o, l));
  sta_attention_desc nd = p->d;
  nd.precision = STA_PRECISION_NATIVE;
  sta_tensor *qf = NULL, *kf = NULL, *vf = NULL;
  OK(sta_tensor_to(&qf, p->q, STA_F32, STA_CPU));
  OK(sta_tensor_to(&kf, p->k, STA_F32, STA_CPU));
  OK(sta_tensor_to(&vf, p->v, STA_F32, STA_CPU));
  sta_tensor *orf = new_like(qf, STA_F32, NAN), *lr = new_lse(p, NAN);
  OK(sta_attention_reference(&nd, qf, kf, vf, orf, lr));
  double rel, cos, lmax = 0;
  rel_cos(o, orf, &rel, &cos);
  const float *a = sta_tensor_data(l), *b = sta_tensor_data(lr);
  for (int64_t i = 0; i < sta_tensor_numel(l); i++) {
    if (isinf(b[i]) && a[i] == b[i]) continue; /* padding rows: -inf both */
    if (!(fabs((double)a[i] - b[i]) <= lmax)) lmax = fabs((double)a[i] - b[i]);
  }
  if (getenv("STA_TEST_VERBOSE"))
    print_message("%s: rel L2 %.4g, cosine %.6f, lse max diff %.4g\n", what, rel, cos, lmax);
  if (!(rel >= lo && rel <= hi && cos >= cmin && lmax <= lse_tol))
    fail_msg("%s: rel L2 %.4g (expected %g..%g), cosine %.6f (>= %g), lse max diff %.4g "
             "(<= %g)", what, rel, lo, hi, cos, cmin, lmax, lse_tol);
  sta_tensor_destroy(o); sta_tensor_destroy(l); sta_tensor_destroy(orf); sta_tensor_destroy(lr);
  sta_tensor_destroy(qf); sta_tensor_destroy(kf); sta_tensor_destroy(vf);
  return rel;
}

static const int32_t TILE[3] = {6, 8, 8}, W333[3] = {3, 3, 3};

#endif
