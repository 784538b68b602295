/* test_bsa_index.c -- the block-sparse kernels' index arithmetic on the
** host, no GPU needed: kernels/bsa_walk.h (the forward's sub-blocks, their
** masks and valid rows, the item order, the union's window box) and
** kernels/bsa_inv.h (the backward's inversion of the lists, the dQ turns,
** every CTA's walk), against the mask written out (blocks_case.h), on
** fresh random lists.  The kernels themselves: test_gpu_blocks.c.
** STA_TEST_SEED fixes the seed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blocks_case.h"
#include "../kernels/bsa_inv.h"

/* bsa_walk.h on the host: every sub-block's loaded rows, mask and valid
** rows (each valid row of the block exactly once, nothing past it read),
** the item order, and the union's window box against the rule. */
static void test_walk(void **state) {
  (void)state;
  for (int32_t bk = 64; bk <= 128; bk += 64)
    for (int32_t bv = bk; bv <= 4 * bk; bv += bk)
      for (int32_t s = 1; s <= bv; s++) {
        int32_t seen[1024] = {0};
        const int32_t ns = bsa_subs(s, bk);
        assert_int_equal(ns, (s + bk - 1) / bk);
        for (int32_t j = 0; j < ns; j++) {
          int32_t r0, lo;
          bsa_sub(s, j, bk, &r0, &lo);
          assert_true(lo >= 0 && lo < bk);
          assert_true(r0 + bk <= s); /* never past the valid rows */
          for (int32_t x = lo; x < bk; x++) {
            assert_true(r0 + x >= 0);
            seen[r0 + x]++;
          }
          for (int32_t x = 0; x < lo; x++) /* masked: zeros before the block, or seen before */
            assert_true(r0 + x < 0 || seen[r0 + x] == 1);
        }
        for (int32_t r = 0; r < s; r++) assert_int_equal(seen[r], 1);
      }
  int64_t item = 0;
  for (int32_t b = 0; b < 2; b++)
    for (int32_t h = 0; h < 3; h++)
      for (int32_t m = 0; m < 5; m++)
        for (int32_t q = 0; q < 2; q++, item++) {
          int32_t xb, xh, xm, xq;
          bsa_item(item, 5, 2, 3, &xb, &xh, &xm, &xq);
          assert_true(xb == b && xh == h && xm == m && xq == q);
        }
  assert_int_equal(bsa_part_rows(200, 0, 128), 128);
  assert_int_equal(bsa_part_rows(200, 1, 128), 72);
  assert_int_equal(bsa_part_rows(100, 1, 128), 0);
  for (int it = 0; it < 200; it++) {
    int32_t g[3], st[3], k[3];
    int16_t win[3];
    for (int a = 0; a < 3; a++) {
      g[a] = (int32_t)sta_test_rint(1, 7);
      win[a] = (int16_t)sta_test_rint(1, g[a]);
    }
    const int32_t tiles = g[0] * g[1] * g[2], m = (int32_t)sta_test_rint(0, tiles - 1);
    bsa_window_box(m, g, win, st, k);
    int32_t cnt = 0;
    for (int32_t n = 0; n < tiles; n++) {
      int want = in_window(m / (g[1] * g[2]), n / (g[1] * g[2]), win[0], g[0]) &&
                 in_window(m / g[2] % g[1], n / g[2] % g[1], win[1], g[1]) &&
                 in_window(m % g[2], n % g[2], win[2], g[2]);
      assert_int_equal(bsa_window_has(n, g, st, k), want);
      cnt += want;
    }
    assert_int_equal(cnt, k[0] * k[1] * k[2]);
    for (int32_t e = 0; e < cnt; e++) {
      const int32_t n = bsa_window_tile(e, g, st, k);
      assert_true(bsa_window_has(n, g, st, k));
      if (e) assert_true(n > bsa_window_tile(e - 1, g, st, k)); /* tile order */
    }
  }
}

