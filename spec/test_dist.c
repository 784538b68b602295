/* test_dist.c -- sequence parallelism on the CPU: loopback collectives, SP
** attention and SP layers on P in {1, 2, 3, 4} ranks (one thread each)
** equal to single-device sta_attention_forward on many geometries, and
** every error path (exact messages, nothing changed, no hang). */
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

#include "internal.h"
#include "test_util.h"

#define MAXP 4
#define MAXH 12

static uint64_t seed_base;

static uint64_t next_seed(void) { return seed_base += 7919; }

static sta_tensor *new4(sta_dtype dt, sta_layout layout, int64_t b, int64_t s, int64_t h,
                        int64_t d) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  return t;
}

static sta_tensor *randn4(sta_dtype dt, sta_layout layout, int64_t b, int64_t s, int64_t h,
                          int64_t d) {
  sta_tensor *t = new4(dt, layout, b, s, h, d);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

static sta_tensor *snapshot(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_to(&c, t, sta_tensor_dtype(t), STA_CPU), STA_OK);
  return c;
}

static void assert_bitwise(const sta_tensor *a, const sta_tensor *b) {
  double mx = -1, rel = -1;
  assert_int_equal(sta_tensor_compare(a, b, &mx, &rel), STA_OK);
  if (!(mx == 0.0)) fail_msg("tensors differ: max |a-b| = %g", mx);
}

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

/* ---- SP attention == single device --------------------------------------------- */

typedef struct sp_case {
  int32_t canvas[3], tile[3];
  int64_t text, text_len; /* text rows; valid ones (-1: all) */
  int64_t b, h, d;
  sta_dtype dtype;
  sta_layout layout;
  int32_t n_windows;
  int32_t windows[3 * MAXH];
} sp_case;

typedef struct sp_job {
  sta_attention_desc desc;
  sta_sp_layer *layers[MAXP];
  sta_strategy *strategy;
  sta_metadata *md;                  /* layer runs: the context's table */
  sta_forward_batch *batches[MAXP];  /* layer runs: NULL = a fresh one */
  int32_t step;
  sta_tensor *q[MAXP], *k[MAXP], *v[MAXP], *o[MAXP];
} sp_job;

static sta_status sp_rank(void *arg, int32_t r, sta_comm *c) {
  sp_job *j = arg;
  return sta_sp_attention(c, &j->desc, j->q[r], j->k[r], j->v[r], j->o[r]);
}

static void case_desc(const sp_case *c, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  for (int i = 0; i < 3; i++) d->geom.tile[i] = c->tile[i];
  d->geom.text_len = c->text_len;
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
}

