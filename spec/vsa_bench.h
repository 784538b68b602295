/* vsa_bench.h -- the VSA timing (STA.md section 12; the budget: the
** whole forward at most 1.15x the fine branch alone): the pieces of
** sta_vsa_forward and sta_vsa_backward timed inside real calls by the
** marks of core/vsa_internal.h (CUDA events on the device, the clock on the
** host), the fine branch and the fine backward alone, a table of mean and
** min ms.  spec/test_gpu_vsa.c runs it at hunyuan-720p on CUDA;
** spec/test_vsa.c walks it on the CPU at a small size (more cubes than
** ever fit a fixed array, partial cubes on every axis), so that its host
** code is tested where it is written.  Every failed call fails the test
** with the piece's name and the library's message.  Header-only. */
#ifndef STA_VSA_BENCH_H
#define STA_VSA_BENCH_H

#include <math.h>
#include <stdio.h>

#include "internal.h"
#include "vsa_case.h"

enum { VB_SLOT = 8, VB_MAXREPS = STA_VSA_MARKS / VB_SLOT - 1 };

/* A workload: cubes 4x4x4 (64 rows) of a canvas, B 1, gate, BSHD. */
typedef struct vbench {
  const char *name;
  int32_t canvas[3];
  int64_t H, D;
  sta_dtype dtype;
  double sparsity;
  sta_device dev;
  int reps; /* timed calls, after one to warm up (<= VB_MAXREPS) */
} vbench;

/* Its tensors, the selection (from sta_vsa_coarse), the fine branch
** resolved once (the block lists checked then), its FLOP. */
typedef struct vb_state {
  vcase c;
  vset s;
  sta_tensor *idx, *num;
  sta_block_list bl;
  sta_attention_desc ad;
  sta_attn_params fp;
  double flop; /* forward: 4 D x the selected pairs of valid tokens */
} vb_state;

static inline void vb_check(sta_status rc, const char *what) {
  if (rc != STA_OK) fail_msg("bench: %s: %s", what, sta_last_error());
}

/* The host copy of t (a fresh tensor). */
static inline sta_tensor *vb_host(const sta_tensor *t) {
  sta_tensor *x = NULL;
  vb_check(sta_tensor_to(&x, t, sta_tensor_dtype(t), STA_CPU), "copy to the host");
  return x;
}

static inline void vb_setup(vb_state *st, const vbench *b) {
  memset(st, 0, sizeof *st);
  vcase *c = &st->c;
  vcase_init(c);
  c->dev = b->dev; c->dtype = b->dtype; c->B = 1; c->H = b->H; c->D = b->D; c->gate = 1;
  c->br = 64; c->sizes = 1; c->seed = 3;
  memcpy(c->canvas, b->canvas, sizeof c->canvas);
  c->mq = c->mk = vsa_canvas_sizes(c->canvas, c->br, NULL);
  vb_check(sta_vsa_topk(b->sparsity, c->mk, &c->topk), "topk");
  vset_make(&st->s, c);
  vset *s = &st->s;
  const int64_t n[4] = {c->B, c->H, c->mq, c->topk};
  vb_check(sta_tensor_create(&st->idx, STA_I32, c->dev, 4, n), "idx");
  vb_check(sta_tensor_create(&st->num, STA_I32, c->dev, 3, n), "num");
  vb_check(sta_vsa_coarse(&s->d, s->q, s->k, s->v, NULL, NULL, st->idx, st->num), "sta_vsa_coarse");
  /* one forward: out and lse for the backward */
  vb_check(sta_vsa_forward(&s->d, s->q, s->k, s->v, s->gate, s->out, s->lse), "sta_vsa_forward");
  /* the fine branch alone: the block-list attention on the same lists,
  ** resolved once, the backward's operands added (what
  ** sta_attention_backward does per call) */
  st->bl.block_rows = c->br; st->bl.num = st->num; st->bl.idx = st->idx; st->bl.kv_sizes = s->ks;
  st->ad.layout = c->layout; st->ad.mask = STA_MASK_BLOCKS; st->ad.blocks = &st->bl;
  vb_check(sta_attn_resolve(&st->ad, s->q, s->k, s->v, s->out, s->lse, &st->fp),
           "the fine branch's resolve");
  sta_bshd x[4];
  const sta_tensor *t[4] = {s->dout, s->dq, s->dk, s->dv};
  for (int i = 0; i < 4; i++) vb_check(sta_tensor_bshd(t[i], c->layout, "t", &x[i]), "bshd");
  sta_attn_params *f = &st->fp;
  f->dout = sta_tensor_data(s->dout);
  f->do_sb = x[0].sb; f->do_ss = x[0].ss; f->do_sh = x[0].sh;
  f->dq = sta_tensor_data(s->dq); f->dq_sb = x[1].sb; f->dq_ss = x[1].ss; f->dq_sh = x[1].sh;
  f->dk = sta_tensor_data(s->dk); f->dk_sb = x[2].sb; f->dk_ss = x[2].ss; f->dk_sh = x[2].sh;
  f->dv = sta_tensor_data(s->dv); f->dv_sb = x[3].sb; f->dv_ss = x[3].ss; f->dv_sh = x[3].sh;
  sta_tensor *hi = vb_host(st->idx);
  const int32_t *ix = sta_tensor_data(hi);
  double pairs = 0;
  for (int64_t i = 0; i < c->H * c->mq; i++)
    for (int32_t j = 0; j < c->topk; j++) {
      const int32_t k = ix[i * c->topk + j];
      if (k < 0 || k >= c->mk) fail_msg("bench: idx[%lld] = %d, not a key cube", (long long)i, k);
      pairs += (double)s->qsz[i % c->mq] * s->ksz[k];
    }
  st->flop = 4.0 * (double)c->D * pairs;
  sta_tensor_destroy(hi);
}

