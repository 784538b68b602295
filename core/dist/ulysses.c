/*
** ulysses.c -- sequence parallelism (Ulysses) over any communicator: this
** rank's checks, every rank's agreement before data moves, and the
** pipeline over head chunks (all-to-all in, compute, all-to-all and
** all-gather out) on two CUDA streams where the device has them.  What
** runs on each chunk is a job (sp_attention.c: SP attention and SP layers).
*/
#include <stdlib.h>

#include "dist.h"

/* One SP call of this rank: the split, the shards, the gathered buffers of
** two chunks (slot c % 2) and the pack buffer, all in c's workspace. */
typedef struct pipe {
  sta_comm *c;
  sp_job *job;
  split sp;
  sta_layout layout;
  sta_device dev;
  int64_t es, n, hc;   /* element bytes, chunks, heads per chunk */
  const sta_tensor *t[4];
  sta_bshd x[4], gx;
  sta_tensor *g[2][4]; /* q, k, v, out of [B, S, hc, D] per slot */
  char *scratch;
  int lanes;           /* CUDA streams: the caller's (main) and c->side */
  void *main;
} pipe;

/* What every rank sends before any data moves; all fields are compared. */
typedef struct sp_desc {
  char magic[8]; /* "sta-sp1" */
  int32_t status, dtype, layout, device, chunks, softmax, precision, n_windows, layer, step;
  int32_t canvas[3], tile[3];
  int64_t b, s, h, d, text_len;
  uint32_t scale;
  uint64_t windows;
  char msg[384]; /* status's message */
} sp_desc;

/* Workspace sizes in 256-byte units (aligned sub-buffers). */
static int64_t ws_round(int64_t n) { return (n + 255) & ~(int64_t)255; }

/* At least bytes of c's workspace on dev; a failed growth keeps the old one. */
static sta_status workspace(sta_comm *c, sta_device dev, int64_t bytes, char **base) {
  sta_tensor *w = c->ws;
  if (!w || sta_tensor_device(w) != dev || sta_tensor_numel(w) * 4 < bytes) {
    int64_t n = bytes / 4 + 64;
    w = NULL;
    sta_status rc = sta_tensor_create(&w, STA_F32, dev, 1, &n);
    if (rc != STA_OK) return rc;
    sta_tensor_destroy(c->ws);
    c->ws = w;
  }
  /* 256-byte aligned start */
  *base = (char *)(((uintptr_t)sta_tensor_data(w) + 255) & ~(uintptr_t)255);
  return STA_OK;
}

/* The second stream and the events of c's pipeline on dev, made once. */
static sta_status lanes_ready(sta_comm *c, sta_device dev) {
  const sta_backend_ops *b = sta_backend_get(dev);
  sta_status rc = STA_OK;
  if (!b || !b->stream_create) return sta_error(STA_ERR_BACKEND, "st attn not supported");
  c->lanes = b;
  if (!c->side) rc = b->stream_create(&c->side);
  for (int i = 0; i < N_EVENTS && rc == STA_OK; i++)
    if (!c->ev[i]) rc = b->event_create(&c->ev[i]);
  return rc;
}

/* Work after this goes to the side lane (side) or the caller's stream. */
static void lane_use(const pipe *p, int side) {
  if (p->lanes) sta_cuda_set_stream(side ? p->c->side : p->main);
}

/* Record event ev on a lane, or make a lane wait for it. */
static sta_status lane_mark(const pipe *p, int ev, int side) {
  if (!p->lanes) return STA_OK;
  return p->c->lanes->event_record(p->c->ev[ev], side ? p->c->side : p->main);
}

static sta_status lane_wait(const pipe *p, int side, int ev) {
  if (!p->lanes) return STA_OK;
  return p->c->lanes->stream_wait(side ? p->c->side : p->main, p->c->ev[ev]);
}

