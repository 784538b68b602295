/* test_dist_errors.c -- every error of SP attention, shards and SP layers
** (exact messages, outputs unchanged, the communicators usable after),
** ranks that disagree on their calls, and every allocation failing. */
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

/* ---- errors ------------------------------------------------------------------------ */

/* One rank's call on a world of p, failing before any collective. */
static void sp_error_case(int32_t p, const int32_t canvas[3], int64_t text, int64_t rows,
                          int64_t h, int32_t n_windows, const int32_t *windows,
                          sta_status want, const char *msg) {
  sta_comm *comms[MAXP];
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, canvas[0], canvas[1], canvas[2]);
  d.geom.tile[0] = 2; d.geom.tile[1] = 2; d.geom.tile[2] = 2;
  d.layout = STA_BSHD;
  d.n_windows = n_windows;
  d.windows = windows;
  assert_int_equal(sta_comm_loopback(comms, p), STA_OK);
  sta_tensor *q = randn4(STA_F32, STA_BSHD, 1, rows + text, h, 8);
  sta_tensor *o = randn4(STA_F32, STA_BSHD, 1, rows + text, h, 8);
  sta_tensor *before = snapshot(o);
  sta_expect_err(sta_sp_attention(comms[p - 1], &d, q, q, q, o), want, msg);
  assert_bitwise(o, before);
  sta_tensor_destroy(q);
  sta_tensor_destroy(o);
  sta_tensor_destroy(before);
  for (int32_t r = 0; r < p; r++) sta_comm_destroy(comms[r]);
}

static void test_errors_sp_attention(void **state) {
  (void)state;
  const int32_t odd[3] = {3, 5, 7}, even[3] = {4, 4, 4}, big[3] = {8, 4, 4}; /* V = 105, 64, 128 */
  int32_t w[3 * 4] = {3, 3, 3, 1, 1, 1, 3, 3, 3, 2, 1, 1};
  sp_error_case(2, odd, 3, 52, 4, 1, w, STA_ERR_SHAPE,
                "canvas: V = 105 video tokens (3x5x7) is not divisible by the 2 ranks");
  sp_error_case(2, even, 3, 32, 3, 1, w, STA_ERR_SHAPE,
                "heads: 3 heads are not divisible by the 2 ranks");
  sp_error_case(4, even, 0, 10, 4, 1, w, STA_ERR_SEQ_LEN,
                "q: 10 rows on rank 3, expected V/P = 16 video rows (+ text rows)");
  sp_error_case(2, even, 3, 32, 4, 2, w, STA_ERR_WINDOW,
                "n_windows: expected 1 or heads (4), got 2");
  sp_error_case(2, big, 3, 64, 4, 4, w, STA_ERR_WINDOW,
                "head 3: window: Kt = 2 is even and smaller than the 4 tiles on the t "
                "axis (use an odd window, or >= 4 for the whole axis)");
  /* a bad window of another rank's head is caught on every rank */
  int32_t w2[3 * 4] = {2, 1, 1, 1, 1, 1, 3, 3, 3, 1, 1, 1};
  sp_error_case(2, big, 3, 64, 4, 4, w2, STA_ERR_WINDOW,
                "head 0: window: Kt = 2 is even and smaller than the 4 tiles on the t "
                "axis (use an odd window, or >= 4 for the whole axis)");

  sta_comm *comms[2];
  assert_int_equal(sta_comm_loopback(comms, 2), STA_OK);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 4, 4);
  d.geom.tile[0] = d.geom.tile[1] = d.geom.tile[2] = 2;
  d.n_windows = 1;
  d.windows = w;
  sta_tensor *q = randn4(STA_F32, STA_BSHD, 1, 35, 4, 8);
  sta_tensor *o = randn4(STA_F32, STA_BSHD, 1, 35, 4, 8);
  sta_tensor *o16 = randn4(STA_F16, STA_BSHD, 1, 35, 4, 8);
  sta_tensor *o5 = randn4(STA_F32, STA_BSHD, 1, 35, 4, 5);
  sta_tensor *before = snapshot(o);
  sta_expect_err(sta_sp_attention(NULL, &d, q, q, q, o), STA_ERR_ARGUMENT,
               "comm: expected a communicator, got NULL");
  sta_expect_err(sta_sp_attention(comms[0], NULL, q, q, q, o), STA_ERR_ARGUMENT,
               "desc: expected a descriptor, got NULL");
  sta_expect_err(sta_sp_attention(comms[0], &d, q, NULL, q, o), STA_ERR_ARGUMENT,
               "k: expected a tensor, got NULL");
  sta_expect_err(sta_sp_attention(comms[0], &d, q, q, q, o16), STA_ERR_DTYPE,
               "out: dtype f16 differs from q's f32");
  sta_expect_err(sta_sp_attention(comms[0], &d, q, q, q, o5), STA_ERR_SHAPE,
               "out: shape [B=1, S=35, heads=4, D=5] differs from q's "
               "[B=1, S=35, heads=4, D=8]");
  d.geom.text_len = 9;
  sta_expect_err(sta_sp_attention(comms[1], &d, q, q, q, o), STA_ERR_ARGUMENT,
               "text_len: 9 is outside 0..3 (seq_len 67 - 64 video tokens)");
  d.geom.text_len = -1;
  d.layout = (sta_layout)7;
  sta_expect_err(sta_sp_attention(comms[1], &d, q, q, q, o), STA_ERR_ARGUMENT,
               "layout: expected STA_BSHD (0) or STA_BHSD (1), got 7");
  assert_bitwise(o, before);
  sta_tensor_destroy(q);
  sta_tensor_destroy(o);
  sta_tensor_destroy(o16);
  sta_tensor_destroy(o5);
  sta_tensor_destroy(before);
  sta_comm_destroy(comms[0]);
  sta_comm_destroy(comms[1]);
}

