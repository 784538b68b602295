/* test_dist_net.c -- the process transports: SP attention over TCP between
** ranks as threads of this process (as processes under scripts/sta-launch)
** equal to one device, its rendezvous errors; a rank cancelled (another
** process: sta_cancel is process-wide) stopping both ranks at once, the
** next call working; NCCL's errors where there is no NCCL. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <spawn.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "dist_util.h"

/* ---- TCP: ranks as threads here (as processes under scripts/sta-launch) ----------- */

typedef struct tcp_job {
  int32_t rank, size, chunks;
  const char *id_file;
  const sta_attention_desc *desc;
  sta_tensor *q, *k, *v, *o;
  sta_status rc;
  char msg[256];
} tcp_job;

static void *tcp_thread(void *p) {
  tcp_job *j = p;
  sta_comm *c = NULL;
  j->rc = sta_comm_tcp(&c, j->rank, j->size, j->id_file);
  if (j->rc == STA_OK) j->rc = sta_comm_set_chunks(c, j->chunks);
  if (j->rc == STA_OK && (sta_comm_rank(c) != j->rank || sta_comm_size(c) != j->size))
    j->rc = sta_error(STA_ERR_STATE, "rank/size mismatch");
  if (j->rc == STA_OK) j->rc = sta_comm_barrier(c);
  if (j->rc == STA_OK) j->rc = sta_sp_attention(c, j->desc, j->q, j->k, j->v, j->o);
  if (j->rc == STA_OK) j->rc = sta_comm_barrier(c);
  snprintf(j->msg, sizeof j->msg, "%s", j->rc == STA_OK ? "" : sta_last_error());
  sta_comm_destroy(c);
  return NULL;
}

