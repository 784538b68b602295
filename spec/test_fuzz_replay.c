/*
** test_fuzz_replay.c -- every libFuzzer target (spec/fuzz/fuzz_*.c) built
** into one cmocka binary, replaying its committed corpus
** spec/fuzz/corpus/<target>/ (seeds, and every input that ever crashed:
** the regression tests of scripts/test/fuzz's findings).  A broken invariant
** traps, so this runs under make test and, with ASan/UBSan, make sanitize.
*/
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <dirent.h>
#include <cmocka.h>

#define LLVMFuzzerTestOneInput fuzz_strategy_one
#include "fuzz/fuzz_strategy.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_npy_one
#include "fuzz/fuzz_npy.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_safetensors_one
#include "fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_tune_one
#include "fuzz/fuzz_tune.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_forward_one
#include "fuzz/fuzz_forward.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput fuzz_api_one
#include "fuzz/fuzz_api.c"
#undef LLVMFuzzerTestOneInput

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Run fn on every file of spec/fuzz/corpus/<name>, in name order. */
static void replay(const char *name, int (*fn)(const uint8_t *, size_t)) {
  char dirpath[256];
  snprintf(dirpath, sizeof dirpath, "spec/fuzz/corpus/%s", name);
  DIR *dir = opendir(dirpath);
  if (!dir) fail_msg("cannot open %s (run from the repository root)", dirpath);
  char **names = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(dir)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    names = realloc(names, (n + 1) * sizeof *names);
    assert_non_null(names);
    names[n] = strdup(e->d_name);
    assert_non_null(names[n++]);
  }
  closedir(dir);
  qsort(names, n, sizeof *names, by_name);
  for (size_t i = 0; i < n; i++) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dirpath, names[i]);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *buf = malloc(1 << 20);
    assert_non_null(buf);
    size_t len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    /* an exact-size copy, so ASan sees reads past the input's end */
    uint8_t *exact = malloc(len ? len : 1);
    assert_non_null(exact);
    memcpy(exact, buf, len);
    free(buf);
    assert_int_equal(fn(exact, len), 0);
    free(exact);
    free(names[i]);
  }
  free(names);
  printf("# fuzz replay: %s: %zu inputs\n", name, n);
  assert_true(n > 0);
}

static void cleanup_files(void) {
  const char *tags[] = {"npy", "st", "tune", "api-search", "api-strategy"};
  for (int d = 0; d < 2; d++)
    for (size_t i = 0; i < 5; i++) {
      char p[128];
      snprintf(p, sizeof p, "%s/sta-fuzz-%d-%s", d ? "/tmp" : "/dev/shm", (int)getpid(), tags[i]);
      remove(p);
    }
}

static void test_replay_strategy(void **state) { (void)state; replay("strategy", fuzz_strategy_one); }
static void test_replay_npy(void **state) { (void)state; replay("npy", fuzz_npy_one); }
static void test_replay_safetensors(void **state) {
  (void)state;
  replay("safetensors", fuzz_safetensors_one);
}
static void test_replay_tune(void **state) { (void)state; replay("tune", fuzz_tune_one); }
static void test_replay_forward(void **state) { (void)state; replay("forward", fuzz_forward_one); }
static void test_replay_api(void **state) { (void)state; replay("api", fuzz_api_one); }

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_replay_strategy),    cmocka_unit_test(test_replay_npy),
    cmocka_unit_test(test_replay_safetensors), cmocka_unit_test(test_replay_tune),
    cmocka_unit_test(test_replay_forward),   cmocka_unit_test(test_replay_api),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  cleanup_files();
  return rc;
}
