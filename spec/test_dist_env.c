/* test_dist_env.c -- how the ranks of a process world meet: the launcher
** families of sta_comm_env (sta-launch, torchrun, mpirun, srun), the
** rendezvous of sta_comm_from_env at MASTER_ADDR:MASTER_PORT + 1, the
** tcp://HOST:PORT rendezvous of sta_comm_tcp between threads on 127.0.0.1
** (SP attention over it equal to one device), and every error: exact
** messages, bounded waits, nothing left open. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed_base;

static const char *const ENV[] = {
  "STA_RANK", "STA_WORLD_SIZE", "STA_LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_RANK",
  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
  "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "MASTER_ADDR", "MASTER_PORT",
  "STA_MASTER_PORT", "STA_DIST_ID_FILE", "STA_DIST_BACKEND"};

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void clear_env(void) {
  for (size_t i = 0; i < sizeof ENV / sizeof ENV[0]; i++) unsetenv(ENV[i]);
}

static void setenv_int(const char *name, int v) {
  char b[32];
  snprintf(b, sizeof b, "%d", v);
  setenv(name, b, 1);
}

/* A port nobody listens on now (bound, then released). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
  close(fd);
  return ntohs(a.sin_port);
}

/* ---- the launcher families ---------------------------------------------------- */

static void expect_world(int32_t rank, int32_t size, int32_t local, int32_t family) {
  int32_t r = -9, n = -9, l = -9, f = -9;
  if (sta_comm_env(&r, &n, &l, &f) != STA_OK) fail_msg("%s", sta_last_error());
  assert_int_equal(r, rank);
  assert_int_equal(n, size);
  assert_int_equal(l, local);
  assert_int_equal(f, family);
}

static void expect_env_err(const char *msg) {
  int32_t r = -9, n = -9, l = -9, f = -9;
  sta_expect_err(sta_comm_env(&r, &n, &l, &f), STA_ERR_ENV, msg);
  assert_true(r == -9 && n == -9 && l == -9 && f == -9); /* nothing written */
}

static void test_env_families(void **state) {
  (void)state;
  static const char *const fam[4][3] = {
    {"STA_RANK", "STA_WORLD_SIZE", "STA_LOCAL_RANK"},
    {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"}};
  clear_env();
  expect_world(0, 1, 0, 0); /* no launcher: rank 0 of 1 */
  for (int i = 0; i < 4; i++) {
    clear_env();
    setenv_int(fam[i][0], 2);
    setenv_int(fam[i][1], 4);
    expect_world(2, 4, 2, i + 1); /* local rank defaults to the rank */
    setenv_int(fam[i][2], 1);
    expect_world(2, 4, 1, i + 1);
    setenv(fam[i][2], "", 1); /* empty is unset */
    expect_world(2, 4, 2, i + 1);
  }
  /* the first family set wins: srun starting torchrun, mpirun under Slurm */
  clear_env();
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "1", 1);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  expect_world(3, 8, 3, 3);
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "6", 1);
  setenv("LOCAL_RANK", "1", 1);
  expect_world(5, 6, 1, 2);
  setenv("STA_RANK", "0", 1);
  setenv("STA_WORLD_SIZE", "2", 1);
  expect_world(0, 2, 0, 1);

  clear_env();
  setenv("RANK", "1", 1);
  expect_env_err("WORLD_SIZE: not set, but RANK is (torchrun sets both)");
  clear_env();
  setenv("SLURM_NTASKS", "2", 1);
  expect_env_err("SLURM_PROCID: not set, but SLURM_NTASKS is (srun sets both)");
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
  expect_env_err("OMPI_COMM_WORLD_RANK: 3 is not below OMPI_COMM_WORLD_SIZE 2");
  clear_env();
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "x", 1);
  expect_env_err("LOCAL_RANK: expected an integer >= 0, got \"x\"");
  setenv("WORLD_SIZE", "0", 1);
  expect_env_err("WORLD_SIZE: expected an integer >= 1, got \"0\"");
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "-1", 1);
  expect_env_err("RANK: expected an integer >= 0, got \"-1\"");
  int32_t x = 7;
  sta_expect_err(sta_comm_env(NULL, &x, &x, &x), STA_ERR_ARGUMENT,
                 "rank: expected a pointer, got NULL");
  sta_expect_err(sta_comm_env(&x, &x, &x, NULL), STA_ERR_ARGUMENT,
                 "family: expected a pointer, got NULL");
  assert_int_equal(x, 7);
  clear_env();
}

