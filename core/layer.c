/*
** layer.c -- the STA layer: finds its row of the live context's window
** table (or builds it from its strategy), picks this rank's global heads,
** and runs STA; a search row runs every candidate and records L1/L2.
*/
#include <math.h>
#include <stdlib.h>

#include "internal.h"

struct sta_layer {
  int32_t index, local_heads, head_dim, sp_rank, sp_size;
  int32_t auto_geom; /* canvas 0,0,0: known shape from seq_len */
  sta_geometry geom;
  sta_layout layout;
  sta_device backend;
  float scale;
  sta_softmax softmax;
  sta_precision precision;
  const sta_strategy *strategy;
  /* VSA mode (sta_layer_mode): the cube, its rows, the cubes of the
  ** canvas and their valid sizes (i32 [cubes] on the backend) */
  sta_layer_mode mode;
  int32_t cube[3], cube_rows, dense_steps;
  int64_t cubes;
  sta_tensor *sizes;
};

/* SGLang: int(prefix.split('.')[-3]). */
sta_status sta_layer_index_from_prefix(const char *prefix, int32_t *layer) {
  if (!prefix) return sta_error(STA_ERR_ARGUMENT, "prefix: expected a string, got NULL");
  if (!layer) return sta_error(STA_ERR_ARGUMENT, "layer: expected a pointer, got NULL");
  const char *end = prefix + strlen(prefix), *dots[3];
  int found = 0;
  for (const char *p = end; p > prefix && found < 3;)
    if (*--p == '.') dots[found++] = p;
  if (found < 2)
    return sta_error(STA_ERR_ARGUMENT,
                     "prefix \"%s\": expected at least 3 '.'-separated parts "
                     "(the layer is prefix.split('.')[-3])", prefix);
  /* part -3 runs from after dots[2] (or the start) to dots[1] */
  const char *a = found == 3 ? dots[2] + 1 : prefix, *b = dots[1];
  int64_t v = 0;
  int ok = a < b;
  for (const char *p = a; ok && p < b; p++) {
    ok = *p >= '0' && *p <= '9';
    if (ok) v = v * 10 + (*p - '0');
    if (v > INT32_MAX) ok = 0;
  }
  if (!ok)
    return sta_error(STA_ERR_ARGUMENT,
                     "prefix \"%s\": part -3 \"%.*s\" is not a layer number", prefix,
                     (int)(b - a), a);
  *layer = (int32_t)v;
  return STA_OK;
}

/* What a VSA layer's description must hold (sta.h, sta_layer_mode); the
** cube (0,0,0: 4,4,4), its rows and the canvas's cubes into cube, *rows,
** *cubes. */
static sta_status vsa_check(const sta_layer_desc *desc, int32_t cube[3], int32_t *rows,
                            int64_t *cubes) {
  const int32_t *c = desc->cube;
  const int32_t *g = desc->geom.canvas;
  sta_status rc;
  if (c[0] == 0 && c[1] == 0 && c[2] == 0) cube[0] = cube[1] = cube[2] = 4;
  else memcpy(cube, c, 3 * sizeof(int32_t));
  if (g[0] == 0 && g[1] == 0 && g[2] == 0)
    return sta_error(STA_ERR_WINDOW, "geom: a VSA layer needs its canvas (the cubes are cut "
                     "from it), got 0x0x0");
  if ((rc = sta_vsa_cube_count(g, cube, cubes)) != STA_OK) return rc;
  *rows = cube[0] * cube[1] * cube[2];
  if (*rows != 64 && *rows != 256)
    return sta_error(STA_ERR_ARGUMENT, "cube: %dx%dx%d holds %d tokens, expected 64 (4x4x4) or "
                     "256 (4x8x8)", (int)cube[0], (int)cube[1], (int)cube[2], (int)*rows);
  if (desc->dense_steps < 0)
    return sta_error(STA_ERR_ARGUMENT, "dense_steps: expected >= 0, got %d",
                     (int)desc->dense_steps);
  if (desc->geom.text_len > 0)
    return sta_error(STA_ERR_UNSUPPORTED, "text_len: a VSA layer has no text rows, got %lld",
                     (long long)desc->geom.text_len);
  if (desc->sp_size > 1)
    return sta_error(STA_ERR_UNSUPPORTED, "sp_size: a VSA layer runs on one rank, got %d",
                     (int)desc->sp_size);
  if (desc->strategy)
    return sta_error(STA_ERR_UNSUPPORTED, "strategy: a VSA layer takes its sparsity from the "
                     "forward batch, not from a window strategy");
  if (desc->softmax != STA_SOFTMAX_EXACT)
    return sta_error(STA_ERR_UNSUPPORTED, "softmax: a VSA layer computes the exact softmax");
  if (desc->precision != STA_PRECISION_NATIVE)
    return sta_error(STA_ERR_UNSUPPORTED, "precision: a VSA layer computes in native precision "
                     "(fp8 runs the window only)");
  return STA_OK;
}