static void test_tcp_transport(void **state) {
  (void)state;
  char id_file[64];
  int32_t w[3 * 6] = {1, 1, 1, 3, 1, 3, 1, 3, 1, 3, 3, 3, 1, 1, 3, 3, 1, 1};
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 6, 6);
  d.geom.tile[0] = 2; d.geom.tile[1] = 3; d.geom.tile[2] = 3;
  d.n_windows = 6;
  d.windows = w;
  int64_t text = 5, v = 144;
  /* BSHD, one batch (sta packs the shard side of each exchange); BHSD, two
  ** (both sides packed), one head per chunk */
  for (int cfg = 0; cfg < 2; cfg++) {
    sta_layout lo = cfg ? STA_BHSD : STA_BSHD;
    int64_t b = cfg ? 2 : 1;
    d.layout = lo;
    sta_tensor *fq = randn4(STA_F32, lo, b, v + text, 6, 8);
    sta_tensor *fk = randn4(STA_F32, lo, b, v + text, 6, 8);
    sta_tensor *fv = randn4(STA_F32, lo, b, v + text, 6, 8);
    sta_tensor *fo = new4(STA_F32, lo, b, v + text, 6, 8);
    assert_int_equal(sta_attention_forward(&d, fq, fk, fv, fo, NULL), STA_OK);
    for (int32_t p = 1; p <= 3; p++) {
      tcp_job jobs[3];
      pthread_t th[3];
      snprintf(id_file, sizeof id_file, "/tmp/sta-test-dist-%d-tcp%d.id", (int)getpid(), (int)p);
      remove(id_file);
      for (int32_t r = 0; r < p; r++) {
        tcp_job *j = &jobs[r];
        memset(j, 0, sizeof *j);
        j->rank = r; j->size = p; j->id_file = id_file; j->desc = &d;
        j->chunks = cfg ? 6 / p : 0;
        j->q = new4(STA_F32, lo, b, v / p + text, 6, 8);
        j->k = new4(STA_F32, lo, b, v / p + text, 6, 8);
        j->v = new4(STA_F32, lo, b, v / p + text, 6, 8);
        j->o = new4(STA_F32, lo, b, v / p + text, 6, 8);
        assert_int_equal(sta_sp_shard(j->q, fq, &d.geom, lo, r, p), STA_OK);
        assert_int_equal(sta_sp_shard(j->k, fk, &d.geom, lo, r, p), STA_OK);
        assert_int_equal(sta_sp_shard(j->v, fv, &d.geom, lo, r, p), STA_OK);
        assert_int_equal(pthread_create(&th[r], NULL, tcp_thread, j), 0);
      }
      for (int32_t r = 0; r < p; r++) pthread_join(th[r], NULL);
      for (int32_t r = 0; r < p; r++) {
        tcp_job *j = &jobs[r];
        if (j->rc != STA_OK) fail_msg("P=%d rank %d: %s", (int)p, (int)r, j->msg);
        sta_tensor *want = new4(STA_F32, lo, b, v / p + text, 6, 8);
        assert_int_equal(sta_sp_shard(want, fo, &d.geom, lo, r, p), STA_OK);
        assert_bitwise(j->o, want);
        sta_tensor_destroy(want);
        sta_tensor_destroy(j->q);
        sta_tensor_destroy(j->k);
        sta_tensor_destroy(j->v);
        sta_tensor_destroy(j->o);
      }
      remove(id_file);
    }
    sta_tensor_destroy(fq);
    sta_tensor_destroy(fk);
    sta_tensor_destroy(fv);
    sta_tensor_destroy(fo);
  }
  /* errors: arguments, no rank 0, a file that is not a TCP bootstrap */
  sta_comm *c = (sta_comm *)0x1;
  sta_expect_err(sta_comm_tcp(&c, 0, 2, NULL), STA_ERR_ARGUMENT,
               "id_file: expected a path or tcp://HOST:PORT to share the TCP port (world size 2)");
  sta_expect_err(sta_comm_tcp(&c, 3, 2, "/tmp/x"), STA_ERR_ARGUMENT, "rank: expected 0..1, got 3");
  sta_expect_err(sta_comm_tcp(&c, 0, 65, "/tmp/x"), STA_ERR_ARGUMENT,
               "size: expected 1..64 ranks, got 65");
  snprintf(id_file, sizeof id_file, "/tmp/sta-test-dist-%d-none.id", (int)getpid());
  remove(id_file);
  setenv("STA_DIST_TIMEOUT", "0.1", 1);
  char want[256];
  snprintf(want, sizeof want,
           "id_file: rank 1 waited 0.1 s for \"%s\" from rank 0 (STA_DIST_TIMEOUT); "
           "is rank 0 running?", id_file);
  sta_expect_err(sta_comm_tcp(&c, 1, 2, id_file), STA_ERR_IO, want);
  FILE *f = fopen(id_file, "wb");
  assert_non_null(f);
  fwrite("0123456789ab", 1, 12, f);
  fclose(f);
  snprintf(want, sizeof want, "id_file: \"%s\" holds no sta bootstrap", id_file);
  sta_expect_err(sta_comm_tcp(&c, 1, 2, id_file), STA_ERR_FORMAT, want);
  f = fopen(id_file, "wb");
  fwrite("01234", 1, 5, f);
  fclose(f);
  snprintf(want, sizeof want, "id_file: \"%s\" holds 5 bytes, expected 12", id_file);
  sta_expect_err(sta_comm_tcp(&c, 1, 2, id_file), STA_ERR_FORMAT, want);
  remove(id_file);
  sta_status rc = sta_comm_tcp(&c, 0, 2, id_file);
  assert_int_equal(rc, STA_ERR_IO);
  unsigned port = 0;
  const char *at = strstr(sta_last_error(), "127.0.0.1:");
  if (at) port = (unsigned)atoi(at + 10);
  char got[256];
  snprintf(got, sizeof got, "%s", sta_last_error());
  snprintf(want, sizeof want, "rendezvous: rank 0 waited 0.1 s for the other ranks at "
           "127.0.0.1:%u (0 of 1 came; STA_DIST_TIMEOUT)", port);
  assert_true(port > 0);
  assert_string_equal(got, want);
  remove(id_file);
  setenv("STA_DIST_TIMEOUT", "30", 1);
  assert_ptr_equal(c, (sta_comm *)0x1);
}

