/* test_files.c -- what every file sta writes or reads holds to, whatever
** its format (RELIABILITY.md's files class), for each writer (.npy,
** .safetensors, strategy, search results, plain text) and each JSON reader
** (strategy, search results, safetensors header):
**   - a symbolic link, dangling or not, chained, relative or absolute: the
**     file it names is written, the link stays a link;
**   - a failed write (the file size limit: EFBIG) names the user's path,
**     never the temporary file, and leaves the target as it was;
**   - the temporary files open now are listed for a signal handler
**     (sta_out_remove_pending removes them);
**   - every reader refuses text after the JSON object and a NUL (\u0000 or
**     raw) in any name, on generated documents that it reads when intact;
**   - device tensors save as their host copies (on a GPU machine). */
#define IO_TEST_NAME "test-files"
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "io_util.h"

/* ---- the writers ------------------------------------------------------------ */

enum { W_NPY, W_ST, W_STRATEGY, W_SEARCH, W_TEXT, W_N };
static const char *const WNAME[W_N] = {".npy", ".safetensors", "strategy", "search results",
                                      "text"};

/* Write with writer w to path (content of about `big` bytes). */
static sta_status write_with(int w, const char *path, size_t big) {
  int64_t n = (int64_t)(big / 4) + 1;
  sta_tensor *t = rand_tensor(STA_F32, 1, &n);
  sta_status rc = STA_OK;
  switch (w) {
  case W_NPY: rc = sta_npy_save(t, path); break;
  case W_ST: {
    const char *names[1] = {"t"};
    const sta_tensor *ts[1] = {t};
    rc = sta_safetensors_save(path, 1, names, ts);
    break;
  }
  case W_STRATEGY: {
    sta_strategy *s = NULL;
    int32_t win[3] = {3, 3, 3};
    int32_t steps = big > 4096 ? 64 : 1;
    assert_int_equal(sta_strategy_uniform(&s, steps, 8, 24, win, win, 0), STA_OK);
    rc = sta_strategy_save(s, path);
    sta_strategy_destroy(s);
    break;
  }
  case W_SEARCH: {
    sta_forward_batch *b = NULL;
    static const int32_t cand[6] = {1, 1, 1, 3, 3, 3};
    float loss[2 * 24];
    for (int i = 0; i < 48; i++) loss[i] = 0.125f * (float)(i + 1);
    assert_int_equal(sta_forward_batch_create(&b, 1), STA_OK);
    int32_t steps = big > 4096 ? 64 : 1;
    for (int32_t st = 0; st < steps; st++)
      for (int32_t l = 0; l < 4; l++)
        assert_int_equal(sta_forward_batch_record(b, 0, st, l, 2, cand, 24, loss, loss), STA_OK);
    rc = sta_forward_batch_save_search(b, 0, path);
    sta_forward_batch_destroy(b);
    break;
  }
  default: {
    char *buf = calloc(1, big + 1);
    assert_non_null(buf);
    memset(buf, 'x', big);
    rc = sta_file_write(path, buf, big);
    free(buf);
    break;
  }
  }
  sta_tensor_destroy(t);
  return rc;
}

static int is_link(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
}

static int is_file(const char *path) {
  struct stat st;
  return lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
}

/* The temporary files (".<name>.<pid>.<hex>.tmp") in dir. */
static int temporaries(const char *dir) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '^\\..*\\.tmp$' >/dev/null", dir);
  return system(cmd) == 0;
}

static void test_symlinks(void **state) {
  (void)state;
  char dir[300];
  snprintf(dir, sizeof dir, "%s", tpath("links"));
  assert_int_equal(mkdir(dir, 0777), 0);
  for (int w = 0; w < W_N; w++) {
    char target[400], link1[400], link2[400], rel[64];
    snprintf(target, sizeof target, "%s/target-%d", dir, w);
    snprintf(link1, sizeof link1, "%s/dangling-%d", dir, w);
    snprintf(link2, sizeof link2, "%s/chain-%d", dir, w);
    snprintf(rel, sizeof rel, "target-%d", w);
    remove(target);
    assert_int_equal(symlink(rel, link1), 0);   /* relative, dangling */
    assert_int_equal(symlink(link1, link2), 0); /* absolute, to a link */
    for (int round = 0; round < 3; round++) {
      const char *via = round == 1 ? link2 : link1; /* round 2: the target exists */
      if (write_with(w, via, 100) != STA_OK) fail_msg("%s via %s: %s", WNAME[w], via, sta_last_error());
      if (!is_link(link1) || !is_link(link2) || !is_file(target))
        fail_msg("%s, round %d: the links must stay links and %s be written", WNAME[w], round,
                 target);
    }
  }
  assert_false(temporaries(dir));
}

