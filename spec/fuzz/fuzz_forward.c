/*
** fuzz_forward.c -- STA forward argument validation.  The bytes decode a
** small problem: canvas, tile, token order, text length, sequence length,
** batch, heads, head dim, dtypes, layout, per-head windows, scale, an lse
** tensor and deliberate mismatches (shape, dtype, layout).  Invariants: every call
** returns STA_OK or an error with its status and a message; on error out
** and lse are unchanged; on success the forward matches
** sta_attention_reference and the output is finite (inputs are finite).
*/
#include <math.h>

#include "fuzz.h"

static sta_tensor *fz_tensor(sta_dtype dt, int32_t nd, const int64_t *shape, uint64_t seed) {
  sta_tensor *t = NULL;
  if (sta_tensor_create(&t, dt, STA_CPU, nd, shape) != STA_OK) return NULL;
  FUZZ_CHECK(sta_tensor_randn(t, seed, 0.0, 1.0) == STA_OK);
  return t;
}

static int fz_same(const sta_tensor *a, const sta_tensor *b) {
  double m = -1, r;
  FUZZ_CHECK(sta_tensor_compare(a, b, &m, &r) == STA_OK);
  return m == 0.0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_bytes in = {data, size};
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  for (int i = 0; i < 3; i++) d.geom.canvas[i] = (int32_t)(fuzz_take(&in) % 7);   /* 0 bad */
  for (int i = 0; i < 3; i++) d.geom.tile[i] = (int32_t)(fuzz_take(&in) % 6);     /* 0 bad */
  int64_t V = (int64_t)d.geom.canvas[0] * d.geom.canvas[1] * d.geom.canvas[2];
  unsigned flags = fuzz_take(&in);
  if (flags & 8) { /* FastVideo's tiled order: the padded tiles' rows */
    d.geom.order = STA_ORDER_TILED;
    if (d.geom.tile[0] && d.geom.tile[1] && d.geom.tile[2]) V = sta_geometry_video_rows(&d.geom);
  }
  int64_t extra = (int64_t)(fuzz_take(&in) % 12) - 2;       /* < 0: too short */
  int64_t S = V + extra < 0 ? 0 : V + extra;
  int64_t tl = (int64_t)(fuzz_take(&in) % 16) - 2;
  d.geom.text_len = (flags & 1) ? -1 : tl;
  int64_t B = 1 + fuzz_take(&in) % 2, H = fuzz_take(&in) % 4; /* H 0 bad */
  static const int64_t dims[4] = {8, 16, 3, 0};
  int64_t D = dims[fuzz_take(&in) % 4];
  sta_dtype dt = (sta_dtype)(fuzz_take(&in) % 3);
  d.layout = (sta_layout)(fuzz_take(&in) % 3); /* 2 bad */
  unsigned nw = fuzz_take(&in);
  d.n_windows = nw < 200 ? (nw % 2 ? (int32_t)H : 1) : (int32_t)(nw % 6) - 1;
  int32_t win[3 * 8];
  for (int i = 0; i < 3 * 8; i++) win[i] = (int32_t)(fuzz_take(&in) % 8); /* 0, even: bad */
  d.windows = (flags & 2) ? NULL : win;
  unsigned sc = fuzz_take(&in);
  d.scale = sc < 200 ? 0.0f : sc < 250 ? (float)(sc - 199) * 0.05f : sc == 250 ? NAN : INFINITY;
  uint64_t seed = (uint64_t)fuzz_take(&in) << 8 | fuzz_take(&in);
  unsigned mismatch = fuzz_take(&in) % 16; /* 1..4: break one operand */

  int bhsd = d.layout == STA_BHSD;
  int64_t shape[4] = {B, bhsd ? H : S, bhsd ? S : H, D}, other[4];
  memcpy(other, shape, sizeof other);
  other[mismatch == 1 ? 1 : 3] += 1;
  sta_tensor *q = fz_tensor(dt, 4, shape, seed), *k = fz_tensor(dt, 4, shape, seed + 1),
             *v = fz_tensor(mismatch == 2 ? (sta_dtype)((dt + 1) % 3) : dt, 4, shape, seed + 2),
             *out = fz_tensor(dt, 4, mismatch == 1 ? other : shape, seed + 3);
  int64_t ls[3] = {B, H, S + (mismatch == 3)};
  sta_tensor *lse = (flags & 4) ? fz_tensor(mismatch == 4 ? STA_F16 : STA_F32, 3, ls, seed + 4)
                                : NULL;
  sta_tensor *out0 = NULL, *lse0 = NULL;
  if (q && k && v && out) {
    FUZZ_CHECK(sta_tensor_to(&out0, out, sta_tensor_dtype(out), STA_CPU) == STA_OK);
    if (lse) FUZZ_CHECK(sta_tensor_to(&lse0, lse, sta_tensor_dtype(lse), STA_CPU) == STA_OK);
    sta_clear_error();
    sta_status rc = fuzz_status(sta_attention_forward(&d, q, k, v, out, lse));
    if (rc != STA_OK) {
      FUZZ_CHECK(fz_same(out, out0));
      if (lse) FUZZ_CHECK(fz_same(lse, lse0));
      FUZZ_CHECK(sta_status_group(rc) == 100 || rc == STA_ERR_SEQ_LEN);
    } else {
      /* it accepted: the problem was valid */
      FUZZ_CHECK(mismatch == 0 || mismatch > 4 || (mismatch == 3 && !lse) ||
                 (mismatch == 4 && !lse));
      sta_tensor *ref = NULL, *lref = NULL;
      FUZZ_CHECK(sta_tensor_to(&ref, out0, dt, STA_CPU) == STA_OK);
      if (lse) FUZZ_CHECK(sta_tensor_to(&lref, lse0, STA_F32, STA_CPU) == STA_OK);
      FUZZ_CHECK(sta_attention_reference(&d, q, k, v, ref, lref) == STA_OK);
      double m, r;
      FUZZ_CHECK(sta_tensor_compare(out, ref, &m, &r) == STA_OK);
      FUZZ_CHECK(isfinite(m));
      FUZZ_CHECK(m < (dt == STA_F32 ? 1e-4 : 5e-2));
      if (lse && V == sta_geometry_video_tokens(&d.geom)) { /* padding rows' lse: -inf */
        FUZZ_CHECK(sta_tensor_compare(lse, lref, &m, &r) == STA_OK);
        FUZZ_CHECK(isfinite(m) && m < 1e-3);
      }
      sta_tensor_destroy(ref);
      sta_tensor_destroy(lref);
    }
  }
  sta_tensor *all[] = {q, k, v, out, lse, out0, lse0};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) sta_tensor_destroy(all[i]);
  return 0;
}
