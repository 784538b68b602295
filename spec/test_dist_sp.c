/* test_dist_sp.c -- SP attention and SP layers on P in {1, 2, 3, 4}
** loopback ranks (one thread each), every chunk count of the pipeline,
** equal bit for bit to single-device sta_attention_forward on many
** geometries, layouts and dtypes; SP layers from strategies and in search
** mode. */
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
#include <cJSON.h>

#include "dist_util.h"

static void check_sp(const sp_case *c) {
  int64_t v = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2], s = v + c->text;
  sp_job j;
  memset(&j, 0, sizeof j);
  case_desc(c, &j.desc);
  full_qkvo f = full_make(c, s);
  assert_int_equal(sta_attention_forward(&j.desc, f.q, f.k, f.v, f.o, NULL), STA_OK);
  int ran = 0;
  for (int32_t p = 1; p <= MAXP; p++) {
    if (v % p || c->h % p) continue;
    sta_comm *comms[MAXP];
    assert_int_equal(sta_comm_loopback(comms, p), STA_OK);
    /* every chunk count of the pipeline (0: the default), in a world of
    ** one too, on the same communicators (their buffers regrown) */
    for (int32_t n = 0; n <= c->h / p; n++) {
      if (n > 0 && (c->h / p) % n) continue;
      for (int32_t r = 0; r < p; r++) assert_int_equal(sta_comm_set_chunks(comms[r], n), STA_OK);
      assert_int_equal(sta_comm_chunks(comms[0]), n);
      run_sp(c, p, &j, sp_rank, f.q, f.k, f.v, f.o, comms);
      ran++;
    }
    for (int32_t r = 0; r < p; r++) sta_comm_destroy(comms[r]);
  }
  assert_true(ran >= 4);
  full_free(&f);
}

/* Per-head windows that differ by head (odd, or full on an axis). */
static void vary_windows(sp_case *c) {
  int32_t grid[3];
  sta_geometry g;
  sta_geometry_init(&g, c->canvas[0], c->canvas[1], c->canvas[2]);
  for (int i = 0; i < 3; i++) g.tile[i] = c->tile[i];
  sta_geometry_grid(&g, grid);
  c->n_windows = (int32_t)c->h;
  for (int64_t h = 0; h < c->h; h++)
    for (int i = 0; i < 3; i++) {
      int32_t k = 1 + 2 * (int32_t)((h + i) % 3); /* 1, 3, 5 */
      c->windows[3 * h + i] = k < grid[i] ? k : grid[i] + (int32_t)(h % 2);
    }
}

static void test_sp_attention_text0(void **state) {
  (void)state;
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 4; c.canvas[1] = 6; c.canvas[2] = 6;   /* V = 144 */
  c.tile[0] = 2; c.tile[1] = 3; c.tile[2] = 3;
  c.text = 0; c.text_len = -1;
  c.b = 1; c.h = 12; c.d = 16;                          /* P = 1, 2, 3, 4 */
  c.dtype = STA_F32;
  c.layout = STA_BSHD;
  vary_windows(&c);
  check_sp(&c);
}

static void test_sp_attention_text(void **state) {
  (void)state;
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 4; c.canvas[1] = 4; c.canvas[2] = 6;   /* V = 96 */
  c.tile[0] = 2; c.tile[1] = 2; c.tile[2] = 3;
  c.text = 9; c.text_len = 6;                          /* padding rows too */
  c.b = 2; c.h = 4; c.d = 8;                            /* P = 1, 2, 4 */
  c.dtype = STA_F32;
  c.layout = STA_BSHD;
  vary_windows(&c);
  check_sp(&c);
}

static void test_sp_attention_odd_canvas(void **state) {
  (void)state;
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 3; c.canvas[1] = 5; c.canvas[2] = 7;   /* V = 105, partial tiles */
  c.tile[0] = 2; c.tile[1] = 2; c.tile[2] = 3;
  c.text = 5; c.text_len = -1;
  c.b = 1; c.h = 6; c.d = 8;                            /* P = 1, 3 */
  c.dtype = STA_F32;
  c.layout = STA_BSHD;
  vary_windows(&c);
  check_sp(&c);
}

static void test_sp_attention_bhsd_bf16(void **state) {
  (void)state;
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 6; c.canvas[1] = 8; c.canvas[2] = 8;   /* V = 384, default tile */
  c.tile[0] = 3; c.tile[1] = 4; c.tile[2] = 4;
  c.text = 7; c.text_len = -1;
  c.b = 1; c.h = 4; c.d = 32;                           /* P = 1, 2, 4 */
  c.dtype = STA_BF16;
  c.layout = STA_BHSD;
  c.n_windows = 1;                                      /* one window, all heads */
  c.windows[0] = 1; c.windows[1] = 1; c.windows[2] = 1;
  check_sp(&c);
}

