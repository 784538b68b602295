/* test_fp8.c -- STA_PRECISION_FP8 on the CPU (core/cpu_fp8.c): the e4m3
** and int8 codes against brute force, the f8e4m3 dtype, the quantize
** pre-pass's invariants and key layout, sta_attention_forward_fp8, every
** error path, a layer.  The forward's accuracy is test_fp8_accuracy.c's;
** the GPU side (the pre-pass bit for bit, the kernel against this
** reference) test_gpu_fp8.c's. */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"
#include "fp8_prob.h"

#define OK(call) assert_int_equal((call), STA_OK)
/* ---- codes ------------------------------------------------------------------ */

/* The value of e4m3 code c from its fields (independent of the library). */
static double e4m3_value(int c) {
  int e = (c >> 3) & 15, m = c & 7;
  double v = e == 0 ? m / 8.0 * ldexp(1, -6) : (1 + m / 8.0) * ldexp(1, e - 7);
  return (c & 0x80) ? -v : v;
}

/* The code brute force gives x: the nearest finite code, ties to the even
** mantissa, beyond 448 saturated. */
static int e4m3_nearest(double x) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f || c == 0x80) continue; /* NaN; -0 */
    double d = fabs(e4m3_value(c) - x);
    if (d < bd || (d == bd && (c & 1) == 0)) { bd = d; best = c; }
  }
  if (fabs(x) > 448) best = x > 0 ? 0x7e : 0xfe;
  return best;
}

static void test_e4m3_codes(void **state) {
  (void)state;
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;
    double v = e4m3_value(c);
    if ((double)sta_e4m3_to_f32((uint8_t)c) != v) bad++;
    if (c != 0x80 && sta_f32_to_e4m3((float)v) != c) bad++;
    if (c == 0x7e || c == 0xfe || (c & 0x7f) == 0x7e) continue;
    double next = e4m3_value(c + (v >= 0 && c < 0x80 ? 1 : 0));
    if (c >= 0x80 || c + 1 > 0x7e) continue;
    double mid = (v + next) / 2; /* exact in float: 5 significant bits */
    float probes[5] = {(float)mid, nextafterf((float)mid, 0), nextafterf((float)mid, 1000),
                       nextafterf((float)v, 1000), nextafterf((float)next, 0)};
    for (int i = 0; i < 5; i++)
      for (int s = -1; s <= 1; s += 2) {
        int want = e4m3_nearest(s * (double)probes[i]);
        if (s < 0 && want == 0) want = 0x80;          /* -0 */
        if (sta_f32_to_e4m3(s * probes[i]) != want) {
          if (bad++ < 5)
            print_message("e4m3(%.9g) = 0x%02x, brute force 0x%02x\n", s * (double)probes[i],
                          sta_f32_to_e4m3(s * probes[i]), want);
        }
      }
  }
  assert_int_equal(bad, 0);
  assert_int_equal(sta_f32_to_e4m3(448.0f), 0x7e);
  assert_int_equal(sta_f32_to_e4m3(463.9f), 0x7e);
  assert_int_equal(sta_f32_to_e4m3(464.0f), 0x7e); /* the tie rounds to 480: saturated */
  assert_int_equal(sta_f32_to_e4m3(1e30f), 0x7e);
  assert_int_equal(sta_f32_to_e4m3(-INFINITY), 0xfe);
  assert_int_equal(sta_f32_to_e4m3(NAN), 0x7f);
  assert_true(isnan(sta_e4m3_to_f32(0x7f)) && isnan(sta_e4m3_to_f32(0xff)));
  assert_int_equal(sta_f32_to_e4m3(0x1p-10f), 0x00);   /* half the smallest: even */
  assert_int_equal(sta_f32_to_e4m3(0x1.8p-9f * 1.0f), 0x02); /* 1.5 steps: even (2) */
  assert_int_equal(sta_f32_to_e4m3(0x1p-12f), 0x00);
}

