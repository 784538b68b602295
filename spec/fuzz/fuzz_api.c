/*
** fuzz_api.c -- random sequences of C API calls: create,
** release, view, push, pop, forward, backward, search, save, load, tune,
** SP layers, cancel, on a pool of handles that the bytes pick from, live
** or already released, in any order.  Each 3 input bytes are one call: the
** operation, the slots (i, j, k: 2 bits each) and flags.
** Invariants: nothing crashes or touches freed memory (ASan); every failure
** carries its status and a message; the context stack has the depth the
** successful pushes and pops give; a forward that fails leaves its output
** as it was; at the end, after everything is released, no handle is left.
** Small problem: canvas 2x4x4, tile 1x2x2, 2 text rows, 4 heads, D 4 (a
** search row of 2 windows is shorter than the heads: search mode records).
** Operations 24-31 take extreme arguments (api_extreme.h).
*/
#include "fuzz.h"

#define API_T 4 /* slots per kind */
enum { API_S = 34, API_H = 4, API_D = 4 };

typedef struct api_pool {
  sta_tensor *t[API_T];
  sta_strategy *s[API_T];
  sta_metadata *m[API_T];
  sta_forward_batch *b[API_T];
  sta_context *c[API_T];
  sta_layer *l[API_T];
  sta_comm *comm[API_T];
  sta_sp_layer *sp[API_T];
  int32_t depth; /* the model of the context stack */
  uint64_t calls; /* calls so far: the extreme calls' stream (api_extreme.h) */
} api_pool;

static sta_geometry api_geom(void) {
  sta_geometry g;
  sta_geometry_init(&g, 2, 4, 4);
  g.tile[0] = 1; g.tile[1] = 2; g.tile[2] = 2; /* grid 2x2x2 */
  return g;
}

static const int32_t API_WIN[4][3] = {{1, 1, 1}, {1, 3, 1}, {3, 3, 3}, {2, 1, 1}};

static sta_layer_desc api_layer_desc(const sta_strategy *s, unsigned x) {
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.layer_index = (int32_t)(x % 3);
  d.local_heads = API_H;
  d.head_dim = API_D;
  d.sp_size = 1;
  d.geom = api_geom();
  d.layout = (x & 8) ? STA_BHSD : STA_BSHD;
  d.strategy = s;
  return d;
}

/* Calls that succeeded, by kind (random_api.c reports them). */
enum { API_OPS = 32 };
static int64_t api_ok[API_OPS];

/* A copy of t's elements when t is live (to check "unchanged"), else NULL. */
static sta_tensor *api_snapshot(const sta_tensor *t) {
  sta_tensor *c = NULL;
  if (sta_handle_live(t, STA_KIND_TENSOR)) FUZZ_CHECK(sta_tensor_to(&c, t, STA_F32, STA_CPU) == STA_OK);
  return c;
}

/* t holds snap's bits (NaN and Inf included: extreme fills put them there). */
static void api_same(const sta_tensor *t, sta_tensor *snap) {
  if (!snap) return;
  sta_tensor *now = NULL;
  FUZZ_CHECK(sta_tensor_to(&now, t, STA_F32, STA_CPU) == STA_OK);
  FUZZ_CHECK(memcmp(sta_tensor_data(now), sta_tensor_data(snap),
                    (size_t)sta_tensor_numel(snap) * sizeof(float)) == 0);
  sta_tensor_destroy(now);
  sta_tensor_destroy(snap);
}

static const char *api_path(const char *tag) {
  static char p[4][128];
  static int k;
  char *s = p[k++ % 4];
  const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(s, 128, "%s/sta-fuzz-%d-api-%s", dir, (int)getpid(), tag);
  return s;
}

#include "api_extreme.h"

