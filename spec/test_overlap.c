/*
** test_overlap.c -- which views share memory (core/overlap.c), and every
** call that writes refusing what it must:
**   - as a property: random views (1-4 dims, strides -6..6 including 0,
**     f32/f16/bf16/f8e4m3 wraps at random byte offsets of one buffer)
**     against brute-force sets of the bytes (pairs) and of the elements'
**     addresses (a view against itself); the decision is exact, never "gave
**     up";
**   - the views real tensors take (heads interleaved or narrowed, a fused
**     qkv, halves, permutations, expand) at full size (2 x 115456 x 24 x
**     128): decided exactly and at once;
**   - every entry point that writes refuses a written tensor whose
**     elements overlap (dk as a stride-0 view over heads, once accepted)
**     and leaves the memory as it was; disjoint interleaved outputs are
**     accepted (byte spans refused them);
**   - sta_attention_forward_fp8 refuses an lse inside out, as
**     sta_attention_forward does (it once accepted one).
** STA_TEST_SEED replays a run.
*/
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

#define BUF 192 /* bytes the random views live in */

/* ---- random views and brute force ----------------------------------------- */

typedef struct rview {
  sta_dtype dt;
  int32_t nd;
  int64_t shape[4], stride[4], off; /* off: byte of element 0 */
} rview;

static int64_t rv_numel(const rview *v) {
  int64_t n = 1;
  for (int32_t i = 0; i < v->nd; i++) n *= v->shape[i];
  return n;
}

/* A random view whose bytes fit in BUF. */
static void draw_view(rview *v) {
  for (;;) {
    v->dt = (sta_dtype)sta_test_rint(STA_F32, STA_F8E4M3);
    v->nd = (int32_t)sta_test_rint(1, 4);
    int64_t lo = 0, hi = 0, es = (int64_t)sta_dtype_size(v->dt);
    for (int32_t i = 0; i < v->nd; i++) {
      v->shape[i] = sta_test_rint(0, 9) == 0 ? 1 : sta_test_rint(1, 4);
      v->stride[i] = sta_test_rint(-6, 6);
      int64_t span = (v->shape[i] - 1) * v->stride[i];
      if (span < 0) lo += span; else hi += span;
    }
    int64_t bytes = (hi - lo + 1) * es;
    if (bytes > BUF) continue;
    v->off = -lo * es + sta_test_rint(0, BUF - bytes);
    return;
  }
}

static sta_tensor *wrap_view(unsigned char *buf, const rview *v) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_wrap(&t, buf + v->off, v->dt, STA_CPU, v->nd, v->shape, v->stride),
                   STA_OK);
  return t;
}

/* Element i's byte offset (row-major index order). */
static int64_t elem_byte(const rview *v, int64_t i) {
  int64_t off = v->off, es = (int64_t)sta_dtype_size(v->dt);
  for (int32_t d = v->nd - 1; d >= 0; d--) {
    off += (i % v->shape[d]) * v->stride[d] * es;
    i /= v->shape[d];
  }
  return off;
}

static int brute_pair(const rview *a, const rview *b) {
  char mark[BUF] = {0};
  int64_t ea = (int64_t)sta_dtype_size(a->dt), eb = (int64_t)sta_dtype_size(b->dt);
  for (int64_t i = 0; i < rv_numel(a); i++)
    for (int64_t k = 0; k < ea; k++) mark[elem_byte(a, i) + k] = 1;
  for (int64_t i = 0; i < rv_numel(b); i++)
    for (int64_t k = 0; k < eb; k++)
      if (mark[elem_byte(b, i) + k]) return 1;
  return 0;
}

static int brute_self(const rview *v) {
  int64_t n = rv_numel(v);
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < i; j++)
      if (elem_byte(v, i) == elem_byte(v, j)) return 1;
  return 0;
}

static void describe(const rview *v, char *buf, size_t cap) {
  int n = snprintf(buf, cap, "%s @%lld shape", sta_dtype_name(v->dt), (long long)v->off);
  for (int32_t i = 0; i < v->nd; i++)
    n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? "x" : " ", (long long)v->shape[i]);
  n += snprintf(buf + n, cap - (size_t)n, " strides");
  for (int32_t i = 0; i < v->nd; i++)
    n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? "," : " ", (long long)v->stride[i]);
}