/* A code's scale m / 127 as the GPU pre-pass takes it (sta_fp8_scale127:
** a product and two fmas) has the division's bits for every finite m >= 0
** -- all 2^31 of them, so the device's IEEE operations can stand in for
** the host's division -- and is the division for Inf and NaN. */
static void test_fp8_scale127(void **state) {
  (void)state;
  long long bad = 0;
  uint32_t first = 0;
  #pragma omp parallel for schedule(static) reduction(+ : bad)
  for (int64_t u = 0; u <= 0x7f7fffffLL; u++) {
    const uint32_t w = (uint32_t)u;
    float m, q, d;
    memcpy(&m, &w, 4);
    q = sta_fp8_scale127(m);
    d = m / 127.0f;
    if (memcmp(&q, &d, 4) != 0) {
      if (!bad) __atomic_store_n(&first, w, __ATOMIC_RELAXED);
      bad++;
    }
  }
  if (bad) fail_msg("sta_fp8_scale127: %lld finite m differ from m / 127, e.g. bits 0x%08x", bad,
                    (unsigned)first);
  assert_true(sta_fp8_scale127(INFINITY) == INFINITY);
  assert_true(isnan(sta_fp8_scale127(NAN)));
  assert_true(sta_fp8_scale127(127.0f) == 1.0f && sta_fp8_scale127(0.0f) == 0.0f);
}

