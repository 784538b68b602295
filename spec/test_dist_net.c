/* test_dist_net.c -- the process transports: SP attention over TCP between
** ranks as threads of this process (as processes under scripts/sta-launch)
** equal to one device, its rendezvous errors, and NCCL's errors where there
** is no NCCL. */
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

int main(void) {
  dist_test_begin("test_dist_net");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tcp_transport),
    cmocka_unit_test(test_errors_nccl_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
