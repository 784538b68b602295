/*
** vsa.c -- sta-run --mode vsa: Video Sparse Attention (STA.md section 12)
** on the video rows of the Q/K/V files, converted to the cube order and
** back (or read in it: --order cubes), and its line of output.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sta-run.h"

/* What vsa_forward ran, for vsa_print: the cubes, topk, the attention call's
** time alone (the cube order's conversions left out) and the fine branch's
** FLOP over the selected cubes' valid rows (STA.md section 8). */
static struct { int64_t cubes; int32_t topk, cube[3]; double ms, flop; } vsa_ran;

/* x in the cube order (a new tensor; rows: the cube order's), or x itself
** with --order cubes (*made 0). */
static sta_status vsa_to_cubes(const options *o, sta_tensor *x, int64_t rows,
                               sta_tensor **c, int *made) {
  *made = 0;
  *c = x;
  if (o->cube_order || !x) return STA_OK;
  int64_t shape[4];
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(x, i);
  shape[o->layout == STA_BSHD ? 1 : 2] = rows;
  sta_status rc = sta_tensor_create(c, sta_tensor_dtype(x), sta_tensor_device(x), 4, shape);
  if (rc == STA_OK) {
    *made = 1;
    rc = sta_tensor_to_cubes(*c, x, o->canvas, vsa_ran.cube, o->layout);
  }
  return rc;
}

/* A [B, heads, S] lse as [B, heads, S, 1] (bhsd): the cube order's helpers
** take 4-D tensors. */
static sta_status lse4(const sta_tensor *lse, sta_tensor **v) {
  int64_t shape[4] = {sta_tensor_size(lse, 0), sta_tensor_size(lse, 1), sta_tensor_size(lse, 2), 1};
  int64_t strides[4] = {sta_tensor_stride(lse, 0), sta_tensor_stride(lse, 1),
                        sta_tensor_stride(lse, 2), 1};
  return sta_tensor_view(v, lse, 0, 4, shape, strides);
}

