/*
** api_extreme.h -- fuzz_api.c's calls with extreme arguments (so that
** integer arithmetic is overflow-checked, in messages too): sizes, strides,
** offsets, indices, counts, canvases, tiles, windows, text lengths and
** coefficients drawn from the edges of their types (0, -1, 2^31 - 1, 2^31,
** 2^32, 2^50, 2^62, INT64_MAX, INT64_MIN, NaN, Inf, ...) mixed with small
** good values, so that some calls pass and reach the work.  Wraps over
** fake addresses (near 0 and near the top of the address space) are only
** measured and viewed, never read.  Each call's extra randomness comes
** from a hash of its three bytes and its position in the sequence, so an
** input replays exactly.
*/
#ifndef STA_API_EXTREME_H
#define STA_API_EXTREME_H

#include <float.h>
#include <math.h>

static const int64_t X64[16] = {0, 1, 2, 3, -1, -2, INT32_MAX, (int64_t)INT32_MAX + 1,
                                INT32_MIN, (int64_t)1 << 32, ((int64_t)1 << 50) + 1,
                                (int64_t)1 << 62, INT64_MAX, INT64_MIN, INT64_MAX / 3, 5};
static const int32_t X32[12] = {0, 1, 3, -1, -2, INT32_MAX, INT32_MIN, 1 << 20, (1 << 20) + 1,
                                INT32_MAX - 1, 1 << 30, 2};
static const double XD[12] = {0.0, -0.0, 1.0, -2.5, 1e308, -1e308, 1e-320, DBL_MAX,
                              (double)FLT_MAX * 2, INFINITY, -INFINITY, NAN};

/* The call's random stream. */
typedef struct xr {
  uint64_t h;
} xr;
static inline uint64_t xr_next(xr *r) { return r->h = sta_splitmix64(r->h); }
/* Half the time a small good value (lo..hi), else an extreme one. */
static inline int64_t xr_i64(xr *r, int64_t lo, int64_t hi) {
  uint64_t v = xr_next(r);
  return (v & 1) ? lo + (int64_t)((v >> 8) % (uint64_t)(hi - lo + 1)) : X64[(v >> 8) % 16];
}
static inline int32_t xr_i32(xr *r, int32_t lo, int32_t hi) {
  uint64_t v = xr_next(r);
  return (v & 1) ? lo + (int32_t)((v >> 8) % (uint64_t)(hi - lo + 1)) : X32[(v >> 8) % 12];
}
static inline double xr_d(xr *r) {
  uint64_t v = xr_next(r);
  return (v & 1) ? (double)((int64_t)(v >> 40) % 200) / 16.0 : XD[(v >> 8) % 12];
}

/* A shape of nd dims whose element count is <= 2^20 or beyond what a
** tensor may hold (refused before any allocation: never a huge malloc);
** zero dims beside huge ones stay (an empty tensor of huge extent). */
static inline void xr_shape(xr *r, int32_t nd, int64_t *shape) {
  int64_t n = 1;
  int neg = 0;
  for (int32_t d = 0; d < nd; d++) {
    shape[d] = xr_i64(r, 0, 6);
    if (shape[d] < 0) neg = 1;
    else if (shape[d] > 0) n = n > INT64_MAX / shape[d] ? INT64_MAX : n * shape[d];
  }
  if (!neg && n > ((int64_t)1 << 20) && n <= ((int64_t)1 << 50))
    for (int32_t d = 0; d < nd; d++)
      if (shape[d] > 32) shape[d] = 1;
}