static void test_property_pairs(void **state) {
  (void)state;
  unsigned char buf[BUF];
  int64_t cases = 0, shared = 0;
  for (int c = 0; c < 40000; c++) {
    rview a, b;
    draw_view(&a);
    draw_view(&b);
    sta_tensor *ta = wrap_view(buf, &a), *tb = wrap_view(buf, &b);
    int want = brute_pair(&a, &b), got = sta_overlap_decide(ta, tb), rev = sta_overlap_decide(tb, ta);
    if (got != want || rev != want) {
      char da[160], db[160];
      describe(&a, da, sizeof da);
      describe(&b, db, sizeof db);
      fail_msg("case %d: %s vs %s: decided %d (reversed %d), the bytes say %d", c, da, db, got,
               rev, want);
    }
    cases++;
    shared += want;
    sta_tensor_destroy(ta);
    sta_tensor_destroy(tb);
  }
  printf("# %lld random pairs of views decided exactly (%lld sharing bytes)\n", (long long)cases,
         (long long)shared);
}

static void test_property_self(void **state) {
  (void)state;
  unsigned char buf[BUF];
  int64_t cases = 0, self = 0;
  for (int c = 0; c < 40000; c++) {
    rview v;
    draw_view(&v);
    sta_tensor *t = wrap_view(buf, &v);
    int want = brute_self(&v), got = sta_self_overlap_decide(t);
    if (got != want) {
      char d[160];
      describe(&v, d, sizeof d);
      fail_msg("case %d: %s: decided %d, its elements say %d", c, d, got, want);
    }
    cases++;
    self += want;
    sta_tensor_destroy(t);
  }
  printf("# %lld random views decided exactly (%lld self-overlapping)\n", (long long)cases,
         (long long)self);
}

/* ---- the views of real tensors, at full size -------------------------------- */

static sta_tensor *narrow(const sta_tensor *t, int32_t dim, int64_t start, int64_t len) {
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_narrow(&v, t, dim, start, len), STA_OK);
  return v;
}

static sta_tensor *view(const sta_tensor *t, int64_t off, int32_t nd, const int64_t *shape,
                        const int64_t *stride) {
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_view(&v, t, off, nd, shape, stride), STA_OK);
  return v;
}

static void expect_pair(const char *what, const sta_tensor *a, const sta_tensor *b, int want) {
  clock_t t0 = clock();
  int got = sta_overlap_decide(a, b);
  double ms = 1e3 * (double)(clock() - t0) / CLOCKS_PER_SEC;
  if (got != want) fail_msg("%s: decided %d, expected %d", what, got, want);
  if (ms > 50) fail_msg("%s: took %.1f ms", what, ms);
}

static void expect_self(const char *what, const sta_tensor *t, int want) {
  int got = sta_self_overlap_decide(t);
  if (got != want) fail_msg("%s: decided %d, expected %d", what, got, want);
}