/* Rows [s0, s0 + rows) and heads [h0, h0 + hn) of t (x its sizes), block j
** jr rows and jh heads further on (rank j's). */
static sta_span span_of(const pipe *p, const sta_tensor *t, const sta_bshd *x, int64_t s0,
                        int64_t rows, int64_t h0, int64_t hn, int64_t jr, int64_t jh) {
  int64_t es = p->es;
  int bshd = p->layout == STA_BSHD;
  sta_span s;
  s.base = (char *)sta_tensor_data(t) + (s0 * x->ss + h0 * x->sh) * es;
  s.peer = (jr * x->ss + jh * x->sh) * es;
  s.run = x->d * es;
  s.n[0] = bshd ? hn : rows;
  s.pitch[0] = (bshd ? x->sh : x->ss) * es;
  s.n[1] = bshd ? rows : hn;
  s.pitch[1] = (bshd ? x->ss : x->sh) * es;
  s.n[2] = x->b;
  s.pitch[2] = x->sb * es;
  return s;
}

/* An all-to-all of n strided blocks: in place through the transport's
** all_to_all_spans, else each block packed (or received) in the scratch
** buffer where it is not already one dense buffer. */
static sta_status move(const pipe *p, int32_t n, const sta_span *send, const sta_span *recv) {
  sta_transport *t = &p->c->t;
  int32_t np = p->sp.p;
  sta_status rc = STA_OK;
  if (t->all_to_all_spans) return t->all_to_all_spans(t->self, n, send, recv, p->dev);
  for (int32_t i = 0; i < n && rc == STA_OK; i++) {
    int64_t blk = sta_span_bytes(&send[i]);
    const void *sb = sta_span_dense(&send[i], np);
    void *rb = sta_span_dense(&recv[i], np);
    sta_span packed = sta_span_packed(&send[i], p->scratch);
    sta_span staged = sta_span_packed(&recv[i], p->scratch + np * blk);
    for (int32_t j = 0; j < np && !sb && rc == STA_OK; j++)
      rc = sta_span_copy(&packed, j, &send[i], j, p->dev);
    if (rc == STA_OK)
      rc = t->all_to_all(t->self, sb ? sb : packed.base, rb ? rb : staged.base, (size_t)blk,
                         p->dev);
    for (int32_t j = 0; j < np && !rb && rc == STA_OK; j++)
      rc = sta_span_copy(&recv[i], j, &staged, j, p->dev);
  }
  return rc;
}

/* Chunk c in: the video rows of its heads from every rank (all-to-all),
** its heads of the (replicated) text rows from the shards. */
static sta_status step_in(const pipe *p, int64_t c) {
  const split *sp = &p->sp;
  sta_tensor *const *g = p->g[c & 1];
  sta_span send[3], recv[3];
  sta_status rc;
  for (int i = 0; i < 3; i++) {
    send[i] = span_of(p, p->t[i], &p->x[i], 0, sp->vr, c * p->hc, p->hc, 0, sp->hl);
    recv[i] = span_of(p, g[i], &p->gx, 0, sp->vr, 0, p->hc, sp->vr, 0);
  }
  rc = move(p, 3, send, recv);
  for (int i = 0; i < 3 && rc == STA_OK && sp->text > 0; i++) {
    sta_span src = span_of(p, p->t[i], &p->x[i], sp->vr, sp->text,
                           sp->r * sp->hl + c * p->hc, p->hc, 0, 0);
    sta_span dst = span_of(p, g[i], &p->gx, sp->v, sp->text, 0, p->hc, 0, 0);
    rc = sta_span_copy(&dst, 0, &src, 0, p->dev);
  }
  return rc;
}

/* Chunk c's attention.  Loopback ranks share this machine's cores and the
** BLAS library's global settings: they compute one at a time. */
static sta_status step_compute(const pipe *p, int64_t c) {
  sta_tensor *const *g = p->g[c & 1];
  sta_loopback_turn(p->c, 1);
  sta_status rc = p->job->compute(p->job, c * p->hc, g[0], g[1], g[2], g[3]);
  sta_loopback_turn(p->c, 0);
  return rc;
}