/* EFBIG: the size limit below what the writer writes; SIGXFSZ ignored. */
static void test_failures_name_the_path(void **state) {
  (void)state;
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
  for (int w = 0; w < W_N; w++) {
    char path[400];
    snprintf(path, sizeof path, "%s", tpath(WNAME[w][0] == '.' ? "big-file" : "big file"));
    write_bytes(path, "old contents", 12);
    lim = old;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    sta_status rc = write_with(w, path, 1 << 16);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    if (rc != STA_ERR_IO || !strstr(sta_last_error(), path) ||
        !strstr(sta_last_error(), "write failed: File too large") ||
        strstr(sta_last_error(), ".tmp"))
      fail_msg("%s: %s '%s', expected an I/O error naming %s", WNAME[w], sta_status_name(rc),
               sta_last_error(), path);
    size_t n;
    unsigned char *b = read_bytes(path, &n);
    assert_true(n == 12 && memcmp(b, "old contents", 12) == 0);
    free(b);
  }
  signal(SIGXFSZ, prev);
  assert_false(temporaries(tmpdir));
}

/* What a SIGINT handler calls (sta-run): every temporary file open now
** goes; the targets are untouched; a later abort is harmless. */
static void test_remove_pending(void **state) {
  (void)state;
  sta_outfile f[3];
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "pending-%d", i);
    assert_int_equal(sta_out_open(&f[i], tpath(name), name), STA_OK);
    sta_out_write(&f[i], "abc", 3);
  }
  assert_true(temporaries(tmpdir));
  sta_out_remove_pending();
  assert_false(temporaries(tmpdir));
  for (int i = 0; i < 3; i++) sta_out_abort(&f[i]);
  assert_int_equal(access(tpath("pending-0"), F_OK), -1);
}

/* ---- the JSON readers --------------------------------------------------------- */

enum { R_STRATEGY, R_SEARCH, R_ST, R_N };
static const char *const RNAME[R_N] = {"strategy", "search results", "safetensors header"};

/* A valid document for reader r (random content); *keys: offsets of the
** closing quote of every object key in it (up to 64). */
static char *document(int r, int64_t *keys, int *nk) {
  char *d = calloc(1, 1 << 14);
  assert_non_null(d);
  int n = 0;
  *nk = 0;
#define KEY(fmt, ...) do { n += sprintf(d + n, "\"" fmt, __VA_ARGS__); keys[(*nk)++] = n; \
                           n += sprintf(d + n, "\""); } while (0)
  if (r == R_STRATEGY) {
    int e = 1 + (int)(seed_counter++ % 6);
    n += sprintf(d + n, "{");
    for (int i = 0; i < e; i++) {
      if (i) n += sprintf(d + n, ", ");
      KEY("%d_%d_%d", i / 4, i % 4, (int)(seed_counter % 3));
      n += sprintf(d + n, ": [%d, %d, %d]", 1 + 2 * (i % 2), 3, 1);
    }
    n += sprintf(d + n, "}");
  } else if (r == R_SEARCH) {
    static const char *const C[3] = {"[1, 1, 1]", "[3, 3, 3]", "[1, 3, 5]"};
    int c = 1 + (int)(seed_counter++ % 3);
    n += sprintf(d + n, "{");
    KEY("%s", "L2_loss");
    n += sprintf(d + n, ": {");
    for (int i = 0; i < c; i++) {
      if (i) n += sprintf(d + n, ", ");
      KEY("%s", C[i]);
      n += sprintf(d + n, ": [[[%d.5, 0.25], [1, 2]]]", i);
    }
    n += sprintf(d + n, "}, ");
    KEY("%s", "L1_loss");
    n += sprintf(d + n, ": {}}");
  } else { /* each key, then what follows it */
    static const char *const KV[6][2] = {
      {"__metadata__", ": {"}, {"format", ": \"pt\"}, "}, {"a", ": {"},
      {"dtype", ": \"F32\", "}, {"shape", ": [2], "}, {"data_offsets", ": [0, 8]}}"}};
    n += sprintf(d + n, "{");
    for (int i = 0; i < 6; i++) {
      KEY("%s", KV[i][0]);
      n += sprintf(d + n, "%s", KV[i][1]);
    }
  }
#undef KEY
  return d;
}

