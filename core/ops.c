/*
** ops.c -- elementwise operations and reductions: the checks of the public
** calls (sta.h "Elementwise operations and reductions") and their host
** loops; device tensors go to the backend (kernels/ops_elementwise.cu and
** ops_stats.cu for CUDA).  Also sta_tensor_copy and _to (between devices
** and dtypes), _fill, _randn and _compare: ops.c calls tensor.c, never the
** other way.
*/
#include <float.h>
#include <stdlib.h>

#include "internal.h"

/* ---- the iteration space ------------------------------------------------ */

void sta_iter_init(sta_iter *it, int32_t nops, const sta_tensor *const *t) {
  int64_t sh[4], st[STA_ITER_OPS][4];
  int32_t n = 0;
  memset(it, 0, sizeof *it);
  it->nops = nops;
  it->numel = sta_tensor_numel(t[0]);
  for (int32_t k = 0; k < nops; k++) {
    it->data[k] = sta_tensor_data(t[k]);
    it->dtype[k] = (int32_t)t[k]->dtype;
  }
  for (int32_t d = 0; d < t[0]->ndim; d++) {
    int64_t size = t[0]->shape[d];
    int merge = n > 0;
    if (size == 1) continue;
    for (int32_t k = 0; k < nops && merge; k++)
      merge = st[k][n - 1] == t[k]->stride[d] * size;
    if (merge) {
      sh[n - 1] *= size;
      for (int32_t k = 0; k < nops; k++) st[k][n - 1] = t[k]->stride[d];
      continue;
    }
    sh[n] = size;
    for (int32_t k = 0; k < nops; k++) st[k][n] = t[k]->stride[d];
    n++;
  }
  if (n == 0) { /* one element */
    sh[0] = 1;
    for (int32_t k = 0; k < nops; k++) st[k][0] = 1;
    n = 1;
  }
  it->ndim = n;
  for (int32_t i = 0; i < 4; i++) {
    int32_t j = i - (4 - n);
    it->shape[i] = j < 0 ? 1 : sh[j];
    for (int32_t k = 0; k < nops; k++) it->stride[k][i] = j < 0 ? 0 : st[k][j];
  }
}

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
  case OP_FILL: { /* the value's bits once, then copies of them */
    uint32_t w = 0;
    sta_store_f32(&w, dt, (float)j->mean);
    if (dt == STA_F32)
      for (int64_t i = 0; i < n; i++) ((uint32_t *)p[0])[i * s0[3]] = w;
    else
      for (int64_t i = 0; i < n; i++) ((uint16_t *)p[0])[i * s0[3]] = (uint16_t)w;
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

static void host_lincomb(sta_tensor *out, float a, const sta_tensor *x, float b,
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

static sta_status host_stats(const sta_tensor *t, sta_stats *out) {
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

/* ---- checks -------------------------------------------------------------- */

static int same_view(const sta_tensor *a, const sta_tensor *b) {
  if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim) return 0;
  for (int32_t i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i]))
      return 0;
  return 1;
}

/* 1 when a and b may share an element without being the same view
** (their storage extents intersect). */
static int overlap(const sta_tensor *a, const sta_tensor *b) {
  int64_t alo, ahi, blo, bhi;
  if (a->storage != b->storage || sta_tensor_numel(a) == 0 || sta_tensor_numel(b) == 0 ||
      same_view(a, b))
    return 0;
  sta_tensor_extent(a, &alo, &ahi);
  sta_tensor_extent(b, &blo, &bhi);
  return alo <= bhi && blo <= ahi;
}

/* The checks every elementwise call makes: t[0] is written, t[1..n-1]
** read; every one non-NULL, one shape, one device whose backend runs. */
static sta_status check_operands(const char *op, int32_t n, const sta_tensor *const *t,
                                 const char *const *names) {
  for (int32_t i = 0; i < n; i++)
    STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, names[i]);
  for (int32_t i = 1; i < n; i++) {
    int same = t[i]->ndim == t[0]->ndim;
    for (int32_t d = 0; same && d < t[0]->ndim; d++) same = t[i]->shape[d] == t[0]->shape[d];
    if (!same) return sta_shape_mismatch(op, names[0], t[0], names[i], t[i]);
  }
  sta_device dev = t[0]->storage->device;
  for (int32_t i = 1; i < n; i++)
    if (t[i]->storage->device != dev)
      return sta_error(STA_ERR_ARGUMENT, "%s: devices differ (%s %s vs %s %s)", op, names[0],
                       sta_device_name(dev), names[i], sta_device_name(t[i]->storage->device));
  if (dev != STA_CPU && !sta_backend_available(dev))
    return sta_error(STA_ERR_BACKEND, "st attn not supported");
  for (int32_t i = 0; i < n; i++) {
    sta_status rc = sta_f8_device_check(t[i], names[i]);
    if (rc != STA_OK) return rc;
  }
  for (int32_t i = 1; i < n; i++)
    if (overlap(t[0], t[i]))
      return sta_error(STA_ERR_ARGUMENT, "%s: %s overlaps %s without being the same view", op,
                       names[0], names[i]);
  return STA_OK;
}

