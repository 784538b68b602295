/*
** layer.c -- the sta.Layer class of the Lua module: an STA layer that runs
** the live context's windows for its (step, layer, heads).
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- layers -------------------------------------------------------------- */

typedef struct { sta_layer *l; int vsa; } LLayer; /* vsa: mode = "vsa" */

static LLayer *check_ulayer(lua_State *L, int idx) {
  LLayer *u = luaL_testudata(L, idx, STA_LUA_LAYER);
  if (!u) sta_lua_misuse(L, "layer: expected a layer, got %s", luaL_typename(L, idx));
  if (!u->l) sta_lua_misuse(L, "layer: released");
  return u;
}

static sta_layer *check_layer(lua_State *L, int idx) { return check_ulayer(L, idx)->l; }

static int y_release(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, STA_LUA_LAYER);
  if (u->l) { sta_layer_destroy(u->l); u->l = NULL; }
  return 0;
}

/* layer{prefix= or layer=, heads=, head_dim=, sp_rank=, sp_size=, canvas=,
** tile=, text_len=, order=, layout=, device=, scale=, softmax=, precision=,
** strategy=}: the fields SP layers share, from the normalized options at
** opts (sta_lua_options) */
void sta_lua_layer_desc(lua_State *L, int opts, int pins, sta_layer_desc *d) {
  d->prefix = sta_lua_str_field(L, opts, "prefix");
  d->layer_index = sta_lua_int32_field(L, opts, "layer", 0);
  d->local_heads = sta_lua_int32_field(L, opts, "heads", 0);
  d->head_dim = sta_lua_int32_field(L, opts, "head_dim", 0);
  const char *dev = sta_lua_str_field(L, opts, "device");
  d->backend = dev ? sta_lua_parse_device(L, dev, "device") : STA_CPU;
  d->scale = (float)sta_lua_num_field(L, opts, "scale", 0); /* 0: the core's 1/sqrt(D) */
  d->softmax = sta_lua_parse_softmax(L, sta_lua_str_field(L, opts, "softmax"));
  d->precision = sta_lua_parse_precision(L, sta_lua_str_field(L, opts, "precision"));
  if (lua_getfield(L, opts, "strategy") != LUA_TNIL) {
    d->strategy = sta_lua_check_strategy(L, -1);
    lua_setfield(L, pins, "strategy");
  } else lua_pop(L, 1);
  if (d->prefix) {
    lua_getfield(L, opts, "prefix");
    lua_setfield(L, pins, "prefix");
  }
}

