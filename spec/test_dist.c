/* test_dist.c -- communicators on the CPU: loopback collectives on P in
** {1, 2, 3, 4} ranks (one thread each), a caller's transport under SP
** attention (its calls counted), a failing rank aborting its world, a
** lone rank timing out, and every error of the communicator calls. */
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

/* ---- loopback collectives ---------------------------------------------------- */

typedef struct coll_job {
  sta_tensor *send[MAXP], *recv[MAXP], *gsend[MAXP], *grecv[MAXP];
  int barriers;
} coll_job;

static sta_status coll_rank(void *arg, int32_t r, sta_comm *c) {
  coll_job *j = arg;
  sta_status rc = sta_comm_barrier(c);
  if (rc == STA_OK) rc = sta_comm_all_to_all(c, j->send[r], j->recv[r]);
  if (rc == STA_OK) rc = sta_comm_all_gather(c, j->gsend[r], j->grecv[r]);
  if (rc == STA_OK) rc = sta_comm_barrier(c);
  return rc;
}

static void test_loopback_collectives(void **state) {
  (void)state;
  for (int32_t p = 1; p <= MAXP; p++) {
    sta_comm *comms[MAXP];
    coll_job j;
    int64_t per = 5, n = per * p;
    memset(&j, 0, sizeof j);
    assert_int_equal(sta_comm_loopback(comms, p), STA_OK);
    for (int32_t r = 0; r < p; r++) {
      assert_int_equal(sta_comm_rank(comms[r]), r);
      assert_int_equal(sta_comm_size(comms[r]), p);
      assert_string_equal(sta_comm_name(comms[r]), "loopback");
      assert_int_equal(sta_tensor_create(&j.send[r], STA_F32, STA_CPU, 1, &n), STA_OK);
      assert_int_equal(sta_tensor_create(&j.recv[r], STA_F32, STA_CPU, 1, &n), STA_OK);
      assert_int_equal(sta_tensor_create(&j.gsend[r], STA_F32, STA_CPU, 1, &per), STA_OK);
      assert_int_equal(sta_tensor_create(&j.grecv[r], STA_F32, STA_CPU, 1, &n), STA_OK);
      assert_int_equal(sta_tensor_randn(j.send[r], next_seed(), 0, 1), STA_OK);
      assert_int_equal(sta_tensor_randn(j.gsend[r], next_seed(), 0, 1), STA_OK);
      assert_int_equal(sta_tensor_fill(j.recv[r], NAN), STA_OK);
      assert_int_equal(sta_tensor_fill(j.grecv[r], NAN), STA_OK);
    }
    assert_int_equal(sta_comm_loopback_run(comms, p, coll_rank, &j), STA_OK);
    for (int32_t r = 0; r < p; r++) {
      const float *recv = sta_tensor_data(j.recv[r]), *grecv = sta_tensor_data(j.grecv[r]);
      for (int32_t s = 0; s < p; s++) {
        const float *send = sta_tensor_data(j.send[s]), *gsend = sta_tensor_data(j.gsend[s]);
        /* chunk s of rank r's recv is chunk r of rank s's send */
        assert_memory_equal(recv + s * per, send + r * per, sizeof(float) * (size_t)per);
        assert_memory_equal(grecv + s * per, gsend, sizeof(float) * (size_t)per);
      }
    }
    for (int32_t r = 0; r < p; r++) {
      sta_tensor_destroy(j.send[r]);
      sta_tensor_destroy(j.recv[r]);
      sta_tensor_destroy(j.gsend[r]);
      sta_tensor_destroy(j.grecv[r]);
      sta_comm_destroy(comms[r]);
    }
  }
}

/* ---- a caller's transport ---------------------------------------------------------- */

typedef struct custom_job {
  sta_comm *comm;
  const sta_attention_desc *desc;
  sta_tensor *q, *o;
  sta_status rc;
  char msg[256];
} custom_job;

static void *custom_thread(void *p) {
  custom_job *j = p;
  j->rc = sta_sp_attention(j->comm, j->desc, j->q, j->q, j->q, j->o);
  snprintf(j->msg, sizeof j->msg, "%s", j->rc == STA_OK ? "" : sta_last_error());
  return NULL;
}

