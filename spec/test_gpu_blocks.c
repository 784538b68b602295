/* test_gpu_blocks.c -- the CUDA block-sparse attention (masks BLOCKS and
** WINDOW_OR_BLOCKS, STA.md section 12) against a float64 reference written
** here, on fresh random problems: random lists per (batch, head, query
** block), duplicate-free, of random lengths (empty ones too) in L slots;
** random valid sizes of key and query blocks (partial blocks), NaN in
** their padding rows (never read: a padding key is never a key, a padding
** query row outputs 0 and lse -inf); Mq != Mk; block_rows 64, 128, 256,
** 384; bf16 and f16; D 64 and 128; BSHD and BHSD, contiguous, permuted
** storage and a fused qkv view; the union with a window; lse; outputs
** poisoned (NaN) first, so every element is checked written; two runs
** bit-identical.  The backward (dq, dk, dv from the GPU forward's out and
** lse) against float64 gradients, zeros on padding rows, the deterministic
** mode bit-identical run to run.  The kernels are called through the
** backend table (core/backend.h's sta_attn_params, built here), so this
** test does not depend on the core's resolve of the lists; through the
** public API and against the CPU path: test_gpu_blocks_api.c; the index
** arithmetic of bsa_walk.h and bsa_inv.h on the host: test_bsa_index.c.
** The paired forward (block_rows 64; the default at D 128 where loads are
** by TMA) on its own cases (test_pairs, sta_cuda_set_bsa_pairs_test), and
** on all of them at D 64 too with STA_TEST_BSA_PAIRS=1, the split kernel on
** all of them with STA_TEST_BSA_PAIRS=-1; the other kernels' lists sorted
** on the device by default, unless the caller says they are ascending
** (test_sort), as given on all of them with STA_TEST_BSA_SORT=-1.
** STA_TEST_SEED fixes the seed, STA_GPU_CASES the number of random
** problems (default 60), STA_GPU_QUICK keeps them small (compute-
** sanitizer). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blocks_case.h"
#include "gpu_hooks.h"

static double worst[2];

static double worst_bwd[2][3];
static int with_bwd; /* test_backward: the cases' backward too */

