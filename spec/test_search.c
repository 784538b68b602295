/* test_search.c -- mask search and tuning end to end on synthetic data
** whose answer is known: "local" heads attend only to keys in their own
** frame, own h tile and a w neighbourhood that straddles two w tiles, so
** window [1, 1, 3] is lossless and [1, 1, 1] is not; "wide" heads attend
** everywhere, so the widest candidate loses least.  On local heads the two
** lossless candidates tie exactly, and ties go to the first listed.  Search runs through
** the layer for 3 steps x 2 layers and two prompts (positive and negative
** passes); tuning with skip_steps 1 must pick full / [1, 1, 3] / [1, 3, 3]. */
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

#include "internal.h"

/* canvas 2x8x16, tile 1x4x4: grid 2x2x4, 256 video tokens, no text */
enum { T = 2, H = 8, W = 16, V = T * H * W, NH = 6, D = 8, STEPS = 3, LAYERS = 2 };
static const int32_t CAND[4][3] = {{1, 1, 1}, {1, 1, 3}, {1, 3, 3}, {2, 2, 4}};
/* heads 0, 2, 3 are local.  4 candidates < 6 heads: a search row (with 4
** heads the row would be per-head windows). */
static const int LOCAL[NH] = {1, 0, 1, 1, 0, 0};

static uint64_t seed_base;
static uint64_t next_seed(void) { return seed_base++ * 0x9e3779b97f4a7c15ull + 7; }

