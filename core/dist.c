/*
** dist.c -- sequence parallelism (Ulysses): communicators over a transport
** table, the in-process loopback transport, strided block copies, and SP
** attention / SP layers as a pipeline over head chunks.  The process
** transports (NCCL, TCP) and the bootstrap are dist_nccl.c.
*/
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "internal.h"

#ifdef STA_WITH_CUDA
/* cudart (linked in with the CUDA backend): the pipeline's second stream,
** its events, strided copies.  Opaque pointers for cudaStream_t and
** cudaEvent_t, int for cudaError_t and cudaMemcpyKind. */
int cudaStreamCreateWithFlags(void **stream, unsigned flags);
int cudaStreamDestroy(void *stream);
int cudaEventCreateWithFlags(void **event, unsigned flags);
int cudaEventDestroy(void *event);
int cudaEventRecord(void *event, void *stream);
int cudaStreamWaitEvent(void *stream, void *event, unsigned flags);
int cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                      size_t height, int kind, void *stream);
int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream);
const char *cudaGetErrorString(int error);
enum { CUDA_STREAM_NON_BLOCKING = 1, CUDA_EVENT_NO_TIMING = 2, CUDA_COPY_DEFAULT = 4 };
#endif

#define MAX_LOOPBACK 64
#define MAX_CHUNKS 64

/* The pipeline's CUDA stream and events: in[c], comp[c], out[c], then
** start and end (see sp_pipeline). */
enum { EV_IN = 0, EV_COMP = MAX_CHUNKS, EV_OUT = 2 * MAX_CHUNKS, EV_START = 3 * MAX_CHUNKS,
       EV_END, N_EVENTS };

struct sta_comm {
  int32_t refs; /* the creator's and every SP layer's that holds it */
  sta_transport t;
  int32_t chunks; /* sta_comm_set_chunks; 0: choose */
  sta_tensor *ws; /* SP workspace, kept between forwards (grown, never shrunk) */
  sta_tensor *dbuf; /* the descriptor's device bytes (a transport of CUDA memory only) */
  void *side;       /* CUDA: the second stream, made on first use */
  void *ev[N_EVENTS];
};

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
  sta_tensor_destroy(c->dbuf);
#ifdef STA_WITH_CUDA
  for (int i = 0; i < N_EVENTS; i++)
    if (c->ev[i]) (void)cudaEventDestroy(c->ev[i]);
  if (c->side) (void)cudaStreamDestroy(c->side);
#endif
  free(c);
}

static int live(const sta_comm *c) {
  return sta_handle_check(c, STA_KIND_COMM, "comm") == STA_OK;
}

int32_t sta_comm_rank(const sta_comm *c) { return live(c) ? c->t.rank(c->t.self) : -1; }
int32_t sta_comm_size(const sta_comm *c) { return live(c) ? c->t.size(c->t.self) : 0; }
const char *sta_comm_name(const sta_comm *c) { return live(c) ? c->t.name : "none"; }

sta_status sta_comm_set_chunks(sta_comm *c, int32_t n) {
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (n < 0 || n > MAX_CHUNKS)
    return sta_error(STA_ERR_ARGUMENT, "n: expected 0 (choose) or 1..%d chunks, got %d",
                     MAX_CHUNKS, (int)n);
  c->chunks = n;
  return STA_OK;
}

int32_t sta_comm_chunks(const sta_comm *c) { return live(c) ? c->chunks : 0; }

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

/* ---- strided blocks (sta_span) --------------------------------------------- */

static int64_t span_bytes(const sta_span *s) { return s->run * s->n[0] * s->n[1] * s->n[2]; }

/* Block 0 of s when its runs lie back to back and so do the size blocks
** (one buffer of size chunks, as all_to_all takes), else NULL. */
static void *span_dense(const sta_span *s, int32_t size) {
  int64_t b = s->run;
  for (int i = 0; i < 3; i++) {
    if (s->n[i] > 1 && s->pitch[i] != b) return NULL;
    b *= s->n[i];
  }
  return size == 1 || s->peer == b ? s->base : NULL;
}

/* s's shape with dense blocks at base. */
static sta_span span_packed(const sta_span *s, void *base) {
  sta_span d = *s;
  d.base = base;
  d.pitch[0] = s->run;
  d.pitch[1] = s->run * s->n[0];
  d.pitch[2] = d.pitch[1] * s->n[1];
  d.peer = span_bytes(s);
  return d;
}

/* Fold the levels two spans of one shape both keep contiguous into the
** run (and drop levels of one), so a copy takes few, long runs. */
static void span_fold(sta_span *a, sta_span *b) {
  int64_t n[3], pa[3], pb[3];
  int k = 0;
  for (int i = 0; i < 3; i++) {
    if (a->n[i] == 1) continue;
    int64_t ea = k ? n[k - 1] * pa[k - 1] : a->run, eb = k ? n[k - 1] * pb[k - 1] : b->run;
    if (a->pitch[i] == ea && b->pitch[i] == eb) {
      if (k) n[k - 1] *= a->n[i];
      else { a->run *= a->n[i]; b->run *= a->n[i]; }
      continue;
    }
    n[k] = a->n[i]; pa[k] = a->pitch[i]; pb[k] = b->pitch[i];
    k++;
  }
  for (; k < 3; k++) { n[k] = 1; pa[k] = pb[k] = 0; }
  for (int i = 0; i < 3; i++) {
    a->n[i] = b->n[i] = n[i];
    a->pitch[i] = pa[i];
    b->pitch[i] = pb[i];
  }
}

