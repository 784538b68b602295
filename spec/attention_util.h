/* attention_util.h -- what the CPU forward's tests share (test_attention.c,
** test_attention_hand.c, test_attention_errors.c): inputs in either layout
** and storage order (narrowed, permuted), snapshots, exact comparison.
** Header-only. */
#ifndef STA_ATTENTION_UTIL_H
#define STA_ATTENTION_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"

/* A 4-D tensor [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD) as seen through
** desc layout, stored as: order 0 = contiguous in that layout, order 1 =
** contiguous in the other layout and permuted; pad > 0 = each row of D has
** pad extra elements (a narrowed view). */
typedef struct held {
  sta_tensor *base, *mid, *view;
} held;

static inline void held_free(held *x) {
  sta_tensor_destroy(x->view);
  sta_tensor_destroy(x->mid);
  sta_tensor_destroy(x->base);
  memset(x, 0, sizeof *x);
}

static inline void make4(held *x, sta_dtype dt, sta_layout layout, int order, int64_t pad,
                         int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int store_bshd = (layout == STA_BSHD) != (order == 1);
  int64_t shape[4] = {B, store_bshd ? S : H, store_bshd ? H : S, D + pad};
  memset(x, 0, sizeof *x);
  assert_int_equal(sta_tensor_create(&x->base, dt, STA_CPU, 4, shape), STA_OK);
  assert_int_equal(sta_tensor_narrow(&x->mid, x->base, 3, 0, D), STA_OK);
  if (order == 1) assert_int_equal(sta_tensor_permute(&x->view, x->mid, swap), STA_OK);
  else assert_int_equal(sta_tensor_narrow(&x->view, x->mid, 3, 0, D), STA_OK);
}

/* A copy of t: same shape, contiguous, f32. */
static inline sta_tensor *snapshot(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_to(&c, t, STA_F32, STA_CPU), STA_OK);
  return c;
}

static inline void assert_same(const sta_tensor *a, const sta_tensor *b) {
  double mx = -1, rel = -1;
  assert_int_equal(sta_tensor_compare(a, b, &mx, &rel), STA_OK);
  assert_true(mx == 0.0);
}

/* Contiguous f32 q, k, v of shape (BSHD), drawn from N(0, 1) with seeds
** seed, seed + 1, seed + 2. */
static inline void f32_qkv(const int64_t shape[4], uint64_t seed, sta_tensor **q,
                           sta_tensor **k, sta_tensor **v) {
  sta_tensor **t[3] = {q, k, v};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(sta_tensor_create(t[i], STA_F32, STA_CPU, 4, shape), STA_OK);
    assert_int_equal(sta_tensor_randn(*t[i], seed + (uint64_t)i, 0, 1), STA_OK);
  }
}

#endif
