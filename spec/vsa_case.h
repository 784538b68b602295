/* vsa_case.h -- what the VSA tests (test_vsa.c, test_gpu_vsa.c) share: a
** random problem (cube sizes, q's own cube count, gate, layout, dtype),
** its tensors with NaN in every padding row (so a read of one shows), the
** coarse scores in double to keep away from near ties (where two correct
** backends may choose differently: STA.md section 12), and comparisons
** restricted to the valid rows, the check of a result against the
** reference's.  Header-only. */
#ifndef STA_VSA_CASE_H
#define STA_VSA_CASE_H

#include <math.h>

#include "test_util.h"

typedef struct vcase {
  int64_t B, H, D, mq, mk;
  int32_t br, topk;
  sta_dtype dtype;
  sta_layout layout;
  float scale;
  int gate;     /* a gate tensor */
  int sizes;    /* 0: whole cubes; 1: random sizes lo..br */
  int32_t lo;   /* smallest random size */
  int qown;     /* q has sizes of its own (always when mq != mk and sizes) */
  sta_device dev;
  int32_t canvas[3]; /* canvas[0] > 0: the sizes are this canvas's cubes' (cube by br) */
  uint64_t seed;
} vcase;

typedef struct vset {
  sta_tensor *q, *k, *v, *gate, *dout;      /* inputs */
  sta_tensor *out, *lse, *dq, *dk, *dv, *dg; /* outputs (NaN-filled) */
  sta_tensor *ks, *qs;                       /* i32 sizes or NULL */
  int32_t *ksz, *qsz;                        /* the sizes on the host, Mk and Mq */
  sta_vsa_desc d;
} vset;

static inline void vcase_init(vcase *c) {
  memset(c, 0, sizeof *c);
  c->B = 1; c->H = 2; c->D = 16; c->mq = c->mk = 6;
  c->br = 64; c->topk = 2;
  c->dtype = STA_F32;
  c->sizes = 1; c->lo = 16;
  c->dev = STA_CPU;
  c->seed = 1;
}

/* [B, S, H, D] in c's layout on c's device. */
static inline sta_tensor *vsa_t4(const vcase *c, int64_t S, sta_dtype dt) {
  int64_t shape[4] = {c->B, c->layout == STA_BSHD ? S : c->H, c->layout == STA_BSHD ? c->H : S,
                      c->D};
  sta_tensor *t = NULL;
  if (sta_tensor_create(&t, dt, c->dev, 4, shape) != STA_OK) fail_msg("%s", sta_last_error());
  return t;
}

static inline sta_tensor *vsa_i32(const vcase *c, int64_t n, const int32_t *v) {
  sta_tensor *t = NULL, *h = NULL;
  if (sta_tensor_wrap(&h, (void *)v, STA_I32, STA_CPU, 1, &n, NULL) != STA_OK ||
      sta_tensor_create(&t, STA_I32, c->dev, 1, &n) != STA_OK || sta_tensor_copy(t, h) != STA_OK)
    fail_msg("i32 tensor: %s", sta_last_error());
  sta_tensor_destroy(h);
  return t;
}

/* Rows [m*br + size, (m+1)*br) of every cube of t set to value. */
static inline void vsa_fill_pad(const vcase *c, sta_tensor *t, int64_t M, const int32_t *sz,
                                double value) {
  for (int64_t m = 0; m < M; m++) {
    if (sz[m] == c->br) continue;
    sta_tensor *rows = NULL;
    if (sta_tensor_narrow(&rows, t, c->layout == STA_BSHD ? 1 : 2, m * c->br + sz[m],
                          c->br - sz[m]) != STA_OK ||
        sta_tensor_fill(rows, value) != STA_OK)
      fail_msg("padding: %s", sta_last_error());
    sta_tensor_destroy(rows);
  }
}

/* The cube (4x4x4 or 4x8x8) of br rows, and the valid tokens of each cube
** of a canvas, written out: the product of the cube's clipped extents. */
static inline void vsa_cube_of(int32_t br, int32_t cube[3]) {
  cube[0] = 4;
  cube[1] = cube[2] = br == 256 ? 8 : 4;
}
static inline int64_t vsa_canvas_sizes(const int32_t cv[3], int32_t br, int32_t *sz) {
  int32_t cb[3];
  int64_t n = 0;
  vsa_cube_of(br, cb);
  for (int32_t t = 0; t < cv[0]; t += cb[0])
    for (int32_t h = 0; h < cv[1]; h += cb[1])
      for (int32_t w = 0; w < cv[2]; w += cb[2]) {
        const int32_t a = cv[0] - t < cb[0] ? cv[0] - t : cb[0];
        const int32_t b = cv[1] - h < cb[1] ? cv[1] - h : cb[1];
        const int32_t e = cv[2] - w < cb[2] ? cv[2] - w : cb[2];
        if (sz) sz[n] = a * b * e;
        n++;
      }
  return n;
}