#ifdef STA_WITH_CUDA
static sta_status cuda_check(int e, const char *what) {
  if (e == 0) return STA_OK;
  return sta_error(STA_ERR_DEVICE, "cuda: %s failed: %s (%d)", what, cudaGetErrorString(e), e);
}
#endif

/* Block dj of dst <- block sj of src (one run and n[]; folded here), on
** dev: CUDA copies are queued on this thread's stream. */
static sta_status span_copy(const sta_span *dst_, int64_t dj, const sta_span *src_, int64_t sj,
                            sta_device dev) {
  sta_span dst = *dst_, src = *src_;
  span_fold(&dst, &src);
  const char *s0 = (const char *)src.base + sj * src.peer;
  char *d0 = (char *)dst.base + dj * dst.peer;
  int64_t run = src.run, n0 = src.n[0];
  for (int64_t i2 = 0; i2 < src.n[2]; i2++)
    for (int64_t i1 = 0; i1 < src.n[1]; i1++) {
      const char *s = s0 + i2 * src.pitch[2] + i1 * src.pitch[1];
      char *d = d0 + i2 * dst.pitch[2] + i1 * dst.pitch[1];
      if (dev == STA_CPU) {
        for (int64_t i0 = 0; i0 < n0; i0++)
          memcpy(d + i0 * dst.pitch[0], s + i0 * src.pitch[0], (size_t)run);
        continue;
      }
#ifdef STA_WITH_CUDA
      void *st = sta_cuda_get_stream();
      sta_status rc = STA_OK;
      if (n0 == 1 || (src.pitch[0] >= run && dst.pitch[0] >= run))
        rc = cuda_check(cudaMemcpy2DAsync(d, (size_t)(n0 == 1 ? run : dst.pitch[0]), s,
                                          (size_t)(n0 == 1 ? run : src.pitch[0]), (size_t)run,
                                          (size_t)n0, CUDA_COPY_DEFAULT, st),
                        "cudaMemcpy2DAsync");
      else /* overlapping or negative pitches: run by run */
        for (int64_t i0 = 0; i0 < n0 && rc == STA_OK; i0++)
          rc = cuda_check(cudaMemcpyAsync(d + i0 * dst.pitch[0], s + i0 * src.pitch[0],
                                          (size_t)run, CUDA_COPY_DEFAULT, st),
                          "cudaMemcpyAsync");
      if (rc != STA_OK) return rc;
#else
      return sta_error(STA_ERR_BACKEND, "st attn not supported");
#endif
    }
  return STA_OK;
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

/* Post what I send (once my device work that writes it is done), wait,
** copy what I need from the others' posts, wait again so no one reuses a
** buffer still being read.  Either bytes (chunk, stride: bytes between
** one sender's chunks for different ranks, 0 for all-gather) or n spans. */
static sta_status lb_exchange(lb_rank *me, const void *send, void *recv, size_t chunk,
                              size_t stride, int32_t n, const sta_span *spans, sta_device d) {
  lb_world *w = me->w;
  sta_status rc = STA_OK;
  if (d != STA_CPU && (rc = sta_backend_get(d)->synchronize()) != STA_OK) {
    lb_abort(w);
    return rc;
  }
  w->posted[me->rank] = send;
  if ((rc = lb_wait(me)) != STA_OK) return rc;
  for (int32_t j = 0; j < w->size && rc == STA_OK; j++) {
    if (spans)
      for (int32_t i = 0; i < n && rc == STA_OK; i++)
        rc = span_copy(&spans[i], j, (const sta_span *)w->posted[j] + i, me->rank, d);
    else
      rc = lb_copy((char *)recv + (size_t)j * chunk,
                   (const char *)w->posted[j] + (size_t)me->rank * stride, chunk, d);
  }
  if (rc == STA_OK && d != STA_CPU) rc = sta_backend_get(d)->synchronize();
  if (rc != STA_OK) { lb_abort(w); return rc; }
  return lb_wait(me);
}

static sta_status lb_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  return lb_exchange(self, send, recv, chunk, chunk, 0, NULL, d);
}

static sta_status lb_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  return lb_exchange(self, send, recv, chunk, 0, 0, NULL, d);
}

/* Strided blocks straight from the senders' memory into the receivers'. */
static sta_status lb_all_to_all_spans(void *self, int32_t n, const sta_span *send,
                                      const sta_span *recv, sta_device d) {
  return lb_exchange(self, send, NULL, 0, 0, n, recv, d);
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
                       lb_size_of, lb_all_to_all, lb_all_gather, lb_barrier, lb_destroy,
                       lb_all_to_all_spans};
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

/* The split of one problem: P ranks, V video tokens, local rows, ... */
typedef struct split {
  int32_t p, r;
  int64_t b, h, d, hl, v, vr, sl, s, text;
} split;

/* Shards are ranges of untiled tokens: the tiled order is refused. */
static sta_status untiled_only(const sta_geometry *g) {
  if (g->order == STA_ORDER_UNTILED) return STA_OK;
  return sta_error(STA_ERR_UNSUPPORTED,
                   "order: sequence parallelism takes the untiled order (shards are ranges "
                   "of untiled tokens), got %d", (int)g->order);
}

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
  if ((rc = untiled_only(g)) != STA_OK) return rc;
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