static void test_int8_codes(void **state) {
  (void)state;
  static const struct { float f; int c; } t[] = {
    {0.5f, 0}, {1.5f, 2}, {2.5f, 2}, {-2.5f, -2}, {-3.5f, -4}, {126.5f, 126}, {127.4f, 127},
    {300.0f, 127}, {-1e9f, -127}, {0.49999997f, 0}, {-0.0f, 0}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (sta_f32_to_i8(t[i].f) != t[i].c)
      fail_msg("int8(%g) = %d, wanted %d", (double)t[i].f, sta_f32_to_i8(t[i].f), t[i].c);
  assert_int_equal(sta_f32_to_i8(NAN), 0);
  for (int i = -1270; i <= 1270; i++) { /* against rint (nearest even) */
    float f = (float)i / 10.0f;
    assert_int_equal(sta_f32_to_i8(f), (int)rintf(f));
  }
}

/* ---- the dtype -------------------------------------------------------------- */

static void test_f8_dtype(void **state) {
  (void)state;
  sta_dtype dt = STA_F32;
  OK(sta_dtype_parse("f8e4m3", &dt));
  assert_int_equal(dt, STA_F8E4M3);
  OK(sta_dtype_parse("float8_e4m3fn", &dt));
  assert_int_equal(dt, STA_F8E4M3);
  assert_string_equal(sta_dtype_name(STA_F8E4M3), "f8e4m3");
  assert_int_equal(sta_dtype_size(STA_F8E4M3), 1);
  EXPECT_ERR(sta_dtype_parse("f8", &dt), STA_ERR_DTYPE,
             "dtype: unknown dtype 'f8' (expected f32, f16, bf16, f8e4m3 or i32)");
  int64_t shape[2] = {7, 33};
  sta_tensor *a = NULL, *b = NULL, *c = NULL;
  OK(sta_tensor_create(&a, STA_F32, STA_CPU, 2, shape));
  OK(sta_tensor_randn(a, 11, 0.0, 200.0)); /* past 448 too */
  OK(sta_tensor_to(&b, a, STA_F8E4M3, STA_CPU));
  OK(sta_tensor_to(&c, b, STA_F32, STA_CPU));
  const float *x = sta_tensor_data(a), *y = sta_tensor_data(c);
  const uint8_t *z = sta_tensor_data(b);
  int sat = 0;
  for (int64_t i = 0; i < 7 * 33; i++) {
    assert_int_equal(z[i], e4m3_nearest(x[i]) == 0 && x[i] < 0 ? 0x80 : e4m3_nearest(x[i]));
    assert_true(y[i] == (float)e4m3_value(z[i]));
    sat += fabsf(x[i]) > 448;
  }
  assert_true(sat > 0);
  int64_t idx[2] = {3, 5};
  double v = 0;
  OK(sta_tensor_set(b, idx, 0.3));
  OK(sta_tensor_get(b, idx, &v));
  assert_true(v == 0.3125); /* 0.3 -> 1.25 * 2^-2 */
  /* host elementwise operations compute in float and store e4m3 */
  OK(sta_tensor_scale(b, 2.0));
  OK(sta_tensor_get(b, idx, &v));
  assert_true(v == 0.625);
  char dir[256];
  assert_int_equal(sta_test_mkdtemp(dir, sizeof dir, "fp8"), 0);
  EXPECT_ERR(sta_npy_save(b, sta_test_path(dir, "b.npy")), STA_ERR_DTYPE,
             "t: .npy has no f8e4m3 type (convert it with sta_tensor_to to f32 first)");
  const char *names[1] = {"b"};
  const sta_tensor *ts[1] = {b};
  OK(sta_safetensors_save(sta_test_path(dir, "b.safetensors"), 1, names, ts));
  sta_safetensors *f = NULL;
  sta_tensor *r = NULL;
  OK(sta_safetensors_open(&f, sta_test_path(dir, "b.safetensors")));
  OK(sta_safetensors_read(f, "b", &r));
  assert_int_equal(sta_tensor_dtype(r), STA_F8E4M3);
  assert_memory_equal(sta_tensor_data(r), sta_tensor_data(b), 7 * 33);
  sta_safetensors_close(f);
  sta_test_rmdir(dir);
  sta_tensor_destroy(a); sta_tensor_destroy(b); sta_tensor_destroy(c); sta_tensor_destroy(r);
}

/* ---- the pre-pass ------------------------------------------------------------ */

static void test_fp8_quantizer(void **state) {
  (void)state;
  static const int32_t cv[3] = {7, 13, 11}, w1[3] = {1, 1, 1};
  prob p;
  prob_make(&p, cv, TILE, 12, 7, 1, 2, 64, 1, w1, STA_F32, STA_BSHD, STA_ORDER_UNTILED, 1, 21);
  sta_tensor *o = new_like(p.q, STA_F32, 0);
  sta_attn_params ap;
  OK(sta_attn_resolve(&p.d, p.q, p.k, p.v, o, NULL, &ap));
  sta_fp8_geom g;
  sta_fp8_geom_init(&g, &ap);
  assert_int_equal(g.tiled_video, 2 * 2 * 2 * 384);
  assert_int_equal(g.rows, g.tiled_video + 12);
  assert_int_equal(g.keys_end, g.tiled_video + 7);
  sta_fp8_ops ops;
  OK(sta_fp8_ops_alloc(&ops, 1, 2, g.rows, 64));
  OK(sta_cpu_fp8_quantize(&ap, &ops));
  const float *q = sta_tensor_data(p.q), *k = sta_tensor_data(p.k), *v = sta_tensor_data(p.v);
  int64_t R = g.rows, nq = 0, nk = 0, V = 7 * 13 * 11;
  for (int64_t h = 0; h < 2; h++) {
    double mean[64] = {0};
    int64_t cnt = 0;
    for (int64_t s = 0; s < V + 7; s++, cnt++)
      for (int c = 0; c < 64; c++) mean[c] += k[(s * 2 + h) * 64 + c];
    for (int c = 0; c < 64; c++) {
      assert_true(fabs(ops.k_mean[h * 64 + c] - mean[c] / (double)cnt) < 1e-6);
      assert_true(abs(ops.eq[h * 64 + c]) <= 3); /* the outlier channels move some */
    }
    float gscale = -1.0f; /* the key group's k_scale (-1: no key yet) */
    int g127 = 0;         /* a key of the group has a code +-127 */
    for (int64_t r = 0; r < R; r++) {
      if (r % STA_FP8_KGROUP == 0) { /* the last group's amax mapped to 127 */
        assert_true(gscale < 0 || g127);
        gscale = -1.0f;
        g127 = 0;
      }
      /* k8 and k_scale in the kernel's key layout */
      int64_t s = sta_fp8_source(&g, r), row = h * R + r, kr = h * R + sta_fp8_kslot(r, R);
      if (s < 0) { /* padding: all zero */
        assert_true(ops.q_scale[row] == 0 && ops.k_scale[kr] == 0 && ops.q_bias[row] == 0);
        for (int c = 0; c < 64; c++) assert_true(ops.q8[row * 64 + c] == 0);
        continue;
      }
      nq++;
      int maxq = 0, maxk = 0;
      double bias = 0;
      for (int c = 0; c < 64; c++) {
        float e = ldexpf(1.0f, ops.eq[h * 64 + c]);
        float x = q[(s * 2 + h) * 64 + c] * e, got = ops.q8[row * 64 + c] * ops.q_scale[row];
        assert_true(fabsf(got - x) <= 0.5f * ops.q_scale[row] * 1.0001f);
        maxq = abs(ops.q8[row * 64 + c]) > maxq ? abs(ops.q8[row * 64 + c]) : maxq;
        bias += (double)q[(s * 2 + h) * 64 + c] * ops.k_mean[h * 64 + c];
        if (r >= g.keys_end) continue;
        float kx = (k[(s * 2 + h) * 64 + c] - ops.k_mean[h * 64 + c]) / e;
        assert_true(fabsf(ops.k8[kr * 64 + c] * ops.k_scale[kr] - kx) <=
                    0.5f * ops.k_scale[kr] * 1.0001f);
        maxk = abs(ops.k8[kr * 64 + c]) > maxk ? abs(ops.k8[kr * 64 + c]) : maxk;
        float y = v[(s * 2 + h) * 64 + c] / ops.v_scale[h * 64 + c];
        float v8 = sta_e4m3_to_f32(ops.v8[(h * 64 + c) * R + r]);
        assert_true(fabsf(v8 - y) <= fabsf(y) * 0x1p-4f + 0x1p-10f); /* half a step */
      }
      assert_int_equal(maxq, 127); /* the row's amax maps to 127 */
      assert_true(fabs(ops.q_bias[row] - bias) <= 1e-5 * (fabs(bias) + 1));
      if (r < g.keys_end) { /* one k_scale for the group's keys */
        if (gscale < 0) gscale = ops.k_scale[kr];
        assert_true(ops.k_scale[kr] == gscale);
        g127 |= maxk == 127;
        nk++;
      } else {
        assert_true(ops.k_scale[kr] == 0);
      }
    }
    assert_true(gscale < 0 || g127);
  }
  assert_int_equal(nq, 2 * (V + 12));
  assert_int_equal(nk, 2 * (V + 7));
  sta_fp8_ops_free(&ops);
  free((void *)ap.windows);
  sta_tensor_destroy(o);
  prob_free(&p);
}

/* The key layout (sta_fp8_ops' k8 and k_scale, what test_fp8_quantizer
** reads through it): sta_fp8_col_key and sta_fp8_kslot inverse
** permutations within each 16 keys, the partial last 16 in order, every
** row once. */
static void test_fp8_key_layout(void **state) {
  (void)state;
  for (int c = 0; c < 16; c++) {
    assert_int_equal(sta_fp8_kslot(sta_fp8_col_key(c), 16), c);
    assert_int_equal(sta_fp8_col_key(c + 32), sta_fp8_col_key(c) + 32);
  }
  assert_int_equal(sta_fp8_col_key(2), 4);  /* a thread's columns 2t, 2t+1, 8+2t: keys 4t.. */
  assert_int_equal(sta_fp8_col_key(8), 2);
  assert_int_equal(sta_fp8_kslot(17, 20), 17); /* the partial last 16: in order */
  static const int64_t rows[3] = {16, 3084, 37};
  for (int i = 0; i < 3; i++) {
    const int64_t R = rows[i];
    char *seen = calloc((size_t)R, 1);
    int64_t moved = 0;
    for (int64_t r = 0; r < R; r++) {
      const int64_t k = sta_fp8_kslot(r, R);
      assert_true(k >= 0 && k < R && !seen[k]);
      assert_true((k & ~15) == (r & ~15));
      seen[k] = 1;
      moved += k != r;
    }
    assert_true(moved > R / 2);
    free(seen);
  }
}

/* ---- 8-bit operands ------------------------------------------------------------ */

/* q8, k8, v8 and scales from p's q, k, v: per-row scales of q and k (k's a
** stride-0 view: one per head), per-channel of v. */
typedef struct q8set {
  sta_tensor *x8[3], *qs, *ks, *ksb, *vs, *deq[3];
} q8set;

static void q8_make(q8set *s, const prob *p) {
  memset(s, 0, sizeof *s);
  int64_t rs[3] = {p->B, p->H, p->S}, cs[3] = {p->B, p->H, p->D}, one[1] = {p->B * p->H};
  OK(sta_tensor_create(&s->qs, STA_F32, STA_CPU, 3, rs));
  OK(sta_tensor_create(&s->ksb, STA_F32, STA_CPU, 1, one));
  int64_t st0[3] = {p->H, 1, 0};
  OK(sta_tensor_view(&s->ks, s->ksb, 0, 3, rs, st0));
  OK(sta_tensor_create(&s->vs, STA_F32, STA_CPU, 3, cs));
  float *qs = sta_tensor_data(s->qs), *ksb = sta_tensor_data(s->ksb), *vs = sta_tensor_data(s->vs);
  for (int64_t i = 0; i < p->B * p->H * p->S; i++) qs[i] = 0.01f + 0.001f * (float)(i % 17);
  for (int64_t i = 0; i < p->B * p->H; i++) ksb[i] = 0.02f * (float)(i + 1);
  for (int64_t i = 0; i < p->B * p->H * p->D; i++) vs[i] = 0.005f * (float)(1 + i % 5);
  const sta_tensor *src[3] = {p->q, p->k, p->v};
  sta_bshd b;
  OK(sta_tensor_bshd(p->q, p->d.layout, "q", &b));
  for (int i = 0; i < 3; i++) {
    OK(sta_tensor_to(&s->deq[i], src[i], STA_F32, STA_CPU));
    OK(sta_tensor_create(&s->x8[i], STA_F8E4M3, STA_CPU, 4, s->deq[i]->shape));
    float *f = sta_tensor_data(s->deq[i]);
    uint8_t *c = sta_tensor_data(s->x8[i]);
    for (int64_t x = 0; x < p->B * p->S * p->H; x++) {
      int64_t bb = x / (p->S * p->H), r = (x / p->H) % p->S, h = x % p->H;
      int64_t off = bb * b.sb + r * b.ss + h * b.sh;
      for (int64_t d = 0; d < p->D; d++) {
        float sc = i == 0 ? qs[(bb * p->H + h) * p->S + r] : i == 1 ? ksb[bb * p->H + h]
                                                                    : vs[(bb * p->H + h) * p->D + d];
        c[off + d] = sta_f32_to_e4m3(f[off + d] / sc);
        f[off + d] = sta_e4m3_to_f32(c[off + d]) * sc;
      }
    }
  }
}

static void q8_free(q8set *s) {
  for (int i = 0; i < 3; i++) { sta_tensor_destroy(s->x8[i]); sta_tensor_destroy(s->deq[i]); }
  sta_tensor_destroy(s->qs); sta_tensor_destroy(s->ks); sta_tensor_destroy(s->ksb);
  sta_tensor_destroy(s->vs);
}

static void test_fp8_prequantized(void **state) {
  (void)state;
  static const int32_t cv[3] = {7, 9, 10};
  for (int lay = 0; lay < 2; lay++) {
    prob p;
    prob_make(&p, cv, TILE, 5, -1, 1, 2, 64, 1, W333, STA_F32, (sta_layout)lay,
              STA_ORDER_UNTILED, 0, 31);
    q8set s;
    q8_make(&s, &p);
    sta_tensor *o = new_like(p.q, STA_BF16, NAN), *l = new_lse(&p, NAN);
    sta_tensor *o2 = new_like(p.q, STA_F32, NAN), *l2 = new_lse(&p, NAN), *ob = NULL;
    OK(sta_attention_forward_fp8(&p.d, s.x8[0], s.x8[1], s.x8[2], s.qs, s.ks, s.vs, o, l));
    OK(sta_attention_forward(&p.d, s.deq[0], s.deq[1], s.deq[2], o2, l2));
    OK(sta_tensor_to(&ob, o2, STA_BF16, STA_CPU));
    assert_memory_equal(sta_tensor_data(o), sta_tensor_data(ob), (size_t)sta_tensor_numel(o) * 2);
    assert_memory_equal(sta_tensor_data(l), sta_tensor_data(l2), (size_t)sta_tensor_numel(l) * 4);
    sta_tensor_destroy(o); sta_tensor_destroy(l); sta_tensor_destroy(o2); sta_tensor_destroy(l2);
    sta_tensor_destroy(ob);
    q8_free(&s);
    prob_free(&p);
  }
}

/* The reference's softmax step (sta_fp8_set_step_test, core/cpu_fp8.c) on
** a D 64 problem, whose scheme takes whole blocks of 128 keys
** (sta_fp8_step, as the CUDA kernel at D 64): halves of 64 (D 128's step)
** move the running maximum more often, so rows that see more than one
** block get other bits at the same accuracy; other values are ignored, 0
** restores the scheme's bits, and a step set for one head dim leaves the
** other's. */
static void test_fp8_step(void **state) {
  (void)state;
  static const int32_t cv[3] = {6, 8, 16}; /* two tiles: 768 keys a row, 6 blocks */
  prob p;
  prob_make(&p, cv, TILE, 0, -1, 1, 2, 64, 1, W333, STA_F32, STA_BSHD, STA_ORDER_UNTILED, 0, 77);
  assert_int_equal(sta_fp8_step(64), STA_FP8_BK);
  assert_int_equal(sta_fp8_step(128), STA_FP8_STEP);
  const int32_t steps[5] = {0, STA_FP8_STEP, 100, 0, STA_FP8_BK}; /* 100: ignored, 64 stays */
  sta_tensor *o[5], *l[5];
  for (int i = 0; i < 5; i++) {
    o[i] = new_like(p.q, STA_F32, NAN);
    l[i] = new_lse(&p, NAN);
    sta_fp8_set_step_test(0, steps[i]);
    OK(sta_attention_forward(&p.d, p.q, p.k, p.v, o[i], l[i]));
  }
  sta_fp8_set_step_test(0, 0);
  const size_t no = (size_t)sta_tensor_numel(o[0]) * 4, nl = (size_t)sta_tensor_numel(l[0]) * 4;
  assert_memory_equal(sta_tensor_data(o[0]), sta_tensor_data(o[3]), no);
  assert_memory_equal(sta_tensor_data(l[0]), sta_tensor_data(l[3]), nl);
  assert_memory_equal(sta_tensor_data(o[0]), sta_tensor_data(o[4]), no);
  assert_memory_equal(sta_tensor_data(o[1]), sta_tensor_data(o[2]), no);
  assert_true(memcmp(sta_tensor_data(o[0]), sta_tensor_data(o[1]), no) != 0);
  double rel, cos;
  rel_cos(o[1], o[0], &rel, &cos);
  /* P rounds to e4m3 against another maximum: about 1e-2 apart, a third of
  ** the scheme's own error against float (3.8e-2 on randn) */
  if (!(rel > 0 && rel < 2.5e-2)) fail_msg("step 64 against 128: rel L2 %.4g", rel);
  { /* a head dim's own step: 64 set at D 128 leaves this D 64 problem's
    ** bits, 64 set at D 64 gives halves' */
    sta_tensor *x = new_like(p.q, STA_F32, NAN);
    sta_fp8_set_step_test(128, STA_FP8_STEP);
    OK(sta_attention_forward(&p.d, p.q, p.k, p.v, x, NULL));
    assert_memory_equal(sta_tensor_data(o[0]), sta_tensor_data(x), no);
    sta_fp8_set_step_test(64, STA_FP8_STEP);
    OK(sta_attention_forward(&p.d, p.q, p.k, p.v, x, NULL));
    assert_memory_equal(sta_tensor_data(o[1]), sta_tensor_data(x), no);
    sta_fp8_set_step_test(0, 0);
    sta_tensor_destroy(x);
  }
  sta_fp8_set_step_test(0, STA_FP8_STEP); /* the same accuracy against the double reference */
  check_fp8(&p, STA_F32, 0.0, 6e-2, 0.998, 2e-2, "fp8, steps of 64 keys at D 64");
  sta_fp8_set_step_test(0, 0);
  for (int i = 0; i < 5; i++) {
    sta_tensor_destroy(o[i]);
    sta_tensor_destroy(l[i]);
  }
  prob_free(&p);
}

/* ---- errors ------------------------------------------------------------------ */

static void expect_unchanged(const sta_tensor *t, double v) {
  sta_tensor *c = NULL;
  OK(sta_tensor_to(&c, t, STA_F32, STA_CPU));
  const float *x = sta_tensor_data(c);
  for (int64_t i = 0; i < sta_tensor_numel(c); i++)
    if (!(x[i] == (float)v)) fail_msg("element %lld changed to %g", (long long)i, (double)x[i]);
  sta_tensor_destroy(c);
}

static void test_fp8_errors(void **state) {
  (void)state;
  static const int32_t cv[3] = {6, 8, 8};
  prob p;
  prob_make(&p, cv, TILE, 4, -1, 1, 2, 32, 1, W333, STA_F32, STA_BSHD, STA_ORDER_UNTILED, 0, 3);
  sta_tensor *o = new_like(p.q, STA_F32, 5), *l = new_lse(&p, 5);
  sta_attention_desc d = p.d;
  d.precision = (sta_precision)2;
  EXPECT_ERR(sta_attention_forward(&d, p.q, p.k, p.v, o, l), STA_ERR_ARGUMENT,
             "precision: expected STA_PRECISION_NATIVE (0) or STA_PRECISION_FP8 (1), got 2");
  EXPECT_ERR(sta_attention_reference(&d, p.q, p.k, p.v, o, l), STA_ERR_ARGUMENT,
             "precision: expected STA_PRECISION_NATIVE (0) or STA_PRECISION_FP8 (1), got 2");
  sta_tensor *g[3] = {new_like(p.q, STA_F32, 5), new_like(p.q, STA_F32, 5),
                      new_like(p.q, STA_F32, 5)};
  EXPECT_ERR(sta_attention_backward(&p.d, p.q, p.k, p.v, o, l, o, g[0], g[1], g[2]),
             STA_ERR_UNSUPPORTED, "precision: the backward has no STA_PRECISION_FP8 mode (it "
             "differentiates the exact forward): use STA_PRECISION_NATIVE");
  EXPECT_ERR(sta_attention_backward_reference(&p.d, p.q, p.k, p.v, o, g[0], g[1], g[2]),
             STA_ERR_UNSUPPORTED, "precision: the backward has no STA_PRECISION_FP8 mode (it "
             "differentiates the exact forward): use STA_PRECISION_NATIVE");
  for (int i = 0; i < 3; i++) expect_unchanged(g[i], 5);
  sta_tensor *q8 = NULL;
  OK(sta_tensor_to(&q8, p.q, STA_F8E4M3, STA_CPU));
  EXPECT_ERR(sta_attention_forward(&p.d, q8, q8, q8, o, l), STA_ERR_DTYPE,
             "q: f8e4m3 operands go to sta_attention_forward_fp8 (with their scales)");
  /* sta_attention_forward_fp8 */
  q8set s;
  q8_make(&s, &p);
  sta_tensor **x8 = s.x8;
  d = p.d;
  d.precision = STA_PRECISION_NATIVE;
  EXPECT_ERR(sta_attention_forward_fp8(&d, x8[0], x8[1], x8[2], s.qs, s.ks, s.vs, o, l),
             STA_ERR_ARGUMENT, "precision: sta_attention_forward_fp8 computes in fp8: expected "
             "STA_PRECISION_FP8 (1), got 0");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, p.q, x8[1], x8[2], s.qs, s.ks, s.vs, o, l),
             STA_ERR_DTYPE, "q8: expected f8e4m3, got f32");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, x8[0], x8[1], p.v, s.qs, s.ks, s.vs, o, l),
             STA_ERR_DTYPE, "v8: expected f8e4m3, got f32");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, x8[0], x8[1], x8[2], s.qs, s.ks, s.vs, q8, l),
             STA_ERR_DTYPE, "out: expected f32, f16 or bf16, got f8e4m3");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, x8[0], x8[1], x8[2], s.vs, s.ks, s.vs, o, l),
             STA_ERR_SHAPE, "q_scale: expected shape [B=1, heads=2, S=388], got [1, 2, 32]");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, x8[0], x8[1], x8[2], s.qs, s.ks, s.qs, o, l),
             STA_ERR_SHAPE, "v_scale: expected shape [B=1, heads=2, D=32], got [1, 2, 388]");
  EXPECT_ERR(sta_attention_forward_fp8(&p.d, x8[0], x8[1], x8[2], s.qs, s.ks, s.vs, o, q8),
             STA_ERR_DTYPE, "lse: expected f32, got f8e4m3");
  int32_t bad[3] = {0, 3, 3};
  d = p.d;
  d.windows = bad;
  EXPECT_ERR(sta_attention_forward_fp8(&d, x8[0], x8[1], x8[2], s.qs, s.ks, s.vs, o, l),
             STA_ERR_WINDOW, NULL);
  expect_unchanged(o, 5);
  expect_unchanged(l, 5);
  /* a layer: its precision checked and passed on */
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 2; ld.head_dim = 32; ld.sp_size = 1; ld.geom = p.d.geom;
  ld.precision = (sta_precision)9;
  sta_layer *ly = NULL;
  EXPECT_ERR(sta_layer_create(&ly, &ld), STA_ERR_ARGUMENT,
             "precision: expected STA_PRECISION_NATIVE (0) or STA_PRECISION_FP8 (1), got 9");
  assert_null(ly);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(g[i]);
  q8_free(&s);
  sta_tensor_destroy(q8); sta_tensor_destroy(o); sta_tensor_destroy(l);
  prob_free(&p);
}