static void test_errors_shard(void **state) {
  (void)state;
  sta_geometry g;
  sta_geometry_init(&g, 4, 4, 4);
  sta_tensor *full = randn4(STA_F32, STA_BSHD, 1, 67, 2, 4);
  sta_tensor *local = randn4(STA_F32, STA_BSHD, 1, 35, 2, 4);
  sta_tensor *wrong = randn4(STA_F32, STA_BSHD, 1, 34, 2, 4);
  sta_tensor *before = snapshot(local);
  sta_expect_err(sta_sp_shard(local, full, &g, STA_BSHD, 2, 2), STA_ERR_ARGUMENT,
               "rank: expected 0..1, got 2");
  sta_expect_err(sta_sp_shard(local, full, &g, STA_BSHD, -1, 2), STA_ERR_ARGUMENT,
               "rank: expected 0..1, got -1");
  sta_expect_err(sta_sp_shard(local, full, &g, STA_BSHD, 0, 0), STA_ERR_ARGUMENT,
               "size: expected >= 1 ranks, got 0");
  sta_expect_err(sta_sp_shard(local, full, &g, STA_BSHD, 0, 3), STA_ERR_SHAPE,
               "canvas: V = 64 video tokens (4x4x4) is not divisible by the 3 ranks");
  sta_expect_err(sta_sp_shard(wrong, full, &g, STA_BSHD, 0, 2), STA_ERR_SHAPE,
               "local: shape [B=1, S=34, heads=2, D=4], expected [B=1, S=35 (V/P 32 + "
               "text 3), heads=2, D=4]");
  sta_expect_err(sta_sp_shard(local, full, NULL, STA_BSHD, 0, 2), STA_ERR_ARGUMENT,
               "geometry: expected a geometry, got NULL");
  assert_bitwise(local, before);
  sta_tensor_destroy(full);
  sta_tensor_destroy(local);
  sta_tensor_destroy(wrong);
  sta_tensor_destroy(before);
}

/* ---- ranks that disagree ------------------------------------------------------------- */

/* Each rank's own call (desc, q as q, k and v, out) and its result. */
typedef struct dis_job {
  sta_attention_desc desc[2];
  int32_t windows[2][3];
  sta_tensor *q[2], *o[2], *before[2];
  sta_status rc[2];
  char msg[2][512];
} dis_job;

static sta_status sp_error_rank(void *arg, int32_t r, sta_comm *c);

static sta_status dis_rank(void *arg, int32_t r, sta_comm *c) {
  dis_job *j = arg;
  j->rc[r] = sta_sp_attention(c, &j->desc[r], j->q[r], j->q[r], j->q[r], j->o[r]);
  snprintf(j->msg[r], sizeof j->msg[r], "%s", j->rc[r] == STA_OK ? "" : sta_last_error());
  return STA_OK; /* each rank's result is checked below */
}