/* The backward of a case (after its forward: g[3] the GPU's out, glse its
** lse) against the float64 gradients; deterministic (bwd 2): two runs bit
** for bit, and the default within rounding of them. */
static void check_backward(const kcase *c, const lists *x, sta_tensor *const f[3],
                           sta_tensor *const g[4], sta_tensor *glse, const char *what) {
  const sta_backend_ops *be = sta_backend_get(STA_CUDA);
  const int64_t Sq = c->Mq * c->bv, Sk = c->Mk * c->bv, D = c->D;
  sta_tensor *hdob = NULL, *hdo = make4(&hdob, c->dtype, STA_CPU, c->layout, 0, c->B, Sq, c->H, D);
  assert_int_equal(sta_tensor_randn(hdo, c->seed * 3 + 7, 0.0, 1.0), STA_OK);
  for (int64_t m = 0; m < c->Mq; m++) fill_rows(hdo, c->layout, m * c->bv + x->qs[m], (m + 1) * c->bv, NAN);
  sta_tensor *fdo = NULL, *gdob = NULL, *gdo;
  assert_int_equal(sta_tensor_to(&fdo, hdo, STA_F32, STA_CPU), STA_OK);
  gdo = make4(&gdob, c->dtype, STA_CUDA, c->layout, c->store == 2 ? 0 : c->store, c->B, Sq, c->H, D);
  assert_int_equal(sta_tensor_copy(gdo, hdo), STA_OK);
  const int runs = c->bwd == 2 ? 3 : 1; /* deterministic twice, then the default */
  sta_tensor *gg[3][3], *ggb[3][3], *hg[3][3];
  int32_t wins[3 * MAXH];
  for (int run = 0; run < runs; run++) {
    for (int i = 0; i < 3; i++) {
      gg[run][i] = make4(&ggb[run][i], c->dtype, STA_CUDA, c->layout, c->store == 2 ? 0 : c->store,
                         c->B, i ? Sk : Sq, c->H, D);
      assert_int_equal(sta_tensor_fill(ggb[run][i], NAN), STA_OK); /* poison */
    }
    sta_attn_params p;
    params_of(c, x, g, sta_tensor_data(glse), wins, &p);
    p.deterministic = c->bwd == 2 && run < 2;
    p.dout = sta_tensor_data(gdo);
    p.dq = sta_tensor_data(gg[run][0]); p.dk = sta_tensor_data(gg[run][1]);
    p.dv = sta_tensor_data(gg[run][2]);
    sta_tensor *const t4[4] = {gdo, gg[run][0], gg[run][1], gg[run][2]};
    int64_t *st[4][3] = {{&p.do_sb, &p.do_ss, &p.do_sh}, {&p.dq_sb, &p.dq_ss, &p.dq_sh},
                         {&p.dk_sb, &p.dk_ss, &p.dk_sh}, {&p.dv_sb, &p.dv_ss, &p.dv_sh}};
    for (int i = 0; i < 4; i++) {
      *st[i][0] = sta_tensor_stride(t4[i], 0);
      *st[i][1] = sta_tensor_stride(t4[i], c->layout == STA_BSHD ? 1 : 2);
      *st[i][2] = sta_tensor_stride(t4[i], c->layout == STA_BSHD ? 2 : 1);
    }
    sta_status rc = be->attention_backward(&p);
    if (rc != STA_OK) fail_msg("%s: GPU backward (run %d): %s", what, run, sta_last_error());
    if (be->synchronize() != STA_OK)
      fail_msg("%s: GPU backward (run %d), at the synchronize: %s", what, run, sta_last_error());
    for (int i = 0; i < 3; i++) {
      hg[run][i] = NULL;
      assert_int_equal(sta_tensor_to(&hg[run][i], gg[run][i], STA_F32, STA_CPU), STA_OK);
    }
  }
  static const char *name[3] = {"dq", "dk", "dv"};
  for (int run = 1; run < runs; run++)
    for (int i = 0; i < 3; i++) {
      double mx, rel;
      assert_int_equal(sta_tensor_compare(hg[0][i], hg[run][i], &mx, &rel), STA_OK);
      if (run == 1 && mx != 0.0) fail_msg("%s: deterministic runs differ (%s, max %g)", what, name[i], mx);
      if (run == 2 && !(rel < 1e-2)) fail_msg("%s: deterministic vs default: %s rel %g", what, name[i], rel);
    }
  /* float64 gradients */
  const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
  const int64_t nq = c->B * c->H * Sq * D, nk = c->B * c->H * Sk * D;
  double *rq = calloc((size_t)nq, sizeof(double)), *rk = calloc((size_t)nk, sizeof(double));
  double *rv = calloc((size_t)nk, sizeof(double)), *pr = malloc(sizeof(double) * (size_t)Sk);
  int64_t *kr = malloc(sizeof(int64_t) * (size_t)Sk);
  double *orow = malloc(sizeof(double) * (size_t)D);
  assert_true(rq && rk && rv && pr && kr && orow);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t hh = 0; hh < c->H; hh++)
      for (int64_t m = 0; m < c->Mq; m++)
        for (int64_t r = 0; r < x->qs[m]; r++) {
          const int64_t s = m * c->bv + r, bh = b * c->H + hh;
          const float *qr = rowp(f[0], c->layout, b, s, hh), *dor = rowp(fdo, c->layout, b, s, hh);
          int64_t nkey = 0;
          double mxs = -INFINITY, sum = 0;
          for (int64_t n = 0; n < c->Mk; n++) {
            if (!sees(c, x, b, hh, m, n)) continue;
            for (int64_t j = 0; j < x->ks[n]; j++) {
              const float *krw = rowp(f[1], c->layout, b, n * c->bv + j, hh);
              double dot = 0;
              for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * krw[d];
              kr[nkey] = n * c->bv + j;
              pr[nkey] = dot * scale;
              if (pr[nkey] > mxs) mxs = pr[nkey];
              nkey++;
            }
          }
          if (nkey == 0) continue;
          for (int64_t d = 0; d < D; d++) orow[d] = 0;
          for (int64_t i = 0; i < nkey; i++) {
            pr[i] = exp(pr[i] - mxs);
            sum += pr[i];
          }
          double di = 0;
          for (int64_t i = 0; i < nkey; i++) {
            pr[i] /= sum;
            const float *vr = rowp(f[2], c->layout, b, kr[i], hh);
            for (int64_t d = 0; d < D; d++) orow[d] += pr[i] * vr[d];
          }
          for (int64_t d = 0; d < D; d++) di += orow[d] * dor[d];
          double *dqr = rq + (bh * Sq + s) * D;
          for (int64_t i = 0; i < nkey; i++) {
            const float *vr = rowp(f[2], c->layout, b, kr[i], hh);
            const float *krw = rowp(f[1], c->layout, b, kr[i], hh);
            double dp = 0;
            for (int64_t d = 0; d < D; d++) dp += (double)dor[d] * vr[d];
            const double ds = pr[i] * (dp - di);
            double *dkr = rk + (bh * Sk + kr[i]) * D, *dvr = rv + (bh * Sk + kr[i]) * D;
            for (int64_t d = 0; d < D; d++) {
              dqr[d] += scale * ds * krw[d];
              dkr[d] += scale * ds * qr[d];
              dvr[d] += pr[i] * dor[d];
            }
          }
        }
  const double *ref[3] = {rq, rk, rv};
  const double tol = c->dtype == STA_F16 ? 1e-2 : 3e-2;
  for (int i = 0; i < 3; i++) {
    const int64_t S = i ? Sk : Sq;
    double num2 = 0, den2 = 0;
    for (int64_t b = 0; b < c->B; b++)
      for (int64_t hh = 0; hh < c->H; hh++)
        for (int64_t s = 0; s < S; s++) {
          const float *gr = rowp(hg[0][i], c->layout, b, s, hh);
          const double *rr = ref[i] + ((b * c->H + hh) * S + s) * D;
          for (int64_t d = 0; d < D; d++) {
            if (isnan(gr[d])) fail_msg("%s: %s[%lld, %lld, %lld, %lld] not written (NaN)", what,
                                       name[i], (long long)b, (long long)s, (long long)hh, (long long)d);
            if (rr[d] == 0.0 && gr[d] != 0.0 && (i ? s % c->bv >= x->ks[s / c->bv] : s % c->bv >= x->qs[s / c->bv]))
              fail_msg("%s: %s on padding row %lld: %g", what, name[i], (long long)s, (double)gr[d]);
            num2 += (gr[d] - rr[d]) * (gr[d] - rr[d]);
            den2 += rr[d] * rr[d];
          }
        }
    const double rel = den2 > 0 ? sqrt(num2 / den2) : sqrt(num2);
    if (!(rel < tol)) fail_msg("%s: %s rel L2 %g (tol %g)", what, name[i], rel, tol);
    if (rel > worst_bwd[c->dtype == STA_F16][i]) worst_bwd[c->dtype == STA_F16][i] = rel;
  }
  free(rq); free(rk); free(rv); free(pr); free(kr); free(orow);
  for (int run = 0; run < runs; run++)
    for (int i = 0; i < 3; i++) {
      sta_tensor_destroy(gg[run][i]); sta_tensor_destroy(ggb[run][i]); sta_tensor_destroy(hg[run][i]);
    }
  sta_tensor_destroy(hdo); sta_tensor_destroy(hdob); sta_tensor_destroy(fdo);
  sta_tensor_destroy(gdo); sta_tensor_destroy(gdob);
}