/* ---- one rank cancelled: both stop at once, the next call works -------------
** Rank 1 runs in a second process (this binary again, --cancel-rank),
** since sta_cancel raises a process-wide flag.  Both ranks go through a
** relay transport over their TCP communicator; rank 1's relay raises the
** cancel flag after a given all-to-all of a call.  Four calls, two head
** chunks each: (A) rank 1 cancelled before its call; (B) a plain call;
** (C) rank 1 cancelled after the first chunk's output went back (its
** second chunk's forward sees the flag); (D) a plain call.  A and C must
** fail on both ranks within seconds (not STA_DIST_TIMEOUT) with rank 1's
** cancel as the error; B and D equal one device. */

/* One call's outcome on a rank: per head of out (bit h), whether it is as
** before the call and whether it equals one device's shard. */
typedef struct cancel_call {
  sta_status rc;
  char msg[256];
  double secs;
  int kept, equal;
} cancel_call;

/* The heads (bits) in which a and b are equal. */
static int heads_equal(const sta_tensor *a, const sta_tensor *b) {
  int bits = 0;
  for (int64_t h = 0; h < sta_tensor_size(a, 2); h++) {
    sta_tensor *x = NULL, *y = NULL;
    double mx = -1;
    assert_int_equal(sta_tensor_narrow(&x, a, 2, h, 1), STA_OK);
    assert_int_equal(sta_tensor_narrow(&y, b, 2, h, 1), STA_OK);
    assert_int_equal(sta_tensor_compare(x, y, &mx, NULL), STA_OK);
    bits |= (mx == 0.0) << h;
    sta_tensor_destroy(x);
    sta_tensor_destroy(y);
  }
  return bits;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Rank rank's four calls (A..D above) through id_file; 0 when the ranks
** met.  Inputs from seed (both processes draw the same). */
static int cancel_rank(int32_t rank, const char *id_file, uint64_t seed, cancel_call call[4]) {
  const int32_t p = 2;
  int32_t w[3] = {3, 1, 3};
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 4, 4);
  d.geom.tile[0] = d.geom.tile[1] = d.geom.tile[2] = 2;
  d.n_windows = 1;
  d.windows = w;
  seed_base = seed;
  sta_tensor *fq = randn4(STA_F32, STA_BSHD, 1, 67, 4, 8), *fk = randn4(STA_F32, STA_BSHD, 1, 67, 4, 8);
  sta_tensor *fv = randn4(STA_F32, STA_BSHD, 1, 67, 4, 8), *fo = new4(STA_F32, STA_BSHD, 1, 67, 4, 8);
  assert_int_equal(sta_attention_forward(&d, fq, fk, fv, fo, NULL), STA_OK);
  sta_tensor *q = new4(STA_F32, STA_BSHD, 1, 35, 4, 8), *k = new4(STA_F32, STA_BSHD, 1, 35, 4, 8);
  sta_tensor *v = new4(STA_F32, STA_BSHD, 1, 35, 4, 8), *want = new4(STA_F32, STA_BSHD, 1, 35, 4, 8);
  sta_tensor *o = randn4(STA_F32, STA_BSHD, 1, 35, 4, 8);
  assert_int_equal(sta_sp_shard(q, fq, &d.geom, STA_BSHD, rank, p), STA_OK);
  assert_int_equal(sta_sp_shard(k, fk, &d.geom, STA_BSHD, rank, p), STA_OK);
  assert_int_equal(sta_sp_shard(v, fv, &d.geom, STA_BSHD, rank, p), STA_OK);
  assert_int_equal(sta_sp_shard(want, fo, &d.geom, STA_BSHD, rank, p), STA_OK);
  sta_comm *tcp = NULL, *c = NULL;
  relay rl;
  memset(&rl, 0, sizeof rl);
  int met = sta_comm_tcp(&tcp, rank, p, id_file) == STA_OK;
  if (met) {
    rl.inner = tcp;
    sta_transport t = relay_transport(&rl);
    assert_int_equal(sta_comm_create(&c, &t), STA_OK);
    assert_int_equal(sta_comm_set_chunks(c, 2), STA_OK);
  }
  for (int i = 0; i < 4 && met; i++) {
    assert_int_equal(sta_tensor_randn(o, next_seed(), 0.0, 1.0), STA_OK);
    sta_tensor *before = snapshot(o);
    rl.a2a = 0;
    rl.cancel_after = rank == 1 && i == 2 ? 7 : 0; /* in: 2 x 3, out(0): the 7th */
    if (rank == 1 && i == 0) sta_cancel();
    double t0 = now_s();
    call[i].rc = sta_sp_attention(c, &d, q, k, v, o);
    call[i].secs = now_s() - t0;
    snprintf(call[i].msg, sizeof call[i].msg, "%s", call[i].rc == STA_OK ? "" : sta_last_error());
    sta_cancel_clear();
    call[i].kept = heads_equal(o, before);
    call[i].equal = heads_equal(o, want);
    sta_tensor_destroy(before);
  }
  sta_comm_destroy(c);
  sta_comm_destroy(tcp);
  sta_tensor *all[] = {fq, fk, fv, fo, q, k, v, want, o};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
  return met ? 0 : -1;
}

