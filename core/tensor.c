/*
** tensor.c -- the tensor objects: dtypes, strided tensors over
** reference-counted storage on the host or a device (creation, wraps,
** views), their accessors, the iteration space of same-shape tensors,
** element access.
** Calls go one way: the operations on tensors (core/ops.c, the host loops
** of core/cpu_ops.c, kernels/) call this file; it calls none of them, only
** handles, errors, the backends' allocation and tensor_i32.c's dtype rules.
*/
#include <math.h>
#include <stdlib.h>

#include "internal.h"

#define MAX_ELEMS ((int64_t)1 << 50)

/* ---- dtypes ----------------------------------------------------------- */

size_t sta_dtype_size(sta_dtype dtype) {
  return dtype == STA_F32 || dtype == STA_I32 ? 4 : dtype == STA_F8E4M3 ? 1 : 2;
}

const char *sta_dtype_name(sta_dtype dtype) {
  switch (dtype) {
  case STA_F32: return "f32";
  case STA_F16: return "f16";
  case STA_BF16: return "bf16";
  case STA_F8E4M3: return "f8e4m3";
  case STA_I32: return "i32";
  }
  return "?";
}

const char *sta_device_name(sta_device d) { return d == STA_CPU ? "cpu" : "cuda"; }

static int dtype_ok(sta_dtype d) {
  return d == STA_F32 || d == STA_F16 || d == STA_BF16 || d == STA_F8E4M3 || d == STA_I32;
}

sta_status sta_dtype_parse(const char *name, sta_dtype *out) {
  static const struct { const char *n; sta_dtype d; } names[] = {
    {"f32", STA_F32}, {"float32", STA_F32}, {"f16", STA_F16},
    {"float16", STA_F16}, {"fp16", STA_F16}, {"bf16", STA_BF16},
    {"bfloat16", STA_BF16}, {"f8e4m3", STA_F8E4M3}, {"float8_e4m3fn", STA_F8E4M3},
    {"e4m3", STA_F8E4M3}, {"i32", STA_I32}, {"int32", STA_I32}};
  if (!name) return sta_error(STA_ERR_DTYPE, "dtype: expected a name, got NULL");
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (strcmp(name, names[i].n) == 0) { *out = names[i].d; return STA_OK; }
  return sta_error(STA_ERR_DTYPE,
                   "dtype: unknown dtype '%s' (expected f32, f16, bf16, f8e4m3 or i32)",
                   name);
}

