/* test_layer.c -- the STA layer: prefixes, creation checks, forward's
** checks in order (nothing changed on error), sequence-parallel head
** selection against sta_attention_forward, FastVideo strategy files, the
** backward.  Search mode: test_layer_search.c; VSA mode: test_layer_vsa.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "layer_util.h"

/* ---- prefixes and creation ------------------------------------------------ */

static void test_prefix(void **state) {
  (void)state;
  int32_t l = -1;
  assert_int_equal(sta_layer_index_from_prefix("transformer.double_blocks.7.attn.impl", &l), STA_OK);
  assert_int_equal(l, 7);
  assert_int_equal(sta_layer_index_from_prefix("12.attn.impl", &l), STA_OK);
  assert_int_equal(l, 12);
  assert_int_equal(sta_layer_index_from_prefix("model.blocks.0.x.y", &l), STA_OK);
  assert_int_equal(l, 0);
  assert_int_equal(sta_layer_index_from_prefix("a.b.39.c.d", &l), STA_OK);
  assert_int_equal(l, 39);
  l = 5;
  EXPECT_ERR(sta_layer_index_from_prefix("attn.impl", &l), STA_ERR_ARGUMENT,
             "prefix \"attn.impl\": expected at least 3 '.'-separated parts (the layer is "
             "prefix.split('.')[-3])");
  EXPECT_ERR(sta_layer_index_from_prefix("", &l), STA_ERR_ARGUMENT,
             "prefix \"\": expected at least 3 '.'-separated parts (the layer is "
             "prefix.split('.')[-3])");
  EXPECT_ERR(sta_layer_index_from_prefix("transformer.blocks.x.attn.impl", &l), STA_ERR_ARGUMENT,
             "prefix \"transformer.blocks.x.attn.impl\": part -3 \"x\" is not a layer number");
  EXPECT_ERR(sta_layer_index_from_prefix("blocks.7.attn", &l), STA_ERR_ARGUMENT,
             "prefix \"blocks.7.attn\": part -3 \"blocks\" is not a layer number");
  EXPECT_ERR(sta_layer_index_from_prefix("a..attn.impl", &l), STA_ERR_ARGUMENT,
             "prefix \"a..attn.impl\": part -3 \"\" is not a layer number");
  EXPECT_ERR(sta_layer_index_from_prefix("a.-1.attn.impl", &l), STA_ERR_ARGUMENT,
             "prefix \"a.-1.attn.impl\": part -3 \"-1\" is not a layer number");
  EXPECT_ERR(sta_layer_index_from_prefix("a.99999999999.b.c", &l), STA_ERR_ARGUMENT,
             "prefix \"a.99999999999.b.c\": part -3 \"99999999999\" is not a layer number");
  EXPECT_ERR(sta_layer_index_from_prefix(NULL, &l), STA_ERR_ARGUMENT,
             "prefix: expected a string, got NULL");
  assert_int_equal(l, 5);
}

