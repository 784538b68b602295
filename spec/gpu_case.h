/* gpu_case.h -- what the forward's GPU tests share (header-only): the
** setup that names the CUDA backend, a test case (canvas, tile, text,
** batch, heads, head dim, dtype, layout, storage order, LSE, token order,
** windows, scale, seed), its defaults and a random draw of one. */
#ifndef STA_GPU_CASE_H
#define STA_GPU_CASE_H

#include "test_util.h"

#define MAXH 4

static inline int gpu_setup(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA)) {
    printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
    return 0;
  }
  printf("# %s\n", sta_backend_describe(STA_CUDA));
  return 0;
}

typedef struct gcase {
  int32_t canvas[3], tile[3];
  int64_t text, text_len, B, H, D;
  sta_dtype dtype;
  sta_layout layout;
  int order, lse;  /* order: storage (0 contiguous, 1 permuted) */
  int tiled;       /* the rows in FastVideo's tiled order */
  int32_t n_windows, windows[3 * MAXH];
  float scale;
  uint64_t seed;
} gcase;

static inline void case_init(gcase *c, int32_t t, int32_t h, int32_t w) {
  memset(c, 0, sizeof *c);
  c->canvas[0] = t; c->canvas[1] = h; c->canvas[2] = w;
  c->tile[0] = 6; c->tile[1] = 8; c->tile[2] = 8;
  c->text_len = -1;
  c->B = 1; c->H = 2; c->D = 128;
  c->dtype = STA_BF16;
  c->layout = STA_BSHD;
  c->n_windows = 1;
  c->windows[0] = c->windows[1] = c->windows[2] = 3;
  c->lse = 1;
  c->seed = 1;
}

/* 6x8x8 and the other even-t 8x8 tiles take the TMA paths (K, V and Q
** blocks of 2 t-slices straight from untiled memory); the rest the gather. */
static const int32_t tiles[][3] = {{6, 8, 8}, {6, 8, 8}, {2, 8, 8}, {4, 8, 8},
                                   {2, 3, 4}, {3, 4, 5}, {1, 8, 8}, {4, 4, 4},
                                   {2, 2, 16}, {5, 3, 7}};

static inline void random_case(gcase *c) {
  int64_t S, V;
  do {
    const int32_t *t = tiles[sta_test_rnd() % (sizeof tiles / sizeof tiles[0])];
    case_init(c, (int32_t)sta_test_rint(1, 14), (int32_t)sta_test_rint(1, 20), (int32_t)sta_test_rint(1, 22));
    memcpy(c->tile, t, sizeof c->tile);
    if (sta_test_rnd() % 4 == 0)
      for (int i = 0; i < 3; i++) c->canvas[i] = t[i] * (int32_t)sta_test_rint(1, 3);
    V = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2];
    int64_t text = sta_test_rnd() % 2 ? 0 : sta_test_rint(1, 150);
    int64_t pad = sta_test_rnd() % 3 ? 0 : sta_test_rint(1, 40);
    c->text = text + pad;
    c->text_len = (pad || sta_test_rnd() % 2) ? text : -1;
    S = V + c->text;
  } while (S < 8 || S > 3000);
  int32_t grid[3];
  for (int i = 0; i < 3; i++) grid[i] = (c->canvas[i] + c->tile[i] - 1) / c->tile[i];
  c->H = sta_test_rint(1, MAXH);
  c->n_windows = sta_test_rnd() % 2 ? 1 : (int32_t)c->H;
  for (int h = 0; h < c->n_windows; h++)
    for (int i = 0; i < 3; i++) {
      int32_t k;
      if (sta_test_rnd() % 4 == 0) k = grid[i] + (int32_t)sta_test_rint(0, 3); /* whole axis */
      else k = 1 + 2 * (int32_t)sta_test_rint(0, (grid[i] - 1) / 2);
      c->windows[3 * h + i] = k;
    }
  c->B = sta_test_rint(1, 2);
  c->D = sta_test_rnd() % 2 ? 64 : 128;
  c->dtype = sta_test_rnd() % 2 ? STA_BF16 : STA_F16;
  c->layout = sta_test_rnd() % 2 ? STA_BSHD : STA_BHSD;
  c->order = (int)(sta_test_rnd() % 2);
  c->lse = (int)(sta_test_rnd() % 3 != 0);
  c->scale = sta_test_rnd() % 3 ? 0.f : 0.05f;
  c->seed = sta_test_rnd() % 100000;
  c->tiled = sta_test_rnd() % 3 == 0;
}

#endif
