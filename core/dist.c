/*
** dist.c -- sequence parallelism (Ulysses): communicators over a transport
** table, the in-process loopback transport, and SP attention / SP layers.
** The NCCL transport is dist_nccl.c.
*/
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

struct sta_comm {
  int32_t refs; /* the creator's and every SP layer's that holds it */
  sta_transport t;
  sta_tensor *ws; /* SP workspace, kept between forwards (grown, never shrunk) */
};

#define MAX_LOOPBACK 64

/* ---- communicators -------------------------------------------------------- */

sta_status sta_comm_create(sta_comm **out, const sta_transport *t) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!t) return sta_error(STA_ERR_ARGUMENT, "transport: expected a table, got NULL");
  if (!t->rank || !t->size || !t->all_to_all || !t->all_gather || !t->barrier)
    return sta_error(STA_ERR_ARGUMENT,
                     "transport: rank, size, all_to_all, all_gather and barrier "
                     "must all be set");
  int32_t r = t->rank(t->self), n = t->size(t->self);
  if (n < 1 || r < 0 || r >= n)
    return sta_error(STA_ERR_ARGUMENT, "transport: rank %d of size %d is not a rank",
                     (int)r, (int)n);
  sta_comm *c = sta_calloc(1, sizeof *c);
  if (!c) return sta_error(STA_ERR_NOMEM, "out of host memory (communicator)");
  sta_status rc = sta_handle_add(c, STA_KIND_COMM);
  if (rc != STA_OK) { free(c); return rc; }
  c->refs = 1;
  c->t = *t;
  if (!c->t.name) c->t.name = "custom";
  *out = c;
  return STA_OK;
}

void sta_comm_retain(sta_comm *c) { sta_ref_retain(&c->refs); }

void sta_comm_destroy(sta_comm *c) {
  if (!sta_handle_live(c, STA_KIND_COMM) || !sta_ref_release(&c->refs)) return;
  sta_handle_remove(c);
  if (c->t.destroy) c->t.destroy(c->t.self);
  sta_tensor_destroy(c->ws);
  free(c);
}

static int live(const sta_comm *c) {
  return sta_handle_check(c, STA_KIND_COMM, "comm") == STA_OK;
}

int32_t sta_comm_rank(const sta_comm *c) { return live(c) ? c->t.rank(c->t.self) : -1; }
int32_t sta_comm_size(const sta_comm *c) { return live(c) ? c->t.size(c->t.self) : 0; }
const char *sta_comm_name(const sta_comm *c) { return live(c) ? c->t.name : "none"; }

sta_status sta_comm_barrier(sta_comm *c) {
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  return c->t.barrier(c->t.self);
}

static sta_status check_moves(const sta_comm *c, const sta_tensor *t, const char *name) {
  sta_device d = sta_tensor_device(t);
  if (!(c->t.devices & (1u << d)))
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s, but the %s communicator does not move %s memory",
                     name, sta_device_name(d), c->t.name, sta_device_name(d));
  return STA_OK;
}

/* Checks shared by the tensor collectives; *bytes = send's size in bytes. */
static sta_status collective_args(const sta_comm *c, const sta_tensor *send,
                                  const sta_tensor *recv, size_t *bytes) {
  sta_status rc;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  STA_CHECK_HANDLE(send, STA_KIND_TENSOR, "send");
  STA_CHECK_HANDLE(recv, STA_KIND_TENSOR, "recv");
  if (!sta_tensor_is_contiguous(send))
    return sta_error(STA_ERR_SHAPE, "send: expected a contiguous tensor");
  if (!sta_tensor_is_contiguous(recv))
    return sta_error(STA_ERR_SHAPE, "recv: expected a contiguous tensor");
  if (send->dtype != recv->dtype)
    return sta_error(STA_ERR_DTYPE, "recv: dtype %s differs from send's %s",
                     sta_dtype_name(recv->dtype), sta_dtype_name(send->dtype));
  if (sta_tensor_device(send) != sta_tensor_device(recv))
    return sta_error(STA_ERR_ARGUMENT, "recv: on %s while send is on %s",
                     sta_device_name(sta_tensor_device(recv)), sta_device_name(sta_tensor_device(send)));
  if ((rc = check_moves(c, send, "send")) != STA_OK) return rc;
  *bytes = (size_t)sta_tensor_numel(send) * sta_dtype_size(send->dtype);
  return STA_OK;
}

sta_status sta_comm_all_to_all(sta_comm *c, const sta_tensor *send, sta_tensor *recv) {
  size_t bytes;
  sta_status rc = collective_args(c, send, recv, &bytes);
  if (rc != STA_OK) return rc;
  int32_t p = sta_comm_size(c);
  int64_t n = sta_tensor_numel(send);
  if (sta_tensor_numel(recv) != n)
    return sta_error(STA_ERR_SHAPE, "recv: %lld elements, expected send's %lld",
                     (long long)sta_tensor_numel(recv), (long long)n);
  if (n % p != 0)
    return sta_error(STA_ERR_SHAPE, "send: %lld elements are not divisible by the %d ranks",
                     (long long)n, (int)p);
  return c->t.all_to_all(c->t.self, sta_tensor_data(send), sta_tensor_data(recv),
                         bytes / (size_t)p, sta_tensor_device(send));
}

