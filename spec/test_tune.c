/* test_tune.c -- sta_tune on hand-written search files: averaging, argmin,
** ties, skip_steps, the report, and every malformed-file error. */
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

static const char *path_of(int i) {
  static char buf[16][256];
  snprintf(buf[i], sizeof buf[i], "/tmp/sta-test-tune-%d-%d.json", (int)getpid(), i);
  return buf[i];
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

enum { NC = 3, S = 4, L = 2, HH = 3 };
static const int32_t CANDS[NC][3] = {{3, 1, 10}, {1, 5, 7}, {3, 3, 3}};
static const int32_t FULL[3] = {3, 6, 10};

/* A search file with losses x[c][s][l][h]; candidates in order perm. */
static void write_search(const char *path, double x[NC][S][L][HH], const int *perm) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  const char *names[2] = {"L2_loss", "L1_loss"};
  fputs("{", f);
  for (int which = 0; which < 2; which++) {
    fprintf(f, "%s\"%s\": {", which ? ", " : "", names[which]);
    for (int i = 0; i < NC; i++) {
      int c = perm[i];
      fprintf(f, "%s\"[%d, %d, %d]\": [", i ? ", " : "", CANDS[c][0], CANDS[c][1], CANDS[c][2]);
      for (int s = 0; s < S; s++) {
        fprintf(f, "%s[", s ? ", " : "");
        for (int l = 0; l < L; l++) {
          fprintf(f, "%s[", l ? ", " : "");
          for (int h = 0; h < HH; h++)
            fprintf(f, "%s%.17g", h ? ", " : "", which ? 1.0 - x[c][s][l][h] : x[c][s][l][h]);
          fputs("]", f);
        }
        fputs("]", f);
      }
      fputs("]", f);
    }
    fputs("}", f);
  }
  fputs("}\n", f);
  fclose(f);
}

static void random_losses(double x[NC][S][L][HH]) {
  for (int c = 0; c < NC; c++)
    for (int s = 0; s < S; s++)
      for (int l = 0; l < L; l++)
        for (int h = 0; h < HH; h++) x[c][s][l][h] = (rand_r(&seed) % 1000000) / 1e6 + 1e-4;
}

static void test_argmin_average_skip(void **state) {
  (void)state;
  static double a[NC][S][L][HH], b[NC][S][L][HH];
  random_losses(a);
  random_losses(b);
  /* a tie in the average on (1, 0, 2): first listed in the first file wins */
  a[0][1][0][2] = 0.25; b[0][1][0][2] = 0.25;
  a[2][1][0][2] = 0.5; b[2][1][0][2] = 0.0;
  a[1][1][0][2] = 0.9; b[1][1][0][2] = 0.9;
  const int order_a[NC] = {0, 1, 2}, order_b[NC] = {2, 0, 1};
  write_search(path_of(0), a, order_a);
  write_search(path_of(1), b, order_b);
  const char *files[2] = {path_of(0), path_of(1)};
  for (int skip = 0; skip <= S + 1; skip++) {
    sta_strategy *s = NULL;
    sta_tune_report rep;
    assert_int_equal(sta_tune(&s, 2, files, skip, FULL, &rep), STA_OK);
    assert_int_equal(sta_strategy_check(s, S, L, HH), STA_OK);
    assert_int_equal(sta_strategy_count(s), S * L * HH);
    int64_t counts[NC + 1] = {0};
    double vol = 0;
    for (int t = 0; t < S; t++)
      for (int l = 0; l < L; l++)
        for (int h = 0; h < HH; h++) {
          int best = -1;
          if (t >= skip)
            for (int c = 0; c < NC; c++)
              if (best < 0 || (a[c][t][l][h] + b[c][t][l][h]) / 2 <
                                  (a[best][t][l][h] + b[best][t][l][h]) / 2)
                best = c;
          const int32_t *want = best < 0 ? FULL : CANDS[best];
          counts[best < 0 ? NC : best]++;
          vol += (double)(want[0] < 3 ? want[0] : 3) * (want[1] < 6 ? want[1] : 6) *
                 (want[2] < 10 ? want[2] : 10);
          int32_t w[3];
          assert_int_equal(sta_strategy_get(s, t, l, h, w), STA_OK);
          assert_memory_equal(w, want, sizeof w);
        }
    if (skip <= 1) {
      int32_t w[3];
      assert_int_equal(sta_strategy_get(s, 1, 0, 2, w), STA_OK);
      assert_memory_equal(w, CANDS[0], sizeof w); /* the tie */
    }
    assert_float_equal(rep.sparsity, 1.0 - vol / (S * L * HH * 180.0), 1e-12);
    int k = 0;
    for (int c = 0; c <= NC; c++) {
      if (!counts[c]) continue;
      assert_memory_equal(rep.windows[k], c == NC ? FULL : CANDS[c], 12);
      assert_int_equal(rep.counts[k], counts[c]);
      k++;
    }
    assert_int_equal(rep.n_windows, k);
    sta_strategy_destroy(s);
  }
  remove(path_of(0));
  remove(path_of(1));
}

