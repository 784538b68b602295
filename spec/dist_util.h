/* dist_util.h -- what the sequence-parallelism tests share (header-only):
** fresh random tensors in either layout, bit-for-bit comparison, and a case
** run on P loopback ranks against single-device sta_attention_forward. */
#ifndef STA_DIST_UTIL_H
#define STA_DIST_UTIL_H

#include <math.h>
#include <string.h>

#include "internal.h"
#include "test_util.h"

#define MAXP 4
#define MAXH 12

static uint64_t seed_base;

static inline uint64_t next_seed(void) { return seed_base += 7919; }

/* The first lines of a dist test's main: the seed, printed; every wait
** bounded (a broken test fails, never hangs). */
static inline void dist_test_begin(const char *name) {
  seed_base = (uint64_t)time(NULL);
  setenv("STA_DIST_TIMEOUT", "30", 0);
  printf("%s: seed %llu\n", name, (unsigned long long)seed_base);
}

static inline sta_tensor *new4(sta_dtype dt, sta_layout layout, int64_t b, int64_t s, int64_t h,
                        int64_t d) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {b, layout == STA_BSHD ? s : h, layout == STA_BSHD ? h : s, d};
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, 4, shape), STA_OK);
  return t;
}

static inline sta_tensor *randn4(sta_dtype dt, sta_layout layout, int64_t b, int64_t s, int64_t h,
                          int64_t d) {
  sta_tensor *t = new4(dt, layout, b, s, h, d);
  assert_int_equal(sta_tensor_randn(t, next_seed(), 0.0, 1.0), STA_OK);
  return t;
}

static inline sta_tensor *snapshot(const sta_tensor *t) {
  sta_tensor *c = NULL;
  assert_int_equal(sta_tensor_to(&c, t, sta_tensor_dtype(t), STA_CPU), STA_OK);
  return c;
}

static inline void assert_bitwise(const sta_tensor *a, const sta_tensor *b) {
  double mx = -1, rel = -1;
  assert_int_equal(sta_tensor_compare(a, b, &mx, &rel), STA_OK);
  if (!(mx == 0.0)) fail_msg("tensors differ: max |a-b| = %g", mx);
}

/* ---- a case on P loopback ranks against one device ----------------------------- */

typedef struct sp_case {
  int32_t canvas[3], tile[3];
  int64_t text, text_len; /* text rows; valid ones (-1: all) */
  int64_t b, h, d;
  sta_dtype dtype;
  sta_layout layout;
  int32_t n_windows;
  int32_t windows[3 * MAXH];
} sp_case;

typedef struct sp_job {
  sta_attention_desc desc;
  sta_sp_layer *layers[MAXP];
  sta_strategy *strategy;
  sta_metadata *md;                  /* layer runs: the context's table */
  sta_forward_batch *batches[MAXP];  /* layer runs: NULL = a fresh one */
  int32_t step;
  sta_tensor *q[MAXP], *k[MAXP], *v[MAXP], *o[MAXP];
} sp_job;

static inline sta_status sp_rank(void *arg, int32_t r, sta_comm *c) {
  sp_job *j = arg;
  return sta_sp_attention(c, &j->desc, j->q[r], j->k[r], j->v[r], j->o[r]);
}

static inline void case_desc(const sp_case *c, sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, c->canvas[0], c->canvas[1], c->canvas[2]);
  for (int i = 0; i < 3; i++) d->geom.tile[i] = c->tile[i];
  d->geom.text_len = c->text_len;
  d->layout = c->layout;
  d->n_windows = c->n_windows;
  d->windows = c->windows;
}

