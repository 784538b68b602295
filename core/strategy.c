/*
** strategy.c -- mask strategies (STA.md section 5): a window for every
** (step, layer, head), kept as an array sorted by key; FastVideo's JSON
** format {"t_l_h": [Kt, Kh, Kw], ...} read with cJSON and written by hand.
*/
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

#include <cJSON.h>

#include "internal.h"

typedef struct entry {
  int32_t key[3];  /* step, layer, head */
  int32_t win[3];  /* Kt, Kh, Kw */
  int64_t pos;     /* order in the source file (duplicate reports) */
} entry;

struct sta_strategy {
  entry *e;
  int64_t n, cap;
  int32_t refs; /* the creator's and every layer's that holds it */
};

static int key_cmp(const int32_t *a, const int32_t *b) {
  for (int i = 0; i < 3; i++)
    if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
  return 0;
}

static int entry_cmp(const void *a, const void *b) {
  return key_cmp(((const entry *)a)->key, ((const entry *)b)->key);
}

/* Index of key, or -(insertion point) - 1. */
static int64_t find(const sta_strategy *s, const int32_t key[3]) {
  int64_t lo = 0, hi = s->n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    int c = key_cmp(s->e[mid].key, key);
    if (c == 0) return mid;
    if (c < 0) lo = mid + 1; else hi = mid;
  }
  return -lo - 1;
}

static sta_status reserve(sta_strategy *s, int64_t n) {
  if (n <= s->cap) return STA_OK;
  int64_t cap = s->cap ? s->cap : 16;
  while (cap < n) cap *= 2;
  entry *e = sta_realloc(s->e, (size_t)cap * sizeof *e);
  if (!e) return sta_error(STA_ERR_NOMEM, "out of host memory (mask strategy of %lld entries)",
                           (long long)n);
  s->e = e;
  s->cap = cap;
  return STA_OK;
}

sta_status sta_strategy_create(sta_strategy **out) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  sta_strategy *s = sta_calloc(1, sizeof *s);
  if (!s) return sta_error(STA_ERR_NOMEM, "out of host memory (mask strategy)");
  s->refs = 1;
  sta_status rc = sta_handle_add(s, STA_KIND_STRATEGY);
  if (rc != STA_OK) { free(s); return rc; }
  *out = s;
  return STA_OK;
}

void sta_strategy_retain(const sta_strategy *s) {
  sta_ref_retain(&((sta_strategy *)s)->refs);
}

void sta_strategy_destroy(sta_strategy *s) {
  if (!sta_handle_live(s, STA_KIND_STRATEGY) || !sta_ref_release(&s->refs)) return;
  sta_handle_remove(s);
  free(s->e);
  free(s);
}

/* ---- parsing ------------------------------------------------------------ */

/* Steps, layers and heads are 0..KEY_MAX, so that counts (sta_strategy_extent:
** the largest + 1) fit an int32. */
#define KEY_MAX (INT32_MAX - 1)
static const char *const KEY_PART[3] = {"step", "layer", "head"};

/* One non-negative decimal at *p, digits only, into *v (saturated past
** INT64_MAX / 10); advances *p. */
static int parse_uint(const char **p, int64_t *v) {
  const char *c = *p;
  int64_t x = 0;
  if (*c < '0' || *c > '9') return 0;
  for (; *c >= '0' && *c <= '9'; c++) x = x > INT64_MAX / 10 - 9 ? INT64_MAX / 10 : x * 10 + (*c - '0');
  *v = x;
  *p = c;
  return 1;
}

/* 0: a key "step_layer_head"; -1: not of that form; 1 + i: part i is past
** KEY_MAX. */
static int parse_key(const char *k, int32_t key[3]) {
  const char *p = k;
  int64_t v[3];
  for (int i = 0; i < 3; i++) {
    if (i > 0 && *p++ != '_') return -1;
    if (!parse_uint(&p, &v[i])) return -1;
  }
  if (*p != '\0') return -1;
  for (int i = 0; i < 3; i++) {
    if (v[i] > KEY_MAX) return 1 + i;
    key[i] = (int32_t)v[i];
  }
  return 0;
}

/* A JSON number holding an integer in lo..hi. */
static int json_int(const cJSON *it, double lo, double hi, int32_t *v) {
  if (!cJSON_IsNumber(it)) return 0;
  double d = it->valuedouble;
  if (!isfinite(d) || d != floor(d) || d < lo || d > hi) return 0;
  *v = (int32_t)d;
  return 1;
}

static int parse_window(const cJSON *val, int32_t win[3]) {
  if (!cJSON_IsArray(val) || cJSON_GetArraySize(val) != 3) return 0;
  int i = 0;
  for (const cJSON *it = val->child; it; it = it->next, i++)
    if (!json_int(it, 1, INT32_MAX, &win[i])) return 0;
  return 1;
}