static sta_tensor *tensor(void) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {1, V, NH, D};
  assert_int_equal(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

/* Coarse position of a token: frame, h tile, w block of 4 shifted by 2. */
static void coarse(int64_t s, float x[3]) {
  int64_t t = s / (H * W), h = (s / W) % H, w = s % W;
  x[0] = (float)t - 0.5f;
  x[1] = (float)(h / 4) - 0.5f;
  x[2] = (float)((w + 2) / 4) - 2.0f;
}

/* q.k = c (2 x_i.x_j - |x_j|^2): largest, and equal, exactly on the keys
** with x_j = x_i; at least c below on every other key (c * scale * log2 e
** is far beyond float's exponent range).  V on local heads: integers 1..4,
** so the sums are exact whatever the order. */
static void make_inputs(sta_tensor **q, sta_tensor **k, sta_tensor **v) {
  *q = tensor(); *k = tensor(); *v = tensor();
  float *qd = sta_tensor_data(*q), *kd = sta_tensor_data(*k), *vd = sta_tensor_data(*v);
  const float c = 600.0f;
  for (int64_t s = 0; s < V; s++)
    for (int h = 0; h < NH; h++) {
      if (!LOCAL[h]) continue;
      float x[3], *qr = qd + (s * NH + h) * D, *kr = kd + (s * NH + h) * D,
                  *vr = vd + (s * NH + h) * D;
      coarse(s, x);
      memset(qr, 0, D * sizeof(float));
      memset(kr, 0, D * sizeof(float));
      for (int i = 0; i < 3; i++) { qr[i] = 2 * c * x[i]; kr[i] = x[i]; }
      qr[3] = -c;
      kr[3] = x[0] * x[0] + x[1] * x[1] + x[2] * x[2];
      for (int d = 0; d < D; d++) {
        float r = vr[d];
        vr[d] = (float)(1 + ((int)(r * 1000.0f) & 3));
      }
    }
}

/* One prompt: 3 steps x 2 layers, positive and negative passes; saves the
** positive list to pos_path and the negative one to neg_path. */
static void search_prompt(sta_layer *const *layers, const char *pos_path,
                          const char *neg_path, float l2_out[STEPS][LAYERS][3][NH]) {
  sta_metadata *md = NULL;
  assert_int_equal(sta_metadata_search(&md, LAYERS, 4, &CAND[0][0]), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  for (int step = 0; step < STEPS; step++)
    for (int neg = 0; neg < 2; neg++) {
      sta_forward_batch_set_negative(fb, neg);
      sta_context *ctx = NULL;
      assert_int_equal(sta_context_push(&ctx, step, md, fb), STA_OK);
      assert_true(sta_in_forward_pass());
      for (int l = 0; l < LAYERS; l++) {
        sta_tensor *q, *k, *v, *out = tensor(), *full = tensor();
        make_inputs(&q, &k, &v);
        assert_int_equal(sta_layer_forward(layers[l], q, k, v, out), STA_OK);
        /* the layer returns the full-window output */
        sta_attention_desc ad;
        memset(&ad, 0, sizeof ad);
        sta_geometry_init(&ad.geom, T, H, W);
        ad.geom.tile[0] = 1; ad.geom.tile[1] = 4; ad.geom.tile[2] = 4;
        ad.n_windows = 1;
        ad.windows = CAND[3];
        assert_int_equal(sta_attention_forward(&ad, q, k, v, full, NULL), STA_OK);
        double max_abs, rel;
        assert_int_equal(sta_tensor_compare(out, full, &max_abs, &rel), STA_OK);
        if (max_abs != 0.0) fail_msg("layer output differs from full: %g", max_abs);
        /* losses of each candidate, by hand, for the checks below */
        if (!neg)
          for (int c = 0; c < 3; c++) {
            float l1[NH];
            ad.windows = CAND[c];
            assert_int_equal(sta_attention_forward(&ad, q, k, v, out, NULL), STA_OK);
            assert_int_equal(sta_head_diff(out, full, STA_BSHD, l1, l2_out[step][l][c]), STA_OK);
          }
        sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
        sta_tensor_destroy(out); sta_tensor_destroy(full);
      }
      assert_int_equal(sta_context_pop(ctx), STA_OK);
    }
  assert_int_equal(sta_forward_batch_records(fb, 0), STEPS * LAYERS);
  assert_int_equal(sta_forward_batch_records(fb, 1), STEPS * LAYERS);
  assert_int_equal(sta_forward_batch_save_search(fb, 0, pos_path), STA_OK);
  assert_int_equal(sta_forward_batch_save_search(fb, 1, neg_path), STA_OK);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(md);
}

static void test_search_then_tune(void **state) {
  (void)state;
  sta_layer *layers[LAYERS];
  for (int l = 0; l < LAYERS; l++) {
    sta_layer_desc d;
    memset(&d, 0, sizeof d);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "transformer.blocks.%d.attn.impl", l);
    d.prefix = prefix;
    d.local_heads = NH;
    d.head_dim = D;
    d.sp_size = 1;
    sta_geometry_init(&d.geom, T, H, W);
    d.geom.tile[0] = 1; d.geom.tile[1] = 4; d.geom.tile[2] = 4;
    d.layout = STA_BSHD;
    d.backend = STA_CPU;
    assert_int_equal(sta_layer_create(&layers[l], &d), STA_OK);
  }
  char paths[4][256];
  for (int i = 0; i < 4; i++)
    snprintf(paths[i], sizeof paths[i], "/tmp/sta-test-search-%d-%d.json", (int)getpid(), i);
  static float l2[2][STEPS][LAYERS][3][NH];
  search_prompt(layers, paths[0], paths[1], l2[0]);
  search_prompt(layers, paths[2], paths[3], l2[1]);
  /* the synthetic data does what it claims */
  for (int p = 0; p < 2; p++)
    for (int s = 0; s < STEPS; s++)
      for (int l = 0; l < LAYERS; l++)
        for (int h = 0; h < NH; h++) {
          const float *x = &l2[p][s][l][0][h];
          float a = x[0], b = x[NH], c = x[2 * NH];
          if (LOCAL[h]) {
            /* [1, 1, 3] and [1, 3, 3] see the same keys with weight > 0 and
            ** give the same bits; against the dense path only rounding */
            assert_true(a > 1e-3f);
            if (b != c || b > 1e-8f)
              fail_msg("local head %d: L2 of [1,1,3] %g and [1,3,3] %g should be equal and ~0",
                       h, (double)b, (double)c);
          } else {
            assert_true(a > b && b > c && c > 0.0f);
          }
        }
  /* tune on the two prompts' positive passes */
  const char *files[2] = {paths[0], paths[2]};
  int32_t full[3] = {2, 2, 4};
  sta_strategy *s = NULL;
  sta_tune_report rep;
  assert_int_equal(sta_tune(&s, 2, files, 1, full, &rep), STA_OK);
  assert_int_equal(sta_strategy_count(s), STEPS * LAYERS * NH);
  assert_int_equal(sta_strategy_check(s, STEPS, LAYERS, NH), STA_OK);
  for (int t = 0; t < STEPS; t++)
    for (int l = 0; l < LAYERS; l++)
      for (int h = 0; h < NH; h++) {
        int32_t w[3];
        assert_int_equal(sta_strategy_get(s, t, l, h, w), STA_OK);
        const int32_t *want = t < 1 ? full : LOCAL[h] ? CAND[1] : CAND[2];
        if (memcmp(w, want, sizeof w))
          fail_msg("step %d layer %d head %d: chose [%d, %d, %d], expected [%d, %d, %d]", t, l,
                   h, w[0], w[1], w[2], want[0], want[1], want[2]);
      }
  /* report: sparsity against full, windows in candidate order, full last */
  assert_float_equal(rep.sparsity, 1.0 - (12 * 16 + 12 * 3 + 12 * 6) / (36.0 * 16), 1e-12);
  assert_int_equal(rep.n_windows, 3);
  assert_memory_equal(rep.windows[0], CAND[1], 12);
  assert_memory_equal(rep.windows[1], CAND[2], 12);
  assert_memory_equal(rep.windows[2], full, 12);
  assert_int_equal(rep.counts[0], 12);
  assert_int_equal(rep.counts[1], 12);
  assert_int_equal(rep.counts[2], 12);
  /* the negative passes tune to the same answer; the strategy round-trips */
  const char *neg_files[2] = {paths[1], paths[3]};
  sta_strategy *sn = NULL, *back = NULL;
  assert_int_equal(sta_tune(&sn, 2, neg_files, 1, full, NULL), STA_OK);
  assert_true(sta_strategy_equal(s, sn));
  char spath[256];
  snprintf(spath, sizeof spath, "/tmp/sta-test-search-%d-strategy.json", (int)getpid());
  assert_int_equal(sta_strategy_save(s, spath), STA_OK);
  assert_int_equal(sta_strategy_load(&back, spath), STA_OK);
  assert_true(sta_strategy_equal(s, back));
  /* and drives the layers: the tuned windows are what runs */
  for (int l = 0; l < LAYERS; l++) sta_layer_set_strategy(layers[l], back);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  sta_context *ctx = NULL;
  assert_int_equal(sta_context_push(&ctx, 2, NULL, fb), STA_OK);
  sta_tensor *q, *k, *v, *out = tensor(), *want = tensor();
  make_inputs(&q, &k, &v);
  assert_int_equal(sta_layer_forward(layers[1], q, k, v, out), STA_OK);
  int32_t wins[NH][3];
  for (int h = 0; h < NH; h++) memcpy(wins[h], LOCAL[h] ? CAND[1] : CAND[2], 12);
  sta_attention_desc ad;
  memset(&ad, 0, sizeof ad);
  sta_geometry_init(&ad.geom, T, H, W);
  ad.geom.tile[0] = 1; ad.geom.tile[1] = 4; ad.geom.tile[2] = 4;
  ad.n_windows = NH;
  ad.windows = &wins[0][0];
  assert_int_equal(sta_attention_forward(&ad, q, k, v, want, NULL), STA_OK);
  double max_abs, rel;
  assert_int_equal(sta_tensor_compare(out, want, &max_abs, &rel), STA_OK);
  assert_true(max_abs == 0.0);
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
  sta_tensor_destroy(out); sta_tensor_destroy(want);
  sta_forward_batch_destroy(fb);
  for (int i = 0; i < 4; i++) remove(paths[i]);
  remove(spath);
  sta_strategy_destroy(s);
  sta_strategy_destroy(sn);
  sta_strategy_destroy(back);
  for (int l = 0; l < LAYERS; l++) sta_layer_destroy(layers[l]);
}

/* ---- saved tables, as a property ------------------------------------------ */

static uint64_t rng_state = 1;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}
static int32_t rin(int32_t lo, int32_t hi) { return lo + (int32_t)(rnd() % (uint64_t)(hi - lo + 1)); }

