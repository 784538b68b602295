/* test_gpu_blocks_api.c -- block-sparse attention on the GPU through the
** public API (sta_attention_forward and _backward with STA_MASK_BLOCKS,
** the lists as i32 tensors): against the CPU path on f32 copies of the same
** values (forward, lse, gradients), and bad lists (an index out of range or
** twice, num past L, a size outside 1..block_rows) refused on the GPU with
** the CPU's status and message (the device check, kernels/bsa_check.cu,
** against core/mask.c's), the outputs left as they were; a NaN or +Inf
** planted in q, k or v reaches the same outputs on both devices.  The kernels'
** own coverage: test_gpu_blocks.c.  STA_TEST_SEED fixes the seed. */
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

static int64_t n_nonfinite; /* test_nonfinite: non-finite outputs seen */

static sta_tensor *i32_tensor(int32_t nd, const int64_t *shape, const int32_t *v, sta_device dev) {
  sta_tensor *h = NULL, *d = NULL;
  assert_int_equal(sta_tensor_create(&h, STA_I32, STA_CPU, nd, shape), STA_OK);
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= shape[i];
  memcpy(sta_tensor_data(h), v, sizeof(int32_t) * (size_t)n);
  if (dev == STA_CPU) return h;
  assert_int_equal(sta_tensor_to(&d, h, STA_I32, dev), STA_OK);
  sta_tensor_destroy(h);
  return d;
}

typedef struct plists {
  sta_tensor *t[4]; /* num, idx, kv_sizes, q_sizes */
  sta_block_list bl;
} plists;

static void plists_make(plists *pl, const kcase *c, const lists *x, sta_device dev) {
  const int64_t ns[3] = {c->B, c->H, c->Mq}, is[4] = {c->B, c->H, c->Mq, c->L};
  pl->t[0] = i32_tensor(3, ns, x->num, dev);
  pl->t[1] = i32_tensor(4, is, x->idx, dev);
  pl->t[2] = i32_tensor(1, &c->Mk, x->ks, dev);
  pl->t[3] = i32_tensor(1, &c->Mq, x->qs, dev);
  memset(&pl->bl, 0, sizeof pl->bl);
  pl->bl.block_rows = c->bv;
  pl->bl.num = pl->t[0]; pl->bl.idx = pl->t[1]; pl->bl.kv_sizes = pl->t[2]; pl->bl.q_sizes = pl->t[3];
}

static void plists_free(plists *pl) {
  for (int i = 0; i < 4; i++) sta_tensor_destroy(pl->t[i]);
}

/* One problem's operands and outputs on both devices: the lists; q, k, v
** (and dout, n 4) on the host in c->dtype, randn from seed + i (v centred
** at vmean), padding rows NaN (never read); then their f32 CPU and
** c->dtype CUDA copies, the lists on each device, the descriptor, and out
** and lse on each device (GPU in c->dtype, CPU in f32). */
typedef struct pcase {
  lists x;
  plists hl, dl;
  int n;
  sta_tensor *hb[4], *h[4], *f[4], *g[4];
  sta_attention_desc d;
  int64_t qshape[4], kshape[4];
  sta_tensor *go, *glse, *co, *clse;
} pcase;

/* The lists and the host operands (a caller may change them before
** pcase_devices). */
static void pcase_begin(pcase *p, const kcase *c, int n, uint64_t seed, double vmean) {
  memset(p, 0, sizeof *p);
  p->n = n;
  make_lists(c, &p->x);
  for (int i = 0; i < n; i++) { /* q, k, v, dout */
    const int kv = i == 1 || i == 2;
    const int64_t M = kv ? c->Mk : c->Mq;
    const int32_t *sz = kv ? p->x.ks : p->x.qs;
    p->h[i] = make4(&p->hb[i], c->dtype, STA_CPU, c->layout, 0, c->B, M * c->bv, c->H, c->D);
    assert_int_equal(sta_tensor_randn(p->h[i], seed + (uint64_t)i, i == 2 ? vmean : 0.0, 1.0), STA_OK);
    for (int64_t m = 0; m < M; m++) fill_rows(p->h[i], c->layout, m * c->bv + sz[m], (m + 1) * c->bv, NAN);
  }
}

