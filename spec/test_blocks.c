/* test_blocks.c -- block-sparse attention on the CPU (STA.md section 12;
** sta.h, STA_MASK_BLOCKS and STA_MASK_WINDOW_OR_BLOCKS): the fast forward
** and backward against the float64 reference on random problems (random
** q and kv block sizes, different lists per batch and head, Mq != Mk, an
** empty list, block_rows 64, 256 and 48, every dtype, both layouts), the
** reference against a dense masked computation written here and against
** finite differences, the union against the reference and against the
** window, every block listed against dense attention, determinism, the
** flop count, and every bad input's exact message with the outputs
** unchanged.  (The lists' dtype, STA_I32: test_i32.c.) */
#include <math.h>

#include "test_util.h"

typedef struct bprob {
  int64_t B, H, D, Mq, Mk, L;
  int32_t bv;        /* block_rows as given (0: the default) */
  int32_t rows;      /* rows per block in fact */
  int uni;           /* STA_MASK_WINDOW_OR_BLOCKS over canvas, tile, window */
  int32_t canvas[3], tile[3], window[3];
  int qsizes, ksizes; /* random valid sizes given */
  int all;           /* every key block listed */
  sta_dtype dtype;
  sta_layout layout;
  uint64_t seed;
} bprob;

enum { Q, K, V, DO, O, DQ, DK, DV, NT };

typedef struct bset {
  sta_tensor *t[NT], *lse, *num, *idx, *qs, *ks;
  sta_block_list bl;
  sta_attention_desc d;
} bset;

static void prob_init(bprob *c, int64_t Mq, int64_t Mk, int32_t bv) {
  memset(c, 0, sizeof *c);
  c->B = 2; c->H = 2; c->D = 16;
  c->Mq = Mq; c->Mk = Mk; c->L = Mk > 3 ? Mk - 1 : Mk;
  c->bv = c->rows = bv;
  c->qsizes = c->ksizes = 1;
  c->dtype = STA_F32;
  c->seed = sta_test_rnd();
}

/* The union over a canvas whose tiles are whole: blocks = tiles. */
static void prob_union(bprob *c, int32_t t, int32_t h, int32_t w, int32_t tt, int32_t th,
                       int32_t tw, int32_t k) {
  c->uni = 1;
  c->canvas[0] = t; c->canvas[1] = h; c->canvas[2] = w;
  c->tile[0] = tt; c->tile[1] = th; c->tile[2] = tw;
  c->window[0] = c->window[1] = c->window[2] = k;
  c->rows = tt * th * tw;
  c->bv = 0; /* the tile volume */
  c->Mq = c->Mk = (int64_t)((t + tt - 1) / tt) * ((h + th - 1) / th) * ((w + tw - 1) / tw);
  c->L = c->Mk / 2 + 1;
}

static int64_t sq(const bprob *c) { return c->Mq * c->rows; }
static int64_t sk(const bprob *c) { return c->Mk * c->rows; }

static sta_tensor *i32(int32_t ndim, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, STA_I32, STA_CPU, ndim, shape), STA_OK);
  return t;
}

/* [B, S, H, D] (or BHSD) in c's dtype and layout. */
static sta_tensor *make4(const bprob *c, int64_t S) {
  sta_tensor *t = NULL;
  int64_t bshd[4] = {c->B, S, c->H, c->D}, bhsd[4] = {c->B, c->H, S, c->D};
  assert_int_equal(sta_tensor_create(&t, c->dtype, STA_CPU, 4,
                                     c->layout == STA_BSHD ? bshd : bhsd), STA_OK);
  return t;
}

