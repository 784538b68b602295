/*
** attention.c -- the attention calls of the Lua module: sta.attention,
** sta.reference, sta.attention_backward, sta.attention_fp8, sta.flops and
** sta.head_diff.
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- attention ----------------------------------------------------------- */

/* opts.window as sta_lua_windows reads it; opts: a table or nil. */
static int32_t *opts_windows(lua_State *L, int opts, int32_t *n) {
  if (lua_istable(L, opts)) lua_getfield(L, opts, "window");
  else lua_pushnil(L);
  return sta_lua_windows(L, -1, n);
}

/* The descriptor of an attention call from its options table at opts (or
** nil; it must exist on the stack), checked against the schema of call
** (sta_lua_options) and replaced by its normalized copy: layout, canvas
** (else the known shape of q's length), tile, text_len, order, window(s),
** scale, softmax, precision, deterministic; absent ones as the core's
** defaults.  d->windows lives in a userdata this leaves on the stack:
** keep it there for the call. */
void sta_lua_read_desc(lua_State *L, int opts, const char *call, sta_tensor *q,
                       sta_attention_desc *d) {
  sta_lua_options(L, opts, call);
  memset(d, 0, sizeof *d);
  d->layout = sta_lua_parse_layout(L, sta_lua_str_field(L, opts, "layout"));
  if (!sta_lua_read_geometry(L, opts, &d->geom)) {
    sta_geometry gk;
    if (sta_tensor_ndim(q) != 4)
      sta_lua_misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
    sta_status rc = sta_geometry_from_seq_len(&gk, sta_tensor_size(q, d->layout == STA_BSHD ? 1 : 2));
    if (rc != STA_OK) sta_lua_fail(L, rc);
    gk.text_len = d->geom.text_len;
    gk.tile[0] = d->geom.tile[0]; gk.tile[1] = d->geom.tile[1]; gk.tile[2] = d->geom.tile[2];
    gk.order = d->geom.order;
    d->geom = gk;
  }
  d->windows = opts_windows(L, opts, &d->n_windows);
  d->scale = (float)sta_lua_num_field(L, opts, "scale", 0); /* 0: the core's 1/sqrt(D) */
  d->deterministic = sta_lua_bool_field(L, opts, "deterministic", 0);
  d->softmax = sta_lua_parse_softmax(L, sta_lua_str_field(L, opts, "softmax"));
  d->precision = sta_lua_parse_precision(L, sta_lua_str_field(L, opts, "precision"));
}

void sta_lua_push_desc(lua_State *L, const sta_attention_desc *d) {
  lua_createtable(L, 0, 10);
  sta_lua_push_ints(L, d->geom.canvas, 3);
  lua_setfield(L, -2, "canvas");
  sta_lua_push_ints(L, d->geom.tile, 3);
  lua_setfield(L, -2, "tile");
  if (d->geom.text_len >= 0) {
    lua_pushinteger(L, (lua_Integer)d->geom.text_len);
    lua_setfield(L, -2, "text_len");
  }
  lua_pushstring(L, sta_lua_order_name(d->geom.order));
  lua_setfield(L, -2, "order");
  lua_pushstring(L, d->layout == STA_BHSD ? "bhsd" : "bshd");
  lua_setfield(L, -2, "layout");
  sta_lua_push_window_list(L, d->windows, d->n_windows);
  lua_setfield(L, -2, "window");
  if (d->scale > 0) {
    lua_pushnumber(L, d->scale);
    lua_setfield(L, -2, "scale");
  }
  lua_pushstring(L, d->softmax == STA_SOFTMAX_FAST ? "fast" : "exact");
  lua_setfield(L, -2, "softmax");
  lua_pushstring(L, d->precision == STA_PRECISION_FP8 ? "fp8" : "native");
  lua_setfield(L, -2, "precision");
}

/* *out: the tensor opts[key] if given, else a new one like t; pushed.  1,
** or what sta_lua_fail returns. */
int sta_lua_opt_or_like(lua_State *L, int opts, const char *key, sta_tensor *t, sta_tensor **out) {
  if (lua_istable(L, opts) && lua_getfield(L, opts, key) != LUA_TNIL) {
    *out = sta_lua_check_tensor(L, -1, key);
    return 1;
  }
  if (lua_istable(L, opts)) lua_pop(L, 1);
  return sta_lua_push_like(L, t, out);
}