static sta_status check_coef(const char *name, double v, float *out) {
  if (!isfinite(v) || fabs(v) > FLT_MAX)
    return sta_error(STA_ERR_ARGUMENT, "%s: expected a finite float32 value, got %g", name, v);
  *out = (float)v;
  return STA_OK;
}

/* sta_tensor_copy's overlap check (tensor.c checks the rest). */
sta_status sta_copy_check_overlap(const sta_tensor *dst, const sta_tensor *src) {
  if (overlap(dst, src))
    return sta_error(STA_ERR_ARGUMENT, "copy: dst overlaps src without being the same view");
  return STA_OK;
}

/* ---- the calls ------------------------------------------------------------- */

/* out = a*x + b*y (y NULL: a*x), operands checked. */
static sta_status lincomb(const char *op, sta_tensor *out, float a, const sta_tensor *x,
                          float b, const sta_tensor *y) {
  if (sta_tensor_numel(out) == 0) return STA_OK;
  sta_device dev = out->storage->device;
  if (dev == STA_CPU) {
    host_lincomb(out, a, x, b, y);
    return STA_OK;
  }
  const sta_backend_ops *be = sta_backend_get(dev);
  if (!be || !be->lincomb)
    return sta_error(STA_ERR_UNSUPPORTED, "%s: not available on %s", op, sta_device_name(dev));
  return be->lincomb(out, a, x, b, y);
}

sta_status sta_tensor_axpby(sta_tensor *y, double a, const sta_tensor *x, double b) {
  const sta_tensor *t[2] = {y, x};
  static const char *const names[2] = {"y", "x"};
  float fa = 0, fb = 0;
  sta_status rc = check_operands("axpby", 2, t, names);
  if (rc == STA_OK) rc = check_coef("a", a, &fa);
  if (rc == STA_OK) rc = check_coef("b", b, &fb);
  return rc == STA_OK ? lincomb("axpby", y, fa, x, fb, y) : rc;
}

sta_status sta_tensor_scale(sta_tensor *t, double a) {
  const sta_tensor *tt[1] = {t};
  static const char *const names[1] = {"t"};
  float fa = 0;
  sta_status rc = check_operands("scale", 1, tt, names);
  if (rc == STA_OK) rc = check_coef("a", a, &fa);
  return rc == STA_OK ? lincomb("scale", t, fa, t, 0.f, NULL) : rc;
}

sta_status sta_tensor_add(sta_tensor *out, const sta_tensor *x, const sta_tensor *y) {
  const sta_tensor *t[3] = {out, x, y};
  static const char *const names[3] = {"out", "x", "y"};
  sta_status rc = check_operands("add", 3, t, names);
  return rc == STA_OK ? lincomb("add", out, 1.f, x, 1.f, y) : rc;
}

sta_status sta_tensor_stats(const sta_tensor *t, sta_stats *out) {
  const sta_tensor *tt[1] = {t};
  static const char *const names[1] = {"t"};
  sta_status rc = check_operands("stats", 1, tt, names);
  if (rc != STA_OK) return rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  sta_stats r;
  memset(&r, 0, sizeof r);
  sta_device dev = t->storage->device;
  if (sta_tensor_numel(t) == 0) rc = STA_OK;
  else if (dev == STA_CPU) rc = host_stats(t, &r);
  else {
    const sta_backend_ops *be = sta_backend_get(dev);
    rc = be && be->stats ? be->stats(t, &r)
                         : sta_error(STA_ERR_UNSUPPORTED, "stats: not available on %s",
                                     sta_device_name(dev));
  }
  if (rc == STA_OK) *out = r;
  return rc;
}

/* ---- copies between devices and dtypes, comparison ---------------------- */