sta_status sta_comm_all_gather(sta_comm *c, const sta_tensor *send, sta_tensor *recv) {
  size_t bytes;
  sta_status rc = collective_args(c, send, recv, &bytes);
  if (rc != STA_OK) return rc;
  int32_t p = sta_comm_size(c);
  int64_t n = sta_tensor_numel(send);
  if (sta_tensor_numel(recv) != n * p)
    return sta_error(STA_ERR_SHAPE, "recv: %lld elements, expected %d ranks x %lld",
                     (long long)sta_tensor_numel(recv), (int)p, (long long)n);
  return c->t.all_gather(c->t.self, sta_tensor_data(send), sta_tensor_data(recv), bytes,
                         sta_tensor_device(send));
}

/* ---- loopback transport ---------------------------------------------------- */

typedef struct lb_world {
  pthread_mutex_t mu;
  pthread_mutex_t compute; /* one rank computes at a time (see sp_run) */
  pthread_cond_t cv;
  int32_t size, arrived, refs, aborted;
  uint64_t gen;
  const void *posted[MAX_LOOPBACK];
} lb_world;

typedef struct lb_rank {
  lb_world *w;
  int32_t rank;
} lb_rank;

static int32_t lb_rank_of(void *self) { return ((lb_rank *)self)->rank; }
static int32_t lb_size_of(void *self) { return ((lb_rank *)self)->w->size; }

static double timeout_s(void) {
  const char *e = getenv("STA_DIST_TIMEOUT");
  double s = e ? atof(e) : 300;
  return s > 0 ? s : 300;
}

/* Wait for every rank (generation barrier).  Fails when the world was
** aborted or the wait times out; either aborts the world. */
static sta_status lb_wait(lb_rank *me) {
  lb_world *w = me->w;
  sta_status rc = STA_OK;
  struct timespec until;
  double to = timeout_s();
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)to;
  until.tv_nsec += (long)((to - (double)(time_t)to) * 1e9);
  if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
  pthread_mutex_lock(&w->mu);
  if (w->aborted) rc = STA_ERR_STATE;
  else if (++w->arrived == w->size) {
    w->arrived = 0;
    w->gen++;
    pthread_cond_broadcast(&w->cv);
  } else {
    uint64_t g = w->gen;
    while (g == w->gen && !w->aborted) {
      if (pthread_cond_timedwait(&w->cv, &w->mu, &until) == ETIMEDOUT) {
        w->aborted = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        return sta_error(STA_ERR_STATE,
                         "loopback rank %d: waited %g s for the other ranks "
                         "(STA_DIST_TIMEOUT); the world is aborted",
                         (int)me->rank, to);
      }
    }
    if (g == w->gen) rc = STA_ERR_STATE;
  }
  pthread_mutex_unlock(&w->mu);
  if (rc != STA_OK)
    return sta_error(rc, "loopback rank %d: the world was aborted (another rank failed)",
                     (int)me->rank);
  return STA_OK;
}

static void lb_abort(lb_world *w) {
  pthread_mutex_lock(&w->mu);
  w->aborted = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void lb_reset(lb_world *w) {
  pthread_mutex_lock(&w->mu);
  w->aborted = 0;
  w->arrived = 0;
  pthread_mutex_unlock(&w->mu);
}

static sta_status lb_copy(void *dst, const void *src, size_t n, sta_device d) {
  if (d == STA_CPU) { memcpy(dst, src, n); return STA_OK; }
  return sta_backend_get(d)->memcpy(dst, d, src, d, n);
}

/* Post my send buffer, wait, copy what I need, wait again so no one
** reuses a buffer still being read.  stride: bytes between the chunks of
** one sender that go to different ranks (0 for all-gather). */
static sta_status lb_exchange(lb_rank *me, const void *send, void *recv, size_t chunk,
                              size_t stride, sta_device d) {
  lb_world *w = me->w;
  sta_status rc;
  w->posted[me->rank] = send;
  if ((rc = lb_wait(me)) != STA_OK) return rc;
  for (int32_t j = 0; j < w->size && rc == STA_OK; j++)
    rc = lb_copy((char *)recv + (size_t)j * chunk,
                 (const char *)w->posted[j] + (size_t)me->rank * stride, chunk, d);
  if (rc == STA_OK && d != STA_CPU) rc = sta_backend_get(d)->synchronize();
  if (rc != STA_OK) { lb_abort(w); return rc; }
  return lb_wait(me);
}

static sta_status lb_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  return lb_exchange(self, send, recv, chunk, chunk, d);
}

static sta_status lb_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  return lb_exchange(self, send, recv, chunk, 0, d);
}

static sta_status lb_barrier(void *self) { return lb_wait(self); }

static void lb_free(lb_world *w) {
  pthread_cond_destroy(&w->cv);
  pthread_mutex_destroy(&w->compute);
  pthread_mutex_destroy(&w->mu);
  free(w);
}

static void lb_destroy(void *self) {
  lb_rank *me = self;
  lb_world *w = me->w;
  pthread_mutex_lock(&w->mu);
  int last = --w->refs == 0;
  pthread_mutex_unlock(&w->mu);
  if (last) lb_free(w);
  free(me);
}