/* ---- Ulysses: the job, the descriptor, the pipeline -------------------------------- */

struct pipe;

/* What runs on the gathered [B, V + text, heads of a chunk, D] problem. */
typedef struct sp_job {
  /* checks that need the split (may be NULL), before any data moves */
  sta_status (*prepare)(struct sp_job *j, const struct pipe *p);
  /* check the gathered operands of chunk 0 (may be NULL) */
  sta_status (*check)(struct sp_job *j, const sta_tensor *q, const sta_tensor *k,
                      const sta_tensor *v, const sta_tensor *out);
  /* the chunk whose first local head is h0 */
  sta_status (*compute)(struct sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                        const sta_tensor *v, sta_tensor *out);
  const sta_attention_desc *desc; /* sp_attention: the global desc */
  int32_t *windows;               /* sp_attention, per-head windows: this rank's */
  uint64_t hash;                  /* sp_attention: of the global windows */
  sta_layer *layer;               /* SP layer */
} sp_job;

/* One SP call of this rank: the split, the shards, the gathered buffers of
** two chunks (slot c % 2) and the pack buffer, all in c's workspace. */
typedef struct pipe {
  sta_comm *c;
  sp_job *job;
  split sp;
  sta_layout layout;
  sta_device dev;
  int64_t es, n, hc;   /* element bytes, chunks, heads per chunk */
  const sta_tensor *t[4];
  sta_bshd x[4], gx;
  sta_tensor *g[2][4]; /* q, k, v, out of [B, S, hc, D] per slot */
  char *scratch;
  int lanes;           /* CUDA streams: the caller's (main) and c->side */
  void *main;
} pipe;

/* What every rank sends before any data moves; all fields are compared. */
typedef struct sp_desc {
  char magic[8]; /* "sta-sp1" */
  int32_t status, dtype, layout, device, chunks, softmax, precision, n_windows, layer, step;
  int32_t canvas[3], tile[3];
  int64_t b, s, h, d, text_len;
  uint32_t scale;
  uint64_t windows;
  char msg[384]; /* status's message */
} sp_desc;

static int is_loopback(const sta_comm *c);

/* Workspace sizes in 256-byte units (aligned sub-buffers). */
static int64_t ws_round(int64_t n) { return (n + 255) & ~(int64_t)255; }