static const char *json_type_name(const cJSON *j) {
  if (cJSON_IsArray(j)) return "an array";
  if (cJSON_IsObject(j)) return "an object";
  if (cJSON_IsString(j)) return "a string";
  if (cJSON_IsNumber(j)) return "a number";
  if (cJSON_IsBool(j)) return "a boolean";
  if (cJSON_IsNull(j)) return "null";
  return "an invalid value";
}

/* Build a strategy from parsed JSON; messages are prefixed with what. */
static sta_status from_json(sta_strategy **out, const cJSON *root,
                            const char *what) {
  if (!cJSON_IsObject(root))
    return sta_error(STA_ERR_FORMAT, "%s: expected a JSON object at the top level, got %s",
                     what, json_type_name(root));
  sta_strategy *s;
  sta_status rc = sta_strategy_create(&s);
  if (rc != STA_OK) return rc;
  int64_t n = cJSON_GetArraySize(root);
  if ((rc = reserve(s, n)) != STA_OK) { sta_strategy_destroy(s); return rc; }
  for (const cJSON *it = root->child; it; it = it->next) {
    entry *e = &s->e[s->n];
    int bad = parse_key(it->string, e->key);
    if (bad) {
      sta_strategy_destroy(s);
      if (bad > 0)
        return sta_error(STA_ERR_FORMAT, "%s: key \"%.64s\": the %s is out of range (0..%d)",
                         what, it->string, KEY_PART[bad - 1], KEY_MAX);
      return sta_error(STA_ERR_FORMAT, "%s: key \"%.64s\" is not \"step_layer_head\"",
                       what, it->string);
    }
    if (!parse_window(it, e->win)) {
      sta_strategy_destroy(s);
      return sta_error(STA_ERR_FORMAT,
                       "%s: \"%s\": expected [Kt, Kh, Kw] of 3 positive integers",
                       what, it->string);
    }
    e->pos = s->n++;
  }
  if (s->n > 1) qsort(s->e, (size_t)s->n, sizeof *s->e, entry_cmp); /* e NULL when empty */
  /* a repeated key: report the one whose second occurrence comes first */
  int64_t dup = -1;
  for (int64_t i = 1; i < s->n; i++)
    if (key_cmp(s->e[i - 1].key, s->e[i].key) == 0) {
      int64_t later = s->e[i].pos > s->e[i - 1].pos ? i : i - 1;
      if (dup < 0 || s->e[later].pos < s->e[dup].pos) dup = later;
    }
  if (dup >= 0) {
    const int32_t *k = s->e[dup].key;
    sta_status r = sta_error(STA_ERR_FORMAT, "%s: key \"%d_%d_%d\" appears more than once",
                             what, (int)k[0], (int)k[1], (int)k[2]);
    sta_strategy_destroy(s);
    return r;
  }
  *out = s;
  return STA_OK;
}

static sta_status parse_text(sta_strategy **out, const char *json, size_t len,
                             const char *what) {
  cJSON *root = NULL;
  sta_status rc = sta_json_parse(json, len, what, 1, &root);
  if (rc != STA_OK) return rc;
  rc = from_json(out, root, what);
  cJSON_Delete(root);
  return rc;
}

sta_status sta_strategy_parse(sta_strategy **out, const char *json,
                              size_t len) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!json) return sta_error(STA_ERR_ARGUMENT, "json: expected a string, got NULL");
  return parse_text(out, json, len, "mask strategy");
}

sta_status sta_strategy_load(sta_strategy **out, const char *path) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  char *text, what[512];
  size_t len;
  sta_status rc = sta_read_text_file(path, "mask strategy", &text, &len);
  if (rc != STA_OK) return rc;
  snprintf(what, sizeof what, "mask strategy \"%s\"", path);
  rc = parse_text(out, text, len, what);
  free(text);
  return rc;
}

sta_status sta_strategy_load_default(sta_strategy **out) {
  static const char *vars[] = {"STA_ATTENTION_CONFIG",
                               "SGLANG_DIFFUSION_ATTENTION_CONFIG",
                               "FASTVIDEO_ATTENTION_CONFIG"};
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *p = getenv(vars[i]);
    if (p && *p) return sta_strategy_load(out, p);
  }
  return sta_error(STA_ERR_ENV, "STA_ATTENTION_CONFIG is not set");
}

/* ---- writing ------------------------------------------------------------ */

