/*
** tune.c -- mask tuning (STA.md section 7): average the L2 losses of saved
** search files, keep the full window for the first skip_steps steps, then
** take per (step, layer, head) the candidate with the least average L2.
*/
#include <math.h>
#include <stdlib.h>

#include <cJSON.h>

#include "internal.h"

typedef struct tune_state {
  int32_t n_cand, dims[3]; /* candidates; steps, layers, heads */
  int32_t *cand;           /* n_cand*3, in the first file's order */
  double *sum;             /* [cand][step][layer][head] */
  const char *first;       /* path of the first file */
} tune_state;

static void skip_ws(const char **p) {
  while (**p == ' ') (*p)++;
}

static int parse_pos(const char **p, int32_t *v) {
  int64_t x = 0;
  const char *c = *p;
  if (*c < '0' || *c > '9') return 0;
  for (; *c >= '0' && *c <= '9'; c++)
    if ((x = x * 10 + (*c - '0')) > INT32_MAX) return 0;
  if (x < 1) return 0;
  *v = (int32_t)x;
  *p = c;
  return 1;
}

/* Python's str of a list of 3 positive ints: "[3, 1, 10]". */
static int parse_candidate(const char *s, int32_t w[3]) {
  const char *p = s;
  if (*p++ != '[') return 0;
  for (int i = 0; i < 3; i++) {
    skip_ws(&p);
    if (!parse_pos(&p, &w[i])) return 0;
    skip_ws(&p);
    if (*p++ != (i < 2 ? ',' : ']')) return 0;
  }
  return *p == '\0';
}

static int32_t find_candidate(const tune_state *st, const int32_t w[3]) {
  for (int32_t c = 0; c < st->n_cand; c++)
    if (!memcmp(st->cand + 3 * c, w, 3 * sizeof(int32_t))) return c;
  return -1;
}

/* One list of the [step][layer][head] table has dims[d] entries. */
static sta_status check_list(const tune_state *st, const cJSON *x, int d,
                             const char *path, const char *key, const int32_t *at) {
  static const char *what[3] = {"steps", "layers", "heads"};
  if (cJSON_IsArray(x) && cJSON_GetArraySize(x) == st->dims[d]) return STA_OK;
  char where[64] = "";
  int n = 0;
  for (int j = 0; j < d; j++) n += snprintf(where + n, sizeof where - (size_t)n, "[%d]", (int)at[j]);
  int other = path != st->first;
  return sta_error(STA_ERR_FORMAT,
                   "search results \"%s\": L2_loss[\"%s\"]%s is not a list of %d %s%s%s%s",
                   path, key, where, (int)st->dims[d], what[d], other ? " as in \"" : "",
                   other ? st->first : "", other ? "\"" : "");
}

/* Check a [step][layer][head] array against st->dims (set them when
** dims[0] is 0) and add it to sum (when sum is not NULL). */
static sta_status add_losses(tune_state *st, const cJSON *a, const char *path,
                             const char *key, double *sum) {
  sta_status rc;
  if (st->dims[0] == 0) { /* the first list sets the sizes */
    static const char *zeros[3] = {"", "[0]", "[0][0]"};
    static const char *what[3] = {"steps", "layers", "heads"};
    const cJSON *x = a;
    for (int d = 0; d < 3; d++, x = x->child)
      if (!cJSON_IsArray(x) || (st->dims[d] = cJSON_GetArraySize(x)) < 1) {
        st->dims[0] = st->dims[1] = st->dims[2] = 0;
        return sta_error(STA_ERR_FORMAT,
                         "search results \"%s\": L2_loss[\"%s\"]%s is not a non-empty list of %s",
                         path, key, zeros[d], what[d]);
      }
  }
  int32_t at[3] = {0, 0, 0};
  if ((rc = check_list(st, a, 0, path, key, at)) != STA_OK) return rc;
  for (const cJSON *ps = a->child; ps; ps = ps->next, at[0]++) {
    if ((rc = check_list(st, ps, 1, path, key, at)) != STA_OK) return rc;
    at[1] = 0;
    for (const cJSON *pl = ps->child; pl; pl = pl->next, at[1]++) {
      if ((rc = check_list(st, pl, 2, path, key, at)) != STA_OK) return rc;
      at[2] = 0;
      for (const cJSON *ph = pl->child; ph; ph = ph->next, at[2]++) {
        if (!cJSON_IsNumber(ph) || !isfinite(ph->valuedouble))
          return sta_error(STA_ERR_FORMAT,
                           "search results \"%s\": L2_loss[\"%s\"][%d][%d][%d] is not a number",
                           path, key, (int)at[0], (int)at[1], (int)at[2]);
        if (sum) sum[((size_t)at[0] * st->dims[1] + at[1]) * st->dims[2] + at[2]] += ph->valuedouble;
      }
    }
  }
  return STA_OK;
}