/* Random inputs and lists: per (b, h, m) a count in 0..L (every key block
** when c->all), distinct blocks in random order, the entries past the
** count garbage (never read); list (0, 0, 0) empty unless c->all. */
static void set_make(bset *s, const bprob *c) {
  memset(s, 0, sizeof *s);
  for (int i = 0; i < NT; i++) s->t[i] = make4(c, i == K || i == V || i == DK || i == DV ? sk(c) : sq(c));
  for (int i = 0; i <= DO; i++)
    assert_int_equal(sta_tensor_randn(s->t[i], c->seed * 8 + (uint64_t)i, i == V ? 0.3 : 0, 1), STA_OK);
  for (int i = O; i < NT; i++) assert_int_equal(sta_tensor_fill(s->t[i], NAN), STA_OK);
  int64_t ls[3] = {c->B, c->H, sq(c)}, ns[3] = {c->B, c->H, c->Mq}, is[4] = {c->B, c->H, c->Mq, c->L};
  assert_int_equal(sta_tensor_create(&s->lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_fill(s->lse, NAN), STA_OK);
  s->num = i32(3, ns);
  s->idx = i32(4, is);
  int32_t *num = sta_tensor_data(s->num), *idx = sta_tensor_data(s->idx), perm[4096];
  for (int64_t r = 0; r < c->B * c->H * c->Mq; r++) {
    const int64_t most = c->L < c->Mk ? c->L : c->Mk;
    int64_t n = c->all ? c->Mk : r == 0 ? 0 : sta_test_rint(0, most);
    for (int64_t j = 0; j < c->Mk; j++) perm[j] = (int32_t)j;
    for (int64_t j = 0; j < c->L; j++) {
      if (j < n) { /* a random block not taken yet */
        int64_t x = sta_test_rint(j, c->Mk - 1);
        int32_t y = perm[j];
        perm[j] = perm[x];
        perm[x] = y;
      }
      idx[r * c->L + j] = j < n ? perm[j] : (int32_t)sta_test_rint(-5, 2 * c->Mk); /* unread */
    }
    num[r] = (int32_t)n;
  }
  int64_t ms[1] = {c->Mq}, ks[1] = {c->Mk};
  const int32_t lo = c->rows / 4 > 0 ? c->rows / 4 : 1;
  if (c->qsizes) {
    s->qs = i32(1, ms);
    for (int64_t m = 0; m < c->Mq; m++)
      ((int32_t *)sta_tensor_data(s->qs))[m] = (int32_t)sta_test_rint(lo, c->rows);
  }
  if (c->ksizes) {
    s->ks = i32(1, ks);
    for (int64_t n = 0; n < c->Mk; n++)
      ((int32_t *)sta_tensor_data(s->ks))[n] = (int32_t)sta_test_rint(lo, c->rows);
    ((int32_t *)sta_tensor_data(s->ks))[0] = c->rows; /* a whole one too */
  }
  s->bl.block_rows = c->bv;
  s->bl.num = s->num;
  s->bl.idx = s->idx;
  s->bl.q_sizes = s->qs;
  s->bl.kv_sizes = s->ks;
  s->d.layout = c->layout;
  s->d.mask = c->uni ? STA_MASK_WINDOW_OR_BLOCKS : STA_MASK_BLOCKS;
  s->d.blocks = &s->bl;
  if (c->uni) {
    sta_geometry_init(&s->d.geom, c->canvas[0], c->canvas[1], c->canvas[2]);
    memcpy(s->d.geom.tile, c->tile, sizeof c->tile);
    s->d.geom.order = STA_ORDER_TILED;
    s->d.n_windows = 1;
    s->d.windows = c->window;
  }
}

static void set_free(bset *s) {
  for (int i = 0; i < NT; i++) sta_tensor_destroy(s->t[i]);
  sta_tensor_destroy(s->lse);
  sta_tensor_destroy(s->num);
  sta_tensor_destroy(s->idx);
  sta_tensor_destroy(s->qs);
  sta_tensor_destroy(s->ks);
}

/* Element (b, s, h, e) of a 4-D tensor in layout. */
static double at4(const sta_tensor *t, sta_layout layout, int64_t b, int64_t s, int64_t h, int64_t e) {
  int64_t ix[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, e};
  double x = 0;
  assert_int_equal(sta_tensor_get(t, ix, &x), STA_OK);
  return x;
}

static int32_t size_of(const sta_tensor *sizes, int64_t n, int32_t rows) {
  return sizes ? ((const int32_t *)sta_tensor_data(sizes))[n] : rows;
}

/* Query row s of (b, h): 0 padding, 1 a query with keys, 2 an empty list
** (the union's window is never empty). */
static int qkind(const bset *st, const bprob *c, int64_t b, int64_t h, int64_t s) {
  int64_t m = s / c->rows;
  const sta_tensor *qs = st->qs ? st->qs : c->Mq == c->Mk ? st->ks : NULL;
  if (s % c->rows >= size_of(qs, m, c->rows)) return 0;
  return c->uni || ((const int32_t *)sta_tensor_data(st->num))[(b * c->H + h) * c->Mq + m] ? 1 : 2;
}

/* rel L2 of a against r over the rows where both are finite; non-finite
** entries must match (both -inf, say) */
static double rel_l2(const sta_tensor *a, const sta_tensor *r) {
  double mx, rel;
  assert_int_equal(sta_tensor_compare(a, r, &mx, &rel), STA_OK);
  return rel;
}

/* The lse's error: rel L2, or the largest absolute difference where that is
** smaller. An lse is a log, its values near 0 when a row has one key whose
** score is small, so with few rows rel L2 divides by a small norm (one row
** of one key: lse = its score, rel 1e-5 from an absolute 1e-7). */
static double lse_err(const sta_tensor *a, const sta_tensor *r) {
  double mx, rel;
  assert_int_equal(sta_tensor_compare(a, r, &mx, &rel), STA_OK);
  return rel < mx / 5 ? rel : mx / 5;
}

static double fwd_tol(sta_dtype dt) { return dt == STA_F32 ? 2e-5 : dt == STA_F16 ? 6e-4 : 4e-3; }
static double bwd_tol(sta_dtype dt) { return dt == STA_F32 ? 1e-5 : dt == STA_F16 ? 4e-3 : 1.5e-2; }

static sta_tensor *f32_copy(const sta_tensor *t) {
  sta_tensor *x = NULL;
  assert_int_equal(sta_tensor_to(&x, t, STA_F32, STA_CPU), STA_OK);
  return x;
}

/* The fast forward and backward against the reference (on exact f32
** copies), and the rows that must be exactly 0 / -inf. */
static void check(const bprob *c) {
  bset s;
  set_make(&s, c);
  sta_status rc = sta_attention_forward(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], s.lse);
  if (rc != STA_OK) fail_msg("forward: %s", sta_last_error());
  rc = sta_attention_backward(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], s.lse, s.t[DO], s.t[DQ],
                              s.t[DK], s.t[DV]);
  if (rc != STA_OK) fail_msg("backward: %s", sta_last_error());
  sta_tensor *x[4], *ro, *rl = NULL, *rg[3];
  for (int i = 0; i < 4; i++) x[i] = f32_copy(s.t[i]);
  ro = f32_copy(s.t[O]);
  for (int i = 0; i < 3; i++) rg[i] = f32_copy(s.t[DQ + i]);
  int64_t ls[3] = {c->B, c->H, sq(c)};
  assert_int_equal(sta_tensor_create(&rl, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_attention_reference(&s.d, x[Q], x[K], x[V], ro, rl), STA_OK);
  assert_int_equal(sta_attention_backward_reference(&s.d, x[Q], x[K], x[V], x[DO], rg[0], rg[1],
                                                    rg[2]), STA_OK);
  /* rows without keys: out 0, lse -inf, dq 0, in both; then compare the
  ** rest with those rows set to 0 in the lse */
  int64_t nz = 0, nempty = 0;
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t h = 0; h < c->H; h++)
      for (int64_t r = 0; r < sq(c); r++) {
        int k = qkind(&s, c, b, h, r);
        int64_t li[3] = {b, h, r};
        double a, z;
        assert_int_equal(sta_tensor_get(s.lse, li, &a), STA_OK);
        assert_int_equal(sta_tensor_get(rl, li, &z), STA_OK);
        if (k == 1) { assert_true(isfinite(a) && isfinite(z)); continue; }
        nempty += k == 2;
        if (!(a == -INFINITY && z == -INFINITY)) fail_msg("lse row %lld (kind %d): %g, reference %g", (long long)r, k, a, z);
        assert_int_equal(sta_tensor_set(s.lse, li, 0), STA_OK);
        assert_int_equal(sta_tensor_set(rl, li, 0), STA_OK);
        for (int64_t e = 0; e < c->D; e++) {
          if (at4(s.t[O], c->layout, b, r, h, e) != 0 || at4(ro, c->layout, b, r, h, e) != 0 ||
              at4(s.t[DQ], c->layout, b, r, h, e) != 0 || at4(rg[0], c->layout, b, r, h, e) != 0)
            fail_msg("row %lld (kind %d) of a query without keys: out or dq not 0", (long long)r, k);
          nz++;
        }
      }
  assert_true(c->all || c->uni || nempty >= c->rows / 4); /* list (0, 0, 0) is empty */
  /* key rows that are padding: dk = dv = 0 */
  for (int64_t n = 0; n < c->Mk; n++)
    for (int64_t r = size_of(s.ks, n, c->rows); r < c->rows; r++)
      for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
          for (int64_t e = 0; e < c->D; e++)
            for (int g = 1; g < 3; g++)
              if (at4(s.t[DQ + g], c->layout, b, n * c->rows + r, h, e) != 0 ||
                  at4(rg[g], c->layout, b, n * c->rows + r, h, e) != 0)
                fail_msg("padding key row %lld: d%c not 0", (long long)(n * c->rows + r), "qkv"[g]);
  const double tf = fwd_tol(c->dtype), tb = bwd_tol(c->dtype);
  double e0 = rel_l2(s.t[O], ro), e1 = lse_err(s.lse, rl), eg[3];
  for (int i = 0; i < 3; i++) eg[i] = rel_l2(s.t[DQ + i], rg[i]);
  if (getenv("STA_TEST_VERBOSE"))
    printf("# %s layout %d rows %d Mq %lld Mk %lld uni %d: out %.2g lse %.2g dq %.2g dk %.2g dv %.2g\n",
           sta_dtype_name(c->dtype), (int)c->layout, c->rows, (long long)c->Mq, (long long)c->Mk,
           c->uni, e0, e1, eg[0], eg[1], eg[2]);
  if (!(e0 < tf && e1 < 2e-6 && eg[0] < tb && eg[1] < tb && eg[2] < tb))
    fail_msg("%s layout %d rows %d Mq %lld Mk %lld L %lld uni %d: rel L2 out %g lse %g dq %g dk "
             "%g dv %g", sta_dtype_name(c->dtype), (int)c->layout, c->rows, (long long)c->Mq,
             (long long)c->Mk, (long long)c->L, c->uni, e0, e1, eg[0], eg[1], eg[2]);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(x[i]);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(rg[i]);
  sta_tensor_destroy(ro);
  sta_tensor_destroy(rl);
  set_free(&s);
}