/* One problem: the GPU (twice: bit-identical) against the float64
** reference on the same rounded inputs. */
static void run_case(const kcase *c) {
  char what[400];
  describe(c, what, sizeof what);
  const sta_backend_ops *be = sta_backend_get(STA_CUDA);
  lists x;
  make_lists(c, &x);
  const int64_t Sq = c->Mq * c->bv, Sk = c->Mk * c->bv;
  /* host inputs in the dtype, NaN in the padding rows */
  sta_tensor *hb[3], *h[3], *f[3];
  for (int i = 0; i < 3; i++) {
    h[i] = make4(&hb[i], c->dtype, STA_CPU, c->layout, 0, c->B, i ? Sk : Sq, c->H, c->D);
    assert_int_equal(sta_tensor_randn(h[i], c->seed * 3 + (uint64_t)i, i == 2 ? 0.3 : 0.0, 1.0),
                     STA_OK);
    const int64_t M = i ? c->Mk : c->Mq;
    const int32_t *sz = i ? x.ks : x.qs;
    for (int64_t n = 0; n < M; n++) fill_rows(h[i], c->layout, n * c->bv + sz[n], (n + 1) * c->bv, NAN);
    f[i] = NULL;
    assert_int_equal(sta_tensor_to(&f[i], h[i], STA_F32, STA_CPU), STA_OK);
  }
  /* device views */
  sta_tensor *qkvb = NULL, *gb[4] = {NULL, NULL, NULL, NULL}, *g[4];
  if (c->store == 2) {
    make_qkv(&qkvb, g, c->dtype, c->layout, c->B, Sq, c->H, c->D);
  } else {
    for (int i = 0; i < 3; i++)
      g[i] = make4(&gb[i], c->dtype, STA_CUDA, c->layout, c->store > 2 ? c->store : (c->store + i) & 1,
                   c->B, i ? Sk : Sq, c->H, c->D);
  }
  g[3] = make4(&gb[3], c->dtype, STA_CUDA, c->layout, c->store == 1 || c->store == 4 ? c->store : 0,
               c->B, Sq, c->H, c->D);
  for (int i = 0; i < 3; i++) assert_int_equal(sta_tensor_copy(g[i], h[i]), STA_OK);
  sta_tensor *glse = NULL, *out[2] = {NULL, NULL}, *lh[2] = {NULL, NULL};
  int64_t ls[3] = {c->B, c->H, Sq};
  assert_int_equal(sta_tensor_create(&glse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  int32_t wins[3 * MAXH];
  for (int run = 0; run < 2; run++) {
    assert_int_equal(sta_tensor_fill(gb[3], NAN), STA_OK); /* poison */
    assert_int_equal(sta_tensor_fill(glse, NAN), STA_OK);
    sta_attn_params p;
    params_of(c, &x, g, c->lse || c->bwd ? sta_tensor_data(glse) : NULL, wins, &p);
    sta_status rc = be->attention(&p);
    if (rc != STA_OK) fail_msg("%s: GPU: %s", what, sta_last_error());
    assert_int_equal(be->synchronize(), STA_OK);
    assert_int_equal(sta_tensor_to(&out[run], g[3], STA_F32, STA_CPU), STA_OK);
    assert_int_equal(sta_tensor_to(&lh[run], glse, STA_F32, STA_CPU), STA_OK);
  }
  const char *launch = sta_cuda_last_launch();
  if (!strstr(launch, "block-sparse")) fail_msg("%s: launched %s", what, launch);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(out[0], out[1], &mx, &rel), STA_OK);
  if (mx != 0.0) fail_msg("%s: two runs differ (max %g)", what, mx);

  /* float64 reference, row by row */
  const double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)c->D);
  double *sc = malloc(sizeof(double) * (size_t)Sk), *acc = malloc(sizeof(double) * (size_t)c->D);
  assert_non_null(sc); assert_non_null(acc);
  double num2 = 0, den2 = 0;
  const float *ol = sta_tensor_data(lh[0]);
  for (int64_t b = 0; b < c->B; b++)
    for (int64_t hh = 0; hh < c->H; hh++)
      for (int64_t m = 0; m < c->Mq; m++) {
        char *seen = calloc((size_t)c->Mk, 1);
        assert_non_null(seen);
        for (int64_t n = 0; n < c->Mk; n++) seen[n] = (char)sees(c, &x, b, hh, m, n);
        for (int64_t r = 0; r < c->bv; r++) {
          const int64_t s = m * c->bv + r;
          const int valid = r < x.qs[m];
          double mxs = -INFINITY, sum = 0;
          int64_t nk = 0;
          const float *qr = rowp(f[0], c->layout, b, s, hh);
          for (int64_t n = 0; valid && n < c->Mk; n++) {
            if (!seen[n]) continue;
            for (int64_t j = 0; j < x.ks[n]; j++) {
              const float *kr = rowp(f[1], c->layout, b, n * c->bv + j, hh);
              double dot = 0;
              for (int64_t d = 0; d < c->D; d++) dot += (double)qr[d] * kr[d];
              sc[nk++] = dot * scale;
              if (dot * scale > mxs) mxs = dot * scale;
            }
          }
          for (int64_t d = 0; d < c->D; d++) acc[d] = 0;
          nk = 0;
          for (int64_t n = 0; valid && n < c->Mk; n++) {
            if (!seen[n]) continue;
            for (int64_t j = 0; j < x.ks[n]; j++) {
              const double e = exp(sc[nk++] - mxs);
              const float *vr = rowp(f[2], c->layout, b, n * c->bv + j, hh);
              sum += e;
              for (int64_t d = 0; d < c->D; d++) acc[d] += e * vr[d];
            }
          }
          const float *orow = rowp(out[0], c->layout, b, s, hh);
          for (int64_t d = 0; d < c->D; d++) {
            const double want = sum > 0 ? acc[d] / sum : 0.0, got = orow[d];
            if (isnan(got)) fail_msg("%s: out[%lld, %lld, %lld, %lld] not written (NaN)", what,
                                     (long long)b, (long long)s, (long long)hh, (long long)d);
            if (sum == 0 && got != 0.0)
              fail_msg("%s: out[%lld, %lld, %lld, %lld] = %g, wanted 0 (%s)", what, (long long)b,
                       (long long)s, (long long)hh, (long long)d, got,
                       valid ? "empty list" : "padding row");
            num2 += (got - want) * (got - want);
            den2 += want * want;
          }
          if (c->lse) {
            const double lw = sum > 0 ? mxs + log(sum) : -INFINITY;
            const double lg = ol[(b * c->H + hh) * Sq + s];
            if (!(lw == lg || fabs(lw - lg) < 2e-3))
              fail_msg("%s: lse[%lld, %lld, %lld] = %g, wanted %g", what, (long long)b,
                       (long long)hh, (long long)s, lg, lw);
          }
        }
        free(seen);
      }
  const double r = den2 > 0 ? sqrt(num2 / den2) : sqrt(num2);
  const double tol = c->dtype == STA_BF16 ? 1e-2 : 2e-3;
  if (!(r < tol)) fail_msg("%s: rel L2 %g (tol %g)", what, r, tol);
  if (r > worst[c->dtype == STA_F16]) worst[c->dtype == STA_F16] = r;
  free(sc); free(acc);
  if (c->bwd && with_bwd) check_backward(c, &x, f, g, glse, what);
  for (int i = 0; i < 3; i++) {
    sta_tensor_destroy(h[i]); sta_tensor_destroy(hb[i]); sta_tensor_destroy(f[i]);
    sta_tensor_destroy(g[i]); sta_tensor_destroy(gb[i]);
  }
  sta_tensor_destroy(g[3]); sta_tensor_destroy(gb[3]); sta_tensor_destroy(qkvb);
  for (int i = 0; i < 2; i++) { sta_tensor_destroy(out[i]); sta_tensor_destroy(lh[i]); }
  sta_tensor_destroy(glse);
  free_lists(&x);
}

