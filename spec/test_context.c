/* test_context.c -- the per-thread forward context stack and the forward
** batch's search records. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <cmocka.h>
#include <cJSON.h>

#include "internal.h"
#include "test_util.h"

static void test_push_pop(void **state) {
  (void)state;
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_metadata_create(&md, 2), STA_OK);
  assert_int_equal(sta_forward_batch_create(&fb, 2), STA_OK);
  assert_int_equal(sta_context_depth(), 0);
  assert_null(sta_context_current());
  assert_false(sta_in_forward_pass());
  sta_context *a = NULL, *b = NULL, *c = NULL;
  assert_int_equal(sta_context_push(&a, 3, md, NULL), STA_OK);
  assert_ptr_equal(sta_context_current(), a);
  assert_false(sta_in_forward_pass());
  assert_int_equal(sta_context_push(&b, 7, NULL, fb), STA_OK);
  assert_true(sta_in_forward_pass());
  assert_int_equal(sta_context_push(&c, 9, md, fb), STA_OK);
  assert_int_equal(sta_context_depth(), 3);
  assert_int_equal(sta_context_step(c), 9);
  assert_ptr_equal(sta_context_metadata(c), md);
  assert_ptr_equal(sta_context_batch(c), fb);
  assert_int_equal(sta_context_step(a), 3);
  assert_null(sta_context_batch(a));
  assert_null(sta_context_metadata(b));
  /* out of order: refused, nothing changes */
  EXPECT_ERR(sta_context_pop(a), STA_ERR_STATE,
             "forward context: pop of a context that is not the innermost (it is at level 1 of depth 3)");
  EXPECT_ERR(sta_context_pop(b), STA_ERR_STATE,
             "forward context: pop of a context that is not the innermost (it is at level 2 of depth 3)");
  EXPECT_ERR(sta_context_pop(NULL), STA_ERR_ARGUMENT, "ctx: expected a context, got NULL");
  assert_int_equal(sta_context_depth(), 3);
  assert_ptr_equal(sta_context_current(), c);
  assert_int_equal(sta_context_pop(c), STA_OK);
  assert_ptr_equal(sta_context_current(), b);
  assert_int_equal(sta_context_pop(b), STA_OK);
  assert_false(sta_in_forward_pass());
  assert_int_equal(sta_context_pop(a), STA_OK);
  assert_int_equal(sta_context_depth(), 0);
  /* popped already: the handle is dead, refused without being touched */
  EXPECT_ERR(sta_context_pop(a), STA_ERR_ARGUMENT,
             "ctx: not a live sta_context (released already, or not made by sta)");
  sta_context *x = NULL;
  EXPECT_ERR(sta_context_push(&x, -1, NULL, fb), STA_ERR_ARGUMENT, "step: expected >= 0, got -1");
  EXPECT_ERR(sta_context_push(NULL, 0, NULL, fb), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL");
  assert_null(x);
  assert_int_equal(sta_context_depth(), 0);
  /* a context that is not on the stack at all */
  assert_int_equal(sta_context_push(&a, 0, NULL, NULL), STA_OK);
  assert_int_equal(sta_context_push(&b, 1, NULL, NULL), STA_OK);
  assert_int_equal(sta_context_pop(b), STA_OK);
  EXPECT_ERR(sta_context_pop((sta_context *)&x), STA_ERR_ARGUMENT,
             "ctx: not a live sta_context (released already, or not made by sta)");
  assert_int_equal(sta_context_pop(a), STA_OK);
  sta_forward_batch_destroy(fb);
  sta_metadata_destroy(md);
}