/* sta_comm_from_env's rendezvous: where, and its errors (no NCCL here). */
static void test_env_rendezvous_errors(void **state) {
  (void)state;
  sta_comm *c = (sta_comm *)0x1;
  char want[512];
  clear_env();
  setenv("STA_DIST_BACKEND", "tcp", 1);
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
                 "MASTER_ADDR: not set; a world of 2 ranks (from torchrun's WORLD_SIZE) meets "
                 "at MASTER_ADDR:MASTER_PORT (or STA_DIST_ID_FILE)");
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV, "MASTER_PORT: not set, but MASTER_ADDR is");
  setenv("MASTER_PORT", "65535", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV, "MASTER_PORT: port 65536 is outside 1..65535");
  setenv("STA_MASTER_PORT", "abc", 1);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_ENV,
                 "STA_MASTER_PORT: expected an integer >= 1, got \"abc\"");
  unsetenv("STA_MASTER_PORT");
  /* nobody listens: rank 1 gives up after STA_DIST_TIMEOUT, saying where
  ** the world came from; MASTER_PORT itself stays torchrun's */
  int port = free_port();
  setenv_int("MASTER_PORT", port - 1);
  setenv("STA_DIST_TIMEOUT", "0.3", 1);
  double t0 = now_s();
  snprintf(want, sizeof want, "rendezvous: rank 1 cannot reach rank 0 at 127.0.0.1:%d within "
           "0.3 s (STA_DIST_TIMEOUT): Connection refused; is rank 0 running? [rank 1 of 2 from "
           "torchrun: RANK, WORLD_SIZE]", port);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_IO, want);
  double waited = now_s() - t0;
  assert_true(waited >= 0.25 && waited < 5);
  /* rank 0 alone waits as long, then says how many came */
  setenv("RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_RANK", "1", 1); /* a later family: ignored */
  snprintf(want, sizeof want, "rendezvous: rank 0 waited 0.3 s for the other ranks at "
           "127.0.0.1:%d (0 of 1 came; STA_DIST_TIMEOUT) [rank 0 of 2 from torchrun: RANK, "
           "WORLD_SIZE]", port);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_IO, want);
  /* the port is taken: say so, and how to choose another */
  int busy = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)port);
  assert_int_equal(bind(busy, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(busy, 1), 0);
  clear_env();
  setenv("STA_DIST_BACKEND", "tcp", 1);
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "3", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv_int("STA_MASTER_PORT", port);
  snprintf(want, sizeof want, "rendezvous: rank 0 cannot listen on 127.0.0.1:%d: Address "
           "already in use (another job's rendezvous? choose another MASTER_PORT or set "
           "STA_MASTER_PORT) [rank 0 of 3 from srun: SLURM_PROCID, SLURM_NTASKS]", port);
  sta_expect_err(sta_comm_from_env(&c), STA_ERR_IO, want);
  close(busy);
  assert_ptr_equal(c, (sta_comm *)0x1);
  /* a world of one needs no rendezvous (MASTER_ADDR may be set or not) */
  for (int with_addr = 0; with_addr <= 1; with_addr++) {
    clear_env();
    setenv("STA_DIST_BACKEND", "tcp", 1);
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "1", 1);
    if (with_addr) setenv("MASTER_ADDR", "127.0.0.1", 1);
    assert_int_equal(sta_comm_from_env(&c), STA_OK);
    assert_string_equal(sta_comm_name(c), "tcp");
    assert_int_equal(sta_comm_size(c), 1);
    assert_int_equal(sta_comm_barrier(c), STA_OK);
    sta_comm_destroy(c);
  }
  clear_env();
  setenv("STA_DIST_TIMEOUT", "30", 1);
}

/* ---- tcp://HOST:PORT between threads ---------------------------------------------- */