sta_status sta_comm_loopback(sta_comm **comms, int32_t size) {
  if (!comms) return sta_error(STA_ERR_ARGUMENT, "comms: expected an array, got NULL");
  if (size < 1 || size > MAX_LOOPBACK)
    return sta_error(STA_ERR_ARGUMENT, "size: expected 1..%d ranks, got %d", MAX_LOOPBACK,
                     (int)size);
  lb_world *w = sta_calloc(1, sizeof *w);
  if (!w) return sta_error(STA_ERR_NOMEM, "out of host memory (loopback world)");
  pthread_mutex_init(&w->mu, NULL);
  pthread_mutex_init(&w->compute, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->size = size;
  sta_comm *made[MAX_LOOPBACK];
  sta_status rc = STA_OK;
  int32_t r;
  for (r = 0; r < size; r++) {
    lb_rank *me = sta_calloc(1, sizeof *me);
    if (!me) { rc = sta_error(STA_ERR_NOMEM, "out of host memory (loopback rank)"); break; }
    me->w = w;
    me->rank = r;
    sta_transport t = {"loopback", (1u << STA_CPU) | (1u << STA_CUDA), me, lb_rank_of,
                       lb_size_of, lb_all_to_all, lb_all_gather, lb_barrier, lb_destroy};
    if ((rc = sta_comm_create(&made[r], &t)) != STA_OK) { free(me); break; }
    w->refs++;
  }
  if (rc != STA_OK) {
    if (r == 0) lb_free(w);
    while (r-- > 0) sta_comm_destroy(made[r]); /* the last one frees w */
    return rc;
  }
  for (r = 0; r < size; r++) comms[r] = made[r];
  return STA_OK;
}

/* ---- running one thread per rank --------------------------------------------- */

typedef struct lb_job {
  sta_rank_fn fn;
  void *arg;
  sta_comm *comm;
  int32_t rank;
  sta_status rc;
  char msg[1024];
} lb_job;

static void *lb_thread(void *p) {
  lb_job *j = p;
  j->rc = j->fn(j->arg, j->rank, j->comm);
  if (j->rc != STA_OK) {
    snprintf(j->msg, sizeof j->msg, "%s", sta_last_error());
    if (j->comm->t.destroy == lb_destroy) lb_abort(((lb_rank *)j->comm->t.self)->w);
  }
  return NULL;
}

sta_status sta_comm_loopback_run(sta_comm *const *comms, int32_t size, sta_rank_fn fn,
                                 void *arg) {
  if (!comms) return sta_error(STA_ERR_ARGUMENT, "comms: expected an array, got NULL");
  if (!fn) return sta_error(STA_ERR_ARGUMENT, "fn: expected a function, got NULL");
  if (size < 1 || size > MAX_LOOPBACK)
    return sta_error(STA_ERR_ARGUMENT, "size: expected 1..%d ranks, got %d", MAX_LOOPBACK,
                     (int)size);
  lb_world *w = NULL;
  for (int32_t r = 0; r < size; r++) {
    sta_comm *c = comms[r];
    char name[32];
    snprintf(name, sizeof name, "comms[%d]", (int)r);
    STA_CHECK_HANDLE(c, STA_KIND_COMM, name);
    if (c->t.destroy != lb_destroy)
      return sta_error(STA_ERR_ARGUMENT, "comms[%d]: expected a loopback communicator",
                       (int)r);
    lb_rank *me = c->t.self;
    if (r == 0) w = me->w;
    if (me->w != w || me->rank != r)
      return sta_error(STA_ERR_ARGUMENT,
                       "comms[%d]: expected rank %d of comms[0]'s world, got rank %d of %s",
                       (int)r, (int)r, (int)me->rank, me->w == w ? "it" : "another world");
  }
  if (w->size != size)
    return sta_error(STA_ERR_ARGUMENT, "size: the world has %d ranks, got %d", (int)w->size,
                     (int)size);
  lb_reset(w); /* no rank is inside a collective: start clean */
  /* the ranks may destroy their communicators: hold them for the run */
  for (int32_t r = 0; r < size; r++) sta_comm_retain(comms[r]);
  lb_job *jobs = sta_calloc((size_t)size, sizeof *jobs);
  pthread_t *th = sta_calloc((size_t)size, sizeof *th);
  if (!jobs || !th) {
    free(jobs);
    free(th);
    for (int32_t r = 0; r < size; r++) sta_comm_destroy(comms[r]);
    return sta_error(STA_ERR_NOMEM, "out of host memory (loopback run)");
  }
  int32_t started = 0;
  for (; started < size; started++) {
    lb_job *j = &jobs[started];
    j->fn = fn; j->arg = arg; j->comm = comms[started]; j->rank = started;
    if (pthread_create(&th[started], NULL, lb_thread, j) != 0) {
      lb_abort(w);
      break;
    }
  }
  for (int32_t r = 0; r < started; r++) pthread_join(th[r], NULL);
  sta_status rc = STA_OK;
  if (started < size)
    rc = sta_error(STA_ERR_STATE, "loopback run: cannot start the thread of rank %d",
                   (int)started);
  /* first failure that is not just the abort it caused elsewhere */
  for (int pass = 0; pass < 2 && rc == STA_OK; pass++)
    for (int32_t r = 0; r < started && rc == STA_OK; r++)
      if (jobs[r].rc != STA_OK &&
          (pass == 1 || strstr(jobs[r].msg, ": the world was aborted") == NULL))
        rc = sta_error(jobs[r].rc, "rank %d: %s", (int)r, jobs[r].msg);
  lb_reset(w); /* every thread has left */
  free(jobs);
  free(th);
  for (int32_t r = 0; r < size; r++) sta_comm_destroy(comms[r]); /* the run's references */
  return rc;
}

/* ---- shards ---------------------------------------------------------------- */

/* View of t (4-D in layout) restricted to rows [s0, s0+sn) and heads
** [h0, h0+hn). */
static sta_status block(sta_tensor **out, const sta_tensor *t, sta_layout layout,
                        int64_t s0, int64_t sn, int64_t h0, int64_t hn) {
  int32_t sd = layout == STA_BSHD ? 1 : 2, hd = layout == STA_BSHD ? 2 : 1;
  sta_tensor *a = NULL;
  sta_status rc = sta_tensor_narrow(&a, t, sd, s0, sn);
  if (rc == STA_OK) rc = sta_tensor_narrow(out, a, hd, h0, hn);
  sta_tensor_destroy(a);
  return rc;
}

/* dst block <- src block (same extents). */
static sta_status copy_block(sta_tensor *dst, int64_t ds0, int64_t dh0, const sta_tensor *src,
                             int64_t ss0, int64_t sh0, int64_t sn, int64_t hn,
                             sta_layout layout) {
  sta_tensor *a = NULL, *b = NULL;
  sta_status rc = block(&a, dst, layout, ds0, sn, dh0, hn);
  if (rc == STA_OK) rc = block(&b, src, layout, ss0, sn, sh0, hn);
  if (rc == STA_OK) rc = sta_tensor_copy(a, b);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
  return rc;
}

/* A contiguous [B, S, H, D] (in layout) view at element offset of buf. */
static sta_status region(sta_tensor **out, const sta_tensor *buf, int64_t offset,
                         sta_layout layout, int64_t b, int64_t s, int64_t h, int64_t d) {
  int64_t shape[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  int64_t st[4] = {shape[1] * shape[2] * d, shape[2] * d, d, 1};
  return sta_tensor_view(out, buf, offset, 4, shape, st);
}

/* The split of one problem: P ranks, V video tokens, local rows, ... */
typedef struct split {
  int32_t p, r;
  int64_t b, h, d, hl, v, vr, sl, s, text;
} split;

static sta_status split_check(split *sp, const sta_geometry *g, sta_layout layout,
                              const sta_tensor *const t[4], const char *const names[4],
                              int32_t rank, int32_t size) {
  sta_bshd x[4];
  sta_status rc;
  if (!g) return sta_error(STA_ERR_ARGUMENT, "geometry: expected a geometry, got NULL");
  if (layout != STA_BSHD && layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)layout);
  if (size < 1) return sta_error(STA_ERR_ARGUMENT, "size: expected >= 1 ranks, got %d", (int)size);
  if (rank < 0 || rank >= size)
    return sta_error(STA_ERR_ARGUMENT, "rank: expected 0..%d, got %d", (int)size - 1, (int)rank);
  for (int i = 0; i < 4; i++) {
    if (!t[i]) continue;
    if ((rc = sta_tensor_bshd(t[i], layout, names[i], &x[i])) != STA_OK) return rc;
  }
  memset(sp, 0, sizeof *sp);
  sp->p = size;
  sp->r = rank;
  for (int i = 0; i < 3; i++)
    if (g->canvas[i] < 1)
      return sta_error(STA_ERR_WINDOW, "canvas: %dx%dx%d, expected each >= 1",
                       (int)g->canvas[0], (int)g->canvas[1], (int)g->canvas[2]);
  sp->v = sta_geometry_video_tokens(g);
  if (sp->v % size != 0)
    return sta_error(STA_ERR_SHAPE,
                     "canvas: V = %lld video tokens (%dx%dx%d) is not divisible by "
                     "the %d ranks", (long long)sp->v, (int)g->canvas[0],
                     (int)g->canvas[1], (int)g->canvas[2], (int)size);
  sp->vr = sp->v / size;
  return STA_OK;
}

/* Fill the sizes of sp from a local [B, V/P + text, H, D] operand and check
** it and the global geometry. */
static sta_status split_local(split *sp, const sta_geometry *g, const sta_bshd *x,
                              const char *name) {
  sta_status rc;
  sp->b = x->b; sp->h = x->h; sp->d = x->d; sp->sl = x->s;
  if (sp->h % sp->p != 0)
    return sta_error(STA_ERR_SHAPE, "heads: %lld heads are not divisible by the %d ranks",
                     (long long)sp->h, (int)sp->p);
  sp->hl = sp->h / sp->p;
  if (sp->sl < sp->vr)
    return sta_error(STA_ERR_SEQ_LEN,
                     "%s: %lld rows on rank %d, expected V/P = %lld video rows "
                     "(+ text rows)", name, (long long)sp->sl, (int)sp->r,
                     (long long)sp->vr);
  sp->text = sp->sl - sp->vr;
  sp->s = sp->v + sp->text;
  if ((rc = sta_geometry_check(g, sp->s)) != STA_OK) return rc;
  return STA_OK;
}

static sta_status shard_common(sta_tensor *full, const sta_tensor *local,
                               const sta_geometry *g, sta_layout layout, int32_t rank,
                               int32_t size, int to_local) {
  static const char *const names[4] = {"local", "full", "", ""};
  const sta_tensor *t[4] = {local, full, NULL, NULL};
  sta_bshd xl, xf;
  split sp;
  sta_status rc;
  STA_CHECK_HANDLE(local, STA_KIND_TENSOR, "local");
  STA_CHECK_HANDLE(full, STA_KIND_TENSOR, "full");
  if ((rc = split_check(&sp, g, layout, t, names, rank, size)) != STA_OK) return rc;
  sta_tensor_bshd(local, layout, "local", &xl);
  sta_tensor_bshd(full, layout, "full", &xf);
  if (xf.s < sp.v)
    return sta_error(STA_ERR_SEQ_LEN, "seq_len %lld not supported for STA", (long long)xf.s);
  int64_t text = xf.s - sp.v;
  if (xl.b != xf.b || xl.h != xf.h || xl.d != xf.d || xl.s != sp.vr + text)
    return sta_error(STA_ERR_SHAPE,
                     "local: shape [B=%lld, S=%lld, heads=%lld, D=%lld], expected "
                     "[B=%lld, S=%lld (V/P %lld + text %lld), heads=%lld, D=%lld]",
                     (long long)xl.b, (long long)xl.s, (long long)xl.h, (long long)xl.d,
                     (long long)xf.b, (long long)(sp.vr + text), (long long)sp.vr,
                     (long long)text, (long long)xf.h, (long long)xf.d);
  /* views first, copies after: a failure leaves the destination as it was */
  sta_tensor *lv = NULL, *fv = NULL, *lt = NULL, *ft = NULL;
  rc = block(&lv, local, layout, 0, sp.vr, 0, xf.h);
  if (rc == STA_OK) rc = block(&fv, full, layout, rank * sp.vr, sp.vr, 0, xf.h);
  if (rc == STA_OK && text > 0) rc = block(&lt, local, layout, sp.vr, text, 0, xf.h);
  if (rc == STA_OK && text > 0) rc = block(&ft, full, layout, sp.v, text, 0, xf.h);
  if (rc == STA_OK) rc = to_local ? sta_tensor_copy(lv, fv) : sta_tensor_copy(fv, lv);
  if (rc == STA_OK && text > 0) rc = to_local ? sta_tensor_copy(lt, ft) : sta_tensor_copy(ft, lt);
  sta_tensor_destroy(lv);
  sta_tensor_destroy(fv);
  sta_tensor_destroy(lt);
  sta_tensor_destroy(ft);
  return rc;
}

sta_status sta_sp_shard(sta_tensor *local, const sta_tensor *full, const sta_geometry *g,
                        sta_layout layout, int32_t rank, int32_t size) {
  return shard_common((sta_tensor *)full, local, g, layout, rank, size, 1);
}

sta_status sta_sp_unshard(sta_tensor *full, const sta_tensor *local, const sta_geometry *g,
                          sta_layout layout, int32_t rank, int32_t size) {
  return shard_common(full, local, g, layout, rank, size, 0);
}

/* ---- Ulysses --------------------------------------------------------------------- */

/* What runs on the gathered [B, V + text, H/P, D] problem. */
typedef struct sp_job {
  /* check before the first collective (may be NULL) and compute */
  sta_status (*check)(struct sp_job *j, const sta_tensor *q, const sta_tensor *k,
                      const sta_tensor *v, const sta_tensor *out);
  sta_status (*compute)(struct sp_job *j, const sta_tensor *q, const sta_tensor *k,
                        const sta_tensor *v, sta_tensor *out);
  const sta_attention_desc *desc; /* sp_attention: the global desc */
  int32_t *windows;               /* sp_attention: this rank's windows */
  sta_layer *layer;               /* sp layer */
} sp_job;

/* Workspace sizes in 256-byte units (aligned sub-buffers). */
static size_t ws_round(size_t n) { return (n + 255) & ~(size_t)255; }

/* At least bytes of c's workspace on dev; a failed growth keeps the old one. */
static sta_status workspace(sta_comm *c, sta_device dev, size_t bytes, char **base) {
  sta_tensor *w = c->ws;
  if (!w || sta_tensor_device(w) != dev || (size_t)sta_tensor_numel(w) * 4 < bytes) {
    int64_t n = (int64_t)(bytes / 4) + 64;
    w = NULL;
    sta_status rc = sta_tensor_create(&w, STA_F32, dev, 1, &n);
    if (rc != STA_OK) return rc;
    sta_tensor_destroy(c->ws);
    c->ws = w;
  }
  /* 256-byte aligned start */
  *base = (char *)(((uintptr_t)sta_tensor_data(w) + 255) & ~(uintptr_t)255);
  return STA_OK;
}

static sta_status sp_run(sta_comm *c, const sta_geometry *g, sta_layout layout,
                         const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                         sta_tensor *out, sp_job *job) {
  static const char *const names[4] = {"q", "k", "v", "out"};
  const sta_tensor *t[4] = {q, k, v, out};
  sta_bshd x[4];
  split sp;
  sta_status rc;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  for (int i = 0; i < 4; i++)
    STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, names[i]);
  if ((rc = split_check(&sp, g, layout, t, names, sta_comm_rank(c), sta_comm_size(c))) != STA_OK)
    return rc;
  for (int i = 0; i < 4; i++) sta_tensor_bshd(t[i], layout, names[i], &x[i]);
  for (int i = 1; i < 4; i++) {
    if (x[i].b != x[0].b || x[i].s != x[0].s || x[i].h != x[0].h || x[i].d != x[0].d)
      return sta_error(STA_ERR_SHAPE,
                       "%s: shape [B=%lld, S=%lld, heads=%lld, D=%lld] differs from "
                       "q's [B=%lld, S=%lld, heads=%lld, D=%lld]", names[i],
                       (long long)x[i].b, (long long)x[i].s, (long long)x[i].h,
                       (long long)x[i].d, (long long)x[0].b, (long long)x[0].s,
                       (long long)x[0].h, (long long)x[0].d);
    if (t[i]->dtype != q->dtype)
      return sta_error(STA_ERR_DTYPE, "%s: dtype %s differs from q's %s", names[i],
                       sta_dtype_name(t[i]->dtype), sta_dtype_name(q->dtype));
    if (sta_tensor_device(t[i]) != sta_tensor_device(q))
      return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", names[i],
                       sta_device_name(sta_tensor_device(t[i])), sta_device_name(sta_tensor_device(q)));
  }
  if (x[0].b < 1 || x[0].h < 1 || x[0].d < 1)
    return sta_error(STA_ERR_SHAPE,
                     "q: batch, heads and D must be >= 1, got B=%lld heads=%lld D=%lld",
                     (long long)x[0].b, (long long)x[0].h, (long long)x[0].d);
  if ((rc = check_moves(c, q, "q")) != STA_OK) return rc;
  if ((rc = split_local(&sp, g, &x[0], "q")) != STA_OK) return rc;
  /* one rank holds every token and head: no data to move */
  if (sp.p == 1) return job->compute(job, q, k, v, out);

  sta_device dev = sta_tensor_device(q);
  sta_dtype dt = q->dtype;
  size_t es = sta_dtype_size(dt);
  int64_t chunk = sp.b * sp.vr * sp.hl * sp.d, tchunk = sp.b * sp.text * sp.hl * sp.d;
  int64_t fshape[4] = {sp.b, layout == STA_BSHD ? sp.s : sp.hl,
                       layout == STA_BSHD ? sp.hl : sp.s, sp.d};
  int64_t nbuf = 3 * sp.p * chunk, ntext = (sp.p + 1) * tchunk;
  sta_tensor *full[4] = {NULL, NULL, NULL, NULL}, *send = NULL, *recv = NULL, *txt = NULL;
  sta_tensor *a = NULL;
  int64_t one = 1;
  /* every buffer lives in the communicator's workspace: no allocation (and,
  ** on a GPU, no cudaMalloc/cudaFree) per forward once it has grown */
  size_t fbytes = ws_round((size_t)(sp.b * sp.s * sp.hl * sp.d) * es);
  size_t bbytes = ws_round((size_t)(nbuf ? nbuf : 1) * es);
  size_t tbytes = ws_round((size_t)(ntext ? ntext : 1) * es);
  char *ws = NULL;
  if ((rc = workspace(c, dev, 4 * fbytes + 2 * bbytes + tbytes, &ws)) != STA_OK) goto done;
  for (int i = 0; i < 4 && rc == STA_OK; i++)
    rc = sta_tensor_wrap(&full[i], ws + (size_t)i * fbytes, dt, dev, 4, fshape, NULL);
  ws += 4 * fbytes;
  if (rc == STA_OK) rc = sta_tensor_wrap(&send, ws, dt, dev, 1, nbuf ? &nbuf : &one, NULL);
  if (rc == STA_OK) rc = sta_tensor_wrap(&recv, ws + bbytes, dt, dev, 1, nbuf ? &nbuf : &one, NULL);
  if (rc == STA_OK)
    rc = sta_tensor_wrap(&txt, ws + 2 * bbytes, dt, dev, 1, ntext ? &ntext : &one, NULL);
  if (rc == STA_OK && job->check) rc = job->check(job, full[0], full[1], full[2], full[3]);
  if (rc != STA_OK) goto done;

  /* 1. video rows of every head -> all video rows of my heads */
  for (int32_t j = 0; j < sp.p && rc == STA_OK; j++)
    for (int i = 0; i < 3 && rc == STA_OK; i++) {
      rc = region(&a, send, (j * 3 + i) * chunk, layout, sp.b, sp.vr, sp.hl, sp.d);
      if (rc == STA_OK) rc = copy_block(a, 0, 0, t[i], 0, j * sp.hl, sp.vr, sp.hl, layout);
      sta_tensor_destroy(a);
      a = NULL;
    }
  if (rc == STA_OK)
    rc = c->t.all_to_all(c->t.self, sta_tensor_data(send), sta_tensor_data(recv),
                         (size_t)(3 * chunk) * es, dev);
  for (int32_t j = 0; j < sp.p && rc == STA_OK; j++)
    for (int i = 0; i < 3 && rc == STA_OK; i++) {
      rc = region(&a, recv, (j * 3 + i) * chunk, layout, sp.b, sp.vr, sp.hl, sp.d);
      if (rc == STA_OK) rc = copy_block(full[i], j * sp.vr, 0, a, 0, 0, sp.vr, sp.hl, layout);
      sta_tensor_destroy(a);
      a = NULL;
    }
  /* my heads of the (replicated) text rows */
  for (int i = 0; i < 3 && rc == STA_OK && sp.text > 0; i++)
    rc = copy_block(full[i], sp.v, 0, t[i], sp.vr, sp.r * sp.hl, sp.text, sp.hl, layout);
  /* 2. attention on my heads.  Loopback ranks share this machine's cores
  ** and the BLAS library's global settings: they compute one at a time. */
  if (rc == STA_OK) {
    pthread_mutex_t *turn = c->t.destroy == lb_destroy ? &((lb_rank *)c->t.self)->w->compute : NULL;
    if (turn) pthread_mutex_lock(turn);
    rc = job->compute(job, full[0], full[1], full[2], full[3]);
    if (turn) pthread_mutex_unlock(turn);
  }
  /* 3. video output back to the token split; text output gathered over heads */
  for (int32_t j = 0; j < sp.p && rc == STA_OK; j++) {
    rc = region(&a, send, j * chunk, layout, sp.b, sp.vr, sp.hl, sp.d);
    if (rc == STA_OK) rc = copy_block(a, 0, 0, full[3], j * sp.vr, 0, sp.vr, sp.hl, layout);
    sta_tensor_destroy(a);
    a = NULL;
  }
  if (rc == STA_OK)
    rc = c->t.all_to_all(c->t.self, sta_tensor_data(send), sta_tensor_data(recv),
                         (size_t)chunk * es, dev);
  if (rc == STA_OK && sp.text > 0) {
    rc = region(&a, txt, sp.p * tchunk, layout, sp.b, sp.text, sp.hl, sp.d);
    if (rc == STA_OK) rc = copy_block(a, 0, 0, full[3], sp.v, 0, sp.text, sp.hl, layout);
    sta_tensor_destroy(a);
    a = NULL;
    if (rc == STA_OK)
      rc = c->t.all_gather(c->t.self, (char *)sta_tensor_data(txt) + (size_t)(sp.p * tchunk) * es,
                           sta_tensor_data(txt), (size_t)tchunk * es, dev);
  }
  /* 4. only now write out: every view first, so a failure leaves out as it was */
  if (rc == STA_OK) {
    int32_t nv = sp.text > 0 ? 4 : 2;
    sta_tensor **views = sta_calloc((size_t)(nv * sp.p), sizeof *views);
    if (!views) rc = sta_error(STA_ERR_NOMEM, "out of host memory (SP output views)");
    for (int32_t j = 0; j < sp.p && rc == STA_OK; j++) {
      sta_tensor **w = views + nv * j;
      rc = region(&w[0], recv, j * chunk, layout, sp.b, sp.vr, sp.hl, sp.d);
      if (rc == STA_OK) rc = block(&w[1], out, layout, 0, sp.vr, j * sp.hl, sp.hl);
      if (rc == STA_OK && nv == 4)
        rc = region(&w[2], txt, j * tchunk, layout, sp.b, sp.text, sp.hl, sp.d);
      if (rc == STA_OK && nv == 4)
        rc = block(&w[3], out, layout, sp.vr, sp.text, j * sp.hl, sp.hl);
    }
    for (int32_t j = 0; j < sp.p && rc == STA_OK; j++) {
      sta_tensor **w = views + nv * j;
      rc = sta_tensor_copy(w[1], w[0]);
      if (rc == STA_OK && nv == 4) rc = sta_tensor_copy(w[3], w[2]);
    }
    if (views)
      for (int32_t i = 0; i < nv * sp.p; i++) sta_tensor_destroy(views[i]);
    free(views);
  }