static void test_real_views(void **state) {
  (void)state;
  /* a fake device-sized buffer: only addresses are computed, never read */
  void *fake = (void *)(uintptr_t)0x7f0000000000ull;
  const int64_t B = 2, S = 115456, H = 24, D = 128;
  sta_tensor *qkv = NULL, *x = NULL;
  int64_t flat = B * S * 3 * H * D;
  assert_int_equal(sta_tensor_wrap(&qkv, fake, STA_BF16, STA_CPU, 1, &flat, NULL), STA_OK);
  int64_t st5[5] = {S * 3 * H * D, 3 * H * D, H * D, D, 1};
  sta_tensor *q = view(qkv, 0, 4, (int64_t[]){B, S, H, D}, (int64_t[]){st5[0], st5[1], st5[3], 1});
  sta_tensor *k = view(qkv, st5[2], 4, (int64_t[]){B, S, H, D}, (int64_t[]){st5[0], st5[1], st5[3], 1});
  expect_pair("fused qkv: q vs k", q, k, 0);
  expect_self("fused qkv: q", q, 0);
  sta_tensor *h0 = narrow(q, 2, 0, 12), *h1 = narrow(q, 2, 12, 12), *h2 = narrow(q, 2, 11, 12);
  expect_pair("heads 0-11 vs 12-23", h0, h1, 0);
  expect_pair("heads 0-11 vs 11-22", h0, h2, 1);
  sta_tensor *s0 = narrow(q, 1, 0, S / 2), *s1 = narrow(q, 1, S / 2, S / 2);
  sta_tensor *s2 = narrow(q, 1, S / 2 - 1, 2);
  expect_pair("rows: halves", s0, s1, 0);
  expect_pair("rows: a half and the rows around the middle", s0, s2, 1);
  sta_tensor *ev = view(qkv, 0, 4, (int64_t[]){B, S, H / 2, D}, (int64_t[]){st5[0], st5[1], 2 * D, 1});
  sta_tensor *od = view(qkv, D, 4, (int64_t[]){B, S, H / 2, D}, (int64_t[]){st5[0], st5[1], 2 * D, 1});
  expect_pair("even heads vs odd heads", ev, od, 0);
  expect_pair("odd heads vs heads 12-23", od, h1, 1);
  sta_tensor *pm = NULL;
  int32_t perm[4] = {0, 2, 1, 3};
  assert_int_equal(sta_tensor_permute(&pm, q, perm), STA_OK);
  expect_pair("q vs its bhsd permutation", q, pm, 1);
  expect_pair("k vs q's bhsd permutation", k, pm, 0);
  expect_self("the bhsd permutation", pm, 0);
  sta_tensor *ex = view(qkv, 0, 4, (int64_t[]){B, S, H, D}, (int64_t[]){st5[0], st5[1], 0, 1});
  expect_self("one head expanded over all heads (stride 0)", ex, 1);
  expect_pair("the expanded head vs k", ex, k, 0);
  sta_tensor *fold = view(qkv, 0, 2, (int64_t[]){S, D}, (int64_t[]){D / 2, 1});
  expect_self("rows of D elements D/2 apart", fold, 1);
  /* two wraps of one buffer in other dtypes: decided on the bytes */
  int64_t n32 = S * H * D / 2;
  assert_int_equal(sta_tensor_wrap(&x, (char *)fake + (S * 3 * H * D) * 2, STA_F32, STA_CPU, 1,
                                   &n32, NULL), STA_OK);
  expect_pair("an f32 wrap of batch 1's first bytes vs q", x, q, 1);
  expect_pair("an f32 wrap of batch 1's first bytes vs heads 12-23 of q", x, h1, 1);
  sta_tensor *xk = view(qkv, S * 3 * H * D + H * D, 1, (int64_t[]){H * D / 2},
                        (int64_t[]){1}); /* batch 1, row 0, k's first half */
  expect_pair("batch 1 row 0 of k vs q", xk, q, 0);
  sta_tensor *all[] = {q, k, h0, h1, h2, s0, s1, s2, ev, od, pm, ex, fold, x, xk, qkv};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
}

/* ---- entry points ------------------------------------------------------------ */

static sta_tensor *rand4(const int64_t shape[4], sta_dtype dt) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, sta_test_rnd(), 0.0, 1.0), STA_OK);
  return t;
}

/* A [B, S, H, D] view over one head of base ([B, S, 1, D]) with head
** stride 0: an MQA gradient passed as dk, once accepted. */
static sta_tensor *expanded(const sta_tensor *base, int64_t H) {
  int64_t shape[4] = {sta_tensor_size(base, 0), sta_tensor_size(base, 1), H,
                      sta_tensor_size(base, 3)};
  int64_t st[4] = {sta_tensor_stride(base, 0), sta_tensor_stride(base, 1), 0, 1};
  return view(base, 0, 4, shape, st);
}

/* The bits of t's storage (a whole contiguous tensor). */
static void *bits(const sta_tensor *t) {
  size_t n = (size_t)sta_tensor_numel(t) * sta_dtype_size(sta_tensor_dtype(t));
  void *p = malloc(n ? n : 1);
  assert_non_null(p);
  memcpy(p, sta_tensor_data(t), n);
  return p;
}

static void expect_refused(sta_status rc, const char *name, const char *call,
                           const sta_tensor *base, const void *before) {
  char want[64];
  snprintf(want, sizeof want, "%s: more than one of its elements is one memory location", name);
  if (rc != STA_ERR_ARGUMENT || strncmp(sta_last_error(), want, strlen(want)) != 0)
    fail_msg("%s: %s \"%s\", expected STA_ERR_ARGUMENT \"%s ...\"", call, sta_status_name(rc),
             sta_last_error(), want);
  size_t n = (size_t)sta_tensor_numel(base) * sta_dtype_size(sta_tensor_dtype(base));
  if (memcmp(sta_tensor_data(base), before, n) != 0) fail_msg("%s: memory changed", call);
}

