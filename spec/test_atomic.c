/* test_atomic.c -- every writer (npy, safetensors, strategy, search
** results, sta_file_write) replaces its target atomically: a failed write
** (here: a file size limit, a device that is full) leaves the old file as
** it was and no temporary file behind; device nodes, directories and
** symbolic links at the target are never removed or replaced. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "test_util.h"

static char tmpdir[256];

static const char *tpath(const char *name) { return sta_test_path(tmpdir, name); }

static void write_str(const char *path, const char *s) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(s, 1, strlen(s), f), strlen(s));
  assert_int_equal(fclose(f), 0);
}

static void assert_content(const char *path, const char *want) {
  char buf[256] = {0};
  FILE *f = fopen(path, "rb");
  if (!f) fail_msg("%s: gone (%s)", path, strerror(errno));
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  assert_int_equal(n, strlen(want));
  assert_string_equal(buf, want);
}

/* Entries of tmpdir (no . and ..). */
static int entries(void) {
  DIR *d = opendir(tmpdir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

static int setup(void **state) {
  (void)state;
  if (sta_test_mkdtemp(tmpdir, sizeof tmpdir, "test-atomic")) return -1;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return sta_test_rmdir(tmpdir);
}

/* ---- the writers, each producing more than LIMIT bytes ------------------ */

#define LIMIT 4096

typedef sta_status (*writer)(const char *path);

static sta_status w_npy(const char *path) {
  int64_t shape[2] = {64, 64};
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 2, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, 11, 0, 1), STA_OK);
  sta_status rc = sta_npy_save(t, path);
  sta_tensor_destroy(t);
  return rc;
}

static sta_status w_safetensors(const char *path) {
  int64_t shape[2] = {32, 64};
  sta_tensor *a = NULL, *b = NULL;
  assert_int_equal(sta_tensor_create(&a, STA_BF16, STA_CPU, 2, shape), STA_OK);
  assert_int_equal(sta_tensor_create(&b, STA_F32, STA_CPU, 2, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(a, 12, 0, 1), STA_OK);
  assert_int_equal(sta_tensor_randn(b, 13, 0, 1), STA_OK);
  const char *names[2] = {"a", "b"};
  const sta_tensor *ts[2] = {a, b};
  sta_status rc = sta_safetensors_save(path, 2, names, ts);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  return rc;
}

static sta_status w_strategy(const char *path) {
  sta_strategy *s = NULL;
  int32_t w[3] = {3, 3, 3};
  assert_int_equal(sta_strategy_uniform(&s, 10, 4, 8, w, NULL, 0), STA_OK);
  sta_status rc = sta_strategy_save(s, path);
  sta_strategy_destroy(s);
  return rc;
}

static sta_status w_search(const char *path) {
  sta_forward_batch *fb = NULL;
  int32_t cand[6] = {1, 1, 1, 3, 3, 3};
  float l1[2 * 16], l2[2 * 16];
  for (int i = 0; i < 32; i++) { l1[i] = 0.1f * (float)i + 0.013f; l2[i] = 0.7f / (float)(i + 3); }
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  for (int32_t step = 0; step < 4; step++)
    for (int32_t layer = 0; layer < 4; layer++)
      assert_int_equal(sta_forward_batch_record(fb, 0, step, layer, 2, cand, 16, l1, l2), STA_OK);
  sta_status rc = sta_forward_batch_save_search(fb, 0, path);
  sta_forward_batch_destroy(fb);
  return rc;
}

static sta_status w_raw(const char *path) {
  static char big[3 * LIMIT];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (char)('a' + i % 26);
  return sta_file_write(path, big, sizeof big);
}

static const struct { const char *name; writer fn; } WRITERS[] = {
  {"x.npy", w_npy}, {"x.safetensors", w_safetensors}, {"s.json", w_strategy},
  {"r.json", w_search}, {"raw.bin", w_raw}};
#define NW (sizeof WRITERS / sizeof WRITERS[0])

/* A write that fails midway (the file size limit
** stands in for a full disk) used to truncate the target and then remove
** it; now the old file stays, byte for byte, and nothing else is left. */
static void test_failed_write_keeps_old_file(void **state) {
  (void)state;
  struct rlimit old, lim;
  assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
  void (*prev)(int) = signal(SIGXFSZ, SIG_IGN); /* write() then fails with EFBIG */
  for (size_t i = 0; i < NW; i++) {
    const char *p = tpath(WRITERS[i].name);
    write_str(p, "the user's earlier file");
    int before = entries();
    lim = old;
    lim.rlim_cur = LIMIT;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    sta_status rc = WRITERS[i].fn(p);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    if (rc != STA_ERR_IO) fail_msg("%s: %s (%s)", WRITERS[i].name, sta_status_name(rc), sta_last_error());
    if (!strstr(sta_last_error(), "write failed: File too large"))
      fail_msg("%s: message '%s'", WRITERS[i].name, sta_last_error());
    assert_content(p, "the user's earlier file");
    assert_int_equal(entries(), before); /* no temporary file left */
    /* and without the limit the same call replaces it */
    assert_int_equal(WRITERS[i].fn(p), STA_OK);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_size > LIMIT);
    assert_int_equal(entries(), before);
    unlink(p);
  }
  signal(SIGXFSZ, prev);
}