/* Chunk c out: its video output to the ranks that hold those rows (into
** their out, in place), its text output to every rank (all-gather). */
static sta_status step_out(const pipe *p, int64_t c) {
  const split *sp = &p->sp;
  sta_tensor *o = p->g[c & 1][3];
  sta_span send = span_of(p, o, &p->gx, 0, sp->vr, 0, p->hc, sp->vr, 0);
  sta_span recv = span_of(p, p->t[3], &p->x[3], 0, sp->vr, c * p->hc, p->hc, 0, sp->hl);
  sta_status rc = move(p, 1, &send, &recv);
  if (rc != STA_OK || sp->text == 0) return rc;
  sta_span src = span_of(p, o, &p->gx, sp->v, sp->text, 0, p->hc, 0, 0);
  sta_span mine = sta_span_packed(&src, p->scratch), all = sta_span_packed(&src, p->scratch + mine.peer);
  sta_span dst = span_of(p, p->t[3], &p->x[3], sp->vr, sp->text, c * p->hc, p->hc, 0, sp->hl);
  rc = sta_span_copy(&mine, 0, &src, 0, p->dev);
  if (rc == STA_OK)
    rc = p->c->t.all_gather(p->c->t.self, mine.base, all.base, (size_t)mine.peer, p->dev);
  for (int32_t j = 0; j < sp->p && rc == STA_OK; j++) rc = sta_span_copy(&dst, j, &all, j, p->dev);
  return rc;
}

/* The chunk schedule: in(0), in(1), then for each chunk c: compute(c);
** out(c); in(c + 2).  With CUDA lanes the exchanges run on the side
** stream and compute on the caller's, ordered by events: in(c) before
** compute(c); compute(c) before out(c) and before in(c + 2) (which
** reuses its slot); out(c - 2) before compute(c) (which reuses its output
** slot).  So out(c - 1) and in(c + 1) run while compute(c) does.  Without
** lanes the same steps run one after another in this order. */
static sta_status chunk_agree(const pipe *p, int64_t c, sta_status rc);

static sta_status pipeline(const pipe *p) {
  int64_t n = p->n;
  sta_status rc = lane_mark(p, EV_START, 0);
  if (rc == STA_OK) rc = lane_wait(p, 1, EV_START);
  lane_use(p, 1);
  for (int64_t c = 0; c < 2 && c < n && rc == STA_OK; c++) {
    rc = step_in(p, c);
    if (rc == STA_OK) rc = lane_mark(p, EV_IN + (int)c, 1);
  }
  for (int64_t c = 0; c < n && rc == STA_OK; c++) {
    rc = lane_wait(p, 0, EV_IN + (int)c);
    if (rc == STA_OK && c >= 2) rc = lane_wait(p, 0, EV_OUT + (int)c - 2);
    lane_use(p, 0);
    if (rc == STA_OK) rc = step_compute(p, c);
    rc = chunk_agree(p, c, rc); /* every rank goes on, or every rank stops here */
    if (rc == STA_OK) rc = lane_mark(p, EV_COMP + (int)c, 0);
    if (rc == STA_OK) rc = lane_wait(p, 1, EV_COMP + (int)c);
    lane_use(p, 1);
    if (rc == STA_OK) rc = step_out(p, c);
    if (rc == STA_OK) rc = lane_mark(p, EV_OUT + (int)c, 1);
    if (rc == STA_OK && c + 2 < n) rc = step_in(p, c + 2);
    if (rc == STA_OK && c + 2 < n) rc = lane_mark(p, EV_IN + (int)c + 2, 1);
  }
  /* the caller's stream waits for the side lane, after a failure too (the
  ** workspace is in use until then) */
  if (lane_mark(p, EV_END, 1) == STA_OK) (void)lane_wait(p, 0, EV_END);
  lane_use(p, 0);
  return rc;
}

/* ---- Ulysses: this rank's checks, then every rank's agreement ---------------------- */

static const char *const OPS[4] = {"q", "k", "v", "out"};

/* Byte range [lo, hi] of t's view in its storage. */
static void bytes_of(const sta_tensor *t, int64_t *lo, int64_t *hi) {
  int64_t es = (int64_t)sta_dtype_size(t->dtype);
  sta_tensor_extent(t, lo, hi);
  *lo *= es;
  *hi = *hi * es + es - 1;
}