/* The 2x4x5 canvas in 1x2x2 tiles (40 rows, no text) with window win. */
static void small_desc(sta_attention_desc *d, const int32_t *win) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, 2, 4, 5);
  d->geom.tile[0] = 1; d->geom.tile[1] = 2; d->geom.tile[2] = 2;
  d->n_windows = 1;
  d->windows = win;
}

/* The fp8 forward's scales: q and k per row ([B, heads, S]), v per channel. */
static void fp8_scales(sta_tensor **qs, sta_tensor **ks, sta_tensor **vs, const int64_t ls[3],
                       const int64_t vsh[3]) {
  assert_int_equal(sta_tensor_create(qs, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(ks, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(vs, STA_F32, STA_CPU, 3, vsh), STA_OK);
  assert_int_equal(sta_tensor_fill(*qs, 0.5), STA_OK);
  assert_int_equal(sta_tensor_fill(*ks, 0.25), STA_OK);
  assert_int_equal(sta_tensor_fill(*vs, 0.125), STA_OK);
}

static void test_entry_points_refuse(void **state) {
  (void)state;
  const int64_t B = 1, S = 40, H = 3, D = 8;
  int64_t shape[4] = {B, S, H, D}, one[4] = {B, S, 1, D}, ls[3] = {B, H, S};
  int32_t win[3] = {3, 3, 3};
  sta_attention_desc d;
  small_desc(&d, win);
  sta_tensor *q = rand4(shape, STA_F32), *k = rand4(shape, STA_F32), *v = rand4(shape, STA_F32);
  sta_tensor *o = rand4(shape, STA_F32), *dout = rand4(shape, STA_F32);
  sta_tensor *dq = rand4(shape, STA_F32), *dk = rand4(shape, STA_F32), *dv = rand4(shape, STA_F32);
  sta_tensor *lse = NULL, *head = rand4(one, STA_F32), *x = expanded(head, H);
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_attention_forward(&d, q, k, v, o, lse), STA_OK);
  void *before = bits(head);
  expect_refused(sta_attention_forward(&d, q, k, v, x, NULL), "out", "forward", head, before);
  expect_refused(sta_attention_reference(&d, q, k, v, x, NULL), "out", "reference", head, before);
  expect_refused(sta_attention_backward(&d, q, k, v, o, lse, dout, dq, x, dv), "dk", "backward",
                 head, before);
  expect_refused(sta_attention_backward(&d, q, k, v, o, lse, dout, x, dk, dv), "dq", "backward",
                 head, before);
  expect_refused(sta_attention_backward_reference(&d, q, k, v, dout, dq, dk, x), "dv",
                 "backward reference", head, before);
  expect_refused(sta_tensor_copy(x, q), "dst", "copy", head, before);
  expect_refused(sta_tensor_fill(x, 1.5), "t", "fill", head, before);
  expect_refused(sta_tensor_randn(x, 3, 0, 1), "t", "randn", head, before);
  expect_refused(sta_tensor_axpby(x, 1, q, 1), "y", "axpby", head, before);
  expect_refused(sta_tensor_scale(x, 2), "t", "scale", head, before);
  expect_refused(sta_tensor_add(x, q, k), "out", "add", head, before);
  /* lse as a stride-0 view over heads */
  sta_tensor *lrow = NULL, *lx = NULL;
  int64_t lr[3] = {B, 1, S};
  assert_int_equal(sta_tensor_create(&lrow, STA_F32, STA_CPU, 3, lr), STA_OK);
  assert_int_equal(sta_tensor_fill(lrow, 7), STA_OK);
  assert_int_equal(sta_tensor_view(&lx, lrow, 0, 3, ls, (int64_t[]){S, 0, 1}), STA_OK);
  void *lb = bits(lrow);
  expect_refused(sta_attention_forward(&d, q, k, v, o, lx), "lse", "forward lse", lrow, lb);
  /* fp8 */
  sta_tensor *q8 = rand4(shape, STA_F8E4M3), *k8 = rand4(shape, STA_F8E4M3),
             *v8 = rand4(shape, STA_F8E4M3), *qs = NULL, *ks = NULL, *vs = NULL;
  int64_t vsh[3] = {B, H, D};
  fp8_scales(&qs, &ks, &vs, ls, vsh);
  sta_attention_desc d8 = d;
  d8.precision = STA_PRECISION_FP8;
  expect_refused(sta_attention_forward_fp8(&d8, q8, k8, v8, qs, ks, vs, x, NULL), "out", "fp8",
                 head, before);
  expect_refused(sta_attention_forward_fp8(&d8, q8, k8, v8, qs, ks, vs, o, lx), "lse", "fp8 lse",
                 lrow, lb);
  /* tile and untile */
  sta_geometry g = d.geom;
  int64_t tl = sta_geometry_tiled_len(&g, S);
  sta_tensor *tb = NULL, *tx = NULL;
  int64_t tshape[4] = {B, tl, 1, D};
  assert_int_equal(sta_tensor_create(&tb, STA_F32, STA_CPU, 4, tshape), STA_OK);
  assert_int_equal(sta_tensor_fill(tb, 2), STA_OK);
  tx = expanded(tb, H);
  void *tbb = bits(tb);
  expect_refused(sta_tensor_tile(tx, q, &g, STA_BSHD), "out", "tile", tb, tbb);
  sta_tensor *tin = NULL;
  int64_t tfull[4] = {B, tl, H, D};
  assert_int_equal(sta_tensor_create(&tin, STA_F32, STA_CPU, 4, tfull), STA_OK);
  assert_int_equal(sta_tensor_tile(tin, q, &g, STA_BSHD), STA_OK);
  expect_refused(sta_tensor_untile(x, tin, &g, STA_BSHD), "out", "untile", head, before);
  free(before);
  free(lb);
  free(tbb);
  sta_tensor *all[] = {q, k, v, o, dout, dq, dk, dv, lse, head, x, lrow, lx, q8, k8, v8,
                       qs, ks, vs, tb, tx, tin};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
}

/* Outputs interleaved with inputs in one buffer, element-disjoint (their
** byte spans meet): accepted, and the results equal those into separate
** tensors. */
static void test_interleaved_outputs(void **state) {
  (void)state;
  const int64_t B = 2, S = 40, H = 2, D = 8;
  int64_t shape[4] = {B, S, H, D}, wide[5] = {B, S, 8, H, D}, ls[3] = {B, H, S};
  int32_t win[3] = {1, 3, 3};
  sta_attention_desc d;
  small_desc(&d, win);
  int64_t flat = wide[0] * wide[1] * wide[2] * wide[3] * wide[4];
  sta_tensor *blk = NULL, *t[8];
  assert_int_equal(sta_tensor_create(&blk, STA_F32, STA_CPU, 1, &flat), STA_OK);
  assert_int_equal(sta_tensor_randn(blk, sta_test_rnd(), 0, 1), STA_OK);
  int64_t st[4] = {S * 8 * H * D, 8 * H * D, D, 1};
  for (int i = 0; i < 8; i++) t[i] = view(blk, i * H * D, 4, shape, st); /* q k v dout o dq dk dv */
  sta_tensor *lse = NULL, *ref[4];
  assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  for (int i = 0; i < 4; i++) {
    ref[i] = NULL;
    assert_int_equal(sta_tensor_create(&ref[i], STA_F32, STA_CPU, 4, shape), STA_OK);
  }
  if (sta_attention_forward(&d, t[0], t[1], t[2], t[4], lse) != STA_OK)
    fail_msg("forward into an interleaved out: %s", sta_last_error());
  assert_int_equal(sta_attention_forward(&d, t[0], t[1], t[2], ref[0], NULL), STA_OK);
  if (sta_attention_backward(&d, t[0], t[1], t[2], t[4], lse, t[3], t[5], t[6], t[7]) != STA_OK)
    fail_msg("backward into interleaved dq, dk, dv: %s", sta_last_error());
  assert_int_equal(sta_attention_backward(&d, t[0], t[1], t[2], ref[0], lse, t[3], ref[1], ref[2],
                                          ref[3]), STA_OK);
  for (int i = 0; i < 4; i++) {
    double mx, rel;
    assert_int_equal(sta_tensor_compare(t[4 + i], ref[i], &mx, &rel), STA_OK);
    if (mx != 0) fail_msg("output %d differs from the separate tensors' by %g", i, mx);
  }
  /* even and odd heads of one tensor as out and q */
  sta_tensor *eo = NULL, *ev, *od;
  int64_t two[4] = {B, S, 2 * H, D}, half[4] = {B, S, H, D}, hs[4] = {S * 2 * H * D, 2 * H * D, 2 * D, 1};
  assert_int_equal(sta_tensor_create(&eo, STA_F32, STA_CPU, 4, two), STA_OK);
  assert_int_equal(sta_tensor_randn(eo, sta_test_rnd(), 0, 1), STA_OK);
  ev = view(eo, 0, 4, half, hs);
  od = view(eo, D, 4, half, hs);
  assert_int_equal(sta_attention_forward(&d, ev, t[1], t[2], od, NULL), STA_OK);
  assert_int_equal(sta_attention_forward(&d, ev, t[1], t[2], ref[0], NULL), STA_OK);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(od, ref[0], &mx, &rel), STA_OK);
  assert_true(mx == 0);
  assert_int_equal(sta_tensor_axpby(od, 2, ev, 1), STA_OK); /* elementwise too */
  for (int i = 0; i < 8; i++) sta_tensor_destroy(t[i]);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(ref[i]);
  sta_tensor_destroy(ev);
  sta_tensor_destroy(od);
  sta_tensor_destroy(eo);
  sta_tensor_destroy(lse);
  sta_tensor_destroy(blk);
}

