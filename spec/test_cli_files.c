/* test_cli_files.c -- sta-run's files: every output is checked
** before the inputs are read and left as it was by a failed run; an output
** that is also an input file keeps that file's tensors (q, k, v
** were once lost) and cannot replace one of the run's inputs; SIGINT and
** SIGTERM leave no temporary file (exit 130, 143); a symbolic link, dangling
** or not, has the file it names written and stays a link; errors name the
** user's path, never a temporary file. */
#define CLI_TEST_NAME "test-cli-files"
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include "cli_util.h"

/* The temporary files in dir (".<name>.<pid>.<hex>.tmp", core/fileio.c). */
static int temporaries_in(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    size_t l = strlen(e->d_name);
    n += e->d_name[0] == '.' && l > 4 && strcmp(e->d_name + l - 4, ".tmp") == 0;
  }
  closedir(d);
  return n;
}

static int staging_left(void) { return temporaries_in(tmpdir) > 0; }

/* An output that cannot be written is found before
** anything is read or computed (here the inputs do not even exist), and a
** failed run leaves every output as it was: no file, or the old one. */
static void test_outputs_checked_first(void **state) {
  (void)state;
  FILE *f = fopen(tpath("old.npy"), "wb");
  assert_non_null(f);
  fputs("the previous run's output", f);
  fclose(f);
  assert_int_equal(run("--q missing.npy --k missing.npy --v missing.npy --out old.npy "
                       "--lse /nonexistent/l.npy --window 1,1,1"), 1);
  assert_string_equal(err_text, "sta-run: --lse /nonexistent/l.npy: cannot open for writing: No "
                                "such file or directory (checked before computing)\n");
  assert_int_equal(run("--q missing.npy --k k.npy --v v.npy --out . --window 1,1,1"), 1);
  assert_string_equal(err_text, "sta-run: --out .: cannot open for writing: Is a directory "
                                "(checked before computing)\n");
  /* the inputs are read only after the outputs pass */
  assert_int_equal(run("--q missing.npy --k k.npy --v v.npy --out o2.npy --window 1,1,1"), 1);
  assert_non_null(strstr(err_text, "missing.npy: cannot open"));
  /* a run that fails after computing (a shape error here comes late:
  ** after the files are read) leaves old.npy and nothing else */
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 2, 16);
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out old.npy --lse l2.npy "
                       "--canvas 4,8,8 --window 2,1,1 --tile 1,8,8"), 1);
  char buf[64];
  slurp(tpath("old.npy"), buf, sizeof buf);
  assert_string_equal(buf, "the previous run's output");
  assert_int_equal(access(tpath("l2.npy"), F_OK), -1);
  assert_false(staging_left());
  /* and a good run replaces both */
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out old.npy --lse l2.npy "
                       "--canvas 4,8,8 --window 1,1,1 --quiet"), 0);
  sta_tensor *o = NULL, *l = NULL;
  assert_int_equal(sta_npy_load(&o, tpath("old.npy"), 0), STA_OK);
  assert_int_equal(sta_npy_load(&l, tpath("l2.npy"), 0), STA_OK);
  assert_int_equal(sta_tensor_ndim(l), 3);
  assert_false(staging_left());
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  free_problem(&p);
}


/* A small problem on a 4x8x8 canvas, its q, k, v in qkv.safetensors with
** an I64 tensor and metadata beside them (written by hand). */
static void write_qkv_st(problem *p) {
  make_problem(p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 2, 8);
  sta_geometry_init(&p->desc.geom, 4, 8, 8);
  int32_t w[3] = {1, 1, 1};
  memcpy(p->windows, w, sizeof w);
  p->desc.n_windows = 1;
  const char *names[3] = {"q", "k", "v"};
  const sta_tensor *ts[3] = {p->q, p->k, p->v};
  assert_int_equal(sta_safetensors_save(tpath("plain.safetensors"), 3, names, ts), STA_OK);
  /* the same tensors after an I64 one and __metadata__ */
  FILE *f = fopen(tpath("plain.safetensors"), "rb");
  assert_non_null(f);
  unsigned char len8[8];
  assert_int_equal(fread(len8, 1, 8, f), 8);
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = hl << 8 | len8[i];
  char *hdr = calloc(1, hl + 1);
  assert_int_equal(fread(hdr, 1, hl, f), hl);
  size_t data_n = (size_t)(3 * 256 * 2 * 8 * 4);
  char *data = malloc(data_n);
  assert_int_equal(fread(data, 1, data_n, f), data_n);
  fclose(f);
  /* shift every offset by the 16 bytes of idx: rebuild the header */
  char json[2048];
  int64_t n = 256 * 2 * 8 * 4;
  snprintf(json, sizeof json,
           "{\"__metadata__\":{\"format\":\"pt\"},"
           "\"idx\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
           "\"q\":{\"dtype\":\"F32\",\"shape\":[1,256,2,8],\"data_offsets\":[16,%lld]},"
           "\"k\":{\"dtype\":\"F32\",\"shape\":[1,256,2,8],\"data_offsets\":[%lld,%lld]},"
           "\"v\":{\"dtype\":\"F32\",\"shape\":[1,256,2,8],\"data_offsets\":[%lld,%lld]}}",
           (long long)(16 + n), (long long)(16 + n), (long long)(16 + 2 * n),
           (long long)(16 + 2 * n), (long long)(16 + 3 * n));
  size_t jl = strlen(json), pl = (jl + 7) / 8 * 8;
  f = fopen(tpath("qkv.safetensors"), "wb");
  assert_non_null(f);
  for (int i = 0; i < 8; i++) fputc((int)((pl >> (8 * i)) & 0xff), f);
  fputs(json, f);
  for (size_t i = jl; i < pl; i++) fputc(' ', f);
  static const unsigned char idx[16] = {1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0};
  fwrite(idx, 1, 16, f);
  fwrite(data, 1, data_n, f);
  fclose(f);
  free(hdr);
  free(data);
}