/* The lse to write, pushed: opts.lse if it is a tensor (*lse already set),
** else a new f32 [B, heads, S] on q's device.  1, or what sta_lua_fail
** returns. */
int sta_lua_push_lse(lua_State *L, int opts, sta_tensor *q, sta_layout layout, sta_tensor **lse) {
  if (*lse) {
    lua_getfield(L, opts, "lse");
    return 1;
  }
  int64_t shape[3] = {sta_tensor_size(q, 0), sta_tensor_size(q, layout == STA_BSHD ? 2 : 1),
                      sta_tensor_size(q, layout == STA_BSHD ? 1 : 2)};
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, STA_F32, sta_tensor_device(q), 3, shape, &u);
  if (r == 1) *lse = u->t;
  return r;
}

/* opts.lse at opts: *want (true or a tensor), *lse the tensor if one. */
static void read_lse_opt(lua_State *L, int opts, int *want, sta_tensor **lse) {
  *want = 0;
  *lse = NULL;
  if (lua_istable(L, opts) && lua_getfield(L, opts, "lse") != LUA_TNIL) {
    if (lua_isboolean(L, -1)) *want = lua_toboolean(L, -1);
    else { *lse = sta_lua_check_tensor(L, -1, "lse"); *want = 1; }
  }
}

int sta_lua_push_outputs(lua_State *L, int opts, sta_tensor *q, sta_layout layout,
                         sta_tensor **out, sta_tensor **lse, int *want_lse) {
  const int top = lua_gettop(L);
  read_lse_opt(L, opts, want_lse, lse);
  lua_settop(L, top);
  if (sta_tensor_ndim(q) != 4)
    return sta_lua_misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
  int r = sta_lua_opt_or_like(L, opts, "out", q, out);
  if (r == 1 && *want_lse) r = sta_lua_push_lse(L, opts, q, layout, lse);
  return r;
}

/* attention(q, k, v [, opts]) -> out [, lse]; reference with ref = 1 */
static int attention_common(lua_State *L, int ref) {
  sta_tensor *q = sta_lua_check_tensor(L, 1, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 2, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 3, "v");
  sta_attention_desc d;
  lua_settop(L, 4);
  sta_lua_read_desc(L, 4, ref ? "reference" : "attention", q, &d); /* its windows stay */
  sta_tensor *lse, *out;
  int want_lse, r = sta_lua_push_outputs(L, 4, q, d.layout, &out, &lse, &want_lse);
  if (r != 1) return r;
  sta_status rc;
  if (ref) STA_LUA_LONG(rc, sta_attention_reference(&d, q, k, v, out, lse));
  else STA_LUA_LONG(rc, sta_attention_forward(&d, q, k, v, out, lse));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return want_lse ? 2 : 1;
}

/* attention_backward(q, k, v, out, lse, dout [, opts]) -> dq, dk, dv: the
** options of attention (the forward's), plus dq, dk, dv to write into */
static int l_attention_backward(lua_State *L) {
  static const char *N[6] = {"q", "k", "v", "out", "lse", "dout"};
  sta_tensor *t[6];
  for (int i = 0; i < 6; i++) t[i] = sta_lua_check_tensor(L, i + 1, N[i]);
  sta_attention_desc d;
  lua_settop(L, 7);
  sta_lua_read_desc(L, 7, "attention_backward", t[0], &d); /* d.windows' userdata stays on the stack */
  sta_tensor *g[3];
  static const char *G[3] = {"dq", "dk", "dv"};
  for (int i = 0; i < 3; i++) {
    int r = sta_lua_opt_or_like(L, 7, G[i], t[0], &g[i]);
    if (r != 1) return r;
  }
  sta_status rc;
  STA_LUA_LONG(rc, sta_attention_backward(&d, t[0], t[1], t[2], t[3], t[4], t[5], g[0], g[1], g[2]));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 3;
}

