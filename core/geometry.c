/*
** geometry.c -- canvas, tiles, windows and text (STA.md sections 1-3);
** FastVideo's tiled token order for interop.
*/
#include <stdlib.h>

#include "internal.h"

static const char AXIS[3] = {'t', 'h', 'w'};
#define MAX_CANVAS (1 << 20)

#define NULL_GEOMETRY(g, ret) \
  do { if (!(g)) { sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL"); return ret; } } while (0)

void sta_geometry_init(sta_geometry *g, int32_t t, int32_t h, int32_t w) {
  NULL_GEOMETRY(g, );
  g->canvas[0] = t; g->canvas[1] = h; g->canvas[2] = w;
  g->tile[0] = 6; g->tile[1] = 8; g->tile[2] = 8;
  g->text_len = -1;
  g->order = STA_ORDER_UNTILED;
}

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

void sta_geometry_grid(const sta_geometry *g, int32_t grid[3]) {
  NULL_GEOMETRY(g, );
  if (!grid) { sta_error(STA_ERR_ARGUMENT, "grid: expected 3 ints, got NULL"); return; }
  for (int i = 0; i < 3; i++) grid[i] = cdiv(g->canvas[i], g->tile[i]);
}

int64_t sta_geometry_video_tokens(const sta_geometry *g) {
  NULL_GEOMETRY(g, 0);
  return (int64_t)g->canvas[0] * g->canvas[1] * g->canvas[2];
}

static int64_t padded_video(const sta_geometry *g) {
  int32_t grid[3];
  sta_geometry_grid(g, grid);
  return (int64_t)grid[0] * grid[1] * grid[2] * g->tile[0] * g->tile[1] * g->tile[2];
}

int64_t sta_geometry_video_rows(const sta_geometry *g) {
  NULL_GEOMETRY(g, 0);
  return g->order == STA_ORDER_TILED ? padded_video(g) : sta_geometry_video_tokens(g);
}

int64_t sta_geometry_text_len(const sta_geometry *g, int64_t seq_len) {
  NULL_GEOMETRY(g, 0);
  return g->text_len < 0 ? seq_len - sta_geometry_video_rows(g) : g->text_len;
}

sta_status sta_geometry_check(const sta_geometry *g, int64_t seq_len) {
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  for (int i = 0; i < 3; i++) {
    if (g->canvas[i] < 1 || g->canvas[i] > MAX_CANVAS)
      return sta_error(STA_ERR_WINDOW, "canvas: %c = %d, expected 1..%d",
                       AXIS[i], (int)g->canvas[i], MAX_CANVAS);
    if (g->tile[i] < 1 || g->tile[i] > MAX_CANVAS)
      return sta_error(STA_ERR_WINDOW, "tile: %c = %d, expected 1..%d",
                       AXIS[i], (int)g->tile[i], MAX_CANVAS);
  }
  if (g->order != STA_ORDER_UNTILED && g->order != STA_ORDER_TILED)
    return sta_error(STA_ERR_ARGUMENT,
                     "order: expected STA_ORDER_UNTILED (0) or STA_ORDER_TILED (1), got %d",
                     (int)g->order);
  const int tiled = g->order == STA_ORDER_TILED;
  int64_t v = sta_geometry_video_tokens(g);
  /* padded: each factor <= 2^20 tiles x 2^20 tokens, so no overflow */
  double pv = 1;
  for (int i = 0; i < 3; i++)
    pv *= (double)((g->canvas[i] + g->tile[i] - 1) / g->tile[i]) * (double)g->tile[i];
  if (v > ((int64_t)1 << 40) || (tiled && pv > (double)((int64_t)1 << 40)))
    return sta_error(STA_ERR_WINDOW, "canvas: %dx%dx%d has too many tokens%s",
                     (int)g->canvas[0], (int)g->canvas[1], (int)g->canvas[2],
                     tiled ? " (tiled order, tiles padded)" : "");
  int64_t rows = sta_geometry_video_rows(g);
  if (seq_len < rows) {
    if (!tiled)
      return sta_error(STA_ERR_SEQ_LEN, "seq_len %lld not supported for STA",
                       (long long)seq_len);
    int32_t grid[3];
    sta_geometry_grid(g, grid);
    return sta_error(STA_ERR_SEQ_LEN,
                     "seq_len %lld not supported for STA (the tiled order of canvas "
                     "%dx%dx%d has %lld video rows: %dx%dx%d tiles of %dx%dx%d, partial "
                     "ones padded; then the text)",
                     (long long)seq_len, (int)g->canvas[0], (int)g->canvas[1],
                     (int)g->canvas[2], (long long)rows, (int)grid[0], (int)grid[1],
                     (int)grid[2], (int)g->tile[0], (int)g->tile[1], (int)g->tile[2]);
  }
  if (g->text_len < -1 || g->text_len > seq_len - rows)
    return sta_error(STA_ERR_ARGUMENT,
                     "text_len: %lld is outside 0..%lld (seq_len %lld - %lld video %s)",
                     (long long)g->text_len, (long long)(seq_len - rows),
                     (long long)seq_len, (long long)rows,
                     tiled ? "rows of the tiled order" : "tokens");
  return STA_OK;
}

sta_status sta_window_check(const sta_geometry *g, const int32_t window[3]) {
  int32_t grid[3];
  sta_status rc;
  if (!window) return sta_error(STA_ERR_WINDOW, "window: expected 3 ints, got NULL");
  /* canvas and tile first: the grid divides by the tile */
  if ((rc = sta_geometry_check(g, INT64_MAX)) != STA_OK) return rc;
  sta_geometry_grid(g, grid);
  for (int i = 0; i < 3; i++) {
    if (window[i] < 1)
      return sta_error(STA_ERR_WINDOW, "window: K%c = %d, expected >= 1",
                       AXIS[i], (int)window[i]);
    if (window[i] < grid[i] && window[i] % 2 == 0)
      return sta_error(STA_ERR_WINDOW,
                       "window: K%c = %d is even and smaller than the %d tiles "
                       "on the %c axis (use an odd window, or >= %d for the whole axis)",
                       AXIS[i], (int)window[i], (int)grid[i], AXIS[i], (int)grid[i]);
  }
  return STA_OK;
}

sta_status sta_window_range(int32_t q, int32_t k, int32_t c, int32_t *start,
                            int32_t *count) {
  if (!start || !count)
    return sta_error(STA_ERR_ARGUMENT, "start, count: expected pointers, got NULL");
  if (c < 1 || q < 0 || q >= c)
    return sta_error(STA_ERR_WINDOW, "window: query tile %d outside 0..%d",
                     (int)q, (int)c - 1);
  if (k < 1) return sta_error(STA_ERR_WINDOW, "window: K = %d, expected >= 1", (int)k);
  if (k < c && k % 2 == 0)
    return sta_error(STA_ERR_WINDOW, "window: K = %d is even and smaller than %d tiles",
                     (int)k, (int)c);
  *count = sta_window_span(k, c); /* the rule: mask.h */
  *start = sta_window_start(q, *count, c);
  return STA_OK;
}

sta_status sta_geometry_from_seq_len(sta_geometry *g, int64_t seq_len) {
  static const struct { int64_t s; int32_t t, h, w; } known[] = {
    {115456, 30, 48, 80}, {115200, 30, 48, 80},
    {82944, 36, 48, 48}, {69120, 18, 48, 80}};
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (known[i].s == seq_len) {
      sta_geometry_init(g, known[i].t, known[i].h, known[i].w);
      return STA_OK;
    }
  return sta_error(STA_ERR_SEQ_LEN, "seq_len %lld not supported for STA",
                   (long long)seq_len);
}

int64_t sta_geometry_tiled_len(const sta_geometry *g, int64_t seq_len) {
  NULL_GEOMETRY(g, 0);
  int64_t v = sta_geometry_video_tokens(g), p = padded_video(g);
  if (seq_len < v || seq_len - v > INT64_MAX - p) return -1; /* no untiled length of g */
  return p + (seq_len - v);
}

int64_t sta_tiled_row(const int32_t canvas[3], const int32_t tile[3], const int32_t grid[3],
                      int64_t x) {
  int64_t t = x / ((int64_t)canvas[1] * canvas[2]), h = (x / canvas[2]) % canvas[1],
          w = x % canvas[2];
  int64_t id = ((t / tile[0]) * grid[1] + h / tile[1]) * grid[2] + w / tile[2];
  return id * tile[0] * tile[1] * tile[2] +
         ((t % tile[0]) * tile[1] + h % tile[1]) * tile[2] + w % tile[2];
}

/* Source row of tiled row j, or -1 for padding. */
static int64_t tiled_source(const sta_geometry *g, const int32_t grid[3],
                            int64_t pv, int64_t j) {
  if (j >= pv) return sta_geometry_video_tokens(g) + (j - pv);
  return sta_tiled_token(g->canvas, g->tile, grid, j);
}

/* Move rows between the untiled tensor u and the tiled tensor tl (host). */
static sta_status tile_rows(sta_tensor *dst, const sta_tensor *src,
                            const sta_geometry *g, sta_layout layout,
                            int to_tiled) {
  const sta_tensor *u = to_tiled ? src : dst, *tl = to_tiled ? dst : src;
  sta_bshd bu, bt;
  sta_status rc;
  if (layout != STA_BSHD && layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)layout);
  if ((rc = sta_tensor_bshd(u, layout, to_tiled ? "in" : "out", &bu)) != STA_OK) return rc;
  if ((rc = sta_tensor_bshd(tl, layout, to_tiled ? "out" : "in", &bt)) != STA_OK) return rc;
  sta_geometry gu = *g; /* u is untiled whatever g's order says */
  gu.order = STA_ORDER_UNTILED;
  g = &gu;
  if ((rc = sta_geometry_check(g, bu.s)) != STA_OK) return rc;
  int64_t want = sta_geometry_tiled_len(g, bu.s);
  if (bt.b != bu.b || bt.h != bu.h || bt.d != bu.d || bt.s != want)
    return sta_error(STA_ERR_SHAPE,
                     "%s: expected %lld rows for the tiled order of %lld tokens "
                     "(same batch, heads, D), got %lld",
                     to_tiled ? "out" : "in", (long long)want, (long long)bu.s,
                     (long long)bt.s);
  if (dst->dtype != src->dtype)
    return sta_error(STA_ERR_DTYPE, "out: dtype %s differs from in's %s",
                     sta_dtype_name(dst->dtype), sta_dtype_name(src->dtype));
  static const char *const ON[1] = {"out"}, *const IN[1] = {"in"};
  const sta_tensor *w = dst;
  if ((rc = sta_check_writes(to_tiled ? "tile" : "untile", 0, 1, &w, ON, 1, &src, IN)) != STA_OK)
    return rc;
  if (dst->storage->device != STA_CPU || src->storage->device != STA_CPU) {
    /* stage through the host */
    sta_tensor *hs = NULL, *hd = NULL;
    rc = sta_tensor_to(&hs, src, src->dtype, STA_CPU);
    if (rc == STA_OK) rc = sta_tensor_create(&hd, dst->dtype, STA_CPU, 4, dst->shape);
    if (rc == STA_OK) rc = sta_tensor_copy(hd, dst); /* keeps padding rows */
    if (rc == STA_OK) rc = tile_rows(hd, hs, g, layout, to_tiled);
    if (rc == STA_OK) rc = sta_tensor_copy(dst, hd);
    sta_tensor_destroy(hs);
    sta_tensor_destroy(hd);
    return rc;
  }
  int32_t grid[3];
  sta_geometry_grid(g, grid);
  int64_t pv = padded_video(g);
  size_t es = sta_dtype_size(src->dtype);
  char *ub = sta_tensor_data(u), *tb = sta_tensor_data(tl);
  #pragma omp parallel for schedule(static)
  for (int64_t j = 0; j < bt.s; j++) {
    int64_t r = tiled_source(g, grid, pv, j);
    for (int64_t b = 0; b < bu.b; b++)
      for (int64_t h = 0; h < bu.h; h++) {
        char *tr = tb + (b * bt.sb + j * bt.ss + h * bt.sh) * (int64_t)es;
        if (r < 0) {
          if (to_tiled)
            for (int64_t d = 0; d < bu.d; d++) memset(tr + d * bt.sd * (int64_t)es, 0, es);
          continue;
        }
        char *ur = ub + (b * bu.sb + r * bu.ss + h * bu.sh) * (int64_t)es;
        char *from = to_tiled ? ur : tr, *to = to_tiled ? tr : ur;
        int64_t fs = to_tiled ? bu.sd : bt.sd, ts = to_tiled ? bt.sd : bu.sd;
        for (int64_t d = 0; d < bu.d; d++)
          memcpy(to + d * ts * (int64_t)es, from + d * fs * (int64_t)es, es);
      }
  }
  return STA_OK;
}

sta_status sta_tensor_tile(sta_tensor *out, const sta_tensor *in,
                           const sta_geometry *g, sta_layout layout) {
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  return tile_rows(out, in, g, layout, 1);
}

sta_status sta_tensor_untile(sta_tensor *out, const sta_tensor *in,
                             const sta_geometry *g, sta_layout layout) {
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  return tile_rows(out, in, g, layout, 0);
}
