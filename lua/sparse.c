/*
** sparse.c -- block-sparse attention and VSA in the Lua module (STA.md
** section 12): sta.block_sparse, sta.block_sparse_backward, sta.vsa,
** sta.vsa_backward, their float64 references (sta.vsa_reference,
** sta.vsa_backward_reference), sta.vsa_coarse, the cube order
** (sta.to_cubes, sta.from_cubes, sta.cube_sizes) and sta.vsa_topk.  Block lists and sizes are i32 tensors
** or Lua lists, converted here (on q's device).
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* Raise what sta_lua_fail gives for rc: misuse raises there; a failure of
** the environment (memory, device) is raised here too, with its message
** (these helpers have no result to return it in). */
static void raise_fail(lua_State *L, sta_status rc) {
  sta_lua_fail(L, rc);
  lua_pop(L, 1); /* nil, message, code: raise the message */
  lua_error(L);
}

/* Raise the failure sta_lua_push_new_tensor pushed (nil, message, code). */
static void raise_pushed(lua_State *L) {
  lua_pop(L, 1);
  lua_error(L);
}

/* ---- i32 lists ------------------------------------------------------------ */

/* A list of depth levels (1: [n]; 3: num [B, heads, M]; 4: idx [B, heads,
** M, L]) as the schema left it (every leaf an int32, sta.options); ragged:
** the last level's lengths may differ (padded with 0 to the longest). */
typedef struct ints_shape {
  int depth, ragged;
  int64_t n[4]; /* per level; -1 before the first list of the level */
} ints_shape;

/* Pass 1: the sizes, every level rectangular but a ragged last one. */
static void ints_measure(lua_State *L, int t, ints_shape *s, int lv, const char *path) {
  const int64_t len = (int64_t)lua_rawlen(L, t);
  if (lv == s->depth - 1 && s->ragged) {
    if (len > s->n[lv]) s->n[lv] = len;
  } else if (s->n[lv] < 0) {
    s->n[lv] = len;
  } else if (s->n[lv] != len) {
    sta_lua_misuse(L, "%s: %d entries, expected %d as the other lists at this level", path,
                   (int)len, (int)s->n[lv]);
  }
  for (int64_t i = 0; i < len; i++) {
    char at[96];
    snprintf(at, sizeof at, "%s[%d]", path, (int)i + 1);
    int ty = lua_rawgeti(L, t, (lua_Integer)i + 1);
    if (lv < s->depth - 1) {
      if (ty != LUA_TTABLE)
        sta_lua_misuse(L, "%s: expected a list (%d levels of lists), got %s", at, s->depth,
                       lua_typename(L, ty));
      ints_measure(L, lua_gettop(L), s, lv + 1, at);
    } else if (!lua_isinteger(L, -1)) {
      sta_lua_misuse(L, "%s: expected an integer, got %s", at, lua_typename(L, ty));
    }
    lua_pop(L, 1);
  }
}

/* Pass 2: the values into p (row-major, the ragged level padded with 0 and
** its lengths into lens). */
static void ints_fill(lua_State *L, int t, const ints_shape *s, int lv, int32_t **p,
                      int32_t **lens) {
  const int64_t len = (int64_t)lua_rawlen(L, t);
  if (lv == s->depth - 1) {
    for (int64_t i = 0; i < s->n[lv]; i++) {
      int32_t v = 0;
      if (i < len) {
        lua_rawgeti(L, t, (lua_Integer)i + 1);
        v = (int32_t)lua_tointeger(L, -1);
        lua_pop(L, 1);
      }
      *(*p)++ = v;
    }
    if (lens) *(*lens)++ = (int32_t)len;
    return;
  }
  for (int64_t i = 0; i < len; i++) {
    lua_rawgeti(L, t, (lua_Integer)i + 1);
    ints_fill(L, lua_gettop(L), s, lv + 1, p, lens);
    lua_pop(L, 1);
  }
}

