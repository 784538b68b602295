/*
** vsa.c -- Video Sparse Attention (sta.h; STA.md section 12): the checks
** of the VSA calls, the workspace, and the order of the pieces on the
** tensors' backend: means, coarse branch and selection, the fine branch
** (the block-list attention: sta_attn_run and the backend's
** attention_backward), the combine; backward: the same recomputed, the
** fine branch's output rebuilt, its gradients, then the coarse branch's.
** The CPU's pieces are core/vsa_cpu.c's, CUDA's kernels/vsa_*.cu's; the
** cube order is core/vsa_cubes.c's.
*/
#include <math.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

/* The pieces of one backend. */
typedef struct vsa_impl {
  sta_status (*means)(const sta_vsa_params *);
  sta_status (*coarse)(const sta_vsa_params *);
  sta_status (*combine)(const sta_vsa_params *);
  sta_status (*bprep)(const sta_vsa_params *);
  sta_status (*bcoarse)(const sta_vsa_params *);
  sta_status (*fine)(const sta_attn_params *);
  sta_status (*fine_backward)(const sta_attn_params *);
  sta_status (*workspace)(void **, size_t);
  void (*workspace_free)(void *);
  int32_t (*capturing)(void);
} vsa_impl;

static sta_status cpu_workspace(void **p, size_t n) {
  *p = sta_malloc(n ? n : 1);
  return *p ? STA_OK : sta_error(STA_ERR_NOMEM, "out of host memory: %zu bytes (VSA workspace)", n);
}
static int32_t cpu_capturing(void) { return 0; }

/* The pieces on device, or STA_ERR_UNSUPPORTED; fine: the call runs the
** fine branch (the block-list attention) too. */
static sta_status impl_of(sta_device dev, int fine, vsa_impl *im) {
  memset(im, 0, sizeof *im);
  if (dev == STA_CPU) {
    vsa_impl c = {sta_cpu_vsa_means, sta_cpu_vsa_coarse, sta_cpu_vsa_combine,
                  sta_cpu_vsa_backward_prep, sta_cpu_vsa_backward_coarse, sta_cpu_attention,
                  sta_cpu_attention_backward, cpu_workspace, free, cpu_capturing};
    *im = c;
    return STA_OK;
  }
  if (!sta_backend_available(dev)) return sta_backend_missing(dev);
  const sta_backend_ops *be = sta_backend_get(dev);
  if (!be->vsa_means || !be->vsa_coarse || !be->vsa_combine || !be->vsa_backward_prep ||
      !be->vsa_backward_coarse || !be->workspace || !be->workspace_free || !be->capturing ||
      !be->attention_backward)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: not implemented on %s in this build",
                     sta_device_name(dev));
  if (fine && !(be->masks & (1 << STA_MASK_BLOCKS)))
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: the block-list attention (the fine branch) is "
                     "not on %s in this build", sta_device_name(dev));
  vsa_impl c = {be->vsa_means, be->vsa_coarse, be->vsa_combine, be->vsa_backward_prep,
                be->vsa_backward_coarse, be->attention, be->attention_backward,
                be->workspace, be->workspace_free, be->capturing};
  *im = c;
  return STA_OK;
}

/* ---- checks -------------------------------------------------------------- */

/* t (name): contiguous, dtype dt, shape n[0..nd), on dev. */
static sta_status check_aux(const sta_tensor *t, const char *name, sta_dtype dt, int32_t nd,
                            const int64_t *n, const char *dims, sta_device dev) {
  int ok = t->ndim == nd;
  for (int32_t i = 0; ok && i < nd; i++) ok = t->shape[i] == n[i];
  if (t->dtype != dt)
    return sta_error(STA_ERR_DTYPE, "%s: expected %s, got %s", name, sta_dtype_name(dt),
                     sta_dtype_name(t->dtype));
  if (!ok) {
    char got[96], want[96];
    int a = 0, b = 0;
    got[0] = want[0] = '\0';
    for (int32_t i = 0; i < t->ndim; i++)
      a += snprintf(got + a, sizeof got - (size_t)a, "%s%lld", i ? ", " : "",
                    (long long)t->shape[i]);
    for (int32_t i = 0; i < nd; i++)
      b += snprintf(want + b, sizeof want - (size_t)b, "%s%lld", i ? ", " : "", (long long)n[i]);
    return sta_error(STA_ERR_SHAPE, "%s: expected shape %s = [%s], got [%s]", name, dims, want,
                     got);
  }
  if (t->storage->device != dev)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", name,
                     sta_device_name(t->storage->device), sta_device_name(dev));
  if (!sta_tensor_is_contiguous(t))
    return sta_error(STA_ERR_SHAPE, "%s: expected a contiguous tensor", name);
  return STA_OK;
}