/* At least bytes of c's workspace on dev; a failed growth keeps the old one. */
static sta_status workspace(sta_comm *c, sta_device dev, int64_t bytes, char **base) {
  sta_tensor *w = c->ws;
  if (!w || sta_tensor_device(w) != dev || sta_tensor_numel(w) * 4 < bytes) {
    int64_t n = bytes / 4 + 64;
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

/* The CUDA stream and events of c's pipeline, made once. */
static sta_status lanes_ready(sta_comm *c) {
#ifdef STA_WITH_CUDA
  sta_status rc = STA_OK;
  if (!c->side)
    rc = cuda_check(cudaStreamCreateWithFlags(&c->side, CUDA_STREAM_NON_BLOCKING),
                    "cudaStreamCreateWithFlags");
  for (int i = 0; i < N_EVENTS && rc == STA_OK; i++)
    if (!c->ev[i])
      rc = cuda_check(cudaEventCreateWithFlags(&c->ev[i], CUDA_EVENT_NO_TIMING),
                      "cudaEventCreateWithFlags");
  return rc;
#else
  (void)c;
  return sta_error(STA_ERR_BACKEND, "st attn not supported");
#endif
}

/* Work after this goes to the side lane (side) or the caller's stream. */
static void lane_use(const pipe *p, int side) {
  if (p->lanes) sta_cuda_set_stream(side ? p->c->side : p->main);
}

/* Record event ev on a lane, or make a lane wait for it. */
static sta_status lane_mark(const pipe *p, int ev, int side) {
#ifdef STA_WITH_CUDA
  if (p->lanes)
    return cuda_check(cudaEventRecord(p->c->ev[ev], side ? p->c->side : p->main),
                      "cudaEventRecord");
#else
  (void)p; (void)ev; (void)side;
#endif
  return STA_OK;
}

static sta_status lane_wait(const pipe *p, int side, int ev) {
#ifdef STA_WITH_CUDA
  if (p->lanes)
    return cuda_check(cudaStreamWaitEvent(side ? p->c->side : p->main, p->c->ev[ev], 0),
                      "cudaStreamWaitEvent");
#else
  (void)p; (void)ev; (void)side;
#endif
  return STA_OK;
}

/* Rows [s0, s0 + rows) and heads [h0, h0 + hn) of t (x its sizes), block j
** jr rows and jh heads further on (rank j's). */
static sta_span span_of(const pipe *p, const sta_tensor *t, const sta_bshd *x, int64_t s0,
                        int64_t rows, int64_t h0, int64_t hn, int64_t jr, int64_t jh) {
  int64_t es = p->es;
  int bshd = p->layout == STA_BSHD;
  sta_span s;
  s.base = (char *)sta_tensor_data(t) + (s0 * x->ss + h0 * x->sh) * es;
  s.peer = (jr * x->ss + jh * x->sh) * es;
  s.run = x->d * es;
  s.n[0] = bshd ? hn : rows;
  s.pitch[0] = (bshd ? x->sh : x->ss) * es;
  s.n[1] = bshd ? rows : hn;
  s.pitch[1] = (bshd ? x->ss : x->sh) * es;
  s.n[2] = x->b;
  s.pitch[2] = x->sb * es;
  return s;
}

/* An all-to-all of n strided blocks: in place through the transport's
** all_to_all_spans, else each block packed (or received) in the scratch
** buffer where it is not already one dense buffer. */
static sta_status move(const pipe *p, int32_t n, const sta_span *send, const sta_span *recv) {
  sta_transport *t = &p->c->t;
  int32_t np = p->sp.p;
  sta_status rc = STA_OK;
  if (t->all_to_all_spans) return t->all_to_all_spans(t->self, n, send, recv, p->dev);
  for (int32_t i = 0; i < n && rc == STA_OK; i++) {
    int64_t blk = span_bytes(&send[i]);
    const void *sb = span_dense(&send[i], np);
    void *rb = span_dense(&recv[i], np);
    sta_span packed = span_packed(&send[i], p->scratch);
    sta_span staged = span_packed(&recv[i], p->scratch + np * blk);
    for (int32_t j = 0; j < np && !sb && rc == STA_OK; j++)
      rc = span_copy(&packed, j, &send[i], j, p->dev);
    if (rc == STA_OK)
      rc = t->all_to_all(t->self, sb ? sb : packed.base, rb ? rb : staged.base, (size_t)blk,
                         p->dev);
    for (int32_t j = 0; j < np && !rb && rc == STA_OK; j++)
      rc = span_copy(&recv[i], j, &staged, j, p->dev);
  }
  return rc;
}

/* Chunk c in: the video rows of its heads from every rank (all-to-all),
** its heads of the (replicated) text rows from the shards. */
static sta_status step_in(const pipe *p, int64_t c) {
  const split *sp = &p->sp;
  sta_tensor *const *g = p->g[c & 1];
  sta_span send[3], recv[3];
  sta_status rc;
  for (int i = 0; i < 3; i++) {
    send[i] = span_of(p, p->t[i], &p->x[i], 0, sp->vr, c * p->hc, p->hc, 0, sp->hl);
    recv[i] = span_of(p, g[i], &p->gx, 0, sp->vr, 0, p->hc, sp->vr, 0);
  }
  rc = move(p, 3, send, recv);
  for (int i = 0; i < 3 && rc == STA_OK && sp->text > 0; i++) {
    sta_span src = span_of(p, p->t[i], &p->x[i], sp->vr, sp->text,
                           sp->r * sp->hl + c * p->hc, p->hc, 0, 0);
    sta_span dst = span_of(p, g[i], &p->gx, sp->v, sp->text, 0, p->hc, 0, 0);
    rc = span_copy(&dst, 0, &src, 0, p->dev);
  }
  return rc;
}

/* Chunk c's attention.  Loopback ranks share this machine's cores and the
** BLAS library's global settings: they compute one at a time. */
static sta_status step_compute(const pipe *p, int64_t c) {
  sta_tensor *const *g = p->g[c & 1];
  const sta_comm *cm = p->c;
  pthread_mutex_t *turn = is_loopback(cm) ? &((lb_rank *)cm->t.self)->w->compute : NULL;
  if (turn) pthread_mutex_lock(turn);
  sta_status rc = p->job->compute(p->job, c * p->hc, g[0], g[1], g[2], g[3]);
  if (turn) pthread_mutex_unlock(turn);
  return rc;
}

/* Chunk c out: its video output to the ranks that hold those rows (into
** their out, in place), its text output to every rank (all-gather). */
static sta_status step_out(const pipe *p, int64_t c) {
  const split *sp = &p->sp;
  sta_tensor *o = p->g[c & 1][3];
  sta_span send = span_of(p, o, &p->gx, 0, sp->vr, 0, p->hc, sp->vr, 0);
  sta_span recv = span_of(p, p->t[3], &p->x[3], 0, sp->vr, c * p->hc, p->hc, 0, sp->hl);
  sta_status rc = move(p, 1, &send, &recv);
  if (rc != STA_OK || sp->text == 0) return rc;
  sta_span src = span_of(p, o, &p->gx, sp->v, sp->text, 0, p->hc, 0, 0);
  sta_span mine = span_packed(&src, p->scratch), all = span_packed(&src, p->scratch + mine.peer);
  sta_span dst = span_of(p, p->t[3], &p->x[3], sp->vr, sp->text, c * p->hc, p->hc, 0, sp->hl);
  rc = span_copy(&mine, 0, &src, 0, p->dev);
  if (rc == STA_OK)
    rc = p->c->t.all_gather(p->c->t.self, mine.base, all.base, (size_t)mine.peer, p->dev);
  for (int32_t j = 0; j < sp->p && rc == STA_OK; j++) rc = span_copy(&dst, j, &all, j, p->dev);
  return rc;
}

/* The chunk schedule: in(0), in(1), then for each chunk c: compute(c);
** out(c); in(c + 2).  With CUDA lanes the exchanges run on the side
** stream and compute on the caller's, ordered by events: in(c) before
** compute(c); compute(c) before out(c) and before in(c + 2) (which
** reuses its slot); out(c - 2) before compute(c) (which reuses its output
** slot).  So out(c - 1) and in(c + 1) run while compute(c) does.  Without
** lanes the same steps run one after another in this order. */
static sta_status pipeline(const pipe *p) {
  int64_t n = p->n;
  sta_status rc = lane_mark(p, EV_START, 0);
  if (rc == STA_OK) rc = lane_wait(p, 1, EV_START);
  lane_use(p, 1);
  for (int64_t c = 0; c < 2 && c < n && rc == STA_OK; c++) {
    rc = step_in(p, c);
    if (rc == STA_OK) rc = lane_mark(p, EV_IN + (int)c, 1);
  }
  for (int64_t c = 0; c < n && rc == STA_OK; c++) {
    rc = lane_wait(p, 0, EV_IN + (int)c);
    if (rc == STA_OK && c >= 2) rc = lane_wait(p, 0, EV_OUT + (int)c - 2);
    lane_use(p, 0);
    if (rc == STA_OK) rc = step_compute(p, c);
    if (rc == STA_OK) rc = lane_mark(p, EV_COMP + (int)c, 0);
    if (rc == STA_OK) rc = lane_wait(p, 1, EV_COMP + (int)c);
    lane_use(p, 1);
    if (rc == STA_OK) rc = step_out(p, c);
    if (rc == STA_OK) rc = lane_mark(p, EV_OUT + (int)c, 1);
    if (rc == STA_OK && c + 2 < n) rc = step_in(p, c + 2);
    if (rc == STA_OK && c + 2 < n) rc = lane_mark(p, EV_IN + (int)c + 2, 1);
  }
  /* the caller's stream waits for the side lane, after a failure too (the
  ** workspace is in use until then) */
  if (lane_mark(p, EV_END, 1) == STA_OK) (void)lane_wait(p, 0, EV_END);
  lane_use(p, 0);
  return rc;
}

/* ---- Ulysses: this rank's checks, then every rank's agreement ---------------------- */

static const char *const OPS[4] = {"q", "k", "v", "out"};

/* Byte range [lo, hi] of t's view in its storage. */
static void bytes_of(const sta_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)sta_dtype_size(t->dtype);
  sta_tensor_extent(t, lo, hi);
  *lo *= es;
  *hi = *hi * es + es - 1;
}

/* This rank's own checks (with the caller's status pre), then the chunk
** count and, when data will move, the gathered buffers and the lanes.
** Everything that can fail before any data moves fails here. */
static sta_status prepare(pipe *p, sta_comm *c, const sta_geometry *g, sta_layout layout,
                          const sta_tensor *const t[4], sp_job *job, sta_status pre) {
  sta_status rc;
  split *sp = &p->sp;
  memset(p, 0, sizeof *p);
  p->c = c;
  p->job = job;
  p->layout = layout;
  if (pre != STA_OK) return pre;
  for (int i = 0; i < 4; i++) {
    STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, OPS[i]);
    p->t[i] = t[i];
  }
  if ((rc = split_check(sp, g, layout, t, OPS, sta_comm_rank(c), sta_comm_size(c))) != STA_OK)
    return rc;
  for (int i = 0; i < 4; i++) {
    sta_bshd *x = &p->x[i];
    sta_tensor_bshd(t[i], layout, OPS[i], x);
    if (i > 0 && (x->b != p->x[0].b || x->s != p->x[0].s || x->h != p->x[0].h || x->d != p->x[0].d))
      return sta_error(STA_ERR_SHAPE,
                       "%s: shape [B=%lld, S=%lld, heads=%lld, D=%lld] differs from "
                       "q's [B=%lld, S=%lld, heads=%lld, D=%lld]", OPS[i],
                       (long long)x->b, (long long)x->s, (long long)x->h,
                       (long long)x->d, (long long)p->x[0].b, (long long)p->x[0].s,
                       (long long)p->x[0].h, (long long)p->x[0].d);
    if (t[i]->dtype != t[0]->dtype)
      return sta_error(STA_ERR_DTYPE, "%s: dtype %s differs from q's %s", OPS[i],
                       sta_dtype_name(t[i]->dtype), sta_dtype_name(t[0]->dtype));
    if (sta_tensor_device(t[i]) != sta_tensor_device(t[0]))
      return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", OPS[i],
                       sta_device_name(sta_tensor_device(t[i])),
                       sta_device_name(sta_tensor_device(t[0])));
    if (x->d > 1 && x->sd != 1)
      return sta_error(STA_ERR_SHAPE,
                       "%s: the head dimension must be contiguous (stride 1), got stride %lld",
                       OPS[i], (long long)x->sd);
  }
  const sta_bshd *x = &p->x[0];
  if (x->b < 1 || x->h < 1 || x->d < 1)
    return sta_error(STA_ERR_SHAPE,
                     "q: batch, heads and D must be >= 1, got B=%lld heads=%lld D=%lld",
                     (long long)x->b, (long long)x->h, (long long)x->d);
  for (int i = 0; i < 3; i++) { /* out is written while the inputs are read */
    int64_t a0, a1, b0, b1;
    if (t[3]->storage != t[i]->storage || sta_tensor_numel(t[i]) == 0) continue;
    bytes_of(t[3], &a0, &a1);
    bytes_of(t[i], &b0, &b1);
    if (a0 <= b1 && b0 <= a1)
      return sta_error(STA_ERR_ARGUMENT, "out: shares memory with %s (the forward writes out "
                       "while reading %s; use a separate tensor)", OPS[i], OPS[i]);
  }
  if ((rc = check_moves(c, t[0], "q")) != STA_OK) return rc;
  if ((rc = split_local(sp, g, x, "q")) != STA_OK) return rc;
  if (job->prepare && (rc = job->prepare(job, p)) != STA_OK) return rc;
  p->dev = sta_tensor_device(t[0]);
  p->es = (int64_t)sta_dtype_size(t[0]->dtype);
  if (c->chunks > 0 && sp->hl % c->chunks != 0)
    return sta_error(STA_ERR_ARGUMENT, "chunks: %d do not divide the %lld heads of each rank "
                     "(%lld heads / %d ranks; sta_comm_set_chunks)", (int)c->chunks,
                     (long long)sp->hl, (long long)sp->h, (int)sp->p);
  p->n = c->chunks > 0 ? c->chunks : 1;
  if (c->chunks == 0 && p->dev == STA_CUDA && sp->p > 1)
    for (p->n = 4; sp->hl % p->n != 0; p->n--) {}
  if (job->layer) p->n = 1; /* a layer's windows come whole from its context */
  p->hc = sp->hl / p->n;
  if (sp->p == 1 && p->n == 1) return STA_OK; /* nothing to move */

  /* the gathered [B, V + text, hc, D] of two slots, then the pack buffer */
  int64_t fshape[4] = {sp->b, layout == STA_BSHD ? sp->s : p->hc,
                       layout == STA_BSHD ? p->hc : sp->s, sp->d};
  int64_t fbytes = ws_round(sp->b * sp->s * p->hc * sp->d * p->es);
  int64_t blk = sp->b * sp->vr * p->hc * sp->d * p->es;
  int64_t tb = sp->b * sp->text * p->hc * sp->d * p->es;
  int64_t pack = c->t.all_to_all_spans ? 0 : 2 * sp->p * blk;
  int64_t slots = p->n > 1 ? 2 : 1;
  char *ws = NULL;
  if (pack < (sp->p + 1) * tb) pack = (sp->p + 1) * tb;
  if ((rc = workspace(c, p->dev, slots * 4 * fbytes + ws_round(pack + 1), &ws)) != STA_OK)
    return rc;
  for (int64_t s = 0; s < slots; s++)
    for (int i = 0; i < 4 && rc == STA_OK; i++)
      rc = sta_tensor_wrap(&p->g[s][i], ws + (s * 4 + i) * fbytes, t[0]->dtype, p->dev, 4,
                           fshape, NULL);
  p->scratch = ws + slots * 4 * fbytes;
  if (rc == STA_OK) rc = sta_tensor_bshd(p->g[0][0], layout, "q", &p->gx);
  if (rc == STA_OK && job->check)
    rc = job->check(job, p->g[0][0], p->g[0][1], p->g[0][2], p->g[0][3]);
  if (rc == STA_OK && p->dev == STA_CUDA && p->n > 1) {
    rc = lanes_ready(c);
    p->lanes = rc == STA_OK;
    p->main = sta_cuda_get_stream();
  }
  return rc;
}