static void test_create_errors(void **state) {
  (void)state;
  sta_layer *l = NULL;
  sta_layer_desc d = base_desc();
  d.prefix = "transformer.blocks.3.attn.impl";
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  assert_int_equal(sta_layer_index(l), 3);
  sta_layer_destroy(l);
  l = NULL;
  d = base_desc();
  d.layer_index = 5;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  assert_int_equal(sta_layer_index(l), 5);
  sta_layer_destroy(l);
  l = NULL;
#define BAD(field, value, status, msg)            \
  do {                                            \
    d = base_desc();                              \
    d.field = value;                              \
    EXPECT_ERR(sta_layer_create(&l, &d), status, msg); \
    assert_null(l);                               \
  } while (0)
  BAD(layer_index, -1, STA_ERR_ARGUMENT, "layer_index: expected >= 0, got -1");
  BAD(prefix, "x.attn", STA_ERR_ARGUMENT,
      "prefix \"x.attn\": expected at least 3 '.'-separated parts (the layer is "
      "prefix.split('.')[-3])");
  BAD(local_heads, 0, STA_ERR_ARGUMENT, "local_heads: expected 1..65536, got 0");
  BAD(head_dim, 0, STA_ERR_ARGUMENT, "head_dim: expected >= 1, got 0");
  BAD(sp_size, 0, STA_ERR_ARGUMENT, "sp_size: expected 1..65536, got 0");
  BAD(sp_rank, 1, STA_ERR_ARGUMENT, "sp_rank: expected 0..0 (sp_size 1), got 1");
  d = base_desc();
  d.local_heads = 65536;
  d.sp_size = 32;
  EXPECT_ERR(sta_layer_create(&l, &d), STA_ERR_ARGUMENT,
             "local_heads x sp_size: 2097152 heads in all, expected at most 1048576");
  assert_null(l);
  BAD(sp_rank, -1, STA_ERR_ARGUMENT, "sp_rank: expected 0..0 (sp_size 1), got -1");
  BAD(geom.canvas[1], 0, STA_ERR_WINDOW,
      "geom: canvas 6x0x24 (all 0 for a known shape by seq_len, else each >= 1)");
  BAD(geom.tile[2], 0, STA_ERR_WINDOW, "tile: w = 0, expected 1..1048576");
  BAD(layout, (sta_layout)7, STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got 7");
  BAD(backend, (sta_device)9, STA_ERR_ARGUMENT, "backend: unknown device 9");
  BAD(softmax, (sta_softmax)2, STA_ERR_ARGUMENT,
      "softmax: expected STA_SOFTMAX_EXACT (0) or STA_SOFTMAX_FAST (1), got 2");
  char nb[300];
  setenv("STA_DISABLE_CUDA", "1", 1);
  snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
  BAD(backend, STA_CUDA, STA_ERR_BACKEND, nb);
  unsetenv("STA_DISABLE_CUDA");
  snprintf(nb, sizeof nb, "st attn not supported (%s)", sta_backend_describe(STA_CUDA));
  if (!sta_backend_available(STA_CUDA)) BAD(backend, STA_CUDA, STA_ERR_BACKEND, nb);
  EXPECT_ERR(sta_layer_create(&l, NULL), STA_ERR_ARGUMENT,
             "desc: expected a layer description, got NULL");
  /* canvas 0,0,0 is allowed: the shape comes from seq_len */
  d = base_desc();
  d.geom.canvas[0] = d.geom.canvas[1] = d.geom.canvas[2] = 0;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  sta_layer_destroy(l);
#undef BAD
}

/* ---- forward errors: in order, out unchanged ------------------------------ */

static void test_forward_errors(void **state) {
  (void)state;
  sta_layer_desc d = base_desc();
  d.layer_index = 1;
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  sta_tensor *q = randn4(1, S, 2, D), *k = randn4(1, S, 2, D), *v = randn4(1, S, 2, D);
  sta_tensor *out = randn4(1, S, 2, D), *poison = NULL;
  assert_int_equal(sta_tensor_to(&poison, out, STA_F32, STA_CPU), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  sta_context *c = NULL;
#define FWD_ERR(status, msg)                                            \
  do {                                                                  \
    EXPECT_ERR(sta_layer_forward(l, q, k, v, out), status, msg);        \
    assert_same(out, poison, 0.0);                                      \
  } while (0)
  FWD_ERR(STA_ERR_STATE, "STA forward called outside a forward context (no context is live)");
  assert_int_equal(sta_context_push(&c, 0, NULL, NULL), STA_OK);
  FWD_ERR(STA_ERR_NO_BATCH, "forward_batch cannot be None");
  assert_int_equal(sta_context_pop(c), STA_OK);
  /* no metadata: the layer's strategy */
  assert_int_equal(sta_context_push(&c, 1, NULL, fb), STA_OK);
  FWD_ERR(STA_ERR_NO_STRATEGY, "mask_strategy cannot be None for SlidingTileAttention");
  sta_strategy *s = NULL;
  const char *no0 = "{\"1_1_0\": [1, 3, 3], \"1_1_1\": [3, 1, 1]}";
  assert_int_equal(sta_strategy_parse(&s, no0, strlen(no0)), STA_OK);
  sta_layer_set_strategy(l, s);
  FWD_ERR(STA_ERR_NO_STEP0, "mask_strategy[0] cannot be None for SlidingTileAttention");
  int32_t w3[3] = {3, 3, 3};
  assert_int_equal(sta_strategy_set(s, 0, 0, 0, w3), STA_OK);
  assert_int_equal(sta_strategy_set(s, 1, 1, 1, (int32_t[]){3, 3, 3}), STA_OK);
  int32_t w2[3] = {2, 3, 3}; /* even and smaller than 3 tiles */
  assert_int_equal(sta_strategy_set(s, 1, 1, 0, w2), STA_OK);
  FWD_ERR(STA_ERR_WINDOW,
          "head 0: window: Kt = 2 is even and smaller than the 3 tiles on the t axis (use an "
          "odd window, or >= 3 for the whole axis)");
  assert_int_equal(sta_context_pop(c), STA_OK);
  assert_int_equal(sta_context_push(&c, 2, NULL, fb), STA_OK);
  FWD_ERR(STA_ERR_KEY, "mask strategy has no window for \"2_1_0\" (step 2, layer 1, head 0)");
  assert_int_equal(sta_context_pop(c), STA_OK);
  /* metadata: rows checked before the tensors */
  sta_metadata *md = NULL;
  assert_int_equal(sta_metadata_create(&md, 1), STA_OK);
  assert_int_equal(sta_context_push(&c, 0, md, fb), STA_OK);
  FWD_ERR(STA_ERR_STA_PARAM, "Invalid STA_param");  /* 1 layer, index 1 */
  assert_int_equal(sta_context_pop(c), STA_OK);
  sta_metadata_destroy(md);
  assert_int_equal(sta_metadata_create(&md, 2), STA_OK);
  assert_int_equal(sta_context_push(&c, 0, md, fb), STA_OK);
  FWD_ERR(STA_ERR_STA_PARAM, "Invalid STA_param");  /* row 1 unset */
  int32_t three[9] = {1, 1, 1, 3, 1, 3, 3, 2, 6};
  assert_int_equal(sta_metadata_set_row(md, 1, 3, three), STA_OK);
  FWD_ERR(STA_ERR_STA_PARAM, "Invalid STA_param");  /* 3 windows > 2 heads */
  int32_t two[6] = {1, 3, 3, 3, 1, 1};
  assert_int_equal(sta_metadata_set_row(md, 1, 2, two), STA_OK);
  /* tensors */
  sta_tensor *shortq = narrow(q, 1, 0, V - 1), *kk = narrow(k, 1, 0, V - 1),
             *vv = narrow(v, 1, 0, V - 1), *oo = narrow(out, 1, 0, V - 1);
  EXPECT_ERR(sta_layer_forward(l, shortq, kk, vv, oo), STA_ERR_SEQ_LEN,
             "seq_len 1151 not supported for STA");
  assert_same(out, poison, 0.0);
  sta_tensor *q1 = narrow(q, 2, 0, 1), *qd = narrow(q, 3, 0, D - 1);
  EXPECT_ERR(sta_layer_forward(l, q1, k, v, out), STA_ERR_SHAPE,
             "q: expected 2 heads (local_heads), got 1");
  EXPECT_ERR(sta_layer_forward(l, q, k, v, qd), STA_ERR_SHAPE, "out: expected head dim 16, got 15");
  EXPECT_ERR(sta_layer_forward(l, q, NULL, v, out), STA_ERR_ARGUMENT,
             "k: expected a tensor, got NULL");
  sta_tensor *k3 = narrow(k, 1, 0, S - 1);
  EXPECT_ERR(sta_layer_forward(l, q, k3, v, out), STA_ERR_SHAPE,
             "k: shape [B=1, S=1159, heads=2, D=16] differs from q's [B=1, S=1160, heads=2, D=16]");
  sta_tensor *vh = NULL;
  assert_int_equal(sta_tensor_to(&vh, v, STA_BF16, STA_CPU), STA_OK);
  EXPECT_ERR(sta_layer_forward(l, q, k, vh, out), STA_ERR_DTYPE, "v: dtype bf16 differs from q's f32");
  assert_same(out, poison, 0.0);
  assert_int_equal(sta_context_pop(c), STA_OK);
  /* no canvas: the known FastVideo shapes only */
  sta_layer *la = NULL;
  d = base_desc();
  d.geom.canvas[0] = d.geom.canvas[1] = d.geom.canvas[2] = 0;
  assert_int_equal(sta_layer_create(&la, &d), STA_OK);
  assert_int_equal(sta_metadata_set_row(md, 0, 2, two), STA_OK);
  assert_int_equal(sta_context_push(&c, 0, md, fb), STA_OK);
  EXPECT_ERR(sta_layer_forward(la, q, k, v, out), STA_ERR_SEQ_LEN,
             "seq_len 1160 not supported for STA");
  assert_same(out, poison, 0.0);
  assert_int_equal(sta_context_pop(c), STA_OK);
  assert_int_equal(sta_forward_batch_records(fb, 0), 0);
  assert_int_equal(sta_context_depth(), 0);
  sta_tensor *all[] = {q, k, v, out, poison, shortq, kk, vv, oo, q1, qd, k3, vh};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
  sta_layer_destroy(la);
  sta_layer_destroy(l);
  sta_metadata_destroy(md);
  sta_strategy_destroy(s);
  sta_forward_batch_destroy(fb);
#undef FWD_ERR
}

/* ---- sequence parallel: each rank runs its global heads ------------------- */

enum { STEPS = 3, LAYERS = 2, HEADS = 4, SP = 2, HL = HEADS / SP };

/* The 16 windows that differ on a 3x2x6 grid; each (step, layer) gets 4
** different ones from a fresh random permutation. */
static sta_strategy *distinct_strategy(int32_t win[STEPS][LAYERS][HEADS][3]) {
  static const int32_t kt[2] = {1, 3}, kh[2] = {1, 2}, kw[4] = {1, 3, 5, 6};
  int32_t all[16][3], n = 0;
  for (int a = 0; a < 2; a++)
    for (int b = 0; b < 2; b++)
      for (int c = 0; c < 4; c++) { all[n][0] = kt[a]; all[n][1] = kh[b]; all[n][2] = kw[c]; n++; }
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_create(&s), STA_OK);
  for (int t = 0; t < STEPS; t++)
    for (int l = 0; l < LAYERS; l++) {
      for (int i = n - 1; i > 0; i--) {
        int j = (int)(next_seed() % (uint64_t)(i + 1));
        int32_t x[3];
        memcpy(x, all[i], sizeof x); memcpy(all[i], all[j], sizeof x); memcpy(all[j], x, sizeof x);
      }
      for (int h = 0; h < HEADS; h++) {
        memcpy(win[t][l][h], all[h], 3 * sizeof(int32_t));
        assert_int_equal(sta_strategy_set(s, t, l, h, win[t][l][h]), STA_OK);
      }
    }
  return s;
}

static void run_sp_loop(sta_layout layout, int use_metadata) {
  int32_t win[STEPS][LAYERS][HEADS][3];
  sta_strategy *s = distinct_strategy(win);
  int hdim = layout == STA_BSHD ? 2 : 1;
  sta_layer *layer[SP][LAYERS];
  for (int r = 0; r < SP; r++)
    for (int l = 0; l < LAYERS; l++) {
      sta_layer_desc d = base_desc();
      char prefix[64];
      snprintf(prefix, sizeof prefix, "transformer.blocks.%d.attn.impl", l);
      d.prefix = l == 0 ? prefix : NULL;
      d.layer_index = l;
      d.local_heads = HL;
      d.sp_rank = r;
      d.sp_size = SP;
      d.layout = layout;
      d.strategy = use_metadata ? NULL : s;
      assert_int_equal(sta_layer_create(&layer[r][l], &d), STA_OK);
      assert_int_equal(sta_layer_index(layer[r][l]), l);
    }
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  for (int t = 0; t < STEPS; t++) {
    sta_metadata *md = NULL;
    if (use_metadata) assert_int_equal(sta_metadata_from_strategy(&md, s, t, LAYERS, HEADS), STA_OK);
    sta_context *c = NULL;
    assert_int_equal(sta_context_push(&c, t, md, fb), STA_OK);
    for (int l = 0; l < LAYERS; l++) {
      int64_t B = 1 + (t == 1); /* one step with batch 2 */
      sta_tensor *q, *k, *v, *out, *want = NULL;
      if (layout == STA_BSHD) {
        q = randn4(B, S, HEADS, D); k = randn4(B, S, HEADS, D); v = randn4(B, S, HEADS, D);
        out = randn4(B, S, HEADS, D);
      } else {
        q = randn4(B, HEADS, S, D); k = randn4(B, HEADS, S, D); v = randn4(B, HEADS, S, D);
        out = randn4(B, HEADS, S, D);
      }
      assert_int_equal(sta_tensor_to(&want, out, STA_F32, STA_CPU), STA_OK);
      sta_attention_desc ad;
      memset(&ad, 0, sizeof ad);
      geometry(&ad.geom);
      ad.layout = layout;
      ad.n_windows = HEADS;
      ad.windows = &win[t][l][0][0];
      assert_int_equal(sta_attention_forward(&ad, q, k, v, want, NULL), STA_OK);
      for (int r = 0; r < SP; r++) {
        sta_tensor *qr = narrow(q, hdim, r * HL, HL), *kr = narrow(k, hdim, r * HL, HL),
                   *vr = narrow(v, hdim, r * HL, HL), *outr = narrow(out, hdim, r * HL, HL);
        assert_int_equal(sta_layer_forward(layer[r][l], qr, kr, vr, outr), STA_OK);
        sta_tensor_destroy(qr); sta_tensor_destroy(kr); sta_tensor_destroy(vr);
        sta_tensor_destroy(outr);
      }
      /* each rank wrote exactly its global heads with their windows */
      assert_same(out, want, 1e-6);
      /* an allocation failing anywhere in a normal-mode forward changes nothing */
      if (t == 0 && l == 0) {
        sta_tensor *q0 = narrow(q, hdim, 0, HL), *o0 = narrow(out, hdim, 0, HL), *keep = NULL;
        assert_int_equal(sta_tensor_to(&keep, o0, STA_F32, STA_CPU), STA_OK);
        sta_status rc = STA_ERR_NOMEM;
        for (int64_t n = 1; n < 64 && rc != STA_OK; n++) {
          sta_fault_arm(n);
          rc = sta_layer_forward(layer[0][l], q0, q0, q0, o0);
          sta_fault_arm(0);
          if (rc != STA_OK) {
            assert_int_equal(rc, STA_ERR_NOMEM);
            assert_same(o0, keep, 0.0);
          }
        }
        assert_int_equal(rc, STA_OK);
        sta_tensor *r1 = narrow(q, hdim, HL, HL), *o1 = narrow(out, hdim, HL, HL);
        assert_int_equal(sta_layer_forward(layer[1][l], r1, r1, r1, o1), STA_OK);
        sta_tensor_destroy(q0); sta_tensor_destroy(o0); sta_tensor_destroy(keep);
        sta_tensor_destroy(r1); sta_tensor_destroy(o1);
        ad.windows = &win[t][l][0][0];
        assert_int_equal(sta_attention_forward(&ad, q, q, q, want, NULL), STA_OK);
        assert_same(out, want, 1e-6);
      }
      /* and the windows matter: the wrong rank's windows give another answer */
      int32_t swapped[HEADS][3];
      for (int h = 0; h < HEADS; h++) memcpy(swapped[h], win[t][l][(h + HL) % HEADS], 12);
      ad.windows = &swapped[0][0];
      assert_int_equal(sta_attention_forward(&ad, q, k, v, want, NULL), STA_OK);
      double max_abs, rel;
      assert_int_equal(sta_tensor_compare(out, want, &max_abs, &rel), STA_OK);
      assert_true(max_abs > 1e-3);
      sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
      sta_tensor_destroy(out); sta_tensor_destroy(want);
    }
    assert_int_equal(sta_context_pop(c), STA_OK);
    sta_metadata_destroy(md);
  }
  assert_int_equal(sta_forward_batch_records(fb, 0), 0);
  for (int r = 0; r < SP; r++)
    for (int l = 0; l < LAYERS; l++) sta_layer_destroy(layer[r][l]);
  sta_forward_batch_destroy(fb);
  sta_strategy_destroy(s);
}

static void test_sp_metadata_bshd(void **state) { (void)state; run_sp_loop(STA_BSHD, 1); }
static void test_sp_strategy_bhsd(void **state) { (void)state; run_sp_loop(STA_BHSD, 0); }

/* ---- a FastVideo strategy file drives the per-head windows ------------ */

static void test_fastvideo_file(void **state) {
  (void)state;
  /* as FastVideo writes it: json.dump of {"t_l_h": [Kt, Kh, Kw]}, any order */
  const char *text =
      "{\"0_0_0\": [1, 2, 3], \"0_0_1\": [3, 1, 5], \"0_0_2\": [3, 2, 6], \"0_0_3\": [1, 1, 1],\n"
      " \"1_0_3\": [3, 3, 3], \"1_0_2\": [1, 1, 3], \"1_0_1\": [1, 5, 1], \"1_0_0\": [3, 1, 7]}";
  const int32_t want_w[2][4][3] = {{{1, 2, 3}, {3, 1, 5}, {3, 2, 6}, {1, 1, 1}},
                                   {{3, 1, 7}, {1, 5, 1}, {1, 1, 3}, {3, 3, 3}}};
  char path[256];
  snprintf(path, sizeof path, "/tmp/sta-test-layer-%d-fastvideo.json", (int)getpid());
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  setenv("FASTVIDEO_ATTENTION_CONFIG", path, 1);
  unsetenv("STA_ATTENTION_CONFIG");
  unsetenv("SGLANG_DIFFUSION_ATTENTION_CONFIG");
  sta_strategy *s = NULL;
  assert_int_equal(sta_strategy_load_default(&s), STA_OK);
  unsetenv("FASTVIDEO_ATTENTION_CONFIG");
  remove(path);
  sta_layer_desc d = base_desc();
  d.prefix = "transformer.blocks.0.attn.impl";
  d.local_heads = 4;
  d.strategy = s;
  d.geom.text_len = 5; /* 3 padding rows after the valid text */
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &d), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  for (int t = 0; t < 2; t++) {
    sta_tensor *q = randn4(1, S, 4, D), *k = randn4(1, S, 4, D), *v = randn4(1, S, 4, D),
               *out = randn4(1, S, 4, D), *want = randn4(1, S, 4, D);
    sta_attention_desc ad;
    memset(&ad, 0, sizeof ad);
    geometry(&ad.geom);
    ad.geom.text_len = 5;
    ad.layout = STA_BSHD;
    ad.n_windows = 4;
    ad.windows = &want_w[t][0][0];
    assert_int_equal(sta_attention_forward(&ad, q, k, v, want, NULL), STA_OK);
    sta_context *c = NULL;
    assert_int_equal(sta_context_push(&c, t, NULL, fb), STA_OK);
    assert_int_equal(sta_layer_forward(l, q, k, v, out), STA_OK);
    assert_int_equal(sta_context_pop(c), STA_OK);
    assert_same(out, want, 1e-6);
    sta_tensor_destroy(q); sta_tensor_destroy(k); sta_tensor_destroy(v);
    sta_tensor_destroy(out); sta_tensor_destroy(want);
  }
  sta_layer_destroy(l);
  sta_forward_batch_destroy(fb);
  sta_strategy_destroy(s);
}