static sta_status sp_error_rank(void *arg, int32_t r, sta_comm *c) {
  dis_job *j = arg;
  return sta_sp_attention(c, &j->desc[r], j->q[r], j->q[r], j->q[r], j->o[r]);
}

/* A valid rank call: canvas 4x4x4, tile 2, window 1,1,1, q [1, 32 + 3, 4, 8]. */
static void dis_rank_init(dis_job *j, int r, sta_dtype dt, sta_layout layout, int64_t rows,
                          int64_t h) {
  sta_attention_desc *d = &j->desc[r];
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, 4, 4, 4);
  d->geom.tile[0] = d->geom.tile[1] = d->geom.tile[2] = 2;
  d->layout = layout;
  d->n_windows = 1;
  j->windows[r][0] = j->windows[r][1] = j->windows[r][2] = 1;
  d->windows = j->windows[r];
  j->q[r] = randn4(dt, layout, 1, rows, h, 8);
  j->o[r] = randn4(dt, layout, 1, rows, h, 8);
  j->before[r] = snapshot(j->o[r]);
}

/* Both ranks return msg (status want) and leave out unchanged; then the
** same communicators run a valid call that equals one device. */
static void dis_check(dis_job *j, sta_comm **comms, sta_status want, const char *msg) {
  assert_int_equal(sta_comm_loopback_run(comms, 2, dis_rank, j), STA_OK);
  for (int r = 0; r < 2; r++) {
    if (j->rc[r] != want || strcmp(j->msg[r], msg) != 0)
      fail_msg("rank %d: %s (%d), wanted \"%s\" (%d)", r, j->msg[r], (int)j->rc[r], msg, (int)want);
    assert_bitwise(j->o[r], j->before[r]);
    sta_tensor_destroy(j->q[r]);
    sta_tensor_destroy(j->o[r]);
    sta_tensor_destroy(j->before[r]);
    assert_int_equal(sta_comm_set_chunks(comms[r], 0), STA_OK);
  }
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = c.canvas[1] = c.canvas[2] = 4;
  c.tile[0] = c.tile[1] = c.tile[2] = 2;
  c.text = 3; c.text_len = -1;
  c.b = 1; c.h = 4; c.d = 8;
  c.dtype = STA_F32;
  c.layout = STA_BSHD;
  c.n_windows = 1;
  c.windows[0] = 3; c.windows[1] = 1; c.windows[2] = 3;
  sp_job sj;
  memset(&sj, 0, sizeof sj);
  case_desc(&c, &sj.desc);
  full_qkvo f = full_make(&c, 64 + 3);
  assert_int_equal(sta_attention_forward(&sj.desc, f.q, f.k, f.v, f.o, NULL), STA_OK);
  run_sp(&c, 2, &sj, sp_rank, f.q, f.k, f.v, f.o, comms);
  full_free(&f);
}