/* A layer with precision FP8 runs the fp8 forward (its output is the
** attention's FP8 output, bit for bit). */
static void test_fp8_layer(void **state) {
  (void)state;
  static const int32_t cv[3] = {6, 8, 16};
  prob p;
  prob_make(&p, cv, TILE, 0, -1, 1, 2, 32, 1, W333, STA_F32, STA_BSHD, STA_ORDER_UNTILED, 0, 13);
  sta_strategy *st = NULL;
  OK(sta_strategy_uniform(&st, 1, 1, 2, W333, NULL, 0));
  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 2; ld.head_dim = 32; ld.sp_size = 1; ld.geom = p.d.geom;
  ld.strategy = st; ld.precision = STA_PRECISION_FP8;
  sta_layer *ly = NULL;
  OK(sta_layer_create(&ly, &ld));
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  OK(sta_forward_batch_create(&fb, 1));
  OK(sta_context_push(&ctx, 0, NULL, fb));
  sta_tensor *o1 = new_like(p.q, STA_F32, 0), *o2 = new_like(p.q, STA_F32, 0);
  OK(sta_layer_forward(ly, p.q, p.k, p.v, o1));
  OK(sta_attention_forward(&p.d, p.q, p.k, p.v, o2, NULL));
  assert_memory_equal(sta_tensor_data(o1), sta_tensor_data(o2), (size_t)sta_tensor_numel(o1) * 4);
  OK(sta_context_pop(ctx));
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(ly);
  sta_strategy_destroy(st);
  sta_tensor_destroy(o1); sta_tensor_destroy(o2);
  prob_free(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_e4m3_codes),
    cmocka_unit_test(test_int8_codes),
    cmocka_unit_test(test_fp8_scale127),
    cmocka_unit_test(test_f8_dtype),
    cmocka_unit_test(test_fp8_quantizer),
    cmocka_unit_test(test_fp8_key_layout),
    cmocka_unit_test(test_fp8_prequantized),
    cmocka_unit_test(test_fp8_step),
    cmocka_unit_test(test_fp8_errors),
    cmocka_unit_test(test_fp8_layer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