static inline void vset_make(vset *s, const vcase *c) {
  memset(s, 0, sizeof *s);
  s->ksz = malloc(sizeof(int32_t) * (size_t)c->mk);
  s->qsz = malloc(sizeof(int32_t) * (size_t)c->mq);
  if (!s->ksz || !s->qsz) fail_msg("out of host memory (sizes of %lld cubes)", (long long)c->mk);
  uint64_t r = c->seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t m = 0; m < c->mk; m++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    s->ksz[m] = c->sizes ? c->lo + (int32_t)((r >> 33) % (uint64_t)(c->br - c->lo + 1)) : c->br;
  }
  if (c->canvas[0] > 0) {
    if (vsa_canvas_sizes(c->canvas, c->br, NULL) != c->mk) fail_msg("canvas: not Mk cubes");
    vsa_canvas_sizes(c->canvas, c->br, s->ksz);
  }
  const int qown = c->sizes && (c->qown || c->mq != c->mk);
  for (int64_t m = 0; m < c->mq; m++) {
    r = r * 6364136223846793005ull + 1442695040888963407ull;
    s->qsz[m] = qown ? c->lo + (int32_t)((r >> 33) % (uint64_t)(c->br - c->lo + 1))
                     : c->sizes && c->mq == c->mk ? s->ksz[m] : c->br;
  }
  const int64_t sq = c->mq * c->br, sk = c->mk * c->br;
  s->q = vsa_t4(c, sq, c->dtype); s->k = vsa_t4(c, sk, c->dtype); s->v = vsa_t4(c, sk, c->dtype);
  s->dout = vsa_t4(c, sq, c->dtype);
  if (c->gate) s->gate = vsa_t4(c, sq, c->dtype);
  sta_tensor *in[5] = {s->q, s->k, s->v, s->dout, s->gate};
  for (int i = 0; i < 5; i++) {
    if (!in[i]) continue;
    if (sta_tensor_randn(in[i], c->seed * 16 + (uint64_t)i, i == 4 ? 0.5 : 0.0, 1.0) != STA_OK)
      fail_msg("%s", sta_last_error());
    const int kv = i == 1 || i == 2;
    vsa_fill_pad(c, in[i], kv ? c->mk : c->mq, kv ? s->ksz : s->qsz, NAN);
  }
  s->out = vsa_t4(c, sq, c->dtype); s->dq = vsa_t4(c, sq, c->dtype);
  s->dk = vsa_t4(c, sk, c->dtype); s->dv = vsa_t4(c, sk, c->dtype);
  if (c->gate) s->dg = vsa_t4(c, sq, c->dtype);
  int64_t ls[3] = {c->B, c->H, sq};
  if (sta_tensor_create(&s->lse, STA_F32, c->dev, 3, ls) != STA_OK) fail_msg("%s", sta_last_error());
  sta_tensor *o[6] = {s->out, s->dq, s->dk, s->dv, s->dg, s->lse};
  for (int i = 0; i < 6; i++)
    if (o[i]) (void)sta_tensor_fill(o[i], NAN);
  if (c->sizes) {
    s->ks = vsa_i32(c, c->mk, s->ksz);
    if (qown) s->qs = vsa_i32(c, c->mq, s->qsz);
  }
  s->d.layout = c->layout;
  s->d.block_rows = c->br;
  s->d.topk = c->topk;
  s->d.scale = c->scale;
  s->d.kv_sizes = s->ks;
  s->d.q_sizes = s->qs;
}

static inline void vset_free(vset *s) {
  sta_tensor *t[13] = {s->q, s->k, s->v, s->gate, s->dout, s->out, s->lse,
                       s->dq, s->dk, s->dv, s->dg, s->ks, s->qs};
  for (int i = 0; i < 13; i++) sta_tensor_destroy(t[i]);
  free(s->ksz);
  free(s->qsz);
  memset(s, 0, sizeof *s);
}

/* Key cube `to` of s made a copy of key cube `from` (rows, padding included). */
static inline void vsa_copy_cube(const vcase *c, vset *s, int64_t from, int64_t to) {
  sta_tensor *a = NULL, *b = NULL;
  const int32_t dim = c->layout == STA_BSHD ? 1 : 2;
  if (sta_tensor_narrow(&a, s->k, dim, from * c->br, c->br) != STA_OK ||
      sta_tensor_narrow(&b, s->k, dim, to * c->br, c->br) != STA_OK || sta_tensor_copy(b, a) != STA_OK)
    fail_msg("copy of cube %lld: %s", (long long)from, sta_last_error());
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
}