sta_status sta_layer_create(sta_layer **out, const sta_layer_desc *desc) {
  sta_status rc;
  int32_t index, cube[3] = {0, 0, 0}, cube_rows = 0;
  int64_t cubes = 0;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a layer description, got NULL");
  if (desc->prefix) {
    if ((rc = sta_layer_index_from_prefix(desc->prefix, &index)) != STA_OK) return rc;
  } else if ((index = desc->layer_index) < 0)
    return sta_error(STA_ERR_ARGUMENT, "layer_index: expected >= 0, got %d", (int)index);
  if (desc->local_heads < 1 || desc->local_heads > (1 << 16))
    return sta_error(STA_ERR_ARGUMENT, "local_heads: expected 1..%d, got %d", 1 << 16,
                     (int)desc->local_heads);
  if (desc->head_dim < 1)
    return sta_error(STA_ERR_ARGUMENT, "head_dim: expected >= 1, got %d", (int)desc->head_dim);
  if (desc->sp_size < 1 || desc->sp_size > (1 << 16))
    return sta_error(STA_ERR_ARGUMENT, "sp_size: expected 1..%d, got %d", 1 << 16,
                     (int)desc->sp_size);
  if ((int64_t)desc->local_heads * desc->sp_size > (1 << 20))
    return sta_error(STA_ERR_ARGUMENT,
                     "local_heads x sp_size: %lld heads in all, expected at most %d",
                     (long long)desc->local_heads * desc->sp_size, 1 << 20);
  if (desc->sp_rank < 0 || desc->sp_rank >= desc->sp_size)
    return sta_error(STA_ERR_ARGUMENT, "sp_rank: expected 0..%d (sp_size %d), got %d",
                     (int)desc->sp_size - 1, (int)desc->sp_size, (int)desc->sp_rank);
  if (desc->mode != STA_LAYER_STA && desc->mode != STA_LAYER_VSA)
    return sta_error(STA_ERR_ARGUMENT, "mode: expected STA_LAYER_STA (0) or STA_LAYER_VSA (1), "
                     "got %d", (int)desc->mode);
  const int32_t *c = desc->geom.canvas;
  int auto_geom = c[0] == 0 && c[1] == 0 && c[2] == 0;
  if (desc->mode == STA_LAYER_VSA) {
    if ((rc = vsa_check(desc, cube, &cube_rows, &cubes)) != STA_OK) return rc;
  } else if (desc->cube[0] || desc->cube[1] || desc->cube[2] || desc->dense_steps) {
    return sta_error(STA_ERR_ARGUMENT, "%s: a layer in STA mode has no cubes (VSA mode: "
                     "STA_LAYER_VSA)", desc->dense_steps ? "dense_steps" : "cube");
  } else if (!auto_geom) {
    int64_t tl = desc->geom.text_len > 0 ? desc->geom.text_len : 0;
    if (c[0] < 1 || c[1] < 1 || c[2] < 1)
      return sta_error(STA_ERR_WINDOW,
                       "geom: canvas %dx%dx%d (all 0 for a known shape by seq_len, else each >= 1)",
                       (int)c[0], (int)c[1], (int)c[2]);
    if ((rc = sta_geometry_check(&desc->geom, INT64_MAX)) != STA_OK ||
        (rc = sta_geometry_check(&desc->geom, sta_geometry_video_rows(&desc->geom) + tl)) !=
            STA_OK)
      return rc;
  }
  if (desc->layout != STA_BSHD && desc->layout != STA_BHSD)
    return sta_error(STA_ERR_ARGUMENT, "layout: expected STA_BSHD (0) or STA_BHSD (1), got %d",
                     (int)desc->layout);
  if (desc->backend != STA_CPU && desc->backend != STA_CUDA)
    return sta_error(STA_ERR_ARGUMENT, "backend: unknown device %d", (int)desc->backend);
  if (!sta_backend_available(desc->backend))
    return sta_backend_missing(desc->backend);
  if (!isfinite(desc->scale))
    return sta_error(STA_ERR_ARGUMENT, "scale: expected a finite value, got %g", (double)desc->scale);
  if (desc->softmax != STA_SOFTMAX_EXACT && desc->softmax != STA_SOFTMAX_FAST)
    return sta_error(STA_ERR_ARGUMENT,
                     "softmax: expected STA_SOFTMAX_EXACT (0) or STA_SOFTMAX_FAST (1), got %d",
                     (int)desc->softmax);
  if (desc->precision != STA_PRECISION_NATIVE && desc->precision != STA_PRECISION_FP8)
    return sta_error(STA_ERR_ARGUMENT,
                     "precision: expected STA_PRECISION_NATIVE (0) or STA_PRECISION_FP8 (1), "
                     "got %d", (int)desc->precision);
  if (desc->strategy) STA_CHECK_HANDLE(desc->strategy, STA_KIND_STRATEGY, "strategy");
  sta_tensor *sizes = NULL;
  if (desc->mode == STA_LAYER_VSA &&
      ((rc = sta_tensor_create(&sizes, STA_I32, desc->backend, 1, &cubes)) != STA_OK ||
       (rc = sta_vsa_cube_sizes(sizes, desc->geom.canvas, cube)) != STA_OK)) {
    sta_tensor_destroy(sizes);
    return rc;
  }
  sta_layer *l = sta_calloc(1, sizeof *l);
  if (!l) {
    sta_tensor_destroy(sizes);
    return sta_error(STA_ERR_NOMEM, "out of host memory (STA layer)");
  }
  if ((rc = sta_handle_add(l, STA_KIND_LAYER)) != STA_OK) {
    sta_tensor_destroy(sizes);
    free(l);
    return rc;
  }
  l->index = index;
  l->local_heads = desc->local_heads;
  l->head_dim = desc->head_dim;
  l->sp_rank = desc->sp_rank;
  l->sp_size = desc->sp_size;
  l->auto_geom = auto_geom;
  l->geom = desc->geom;
  l->layout = desc->layout;
  l->backend = desc->backend;
  l->scale = desc->scale;
  l->softmax = desc->softmax;
  l->precision = desc->precision;
  l->strategy = desc->strategy;
  if (l->strategy) sta_strategy_retain(l->strategy);
  l->mode = desc->mode;
  memcpy(l->cube, cube, sizeof cube);
  l->cube_rows = cube_rows;
  l->cubes = cubes;
  l->dense_steps = desc->dense_steps;
  l->sizes = sizes;
  *out = l;
  return STA_OK;
}