done:
  for (int i = 0; i < 4; i++) sta_tensor_destroy(full[i]);
  sta_tensor_destroy(send);
  sta_tensor_destroy(recv);
  sta_tensor_destroy(txt);
  return rc;
}

/* sp_attention: the desc of my heads over the gathered sequence. */
static void local_desc(const sp_job *j, sta_attention_desc *d, int64_t hl) {
  *d = *j->desc;
  d->n_windows = j->desc->n_windows == 1 ? 1 : (int32_t)hl;
  d->windows = j->desc->n_windows == 1 ? j->desc->windows : j->windows;
}

static sta_status attn_check(sp_job *j, const sta_tensor *q, const sta_tensor *k,
                             const sta_tensor *v, const sta_tensor *out) {
  sta_attention_desc d;
  sta_attn_params p;
  local_desc(j, &d, q->shape[j->desc->layout == STA_BSHD ? 2 : 1]);
  sta_status rc = sta_attn_resolve(&d, q, k, v, out, NULL, &p);
  if (rc == STA_OK) free((void *)p.windows);
  return rc;
}

static sta_status attn_compute(sp_job *j, const sta_tensor *q, const sta_tensor *k,
                               const sta_tensor *v, sta_tensor *out) {
  sta_attention_desc d;
  local_desc(j, &d, q->shape[j->desc->layout == STA_BSHD ? 2 : 1]);
  return sta_attention_forward(&d, q, k, v, out, NULL);
}

