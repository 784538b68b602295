/* test_cancel.c -- the cooperative cancel flag (sta_cancel): raised by a
** SIGINT handler or another thread while a long CPU forward runs, the call
** stops early with STA_ERR_CANCELLED and leaves out and lse exactly as they
** were; raised before a call, the call stops at once; cleared, calls run
** again.  Search mode records nothing when cancelled. */
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

static const char *MSG = "attention: cancelled (sta_cancel) before it finished; no output was changed";

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct problem {
  sta_attention_desc d;
  int32_t w[3];
  sta_tensor *q, *k, *v, *out, *lse, *out0, *lse0;
} problem;

/* A full-window forward of t x 16 x 16 tokens, 4 heads, D 64. */
static void make(problem *p, int32_t t) {
  memset(p, 0, sizeof *p);
  sta_geometry_init(&p->d.geom, t, 16, 16);
  p->w[0] = p->w[1] = p->w[2] = 99;
  p->d.n_windows = 1;
  p->d.windows = p->w;
  int64_t s[4] = {1, (int64_t)t * 256 + 8, 4, 64}, ls[3] = {1, 4, s[1]};
  sta_tensor **t4[4] = {&p->q, &p->k, &p->v, &p->out};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sta_tensor_create(t4[i], STA_F32, STA_CPU, 4, s), STA_OK);
    assert_int_equal(sta_tensor_randn(*t4[i], (uint64_t)time(NULL) + (uint64_t)i, 0, 1), STA_OK);
  }
  assert_int_equal(sta_tensor_create(&p->lse, STA_F32, STA_CPU, 3, ls), STA_OK);
  assert_int_equal(sta_tensor_randn(p->lse, 99, 0, 1), STA_OK);
  assert_int_equal(sta_tensor_to(&p->out0, p->out, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&p->lse0, p->lse, STA_F32, STA_CPU), STA_OK);
}

static void unchanged(const problem *p) {
  double m = -1;
  assert_int_equal(sta_tensor_compare(p->out, p->out0, &m, NULL), STA_OK);
  assert_true(m == 0.0);
  assert_int_equal(sta_tensor_compare(p->lse, p->lse0, &m, NULL), STA_OK);
  assert_true(m == 0.0);
}

static void drop(problem *p) {
  sta_tensor *all[] = {p->q, p->k, p->v, p->out, p->lse, p->out0, p->lse0};
  for (size_t i = 0; i < 7; i++) sta_tensor_destroy(all[i]);
}

static void on_sigint(int sig) { (void)sig; sta_cancel(); }

static double delay_s;
static void *send_sigint(void *arg) {
  (void)arg;
  struct timespec ts = {0, (long)(delay_s * 1e9)};
  nanosleep(&ts, NULL);
  kill(getpid(), SIGINT);
  return NULL;
}

