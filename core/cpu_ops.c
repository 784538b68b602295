/*
** cpu_ops.c -- the host loops of the operations on tensors (core/ops.c
** checks the operands and calls them for host tensors; kernels/
** ops_elementwise.cu and ops_stats.cu are the CUDA side): copies and
** conversions, fills, random normals, a*x + b*y, stats.  Work items of
** CHUNK elements over the common iteration space (sta_iter_init,
** core/tensor.c), OpenMP-parallel, results independent of the thread
** count.  Calls core/tensor.c only.
*/
#include <stdlib.h>

#include "internal.h"

/* ---- host loops ----------------------------------------------------------- */

#define CHUNK 4096 /* elements per work item of the host loops */

enum { OP_COPY, OP_FILL, OP_RANDN, OP_LINCOMB, OP_STATS };

typedef struct host_job {
  sta_iter it;
  int op;
  float a, b, shift;   /* lincomb; stats: the shift */
  double mean, std;    /* randn (mean: also the fill value) */
  uint64_t seed;
} host_job;

typedef struct stats_part {
  double s1, s2;       /* sums of (x - shift) and its square, finite x */
  float lo, hi;
  int64_t bad;
} stats_part;

static void load_row(float *dst, const char *p, int64_t st, int32_t dt, int64_t n) {
  if (dt == STA_F32) {
    const float *s = (const float *)p;
    if (st == 1) memcpy(dst, s, (size_t)n * sizeof *dst);
    else for (int64_t i = 0; i < n; i++) dst[i] = s[i * st];
  } else if (dt == STA_F16) {
    const uint16_t *s = (const uint16_t *)p;
    for (int64_t i = 0; i < n; i++) dst[i] = sta_f16_to_f32(s[i * st]);
  } else if (dt == STA_F8E4M3) {
    const uint8_t *s = (const uint8_t *)p;
    for (int64_t i = 0; i < n; i++) dst[i] = sta_e4m3_to_f32(s[i * st]);
  } else {
    const uint16_t *s = (const uint16_t *)p;
    int64_t i = 0;
    if (st == 1) /* blocks of 8: gcc -O2 vectorises a loop of constant trips */
      for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) dst[i + k] = sta_bf16_to_f32(s[i + k]);
    for (; i < n; i++) dst[i] = sta_bf16_to_f32(s[i * st]);
  }
}

static void store_row(char *p, int64_t st, int32_t dt, const float *src, int64_t n) {
  if (dt == STA_F32) {
    float *d = (float *)p;
    if (st == 1) memcpy(d, src, (size_t)n * sizeof *src);
    else for (int64_t i = 0; i < n; i++) d[i * st] = src[i];
  } else if (dt == STA_F16) {
    uint16_t *d = (uint16_t *)p;
    for (int64_t i = 0; i < n; i++) d[i * st] = sta_f32_to_f16(src[i]);
  } else if (dt == STA_F8E4M3) {
    uint8_t *d = (uint8_t *)p;
    for (int64_t i = 0; i < n; i++) d[i * st] = sta_f32_to_e4m3(src[i]);
  } else {
    uint16_t *d = (uint16_t *)p;
    int64_t i = 0;
    if (st == 1)
      for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) d[i + k] = sta_f32_to_bf16(src[i + k]);
    for (; i < n; i++) d[i * st] = sta_f32_to_bf16(src[i]);
  }
}

/* Same dtype: the elements' bits, no conversion (NaN payloads kept). */
static void raw_row(char *d, int64_t ds, const char *s, int64_t ss, size_t es, int64_t n) {
  if (ds == 1 && ss == 1) memcpy(d, s, (size_t)n * es);
  else if (es == 4)
    for (int64_t i = 0; i < n; i++) ((uint32_t *)d)[i * ds] = ((const uint32_t *)s)[i * ss];
  else if (es == 1)
    for (int64_t i = 0; i < n; i++) ((uint8_t *)d)[i * ds] = ((const uint8_t *)s)[i * ss];
  else
    for (int64_t i = 0; i < n; i++) ((uint16_t *)d)[i * ds] = ((const uint16_t *)s)[i * ss];
}

double sta_randn_at(uint64_t seed, uint64_t i) {
  double even, odd;
  sta_randn_pair(seed, i >> 1, &even, &odd);
  return (i & 1) ? odd : even;
}