sta_status sta_sp_attention(sta_comm *c, const sta_attention_desc *desc,
                            const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                            sta_tensor *out) {
  sta_status rc;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (!desc->windows) return sta_error(STA_ERR_WINDOW, "windows: expected an array, got NULL");
  sp_job job;
  memset(&job, 0, sizeof job);
  job.check = attn_check;
  job.compute = attn_compute;
  job.desc = desc;
  if (desc->n_windows != 1) {
    sta_bshd x;
    STA_CHECK_HANDLE(q, STA_KIND_TENSOR, "q");
    if ((desc->layout == STA_BSHD || desc->layout == STA_BHSD) &&
        sta_tensor_bshd(q, desc->layout, "q", &x) == STA_OK) {
      int32_t p = sta_comm_size(c), r = sta_comm_rank(c);
      if (desc->n_windows != x.h)
        return sta_error(STA_ERR_WINDOW, "n_windows: expected 1 or heads (%lld), got %d",
                         (long long)x.h, (int)desc->n_windows);
      if (x.h % p == 0) {
        int64_t hl = x.h / p;
        job.windows = sta_malloc(sizeof(int32_t) * 3 * (size_t)hl);
        if (!job.windows) return sta_error(STA_ERR_NOMEM, "out of host memory (windows)");
        /* check every global window here so the message names the global head */
        for (int64_t h = 0; h < x.h; h++)
          if ((rc = sta_window_check(&desc->geom, desc->windows + 3 * h)) != STA_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "head %lld: %s", (long long)h, sta_last_error());
            free(job.windows);
            return sta_error(rc, "%s", msg);
          }
        memcpy(job.windows, desc->windows + 3 * (size_t)r * (size_t)hl,
               sizeof(int32_t) * 3 * (size_t)hl);
      }
    }
  }
  rc = sp_run(c, &desc->geom, desc->layout, q, k, v, out, &job);
  free(job.windows);
  return rc;
}