static void fixed_cases(void) {
  kcase c;
  case_init(&c, 64, 6, 9, 5); /* the split kernel, partial blocks, Mq != Mk */
  c.bwd = 2;
  run_case(&c);
  c.D = 64; c.dtype = STA_F16; c.seed = sta_test_rnd();
  run_case(&c);
  case_init(&c, 256, 3, 4, 3); /* the shared kernel, two parts and two sub-blocks */
  c.bwd = 2;
  run_case(&c);
  c.D = 64; c.layout = STA_BHSD; c.store = 1; c.seed = sta_test_rnd();
  run_case(&c);
  if (getenv("STA_GPU_QUICK")) return; /* compute-sanitizer: the two kernels are enough */
  case_init(&c, 128, 4, 4, 6); /* L > Mk */
  c.store = 2; c.B = 2; c.sizes = 1; c.scale = 0.05f;
  run_case(&c);
  case_init(&c, 384, 2, 3, 2); /* three parts, three sub-blocks */
  c.fast = 1; c.H = 1;
  run_case(&c);
  case_init(&c, 64, 5, 4, 4); /* the gathers: 16-byte rows (B 2), element loads */
  c.store = 3; c.B = 2;
  run_case(&c);
  case_init(&c, 256, 2, 2, 2);
  c.store = 4; c.D = 64; c.dtype = STA_F16;
  run_case(&c);
  uni_init(&c, 64, 2, 3, 4, 3); /* window or blocks */
  run_case(&c);
  uni_init(&c, 128, 3, 2, 2, 2);
  c.D = 64; c.layout = STA_BHSD;
  run_case(&c);
}

