/*
** test_nonfinite_blocks.c -- non-finite values propagate through block-list
** attention (STA_MASK_BLOCKS) as through the window (test_nonfinite.c): one
** NaN (or +Inf in q) planted at a random place of q, k or v of a random
** problem (block rows, partial blocks, random lists with empty ones, f32,
** f16, bf16, both layouts) reaches exactly the elements that depend on it
** and nothing else, in the fast CPU forward and the double reference:
**
**   q at a valid row i: out row i non-finite, lse NaN (or -inf where an
**     Inf meets keys of one sign only), unless its list is empty (out 0,
**     lse -inf);
**   k at a valid row of key block n: every valid row of each query block
**     that lists n: out non-finite, lse NaN;
**   v at (a valid row of block n, column d): those rows' out column d
**     non-finite, lse finite;
**   a padding row of q, k or v: nothing (it is never read);
**   every other element finite; padding query rows out 0, lse -inf.
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
#include <cmocka.h>

#include "test_util.h"

#define CASES 120

static int64_t n_bad, n_elems; /* non-finite elements predicted (and seen), all checked */

typedef struct bcase {
  int64_t H, D, M, L, S;
  int32_t bv;
  sta_dtype dt;
  sta_layout layout;
  sta_tensor *num, *idx, *sizes;
  int32_t *n, *x, *sz; /* the lists' data */
} bcase;

static void lists_new(bcase *c) {
  int64_t ns[3] = {1, c->H, c->M}, is[4] = {1, c->H, c->M, c->L}, ks[1] = {c->M};
  assert_int_equal(sta_tensor_create(&c->num, STA_I32, STA_CPU, 3, ns), STA_OK);
  assert_int_equal(sta_tensor_create(&c->idx, STA_I32, STA_CPU, 4, is), STA_OK);
  assert_int_equal(sta_tensor_create(&c->sizes, STA_I32, STA_CPU, 1, ks), STA_OK);
  c->n = sta_tensor_data(c->num);
  c->x = sta_tensor_data(c->idx);
  c->sz = sta_tensor_data(c->sizes);
  for (int64_t m = 0; m < c->M; m++) c->sz[m] = (int32_t)sta_test_rint(1, c->bv);
  for (int64_t r = 0; r < c->H * c->M; r++) {
    /* a random subset in random order (one list in five empty) */
    int32_t perm[64];
    for (int64_t k = 0; k < c->M; k++) perm[k] = (int32_t)k;
    for (int64_t k = c->M - 1; k > 0; k--) {
      int64_t j = sta_test_rint(0, k);
      int32_t t = perm[k];
      perm[k] = perm[j];
      perm[j] = t;
    }
    c->n[r] = sta_test_rint(0, 4) == 0 ? 0 : (int32_t)sta_test_rint(1, c->L);
    for (int64_t e = 0; e < c->L; e++)
      c->x[r * c->L + e] = e < c->n[r] ? perm[e] : (int32_t)sta_test_rint(-5, 99); /* junk */
  }
}

/* Query block m of head h lists key block n. */
static int lists(const bcase *c, int64_t h, int64_t m, int64_t n) {
  const int64_t r = h * c->M + m;
  for (int64_t e = 0; e < c->n[r]; e++)
    if (c->x[r * c->L + e] == n) return 1;
  return 0;
}

static int valid(const bcase *c, int64_t s) { return s % c->bv < c->sz[s / c->bv]; }

static double at(const sta_tensor *t, const bcase *c, int64_t s, int64_t h, int64_t d) {
  int64_t i[4] = {0, c->layout == STA_BSHD ? s : h, c->layout == STA_BSHD ? h : s, d};
  double v;
  assert_int_equal(sta_tensor_get(t, i, &v), STA_OK);
  return v;
}

static void put(sta_tensor *t, const bcase *c, int64_t s, int64_t h, int64_t d, double v) {
  int64_t i[4] = {0, c->layout == STA_BSHD ? s : h, c->layout == STA_BSHD ? h : s, d};
  assert_int_equal(sta_tensor_set(t, i, v), STA_OK);
}

