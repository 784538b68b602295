/*
** search.c -- the forward batch (batch size, CFG negative flag) and the
** mask-search records it collects; saving them in FastVideo's per-prompt
** layout {"L2_loss": {"[3, 1, 10]": [step][layer][head]}, "L1_loss": ...},
** written as Python's json.dump would (floats in their shortest form).
*/
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>

#include "internal.h"

typedef struct record {
  int32_t step, layer, n, heads;
  int32_t *cand; /* n*3 */
  float *l1, *l2; /* n*heads */
} record;

typedef struct record_list {
  record *r;
  int32_t n, cap;
} record_list;

struct sta_forward_batch {
  int32_t refs; /* the creator's and every context's that holds it */
  int32_t batch_size;
  int32_t negative;
  double vsa_sparsity; /* SGLang's VSA_sparsity: VSA-mode layers' fraction of key cubes left out */
  record_list list[2]; /* positive, negative */
  pthread_mutex_t lock; /* ranks of an in-process world may share a batch */
};

sta_status sta_forward_batch_create(sta_forward_batch **out,
                                    int32_t batch_size) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (batch_size < 1)
    return sta_error(STA_ERR_ARGUMENT, "batch_size: expected >= 1, got %d", (int)batch_size);
  sta_forward_batch *fb = sta_calloc(1, sizeof *fb);
  if (!fb) return sta_error(STA_ERR_NOMEM, "out of host memory (forward batch)");
  if (pthread_mutex_init(&fb->lock, NULL) != 0) {
    free(fb);
    return sta_error(STA_ERR_NOMEM, "forward batch: cannot create its lock");
  }
  sta_status rc = sta_handle_add(fb, STA_KIND_BATCH);
  if (rc != STA_OK) {
    pthread_mutex_destroy(&fb->lock);
    free(fb);
    return rc;
  }
  fb->refs = 1;
  fb->batch_size = batch_size;
  *out = fb;
  return STA_OK;
}

static void record_free(record *r) {
  free(r->cand);
  free(r->l1);
  free(r->l2);
}

static void clear_lists(sta_forward_batch *fb) {
  for (int i = 0; i < 2; i++) {
    for (int32_t j = 0; j < fb->list[i].n; j++) record_free(&fb->list[i].r[j]);
    free(fb->list[i].r);
    fb->list[i].r = NULL;
    fb->list[i].n = fb->list[i].cap = 0;
  }
}

/* A live batch, else 0 with the message left. */
static int live(const sta_forward_batch *fb) {
  return sta_handle_check(fb, STA_KIND_BATCH, "forward batch") == STA_OK;
}

void sta_forward_batch_retain(sta_forward_batch *fb) {
  if (live(fb)) sta_ref_retain(&fb->refs);
}

void sta_forward_batch_clear(sta_forward_batch *fb) {
  if (!live(fb)) return;
  pthread_mutex_lock(&fb->lock);
  clear_lists(fb);
  pthread_mutex_unlock(&fb->lock);
}

void sta_forward_batch_destroy(sta_forward_batch *fb) {
  if (!sta_handle_live(fb, STA_KIND_BATCH) || !sta_ref_release(&fb->refs)) return;
  sta_handle_remove(fb);
  clear_lists(fb);
  pthread_mutex_destroy(&fb->lock);
  free(fb);
}

int32_t sta_forward_batch_size(const sta_forward_batch *fb) {
  return live(fb) ? fb->batch_size : 0;
}

void sta_forward_batch_set_negative(sta_forward_batch *fb, int32_t negative) {
  if (live(fb)) fb->negative = negative != 0;
}

int32_t sta_forward_batch_is_negative(const sta_forward_batch *fb) {
  return live(fb) ? fb->negative : 0;
}