static void test_ranks_disagree(void **state) {
  (void)state;
  sta_comm *comms[2];
  dis_job j;
  assert_int_equal(sta_comm_loopback(comms, 2), STA_OK);
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 6);
  dis_check(&j, comms, STA_ERR_SHAPE, "ranks disagree on the heads: rank 0 has 4, rank 1 has 6");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 36, 4);
  dis_check(&j, comms, STA_ERR_SHAPE, "ranks disagree on q's shape: rank 0 has [B=1, S=35, "
            "heads=4, D=8], rank 1 has [B=1, S=36, heads=4, D=8]");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F16, STA_BSHD, 35, 4);
  dis_check(&j, comms, STA_ERR_DTYPE, "ranks disagree on the dtype: rank 0 has f32, rank 1 has f16");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BHSD, 35, 4);
  dis_check(&j, comms, STA_ERR_ARGUMENT,
            "ranks disagree on the layout: rank 0 has BSHD, rank 1 has BHSD");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  j.windows[1][1] = 3;
  dis_check(&j, comms, STA_ERR_WINDOW,
            "ranks disagree on the windows: rank 1's differ from rank 0's (n_windows 1 and 1)");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  sta_geometry_init(&j.desc[1].geom, 2, 8, 4); /* the same V = 64 */
  j.desc[1].geom.tile[0] = j.desc[1].geom.tile[1] = j.desc[1].geom.tile[2] = 2;
  dis_check(&j, comms, STA_ERR_WINDOW,
            "ranks disagree on the geometry: rank 0 has canvas 4x4x4, tile 2x2x2, text_len -1; "
            "rank 1 has canvas 2x8x4, tile 2x2x2, text_len -1");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  j.desc[1].scale = 0.5f;
  dis_check(&j, comms, STA_ERR_ARGUMENT,
            "ranks disagree on the scale, softmax or precision: rank 0 has 0, 0 and 0, rank 1 "
            "has 0.5, 0 and 0");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  j.desc[1].precision = STA_PRECISION_FP8;
  dis_check(&j, comms, STA_ERR_ARGUMENT,
            "ranks disagree on the scale, softmax or precision: rank 0 has 0, 0 and 0, rank 1 "
            "has 0, 0 and 1");
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  assert_int_equal(sta_comm_set_chunks(comms[0], 2), STA_OK);
  dis_check(&j, comms, STA_ERR_ARGUMENT,
            "ranks disagree on the chunks: rank 0 runs 2, rank 1 runs 1 (sta_comm_set_chunks)");
  /* one rank's own error: in a loopback world it returns at once and its
  ** run aborts the other */
  dis_rank_init(&j, 0, STA_F32, STA_BSHD, 35, 4);
  dis_rank_init(&j, 1, STA_F32, STA_BSHD, 35, 4);
  assert_int_equal(sta_comm_set_chunks(comms[1], 3), STA_OK);
  sta_expect_err(sta_comm_loopback_run(comms, 2, sp_error_rank, &j), STA_ERR_ARGUMENT,
                 "rank 1: chunks: 3 do not divide the 2 heads of each rank (4 heads / 2 ranks; "
                 "sta_comm_set_chunks)");
  for (int r = 0; r < 2; r++) {
    assert_bitwise(j.o[r], j.before[r]);
    sta_tensor_destroy(j.q[r]);
    sta_tensor_destroy(j.o[r]);
    sta_tensor_destroy(j.before[r]);
  }
  sta_expect_err(sta_comm_set_chunks(comms[0], 65), STA_ERR_ARGUMENT,
                 "n: expected 0 (choose) or 1..64 chunks, got 65");
  sta_expect_err(sta_comm_set_chunks(NULL, 1), STA_ERR_ARGUMENT,
                 "comm: expected a communicator, got NULL");
  assert_int_equal(sta_comm_chunks(comms[1]), 3);
  sta_comm_destroy(comms[0]);
  sta_comm_destroy(comms[1]);
}

static void test_errors_layer(void **state) {
  (void)state;
  sta_comm *comms[2];
  sta_sp_layer *l = (sta_sp_layer *)0x1;
  assert_int_equal(sta_comm_loopback(comms, 2), STA_OK);
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.layer_index = 0;
  ld.local_heads = 2;
  ld.head_dim = 8;
  ld.layout = STA_BSHD;
  ld.backend = STA_CPU;
  sta_expect_err(sta_sp_layer_create(&l, comms[0], &ld), STA_ERR_WINDOW,
               "geom: sequence parallelism needs the canvas (0x0x0 picks a known shape by "
               "sequence length, which a rank's shard does not have)");
  sta_expect_err(sta_sp_layer_create(&l, NULL, &ld), STA_ERR_ARGUMENT,
               "comm: expected a communicator, got NULL");
  sta_geometry_init(&ld.geom, 4, 4, 4);
  ld.local_heads = 0;
  sta_expect_err(sta_sp_layer_create(&l, comms[0], &ld), STA_ERR_ARGUMENT,
               "local_heads: expected 1..65536, got 0");
  assert_ptr_equal(l, (sta_sp_layer *)0x1);
  ld.local_heads = 2;
  assert_int_equal(sta_sp_layer_create(&l, comms[1], &ld), STA_OK);
  sta_tensor *q = randn4(STA_F32, STA_BSHD, 1, 32, 2, 8);
  sta_tensor *o = randn4(STA_F32, STA_BSHD, 1, 32, 2, 8);
  sta_tensor *before = snapshot(o);
  sta_expect_err(sta_sp_layer_forward(l, q, q, q, o), STA_ERR_SHAPE,
               "q: expected 4 heads (local_heads 2 x 2 ranks), got 2");
  sta_expect_err(sta_sp_layer_forward(NULL, q, q, q, o), STA_ERR_ARGUMENT,
               "layer: expected an SP layer, got NULL");
  assert_bitwise(o, before);
  sta_sp_layer_destroy(l);
  sta_tensor_destroy(q);
  sta_tensor_destroy(o);
  sta_tensor_destroy(before);
  sta_comm_destroy(comms[0]);
  sta_comm_destroy(comms[1]);
}

