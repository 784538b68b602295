/*
** vsa_cubes.c -- VSA's cube order (STA.md section 12): the cube count and
** sizes of a canvas (FastVideo's variable_block_sizes) and the conversions
** between the untiled order and the cube order (its
** tile_partition_indices with the padding of non_pad_index).  The rule is
** core/vsa_internal.h's sta_cube_token, shared with the CUDA gather.
*/
#include <stdlib.h>

#include "internal.h"

/* g from canvas and cube, checked (names the bad argument). */
static sta_status cubes_init(sta_vsa_cubes *g, const int32_t canvas[3], const int32_t cube[3]) {
  static const char *const AX[3] = {"T", "H", "W"};
  if (!canvas) return sta_error(STA_ERR_ARGUMENT, "canvas: expected 3 ints, got NULL");
  if (!cube) return sta_error(STA_ERR_ARGUMENT, "cube: expected 3 ints, got NULL");
  memset(g, 0, sizeof *g);
  g->count = g->vol = 1;
  for (int i = 0; i < 3; i++) {
    if (canvas[i] < 1)
      return sta_error(STA_ERR_WINDOW, "canvas: %s = %d, expected >= 1", AX[i], (int)canvas[i]);
    if (cube[i] < 1 || cube[i] > 4096)
      return sta_error(STA_ERR_WINDOW, "cube: %s = %d, expected 1..4096", AX[i], (int)cube[i]);
    g->canvas[i] = canvas[i];
    g->cube[i] = cube[i];
    g->grid[i] = (canvas[i] + cube[i] - 1) / cube[i];
    g->count *= g->grid[i];
    g->vol *= cube[i];
  }
  if (g->vol > 4096)
    return sta_error(STA_ERR_WINDOW, "cube: %dx%dx%d = %lld tokens, expected at most 4096",
                     (int)cube[0], (int)cube[1], (int)cube[2], (long long)g->vol);
  return STA_OK;
}

sta_status sta_vsa_cube_count(const int32_t canvas[3], const int32_t cube[3], int64_t *count) {
  sta_vsa_cubes g;
  sta_status rc = cubes_init(&g, canvas, cube);
  if (rc != STA_OK) return rc;
  if (!count) return sta_error(STA_ERR_ARGUMENT, "count: expected a pointer, got NULL");
  *count = g.count;
  return STA_OK;
}

sta_status sta_vsa_cube_sizes(sta_tensor *sizes, const int32_t canvas[3],
                              const int32_t cube[3]) {
  STA_CHECK_HANDLE(sizes, STA_KIND_TENSOR, "sizes");
  sta_vsa_cubes g;
  sta_status rc = cubes_init(&g, canvas, cube);
  if (rc != STA_OK) return rc;
  if (sizes->dtype != STA_I32)
    return sta_error(STA_ERR_DTYPE, "sizes: expected i32, got %s", sta_dtype_name(sizes->dtype));
  if (sizes->ndim != 1 || sizes->shape[0] != g.count)
    return sta_error(STA_ERR_SHAPE, "sizes: expected shape [%lld] (the cubes), got a %d-D "
                     "tensor of %lld elements", (long long)g.count, (int)sizes->ndim,
                     (long long)sta_tensor_numel(sizes));
  int32_t *h = sta_malloc(sizeof(int32_t) * (size_t)g.count);
  if (!h) return sta_error(STA_ERR_NOMEM, "out of host memory (cube sizes)");
  for (int64_t c = 0; c < g.count; c++) h[c] = (int32_t)sta_cube_size(&g, c);
  sta_tensor *w = NULL;
  rc = sta_tensor_wrap(&w, h, STA_I32, STA_CPU, 1, &g.count, NULL);
  if (rc == STA_OK) rc = sta_tensor_copy(sizes, w);
  sta_tensor_destroy(w);
  free(h);
  return rc;
}