/* What rank r must see of the four calls; NULL when it did, else why not.
** C returned chunk 0's heads (global heads 0 and 2: the first of each
** rank's two) and left the others as they were. */
static const char *cancel_verdict(int32_t r, const cancel_call call[4], char *why, size_t n) {
  static const char *const first =
      "sp attention: cancelled (sta_cancel) before it finished; no output was changed";
  static const char *const later =
      "sp attention: cancelled (sta_cancel) after 1 of 2 head chunks; out holds their heads, "
      "the rest is unchanged";
  for (int i = 0; i < 4; i++) {
    const cancel_call *x = &call[i];
    char want[512];
    if (i % 2) {
      if (x->rc != STA_OK || x->equal != 15)
        return snprintf(why, n, "call %c: rc %d (%s), heads equal to one device %#x", 'A' + i,
                        (int)x->rc, x->msg, (unsigned)x->equal), why;
      continue;
    }
    snprintf(want, sizeof want, "%s%s", r == 1 ? "" : "rank 1: ", i == 0 ? first : later);
    int kept = i == 0 ? 15 : 10, equal = i == 0 ? 0 : 5;
    if (x->rc != STA_ERR_CANCELLED || strcmp(x->msg, want) != 0 || x->secs > 5 ||
        x->kept != kept || (x->equal & equal) != equal)
      return snprintf(why, n, "call %c: rc %d \"%s\" after %.1f s (heads kept %#x, done %#x); "
                      "wanted STA_ERR_CANCELLED \"%s\" within 5 s (heads kept %#x, done %#x)",
                      'A' + i, (int)x->rc, x->msg, x->secs, (unsigned)x->kept,
                      (unsigned)x->equal, want, (unsigned)kept, (unsigned)equal), why;
  }
  return NULL;
}

/* Rank 1, in the second process: 0 when it saw what it must. */
static int cancel_child(const char *id_file, uint64_t seed) {
  cancel_call call[4];
  char why[1024];
  memset(call, 0, sizeof call);
  if (cancel_rank(1, id_file, seed, call) != 0) {
    printf("# rank 1: no rendezvous: %s\n", sta_last_error());
    return 1;
  }
  const char *bad = cancel_verdict(1, call, why, sizeof why);
  if (bad) printf("# rank 1: %s\n", bad);
  return bad ? 1 : 0;
}

static void test_tcp_cancel_one_rank(void **state) {
  (void)state;
  char self[1024], id_file[64], seed[32];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  assert_true(n > 0);
  self[n] = '\0';
  snprintf(id_file, sizeof id_file, "/tmp/sta-test-dist-%d-cancel.id", (int)getpid());
  remove(id_file);
  uint64_t s = next_seed();
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)s);
  setenv("STA_DIST_TIMEOUT", "10", 1);
  char *argv[] = {self, "--cancel-rank", id_file, seed, NULL};
  extern char **environ;
  pid_t pid;
  assert_int_equal(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
  cancel_call call[4];
  char why[1024];
  memset(call, 0, sizeof call);
  int met = cancel_rank(0, id_file, s, call);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  setenv("STA_DIST_TIMEOUT", "30", 1);
  remove(id_file);
  assert_int_equal(met, 0);
  const char *bad = cancel_verdict(0, call, why, sizeof why);
  if (bad) fail_msg("rank 0: %s", bad);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("rank 1 failed (its lines above)");
}