void sta_layer_destroy(sta_layer *l) {
  if (!sta_handle_live(l, STA_KIND_LAYER)) return;
  sta_handle_remove(l);
  sta_strategy_destroy((sta_strategy *)l->strategy); /* the layer's reference */
  sta_tensor_destroy(l->sizes);
  free(l);
}

int32_t sta_layer_index(const sta_layer *l) {
  return sta_handle_check(l, STA_KIND_LAYER, "layer") == STA_OK ? l->index : -1;
}

sta_layout sta_layer_layout(const sta_layer *l) {
  return sta_handle_check(l, STA_KIND_LAYER, "layer") == STA_OK ? l->layout : STA_BSHD;
}

sta_status sta_layer_set_strategy(sta_layer *l, const sta_strategy *s) {
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  if (s) STA_CHECK_HANDLE(s, STA_KIND_STRATEGY, "strategy");
  if (s && l->mode == STA_LAYER_VSA)
    return sta_error(STA_ERR_UNSUPPORTED, "strategy: a VSA layer takes its sparsity from the "
                     "forward batch, not from a window strategy");
  if (s) sta_strategy_retain(s);
  sta_strategy_destroy((sta_strategy *)l->strategy);
  l->strategy = s;
  return STA_OK;
}

/* Heads, head dim and device of one of q, k, v, out. */
static sta_status check_operand(const sta_layer *l, const sta_tensor *t,
                                const char *name) {
  sta_bshd b;
  sta_status rc = sta_tensor_bshd(t, l->layout, name, &b);
  if (rc != STA_OK) return rc;
  if (b.h != l->local_heads)
    return sta_error(STA_ERR_SHAPE, "%s: expected %d heads (local_heads), got %lld", name,
                     (int)l->local_heads, (long long)b.h);
  if (b.d != l->head_dim)
    return sta_error(STA_ERR_SHAPE, "%s: expected head dim %d, got %lld", name,
                     (int)l->head_dim, (long long)b.d);
  if (sta_tensor_device(t) != l->backend)
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s, but the layer runs on %s", name,
                     sta_device_name(sta_tensor_device(t)), sta_device_name(l->backend));
  return STA_OK;
}

