/*
** metadata.c -- one step's [layer][head] window table (FastVideo's
** STA_param); a row shorter than the total head count is a search row.
*/
#include <stdlib.h>

#include "internal.h"

struct sta_metadata {
  int32_t refs; /* the creator's and every context's that holds it */
  int32_t layers;
  int32_t *n;     /* windows per row, 0 = unset */
  int32_t **rows; /* n[l]*3 ints each */
};

sta_status sta_metadata_create(sta_metadata **out, int32_t layers) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (layers < 1 || layers > (1 << 20))
    return sta_error(STA_ERR_ARGUMENT, "layers: expected 1..%d, got %d", 1 << 20, (int)layers);
  sta_metadata *m = sta_calloc(1, sizeof *m);
  if (m) {
    m->n = sta_calloc((size_t)layers, sizeof *m->n);
    m->rows = sta_calloc((size_t)layers, sizeof *m->rows);
  }
  sta_status rc = STA_ERR_NOMEM;
  if (!m || !m->n || !m->rows || (rc = sta_handle_add(m, STA_KIND_METADATA)) != STA_OK) {
    if (m) { free(m->n); free(m->rows); free(m); }
    if (rc != STA_ERR_NOMEM) return rc;
    return sta_error(STA_ERR_NOMEM, "out of host memory (metadata of %d layers)", (int)layers);
  }
  m->refs = 1;
  m->layers = layers;
  *out = m;
  return STA_OK;
}

void sta_metadata_retain(sta_metadata *m) {
  if (sta_handle_check(m, STA_KIND_METADATA, "metadata") == STA_OK) sta_ref_retain(&m->refs);
}

void sta_metadata_destroy(sta_metadata *m) {
  if (!sta_handle_live(m, STA_KIND_METADATA) || !sta_ref_release(&m->refs)) return;
  sta_handle_remove(m);
  for (int32_t l = 0; l < m->layers; l++) free(m->rows[l]);
  free(m->rows);
  free(m->n);
  free(m);
}

int32_t sta_metadata_layers(const sta_metadata *m) {
  return sta_handle_check(m, STA_KIND_METADATA, "metadata") == STA_OK ? m->layers : 0;
}

static sta_status check_windows(int32_t n, const int32_t *w, const char *arg) {
  static const char AXIS[3] = {'t', 'h', 'w'};
  if (n > 0 && !w) return sta_error(STA_ERR_WINDOW, "%s: expected %d ints, got NULL", arg, (int)(3 * n));
  for (int32_t i = 0; i < n; i++)
    for (int j = 0; j < 3; j++)
      if (w[3 * i + j] < 1)
        return sta_error(STA_ERR_WINDOW, "%s[%d]: K%c = %d, expected >= 1", arg, (int)i,
                         AXIS[j], (int)w[3 * i + j]);
  return STA_OK;
}

sta_status sta_metadata_set_row(sta_metadata *m, int32_t layer, int32_t n,
                                const int32_t *windows) {
  sta_status rc;
  STA_CHECK_HANDLE(m, STA_KIND_METADATA, "metadata");
  if (layer < 0 || layer >= m->layers)
    return sta_error(STA_ERR_ARGUMENT, "layer: expected 0..%d, got %d", (int)m->layers - 1,
                     (int)layer);
  if (n < 0 || n > (1 << 20))
    return sta_error(STA_ERR_ARGUMENT, "n: expected 0..%d windows, got %d", 1 << 20, (int)n);
  if ((rc = check_windows(n, windows, "windows")) != STA_OK) return rc;
  int32_t *row = NULL;
  if (n > 0) {
    row = sta_malloc(sizeof(int32_t) * 3 * (size_t)n);
    if (!row) return sta_error(STA_ERR_NOMEM, "out of host memory (metadata row of %d windows)", (int)n);
    memcpy(row, windows, sizeof(int32_t) * 3 * (size_t)n);
  }
  free(m->rows[layer]);
  m->rows[layer] = row;
  m->n[layer] = n;
  return STA_OK;
}

sta_status sta_metadata_row(const sta_metadata *m, int32_t layer,
                            int32_t *n, const int32_t **windows) {
  STA_CHECK_HANDLE(m, STA_KIND_METADATA, "metadata");
  if (!n || !windows) return sta_error(STA_ERR_ARGUMENT, "n, windows: expected pointers, got NULL");
  if (layer < 0 || layer >= m->layers)
    return sta_error(STA_ERR_ARGUMENT, "layer: expected 0..%d, got %d", (int)m->layers - 1,
                     (int)layer);
  *n = m->n[layer];
  *windows = m->rows[layer];
  return STA_OK;
}

sta_status sta_metadata_from_strategy(sta_metadata **out,
                                      const sta_strategy *s, int32_t step,
                                      int32_t layers, int32_t heads) {
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!s)
    return sta_error(STA_ERR_NO_STRATEGY, "mask_strategy cannot be None for SlidingTileAttention");
  STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (!sta_strategy_has_step(s, 0))
    return sta_error(STA_ERR_NO_STEP0, "mask_strategy[0] cannot be None for SlidingTileAttention");
  if (step < 0) return sta_error(STA_ERR_ARGUMENT, "step: expected >= 0, got %d", (int)step);
  if (heads < 1 || heads > (1 << 20))
    return sta_error(STA_ERR_ARGUMENT, "heads: expected 1..%d, got %d", 1 << 20, (int)heads);
  sta_metadata *m;
  if ((rc = sta_metadata_create(&m, layers)) != STA_OK) return rc;
  for (int32_t l = 0; l < layers; l++) {
    m->rows[l] = sta_malloc(sizeof(int32_t) * 3 * (size_t)heads);
    if (!m->rows[l]) {
      sta_metadata_destroy(m);
      return sta_error(STA_ERR_NOMEM, "out of host memory (metadata row of %d heads)", (int)heads);
    }
    m->n[l] = heads;
    for (int32_t h = 0; h < heads; h++)
      if ((rc = sta_strategy_get(s, step, l, h, m->rows[l] + 3 * h)) != STA_OK) {
        sta_metadata_destroy(m);
        return rc;
      }
  }
  *out = m;
  return STA_OK;
}

sta_status sta_metadata_search(sta_metadata **out, int32_t layers,
                               int32_t n_candidates,
                               const int32_t *candidates) {
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (n_candidates < 1 || n_candidates > 1024)
    return sta_error(STA_ERR_ARGUMENT,
                     "n_candidates: expected 1..1024 (the full window last), got %d",
                     (int)n_candidates);
  if ((rc = check_windows(n_candidates, candidates, "candidates")) != STA_OK) return rc;
  sta_metadata *m;
  if ((rc = sta_metadata_create(&m, layers)) != STA_OK) return rc;
  for (int32_t l = 0; l < layers; l++)
    if ((rc = sta_metadata_set_row(m, l, n_candidates, candidates)) != STA_OK) {
      sta_metadata_destroy(m);
      return rc;
    }
  *out = m;
  return STA_OK;
}