static void test_random_lists(void **state) {
  (void)state;
  static const sta_dtype DT[3] = {STA_F32, STA_BF16, STA_F16};
  for (int i = 0; i < 12; i++) {
    bprob c;
    static const int32_t BV[3] = {64, 48, 256};
    int32_t bv = BV[i % 3];
    prob_init(&c, sta_test_rint(1, bv == 256 ? 3 : 6), sta_test_rint(1, bv == 256 ? 3 : 7), bv);
    if (bv == 64 && i % 2) c.bv = 0; /* the default, 64 */
    c.dtype = DT[i % 3 == 0 ? (i / 3) % 3 : i % 3];
    c.layout = i % 2 ? STA_BHSD : STA_BSHD;
    c.qsizes = i % 4 != 1;
    c.ksizes = i % 4 != 2;
    c.D = i % 5 == 4 ? 64 : 16;
    c.B = bv == 256 ? 1 : 2;
    check(&c);
  }
}

/* Mq != Mk both ways; q without sizes (whole) against k with them. */
static void test_shapes(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 2, 7, 64);
  c.qsizes = 0;
  check(&c);
  prob_init(&c, 7, 2, 64);
  c.L = 2;
  c.layout = STA_BHSD;
  check(&c);
  prob_init(&c, 1, 1, 1); /* blocks of one row */
  c.qsizes = c.ksizes = 0;
  check(&c);
  prob_init(&c, 4, 4, 64); /* q_sizes NULL, Mq == Mk: kv_sizes serve */
  c.qsizes = 0;
  check(&c);
}