/* One call: op, slots i, j, k (2 bits each of sl) and flags x. */
static void api_step(api_pool *a, unsigned op, unsigned sl, unsigned x) {
  unsigned i = sl % API_T, j = (sl / 4) % API_T, k = (sl / 16) % API_T;
  sta_status rc = STA_OK;
  sta_clear_error();
  xr r = {((uint64_t)op << 16 | (uint64_t)sl << 8 | x) ^ (a->calls++ * 0x9e3779b97f4a7c15ull)};
  switch (op % API_OPS) {
  case 0: { /* a tensor of the problem's shape, or a small odd one */
    int64_t sh[4] = {1, API_S, API_H, API_D}, bh[4] = {1, API_H, API_S, API_D}, odd[2] = {3, 5};
    sta_tensor *t = NULL;
    rc = (x & 128) ? sta_tensor_create(&t, STA_F32, STA_CPU, 2, odd)
                   : sta_tensor_create(&t, (sta_dtype)((x / 16) % 3), STA_CPU, 4, (x & 64) ? bh : sh);
    if (rc == STA_OK) FUZZ_CHECK(sta_tensor_randn(t, x, 0, 1) == STA_OK);
    if (rc == STA_OK) { sta_tensor_destroy(a->t[i]); a->t[i] = t; }
    break;
  }
  case 1: { /* a view (narrow or permute), into another slot */
    sta_tensor *v = NULL;
    int32_t perm[4] = {0, 2, 1, 3};
    rc = (x & 64) ? sta_tensor_permute(&v, a->t[j], perm)
                  : sta_tensor_narrow(&v, a->t[j], 3, 0, (x & 128) ? 2 : API_D);
    if (rc == STA_OK) { sta_tensor_destroy(a->t[i]); a->t[i] = v; }
    break;
  }
  case 2: sta_tensor_destroy(a->t[i]); break; /* the slot keeps the dead handle */
  case 3: {
    sta_strategy *s = NULL;
    rc = sta_strategy_uniform(&s, 1 + (int32_t)(x % 3), 3, API_H, API_WIN[(x / 4) % 3],
                              API_WIN[2], (int32_t)((x / 16) % 2));
    if (rc == STA_OK) { sta_strategy_destroy(a->s[i]); a->s[i] = s; }
    break;
  }
  case 4: rc = sta_strategy_set(a->s[i], (int32_t)(x % 4), (int32_t)((x / 4) % 3),
                                (int32_t)((x / 16) % 3), API_WIN[(x / 64) % 4]);
    break;
  case 5: sta_strategy_destroy(a->s[i]); break;
  case 6: {
    sta_metadata *m = NULL;
    int32_t cands[6] = {1, 1, 1, 3, 3, 3};
    rc = (x & 128) ? sta_metadata_search(&m, 3, 2, cands)
                   : sta_metadata_from_strategy(&m, a->s[j], (int32_t)(x % 3), 3, API_H);
    if (rc == STA_OK) { sta_metadata_destroy(a->m[i]); a->m[i] = m; }
    break;
  }
  case 7: sta_metadata_destroy(a->m[i]); break;
  case 8: {
    sta_forward_batch *b = NULL;
    rc = sta_forward_batch_create(&b, 1);
    if (rc == STA_OK) { sta_forward_batch_destroy(a->b[i]); a->b[i] = b; }
    sta_forward_batch_set_negative(a->b[i], (int32_t)(x & 64));
    break;
  }
  case 9: sta_forward_batch_destroy(a->b[i]); break;
  case 10: { /* push with any metadata and batch slot, live, dead or none */
    sta_context *c = NULL;
    rc = sta_context_push(&c, (int32_t)(x % 3), (x & 64) ? NULL : a->m[j],
                          (x & 128) ? NULL : a->b[k]);
    if (rc == STA_OK) { a->c[i] = c; a->depth++; }
    break;
  }
  case 11: /* pop any slot: only the innermost live one may go */
    rc = sta_context_pop(a->c[i]);
    if (rc == STA_OK) a->depth--;
    break;
  case 12: {
    sta_layer *l = NULL;
    sta_layer_desc d = api_layer_desc((x & 64) ? a->s[j] : NULL, x);
    rc = sta_layer_create(&l, &d);
    if (rc == STA_OK) { sta_layer_destroy(a->l[i]); a->l[i] = l; }
    break;
  }
  case 13: rc = sta_layer_set_strategy(a->l[i], (x & 64) ? a->s[j] : NULL); break;
  case 14: sta_layer_destroy(a->l[i]); break;
  case 15: case 16: { /* layer forward; out unchanged on failure */
    sta_tensor *out = a->t[(j + 1 + (x % 3)) % API_T], *snap = api_snapshot(out);
    rc = sta_layer_forward(a->l[i], a->t[j], a->t[k], a->t[k], out);
    if (rc != STA_OK) api_same(out, snap); else sta_tensor_destroy(snap);
    break;
  }
  case 17: { /* attention forward with lse */
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    d.geom = api_geom();
    d.n_windows = 1;
    d.windows = API_WIN[x % 4];
    d.layout = (x & 4) ? STA_BHSD : STA_BSHD;
    sta_tensor *out = a->t[k], *snap = api_snapshot(out);
    rc = sta_attention_forward(&d, a->t[i], a->t[j], a->t[j], out,
                               (x & 8) ? a->t[(k + 1) % API_T] : NULL);
    if (rc != STA_OK) api_same(out, snap); else sta_tensor_destroy(snap);
    break;
  }
  case 18: { /* search results of a batch, saved, then tuned */
    const char *p = api_path("search");
    rc = sta_forward_batch_save_search(a->b[i], (int32_t)(x & 1), p);
    if (rc == STA_OK) {
      sta_strategy *s = NULL;
      const char *paths[1] = {p};
      static const int32_t full[3] = {3, 3, 3};
      sta_tune_report rep;
      rc = sta_tune(&s, 1, paths, (int32_t)(x % 3), full, &rep);
      if (rc == STA_OK) { sta_strategy_destroy(a->s[j]); a->s[j] = s; }
    }
    break;
  }
  case 19: { /* strategy round trip through a file */
    const char *p = api_path("strategy");
    rc = sta_strategy_save(a->s[i], p);
    if (rc == STA_OK) {
      sta_strategy *s = NULL;
      FUZZ_CHECK(sta_strategy_load(&s, p) == STA_OK);
      FUZZ_CHECK(sta_strategy_equal(s, a->s[i]));
      sta_strategy_destroy(a->s[j]);
      a->s[j] = s;
    }
    break;
  }
  case 20: { /* an SP layer over a loopback world of one; the comm may go first */
    sta_comm *c = NULL;
    rc = sta_comm_loopback(&c, 1);
    if (rc == STA_OK) { sta_comm_destroy(a->comm[i]); a->comm[i] = c; }
    sta_layer_desc d = api_layer_desc(a->s[j], x);
    sta_sp_layer *l = NULL;
    rc = sta_sp_layer_create(&l, a->comm[k], &d);
    if (rc == STA_OK) { sta_sp_layer_destroy(a->sp[i]); a->sp[i] = l; }
    if (x & 64) sta_comm_destroy(a->comm[k]);
    break;
  }
  case 21: {
    sta_tensor *out = a->t[(j + 1 + (x % 3)) % API_T], *snap = api_snapshot(out);
    rc = sta_sp_layer_forward(a->sp[i], a->t[j], a->t[k], a->t[k], out);
    if (rc != STA_OK) api_same(out, snap); else sta_tensor_destroy(snap);
    break;
  }
  case 22: /* release in bulk, in slot order */
    for (unsigned s = 0; s < API_T; s++) {
      if (x & 1) sta_tensor_destroy(a->t[s]);
      if (x & 2) sta_strategy_destroy(a->s[s]);
      if (x & 4) sta_metadata_destroy(a->m[s]);
      if (x & 8) sta_forward_batch_destroy(a->b[s]);
      if (x & 16) sta_layer_destroy(a->l[s]);
      if (x & 32) sta_sp_layer_destroy(a->sp[s]);
      if (x & 64) sta_comm_destroy(a->comm[s]);
    }
    break;
  case 23: /* the cancel flag, raised for the next call or cleared */
    if (x & 1) sta_cancel(); else sta_cancel_clear();
    break;
  default: /* 24-31: extreme arguments */
    api_extreme(a, op % API_OPS, i, j, k, x, &r, &rc);
    break;
  }
  fuzz_status(rc);
  if (rc == STA_OK) api_ok[op % API_OPS]++;
  if (rc == STA_ERR_CANCELLED) FUZZ_CHECK(sta_cancel_requested());
  FUZZ_CHECK(sta_context_depth() == a->depth);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int64_t live0 = -1;
  if (live0 < 0) live0 = sta_handle_count();
  api_pool a;
  memset(&a, 0, sizeof a);
  fuzz_bytes in = {data, size > 512 ? 512 : size};
  while (in.n >= 3) {
    unsigned op = fuzz_take(&in), sl = fuzz_take(&in);
    api_step(&a, op, sl, fuzz_take(&in));
  }
  /* unwind: every context, then every handle, in slot order */
  while (sta_context_current()) FUZZ_CHECK(sta_context_pop(sta_context_current()) == STA_OK);
  for (unsigned s = 0; s < API_T; s++) {
    sta_tensor_destroy(a.t[s]);
    sta_strategy_destroy(a.s[s]);
    sta_metadata_destroy(a.m[s]);
    sta_forward_batch_destroy(a.b[s]);
    sta_layer_destroy(a.l[s]);
    sta_sp_layer_destroy(a.sp[s]);
    sta_comm_destroy(a.comm[s]);
  }
  sta_cancel_clear();
  FUZZ_CHECK(sta_handle_count() == live0);
  return 0;
}