/* Byte range [lo, hi] of a view in its storage (numel > 0). */
static void byte_span(const sta_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)sta_dtype_size(t->dtype);
  sta_tensor_extent(t, lo, hi);
  *lo *= es;
  *hi = *hi * es + es - 1;
}

sta_status sta_vsa_no_alias(const char *what, const sta_tensor *w, const char *wn,
                            const sta_tensor *r, const char *rn) {
  int64_t a0, a1, b0, b1;
  if (!w || !r || w->storage != r->storage) return STA_OK;
  if (sta_tensor_numel(w) == 0 || sta_tensor_numel(r) == 0) return STA_OK;
  byte_span(w, &a0, &a1);
  byte_span(r, &b0, &b1);
  if (a0 > b1 || b0 > a1) return STA_OK;
  return sta_error(STA_ERR_ARGUMENT,
                   "%s: shares memory with %s (the %s writes %s while it reads %s; use a "
                   "separate tensor)", wn, rn, what, wn, rn);
}

/* Every written tensor against every other operand. */
static sta_status no_aliases(const char *what, sta_tensor *const *w, const char *const *wn, int nw,
                             const sta_tensor *const *r, const char *const *rn, int nr) {
  sta_status rc;
  for (int i = 0; i < nw; i++) {
    for (int j = 0; j < nr; j++)
      if ((rc = sta_vsa_no_alias(what, w[i], wn[i], r[j], rn[j])) != STA_OK) return rc;
    for (int j = 0; j < i; j++)
      if ((rc = sta_vsa_no_alias(what, w[i], wn[i], w[j], wn[j])) != STA_OK) return rc;
  }
  return STA_OK;
}

/* The sizes (name, i32 [m] on dev or NULL) in 1..br: read back from a
** device unless its stream is being captured. */
static sta_status check_sizes(const sta_tensor *t, const char *name, int64_t m, int32_t br,
                              sta_device dev, const vsa_impl *im) {
  sta_status rc;
  if (!t) return STA_OK;
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, name);
  if ((rc = check_aux(t, name, STA_I32, 1, &m, m == 0 ? "[M]" : "[cubes]", dev)) != STA_OK)
    return rc;
  const int32_t *s = sta_tensor_data(t);
  int32_t *host = NULL;
  if (dev != STA_CPU) {
    if (im->capturing()) return STA_OK;
    if (!(host = sta_malloc(sizeof(int32_t) * (size_t)(m ? m : 1))))
      return sta_error(STA_ERR_NOMEM, "out of host memory (%s)", name);
    if ((rc = sta_backend_get(dev)->memcpy(host, STA_CPU, s, dev,
                                           sizeof(int32_t) * (size_t)m)) != STA_OK) {
      free(host);
      return rc;
    }
    s = host;
  }
  rc = STA_OK;
  for (int64_t i = 0; i < m && rc == STA_OK; i++)
    if (s[i] < 1 || s[i] > br)
      rc = sta_error(STA_ERR_ARGUMENT, "%s[%lld]: %d valid rows, expected 1..%d (block_rows)",
                     name, (long long)i, (int)s[i], (int)br);
  free(host);
  return rc;
}