/* ---- SP layers ------------------------------------------------------------------- */

struct sta_sp_layer {
  sta_comm *comm;
  sta_layer *layer;
  sta_geometry geom;
  sta_layout layout;
  int32_t local_heads;
};

static sta_status layer_compute(sp_job *j, const sta_tensor *q, const sta_tensor *k,
                                const sta_tensor *v, sta_tensor *out) {
  return sta_layer_forward(j->layer, q, k, v, out);
}

sta_status sta_sp_layer_create(sta_sp_layer **out, sta_comm *c, const sta_layer_desc *desc) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a layer description, got NULL");
  const int32_t *cv = desc->geom.canvas;
  if (cv[0] == 0 && cv[1] == 0 && cv[2] == 0)
    return sta_error(STA_ERR_WINDOW,
                     "geom: sequence parallelism needs the canvas (0x0x0 picks a known "
                     "shape by sequence length, which a rank's shard does not have)");
  sta_layer_desc d = *desc;
  d.sp_rank = sta_comm_rank(c);
  d.sp_size = sta_comm_size(c);
  sta_status rc;
  if (!(c->t.devices & (1u << (desc->backend == STA_CUDA ? STA_CUDA : STA_CPU))))
    return sta_error(STA_ERR_ARGUMENT, "backend: the %s communicator does not move %s memory",
                     c->t.name, sta_device_name(desc->backend));
  sta_sp_layer *l = sta_calloc(1, sizeof *l);
  if (!l) return sta_error(STA_ERR_NOMEM, "out of host memory (SP layer)");
  if ((rc = sta_handle_add(l, STA_KIND_SP_LAYER)) != STA_OK) {
    free(l);
    return rc;
  }
  if ((rc = sta_layer_create(&l->layer, &d)) != STA_OK) {
    sta_handle_remove(l);
    free(l);
    return rc;
  }
  l->comm = c;
  sta_comm_retain(c);
  l->geom = desc->geom;
  l->layout = desc->layout;
  l->local_heads = desc->local_heads;
  *out = l;
  return STA_OK;
}