sta_status sta_strategy_to_json(const sta_strategy *s, char **json) {
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (!json) return sta_error(STA_ERR_ARGUMENT, "json: expected a pointer, got NULL");
  /* each line at most 2 + 3*12 + 6 + 3*12 + 8 bytes */
  size_t cap = 8 + (size_t)s->n * 96, n = 0;
  char *buf = sta_malloc(cap);
  if (!buf) return sta_error(STA_ERR_NOMEM, "out of host memory (mask strategy JSON)");
  if (s->n == 0) n += (size_t)snprintf(buf, cap, "{}\n");
  else {
    buf[n++] = '{';
    for (int64_t i = 0; i < s->n; i++) {
      const entry *e = &s->e[i];
      n += (size_t)snprintf(buf + n, cap - n, "%s\n  \"%d_%d_%d\": [%d, %d, %d]",
                            i ? "," : "", (int)e->key[0], (int)e->key[1],
                            (int)e->key[2], (int)e->win[0], (int)e->win[1],
                            (int)e->win[2]);
    }
    n += (size_t)snprintf(buf + n, cap - n, "\n}\n");
  }
  *json = buf;
  return STA_OK;
}

sta_status sta_strategy_save(const sta_strategy *s, const char *path) {
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  char *json;
  sta_status rc = sta_strategy_to_json(s, &json);
  if (rc != STA_OK) return rc;
  char label[512];
  snprintf(label, sizeof label, "mask strategy \"%s\"", path);
  rc = sta_write_text_file(path, label, json, strlen(json));
  free(json);
  return rc;
}

/* ---- building and asking ------------------------------------------------ */

static const char AXIS[3] = {'t', 'h', 'w'};

static sta_status check_window(const int32_t w[3], const char *arg) {
  if (!w) return sta_error(STA_ERR_WINDOW, "%s: expected 3 ints, got NULL", arg);
  for (int i = 0; i < 3; i++)
    if (w[i] < 1)
      return sta_error(STA_ERR_WINDOW, "%s: K%c = %d, expected >= 1", arg, AXIS[i], (int)w[i]);
  return STA_OK;
}

static sta_status check_count(int32_t v, const char *arg, int32_t lo) {
  if (v < lo) return sta_error(STA_ERR_ARGUMENT, "%s: expected >= %d, got %d", arg, (int)lo, (int)v);
  return STA_OK;
}

sta_status sta_strategy_uniform(sta_strategy **out, int32_t steps,
                                int32_t layers, int32_t heads,
                                const int32_t window[3],
                                const int32_t full[3], int32_t full_steps) {
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if ((rc = check_count(steps, "steps", 1)) || (rc = check_count(layers, "layers", 1)) ||
      (rc = check_count(heads, "heads", 1)) || (rc = check_window(window, "window")))
    return rc;
  if (full_steps < 0 || full_steps > steps)
    return sta_error(STA_ERR_ARGUMENT, "full_steps: expected 0..%d (steps), got %d",
                     (int)steps, (int)full_steps);
  if (full_steps > 0 && (rc = check_window(full, "full")) != STA_OK) return rc;
  int64_t n = (int64_t)steps * layers; /* < 2^62: no overflow; x heads checked */
  if (__builtin_mul_overflow(n, (int64_t)heads, &n))
    return sta_error(STA_ERR_ARGUMENT, "steps x layers x heads: %d x %d x %d entries is too many",
                     (int)steps, (int)layers, (int)heads);
  if (n > ((int64_t)1 << 32))
    return sta_error(STA_ERR_ARGUMENT, "steps x layers x heads: %lld entries is too many",
                     (long long)n);
  sta_strategy *s;
  if ((rc = sta_strategy_create(&s)) != STA_OK) return rc;
  if ((rc = reserve(s, n)) != STA_OK) { sta_strategy_destroy(s); return rc; }
  for (int32_t t = 0; t < steps; t++)
    for (int32_t l = 0; l < layers; l++)
      for (int32_t h = 0; h < heads; h++) {
        entry *e = &s->e[s->n];
        const int32_t *w = t < full_steps ? full : window;
        e->key[0] = t; e->key[1] = l; e->key[2] = h;
        memcpy(e->win, w, sizeof e->win);
        e->pos = s->n++;
      }
  *out = s;
  return STA_OK;
}

static sta_status check_key(int32_t step, int32_t layer, int32_t head) {
  const int32_t k[3] = {step, layer, head};
  for (int i = 0; i < 3; i++) {
    sta_status rc = check_count(k[i], KEY_PART[i], 0);
    if (rc != STA_OK) return rc;
    if (k[i] > KEY_MAX)
      return sta_error(STA_ERR_ARGUMENT, "%s: expected 0..%d, got %d", KEY_PART[i], KEY_MAX,
                       (int)k[i]);
  }
  return STA_OK;
}

sta_status sta_strategy_set(sta_strategy *s, int32_t step, int32_t layer,
                            int32_t head, const int32_t window[3]) {
  sta_status rc;
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if ((rc = check_key(step, layer, head)) || (rc = check_window(window, "window")))
    return rc;
  int32_t key[3] = {step, layer, head};
  int64_t i = find(s, key);
  if (i < 0) {
    if ((rc = reserve(s, s->n + 1)) != STA_OK) return rc;
    i = -i - 1;
    memmove(&s->e[i + 1], &s->e[i], (size_t)(s->n - i) * sizeof *s->e);
    memcpy(s->e[i].key, key, sizeof key);
    s->e[i].pos = s->n++;
  }
  memcpy(s->e[i].win, window, sizeof s->e[i].win);
  return STA_OK;
}