/* Draws g .. g+n-1 of the job's stream as stored values. */
static void randn_row(float *dst, const host_job *j, uint64_t g, int64_t n) {
  int64_t i = 0;
  double e, o;
  if (n > 0 && (g & 1)) { /* odd start: the second of a pair */
    sta_randn_pair(j->seed, g >> 1, &e, &o);
    dst[i++] = sta_randn_value(o, j->mean, j->std);
  }
  for (; i + 1 < n; i += 2) {
    sta_randn_pair(j->seed, (g + (uint64_t)i) >> 1, &e, &o);
    dst[i] = sta_randn_value(e, j->mean, j->std);
    dst[i + 1] = sta_randn_value(o, j->mean, j->std);
  }
  if (i < n) {
    sta_randn_pair(j->seed, (g + (uint64_t)i) >> 1, &e, &o);
    dst[i] = sta_randn_value(e, j->mean, j->std);
  }
}

/* Into s: n values, in 8 lanes (in blocks of 8: vectorised) merged in
** lane order, so the sums' order is fixed. */
static void stats_row(stats_part *s, const float *x, float shift, int64_t n) {
  double a1[8] = {0}, a2[8] = {0};
  float lo[8], hi[8];
  int64_t bad[8] = {0}, i = 0;
  for (int k = 0; k < 8; k++) { lo[k] = INFINITY; hi[k] = -INFINITY; }
  for (; i < n; i += 8)
    for (int k = 0; k < 8; k++) {
      int in = i + k < n; /* past the end: adds nothing, moves no bound */
      float v = in ? x[i + k] : 0.0f;
      int ok = in && isfinite(v);
      double d = ok ? (double)v - shift : 0.0;
      a1[k] += d;
      a2[k] += d * d;
      lo[k] = ok && v < lo[k] ? v : lo[k];
      hi[k] = ok && v > hi[k] ? v : hi[k];
      bad[k] += in && !ok;
    }
  for (int k = 0; k < 8; k++) {
    s->s1 += a1[k];
    s->s2 += a2[k];
    if (lo[k] < s->lo) s->lo = lo[k];
    if (hi[k] > s->hi) s->hi = hi[k];
    s->bad += bad[k];
  }
}

/* One run of n elements along the last dim, logical index g. */
static void host_segment(const host_job *j, char *const *p, int64_t g, int64_t n,
                         stats_part *part) {
  const sta_iter *it = &j->it;
  const int64_t *s0 = it->stride[0], *s1 = it->stride[1], *s2 = it->stride[2];
  float x[CHUNK], y[CHUNK];
  int32_t dt = it->dtype[0];
  switch (j->op) {
  case OP_COPY:
    if (it->dtype[0] == it->dtype[1])
      raw_row(p[0], s0[3], p[1], s1[3], sta_dtype_size((sta_dtype)dt), n);
    else {
      load_row(x, p[1], s1[3], it->dtype[1], n);
      store_row(p[0], s0[3], dt, x, n);
    }
    break;
  case OP_FILL: { /* the value's bits once, then copies of them, by element size */
    unsigned char bits[4] = {0, 0, 0, 0};
    uint32_t w4;
    uint16_t w2;
    sta_store_f32(bits, dt, (float)j->mean);
    memcpy(&w4, bits, 4);
    memcpy(&w2, bits, 2);
    switch (sta_dtype_size((sta_dtype)dt)) {
    case 4: for (int64_t i = 0; i < n; i++) ((uint32_t *)p[0])[i * s0[3]] = w4; break;
    case 2: for (int64_t i = 0; i < n; i++) ((uint16_t *)p[0])[i * s0[3]] = w2; break;
    default: for (int64_t i = 0; i < n; i++) ((uint8_t *)p[0])[i * s0[3]] = bits[0]; break;
    }
    break;
  }
  case OP_RANDN:
    randn_row(x, j, (uint64_t)g, n);
    store_row(p[0], s0[3], dt, x, n);
    break;
  case OP_LINCOMB:
    load_row(x, p[1], s1[3], it->dtype[1], n);
    if (it->nops > 2) {
      load_row(y, p[2], s2[3], it->dtype[2], n);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) { /* one rounding each, as on the device */
          float ax = j->a * x[i + k];
          float by = j->b * y[i + k];
          x[i + k] = ax + by;
        }
      for (; i < n; i++) {
        float ax = j->a * x[i];
        float by = j->b * y[i];
        x[i] = ax + by;
      }
    } else
      for (int64_t i = 0; i < n; i++) x[i] = j->a * x[i];
    store_row(p[0], s0[3], dt, x, n);
    break;
  default: /* OP_STATS */
    load_row(x, p[0], s0[3], dt, n);
    stats_row(part, x, j->shift, n);
    break;
  }
}