/* The union: against the reference; with empty lists it is the window. */
static void test_union(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 0, 0, 0);
  prob_union(&c, 6, 8, 12, 2, 4, 4, 3); /* 3x2x3 tiles of 32 rows */
  check(&c);
  prob_init(&c, 0, 0, 0);
  prob_union(&c, 8, 8, 8, 2, 2, 4, 1);
  c.dtype = STA_BF16;
  c.layout = STA_BHSD;
  c.qsizes = 0;
  check(&c);
  /* every list empty, whole blocks: the window kind on the same rows */
  prob_init(&c, 0, 0, 0);
  prob_union(&c, 4, 6, 9, 2, 3, 3, 1);
  c.qsizes = c.ksizes = 0;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_tensor_fill(s.num, 0), STA_OK);
  assert_int_equal(sta_attention_forward(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], NULL), STA_OK);
  sta_attention_desc w = s.d;
  w.mask = STA_MASK_WINDOW;
  assert_int_equal(sta_attention_forward(&w, s.t[Q], s.t[K], s.t[V], s.t[DQ], NULL), STA_OK);
  assert_true(rel_l2(s.t[O], s.t[DQ]) < 1e-6);
  set_free(&s);
}

/* Every key block listed, whole blocks: dense attention (the reference's
** full window over the same rows). */
static void test_dense(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 3, 3, 64);
  c.all = 1;
  c.L = 3;
  c.qsizes = c.ksizes = 0;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_attention_forward(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], NULL), STA_OK);
  sta_attention_desc w;
  memset(&w, 0, sizeof w);
  sta_geometry_init(&w.geom, 3, 8, 8); /* 192 tokens, one tile */
  int32_t full[3] = {1, 1, 1};
  w.windows = full;
  w.n_windows = 1;
  assert_int_equal(sta_attention_reference(&w, s.t[Q], s.t[K], s.t[V], s.t[DQ], NULL), STA_OK);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(s.t[O], s.t[DQ], &mx, &rel), STA_OK);
  if (!(rel < 2e-6 && mx < 1e-5)) fail_msg("dense: rel %g max %g", rel, mx);
  set_free(&s);
  check(&c);
}

/* The reference against dense masked attention written out here, on one
** small problem: q row i of block m sees key row j of block n when n is in
** m's list and both rows are valid. */
static void test_reference_by_hand(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 3, 4, 4);
  c.B = 1; c.H = 1; c.D = 3; c.L = 3;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_attention_reference(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], s.lse), STA_OK);
  const int32_t *num = sta_tensor_data(s.num), *idx = sta_tensor_data(s.idx);
  for (int64_t i = 0; i < sq(&c); i++) {
    int64_t m = i / 4;
    double lg[16], mx = -INFINITY, l = 0, acc[3] = {0, 0, 0};
    int any = 0;
    for (int64_t j = 0; j < sk(&c); j++) {
      int64_t n = j / 4, seen = 0;
      for (int32_t e = 0; e < num[m]; e++) seen |= idx[m * c.L + e] == n;
      lg[j] = -INFINITY;
      if (!seen || i % 4 >= size_of(s.qs, m, 4) || j % 4 >= size_of(s.ks, n, 4)) continue;
      lg[j] = 0;
      for (int e = 0; e < 3; e++) lg[j] += at4(s.t[Q], c.layout, 0, i, 0, e) * at4(s.t[K], c.layout, 0, j, 0, e);
      lg[j] /= sqrt(3.0);
      mx = lg[j] > mx ? lg[j] : mx;
      any = 1;
    }
    for (int64_t j = 0; j < sk(&c) && any; j++) {
      if (lg[j] == -INFINITY) continue;
      l += exp(lg[j] - mx);
      for (int e = 0; e < 3; e++) acc[e] += exp(lg[j] - mx) * at4(s.t[V], c.layout, 0, j, 0, e);
    }
    for (int e = 0; e < 3; e++) {
      double o = at4(s.t[O], c.layout, 0, i, 0, e), want = any ? acc[e] / l : 0;
      if (fabs(o - want) > 1e-6) fail_msg("row %lld: %g, by hand %g", (long long)i, o, want);
    }
    int64_t li[3] = {0, 0, i};
    double z;
    assert_int_equal(sta_tensor_get(s.lse, li, &z), STA_OK);
    assert_true(any ? fabs(z - (mx + log(l))) < 1e-5 : z == -INFINITY);
  }
  set_free(&s);
}