static void random_cases(int n) {
  const int quick = getenv("STA_GPU_QUICK") != NULL;
  static const int32_t bvs[] = {64, 64, 64, 128, 256, 256, 384};
  for (int i = 0; i < n; i++) {
    kcase c;
    const int32_t bv = bvs[sta_test_rint(0, 6)];
    const int64_t cap = quick ? 3 : (bv == 64 ? 8 : 4);
    if (sta_test_rint(0, 4) == 0) {
      uni_init(&c, bv, (int32_t)sta_test_rint(1, 3), (int32_t)sta_test_rint(1, 3),
               (int32_t)sta_test_rint(1, 3), sta_test_rint(1, 4));
      c.H = sta_test_rint(1, MAXH);
    } else {
      const int64_t Mq = sta_test_rint(1, cap), Mk = sta_test_rint(1, cap);
      case_init(&c, bv, Mq, Mk, sta_test_rint(1, Mk + 2));
      c.H = sta_test_rint(1, MAXH);
      c.sizes = (int)sta_test_rint(0, 2);
      if (c.Mq != c.Mk && c.sizes == 1) c.sizes = 2;
    }
    c.B = sta_test_rint(1, 2);
    c.D = sta_test_rint(0, 1) ? 128 : 64;
    c.dtype = sta_test_rint(0, 1) ? STA_BF16 : STA_F16;
    c.layout = (sta_layout)sta_test_rint(0, 1);
    static const int stores[] = {0, 0, 1, 3, 4, 2};
    c.store = stores[sta_test_rint(0, c.Mq == c.Mk ? 5 : 4)];
    c.fast = sta_test_rint(0, 3) == 0;
    c.lse = sta_test_rint(0, 3) != 0;
    c.scale = sta_test_rint(0, 3) ? 0.0f : 0.06f;
    c.bwd = (int)sta_test_rint(0, 2);
    run_case(&c);
  }
  printf("# worst rel L2 against float64: bf16 %.3g, f16 %.3g; backward (dq, dk, dv) bf16 %.3g "
         "%.3g %.3g, f16 %.3g %.3g %.3g\n",
         worst[0], worst[1], worst_bwd[0][0], worst_bwd[0][1], worst_bwd[0][2], worst_bwd[1][0],
         worst_bwd[1][1], worst_bwd[1][2]);
}