/* Every allocation of an SP forward may fail: a clean error, out unchanged. */
static void test_errors_out_of_memory(void **state) {
  (void)state;
  sta_comm *c;
  assert_int_equal(sta_comm_loopback(&c, 1), STA_OK);
  sta_attention_desc d;
  int32_t w[3] = {3, 1, 3};
  memset(&d, 0, sizeof d);
  sta_geometry_init(&d.geom, 4, 4, 4);
  d.geom.tile[0] = d.geom.tile[1] = d.geom.tile[2] = 2;
  d.n_windows = 1;
  d.windows = w;
  sta_tensor *q = randn4(STA_F32, STA_BSHD, 1, 66, 2, 8);
  sta_tensor *o = randn4(STA_F32, STA_BSHD, 1, 66, 2, 8);
  sta_tensor *before = snapshot(o);
  int failures = 0;
  for (int64_t n = 1; n < 500; n++) {
    sta_fault_arm(n);
    sta_status rc = sta_sp_attention(c, &d, q, q, q, o);
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_bitwise(o, before);
    failures++;
  }
  /* one rank runs the plain forward (nothing to move): its allocations */
  assert_true(failures >= 2);
  /* the pipeline of two chunks in a world of one: a failure before data
  ** moves (buffers, views) leaves out unchanged; a later one (in the
  ** second chunk's forward) may have written the first chunk's heads */
  sta_tensor *ref = randn4(STA_F32, STA_BSHD, 1, 66, 2, 8);
  assert_int_equal(sta_attention_forward(&d, q, q, q, ref, NULL), STA_OK);
  assert_int_equal(sta_comm_set_chunks(c, 2), STA_OK);
  int before_moving = 0;
  failures = 0;
  for (int64_t n = 1; n < 500; n++) {
    assert_int_equal(sta_tensor_copy(o, before), STA_OK);
    sta_fault_arm(n);
    sta_status rc = sta_sp_attention(c, &d, q, q, q, o);
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    assert_int_equal(rc, STA_ERR_NOMEM);
    double mx = -1;
    assert_int_equal(sta_tensor_compare(o, before, &mx, NULL), STA_OK);
    before_moving += mx == 0.0;
    failures++;
  }
  assert_true(before_moving >= 3 && failures > before_moving);
  assert_bitwise(o, ref);
  sta_tensor_destroy(ref);
  /* shard and unshard: the destination unchanged on every failure */
  sta_tensor *local = randn4(STA_F32, STA_BSHD, 1, 66, 2, 8);
  sta_tensor *lbefore = snapshot(local);
  for (int unshard = 0; unshard <= 1; unshard++) {
    if (unshard) assert_int_equal(sta_tensor_randn(local, next_seed(), 0, 1), STA_OK);
    sta_tensor *dst = unshard ? q : local;
    sta_tensor *keep = unshard ? snapshot(q) : lbefore;
    failures = 0;
    for (int64_t n = 1; n < 100; n++) {
      sta_fault_arm(n);
      sta_status rc = unshard ? sta_sp_unshard(q, local, &d.geom, STA_BSHD, 0, 1)
                              : sta_sp_shard(local, q, &d.geom, STA_BSHD, 0, 1);
      sta_fault_arm(0);
      if (rc == STA_OK) break;
      assert_int_equal(rc, STA_ERR_NOMEM);
      assert_bitwise(dst, keep);
      failures++;
    }
    assert_true(failures >= 4);
    if (unshard) sta_tensor_destroy(keep);
  }
  sta_tensor_destroy(local);
  sta_tensor_destroy(lbefore);
  sta_comm_destroy(c);
  sta_tensor_destroy(q);
  sta_tensor_destroy(o);
  sta_tensor_destroy(before);
}

int main(void) {
  dist_test_begin("test_dist_errors");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_errors_sp_attention),
    cmocka_unit_test(test_errors_shard),
    cmocka_unit_test(test_ranks_disagree),
    cmocka_unit_test(test_errors_layer),
    cmocka_unit_test(test_errors_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