static sta_status read_file(tune_state *st, const char *path, int first) {
  char *text;
  size_t len;
  sta_status rc = sta_read_text_file(path, "search results", &text, &len);
  if (rc != STA_OK) return rc;
  char what[512];
  cJSON *root = NULL;
  snprintf(what, sizeof what, "search results \"%s\"", path);
  rc = sta_json_parse(text, len, what, 0, &root);
  free(text);
  if (rc != STA_OK) return rc;
  const cJSON *l2 = cJSON_GetObjectItemCaseSensitive(root, "L2_loss");
  if (!cJSON_IsObject(root) || !cJSON_IsObject(l2)) {
    rc = sta_error(STA_ERR_FORMAT,
                   "search results \"%s\": expected an object with \"L2_loss\": "
                   "{\"[Kt, Kh, Kw]\": [step][layer][head], ...}", path);
    goto out;
  }
  int32_t n = cJSON_GetArraySize(l2);
  if (n < 1) {
    rc = sta_error(STA_ERR_FORMAT, "search results \"%s\": L2_loss holds no candidates", path);
    goto out;
  }
  if (first) {
    st->n_cand = n;
    st->cand = sta_calloc((size_t)n * 3, sizeof(int32_t)); /* find_candidate scans it all */
    if (!st->cand) { rc = sta_error(STA_ERR_NOMEM, "out of host memory (tuning)"); goto out; }
  } else if (n != st->n_cand) {
    rc = sta_error(STA_ERR_FORMAT, "search results \"%s\": %d candidates, \"%s\" has %d", path,
                   (int)n, st->first, (int)st->n_cand);
    goto out;
  }
  int32_t i = 0, w[3];
  for (const cJSON *it = l2->child; it; it = it->next, i++) {
    if (!parse_candidate(it->string, w)) {
      rc = sta_error(STA_ERR_FORMAT,
                     "search results \"%s\": L2_loss key \"%s\" is not a window like \"[3, 1, 10]\"",
                     path, it->string);
      goto out;
    }
    int32_t c = find_candidate(st, w);
    if (first) {
      if (c >= 0 && c < i) {
        rc = sta_error(STA_ERR_FORMAT, "search results \"%s\": L2_loss key \"%s\" appears twice",
                       path, it->string);
        goto out;
      }
      memcpy(st->cand + 3 * i, w, sizeof w);
      /* first pass sizes the table: check the shape, sum later */
      if ((rc = add_losses(st, it, path, it->string, NULL)) != STA_OK) goto out;
    } else if (c < 0) {
      rc = sta_error(STA_ERR_FORMAT,
                     "search results \"%s\": candidate \"%s\" is not in \"%s\"", path,
                     it->string, st->first);
      goto out;
    } else {
      for (const cJSON *prev = l2->child; prev != it; prev = prev->next) {
        int32_t pw[3];
        parse_candidate(prev->string, pw);
        if (!memcmp(pw, w, sizeof w)) {
          rc = sta_error(STA_ERR_FORMAT,
                         "search results \"%s\": L2_loss key \"%s\" appears twice", path,
                         it->string);
          goto out;
        }
      }
    }
  }
  if (first) {
    size_t per = (size_t)st->dims[0] * st->dims[1] * st->dims[2];
    st->sum = sta_calloc((size_t)n * per, sizeof(double));
    if (!st->sum) { rc = sta_error(STA_ERR_NOMEM, "out of host memory (tuning)"); goto out; }
  }
  /* every candidate exactly once (counts are equal, so no key repeats) */
  for (const cJSON *it = l2->child; it; it = it->next) {
    parse_candidate(it->string, w);
    int32_t c = find_candidate(st, w);
    size_t per = (size_t)st->dims[0] * st->dims[1] * st->dims[2];
    if ((rc = add_losses(st, it, path, it->string, st->sum + (size_t)c * per)) != STA_OK)
      goto out;
  }
out:
  cJSON_Delete(root);
  return rc;
}