/* Shard full inputs over p ranks, run fn on every rank, compare each rank's
** output with the shard of full_out. */
static inline void run_sp(const sp_case *c, int32_t p, sp_job *j, sta_rank_fn fn,
                   const sta_tensor *fq, const sta_tensor *fk, const sta_tensor *fv,
                   const sta_tensor *fo, sta_comm **comms) {
  int64_t v = (int64_t)c->canvas[0] * c->canvas[1] * c->canvas[2];
  int64_t sl = v / p + c->text;
  const sta_geometry *g = &j->desc.geom;
  for (int32_t r = 0; r < p; r++) {
    j->q[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->k[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->v[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    j->o[r] = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    assert_int_equal(sta_sp_shard(j->q[r], fq, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_sp_shard(j->k[r], fk, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_sp_shard(j->v[r], fv, g, c->layout, r, p), STA_OK);
    assert_int_equal(sta_tensor_fill(j->o[r], NAN), STA_OK);
  }
  sta_status rc = sta_comm_loopback_run(comms, p, fn, j);
  if (rc != STA_OK) fail_msg("P=%d: %s", (int)p, sta_last_error());
  sta_tensor *back = new4(c->dtype, c->layout, c->b, v + c->text, c->h, c->d);
  for (int32_t r = 0; r < p; r++) {
    sta_tensor *want = new4(c->dtype, c->layout, c->b, sl, c->h, c->d);
    assert_int_equal(sta_sp_shard(want, fo, g, c->layout, r, p), STA_OK);
    assert_bitwise(j->o[r], want);
    assert_int_equal(sta_sp_unshard(back, j->o[r], g, c->layout, r, p), STA_OK);
    sta_tensor_destroy(want);
    sta_tensor_destroy(j->q[r]);
    sta_tensor_destroy(j->k[r]);
    sta_tensor_destroy(j->v[r]);
    sta_tensor_destroy(j->o[r]);
  }
  assert_bitwise(back, fo); /* the shards cover the whole output */
  sta_tensor_destroy(back);
}

/* A case's whole-sequence tensors (s rows): random q, k, v and an o. */
typedef struct full_qkvo {
  sta_tensor *q, *k, *v, *o;
} full_qkvo;

static inline full_qkvo full_make(const sp_case *c, int64_t s) {
  full_qkvo f;
  f.q = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.k = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.v = randn4(c->dtype, c->layout, c->b, s, c->h, c->d);
  f.o = new4(c->dtype, c->layout, c->b, s, c->h, c->d);
  return f;
}

static inline void full_free(full_qkvo *f) {
  sta_tensor_destroy(f->q);
  sta_tensor_destroy(f->k);
  sta_tensor_destroy(f->v);
  sta_tensor_destroy(f->o);
}

/* ---- a caller's transport ------------------------------------------------------ */

/* Relays every collective to an inner communicator (raw bytes wrapped as
** 1-byte tensors) and counts them; fail_gather makes all-gather fail,
** cancel_after raises sta_cancel after that all-to-all (counted since a2a
** was last set to 0). */
typedef struct relay {
  sta_comm *inner;
  int32_t a2a, gather, barrier, destroyed, fail_gather, cancel_after;
} relay;

static inline int32_t relay_rank(void *self) { return sta_comm_rank(((relay *)self)->inner); }
static inline int32_t relay_size(void *self) { return sta_comm_size(((relay *)self)->inner); }

static inline sta_status relay_move(relay *r, const void *send, void *recv, size_t sbytes,
                                    size_t rbytes, int gather) {
  sta_tensor *s = NULL, *t = NULL;
  int64_t ns = (int64_t)sbytes, nr = (int64_t)rbytes;
  sta_status rc = sta_tensor_wrap(&s, (void *)send, STA_F8E4M3, STA_CPU, 1, &ns, NULL);
  if (rc == STA_OK) rc = sta_tensor_wrap(&t, recv, STA_F8E4M3, STA_CPU, 1, &nr, NULL);
  if (rc == STA_OK)
    rc = gather ? sta_comm_all_gather(r->inner, s, t) : sta_comm_all_to_all(r->inner, s, t);
  sta_tensor_destroy(s);
  sta_tensor_destroy(t);
  return rc;
}

static inline sta_status relay_a2a(void *self, const void *send, void *recv, size_t chunk,
                                   sta_device d) {
  relay *r = self;
  size_t n = chunk * (size_t)relay_size(self);
  assert_int_equal(d, STA_CPU);
  sta_status rc = relay_move(r, send, recv, n, n, 0);
  if (++r->a2a == r->cancel_after) sta_cancel();
  return rc;
}

static inline sta_status relay_gather(void *self, const void *send, void *recv, size_t chunk,
                                      sta_device d) {
  relay *r = self;
  assert_int_equal(d, STA_CPU);
  r->gather++;
  if (r->fail_gather) return sta_error(STA_ERR_DEVICE, "fake: link down");
  return relay_move(r, send, recv, chunk, chunk * (size_t)relay_size(self), 1);
}

static inline sta_status relay_barrier(void *self) {
  relay *r = self;
  r->barrier++;
  return sta_comm_barrier(r->inner);
}

static inline void relay_destroy(void *self) { ((relay *)self)->destroyed++; }

/* The transport table of r, CPU memory, named "relay". */
static inline sta_transport relay_transport(relay *r) {
  sta_transport t = {"relay", 1u << STA_CPU, r, relay_rank, relay_size, relay_a2a,
                     relay_gather, relay_barrier, relay_destroy, NULL};
  return t;
}

#endif