static inline void vb_free(vb_state *st) {
  free((void *)st->fp.windows);
  sta_tensor_destroy(st->idx);
  sta_tensor_destroy(st->num);
  vset_free(&st->s);
  sta_vsa_marks_release_test();
}

/* reps calls of fn (after one to warm up), each between marks: call k's
** base k * VB_SLOT, fn records base + 1 .. base + np (np 0: the bench
** records base + 1 after it).  mean[j], mn[j]: ms from mark j to j + 1,
** j < np (np 0: the whole call, j = 0); mean[np], mn[np]: the whole call. */
static inline void vb_time(const vbench *b, vb_state *st, const char *what,
                           sta_status (*fn)(vb_state *), int np, double *mean, double *mn) {
  const int reps = b->reps < 1 ? 1 : b->reps > VB_MAXREPS ? VB_MAXREPS : b->reps;
  const int last = np ? np : 1;
  for (int k = 0; k <= reps; k++) {
    const int32_t base = k * VB_SLOT;
    vb_check(sta_vsa_mark_test(b->dev, base), what);
    if (np) sta_vsa_set_marks_test(base);
    const sta_status rc = fn(st);
    sta_vsa_set_marks_test(-1);
    vb_check(rc, what);
    if (!np) vb_check(sta_vsa_mark_test(b->dev, base + 1), what);
  }
  for (int j = 0; j <= last; j++) mean[j] = 0, mn[j] = INFINITY;
  for (int k = 1; k <= reps; k++) { /* call 0 warms up */
    const int32_t base = k * VB_SLOT;
    for (int j = 0; j <= last; j++) {
      double ms = 0;
      vb_check(j < last ? sta_vsa_elapsed_test(b->dev, base + j, base + j + 1, &ms)
                        : sta_vsa_elapsed_test(b->dev, base, base + last, &ms), what);
      if (!(ms >= 0) || !isfinite(ms)) fail_msg("bench: %s: %g ms", what, ms);
      mean[j] += ms / reps;
      if (ms < mn[j]) mn[j] = ms;
    }
  }
}

static inline void vb_row(const char *piece, double mean, double mn, double flop) {
  if (flop > 0)
    printf("# %-44s %9.3f %9.3f %8.3g\n", piece, mean, mn, flop / mean / 1e9);
  else
    printf("# %-44s %9.3f %9.3f\n", piece, mean, mn);
}

static inline void vb_head(const vbench *b, const vb_state *st, const char *what) {
  const vcase *c = &st->c;
  printf("# %s VSA %s: %lld cubes of 64 (canvas %dx%dx%d, cubes 4x4x4), topk %d (sparsity %g), "
         "%lld heads, D %lld, %s, gate, %s; %d calls after one: mean and min ms\n",
         b->name, what, (long long)c->mk, c->canvas[0], c->canvas[1], c->canvas[2], c->topk,
         b->sparsity, (long long)c->H, (long long)c->D, sta_dtype_name(c->dtype),
         sta_device_name(c->dev), b->reps);
  printf("# %-44s %9s %9s %8s\n", "piece", "mean", "min", "TFLOP/s");
}