void sta_tune_defaults(int32_t full[3], int32_t *skip_steps) {
  if (full) { full[0] = 3; full[1] = 6; full[2] = 10; }
  if (skip_steps) *skip_steps = 12;
}

sta_status sta_tune(sta_strategy **out, int32_t n_files,
                    const char *const *paths, int32_t skip_steps,
                    const int32_t full[3], sta_tune_report *report) {
  static const char AXIS[3] = {'t', 'h', 'w'};
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (n_files < 1) return sta_error(STA_ERR_ARGUMENT, "n_files: expected >= 1, got %d", (int)n_files);
  if (!paths) return sta_error(STA_ERR_ARGUMENT, "paths: expected %d file names, got NULL", (int)n_files);
  for (int32_t i = 0; i < n_files; i++)
    if (!paths[i]) return sta_error(STA_ERR_ARGUMENT, "paths[%d]: expected a file name, got NULL", (int)i);
  if (skip_steps < 0)
    return sta_error(STA_ERR_ARGUMENT, "skip_steps: expected >= 0, got %d", (int)skip_steps);
  if (!full) return sta_error(STA_ERR_WINDOW, "full: expected 3 ints, got NULL");
  for (int i = 0; i < 3; i++)
    if (full[i] < 1)
      return sta_error(STA_ERR_WINDOW, "full: K%c = %d, expected >= 1", AXIS[i], (int)full[i]);
  tune_state st;
  memset(&st, 0, sizeof st);
  st.first = paths[0];
  sta_strategy *s = NULL;
  for (int32_t i = 0; i < n_files; i++)
    if ((rc = read_file(&st, paths[i], i == 0)) != STA_OK) goto done;
  if ((rc = sta_strategy_create(&s)) != STA_OK) goto done;
  int32_t S = st.dims[0], L = st.dims[1], H = st.dims[2];
  size_t per = (size_t)S * L * H;
  int64_t counts[17] = {0};
  for (int32_t t = 0; t < S; t++)
    for (int32_t l = 0; l < L; l++)
      for (int32_t h = 0; h < H; h++) {
        const int32_t *w = full;
        int32_t best = -1;
        if (t >= skip_steps) {
          size_t at = ((size_t)t * L + l) * H + h;
          for (int32_t c = 0; c < st.n_cand; c++)
            if (best < 0 || st.sum[(size_t)c * per + at] / n_files <
                                st.sum[(size_t)best * per + at] / n_files)
              best = c;
          w = st.cand + 3 * best;
        }
        if ((rc = sta_strategy_set(s, t, l, h, w)) != STA_OK) goto done;
        if (best >= 0 && best < 16 && memcmp(w, full, 3 * sizeof(int32_t))) counts[best]++;
        else if (best < 0 || !memcmp(w, full, 3 * sizeof(int32_t))) counts[16]++;
      }
  if (report) {
    sta_tune_report r;
    memset(&r, 0, sizeof r);
    if ((rc = sta_strategy_sparsity(s, full, &r.sparsity)) != STA_OK) goto done;
    for (int32_t c = 0; c <= 16; c++) {
      if (!counts[c] || r.n_windows == 16) continue;
      memcpy(r.windows[r.n_windows], c == 16 ? full : st.cand + 3 * c, 3 * sizeof(int32_t));
      r.counts[r.n_windows++] = counts[c];
    }
    *report = r;
  }
  *out = s;
  s = NULL;
done:
  sta_strategy_destroy(s);
  free(st.cand);
  free(st.sum);
  return rc;
}