/* Search mode: every candidate on all local heads, full (last) into out
** (and its log-sum-exp into lse when asked).  Every candidate's window is
** checked, then the operands are resolved once; the runs change only the
** windows and the output (scratch tensors of out's shape). */
static sta_status search_forward(sta_layer *l, sta_context *ctx,
                                 sta_attention_desc *d, int32_t n,
                                 const int32_t *row, const sta_tensor *q,
                                 const sta_tensor *k, const sta_tensor *v,
                                 sta_tensor *out, sta_tensor *lse) {
  sta_status rc;
  int32_t hl = l->local_heads;
  for (int32_t c = 0; c < n; c++)
    if ((rc = sta_window_check(&d->geom, row + 3 * c)) != STA_OK) {
      char msg[512];
      snprintf(msg, sizeof msg, "search candidate %d [%d, %d, %d]: %s", (int)c,
               (int)row[3 * c], (int)row[3 * c + 1], (int)row[3 * c + 2], sta_last_error());
      return sta_error(rc, "%s", msg);
    }
  sta_attn_params p;
  d->windows = row + 3 * (n - 1);
  if ((rc = sta_attn_resolve(d, q, k, v, out, lse, &p)) != STA_OK) return rc;
  int32_t *win = (int32_t *)p.windows; /* heads * 3, set per run */
  sta_tensor *full = NULL, *cand = NULL, *lse_s = NULL;
  size_t nl = (size_t)(n > 1 ? n - 1 : 1) * (size_t)hl;
  float *l1 = sta_malloc(sizeof(float) * nl), *l2 = sta_malloc(sizeof(float) * nl);
  if (!l1 || !l2) {
    rc = sta_error(STA_ERR_NOMEM, "out of host memory (search losses)");
    goto done;
  }
  if ((rc = sta_tensor_create(&full, out->dtype, l->backend, 4, out->shape)) != STA_OK) goto done;
  if (lse) { /* into scratch too: a cancelled search changes no output */
    if ((rc = sta_tensor_create(&lse_s, STA_F32, l->backend, 3, lse->shape)) != STA_OK) goto done;
    p.lse = sta_tensor_data(lse_s);
    p.lse_sb = lse_s->stride[0]; p.lse_sh = lse_s->stride[1]; p.lse_ss = lse_s->stride[2];
  }
  if (n > 1 && (rc = sta_tensor_create(&cand, out->dtype, l->backend, 4, out->shape)) != STA_OK)
    goto done;
  for (int32_t i = 0; i < n; i++) { /* the full window first, then the candidates */
    const int32_t c = i == 0 ? n - 1 : i - 1;
    sta_tensor *o = c == n - 1 ? full : cand;
    sta_bshd ob;
    if ((rc = sta_tensor_bshd(o, l->layout, "out", &ob)) != STA_OK) goto done;
    p.o = sta_tensor_data(o);
    p.o_sb = ob.sb; p.o_ss = ob.ss; p.o_sh = ob.sh;
    if (c < n - 1) p.lse = NULL; /* the full window's only */
    for (int32_t h = 0; h < hl; h++) memcpy(win + 3 * h, row + 3 * c, 3 * sizeof(int32_t));
    if ((rc = sta_attn_run(&p, l->backend)) != STA_OK) goto done;
    if (c < n - 1 && (rc = sta_head_diff(cand, full, l->layout, l1 + (size_t)c * hl,
                                         l2 + (size_t)c * hl)) != STA_OK)
      goto done;
  }
  sta_forward_batch *fb = sta_context_batch(ctx);
  if (n > 1 &&
      (rc = sta_forward_batch_record(fb, sta_forward_batch_is_negative(fb),
                                     sta_context_step(ctx), l->index, n - 1, row, hl, l1,
                                     l2)) != STA_OK)
    goto done;
  rc = sta_tensor_copy(out, full);
  if (rc == STA_OK && lse_s) rc = sta_tensor_copy(lse, lse_s);
done:
  sta_tensor_destroy(full);
  sta_tensor_destroy(cand);
  sta_tensor_destroy(lse_s);
  free(l1);
  free(l2);
  free(win);
  return rc;
}