/* This rank's own checks (with the caller's status pre), then the chunk
** count and, when data will move, the gathered buffers and the lanes.
** Everything that can fail before any data moves fails here. */
static sta_status prepare(pipe *p, sta_comm *c, const sta_geometry *g, sta_layout layout,
                          const sta_tensor *const t[4], sp_job *job, sta_status pre) {
  sta_status rc;
  split *sp = &p->sp;
  memset(p, 0, sizeof *p);
  p->c = c;
  p->job = job;
  p->layout = layout;
  if (pre != STA_OK) return pre;
  for (int i = 0; i < 4; i++) {
    STA_CHECK_HANDLE(t[i], STA_KIND_TENSOR, OPS[i]);
    p->t[i] = t[i];
  }
  if ((rc = sta_split_check(sp, g, layout, t, OPS, sta_comm_rank(c), sta_comm_size(c))) !=
      STA_OK)
    return rc;
  for (int i = 0; i < 4; i++) {
    sta_bshd *x = &p->x[i];
    sta_tensor_bshd(t[i], layout, OPS[i], x);
    if (i > 0 && (x->b != p->x[0].b || x->s != p->x[0].s || x->h != p->x[0].h || x->d != p->x[0].d))
      return sta_error(STA_ERR_SHAPE,
                       "%s: shape [B=%lld, S=%lld, heads=%lld, D=%lld] differs from "
                       "q's [B=%lld, S=%lld, heads=%lld, D=%lld]", OPS[i],
                       (long long)x->b, (long long)x->s, (long long)x->h,
                       (long long)x->d, (long long)p->x[0].b, (long long)p->x[0].s,
                       (long long)p->x[0].h, (long long)p->x[0].d);
    if (t[i]->dtype != t[0]->dtype)
      return sta_error(STA_ERR_DTYPE, "%s: dtype %s differs from q's %s", OPS[i],
                       sta_dtype_name(t[i]->dtype), sta_dtype_name(t[0]->dtype));
    if (sta_tensor_device(t[i]) != sta_tensor_device(t[0]))
      return sta_error(STA_ERR_ARGUMENT, "%s: on %s while q is on %s", OPS[i],
                       sta_device_name(sta_tensor_device(t[i])),
                       sta_device_name(sta_tensor_device(t[0])));
    if (x->d > 1 && x->sd != 1)
      return sta_error(STA_ERR_SHAPE,
                       "%s: the head dimension must be contiguous (stride 1), got stride %lld",
                       OPS[i], (long long)x->sd);
  }
  const sta_bshd *x = &p->x[0];
  if (x->b < 1 || x->h < 1 || x->d < 1)
    return sta_error(STA_ERR_SHAPE,
                     "q: batch, heads and D must be >= 1, got B=%lld heads=%lld D=%lld",
                     (long long)x->b, (long long)x->h, (long long)x->d);
  for (int i = 0; i < 3; i++) { /* out is written while the inputs are read */
    int64_t a0, a1, b0, b1;
    if (t[3]->storage != t[i]->storage || sta_tensor_numel(t[i]) == 0) continue;
    bytes_of(t[3], &a0, &a1);
    bytes_of(t[i], &b0, &b1);
    if (a0 <= b1 && b0 <= a1)
      return sta_error(STA_ERR_ARGUMENT, "out: shares memory with %s (the forward writes out "
                       "while reading %s; use a separate tensor)", OPS[i], OPS[i]);
  }
  if ((rc = sta_comm_check_moves(c, t[0], "q")) != STA_OK) return rc;
  if ((rc = sta_split_local(sp, g, x, "q")) != STA_OK) return rc;
  if (job->prepare && (rc = job->prepare(job, sp)) != STA_OK) return rc;
  p->dev = sta_tensor_device(t[0]);
  p->es = (int64_t)sta_dtype_size(t[0]->dtype);
  if (c->chunks > 0 && sp->hl % c->chunks != 0)
    return sta_error(STA_ERR_ARGUMENT, "chunks: %d do not divide the %lld heads of each rank "
                     "(%lld heads / %d ranks; sta_comm_set_chunks)", (int)c->chunks,
                     (long long)sp->hl, (long long)sp->h, (int)sp->p);
  p->n = c->chunks > 0 ? c->chunks : 1;
  if (c->chunks == 0 && p->dev == STA_CUDA && sp->p > 1)
    for (p->n = 4; sp->hl % p->n != 0; p->n--) {}
  if (job->layer) p->n = 1; /* a layer's windows come whole from its context */
  p->hc = sp->hl / p->n;
  if (sp->p == 1 && p->n == 1) return STA_OK; /* nothing to move */

  /* the gathered [B, V + text, hc, D] of two slots, then the pack buffer */
  int64_t fshape[4] = {sp->b, layout == STA_BSHD ? sp->s : p->hc,
                       layout == STA_BSHD ? p->hc : sp->s, sp->d};
  int64_t fbytes = ws_round(sp->b * sp->s * p->hc * sp->d * p->es);
  int64_t blk = sp->b * sp->vr * p->hc * sp->d * p->es;
  int64_t tb = sp->b * sp->text * p->hc * sp->d * p->es;
  int64_t pack = c->t.all_to_all_spans ? 0 : 2 * sp->p * blk;
  int64_t slots = p->n > 1 ? 2 : 1;
  char *ws = NULL;
  if (pack < (sp->p + 1) * tb) pack = (sp->p + 1) * tb;
  if ((rc = workspace(c, p->dev, slots * 4 * fbytes + ws_round(pack + 1), &ws)) != STA_OK)
    return rc;
  for (int64_t s = 0; s < slots; s++)
    for (int i = 0; i < 4 && rc == STA_OK; i++)
      rc = sta_tensor_wrap(&p->g[s][i], ws + (s * 4 + i) * fbytes, t[0]->dtype, p->dev, 4,
                           fshape, NULL);
  p->scratch = ws + slots * 4 * fbytes;
  if (rc == STA_OK) rc = sta_tensor_bshd(p->g[0][0], layout, "q", &p->gx);
  if (rc == STA_OK && job->check)
    rc = job->check(job, p->g[0][0], p->g[0][1], p->g[0][2], p->g[0][3]);
  if (rc == STA_OK && p->dev == STA_CUDA && p->n > 1) {
    rc = lanes_ready(c, p->dev);
    p->lanes = rc == STA_OK;
    p->main = sta_cuda_get_stream();
  }
  return rc;
}