/* A caller's transport without all_to_all_spans: sta packs the strided
** side of each exchange.  Every chunk count gives single-device bits; the
** calls are counted: the descriptor (one all-gather), then per chunk
** three all-to-alls in (q, k, v), every rank's status after its compute
** (an all-gather), one all-to-all out and the text all-gather. */
static void test_custom_transport(void **state) {
  (void)state;
  const int32_t p = 2;
  sta_comm *inner[2], *comms[2];
  relay cnt[2];
  memset(cnt, 0, sizeof cnt);
  assert_int_equal(sta_comm_loopback(inner, p), STA_OK);
  for (int32_t r = 0; r < p; r++) {
    cnt[r].inner = inner[r];
    sta_transport t = relay_transport(&cnt[r]);
    assert_int_equal(sta_comm_create(&comms[r], &t), STA_OK);
    assert_string_equal(sta_comm_name(comms[r]), "relay");
    assert_int_equal(sta_comm_rank(comms[r]), r);
  }
  int32_t w[3] = {1, 3, 1};
  for (int text = 0; text <= 5; text += 5) {
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    sta_geometry_init(&d.geom, 4, 4, 6);
    d.geom.tile[0] = 2; d.geom.tile[1] = 2; d.geom.tile[2] = 3;
    d.n_windows = 1;
    d.windows = w;
    sta_tensor *full = randn4(STA_BF16, STA_BSHD, 1, 96 + text, 4, 8);
    sta_tensor *ref = new4(STA_BF16, STA_BSHD, 1, 96 + text, 4, 8);
    assert_int_equal(sta_attention_forward(&d, full, full, full, ref, NULL), STA_OK);
    for (int32_t n = 1; n <= 2; n++)
      for (int fail = 0; fail <= (text > 0 && n == 1); fail++) {
        custom_job jobs[2];
        pthread_t th[2];
        sta_tensor *before[2];
        for (int32_t r = 0; r < p; r++) {
          memset(&jobs[r], 0, sizeof jobs[r]);
          cnt[r].a2a = cnt[r].gather = 0;
          cnt[r].fail_gather = fail;
          assert_int_equal(sta_comm_set_chunks(comms[r], n), STA_OK);
          jobs[r].comm = comms[r];
          jobs[r].desc = &d;
          jobs[r].q = new4(STA_BF16, STA_BSHD, 1, 48 + text, 4, 8);
          jobs[r].o = randn4(STA_BF16, STA_BSHD, 1, 48 + text, 4, 8);
          before[r] = snapshot(jobs[r].o);
          assert_int_equal(sta_sp_shard(jobs[r].q, full, &d.geom, STA_BSHD, r, p), STA_OK);
          assert_int_equal(pthread_create(&th[r], NULL, custom_thread, &jobs[r]), 0);
        }
        for (int32_t r = 0; r < p; r++) pthread_join(th[r], NULL);
        for (int32_t r = 0; r < p; r++) {
          if (fail) { /* the descriptor's all-gather fails: nothing moved */
            assert_int_equal(cnt[r].gather, 1);
            assert_int_equal(cnt[r].a2a, 0);
            assert_int_equal(jobs[r].rc, STA_ERR_DEVICE);
            assert_string_equal(jobs[r].msg, "fake: link down");
            assert_bitwise(jobs[r].o, before[r]);
          } else {
            assert_int_equal(cnt[r].gather, 1 + n * (1 + (text > 0)));
            assert_int_equal(cnt[r].a2a, 4 * n);
            if (jobs[r].rc != STA_OK) fail_msg("rank %d: %s", (int)r, jobs[r].msg);
            sta_tensor *want = new4(STA_BF16, STA_BSHD, 1, 48 + text, 4, 8);
            assert_int_equal(sta_sp_shard(want, ref, &d.geom, STA_BSHD, r, p), STA_OK);
            assert_bitwise(jobs[r].o, want);
            sta_tensor_destroy(want);
          }
          sta_tensor_destroy(jobs[r].q);
          sta_tensor_destroy(jobs[r].o);
          sta_tensor_destroy(before[r]);
        }
      }
    sta_tensor_destroy(full);
    sta_tensor_destroy(ref);
  }
  /* a rank outside the size is refused */
  relay bad;
  memset(&bad, 0, sizeof bad);
  bad.inner = inner[0];
  sta_transport t = relay_transport(&bad);
  t.rank = relay_size;
  sta_comm *c = NULL;
  sta_expect_err(sta_comm_create(&c, &t), STA_ERR_ARGUMENT,
               "transport: rank 2 of size 2 is not a rank");
  for (int32_t r = 0; r < p; r++) {
    sta_comm_destroy(comms[r]);
    assert_int_equal(cnt[r].destroyed, 1);
    sta_comm_destroy(inner[r]);
  }
  assert_int_equal(bad.destroyed, 0);
}