/* out and lse of one call against the rules for a value planted in x[which]
** at (ps, ph, pd). */
static void check(const bcase *c, const sta_tensor *o, const sta_tensor *lse, int which,
                  int64_t ps, int64_t ph, int64_t pd, int inf, const char *who) {
  const int pv = valid(c, ps);
  for (int64_t h = 0; h < c->H; h++)
    for (int64_t s = 0; s < c->S; s++) {
      const int64_t m = s / c->bv;
      int64_t li[3] = {0, h, s};
      double l;
      assert_int_equal(sta_tensor_get(lse, li, &l), STA_OK);
      if (!valid(c, s) || c->n[h * c->M + m] == 0) { /* no query, or no keys */
        if (l != -INFINITY) fail_msg("%s: lse of row %lld head %lld: %g, expected -inf", who,
                                     (long long)s, (long long)h, l);
        for (int64_t d = 0; d < c->D; d++)
          if (at(o, c, s, h, d) != 0) fail_msg("%s: out row %lld not 0", who, (long long)s);
        continue;
      }
      /* does this row depend on the planted value, and how */
      int row_bad = 0, col_bad = 0;
      if (pv && h == ph) {
        if (which == 0) row_bad = s == ps;
        else if (lists(c, h, m, ps / c->bv)) row_bad = which == 1, col_bad = which == 2;
      }
      for (int64_t d = 0; d < c->D; d++) {
        const double v = at(o, c, s, h, d);
        const int want_bad = row_bad || (col_bad && d == pd);
        n_bad += want_bad;
        n_elems++;
        if (want_bad == isfinite(v))
          fail_msg("%s: %s planted at row %lld head %lld col %lld (%s): out row %lld head %lld "
                   "col %lld = %g", who, which == 0 ? "q" : which == 1 ? "k" : "v",
                   (long long)ps, (long long)ph, (long long)pd, inf ? "+inf" : "nan",
                   (long long)s, (long long)h, (long long)d, v);
      }
      if (row_bad && !(isnan(l) || (inf && l == -INFINITY)))
        fail_msg("%s: lse of row %lld: %g, expected NaN%s", who, (long long)s, l,
                 inf ? " (or -inf)" : "");
      if (!row_bad && !isfinite(l)) fail_msg("%s: lse of row %lld: %g", who, (long long)s, l);
    }
}

static void test_blocks_propagate(void **state) {
  (void)state;
  static const sta_dtype DT[3] = {STA_F32, STA_F16, STA_BF16};
  for (int k = 0; k < CASES; k++) {
    bcase c;
    memset(&c, 0, sizeof c);
    c.bv = (int32_t)(sta_test_rint(0, 1) ? 8 : 16);
    c.M = sta_test_rint(2, 6);
    c.L = sta_test_rint(1, c.M);
    c.H = sta_test_rint(1, 3);
    c.D = sta_test_rint(0, 1) ? 8 : 16;
    c.S = c.M * c.bv;
    c.dt = DT[k % 3];
    c.layout = sta_test_rint(0, 1) ? STA_BSHD : STA_BHSD;
    lists_new(&c);
    int64_t shape[4] = {1, c.layout == STA_BSHD ? c.S : c.H, c.layout == STA_BSHD ? c.H : c.S,
                        c.D}, ls[3] = {1, c.H, c.S};
    sta_tensor *t[3], *o = NULL, *lse = NULL;
    for (int i = 0; i < 3; i++) {
      assert_int_equal(sta_tensor_create(&t[i], c.dt, STA_CPU, 4, shape), STA_OK);
      assert_int_equal(sta_tensor_randn(t[i], sta_test_rnd(), 0, 1), STA_OK);
    }
    assert_int_equal(sta_tensor_create(&o, c.dt, STA_CPU, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls), STA_OK);
    /* the plant: which tensor, where (padding rows too), NaN or +Inf (q only) */
    const int which = (int)sta_test_rint(0, 2);
    const int64_t ps = sta_test_rint(0, c.S - 1), ph = sta_test_rint(0, c.H - 1),
                  pd = sta_test_rint(0, c.D - 1);
    const int inf = which == 0 && sta_test_rint(0, 3) == 0;
    put(t[which], &c, ps, ph, pd, inf ? INFINITY : NAN);
    sta_block_list bl = {c.bv, c.num, c.idx, c.sizes, NULL};
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    d.layout = c.layout;
    d.mask = STA_MASK_BLOCKS;
    d.blocks = &bl;
    char who[160];
    snprintf(who, sizeof who, "case %d (%s, bv %d, M %lld, L %lld, H %lld, D %lld, %s)", k,
             sta_dtype_name(c.dt), (int)c.bv, (long long)c.M, (long long)c.L, (long long)c.H,
             (long long)c.D, c.layout == STA_BSHD ? "bshd" : "bhsd");
    assert_int_equal(sta_attention_forward(&d, t[0], t[1], t[2], o, lse), STA_OK);
    check(&c, o, lse, which, ps, ph, pd, inf, who);
    if (c.dt == STA_F32) { /* the double reference (f32 operands) */
      assert_int_equal(sta_attention_reference(&d, t[0], t[1], t[2], o, lse), STA_OK);
      strncat(who, ", reference", sizeof who - strlen(who) - 1);
      check(&c, o, lse, which, ps, ph, pd, inf, who);
    }
    for (int i = 0; i < 3; i++) sta_tensor_destroy(t[i]);
    sta_tensor_destroy(o);
    sta_tensor_destroy(lse);
    sta_tensor_destroy(c.num);
    sta_tensor_destroy(c.idx);
    sta_tensor_destroy(c.sizes);
  }
  printf("# %d cases: %lld elements checked, %lld of them non-finite as predicted\n", CASES,
         (long long)n_elems, (long long)n_bad);
  assert_true(n_bad > 0 && n_bad < n_elems);
}

int main(void) {
  sta_test_begin(2862933555777941757ull, 17);
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_blocks_propagate)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