static void pipe_free(pipe *p) {
  for (int s = 0; s < 2; s++)
    for (int i = 0; i < 4; i++) sta_tensor_destroy(p->g[s][i]);
}

static const char *layout_name(int32_t l) {
  return l == STA_BSHD ? "BSHD" : l == STA_BHSD ? "BHSD" : "?";
}

/* The first field in which rank r's call differs from rank 0's. */
static sta_status disagree(const sp_desc *a, const sp_desc *b, int32_t r) {
  const char *pre = "ranks disagree on";
  if (a->dtype != b->dtype)
    return sta_error(STA_ERR_DTYPE, "%s the dtype: rank 0 has %s, rank %d has %s", pre,
                     sta_dtype_name(a->dtype), (int)r, sta_dtype_name(b->dtype));
  if (a->layout != b->layout)
    return sta_error(STA_ERR_ARGUMENT, "%s the layout: rank 0 has %s, rank %d has %s", pre,
                     layout_name(a->layout), (int)r, layout_name(b->layout));
  if (a->device != b->device)
    return sta_error(STA_ERR_ARGUMENT, "%s the device: rank 0 has %s, rank %d has %s", pre,
                     sta_device_name(a->device), (int)r, sta_device_name(b->device));
  if (a->h != b->h)
    return sta_error(STA_ERR_SHAPE, "%s the heads: rank 0 has %lld, rank %d has %lld", pre,
                     (long long)a->h, (int)r, (long long)b->h);
  if (a->b != b->b || a->s != b->s || a->d != b->d)
    return sta_error(STA_ERR_SHAPE, "%s q's shape: rank 0 has [B=%lld, S=%lld, heads=%lld, "
                     "D=%lld], rank %d has [B=%lld, S=%lld, heads=%lld, D=%lld]", pre,
                     (long long)a->b, (long long)a->s, (long long)a->h, (long long)a->d, (int)r,
                     (long long)b->b, (long long)b->s, (long long)b->h, (long long)b->d);
  if (memcmp(a->canvas, b->canvas, sizeof a->canvas) || memcmp(a->tile, b->tile, sizeof a->tile) ||
      a->text_len != b->text_len)
    return sta_error(STA_ERR_WINDOW, "%s the geometry: rank 0 has canvas %dx%dx%d, tile "
                     "%dx%dx%d, text_len %lld; rank %d has canvas %dx%dx%d, tile %dx%dx%d, "
                     "text_len %lld", pre, a->canvas[0], a->canvas[1], a->canvas[2], a->tile[0],
                     a->tile[1], a->tile[2], (long long)a->text_len, (int)r, b->canvas[0],
                     b->canvas[1], b->canvas[2], b->tile[0], b->tile[1], b->tile[2],
                     (long long)b->text_len);
  if (a->n_windows != b->n_windows || a->windows != b->windows)
    return sta_error(STA_ERR_WINDOW, "%s the windows: rank %d's differ from rank 0's "
                     "(n_windows %d and %d)", pre, (int)r, (int)b->n_windows, (int)a->n_windows);
  if (a->scale != b->scale || a->softmax != b->softmax || a->precision != b->precision) {
    float fa, fb;
    memcpy(&fa, &a->scale, 4);
    memcpy(&fb, &b->scale, 4);
    return sta_error(STA_ERR_ARGUMENT, "%s the scale, softmax or precision: rank 0 has %g, %d "
                     "and %d, rank %d has %g, %d and %d", pre, (double)fa, (int)a->softmax,
                     (int)a->precision, (int)r, (double)fb, (int)b->softmax, (int)b->precision);
  }
  if (a->chunks != b->chunks)
    return sta_error(STA_ERR_ARGUMENT, "%s the chunks: rank 0 runs %d, rank %d runs %d "
                     "(sta_comm_set_chunks)", pre, (int)a->chunks, (int)r, (int)b->chunks);
  if (a->layer != b->layer || a->step != b->step)
    return sta_error(STA_ERR_ARGUMENT, "%s the layer: rank 0 runs layer %d at step %d, rank %d "
                     "layer %d at step %d", pre, (int)a->layer, (int)a->step, (int)r,
                     (int)b->layer, (int)b->step);
  return STA_OK;
}