static void pipe_free(pipe *p) {
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 4; i++) sta_tensor_destroy(p->g[s][i]);
}

/* FNV-1a over n bytes. */
static uint64_t fnv(const void *data, size_t n) {
  const unsigned char *b = data;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

static const char *layout_name(int32_t l) {
  return l == STA_BSHD ? "BSHD" : l == STA_BHSD ? "BHSD" : "?";
}

/* The first field in which rank r's call differs from rank 0's. */
static sta_status disagree(const sp_desc *a, const sp_desc *b, int32_t r) {
  const char *pre = "ranks disagree on";
  if (a->dtype != b->dtype)
    return sta_error(STA_ERR_DTYPE, "%s the dtype: rank 0 has %s, rank %d has %s", pre,
                     sta_dtype_name(a->dtype), (int)r, sta_dtype_name(b->dtype));
  if (a->layout != b->layout)
    return sta_error(STA_ERR_ARGUMENT, "%s the layout: rank 0 has %s, rank %d has %s", pre,
                     layout_name(a->layout), (int)r, layout_name(b->layout));
  if (a->device != b->device)
    return sta_error(STA_ERR_ARGUMENT, "%s the device: rank 0 has %s, rank %d has %s", pre,
                     sta_device_name(a->device), (int)r, sta_device_name(b->device));
  if (a->h != b->h)
    return sta_error(STA_ERR_SHAPE, "%s the heads: rank 0 has %lld, rank %d has %lld", pre,
                     (long long)a->h, (int)r, (long long)b->h);
  if (a->b != b->b || a->s != b->s || a->d != b->d)
    return sta_error(STA_ERR_SHAPE, "%s q's shape: rank 0 has [B=%lld, S=%lld, heads=%lld, "
                     "D=%lld], rank %d has [B=%lld, S=%lld, heads=%lld, D=%lld]", pre,
                     (long long)a->b, (long long)a->s, (long long)a->h, (long long)a->d, (int)r,
                     (long long)b->b, (long long)b->s, (long long)b->h, (long long)b->d);
  if (memcmp(a->canvas, b->canvas, sizeof a->canvas) || memcmp(a->tile, b->tile, sizeof a->tile) ||
      a->text_len != b->text_len)
    return sta_error(STA_ERR_WINDOW, "%s the geometry: rank 0 has canvas %dx%dx%d, tile "
                     "%dx%dx%d, text_len %lld; rank %d has canvas %dx%dx%d, tile %dx%dx%d, "
                     "text_len %lld", pre, a->canvas[0], a->canvas[1], a->canvas[2], a->tile[0],
                     a->tile[1], a->tile[2], (long long)a->text_len, (int)r, b->canvas[0],
                     b->canvas[1], b->canvas[2], b->tile[0], b->tile[1], b->tile[2],
                     (long long)b->text_len);
  if (a->n_windows != b->n_windows || a->windows != b->windows)
    return sta_error(STA_ERR_WINDOW, "%s the windows: rank %d's differ from rank 0's "
                     "(n_windows %d and %d)", pre, (int)r, (int)b->n_windows, (int)a->n_windows);
  if (a->scale != b->scale || a->softmax != b->softmax || a->precision != b->precision) {
    float fa, fb;
    memcpy(&fa, &a->scale, 4);
    memcpy(&fb, &b->scale, 4);
    return sta_error(STA_ERR_ARGUMENT, "%s the scale, softmax or precision: rank 0 has %g, %d "
                     "and %d, rank %d has %g, %d and %d", pre, (double)fa, (int)a->softmax,
                     (int)a->precision, (int)r, (double)fb, (int)b->softmax, (int)b->precision);
  }
  if (a->chunks != b->chunks)
    return sta_error(STA_ERR_ARGUMENT, "%s the chunks: rank 0 runs %d, rank %d runs %d "
                     "(sta_comm_set_chunks)", pre, (int)a->chunks, (int)r, (int)b->chunks);
  if (a->layer != b->layer || a->step != b->step)
    return sta_error(STA_ERR_ARGUMENT, "%s the layer: rank 0 runs layer %d at step %d, rank %d "
                     "layer %d at step %d", pre, (int)a->layer, (int)a->step, (int)r,
                     (int)b->layer, (int)b->step);
  return STA_OK;
}

/* Exchange every rank's descriptor (host memory, else the transport's
** device memory) and compare.  mine->status: this rank's own checks. */
static sta_status agree(sta_comm *c, sp_desc *mine) {
  int32_t np = sta_comm_size(c);
  sta_status rc;
  sp_desc *all = sta_calloc((size_t)np, sizeof *all);
  if (!all) return sta_error(STA_ERR_NOMEM, "out of host memory (SP descriptors)");
  if (c->t.devices & (1u << STA_CPU))
    rc = c->t.all_gather(c->t.self, mine, all, sizeof *mine, STA_CPU);
  else { /* a transport of device memory only */
    sta_device d = STA_CUDA;
    int64_t n = (int64_t)((size_t)(np + 1) * sizeof *mine);
    const sta_backend_ops *b = sta_backend_get(d);
    rc = c->dbuf && sta_tensor_numel(c->dbuf) >= n ? STA_OK
         : (sta_tensor_destroy(c->dbuf), c->dbuf = NULL,
            sta_tensor_create(&c->dbuf, STA_F16, d, 1, &n));
    char *db = rc == STA_OK ? sta_tensor_data(c->dbuf) : NULL;
    if (rc == STA_OK) rc = b->memcpy(db, d, mine, STA_CPU, sizeof *mine);
    if (rc == STA_OK) rc = c->t.all_gather(c->t.self, db, db + sizeof *mine, sizeof *mine, d);
    if (rc == STA_OK) rc = b->memcpy(all, STA_CPU, db + sizeof *mine, d, (size_t)np * sizeof *mine);
  }
  for (int32_t r = 0; r < np && rc == STA_OK; r++)
    if (memcmp(all[r].magic, "sta-sp1", 8) != 0)
      rc = sta_error(STA_ERR_STATE, "rank %d sent no SP descriptor (is it in another "
                     "collective?)", (int)r);
  if (rc == STA_OK && mine->status != STA_OK) rc = sta_error(mine->status, "%s", mine->msg);
  for (int32_t r = 0; r < np && rc == STA_OK; r++)
    if (all[r].status != STA_OK) rc = sta_error(all[r].status, "rank %d: %s", (int)r, all[r].msg);
  for (int32_t r = 1; r < np && rc == STA_OK; r++) rc = disagree(&all[0], &all[r], r);
  free(all);
  return rc;
}

/* This rank's descriptor (status: its own checks). */
static void describe(sp_desc *d, const pipe *p, const sta_geometry *g, sta_status status) {
  memset(d, 0, sizeof *d);
  memcpy(d->magic, "sta-sp1", 8);
  d->status = status;
  if (status != STA_OK) {
    snprintf(d->msg, sizeof d->msg, "%s", sta_last_error());
    return;
  }
  d->dtype = p->t[0]->dtype;
  d->layout = p->layout;
  d->device = p->dev;
  d->chunks = (int32_t)p->n;
  d->b = p->sp.b;
  d->s = p->sp.sl;
  d->h = p->sp.h;
  d->d = p->sp.d;
  memcpy(d->canvas, g->canvas, sizeof d->canvas);
  memcpy(d->tile, g->tile, sizeof d->tile);
  d->text_len = g->text_len;
  d->layer = d->step = -1;
  if (p->job->desc) {
    d->n_windows = p->job->desc->n_windows;
    d->windows = p->job->hash;
    memcpy(&d->scale, &p->job->desc->scale, 4);
    d->softmax = p->job->desc->softmax;
    d->precision = p->job->desc->precision;
  } else {
    sta_context *ctx = sta_context_current();
    d->layer = sta_layer_index(p->job->layer);
    d->step = ctx ? sta_context_step(ctx) : -1;
  }
}

static int is_loopback(const sta_comm *c) { return c->t.destroy == lb_destroy; }

static sta_status sp_run(sta_comm *c, const sta_geometry *g, sta_layout layout,
                         const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                         sta_tensor *out, sp_job *job, sta_status pre) {
  const sta_tensor *t[4] = {q, k, v, out};
  pipe p;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  sta_status rc = prepare(&p, c, g, layout, t, job, pre);
  /* every rank learns of every rank's failed checks, unless this is a
  ** loopback world, whose run aborts the others when this rank returns */
  if (sta_comm_size(c) > 1 && !(rc != STA_OK && is_loopback(c))) {
    sp_desc mine;
    describe(&mine, &p, g, rc);
    rc = agree(c, &mine);
  }
  if (rc == STA_OK)
    rc = p.sp.p == 1 && p.n == 1 ? job->compute(job, 0, q, k, v, out) : pipeline(&p);
  pipe_free(&p);
  return rc;
}

/* sp_attention: the desc of heads h0 .. h0 + hn - 1 of this rank. */
static void local_desc(const sp_job *j, sta_attention_desc *d, int64_t h0, int64_t hn) {
  *d = *j->desc;
  d->n_windows = j->desc->n_windows == 1 ? 1 : (int32_t)hn;
  d->windows = j->desc->n_windows == 1 ? j->desc->windows : j->windows + 3 * h0;
}

static int64_t heads_of(const sp_job *j, const sta_tensor *q) {
  return q->shape[j->desc->layout == STA_BSHD ? 2 : 1];
}

/* The windows: 1 or one per global head, each valid (named by its global
** head); this rank's copied. */
static sta_status attn_prepare(sp_job *j, const pipe *p) {
  const sta_attention_desc *d = j->desc;
  int64_t nh = p->sp.h, hl = p->sp.hl;
  sta_status rc;
  if (d->mask != STA_MASK_WINDOW) /* the lists are per global head: not sharded yet */
    return sta_error(STA_ERR_UNSUPPORTED, "mask: sequence parallelism runs STA_MASK_WINDOW "
                     "only, got %d", (int)d->mask);
  if (d->n_windows != 1 && d->n_windows != nh)
    return sta_error(STA_ERR_WINDOW, "n_windows: expected 1 or heads (%lld), got %d",
                     (long long)nh, (int)d->n_windows);
  j->hash = fnv(d->windows, sizeof(int32_t) * 3 * (size_t)d->n_windows);
  if (d->n_windows == 1) return STA_OK;
  for (int64_t h = 0; h < nh; h++)
    if ((rc = sta_window_check(&d->geom, d->windows + 3 * h)) != STA_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "head %lld: %s", (long long)h, sta_last_error());
      return sta_error(rc, "%s", msg);
    }
  j->windows = sta_malloc(sizeof(int32_t) * 3 * (size_t)hl);
  if (!j->windows) return sta_error(STA_ERR_NOMEM, "out of host memory (windows)");
  memcpy(j->windows, d->windows + 3 * (size_t)p->sp.r * (size_t)hl, sizeof(int32_t) * 3 * (size_t)hl);
  return STA_OK;
}