static int same_shape(const sta_tensor *a, const sta_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int32_t i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* src converted to dt, contiguous, into host memory at host (src on a
** device): converted on the device first when it is not already so; an
** f8e4m3 side converts on the host (its raw bytes fetched). */
static sta_status fetch(void *host, const sta_tensor *src, sta_dtype dt) {
  const sta_backend_ops *b = sta_backend_get(src->storage->device);
  sta_tensor *dc = NULL;
  const sta_tensor *from = src;
  sta_status rc = STA_OK;
  if (src->dtype == STA_F8E4M3 && !sta_tensor_is_contiguous(src))
    return sta_f8_device_check(src, "src");
  if ((src->dtype == STA_F8E4M3 || dt == STA_F8E4M3) && src->dtype != dt) {
    sta_tensor *raw = NULL, *hv = NULL;
    if (!sta_tensor_is_contiguous(src))
      rc = sta_error(STA_ERR_UNSUPPORTED, "src: a strided %s tensor on %s converts to %s only "
                     "through a contiguous copy", sta_dtype_name(src->dtype),
                     sta_device_name(src->storage->device), sta_dtype_name(dt));
    if (rc == STA_OK) rc = sta_tensor_create(&raw, src->dtype, STA_CPU, src->ndim, src->shape);
    if (rc == STA_OK) rc = fetch(sta_tensor_data(raw), src, src->dtype);
    if (rc == STA_OK) rc = sta_tensor_wrap(&hv, host, dt, STA_CPU, src->ndim, src->shape, NULL);
    if (rc == STA_OK) sta_host_copy(hv, raw);
    sta_tensor_destroy(hv);
    sta_tensor_destroy(raw);
    return rc;
  }
  if (!sta_tensor_is_contiguous(src) || src->dtype != dt) {
    rc = sta_tensor_create(&dc, dt, src->storage->device, src->ndim, src->shape);
    if (rc == STA_OK) rc = b->copy(dc, src);
    from = dc;
  }
  if (rc == STA_OK)
    rc = b->memcpy(host, STA_CPU, sta_tensor_data(from), from->storage->device,
                   (size_t)sta_tensor_numel(src) * sta_dtype_size(dt));
  sta_tensor_destroy(dc);
  return rc;
}

/* New contiguous host tensor with src's shape and dtype `dt`, filled from
** src (any device). */
static sta_status to_host(sta_tensor **out, const sta_tensor *src, sta_dtype dt) {
  sta_tensor *h = NULL;
  sta_status rc = sta_tensor_create(&h, dt, STA_CPU, src->ndim, src->shape);
  if (rc != STA_OK) return rc;
  if (src->storage->device == STA_CPU) sta_host_copy(h, src);
  else if ((rc = fetch(sta_tensor_data(h), src, dt)) != STA_OK) {
    sta_tensor_destroy(h);
    return rc;
  }
  *out = h;
  return STA_OK;
}

/* Write a contiguous host tensor h (dst's shape and dtype) into device dst. */
static sta_status from_host(sta_tensor *dst, const sta_tensor *h) {
  const sta_backend_ops *b = sta_backend_get(dst->storage->device);
  size_t nbytes = (size_t)sta_tensor_numel(h) * sta_dtype_size(h->dtype);
  if (sta_tensor_is_contiguous(dst))
    return b->memcpy(sta_tensor_data(dst), dst->storage->device,
                     sta_tensor_data(h), STA_CPU, nbytes);
  sta_tensor *dc = NULL;
  sta_status rc = sta_tensor_create(&dc, h->dtype, dst->storage->device, h->ndim, h->shape);
  if (rc == STA_OK)
    rc = b->memcpy(sta_tensor_data(dc), dst->storage->device, sta_tensor_data(h), STA_CPU, nbytes);
  if (rc == STA_OK) rc = b->copy(dst, dc);
  sta_tensor_destroy(dc);
  return rc;
}

/* The backend of a device tensor's device, or STA_ERR_BACKEND (a wrapped
** device pointer in a build or on a machine without that backend). */
static sta_status device_backend(sta_device d) {
  return d == STA_CPU || sta_backend_available(d) ? STA_OK
                                                  : sta_error(STA_ERR_BACKEND, "st attn not supported");
}

sta_status sta_tensor_copy(sta_tensor *dst, const sta_tensor *src) {
  STA_CHECK_HANDLE(dst, STA_KIND_TENSOR, "dst");
  STA_CHECK_HANDLE(src, STA_KIND_TENSOR, "src");
  if (!same_shape(dst, src)) return sta_shape_mismatch("copy", NULL, dst, NULL, src);
  sta_device dd = dst->storage->device, sd = src->storage->device;
  sta_status rc = sta_copy_check_overlap(dst, src);
  if (rc == STA_OK) rc = device_backend(dd);
  if (rc == STA_OK) rc = device_backend(sd);
  if (rc == STA_OK && dd != STA_CPU && dst->dtype == STA_F8E4M3 &&
      (dd == sd || !sta_tensor_is_contiguous(dst)))
    rc = sta_f8_device_check(dst, "dst");
  if (rc == STA_OK && dd == sd && dd != STA_CPU) rc = sta_f8_device_check(src, "src");
  if (rc != STA_OK || sta_tensor_numel(dst) == 0) return rc;
  if (dd == STA_CPU && sd == STA_CPU) { sta_host_copy(dst, src); return STA_OK; }
  if (dd == sd) return sta_backend_get(dd)->copy(dst, src);
  if (dd == STA_CPU && sta_tensor_is_contiguous(dst)) return fetch(sta_tensor_data(dst), src, dst->dtype);
  if (sd == STA_CPU && sta_tensor_is_contiguous(src) && src->dtype == dst->dtype)
    return from_host(dst, src);
  sta_tensor *h = NULL;
  rc = to_host(&h, src, dst->dtype);
  if (rc == STA_OK) {
    if (dd == STA_CPU) sta_host_copy(dst, h);
    else rc = from_host(dst, h);
  }
  sta_tensor_destroy(h);
  return rc;
}

sta_status sta_tensor_to(sta_tensor **out, const sta_tensor *src,
                         sta_dtype dtype, sta_device device) {
  sta_tensor *t = NULL;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  STA_CHECK_HANDLE(src, STA_KIND_TENSOR, "src");
  sta_status rc = sta_tensor_create(&t, dtype, device, src->ndim, src->shape);
  if (rc != STA_OK) return rc;
  rc = sta_tensor_copy(t, src);
  if (rc != STA_OK) { sta_tensor_destroy(t); return rc; }
  *out = t;
  return STA_OK;
}

/* ---- random numbers and fills ------------------------------------------- */

double sta_randn_at(uint64_t seed, uint64_t i) {
  double even, odd;
  sta_randn_pair(seed, i >> 1, &even, &odd);
  return (i & 1) ? odd : even;
}

sta_status sta_tensor_randn(sta_tensor *t, uint64_t seed, double mean,
                            double std) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  if (!(std >= 0) || !isfinite(std))
    return sta_error(STA_ERR_ARGUMENT, "std: expected a finite value >= 0, got %g", std);
  if (!isfinite(mean))
    return sta_error(STA_ERR_ARGUMENT, "mean: expected a finite value, got %g", mean);
  sta_status rc = device_backend(t->storage->device);
  if (rc == STA_OK) rc = sta_f8_device_check(t, "t");
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    sta_host_randn(t, seed, mean, std);
    return STA_OK;
  }
  return sta_backend_get(t->storage->device)->randn(t, seed, mean, std);
}