/* Work item c: logical elements [c*CHUNK, (c+1)*CHUNK), row by row. */
static void host_item(const host_job *j, int64_t c, stats_part *part) {
  const sta_iter *it = &j->it;
  int64_t g = c * CHUNK, end = g + CHUNK < it->numel ? g + CHUNK : it->numel;
  while (g < end) {
    int64_t i3 = g % it->shape[3], r = g / it->shape[3];
    int64_t i2 = r % it->shape[2];
    r /= it->shape[2];
    int64_t i1 = r % it->shape[1], i0 = r / it->shape[1];
    int64_t n = it->shape[3] - i3 < end - g ? it->shape[3] - i3 : end - g;
    char *p[STA_ITER_OPS];
    for (int32_t k = 0; k < it->nops; k++) {
      const int64_t *st = it->stride[k];
      p[k] = it->data[k] + (i0 * st[0] + i1 * st[1] + i2 * st[2] + i3 * st[3]) *
                               (int64_t)sta_dtype_size((sta_dtype)it->dtype[k]);
    }
    host_segment(j, p, g, n, part);
    g += n;
  }
}

/* Run j over all elements; parts: one per work item (stats) or NULL. */
static void host_run(const host_job *j, stats_part *parts) {
  int64_t items = (j->it.numel + CHUNK - 1) / CHUNK;
  #pragma omp parallel for schedule(static) if (items > 16)
  for (int64_t c = 0; c < items; c++) host_item(j, c, parts ? parts + c : NULL);
}

static void host_job_init(host_job *j, int op, int32_t nops, const sta_tensor *const *t) {
  memset(j, 0, sizeof *j);
  j->op = op;
  sta_iter_init(&j->it, nops, t);
}

void sta_host_copy(sta_tensor *dst, const sta_tensor *src) {
  const sta_tensor *t[2] = {dst, src};
  host_job j;
  host_job_init(&j, OP_COPY, 2, t);
  host_run(&j, NULL);
}

void sta_host_fill(sta_tensor *t, double value) {
  const sta_tensor *tt[1] = {t};
  host_job j;
  host_job_init(&j, OP_FILL, 1, tt);
  j.mean = value;
  host_run(&j, NULL);
}

void sta_host_randn(sta_tensor *t, uint64_t seed, double mean, double std) {
  const sta_tensor *tt[1] = {t};
  host_job j;
  host_job_init(&j, OP_RANDN, 1, tt);
  j.seed = seed;
  j.mean = mean;
  j.std = std;
  host_run(&j, NULL);
}

void sta_host_lincomb(sta_tensor *out, float a, const sta_tensor *x, float b,
                      const sta_tensor *y) {
  const sta_tensor *t[3] = {out, x, y};
  host_job j;
  host_job_init(&j, OP_LINCOMB, y ? 3 : 2, t);
  j.a = a;
  j.b = b;
  host_run(&j, NULL);
}

/* The shift of the stats sums: element 0 when finite (sums of deviations
** from a value of the data keep the variance accurate), else 0. */
static float stats_shift(const sta_tensor *t) {
  float v = sta_load_f32(sta_tensor_data(t), t->dtype);
  return isfinite(v) ? v : 0.f;
}

sta_status sta_host_stats(const sta_tensor *t, sta_stats *out) {
  const sta_tensor *tt[1] = {t};
  host_job j;
  host_job_init(&j, OP_STATS, 1, tt);
  j.shift = stats_shift(t);
  int64_t items = (j.it.numel + CHUNK - 1) / CHUNK;
  stats_part *parts = sta_malloc((size_t)items * sizeof *parts);
  if (!parts) return sta_error(STA_ERR_NOMEM, "stats: out of host memory");
  for (int64_t c = 0; c < items; c++) {
    parts[c].s1 = parts[c].s2 = 0;
    parts[c].lo = INFINITY;
    parts[c].hi = -INFINITY;
    parts[c].bad = 0;
  }
  host_run(&j, parts);
  /* merged in item order: the same bits for any thread count */
  double s1 = 0, s2 = 0;
  float lo = INFINITY, hi = -INFINITY;
  int64_t bad = 0;
  for (int64_t c = 0; c < items; c++) {
    s1 += parts[c].s1;
    s2 += parts[c].s2;
    if (parts[c].lo < lo) lo = parts[c].lo;
    if (parts[c].hi > hi) hi = parts[c].hi;
    bad += parts[c].bad;
  }
  free(parts);
  int64_t n = j.it.numel - bad;
  memset(out, 0, sizeof *out);
  out->count = n;
  out->nonfinite = bad;
  if (n > 0) {
    double m = s1 / (double)n, var = s2 / (double)n - m * m;
    out->mean = (double)j.shift + m;
    out->std = var > 0 ? sqrt(var) : 0;
    out->min = lo;
    out->max = hi;
  }
  return STA_OK;
}