/* What every VSA call checks: desc, q, k, v, gate (may be NULL); fills p's
** operands, sizes and scale, *bq and *bk, and im (fine: the call runs the
** fine branch). */
static sta_status resolve(const sta_vsa_desc *desc, const sta_tensor *q, const sta_tensor *k,
                          const sta_tensor *v, const sta_tensor *gate, sta_vsa_params *p,
                          sta_bshd *bq, sta_bshd *bk, vsa_impl *im, int fine) {
  sta_bshd bv, bg;
  sta_status rc;
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (desc->layout != STA_BSHD && desc->layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)desc->layout);
  const int32_t br = desc->block_rows ? desc->block_rows : 64;
  if (br != 64 && br != 256)
    return sta_error(STA_ERR_ARGUMENT,
                     "block_rows: expected 64 (4x4x4 cubes) or 256 (4x8x8 cubes), got %d",
                     (int)desc->block_rows);
  if ((rc = sta_check_operand4(q, "q", desc->layout, bq)) != STA_OK) return rc;
  if (q->dtype != STA_F32 && q->dtype != STA_F16 && q->dtype != STA_BF16)
    return sta_error(STA_ERR_DTYPE, "q: expected f32, f16 or bf16, got %s",
                     sta_dtype_name(q->dtype));
  if ((rc = sta_check_operand4(k, "k", desc->layout, bk)) != STA_OK) return rc;
  if (bk->b != bq->b || bk->h != bq->h || bk->d != bq->d)
    return sta_error(STA_ERR_SHAPE,
                     "k: [B=%lld, heads=%lld, D=%lld] differs from q's [B=%lld, heads=%lld, "
                     "D=%lld]", (long long)bk->b, (long long)bk->h, (long long)bk->d,
                     (long long)bq->b, (long long)bq->h, (long long)bq->d);
  if (k->dtype != q->dtype)
    return sta_error(STA_ERR_DTYPE, "k: dtype %s differs from q's %s", sta_dtype_name(k->dtype),
                     sta_dtype_name(q->dtype));
  if (k->storage->device != q->storage->device)
    return sta_error(STA_ERR_ARGUMENT, "k: on %s while q is on %s",
                     sta_device_name(k->storage->device), sta_device_name(q->storage->device));
  if ((rc = sta_check_like(v, "v", desc->layout, k, "k", bk, &bv, 0)) != STA_OK) return rc;
  if (gate && (rc = sta_check_like(gate, "gate", desc->layout, q, "q", bq, &bg, 0)) != STA_OK)
    return rc;
  if (bq->b < 1 || bq->h < 1 || bq->d < 1)
    return sta_error(STA_ERR_SHAPE,
                     "q: batch, heads and D must be >= 1, got B=%lld heads=%lld D=%lld",
                     (long long)bq->b, (long long)bq->h, (long long)bq->d);
  if (bq->s < br || bq->s % br)
    return sta_error(STA_ERR_SHAPE, "q: %lld rows, expected a positive multiple of block_rows %d",
                     (long long)bq->s, (int)br);
  if (bk->s < br || bk->s % br)
    return sta_error(STA_ERR_SHAPE, "k: %lld rows, expected a positive multiple of block_rows %d",
                     (long long)bk->s, (int)br);
  const int64_t mq = bq->s / br, mk = bk->s / br;
  if (desc->topk < 1 || desc->topk > mk)
    return sta_error(STA_ERR_ARGUMENT, "topk: expected 1..%lld (the key cubes), got %d",
                     (long long)mk, (int)desc->topk);
  if (isnan(desc->scale) || isinf(desc->scale))
    return sta_error(STA_ERR_ARGUMENT, "scale: expected a finite value, got %g",
                     (double)desc->scale);
  if (desc->deterministic != 0 && desc->deterministic != 1)
    return sta_error(STA_ERR_ARGUMENT, "deterministic: expected 0 or 1, got %d",
                     (int)desc->deterministic);
  const sta_device dev = q->storage->device;
  if ((rc = impl_of(dev, fine, im)) != STA_OK) return rc;
  if ((rc = check_sizes(desc->kv_sizes, "kv_sizes", mk, br, dev, im)) != STA_OK) return rc;
  const sta_tensor *qs = desc->q_sizes ? desc->q_sizes : mq == mk ? desc->kv_sizes : NULL;
  if ((rc = check_sizes(desc->q_sizes, "q_sizes", mq, br, dev, im)) != STA_OK) return rc;

  memset(p, 0, sizeof *p);
  sta_attn_params *f = &p->f;
  f->q = sta_tensor_data(q); f->k = sta_tensor_data(k); f->v = sta_tensor_data(v);
  f->dtype = q->dtype;
  f->batch = bq->b; f->seq_len = bq->s; f->heads = bq->h; f->head_dim = bq->d;
  f->q_sb = bq->sb; f->q_ss = bq->ss; f->q_sh = bq->sh;
  f->k_sb = bk->sb; f->k_ss = bk->ss; f->k_sh = bk->sh;
  f->v_sb = bv.sb; f->v_ss = bv.ss; f->v_sh = bv.sh;
  f->scale = desc->scale > 0 ? desc->scale : (float)(1.0 / sqrt((double)bq->d));
  f->deterministic = desc->deterministic;
  f->mask = STA_MASK_BLOCKS;
  f->block_rows = br;
  f->kv_len = bk->s;
  f->q_blocks = mq;
  f->kv_blocks = mk;
  f->list_len = desc->topk;
  f->kv_sizes = desc->kv_sizes ? sta_tensor_data(desc->kv_sizes) : NULL;
  f->q_sizes = qs ? sta_tensor_data(qs) : NULL;
  p->topk = desc->topk;
  if (gate) {
    p->gate = sta_tensor_data(gate);
    p->g_sb = bg.sb; p->g_ss = bg.ss; p->g_sh = bg.sh;
  }
  return STA_OK;
}