/* ---- backward ---------------------------------------------------------------- */

/* The layer's backward uses the live context's windows (here per head, from
** a strategy, at step 3 of a rank's heads) and matches sta_attention_backward
** with them; a search row and a missing context are errors that leave the
** gradients as they were. */
static void test_backward(void **state) {
  (void)state;
  sta_strategy *st = NULL;
  assert_int_equal(sta_strategy_create(&st), STA_OK);
  int32_t wins[4][3] = {{1, 1, 3}, {3, 1, 1}, {1, 3, 5}, {3, 3, 1}};
  for (int32_t h = 0; h < 4; h++) {
    int32_t full[3] = {3, 3, 7};
    assert_int_equal(sta_strategy_set(st, 0, 0, h, full), STA_OK);
    assert_int_equal(sta_strategy_set(st, 3, 0, h, wins[h]), STA_OK);
  }
  sta_layer_desc ld = base_desc();
  ld.sp_rank = 1;
  ld.sp_size = 2;
  ld.strategy = st;
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &ld), STA_OK);
  sta_tensor *t[8], *r[3], *lse = NULL;
  for (int i = 0; i < 8; i++) t[i] = randn4(1, S, 2, D);
  for (int i = 0; i < 3; i++) {
    r[i] = randn4(1, S, 2, D);
    assert_int_equal(sta_tensor_fill(t[5 + i], NAN), STA_OK);
  }
  int64_t lshape[3] = {1, 2, S};
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, lshape), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  /* no live context */
  EXPECT_ERR(sta_layer_backward(l, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6], t[7]),
             STA_ERR_STATE, "STA forward called outside a forward context (no context is live)");
  sta_context *ctx = NULL;
  assert_int_equal(sta_context_push(&ctx, 3, NULL, fb), STA_OK);
  assert_int_equal(sta_layer_forward_lse(l, t[0], t[1], t[2], t[3], lse), STA_OK);
  assert_int_equal(sta_layer_backward(l, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6], t[7]),
                   STA_OK);
  /* the same through the attention API with rank 1's windows (heads 2, 3) */
  sta_attention_desc ad;
  memset(&ad, 0, sizeof ad);
  geometry(&ad.geom);
  ad.layout = STA_BSHD;
  ad.n_windows = 2;
  ad.windows = &wins[2][0];
  assert_int_equal(sta_attention_backward(&ad, t[0], t[1], t[2], t[3], lse, t[4], r[0], r[1], r[2]),
                   STA_OK);
  for (int i = 0; i < 3; i++) assert_same(t[5 + i], r[i], 0.0);
  /* sta_layer_resolve gives that descriptor: what the forward ran, kept
  ** for a backward that needs no context */
  sta_attention_desc rd;
  int32_t rw[6] = {0};
  assert_int_equal(sta_layer_resolve(l, t[0], &rd, rw), STA_OK);
  assert_ptr_equal(rd.windows, rw);
  assert_int_equal(rd.n_windows, 2);
  assert_memory_equal(rw, &wins[2][0], sizeof rw);
  assert_memory_equal(&rd.geom, &ad.geom, sizeof rd.geom);
  assert_int_equal(rd.layout, STA_BSHD);
  assert_true(rd.scale == ld.scale);
  assert_int_equal(sta_attention_forward(&rd, t[0], t[1], t[2], r[0], NULL), STA_OK);
  assert_same(r[0], t[3], 0.0);
  /* a wrong operand is named */
  sta_tensor *three = randn4(1, S, 3, D);
  EXPECT_ERR(sta_layer_backward(l, t[0], t[1], t[2], t[3], lse, three, t[5], t[6], t[7]),
             STA_ERR_SHAPE, "dout: expected 2 heads (local_heads), got 3");
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  /* a search row: candidates then the full window, fewer than the heads */
  sta_metadata *md = NULL;
  int32_t cand[6] = {1, 1, 1, 3, 3, 7};
  assert_int_equal(sta_metadata_search(&md, 1, 2, cand), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 5, md, fb), STA_OK);
  for (int i = 0; i < 3; i++) assert_int_equal(sta_tensor_copy(r[i], t[5 + i]), STA_OK);
  EXPECT_ERR(sta_layer_backward(l, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6], t[7]),
             STA_ERR_UNSUPPORTED,
             "backward: layer 0 runs a mask search at step 5 (2 candidate windows); a "
             "search-mode forward has no backward");
  for (int i = 0; i < 3; i++) assert_same(t[5 + i], r[i], 0.0);
  int32_t before[6] = {7, 7, 7, 7, 7, 7};
  memcpy(rw, before, sizeof rw);
  EXPECT_ERR(sta_layer_resolve(l, t[0], &rd, rw), STA_ERR_UNSUPPORTED,
             "backward: layer 0 runs a mask search at step 5 (2 candidate windows); a "
             "search-mode forward has no backward");
  assert_memory_equal(rw, before, sizeof rw);
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  sta_metadata_destroy(md);
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(l);
  sta_strategy_destroy(st);
  for (int i = 0; i < 8; i++) sta_tensor_destroy(t[i]);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(r[i]);
  sta_tensor_destroy(three);
  sta_tensor_destroy(lse);
}

int main(void) {
  seed_base = (uint64_t)time(NULL) * 1000003u + (uint64_t)getpid();
  printf("# test_layer seed %llu\n", (unsigned long long)seed_base);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prefix),
    cmocka_unit_test(test_create_errors),
    cmocka_unit_test(test_forward_errors),
    cmocka_unit_test(test_sp_metadata_bshd),
    cmocka_unit_test(test_sp_strategy_bhsd),
    cmocka_unit_test(test_fastvideo_file),
    cmocka_unit_test(test_backward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
