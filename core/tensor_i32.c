/*
** tensor_i32.c -- the rules of STA_I32 (sta.h), the block lists' dtype:
** exact integer values, no conversion to or from another dtype, no
** arithmetic.  Pure helpers of the tensor objects: core/tensor.c's
** sta_tensor_set and core/ops.c's copy and fill (which hold i32's copies
** and fills) call them; calls go one way, they call no operation.
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