/* The host tensor at the top moved to dev (replacing it), unless dev is
** the host. */
static sta_tensor *to_device(lua_State *L, sta_tensor *host, sta_device dev) {
  if (dev == STA_CPU) return host;
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  sta_status rc;
  STA_LUA_CALL(rc, sta_tensor_to(&u->t, host, STA_I32, dev));
  if (rc != STA_OK) raise_fail(L, rc);
  sta_lua_tensor_born(L, u);
  lua_replace(L, -2);
  return u->t;
}

/* opts[key], an ints option (sta.options), as an i32 tensor on dev: the
** tensor itself, or the lists converted (pushed).  NULL when absent.
** *lens (ragged lists only, may be NULL): the lists' lengths, an i32 tensor
** of one dimension less on dev, pushed before the values. */
static sta_tensor *push_ints(lua_State *L, int opts, const char *key, int depth, int ragged,
                             sta_device dev, sta_tensor **lens) {
  if (lens) *lens = NULL;
  int ty = lua_getfield(L, opts, key);
  if (ty == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (ty != LUA_TTABLE) return sta_lua_check_tensor(L, -1, key); /* stays pushed */
  const int list = lua_gettop(L);
  ints_shape s = {depth, ragged, {-1, -1, -1, -1}};
  ints_measure(L, list, &s, 0, key);
  for (int i = 0; i < depth; i++)
    if (s.n[i] < 0) s.n[i] = 0;
  if (ragged && s.n[depth - 1] < 1) s.n[depth - 1] = 1;
  sta_lua_tensor *uv, *ul = NULL;
  int r;
  if (ragged && lens) {
    if ((r = sta_lua_push_new_tensor(L, STA_I32, STA_CPU, depth - 1, s.n, &ul)) != 1)
      raise_pushed(L);
  }
  if ((r = sta_lua_push_new_tensor(L, STA_I32, STA_CPU, depth, s.n, &uv)) != 1) raise_pushed(L);
  int32_t *p = sta_tensor_data(uv->t), *lp = ul ? sta_tensor_data(ul->t) : NULL;
  ints_fill(L, list, &s, 0, &p, ul ? &lp : NULL);
  sta_tensor *vals = to_device(L, uv->t, dev);
  if (ul) {
    lua_insert(L, -2); /* lens on top */
    *lens = to_device(L, ul->t, dev);
    lua_insert(L, -2); /* values on top again */
  }
  return vals;
}

/* ---- block-sparse attention ----------------------------------------------------- */

/* The descriptor of a block-list call from its options at opts (which
** must exist), checked against the schema of call: the lists and sizes as
** i32 tensors on q's device, left on the stack (keep them there). */
static void read_blocks(lua_State *L, int opts, const char *call, sta_tensor *q,
                        sta_attention_desc *d, sta_block_list *bl) {
  sta_lua_options(L, opts, call);
  memset(d, 0, sizeof *d);
  memset(bl, 0, sizeof *bl);
  d->layout = sta_lua_parse_layout(L, sta_lua_str_field(L, opts, "layout"));
  d->scale = (float)sta_lua_num_field(L, opts, "scale", 0); /* 0: the core's 1/sqrt(D) */
  d->deterministic = sta_lua_bool_field(L, opts, "deterministic", 0);
  d->mask = STA_MASK_BLOCKS;
  d->blocks = bl;
  bl->block_rows = sta_lua_int32_field(L, opts, "block_rows", 0); /* 0: the core's 64 */
  const sta_device dev = sta_tensor_device(q);
  sta_tensor *lens;
  bl->idx = push_ints(L, opts, "idx", 4, 1, dev, &lens);
  bl->num = push_ints(L, opts, "num", 3, 0, dev, NULL);
  if (!bl->num) bl->num = lens;
  if (!bl->num)
    sta_lua_misuse(L, "num: required with an idx tensor (how many of each list's entries "
                      "count: i32 [B, heads, Mq])");
  bl->kv_sizes = push_ints(L, opts, "kv_sizes", 1, 0, dev, NULL);
  bl->q_sizes = push_ints(L, opts, "q_sizes", 1, 0, dev, NULL);
}

/* block_sparse(q, k, v, {idx=, num=, kv_sizes=, q_sizes=, block_rows=,
** layout=, scale=, out=, lse=}) -> out [, lse] */
static int l_block_sparse(lua_State *L) {
  sta_tensor *q = sta_lua_check_tensor(L, 1, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 2, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 3, "v");
  sta_attention_desc d;
  sta_block_list bl;
  lua_settop(L, 4);
  read_blocks(L, 4, "block_sparse", q, &d, &bl); /* the lists stay on the stack */
  sta_tensor *lse, *out;
  int want_lse, r = sta_lua_push_outputs(L, 4, q, d.layout, &out, &lse, &want_lse);
  if (r != 1) return r;
  sta_status rc;
  STA_LUA_LONG(rc, sta_attention_forward(&d, q, k, v, out, lse));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return want_lse ? 2 : 1;
}

/* block_sparse_backward(q, k, v, out, lse, dout, opts) -> dq, dk, dv: the
** options of block_sparse (the forward's), plus dq, dk, dv to write into */
static int l_block_sparse_backward(lua_State *L) {
  static const char *N[6] = {"q", "k", "v", "out", "lse", "dout"}, *G[3] = {"dq", "dk", "dv"};
  sta_tensor *t[6], *g[3];
  for (int i = 0; i < 6; i++) t[i] = sta_lua_check_tensor(L, i + 1, N[i]);
  sta_attention_desc d;
  sta_block_list bl;
  lua_settop(L, 7);
  read_blocks(L, 7, "block_sparse_backward", t[0], &d, &bl);
  for (int i = 0; i < 3; i++) { /* dq like q; dk, dv like k */
    int r = sta_lua_opt_or_like(L, 7, G[i], t[i == 0 ? 0 : 1], &g[i]);
    if (r != 1) return r;
  }
  sta_status rc;
  STA_LUA_LONG(rc, sta_attention_backward(&d, t[0], t[1], t[2], t[3], t[4], t[5], g[0], g[1], g[2]));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 3;
}

/* ---- VSA -------------------------------------------------------------------- */

/* canvas (required by the schema) and cube (else 4x4x4) of options at opts. */
static void read_canvas_cube(lua_State *L, int opts, int32_t canvas[3], int32_t cube[3]) {
  lua_getfield(L, opts, "canvas");
  sta_lua_int_list(L, -1, canvas, 3, "canvas");
  cube[0] = cube[1] = cube[2] = 4;
  if (lua_getfield(L, opts, "cube") != LUA_TNIL) sta_lua_int_list(L, -1, cube, 3, "cube");
  lua_pop(L, 2);
}

/* The rows of t (name; 4-D in layout) are the cube order's, else raise. */
static void check_cube_rows(lua_State *L, const sta_tensor *t, const char *name,
                            sta_layout layout, const int32_t canvas[3], int64_t n, int32_t br) {
  if (sta_tensor_ndim(t) != 4) return; /* the core's message */
  int64_t s = sta_tensor_size(t, layout == STA_BSHD ? 1 : 2);
  if (s != n * br)
    sta_lua_misuse(L, "%s: %I rows, expected %I (the canvas %dx%dx%d in %I cubes of %d rows, cube "
                      "order)", name, (lua_Integer)s, (lua_Integer)(n * br), (int)canvas[0],
                   (int)canvas[1], (int)canvas[2], (lua_Integer)n, (int)br);
}

void sta_lua_read_vsa(lua_State *L, int opts, const char *call, sta_tensor *q,
                      sta_tensor *k, sta_vsa_desc *d, sta_tensor **gate) {
  int32_t canvas[3], cube[3];
  int64_t n;
  sta_status rc;
  sta_lua_options(L, opts, call);
  memset(d, 0, sizeof *d);
  read_canvas_cube(L, opts, canvas, cube);
  if ((rc = sta_vsa_cube_count(canvas, cube, &n)) != STA_OK) raise_fail(L, rc);
  sta_lua_tensor *u;
  if (sta_lua_push_new_tensor(L, STA_I32, sta_tensor_device(q), 1, &n, &u) != 1) raise_pushed(L);
  if ((rc = sta_vsa_cube_sizes(u->t, canvas, cube)) != STA_OK) raise_fail(L, rc);
  d->kv_sizes = u->t;
  d->block_rows = cube[0] * cube[1] * cube[2]; /* <= 4096: sta_vsa_cube_count */
  d->layout = sta_lua_parse_layout(L, sta_lua_str_field(L, opts, "layout"));
  check_cube_rows(L, q, "q", d->layout, canvas, n, d->block_rows);
  check_cube_rows(L, k, "k", d->layout, canvas, n, d->block_rows);
  d->scale = (float)sta_lua_num_field(L, opts, "scale", 0);
  d->deterministic = sta_lua_bool_field(L, opts, "deterministic", 0);
  if (lua_getfield(L, opts, "topk") != LUA_TNIL) d->topk = sta_lua_int32_field(L, opts, "topk", 0);
  else if ((rc = sta_vsa_topk(sta_lua_num_field(L, opts, "sparsity", 0), n, &d->topk)) != STA_OK)
    raise_fail(L, rc);
  lua_pop(L, 1);
  *gate = NULL;
  if (lua_getfield(L, opts, "gate") != LUA_TNIL) *gate = sta_lua_check_tensor(L, -1, "gate");
  lua_pop(L, 1); /* the table holds it */
}

void sta_lua_push_vsa(lua_State *L, const sta_vsa_desc *d, const int32_t canvas[3],
                      const int32_t cube[3], int gate_idx) {
  lua_createtable(L, 0, 6);
  sta_lua_push_ints(L, canvas, 3);
  lua_setfield(L, -2, "canvas");
  sta_lua_push_ints(L, cube, 3);
  lua_setfield(L, -2, "cube");
  lua_pushinteger(L, d->topk);
  lua_setfield(L, -2, "topk");
  lua_pushstring(L, d->layout == STA_BHSD ? "bhsd" : "bshd");
  lua_setfield(L, -2, "layout");
  if (d->scale > 0) {
    lua_pushnumber(L, d->scale);
    lua_setfield(L, -2, "scale");
  }
  if (gate_idx) {
    lua_pushvalue(L, gate_idx);
    lua_setfield(L, -2, "gate");
  }
}

/* vsa(q, k, v, {canvas=, cube=, sparsity= | topk=, gate=, layout=, scale=,
** out=, lse=}) -> out [, lse]: q, k, v in the cube order of canvas;
** vsa_reference (the brute force in double, host tensors) with ref = 1 */
static int vsa_common(lua_State *L, int ref) {
  sta_tensor *q = sta_lua_check_tensor(L, 1, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 2, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 3, "v");
  sta_vsa_desc d;
  sta_tensor *gate, *lse, *out;
  lua_settop(L, 4);
  sta_lua_read_vsa(L, 4, ref ? "vsa_reference" : "vsa", q, k, &d, &gate); /* the sizes stay */
  int want_lse, r = sta_lua_push_outputs(L, 4, q, d.layout, &out, &lse, &want_lse);
  if (r != 1) return r;
  sta_status rc;
  if (ref) STA_LUA_LONG(rc, sta_vsa_reference(&d, q, k, v, gate, out, lse));
  else STA_LUA_LONG(rc, sta_vsa_forward(&d, q, k, v, gate, out, lse));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return want_lse ? 2 : 1;
}

static int l_vsa(lua_State *L) { return vsa_common(L, 0); }
static int l_vsa_reference(lua_State *L) { return vsa_common(L, 1); }

/* dq, dk, dv (and dgate) of sta_vsa_backward, or of sta_vsa_backward_reference
** with ref = 1 (which reads neither out nor lse: t[3], t[4] may be NULL). */
static int vsa_grads(lua_State *L, const sta_vsa_desc *d, sta_tensor *const *t,
                     sta_tensor *gate, int grads, int ref) {
  static const char *G[4] = {"dq", "dk", "dv", "dgate"};
  sta_tensor *g[4] = {NULL, NULL, NULL, NULL};
  const int n = gate ? 4 : 3;
  for (int i = 0; i < n; i++) { /* dq, dgate like q; dk, dv like k */
    int r = sta_lua_opt_or_like(L, grads, G[i], t[i == 1 || i == 2 ? 1 : 0], &g[i]);
    if (r != 1) return r;
  }
  sta_status rc;
  if (ref)
    STA_LUA_LONG(rc, sta_vsa_backward_reference(d, t[0], t[1], t[2], gate, t[5], g[0], g[1],
                                                g[2], g[3]));
  else
    STA_LUA_LONG(rc, sta_vsa_backward(d, t[0], t[1], t[2], gate, t[3], t[4], t[5], g[0], g[1],
                                      g[2], g[3]));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return n;
}

int sta_lua_vsa_backward(lua_State *L, const sta_vsa_desc *d, sta_tensor *const *t,
                         sta_tensor *gate, int grads) {
  return vsa_grads(L, d, t, gate, grads, 0);
}

/* vsa_backward(q, k, v, out, lse, dout, opts) -> dq, dk, dv [, dgate]: the
** options of vsa (the forward's: sparsity or topk, gate), plus dq, dk, dv,
** dgate to write into; vsa_backward_reference with ref = 1 (in double from
** q, k, v, gate and dout: out and lse may be nil, and are not read) */
static int vsa_backward_common(lua_State *L, int ref) {
  static const char *N[6] = {"q", "k", "v", "out", "lse", "dout"};
  sta_tensor *t[6], *gate;
  for (int i = 0; i < 6; i++)
    t[i] = ref && (i == 3 || i == 4) && lua_isnoneornil(L, i + 1)
               ? NULL : sta_lua_check_tensor(L, i + 1, N[i]);
  sta_vsa_desc d;
  lua_settop(L, 7);
  sta_lua_read_vsa(L, 7, ref ? "vsa_backward_reference" : "vsa_backward", t[0], t[1], &d, &gate);
  return vsa_grads(L, &d, t, gate, 7, ref);
}

static int l_vsa_backward(lua_State *L) { return vsa_backward_common(L, 0); }
static int l_vsa_backward_reference(lua_State *L) { return vsa_backward_common(L, 1); }

/* vsa_coarse(q, k, v, {canvas=, cube=, sparsity= | topk=, layout=, scale=})
** -> out_c f32 [B, heads, Mq, D], lse_c f32 [B, heads, Mq], idx i32 [B,
** heads, Mq, topk] (the selected key cubes, ascending), num i32 [B, heads,
** Mq] (topk): the coarse branch and the selection (sta_vsa_coarse), on q's
** device; idx and num are a block list for sta.block_sparse */
static int l_vsa_coarse(lua_State *L) {
  sta_tensor *q = sta_lua_check_tensor(L, 1, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 2, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 3, "v");
  sta_vsa_desc d;
  sta_tensor *gate, *w[4];
  lua_settop(L, 4);
  sta_lua_read_vsa(L, 4, "vsa_coarse", q, k, &d, &gate); /* the sizes stay; no gate here */
  if (sta_tensor_ndim(q) != 4)
    return sta_lua_misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
  const int bshd = d.layout == STA_BSHD;
  const int64_t B = sta_tensor_size(q, 0), heads = sta_tensor_size(q, bshd ? 2 : 1);
  const int64_t Mq = sta_tensor_size(q, bshd ? 1 : 2) / d.block_rows; /* whole: read_vsa */
  const int64_t oc[4] = {B, heads, Mq, sta_tensor_size(q, 3)}, ix[4] = {B, heads, Mq, d.topk};
  const sta_dtype dt[4] = {STA_F32, STA_F32, STA_I32, STA_I32};
  const int nd[4] = {4, 3, 4, 3};
  for (int i = 0; i < 4; i++) {
    sta_lua_tensor *u;
    int r = sta_lua_push_new_tensor(L, dt[i], sta_tensor_device(q), nd[i], i < 2 ? oc : ix, &u);
    if (r != 1) return r;
    w[i] = u->t;
  }
  sta_status rc;
  STA_LUA_LONG(rc, sta_vsa_coarse(&d, q, k, v, w[0], w[1], w[2], w[3]));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 4;
}

/* vsa_topk(sparsity, cubes) -> ceil((1 - sparsity) * cubes) (sta_vsa_topk) */
static int l_vsa_topk(lua_State *L) {
  int ok;
  double s = lua_tonumberx(L, 1, &ok);
  if (!ok) return sta_lua_misuse(L, "sparsity: expected a number, got %s", luaL_typename(L, 1));
  lua_Integer n = lua_tointegerx(L, 2, &ok);
  if (!ok) return sta_lua_misuse(L, "cubes: expected an integer, got %s", luaL_typename(L, 2));
  int32_t topk;
  sta_status rc = sta_vsa_topk(s, (int64_t)n, &topk);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushinteger(L, topk);
  return 1;
}

/* ---- the cube order ------------------------------------------------------------ */

/* to_cubes(x, {canvas=, cube=, layout=, out=}) -> x in cube order (cubes *
** |cube| rows, padding rows 0); from_cubes the other way (T*H*W rows) */
static int cubes_common(lua_State *L, int to) {
  sta_tensor *x = sta_lua_check_tensor(L, 1, "x");
  int32_t canvas[3], cube[3];
  int64_t n, shape[4];
  lua_settop(L, 2);
  sta_lua_options(L, 2, "cubes");
  read_canvas_cube(L, 2, canvas, cube);
  sta_layout layout = sta_lua_parse_layout(L, sta_lua_str_field(L, 2, "layout"));
  sta_status rc = sta_vsa_cube_count(canvas, cube, &n);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  if (sta_tensor_ndim(x) != 4)
    return sta_lua_misuse(L, "x: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(x));
  sta_tensor *out;
  if (lua_getfield(L, 2, "out") != LUA_TNIL) {
    out = sta_lua_check_tensor(L, -1, "out");
  } else {
    lua_pop(L, 1);
    for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(x, i);
    shape[layout == STA_BSHD ? 1 : 2] =
        to ? n * cube[0] * cube[1] * cube[2] : (int64_t)canvas[0] * canvas[1] * canvas[2];
    sta_lua_tensor *u;
    int r = sta_lua_push_new_tensor(L, sta_tensor_dtype(x), sta_tensor_device(x), 4, shape, &u);
    if (r != 1) return r;
    out = u->t;
  }
  rc = to ? sta_tensor_to_cubes(out, x, canvas, cube, layout)
          : sta_tensor_from_cubes(out, x, canvas, cube, layout);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int l_to_cubes(lua_State *L) { return cubes_common(L, 1); }
static int l_from_cubes(lua_State *L) { return cubes_common(L, 0); }

/* cube_sizes{canvas=, cube=, device=} -> i32 [cubes]: each cube's valid
** tokens (FastVideo's variable_block_sizes) */
static int l_cube_sizes(lua_State *L) {
  int32_t canvas[3], cube[3];
  int64_t n;
  lua_settop(L, 1);
  sta_lua_options(L, 1, "cube_sizes");
  read_canvas_cube(L, 1, canvas, cube);
  const char *dev = sta_lua_str_field(L, 1, "device");
  sta_status rc = sta_vsa_cube_count(canvas, cube, &n);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, STA_I32, dev ? sta_lua_parse_device(L, dev, "device")
                                                  : STA_CPU, 1, &n, &u);
  if (r != 1) return r;
  rc = sta_vsa_cube_sizes(u->t, canvas, cube);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg sparse_funcs[] = {
  {"block_sparse", l_block_sparse}, {"block_sparse_backward", l_block_sparse_backward},
  {"vsa", l_vsa}, {"vsa_backward", l_vsa_backward}, {"vsa_reference", l_vsa_reference},
  {"vsa_backward_reference", l_vsa_backward_reference}, {"vsa_coarse", l_vsa_coarse},
  {"vsa_topk", l_vsa_topk},
  {"to_cubes", l_to_cubes}, {"from_cubes", l_from_cubes}, {"cube_sizes", l_cube_sizes},
  {NULL, NULL}};

void sta_lua_open_sparse(lua_State *L) { luaL_setfuncs(L, sparse_funcs, 0); }