static const char *tmp_file(const char *name) {
  static char buf[2][256];
  static int k;
  char *p = buf[k++ & 1];
  snprintf(p, 256, "/tmp/sta-test-search-%d-%s", (int)getpid(), name);
  return p;
}

/* Random records: steps x layer sequences, either every step with one
** sequence (a permutation of some layers) or one step broken (a record
** dropped, added or two swapped).  Saving must refuse exactly the broken
** ones, naming the step; a saved file must tune (skip_steps 0) to the
** argmin of what was recorded at [step][position in the sequence][head]
** (a ragged table was once written, then refused by sta_tune). */
static void test_saved_tables(void **state) {
  (void)state;
  rng_state = seed_base | 1;
  enum { NC = 3 };
  static const int32_t cand[NC][3] = {{1, 1, 1}, {1, 3, 3}, {3, 3, 3}};
  int saved = 0, refused = 0;
  for (int c = 0; c < 300; c++) {
    int32_t steps = rin(1, 4), nl = rin(1, 4), heads = rin(1, 3), seq[8], lay[4][8], n[4];
    for (int32_t i = 0; i < nl; i++) seq[i] = i;
    for (int32_t i = nl - 1; i > 0; i--) { int32_t j = rin(0, i), t = seq[i]; seq[i] = seq[j]; seq[j] = t; }
    for (int32_t t = 0; t < steps; t++) { memcpy(lay[t], seq, sizeof seq); n[t] = nl; }
    int broken = steps > 1 && rin(0, 1);
    if (broken) {
      int32_t t = rin(1, steps - 1), how = rin(0, 2);
      if (nl == 1 && how != 1) how = 1; /* a step with no record is no step */
      if (how == 0) n[t] = nl - 1; /* the last dropped */
      else if (how == 1) { lay[t][nl] = rin(0, 3); n[t] = nl + 1; } /* one more */
      else { int32_t a = lay[t][0]; lay[t][0] = lay[t][nl - 1]; lay[t][nl - 1] = a; }
    }
    sta_forward_batch *fb = NULL;
    assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
    static float l2[4][8][NC][4], l1[NC * 4];
    for (int32_t t = 0; t < steps; t++)
      for (int32_t i = 0; i < n[t]; i++) {
        for (int32_t k = 0; k < NC * heads; k++) {
          l2[t][i][k / heads][k % heads] = (float)(rnd() % 1000) / 997.0f;
          l1[k] = 0.5f;
        }
        float flat[NC * 4];
        for (int32_t k = 0; k < NC * heads; k++) flat[k] = l2[t][i][k / heads][k % heads];
        assert_int_equal(sta_forward_batch_record(fb, 0, t, lay[t][i], NC, &cand[0][0], heads,
                                                  l1, flat), STA_OK);
      }
    const char *path = tmp_file("table.json");
    remove(path);
    sta_status rc = sta_forward_batch_save_search(fb, 0, path);
    int bad = 0;
    for (int32_t t = 1; t < steps; t++)
      bad |= n[t] != n[0] || memcmp(lay[t], lay[0], sizeof(int32_t) * (size_t)n[0]) != 0;
    if (bad) {
      if (rc != STA_ERR_STATE || !strstr(sta_last_error(), "every step of a search must record"))
        fail_msg("case %d: a broken table: %s '%s'", c, sta_status_name(rc), sta_last_error());
      assert_int_equal(access(path, F_OK), -1); /* nothing written */
      refused++;
    } else {
      if (rc != STA_OK) fail_msg("case %d: %s", c, sta_last_error());
      sta_strategy *st = NULL;
      int32_t full[3] = {5, 5, 5};
      const char *files[1] = {path};
      if (sta_tune(&st, 1, files, 0, full, NULL) != STA_OK)
        fail_msg("case %d: tune: %s", c, sta_last_error());
      for (int32_t t = 0; t < steps; t++)
        for (int32_t i = 0; i < nl; i++)
          for (int32_t h = 0; h < heads; h++) {
            int best = 0;
            for (int k = 1; k < NC; k++) if (l2[t][i][k][h] < l2[t][i][best][h]) best = k;
            int32_t w[3];
            assert_int_equal(sta_strategy_get(st, t, i, h, w), STA_OK);
            if (memcmp(w, cand[best], sizeof w))
              fail_msg("case %d: [%d][%d][%d] chose [%d, %d, %d], recorded best [%d, %d, %d]", c,
                       t, i, h, w[0], w[1], w[2], cand[best][0], cand[best][1], cand[best][2]);
          }
      sta_strategy_destroy(st);
      saved++;
    }
    remove(path);
    sta_forward_batch_destroy(fb);
  }
  printf("# %d record sets saved and tuned back exactly, %d broken ones refused\n", saved,
         refused);
  assert_true(saved > 50 && refused > 50);
}

