/* blocks_case.h -- what the block-sparse GPU tests share
** (test_gpu_blocks.c, test_gpu_blocks_api.c): a problem (kcase), its
** tensors in any layout and storage, random lists (host and device), the
** mask written out again (which key blocks a query block sees), and the
** backend's sta_attn_params of a call.  Header-only, static. */
#ifndef STA_BLOCKS_CASE_H
#define STA_BLOCKS_CASE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"


#define MAXH 4

typedef struct kcase {
  int64_t B, H, D, Mq, Mk, L;
  int32_t bv;
  sta_dtype dtype;
  sta_layout layout;
  int store;    /* make4's (0, 1, 3, 4), or 2: q, k, v views of one fused qkv tensor */
  int sizes;    /* 0 whole blocks, 1 kv_sizes (q_sizes = kv_sizes), 2 both, separate */
  int uni;      /* WINDOW_OR_BLOCKS: blocks are the tiles of grid */
  int32_t grid[3], win[3 * MAXH];
  int fast, lse;
  int bwd;      /* also the backward (0 no, 1 yes, 2 and the deterministic mode) */
  int shape;    /* the lists: 0 random, 1 local (a run of blocks around m Mk / Mq, one
                ** maybe elsewhere, shuffled: neighbours overlap as VSA's do), 2 random
                ** with whole pairs (2p, 2p + 1) and every other odd block empty */
  int given_sorted; /* the params' lists_sorted (the caller says ascending) */
  float scale;
  uint64_t seed;
} kcase;

static inline void describe(const kcase *c, char *buf, size_t n) {
  snprintf(buf, n,
           "B%lld H%lld D%lld Mq %lld Mk %lld L %lld bv %d %s %s store %d sizes %d uni %d "
           "grid %dx%dx%d win %d,%d,%d fast %d lse %d bwd %d shape %d scale %g seed %llu",
           (long long)c->B, (long long)c->H, (long long)c->D, (long long)c->Mq, (long long)c->Mk,
           (long long)c->L, c->bv, sta_dtype_name(c->dtype), c->layout == STA_BSHD ? "BSHD" : "BHSD",
           c->store, c->sizes, c->uni, c->grid[0], c->grid[1], c->grid[2], c->win[0], c->win[1],
           c->win[2], c->fast, c->lse, c->bwd, c->shape, (double)c->scale,
           (unsigned long long)c->seed);
}

/* A [B,S,H,D] or [B,H,S,D] tensor of dtype on dev: storage contiguous in
** layout (store 0) or in the other layout, permuted (1), or rows of D + 8
** (3: 16-byte aligned; TMA with the heads folded at batch 1, else the
** cp.async gather) or D + 1 elements (4: the element-wise gather) in
** layout; *base holds it. */
static inline sta_tensor *make4(sta_tensor **base, sta_dtype dt, sta_device dev, sta_layout layout,
                         int store, int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int bshd = (layout == STA_BSHD) != (store == 1);
  int64_t shape[4] = {B, bshd ? S : H, bshd ? H : S, D + (store == 3 ? 8 : store == 4 ? 1 : 0)};
  sta_tensor *v = NULL;
  assert_int_equal(sta_tensor_create(base, dt, dev, 4, shape), STA_OK);
  if (store == 1) assert_int_equal(sta_tensor_permute(&v, *base, swap), STA_OK);
  else assert_int_equal(sta_tensor_narrow(&v, *base, 3, 0, D), STA_OK);
  return v;
}

/* q, k, v as views of one [B, S, 3H, D] storage (BSHD) or its [B, 3H, S, D]
** permutation (BHSD): head stride D, row stride 3 H D. */
static inline void make_qkv(sta_tensor **base, sta_tensor *t[3], sta_dtype dt, sta_layout layout,
                     int64_t B, int64_t S, int64_t H, int64_t D) {
  static const int32_t swap[4] = {0, 2, 1, 3};
  int64_t shape[4] = {B, S, 3 * H, D};
  assert_int_equal(sta_tensor_create(base, dt, STA_CUDA, 4, shape), STA_OK);
  sta_tensor *p = NULL;
  if (layout == STA_BHSD) assert_int_equal(sta_tensor_permute(&p, *base, swap), STA_OK);
  for (int i = 0; i < 3; i++) {
    t[i] = NULL;
    assert_int_equal(sta_tensor_narrow(&t[i], p ? p : *base, layout == STA_BHSD ? 1 : 2, i * H, H),
                     STA_OK);
  }
  sta_tensor_destroy(p);
}

/* Row (b, s, h) of a contiguous host f32 tensor in layout. */
static inline const float *rowp(const sta_tensor *t, sta_layout layout, int64_t b, int64_t s, int64_t h) {
  const float *x = sta_tensor_data(t);
  int64_t i1 = layout == STA_BSHD ? s : h, i2 = layout == STA_BSHD ? h : s;
  return x + b * sta_tensor_stride(t, 0) + i1 * sta_tensor_stride(t, 1) +
         i2 * sta_tensor_stride(t, 2);
}