/* /dev/full run as root used to be deleted by the failed write's remove().
** A node of the same device (1, 7) stands in for it here; a node of
** /dev/null's (1, 3) takes a write and stays too. */
static void test_device_target_not_removed(void **state) {
  (void)state;
  const char *full = tpath("full"), *null = tpath("null");
  if (mknod(full, S_IFCHR | 0666, makedev(1, 7)) != 0 ||
      mknod(null, S_IFCHR | 0666, makedev(1, 3)) != 0) {
    printf("# mknod not permitted here (%s): device targets not checked\n", strerror(errno));
    unlink(full);
    skip();
  }
  struct stat st;
  for (size_t i = 0; i < NW; i++) {
    sta_status rc = WRITERS[i].fn(full);
    if (rc != STA_ERR_IO) fail_msg("%s: %s", WRITERS[i].name, sta_status_name(rc));
    if (!strstr(sta_last_error(), "write failed: No space left on device"))
      fail_msg("%s: message '%s'", WRITERS[i].name, sta_last_error());
    assert_int_equal(lstat(full, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
    assert_int_equal(WRITERS[i].fn(null), STA_OK);
    assert_int_equal(lstat(null, &st), 0);
    assert_true(S_ISCHR(st.st_mode));
  }
  assert_int_equal(entries(), 2);
  unlink(full);
  unlink(null);
}

static void test_directory_symlink_mode(void **state) {
  (void)state;
  struct stat st;
  const char *dir = tpath("adir");
  assert_int_equal(mkdir(dir, 0755), 0);
  for (size_t i = 0; i < NW; i++) {
    EXPECT_ERR(WRITERS[i].fn(dir), STA_ERR_IO, NULL);
    assert_non_null(strstr(sta_last_error(), "cannot open for writing: Is a directory"));
    assert_int_equal(stat(dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
  }
  assert_int_equal(rmdir(dir), 0);
  /* a symbolic link: its target is replaced, the link stays a link */
  char real[512], link[512];
  snprintf(real, sizeof real, "%s", tpath("real.npy"));
  snprintf(link, sizeof link, "%s", tpath("link.npy"));
  write_str(real, "old");
  assert_int_equal(symlink("real.npy", link), 0);
  assert_int_equal(chmod(real, 0640), 0);
  assert_int_equal(w_npy(link), STA_OK);
  assert_int_equal(lstat(link, &st), 0);
  assert_true(S_ISLNK(st.st_mode));
  assert_int_equal(stat(real, &st), 0);
  assert_true(st.st_size > LIMIT);
  assert_int_equal(st.st_mode & 07777, 0640); /* the old file's mode */
  assert_int_equal(entries(), 2);
  unlink(link);
  unlink(real);
  /* a missing directory: nothing is made */
  EXPECT_ERR(sta_file_write(tpath("no/such/dir"), "x", 1), STA_ERR_IO, NULL);
  assert_non_null(strstr(sta_last_error(), "cannot open for writing: No such file or directory"));
  EXPECT_ERR(sta_file_write(NULL, "x", 1), STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  EXPECT_ERR(sta_file_write(tpath("x"), NULL, 1), STA_ERR_ARGUMENT,
             "data: expected 1 bytes, got NULL");
  assert_int_equal(entries(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_failed_write_keeps_old_file),
    cmocka_unit_test(test_device_target_not_removed),
    cmocka_unit_test(test_directory_symlink_mode),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