static void test_sp_attention_dense(void **state) {
  (void)state;
  sp_case c;
  memset(&c, 0, sizeof c);
  c.canvas[0] = 2; c.canvas[1] = 6; c.canvas[2] = 4;   /* V = 48 */
  c.tile[0] = 1; c.tile[1] = 3; c.tile[2] = 2;
  c.text = 3; c.text_len = 2;
  c.b = 1; c.h = 6; c.d = 16;                           /* P = 1, 2, 3 */
  c.dtype = STA_F16;
  c.layout = STA_BSHD;
  c.n_windows = 1;                                      /* full window */
  c.windows[0] = 9; c.windows[1] = 9; c.windows[2] = 9;
  check_sp(&c);
}

/* ---- SP layers ----------------------------------------------------------------- */

static sta_status layer_rank(void *arg, int32_t r, sta_comm *c) {
  sp_job *j = arg;
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  (void)c;
  sta_status rc = j->batches[r] ? STA_OK : sta_forward_batch_create(&fb, 1);
  if (rc == STA_OK) rc = sta_context_push(&ctx, j->step, j->md, j->batches[r] ? j->batches[r] : fb);
  if (rc == STA_OK) {
    rc = sta_sp_layer_forward(j->layers[r], j->q[r], j->k[r], j->v[r], j->o[r]);
    sta_status rc2 = sta_context_pop(ctx);
    if (rc == STA_OK) rc = rc2;
  }
  sta_forward_batch_destroy(fb);
  return rc;
}

/* The SP layer tests' case: canvas 4x6x6 (V = 144), tiles 2x3x3, batch
** 1, 4 heads of 16, f32 BSHD, `text` text rows. */
static void layer_case(sp_case *c, int64_t text) {
  memset(c, 0, sizeof *c);
  c->canvas[0] = 4; c->canvas[1] = 6; c->canvas[2] = 6;
  c->tile[0] = 2; c->tile[1] = 3; c->tile[2] = 3;
  c->text = text; c->text_len = -1;
  c->b = 1; c->h = 4; c->d = 16;
  c->dtype = STA_F32;
  c->layout = STA_BSHD;
}

static void test_sp_layer_strategy(void **state) {
  (void)state;
  sp_case c;
  layer_case(&c, 4);
  vary_windows(&c);
  int64_t v = 144, s = v + c.text;
  sp_job j;
  memset(&j, 0, sizeof j);
  case_desc(&c, &j.desc);
  j.step = 2;
  /* strategy: step 2, layer 5, head h -> c.windows[h]; other steps uniform */
  int32_t w3[3] = {3, 3, 3};
  assert_int_equal(sta_strategy_uniform(&j.strategy, 4, 8, (int32_t)c.h, w3, NULL, 0), STA_OK);
  for (int32_t h = 0; h < c.h; h++)
    assert_int_equal(sta_strategy_set(j.strategy, 2, 5, h, c.windows + 3 * h), STA_OK);
  full_qkvo f = full_make(&c, s);
  assert_int_equal(sta_attention_forward(&j.desc, f.q, f.k, f.v, f.o, NULL), STA_OK);
  for (int32_t p = 1; p <= MAXP; p++) {
    if (c.h % p) continue;
    sta_comm *comms[MAXP];
    assert_int_equal(sta_comm_loopback(comms, p), STA_OK);
    for (int32_t r = 0; r < p; r++) {
      sta_layer_desc ld;
      memset(&ld, 0, sizeof ld);
      ld.prefix = "transformer.blocks.5.attn.impl";
      ld.local_heads = (int32_t)(c.h / p);
      ld.head_dim = (int32_t)c.d;
      ld.geom = j.desc.geom;
      ld.layout = c.layout;
      ld.backend = STA_CPU;
      ld.strategy = j.strategy;
      assert_int_equal(sta_sp_layer_create(&j.layers[r], comms[r], &ld), STA_OK);
      assert_int_equal(sta_layer_index(sta_sp_layer_base(j.layers[r])), 5);
    }
    run_sp(&c, p, &j, layer_rank, f.q, f.k, f.v, f.o, comms);
    if (p == 2) { /* ranks at different layers: refused before anything moves */
      sta_layer_desc ld;
      memset(&ld, 0, sizeof ld);
      ld.layer_index = 6;
      ld.local_heads = 2;
      ld.head_dim = (int32_t)c.d;
      ld.geom = j.desc.geom;
      ld.backend = STA_CPU;
      ld.strategy = j.strategy;
      sta_sp_layer_destroy(j.layers[1]);
      assert_int_equal(sta_sp_layer_create(&j.layers[1], comms[1], &ld), STA_OK);
      for (int32_t r = 0; r < 2; r++) {
        j.q[r] = j.k[r] = j.v[r] = randn4(STA_F32, STA_BSHD, 1, v / 2 + c.text, c.h, c.d);
        j.o[r] = randn4(STA_F32, STA_BSHD, 1, v / 2 + c.text, c.h, c.d);
      }
      sta_tensor *before = snapshot(j.o[0]);
      sta_expect_err(sta_comm_loopback_run(comms, 2, layer_rank, &j), STA_ERR_ARGUMENT,
                     "rank 0: ranks disagree on the layer: rank 0 runs layer 5 at step 2, rank 1 "
                     "layer 6 at step 2");
      assert_bitwise(j.o[0], before);
      sta_tensor_destroy(before);
      for (int32_t r = 0; r < 2; r++) {
        sta_tensor_destroy(j.q[r]);
        sta_tensor_destroy(j.o[r]);
      }
    }
    for (int32_t r = 0; r < p; r++) {
      sta_sp_layer_destroy(j.layers[r]);
      sta_comm_destroy(comms[r]);
    }
  }
  sta_strategy_destroy(j.strategy);
  full_free(&f);
}