static void pcase_devices(pcase *p, const kcase *c) {
  for (int i = 0; i < p->n; i++) {
    assert_int_equal(sta_tensor_to(&p->f[i], p->h[i], STA_F32, STA_CPU), STA_OK);
    assert_int_equal(sta_tensor_to(&p->g[i], p->h[i], c->dtype, STA_CUDA), STA_OK);
  }
  plists_make(&p->hl, c, &p->x, STA_CPU);
  plists_make(&p->dl, c, &p->x, STA_CUDA);
  p->d.layout = c->layout;
  p->d.mask = STA_MASK_BLOCKS;
  p->d.scale = c->scale;
  const int64_t ls[3] = {c->B, c->H, c->Mq * c->bv};
  for (int i = 0; i < 4; i++) {
    p->qshape[i] = sta_tensor_size(p->f[0], i);
    p->kshape[i] = sta_tensor_size(p->f[1], i);
  }
  assert_int_equal(sta_tensor_create(&p->go, c->dtype, STA_CUDA, 4, p->qshape), STA_OK);
  assert_int_equal(sta_tensor_create(&p->glse, STA_F32, STA_CUDA, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_create(&p->co, STA_F32, STA_CPU, 4, p->qshape), STA_OK);
  assert_int_equal(sta_tensor_create(&p->clse, STA_F32, STA_CPU, 3, ls), STA_OK);
}

static void pcase_end(pcase *p) {
  for (int i = 0; i < p->n; i++) {
    sta_tensor_destroy(p->h[i]); sta_tensor_destroy(p->hb[i]);
    sta_tensor_destroy(p->f[i]); sta_tensor_destroy(p->g[i]);
  }
  sta_tensor_destroy(p->go); sta_tensor_destroy(p->glse);
  sta_tensor_destroy(p->co); sta_tensor_destroy(p->clse);
  plists_free(&p->hl);
  plists_free(&p->dl);
  free_lists(&p->x);
}

/* One problem through sta_attention_forward / _backward on both devices
** (the CPU on f32 copies of the same values); then bad lists: the GPU's
** status and message are the CPU's, and the outputs are left as they were. */
static void public_case(const kcase *c) {
  char what[400];
  describe(c, what, sizeof what);
  pcase pc;
  pcase_begin(&pc, c, 4, c->seed * 5, 0.3);
  pcase_devices(&pc, c);
  lists x = pc.x;
  sta_tensor *const *f = pc.f, *const *g = pc.g;
  sta_tensor *go = pc.go, *glse = pc.glse, *co = pc.co, *clse = pc.clse, *gg[3], *cg[3];
  sta_attention_desc d = pc.d;
  for (int i = 0; i < 3; i++) {
    gg[i] = cg[i] = NULL;
    assert_int_equal(sta_tensor_create(&gg[i], c->dtype, STA_CUDA, 4, i ? pc.kshape : pc.qshape), STA_OK);
    assert_int_equal(sta_tensor_create(&cg[i], STA_F32, STA_CPU, 4, i ? pc.kshape : pc.qshape), STA_OK);
    assert_int_equal(sta_tensor_fill(gg[i], NAN), STA_OK);
  }
  assert_int_equal(sta_tensor_fill(go, NAN), STA_OK);
  d.blocks = &pc.dl.bl;
  sta_status rc = sta_attention_forward(&d, g[0], g[1], g[2], go, glse);
  if (rc != STA_OK) fail_msg("%s: GPU forward: %s", what, sta_last_error());
  rc = sta_attention_backward(&d, g[0], g[1], g[2], go, glse, g[3], gg[0], gg[1], gg[2]);
  if (rc != STA_OK) fail_msg("%s: GPU backward: %s", what, sta_last_error());
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  d.blocks = &pc.hl.bl;
  assert_int_equal(sta_attention_forward(&d, f[0], f[1], f[2], co, clse), STA_OK);
  assert_int_equal(sta_attention_backward(&d, f[0], f[1], f[2], co, clse, f[3], cg[0], cg[1], cg[2]),
                   STA_OK);
  double mx, rel;
  assert_int_equal(sta_tensor_compare(go, co, &mx, &rel), STA_OK);
  if (!(rel < (c->dtype == STA_BF16 ? 1e-2 : 2e-3))) fail_msg("%s: out rel L2 %g against the CPU", what, rel);
  sta_tensor *hl2 = NULL;
  assert_int_equal(sta_tensor_to(&hl2, glse, STA_F32, STA_CPU), STA_OK);
  const float *a = sta_tensor_data(hl2), *bb = sta_tensor_data(clse);
  for (int64_t i = 0; i < sta_tensor_numel(hl2); i++)
    if (a[i] != bb[i] && !(fabsf(a[i] - bb[i]) < 2e-3f))
      fail_msg("%s: lse[%lld] = %g, CPU %g", what, (long long)i, (double)a[i], (double)bb[i]);
  sta_tensor_destroy(hl2);
  static const char *name[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(sta_tensor_compare(gg[i], cg[i], &mx, &rel), STA_OK);
    if (!(rel < (c->dtype == STA_F16 ? 1e-2 : 3e-2)))
      fail_msg("%s: %s rel L2 %g against the CPU", what, name[i], rel);
  }
  /* bad lists: each fault on both devices, the same status and message */
  const int64_t rows = c->B * c->H * c->Mq, r = rows - 1;
  for (int fault = 0; fault < 5; fault++) {
    lists y = x;
    int32_t *num = malloc(sizeof(int32_t) * (size_t)rows), *idx = malloc(sizeof(int32_t) * (size_t)(rows * c->L));
    int32_t *ks = malloc(sizeof(int32_t) * (size_t)c->Mk), *qs = malloc(sizeof(int32_t) * (size_t)c->Mq);
    assert_true(num && idx && ks && qs);
    memcpy(num, x.num, sizeof(int32_t) * (size_t)rows);
    memcpy(idx, x.idx, sizeof(int32_t) * (size_t)(rows * c->L));
    memcpy(ks, x.ks, sizeof(int32_t) * (size_t)c->Mk);
    memcpy(qs, x.qs, sizeof(int32_t) * (size_t)c->Mq);
    y.num = num; y.idx = idx; y.ks = ks; y.qs = qs;
    num[r] = num[r] > 1 ? num[r] : 2; /* the last list: two entries at least */
    idx[r * c->L] = 0; idx[r * c->L + 1] = c->Mk > 1 ? 1 : 0;
    if (fault == 0) idx[r * c->L + 1] = (int32_t)c->Mk;           /* out of range */
    if (fault == 1) idx[r * c->L + 1] = 0;                        /* twice */
    if (fault == 2) num[r] = (int32_t)c->L + 1;                    /* num past L */
    if (fault == 3) ks[c->Mk - 1] = c->bv + 1;                    /* a size */
    if (fault == 4) { qs[0] = 0; ks[0] = 0; }                     /* kv first */
    if (c->Mk == 1 && fault == 1) { free(num); free(idx); free(ks); free(qs); continue; }
    if (num[r] > c->L && fault != 2) num[r] = (int32_t)c->L;
    plists hb2, db2;
    plists_make(&hb2, c, &y, STA_CPU);
    plists_make(&db2, c, &y, STA_CUDA);
    char cmsg[512];
    d.blocks = &hb2.bl;
    const sta_status crc = sta_attention_forward(&d, f[0], f[1], f[2], co, clse);
    snprintf(cmsg, sizeof cmsg, "%s", sta_last_error());
    assert_int_equal(sta_tensor_fill(go, NAN), STA_OK);
    d.blocks = &db2.bl;
    const sta_status grc = sta_attention_forward(&d, g[0], g[1], g[2], go, glse);
    if (crc == STA_OK || grc != crc || strcmp(cmsg, sta_last_error()) != 0)
      fail_msg("%s: bad lists (fault %d): GPU %s '%s', CPU %s '%s'", what, fault,
               sta_status_name(grc), sta_last_error(), sta_status_name(crc), cmsg);
    sta_tensor *ho = NULL;
    assert_int_equal(sta_tensor_to(&ho, go, STA_F32, STA_CPU), STA_OK);
    const float *o = sta_tensor_data(ho);
    for (int64_t i = 0; i < sta_tensor_numel(ho); i++)
      if (!isnan(o[i])) fail_msg("%s: bad lists (fault %d) wrote out[%lld]", what, fault, (long long)i);
    sta_tensor_destroy(ho);
    plists_free(&hb2);
    plists_free(&db2);
    free(num); free(idx); free(ks); free(qs);
  }
  for (int i = 0; i < 3; i++) { sta_tensor_destroy(gg[i]); sta_tensor_destroy(cg[i]); }
  pcase_end(&pc);
}

/* Non-finite values through the GPU's block lists: one NaN (or +Inf in q)
** planted at a random valid element of q, k or v; the GPU forward and the
** CPU forward on f32 copies of the same values agree element by element on
** which outputs are finite, and on which lse entries are NaN, -inf or
** finite (the rules themselves: test_nonfinite_blocks.c, on the CPU). */
static void nonfinite_case(const kcase *c, int which, int inf) {
  char what[480];
  describe(c, what, sizeof what);
  pcase pc;
  pcase_begin(&pc, c, 3, c->seed * 7, 0.0);
  /* the plant, at a valid row */
  const int64_t M = which ? c->Mk : c->Mq, blk = sta_test_rint(0, M - 1);
  const int64_t row = blk * c->bv + sta_test_rint(0, (which ? pc.x.ks : pc.x.qs)[blk] - 1);
  const int64_t pb = sta_test_rint(0, c->B - 1), ph = sta_test_rint(0, c->H - 1),
                pd = sta_test_rint(0, c->D - 1);
  int64_t at[4] = {pb, c->layout == STA_BSHD ? row : ph, c->layout == STA_BSHD ? ph : row, pd};
  assert_int_equal(sta_tensor_set(pc.h[which], at, inf ? INFINITY : NAN), STA_OK);
  char where[600];
  snprintf(where, sizeof where, "%s: %s %s at b %lld row %lld head %lld col %lld", what,
           inf ? "+inf" : "NaN", which == 0 ? "q" : which == 1 ? "k" : "v", (long long)pb,
           (long long)row, (long long)ph, (long long)pd);
  pcase_devices(&pc, c);
  sta_tensor *ho = NULL, *hl2 = NULL;
  assert_int_equal(sta_tensor_fill(pc.go, 7.0), STA_OK); /* poison: finite, so a missed write shows */
  pc.d.blocks = &pc.dl.bl;
  if (sta_attention_forward(&pc.d, pc.g[0], pc.g[1], pc.g[2], pc.go, pc.glse) != STA_OK)
    fail_msg("%s: GPU forward: %s", where, sta_last_error());
  assert_int_equal(sta_cuda_synchronize(), STA_OK);
  pc.d.blocks = &pc.hl.bl;
  assert_int_equal(sta_attention_forward(&pc.d, pc.f[0], pc.f[1], pc.f[2], pc.co, pc.clse), STA_OK);
  assert_int_equal(sta_tensor_to(&ho, pc.go, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&hl2, pc.glse, STA_F32, STA_CPU), STA_OK);
  const float *go_ = sta_tensor_data(ho), *co_ = sta_tensor_data(pc.co);
  int64_t bad = 0;
  for (int64_t i = 0; i < sta_tensor_numel(ho); i++) {
    if (isfinite(go_[i]) != isfinite(co_[i]))
      fail_msg("%s: out[%lld] GPU %g, CPU %g", where, (long long)i, (double)go_[i], (double)co_[i]);
    bad += !isfinite(co_[i]);
  }
  const float *gl = sta_tensor_data(hl2), *cl = sta_tensor_data(pc.clse);
  for (int64_t i = 0; i < sta_tensor_numel(hl2); i++) {
    const int gk = isnan(gl[i]) ? 0 : isinf(gl[i]) ? 1 : 2, ck = isnan(cl[i]) ? 0 : isinf(cl[i]) ? 1 : 2;
    if (gk != ck || (gk == 1 && gl[i] != cl[i]))
      fail_msg("%s: lse[%lld] GPU %g, CPU %g", where, (long long)i, (double)gl[i], (double)cl[i]);
  }
  n_nonfinite += bad;
  sta_tensor_destroy(ho); sta_tensor_destroy(hl2);
  pcase_end(&pc);
}

static void test_nonfinite(void **state) {
  NEED_GPU();
  static const int32_t BV[4] = {64, 128, 256, 384};
  for (int k = 0; k < 24; k++) {
    kcase c;
    case_init(&c, BV[k % 4], sta_test_rint(2, 5), sta_test_rint(2, 6), sta_test_rint(1, 4));
    c.D = k % 3 == 2 ? 64 : 128;
    c.dtype = k % 2 ? STA_F16 : STA_BF16;
    c.layout = sta_test_rint(0, 1) ? STA_BSHD : STA_BHSD;
    c.B = sta_test_rint(1, 2);
    const int which = k % 3, inf = which == 0 && k % 6 == 3;
    nonfinite_case(&c, which, inf);
  }
  printf("# 24 planted cases: %lld non-finite outputs, GPU and CPU alike\n", (long long)n_nonfinite);
  assert_true(n_nonfinite > 0);
}

static void test_public(void **state) {
  NEED_GPU();
  kcase c;
  case_init(&c, 64, 7, 5, 6); /* L > Mk */
  public_case(&c);
  case_init(&c, 256, 2, 3, 2);
  c.D = 64; c.dtype = STA_F16; c.layout = STA_BHSD; c.B = 2;
  public_case(&c);
}

int main(void) {
  sta_test_begin(1181783497276652981ull, 7046029254386353131ull);
  if (!sta_backend_available(STA_CUDA))
    printf("# no CUDA backend: %s\n", sta_backend_describe(STA_CUDA));
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_public),
      cmocka_unit_test(test_nonfinite),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