/* An output of q's (or k's) sizes, q's dtype and device. */
static sta_status check_out(const sta_tensor *t, const char *name, sta_layout layout,
                            const sta_tensor *ref, const char *rname, const sta_bshd *br,
                            void **data, int64_t *sb, int64_t *ss, int64_t *sh) {
  sta_bshd b;
  sta_status rc = sta_check_like(t, name, layout, ref, rname, br, &b, 0);
  if (rc != STA_OK) return rc;
  *data = sta_tensor_data(t);
  *sb = b.sb; *ss = b.ss; *sh = b.sh;
  return STA_OK;
}

static sta_status check_lse(const sta_tensor *t, const char *name, const sta_bshd *bq,
                            sta_device dev, sta_attn_params *f) {
  const int64_t n[3] = {bq->b, bq->h, bq->s};
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, name);
  if (t->dtype != STA_F32)
    return sta_error(STA_ERR_DTYPE, "%s: expected f32, got %s", name, sta_dtype_name(t->dtype));
  if (t->ndim != 3 || t->shape[0] != n[0] || t->shape[1] != n[1] || t->shape[2] != n[2])
    return check_aux(t, name, STA_F32, 3, n, "[B, heads, Sq]", dev);
  if (t->storage->device != dev)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", name,
                     sta_device_name(t->storage->device), sta_device_name(dev));
  f->lse = sta_tensor_data(t);
  f->lse_sb = t->stride[0]; f->lse_sh = t->stride[1]; f->lse_ss = t->stride[2];
  return STA_OK;
}

/* ---- the workspace --------------------------------------------------------- */

typedef struct vsa_ws {
  void *base;
  void (*release)(void *);
} vsa_ws;

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Carve p's workspace arrays (backward: also the gradients and out_s). */
static sta_status ws_alloc(sta_vsa_params *p, const vsa_impl *im, int backward, vsa_ws *ws) {
  const sta_attn_params *f = &p->f;
  const size_t bh = (size_t)(f->batch * f->heads), D = (size_t)f->head_dim;
  const size_t mq = (size_t)f->q_blocks, mk = (size_t)f->kv_blocks;
  size_t sz[13] = {
      bh * mq * D * 4, bh * mk * D * 4, bh * mk * D * 4, bh * mq * D * 4, bh * mq * 4,
      bh * mq * mk * 4, bh * mq * (size_t)p->topk * 4, bh * mq * 4, 0, 0, 0, 0, 0};
  if (backward) {
    sz[8] = bh * mq * D * 4; sz[9] = bh * mq * D * 4; sz[10] = bh * mk * D * 4;
    sz[11] = bh * mk * D * 4;
    sz[12] = bh * (size_t)f->seq_len * D * sta_dtype_size(f->dtype);
  }
  size_t off[13], total = 0;
  for (int i = 0; i < 13; i++) { off[i] = total; total += up256(sz[i]); }
  char *b = NULL;
  sta_status rc = im->workspace((void **)&b, total);
  if (rc != STA_OK) return rc;
  ws->base = b;
  ws->release = im->workspace_free;
  p->qc = (float *)(b + off[0]); p->kc = (float *)(b + off[1]); p->vc = (float *)(b + off[2]);
  p->oc = (float *)(b + off[3]); p->lsec = (float *)(b + off[4]);
  p->sc = (float *)(b + off[5]);
  p->idx = (int32_t *)(b + off[6]); p->num = (int32_t *)(b + off[7]);
  p->f.idx = p->idx; p->f.num = p->num;
  p->f.lists_sorted = 1; /* the selection writes each list ascending */
  if (backward) {
    p->gc = (float *)(b + off[8]); p->dqc = (float *)(b + off[9]);
    p->dkc = (float *)(b + off[10]); p->dvc = (float *)(b + off[11]);
    /* out_s: [B][Sq][heads][D] contiguous */
    p->f.o = b + off[12];
    p->f.o_ss = f->heads * f->head_dim; p->f.o_sh = f->head_dim;
    p->f.o_sb = f->seq_len * p->f.o_ss;
  }
  return STA_OK;
}

static void ws_free(vsa_ws *ws) {
  if (ws->base) ws->release(ws->base);
  ws->base = NULL;
}

/* ---- host outputs through scratch (sta.h: a cancelled CPU call changes
** nothing) ------------------------------------------------------------------ */

typedef struct scratch_set {
  sta_tensor *dst[4], *tmp[4];
  int n;
} scratch_set;