/* The full window recorded as a candidate can be chosen and is counted as
** full in the report. */
static void test_full_as_candidate(void **state) {
  (void)state;
  const char *text =
      "{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]],"
      " \"[3, 6, 10]\": [[[0.0, 0.2]], [[0.0, 0.2]]]}}";
  write_file(path_of(2), text);
  const char *files[1] = {path_of(2)};
  sta_strategy *s = NULL;
  sta_tune_report rep;
  assert_int_equal(sta_tune(&s, 1, files, 1, FULL, &rep), STA_OK);
  char *json = NULL;
  assert_int_equal(sta_strategy_to_json(s, &json), STA_OK);
  assert_string_equal(json, "{\n  \"0_0_0\": [3, 6, 10],\n  \"0_0_1\": [3, 6, 10],\n"
                            "  \"1_0_0\": [3, 6, 10],\n  \"1_0_1\": [3, 3, 3]\n}\n");
  sta_free(json);
  assert_int_equal(rep.n_windows, 2);
  assert_memory_equal(rep.windows[0], ((int32_t[]){3, 3, 3}), 12);
  assert_int_equal(rep.counts[0], 1);
  assert_memory_equal(rep.windows[1], FULL, 12);
  assert_int_equal(rep.counts[1], 3);
  assert_float_equal(rep.sparsity, 1.0 - (3 * 180 + 27) / (4 * 180.0), 1e-12);
  sta_strategy_destroy(s);
  remove(path_of(2));
}

static void test_defaults(void **state) {
  (void)state;
  int32_t full[3] = {0, 0, 0}, skip = 0;
  sta_tune_defaults(full, &skip);
  assert_memory_equal(full, FULL, 12);
  assert_int_equal(skip, 12);
}

