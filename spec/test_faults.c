/*
** test_faults.c -- allocation fault injection.  For each
** operation: count its allocations through the sta hooks (cJSON's included,
** see sta_fault_arm), then fail the i-th one for every i and check the
** status (STA_ERR_NOMEM), the message, that nothing changed (outputs
** poisoned and compared, strategies and batches as they were, the context
** stack as deep as before, no file left behind) and -- under make sanitize
** (LeakSanitizer) and scripts/test/valgrind -- that nothing leaked.  The counts
** are printed as "# faults: <operation>: <n> allocation sites".
*/
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static uint64_t seed;
static char dir[64];

static const char *tpath(const char *name) {
  static char buf[8][160];
  static int k;
  char *p = buf[k++ % 8];
  snprintf(p, 160, "%s/%s", dir, name);
  return p;
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

static sta_tensor *randn(sta_dtype dt, int32_t nd, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, nd, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, ++seed, 0.0, 1.0), STA_OK);
  return t;
}

static sta_tensor *clone(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_to(&c, t, sta_tensor_dtype(t), STA_CPU), STA_OK);
  return c;
}

static void assert_same(const sta_tensor *a, const sta_tensor *b) {
  double m = -1, r = -1;
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  assert_true(m == 0.0);
}

/* The failure the i-th injected fault must give. */
static void assert_nomem(sta_status rc, const char *op, int64_t i) {
  if (rc != STA_ERR_NOMEM)
    fail_msg("%s, fault %lld: status %s (%s), expected STA_ERR_NOMEM", op, (long long)i,
             sta_status_name(rc), sta_last_error());
  if (!strstr(sta_last_error(), "out of host memory"))
    fail_msg("%s, fault %lld: message \"%s\" does not say out of host memory", op,
             (long long)i, sta_last_error());
}

/* Allocations one run of op makes. */
#define COUNT(n, call) do { sta_fault_arm(0); (void)(call); n = sta_fault_count(); } while (0)
static void report(const char *op, int64_t n) {
  printf("# faults: %s: %lld allocation sites\n", op, (long long)n);
  assert_true(n > 0);
}

/* ---- STA forward --------------------------------------------------------- */

static void fwd_desc(sta_attention_desc *d, int32_t *win) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, 5, 7, 6);
  d->geom.tile[0] = 2; d->geom.tile[1] = 3; d->geom.tile[2] = 3; /* grid 3x3x2 */
  d->layout = STA_BSHD;
  d->n_windows = 2;
  win[0] = 1; win[1] = 3; win[2] = 1;
  win[3] = 3; win[4] = 1; win[5] = 2;
  d->windows = win;
}

static void test_forward_faults(void **state) {
  (void)state;
  sta_attention_desc d;
  int32_t win[6];
  fwd_desc(&d, win);
  int64_t shape[4] = {2, 5 * 7 * 6 + 9, 2, 16}, lshape[3] = {2, 2, 5 * 7 * 6 + 9};
  for (int dt = 0; dt < 3; dt++) {
    sta_tensor *q = randn((sta_dtype)dt, 4, shape), *k = randn((sta_dtype)dt, 4, shape),
               *v = randn((sta_dtype)dt, 4, shape), *out = randn((sta_dtype)dt, 4, shape),
               *lse = randn(STA_F32, 3, lshape);
    sta_tensor *out0 = clone(out), *lse0 = clone(lse);
    int64_t n;
    COUNT(n, sta_attention_forward(&d, q, k, v, out, lse));
    if (dt == 0) report("sta_attention_forward (CPU)", n);
    /* out and lse were written: poison them again */
    assert_int_equal(sta_tensor_copy(out, out0), STA_OK);
    assert_int_equal(sta_tensor_copy(lse, lse0), STA_OK);
    for (int64_t i = 1; i <= n; i++) {
      sta_fault_arm(i);
      sta_status rc = sta_attention_forward(&d, q, k, v, out, lse);
      sta_fault_arm(0);
      assert_nomem(rc, "forward", i);
      assert_same(out, out0);
      assert_same(lse, lse0);
    }
    /* one past the last site: it succeeds, and matches the reference */
    sta_fault_arm(n + 1);
    assert_int_equal(sta_attention_forward(&d, q, k, v, out, lse), STA_OK);
    sta_fault_arm(0);
    sta_tensor *ref = clone(out0);
    assert_int_equal(sta_attention_reference(&d, q, k, v, ref, NULL), STA_OK);
    double m, r;
    assert_int_equal(sta_tensor_compare(out, ref, &m, &r), STA_OK);
    assert_true(r < (dt == 0 ? 1e-5 : 1e-2));
    sta_tensor *all[] = {q, k, v, out, lse, out0, lse0, ref};
    for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) sta_tensor_destroy(all[j]);
  }
}