/* No NCCL here: clear errors, never a crash. */
static void test_errors_nccl_env(void **state) {
  (void)state;
  sta_comm *c = (sta_comm *)0x1;
  setenv("STA_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
  sta_status rc = sta_comm_nccl(&c, 0, 1, NULL, -1);
  assert_int_equal(rc, STA_ERR_BACKEND);
  const char *want = "nccl: cannot load \"/nonexistent/libnccl.so.2\" (";
  if (strncmp(sta_last_error(), want, strlen(want)) != 0) fail_msg("got \"%s\"", sta_last_error());
  assert_non_null(strstr(sta_last_error(), "; set STA_NCCL_LIB to the library's path"));
  sta_expect_err(sta_comm_nccl(&c, 2, 2, "/tmp/x", -1), STA_ERR_ARGUMENT,
               "rank: expected 0..1, got 2");
  sta_expect_err(sta_comm_nccl(&c, 1, 2, NULL, -1), STA_ERR_ARGUMENT,
               "id_file: expected a path or tcp://HOST:PORT to share the NCCL id (world size 2)");
  sta_expect_err(sta_comm_nccl(&c, 0, 0, NULL, -1), STA_ERR_ARGUMENT,
               "size: expected 1..1048576 ranks, got 0");

  setenv("STA_WORLD_SIZE", "two", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
               "STA_WORLD_SIZE: expected an integer >= 1, got \"two\"");
  setenv("STA_WORLD_SIZE", "2", 1);
  setenv("STA_RANK", "2", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV, "STA_RANK: 2 is not below STA_WORLD_SIZE 2");
  setenv("STA_RANK", "1", 1);
  setenv("STA_DIST_BACKEND", "loopback", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
               "STA_DIST_BACKEND: loopback joins no other process (STA_WORLD_SIZE 2); use nccl");
  setenv("STA_DIST_BACKEND", "mpi", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
               "STA_DIST_BACKEND: expected nccl, tcp or loopback, got \"mpi\"");
  unsetenv("STA_DIST_BACKEND");
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
               "MASTER_ADDR: not set; a world of 2 ranks (from scripts/sta-launch's "
               "STA_WORLD_SIZE) meets at MASTER_ADDR:MASTER_PORT (or STA_DIST_ID_FILE)");
  setenv("STA_DIST_ID_FILE", "/tmp/sta-test-dist-id", 1);
  assert_int_equal(sta_comm_from_env(&c), STA_ERR_BACKEND); /* no NCCL here */
  unsetenv("STA_DIST_ID_FILE");
  assert_ptr_equal(c, (sta_comm *)0x1);
  setenv("STA_WORLD_SIZE", "1", 1);
  setenv("STA_RANK", "0", 1);
  setenv("STA_DIST_BACKEND", "loopback", 1);
  assert_int_equal(sta_comm_from_env(&c), STA_OK);
  assert_string_equal(sta_comm_name(c), "loopback");
  assert_int_equal(sta_comm_rank(c), 0);
  assert_int_equal(sta_comm_size(c), 1);
  assert_int_equal(sta_comm_barrier(c), STA_OK); /* a world of one never waits */
  sta_comm_destroy(c);
  unsetenv("STA_WORLD_SIZE");
  unsetenv("STA_RANK");
  unsetenv("STA_DIST_BACKEND");
  unsetenv("STA_NCCL_LIB");
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--cancel-rank") == 0) /* test_tcp_cancel_one_rank's rank 1 */
    return cancel_child(argv[2], strtoull(argv[3], NULL, 10));
  dist_test_begin("test_dist_net");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tcp_transport),
    cmocka_unit_test(test_tcp_cancel_one_rank),
    cmocka_unit_test(test_errors_nccl_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