/* SIGINT during a forward: it stops within a fraction of its full time. */
static void test_sigint_stops_forward(void **state) {
  (void)state;
  problem p;
  make(&p, 24);
  sta_cancel_clear();
  double t0 = now();
  sta_tensor *full = NULL;
  assert_int_equal(sta_tensor_to(&full, p.out, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_attention_forward(&p.d, p.q, p.k, p.v, full, NULL), STA_OK);
  double whole = now() - t0;
  void (*prev)(int) = signal(SIGINT, on_sigint);
  pthread_t th;
  delay_s = whole / 5;
  assert_int_equal(pthread_create(&th, NULL, send_sigint, NULL), 0);
  t0 = now();
  EXPECT_ERR(sta_attention_forward(&p.d, p.q, p.k, p.v, p.out, p.lse), STA_ERR_CANCELLED, MSG);
  double took = now() - t0;
  pthread_join(th, NULL);
  signal(SIGINT, prev);
  printf("# whole forward %.3f s; SIGINT after %.3f s, returned after %.3f s\n", whole,
         delay_s, took);
  assert_true(took < 0.8 * whole);
  unchanged(&p);
  assert_true(sta_cancel_requested());
  /* still raised: the next call stops at once, changing nothing */
  EXPECT_ERR(sta_attention_forward(&p.d, p.q, p.k, p.v, p.out, p.lse), STA_ERR_CANCELLED, MSG);
  EXPECT_ERR(sta_attention_reference(&p.d, p.q, p.k, p.v, p.out, p.lse), STA_ERR_CANCELLED,
             "attention reference: cancelled (sta_cancel) before it finished; no output was "
             "changed");
  unchanged(&p);
  sta_cancel_clear();
  assert_false(sta_cancel_requested());
  assert_int_equal(sta_attention_forward(&p.d, p.q, p.k, p.v, p.out, p.lse), STA_OK);
  double m = -1;
  assert_int_equal(sta_tensor_compare(p.out, full, &m, NULL), STA_OK);
  assert_true(m == 0.0);
  sta_tensor_destroy(full);
  drop(&p);
}

static void *cancel_later(void *arg) {
  struct timespec ts = {0, 20 * 1000 * 1000};
  nanosleep(&ts, NULL);
  (void)arg;
  sta_cancel();
  return NULL;
}

/* Another thread cancels the reference; a search-mode layer forward,
** cancelled, records nothing and writes nothing. */
static void test_thread_cancel_and_search(void **state) {
  (void)state;
  problem p;
  make(&p, 6);
  sta_cancel_clear();
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, cancel_later, NULL), 0);
  sta_status rc = sta_attention_reference(&p.d, p.q, p.k, p.v, p.out, p.lse);
  pthread_join(th, NULL);
  if (rc == STA_OK) printf("# the reference finished before the cancel arrived\n");
  else assert_int_equal(rc, STA_ERR_CANCELLED);
  if (rc != STA_OK) unchanged(&p);
  sta_cancel_clear();

  sta_layer_desc ld;
  memset(&ld, 0, sizeof ld);
  ld.local_heads = 4;
  ld.head_dim = 64;
  ld.sp_size = 1;
  ld.geom = p.d.geom;
  sta_layer *l = NULL;
  assert_int_equal(sta_layer_create(&l, &ld), STA_OK);
  int32_t cand[6] = {1, 1, 1, 99, 99, 99};
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  sta_context *ctx = NULL;
  assert_int_equal(sta_metadata_search(&md, 1, 2, cand), STA_OK);
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  assert_int_equal(sta_context_push(&ctx, 0, md, fb), STA_OK);
  sta_cancel();
  EXPECT_ERR(sta_layer_forward(l, p.q, p.k, p.v, p.out), STA_ERR_CANCELLED, MSG);
  assert_int_equal(sta_forward_batch_records(fb, 0), 0);
  unchanged(&p);
  sta_cancel_clear();
  assert_int_equal(sta_layer_forward(l, p.q, p.k, p.v, p.out), STA_OK);
  assert_int_equal(sta_forward_batch_records(fb, 0), 1);
  assert_int_equal(sta_context_pop(ctx), STA_OK);
  sta_metadata_destroy(md);
  sta_forward_batch_destroy(fb);
  sta_layer_destroy(l);
  drop(&p);
}

/* The backward and its reference, cancelled before they start, return
** the status and leave dq, dk, dv as they were; cleared, they run. */
static void test_cancel_backward(void **state) {
  (void)state;
  problem p;
  make(&p, 2);
  sta_tensor *g[4], *g0[3];
  int64_t s[4] = {1, 2 * 256 + 8, 4, 64};
  for (int i = 0; i < 4; i++) {
    assert_int_equal(sta_tensor_create(&g[i], STA_F32, STA_CPU, 4, s), STA_OK);
    assert_int_equal(sta_tensor_randn(g[i], 40 + (uint64_t)i, 0, 1), STA_OK);
  }
  for (int i = 0; i < 3; i++) assert_int_equal(sta_tensor_to(&g0[i], g[1 + i], STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_attention_forward(&p.d, p.q, p.k, p.v, p.out, p.lse), STA_OK);
  sta_cancel();
  EXPECT_ERR(sta_attention_backward(&p.d, p.q, p.k, p.v, p.out, p.lse, g[0], g[1], g[2], g[3]),
             STA_ERR_CANCELLED,
             "backward: cancelled (sta_cancel) before it finished; no output was changed");
  EXPECT_ERR(sta_attention_backward_reference(&p.d, p.q, p.k, p.v, g[0], g[1], g[2], g[3]),
             STA_ERR_CANCELLED,
             "backward reference: cancelled (sta_cancel) before it finished; no output was "
             "changed");
  for (int i = 0; i < 3; i++) {
    double m = -1;
    assert_int_equal(sta_tensor_compare(g[1 + i], g0[i], &m, NULL), STA_OK);
    assert_true(m == 0.0);
  }
  sta_cancel_clear();
  assert_int_equal(sta_attention_backward(&p.d, p.q, p.k, p.v, p.out, p.lse, g[0], g[1], g[2], g[3]),
                   STA_OK);
  double m = -1;
  assert_int_equal(sta_tensor_compare(g[1], g0[0], &m, NULL), STA_OK);
  assert_true(m > 0.0);
  for (int i = 0; i < 4; i++) sta_tensor_destroy(g[i]);
  for (int i = 0; i < 3; i++) sta_tensor_destroy(g0[i]);
  drop(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_sigint_stops_forward),
    cmocka_unit_test(test_thread_cancel_and_search),
    cmocka_unit_test(test_cancel_backward),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