/* Fill rows [r0, r1) of (every b, h) of t (host or device, layout) with value. */
static inline void fill_rows(sta_tensor *t, sta_layout layout, int64_t r0, int64_t r1, double value) {
  if (r1 <= r0) return;
  sta_tensor *r = NULL;
  assert_int_equal(sta_tensor_narrow(&r, t, layout == STA_BSHD ? 1 : 2, r0, r1 - r0), STA_OK);
  assert_int_equal(sta_tensor_fill(r, value), STA_OK);
  sta_tensor_destroy(r);
}

/* The window rule (STA.md section 2) on one axis, written out here. */
static inline int in_window(int32_t q, int32_t kt, int32_t k, int32_t c) {
  if (k > c) k = c;
  int32_t s = q - k / 2;
  if (s < 0) s = 0;
  if (s > c - k) s = c - k;
  return kt >= s && kt < s + k;
}

typedef struct lists {
  int32_t *num, *idx, *qs, *ks; /* host */
  void *dnum, *didx, *dqs, *dks; /* device */
} lists;

static inline void *to_device(const void *h, size_t bytes) {
  const sta_backend_ops *be = sta_backend_get(STA_CUDA);
  void *d = NULL;
  assert_int_equal(be->alloc(&d, bytes ? bytes : 4), STA_OK);
  if (bytes) assert_int_equal(be->memcpy(d, STA_CUDA, h, STA_CPU, bytes), STA_OK);
  return d;
}

/* Random lists: per (b, h, m) a count in [0, min(L, Mk)] (a few empty,
** most long) of distinct blocks; unused slots hold -1 (never read). */
static inline void make_lists(const kcase *c, lists *x) {
  const int64_t rows = c->B * c->H * c->Mq;
  x->num = calloc((size_t)rows, 4);
  x->idx = calloc((size_t)(rows * c->L), 4);
  x->qs = calloc((size_t)c->Mq, 4);
  x->ks = calloc((size_t)c->Mk, 4);
  int32_t *perm = calloc((size_t)c->Mk, 4);
  assert_non_null(x->num); assert_non_null(x->idx); assert_non_null(x->qs);
  assert_non_null(x->ks); assert_non_null(perm);
  const int64_t most = c->L < c->Mk ? c->L : c->Mk;
  for (int64_t r = 0; r < rows; r++) {
    int64_t n = sta_test_rint(0, 7) == 0 ? sta_test_rint(0, most) : most - sta_test_rint(0, most / 4);
    if (sta_test_rint(0, 11) == 0) n = 0;
    const int64_t m = r % c->Mq;
    if (c->shape == 2 && (m / 2 % 2 == 0 || (m % 2 == 1 && m / 2 % 4 == 1))) n = 0;
    for (int64_t i = 0; i < c->Mk; i++) perm[i] = (int32_t)i;
    if (c->shape == 1) { /* the run [s0, s0 + n) first, then the others */
      int64_t s0 = m * c->Mk / c->Mq - n / 2;
      s0 = s0 < 0 ? 0 : s0 > c->Mk - n ? c->Mk - n : s0;
      for (int64_t i = 0; i < c->Mk; i++)
        perm[i] = (int32_t)(i < n ? s0 + i : i - n < s0 ? i - n : i);
      if (n > 0 && n < c->Mk && sta_test_rint(0, 1)) { /* one block elsewhere */
        const int64_t j = sta_test_rint(n, c->Mk - 1);
        int32_t t = perm[n - 1]; perm[n - 1] = perm[j]; perm[j] = t;
      }
    }
    for (int64_t i = 0; i < n; i++) { /* partial Fisher-Yates (local: a shuffle of the run) */
      int64_t j = sta_test_rint(i, c->shape == 1 ? n - 1 : c->Mk - 1);
      int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
      x->idx[r * c->L + i] = perm[i];
    }
    for (int64_t i = n; i < c->L; i++) x->idx[r * c->L + i] = -1;
    x->num[r] = (int32_t)n;
  }
  free(perm);
  for (int64_t n = 0; n < c->Mk; n++)
    x->ks[n] = c->sizes && sta_test_rint(0, 2) ? (int32_t)sta_test_rint(c->bv / 4 > 0 ? c->bv / 4 : 1, c->bv)
                                               : c->bv;
  if (c->sizes && c->bv > 16 && c->Mk > 1) x->ks[sta_test_rint(0, c->Mk - 1)] = 1; /* one row */
  for (int64_t m = 0; m < c->Mq; m++)
    x->qs[m] = c->sizes == 2 ? (int32_t)sta_test_rint(1, c->bv)
               : c->sizes == 1 && m < c->Mk ? x->ks[m] : c->bv;
  x->dnum = to_device(x->num, (size_t)rows * 4);
  x->didx = to_device(x->idx, (size_t)(rows * c->L) * 4);
  x->dqs = c->sizes ? to_device(x->qs, (size_t)c->Mq * 4) : NULL;
  x->dks = c->sizes ? to_device(x->ks, (size_t)c->Mk * 4) : NULL;
}