/* attention_fp8(q8, k8, v8, q_scale, k_scale, v_scale [, opts]) -> out
** [, lse]: sta_attention_forward_fp8, operands already in 8 bits (f8e4m3)
** with their scales (f32: per row [B, heads, S], per channel of v [B,
** heads, D]).  opts: those of attention (precision fp8 unless given), plus
** out, lse and dtype (of a new out: "f32", the default, "f16" or "bf16"). */
static int l_attention_fp8(lua_State *L) {
  static const char *N[6] = {"q8", "k8", "v8", "q_scale", "k_scale", "v_scale"};
  sta_tensor *t[6];
  for (int i = 0; i < 6; i++) t[i] = sta_lua_check_tensor(L, i + 1, N[i]);
  sta_attention_desc d;
  lua_settop(L, 7);
  sta_lua_read_desc(L, 7, "attention_fp8", t[0], &d);
  const int top = lua_gettop(L); /* d.windows' userdata stays below it */
  if (!sta_lua_str_field(L, 7, "precision")) d.precision = STA_PRECISION_FP8;
  const char *dt = sta_lua_str_field(L, 7, "dtype");
  const sta_dtype odt = dt ? sta_lua_parse_dtype(L, dt) : STA_F32;
  sta_tensor *lse;
  int want_lse;
  read_lse_opt(L, 7, &want_lse, &lse);
  lua_settop(L, top);
  if (sta_tensor_ndim(t[0]) != 4)
    return sta_lua_misuse(L, "q8: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(t[0]));
  sta_tensor *out;
  int r;
  if (lua_istable(L, 7) && lua_getfield(L, 7, "out") != LUA_TNIL) {
    out = sta_lua_check_tensor(L, -1, "out");
  } else {
    lua_settop(L, top);
    int64_t shape[4];
    for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(t[0], i);
    sta_lua_tensor *u;
    if ((r = sta_lua_push_new_tensor(L, odt, sta_tensor_device(t[0]), 4, shape, &u)) != 1) return r;
    out = u->t;
  }
  if (want_lse && (r = sta_lua_push_lse(L, 7, t[0], d.layout, &lse)) != 1) return r;
  sta_status rc;
  STA_LUA_LONG(rc, sta_attention_forward_fp8(&d, t[0], t[1], t[2], t[3], t[4], t[5], out, lse));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return want_lse ? 2 : 1;
}

static int l_attention(lua_State *L) { return attention_common(L, 0); }
static int l_reference(lua_State *L) { return attention_common(L, 1); }

/* flops{canvas=, tile=, text_len=, window=, batch=, seq_len=, heads=, head_dim=} */
static int l_flops(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  static const char *const keys[] = {"canvas", "tile", "text_len", "order", "geometry",
                                     "window", "batch", "seq_len", "heads", "head_dim", NULL};
  sta_lua_check_keys(L, 1, keys);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  if (!sta_lua_read_geometry(L, 1, &d.geom))
    return sta_lua_misuse(L, "canvas: expected {T, H, W}, got nil");
  d.windows = opts_windows(L, 1, &d.n_windows);
  int64_t seq = (int64_t)sta_lua_int_field(L, 1, "seq_len", sta_geometry_video_rows(&d.geom) +
                                                      (d.geom.text_len > 0 ? d.geom.text_len : 0));
  lua_pushnumber(L, sta_attention_flops(&d, (int64_t)sta_lua_int_field(L, 1, "batch", 1), seq,
                                        (int64_t)sta_lua_int_field(L, 1, "heads", 1),
                                        (int64_t)sta_lua_int_field(L, 1, "head_dim", 128)));
  return 1;
}

/* head_diff(a, b [, layout]) -> l1 list, l2 list (per head) */
static int l_head_diff(lua_State *L) {
  sta_tensor *a = sta_lua_check_tensor(L, 1, "a");
  sta_tensor *b = sta_lua_check_tensor(L, 2, "b");
  sta_layout layout = sta_lua_parse_layout(L, luaL_optstring(L, 3, "bshd"));
  if (sta_tensor_ndim(a) != 4)
    return sta_lua_misuse(L, "a: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(a));
  int64_t heads = sta_tensor_size(a, layout == STA_BSHD ? 2 : 1);
  float *l1 = lua_newuserdatauv(L, sizeof(float) * (size_t)(heads ? heads : 1), 0);
  float *l2 = lua_newuserdatauv(L, sizeof(float) * (size_t)(heads ? heads : 1), 0);
  sta_status rc = sta_head_diff(a, b, layout, l1, l2);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_createtable(L, (int)heads, 0);
  lua_createtable(L, (int)heads, 0);
  for (int64_t h = 0; h < heads; h++) {
    lua_pushnumber(L, l1[h]);
    lua_rawseti(L, -3, h + 1);
    lua_pushnumber(L, l2[h]);
    lua_rawseti(L, -2, h + 1);
  }
  return 2;
}
/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg attention_funcs[] = {
  {"attention", l_attention}, {"attention_fp8", l_attention_fp8}, {"reference", l_reference},
  {"attention_backward", l_attention_backward}, {"flops", l_flops},
  {"head_diff", l_head_diff}, {NULL, NULL}};

void sta_lua_open_attention(lua_State *L) { luaL_setfuncs(L, attention_funcs, 0); }