sta_status sta_forward_batch_set_vsa_sparsity(sta_forward_batch *fb, double sparsity) {
  STA_CHECK_HANDLE(fb, STA_KIND_BATCH, "forward batch");
  if (!(sparsity >= 0.0 && sparsity < 1.0))
    return sta_error(STA_ERR_ARGUMENT, "sparsity: expected a value in [0, 1), got %g", sparsity);
  fb->vsa_sparsity = sparsity;
  return STA_OK;
}

double sta_forward_batch_vsa_sparsity(const sta_forward_batch *fb) {
  return live(fb) ? fb->vsa_sparsity : 0.0;
}

int32_t sta_forward_batch_records(const sta_forward_batch *fb,
                                  int32_t negative) {
  if (!live(fb)) return 0;
  pthread_mutex_t *m = (pthread_mutex_t *)&fb->lock;
  pthread_mutex_lock(m);
  int32_t n = fb->list[negative != 0].n;
  pthread_mutex_unlock(m);
  return n;
}

sta_status sta_forward_batch_record(sta_forward_batch *fb, int32_t negative,
                                    int32_t step, int32_t layer, int32_t n,
                                    const int32_t *candidates, int32_t heads,
                                    const float *l1, const float *l2) {
  static const char AXIS[3] = {'t', 'h', 'w'};
  STA_CHECK_HANDLE(fb, STA_KIND_BATCH, "forward batch");
  if (step < 0) return sta_error(STA_ERR_ARGUMENT, "step: expected >= 0, got %d", (int)step);
  if (layer < 0) return sta_error(STA_ERR_ARGUMENT, "layer: expected >= 0, got %d", (int)layer);
  if (n < 1 || n > 1024)
    return sta_error(STA_ERR_ARGUMENT, "n: expected 1..1024 candidates, got %d", (int)n);
  if (heads < 1 || heads > (1 << 20))
    return sta_error(STA_ERR_ARGUMENT, "heads: expected 1..%d, got %d", 1 << 20, (int)heads);
  if (!candidates) return sta_error(STA_ERR_WINDOW, "candidates: expected %d ints, got NULL", (int)(3 * n));
  if (!l1) return sta_error(STA_ERR_ARGUMENT, "l1: expected %d floats, got NULL", (int)(n * heads));
  if (!l2) return sta_error(STA_ERR_ARGUMENT, "l2: expected %d floats, got NULL", (int)(n * heads));
  for (int32_t i = 0; i < n; i++)
    for (int j = 0; j < 3; j++)
      if (candidates[3 * i + j] < 1)
        return sta_error(STA_ERR_WINDOW, "candidates[%d]: K%c = %d, expected >= 1", (int)i,
                         AXIS[j], (int)candidates[3 * i + j]);
  size_t nl = (size_t)n * (size_t)heads;
  for (size_t i = 0; i < nl; i++) {
    if (!isfinite(l1[i]))
      return sta_error(STA_ERR_ARGUMENT, "l1[%d][%d]: expected a finite loss, got %g",
                       (int)(i / (size_t)heads), (int)(i % (size_t)heads), (double)l1[i]);
    if (!isfinite(l2[i]))
      return sta_error(STA_ERR_ARGUMENT, "l2[%d][%d]: expected a finite loss, got %g",
                       (int)(i / (size_t)heads), (int)(i % (size_t)heads), (double)l2[i]);
  }
  record rec = {step, layer, n, heads, NULL, NULL, NULL};
  rec.cand = sta_malloc(sizeof(int32_t) * 3 * (size_t)n);
  rec.l1 = sta_malloc(sizeof(float) * nl);
  rec.l2 = sta_malloc(sizeof(float) * nl);
  if (!rec.cand || !rec.l1 || !rec.l2) {
    record_free(&rec);
    return sta_error(STA_ERR_NOMEM, "out of host memory (search record)");
  }
  memcpy(rec.cand, candidates, sizeof(int32_t) * 3 * (size_t)n);
  memcpy(rec.l1, l1, sizeof(float) * nl);
  memcpy(rec.l2, l2, sizeof(float) * nl);
  sta_status rc = STA_OK;
  pthread_mutex_lock(&fb->lock);
  record_list *L = &fb->list[negative != 0];
  if (L->n == L->cap) {
    int32_t ncap = L->cap ? L->cap * 2 : 16;
    record *r = L->cap >= (1 << 28) ? NULL : sta_realloc(L->r, sizeof *r * (size_t)ncap);
    if (!r) rc = sta_error(STA_ERR_NOMEM, "out of host memory (search records)");
    else {
      L->r = r;
      L->cap = ncap;
    }
  }
  if (rc == STA_OK) L->r[L->n++] = rec;
  pthread_mutex_unlock(&fb->lock);
  if (rc != STA_OK) record_free(&rec);
  return rc;
}