static void test_deep_and_faults(void **state) {
  (void)state;
  enum { N = 100 };
  sta_context *c[N];
  for (int i = 0; i < N; i++) {
    assert_int_equal(sta_context_push(&c[i], i, NULL, NULL), STA_OK);
    assert_int_equal(sta_context_depth(), i + 1);
  }
  for (int i = N - 1; i >= 0; i--) {
    assert_int_equal(sta_context_step(sta_context_current()), i);
    assert_int_equal(sta_context_pop(c[i]), STA_OK);
  }
  /* every allocation of a push failing leaves no half-pushed context */
  for (int depth = 0; depth < 20; depth++) {
    sta_context *d[20];
    for (int i = 0; i < depth; i++) assert_int_equal(sta_context_push(&d[i], i, NULL, NULL), STA_OK);
    for (int64_t k = 1; k <= 3; k++) {
      sta_context *x = (sta_context *)&k;
      sta_fault_arm(k);
      sta_status rc = sta_context_push(&x, 5, NULL, NULL);
      int64_t used = sta_fault_count();
      sta_fault_arm(0);
      if (rc == STA_OK) {
        assert_true(used < k);
        assert_int_equal(sta_context_depth(), depth + 1);
        assert_int_equal(sta_context_pop(x), STA_OK);
        break;
      }
      assert_int_equal(rc, STA_ERR_NOMEM);
      assert_ptr_equal(x, (sta_context *)&k);
      assert_int_equal(sta_context_depth(), depth);
      assert_ptr_equal(sta_context_current(), depth ? d[depth - 1] : NULL);
    }
    for (int i = depth - 1; i >= 0; i--) assert_int_equal(sta_context_pop(d[i]), STA_OK);
  }
  assert_int_equal(sta_context_depth(), 0);
}

static void *thread_body(void *arg) {
  int *ok = arg;
  sta_context *c = NULL;
  *ok = sta_context_depth() == 0 && sta_context_current() == NULL;
  *ok &= sta_context_push(&c, 42, NULL, NULL) == STA_OK;
  *ok &= sta_context_depth() == 1 && sta_context_step(sta_context_current()) == 42;
  *ok &= sta_context_pop(c) == STA_OK;
  return NULL;
}

static void test_per_thread(void **state) {
  (void)state;
  sta_context *mine = NULL;
  assert_int_equal(sta_context_push(&mine, 1, NULL, NULL), STA_OK);
  pthread_t th;
  int ok = 0;
  assert_int_equal(pthread_create(&th, NULL, thread_body, &ok), 0);
  pthread_join(th, NULL);
  assert_true(ok);
  assert_int_equal(sta_context_depth(), 1);
  assert_ptr_equal(sta_context_current(), mine);
  assert_int_equal(sta_context_pop(mine), STA_OK);
}

/* ---- forward batch ------------------------------------------------------ */

static void random_losses(float *x, int n, unsigned *seed) {
  for (int i = 0; i < n; i++) x[i] = (float)(rand_r(seed) % 100000) / 7919.0f + 0.001f;
}

static cJSON *load_json(const char *path) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  cJSON *j = cJSON_Parse(buf);
  assert_non_null(j);
  return j;
}