static int l_layer(lua_State *L) {
  lua_settop(L, 1);
  sta_lua_options(L, 1, "layer");
  lua_createtable(L, 0, 2); /* 2: pins */
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  sta_lua_layer_desc(L, 1, 2, &d);
  d.sp_rank = sta_lua_int32_field(L, 1, "sp_rank", 0);
  d.sp_size = sta_lua_int32_field(L, 1, "sp_size", 1);
  sta_lua_read_geometry(L, 1, &d.geom);
  d.layout = sta_lua_parse_layout(L, sta_lua_str_field(L, 1, "layout"));
  const char *mode = sta_lua_str_field(L, 1, "mode");
  d.mode = mode && strcmp(mode, "vsa") == 0 ? STA_LAYER_VSA : STA_LAYER_STA;
  if (lua_getfield(L, 1, "cube") != LUA_TNIL) sta_lua_int_list(L, -1, d.cube, 3, "cube");
  lua_pop(L, 1);
  d.dense_steps = sta_lua_int32_field(L, 1, "dense_steps", 0);
  LLayer *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->l = NULL;
  u->vsa = d.mode == STA_LAYER_VSA;
  luaL_setmetatable(L, STA_LUA_LAYER);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  sta_status rc = sta_layer_create(&u->l, &d);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* A VSA layer's forward (y_forward, from its checked arguments): the
** core's with no gate and no lse wanted; else the VSA the layer resolves
** for the live context, run with the gate (opts.gate), and used: the
** options of sta.vsa_backward that reproduce it (gate included). */
static int vsa_forward(lua_State *L, sta_layer *l, sta_tensor *const *qkv, sta_tensor *out,
                       sta_tensor *lse, int iout, int want_lse) {
  sta_tensor *gate = NULL;
  int igate = 0;
  if (lua_istable(L, 5) && lua_getfield(L, 5, "gate") != LUA_TNIL) {
    gate = sta_lua_check_tensor(L, -1, "gate");
    igate = lua_gettop(L);
  }
  sta_status rc;
  sta_context *c = sta_lua_context_enter(L);
  if (!want_lse && !gate) {
    STA_LUA_LONG(rc, sta_layer_forward_lse(l, qkv[0], qkv[1], qkv[2], out, NULL));
    sta_lua_context_leave(c);
    lua_pushvalue(L, iout);
    return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
  }
  sta_vsa_desc d;
  int32_t canvas[3], cube[3];
  rc = sta_layer_resolve_vsa(l, qkv[0], &d, canvas, cube);
  if (rc == STA_OK) STA_LUA_LONG(rc, sta_vsa_forward(&d, qkv[0], qkv[1], qkv[2], gate, out, lse));
  sta_lua_context_leave(c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, iout);
  if (!want_lse) return 1;
  lua_pushvalue(L, iout + 1);
  sta_lua_push_vsa(L, &d, canvas, cube, igate);
  return 3;
}

/* layer:forward(q, k, v [, out | {out =, lse = true | tensor, gate =}]) ->
** out [, lse, used].  With lse, used records what the forward ran (STA.md
** section 10): the options of sta.attention_backward (canvas, tile,
** text_len, order, layout, one window per head, scale, softmax,
** precision), of sta.vsa_backward for a VSA layer (canvas, cube, the
** step's topk, layout, scale, gate), or for a search row {search = why it
** has no backward}.  layer:backward takes it, so the backward uses the
** forward's windows (or topk) whatever the context, the strategy or the
** layer hold by then.  gate: VSA layers only. */
static int y_forward(lua_State *L) {
  LLayer *ul = check_ulayer(L, 1);
  sta_layer *l = ul->l;
  sta_tensor *q = sta_lua_check_tensor(L, 2, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 3, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 4, "v");
  sta_tensor *out = NULL, *lse = NULL;
  int want_lse = 0, r;
  lua_settop(L, 5);
  if (lua_istable(L, 5)) {
    sta_lua_options(L, 5, "layer_forward");
    if (lua_getfield(L, 5, "out") != LUA_TNIL) out = sta_lua_check_tensor(L, -1, "out");
    if (lua_getfield(L, 5, "lse") != LUA_TNIL) {
      if (lua_isboolean(L, -1)) want_lse = lua_toboolean(L, -1);
      else { lse = sta_lua_check_tensor(L, -1, "lse"); want_lse = 1; }
    }
    lua_settop(L, 5);
  } else if (!lua_isnil(L, 5)) {
    out = sta_lua_check_tensor(L, 5, "out");
  }
  if (out && lua_istable(L, 5)) lua_getfield(L, 5, "out");
  else if (out) lua_pushvalue(L, 5);
  else if ((r = sta_lua_push_like(L, q, &out)) != 1) return r;
  const int iout = lua_gettop(L);
  if (want_lse) {
    if (lse) lua_getfield(L, 5, "lse");
    else {
      if (sta_tensor_ndim(q) != 4)
        return sta_lua_misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
      int bshd = sta_layer_layout(l) == STA_BSHD;
      int64_t shape[3] = {sta_tensor_size(q, 0), sta_tensor_size(q, bshd ? 2 : 1),
                          sta_tensor_size(q, bshd ? 1 : 2)};
      sta_lua_tensor *u;
      if ((r = sta_lua_push_new_tensor(L, STA_F32, sta_tensor_device(q), 3, shape, &u)) != 1)
        return r;
      lse = u->t;
    }
  }
  if (ul->vsa) {
    sta_tensor *qkv[3] = {q, k, v};
    return vsa_forward(L, l, qkv, out, lse, iout, want_lse);
  }
  if (lua_istable(L, 5) && lua_getfield(L, 5, "gate") != LUA_TNIL)
    return sta_lua_misuse(L, "gate: an STA layer takes no gate (a layer of mode \"vsa\" does)");
  sta_status rc;
  sta_context *c = sta_lua_context_enter(L);
  if (!want_lse) {
    STA_LUA_LONG(rc, sta_layer_forward_lse(l, q, k, v, out, NULL));
    sta_lua_context_leave(c);
    return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
  }
  /* the descriptor first, then the forward with exactly it (a search row:
  ** the layer's own forward, and a record that it has no backward) */
  sta_attention_desc d;
  const int64_t hl = sta_tensor_ndim(q) == 4 ? sta_tensor_size(q, sta_layer_layout(l) == STA_BSHD
                                                                     ? 2 : 1) : 1;
  int32_t *wins = lua_newuserdatauv(L, sizeof(int32_t) * 3 * (size_t)(hl > 0 ? hl : 1), 0);
  sta_status rd = sta_layer_resolve(l, q, &d, wins);
  if (rd == STA_OK) STA_LUA_LONG(rc, sta_attention_forward(&d, q, k, v, out, lse));
  else if (rd == STA_ERR_UNSUPPORTED) {
    lua_pushstring(L, sta_last_error()); /* why it has no backward */
    STA_LUA_LONG(rc, sta_layer_forward_lse(l, q, k, v, out, lse));
  } else rc = rd;
  sta_lua_context_leave(c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  if (rd == STA_OK) sta_lua_push_desc(L, &d);
  else {
    lua_createtable(L, 0, 1);
    lua_insert(L, -2);
    lua_setfield(L, -2, "search");
  }
  lua_pushvalue(L, iout);
  lua_pushvalue(L, iout + 1); /* lse */
  lua_rotate(L, -3, -1);      /* out, lse, used */
  return 3;
}

/* layer:backward(q, k, v, out, lse, dout, used [, {dq =, dk =, dv =,
** dgate =}]) -> dq, dk, dv [, dgate]: the gradients of the forward that
** returned out, lse and used (sta_attention_backward, or sta_vsa_backward
** for a VSA layer, with used: no context needed, nothing looked up again;
** dgate when that forward had a gate) */
static int y_backward(lua_State *L) {
  static const char *N[6] = {"q", "k", "v", "out", "lse", "dout"}, *G[3] = {"dq", "dk", "dv"};
  LLayer *ul = check_ulayer(L, 1);
  sta_tensor *t[6], *g[3];
  for (int i = 0; i < 6; i++) t[i] = sta_lua_check_tensor(L, i + 2, N[i]);
  lua_settop(L, 9);
  if (!lua_istable(L, 8))
    return sta_lua_misuse(L, "used: expected the third result of layer:forward(q, k, v, {lse = "
                             "true}), got %s", luaL_typename(L, 8));
  if (lua_getfield(L, 8, "search") != LUA_TNIL) return lua_error(L);
  lua_pop(L, 1);
  sta_lua_options(L, 9, "layer_backward");
  if (ul->vsa) {
    sta_vsa_desc vd;
    sta_tensor *gate;
    sta_lua_read_vsa(L, 8, "vsa_backward", t[0], t[1], &vd, &gate);
    return sta_lua_vsa_backward(L, &vd, t, gate, 9);
  }
  if (lua_getfield(L, 9, "dgate") != LUA_TNIL)
    return sta_lua_misuse(L, "dgate: an STA layer has no gate");
  lua_pop(L, 1);
  sta_attention_desc d;
  sta_lua_read_desc(L, 8, "attention_backward", t[0], &d); /* its windows stay on the stack */
  for (int i = 0; i < 3; i++) {
    if (lua_getfield(L, 9, G[i]) != LUA_TNIL) {
      g[i] = sta_lua_check_tensor(L, -1, G[i]);
      continue;
    }
    lua_pop(L, 1);
    int r = sta_lua_push_like(L, t[0], &g[i]);
    if (r != 1) return r;
  }
  sta_status rc;
  STA_LUA_LONG(rc, sta_attention_backward(&d, t[0], t[1], t[2], t[3], t[4], t[5], g[0], g[1], g[2]));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 3;
}

static int y_index(lua_State *L) {
  lua_pushinteger(L, sta_layer_index(check_layer(L, 1)));
  return 1;
}

int sta_lua_layer_set_strategy(lua_State *L, sta_layer *l) {
  const sta_strategy *s = lua_isnoneornil(L, 2) ? NULL : sta_lua_check_strategy(L, 2);
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "strategy");
  sta_layer_set_strategy(l, s);
  lua_settop(L, 1);
  return 1;
}

static int y_set_strategy(lua_State *L) {
  return sta_lua_layer_set_strategy(L, check_layer(L, 1));
}

static int y_tostring(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, STA_LUA_LAYER);
  if (!u->l) lua_pushliteral(L, "sta.Layer(released)");
  else lua_pushfstring(L, "sta.Layer(%d)", (int)sta_layer_index(u->l));
  return 1;
}

static int l_layer_index_from_prefix(lua_State *L) {
  int32_t i;
  sta_status rc = sta_layer_index_from_prefix(luaL_checkstring(L, 1), &i);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushinteger(L, i);
  return 1;
}
/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg layer_meta[] = {
  {"__gc", y_release}, {"__close", y_release}, {"__tostring", y_tostring}, {NULL, NULL}};
static const luaL_Reg layer_methods[] = {
  {"release", y_release}, {"forward", y_forward}, {"backward", y_backward},
  {"index", y_index},
  {"set_strategy", y_set_strategy}, {NULL, NULL}};
static const luaL_Reg layer_funcs[] = {
  {"layer", l_layer}, {"layer_index_from_prefix", l_layer_index_from_prefix}, {NULL, NULL}};

void sta_lua_open_layer(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_LAYER, layer_meta, layer_methods, 1);
  luaL_setfuncs(L, layer_funcs, 0);
}