static sta_tensor *read_st(const char *file, const char *name) {
  sta_safetensors *f = NULL;
  sta_tensor *t = NULL;
  if (sta_safetensors_open(&f, tpath(file)) != STA_OK) fail_msg("%s", sta_last_error());
  if (sta_safetensors_read(f, name, &t) != STA_OK) fail_msg("%s", sta_last_error());
  sta_safetensors_close(f);
  return t;
}

/* --out (and --lse) naming the input .safetensors: the file keeps q, k, v,
** the I64 tensor and the metadata, and gains out (and lse); an output name
** that is one of the run's inputs there is refused before anything runs. */
static void test_out_is_input(void **state) {
  (void)state;
  problem p;
  write_qkv_st(&p);
  size_t before_n;
  assert_int_equal(run("--safetensors qkv.safetensors --out qkv.safetensors --lse "
                       "qkv.safetensors --canvas 4,8,8 --window 1,1,1 --quiet"), 0);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("qkv.safetensors")), STA_OK);
  before_n = (size_t)sta_safetensors_count(f);
  sta_safetensors_close(f);
  assert_int_equal(before_n, 6); /* idx q k v out lse */
  sta_tensor *q = read_st("qkv.safetensors", "q"), *k = read_st("qkv.safetensors", "k"),
             *v = read_st("qkv.safetensors", "v"), *fo = read_st("qkv.safetensors", "out"),
             *fl = read_st("qkv.safetensors", "lse"), *o = NULL, *l = NULL;
  assert_close(q, p.q, 0);
  assert_close(k, p.k, 0);
  assert_close(v, p.v, 0);
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 1e-6);
  assert_close(fl, l, 1e-6);
  char text[4096];
  slurp(tpath("qkv.safetensors"), text, sizeof text);
  assert_non_null(strstr(text + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
  assert_non_null(strstr(text + 8, "\"idx\":{\"dtype\":\"I64\",\"shape\":[2]"));
  /* writing over an input of the run there: refused, the file as it was */
  struct stat st0, st1;
  assert_int_equal(stat(tpath("qkv.safetensors"), &st0), 0);
  assert_int_equal(run("--safetensors qkv.safetensors --out qkv.safetensors --out-name k "
                       "--canvas 4,8,8 --window 1,1,1"), 2);
  assert_non_null(strstr(err_text, "sta-run: --out qkv.safetensors: 'k' is --k's tensor in that "
                                   "file: writing it would replace an input of this run"));
  assert_int_equal(run("--q qkv.safetensors:q --k k2.npy --v qkv.safetensors:v --out "
                       "./qkv.safetensors:v --canvas 4,8,8 --window 1,1,1"), 2);
  assert_non_null(strstr(err_text, "'v' is --v's tensor in that file"));
  assert_int_equal(stat(tpath("qkv.safetensors"), &st1), 0);
  assert_true(st0.st_ino == st1.st_ino && st0.st_mtime == st1.st_mtime);
  assert_false(staging_left());
  /* an output replacing an old tensor of the same name that is no input */
  assert_int_equal(run("--safetensors qkv.safetensors --out qkv.safetensors --canvas 4,8,8 "
                       "--window 1,1,1 --quiet"), 0);
  assert_int_equal(sta_safetensors_open(&f, tpath("qkv.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 6);
  sta_safetensors_close(f);
  sta_tensor *all[] = {q, k, v, fo, fl, o, l};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
  free_problem(&p);
}

/* Start sta-run in tmpdir; its pid. */
static pid_t start(char *const argv[]) {
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (chdir(tmpdir) != 0) _exit(99);
    if (!freopen("/dev/null", "w", stdout) || !freopen(tpath("stderr"), "w", stderr)) _exit(98);
    execv(exe, argv);
    _exit(97);
  }
  return pid;
}

/* SIGINT and SIGTERM during a run: exit 130 and 143, the old output as it
** was, and no temporary file (they exist from the start: outputs are
** opened before anything is read). */
static void test_signals(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 2048, 2, 32); /* the reference: ~1 s */
  save_qkv_npy(&p);
  static const int SIGS[2] = {SIGTERM, SIGINT};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(tpath("old.npy"), "wb");
    assert_non_null(f);
    fputs("the previous run's output", f);
    fclose(f);
    char *argv[] = {exe, "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "old.npy",
                    "--lse", "lse.npy", "--canvas", "8,16,16", "--tile", "1,4,4", "--window",
                    "8,16,16", "--reference", "--quiet", NULL};
    pid_t pid = start(argv);
    struct timespec ms = {0, 1000000};
    int seen = 0;
    for (int t = 0; t < 20000 && !seen; t++) { /* both temporaries made: up to 20 s */
      seen = temporaries_in(tmpdir) == 2;
      if (!seen) nanosleep(&ms, NULL);
    }
    assert_true(seen);
    assert_int_equal(kill(pid, SIGS[i]), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 128 + SIGS[i])
      fail_msg("signal %d: status %#x, expected exit %d", SIGS[i], status, 128 + SIGS[i]);
    assert_false(staging_left());
    char buf[64];
    slurp(tpath("old.npy"), buf, sizeof buf);
    assert_string_equal(buf, "the previous run's output");
    assert_int_equal(access(tpath("lse.npy"), F_OK), -1);
  }
  free_problem(&p);
}

/* A symbolic link as an output, dangling or not, relative or absolute:
** the file it names is written, the link stays a link. */
static void test_symlinks(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 2, 8);
  sta_geometry_init(&p.desc.geom, 4, 8, 8);
  int32_t w[3] = {1, 1, 1};
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 1;
  save_qkv_npy(&p);
  sta_tensor *o = NULL, *l = NULL;
  direct(&p, 0, &o, &l);
  assert_int_equal(mkdir(tpath("sub"), 0777), 0);
  remove(tpath("dangling.npy"));
  assert_int_equal(symlink("sub/target.npy", tpath("dangling.npy")), 0); /* target missing */
  assert_int_equal(symlink(tpath("sub/abs.npy"), tpath("abs-link.npy")), 0);
  assert_int_equal(symlink("abs-link.npy", tpath("chain.npy")), 0); /* a link to a link */
  static const char *const links[3][2] = {{"dangling.npy", "sub/target.npy"},
                                          {"chain.npy", "sub/abs.npy"},
                                          {"dangling.npy", "sub/target.npy"}}; /* exists now */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out %s --canvas 4,8,8 "
                         "--window 1,1,1 --quiet", links[i][0]), 0);
    struct stat st;
    assert_int_equal(lstat(tpath(links[i][0]), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    assert_int_equal(lstat(tpath(links[i][1]), &st), 0);
    assert_true(S_ISREG(st.st_mode));
    sta_tensor *fo = load_npy(links[i][1]);
    assert_close(fo, o, 1e-6);
    sta_tensor_destroy(fo);
  }
  assert_int_equal(temporaries_in(tpath("sub")), 0);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  free_problem(&p);
}

/* A write that fails (the file size limit: EFBIG) names the user's path,
** not a temporary file, and leaves nothing behind. */
static void test_errors_name_user_path(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 2, 64); /* 128 KiB out */
  sta_geometry_init(&p.desc.geom, 4, 8, 8);
  save_qkv_npy(&p);
  for (int st = 0; st < 2; st++) {
    const char *out = st ? "big.safetensors" : "big.npy";
    assert_int_equal(run_sh("trap '' XFSZ; ulimit -f 64;", "--q q.npy --k k.npy --v v.npy "
                            "--out %s --canvas 4,8,8 --window 1,1,1", out), 1);
    char want[128];
    snprintf(want, sizeof want, "sta-run: --out %s: write failed: File too large\n", out);
    assert_string_equal(err_text, want);
    assert_int_equal(access(tpath(out), F_OK), -1);
    assert_false(staging_left());
  }
  free_problem(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_outputs_checked_first),
    cmocka_unit_test(test_out_is_input),
    cmocka_unit_test(test_signals),
    cmocka_unit_test(test_symlinks),
    cmocka_unit_test(test_errors_name_user_path),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