static void test_batch_records_and_save(void **state) {
  (void)state;
  unsigned seed = (unsigned)getpid() * 2654435761u;
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 3), STA_OK);
  assert_int_equal(sta_forward_batch_size(fb), 3);
  assert_false(sta_forward_batch_is_negative(fb));
  sta_forward_batch_set_negative(fb, 5);
  assert_true(sta_forward_batch_is_negative(fb));
  sta_forward_batch_set_negative(fb, 0);
  int32_t cand[6] = {3, 1, 10, 1, 5, 7};
  enum { STEPS = 3, LAYERS = 2, HEADS = 4 };
  float l1[STEPS][LAYERS][2][HEADS], l2[STEPS][LAYERS][2][HEADS];
  /* steps recorded out of order (2, 0, 1) to check "order first seen" */
  const int order[STEPS] = {2, 0, 1};
  for (int si = 0; si < STEPS; si++)
    for (int l = 0; l < LAYERS; l++) {
      int s = order[si];
      random_losses(&l1[s][l][0][0], 2 * HEADS, &seed);
      random_losses(&l2[s][l][0][0], 2 * HEADS, &seed);
      assert_int_equal(sta_forward_batch_record(fb, 0, s, l, 2, cand, HEADS, &l1[s][l][0][0],
                                                &l2[s][l][0][0]), STA_OK);
    }
  float neg[2 * HEADS];
  random_losses(neg, 2 * HEADS, &seed);
  assert_int_equal(sta_forward_batch_record(fb, 1, 0, 0, 2, cand, HEADS, neg, neg), STA_OK);
  assert_int_equal(sta_forward_batch_records(fb, 0), STEPS * LAYERS);
  assert_int_equal(sta_forward_batch_records(fb, 1), 1);
  char path[256], npath[256];
  snprintf(path, sizeof path, "/tmp/sta-test-context-%d-pos.json", (int)getpid());
  snprintf(npath, sizeof npath, "/tmp/sta-test-context-%d-neg.json", (int)getpid());
  assert_int_equal(sta_forward_batch_save_search(fb, 0, path), STA_OK);
  assert_int_equal(sta_forward_batch_save_search(fb, 1, npath), STA_OK);
  cJSON *j = load_json(path);
  const char *names[2] = {"L2_loss", "L1_loss"};
  for (int which = 0; which < 2; which++) {
    cJSON *obj = cJSON_GetObjectItemCaseSensitive(j, names[which]);
    assert_true(cJSON_IsObject(obj));
    assert_int_equal(cJSON_GetArraySize(obj), 2);
    assert_string_equal(obj->child->string, "[3, 1, 10]");
    assert_string_equal(obj->child->next->string, "[1, 5, 7]");
    for (int c = 0; c < 2; c++) {
      cJSON *a = cJSON_GetArrayItem(obj, c);
      assert_int_equal(cJSON_GetArraySize(a), STEPS);
      for (int si = 0; si < STEPS; si++) {
        cJSON *per_layer = cJSON_GetArrayItem(a, si);
        assert_int_equal(cJSON_GetArraySize(per_layer), LAYERS);
        for (int l = 0; l < LAYERS; l++) {
          cJSON *heads = cJSON_GetArrayItem(per_layer, l);
          assert_int_equal(cJSON_GetArraySize(heads), HEADS);
          for (int h = 0; h < HEADS; h++) {
            float want = which == 0 ? l2[order[si]][l][c][h] : l1[order[si]][l][c][h];
            assert_true((float)cJSON_GetArrayItem(heads, h)->valuedouble == want);
          }
        }
      }
    }
  }
  cJSON_Delete(j);
  j = load_json(npath);
  cJSON *a = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "L1_loss"),
                                              "[1, 5, 7]");
  assert_int_equal(cJSON_GetArraySize(a), 1);
  assert_true((float)cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetArrayItem(a, 0), 0), 3)
                  ->valuedouble == neg[HEADS + 3]);
  cJSON_Delete(j);
  remove(path);
  remove(npath);
  /* record errors change nothing */
  float nan_l[2 * HEADS];
  memcpy(nan_l, neg, sizeof nan_l);
  nan_l[5] = NAN;
  EXPECT_ERR(sta_forward_batch_record(fb, 0, 0, 0, 2, cand, HEADS, neg, nan_l), STA_ERR_ARGUMENT,
             "l2[1][1]: expected a finite loss, got nan");
  int32_t bad[6] = {3, 1, 10, 1, 0, 7};
  EXPECT_ERR(sta_forward_batch_record(fb, 0, 0, 0, 2, bad, HEADS, neg, neg), STA_ERR_WINDOW,
             "candidates[1]: Kh = 0, expected >= 1");
  EXPECT_ERR(sta_forward_batch_record(fb, 0, -1, 0, 2, cand, HEADS, neg, neg), STA_ERR_ARGUMENT,
             "step: expected >= 0, got -1");
  EXPECT_ERR(sta_forward_batch_record(fb, 0, 0, 0, 0, cand, HEADS, neg, neg), STA_ERR_ARGUMENT,
             "n: expected 1..1024 candidates, got 0");
  EXPECT_ERR(sta_forward_batch_record(fb, 0, 0, 0, 2, cand, HEADS, NULL, neg), STA_ERR_ARGUMENT,
             "l1: expected 8 floats, got NULL");
  for (int k = 1; k <= 4; k++) {
    sta_fault_arm(k);
    sta_status rc = sta_forward_batch_record(fb, 1, 0, 0, 2, cand, HEADS, neg, neg);
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_int_equal(sta_forward_batch_records(fb, 1), 1);
  }
  assert_int_equal(sta_forward_batch_records(fb, 0), STEPS * LAYERS);
  /* inconsistent candidates cannot be saved in one table */
  int32_t other[6] = {3, 3, 3, 1, 5, 7};
  assert_int_equal(sta_forward_batch_record(fb, 0, 3, 0, 2, other, HEADS, neg, neg), STA_OK);
  EXPECT_ERR(sta_forward_batch_save_search(fb, 0, path), STA_ERR_ARGUMENT,
             "search results: record 6 (step 3, layer 0) has other candidates than record 0");
  assert_int_equal(access(path, F_OK), -1);
  /* allocation failures while saving: NOMEM and no file */
  sta_forward_batch_clear(fb);
  assert_int_equal(sta_forward_batch_record(fb, 0, 0, 0, 2, cand, HEADS, neg, neg), STA_OK);
  int saved = 0;
  for (int64_t k = 1; k < 10 && !saved; k++) {
    sta_fault_arm(k);
    sta_status rc = sta_forward_batch_save_search(fb, 0, path);
    sta_fault_arm(0);
    if (rc == STA_OK) { saved = 1; break; }
    assert_int_equal(rc, STA_ERR_NOMEM);
    assert_int_equal(access(path, F_OK), -1);
  }
  assert_true(saved);
  remove(path);
  sta_forward_batch_clear(fb);
  assert_int_equal(sta_forward_batch_records(fb, 0), 0);
  assert_int_equal(sta_forward_batch_records(fb, 1), 0);
  EXPECT_ERR(sta_forward_batch_save_search(fb, 1, path), STA_ERR_STATE,
             "search results: the negative list holds no records");
  sta_forward_batch_destroy(fb);
  fb = NULL;
  EXPECT_ERR(sta_forward_batch_create(&fb, 0), STA_ERR_ARGUMENT, "batch_size: expected >= 1, got 0");
  assert_null(fb);
}