static inline void free_lists(lists *x) {
  const sta_backend_ops *be = sta_backend_get(STA_CUDA);
  free(x->num); free(x->idx); free(x->qs); free(x->ks);
  be->release(x->dnum); be->release(x->didx);
  if (x->dqs) be->release(x->dqs);
  if (x->dks) be->release(x->dks);
}

/* Does query block m of (b, h) see key block n? */
static inline int sees(const kcase *c, const lists *x, int64_t b, int64_t h, int64_t m, int64_t n) {
  const int64_t row = (b * c->H + h) * c->Mq + m;
  if (c->uni) {
    int32_t q[3] = {(int32_t)(m / (c->grid[1] * c->grid[2])), (int32_t)(m / c->grid[2] % c->grid[1]),
                    (int32_t)(m % c->grid[2])};
    int32_t k[3] = {(int32_t)(n / (c->grid[1] * c->grid[2])), (int32_t)(n / c->grid[2] % c->grid[1]),
                    (int32_t)(n % c->grid[2])};
    int all = 1;
    for (int a = 0; a < 3; a++) all &= in_window(q[a], k[a], c->win[3 * h + a], c->grid[a]);
    if (all) return 1;
  }
  for (int32_t i = 0; i < x->num[row]; i++)
    if (x->idx[row * c->L + i] == n) return 1;
  return 0;
}

/* sta_attn_params of a BLOCKS / WINDOW_OR_BLOCKS call on device views. */
static inline void params_of(const kcase *c, const lists *x, sta_tensor *const t[4], float *lse,
                      int32_t *wins, sta_attn_params *p) {
  memset(p, 0, sizeof *p);
  p->q = sta_tensor_data(t[0]); p->k = sta_tensor_data(t[1]); p->v = sta_tensor_data(t[2]);
  p->o = sta_tensor_data(t[3]);
  p->lse = lse;
  p->dtype = c->dtype;
  p->batch = c->B; p->seq_len = c->Mq * c->bv; p->heads = c->H; p->head_dim = c->D;
  int64_t *st[4][3] = {{&p->q_sb, &p->q_ss, &p->q_sh}, {&p->k_sb, &p->k_ss, &p->k_sh},
                       {&p->v_sb, &p->v_ss, &p->v_sh}, {&p->o_sb, &p->o_ss, &p->o_sh}};
  for (int i = 0; i < 4; i++) {
    *st[i][0] = sta_tensor_stride(t[i], 0);
    *st[i][1] = sta_tensor_stride(t[i], c->layout == STA_BSHD ? 1 : 2);
    *st[i][2] = sta_tensor_stride(t[i], c->layout == STA_BSHD ? 2 : 1);
  }
  p->lse_sb = c->H * p->seq_len; p->lse_sh = p->seq_len; p->lse_ss = 1;
  p->scale = c->scale > 0 ? c->scale : (float)(1.0 / sqrt((double)c->D));
  p->fast_softmax = c->fast;
  p->mask = c->uni ? STA_MASK_WINDOW_OR_BLOCKS : STA_MASK_BLOCKS;
  p->block_rows = c->bv;
  p->kv_len = c->Mk * c->bv;
  p->q_blocks = c->Mq; p->kv_blocks = c->Mk; p->list_len = c->L;
  p->num = x->dnum; p->idx = x->didx;
  p->lists_sorted = c->given_sorted;
  p->q_sizes = x->dqs; p->kv_sizes = x->dks;
  if (c->uni) {
    memcpy(p->grid, c->grid, sizeof p->grid);
    for (int64_t h = 0; h < c->H; h++) memcpy(wins + 3 * h, c->win + 3 * h, 3 * sizeof(int32_t));
    p->windows = wins;
  }
}

static inline void case_init(kcase *c, int32_t bv, int64_t Mq, int64_t Mk, int64_t L) {
  memset(c, 0, sizeof *c);
  c->B = 1; c->H = 2; c->D = 128;
  c->Mq = Mq; c->Mk = Mk; c->L = L; c->bv = bv;
  c->dtype = STA_BF16;
  c->layout = STA_BSHD;
  c->sizes = 2;
  c->lse = 1;
  c->bwd = 1;
  c->seed = sta_test_rnd();
}

/* The union: blocks are the tiles of a grid (block_rows = tile volume). */
static inline void uni_init(kcase *c, int32_t bv, int32_t t, int32_t hh, int32_t w, int64_t L) {
  case_init(c, bv, (int64_t)t * hh * w, (int64_t)t * hh * w, L);
  c->uni = 1;
  c->grid[0] = t; c->grid[1] = hh; c->grid[2] = w;
  for (int64_t i = 0; i < MAXH; i++)
    for (int a = 0; a < 3; a++) c->win[3 * i + a] = (int32_t)(1 + 2 * sta_test_rint(0, 1));
  c->sizes = 1;
}

#endif