/* Every rank's descriptor into *all (size of them; free it), through host
** memory, else the transport's device memory; each checked to be one. */
static sta_status gather_descs(sta_comm *c, const sp_desc *mine, sp_desc **out) {
  int32_t np = sta_comm_size(c);
  sta_status rc;
  sp_desc *all = *out = sta_calloc((size_t)np, sizeof *all);
  if (!all) return sta_error(STA_ERR_NOMEM, "out of host memory (SP descriptors)");
  if (c->t.devices & (1u << STA_CPU))
    rc = c->t.all_gather(c->t.self, mine, all, sizeof *mine, STA_CPU);
  else { /* a transport of device memory only */
    sta_device d = STA_CUDA;
    int64_t n = (int64_t)((size_t)(np + 1) * sizeof *mine);
    const sta_backend_ops *b = sta_backend_get(d);
    rc = c->dbuf && sta_tensor_numel(c->dbuf) >= n ? STA_OK
         : (sta_tensor_destroy(c->dbuf), c->dbuf = NULL,
            sta_tensor_create(&c->dbuf, STA_F16, d, 1, &n));
    char *db = rc == STA_OK ? sta_tensor_data(c->dbuf) : NULL;
    if (rc == STA_OK) rc = b->memcpy(db, d, mine, STA_CPU, sizeof *mine);
    if (rc == STA_OK) rc = c->t.all_gather(c->t.self, db, db + sizeof *mine, sizeof *mine, d);
    if (rc == STA_OK) rc = b->memcpy(all, STA_CPU, db + sizeof *mine, d, (size_t)np * sizeof *mine);
  }
  for (int32_t r = 0; r < np && rc == STA_OK; r++)
    if (memcmp(all[r].magic, "sta-sp1", 8) != 0)
      rc = sta_error(STA_ERR_STATE, "rank %d sent no SP descriptor (is it in another "
                     "collective?)", (int)r);
  return rc;
}

/* The first failure among every rank's status: this rank's own, else
** "rank r: <its message>". */
static sta_status first_failure(const sp_desc *mine, const sp_desc *all, int32_t np) {
  if (mine->status != STA_OK) return sta_error(mine->status, "%s", mine->msg);
  for (int32_t r = 0; r < np; r++)
    if (all[r].status != STA_OK) return sta_error(all[r].status, "rank %d: %s", (int)r, all[r].msg);
  return STA_OK;
}