/* The L2 list of one search file: [step 0][record 0][heads]. */
static int32_t search_l2(const char *path, const char *cand, double *out, int32_t max) {
  char *text = NULL;
  size_t len = 0;
  assert_int_equal(sta_read_text_file(path, "search", &text, &len), STA_OK);
  cJSON *root = cJSON_Parse(text);
  free(text);
  assert_non_null(root);
  cJSON *l2 = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "L2_loss"), cand);
  cJSON *heads = cJSON_GetArrayItem(cJSON_GetArrayItem(l2, 0), 0);
  assert_non_null(heads);
  int32_t n = cJSON_GetArraySize(heads);
  assert_true(n <= max);
  for (int32_t h = 0; h < n; h++) out[h] = cJSON_GetArrayItem(heads, h)->valuedouble;
  cJSON_Delete(root);
  return n;
}

/* Search rows under SP: each rank runs every candidate on its heads, writes
** the full-window output and records its own heads' losses (SGLang: each
** rank saves its local heads), equal to the single-device search's. */
static void test_sp_layer_search(void **state) {
  (void)state;
  sp_case c;
  layer_case(&c, 3);
  c.n_windows = 1;
  c.windows[0] = c.windows[1] = c.windows[2] = 3; /* the full window (grid 2x2x2) */
  int64_t s = 144 + c.text;
  int32_t cand[9] = {1, 1, 1, 1, 3, 1, 3, 3, 3};
  sp_job j;
  memset(&j, 0, sizeof j);
  case_desc(&c, &j.desc);
  assert_int_equal(sta_metadata_search(&j.md, 3, 3, cand), STA_OK);
  full_qkvo f = full_make(&c, s);
  /* single device: an ordinary layer over all heads */
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.layer_index = 2;
  ld.local_heads = (int32_t)c.h;
  ld.head_dim = (int32_t)c.d;
  ld.sp_size = 1;
  ld.geom = j.desc.geom;
  ld.layout = c.layout;
  ld.backend = STA_CPU;
  sta_layer *single = NULL;
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  assert_int_equal(sta_layer_create(&single, &ld), STA_OK);
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 0, j.md, fb), STA_OK);
  assert_int_equal(sta_layer_forward(single, f.q, f.k, f.v, f.o), STA_OK);
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  char path[64];
  snprintf(path, sizeof path, "/tmp/sta-test-dist-%d-single.json", (int)getpid());
  assert_int_equal(sta_forward_batch_save_search(fb, 0, path), STA_OK);
  double want[2][MAXH], got[MAXH];
  const char *names[2] = {"[1, 1, 1]", "[1, 3, 1]"};
  for (int k = 0; k < 2; k++) assert_int_equal(search_l2(path, names[k], want[k], MAXH), c.h);
  remove(path);
  for (int32_t p = 2; p <= MAXP; p += 2) {
    sta_comm *comms[MAXP];
    assert_int_equal(sta_comm_loopback(comms, p), STA_OK);
    ld.local_heads = (int32_t)(c.h / p);
    for (int32_t r = 0; r < p; r++) {
      assert_int_equal(sta_sp_layer_create(&j.layers[r], comms[r], &ld), STA_OK);
      assert_int_equal(sta_forward_batch_create(&j.batches[r], 1), STA_OK);
    }
    run_sp(&c, p, &j, layer_rank, f.q, f.k, f.v, f.o, comms);
    for (int32_t r = 0; r < p; r++) {
      assert_int_equal(sta_forward_batch_records(j.batches[r], 0), 1);
      snprintf(path, sizeof path, "/tmp/sta-test-dist-%d-r%d.json", (int)getpid(), (int)r);
      assert_int_equal(sta_forward_batch_save_search(j.batches[r], 0, path), STA_OK);
      for (int k = 0; k < 2; k++) {
        assert_int_equal(search_l2(path, names[k], got, MAXH), c.h / p);
        for (int64_t h = 0; h < c.h / p; h++)
          assert_true(got[h] == want[k][r * (c.h / p) + h]);
      }
      remove(path);
      sta_forward_batch_destroy(j.batches[r]);
      j.batches[r] = NULL;
      sta_sp_layer_destroy(j.layers[r]);
      sta_comm_destroy(comms[r]);
    }
  }
  sta_layer_destroy(single);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(j.md);
  full_free(&f);
}


int main(void) {
  dist_test_begin("test_dist_sp");
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sp_attention_text0),
    cmocka_unit_test(test_sp_attention_text),
    cmocka_unit_test(test_sp_attention_odd_canvas),
    cmocka_unit_test(test_sp_attention_bhsd_bf16),
    cmocka_unit_test(test_sp_attention_dense),
    cmocka_unit_test(test_sp_layer_strategy),
    cmocka_unit_test(test_sp_layer_search),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