void sta_sp_layer_destroy(sta_sp_layer *l) {
  if (!sta_handle_live(l, STA_KIND_SP_LAYER)) return;
  sta_handle_remove(l);
  sta_layer_destroy(l->layer);
  sta_comm_destroy(l->comm); /* the layer's reference */
  free(l);
}

sta_layer *sta_sp_layer_base(const sta_sp_layer *l) {
  return sta_handle_check(l, STA_KIND_SP_LAYER, "layer") == STA_OK ? l->layer : NULL;
}

sta_status sta_sp_layer_forward(sta_sp_layer *l, const sta_tensor *q, const sta_tensor *k,
                                const sta_tensor *v, sta_tensor *out) {
  STA_CHECK_HANDLE(l, STA_KIND_SP_LAYER, "layer");
  STA_CHECK_HANDLE(l->comm, STA_KIND_COMM, "comm (the SP layer's)");
  sp_job job;
  memset(&job, 0, sizeof job);
  job.compute = layer_compute;
  job.layer = l->layer;
  sta_bshd x;
  int32_t p = sta_comm_size(l->comm);
  if (q && sta_tensor_bshd(q, l->layout, "q", &x) == STA_OK &&
      x.h != (int64_t)l->local_heads * p)
    return sta_error(STA_ERR_SHAPE,
                     "q: expected %lld heads (local_heads %d x %d ranks), got %lld",
                     (long long)l->local_heads * p, (int)l->local_heads, (int)p,
                     (long long)x.h);
  return sp_run(l->comm, &l->geom, l->layout, q, k, v, out, &job);
}
