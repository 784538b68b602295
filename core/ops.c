/*
** ops.c -- the operations on tensors (sta.h "Tensors" and "Elementwise
** operations and reductions"): copies and conversions between devices and
** dtypes (sta_tensor_copy, _to), fills, random normals, comparison, and
** axpby, scale, add, stats.  Each checks its operands, then runs the host
** loops (core/cpu_ops.c) or the device's backend (kernels/ops_elementwise.cu,
** ops_stats.cu for CUDA).
** Calls go one way: ops.c calls core/tensor.c (the tensor objects) and
** cpu_ops.c, neither of which calls back.
*/
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "internal.h"

/* ---- checks shared by the calls ------------------------------------------ */

static int same_shape(const sta_tensor *a, const sta_tensor *b) {
  if (a->ndim != b->ndim) return 0;
  for (int32_t i = 0; i < a->ndim; i++) if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

/* The backend of a device tensor's device, or STA_ERR_BACKEND (a wrapped
** device pointer in a build or on a machine without that backend). */
static sta_status device_backend(sta_device d) {
  return d == STA_CPU || sta_backend_available(d) ? STA_OK : sta_backend_missing(d);
}

/* ---- copies between devices and dtypes ------------------------------------ */

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

/* STA_ERR_UNSUPPORTED: no device kernel moves a strided i32 tensor. */
static sta_status device_refuse(const sta_tensor *t, const char *name, const char *what) {
  return sta_error(STA_ERR_UNSUPPORTED,
                   "%s: %s of a strided i32 tensor on %s (i32 device tensors move only by "
                   "contiguous copies)", name, what, sta_device_name(t->storage->device));
}

/* i32 dst := src (sta_tensor_copy checked them): a device side contiguous,
** else STA_ERR_UNSUPPORTED. */
static sta_status i32_copy(sta_tensor *dst, const sta_tensor *src) {
  const sta_device dd = dst->storage->device, sd = src->storage->device;
  if (dd == STA_CPU && sd == STA_CPU) {
    sta_host_copy(dst, src);
    return STA_OK;
  }
  const int dc = sta_tensor_is_contiguous(dst), sc = sta_tensor_is_contiguous(src);
  if (dd != STA_CPU && !dc) return device_refuse(dst, "dst", "copy");
  if (sd != STA_CPU && !sc) return device_refuse(src, "src", "copy");
  const sta_backend_ops *b = sta_backend_get(dd != STA_CPU ? dd : sd);
  const size_t nb = (size_t)sta_tensor_numel(src) * sizeof(int32_t);
  if (dc && sc) return b->memcpy(sta_tensor_data(dst), dd, sta_tensor_data(src), sd, nb);
  sta_tensor *h = NULL; /* a strided host side: through a contiguous host copy */
  sta_status rc = sta_tensor_create(&h, STA_I32, STA_CPU, src->ndim, src->shape);
  if (rc == STA_OK && dd == STA_CPU) {
    rc = b->memcpy(sta_tensor_data(h), STA_CPU, sta_tensor_data(src), sd, nb);
    if (rc == STA_OK) sta_host_copy(dst, h);
  } else if (rc == STA_OK) {
    sta_host_copy(h, src);
    rc = b->memcpy(sta_tensor_data(dst), dd, sta_tensor_data(h), STA_CPU, nb);
  }
  sta_tensor_destroy(h);
  return rc;
}

sta_status sta_tensor_copy(sta_tensor *dst, const sta_tensor *src) {
  STA_CHECK_HANDLE(dst, STA_KIND_TENSOR, "dst");
  STA_CHECK_HANDLE(src, STA_KIND_TENSOR, "src");
  if (!same_shape(dst, src)) return sta_shape_mismatch("copy", NULL, dst, NULL, src);
  sta_device dd = dst->storage->device, sd = src->storage->device;
  static const char *const DN[1] = {"dst"}, *const SN[1] = {"src"};
  const sta_tensor *w = dst;
  sta_status rc = sta_check_writes("copy", 1, 1, &w, DN, 1, &src, SN);
  if (rc == STA_OK) rc = device_backend(dd);
  if (rc == STA_OK) rc = device_backend(sd);
  if (rc == STA_OK) rc = sta_i32_mix_check("copy", "dst", dst, "src", src);
  if (rc == STA_OK && dst->dtype == STA_I32)
    return sta_tensor_numel(dst) == 0 ? STA_OK : i32_copy(dst, src);
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

/* ---- fills and random normals ----------------------------------------------- */

/* A fill or randn writes t: its elements must be distinct. */
static sta_status check_written(const sta_tensor *t, const char *what) {
  static const char *const TN[1] = {"t"};
  return sta_check_writes(what, 0, 1, &t, TN, 0, NULL, NULL);
}

/* Every element of host i32 tensor t := v. */
static void i32_host_fill(sta_tensor *t, int32_t v) {
  int64_t sh[STA_MAX_DIMS] = {1, 1, 1, 1}, st[STA_MAX_DIMS] = {0, 0, 0, 0};
  for (int32_t i = 0; i < t->ndim; i++) {
    sh[STA_MAX_DIMS - t->ndim + i] = t->shape[i];
    st[STA_MAX_DIMS - t->ndim + i] = t->stride[i];
  }
  int32_t *p = sta_tensor_data(t);
  for (int64_t a = 0; a < sh[0]; a++)
    for (int64_t b = 0; b < sh[1]; b++)
      for (int64_t c = 0; c < sh[2]; c++)
        for (int64_t d = 0; d < sh[3]; d++) p[a * st[0] + b * st[1] + c * st[2] + d * st[3]] = v;
}

/* i32 t := value (a device t contiguous, else STA_ERR_UNSUPPORTED). */
static sta_status i32_fill(sta_tensor *t, double value) {
  int32_t v = 0;
  sta_status rc = sta_i32_value(value, &v);
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    i32_host_fill(t, v);
    return STA_OK;
  }
  if (!sta_tensor_is_contiguous(t)) return device_refuse(t, "t", "fill");
  sta_tensor *h = NULL; /* a device tensor: from a filled host copy */
  if ((rc = sta_tensor_create(&h, STA_I32, STA_CPU, t->ndim, t->shape)) != STA_OK) return rc;
  i32_host_fill(h, v);
  rc = sta_backend_get(t->storage->device)->memcpy(sta_tensor_data(t), t->storage->device,
                                                   sta_tensor_data(h), STA_CPU,
                                                   (size_t)sta_tensor_numel(h) * sizeof(int32_t));
  sta_tensor_destroy(h);
  return rc;
}

sta_status sta_tensor_randn(sta_tensor *t, uint64_t seed, double mean,
                            double std) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  if (!(std >= 0) || !isfinite(std))
    return sta_error(STA_ERR_ARGUMENT, "std: expected a finite value >= 0, got %g", std);
  if (!isfinite(mean))
    return sta_error(STA_ERR_ARGUMENT, "mean: expected a finite value, got %g", mean);
  if (t->dtype == STA_I32)
    return sta_error(STA_ERR_UNSUPPORTED, "t: randn of an i32 tensor (i32 holds block lists: "
                     "created, copied, filled and set, never computed on)");
  sta_status rc = device_backend(t->storage->device);
  if (rc == STA_OK) rc = sta_f8_device_check(t, "t");
  if (rc == STA_OK) rc = check_written(t, "randn");
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    sta_host_randn(t, seed, mean, std);
    return STA_OK;
  }
  return sta_backend_get(t->storage->device)->randn(t, seed, mean, std);
}