static void api_extreme(api_pool *a, unsigned op, unsigned i, unsigned j, unsigned k,
                        unsigned x, xr *r, sta_status *rc) {
  switch (op) {
  case 24: { /* create: extreme shapes and dtypes */
    int64_t sh[4] = {1, 1, 1, 1};
    int32_t nd = xr_i32(r, 1, 4);
    if (nd < 0 || nd > 4) {
      *rc = sta_tensor_create(&(sta_tensor *){NULL}, STA_F32, STA_CPU, nd, sh);
      break;
    }
    xr_shape(r, nd, sh);
    sta_tensor *t = NULL;
    *rc = sta_tensor_create(&t, (sta_dtype)(xr_next(r) % 6), STA_CPU, nd, sh);
    if (*rc == STA_OK && sta_tensor_randn(t, x, 0, 1) != STA_OK) FUZZ_CHECK(sta_last_error()[0]);
    if (*rc == STA_OK) { sta_tensor_destroy(a->t[i]); a->t[i] = t; }
    break;
  }
  case 25: { /* view: extreme offset, shape and strides over a live tensor */
    int64_t sh[4], st[4];
    int32_t nd = (int32_t)(xr_next(r) % 4) + 1;
    xr_shape(r, nd, sh);
    for (int32_t d = 0; d < nd; d++) st[d] = xr_i64(r, -3, 40);
    sta_tensor *v = NULL;
    *rc = sta_tensor_view(&v, a->t[j], xr_i64(r, -5, 200), nd, sh, st);
    if (*rc == STA_OK) { sta_tensor_destroy(a->t[i]); a->t[i] = v; }
    break;
  }
  case 26: { /* narrow: any dim, start and length */
    sta_tensor *v = NULL;
    *rc = sta_tensor_narrow(&v, a->t[j], xr_i32(r, 0, 3), xr_i64(r, 0, 40), xr_i64(r, 0, 40));
    if (*rc == STA_OK) { sta_tensor_destroy(a->t[i]); a->t[i] = v; }
    break;
  }
  case 27: { /* wraps over addresses near 0 and the top: measured, never read */
    static const uintptr_t FAKE[3] = {0x1000, (uintptr_t)0x7f0000000000ull,
                                      UINTPTR_MAX - 0xfff};
    int64_t sh[4], st[4];
    int32_t nd = (int32_t)(xr_next(r) % 4) + 1;
    for (int32_t d = 0; d < nd; d++) {
      sh[d] = xr_i64(r, 0, 1 << 20);
      st[d] = xr_i64(r, -(1 << 16), 1 << 16);
    }
    sta_tensor *w = NULL;
    *rc = sta_tensor_wrap(&w, (void *)FAKE[xr_next(r) % 3], (sta_dtype)(xr_next(r) % 4),
                          (x & 1) ? STA_CUDA : STA_CPU, nd, sh, (x & 2) ? st : NULL);
    if (*rc == STA_OK) {
      FUZZ_CHECK(sta_tensor_numel(w) >= 0);
      (void)sta_tensor_is_contiguous(w);
      (void)sta_self_overlap_decide(w);
      if (sta_handle_live(a->t[j], STA_KIND_TENSOR)) (void)sta_overlap_decide(w, a->t[j]);
      sta_tensor *v = NULL;
      int32_t perm[4] = {3, 2, 1, 0};
      if (nd == 4 && sta_tensor_permute(&v, w, perm) == STA_OK) {
        FUZZ_CHECK(sta_tensor_numel(v) == sta_tensor_numel(w));
        sta_tensor_destroy(v);
      }
      if (sta_tensor_narrow(&v, w, 0, xr_i64(r, 0, 3), xr_i64(r, 0, 3)) == STA_OK)
        sta_tensor_destroy(v);
      sta_tensor_destroy(w);
    }
    break;
  }
  case 28: { /* attention with an extreme descriptor; out unchanged on failure */
    sta_attention_desc d;
    int32_t win[3 * 64]; /* n_windows <= 64: the callee reads what n_windows says */
    memset(&d, 0, sizeof d);
    d.geom = api_geom();
    for (int q = 0; q < 3; q++) {
      if (xr_next(r) % 4 == 0) d.geom.canvas[q] = xr_i32(r, 1, 6);
      if (xr_next(r) % 4 == 0) d.geom.tile[q] = xr_i32(r, 1, 4);
    }
    if (xr_next(r) % 3 == 0) d.geom.text_len = xr_i64(r, -1, 4);
    if (xr_next(r) % 5 == 0) d.geom.order = (sta_order)xr_i32(r, 0, 1);
    d.n_windows = (x & 1) ? API_H : 1;
    if (xr_next(r) % 5 == 0) d.n_windows = xr_i32(r, 1, API_H);
    if (d.n_windows > 64) d.n_windows = 64;
    for (int q = 0; q < 3 * 64; q++) win[q] = xr_i32(r, 1, 5);
    d.windows = win;
    if (xr_next(r) % 3 == 0) d.scale = (float)xr_d(r);
    if (xr_next(r) % 6 == 0) d.layout = (sta_layout)xr_i32(r, 0, 1);
    if (xr_next(r) % 6 == 0) d.softmax = (sta_softmax)xr_i32(r, 0, 1);
    if (xr_next(r) % 6 == 0) d.precision = (sta_precision)xr_i32(r, 0, 1);
    (void)sta_attention_flops(&d, xr_i64(r, 1, 4), xr_i64(r, 0, API_S), xr_i64(r, 1, API_H),
                              xr_i64(r, 1, 8));
    sta_tensor *out = a->t[k], *snap = api_snapshot(out);
    *rc = sta_attention_forward(&d, a->t[i], a->t[j], a->t[j], out,
                                (x & 8) ? a->t[(k + 1) % API_T] : NULL);
    if (*rc != STA_OK) api_same(out, snap); else sta_tensor_destroy(snap);
    break;
  }
  case 29: { /* strategies, metadata and records with extreme counts and keys */
    int32_t w[3] = {xr_i32(r, 1, 5), xr_i32(r, 1, 5), xr_i32(r, 1, 5)}, g[3];
    switch (xr_next(r) % 6) {
    case 0: {
      sta_strategy *s = NULL;
      int32_t st = xr_i32(r, 1, 3), l = xr_i32(r, 1, 3), h = xr_i32(r, 1, API_H);
      double n = (double)st * l * h; /* small, or refused: not 2^32 real entries */
      if (st > 0 && l > 0 && h > 0 && n > 4096 && n <= 4294967296.0) h = 1, l = l > 64 ? 1 : l,
                                                                      st = st > 64 ? 1 : st;
      *rc = sta_strategy_uniform(&s, st, l, h, w, w, xr_i32(r, 0, 2));
      if (*rc == STA_OK) { sta_strategy_destroy(a->s[i]); a->s[i] = s; }
      break;
    }
    case 1:
      *rc = sta_strategy_set(a->s[i], xr_i32(r, 0, 3), xr_i32(r, 0, 3), xr_i32(r, 0, 3), w);
      break;
    case 2: {
      double sp = -1;
      for (int q = 0; q < 3; q++) g[q] = xr_i32(r, 1, 8);
      *rc = sta_strategy_sparsity(a->s[i], g, &sp);
      if (*rc == STA_OK) FUZZ_CHECK(sp >= 0 && sp <= 1);
      break;
    }
    case 3: {
      int32_t t = 0, l = 0, h = 0;
      sta_strategy_extent(a->s[i], &t, &l, &h);
      FUZZ_CHECK(t >= 0 && l >= 0 && h >= 0);
      *rc = sta_strategy_check(a->s[i], xr_i32(r, 0, 3), xr_i32(r, 0, 3), xr_i32(r, 0, 3));
      break;
    }
    case 4: {
      sta_metadata *m = NULL;
      *rc = sta_metadata_from_strategy(&m, a->s[j], xr_i32(r, 0, 2), xr_i32(r, 1, 3),
                                       xr_i32(r, 1, API_H));
      if (*rc == STA_OK) { sta_metadata_destroy(a->m[i]); a->m[i] = m; }
      break;
    }
    default: { /* a record: counts beyond the arrays are refused before reading */
      static const int32_t cand[6] = {1, 1, 1, 3, 3, 3};
      static const float loss[2 * API_H] = {0.5f, 0.25f, 1, 2, 3, 4, 5, 6};
      int32_t n = xr_i32(r, 1, 2), h = xr_i32(r, 1, API_H);
      if (n >= 1 && n <= 1024 && h >= 1 && h <= (1 << 20) && (int64_t)n * h > 2 * API_H)
        h = 1; /* within the arrays */
      if (n > 2 && n <= 1024) n = 1;
      *rc = sta_forward_batch_record(a->b[i], (int32_t)(x & 1), xr_i32(r, 0, 3), xr_i32(r, 0, 3),
                                     n, cand, h, loss, loss);
      break;
    }
    }
    break;
  }
  case 30: { /* elementwise calls and element access with extreme values */
    int64_t idx[4] = {xr_i64(r, 0, 3), xr_i64(r, 0, 3), xr_i64(r, 0, 3), xr_i64(r, 0, 3)};
    double v = 0;
    switch (xr_next(r) % 7) {
    case 0: *rc = sta_tensor_axpby(a->t[i], xr_d(r), a->t[j], xr_d(r)); break;
    case 1: *rc = sta_tensor_scale(a->t[i], xr_d(r)); break;
    case 2: *rc = sta_tensor_fill(a->t[i], xr_d(r)); break;
    case 3: *rc = sta_tensor_randn(a->t[i], xr_next(r), xr_d(r), xr_d(r)); break;
    case 4: *rc = sta_tensor_set(a->t[i], idx, xr_d(r)); break;
    case 5: *rc = sta_tensor_get(a->t[i], idx, &v); break;
    default: *rc = sta_tensor_copy(a->t[i], a->t[j]); break;
    }
    break;
  }
  default: { /* geometry questions, tiling and windows at the edges */
    sta_geometry g = api_geom();
    int32_t grid[3], s0 = 0, n0 = 0;
    for (int q = 0; q < 3; q++) {
      g.canvas[q] = xr_i32(r, 1, 9);
      g.tile[q] = xr_i32(r, 1, 4);
    }
    g.text_len = xr_i64(r, -1, 4);
    g.order = (sta_order)xr_i32(r, 0, 1);
    int64_t s = xr_i64(r, 0, 400);
    if (sta_geometry_check(&g, s) == STA_OK) {
      sta_geometry_grid(&g, grid);
      FUZZ_CHECK(sta_geometry_video_tokens(&g) >= 1);
      FUZZ_CHECK(sta_geometry_video_rows(&g) >= sta_geometry_video_tokens(&g));
      FUZZ_CHECK(sta_geometry_tiled_len(&g, s) >= -1); /* -1: past INT64_MAX */
      for (int q = 0; q < 3; q++) (void)sta_window_range(xr_i32(r, 0, 3), xr_i32(r, 1, 5), grid[q], &s0, &n0);
      sta_tensor *o = a->t[i];
      *rc = (x & 1) ? sta_tensor_tile(o, a->t[j], &g, (sta_layout)(x / 2 % 2))
                    : sta_tensor_untile(o, a->t[j], &g, (sta_layout)(x / 2 % 2));
    } else {
      (void)sta_geometry_from_seq_len(&g, s);
      int32_t win[3] = {xr_i32(r, 1, 5), xr_i32(r, 1, 5), xr_i32(r, 1, 5)};
      *rc = sta_window_check(&g, win); /* the last call's status */
    }
    break;
  }
  }
}

#endif