/* The list reference's gradient against finite differences of its forward. */
static void test_reference_gradient(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 3, 3, 4);
  c.B = 1; c.D = 4; c.L = 2;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_attention_backward_reference(&s.d, s.t[Q], s.t[K], s.t[V], s.t[DO],
                                                    s.t[DQ], s.t[DK], s.t[DV]), STA_OK);
  for (int which = 0; which < 3; which++)
    for (int n = 0; n < 20; n++) {
      int64_t ix[4];
      for (int i = 0; i < 4; i++) ix[i] = sta_test_rint(0, sta_tensor_size(s.t[which], i) - 1);
      double x0, an, lp = 0, lm = 0, y, g;
      assert_int_equal(sta_tensor_get(s.t[which], ix, &x0), STA_OK);
      assert_int_equal(sta_tensor_get(s.t[DQ + which], ix, &an), STA_OK);
      for (int side = 0; side < 2; side++) {
        assert_int_equal(sta_tensor_set(s.t[which], ix, x0 + (side ? -1e-2 : 1e-2)), STA_OK);
        assert_int_equal(sta_attention_reference(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], NULL), STA_OK);
        double sum = 0;
        for (int64_t b = 0; b < c.B; b++)
          for (int64_t r = 0; r < sq(&c); r++)
            for (int64_t h = 0; h < c.H; h++)
              for (int64_t e = 0; e < c.D; e++) {
                y = at4(s.t[O], c.layout, b, r, h, e);
                g = at4(s.t[DO], c.layout, b, r, h, e);
                sum += y * g;
              }
        *(side ? &lm : &lp) = sum;
      }
      assert_int_equal(sta_tensor_set(s.t[which], ix, x0), STA_OK);
      double fd = (lp - lm) / 2e-2;
      if (!(fabs(fd - an) <= 2e-3 + 2e-3 * fabs(an)))
        fail_msg("d%c: analytic %g, finite difference %g", "qkv"[which], an, fd);
    }
  set_free(&s);
}

/* Bit-identical outputs and gradients run to run and across thread
** counts; the lists in another order give the same bits (the plan sorts
** them). */
static void test_deterministic(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 5, 6, 48);
  c.D = 32;
  bset a;
  set_make(&a, &c);
  const int32_t saved = sta_get_num_threads();
  sta_tensor *keep[4] = {NULL, NULL, NULL, NULL};
  for (int run = 0; run < 3; run++) {
    sta_set_num_threads(run == 0 ? 1 : 2);
    if (run == 2) { /* every list reversed */
      int32_t *num = sta_tensor_data(a.num), *idx = sta_tensor_data(a.idx);
      for (int64_t r = 0; r < c.B * c.H * c.Mq; r++)
        for (int32_t i = 0; i < num[r] / 2; i++) {
          int32_t y = idx[r * c.L + i];
          idx[r * c.L + i] = idx[r * c.L + num[r] - 1 - i];
          idx[r * c.L + num[r] - 1 - i] = y;
        }
    }
    assert_int_equal(sta_attention_forward(&a.d, a.t[Q], a.t[K], a.t[V], a.t[O], a.lse), STA_OK);
    assert_int_equal(sta_attention_backward(&a.d, a.t[Q], a.t[K], a.t[V], a.t[O], a.lse, a.t[DO],
                                            a.t[DQ], a.t[DK], a.t[DV]), STA_OK);
    for (int i = 0; i < 4; i++) {
      const sta_tensor *t = i < 3 ? a.t[DQ + i] : a.t[O];
      if (!keep[i]) {
        keep[i] = f32_copy(t);
        continue;
      }
      double mx;
      assert_int_equal(sta_tensor_compare(t, keep[i], &mx, NULL), STA_OK);
      if (mx != 0) fail_msg("run %d: %s differs by %g", run, i < 3 ? "a gradient" : "out", mx);
    }
  }
  sta_set_num_threads(saved);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(keep[i]);
  set_free(&a);
}