/* On the host, a fresh tensor of t's shape and dtype, to be copied into t
** by scratch_commit; elsewhere t itself. */
static sta_status scratch_of(scratch_set *s, sta_tensor *t, sta_tensor **use) {
  *use = t;
  if (!t || t->storage->device != STA_CPU) return STA_OK;
  sta_tensor *c = NULL;
  sta_status rc = sta_tensor_create(&c, t->dtype, STA_CPU, t->ndim, t->shape);
  if (rc != STA_OK) return rc;
  s->dst[s->n] = t;
  s->tmp[s->n++] = c;
  *use = c;
  return STA_OK;
}

static sta_status scratch_commit(scratch_set *s, sta_status rc) {
  for (int i = 0; i < s->n; i++) {
    if (rc == STA_OK) rc = sta_tensor_copy(s->dst[i], s->tmp[i]);
    sta_tensor_destroy(s->tmp[i]);
  }
  s->n = 0;
  return rc;
}

/* ---- benchmarks' marks (vsa_internal.h: sta_vsa_mark_test) ---------------------- */

static _Thread_local int32_t mark_base = -1;
static _Thread_local double host_marks[STA_VSA_MARKS];

void sta_vsa_set_marks_test(int32_t base) { mark_base = base; }

static sta_status mark_range(int32_t i) {
  return i >= 0 && i < STA_VSA_MARKS
             ? STA_OK
             : sta_error(STA_ERR_ARGUMENT, "mark: expected 0..%d, got %d", STA_VSA_MARKS - 1,
                         (int)i);
}

/* This thread's device marks: timing events of the backend's table, made
** on first use (core/backend.h: timer_create, event_record, event_elapsed),
** on this thread's stream. */
static _Thread_local void *dev_marks[STA_VSA_MARKS];
static _Thread_local const sta_backend_ops *dev_marks_ops;

static const sta_backend_ops *timing_ops(sta_device dev) {
  const sta_backend_ops *b = dev != STA_CPU && sta_backend_available(dev) ? sta_backend_get(dev)
                                                                          : NULL;
  return b && b->timer_create && b->event_elapsed ? b : NULL;
}

sta_status sta_vsa_mark_test(sta_device dev, int32_t i) {
  sta_status rc = mark_range(i);
  if (rc != STA_OK) return rc;
  if (dev == STA_CPU) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    host_marks[i] = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
    return STA_OK;
  }
  const sta_backend_ops *b = timing_ops(dev);
  if (!b) return sta_error(STA_ERR_BACKEND, "mark: no timing on %s in this build", sta_device_name(dev));
  if (dev_marks_ops && dev_marks_ops != b) sta_vsa_marks_release_test();
  if (!dev_marks[i] && (rc = b->timer_create(&dev_marks[i])) != STA_OK) {
    dev_marks[i] = NULL;
    return rc;
  }
  dev_marks_ops = b;
  return b->event_record(dev_marks[i], sta_cuda_get_stream());
}

sta_status sta_vsa_elapsed_test(sta_device dev, int32_t a, int32_t b, double *ms) {
  sta_status rc = mark_range(a);
  if (rc != STA_OK || (rc = mark_range(b)) != STA_OK) return rc;
  if (dev == STA_CPU) {
    *ms = host_marks[b] - host_marks[a];
    return STA_OK;
  }
  const sta_backend_ops *t = timing_ops(dev);
  if (!t) return sta_error(STA_ERR_BACKEND, "mark: no timing on %s in this build", sta_device_name(dev));
  if (t != dev_marks_ops || !dev_marks[a] || !dev_marks[b])
    return sta_error(STA_ERR_ARGUMENT, "mark %d: not recorded", (int)(dev_marks[a] ? b : a));
  return t->event_elapsed(dev_marks[a], dev_marks[b], ms);
}

void sta_vsa_marks_release_test(void) {
  for (int i = 0; i < STA_VSA_MARKS; i++)
    if (dev_marks[i]) {
      dev_marks_ops->event_destroy(dev_marks[i]);
      dev_marks[i] = NULL;
    }
  dev_marks_ops = NULL;
}

/* Mark k of a call (when marks are on). */
static sta_status mark(sta_device dev, int32_t k) {
  return mark_base < 0 ? STA_OK : sta_vsa_mark_test(dev, mark_base + k);
}

/* ---- the calls --------------------------------------------------------------- */