static void test_errors_comm(void **state) {
  (void)state;
  sta_comm *comms[MAXP], *other[2], *c = (sta_comm *)0x1;
  sta_expect_err(sta_comm_loopback(comms, 0), STA_ERR_ARGUMENT, "size: expected 1..64 ranks, got 0");
  sta_expect_err(sta_comm_loopback(comms, 65), STA_ERR_ARGUMENT,
               "size: expected 1..64 ranks, got 65");
  sta_expect_err(sta_comm_loopback(NULL, 2), STA_ERR_ARGUMENT, "comms: expected an array, got NULL");
  sta_expect_err(sta_comm_create(&c, NULL), STA_ERR_ARGUMENT,
               "transport: expected a table, got NULL");
  sta_transport t;
  memset(&t, 0, sizeof t);
  sta_expect_err(sta_comm_create(&c, &t), STA_ERR_ARGUMENT,
               "transport: rank, size, all_to_all, all_gather and barrier must all be set");
  assert_ptr_equal(c, (sta_comm *)0x1);
  sta_expect_err(sta_comm_barrier(NULL), STA_ERR_ARGUMENT, "comm: expected a communicator, got NULL");

  assert_int_equal(sta_comm_loopback(comms, 2), STA_OK);
  assert_int_equal(sta_comm_loopback(other, 2), STA_OK);
  sta_comm *mixed[2] = {comms[0], other[0]};
  sta_expect_err(sta_comm_loopback_run(mixed, 2, NULL, NULL), STA_ERR_ARGUMENT,
               "fn: expected a function, got NULL");
  sta_expect_err(sta_comm_loopback_run(mixed, 2, coll_rank, NULL), STA_ERR_ARGUMENT,
               "comms[1]: expected rank 1 of comms[0]'s world, got rank 0 of another world");
  sta_comm *swapped[2] = {comms[1], comms[0]};
  sta_expect_err(sta_comm_loopback_run(swapped, 2, coll_rank, NULL), STA_ERR_ARGUMENT,
               "comms[0]: expected rank 0 of comms[0]'s world, got rank 1 of it");
  sta_expect_err(sta_comm_loopback_run(comms, 1, coll_rank, NULL), STA_ERR_ARGUMENT,
               "size: the world has 2 ranks, got 1");

  /* tensor collectives */
  int64_t n6 = 6, n5 = 5, n3 = 3;
  sta_tensor *a6 = NULL, *b6 = NULL, *a5 = NULL, *b5 = NULL, *h6 = NULL, *a3 = NULL;
  assert_int_equal(sta_tensor_create(&a6, STA_F32, STA_CPU, 1, &n6), STA_OK);
  assert_int_equal(sta_tensor_create(&b6, STA_F32, STA_CPU, 1, &n6), STA_OK);
  assert_int_equal(sta_tensor_create(&a5, STA_F32, STA_CPU, 1, &n5), STA_OK);
  assert_int_equal(sta_tensor_create(&b5, STA_F32, STA_CPU, 1, &n5), STA_OK);
  assert_int_equal(sta_tensor_create(&h6, STA_F16, STA_CPU, 1, &n6), STA_OK);
  assert_int_equal(sta_tensor_create(&a3, STA_F32, STA_CPU, 1, &n3), STA_OK);
  assert_int_equal(sta_tensor_randn(b6, next_seed(), 0, 1), STA_OK);
  sta_tensor *before = snapshot(b6);
  sta_expect_err(sta_comm_all_to_all(comms[0], a5, b5), STA_ERR_SHAPE,
               "send: 5 elements are not divisible by the 2 ranks");
  sta_expect_err(sta_comm_all_to_all(comms[0], a6, b5), STA_ERR_SHAPE,
               "recv: 5 elements, expected send's 6");
  sta_expect_err(sta_comm_all_to_all(comms[0], h6, b6), STA_ERR_DTYPE,
               "recv: dtype f32 differs from send's f16");
  sta_expect_err(sta_comm_all_gather(comms[0], a6, b6), STA_ERR_SHAPE,
               "recv: 6 elements, expected 2 ranks x 6");
  sta_expect_err(sta_comm_all_gather(comms[0], NULL, b6), STA_ERR_ARGUMENT,
               "send: expected a tensor, got NULL");
  sta_tensor *strided = NULL;
  int64_t st = 2;
  assert_int_equal(sta_tensor_view(&strided, b6, 0, 1, &n3, &st), STA_OK);
  sta_expect_err(sta_comm_all_gather(comms[0], a3, strided), STA_ERR_SHAPE,
               "recv: expected a contiguous tensor");
  assert_bitwise(b6, before);

  sta_tensor_destroy(strided);
  sta_tensor_destroy(before);
  sta_tensor_destroy(a6);
  sta_tensor_destroy(b6);
  sta_tensor_destroy(a5);
  sta_tensor_destroy(b5);
  sta_tensor_destroy(h6);
  sta_tensor_destroy(a3);
  for (int r = 0; r < 2; r++) {
    sta_comm_destroy(comms[r]);
    sta_comm_destroy(other[r]);
  }
}