/* Read text as reader r: STA_OK or its error. */
static sta_status read_as(int r, const char *text, size_t len) {
  const char *path = tpath("doc");
  if (r == R_ST) {
    unsigned char *buf = calloc(1, len + 16);
    assert_non_null(buf);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, text, len);
    write_bytes(path, buf, len + 8 + 8); /* 8 data bytes */
    free(buf);
    sta_safetensors *f = NULL;
    sta_status rc = sta_safetensors_open(&f, path);
    sta_safetensors_close(f);
    return rc;
  }
  write_bytes(path, text, len);
  if (r == R_STRATEGY) {
    sta_strategy *s = NULL;
    sta_status rc = sta_strategy_load(&s, path);
    sta_strategy_destroy(s);
    return rc;
  }
  sta_strategy *s = NULL;
  const char *files[1] = {path};
  int32_t full[3] = {5, 5, 5};
  sta_status rc = sta_tune(&s, 1, files, 0, full, NULL);
  sta_strategy_destroy(s);
  return rc;
}

static void test_json_readers(void **state) {
  (void)state;
  static const char *const JUNK[5] = {" x", "\n{}", " []", ",", "\"\""};
  int cases = 0;
  for (int rep = 0; rep < 40; rep++)
    for (int r = 0; r < R_N; r++) {
      int64_t keys[64];
      int nk;
      char *d = document(r, keys, &nk);
      size_t len = strlen(d);
      if (read_as(r, d, len) != STA_OK) fail_msg("%s: '%s': %s", RNAME[r], d, sta_last_error());
      /* text after the object */
      char *t = calloc(1, len + 16);
      memcpy(t, d, len);
      strcpy(t + len, JUNK[rep % 5]);
      sta_status rc = read_as(r, t, strlen(t));
      if (rc != STA_ERR_FORMAT || !strstr(sta_last_error(), "unexpected text after the JSON"))
        fail_msg("%s: '%s': %s '%s'", RNAME[r], t, sta_status_name(rc), sta_last_error());
      free(t);
      /* a NUL at the end of a key, as \u0000 or as a raw byte */
      int64_t at = keys[(size_t)(seed_counter++ % (uint64_t)nk)];
      for (int raw = 0; raw < 2; raw++) {
        char *u = calloc(1, len + 16);
        memcpy(u, d, (size_t)at);
        size_t ins = raw ? 1 : 6;
        memcpy(u + at, raw ? "\0" : "\\u0000", ins);
        memcpy(u + at + ins, d + at, len - (size_t)at);
        rc = read_as(r, u, len + ins);
        if (rc != STA_ERR_FORMAT || !strstr(sta_last_error(), "NUL character in a string"))
          fail_msg("%s: a NUL (%s) in the key ending at %lld: %s '%s'", RNAME[r],
                   raw ? "raw" : "\\u0000", (long long)at, sta_status_name(rc), sta_last_error());
        free(u);
      }
      cases += 4;
      free(d);
    }
  printf("# %d documents read as intended: every reader took the intact ones and refused "
         "trailing text and a NUL in any key\n", cases);
}

static void test_save_device(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA)) skip();
  int64_t shape[3] = {3, 5, 8};
  int32_t perm[3] = {1, 0, 2};
  for (int d = 0; d < 3; d++) {
    sta_tensor *h = rand_tensor((sta_dtype)d, 3, shape), *dev = NULL, *dp = NULL, *hp = NULL;
    sta_tensor *a = NULL, *b = NULL;
    assert_int_equal(sta_tensor_to(&dev, h, (sta_dtype)d, STA_CUDA), STA_OK);
    assert_int_equal(sta_tensor_permute(&dp, dev, perm), STA_OK);
    assert_int_equal(sta_tensor_permute(&hp, h, perm), STA_OK);
    assert_int_equal(sta_npy_save(dp, tpath("dev.npy")), STA_OK);
    assert_int_equal(sta_npy_load(&a, tpath("dev.npy"), 1), STA_OK);
    assert_same(hp, a);
    const char *names[2] = {"dev", "host"};
    const sta_tensor *ts[2] = {dp, h};
    assert_int_equal(sta_safetensors_save(tpath("dev.safetensors"), 2, names, ts), STA_OK);
    sta_safetensors *f = NULL;
    assert_int_equal(sta_safetensors_open(&f, tpath("dev.safetensors")), STA_OK);
    assert_int_equal(sta_safetensors_read(f, "dev", &b), STA_OK);
    assert_same(hp, b);
    sta_safetensors_close(f);
    sta_tensor_destroy(a);
    sta_tensor_destroy(b);
    sta_tensor_destroy(h);
    sta_tensor_destroy(hp);
    sta_tensor_destroy(dev);
    sta_tensor_destroy(dp);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_symlinks),
    cmocka_unit_test(test_failures_name_the_path),
    cmocka_unit_test(test_remove_pending),
    cmocka_unit_test(test_json_readers),
    cmocka_unit_test(test_save_device),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