static void test_fixed(void **state) {
  NEED_GPU();
  with_bwd = 0;
  fixed_cases();
}

static void test_random(void **state) {
  NEED_GPU();
  const char *ns = getenv("STA_GPU_CASES");
  with_bwd = 0;
  random_cases(ns ? atoi(ns) : 60);
}

/* The backward on the fixed cases and a third of the random ones. */
static void test_backward(void **state) {
  NEED_GPU();
  const char *ns = getenv("STA_GPU_CASES");
  with_bwd = 1;
  fixed_cases();
  random_cases((ns ? atoi(ns) : 60) / 3);
}

/* One backward case named by STA_BWD_PROBE ("dtype D bwd Mq Mk L sizes
** B H", dtype bf16 or f16, block_rows 64; a fault's hunt runs each in its
** own process: scripts/device/gpu-check-bsabwd); skipped when unset. */
static void test_bwd_probe(void **state) {
  NEED_GPU();
  const char *e = getenv("STA_BWD_PROBE");
  if (!e) skip();
  char dt[8];
  int D, bwd, sizes;
  long long Mq, Mk, L, B, H;
  if (sscanf(e, "%7s %d %d %lld %lld %lld %d %lld %lld", dt, &D, &bwd, &Mq, &Mk, &L, &sizes, &B,
             &H) != 9)
    fail_msg("STA_BWD_PROBE: '%s' is not 'dtype D bwd Mq Mk L sizes B H'", e);
  kcase c;
  case_init(&c, 64, Mq, Mk, L);
  c.dtype = strcmp(dt, "f16") == 0 ? STA_F16 : STA_BF16;
  c.D = D; c.bwd = bwd; c.sizes = sizes; c.B = B; c.H = H;
  with_bwd = 1;
  run_case(&c);
  printf("# probe passed: %s\n", e);
}