/* ---- strategies ------------------------------------------------------------ */

static void test_strategy_faults(void **state) {
  (void)state;
  int32_t w[3] = {3, 1, 5}, full[3] = {3, 5, 7};
  sta_strategy *u = NULL;
  assert_int_equal(sta_strategy_uniform(&u, 3, 2, 5, w, full, 1), STA_OK);
  int32_t odd[3] = {1, 3, (int32_t)(seed % 7) * 2 + 1};
  assert_int_equal(sta_strategy_set(u, 2, 1, 4, odd), STA_OK);
  assert_int_equal(sta_strategy_save(u, tpath("s.json")), STA_OK);
  sta_strategy *sentinel = (sta_strategy *)&seed, *s = sentinel;
  int64_t n;
  COUNT(n, sta_strategy_load(&s, tpath("s.json")));
  report("sta_strategy_load (30 entries, cJSON included)", n);
  assert_true(s != sentinel && sta_strategy_equal(s, u));
  sta_strategy_destroy(s);
  for (int64_t i = 1; i <= n; i++) {
    s = sentinel;
    sta_fault_arm(i);
    sta_status rc = sta_strategy_load(&s, tpath("s.json"));
    sta_fault_arm(0);
    assert_nomem(rc, "strategy load", i);
    assert_ptr_equal(s, sentinel);
  }
  /* set on an existing strategy: failure leaves it as it was */
  sta_strategy *c = NULL;
  assert_int_equal(sta_strategy_create(&c), STA_OK);
  int64_t added = 0;
  for (int32_t h = 0; h < 40; h++) {
    int32_t ww[3] = {1, 1, 2 * h + 1};
    sta_fault_arm(1);
    sta_status rc = sta_strategy_set(c, 0, 0, h, ww);
    sta_fault_arm(0);
    if (rc == STA_OK) { added++; continue; } /* no allocation needed */
    assert_nomem(rc, "strategy set", 1);
    assert_int_equal(sta_strategy_count(c), h);
    assert_int_equal(sta_strategy_set(c, 0, 0, h, ww), STA_OK);
  }
  assert_int_equal(sta_strategy_count(c), 40);
  assert_true(added > 0 && added < 40);
  /* to_json, uniform, metadata */
  char *json = (char *)&seed;
  COUNT(n, sta_strategy_to_json(u, &json));
  report("sta_strategy_to_json", n);
  sta_free(json);
  for (int64_t i = 1; i <= n; i++) {
    json = (char *)&seed;
    sta_fault_arm(i);
    sta_status rc = sta_strategy_to_json(u, &json);
    sta_fault_arm(0);
    assert_nomem(rc, "to_json", i);
    assert_ptr_equal(json, &seed);
  }
  sta_metadata *md = (sta_metadata *)&seed;
  COUNT(n, sta_metadata_from_strategy(&md, u, 2, 2, 5));
  report("sta_metadata_from_strategy (2 layers)", n);
  sta_metadata_destroy(md);
  for (int64_t i = 1; i <= n; i++) {
    md = (sta_metadata *)&seed;
    sta_fault_arm(i);
    sta_status rc = sta_metadata_from_strategy(&md, u, 2, 2, 5);
    sta_fault_arm(0);
    assert_nomem(rc, "metadata_from_strategy", i);
    assert_ptr_equal(md, &seed);
  }
  sta_strategy_destroy(c);
  sta_strategy_destroy(u);
}

