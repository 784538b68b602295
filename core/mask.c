/*
** mask.c -- the block lists of an attention call (sta.h, sta_mask_kind and
** sta_block_list; STA.md section 12): every check of their tensors and
** contents, and their fields in sta_attn_params.  The rule itself, and the
** accessors the backends read the lists with, are mask.h.
*/
#include <omp.h>
#include <stdlib.h>

#include "internal.h"

static const char *const KIND[3] = {"STA_MASK_WINDOW", "STA_MASK_BLOCKS",
                                    "STA_MASK_WINDOW_OR_BLOCKS"};

/* "[2, 3, 5]": the shape of t into buf. */
static const char *shape_text(const sta_tensor *t, char *buf, size_t n) {
  int k = snprintf(buf, n, "[");
  for (int32_t i = 0; i < t->ndim && k > 0 && (size_t)k < n; i++)
    k += snprintf(buf + k, n - (size_t)k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
  if (k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
  return buf;
}

/* List tensor t (named name): live, i32, of ndim dims with sizes want (the
** last one free when free_last), contiguous, on dev (q's).  names: the
** dims' names for the message. */
static sta_status check_list(const sta_tensor *t, const char *name, int32_t ndim,
                             const int64_t *want, const char *const *names, int free_last,
                             sta_device dev) {
  char exp[160], got[96];
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, name);
  if (t->dtype != STA_I32)
    return sta_error(STA_ERR_DTYPE, "%s: expected i32, got %s", name, sta_dtype_name(t->dtype));
  int ok = t->ndim == ndim, k = 0;
  for (int32_t i = 0; i < ndim; i++) {
    if (free_last && i == ndim - 1)
      k += snprintf(exp + k, sizeof exp - (size_t)k, "%s%s", i ? ", " : "", names[i]);
    else
      k += snprintf(exp + k, sizeof exp - (size_t)k, "%s%s=%lld", i ? ", " : "", names[i],
                    (long long)want[i]);
    if (ok && !(free_last && i == ndim - 1) && t->shape[i] != want[i]) ok = 0;
  }
  if (!ok)
    return sta_error(STA_ERR_SHAPE, "%s: expected shape [%s], got %s", name, exp,
                     shape_text(t, got, sizeof got));
  if (!sta_tensor_is_contiguous(t))
    return sta_error(STA_ERR_SHAPE, "%s: expected a contiguous tensor (row-major)", name);
  if (t->storage->device != dev)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", name,
                     sta_device_name(t->storage->device), sta_device_name(dev));
  return STA_OK;
}

/* A query block's list that is wrong: where, and how. */
typedef struct list_fault {
  int64_t m;       /* query block; -1: none */
  int32_t what;    /* 0 num out of range, 1 index out of range, 2 index twice */
  int32_t i, j;    /* entries (j: the first of a repeat) */
  int32_t value;   /* num, or the key block */
} list_fault;

/* The first fault of the lists of (batch, head) bh, or f->m = -1; seen,
** at: Mk scratch ints (seen[n] = 1 + the last query block that listed n). */
static void scan_lists(const sta_attn_params *p, const int32_t *num, const int32_t *idx,
                       int64_t bh, int64_t *seen, int32_t *at, list_fault *f) {
  const int64_t L = p->list_len, Mk = p->kv_blocks;
  f->m = -1;
  for (int64_t m = 0; m < p->q_blocks; m++) {
    const int64_t row = bh * p->q_blocks + m;
    const int32_t n = num[row];
    if (n < 0 || n > L) {
      *f = (list_fault){m, 0, 0, 0, n};
      return;
    }
    for (int32_t i = 0; i < n; i++) {
      const int32_t x = idx[row * L + i];
      if (x < 0 || x >= Mk) {
        *f = (list_fault){m, 1, i, 0, x};
        return;
      }
      if (seen[x] == row + 1) {
        *f = (list_fault){m, 2, i, at[x], x};
        return;
      }
      seen[x] = row + 1;
      at[x] = i;
    }
  }
}