sta_status sta_tensor_fill(sta_tensor *t, double value) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  sta_status rc = device_backend(t->storage->device);
  if (rc == STA_OK) rc = sta_f8_device_check(t, "t");
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    sta_host_fill(t, value);
    return STA_OK;
  }
  return sta_backend_get(t->storage->device)->fill(t, value);
}

sta_status sta_tensor_compare(const sta_tensor *a, const sta_tensor *b,
                              double *max_abs, double *rel_l2) {
  STA_CHECK_HANDLE(a, STA_KIND_TENSOR, "a");
  STA_CHECK_HANDLE(b, STA_KIND_TENSOR, "b");
  if (!same_shape(a, b)) return sta_shape_mismatch("compare", NULL, a, NULL, b);
  sta_tensor *ha = NULL, *hb = NULL;
  sta_status rc = device_backend(a->storage->device);
  if (rc == STA_OK) rc = device_backend(b->storage->device);
  if (rc == STA_OK) rc = to_host(&ha, a, STA_F32);
  if (rc == STA_OK) rc = to_host(&hb, b, STA_F32);
  if (rc == STA_OK) {
    const float *x = sta_tensor_data(ha), *y = sta_tensor_data(hb);
    int64_t n = sta_tensor_numel(ha);
    double m = 0, num = 0, den = 0;
    int nan = 0;
    for (int64_t i = 0; i < n; i++) {
      double d = (double)x[i] - (double)y[i];
      if (isnan(d)) nan = 1;
      if (fabs(d) > m) m = fabs(d);
      num += d * d;
      den += (double)y[i] * y[i];
    }
    if (max_abs) *max_abs = nan ? NAN : m;
    if (rel_l2) *rel_l2 = nan ? NAN : (den > 0 ? sqrt(num / den) : sqrt(num));
  }
  sta_tensor_destroy(ha);
  sta_tensor_destroy(hb);
  return rc;
}
