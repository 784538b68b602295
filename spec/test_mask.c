/* test_mask.c -- core/mask.h, the mask's one home, against brute force:
** the window rule on every axis of up to 40 tiles, every window (odd and
** even, up to the axis), every query tile; its inverse for every key tile;
** membership; the list accessors.  The kernels and the CPU path include
** the same header, so this is the rule they run. */
#include "test_util.h"

#include "internal.h" /* mask.h */

/* The window of q by definition, not by the formula: of the runs [s, s +
** k) inside [0, c), the one whose centre tile s + k/2 is nearest q (the
** distance is V-shaped in s, so the nearest is unique). */
static int32_t brute_start(int32_t q, int32_t k, int32_t c) {
  int32_t best = -1, bd = 1 << 30;
  for (int32_t s = 0; s + k <= c; s++) {
    int32_t d = abs(s + k / 2 - q);
    if (d < bd) { bd = d; best = s; }
  }
  return best;
}

static void test_window_start(void **state) {
  (void)state;
  int64_t checked = 0;
  for (int32_t c = 1; c <= 40; c++)
    for (int32_t k = 1; k <= c; k++)
      for (int32_t q = 0; q < c; q++) {
        int32_t s = sta_window_start(q, k, c);
        assert_int_equal(s, brute_start(q, k, c));
        assert_true(s >= 0 && s + k <= c); /* every query sees k tiles */
        if (k % 2 == 1) { /* STA.md section 2's centred form */
          int32_t r = k / 2, center = q < r ? r : q > c - 1 - r ? c - 1 - r : q;
          for (int32_t j = 0; j < c; j++)
            assert_int_equal(sta_window_holds(q, j, k, c), abs(j - center) <= r);
        }
        if (q > 0) assert_true(s >= sta_window_start(q - 1, k, c)); /* never decreases */
        checked++;
      }
  assert_int_equal(checked, 40 * 41 * 81 / 6); /* sum over c of c * c */
  for (int32_t c = 1; c <= 40; c++)
    for (int32_t k = 1; k <= 45; k++) {
      assert_int_equal(sta_window_span(k, c), k < c ? k : c);
      assert_int_equal(sta_window_start(c - 1, sta_window_span(k, c), c),
                       c - sta_window_span(k, c));
    }
}

/* The inverse against the loop the backward used to run: every query tile
** whose window holds kt, which must be one range, never empty. */
static void test_window_seen_by(void **state) {
  (void)state;
  int64_t checked = 0;
  for (int32_t c = 1; c <= 40; c++)
    for (int32_t k = 1; k <= c; k++)
      for (int32_t kt = 0; kt < c; kt++) {
        int32_t lo = c, hi = -1, n = 0;
        for (int32_t q = 0; q < c; q++) {
          int32_t s = brute_start(q, k, c);
          int in = kt >= s && kt < s + k;
          assert_int_equal(sta_window_holds(q, kt, k, c), in);
          if (in) {
            if (q < lo) lo = q;
            hi = q;
            n++;
          }
        }
        assert_true(n > 0 && n == hi - lo + 1); /* one range, never empty */
        assert_true(lo <= kt && kt <= hi);      /* a key tile sees itself */
        int32_t a = -9, z = -9;
        sta_window_seen_by(kt, k, c, &a, &z);
        if (a != lo || z != hi)
          fail_msg("c %d k %d kt %d: seen_by [%d, %d], brute force [%d, %d]", (int)c, (int)k,
                   (int)kt, (int)a, (int)z, (int)lo, (int)hi);
        checked++;
      }
  assert_int_equal(checked, 40 * 41 * 81 / 6);
}

/* The public sta_window_range is the rule for valid windows, clamped. */
static void test_window_range_is_the_rule(void **state) {
  (void)state;
  for (int32_t c = 1; c <= 40; c++)
    for (int32_t k = 1; k <= 45; k += 2)
      for (int32_t q = 0; q < c; q++) {
        int32_t s = -1, n = -1;
        assert_int_equal(sta_window_range(q, k, c, &s, &n), STA_OK);
        assert_int_equal(n, sta_window_span(k, c));
        assert_int_equal(s, sta_window_start(q, n, c));
      }
}

/* The list accessors read FastVideo's q2k_num / q2k_idx layout. */
static void test_list_accessors(void **state) {
  (void)state;
  enum { B = 2, H = 3, MQ = 5, L = 4, MK = 7 };
  int32_t num[B * H * MQ], idx[B * H * MQ * L], sizes[MK];
  for (int i = 0; i < B * H * MQ; i++) num[i] = (int32_t)sta_test_rint(0, L);
  for (int i = 0; i < B * H * MQ * L; i++) idx[i] = (int32_t)sta_test_rint(0, MK - 1);
  for (int i = 0; i < MK; i++) sizes[i] = (int32_t)sta_test_rint(1, 64);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int m = 0; m < MQ; m++) {
        int64_t row = sta_list_row(b, h, m, H, MQ);
        assert_int_equal(row, (b * H + h) * MQ + m);
        assert_int_equal(sta_list_count(num, row), num[(b * H + h) * MQ + m]);
        for (int i = 0; i < L; i++)
          assert_int_equal(sta_list_block(idx, L, row, i), idx[((b * H + h) * MQ + m) * L + i]);
      }
  for (int n = 0; n < MK; n++) {
    assert_int_equal(sta_block_valid(sizes, n, 64), sizes[n]);
    assert_int_equal(sta_block_valid(NULL, n, 48), 48);
  }
}

int main(void) {
  sta_test_begin(2654435761ull, 31);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_window_start),
    cmocka_unit_test(test_window_seen_by),
    cmocka_unit_test(test_window_range_is_the_rule),
    cmocka_unit_test(test_list_accessors),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