/* sta_attention_flops counts 4 D per (valid query row, valid key row of a
** block it sees); the union's window by STA.md section 2's centred form. */
static void test_flops(void **state) {
  (void)state;
  for (int uni = 0; uni < 2; uni++) {
    bprob c;
    prob_init(&c, 5, 6, 48);
    if (uni) {
      prob_init(&c, 0, 0, 0);
      prob_union(&c, 6, 8, 12, 2, 4, 4, 3);
    }
    bset s;
    set_make(&s, &c);
    const int32_t *num = sta_tensor_data(s.num), *idx = sta_tensor_data(s.idx);
    double pairs = 0;
    for (int64_t r = 0; r < c.B * c.H * c.Mq; r++) {
      int64_t m = r % c.Mq, keys = 0;
      for (int64_t n = 0; n < c.Mk; n++) {
        int seen = 0;
        for (int32_t i = 0; i < num[r]; i++) seen |= idx[r * c.L + i] == n;
        if (uni) { /* tiles 3x2x3, window 3 on each axis */
          int64_t g[3] = {3, 2, 3}, in = 1;
          int64_t qc[3] = {m / 6, (m / 3) % 2, m % 3}, kc[3] = {n / 6, (n / 3) % 2, n % 3};
          for (int a = 0; a < 3; a++) {
            int64_t k = 3 < g[a] ? 3 : g[a], rr = k / 2, ctr = qc[a] < rr ? rr : qc[a] > g[a] - 1 - rr ? g[a] - 1 - rr : qc[a];
            in &= k >= g[a] || llabs(kc[a] - ctr) <= rr;
          }
          seen |= (int)in;
        }
        if (seen) keys += size_of(s.ks, n, c.rows);
      }
      pairs += (double)keys * size_of(s.qs, m, c.rows);
    }
    double fl = sta_attention_flops(&s.d, c.B, sq(&c), c.H, c.D);
    if (fl != 4.0 * (double)c.D * pairs) fail_msg("uni %d: flops %g, counted %g", uni, fl, 4.0 * c.D * pairs);
    assert_true(fl > 0);
    assert_true(sta_attention_flops(&s.d, c.B, sq(&c) + c.rows, c.H, c.D) == 0); /* lists unfit */
    set_free(&s);
  }
}

/* Every bad input: its exact message, and out, lse untouched. */
static void expect_bad(bset *s, sta_status want, const char *msg) {
  sta_tensor *o0 = f32_copy(s->t[O]), *l0 = NULL;
  assert_int_equal(sta_tensor_to(&l0, s->lse, STA_F32, STA_CPU), STA_OK);
  sta_expect_err(sta_attention_forward(&s->d, s->t[Q], s->t[K], s->t[V], s->t[O], s->lse), want, msg);
  sta_expect_err(sta_attention_backward(&s->d, s->t[Q], s->t[K], s->t[V], s->t[O], s->lse,
                                        s->t[DO], s->t[DQ], s->t[DK], s->t[DV]), want, msg);
  sta_expect_err(sta_attention_reference(&s->d, s->t[Q], s->t[K], s->t[V], s->t[O], s->lse), want, msg);
  double m1, m2;
  assert_int_equal(sta_tensor_compare(s->t[O], o0, &m1, NULL), STA_OK);
  assert_int_equal(sta_tensor_compare(s->lse, l0, &m2, NULL), STA_OK);
  assert_true(m1 == 0 && m2 == 0);
  sta_tensor_destroy(o0);
  sta_tensor_destroy(l0);
}