/* Element (b, row, h, d) of a 4-D tensor in c's layout (host or device). */
static inline double vsa_at(const vcase *c, const sta_tensor *t, int64_t b, int64_t row, int64_t h,
                            int64_t d) {
  int64_t at[4] = {b, c->layout == STA_BSHD ? row : h, c->layout == STA_BSHD ? h : row, d};
  double x = NAN;
  if (sta_tensor_get(t, at, &x) != STA_OK) fail_msg("get: %s", sta_last_error());
  return x;
}

/* The coarse scores of (b, h) in double: s[m * mk + n]. */
static inline void vsa_scores(const vcase *c, const vset *s, int64_t b, int64_t h, double *sc) {
  double *qc = calloc((size_t)(c->mq * c->D), sizeof(double));
  double *kc = calloc((size_t)(c->mk * c->D), sizeof(double));
  for (int64_t m = 0; m < c->mq; m++)
    for (int64_t r = 0; r < s->qsz[m]; r++)
      for (int64_t d = 0; d < c->D; d++)
        qc[m * c->D + d] += vsa_at(c, s->q, b, m * c->br + r, h, d) / s->qsz[m];
  for (int64_t n = 0; n < c->mk; n++)
    for (int64_t r = 0; r < s->ksz[n]; r++)
      for (int64_t d = 0; d < c->D; d++)
        kc[n * c->D + d] += vsa_at(c, s->k, b, n * c->br + r, h, d) / s->ksz[n];
  for (int64_t m = 0; m < c->mq; m++)
    for (int64_t n = 0; n < c->mk; n++) {
      double x = 0;
      for (int64_t d = 0; d < c->D; d++) x += qc[m * c->D + d] * kc[n * c->D + d];
      sc[m * c->mk + n] = x;
    }
  free(qc);
  free(kc);
}

static int vsa_cmp_desc(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x < y) - (x > y);
}

/* The smallest gap, relative to the row's largest |score|, between the
** topk-th and the next score of any row (1 when topk = mk).  Below ~1e-4
** the float32 scores of a fast path may order them otherwise. */
static inline double vsa_margin(const vcase *c, const vset *s) {
  if (c->topk >= c->mk) return 1;
  double worst = INFINITY, *sc = malloc(sizeof(double) * (size_t)(c->mq * c->mk));
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++) {
      vsa_scores(c, s, b, h, sc);
      for (int64_t m = 0; m < c->mq; m++) {
        double *row = sc + m * c->mk, big = 0;
        qsort(row, (size_t)c->mk, sizeof(double), vsa_cmp_desc);
        for (int64_t n = 0; n < c->mk; n++) big = fmax(big, fabs(row[n]));
        const double gap = (row[c->topk - 1] - row[c->topk]) / (big > 0 ? big : 1);
        if (gap < worst) worst = gap;
      }
    }
  free(sc);
  return worst;
}

/* Draw c's seed until the selection is clear of near ties (margin > 1e-3);
** s made for it. */
static inline void vset_make_clear(vset *s, vcase *c) {
  for (int tries = 0; tries < 40; tries++, c->seed += 1000003) {
    vset_make(s, c);
    if (vsa_margin(c, s) > 1e-3) return;
    vset_free(s);
  }
  fail_msg("no seed without near ties in 40 draws");
}

/* rel L2 and max |a - b| over the valid rows of two 4-D tensors of q's
** (kv 0) or k's (kv 1) rows; NaN anywhere there makes rel NaN. */
static inline double vsa_rel(const vcase *c, const vset *s, const sta_tensor *a,
                             const sta_tensor *b, int kv, double *maxabs) {
  const int64_t M = kv ? c->mk : c->mq;
  const int32_t *sz = kv ? s->ksz : s->qsz;
  double num = 0, den = 0, mx = 0;
  for (int64_t bb = 0; bb < c->B; bb++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t r = 0; r < sz[m]; r++)
        for (int64_t h = 0; h < c->H; h++)
          for (int64_t d = 0; d < c->D; d++) {
            const double x = vsa_at(c, a, bb, m * c->br + r, h, d),
                         y = vsa_at(c, b, bb, m * c->br + r, h, d);
            num += (x - y) * (x - y);
            den += y * y;
            if (!(fabs(x - y) <= mx)) mx = fabs(x - y);
          }
  if (maxabs) *maxabs = mx;
  return sqrt(num / (den > 0 ? den : 1));
}

