/* test_strategy.c -- mask strategies: parsing and its errors, files, the
** environment, uniform strategies, sparsity, metadata tables. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static unsigned seed;

static char *tmp_path(const char *name) {
  static char buf[8][256];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 256, "/tmp/sta-test-strategy-%d-%s", (int)getpid(), name);
  return p;
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static char *json_of(const sta_strategy *s) {
  char *j = NULL;
  assert_int_equal(sta_strategy_to_json(s, &j), STA_OK);
  return j;
}

/* A random strategy: odd windows 1..9, steps x layers x heads. */
static sta_strategy *random_strategy(int32_t steps, int32_t layers, int32_t heads) {
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_create(&s), STA_OK);
  for (int32_t t = 0; t < steps; t++)
    for (int32_t l = 0; l < layers; l++)
      for (int32_t h = 0; h < heads; h++) {
        int32_t w[3] = {1 + 2 * (rand() % 5), 1 + 2 * (rand() % 5), 1 + 2 * (rand() % 5)};
        assert_int_equal(sta_strategy_set(s, t, l, h, w), STA_OK);
      }
  return s;
}

static void test_parse_get(void **state) {
  (void)state;
  const char *json = "{\"1_0_1\": [3, 3, 5], \"0_0_0\": [1, 5, 7],\n"
                     " \"0_0_1\": [3, 1, 10], \"14_3_7\": [3, 6, 10]}";
  sta_strategy *s = NULL;
  int32_t w[3], t, l, h;
  assert_int_equal(sta_strategy_parse(&s, json, strlen(json)), STA_OK);
  assert_int_equal(sta_strategy_count(s), 4);
  assert_int_equal(sta_strategy_get(s, 14, 3, 7, w), STA_OK);
  assert_int_equal(w[0], 3); assert_int_equal(w[1], 6); assert_int_equal(w[2], 10);
  assert_int_equal(sta_strategy_get(s, 0, 0, 1, w), STA_OK);
  assert_int_equal(w[0], 3); assert_int_equal(w[1], 1); assert_int_equal(w[2], 10);
  sta_strategy_extent(s, &t, &l, &h);
  assert_int_equal(t, 15); assert_int_equal(l, 4); assert_int_equal(h, 8);
  char *out = json_of(s);
  assert_string_equal(out, "{\n  \"0_0_0\": [1, 5, 7],\n  \"0_0_1\": [3, 1, 10],\n"
                           "  \"1_0_1\": [3, 3, 5],\n  \"14_3_7\": [3, 6, 10]\n}\n");
  sta_free(out);
  EXPECT_ERR(sta_strategy_get(s, 14, 3, 6, w), STA_ERR_KEY,
             "mask strategy has no window for \"14_3_6\" (step 14, layer 3, head 6)");
  EXPECT_ERR(sta_strategy_get(s, -1, 3, 6, w), STA_ERR_ARGUMENT, "step: expected >= 0, got -1");
  sta_strategy_destroy(s);
  /* empty object, trailing whitespace; len excludes trailing junk */
  assert_int_equal(sta_strategy_parse(&s, "{} \n", 4), STA_OK);
  assert_int_equal(sta_strategy_count(s), 0);
  out = json_of(s);
  assert_string_equal(out, "{}\n");
  sta_free(out);
  sta_strategy_destroy(s);
  assert_int_equal(sta_strategy_parse(&s, "{\"0_0_0\": [1, 1, 1]}garbage", 20), STA_OK);
  assert_int_equal(sta_strategy_count(s), 1);
  sta_strategy_destroy(s);
}

