/* cli_util.h -- what the sta-run tests share (test_cli.c, test_cli_files.c):
** a temporary folder, running build/sta-run in it (found as $BUILD/sta-run,
** else next to the test binary's folder: build/test/x -> build/sta-run),
** problems written as files and the direct forward to compare with.
** Header-only. */
#ifndef STA_CLI_UTIL_H
#define STA_CLI_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <dirent.h>
#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "sta.h"
#include "test_util.h"

static char tmpdir[256], exe[1024];
static char out_text[8192], err_text[8192];
static uint64_t seed_counter = 9001;

static inline const char *tpath(const char *name) { return sta_test_path(tmpdir, name); }

static inline void slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
  buf[n] = '\0';
  if (f) fclose(f);
}

/* Run sta-run with args (shell words, paths already quoted) after the shell
** commands pre ("" or e.g. "ulimit -f 8;"), in tmpdir; exit status. */
static inline int vrun(const char *pre, const char *fmt, va_list ap) {
  char args[4096], cmd[6000];
  vsnprintf(args, sizeof args, fmt, ap);
  snprintf(cmd, sizeof cmd, "cd '%s' && %s '%s' %s >'%s/stdout' 2>'%s/stderr'", tmpdir, pre,
           exe, args, tmpdir, tmpdir);
  int st = system(cmd);
  slurp(tpath("stdout"), out_text, sizeof out_text);
  slurp(tpath("stderr"), err_text, sizeof err_text);
  if (st == -1 || !WIFEXITED(st)) fail_msg("sta-run %s: did not exit (%d)", args, st);
  return WEXITSTATUS(st);
}

static inline int run(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vrun("", fmt, ap);
  va_end(ap);
  return rc;
}

static inline int run_sh(const char *pre, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vrun(pre, fmt, ap);
  va_end(ap);
  return rc;
}

static inline int group_setup(void **state) {
  (void)state;
  const char *b = getenv("BUILD");
  char self[1024];
  if (b && *b) {
    if (b[0] == '/') snprintf(exe, sizeof exe, "%s/sta-run", b);
    else {
      char cwd[512];
      if (!getcwd(cwd, sizeof cwd)) return -1;
      snprintf(exe, sizeof exe, "%s/%s/sta-run", cwd, b);
    }
  }
  if (!exe[0] || access(exe, X_OK) != 0) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return -1;
    self[n] = '\0';
    char *dir = dirname(self); /* build/test */
    snprintf(exe, sizeof exe, "%s/../sta-run", dir);
  }
  if (access(exe, X_OK) != 0) {
    fprintf(stderr, "test_cli: sta-run not found (%s); build it with make\n", exe);
    return -1;
  }
  return sta_test_mkdtemp(tmpdir, sizeof tmpdir, CLI_TEST_NAME);
}

static inline int group_teardown(void **state) {
  (void)state;
  return sta_test_rmdir(tmpdir);
}

/* ---- helpers ---------------------------------------------------------- */

typedef struct problem {
  sta_tensor *q, *k, *v;
  sta_attention_desc desc;
  int32_t windows[3 * 8];
  int64_t b, s, h, d;
} problem;

static inline sta_tensor *rnd(sta_dtype dt, const int64_t shape[4]) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_counter++, 0.0, 1.0), STA_OK);
  return t;
}

static inline void make_problem(problem *p, sta_layout layout, sta_dtype dt, int64_t b, int64_t s,
                         int64_t h, int64_t d) {
  memset(p, 0, sizeof *p);
  int64_t shape[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  p->q = rnd(dt, shape);
  p->k = rnd(dt, shape);
  p->v = rnd(dt, shape);
  p->b = b; p->s = s; p->h = h; p->d = d;
  p->desc.layout = layout;
  p->desc.windows = p->windows;
}

static inline void free_problem(problem *p) {
  sta_tensor_destroy(p->q);
  sta_tensor_destroy(p->k);
  sta_tensor_destroy(p->v);
}

static inline void save_qkv_npy(const problem *p) {
  assert_int_equal(sta_npy_save(p->q, tpath("q.npy")), STA_OK);
  assert_int_equal(sta_npy_save(p->k, tpath("k.npy")), STA_OK);
  assert_int_equal(sta_npy_save(p->v, tpath("v.npy")), STA_OK);
}

/* Direct forward (or reference) on p; out in q's dtype, lse f32. */
static inline void direct(const problem *p, int reference, sta_tensor **out, sta_tensor **lse) {
  int64_t ls[3] = {p->b, p->h, p->s}, os[4];
  for (int i = 0; i < 4; i++) os[i] = sta_tensor_size(p->q, i);
  assert_int_equal(sta_tensor_create(out, sta_tensor_dtype(p->q), STA_CPU, 4, os), STA_OK);
  assert_int_equal(sta_tensor_create(lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  sta_status rc = reference
                      ? sta_attention_reference(&p->desc, p->q, p->k, p->v, *out, *lse)
                      : sta_attention_forward(&p->desc, p->q, p->k, p->v, *out, *lse);
  if (rc != STA_OK) fail_msg("direct forward: %s", sta_last_error());
}

static inline void assert_close(const sta_tensor *a, const sta_tensor *b, double tol) {
  double m = -1, r = -1;
  assert_int_equal(sta_tensor_ndim(a), sta_tensor_ndim(b));
  assert_int_equal(sta_tensor_dtype(a), sta_tensor_dtype(b));
  if (sta_tensor_compare(a, b, &m, &r) != STA_OK) fail_msg("%s", sta_last_error());
  if (!(m <= tol)) fail_msg("max |diff| %g > %g (rel %g)", m, tol, r);
}

static inline sta_tensor *load_npy(const char *name) {
  sta_tensor *t = NULL;
  if (sta_npy_load(&t, tpath(name), 1) != STA_OK) fail_msg("%s", sta_last_error());
  return t;
}


#endif