/* The paired forward (sta_cuda_set_bsa_pairs_test: 1, and 2 its pre-pass's
** rank path), block_rows 64, against the float64 reference: random, local
** (overlapping: VSA-like) and many-empty lists, odd and even Mq, partial
** blocks, both dtypes, D 64 and 128, both layouts; where TMA loads (batch
** 1, 16-byte rows) the paired kernel must launch, elsewhere the split one. */
static void test_pairs(void **state) {
  NEED_GPU();
  const int32_t was = sta_cuda_bsa_pairs_test();
  const int quick = getenv("STA_GPU_QUICK") != NULL, n = quick ? 6 : 36;
  for (int i = 0; i < n; i++) {
    kcase c;
    const int64_t Mq = i < 4 ? 5 + i % 2 : sta_test_rint(1, quick ? 5 : 11);
    const int64_t Mk = sta_test_rint(1, quick ? 6 : 12);
    case_init(&c, 64, Mq, Mk, sta_test_rint(1, Mk + 2));
    c.shape = i % 3;
    c.H = sta_test_rint(1, MAXH);
    c.B = i % 6 == 5 ? 2 : 1; /* batch 2, storage 0: the gather (k permuted, heads not folded) */
    c.D = i % 2 ? 64 : 128;
    c.dtype = i / 2 % 2 ? STA_F16 : STA_BF16;
    c.layout = (sta_layout)(i / 4 % 2);
    c.sizes = (int)sta_test_rint(0, 2);
    if (c.Mq != c.Mk && c.sizes == 1) c.sizes = 2;
    c.store = i % 5 == 4 ? (int)sta_test_rint(1, 4) : 0;
    if (c.store == 2 && c.Mq != c.Mk) c.store = 1; /* the fused qkv: one length */
    c.fast = sta_test_rint(0, 3) == 0;
    c.lse = 1;
    c.bwd = 0;
    sta_cuda_set_bsa_pairs_test(i % 4 == 3 ? 2 : 1);
    run_case(&c);
    /* the paired kernel wherever the loads are by TMA (batch 1 with heads
    ** folded, or a batch stride TMA can step), the split one elsewhere; a
    ** layout TMA cannot take (store 4, odd rows) or STA_TEST_NO_TMA: no TMA */
    const char *ll = sta_cuda_last_launch();
    const int tma = strstr(ll, "loads by TMA") != NULL;
    const int no_tma = c.store == 4 || (sta_cuda_tma_test() & STA_TEST_NO_TMA);
    if (no_tma ? tma : c.B == 1 && c.store == 0 && !tma)
      fail_msg("case %d: %s: %s", i, tma ? "TMA where it cannot load" : "no TMA at batch 1", ll);
    if (!strstr(ll, tma ? "BlockPairs" : "BlockSplit"))
      fail_msg("case %d (%s TMA): launched %s", i, tma ? "with" : "without", ll);
  }
  sta_cuda_set_bsa_pairs_test(was);
}