/* What the live context gives this layer: d's geometry (from q's length
** when the layer has none), layout, scale and windows.  *n: the row's
** window count when it is a search row (candidates, full last), else 0.
** *owned: windows built from the layer's strategy, to free.  Every check
** of the context and the operands (named in ops) runs here. */
static sta_status layer_windows(sta_layer *l, const sta_tensor *const *ops,
                                const char *const *names, int n_ops, sta_attention_desc *d,
                                sta_context **ctx_out, int32_t *n_search,
                                const int32_t **row_out, int32_t **owned) {
  sta_status rc;
  *owned = NULL;
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  sta_context *ctx = sta_context_current();
  if (!ctx)
    return sta_error(STA_ERR_STATE,
                     "STA forward called outside a forward context (no context is live)");
  if (!sta_context_batch(ctx))
    return sta_error(STA_ERR_NO_BATCH, "forward_batch cannot be None");
  int32_t hl = l->local_heads, n = 0;
  int64_t total = (int64_t)hl * l->sp_size;
  const int32_t *row = NULL;
  const sta_metadata *md = sta_context_metadata(ctx);
  if (md) {
    if (l->index >= sta_metadata_layers(md))
      return sta_error(STA_ERR_STA_PARAM, "Invalid STA_param");
    sta_metadata_row(md, l->index, &n, &row);
    if (n == 0 || n > total) return sta_error(STA_ERR_STA_PARAM, "Invalid STA_param");
  } else {
    if (!l->strategy)
      return sta_error(STA_ERR_NO_STRATEGY, "mask_strategy cannot be None for SlidingTileAttention");
    if (!sta_strategy_has_step(l->strategy, 0))
      return sta_error(STA_ERR_NO_STEP0, "mask_strategy[0] cannot be None for SlidingTileAttention");
    int32_t *w = sta_malloc(sizeof(int32_t) * 3 * (size_t)hl);
    if (!w) return sta_error(STA_ERR_NOMEM, "out of host memory (windows)");
    for (int32_t h = 0; h < hl; h++)
      if ((rc = sta_strategy_get(l->strategy, sta_context_step(ctx), l->index,
                                 l->sp_rank * hl + h, w + 3 * h)) != STA_OK) {
        free(w);
        return rc;
      }
    *owned = w;
    n = -1; /* this rank's windows, one per local head */
  }
  sta_bshd qb;
  memset(d, 0, sizeof *d);
  if ((rc = sta_tensor_bshd(ops[0], l->layout, names[0], &qb)) != STA_OK) goto fail;
  d->geom = l->geom;
  if (l->auto_geom) {
    if ((rc = sta_geometry_from_seq_len(&d->geom, qb.s)) != STA_OK) goto fail;
    d->geom.order = l->geom.order; /* the known shapes' tiles are whole: the same rows */
    if ((rc = sta_geometry_check(&d->geom, qb.s)) != STA_OK) goto fail;
  } else if ((rc = sta_geometry_check(&d->geom, qb.s)) != STA_OK)
    goto fail;
  for (int i = 0; i < n_ops; i++)
    if ((rc = check_operand(l, ops[i], names[i])) != STA_OK) goto fail;
  d->layout = l->layout;
  d->scale = l->scale;
  d->softmax = l->softmax;
  d->precision = l->precision;
  if (n == total || n < 0) {
    d->n_windows = hl;
    d->windows = *owned ? *owned : row + 3 * (size_t)l->sp_rank * hl;
    n = 0;
  } else
    d->n_windows = 1;
  *ctx_out = ctx;
  *n_search = n;
  *row_out = row;
  return STA_OK;
fail:
  free(*owned);
  *owned = NULL;
  return rc;
}