/* sta_attention_forward_fp8 refuses an lse that lives inside out, with the
** message sta_attention_forward gives for the same pair (one check). */
static void test_fp8_lse_in_out(void **state) {
  (void)state;
  const int64_t B = 1, S = 40, H = 2, D = 8;
  int64_t shape[4] = {B, S, H, D}, ls[3] = {B, H, S}, vsh[3] = {B, H, D};
  int32_t win[3] = {3, 3, 3};
  sta_attention_desc d;
  small_desc(&d, win);
  sta_tensor *q8 = rand4(shape, STA_F8E4M3), *k8 = rand4(shape, STA_F8E4M3),
             *v8 = rand4(shape, STA_F8E4M3), *q = rand4(shape, STA_F32), *out = rand4(shape, STA_F32);
  sta_tensor *qs = NULL, *ks = NULL, *vs = NULL, *lse = NULL;
  fp8_scales(&qs, &ks, &vs, ls, vsh);
  lse = view(out, 5, 3, ls, (int64_t[]){S * H, S, 1}); /* inside out's elements */
  void *before = bits(out);
  const char *want = "lse: shares memory with out (the forward writes lse while writing out; "
                     "use a separate tensor)";
  sta_attention_desc d8 = d;
  d8.precision = STA_PRECISION_FP8;
  EXPECT_ERR(sta_attention_forward_fp8(&d8, q8, k8, v8, qs, ks, vs, out, lse), STA_ERR_ARGUMENT,
             want);
  assert_memory_equal(sta_tensor_data(out), before, (size_t)(B * S * H * D) * 4);
  EXPECT_ERR(sta_attention_forward(&d, q, q, q, out, lse), STA_ERR_ARGUMENT, want);
  EXPECT_ERR(sta_attention_forward(&d8, q, q, q, out, lse), STA_ERR_ARGUMENT, want);
  /* and an out inside a scale */
  sta_tensor *big = NULL, *o2;
  int64_t n = B * S * H * D * 2;
  assert_int_equal(sta_tensor_create(&big, STA_F32, STA_CPU, 1, &n), STA_OK);
  o2 = view(big, 0, 4, shape, (int64_t[]){S * H * D, H * D, D, 1});
  sta_tensor *qs2 = view(big, 10, 3, ls, (int64_t[]){S * H, S, 1});
  EXPECT_ERR(sta_attention_forward_fp8(&d8, q8, k8, v8, qs2, ks, vs, o2, NULL), STA_ERR_ARGUMENT,
             "out: shares memory with q_scale (the forward writes out while reading q_scale; "
             "use a separate tensor)");
  free(before);
  sta_tensor *all[] = {q8, k8, v8, q, out, qs, ks, vs, lse, big, o2, qs2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
}

int main(void) {
  sta_test_begin(6364136223846793005ull, 1442695040888963407ull);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_property_pairs),
    cmocka_unit_test(test_property_self),
    cmocka_unit_test(test_real_views),
    cmocka_unit_test(test_entry_points_refuse),
    cmocka_unit_test(test_interleaved_outputs),
    cmocka_unit_test(test_fp8_lse_in_out),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