/* Shard full inputs over p ranks, run fn on every rank, compare each rank's
** output with the shard of full_out. */
static void run_sp(const sp_case *c, int32_t p, sp_job *j, sta_rank_fn fn,
                   const sta_tensor *fq, const sta_tensor *fk, const sta_tensor *fv,
                   const sta_tensor *fo, sta_comm **comms) {
  int64_t v = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2];
  int64_t sl = v / p + c->text;
  const sta_geometry *g = &j->desc.geom;
  for (int32_t r = 0; r < p; r++) {
    j->q[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->k[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->v[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->o[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    assert_int_equal(sta_sp_shard(j->q[r], fq, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_sp_shard(j->k[r], fk, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_sp_shard(j->v[r], fv, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_tensor_fill(j->o[r], NAN), STA_OK);
  }
  sta_status rc = sta_comm_loopback_run(comms, p, fn, j);
  if (rc != STA_OK) fail_msg("P=%d: %s", (int)p, sta_last_error());
  sta_tensor *back = new4(c->dtype, c->layout, c->b, v + c->text, c->h, c->d);
  for (int32_t r = 0; r < p; r++) {
    sta_tensor *want = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    assert_int_equal(sta_sp_shard(want, fo, g, c->layout, r, p), STA_OK);
    assert_bitwise(j->o[r], want);
    assert_int_equal(sta_sp_unshard(back, j->o[r], g, c->layout, r, p), STA_OK);
    sta_tensor_destroy(want);
    sta_tensor_destroy(j->q[r]);
    sta_tensor_destroy(j->k[r]);
    sta_tensor_destroy(j->v[r]);
    sta_tensor_destroy(j->o[r]);
  }
  assert_bitwise(back, fo); /* the shards cover the whole output */
  sta_tensor_destroy(back);
}

/* A case's whole-sequence tensors (s rows): random q, k, v and an o. */
typedef struct full_qkvo {
  sta_tensor *q, *k, *v, *o;
} full_qkvo;

static full_qkvo full_make(const sp_case *c, int64_t s) {
  full_qkvo f;
  f.q = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.k = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.v = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.o = new4(c->dtype, c->layout, c->b, s, c->h, c->d);
  return f;
}

static void full_free(full_qkvo *f) {
  sta_tensor_destroy(f->q);
  sta_tensor_destroy(f->k);
  sta_tensor_destroy(f->v);
  sta_tensor_destroy(f->o);
}

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

/* ---- a caller's transport ---------------------------------------------------------- */

/* Counts the collectives and delegates to a loopback communicator (raw
** bytes wrapped as f16 tensors); fail_gather makes all-gather fail. */
typedef struct counting {
  sta_comm *inner;
  int32_t a2a, gather, barrier, fail_gather, destroyed;
} counting;

static int32_t cnt_rank(void *self) { return sta_comm_rank(((counting *)self)->inner); }
static int32_t cnt_size(void *self) { return sta_comm_size(((counting *)self)->inner); }

static sta_status cnt_move(counting *c, const void *send, void *recv, size_t sbytes,
                           size_t rbytes, int gather) {
  sta_tensor *s = NULL, *r = NULL;
  int64_t ns = (int64_t)(sbytes / 2), nr = (int64_t)(rbytes / 2);
  sta_status rc = sta_tensor_wrap(&s, (void *)send, STA_F16, STA_CPU, 1, &ns, NULL);
  if (rc == STA_OK) rc = sta_tensor_wrap(&r, recv, STA_F16, STA_CPU, 1, &nr, NULL);
  if (rc == STA_OK)
    rc = gather ? sta_comm_all_gather(c->inner, s, r) : sta_comm_all_to_all(c->inner, s, r);
  sta_tensor_destroy(s);
  sta_tensor_destroy(r);
  return rc;
}

static sta_status cnt_a2a(void *self, const void *send, void *recv, size_t chunk, sta_device d) {
  counting *c = self;
  size_t n = chunk * (size_t)cnt_size(self);
  assert_int_equal(d, STA_CPU);
  c->a2a++;
  return cnt_move(c, send, recv, n, n, 0);
}

static sta_status cnt_gather(void *self, const void *send, void *recv, size_t chunk,
                             sta_device d) {
  counting *c = self;
  assert_int_equal(d, STA_CPU);
  c->gather++;
  if (c->fail_gather) return sta_error(STA_ERR_DEVICE, "fake: link down");
  return cnt_move(c, send, recv, chunk, chunk * (size_t)cnt_size(self), 1);
}

static sta_status cnt_barrier(void *self) {
  counting *c = self;
  c->barrier++;
  return sta_comm_barrier(c->inner);
}

static void cnt_destroy(void *self) { ((counting *)self)->destroyed++; }

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
** three all-to-alls in (q, k, v), one out and the text all-gather. */
static void test_custom_transport(void **state) {
  (void)state;
  const int32_t p = 2;
  sta_comm *inner[2], *comms[2];
  counting cnt[2];
  memset(cnt, 0, sizeof cnt);
  assert_int_equal(sta_comm_loopback(inner, p), STA_OK);
  for (int32_t r = 0; r < p; r++) {
    cnt[r].inner = inner[r];
    sta_transport t = {"counting", 1u << STA_CPU, &cnt[r], cnt_rank, cnt_size,
                       cnt_a2a, cnt_gather, cnt_barrier, cnt_destroy, NULL};
    assert_int_equal(sta_comm_create(&comms[r], &t), STA_OK);
    assert_string_equal(sta_comm_name(comms[r]), "counting");
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
            assert_int_equal(cnt[r].gather, 1 + n * (text > 0));
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
  counting bad = {inner[0], 0, 0, 0, 0, 0};
  sta_transport t = {"counting", 1u << STA_CPU, &bad, cnt_size, cnt_size, cnt_a2a,
                     cnt_gather, cnt_barrier, cnt_destroy, NULL};
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
  seed_base = (uint64_t)time(NULL);
  setenv("STA_DIST_TIMEOUT", "30", 0); /* a broken test fails, never hangs */
  printf("test_dist: seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_loopback_collectives),
    cmocka_unit_test(test_sp_attention_text0),
    cmocka_unit_test(test_sp_attention_text),
    cmocka_unit_test(test_sp_attention_odd_canvas),
    cmocka_unit_test(test_sp_attention_bhsd_bf16),
    cmocka_unit_test(test_sp_attention_dense),
    cmocka_unit_test(test_sp_layer_strategy),
    cmocka_unit_test(test_sp_layer_search),
    cmocka_unit_test(test_custom_transport),
    cmocka_unit_test(test_tcp_transport),
    cmocka_unit_test(test_errors_sp_attention),
    cmocka_unit_test(test_errors_shard),
    cmocka_unit_test(test_errors_comm),
    cmocka_unit_test(test_ranks_disagree),
    cmocka_unit_test(test_loopback_abort_and_timeout),
    cmocka_unit_test(test_errors_layer),
    cmocka_unit_test(test_errors_nccl_env),
    cmocka_unit_test(test_errors_out_of_memory),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
