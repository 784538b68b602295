/* test_util.h -- small helpers the C tests share (header-only). */
#ifndef STA_TEST_UTIL_H
#define STA_TEST_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "sta.h"

/* xorshift64 for the tests' fresh random inputs: sta_test_seed() once (in
** main, from STA_TEST_SEED or the clock), then sta_test_rnd(). */
static inline uint64_t *sta_test_rng(void) {
  static uint64_t state = 88172645463325252ull;
  return &state;
}
static inline void sta_test_seed(uint64_t seed) { *sta_test_rng() = seed ? seed : 1; }
static inline uint64_t sta_test_rnd(void) {
  uint64_t x = *sta_test_rng();
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *sta_test_rng() = x;
}
/* STA_TEST_FILTER=<glob> runs only the tests whose names match (cmocka's
** filter; '*' and '?'), so a slow tool such as racecheck can take one test
** per process. Call in main before cmocka_run_group_tests. */
static inline void sta_test_filter(void) {
  const char *f = getenv("STA_TEST_FILTER");
  if (f && *f) cmocka_set_test_filter(f);
}
/* The first lines of a test's main: the seed from STA_TEST_SEED (or the
** clock), printed so that a run can be replayed, seeds the generator as
** seed * mul + add; then sta_test_filter().  Returns the seed. */
static inline uint64_t sta_test_begin(uint64_t mul, uint64_t add) {
  const char *s = getenv("STA_TEST_SEED");
  uint64_t seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
  printf("# STA_TEST_SEED=%llu\n", (unsigned long long)seed);
  sta_test_seed(seed * mul + add);
  sta_test_filter();
  return seed;
}
/* Uniform in [lo, hi] (inclusive). */
static inline int64_t sta_test_rint(int64_t lo, int64_t hi) {
  return lo + (int64_t)(sta_test_rnd() % (uint64_t)(hi - lo + 1));
}

/* First line of a GPU test: skip it where there is no CUDA device. */
#define NEED_GPU()                                \
  do {                                            \
    (void)state;                                  \
    if (!sta_backend_available(STA_CUDA)) skip(); \
  } while (0)

/* A call that must fail: status want and, unless msg is NULL, exactly the
** message msg (STA.md section 9's strings are matched word for word). */
static inline void sta_expect_err(sta_status rc, sta_status want, const char *msg) {
  if (rc != want)
    fail_msg("status %s, wanted %s (%s)", sta_status_name(rc), sta_status_name(want),
             sta_last_error());
  if (msg && strcmp(sta_last_error(), msg) != 0)
    fail_msg("message '%s', wanted '%s'", sta_last_error(), msg);
}
#define EXPECT_ERR(call, status, msg) sta_expect_err((call), (status), (msg))

/* Make a fresh folder "<base>/sta-<name>-XXXXXX" in buf, trying /dev/shm
** (tmpfs: some tests write thousands of files) and then /tmp.  0 on
** success. */
static inline int sta_test_mkdtemp(char *buf, size_t n, const char *name) {
  static const char *const bases[] = {"/dev/shm", "/tmp"};
  for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
    snprintf(buf, n, "%s/sta-%s-XXXXXX", bases[i], name);
    if (mkdtemp(buf)) return 0;
  }
  return -1;
}

/* "<dir>/<name>" in one of 8 rotating buffers (so a call can take a few). */
static inline const char *sta_test_path(const char *dir, const char *name) {
  static char buf[8][512];
  static int k = 0;
  k = (k + 1) % 8;
  snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
  return buf[k];
}

/* Remove a folder made by sta_test_mkdtemp and everything in it. */
static inline int sta_test_rmdir(const char *dir) {
  char cmd[512];
  if (!dir[0]) return 0;
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  return system(cmd) == 0 ? 0 : -1;
}

/* Fill the padding rows of g's tiled order (the places of partial tiles
** that hold no token) in t, 4-D [B, S, heads, D] in layout, host or
** device, with value: NaN there shows that nothing reads them.  Returns
** the number of padding rows. */
static inline int64_t sta_test_fill_pad(sta_tensor *t, const sta_geometry *g, sta_layout layout,
                                        double value) {
  int32_t grid[3];
  sta_geometry_grid(g, grid);
  const int64_t vol = (int64_t)g->tile[0] * g->tile[1] * g->tile[2];
  int64_t n = 0;
  for (int64_t j = 0; j < (int64_t)grid[0] * grid[1] * grid[2] * vol; j++) {
    int64_t id = j / vol, in = j % vol;
    int64_t t0 = id / ((int64_t)grid[1] * grid[2]) * g->tile[0] + in / ((int64_t)g->tile[1] * g->tile[2]);
    int64_t h0 = (id / grid[2]) % grid[1] * g->tile[1] + (in / g->tile[2]) % g->tile[1];
    int64_t w0 = id % grid[2] * g->tile[2] + in % g->tile[2];
    if (t0 < g->canvas[0] && h0 < g->canvas[1] && w0 < g->canvas[2]) continue;
    sta_tensor *row = NULL;
    if (sta_tensor_narrow(&row, t, layout == STA_BSHD ? 1 : 2, j, 1) != STA_OK ||
        sta_tensor_fill(row, value) != STA_OK)
      fail_msg("padding row %lld: %s", (long long)j, sta_last_error());
    sta_tensor_destroy(row);
    n++;
  }
  return n;
}

#endif