static void test_errors(void **state) {
  (void)state;
  const char *good = "{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]],"
                     " \"[1, 1, 1]\": [[[0.9, 0.2]], [[0.3, 0.2]]]}, \"L1_loss\": {}}";
  write_file(path_of(3), good);
  static const struct { const char *text, *msg; } cases[] = {
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]]]", "malformed JSON at byte 39"},
    {"[1, 2]", "expected an object with \"L2_loss\": {\"[Kt, Kh, Kw]\": [step][layer][head], ...}"},
    {"{\"L1_loss\": {}}", "expected an object with \"L2_loss\": {\"[Kt, Kh, Kw]\": [step][layer][head], ...}"},
    {"{\"L2_loss\": [1]}", "expected an object with \"L2_loss\": {\"[Kt, Kh, Kw]\": [step][layer][head], ...}"},
    {"{\"L2_loss\": {}}", "L2_loss holds no candidates"},
    {"{\"L2_loss\": {\"3_3_3\": [[[0.5]]]}}", "L2_loss key \"3_3_3\" is not a window like \"[3, 1, 10]\""},
    {"{\"L2_loss\": {\"[3, 3]\": [[[0.5]]]}}", "L2_loss key \"[3, 3]\" is not a window like \"[3, 1, 10]\""},
    {"{\"L2_loss\": {\"[3, 0, 3]\": [[[0.5]]]}}", "L2_loss key \"[3, 0, 3]\" is not a window like \"[3, 1, 10]\""},
    {"{\"L2_loss\": {\"[3, 3, 3]x\": [[[0.5]]]}}", "L2_loss key \"[3, 3, 3]x\" is not a window like \"[3, 1, 10]\""},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5]]], \"[3,3,3]\": [[[0.5]]]}}", "L2_loss key \"[3,3,3]\" appears twice"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, \"x\"]]]}}", "L2_loss[\"[3, 3, 3]\"][0][0][1] is not a number"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, null]]]}}", "L2_loss[\"[3, 3, 3]\"][0][0][1] is not a number"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5]]]}}", "L2_loss[\"[3, 3, 3]\"][1][0] is not a list of 2 heads"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1], [0.5, 0.1]]]}}", "L2_loss[\"[3, 3, 3]\"][1] is not a list of 1 layers"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5]]], \"[1, 1, 1]\": [[[0.5]], [[0.5]]]}}", "L2_loss[\"[1, 1, 1]\"] is not a list of 1 steps"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": 0.5}}", "L2_loss[\"[3, 3, 3]\"] is not a non-empty list of steps"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": []}}", "L2_loss[\"[3, 3, 3]\"] is not a non-empty list of steps"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[]]}}", "L2_loss[\"[3, 3, 3]\"][0] is not a non-empty list of layers"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[]]]}}", "L2_loss[\"[3, 3, 3]\"][0][0] is not a non-empty list of heads"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[0.5]]}}", "L2_loss[\"[3, 3, 3]\"][0][0] is not a non-empty list of heads"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_file(path_of(4), cases[i].text);
    const char *files[1] = {path_of(4)};
    sta_strategy *s = (sta_strategy *)&seed;
    char msg[768];
    snprintf(msg, sizeof msg, "search results \"%s\": %s", path_of(4), cases[i].msg);
    EXPECT_ERR(sta_tune(&s, 1, files, 0, FULL, NULL), STA_ERR_FORMAT, msg);
    assert_ptr_equal(s, (sta_strategy *)&seed);
  }
  /* a second file that disagrees with the first */
  static const struct { const char *text, *msg; } pairs[] = {
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]]}}", "1 candidates, \"%s\" has 2"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]], \"[1, 1, 3]\": [[[0.9, 0.2]], [[0.3, 0.2]]]}}",
     "candidate \"[1, 1, 3]\" is not in \"%s\""},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]], \"[3,3,3]\": [[[0.9, 0.2]], [[0.3, 0.2]]]}}",
     "L2_loss key \"[3,3,3]\" appears twice%.0s"},
    {"{\"L2_loss\": {\"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]], [[0.5, 0.1]]], \"[1, 1, 1]\": [[[0.9, 0.2]], [[0.3, 0.2]]]}}",
     "L2_loss[\"[3, 3, 3]\"] is not a list of 2 steps as in \"%s\""},
    {"{\"L2_loss\": {\"[1, 1, 1]\": [[[0.9, 0.2]], [[0.3, 0.2, 0.1]]], \"[3, 3, 3]\": [[[0.5, 0.1]], [[0.5, 0.1]]]}}",
     "L2_loss[\"[1, 1, 1]\"][1][0] is not a list of 2 heads as in \"%s\""},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
    write_file(path_of(5), pairs[i].text);
    const char *files[2] = {path_of(3), path_of(5)};
    sta_strategy *s = NULL;
    char inner[512], msg[1024];
    snprintf(inner, sizeof inner, pairs[i].msg, path_of(3));
    snprintf(msg, sizeof msg, "search results \"%s\": %s", path_of(5), inner);
    EXPECT_ERR(sta_tune(&s, 2, files, 0, FULL, NULL), STA_ERR_FORMAT, msg);
    assert_null(s);
  }
  /* the good file alone, and the same file twice, tune fine */
  const char *twice[2] = {path_of(3), path_of(3)};
  sta_strategy *s = NULL;
  assert_int_equal(sta_tune(&s, 2, twice, 0, FULL, NULL), STA_OK);
  int32_t w[3];
  assert_int_equal(sta_strategy_get(s, 0, 0, 0, w), STA_OK);
  assert_memory_equal(w, ((int32_t[]){3, 3, 3}), 12);
  assert_int_equal(sta_strategy_get(s, 1, 0, 0, w), STA_OK);
  assert_memory_equal(w, ((int32_t[]){1, 1, 1}), 12);
  sta_strategy_destroy(s);
  s = NULL;
  /* files that cannot be read, and bad arguments */
  char msg[512];
  const char *missing[1] = {path_of(6)};
  remove(path_of(6));
  snprintf(msg, sizeof msg, "search results: cannot open \"%s\": No such file or directory", path_of(6));
  EXPECT_ERR(sta_tune(&s, 1, missing, 0, FULL, NULL), STA_ERR_IO, msg);
  const char *files[1] = {path_of(3)};
  EXPECT_ERR(sta_tune(&s, 0, files, 0, FULL, NULL), STA_ERR_ARGUMENT, "n_files: expected >= 1, got 0");
  EXPECT_ERR(sta_tune(&s, 1, NULL, 0, FULL, NULL), STA_ERR_ARGUMENT,
             "paths: expected 1 file names, got NULL");
  const char *nulls[2] = {path_of(3), NULL};
  EXPECT_ERR(sta_tune(&s, 2, nulls, 0, FULL, NULL), STA_ERR_ARGUMENT,
             "paths[1]: expected a file name, got NULL");
  EXPECT_ERR(sta_tune(&s, 1, files, -1, FULL, NULL), STA_ERR_ARGUMENT,
             "skip_steps: expected >= 0, got -1");
  EXPECT_ERR(sta_tune(&s, 1, files, 0, NULL, NULL), STA_ERR_WINDOW, "full: expected 3 ints, got NULL");
  EXPECT_ERR(sta_tune(&s, 1, files, 0, ((int32_t[]){3, 0, 10}), NULL), STA_ERR_WINDOW,
             "full: Kh = 0, expected >= 1");
  EXPECT_ERR(sta_tune(NULL, 1, files, 0, FULL, NULL), STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  assert_null(s);
  /* allocation failures anywhere leave *out alone */
  for (int64_t n = 1; n < 200; n++) {
    sta_fault_arm(n);
    sta_status rc = sta_tune(&s, 2, twice, 1, FULL, NULL);
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_null(s);
  }
  assert_non_null(s);
  sta_strategy_destroy(s);
  for (int i = 3; i <= 5; i++) remove(path_of(i));
}

int main(void) {
  seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  printf("# test_tune seed %u\n", seed);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_argmin_average_skip),
    cmocka_unit_test(test_full_as_candidate),
    cmocka_unit_test(test_defaults),
    cmocka_unit_test(test_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