/* Means, coarse branch, selection, each behind a cancel point (marks 2
** and 3 after them). */
static sta_status run_coarse(const sta_vsa_params *p, const vsa_impl *im, sta_device dev) {
  sta_status rc;
  if ((rc = sta_cancel_point("vsa")) != STA_OK) return rc;
  if ((rc = im->means(p)) != STA_OK || (rc = mark(dev, 2)) != STA_OK) return rc;
  if ((rc = sta_cancel_point("vsa")) != STA_OK) return rc;
  if ((rc = im->coarse(p)) != STA_OK) return rc;
  return mark(dev, 3);
}

/* Every t[i] a live tensor, NULL allowed where bit i of optional is set. */
static sta_status live(const sta_tensor *const *t, const char *const *name, int n,
                       unsigned optional) {
  for (int i = 0; i < n; i++)
    if (t[i] || !(optional >> i & 1u)) STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, name[i]);
  return STA_OK;
}

/* The forward's operands (q, k, v, gate, out, lse; gate and lse may be
** NULL): checked, resolved into p, out and lse through host scratch (s). */
static sta_status fwd_operands(const sta_vsa_desc *desc, const sta_tensor *const *t, int ref,
                               sta_vsa_params *p, vsa_impl *im, scratch_set *s) {
  static const char *const N[6] = {"q", "k", "v", "gate", "out", "lse"};
  sta_tensor *out = (sta_tensor *)t[4], *lse = (sta_tensor *)t[5];
  sta_bshd bq, bk;
  sta_status rc = live(t, N, 6, 1u << 3 | 1u << 5);
  if (rc != STA_OK) return rc;
  if (ref && t[0]->storage->device != STA_CPU)
    return sta_error(STA_ERR_ARGUMENT, "q: the reference runs on host tensors only");
  if ((rc = resolve(desc, t[0], t[1], t[2], t[3], p, &bq, &bk, im, 1)) != STA_OK) return rc;
  if ((rc = check_out(out, "out", desc->layout, t[0], "q", &bq, &p->f.o, &p->f.o_sb, &p->f.o_ss,
                      &p->f.o_sh)) != STA_OK)
    return rc;
  if (lse && (rc = check_lse(lse, "lse", &bq, t[0]->storage->device, &p->f)) != STA_OK) return rc;
  sta_tensor *w[2] = {out, lse};
  if ((rc = no_aliases(ref ? "reference" : "forward", w, N + 4, 2, t, N, 4)) != STA_OK) return rc;
  sta_tensor *o2 = out, *l2 = lse;
  if ((rc = scratch_of(s, out, &o2)) != STA_OK || (rc = scratch_of(s, lse, &l2)) != STA_OK)
    return rc;
  p->f.o = sta_tensor_data(o2);
  if (l2) p->f.lse = sta_tensor_data(l2);
  return STA_OK;
}

/* The backward's operands (q, k, v, gate, out, lse, dout, dq, dk, dv,
** dgate; the reference has no out and lse): checked, resolved into p, the
** gradients through host scratch (s). */
static sta_status bwd_operands(const sta_vsa_desc *desc, const sta_tensor *const *t, int ref,
                               sta_vsa_params *p, vsa_impl *im, scratch_set *s) {
  static const char *const N[11] = {"q", "k", "v", "gate", "out", "lse", "dout",
                                    "dq", "dk", "dv", "dgate"};
  sta_attn_params *f = &p->f;
  sta_bshd bq, bk;
  void *dop, *outp;
  sta_status rc = live(t, N, 11, 1u << 3 | 1u << 10 | (ref ? 3u << 4 : 0u));
  if (rc != STA_OK) return rc;
  if (ref && t[0]->storage->device != STA_CPU)
    return sta_error(STA_ERR_ARGUMENT, "q: the reference runs on host tensors only");
  if ((rc = resolve(desc, t[0], t[1], t[2], t[3], p, &bq, &bk, im, 1)) != STA_OK) return rc;
  if (!ref) {
    if ((rc = check_out(t[4], "out", desc->layout, t[0], "q", &bq, &outp, &p->out_sb,
                        &p->out_ss, &p->out_sh)) != STA_OK ||
        (rc = check_lse(t[5], "lse", &bq, t[0]->storage->device, f)) != STA_OK)
      return rc;
    p->out = outp;
  }
  if ((rc = check_out(t[6], "dout", desc->layout, t[0], "q", &bq, &dop, &f->do_sb, &f->do_ss,
                      &f->do_sh)) != STA_OK ||
      (rc = check_out(t[7], "dq", desc->layout, t[0], "q", &bq, &f->dq, &f->dq_sb, &f->dq_ss,
                      &f->dq_sh)) != STA_OK ||
      (rc = check_out(t[8], "dk", desc->layout, t[1], "k", &bk, &f->dk, &f->dk_sb, &f->dk_ss,
                      &f->dk_sh)) != STA_OK ||
      (rc = check_out(t[9], "dv", desc->layout, t[1], "k", &bk, &f->dv, &f->dv_sb, &f->dv_ss,
                      &f->dv_sh)) != STA_OK)
    return rc;
  f->dout = dop;
  if (t[10] && !t[3])
    return sta_error(STA_ERR_ARGUMENT, "dgate: given without a gate (gate is NULL)");
  if (t[10] && (rc = check_out(t[10], "dgate", desc->layout, t[0], "q", &bq, &p->dgate,
                               &p->dg_sb, &p->dg_ss, &p->dg_sh)) != STA_OK)
    return rc;
  sta_tensor *w[4] = {(sta_tensor *)t[7], (sta_tensor *)t[8], (sta_tensor *)t[9],
                      (sta_tensor *)t[10]};
  if ((rc = no_aliases("backward", w, N + 7, 4, t, N, 7)) != STA_OK) return rc;
  sta_tensor *use[4];
  for (int i = 0; i < 4; i++)
    if ((rc = scratch_of(s, w[i], &use[i])) != STA_OK) return rc;
  f->dq = sta_tensor_data(use[0]); f->dk = sta_tensor_data(use[1]);
  f->dv = sta_tensor_data(use[2]);
  if (use[3]) p->dgate = sta_tensor_data(use[3]);
  return STA_OK;
}

