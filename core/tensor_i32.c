/*
** tensor_i32.c -- STA_I32 tensors (sta.h): the block lists' dtype.  Exact
** values, copies between i32 tensors (host loops; a device side by the
** backend's memcpy, contiguous only), fills; no conversion, no arithmetic.
** core/tensor.c's calls come here for i32.
*/
#include <math.h>
#include <stdlib.h>

#include "internal.h"

sta_status sta_i32_mix_check(const char *op, const char *an, const sta_tensor *a,
                             const char *bn, const sta_tensor *b) {
  if ((a->dtype == STA_I32) == (b->dtype == STA_I32)) return STA_OK;
  return sta_error(STA_ERR_DTYPE, "%s: %s is %s and %s is %s (i32 converts to no other dtype)",
                   op, an, sta_dtype_name(a->dtype), bn, sta_dtype_name(b->dtype));
}

sta_status sta_i32_value(double v, int32_t *out) {
  if (!(v >= -2147483648.0 && v <= 2147483647.0) || v != floor(v))
    return sta_error(STA_ERR_ARGUMENT, "value: %g is not an i32 (an integer in "
                     "-2147483648..2147483647)", v);
  *out = (int32_t)v;
  return STA_OK;
}

/* STA_ERR_UNSUPPORTED: no device kernel moves a strided i32 tensor. */
static sta_status device_refuse(const sta_tensor *t, const char *name, const char *what) {
  return sta_error(STA_ERR_UNSUPPORTED,
                   "%s: %s of a strided i32 tensor on %s (i32 device tensors move only by "
                   "contiguous copies)", name, what, sta_device_name(t->storage->device));
}

/* Every element of host i32 tensor t := v. */
static void host_fill(sta_tensor *t, int32_t v) {
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

sta_status sta_i32_copy(sta_tensor *dst, const sta_tensor *src) {
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

sta_status sta_i32_fill(sta_tensor *t, double value) {
  int32_t v = 0;
  sta_status rc = sta_i32_value(value, &v);
  if (rc != STA_OK || sta_tensor_numel(t) == 0) return rc;
  if (t->storage->device == STA_CPU) {
    host_fill(t, v);
    return STA_OK;
  }
  if (!sta_tensor_is_contiguous(t)) return device_refuse(t, "t", "fill");
  sta_tensor *h = NULL; /* a device tensor: from a filled host copy */
  if ((rc = sta_tensor_create(&h, STA_I32, STA_CPU, t->ndim, t->shape)) != STA_OK) return rc;
  host_fill(h, v);
  rc = sta_backend_get(t->storage->device)->memcpy(sta_tensor_data(t), t->storage->device,
                                                   sta_tensor_data(h), STA_CPU,
                                                   (size_t)sta_tensor_numel(h) * sizeof(int32_t));
  sta_tensor_destroy(h);
  return rc;
}
