/*
** loopback.c -- the in-process transport: P ranks of one world as threads
** of this process (sta_comm_loopback), posting what they send and copying
** what they receive from each other's posts; sta_comm_loopback_run runs one
** thread per rank and aborts the world when one fails.
*/
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "dist.h"

#define MAX_LOOPBACK 64

typedef struct lb_world {
  pthread_mutex_t mu;
  pthread_mutex_t compute; /* one rank computes at a time (sta_loopback_turn) */
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

/* Wait for every rank (generation barrier).  Fails when the world was
** aborted or the wait times out; either aborts the world. */
static sta_status lb_wait(lb_rank *me) {
  lb_world *w = me->w;
  sta_status rc = STA_OK;
  struct timespec until;
  double to = sta_dist_timeout();
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
        rc = sta_span_copy(&spans[i], j, (const sta_span *)w->posted[j] + i, me->rank, d);
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

int sta_loopback_is(const sta_comm *c) { return c->t.destroy == lb_destroy; }

void sta_loopback_turn(const sta_comm *c, int enter) {
  if (!sta_loopback_is(c)) return;
  pthread_mutex_t *turn = &((lb_rank *)c->t.self)->w->compute;
  if (enter) pthread_mutex_lock(turn);
  else pthread_mutex_unlock(turn);
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
    if (sta_loopback_is(j->comm)) lb_abort(((lb_rank *)j->comm->t.self)->w);
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
    if (!sta_loopback_is(c))
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