/* The contents of host lists: sizes in 1..block_rows, num in 0..L, every
** index in [0, Mk) and none twice in one list; the first fault in (b, h,
** m, entry) order is the error.  (b, h) pairs are scanned in parallel. */
static sta_status check_host_lists(const sta_attn_params *p, const int32_t *num,
                                   const int32_t *idx, const int32_t *qs, const int32_t *ks) {
  const int32_t *sz[2] = {ks, qs};
  const int64_t cnt[2] = {p->kv_blocks, p->q_blocks};
  static const char *const SN[2] = {"blocks.kv_sizes", "blocks.q_sizes"};
  for (int s = 0; s < 2; s++)
    for (int64_t n = 0; sz[s] && n < cnt[s]; n++)
      if (sz[s][n] < 1 || sz[s][n] > p->block_rows)
        return sta_error(STA_ERR_ARGUMENT, "%s[%lld]: %d is outside 1..%d (block_rows)", SN[s],
                         (long long)n, (int)sz[s][n], (int)p->block_rows);
  const int64_t BH = p->batch * p->heads, Mk = p->kv_blocks;
  const int nt = sta_get_num_threads();
  list_fault *f = sta_malloc(sizeof *f * (size_t)(BH > 0 ? BH : 1));
  int64_t *seen = sta_malloc(sizeof(int64_t) * (size_t)(Mk * nt + 1));
  int32_t *at = sta_malloc(sizeof(int32_t) * (size_t)(Mk * nt + 1));
  if (!f || !seen || !at) {
    free(f); free(seen); free(at);
    return sta_error(STA_ERR_NOMEM, "out of host memory (block list check)");
  }
  for (int64_t i = 0; i < Mk * nt; i++) seen[i] = 0;
  #pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t bh = 0; bh < BH; bh++) {
    const int tid = omp_get_thread_num();
    scan_lists(p, num, idx, bh, seen + Mk * tid, at + Mk * tid, &f[bh]);
  }
  sta_status rc = STA_OK;
  for (int64_t bh = 0; bh < BH && rc == STA_OK; bh++) {
    const list_fault *x = &f[bh];
    const long long b = (long long)(bh / p->heads), h = (long long)(bh % p->heads), m = x->m;
    if (x->m < 0) continue;
    if (x->what == 0)
      rc = sta_error(STA_ERR_ARGUMENT, "blocks.num[b=%lld, h=%lld, m=%lld]: %d is outside "
                     "0..%lld (L, the entries of idx per query block)", b, h, m, (int)x->value,
                     (long long)p->list_len);
    else if (x->what == 1)
      rc = sta_error(STA_ERR_ARGUMENT, "blocks.idx[b=%lld, h=%lld, m=%lld]: entry %d is key "
                     "block %d, outside 0..%lld", b, h, m, (int)x->i, (int)x->value,
                     (long long)(Mk - 1));
    else
      rc = sta_error(STA_ERR_ARGUMENT, "blocks.idx[b=%lld, h=%lld, m=%lld]: key block %d is "
                     "listed twice (entries %d and %d)", b, h, m, (int)x->value, (int)x->j,
                     (int)x->i);
  }
  free(f);
  free(seen);
  free(at);
  return rc;
}

/* A device array of n ints into a new host array (*out, sta_malloc). */
static sta_status fetch_ints(const sta_backend_ops *be, sta_device dev, const int32_t *src,
                             int64_t n, int32_t **out) {
  *out = NULL;
  if (!src) return STA_OK;
  *out = sta_malloc(sizeof(int32_t) * (size_t)n + 1);
  if (!*out) return sta_error(STA_ERR_NOMEM, "out of host memory (block lists)");
  return be->memcpy(*out, STA_CPU, src, dev, sizeof(int32_t) * (size_t)n);
}

sta_status sta_mask_check_lists(const sta_attn_params *p, sta_device dev) {
  if (dev == STA_CPU) return check_host_lists(p, p->num, p->idx, p->q_sizes, p->kv_sizes);
  const sta_backend_ops *be = sta_backend_get(dev);
  if (be->check_lists) return be->check_lists(p);
  /* No device check yet: the lists cross to the host once per call, 4 *
  ** (B*heads*Mq*(L + 1) + Mq + Mk) bytes (at hunyuan-720p's VSA, 64-row
  ** cubes, top 225 of 1800: 39 MB, a few ms over PCIe), and are checked
  ** there.  A backend's check_lists op replaces this. */
  const int64_t rows = p->batch * p->heads * p->q_blocks;
  int32_t *h[4] = {NULL, NULL, NULL, NULL};
  sta_status rc = fetch_ints(be, dev, p->num, rows, &h[0]);
  if (rc == STA_OK) rc = fetch_ints(be, dev, p->idx, rows * p->list_len, &h[1]);
  if (rc == STA_OK && p->q_sizes != p->kv_sizes)
    rc = fetch_ints(be, dev, p->q_sizes, p->q_blocks, &h[2]);
  if (rc == STA_OK) rc = fetch_ints(be, dev, p->kv_sizes, p->kv_blocks, &h[3]);
  if (rc == STA_OK)
    rc = check_host_lists(p, h[0], h[1], p->q_sizes == p->kv_sizes ? h[3] : h[2], h[3]);
  for (int i = 0; i < 4; i++) free(h[i]);
  return rc;
}

