/* layer_util.h -- what the STA layer's tests share (test_layer.c,
** test_layer_search.c): the seed, a small canvas, random tensors, views,
** comparison and a layer descriptor on that canvas.  Header-only. */
#ifndef STA_LAYER_UTIL_H
#define STA_LAYER_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed_base; /* set by main: the run's seed, printed */
static inline uint64_t next_seed(void) { return seed_base++ * 0x9e3779b97f4a7c15ull + 1; }

/* Canvas 6x8x24, tile 2x4x4 (grid 3x2x6), text 8 rows: small, so fast. */
enum { T = 6, H = 8, W = 24, V = T * H * W, TEXT = 8, S = V + TEXT, D = 16 };

static inline sta_tensor *randn4(int64_t a, int64_t b, int64_t c, int64_t d) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {a, b, c, d};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

static inline sta_tensor *narrow(const sta_tensor *t, int32_t dim, int64_t start,
                                 int64_t len) {
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_narrow(&v, t, dim, start, len), STA_OK);
  return v;
}

static inline void assert_same(const sta_tensor *a, const sta_tensor *b, double tol) {
  double max_abs = -1, rel = -1;
  assert_int_equal(sta_tensor_compare(a, b, &max_abs, &rel), STA_OK);
  if (max_abs > tol) fail_msg("tensors differ: max |a-b| = %g > %g", max_abs, tol);
}

static inline void geometry(sta_geometry *g) {
  sta_geometry_init(g, T, H, W);
  g->tile[0] = 2; g->tile[1] = 4; g->tile[2] = 4;
}

static inline sta_layer_desc base_desc(void) {
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.layer_index = 0;
  d.local_heads = 2;
  d.head_dim = D;
  d.sp_rank = 0;
  d.sp_size = 1;
  geometry(&d.geom);
  d.layout = STA_BSHD;
  d.backend = STA_CPU;
  return d;
}

#endif