/* ---- files: npy, safetensors ------------------------------------------------- */

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static void test_npy_faults(void **state) {
  (void)state;
  int64_t shape[3] = {3, 4, 5};
  sta_tensor *a = randn(STA_F16, 3, shape);
  assert_int_equal(sta_npy_save(a, tpath("a.npy")), STA_OK);
  /* a Fortran-order file takes the transpose path (more allocations) */
  char hdr[128];
  memset(hdr, ' ', sizeof hdr);
  int hl = snprintf(hdr, sizeof hdr,
                    "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }");
  hdr[hl] = ' ';
  hdr[117] = '\n'; /* 10 + 118 = 128 */
  unsigned char buf[128 + 48];
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = 118; buf[9] = 0;
  memcpy(buf + 10, hdr, 118);
  for (int i = 0; i < 12; i++) { float x = (float)i * 0.5f - 1.0f; memcpy(buf + 128 + 4 * i, &x, 4); }
  write_file(tpath("f.npy"), buf, sizeof buf);
  const char *files[2] = {tpath("a.npy"), tpath("f.npy")};
  for (int f = 0; f < 2; f++) {
    sta_tensor *sentinel = (sta_tensor *)&seed, *t = sentinel;
    int64_t n;
    COUNT(n, sta_npy_load(&t, files[f], 0));
    report(f ? "sta_npy_load (Fortran order)" : "sta_npy_load (C order)", n);
    assert_true(t != sentinel);
    if (f == 0) assert_same(t, a);
    else {
      double x;
      int64_t idx[2] = {2, 1}; /* Fortran: element (2,1) is at 2 + 1*3 */
      assert_int_equal(sta_tensor_get(t, idx, &x), STA_OK);
      assert_true(x == 5 * 0.5 - 1.0);
    }
    sta_tensor_destroy(t);
    for (int64_t i = 1; i <= n; i++) {
      t = sentinel;
      sta_fault_arm(i);
      sta_status rc = sta_npy_load(&t, files[f], 0);
      sta_fault_arm(0);
      assert_nomem(rc, "npy load", i);
      assert_ptr_equal(t, sentinel);
    }
  }
  /* save: a failure writes no file */
  int64_t n;
  remove(tpath("b.npy"));
  COUNT(n, sta_npy_save(a, tpath("b.npy")));
  report("sta_npy_save", n);
  for (int64_t i = 1; i <= n; i++) {
    remove(tpath("b.npy"));
    sta_fault_arm(i);
    sta_status rc = sta_npy_save(a, tpath("b.npy"));
    sta_fault_arm(0);
    assert_nomem(rc, "npy save", i);
    assert_false(exists(tpath("b.npy")));
  }
  sta_tensor_destroy(a);
}

/* Open, read every entry, close: the whole reader. */
static sta_status st_read_all(const char *path, int32_t *count) {
  sta_safetensors *f = NULL;
  sta_status rc = sta_safetensors_open(&f, path);
  if (rc != STA_OK) return rc;
  *count = sta_safetensors_count(f);
  for (int32_t i = 0; i < *count && rc == STA_OK; i++) {
    sta_tensor *t = NULL;
    rc = sta_safetensors_read(f, sta_safetensors_name(f, i), &t);
    sta_tensor_destroy(t);
  }
  sta_safetensors_close(f);
  return rc;
}