/* The search-results reader (sta_tune) refuses text after the object and a
** NUL in a key, as the strategy reader does. */
static void test_reader_refuses(void **state) {
  (void)state;
  static const struct { const char *text, *msg; } cases[] = {
    {"{\"L2_loss\": {\"[1, 1, 1]\": [[[0.5]]]}}\n{\"L2_loss\": {}}",
     "unexpected text after the JSON object at byte 38"},
    {"{\"L2_loss\": {\"[1, 1, 1]\": [[[0.5]]]}} x", "unexpected text after the JSON object"},
    {"{\"L2_loss\": {\"[1, 1, 1]\\u0000x\": [[[0.5]]]}}", "NUL character in a string at byte 23"},
    {"{\"L2_loss\\u0000\": {\"[1, 1, 1]\": [[[0.5]]]}}", "NUL character in a string at byte 9"},
  };
  const char *path = tmp_file("reader.json");
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(cases[i].text, f);
    fclose(f);
    sta_strategy *st = (sta_strategy *)&rng_state;
    const char *files[1] = {path};
    int32_t full[3] = {5, 5, 5};
    sta_status rc = sta_tune(&st, 1, files, 0, full, NULL);
    if (rc != STA_ERR_FORMAT || !strstr(sta_last_error(), cases[i].msg) ||
        !strstr(sta_last_error(), path))
      fail_msg("case %zu: %s '%s', wanted '%s'", i, sta_status_name(rc), sta_last_error(),
               cases[i].msg);
    assert_ptr_equal(st, (sta_strategy *)&rng_state);
  }
  remove(path);
}

int main(void) {
  seed_base = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
  printf("# test_search seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_search_then_tune),
    cmocka_unit_test(test_saved_tables),
    cmocka_unit_test(test_reader_refuses),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