/* Threads of an in-process world may record into one batch at once. */
typedef struct rec_job { sta_forward_batch *fb; int id; int ok; } rec_job;

static void *record_body(void *arg) {
  rec_job *j = arg;
  int32_t cand[3] = {1, 1, 1 + 2 * j->id};
  float l[2] = {0.5f + (float)j->id, 0.25f};
  j->ok = 1;
  for (int i = 0; i < 300; i++)
    j->ok &= sta_forward_batch_record(j->fb, i & 1, i, j->id, 1, cand, 2, l, l) == STA_OK;
  return NULL;
}

static void test_batch_threads(void **state) {
  (void)state;
  sta_forward_batch *fb = NULL;
  assert_int_equal(sta_forward_batch_create(&fb, 1), STA_OK);
  pthread_t th[4];
  rec_job jobs[4];
  for (int i = 0; i < 4; i++) {
    jobs[i] = (rec_job){fb, i, 0};
    assert_int_equal(pthread_create(&th[i], NULL, record_body, &jobs[i]), 0);
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    assert_true(jobs[i].ok);
  }
  assert_int_equal(sta_forward_batch_records(fb, 0), 600);
  assert_int_equal(sta_forward_batch_records(fb, 1), 600);
  sta_forward_batch_destroy(fb);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_push_pop),
    cmocka_unit_test(test_deep_and_faults),
    cmocka_unit_test(test_per_thread),
    cmocka_unit_test(test_batch_records_and_save),
    cmocka_unit_test(test_batch_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