sta_status sta_mask_resolve(const sta_attention_desc *desc, const sta_tensor *q,
                            sta_attn_params *p) {
  const sta_device dev = q->storage->device;
  const sta_block_list *bl = desc->blocks;
  const char *kind = KIND[desc->mask];
  const sta_backend_ops *be = sta_backend_get(dev);
  const int uni = desc->mask == STA_MASK_WINDOW_OR_BLOCKS;
  sta_status rc;
  if (!(be->masks & (1 << desc->mask))) /* the one refusal of a backend's missing kernels */
    return sta_error(STA_ERR_UNSUPPORTED, "mask: %s has no kernel on %s; the CPU backend "
                     "computes it (host tensors)", kind, sta_device_name(dev));
  if (desc->precision == STA_PRECISION_FP8)
    return sta_error(STA_ERR_UNSUPPORTED, "precision: STA_PRECISION_FP8 computes the window "
                     "(STA_MASK_WINDOW) only, not %s", kind);
  if (!bl)
    return sta_error(STA_ERR_ARGUMENT, "blocks: expected a sta_block_list for %s, got NULL",
                     kind);
  const int64_t tv = (int64_t)p->tile[0] * p->tile[1] * p->tile[2];
  int64_t bv = bl->block_rows ? bl->block_rows : uni ? tv : 64;
  if (bl->block_rows < 0)
    return sta_error(STA_ERR_ARGUMENT, "blocks.block_rows: expected >= 1 (0: %s), got %d",
                     uni ? "the tile volume" : "64", (int)bl->block_rows);
  if (uni) { /* the blocks are the tiles, tile after tile */
    if (!p->tiled)
      return sta_error(STA_ERR_ARGUMENT, "geom.order: %s needs STA_ORDER_TILED (its blocks are "
                       "the tiles, tile after tile), got STA_ORDER_UNTILED", kind);
    if (bv != tv)
      return sta_error(STA_ERR_ARGUMENT, "blocks.block_rows: %lld, expected the tile volume "
                       "%lld or 0 (%s: its blocks are the tiles)", (long long)bv, (long long)tv,
                       kind);
    if (p->seq_len != p->video_rows)
      return sta_error(STA_ERR_SHAPE, "q: S = %lld, expected the %lld rows of the %dx%dx%d "
                       "tiles (%s takes no text rows)", (long long)p->seq_len,
                       (long long)p->video_rows, (int)p->grid[0], (int)p->grid[1],
                       (int)p->grid[2], kind);
  }
  static const char *const SN[2] = {"q", "k"};
  const int64_t s[2] = {p->seq_len, p->kv_len};
  for (int i = 0; i < 2; i++)
    if (s[i] % bv != 0)
      return sta_error(STA_ERR_SHAPE, "%s: S = %lld is not a multiple of block_rows %lld (%s: "
                       "whole blocks, padding rows included)", SN[i], (long long)s[i],
                       (long long)bv, kind);
  const int64_t Mq = p->seq_len / bv, Mk = p->kv_len / bv;
  static const char *const NN[3] = {"B", "heads", "Mq"}, *const IN[4] = {"B", "heads", "Mq", "L"};
  static const char *const KN[1] = {"Mk"}, *const QN[1] = {"Mq"};
  const int64_t wn[4] = {p->batch, p->heads, Mq, 0};
  if ((rc = check_list(bl->num, "blocks.num", 3, wn, NN, 0, dev)) != STA_OK ||
      (rc = check_list(bl->idx, "blocks.idx", 4, wn, IN, 1, dev)) != STA_OK)
    return rc;
  if (bl->kv_sizes && (rc = check_list(bl->kv_sizes, "blocks.kv_sizes", 1, &Mk, KN, 0, dev)) != STA_OK)
    return rc;
  if (bl->q_sizes && (rc = check_list(bl->q_sizes, "blocks.q_sizes", 1, &Mq, QN, 0, dev)) != STA_OK)
    return rc;
  p->mask = desc->mask;
  p->block_rows = (int32_t)bv;
  p->q_blocks = Mq;
  p->kv_blocks = Mk;
  p->list_len = bl->idx->shape[3];
  p->num = sta_tensor_data(bl->num);
  p->idx = sta_tensor_data(bl->idx);
  p->kv_sizes = bl->kv_sizes ? sta_tensor_data(bl->kv_sizes) : NULL;
  p->q_sizes = bl->q_sizes ? sta_tensor_data(bl->q_sizes) : Mq == Mk ? p->kv_sizes : NULL;
  return sta_mask_check_lists(p, dev);
}