typedef struct rank_job {
  int32_t rank, size;
  char at[96];
  const sta_attention_desc *desc;
  sta_tensor *q, *k, *v, *o;
  sta_status rc;
  char msg[512];
} rank_job;

static void *rank_thread(void *p) {
  rank_job *j = p;
  sta_comm *c = NULL;
  j->rc = sta_comm_tcp(&c, j->rank, j->size, j->at);
  if (j->rc == STA_OK && j->q) j->rc = sta_sp_attention(c, j->desc, j->q, j->k, j->v, j->o);
  if (j->rc == STA_OK) j->rc = sta_comm_barrier(c);
  snprintf(j->msg, sizeof j->msg, "%s", j->rc == STA_OK ? "" : sta_last_error());
  sta_comm_destroy(c);
  return NULL;
}

static sta_tensor *randn(int64_t s, int64_t h, int64_t d) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {1, s, h, d};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_base += 7919, 0, 1), STA_OK);
  return t;
}

/* Canvas 4x6x6 (V 144), tile 2x3x3, one window w. */
static void small_desc(sta_attention_desc *d, const int32_t *w) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, 4, 6, 6);
  d->geom.tile[0] = 2; d->geom.tile[1] = 3; d->geom.tile[2] = 3;
  d->n_windows = 1;
  d->windows = w;
}

static void test_tcp_url_worlds(void **state) {
  (void)state;
  int32_t w[3] = {3, 1, 3};
  sta_attention_desc d;
  small_desc(&d, w);
  int64_t v = 144, text = 3;
  sta_tensor *fq = randn(v + text, 6, 8), *fk = randn(v + text, 6, 8), *fv = randn(v + text, 6, 8);
  sta_tensor *fo = randn(v + text, 6, 8);
  assert_int_equal(sta_attention_forward(&d, fq, fk, fv, fo, NULL), STA_OK);
  for (int32_t p = 2; p <= 3; p++) {
    rank_job jobs[3];
    pthread_t th[3];
    int port = free_port();
    for (int32_t r = 0; r < p; r++) {
      rank_job *j = &jobs[r];
      memset(j, 0, sizeof *j);
      j->rank = r;
      j->size = p;
      /* the ranks may start in any order: rank 0 last here */
      snprintf(j->at, sizeof j->at, r % 2 ? "tcp://localhost:%d" : "tcp://127.0.0.1:%d", port);
      j->desc = &d;
      j->q = randn(v / p + text, 6, 8);
      j->k = randn(v / p + text, 6, 8);
      j->v = randn(v / p + text, 6, 8);
      j->o = randn(v / p + text, 6, 8);
      assert_int_equal(sta_sp_shard(j->q, fq, &d.geom, STA_BSHD, r, p), STA_OK);
      assert_int_equal(sta_sp_shard(j->k, fk, &d.geom, STA_BSHD, r, p), STA_OK);
      assert_int_equal(sta_sp_shard(j->v, fv, &d.geom, STA_BSHD, r, p), STA_OK);
    }
    for (int32_t r = p - 1; r >= 0; r--) {
      assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &jobs[r]), 0);
      if (r == 1) usleep(50 * 1000);
    }
    for (int32_t r = 0; r < p; r++) pthread_join(th[r], NULL);
    for (int32_t r = 0; r < p; r++) {
      rank_job *j = &jobs[r];
      if (j->rc != STA_OK) fail_msg("P=%d rank %d: %s", (int)p, (int)r, j->msg);
      sta_tensor *want = randn(v / p + text, 6, 8);
      double mx = -1;
      assert_int_equal(sta_sp_shard(want, fo, &d.geom, STA_BSHD, r, p), STA_OK);
      assert_int_equal(sta_tensor_compare(j->o, want, &mx, NULL), STA_OK);
      assert_true(mx == 0.0);
      sta_tensor_destroy(want);
      sta_tensor_destroy(j->q);
      sta_tensor_destroy(j->k);
      sta_tensor_destroy(j->v);
      sta_tensor_destroy(j->o);
    }
  }
  sta_tensor_destroy(fq);
  sta_tensor_destroy(fk);
  sta_tensor_destroy(fv);
  sta_tensor_destroy(fo);
}