float sta_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
  if (exp == 0) {
    if (man == 0) u = sign;
    else { /* subnormal */
      int e = -1;
      do { e++; man <<= 1; } while (!(man & 0x400u));
      u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t sta_f32_to_f16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow->inf */
  if (a < 0x38800000u) { /* subnormal or zero in f16 */
    if (a < 0x33000000u) return (uint16_t)sign;
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (uint16_t)(sign | r);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u; /* rebias 127->15 */
  return (uint16_t)(sign | (r >> 13));
}

/* ---- storage ---------------------------------------------------------- */

static void storage_release(sta_storage *s) {
  if (!s) return;
  if (__atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (s->owned && s->data) {
    if (s->device == STA_CPU) free(s->data);
    else {
      const sta_backend_ops *b = sta_backend_get(s->device);
      if (b) b->release(s->data);
      sta_device_account(-(int64_t)s->nbytes);
    }
  }
  free(s);
}

static sta_status check_device(sta_device device, const char *arg) {
  if (device == STA_CPU) return STA_OK;
  if (device != STA_CUDA)
    return sta_error(STA_ERR_ARGUMENT, "%s: unknown device %d", arg, (int)device);
  if (!sta_backend_available(STA_CUDA)) return sta_backend_missing(STA_CUDA);
  return STA_OK;
}

static sta_status check_shape(int32_t ndim, const int64_t *shape, int64_t *numel) {
  if (ndim < 1 || ndim > STA_MAX_DIMS)
    return sta_error(STA_ERR_SHAPE, "ndim: expected 1..4, got %d", (int)ndim);
  if (!shape) return sta_error(STA_ERR_SHAPE, "shape: expected an array, got NULL");
  /* the product of the nonzero sizes is bounded too, so that an empty
  ** tensor's contiguous strides (and offsets into it) stay in range */
  int64_t n = 1, zero = 0;
  for (int32_t i = 0; i < ndim; i++) {
    if (shape[i] < 0)
      return sta_error(STA_ERR_SHAPE, "shape[%d]: expected >= 0, got %lld",
                       (int)i, (long long)shape[i]);
    if (shape[i] > 0 && n > MAX_ELEMS / shape[i])
      return sta_error(STA_ERR_SHAPE, "shape[%d]: %lld makes the tensor too large",
                       (int)i, (long long)shape[i]);
    if (shape[i] > 0) n *= shape[i];
    else zero = 1;
  }
  *numel = zero ? 0 : n;
  return STA_OK;
}

static void contiguous_strides(int32_t ndim, const int64_t *shape, int64_t *st) {
  int64_t s = 1;
  for (int32_t i = ndim - 1; i >= 0; i--) { st[i] = s; s *= shape[i] > 0 ? shape[i] : 1; }
}

static sta_tensor *tensor_new(sta_storage *s, sta_dtype dtype, int64_t offset,
                              int32_t ndim, const int64_t *shape,
                              const int64_t *stride) {
  sta_tensor *t = sta_calloc(1, sizeof *t);
  if (!t) return NULL;
  if (sta_handle_add(t, STA_KIND_TENSOR) != STA_OK) {
    free(t);
    return NULL;
  }
  t->storage = s;
  t->dtype = dtype;
  t->offset = offset;
  t->ndim = ndim;
  for (int32_t i = 0; i < ndim; i++) { t->shape[i] = shape[i]; t->stride[i] = stride[i]; }
  return t;
}

sta_status sta_tensor_create(sta_tensor **out, sta_dtype dtype,
                             sta_device device, int32_t ndim,
                             const int64_t *shape) {
  int64_t numel, st[STA_MAX_DIMS];
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!dtype_ok(dtype))
    return sta_error(STA_ERR_DTYPE, "dtype: unknown dtype %d", (int)dtype);
  if ((rc = check_shape(ndim, shape, &numel)) != STA_OK) return rc;
  if ((rc = check_device(device, "device")) != STA_OK) return rc;
  size_t nbytes = (size_t)numel * sta_dtype_size(dtype);
  sta_storage *s = sta_calloc(1, sizeof *s);
  if (!s) return sta_error(STA_ERR_NOMEM, "out of host memory (tensor header)");
  s->nbytes = nbytes;
  s->device = device;
  s->owned = 1;
  s->refs = 1;
  if (device == STA_CPU) s->data = sta_malloc(nbytes);
  else {
    const sta_backend_ops *b = sta_backend_get(device);
    rc = b->alloc(&s->data, nbytes ? nbytes : 1);
    if (rc != STA_OK) { free(s); return rc; }
    sta_device_account((int64_t)nbytes);
  }
  if (!s->data) {
    free(s);
    return sta_error(STA_ERR_NOMEM, "out of host memory: tensor of %zu bytes", nbytes);
  }
  contiguous_strides(ndim, shape, st);
  sta_tensor *t = tensor_new(s, dtype, 0, ndim, shape, st);
  if (!t) {
    storage_release(s);
    return sta_error(STA_ERR_NOMEM, "out of host memory (tensor header)");
  }
  *out = t;
  return STA_OK;
}

/* Smallest and largest element offset a view reaches (numel > 0). */
static void view_extent(int64_t offset, int32_t ndim, const int64_t *shape,
                        const int64_t *stride, int64_t *lo, int64_t *hi) {
  *lo = *hi = offset;
  for (int32_t i = 0; i < ndim; i++) {
    int64_t span = (shape[i] - 1) * stride[i];
    if (span < 0) *lo += span; else *hi += span;
  }
}

void sta_tensor_extent(const sta_tensor *t, int64_t *lo, int64_t *hi) {
  view_extent(t->offset, t->ndim, t->shape, t->stride, lo, hi);
}

static sta_status check_strides(int32_t ndim, const int64_t *shape,
                                const int64_t *stride) {
  for (int32_t i = 0; i < ndim; i++) {
    uint64_t a = stride[i] < 0 ? 0 - (uint64_t)stride[i] : (uint64_t)stride[i]; /* INT64_MIN too */
    if (a > (uint64_t)MAX_ELEMS || (shape[i] > 1 && a > (uint64_t)(MAX_ELEMS / (shape[i] - 1))))
      return sta_error(STA_ERR_SHAPE, "strides[%d]: %lld is out of range",
                       (int)i, (long long)stride[i]);
  }
  return STA_OK;
}

sta_status sta_tensor_wrap(sta_tensor **out, void *data, sta_dtype dtype,
                           sta_device device, int32_t ndim,
                           const int64_t *shape, const int64_t *strides) {
  int64_t numel, st[STA_MAX_DIMS], lo = 0, hi = 0;
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!dtype_ok(dtype))
    return sta_error(STA_ERR_DTYPE, "dtype: unknown dtype %d", (int)dtype);
  if ((rc = check_shape(ndim, shape, &numel)) != STA_OK) return rc;
  if (device != STA_CPU && device != STA_CUDA)
    return sta_error(STA_ERR_ARGUMENT, "device: unknown device %d", (int)device);
  if (!data && numel > 0)
    return sta_error(STA_ERR_ARGUMENT, "data: expected a pointer, got NULL");
  if (strides) {
    if ((rc = check_strides(ndim, shape, strides)) != STA_OK) return rc;
    for (int32_t i = 0; i < ndim; i++) st[i] = strides[i];
  } else contiguous_strides(ndim, shape, st);
  size_t es = sta_dtype_size(dtype);
  if (numel > 0) {
    view_extent(0, ndim, shape, st, &lo, &hi);
    /* bytes data + lo*es .. data + hi*es + es - 1 (|lo|, hi <= 2^52: no overflow here) */
    uintptr_t at = (uintptr_t)data;
    if ((uint64_t)(-lo) * es > at || (uint64_t)hi * es + es - 1 > UINTPTR_MAX - at)
      return sta_error(STA_ERR_SHAPE, "strides: from data %p the view reaches elements %lld..%lld, "
                       "outside the address space", data, (long long)lo, (long long)hi);
  }
  sta_storage *s = sta_calloc(1, sizeof *s);
  if (!s) return sta_error(STA_ERR_NOMEM, "out of host memory (tensor header)");
  /* the storage starts at the lowest element the view reaches */
  s->data = data ? (char *)data + lo * (int64_t)es : NULL; /* NULL: empty wrap */
  s->nbytes = numel > 0 ? (size_t)(hi - lo + 1) * es : 0;
  s->device = device;
  s->owned = 0;
  s->refs = 1;
  sta_tensor *t = tensor_new(s, dtype, -lo, ndim, shape, st);
  if (!t) { free(s); return sta_error(STA_ERR_NOMEM, "out of host memory (tensor header)"); }
  *out = t;
  return STA_OK;
}

sta_status sta_tensor_view(sta_tensor **out, const sta_tensor *base,
                           int64_t offset, int32_t ndim,
                           const int64_t *shape, const int64_t *strides) {
  int64_t numel, lo, hi;
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  STA_CHECK_HANDLE(base, STA_KIND_TENSOR, "base");
  if ((rc = check_shape(ndim, shape, &numel)) != STA_OK) return rc;
  if (!strides) return sta_error(STA_ERR_SHAPE, "strides: expected an array, got NULL");
  if ((rc = check_strides(ndim, shape, strides)) != STA_OK) return rc;
  int64_t limit = (int64_t)(base->storage->nbytes / sta_dtype_size(base->dtype));
  if (offset > limit || offset < -limit) /* also keeps the sum below from overflowing */
    return sta_error(STA_ERR_SHAPE, "view: offset %lld is outside the storage of %lld",
                     (long long)offset, (long long)limit);
  int64_t abs_off = base->offset + offset;
  if (numel > 0) {
    view_extent(abs_off, ndim, shape, strides, &lo, &hi);
    if (lo < 0 || hi >= limit)
      return sta_error(STA_ERR_SHAPE,
                       "view: offset %lld with these shape and strides reaches "
                       "elements %lld..%lld outside the storage of %lld",
                       (long long)offset, (long long)lo, (long long)hi,
                       (long long)limit);
  }
  sta_tensor *t = tensor_new(base->storage, base->dtype, abs_off, ndim, shape, strides);
  if (!t) return sta_error(STA_ERR_NOMEM, "out of host memory (tensor header)");
  __atomic_add_fetch(&base->storage->refs, 1, __ATOMIC_ACQ_REL);
  *out = t;
  return STA_OK;
}

sta_status sta_tensor_permute(sta_tensor **out, const sta_tensor *base,
                              const int32_t *perm) {
  int64_t shape[STA_MAX_DIMS], st[STA_MAX_DIMS];
  int seen[STA_MAX_DIMS] = {0};
  STA_CHECK_HANDLE(base, STA_KIND_TENSOR, "base");
  if (!perm) return sta_error(STA_ERR_ARGUMENT, "perm: expected an array, got NULL");
  for (int32_t i = 0; i < base->ndim; i++) {
    int32_t p = perm[i];
    if (p < 0 || p >= base->ndim || seen[p])
      return sta_error(STA_ERR_ARGUMENT,
                       "perm[%d]: %d is not a permutation of 0..%d", (int)i,
                       (int)p, (int)base->ndim - 1);
    seen[p] = 1;
    shape[i] = base->shape[p];
    st[i] = base->stride[p];
  }
  return sta_tensor_view(out, base, 0, base->ndim, shape, st);
}

sta_status sta_tensor_narrow(sta_tensor **out, const sta_tensor *base,
                             int32_t dim, int64_t start, int64_t len) {
  STA_CHECK_HANDLE(base, STA_KIND_TENSOR, "base");
  if (dim < 0 || dim >= base->ndim)
    return sta_error(STA_ERR_ARGUMENT, "dim: expected 0..%d, got %d",
                     (int)base->ndim - 1, (int)dim);
  if (start < 0 || len < 0 || start > base->shape[dim] - len) {
    int64_t end;
    if (__builtin_add_overflow(start, len, &end)) /* the message's sum too */
      return sta_error(STA_ERR_ARGUMENT, "narrow: [%lld, %lld + %lld) is outside dim %d of size "
                       "%lld", (long long)start, (long long)start, (long long)len, (int)dim,
                       (long long)base->shape[dim]);
    return sta_error(STA_ERR_ARGUMENT,
                     "narrow: [%lld, %lld) is outside dim %d of size %lld",
                     (long long)start, (long long)end, (int)dim,
                     (long long)base->shape[dim]);
  }
  int64_t shape[STA_MAX_DIMS];
  for (int32_t i = 0; i < base->ndim; i++) shape[i] = base->shape[i];
  shape[dim] = len;
  return sta_tensor_view(out, base, start * base->stride[dim], base->ndim,
                         shape, base->stride);
}

void sta_tensor_destroy(sta_tensor *t) {
  if (!sta_handle_live(t, STA_KIND_TENSOR)) return; /* NULL or released: nothing */
  sta_handle_remove(t);
  storage_release(t->storage);
  free(t);
}

/* The getters return these for a NULL or released handle (and leave the
** message): STA_F32, STA_CPU, 0 dims, size -1, stride 0, numel 0, NULL. */
#define LIVE_OR(t, dflt) \
  do { if (sta_handle_check((t), STA_KIND_TENSOR, "t") != STA_OK) return (dflt); } while (0)

sta_dtype sta_tensor_dtype(const sta_tensor *t) { LIVE_OR(t, STA_F32); return t->dtype; }
sta_device sta_tensor_device(const sta_tensor *t) { LIVE_OR(t, STA_CPU); return t->storage->device; }
int32_t sta_tensor_ndim(const sta_tensor *t) { LIVE_OR(t, 0); return t->ndim; }

int64_t sta_tensor_size(const sta_tensor *t, int32_t dim) {
  LIVE_OR(t, -1);
  return dim >= 0 && dim < t->ndim ? t->shape[dim] : -1;
}

int64_t sta_tensor_stride(const sta_tensor *t, int32_t dim) {
  LIVE_OR(t, 0);
  return dim >= 0 && dim < t->ndim ? t->stride[dim] : 0;
}

static int64_t numel_of(const sta_tensor *t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

int64_t sta_tensor_numel(const sta_tensor *t) { LIVE_OR(t, 0); return numel_of(t); }

void *sta_tensor_data(const sta_tensor *t) {
  LIVE_OR(t, NULL);
  return (char *)t->storage->data + t->offset * (int64_t)sta_dtype_size(t->dtype);
}

int32_t sta_tensor_is_contiguous(const sta_tensor *t) {
  int64_t s = 1;
  LIVE_OR(t, 0);
  if (numel_of(t) == 0) return 1; /* nothing to address */
  for (int32_t i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

sta_status sta_tensor_bshd(const sta_tensor *t, sta_layout layout,
                           const char *argname, sta_bshd *o) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, argname);
  if (t->ndim != 4)
    return sta_error(STA_ERR_SHAPE, "%s: expected a 4-D tensor, got %d-D",
                     argname, (int)t->ndim);
  int hs = layout == STA_BSHD ? 2 : 1, ss = layout == STA_BSHD ? 1 : 2;
  o->b = t->shape[0]; o->sb = t->stride[0];
  o->s = t->shape[ss]; o->ss = t->stride[ss];
  o->h = t->shape[hs]; o->sh = t->stride[hs];
  o->d = t->shape[3]; o->sd = t->stride[3];
  return STA_OK;
}

sta_status sta_shape_mismatch(const char *what, const char *an, const sta_tensor *a,
                              const char *bn, const sta_tensor *b) {
  char sa[96], sb[96];
  int n = 0;
  sa[0] = sb[0] = '\0';
  for (int32_t i = 0; i < a->ndim; i++)
    n += snprintf(sa + n, sizeof sa - (size_t)n, "%s%lld", i ? "x" : "", (long long)a->shape[i]);
  n = 0;
  for (int32_t i = 0; i < b->ndim; i++)
    n += snprintf(sb + n, sizeof sb - (size_t)n, "%s%lld", i ? "x" : "", (long long)b->shape[i]);
  if (an && bn)
    return sta_error(STA_ERR_SHAPE, "%s: shapes differ (%s %s vs %s %s)", what, an, sa, bn, sb);
  return sta_error(STA_ERR_SHAPE, "%s: shapes differ (%s vs %s)", what, sa, sb);
}

sta_status sta_f8_device_check(const sta_tensor *t, const char *name) {
  if (t->dtype != STA_F8E4M3 || t->storage->device == STA_CPU) return STA_OK;
  return sta_error(STA_ERR_UNSUPPORTED,
                   "%s: f8e4m3 on %s: the device kernels take f32, f16 and bf16 (an f8e4m3 "
                   "device tensor moves only by contiguous copies to and from host f8e4m3 "
                   "tensors)", name, sta_device_name(t->storage->device));
}

/* ---- the iteration space of same-shape tensors ------------------------- */

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
/* ---- element access --------------------------------------------------- */

static sta_status element(const sta_tensor *t, const int64_t *index, char **p) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  if (t->storage->device != STA_CPU)
    return sta_error(STA_ERR_ARGUMENT,
                     "t: element access needs a host tensor, got a %s tensor",
                     t->storage->device == STA_CUDA ? "cuda" : "device");
  if (!index) return sta_error(STA_ERR_ARGUMENT, "index: expected an array, got NULL");
  int64_t off = 0;
  for (int32_t i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      return sta_error(STA_ERR_ARGUMENT, "index[%d]: %lld is outside 0..%lld",
                       (int)i, (long long)index[i], (long long)t->shape[i] - 1);
    off += index[i] * t->stride[i];
  }
  *p = (char *)sta_tensor_data(t) + off * (int64_t)sta_dtype_size(t->dtype);
  return STA_OK;
}

sta_status sta_tensor_get(const sta_tensor *t, const int64_t *index,
                          double *value) {
  char *p;
  if (!value) return sta_error(STA_ERR_ARGUMENT, "value: expected a pointer, got NULL");
  sta_status rc = element(t, index, &p);
  if (rc == STA_OK)
    *value = t->dtype == STA_I32 ? (double)*(const int32_t *)p : sta_load_f32(p, t->dtype);
  return rc;
}

sta_status sta_tensor_set(sta_tensor *t, const int64_t *index, double value) {
  char *p;
  int32_t iv = 0;
  sta_status rc = element(t, index, &p);
  if (rc == STA_OK && t->dtype == STA_I32 && (rc = sta_i32_value(value, &iv)) == STA_OK)
    *(int32_t *)p = iv;
  else if (rc == STA_OK && t->dtype != STA_I32) sta_store_f32(p, t->dtype, (float)value);
  return rc;
}