static sta_status attn_check(sp_job *j, const sta_tensor *q, const sta_tensor *k,
                             const sta_tensor *v, const sta_tensor *out) {
  sta_attention_desc d;
  sta_attn_params p;
  local_desc(j, &d, 0, heads_of(j, q));
  sta_status rc = sta_attn_resolve(&d, q, k, v, out, NULL, &p);
  if (rc == STA_OK) free((void *)p.windows);
  return rc;
}

static sta_status attn_compute(sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                               const sta_tensor *v, sta_tensor *out) {
  sta_attention_desc d;
  local_desc(j, &d, h0, heads_of(j, q));
  return sta_attention_forward(&d, q, k, v, out, NULL);
}

sta_status sta_sp_attention(sta_comm *c, const sta_attention_desc *desc,
                            const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                            sta_tensor *out) {
  sta_status pre = STA_OK;
  sp_job job;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (!desc) pre = sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  else if (!desc->windows) pre = sta_error(STA_ERR_WINDOW, "windows: expected an array, got NULL");
  memset(&job, 0, sizeof job);
  job.prepare = attn_prepare;
  job.check = attn_check;
  job.compute = attn_compute;
  job.desc = desc;
  sta_status rc = sp_run(c, desc ? &desc->geom : NULL, desc ? desc->layout : STA_BSHD, q, k, v,
                         out, &job, pre);
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

static sta_status layer_compute(sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                                const sta_tensor *v, sta_tensor *out) {
  (void)h0; /* one chunk */
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
  sta_status rc = untiled_only(&desc->geom);
  if (rc != STA_OK) return rc;
  sta_layer_desc d = *desc;
  d.sp_rank = sta_comm_rank(c);
  d.sp_size = sta_comm_size(c);
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
  sta_status pre = STA_OK;
  int32_t p = sta_comm_size(l->comm);
  if (q && sta_tensor_bshd(q, l->layout, "q", &x) == STA_OK &&
      x.h != (int64_t)l->local_heads * p)
    pre = sta_error(STA_ERR_SHAPE, "q: expected %lld heads (local_heads %d x %d ranks), got %lld",
                    (long long)l->local_heads * p, (int)l->local_heads, (int)p, (long long)x.h);
  return sp_run(l->comm, &l->geom, l->layout, q, k, v, out, &job, pre);
}