/* What the live context gives a VSA layer (sta.h, sta_layer_mode): d with
** the step's topk and the layer's sizes.  Every check of the context and
** of the operands (named in names: heads, head dim, device, cube rows)
** runs here. */
static sta_status vsa_resolve(sta_layer *l, const sta_tensor *const *ops,
                              const char *const *names, int n_ops, sta_vsa_desc *d) {
  sta_status rc;
  sta_context *ctx = sta_context_current();
  if (!ctx)
    return sta_error(STA_ERR_STATE,
                     "VSA forward called outside a forward context (no context is live)");
  const sta_forward_batch *fb = sta_context_batch(ctx);
  if (!fb) return sta_error(STA_ERR_NO_BATCH, "forward_batch cannot be None");
  const int64_t rows = l->cubes * l->cube_rows;
  for (int i = 0; i < n_ops; i++) {
    sta_bshd b;
    if ((rc = check_operand(l, ops[i], names[i])) != STA_OK ||
        (rc = sta_tensor_bshd(ops[i], l->layout, names[i], &b)) != STA_OK)
      return rc;
    if (b.s != rows)
      return sta_error(STA_ERR_SHAPE, "%s: %lld rows, expected %lld (the canvas %dx%dx%d in "
                       "%lld cubes of %d rows, cube order)", names[i], (long long)b.s,
                       (long long)rows, (int)l->geom.canvas[0], (int)l->geom.canvas[1],
                       (int)l->geom.canvas[2], (long long)l->cubes, (int)l->cube_rows);
  }
  const double sparsity = sta_context_step(ctx) < l->dense_steps
                              ? 0.0 : sta_forward_batch_vsa_sparsity(fb);
  int32_t topk;
  if ((rc = sta_vsa_topk(sparsity, l->cubes, &topk)) != STA_OK) return rc;
  memset(d, 0, sizeof *d);
  d->layout = l->layout;
  d->block_rows = l->cube_rows;
  d->topk = topk;
  d->scale = l->scale;
  d->kv_sizes = l->sizes;
  return STA_OK;
}

/* STA_ERR_STATE: l runs the other mode than the call is for. */
static sta_status wrong_mode(const sta_layer *l, const char *call) {
  return sta_error(STA_ERR_STATE, "%s: layer %d runs %s (%s gives what its forward runs)", call,
                   (int)l->index, l->mode == STA_LAYER_VSA ? "VSA" : "STA",
                   l->mode == STA_LAYER_VSA ? "sta_layer_resolve_vsa" : "sta_layer_resolve");
}

sta_status sta_layer_forward_lse(sta_layer *l, const sta_tensor *q, const sta_tensor *k,
                                 const sta_tensor *v, sta_tensor *out, sta_tensor *lse) {
  static const char *N[4] = {"q", "k", "v", "out"};
  const sta_tensor *ops[4] = {q, k, v, out};
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  if (l->mode == STA_LAYER_VSA) {
    sta_vsa_desc vd;
    sta_status rc = vsa_resolve(l, ops, N, 4, &vd);
    return rc != STA_OK ? rc : sta_vsa_forward(&vd, q, k, v, NULL, out, lse);
  }
  sta_attention_desc d;
  sta_context *ctx;
  int32_t n, *owned;
  const int32_t *row;
  sta_status rc = layer_windows(l, ops, N, 4, &d, &ctx, &n, &row, &owned);
  if (rc != STA_OK) return rc;
  rc = n == 0 ? sta_attention_forward(&d, q, k, v, out, lse)
              : search_forward(l, ctx, &d, n, row, q, k, v, out, lse);
  free(owned);
  return rc;
}