static void test_parse_errors(void **state) {
  (void)state;
  static const struct { const char *json, *msg; } cases[] = {
    {"{\"14_3\": [3, 3, 3]}", "mask strategy: key \"14_3\" is not \"step_layer_head\""},
    {"{\"0_0_0\": [1, 1, 1], \"a_b_c\": [3, 3, 3]}",
     "mask strategy: key \"a_b_c\" is not \"step_layer_head\""},
    {"{\"-1_0_0\": [3, 3, 3]}", "mask strategy: key \"-1_0_0\" is not \"step_layer_head\""},
    {"{\"+1_0_0\": [3, 3, 3]}", "mask strategy: key \"+1_0_0\" is not \"step_layer_head\""},
    {"{\"1_0_0x\": [3, 3, 3]}", "mask strategy: key \"1_0_0x\" is not \"step_layer_head\""},
    {"{\"1_0_0_\": [3, 3, 3]}", "mask strategy: key \"1_0_0_\" is not \"step_layer_head\""},
    {"{\"1__0\": [3, 3, 3]}", "mask strategy: key \"1__0\" is not \"step_layer_head\""},
    {"{\" 1_0_0\": [3, 3, 3]}", "mask strategy: key \" 1_0_0\" is not \"step_layer_head\""},
    {"{\"2147483648_0_0\": [3, 3, 3]}",
     "mask strategy: key \"2147483648_0_0\": the step is out of range (0..2147483646)"},
    {"{\"2147483647_0_0\": [3, 3, 3]}", /* extent() would overflow */
     "mask strategy: key \"2147483647_0_0\": the step is out of range (0..2147483646)"},
    {"{\"0_0_2147483647\": [3, 3, 3]}",
     "mask strategy: key \"0_0_2147483647\": the head is out of range (0..2147483646)"},
    {"{\"1_99999999999999999999_0\": [3, 3, 3]}",
     "mask strategy: key \"1_99999999999999999999_0\": the layer is out of range (0..2147483646)"},
    {"{\"0_0_0\\u0000junk\": [3, 3, 3]}", /* cJSON's key ends at the NUL */
     "mask strategy: NUL character in a string at byte 7 (\\u0000 or a NUL byte: the name or "
     "value would end there)"},
    {"{\"0_0_0\": [3, 3, 3], \"0_0_1\\u0000\": [1, 1, 1]}",
     "mask strategy: NUL character in a string at byte 27 (\\u0000 or a NUL byte: the name or "
     "value would end there)"},
    {"{\"0_0_0\": [1, 1, 1]} {\"0_0_1\": [1, 1, 1]}",
     "mask strategy: unexpected text after the JSON object at byte 21"},
    {"{\"\": [3, 3, 3]}", "mask strategy: key \"\" is not \"step_layer_head\""},
    {"{\"14_3_7\": [3, 3.5, 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, \"3\", 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, -3, 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, 0, 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, 3, 3, 3]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": {\"a\": 1}}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": 3}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"14_3_7\": [3, 3, 1e10]}",
     "mask strategy: \"14_3_7\": expected [Kt, Kh, Kw] of 3 positive integers"},
    {"{\"0_0_0\": [1, 1, 1], \"0_0_1\": [1, 1, 1], \"0_0_0\": [3, 3, 3]}",
     "mask strategy: key \"0_0_0\" appears more than once"},
    {"[[3, 3, 3]]", "mask strategy: expected a JSON object at the top level, got an array"},
    {"\"x\"", "mask strategy: expected a JSON object at the top level, got a string"},
    {"{\"0_0_0\": [1, 1, 1],}", "mask strategy: malformed JSON at byte 20"},
    {"{\"0_0_0\": [1, 1, 1]} x", "mask strategy: unexpected text after the JSON object at byte 21"},
    {"", "mask strategy: malformed JSON at byte 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    sta_strategy *s = (sta_strategy *)&seed; /* a sentinel that must survive */
    sta_status rc = sta_strategy_parse(&s, cases[i].json, strlen(cases[i].json));
    assert_int_equal(rc, STA_ERR_FORMAT);
    assert_string_equal(sta_last_error(), cases[i].msg);
    assert_ptr_equal(s, (sta_strategy *)&seed);
  }
  sta_strategy *s = NULL;
  EXPECT_ERR(sta_strategy_parse(&s, NULL, 3), STA_ERR_ARGUMENT,
             "json: expected a string, got NULL");
  EXPECT_ERR(sta_strategy_parse(NULL, "{}", 2), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  assert_null(s);
}

static void test_roundtrip_files(void **state) {
  (void)state;
  sta_strategy *s = random_strategy(5, 3, 6), *r = NULL;
  const char *path = tmp_path("roundtrip.json");
  assert_int_equal(sta_strategy_save(s, path), STA_OK);
  assert_int_equal(sta_strategy_load(&r, path), STA_OK);
  assert_true(sta_strategy_equal(s, r));
  assert_int_equal(sta_strategy_check(r, 5, 3, 6), STA_OK);
  /* one changed window breaks equality; a missing key is named */
  int32_t w[3] = {11, 11, 11};
  assert_int_equal(sta_strategy_set(r, 4, 2, 5, w), STA_OK);
  assert_false(sta_strategy_equal(s, r));
  EXPECT_ERR(sta_strategy_check(r, 5, 3, 7), STA_ERR_KEY,
             "mask strategy has no window for \"0_0_6\" (step 0, layer 0, head 6)");
  sta_strategy_destroy(r);
  r = NULL;
  remove(path);
  /* I/O and format errors name the file */
  const char *missing = tmp_path("no-such-dir/x.json");
  char msg[512];
  snprintf(msg, sizeof msg, "mask strategy: cannot open \"%s\": No such file or directory", missing);
  EXPECT_ERR(sta_strategy_load(&r, missing), STA_ERR_IO, msg);
  assert_null(r);
  snprintf(msg, sizeof msg,
           "mask strategy \"%s\": cannot open for writing: No such file or directory", missing);
  EXPECT_ERR(sta_strategy_save(s, missing), STA_ERR_IO, msg);
  const char *bad = tmp_path("bad.json");
  write_file(bad, "{\"0_0_0\": [3, 3, 3], \"1_2\": [1, 1, 1]}");
  snprintf(msg, sizeof msg, "mask strategy \"%s\": key \"1_2\" is not \"step_layer_head\"", bad);
  EXPECT_ERR(sta_strategy_load(&r, bad), STA_ERR_FORMAT, msg);
  assert_null(r);
  remove(bad);
  sta_strategy_destroy(s);
}

static void test_load_default(void **state) {
  (void)state;
  sta_strategy *a = random_strategy(2, 2, 2), *b = random_strategy(2, 2, 3),
               *c = random_strategy(1, 1, 4), *r = NULL;
  const char *pa = tmp_path("a.json"), *pb = tmp_path("b.json"), *pc = tmp_path("c.json");
  assert_int_equal(sta_strategy_save(a, pa), STA_OK);
  assert_int_equal(sta_strategy_save(b, pb), STA_OK);
  assert_int_equal(sta_strategy_save(c, pc), STA_OK);
  unsetenv("STA_ATTENTION_CONFIG");
  unsetenv("SGLANG_DIFFUSION_ATTENTION_CONFIG");
  unsetenv("FASTVIDEO_ATTENTION_CONFIG");
  EXPECT_ERR(sta_strategy_load_default(&r), STA_ERR_ENV, "STA_ATTENTION_CONFIG is not set");
  setenv("STA_ATTENTION_CONFIG", "", 1);
  EXPECT_ERR(sta_strategy_load_default(&r), STA_ERR_ENV, "STA_ATTENTION_CONFIG is not set");
  assert_null(r);
  setenv("FASTVIDEO_ATTENTION_CONFIG", pc, 1);
  assert_int_equal(sta_strategy_load_default(&r), STA_OK);
  assert_true(sta_strategy_equal(r, c));
  sta_strategy_destroy(r);
  setenv("SGLANG_DIFFUSION_ATTENTION_CONFIG", pb, 1);
  assert_int_equal(sta_strategy_load_default(&r), STA_OK);
  assert_true(sta_strategy_equal(r, b));
  sta_strategy_destroy(r);
  setenv("STA_ATTENTION_CONFIG", pa, 1);
  assert_int_equal(sta_strategy_load_default(&r), STA_OK);
  assert_true(sta_strategy_equal(r, a));
  sta_strategy_destroy(r);
  r = NULL;
  const char *gone = tmp_path("gone.json");
  setenv("STA_ATTENTION_CONFIG", gone, 1);
  char msg[512];
  snprintf(msg, sizeof msg, "mask strategy: cannot open \"%s\": No such file or directory", gone);
  EXPECT_ERR(sta_strategy_load_default(&r), STA_ERR_IO, msg);
  assert_null(r);
  unsetenv("STA_ATTENTION_CONFIG");
  unsetenv("SGLANG_DIFFUSION_ATTENTION_CONFIG");
  unsetenv("FASTVIDEO_ATTENTION_CONFIG");
  remove(pa); remove(pb); remove(pc);
  sta_strategy_destroy(a); sta_strategy_destroy(b); sta_strategy_destroy(c);
}

static void test_uniform_sparsity(void **state) {
  (void)state;
  int32_t win[3] = {3, 3, 3}, full[3] = {5, 6, 10}, grid[3] = {5, 6, 10}, w[3];
  sta_strategy *s = NULL;
  double sp;
  assert_int_equal(sta_strategy_uniform(&s, 50, 4, 24, win, full, 15), STA_OK);
  assert_int_equal(sta_strategy_count(s), 50 * 4 * 24);
  assert_int_equal(sta_strategy_check(s, 50, 4, 24), STA_OK);
  assert_int_equal(sta_strategy_get(s, 14, 3, 23, w), STA_OK);
  assert_memory_equal(w, full, sizeof w);
  assert_int_equal(sta_strategy_get(s, 15, 0, 0, w), STA_OK);
  assert_memory_equal(w, win, sizeof w);
  assert_int_equal(sta_strategy_sparsity(s, grid, &sp), STA_OK);
  /* 35 of 50 steps at 27/300 of the tiles */
  assert_float_equal(sp, 35.0 / 50.0 * (1.0 - 27.0 / 300.0), 1e-12);
  /* windows larger than the grid are clamped */
  int32_t big[3] = {9, 9, 99};
  assert_int_equal(sta_strategy_set(s, 0, 0, 0, big), STA_OK);
  double sp2;
  assert_int_equal(sta_strategy_sparsity(s, grid, &sp2), STA_OK);
  assert_float_equal(sp2, sp, 1e-12);
  sta_strategy_destroy(s);
  s = NULL;
  EXPECT_ERR(sta_strategy_uniform(&s, 0, 4, 24, win, NULL, 0), STA_ERR_ARGUMENT,
             "steps: expected >= 1, got 0");
  EXPECT_ERR(sta_strategy_uniform(&s, 3, 4, 24, win, NULL, 1), STA_ERR_WINDOW,
             "full: expected 3 ints, got NULL");
  EXPECT_ERR(sta_strategy_uniform(&s, 3, 4, 24, win, full, 4), STA_ERR_ARGUMENT,
             "full_steps: expected 0..3 (steps), got 4");
  int32_t zero[3] = {3, 0, 3};
  EXPECT_ERR(sta_strategy_uniform(&s, 3, 4, 24, zero, NULL, 0), STA_ERR_WINDOW,
             "window: Kh = 0, expected >= 1");
  assert_null(s);
  assert_int_equal(sta_strategy_uniform(&s, 2, 1, 1, win, NULL, 0), STA_OK);
  int32_t bad_grid[3] = {5, 0, 10};
  EXPECT_ERR(sta_strategy_sparsity(s, bad_grid, &sp), STA_ERR_WINDOW, "grid: h = 0, expected >= 1");
  sta_strategy_destroy(s);
}

/* The largest keys: counted without overflow, from JSON and
** from sta_strategy_set alike. */
static void test_largest_keys(void **state) {
  (void)state;
  const char *json = "{\"2147483646_5_2147483646\": [3, 3, 3], \"0_2147483646_0\": [1, 1, 1]}";
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_parse(&s, json, strlen(json)), STA_OK);
  int32_t t = 0, l = 0, h = 0, w[3];
  sta_strategy_extent(s, &t, &l, &h);
  assert_int_equal(t, INT32_MAX);
  assert_int_equal(l, INT32_MAX);
  assert_int_equal(h, INT32_MAX);
  assert_int_equal(sta_strategy_get(s, 2147483646, 5, 2147483646, w), STA_OK);
  assert_int_equal(w[0], 3);
  char *text = json_of(s);
  sta_strategy *r = NULL;
  assert_int_equal(sta_strategy_parse(&r, text, strlen(text)), STA_OK);
  assert_true(sta_strategy_equal(s, r));
  sta_free(text);
  sta_strategy_destroy(r);
  sta_strategy_destroy(s);
}

static void test_set_errors_unchanged(void **state) {
  (void)state;
  sta_strategy *s = random_strategy(3, 2, 4);
  char *before = json_of(s);
  int32_t w[3] = {3, 3, 3}, bad[3] = {3, 3, -1};
  EXPECT_ERR(sta_strategy_set(s, 0, 0, 0, bad), STA_ERR_WINDOW, "window: Kw = -1, expected >= 1");
  EXPECT_ERR(sta_strategy_set(s, 0, -2, 0, w), STA_ERR_ARGUMENT, "layer: expected >= 0, got -2");
  EXPECT_ERR(sta_strategy_set(s, 0, 0, -3, w), STA_ERR_ARGUMENT, "head: expected >= 0, got -3");
  EXPECT_ERR(sta_strategy_set(s, INT32_MAX, 0, 0, w), STA_ERR_ARGUMENT,
             "step: expected 0..2147483646, got 2147483647");
  EXPECT_ERR(sta_strategy_set(s, 0, 0, INT32_MAX, w), STA_ERR_ARGUMENT,
             "head: expected 0..2147483646, got 2147483647");
  EXPECT_ERR(sta_strategy_set(s, 0, 0, 0, NULL), STA_ERR_WINDOW, "window: expected 3 ints, got NULL");
  EXPECT_ERR(sta_strategy_set(NULL, 0, 0, 0, w), STA_ERR_ARGUMENT,
             "strategy: expected a strategy, got NULL");
  char *now = json_of(s);
  assert_string_equal(now, before);
  sta_free(now);
  /* an allocation failure while growing leaves it as it was */
  int failed = 0;
  for (int32_t i = 0; i < 64 && !failed; i++) {
    int32_t x[3] = {1 + 2 * (rand() % 4), 1, 1};
    char *prev = json_of(s);
    int64_t count = sta_strategy_count(s);
    sta_fault_arm(1);
    sta_status rc = sta_strategy_set(s, 100 + i, 0, 0, x);
    sta_fault_arm(0);
    if (rc == STA_ERR_NOMEM) {
      failed = 1;
      assert_int_equal(sta_strategy_count(s), count);
      now = json_of(s);
      assert_string_equal(now, prev);
      sta_free(now);
    } else {
      assert_int_equal(rc, STA_OK);
      assert_int_equal(sta_strategy_count(s), count + 1);
    }
    sta_free(prev);
  }
  assert_true(failed);
  /* and while writing JSON */
  char *j = (char *)&seed;
  sta_fault_arm(1);
  assert_int_equal(sta_strategy_to_json(s, &j), STA_ERR_NOMEM);
  sta_fault_arm(0);
  assert_ptr_equal(j, (char *)&seed);
  assert_string_equal(sta_last_error(), "out of host memory (mask strategy JSON)");
  sta_free(before);
  sta_strategy_destroy(s);
}

static void test_metadata(void **state) {
  (void)state;
  sta_strategy *s = random_strategy(3, 2, 4);
  sta_metadata *m = NULL;
  int32_t n;
  const int32_t *row;
  assert_int_equal(sta_metadata_from_strategy(&m, s, 2, 2, 4), STA_OK);
  assert_int_equal(sta_metadata_layers(m), 2);
  for (int32_t l = 0; l < 2; l++) {
    assert_int_equal(sta_metadata_row(m, l, &n, &row), STA_OK);
    assert_int_equal(n, 4);
    for (int32_t h = 0; h < 4; h++) {
      int32_t w[3];
      assert_int_equal(sta_strategy_get(s, 2, l, h, w), STA_OK);
      assert_memory_equal(row + 3 * h, w, sizeof w);
    }
  }
  sta_metadata_destroy(m);
  m = NULL;
  EXPECT_ERR(sta_metadata_from_strategy(&m, NULL, 0, 2, 4), STA_ERR_NO_STRATEGY,
             "mask_strategy cannot be None for SlidingTileAttention");
  EXPECT_ERR(sta_metadata_from_strategy(&m, s, 3, 2, 4), STA_ERR_KEY,
             "mask strategy has no window for \"3_0_0\" (step 3, layer 0, head 0)");
  EXPECT_ERR(sta_metadata_from_strategy(&m, s, 1, 2, 5), STA_ERR_KEY,
             "mask strategy has no window for \"1_0_4\" (step 1, layer 0, head 4)");
  sta_strategy *no0 = NULL;
  const char *j = "{\"1_0_0\": [3, 3, 3]}";
  assert_int_equal(sta_strategy_parse(&no0, j, strlen(j)), STA_OK);
  EXPECT_ERR(sta_metadata_from_strategy(&m, no0, 1, 1, 1), STA_ERR_NO_STEP0,
             "mask_strategy[0] cannot be None for SlidingTileAttention");
  assert_null(m);
  sta_strategy_destroy(no0);
  /* rows by hand, and a search table */
  int32_t cand[9] = {1, 1, 1, 3, 3, 3, 3, 4, 4};
  assert_int_equal(sta_metadata_create(&m, 3), STA_OK);
  assert_int_equal(sta_metadata_row(m, 1, &n, &row), STA_OK);
  assert_int_equal(n, 0);
  assert_int_equal(sta_metadata_set_row(m, 1, 3, cand), STA_OK);
  assert_int_equal(sta_metadata_row(m, 1, &n, &row), STA_OK);
  assert_int_equal(n, 3);
  assert_memory_equal(row, cand, sizeof cand);
  int32_t bad[3] = {1, 0, 1};
  EXPECT_ERR(sta_metadata_set_row(m, 1, 1, bad), STA_ERR_WINDOW, "windows[0]: Kh = 0, expected >= 1");
  EXPECT_ERR(sta_metadata_set_row(m, 3, 1, cand), STA_ERR_ARGUMENT, "layer: expected 0..2, got 3");
  assert_int_equal(sta_metadata_row(m, 1, &n, &row), STA_OK);
  assert_int_equal(n, 3);
  assert_memory_equal(row, cand, sizeof cand);
  sta_fault_arm(1);
  assert_int_equal(sta_metadata_set_row(m, 1, 1, cand), STA_ERR_NOMEM);
  sta_fault_arm(0);
  assert_int_equal(sta_metadata_row(m, 1, &n, &row), STA_OK);
  assert_int_equal(n, 3);
  assert_memory_equal(row, cand, sizeof cand);
  sta_metadata_destroy(m);
  m = NULL;
  assert_int_equal(sta_metadata_search(&m, 4, 3, cand), STA_OK);
  for (int32_t l = 0; l < 4; l++) {
    assert_int_equal(sta_metadata_row(m, l, &n, &row), STA_OK);
    assert_int_equal(n, 3);
    assert_memory_equal(row, cand, sizeof cand);
  }
  sta_metadata_destroy(m);
  m = NULL;
  EXPECT_ERR(sta_metadata_search(&m, 4, 0, cand), STA_ERR_ARGUMENT,
             "n_candidates: expected 1..1024 (the full window last), got 0");
  EXPECT_ERR(sta_metadata_create(&m, 0), STA_ERR_ARGUMENT, "layers: expected 1..1048576, got 0");
  assert_null(m);
  sta_strategy_destroy(s);
}

int main(void) {
  seed = (unsigned)time(NULL);
  srand(seed);
  printf("# test_strategy seed %u\n", seed);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_parse_get),
    cmocka_unit_test(test_parse_errors),
    cmocka_unit_test(test_roundtrip_files),
    cmocka_unit_test(test_load_default),
    cmocka_unit_test(test_uniform_sparsity),
    cmocka_unit_test(test_largest_keys),
    cmocka_unit_test(test_set_errors_unchanged),
    cmocka_unit_test(test_metadata),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