/* A growing text buffer; the first failed allocation sticks. */
typedef struct text_buf {
  char *p;
  size_t n, cap;
  int failed;
} text_buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void put(text_buf *b, const char *fmt, ...) {
  if (b->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    if (k < 0) { b->failed = 1; return; }
    if ((size_t)k < b->cap - b->n) { b->n += (size_t)k; return; }
    size_t cap = b->cap * 2 + (size_t)k;
    char *q = sta_realloc(b->p, cap);
    if (!q) { b->failed = 1; return; }
    b->p = q;
    b->cap = cap;
  }
}

/* The shortest %g text (6 to 9 digits) that reads back as x. */
static void shortest_float(float x, char num[32]) {
  for (int digits = 6; digits <= 9; digits++) {
    snprintf(num, 32, "%.*g", digits, (double)x);
    if (strtof(num, NULL) == x) return;
  }
}

/* "<name>": {"[3, 1, 10]": [step][layer][head], ...} of l2 or l1.  Keys
** are Python's str() of the candidate list, numbers the shortest text that
** reads back as the same float; separators as Python's json.dump. */
static void put_losses(text_buf *b, const record_list *L, const int32_t *steps,
                       int32_t n_steps, int use_l2) {
  const record *r0 = &L->r[0];
  put(b, "\"%s\": {", use_l2 ? "L2_loss" : "L1_loss");
  for (int32_t c = 0; c < r0->n; c++) {
    const int32_t *w = r0->cand + 3 * c;
    put(b, "%s\"[%d, %d, %d]\": [", c ? ", " : "", (int)w[0], (int)w[1], (int)w[2]);
    for (int32_t s = 0; s < n_steps; s++) {
      put(b, "%s[", s ? ", " : "");
      int first = 1;
      for (int32_t i = 0; i < L->n; i++) {
        const record *r = &L->r[i];
        if (r->step != steps[s]) continue;
        const float *v = (use_l2 ? r->l2 : r->l1) + (size_t)c * (size_t)r->heads;
        put(b, "%s[", first ? "" : ", ");
        first = 0;
        for (int32_t h = 0; h < r->heads; h++) {
          char num[32];
          shortest_float(v[h], num);
          put(b, "%s%s", h ? ", " : "", num);
        }
        put(b, "]");
      }
      put(b, "]");
    }
    put(b, "]");
  }
  put(b, "}");
}

/* Every step must hold the layers of the first, in the same order: the
** file is a [step][layer][head] table whose layer axis is the records'
** order (STA.md section 7), and sta_tune refuses a ragged one or would read
** a reordered one against other layers. */
static sta_status same_layers(const record_list *L, const int32_t *steps, int32_t n_steps) {
  static const char *const WHY = "every step of a search must record the same layers in "
                                 "one order: the file is a [step][layer][head] table";
  int32_t n0 = 0, *first = sta_malloc(sizeof(int32_t) * (size_t)L->n);
  if (!first) return sta_error(STA_ERR_NOMEM, "out of host memory (search results)");
  for (int32_t i = 0; i < L->n; i++)
    if (L->r[i].step == steps[0]) first[n0++] = L->r[i].layer;
  sta_status rc = STA_OK;
  for (int32_t s = 1; s < n_steps && rc == STA_OK; s++) {
    int32_t k = 0;
    for (int32_t i = 0; i < L->n && rc == STA_OK; i++) {
      if (L->r[i].step != steps[s]) continue;
      if (k < n0 && first[k] != L->r[i].layer)
        rc = sta_error(STA_ERR_STATE, "search results: step %d's layer record %d is layer %d, "
                       "step %d's is layer %d (%s)", (int)steps[s], (int)k, (int)L->r[i].layer,
                       (int)steps[0], (int)first[k], WHY);
      k++;
    }
    if (rc == STA_OK && k != n0)
      rc = sta_error(STA_ERR_STATE, "search results: step %d has %d layer records, step %d "
                     "has %d (%s)", (int)steps[s], (int)k, (int)steps[0], (int)n0, WHY);
  }
  free(first);
  return rc;
}