static inline sta_status vb_forward(vb_state *st) {
  vset *s = &st->s;
  return sta_vsa_forward(&s->d, s->q, s->k, s->v, s->gate, s->out, s->lse);
}
static inline sta_status vb_backward(vb_state *st) {
  vset *s = &st->s;
  return sta_vsa_backward(&s->d, s->q, s->k, s->v, s->gate, s->out, s->lse, s->dout, s->dq, s->dk,
                          s->dv, s->dg);
}
static inline sta_status vb_fine(vb_state *st) { return sta_attn_run(&st->fp, st->c.dev); }
static inline sta_status vb_fine_backward(vb_state *st) {
  return sta_backend_get(st->c.dev)->attention_backward(&st->fp);
}

/* The coarse gemms' FLOP: 2 x Mq x Mk x D per head each. */
static inline double vb_coarse_flop(const vcase *c) {
  return 2.0 * (double)(c->B * c->H) * (double)c->mq * (double)c->mk * (double)c->D;
}

/* The forward's table; returns whole / fine alone (the budget: <= 1.15). */
static inline double vb_bench_forward(const vbench *b) {
  vb_state st;
  vb_setup(&st, b);
  double m[6], n[6], fm[2], fn[2];
  vb_time(b, &st, "the fine branch alone (sta_attn_run)", vb_fine, 0, fm, fn);
  char fine_launch[512] = "";
  if (st.c.dev == STA_CUDA) snprintf(fine_launch, sizeof fine_launch, "%s", sta_cuda_last_launch());
  vb_time(b, &st, "sta_vsa_forward", vb_forward, 5, m, n);
  vb_head(b, &st, "forward");
  if (fine_launch[0]) printf("# the fine branch's kernel: %s\n", fine_launch);
  const double cf = vb_coarse_flop(&st.c);
  vb_row("checks, sizes read back, workspace", m[0], n[0], 0);
  vb_row("means (q, k, v)", m[1], n[1], 0);
  vb_row("coarse branch + selection", m[2], n[2], 2 * cf);
  vb_row("fine branch (block-list attention)", m[3], n[3], st.flop);
  vb_row("combine", m[4], n[4], 0);
  vb_row("the whole sta_vsa_forward", m[5], n[5], st.flop);
  vb_row("the fine branch alone (sta_attn_run)", fm[1], fn[1], st.flop);
  const double r = m[5] / fm[1];
  printf("# %-44s %9.3f (the budget: <= 1.15: %s)\n", "VSA forward / fine branch alone", r,
         r <= 1.15 ? "met" : "NOT met");
  printf("# %-44s %9.3f\n", "VSA forward - fine piece (the overhead, ms)", m[5] - m[3]);
  fflush(stdout);
  vb_free(&st);
  return r;
}

/* The backward's table; returns whole / fine backward alone. */
static inline double vb_bench_backward(const vbench *b) {
  vb_state st;
  vb_setup(&st, b);
  double m[7], n[7], fm[2], fn[2];
  vb_time(b, &st, "sta_vsa_backward", vb_backward, 6, m, n);
  vb_time(b, &st, "the fine backward alone (the backend's attention_backward)", vb_fine_backward,
          0, fm, fn);
  vb_head(b, &st, "backward");
  const double cf = vb_coarse_flop(&st.c), bf = 2.5 * st.flop;
  vb_row("checks, sizes read back, workspace", m[0], n[0], 0);
  vb_row("means (q, k, v)", m[1], n[1], 0);
  vb_row("coarse branch + selection (recomputed)", m[2], n[2], 2 * cf);
  vb_row("preparation (out_s, dgate, G)", m[3], n[3], 0);
  vb_row("fine backward (block-list attention)", m[4], n[4], bf);
  vb_row("coarse backward + spread", m[5], n[5], 4 * cf);
  vb_row("the whole sta_vsa_backward", m[6], n[6], bf);
  vb_row("the fine backward alone", fm[1], fn[1], bf);
  const double r = m[6] / fm[1];
  printf("# %-44s %9.3f\n", "VSA backward / fine backward alone", r);
  fflush(stdout);
  vb_free(&st);
  return r;
}

#endif