/* Run ranks (threads) that only meet; results in jobs. */
static void meet(rank_job *jobs, int32_t n) {
  pthread_t th[4];
  for (int32_t r = 0; r < n; r++) assert_int_equal(pthread_create(&th[r], NULL, rank_thread, &jobs[r]), 0);
  for (int32_t r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static void job_at(rank_job *j, int32_t rank, int32_t size, int port) {
  memset(j, 0, sizeof *j);
  j->rank = rank;
  j->size = size;
  snprintf(j->at, sizeof j->at, "tcp://127.0.0.1:%d", port);
}

static void test_tcp_url_errors(void **state) {
  (void)state;
  sta_comm *c = (sta_comm *)0x1;
  char want[512];
  static const char *const bad[] = {"tcp://nohost", "tcp://h:0", "tcp://:80", "tcp://h:99999",
                                    "tcp://h:12x", "tcp://h:"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(want, sizeof want, "id_file: expected a path or tcp://HOST:PORT (port 1..65535), "
             "got \"%s\"", bad[i]);
    sta_expect_err(sta_comm_tcp(&c, 1, 2, bad[i]), STA_ERR_ARGUMENT, want);
  }
  assert_ptr_equal(c, (sta_comm *)0x1);
  setenv("STA_DIST_TIMEOUT", "2", 1);
  /* a rank of another world size: both sides say so */
  rank_job jobs[3];
  int port = free_port();
  job_at(&jobs[0], 0, 2, port);
  job_at(&jobs[1], 1, 3, port);
  meet(jobs, 2);
  assert_int_equal(jobs[0].rc, STA_ERR_IO);
  assert_string_equal(jobs[0].msg, "rendezvous: rank 1 joined a world of 3 ranks, rank 0's has 2");
  assert_int_equal(jobs[1].rc, STA_ERR_IO);
  snprintf(want, sizeof want, "rendezvous: rank 1: rank 0 at 127.0.0.1:%d gave up on the "
           "rendezvous (its own error says why)", port);
  assert_string_equal(jobs[1].msg, want);
  /* two ranks say they are rank 1 */
  port = free_port();
  job_at(&jobs[0], 0, 3, port);
  job_at(&jobs[1], 1, 3, port);
  job_at(&jobs[2], 1, 3, port);
  meet(jobs, 3);
  assert_int_equal(jobs[0].rc, STA_ERR_IO);
  assert_string_equal(jobs[0].msg, "rendezvous: a peer said it is rank 1 (world size 3, or taken)");
  for (int r = 1; r < 3; r++) assert_int_equal(jobs[r].rc, STA_ERR_IO);
  /* a stranger connecting first (a port scan, a stale client) is dropped */
  port = free_port();
  job_at(&jobs[0], 0, 2, port);
  job_at(&jobs[1], 1, 2, port);
  pthread_t th0;
  assert_int_equal(pthread_create(&th0, NULL, rank_thread, &jobs[0]), 0);
  int s = -1;
  for (int tries = 0; tries < 200 && s < 0; tries++) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
      close(s);
      s = -1;
      usleep(10 * 1000);
    }
  }
  assert_true(s >= 0);
  assert_int_equal(write(s, "GET / HTTP/1.0\r\n\r\n", 18), 18);
  rank_thread(&jobs[1]);
  pthread_join(th0, NULL);
  close(s);
  if (jobs[0].rc != STA_OK) fail_msg("rank 0: %s", jobs[0].msg);
  if (jobs[1].rc != STA_OK) fail_msg("rank 1: %s", jobs[1].msg);
  setenv("STA_DIST_TIMEOUT", "30", 1);
}

/* Over a process transport a rank whose own checks fail still joins the
** descriptor exchange: every rank returns (the others "rank r: ..."),
** nothing moved, and the next call runs. */
typedef struct join_job {
  rank_job base;
  sta_attention_desc bad;
  sta_tensor *before;
  sta_status rc1;
  char msg1[512];
} join_job;