static sta_status missing(int32_t step, int32_t layer, int32_t head) {
  return sta_error(STA_ERR_KEY,
                   "mask strategy has no window for \"%d_%d_%d\" (step %d, layer %d, head %d)",
                   (int)step, (int)layer, (int)head, (int)step, (int)layer, (int)head);
}

sta_status sta_strategy_get(const sta_strategy *s, int32_t step,
                            int32_t layer, int32_t head, int32_t window[3]) {
  sta_status rc;
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (!window) return sta_error(STA_ERR_ARGUMENT, "window: expected 3 ints, got NULL");
  if ((rc = check_key(step, layer, head)) != STA_OK) return rc;
  int32_t key[3] = {step, layer, head};
  int64_t i = find(s, key);
  if (i < 0) return missing(step, layer, head);
  memcpy(window, s->e[i].win, sizeof s->e[i].win);
  return STA_OK;
}

int64_t sta_strategy_count(const sta_strategy *s) {
  return sta_handle_check(s, STA_KIND_STRATEGY, "strategy") == STA_OK ? s->n : 0;
}

void sta_strategy_extent(const sta_strategy *s, int32_t *steps,
                         int32_t *layers, int32_t *heads) {
  int32_t m[3] = {0, 0, 0}; /* keys <= KEY_MAX: key + 1 fits */
  if (sta_handle_check(s, STA_KIND_STRATEGY, "strategy") == STA_OK)
    for (int64_t i = 0; i < s->n; i++)
      for (int j = 0; j < 3; j++)
        if (s->e[i].key[j] >= m[j]) m[j] = s->e[i].key[j] + 1;
  if (steps) *steps = m[0];
  if (layers) *layers = m[1];
  if (heads) *heads = m[2];
}

int32_t sta_strategy_has_step(const sta_strategy *s, int32_t step) {
  if (!sta_handle_live(s, STA_KIND_STRATEGY)) return 0;
  int32_t key[3] = {step, 0, 0};
  int64_t i = find(s, key);
  if (i >= 0) return 1;
  i = -i - 1;
  return i < s->n && s->e[i].key[0] == step;
}

sta_status sta_strategy_check(const sta_strategy *s, int32_t steps,
                              int32_t layers, int32_t heads) {
  sta_status rc;
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if ((rc = check_count(steps, "steps", 0)) || (rc = check_count(layers, "layers", 0)) ||
      (rc = check_count(heads, "heads", 0)))
    return rc;
  if (!steps || !layers || !heads) return STA_OK; /* nothing asked (and no 2^31 empty loops) */
  for (int32_t t = 0; t < steps; t++)
    for (int32_t l = 0; l < layers; l++)
      for (int32_t h = 0; h < heads; h++) {
        int32_t key[3] = {t, l, h};
        if (find(s, key) < 0) return missing(t, l, h);
      }
  return STA_OK;
}

sta_status sta_strategy_sparsity(const sta_strategy *s,
                                 const int32_t grid[3], double *sparsity) {
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (!sparsity) return sta_error(STA_ERR_ARGUMENT, "sparsity: expected a pointer, got NULL");
  if (!grid) return sta_error(STA_ERR_ARGUMENT, "grid: expected 3 ints, got NULL");
  for (int i = 0; i < 3; i++)
    if (grid[i] < 1)
      return sta_error(STA_ERR_WINDOW, "grid: %c = %d, expected >= 1", AXIS[i], (int)grid[i]);
  double full = (double)grid[0] * grid[1] * grid[2], used = 0;
  for (int64_t i = 0; i < s->n; i++) {
    double v = 1;
    for (int j = 0; j < 3; j++) v *= s->e[i].win[j] < grid[j] ? s->e[i].win[j] : grid[j];
    used += v;
  }
  *sparsity = s->n ? 1.0 - used / (full * (double)s->n) : 0.0;
  return STA_OK;
}

int32_t sta_strategy_equal(const sta_strategy *a, const sta_strategy *b) {
  if (sta_handle_check(a, STA_KIND_STRATEGY, "a") != STA_OK ||
      sta_handle_check(b, STA_KIND_STRATEGY, "b") != STA_OK)
    return 0;
  if (a->n != b->n) return 0;
  for (int64_t i = 0; i < a->n; i++)
    if (key_cmp(a->e[i].key, b->e[i].key) || memcmp(a->e[i].win, b->e[i].win, sizeof a->e[i].win))
      return 0;
  return 1;
}