sta_status sta_vsa_forward(const sta_vsa_desc *desc, const sta_tensor *q, const sta_tensor *k,
                           const sta_tensor *v, const sta_tensor *gate, sta_tensor *out,
                           sta_tensor *lse) {
  const sta_tensor *t[6] = {q, k, v, gate, out, lse};
  sta_vsa_params p;
  vsa_impl im;
  scratch_set s = {{NULL}, {NULL}, 0};
  vsa_ws ws = {NULL, NULL};
  sta_status rc = fwd_operands(desc, t, 0, &p, &im, &s);
  const sta_device dev = rc == STA_OK ? q->storage->device : STA_CPU;
  if (rc == STA_OK) rc = ws_alloc(&p, &im, 0, &ws);
  if (rc == STA_OK) rc = mark(dev, 1);
  if (rc == STA_OK) rc = run_coarse(&p, &im, dev);
  if (rc == STA_OK) rc = sta_cancel_point("vsa");
  if (rc == STA_OK) rc = im.fine(&p.f);
  if (rc == STA_OK) rc = mark(dev, 4);
  if (rc == STA_OK) rc = sta_cancel_point("vsa");
  if (rc == STA_OK) rc = im.combine(&p);
  if (rc == STA_OK) rc = mark(dev, 5);
  ws_free(&ws);
  return scratch_commit(&s, rc);
}

sta_status sta_vsa_backward(const sta_vsa_desc *desc, const sta_tensor *q, const sta_tensor *k,
                            const sta_tensor *v, const sta_tensor *gate, const sta_tensor *out,
                            const sta_tensor *lse, const sta_tensor *dout, sta_tensor *dq,
                            sta_tensor *dk, sta_tensor *dv, sta_tensor *dgate) {
  const sta_tensor *t[11] = {q, k, v, gate, out, lse, dout, dq, dk, dv, dgate};
  sta_vsa_params p;
  vsa_impl im;
  scratch_set s = {{NULL}, {NULL}, 0};
  vsa_ws ws = {NULL, NULL};
  sta_status rc = bwd_operands(desc, t, 0, &p, &im, &s);
  const sta_device dev = rc == STA_OK ? q->storage->device : STA_CPU;
  if (rc == STA_OK) rc = ws_alloc(&p, &im, 1, &ws);
  if (rc == STA_OK) rc = mark(dev, 1);
  if (rc == STA_OK) rc = run_coarse(&p, &im, dev);
  if (rc == STA_OK) rc = im.bprep(&p);
  if (rc == STA_OK) rc = mark(dev, 4);
  if (rc == STA_OK) rc = sta_cancel_point("vsa");
  if (rc == STA_OK) rc = im.fine_backward(&p.f);
  if (rc == STA_OK) rc = mark(dev, 5);
  if (rc == STA_OK) rc = sta_cancel_point("vsa");
  if (rc == STA_OK) rc = im.bcoarse(&p);
  if (rc == STA_OK) rc = mark(dev, 6);
  ws_free(&ws);
  return scratch_commit(&s, rc);
}