sta_status sta_cpu_vsa_reorder(sta_tensor *dst, const sta_tensor *src, const sta_vsa_cubes *g,
                               sta_layout layout, int32_t to_cubes) {
  const sta_tensor *u = to_cubes ? src : dst, *cu = to_cubes ? dst : src;
  sta_bshd bu, bc;
  (void)sta_tensor_bshd(u, layout, "u", &bu);
  (void)sta_tensor_bshd(cu, layout, "c", &bc);
  const int64_t es = (int64_t)sta_dtype_size(src->dtype);
  char *ub = sta_tensor_data(u), *cb = sta_tensor_data(cu);
  #pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < bc.s; j++) {
    const int64_t r = sta_cube_token(g, j);
    if (r < 0 && !to_cubes) continue;
    for (int64_t b = 0; b < bu.b; b++)
      for (int64_t h = 0; h < bu.h; h++) {
        char *cr = cb + (b * bc.sb + j * bc.ss + h * bc.sh) * es;
        if (r < 0) {
          for (int64_t d = 0; d < bc.d; d++) memset(cr + d * bc.sd * es, 0, (size_t)es);
          continue;
        }
        char *ur = ub + (b * bu.sb + r * bu.ss + h * bu.sh) * es;
        for (int64_t d = 0; d < bc.d; d++) {
          if (to_cubes) memcpy(cr + d * bc.sd * es, ur + d * bu.sd * es, (size_t)es);
          else memcpy(ur + d * bu.sd * es, cr + d * bc.sd * es, (size_t)es);
        }
      }
  }
  return STA_OK;
}

/* Checks of sta_tensor_to_cubes / _from_cubes, then the backend's gather. */
static sta_status reorder(sta_tensor *out, const sta_tensor *in, const int32_t canvas[3],
                          const int32_t cube[3], sta_layout layout, int32_t to_cubes) {
  STA_CHECK_HANDLE(out, STA_KIND_TENSOR, "out");
  STA_CHECK_HANDLE(in, STA_KIND_TENSOR, "in");
  sta_vsa_cubes g;
  sta_bshd bi, bo;
  sta_status rc = cubes_init(&g, canvas, cube);
  if (rc != STA_OK) return rc;
  if (layout != STA_BSHD && layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)layout);
  if ((rc = sta_tensor_bshd(in, layout, "in", &bi)) != STA_OK ||
      (rc = sta_tensor_bshd(out, layout, "out", &bo)) != STA_OK)
    return rc;
  const int64_t tokens = (int64_t)canvas[0] * canvas[1] * canvas[2], rows = g.count * g.vol;
  const int64_t want_in = to_cubes ? tokens : rows, want_out = to_cubes ? rows : tokens;
  if (bi.s != want_in)
    return sta_error(STA_ERR_SHAPE, "in: %lld rows, expected %lld (%s)", (long long)bi.s,
                     (long long)want_in, to_cubes ? "the canvas's tokens" : "cubes x cube volume");
  if (bo.s != want_out || bo.b != bi.b || bo.h != bi.h || bo.d != bi.d)
    return sta_error(STA_ERR_SHAPE,
                     "out: [B=%lld, S=%lld, heads=%lld, D=%lld], expected [B=%lld, S=%lld, "
                     "heads=%lld, D=%lld]", (long long)bo.b, (long long)bo.s, (long long)bo.h,
                     (long long)bo.d, (long long)bi.b, (long long)want_out, (long long)bi.h,
                     (long long)bi.d);
  if (out->dtype != in->dtype)
    return sta_error(STA_ERR_DTYPE, "out: dtype %s differs from in's %s",
                     sta_dtype_name(out->dtype), sta_dtype_name(in->dtype));
  if (out->storage->device != in->storage->device)
    return sta_error(STA_ERR_ARGUMENT, "out: on %s while in is on %s",
                     sta_device_name(out->storage->device), sta_device_name(in->storage->device));
  if ((rc = sta_vsa_no_alias("conversion", out, "out", in, "in")) != STA_OK) return rc;
  const sta_device dev = in->storage->device;
  if (dev == STA_CPU) return sta_cpu_vsa_reorder(out, in, &g, layout, to_cubes);
  if (!sta_backend_available(dev)) return sta_backend_missing(dev);
  const sta_backend_ops *be = sta_backend_get(dev);
  if (!be->vsa_reorder)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: the cube order is not implemented on %s in this "
                     "build", sta_device_name(dev));
  return be->vsa_reorder(out, in, &g, layout, to_cubes);
}

sta_status sta_tensor_to_cubes(sta_tensor *out, const sta_tensor *in, const int32_t canvas[3],
                               const int32_t cube[3], sta_layout layout) {
  return reorder(out, in, canvas, cube, layout, 1);
}

sta_status sta_tensor_from_cubes(sta_tensor *out, const sta_tensor *in, const int32_t canvas[3],
                                 const int32_t cube[3], sta_layout layout) {
  return reorder(out, in, canvas, cube, layout, 0);
}