/* Exchange every rank's descriptor and compare.  mine->status: this rank's
** own checks. */
static sta_status agree(sta_comm *c, sp_desc *mine) {
  int32_t np = sta_comm_size(c);
  sp_desc *all = NULL;
  sta_status rc = gather_descs(c, mine, &all);
  if (rc == STA_OK) rc = first_failure(mine, all, np);
  for (int32_t r = 1; r < np && rc == STA_OK; r++) rc = disagree(&all[0], &all[r], r);
  free(all);
  return rc;
}

/* After chunk c's compute, whose status on this rank is rc: whether every
** rank goes on.  A rank that failed or was cancelled must not leave the
** others waiting in the exchanges that follow until STA_DIST_TIMEOUT: every
** rank stops here with the first failure (its own first), and the links
** stay in step for the next call.  A loopback rank's failure aborts its
** world instead (sta_comm_loopback_run). */
static sta_status chunk_agree(const pipe *p, int64_t c, sta_status rc) {
  if (rc == STA_ERR_CANCELLED) /* say how much of out the call wrote */
    rc = c == 0 ? sta_cancelled(p->job->what)
                : sta_error(STA_ERR_CANCELLED, "%s: cancelled (sta_cancel) after %lld of %lld "
                            "head chunks; out holds their heads, the rest is unchanged",
                            p->job->what, (long long)c, (long long)p->n);
  if (p->sp.p == 1 || sta_loopback_is(p->c)) return rc;
  sp_desc mine, *all = NULL;
  memset(&mine, 0, sizeof mine);
  memcpy(mine.magic, "sta-sp1", 8);
  mine.status = rc;
  if (rc != STA_OK) snprintf(mine.msg, sizeof mine.msg, "%s", sta_last_error());
  sta_status g = gather_descs(p->c, &mine, &all);
  if (g == STA_OK || rc != STA_OK) g = first_failure(&mine, all, p->sp.p);
  free(all);
  return g;
}

/* This rank's descriptor (status: its own checks). */
static void describe(sp_desc *d, const pipe *p, const sta_geometry *g, sta_status status) {
  memset(d, 0, sizeof *d);
  memcpy(d->magic, "sta-sp1", 8);
  d->status = status;
  if (status != STA_OK) {
    snprintf(d->msg, sizeof d->msg, "%s", sta_last_error());
    return;
  }
  d->dtype = p->t[0]->dtype;
  d->layout = p->layout;
  d->device = p->dev;
  d->chunks = (int32_t)p->n;
  d->b = p->sp.b;
  d->s = p->sp.sl;
  d->h = p->sp.h;
  d->d = p->sp.d;
  memcpy(d->canvas, g->canvas, sizeof d->canvas);
  memcpy(d->tile, g->tile, sizeof d->tile);
  d->text_len = g->text_len;
  d->layer = d->step = -1;
  if (p->job->desc) {
    d->n_windows = p->job->desc->n_windows;
    d->windows = p->job->hash;
    memcpy(&d->scale, &p->job->desc->scale, 4);
    d->softmax = p->job->desc->softmax;
    d->precision = p->job->desc->precision;
  } else {
    sta_context *ctx = sta_context_current();
    d->layer = sta_layer_index(p->job->layer);
    d->step = ctx ? sta_context_step(ctx) : -1;
  }
}

sta_status sta_sp_run(sta_comm *c, const sta_geometry *g, sta_layout layout,
                      const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                      sta_tensor *out, sp_job *job, sta_status pre) {
  const sta_tensor *t[4] = {q, k, v, out};
  pipe p;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (pre == STA_OK) pre = sta_cancel_point(job->what); /* every rank learns of it */
  sta_status rc = prepare(&p, c, g, layout, t, job, pre);
  /* every rank learns of every rank's failed checks, unless this is a
  ** loopback world, whose run aborts the others when this rank returns */
  if (sta_comm_size(c) > 1 && !(rc != STA_OK && sta_loopback_is(c))) {
    sp_desc mine;
    describe(&mine, &p, g, rc);
    rc = agree(c, &mine);
  }
  if (rc == STA_OK)
    rc = p.sp.p == 1 && p.n == 1 ? job->compute(job, 0, q, k, v, out) : pipeline(&p);
  pipe_free(&p);
  return rc;
}