sta_status sta_tensor_fill(sta_tensor *t, double value) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  if (t->dtype == STA_I32) {
    sta_status rc = device_backend(t->storage->device);
    return rc == STA_OK ? i32_fill(t, value) : rc;
  }
  sta_status rc = device_backend(t->storage->device);
  if (rc == STA_OK) rc = sta_f8_device_check(t, "t");
  if (rc == STA_OK) rc = check_written(t, "fill");
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    sta_host_fill(t, value);
    return STA_OK;
  }
  return sta_backend_get(t->storage->device)->fill(t, value);
}

/* ---- comparison ------------------------------------------------------------- */

sta_status sta_tensor_compare(const sta_tensor *a, const sta_tensor *b,
                              double *max_abs, double *rel_l2) {
  STA_CHECK_HANDLE(a, STA_KIND_TENSOR, "a");
  STA_CHECK_HANDLE(b, STA_KIND_TENSOR, "b");
  if (!same_shape(a, b)) return sta_shape_mismatch("compare", NULL, a, NULL, b);
  if (a->dtype == STA_I32 || b->dtype == STA_I32)
    return sta_error(STA_ERR_UNSUPPORTED, "compare: %s is i32 (compare computes on f32, f16, "
                     "bf16 and f8e4m3; i32 holds block lists)", a->dtype == STA_I32 ? "a" : "b");
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

/* ---- arithmetic and reductions ---------------------------------------------- */

/* The checks every elementwise call makes: t[0] is written, t[1..n-1]
** read; every one non-NULL, one shape, one device whose backend runs; t[0]
** has distinct elements and overlaps no other unless it is its same view. */
static sta_status check_operands(const char *op, int32_t n, const sta_tensor *const *t,
                                 const char *const *names) {
  for (int32_t i = 0; i < n; i++)
    STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, names[i]);
  for (int32_t i = 1; i < n; i++)
    if (!same_shape(t[i], t[0])) return sta_shape_mismatch(op, names[0], t[0], names[i], t[i]);
  sta_device dev = t[0]->storage->device;
  for (int32_t i = 1; i < n; i++)
    if (t[i]->storage->device != dev)
      return sta_error(STA_ERR_ARGUMENT, "%s: devices differ (%s %s vs %s %s)", op, names[0],
                       sta_device_name(dev), names[i], sta_device_name(t[i]->storage->device));
  sta_status rc = device_backend(dev);
  if (rc != STA_OK) return rc;
  for (int32_t i = 0; i < n; i++) {
    if ((rc = sta_f8_device_check(t[i], names[i])) != STA_OK) return rc;
    if (t[i]->dtype == STA_I32) /* sta.h, STA_I32 */
      return sta_error(STA_ERR_UNSUPPORTED, "%s: %s is i32 (no operation computes on i32: it "
                       "holds block lists)", op, names[i]);
  }
  return sta_check_writes(op, 1, 1, t, names, n - 1, t + 1, names + 1);
}

static sta_status check_coef(const char *name, double v, float *out) {
  if (!isfinite(v) || fabs(v) > FLT_MAX)
    return sta_error(STA_ERR_ARGUMENT, "%s: expected a finite float32 value, got %g", name, v);
  *out = (float)v;
  return STA_OK;
}

/* out = a*x + b*y (y NULL: a*x), operands checked. */
static sta_status lincomb(const char *op, sta_tensor *out, float a, const sta_tensor *x,
                          float b, const sta_tensor *y) {
  if (sta_tensor_numel(out) == 0) return STA_OK;
  sta_device dev = out->storage->device;
  if (dev == STA_CPU) {
    sta_host_lincomb(out, a, x, b, y);
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
  else if (dev == STA_CPU) rc = sta_host_stats(t, &r);
  else {
    const sta_backend_ops *be = sta_backend_get(dev);
    rc = be && be->stats ? be->stats(t, &r)
                         : sta_error(STA_ERR_UNSUPPORTED, "stats: not available on %s",
                                     sta_device_name(dev));
  }
  if (rc == STA_OK) *out = r;
  return rc;
}