sta_status sta_vsa_coarse(const sta_vsa_desc *desc, const sta_tensor *q, const sta_tensor *k,
                          const sta_tensor *v, sta_tensor *out_c, sta_tensor *lse_c,
                          sta_tensor *idx, sta_tensor *num) {
  static const char *const N[7] = {"q", "k", "v", "out_c", "lse_c", "idx", "num"};
  const sta_tensor *t[7] = {q, k, v, out_c, lse_c, idx, num};
  sta_vsa_params p;
  sta_bshd bq, bk;
  vsa_impl im;
  sta_status rc = live(t, N, 7, 0xfu << 3);
  if (rc != STA_OK || (rc = resolve(desc, q, k, v, NULL, &p, &bq, &bk, &im, 0)) != STA_OK) return rc;
  const sta_device dev = q->storage->device;
  const int64_t n_oc[4] = {bq.b, bq.h, p.f.q_blocks, bq.d}, n_idx[4] = {bq.b, bq.h, p.f.q_blocks, p.topk};
  if ((out_c && (rc = check_aux(out_c, "out_c", STA_F32, 4, n_oc, "[B, heads, Mq, D]", dev)) !=
                    STA_OK) ||
      (lse_c && (rc = check_aux(lse_c, "lse_c", STA_F32, 3, n_oc, "[B, heads, Mq]", dev)) !=
                    STA_OK) ||
      (idx && (rc = check_aux(idx, "idx", STA_I32, 4, n_idx, "[B, heads, Mq, topk]", dev)) !=
                  STA_OK) ||
      (num && (rc = check_aux(num, "num", STA_I32, 3, n_idx, "[B, heads, Mq]", dev)) != STA_OK))
    return rc;
  sta_tensor *w[4] = {out_c, lse_c, idx, num};
  if ((rc = no_aliases("coarse branch", w, N + 3, 4, t, N, 3)) != STA_OK) return rc;
  vsa_ws ws = {NULL, NULL};
  if ((rc = ws_alloc(&p, &im, 0, &ws)) == STA_OK) rc = run_coarse(&p, &im, dev);
  const void *src[4] = {p.oc, p.lsec, p.idx, p.num};
  for (int i = 0; i < 4 && rc == STA_OK; i++)
    if (w[i])
      rc = sta_backend_get(dev)->memcpy(sta_tensor_data(w[i]), dev, src[i], dev,
                                        (size_t)sta_tensor_numel(w[i]) * 4);
  ws_free(&ws);
  return rc;
}

sta_status sta_vsa_reference(const sta_vsa_desc *desc, const sta_tensor *q, const sta_tensor *k,
                             const sta_tensor *v, const sta_tensor *gate, sta_tensor *out,
                             sta_tensor *lse) {
  const sta_tensor *t[6] = {q, k, v, gate, out, lse};
  sta_vsa_params p;
  vsa_impl im;
  scratch_set s = {{NULL}, {NULL}, 0};
  sta_status rc = fwd_operands(desc, t, 1, &p, &im, &s);
  if (rc == STA_OK) rc = sta_cpu_vsa_reference(&p);
  return scratch_commit(&s, rc);
}

sta_status sta_vsa_backward_reference(const sta_vsa_desc *desc, const sta_tensor *q,
                                      const sta_tensor *k, const sta_tensor *v,
                                      const sta_tensor *gate, const sta_tensor *dout,
                                      sta_tensor *dq, sta_tensor *dk, sta_tensor *dv,
                                      sta_tensor *dgate) {
  const sta_tensor *t[11] = {q, k, v, gate, NULL, NULL, dout, dq, dk, dv, dgate};
  sta_vsa_params p;
  vsa_impl im;
  scratch_set s = {{NULL}, {NULL}, 0};
  sta_status rc = bwd_operands(desc, t, 1, &p, &im, &s);
  if (rc == STA_OK) rc = sta_cpu_vsa_backward_reference(&p);
  return scratch_commit(&s, rc);
}

sta_status sta_vsa_topk(double sparsity, int64_t cubes, int32_t *topk) {
  if (!topk) return sta_error(STA_ERR_ARGUMENT, "topk: expected a pointer, got NULL");
  if (!(sparsity >= 0.0 && sparsity < 1.0))
    return sta_error(STA_ERR_ARGUMENT, "sparsity: expected a value in [0, 1), got %g", sparsity);
  if (cubes < 1 || cubes > INT32_MAX)
    return sta_error(STA_ERR_ARGUMENT, "cubes: expected 1..%d, got %lld", (int)INT32_MAX,
                     (long long)cubes);
  double t = ceil((1.0 - sparsity) * (double)cubes);
  *topk = t < 1 ? 1 : t > (double)cubes ? (int32_t)cubes : (int32_t)t;
  return STA_OK;
}