/* t on the host (itself, or a new copy in *own), or NULL: not a live
** contiguous i32 tensor of n elements (n < 0: any). */
static const int32_t *host_ints(const sta_tensor *t, int64_t n, sta_tensor **own) {
  *own = NULL;
  if (!sta_handle_live(t, STA_KIND_TENSOR) || t->dtype != STA_I32 ||
      !sta_tensor_is_contiguous(t) || (n >= 0 && sta_tensor_numel(t) != n))
    return NULL;
  if (t->storage->device == STA_CPU) return sta_tensor_data(t);
  return sta_tensor_to(own, t, STA_I32, STA_CPU) == STA_OK ? sta_tensor_data(*own) : NULL;
}

double sta_mask_flops(const sta_attention_desc *desc, int64_t batch, int64_t seq_len,
                      int64_t heads, int64_t head_dim) {
  const sta_block_list *bl = desc->blocks;
  const int uni = desc->mask == STA_MASK_WINDOW_OR_BLOCKS;
  if (!bl || (desc->mask != STA_MASK_BLOCKS && !uni) || batch < 1 || heads < 1 ||
      !sta_handle_live(bl->idx, STA_KIND_TENSOR) || bl->idx->ndim != 4)
    return 0;
  int32_t grid[3] = {1, 1, 1};
  const int64_t tv = (int64_t)desc->geom.tile[0] * desc->geom.tile[1] * desc->geom.tile[2];
  const int64_t bv = bl->block_rows > 0 ? bl->block_rows : uni ? tv : 64;
  if (uni) {
    if (!desc->windows || sta_geometry_check(&desc->geom, seq_len) != STA_OK) return 0;
    sta_geometry_grid(&desc->geom, grid);
  }
  const int64_t Mq = seq_len / bv, L = bl->idx->shape[3];
  const int64_t Mk = uni ? Mq : bl->kv_sizes ? sta_tensor_numel(bl->kv_sizes) : INT32_MAX;
  sta_tensor *own[4];
  const int32_t *num = host_ints(bl->num, batch * heads * Mq, &own[0]);
  const int32_t *idx = host_ints(bl->idx, batch * heads * Mq * L, &own[1]);
  const int32_t *ks = bl->kv_sizes ? host_ints(bl->kv_sizes, -1, &own[2]) : (own[2] = NULL, NULL);
  const int32_t *qs = bl->q_sizes ? host_ints(bl->q_sizes, Mq, &own[3]) : (own[3] = NULL, NULL);
  if (!bl->q_sizes && bl->kv_sizes && Mq == Mk) qs = ks;
  double pairs = 0;
  int ok = num && idx && (!bl->kv_sizes || ks) && (!bl->q_sizes || qs) && seq_len % bv == 0;
  for (int64_t bh = 0; ok && bh < batch * heads; bh++) {
    const int32_t *win = uni ? desc->windows + (desc->n_windows == 1 ? 0 : 3 * (bh % heads)) : NULL;
    for (int64_t m = 0; ok && m < Mq; m++) {
      const int64_t row = bh * Mq + m;
      double keys = 0;
      ok = num[row] >= 0 && num[row] <= L;
      for (int32_t i = 0; ok && i < num[row]; i++) {
        const int32_t n = idx[row * L + i];
        ok = n >= 0 && n < Mk;
        if (ok && !(uni && sta_window_holds_tile(grid, win, m, n)))
          keys += sta_block_valid(ks, n, (int32_t)bv);
      }
      for (int64_t n = 0; uni && ok && n < Mk; n++)
        if (sta_window_holds_tile(grid, win, m, n)) keys += sta_block_valid(ks, n, (int32_t)bv);
      pairs += keys * sta_block_valid(qs, m, (int32_t)bv);
    }
  }
  for (int i = 0; i < 4; i++) sta_tensor_destroy(own[i]);
  return ok ? 4.0 * (double)head_dim * pairs : 0;
}