static void test_safetensors_faults(void **state) {
  (void)state;
  int64_t s1[2] = {4, 6}, s2[4] = {1, 3, 2, 8}, s3[1] = {5};
  sta_tensor *t[3] = {randn(STA_F32, 2, s1), randn(STA_BF16, 4, s2), randn(STA_F16, 1, s3)};
  const char *names[3] = {"q.weight", "k", "layer.7.v"};
  int64_t n;
  remove(tpath("a.safetensors"));
  COUNT(n, sta_safetensors_save(tpath("a.safetensors"), 3, names,
                                (const sta_tensor *const *)t));
  report("sta_safetensors_save (3 tensors)", n);
  for (int64_t i = 1; i <= n; i++) {
    remove(tpath("b.safetensors"));
    sta_fault_arm(i);
    sta_status rc = sta_safetensors_save(tpath("b.safetensors"), 3, names,
                                         (const sta_tensor *const *)t);
    sta_fault_arm(0);
    assert_nomem(rc, "safetensors save", i);
    assert_false(exists(tpath("b.safetensors")));
  }
  int32_t count = -1;
  COUNT(n, st_read_all(tpath("a.safetensors"), &count));
  assert_int_equal(count, 3);
  report("sta_safetensors_open + read of 3 tensors (cJSON included)", n);
  for (int64_t i = 1; i <= n; i++) {
    sta_fault_arm(i);
    sta_status rc = st_read_all(tpath("a.safetensors"), &count);
    sta_fault_arm(0);
    assert_nomem(rc, "safetensors open+read", i);
  }
  /* a rewrite that keeps a.safetensors' other tensors (sta-run's output that
  ** is an input file): a failure leaves a.safetensors as it was */
  FILE *fa = fopen(tpath("a.safetensors"), "rb");
  assert_non_null(fa);
  char before[4096];
  size_t nb = fread(before, 1, sizeof before, fa);
  fclose(fa);
  sta_safetensors *keep = NULL;
  assert_int_equal(sta_safetensors_open(&keep, tpath("a.safetensors")), STA_OK);
  const char *out_name[1] = {"out"};
  const sta_tensor *out_t[1] = {t[2]};
  sta_outfile of;
  for (int64_t i = 1;; i++) {
    sta_fault_arm(i);
    sta_status rc = sta_out_open(&of, tpath("a.safetensors"), "rewrite");
    if (rc == STA_OK) {
      rc = sta_safetensors_write(&of, 1, out_name, out_t, keep);
      if (rc != STA_OK) sta_out_abort(&of);
    }
    int64_t used = sta_fault_count();
    sta_fault_arm(0);
    if (used < i) { /* every site failed once: this one ran through */
      assert_int_equal(rc, STA_OK);
      sta_out_abort(&of);
      report("sta_safetensors_write keeping 3 tensors of an open file", i - 1);
      break;
    }
    assert_nomem(rc, "safetensors rewrite", i);
    fa = fopen(tpath("a.safetensors"), "rb");
    char now[4096];
    size_t nn = fread(now, 1, sizeof now, fa);
    fclose(fa);
    assert_true(nn == nb && memcmp(now, before, nb) == 0);
  }
  sta_safetensors_close(keep);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(t[i]);
}

/* ---- search records, save and tune --------------------------------------------- */

static const int32_t CAND[9] = {1, 1, 1, 3, 1, 3, 3, 3, 3}; /* full last */

static sta_forward_batch *make_batch(int32_t steps, int32_t layers, int32_t heads) {
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  float l1[2 * 8], l2[2 * 8];
  for (int32_t s = 0; s < steps; s++)
    for (int32_t l = 0; l < layers; l++) {
      for (int32_t i = 0; i < 2 * heads; i++) {
        l1[i] = (float)fabs(sta_randn_at(seed, (uint64_t)(s * 100 + l * 10 + i)));
        l2[i] = l1[i] * l1[i] * (float)(1 + i % 3);
      }
      assert_int_equal(sta_forward_batch_record(fb, 0, s, l, 2, CAND, heads, l1, l2), STA_OK);
    }
  seed++;
  return fb;
}

static void test_search_save_faults(void **state) {
  (void)state;
  sta_forward_batch *fb = make_batch(4, 3, 5);
  int64_t n;
  remove(tpath("r.json"));
  COUNT(n, sta_forward_batch_save_search(fb, 0, tpath("r.json")));
  report("sta_forward_batch_save_search (4 steps x 3 layers x 5 heads, cJSON included)", n);
  for (int64_t i = 1; i <= n; i++) {
    remove(tpath("r2.json"));
    sta_fault_arm(i);
    sta_status rc = sta_forward_batch_save_search(fb, 0, tpath("r2.json"));
    sta_fault_arm(0);
    assert_nomem(rc, "search save", i);
    assert_false(exists(tpath("r2.json")));
    assert_int_equal(sta_forward_batch_records(fb, 0), 12);
  }
  /* record: the batch keeps what it had */
  float l[2 * 5] = {0};
  COUNT(n, sta_forward_batch_record(fb, 1, 0, 0, 2, CAND, 5, l, l));
  report("sta_forward_batch_record (first record)", n);
  sta_forward_batch_clear(fb);
  for (int64_t i = 1; i <= n; i++) {
    sta_forward_batch_clear(fb); /* a failed record may keep a grown (empty) list */
    sta_fault_arm(i);
    sta_status rc = sta_forward_batch_record(fb, 1, 0, 0, 2, CAND, 5, l, l);
    sta_fault_arm(0);
    assert_nomem(rc, "record", i);
    assert_int_equal(sta_forward_batch_records(fb, 1), 0);
  }
  sta_forward_batch_destroy(fb);
}