/* Every padding row of t (q's rows, or k's when kv) is exactly 0. */
static inline void vsa_pad_zero(const vcase *c, const vset *s, const sta_tensor *t, int kv,
                                const char *name) {
  const int64_t M = kv ? c->mk : c->mq;
  const int32_t *sz = kv ? s->ksz : s->qsz;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t m = 0; m < M; m++)
      for (int64_t r = sz[m]; r < c->br; r++)
        for (int64_t h = 0; h < c->H; h++)
          for (int64_t d = 0; d < c->D; d++)
            if (vsa_at(c, t, b, m * c->br + r, h, d) != 0.0)
              fail_msg("%s: padding row %lld (cube %lld) = %g, expected 0", name,
                       (long long)(m * c->br + r), (long long)m,
                       vsa_at(c, t, b, m * c->br + r, h, d));
}

/* max |lse_a - lse_b| over valid rows; padding rows must be -inf in a. */
static inline double vsa_lse_diff(const vcase *c, const vset *s, const sta_tensor *a,
                                  const sta_tensor *b) {
  double mx = 0;
  for (int64_t bb = 0; bb < c->B; bb++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t m = 0; m < c->mq; m++)
        for (int64_t r = 0; r < c->br; r++) {
          int64_t at[3] = {bb, h, m * c->br + r};
          double x, y;
          if (sta_tensor_get(a, at, &x) != STA_OK || sta_tensor_get(b, at, &y) != STA_OK)
            fail_msg("lse: %s", sta_last_error());
          if (r >= s->qsz[m]) {
            if (!(x == -INFINITY)) fail_msg("lse of padding row %lld = %g", (long long)at[2], x);
            continue;
          }
          if (!(fabs(x - y) <= mx)) mx = fabs(x - y);
        }
  return mx;
}

/* One line naming case c (a static buffer). */
static inline const char *vsa_describe(const vcase *c) {
  static char buf[256];
  snprintf(buf, sizeof buf,
           "B%lld H%lld D%lld Mq %lld Mk %lld cubes of %d topk %d %s layout %d gate %d sizes %d "
           "qown %d scale %g seed %llu", (long long)c->B, (long long)c->H, (long long)c->D,
           (long long)c->mq, (long long)c->mk, c->br, c->topk, sta_dtype_name(c->dtype),
           (int)c->layout, c->gate, c->sizes, c->qown, (double)c->scale,
           (unsigned long long)c->seed);
  return buf;
}

/* The reference's set r: the inputs of s (on the host) as f32 (f16 and
** bf16 widen exactly); *c32 its case. */
static inline void vsa_widen(const vcase *c, const vset *s, vcase *c32, vset *r) {
  *c32 = *c;
  c32->dtype = STA_F32;
  c32->dev = STA_CPU;
  vset_make(r, c32);
  sta_tensor *from[5] = {s->q, s->k, s->v, s->gate, s->dout}, *to[5] = {r->q, r->k, r->v, r->gate, r->dout};
  for (int i = 0; i < 5; i++)
    if (from[i] && sta_tensor_copy(to[i], from[i]) != STA_OK) fail_msg("widen: %s", sta_last_error());
}

/* Results got (host tensors: out, dq, dk, dv, dgate, lse; NULL where not
** computed) against the reference's want: rel L2 over the valid rows below
** ftol (out) and btol (the gradients), lse within ltol, every padding row
** 0 (lse -inf).  who names the results in a failure. */
static inline void vsa_check(const vcase *c, const vset *s, const sta_tensor *const got[6],
                             const sta_tensor *const want[6], double ftol, double btol,
                             double ltol, const char *who) {
  static const char *const N[5] = {"out", "dq", "dk", "dv", "dgate"};
  for (int i = 0; i < 5; i++) {
    if (!got[i]) continue;
    const int kv = i == 2 || i == 3;
    double mx, rel = vsa_rel(c, s, got[i], want[i], kv, &mx);
    const double tol = i ? btol : ftol;
    if (getenv("STA_TEST_VERBOSE")) printf("# %s %s rel %.3g\n", who, N[i], rel);
    if (!(rel < tol))
      fail_msg("%s %s: rel L2 %g (max %g), tolerance %g: %s", who, N[i], rel, mx, tol,
               vsa_describe(c));
    vsa_pad_zero(c, s, got[i], kv, N[i]);
  }
  if (got[5]) {
    const double dl = vsa_lse_diff(c, s, got[5], want[5]);
    if (!(dl < ltol))
      fail_msg("%s lse: max diff %g, tolerance %g: %s", who, dl, ltol, vsa_describe(c));
  }
}

#endif