/* out (and lse) = VSA(q, k, v) of the options: the cube sizes of --canvas
** and --cube, topk from --sparsity or --topk, the gate file; rows converted
** to the cube order and back unless --order cubes. */
sta_status vsa_forward(const options *o, sta_tensor *const dev[3], sta_tensor *out,
                       sta_tensor *lse) {
  static const int32_t CUBE[3] = {4, 4, 4};
  memcpy(vsa_ran.cube, o->have_cube ? o->cube : CUBE, sizeof vsa_ran.cube);
  const int32_t *cube = vsa_ran.cube;
  const sta_device dev_of = sta_tensor_device(dev[0]);
  sta_tensor *sizes = NULL, *hg = NULL, *g = NULL, *c[5] = {NULL}, *lv = NULL, *lcv = NULL;
  sta_tensor *idx = NULL, *num = NULL;
  int made[5] = {0};
  int64_t n;
  sta_status rc = sta_vsa_cube_count(o->canvas, cube, &n);
  if (rc != STA_OK) return rc;
  const int64_t rows = n * cube[0] * cube[1] * cube[2];
  sta_vsa_desc d;
  memset(&d, 0, sizeof d);
  d.layout = o->layout;
  d.block_rows = cube[0] * cube[1] * cube[2];
  d.scale = (float)o->scale;
  d.topk = o->topk;
  if (!o->topk && (rc = sta_vsa_topk(o->sparsity, n, &d.topk)) != STA_OK) return rc;
  if ((rc = sta_tensor_create(&sizes, STA_I32, dev_of, 1, &n)) != STA_OK ||
      (rc = sta_vsa_cube_sizes(sizes, o->canvas, cube)) != STA_OK)
    goto done;
  d.kv_sizes = sizes;
  if (o->gate && ((rc = load(o->gate, o->gate_name, &hg)) != STA_OK ||
                  (rc = sta_tensor_to(&g, hg, sta_tensor_dtype(dev[0]), dev_of)) != STA_OK))
    goto done;
  sta_tensor *x[5] = {dev[0], dev[1], dev[2], g, out};
  for (int i = 0; i < 5 && rc == STA_OK; i++) rc = vsa_to_cubes(o, x[i], rows, &c[i], &made[i]);
  int64_t ls[3] = {sta_tensor_size(c[0], 0), sta_tensor_size(c[0], o->layout == STA_BSHD ? 2 : 1),
                   rows};
  sta_tensor *lc = lse;
  if (rc == STA_OK && lse && !o->cube_order) {
    rc = sta_tensor_create(&lcv, STA_F32, dev_of, 3, ls);
    lc = lcv;
  }
  if (rc != STA_OK) goto done;
  if (dev_of == STA_CUDA && (rc = sta_cuda_synchronize()) != STA_OK) goto done;
  double t0 = now_s();
  rc = o->reference ? sta_vsa_reference(&d, c[0], c[1], c[2], c[3], c[4], lc)
                    : sta_vsa_forward(&d, c[0], c[1], c[2], c[3], c[4], lc);
  if (rc == STA_OK && dev_of == STA_CUDA) rc = sta_cuda_synchronize();
  vsa_ran.ms = (now_s() - t0) * 1e3;
  if (rc == STA_OK && made[4]) rc = sta_tensor_from_cubes(out, c[4], o->canvas, cube, o->layout);
  if (rc == STA_OK && lcv) {
    sta_tensor *a = NULL;
    rc = lse4(lcv, &a);
    if (rc == STA_OK) rc = lse4(lse, &lv);
    if (rc == STA_OK) rc = sta_tensor_from_cubes(lv, a, o->canvas, cube, STA_BHSD);
    sta_tensor_destroy(a);
  }
  /* the work: the fine branch over the selection (sta_vsa_coarse's lists) */
  int64_t is[4] = {ls[0], ls[1], n, d.topk};
  if (rc == STA_OK && !o->quiet &&
      (rc = sta_tensor_create(&idx, STA_I32, dev_of, 4, is)) == STA_OK &&
      (rc = sta_tensor_create(&num, STA_I32, dev_of, 3, is)) == STA_OK &&
      (rc = sta_vsa_coarse(&d, c[0], c[1], c[2], NULL, NULL, idx, num)) == STA_OK) {
    sta_block_list bl = {d.block_rows, num, idx, sizes, NULL};
    sta_attention_desc fd;
    memset(&fd, 0, sizeof fd);
    fd.layout = o->layout;
    fd.mask = STA_MASK_BLOCKS;
    fd.blocks = &bl;
    vsa_ran.flop = sta_attention_flops(&fd, ls[0], rows, ls[1], sta_tensor_size(c[0], 3));
  }
  vsa_ran.cubes = n;
  vsa_ran.topk = d.topk;
done:
  for (int i = 0; i < 5; i++)
    if (made[i]) sta_tensor_destroy(c[i]);
  sta_tensor_destroy(sizes);
  sta_tensor_destroy(hg);
  sta_tensor_destroy(g);
  sta_tensor_destroy(lcv);
  sta_tensor_destroy(lv);
  sta_tensor_destroy(idx);
  sta_tensor_destroy(num);
  return rc;
}

void vsa_print(const options *o, const sta_tensor *q, sta_dtype file_dt, sta_dtype dt) {
  char sh[64];
  shape_str(q, sh, sizeof sh);
  double s = vsa_ran.ms * 1e-3;
  printf("sta-run: q %s %s %s%s, vsa canvas %dx%dx%d cube %dx%dx%d, top %d of %lld cubes%s, "
         "%s %s%s, %.3f ms, %.2f GFLOP/s (%.3f GFLOP)\n",
         sh, sta_dtype_name(file_dt), o->layout == STA_BSHD ? "bshd" : "bhsd",
         o->cube_order ? " cubes" : "", (int)o->canvas[0], (int)o->canvas[1],
         (int)o->canvas[2], (int)vsa_ran.cube[0], (int)vsa_ran.cube[1], (int)vsa_ran.cube[2],
         (int)vsa_ran.topk, (long long)vsa_ran.cubes, o->gate ? ", gate" : "",
         o->device == STA_CPU ? "cpu" : "cuda", sta_dtype_name(dt),
         o->reference ? " reference" : "", vsa_ran.ms, s > 0 ? vsa_ran.flop / s * 1e-9 : 0.0,
         vsa_ran.flop * 1e-9);
}