/* A failing rank aborts the others (no hang); the world is usable after. */
static sta_status fail_rank1(void *arg, int32_t r, sta_comm *c) {
  (void)arg;
  if (r == 1) return sta_error(STA_ERR_KEY, "made up failure on rank 1");
  sta_status rc = sta_comm_barrier(c);
  if (rc == STA_OK) rc = sta_comm_barrier(c);
  return rc;
}

static sta_status barrier_rank(void *arg, int32_t r, sta_comm *c) {
  (void)arg; (void)r;
  return sta_comm_barrier(c);
}

static void test_loopback_abort_and_timeout(void **state) {
  (void)state;
  sta_comm *comms[3];
  assert_int_equal(sta_comm_loopback(comms, 3), STA_OK);
  sta_expect_err(sta_comm_loopback_run(comms, 3, fail_rank1, NULL), STA_ERR_KEY,
               "rank 1: made up failure on rank 1");
  assert_int_equal(sta_comm_loopback_run(comms, 3, barrier_rank, NULL), STA_OK);
  /* one rank alone in a barrier times out instead of hanging */
  setenv("STA_DIST_TIMEOUT", "0.2", 1);
  sta_expect_err(sta_comm_barrier(comms[2]), STA_ERR_STATE,
               "loopback rank 2: waited 0.2 s for the other ranks (STA_DIST_TIMEOUT); "
               "the world is aborted");
  sta_expect_err(sta_comm_barrier(comms[0]), STA_ERR_STATE,
               "loopback rank 0: the world was aborted (another rank failed)");
  setenv("STA_DIST_TIMEOUT", "30", 1);
  assert_int_equal(sta_comm_loopback_run(comms, 3, barrier_rank, NULL), STA_OK);
  for (int r = 0; r < 3; r++) sta_comm_destroy(comms[r]);
}

int main(void) {
  dist_test_begin("test_dist");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_loopback_collectives),
    cmocka_unit_test(test_custom_transport),
    cmocka_unit_test(test_errors_comm),
    cmocka_unit_test(test_loopback_abort_and_timeout),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