/* The backward's inversion and walks (bsa_inv.h) emulated on the host, as
** bsa_bwd_api.cu's kernels and kernel_bsa_bwd.cuh's producer run them: the
** bitmaps from bsa_inv_entry, counts, the exclusive scan, the fill in bit
** order and the ranks; then every CTA's walk.  Against the mask written
** out (blocks_case.h's sees): each key block's query blocks ascending, each
** query block's ranks 0, 1, .. in key block order (so the deterministic
** turns of every dQ block are a permutation of 0 .. adds - 1: no CTA waits
** for a turn nobody takes), every walk as long as its count, every (query
** block, part) once per CTA, slots in range; the dQ staging a bijection. */
static void test_inverse(void **state) {
  (void)state;
  for (int32_t W = 32; W <= 64; W *= 2) {
    char *hit = calloc((size_t)(64 * W), 1);
    assert_non_null(hit);
    for (int32_t r = 0; r < 64; r++)
      for (int32_t c = 0; c < W; c++) {
        const int32_t o = bsa_dq_off(W, r, c);
        assert_true(o >= 0 && o < 64 * W && !hit[o]);
        hit[o] = 1;
        if (c % 2 == 0) assert_int_equal(bsa_dq_off(W, r, c + 1), o + 1); /* float2 pairs */
      }
    free(hit);
  }
  static const int32_t bvs[] = {64, 128, 256, 384};
  for (int it = 0; it < 300; it++) {
    kcase c;
    const int32_t bv = bvs[sta_test_rint(0, 3)];
    if (sta_test_rint(0, 3) == 0) {
      uni_init(&c, bv, (int32_t)sta_test_rint(1, 4), (int32_t)sta_test_rint(1, 3),
               (int32_t)sta_test_rint(1, 4), sta_test_rint(1, 5));
      c.H = sta_test_rint(1, MAXH);
    } else {
      case_init(&c, bv, sta_test_rint(1, 40), sta_test_rint(1, 70), 1);
      c.L = sta_test_rint(1, c.Mk + 2);
      c.H = sta_test_rint(1, MAXH);
    }
    c.B = sta_test_rint(1, 2);
    const int64_t BH = c.B * c.H, Mq = c.Mq, Mk = c.Mk, L = c.L;
    const int64_t wq = (Mq + 31) / 32, wk = (Mk + 31) / 32;
    /* the lists, as make_lists draws them (host only) */
    lists x;
    memset(&x, 0, sizeof x);
    x.num = calloc((size_t)(BH * Mq), 4);
    x.idx = calloc((size_t)(BH * Mq * L), 4);
    x.qs = calloc((size_t)Mq, 4);
    int32_t *perm = calloc((size_t)Mk, 4);
    assert_true(x.num && x.idx && x.qs && perm);
    for (int64_t r = 0; r < BH * Mq; r++) {
      const int64_t most = L < Mk ? L : Mk;
      const int64_t nn = sta_test_rint(0, 4) == 0 ? 0 : sta_test_rint(0, most);
      for (int64_t i = 0; i < Mk; i++) perm[i] = (int32_t)i;
      for (int64_t i = 0; i < nn; i++) {
        const int64_t j = sta_test_rint(i, Mk - 1);
        const int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        x.idx[r * L + i] = perm[i];
      }
      for (int64_t i = nn; i < L; i++) x.idx[r * L + i] = -1;
      x.num[r] = (int32_t)nn;
    }
    const int sizes = (int)sta_test_rint(0, 1);
    for (int64_t m = 0; m < Mq; m++) x.qs[m] = sizes ? (int32_t)sta_test_rint(1, bv) : bv;
    const int32_t *qsz = sizes ? x.qs : NULL;
    int16_t win[3 * MAXH];
    int32_t nwmax = 0;
    for (int64_t h = 0; c.uni && h < c.H; h++) {
      for (int a = 0; a < 3; a++)
        win[3 * h + a] = (int16_t)(c.win[3 * h + a] < c.grid[a] ? c.win[3 * h + a] : c.grid[a]);
      const int32_t v = win[3 * h] * win[3 * h + 1] * win[3 * h + 2];
      nwmax = v > nwmax ? v : nwmax;
    }
    /* 1. set */
    uint32_t *kq = calloc((size_t)(BH * Mk * wq), 4), *qk = calloc((size_t)(BH * Mq * wk), 4);
    assert_true(kq && qk);
    for (int64_t row = 0; row < BH * Mq; row++)
      for (int64_t i = 0; i < L + nwmax; i++) {
        const int64_t bh = row / Mq;
        const int32_t m = (int32_t)(row % Mq);
        const int32_t n = bsa_inv_entry(i, L, i < L ? x.num[row] : 0, x.idx + row * L, c.uni, m,
                                        c.grid, win + 3 * (bh % c.H));
        if (n < 0) continue;
        assert_true(n < Mk);
        kq[(bh * Mk + n) * wq + (m >> 5)] |= 1u << (m & 31);
        qk[(bh * Mq + m) * wk + (n >> 5)] |= 1u << (n & 31);
      }
    /* 2., 3. count, exclusive scan */
    int32_t *off = calloc((size_t)(BH * Mk + 1), 4);
    assert_non_null(off);
    for (int64_t w = 0; w < BH * Mk; w++) {
      int32_t cnt = 0;
      for (int64_t y = 0; y < wq; y++) cnt += bsa_popc(kq[w * wq + y]);
      off[w + 1] = off[w] + cnt;
    }
    /* 4. fill, ranks */
    int32_t *k2q = calloc((size_t)(off[BH * Mk] + 1), 4), *rank = calloc((size_t)(off[BH * Mk] + 1), 4);
    assert_true(k2q && rank);
    for (int64_t w = 0; w < BH * Mk; w++) {
      int32_t p = off[w];
      const int64_t bh = w / Mk;
      const int32_t n = (int32_t)(w % Mk);
      for (int32_t m = 0; m < Mq; m++)
        if (kq[w * wq + (m >> 5)] >> (m & 31) & 1u) {
          k2q[p] = m;
          rank[p++] = bsa_inv_rank(qk + (bh * Mq + m) * wk, n);
        }
      assert_int_equal(p, off[w + 1]);
    }
    /* against the mask; the walks; the turns */
    const int32_t subs = bv == 64 ? 1 : bv / 128, nslots = (int32_t)(Mq * (bv / 64));
    const int64_t TM = Mk * subs; /* turns of a dQ block: fewer than key blocks x parts */
    int32_t *adds = calloc((size_t)(BH * nslots), 4), *turns = calloc((size_t)(BH * nslots * TM), 4);
    assert_true(adds && turns);
    for (int64_t bh = 0; bh < BH; bh++)
      for (int32_t m = 0; m < Mq; m++) {
        int32_t r = 0;
        for (int32_t n = 0; n < Mk; n++) {
          const int see = sees(&c, &x, bh / c.H, bh % c.H, m, n);
          int32_t at = -1;
          for (int32_t e = off[bh * Mk + n]; e < off[bh * Mk + n + 1]; e++)
            if (k2q[e] == m) at = e;
          assert_int_equal(at >= 0, see);
          if (!see) continue;
          assert_int_equal(rank[at], r++);
        }
      }
    for (int64_t bh = 0; bh < BH; bh++)
      for (int32_t n = 0; n < Mk; n++) {
        const int32_t e0 = off[bh * Mk + n], e1 = off[bh * Mk + n + 1];
        for (int32_t e = e0 + 1; e < e1; e++) assert_true(k2q[e] > k2q[e - 1]); /* ascending */
        for (int32_t kj = 0; kj < subs; kj++) {
          const int32_t cnt = bsa_qwalk_count(e0, e1, k2q, qsz, bv);
          bsa_qwalk w;
          bsa_qwalk_start(&w, e0, e1, k2q, qsz, bv);
          int32_t steps = 0, last = -1;
          for (; steps < cnt; steps++, bsa_qwalk_next(&w, k2q, qsz, bv)) {
            assert_true(w.e < e1);
            const int32_t slot = w.m * (bv / 64) + w.j, qs = qsz ? qsz[w.m] : bv;
            assert_true(slot > last && slot < nslots); /* each part once, in order */
            last = slot;
            assert_true(w.j == 0 || qs - 64 * w.j > 0); /* a part past the rows: only the first */
            const int32_t t = rank[w.e] * subs + kj;
            assert_true(t >= 0 && t < TM);
            turns[(bh * nslots + slot) * TM + t]++;
            adds[bh * nslots + slot]++;
          }
          assert_int_equal(w.e, e1); /* the walk ends where the count does */
        }
      }
    for (int64_t s = 0; s < BH * nslots; s++) /* the turns of a dQ block: 0 .. adds - 1 once */
      for (int64_t t = 0; t < TM; t++) assert_int_equal(turns[s * TM + t], t < adds[s] ? 1 : 0);
    free(kq); free(qk); free(off); free(k2q); free(rank); free(adds); free(turns);
    free(x.num); free(x.idx); free(x.qs); free(perm);
  }
}

int main(void) {
  sta_test_begin(2862933555777941757ull, 3037000493ull);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_walk),
      cmocka_unit_test(test_inverse),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