static void test_errors(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 3, 4, 64);
  c.B = 2; c.H = 3; c.L = 3;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_tensor_fill(s.t[O], 5), STA_OK);
  assert_int_equal(sta_tensor_fill(s.lse, 6), STA_OK);
  int32_t *num = sta_tensor_data(s.num), *idx = sta_tensor_data(s.idx);
  int32_t *ks = sta_tensor_data(s.ks), *qs = sta_tensor_data(s.qs);
  /* list (b=1, h=2, m=1): entries 0..2 = 3, 1, 0 */
  const int64_t r = (1 * 3 + 2) * 3 + 1;
  num[r] = 3; idx[r * 3] = 3; idx[r * 3 + 1] = 1; idx[r * 3 + 2] = 0;
  idx[r * 3 + 2] = 1;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.idx[b=1, h=2, m=1]: key block 1 is listed twice (entries 1 and 2)");
  idx[r * 3 + 2] = 4;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.idx[b=1, h=2, m=1]: entry 2 is key block 4, outside 0..3");
  idx[r * 3 + 2] = -1;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.idx[b=1, h=2, m=1]: entry 2 is key block -1, outside 0..3");
  idx[r * 3 + 2] = 0;
  num[r] = 4;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.num[b=1, h=2, m=1]: 4 is outside 0..3 (L, the entries of idx per query block)");
  num[r] = -1;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.num[b=1, h=2, m=1]: -1 is outside 0..3 (L, the entries of idx per query block)");
  num[r] = 3;
  ks[2] = 65;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.kv_sizes[2]: 65 is outside 1..64 (block_rows)");
  ks[2] = 0;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.kv_sizes[2]: 0 is outside 1..64 (block_rows)");
  ks[2] = 64;
  qs[1] = -3;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.q_sizes[1]: -3 is outside 1..64 (block_rows)");
  qs[1] = 1;
  /* shapes, dtypes, devices and the descriptor */
  s.bl.block_rows = -2;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.block_rows: expected >= 1 (0: 64), got -2");
  s.bl.block_rows = 128;
  expect_bad(&s, STA_ERR_SHAPE, "q: S = 192 is not a multiple of block_rows 128 (STA_MASK_BLOCKS: whole blocks, padding rows included)");
  s.bl.block_rows = 96;
  expect_bad(&s, STA_ERR_SHAPE, "k: S = 256 is not a multiple of block_rows 96 (STA_MASK_BLOCKS: whole blocks, padding rows included)");
  s.bl.block_rows = 64;
  s.d.blocks = NULL;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks: expected a sta_block_list for STA_MASK_BLOCKS, got NULL");
  s.d.blocks = &s.bl;
  s.d.mask = (sta_mask_kind)3;
  expect_bad(&s, STA_ERR_ARGUMENT, "mask: expected STA_MASK_WINDOW (0), STA_MASK_BLOCKS (1) or STA_MASK_WINDOW_OR_BLOCKS (2), got 3");
  s.d.mask = STA_MASK_BLOCKS;
  s.d.precision = STA_PRECISION_FP8;
  expect_bad(&s, STA_ERR_UNSUPPORTED, "precision: STA_PRECISION_FP8 computes the window (STA_MASK_WINDOW) only, not STA_MASK_BLOCKS");
  s.d.precision = STA_PRECISION_NATIVE;
  sta_tensor *f = NULL, *bad = NULL, *view = NULL;
  int64_t ns[3] = {2, 3, 3}, ns2[3] = {2, 3, 4}, is2[4] = {2, 3, 4, 3}, ks1[1] = {5}, qs1[1] = {2};
  assert_int_equal(sta_tensor_create(&f, STA_F32, STA_CPU, 3, ns), STA_OK);
  s.bl.num = f;
  expect_bad(&s, STA_ERR_DTYPE, "blocks.num: expected i32, got f32");
  s.bl.num = NULL;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.num: expected a tensor, got NULL");
  bad = i32(3, ns2);
  s.bl.num = bad;
  expect_bad(&s, STA_ERR_SHAPE, "blocks.num: expected shape [B=2, heads=3, Mq=3], got [2, 3, 4]");
  s.bl.num = s.num;
  sta_tensor_destroy(bad);
  bad = i32(4, is2);
  s.bl.idx = bad;
  expect_bad(&s, STA_ERR_SHAPE, "blocks.idx: expected shape [B=2, heads=3, Mq=3, L], got [2, 3, 4, 3]");
  assert_int_equal(sta_tensor_narrow(&view, s.idx, 3, 0, 2), STA_OK); /* strided */
  s.bl.idx = view;
  expect_bad(&s, STA_ERR_SHAPE, "blocks.idx: expected a contiguous tensor (row-major)");
  s.bl.idx = s.idx;
  sta_tensor_destroy(bad);
  bad = i32(1, ks1);
  s.bl.kv_sizes = bad;
  expect_bad(&s, STA_ERR_SHAPE, "blocks.kv_sizes: expected shape [Mk=4], got [5]");
  s.bl.kv_sizes = s.ks;
  sta_tensor_destroy(bad);
  bad = i32(1, qs1);
  s.bl.q_sizes = bad;
  expect_bad(&s, STA_ERR_SHAPE, "blocks.q_sizes: expected shape [Mq=3], got [2]");
  s.bl.q_sizes = s.qs;
  sta_tensor_destroy(bad);
  /* k of its own length but another head count; v unlike k */
  int64_t k2[4] = {2, 256, 2, 16}, v2[4] = {2, 192, 3, 16};
  sta_tensor *kk = NULL, *vv = NULL, *k0 = s.t[K], *v0 = s.t[V];
  assert_int_equal(sta_tensor_create(&kk, STA_F32, STA_CPU, 4, k2), STA_OK);
  s.t[K] = kk;
  expect_bad(&s, STA_ERR_SHAPE, "k: shape [B=2, S=256, heads=2, D=16] differs from q's [B=2, S=192, heads=3, D=16] (STA_MASK_BLOCKS: only S may differ)");
  s.t[K] = k0;
  assert_int_equal(sta_tensor_create(&vv, STA_F32, STA_CPU, 4, v2), STA_OK);
  s.t[V] = vv;
  expect_bad(&s, STA_ERR_SHAPE, "v: shape [B=2, S=192, heads=3, D=16] differs from k's [B=2, S=256, heads=3, D=16]");
  s.t[V] = v0;
  /* the backward's dk like k */
  sta_expect_err(sta_attention_backward(&s.d, s.t[Q], s.t[K], s.t[V], s.t[O], s.lse, s.t[DO],
                                        s.t[DQ], s.t[DQ], s.t[DV]), STA_ERR_SHAPE,
                 "dk: shape [B=2, S=192, heads=3, D=16] differs from k's [B=2, S=256, heads=3, D=16]");
  /* sequence parallelism shards the window only */
  sta_comm *cm = NULL;
  assert_int_equal(sta_comm_loopback(&cm, 1), STA_OK);
  sta_attention_desc sp = s.d;
  int32_t w3[3] = {3, 3, 3};
  sta_geometry_init(&sp.geom, 3, 8, 8);
  sp.windows = w3;
  sp.n_windows = 1;
  sta_tensor *k192 = NULL, *v192 = NULL;
  assert_int_equal(sta_tensor_to(&k192, s.t[Q], STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&v192, s.t[Q], STA_F32, STA_CPU), STA_OK);
  sta_expect_err(sta_sp_attention(cm, &sp, s.t[Q], k192, v192, s.t[O]), STA_ERR_UNSUPPORTED,
                 "mask: sequence parallelism runs STA_MASK_WINDOW only, got 1");
  sp.mask = STA_MASK_WINDOW;
  assert_int_equal(sta_sp_attention(cm, &sp, s.t[Q], k192, v192, s.t[DQ]), STA_OK); /* the window runs */
  sta_tensor_destroy(k192);
  sta_tensor_destroy(v192);
  sta_comm_destroy(cm);
  /* i32 is no attention operand */
  sta_tensor *qi = NULL;
  int64_t q4[4] = {2, 192, 3, 16};
  assert_int_equal(sta_tensor_create(&qi, STA_I32, STA_CPU, 4, q4), STA_OK);
  s.t[Q] = qi;
  expect_bad(&s, STA_ERR_DTYPE, "q: expected f32, f16 or bf16, got i32");
  sta_tensor_destroy(qi);
  sta_tensor_destroy(kk);
  sta_tensor_destroy(vv);
  sta_tensor_destroy(view);
  sta_tensor_destroy(f);
  set_free(&s);
}