static void test_tune_faults(void **state) {
  (void)state;
  for (int f = 0; f < 2; f++) {
    sta_forward_batch *fb = make_batch(4, 2, 3);
    assert_int_equal(sta_forward_batch_save_search(fb, 0, tpath(f ? "t1.json" : "t0.json")),
                     STA_OK);
    sta_forward_batch_destroy(fb);
  }
  const char *paths[2] = {tpath("t0.json"), tpath("t1.json")};
  int32_t full[3] = {3, 3, 3};
  sta_strategy *sentinel = (sta_strategy *)&seed, *s = sentinel;
  sta_tune_report rep, rep0;
  memset(&rep0, 0x5a, sizeof rep0);
  rep = rep0;
  int64_t n;
  COUNT(n, sta_tune(&s, 2, paths, 1, full, &rep));
  report("sta_tune (2 files, 4 steps x 2 layers x 3 heads, cJSON included)", n);
  assert_true(s != sentinel);
  assert_int_equal(sta_strategy_count(s), 24);
  sta_strategy_destroy(s);
  for (int64_t i = 1; i <= n; i++) {
    s = sentinel;
    rep = rep0;
    sta_fault_arm(i);
    sta_status rc = sta_tune(&s, 2, paths, 1, full, &rep);
    sta_fault_arm(0);
    assert_nomem(rc, "tune", i);
    assert_ptr_equal(s, sentinel);
    assert_memory_equal(&rep, &rep0, sizeof rep);
  }
}

/* ---- contexts and the layer in search mode ----------------------------------------- */

static void test_layer_search_faults(void **state) {
  (void)state;
  const int32_t heads = 4;
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.layer_index = 1;
  ld.local_heads = heads;
  ld.head_dim = 16;
  ld.sp_size = 1;
  sta_geometry_init(&ld.geom, 6, 9, 9);
  ld.geom.tile[0] = 2; ld.geom.tile[1] = 3; ld.geom.tile[2] = 3; /* grid 3x3x3 */
  ld.layout = STA_BHSD;
  ld.backend = STA_CPU;
  sta_layer *layer = NULL;
  assert_int_equal(sta_layer_create(&layer, &ld), STA_OK);
  sta_metadata *md = NULL;
  assert_int_equal(sta_metadata_search(&md, 2, 3, CAND), STA_OK);
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  sta_context *ctx = NULL;
  assert_int_equal(sta_context_push(&ctx, 3, md, fb), STA_OK);
  int32_t depth = sta_context_depth();
  int64_t shape[4] = {1, heads, 6 * 9 * 9 + 7, 16};
  sta_tensor *q = randn(STA_F32, 4, shape), *k = randn(STA_F32, 4, shape),
             *v = randn(STA_F32, 4, shape), *out = randn(STA_F32, 4, shape);
  sta_tensor *out0 = clone(out);
  int64_t n;
  COUNT(n, sta_layer_forward(layer, q, k, v, out));
  report("sta_layer_forward (search mode, 3 candidates)", n);
  assert_int_equal(sta_forward_batch_records(fb, 0), 1);
  sta_tensor *ref = clone(out);
  assert_int_equal(sta_tensor_copy(out, out0), STA_OK);
  sta_forward_batch_clear(fb);
  for (int64_t i = 1; i <= n; i++) {
    sta_forward_batch_clear(fb); /* a failed record may keep a grown (empty) list */
    sta_fault_arm(i);
    sta_status rc = sta_layer_forward(layer, q, k, v, out);
    sta_fault_arm(0);
    assert_nomem(rc, "layer search forward", i);
    assert_same(out, out0);
    assert_int_equal(sta_forward_batch_records(fb, 0), 0);
    assert_int_equal(sta_context_depth(), depth);
    assert_ptr_equal(sta_context_current(), ctx);
  }
  assert_int_equal(sta_layer_forward(layer, q, k, v, out), STA_OK);
  assert_same(out, ref);
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  /* context push itself: depth unchanged on failure */
  sta_context *c[3];
  for (int32_t j = 0; j < 3; j++) {
    int32_t before = sta_context_depth();
    COUNT(n, sta_context_push(&c[j], j, NULL, fb));
    assert_int_equal(sta_context_pop(c[j]), STA_OK);
    if (j == 0) report("sta_context_push (empty stack)", n);
    for (int64_t i = 1; i <= n; i++) {
      sta_context *sentinel = (sta_context *)&seed, *x = sentinel;
      sta_fault_arm(i);
      sta_status rc = sta_context_push(&x, j, NULL, fb);
      sta_fault_arm(0);
      assert_nomem(rc, "context push", i);
      assert_ptr_equal(x, sentinel);
      assert_int_equal(sta_context_depth(), before);
    }
    assert_int_equal(sta_context_push(&c[j], j, NULL, fb), STA_OK);
  }
  for (int32_t j = 2; j >= 0; j--) assert_int_equal(sta_context_pop(c[j]), STA_OK);
  assert_int_equal(sta_context_depth(), 0);
  sta_tensor *all[] = {q, k, v, out, out0, ref};
  for (size_t j = 0; j < sizeof all / sizeof all[0]; j++) sta_tensor_destroy(all[j]);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(md);
  sta_layer_destroy(layer);
}