static void *join_thread(void *arg) {
  join_job *j = arg;
  rank_job *b = &j->base;
  sta_comm *c = NULL;
  b->rc = sta_comm_tcp(&c, b->rank, b->size, b->at);
  if (b->rc != STA_OK) {
    snprintf(j->msg1, sizeof j->msg1, "%s", sta_last_error());
    return NULL;
  }
  j->rc1 = sta_sp_attention(c, &j->bad, b->q, b->k, b->v, b->o);
  snprintf(j->msg1, sizeof j->msg1, "%s", sta_last_error());
  double mx = -1;
  if (sta_tensor_compare(b->o, j->before, &mx, NULL) != STA_OK || mx != 0.0) j->rc1 = STA_ERR_STATE;
  b->rc = sta_sp_attention(c, b->desc, b->q, b->k, b->v, b->o);
  snprintf(b->msg, sizeof b->msg, "%s", b->rc == STA_OK ? "" : sta_last_error());
  sta_comm_destroy(c);
  return NULL;
}

static void test_tcp_join_on_error(void **state) {
  (void)state;
  int32_t w[3] = {1, 3, 1}, w2[6] = {1, 1, 1, 3, 3, 3};
  sta_attention_desc d;
  small_desc(&d, w);
  int64_t v = 144, text = 2;
  sta_tensor *fq = randn(v + text, 4, 8), *fo = randn(v + text, 4, 8);
  assert_int_equal(sta_attention_forward(&d, fq, fq, fq, fo, NULL), STA_OK);
  int port = free_port();
  join_job jobs[2];
  pthread_t th[2];
  for (int32_t r = 0; r < 2; r++) {
    join_job *j = &jobs[r];
    job_at(&j->base, r, 2, port);
    j->base.desc = &d;
    j->base.q = j->base.k = j->base.v = randn(v / 2 + text, 4, 8);
    j->base.o = randn(v / 2 + text, 4, 8);
    j->before = randn(v / 2 + text, 4, 8);
    assert_int_equal(sta_tensor_copy(j->before, j->base.o), STA_OK);
    assert_int_equal(sta_sp_shard(j->base.q, fq, &d.geom, STA_BSHD, r, 2), STA_OK);
    j->bad = d;
    if (r == 1) { j->bad.n_windows = 2; j->bad.windows = w2; }
  }
  for (int32_t r = 0; r < 2; r++) assert_int_equal(pthread_create(&th[r], NULL, join_thread, &jobs[r]), 0);
  for (int32_t r = 0; r < 2; r++) pthread_join(th[r], NULL);
  assert_int_equal(jobs[1].rc1, STA_ERR_WINDOW);
  assert_string_equal(jobs[1].msg1, "n_windows: expected 1 or heads (4), got 2");
  assert_int_equal(jobs[0].rc1, STA_ERR_WINDOW);
  assert_string_equal(jobs[0].msg1, "rank 1: n_windows: expected 1 or heads (4), got 2");
  for (int32_t r = 0; r < 2; r++) {
    join_job *j = &jobs[r];
    if (j->base.rc != STA_OK) fail_msg("rank %d: %s", (int)r, j->base.msg);
    sta_tensor *want = randn(v / 2 + text, 4, 8);
    double mx = -1;
    assert_int_equal(sta_sp_shard(want, fo, &d.geom, STA_BSHD, r, 2), STA_OK);
    assert_int_equal(sta_tensor_compare(j->base.o, want, &mx, NULL), STA_OK);
    assert_true(mx == 0.0);
    sta_tensor_destroy(want);
    sta_tensor_destroy(j->base.q);
    sta_tensor_destroy(j->base.o);
    sta_tensor_destroy(j->before);
  }
  sta_tensor_destroy(fq);
  sta_tensor_destroy(fo);
}

int main(void) {
  seed_base = (uint64_t)time(NULL);
  setenv("STA_DIST_TIMEOUT", "30", 0); /* a broken test fails, never hangs */
  printf("test_dist_env: seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_env_families),
    cmocka_unit_test(test_env_rendezvous_errors),
    cmocka_unit_test(test_tcp_url_worlds),
    cmocka_unit_test(test_tcp_url_errors),
    cmocka_unit_test(test_tcp_join_on_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