/* The union's own checks: tiled order, blocks = tiles, no text rows; k
** and v of q's length. */
static void test_union_errors(void **state) {
  (void)state;
  bprob c;
  prob_init(&c, 0, 0, 0);
  prob_union(&c, 6, 8, 12, 2, 4, 4, 3); /* 3x2x3 tiles of 32 rows: 576 */
  c.B = 1;
  bset s;
  set_make(&s, &c);
  assert_int_equal(sta_tensor_fill(s.t[O], 5), STA_OK);
  assert_int_equal(sta_tensor_fill(s.lse, 6), STA_OK);
  s.d.geom.order = STA_ORDER_UNTILED;
  expect_bad(&s, STA_ERR_ARGUMENT, "geom.order: STA_MASK_WINDOW_OR_BLOCKS needs STA_ORDER_TILED "
             "(its blocks are the tiles, tile after tile), got STA_ORDER_UNTILED");
  s.d.geom.order = STA_ORDER_TILED;
  s.bl.block_rows = 64;
  expect_bad(&s, STA_ERR_ARGUMENT, "blocks.block_rows: 64, expected the tile volume 32 or 0 "
             "(STA_MASK_WINDOW_OR_BLOCKS: its blocks are the tiles)");
  s.bl.block_rows = 32;
  s.d.geom.canvas[0] = 4; /* 2x2x3 tiles: 384 rows, then 192 would be text */
  expect_bad(&s, STA_ERR_SHAPE, "q: S = 576, expected the 384 rows of the 2x2x3 tiles "
             "(STA_MASK_WINDOW_OR_BLOCKS takes no text rows)");
  s.d.geom.canvas[0] = 6;
  int32_t even[3] = {2, 1, 1};
  s.d.windows = even;
  expect_bad(&s, STA_ERR_WINDOW, "window: Kt = 2 is even and smaller than the 3 tiles on the t "
             "axis (use an odd window, or >= 3 for the whole axis)");
  s.d.windows = c.window;
  sta_tensor *k0 = s.t[K], *kk = NULL;
  int64_t k2[4] = {1, 608, 2, 16};
  assert_int_equal(sta_tensor_create(&kk, STA_F32, STA_CPU, 4, k2), STA_OK);
  s.t[K] = kk;
  expect_bad(&s, STA_ERR_SHAPE, "k: shape [B=1, S=608, heads=2, D=16] differs from q's "
             "[B=1, S=576, heads=2, D=16]");
  s.t[K] = k0;
  sta_tensor_destroy(kk);
  set_free(&s);
}

int main(void) {
  sta_test_begin(6364136223846793005ull, 1442695040888963407ull);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_reference_by_hand),
    cmocka_unit_test(test_reference_gradient),
    cmocka_unit_test(test_random_lists),
    cmocka_unit_test(test_shapes),
    cmocka_unit_test(test_union),
    cmocka_unit_test(test_dense),
    cmocka_unit_test(test_deterministic),
    cmocka_unit_test(test_flops),
    cmocka_unit_test(test_errors),
    cmocka_unit_test(test_union_errors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