/* ---- tensors ----------------------------------------------------------------------- */

static void test_tensor_faults(void **state) {
  (void)state;
  int64_t shape[4] = {2, 3, 4, 5};
  sta_tensor *a = randn(STA_F32, 4, shape);
  int32_t perm[4] = {3, 1, 0, 2};
  sta_tensor *p = NULL;
  assert_int_equal(sta_tensor_permute(&p, a, perm), STA_OK);
  struct { const char *what; int op; } ops[] = {
    {"sta_tensor_create", 0}, {"sta_tensor_to (strided, bf16)", 1},
    {"sta_tensor_narrow", 2}};
  for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
    int64_t n = 0;
    for (int64_t i = 0;; i++) {
      sta_tensor *sentinel = (sta_tensor *)&seed, *t = sentinel;
      sta_fault_arm(i);
      sta_status rc;
      switch (ops[o].op) {
      case 0: rc = sta_tensor_create(&t, STA_BF16, STA_CPU, 4, shape); break;
      case 1: rc = sta_tensor_to(&t, p, STA_BF16, STA_CPU); break;
      case 2: rc = sta_tensor_narrow(&t, a, 2, 1, 2); break;
      default: rc = STA_ERR_ARGUMENT; break;
      }
      int64_t used = sta_fault_count();
      sta_fault_arm(0);
      if (i == 0) { /* the counting run */
        n = used;
        assert_int_equal(rc, STA_OK);
        if (t != sentinel) sta_tensor_destroy(t);
        report(ops[o].what, n);
        continue;
      }
      if (i > n) { /* one past the last site: it succeeds */
        assert_int_equal(rc, STA_OK);
        sta_tensor_destroy(t);
        break;
      }
      assert_nomem(rc, ops[o].what, i);
      assert_ptr_equal(t, sentinel);
    }
  }
  /* compare on equal shapes allocates two host copies */
  sta_tensor *b = clone(a);
  int64_t n;
  double m = 7, r = 7;
  COUNT(n, sta_tensor_compare(a, b, &m, &r));
  report("sta_tensor_compare", n);
  for (int64_t i = 1; i <= n; i++) {
    m = r = 7;
    sta_fault_arm(i);
    sta_status rc = sta_tensor_compare(a, b, &m, &r);
    sta_fault_arm(0);
    assert_nomem(rc, "compare", i);
    assert_true(m == 7 && r == 7);
  }
  sta_tensor_destroy(b);
  sta_tensor_destroy(p);
  sta_tensor_destroy(a);
}

static int setup(void **state) {
  (void)state;
  seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  printf("# test_faults seed %llu\n", (unsigned long long)seed);
  return sta_test_mkdtemp(dir, sizeof dir, "faults");
}

static int teardown(void **state) {
  (void)state;
  return sta_test_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_forward_faults),
    cmocka_unit_test(test_strategy_faults),
    cmocka_unit_test(test_npy_faults),
    cmocka_unit_test(test_safetensors_faults),
    cmocka_unit_test(test_search_save_faults),
    cmocka_unit_test(test_tune_faults),
    cmocka_unit_test(test_layer_search_faults),
    cmocka_unit_test(test_tensor_faults),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