/* The lists' order (sta_cuda_set_bsa_sort_test): by default a copy sorted
** on the device (the launch says so) unless the caller says its lists are
** ascending (lists_sorted, VSA's); -1 the lists as given, 1 sorted even
** then; each against the float64 reference, at every block_rows kind,
** both D, random (unsorted) and local lists.  The paired kernel (the
** default at D 128, block_rows 64) walks its union ascending: never
** sorted. */
static void test_sort(void **state) {
  NEED_GPU();
  const sta_test_kernels was = sta_test_kernels_default();
  static const int32_t bvs[4] = {64, 128, 256, 64};
  const int quick = getenv("STA_GPU_QUICK") != NULL, n = quick ? 8 : 16;
  for (int i = 0; i < n; i++) {
    kcase c;
    const int64_t Mk = sta_test_rint(2, quick ? 6 : 10);
    case_init(&c, bvs[i % 4], sta_test_rint(1, quick ? 5 : 9), Mk, sta_test_rint(2, Mk));
    c.shape = i % 3 == 2 ? 1 : 0;
    c.H = sta_test_rint(1, MAXH);
    c.D = i / 4 % 2 ? 64 : 128;
    c.lse = 1;
    c.bwd = 0;
    /* setting, given_sorted -> sorted on the device? */
    static const int32_t mode[4][3] = {{0, 0, 1}, {0, 1, 0}, {-1, 0, 0}, {1, 1, 1}};
    const int32_t *m = mode[(i + i / 4) % 4];
    sta_cuda_set_bsa_sort_test(m[0]);
    c.given_sorted = m[1];
    run_case(&c);
    const char *ll = sta_cuda_last_launch();
    const int paired = strstr(ll, "BlockPairs") != NULL;
    if (paired && (c.bv != 64 || c.D != 128))
      fail_msg("case %d: the paired kernel at D %d, block_rows %d", i, (int)c.D, (int)c.bv);
    if (!strstr(ll, "lists sorted on the device") != !(m[2] && !paired))
      fail_msg("case %d (setting %d, given sorted %d): launched %s", i, (int)m[0], (int)m[1], ll);
  }
  sta_test_kernels_put(was);
}

/* block_rows the CUDA backend does not take: refused, naming it. */
static void test_refusals(void **state) {
  NEED_GPU();
  kcase c;
  case_init(&c, 96, 2, 2, 2);
  c.sizes = 0;
  lists x;
  make_lists(&c, &x);
  sta_tensor *b[4], *t[4];
  for (int i = 0; i < 4; i++) t[i] = make4(&b[i], c.dtype, STA_CUDA, c.layout, 0, 1, 192, 2, 128);
  sta_attn_params p;
  int32_t wins[3 * MAXH];
  params_of(&c, &x, t, NULL, wins, &p);
  EXPECT_ERR(sta_backend_get(STA_CUDA)->attention(&p), STA_ERR_UNSUPPORTED,
             "attention: block_rows 96 not supported on cuda (64 or a multiple of 128 up to 1024)");
  for (int i = 0; i < 4; i++) { sta_tensor_destroy(t[i]); sta_tensor_destroy(b[i]); }
  free_lists(&x);
}

int main(void) {
  sta_test_begin(2862933555777941757ull, 3037000493ull);
  sta_test_kernel_settings(); /* STA_TEST_NO_TMA: the gathers everywhere */
  if (!sta_backend_available(STA_CUDA))
    printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_refusals),
      cmocka_unit_test(test_fixed),
      cmocka_unit_test(test_random),
      cmocka_unit_test(test_pairs),
      cmocka_unit_test(test_sort),
      cmocka_unit_test(test_backward),
      cmocka_unit_test(test_bwd_probe),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