/* The JSON text of one list (caller holds the lock). */
static sta_status search_text(const sta_forward_batch *fb, int32_t negative, char **out) {
  const record_list *L = &fb->list[negative != 0];
  const char *which = negative ? "negative" : "positive";
  if (L->n == 0)
    return sta_error(STA_ERR_STATE, "search results: the %s list holds no records", which);
  const record *r0 = &L->r[0];
  for (int32_t i = 1; i < L->n; i++) {
    const record *r = &L->r[i];
    if (r->n != r0->n || memcmp(r->cand, r0->cand, sizeof(int32_t) * 3 * (size_t)r->n))
      return sta_error(STA_ERR_ARGUMENT,
                       "search results: record %d (step %d, layer %d) has other candidates "
                       "than record 0", (int)i, (int)r->step, (int)r->layer);
    if (r->heads != r0->heads)
      return sta_error(STA_ERR_ARGUMENT,
                       "search results: record %d (step %d, layer %d) has %d heads, record 0 "
                       "has %d", (int)i, (int)r->step, (int)r->layer, (int)r->heads,
                       (int)r0->heads);
  }
  /* steps in the order first seen */
  int32_t *steps = sta_malloc(sizeof(int32_t) * (size_t)L->n), n_steps = 0;
  if (!steps) return sta_error(STA_ERR_NOMEM, "out of host memory (search results)");
  for (int32_t i = 0; i < L->n; i++) {
    int32_t s = 0;
    while (s < n_steps && steps[s] != L->r[i].step) s++;
    if (s == n_steps) steps[n_steps++] = L->r[i].step;
  }
  sta_status rc = same_layers(L, steps, n_steps);
  if (rc != STA_OK) {
    free(steps);
    return rc;
  }
  text_buf b = {NULL, 0, 0, 0};
  b.cap = 4096 + (size_t)L->n * (size_t)r0->n * (size_t)r0->heads * 24;
  b.p = sta_malloc(b.cap);
  b.failed = b.p == NULL;
  put(&b, "{");
  put_losses(&b, L, steps, n_steps, 1);
  put(&b, ", ");
  put_losses(&b, L, steps, n_steps, 0);
  put(&b, "}\n");
  free(steps);
  if (b.failed) {
    free(b.p);
    return sta_error(STA_ERR_NOMEM, "out of host memory (search results JSON)");
  }
  char *text = b.p;
  *out = text;
  return STA_OK;
}

sta_status sta_forward_batch_save_search(const sta_forward_batch *fb,
                                         int32_t negative, const char *path) {
  STA_CHECK_HANDLE(fb, STA_KIND_BATCH, "forward batch");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  pthread_mutex_t *m = (pthread_mutex_t *)&fb->lock;
  pthread_mutex_lock(m);
  char *text = NULL;
  sta_status rc = search_text(fb, negative, &text);
  pthread_mutex_unlock(m);
  if (rc != STA_OK) return rc;
  char label[512];
  snprintf(label, sizeof label, "search results \"%s\"", path);
  rc = sta_write_text_file(path, label, text, strlen(text));
  free(text);
  return rc;
}