sta_status sta_layer_forward(sta_layer *l, const sta_tensor *q,
                             const sta_tensor *k, const sta_tensor *v,
                             sta_tensor *out) {
  return sta_layer_forward_lse(l, q, k, v, out, NULL);
}

/* A search row has no backward (STA.md section 10). */
static sta_status no_search_backward(const sta_layer *l, sta_context *ctx, int32_t n) {
  return sta_error(STA_ERR_UNSUPPORTED,
                   "backward: layer %d runs a mask search at step %d (%d candidate windows); "
                   "a search-mode forward has no backward",
                   (int)l->index, (int)sta_context_step(ctx), (int)n);
}

sta_status sta_layer_backward(sta_layer *l, const sta_tensor *q, const sta_tensor *k,
                              const sta_tensor *v, const sta_tensor *out,
                              const sta_tensor *lse, const sta_tensor *dout, sta_tensor *dq,
                              sta_tensor *dk, sta_tensor *dv) {
  static const char *N[8] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
  const sta_tensor *ops[8] = {q, k, v, out, dout, dq, dk, dv};
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  if (l->mode == STA_LAYER_VSA) {
    sta_vsa_desc vd;
    sta_status rc = vsa_resolve(l, ops, N, 8, &vd);
    return rc != STA_OK ? rc
                        : sta_vsa_backward(&vd, q, k, v, NULL, out, lse, dout, dq, dk, dv, NULL);
  }
  sta_attention_desc d;
  sta_context *ctx;
  int32_t n, *owned;
  const int32_t *row;
  sta_status rc = layer_windows(l, ops, N, 8, &d, &ctx, &n, &row, &owned);
  if (rc != STA_OK) return rc;
  if (n != 0) rc = no_search_backward(l, ctx, n);
  else rc = sta_attention_backward(&d, q, k, v, out, lse, dout, dq, dk, dv);
  free(owned);
  return rc;
}

sta_status sta_layer_resolve(sta_layer *l, const sta_tensor *q, sta_attention_desc *desc,
                             int32_t *windows) {
  static const char *N[1] = {"q"};
  const sta_tensor *ops[1] = {q};
  sta_attention_desc d;
  sta_context *ctx;
  int32_t n, *owned;
  const int32_t *row;
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (!windows) return sta_error(STA_ERR_ARGUMENT, "windows: expected %d ints, got NULL",
                                 (int)(3 * l->local_heads));
  STA_CHECK_HANDLE(q, STA_KIND_TENSOR, "q");
  if (l->mode == STA_LAYER_VSA) return wrong_mode(l, "sta_layer_resolve");
  sta_status rc = layer_windows(l, ops, N, 1, &d, &ctx, &n, &row, &owned);
  if (rc != STA_OK) return rc;
  if (n != 0) rc = no_search_backward(l, ctx, n);
  else {
    memcpy(windows, d.windows, sizeof(int32_t) * 3 * (size_t)d.n_windows);
    d.windows = windows;
    *desc = d;
  }
  free(owned);
  return rc;
}

sta_status sta_layer_resolve_vsa(sta_layer *l, const sta_tensor *q, sta_vsa_desc *desc,
                                 int32_t *canvas, int32_t *cube) {
  static const char *N[1] = {"q"};
  const sta_tensor *ops[1] = {q};
  STA_CHECK_HANDLE(l, STA_KIND_LAYER, "layer");
  STA_CHECK_HANDLE(q, STA_KIND_TENSOR, "q");
  if (!desc) return sta_error(STA_ERR_ARGUMENT, "desc: expected a descriptor, got NULL");
  if (l->mode != STA_LAYER_VSA) return wrong_mode(l, "sta_layer_resolve_vsa");
  sta_vsa_desc d;
  sta_status rc = vsa_resolve(l, ops, N, 1, &d);
  if (rc != STA_OK) return rc;
  *desc = d;
  if (canvas) memcpy(canvas, l->geom.canvas, 3 * sizeof(int32_t));
  if (cube) memcpy(cube, l->cube, 3 * sizeof(int32_t));
  return STA_OK;
}
