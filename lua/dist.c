/*
** dist.c -- the Lua binding of sta.h's sequence parallelism section,
** built into sta/core.so with the other C files of lua/ and opened by
** lua/sta/dist.lua through package.loadlib(..., "luaopen_sta_dist").  Low-level entry
** points (names starting with "_") take already-normalized arguments:
** dist.lua builds the geometry (sta.Geometry) and makes output tensors
** with sta.core, then calls them.
**
** Errors follow sta_lua.h's one policy: misuse raises the exact message
** (also no NCCL library or no GPU for NCCL, STA_ERR_BACKEND, as "st attn
** not supported" is); failures of the environment (out of memory, device
** and NCCL failures, files) return nil, message, code.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

#define MAXRANKS 64

typedef struct { sta_comm *c; } LComm;
typedef struct { sta_sp_layer *l; } LSPLayer;

static sta_comm *check_comm(lua_State *L, int idx) {
  LComm *u = luaL_testudata(L, idx, STA_LUA_COMM);
  if (!u) sta_lua_misuse(L, "comm: expected a communicator, got %s", luaL_typename(L, idx));
  if (!u->c) sta_lua_misuse(L, "comm: released");
  return u->c;
}

/* ---- communicators ----------------------------------------------------------- */

static LComm *push_comm(lua_State *L) {
  LComm *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->c = NULL;
  luaL_setmetatable(L, STA_LUA_COMM);
  return u;
}

static int comm_release(lua_State *L) {
  LComm *u = luaL_checkudata(L, 1, STA_LUA_COMM);
  if (u->c) {
    sta_comm_destroy(u->c);
    u->c = NULL;
  }
  return 0;
}

/* loopback(P) -> {comm rank 0, ..., comm rank P-1} */
static int d_loopback(lua_State *L) {
  lua_Integer p = luaL_checkinteger(L, 1);
  sta_comm *cs[MAXRANKS];
  sta_status rc = sta_comm_loopback(cs, p < -1 || p > MAXRANKS + 1 ? -1 : (int32_t)p);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_createtable(L, (int)p, 0);
  for (int32_t r = 0; r < (int32_t)p; r++) {
    push_comm(L)->c = cs[r];
    lua_rawseti(L, -2, r + 1);
  }
  return 1;
}

/* _init(nil) from the environment, or _init(rank, size, id_file, device,
** backend) with backend "nccl" (default) or "tcp"; id_file: a path or
** tcp://HOST:PORT */
static int d_init(lua_State *L) {
  LComm *u;
  sta_status rc;
  if (lua_isnoneornil(L, 1)) {
    u = push_comm(L);
    rc = sta_comm_from_env(&u->c);
  } else {
    int32_t rank = sta_lua_check_int32(L, 1, "rank"), size = sta_lua_check_int32(L, 2, "size");
    const char *id = luaL_optstring(L, 3, NULL);
    int32_t dev = sta_lua_opt_int32(L, 4, "device", -1);
    const char *be = luaL_optstring(L, 5, "nccl");
    if (strcmp(be, "nccl") != 0 && strcmp(be, "tcp") != 0)
      return sta_lua_misuse(L, "backend: expected \"nccl\" or \"tcp\", got '%s'", be);
    u = push_comm(L);
    rc = strcmp(be, "tcp") == 0 ? sta_comm_tcp(&u->c, rank, size, id)
                                : sta_comm_nccl(&u->c, rank, size, id, dev);
  }
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* _env() -> rank, size, local_rank, launcher name (nil: none) */
static int d_env(lua_State *L) {
  static const char *const names[] = {NULL, "sta-launch", "torchrun", "mpirun", "srun"};
  int32_t r, n, l, f;
  sta_status rc = sta_comm_env(&r, &n, &l, &f);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushinteger(L, r);
  lua_pushinteger(L, n);
  lua_pushinteger(L, l);
  if (f > 0 && f < 5) lua_pushstring(L, names[f]);
  else lua_pushnil(L);
  return 4;
}

/* comm:set_chunks(n) -> comm;  comm:chunks() -> n (0: chosen per call) */
static int comm_set_chunks(lua_State *L) {
  sta_comm *c = check_comm(L, 1);
  sta_status rc = sta_comm_set_chunks(c, sta_lua_check_int32(L, 2, "n"));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}
static int comm_chunks(lua_State *L) {
  lua_pushinteger(L, sta_comm_chunks(check_comm(L, 1)));
  return 1;
}

static int comm_rank(lua_State *L) {
  lua_pushinteger(L, sta_comm_rank(check_comm(L, 1)));
  return 1;
}
static int comm_size(lua_State *L) {
  lua_pushinteger(L, sta_comm_size(check_comm(L, 1)));
  return 1;
}
static int comm_name(lua_State *L) {
  lua_pushstring(L, sta_comm_name(check_comm(L, 1)));
  return 1;
}
static int comm_barrier(lua_State *L) {
  sta_status rc = sta_comm_barrier(check_comm(L, 1));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}
/* comm:all_to_all(send, recv) / comm:all_gather(send, recv) -> recv */
static int collective(lua_State *L, int gather) {
  sta_comm *c = check_comm(L, 1);
  sta_tensor *send = sta_lua_check_tensor(L, 2, "send"), *recv = sta_lua_check_tensor(L, 3, "recv");
  sta_status rc = gather ? sta_comm_all_gather(c, send, recv) : sta_comm_all_to_all(c, send, recv);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 3);
  return 1;
}
static int comm_all_to_all(lua_State *L) { return collective(L, 0); }
static int comm_all_gather(lua_State *L) { return collective(L, 1); }
static int comm_tostring(lua_State *L) {
  LComm *u = luaL_checkudata(L, 1, STA_LUA_COMM);
  if (!u->c) lua_pushliteral(L, "sta.Comm(released)");
  else
    lua_pushfstring(L, "sta.Comm(%s, rank %d of %d)", sta_comm_name(u->c),
                    (int)sta_comm_rank(u->c), (int)sta_comm_size(u->c));
  return 1;
}

/* ---- SP attention ------------------------------------------------------------------ */

static void attention_desc(lua_State *L, int gi, int wi, int li, int si,
                           sta_attention_desc *d) {
  memset(d, 0, sizeof *d);
  d->geom = *sta_lua_check_geometry(L, gi);
  d->windows = sta_lua_windows(L, wi, &d->n_windows); /* pinned on the stack */
  d->layout = sta_lua_parse_layout(L, luaL_optstring(L, li, NULL));
  d->scale = (float)luaL_optnumber(L, si, 0);
}

/* _attention(comm, geometry, windows, layout, scale, q, k, v, out) -> out */
static int d_attention(lua_State *L) {
  sta_comm *c = check_comm(L, 1);
  sta_attention_desc d;
  attention_desc(L, 2, 3, 4, 5, &d);
  sta_status rc =
      sta_sp_attention(c, &d, sta_lua_check_tensor(L, 6, "q"), sta_lua_check_tensor(L, 7, "k"),
                       sta_lua_check_tensor(L, 8, "v"), sta_lua_check_tensor(L, 9, "out"));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, 9);
  return 1;
}

/* _shard(local, full, geometry, layout, rank, size, unshard) */
static int d_shard(lua_State *L) {
  sta_tensor *local = sta_lua_check_tensor(L, 1, "local"),
             *full = sta_lua_check_tensor(L, 2, "full");
  sta_geometry *g = sta_lua_check_geometry(L, 3);
  sta_layout layout = sta_lua_parse_layout(L, luaL_optstring(L, 4, NULL));
  int32_t rank = sta_lua_check_int32(L, 5, "rank"), size = sta_lua_check_int32(L, 6, "size");
  sta_status rc = lua_toboolean(L, 7) ? sta_sp_unshard(full, local, g, layout, rank, size)
                                      : sta_sp_shard(local, full, g, layout, rank, size);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, lua_toboolean(L, 7) ? 2 : 1);
  return 1;
}

/* ---- loopback runs: one thread per rank ---------------------------------------------- */

typedef struct run {
  sta_attention_desc desc;
  sta_sp_layer *layers[MAXRANKS];
  sta_tensor *q[MAXRANKS], *k[MAXRANKS], *v[MAXRANKS], *o[MAXRANKS];
  /* the caller's live context, replayed on every rank's thread */
  int32_t step;
  sta_metadata *md;
  sta_forward_batch *fb;
} run;

static sta_status run_attention_rank(void *arg, int32_t r, sta_comm *c) {
  run *j = arg;
  return sta_sp_attention(c, &j->desc, j->q[r], j->k[r], j->v[r], j->o[r]);
}

static sta_status run_layer_rank(void *arg, int32_t r, sta_comm *c) {
  run *j = arg;
  sta_context *ctx = NULL;
  (void)c;
  sta_status rc = sta_context_push(&ctx, j->step, j->md, j->fb);
  if (rc != STA_OK) return rc;
  rc = sta_sp_layer_forward(j->layers[r], j->q[r], j->k[r], j->v[r], j->o[r]);
  sta_status rc2 = sta_context_pop(ctx);
  return rc != STA_OK ? rc : rc2;
}

/* The list at idx: n entries, each checked by get. */
static int32_t list_len(lua_State *L, int idx, const char *name, int32_t want) {
  if (!lua_istable(L, idx))
    sta_lua_misuse(L, "%s: expected a list, got %s", name, luaL_typename(L, idx));
  int32_t n = (int32_t)luaL_len(L, idx);
  if (want >= 0 && n != want)
    sta_lua_misuse(L, "%s: expected %d entries (one per rank), got %d", name, (int)want, (int)n);
  return n;
}

static void tensors_of(lua_State *L, int idx, const char *name, int32_t n, sta_tensor **out) {
  list_len(L, idx, name, n);
  for (int32_t r = 0; r < n; r++) {
    char nm[32];
    snprintf(nm, sizeof nm, "%s[%d]", name, (int)r + 1);
    lua_geti(L, idx, r + 1);
    out[r] = sta_lua_check_tensor(L, -1, nm);
    lua_pop(L, 1); /* kept alive by the list */
  }
}

static int32_t comms_of(lua_State *L, int idx, sta_comm **cs) {
  int32_t n = list_len(L, idx, "comms", -1);
  if (n < 1 || n > MAXRANKS)
    sta_lua_misuse(L, "comms: expected 1..%d communicators, got %d", MAXRANKS, (int)n);
  for (int32_t r = 0; r < n; r++) {
    lua_geti(L, idx, r + 1);
    cs[r] = check_comm(L, -1);
    lua_pop(L, 1);
  }
  return n;
}

/* _run_attention(comms, geometry, windows, layout, scale, qs, ks, vs, outs) -> outs */
static int d_run_attention(lua_State *L) {
  sta_comm *cs[MAXRANKS];
  int32_t n = comms_of(L, 1, cs);
  run *j = lua_newuserdatauv(L, sizeof *j, 0);
  memset(j, 0, sizeof *j);
  attention_desc(L, 2, 3, 4, 5, &j->desc);
  tensors_of(L, 6, "q", n, j->q);
  tensors_of(L, 7, "k", n, j->k);
  tensors_of(L, 8, "v", n, j->v);
  tensors_of(L, 9, "out", n, j->o);
  sta_status rc;
  STA_LUA_LONG(rc, sta_comm_loopback_run(cs, n, run_attention_rank, j));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, 9);
  return 1;
}

/* ---- SP layers ----------------------------------------------------------------------- */

static sta_sp_layer *check_splayer(lua_State *L, int idx) {
  LSPLayer *u = luaL_testudata(L, idx, STA_LUA_SPLAYER);
  if (!u) sta_lua_misuse(L, "layer: expected an SP layer, got %s", luaL_typename(L, idx));
  if (!u->l) sta_lua_misuse(L, "layer: released");
  return u->l;
}

static int sp_release(lua_State *L) {
  LSPLayer *u = luaL_checkudata(L, 1, STA_LUA_SPLAYER);
  if (u->l) {
    sta_sp_layer_destroy(u->l);
    u->l = NULL;
  }
  return 0;
}

/* _layer(comm, geometry, layout, {prefix=, layer=, heads=, head_dim=,
** backend=, scale=, strategy=}) -> SP layer.  heads: per rank. */
static int d_layer(lua_State *L) {
  sta_comm *c = check_comm(L, 1);
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.geom = *sta_lua_check_geometry(L, 2);
  d.layout = sta_lua_parse_layout(L, luaL_optstring(L, 3, NULL));
  luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  lua_createtable(L, 0, 4); /* 5: pins: comm, strategy, prefix; layout */
  lua_pushvalue(L, 1);
  lua_setfield(L, 5, "comm");
  lua_pushinteger(L, d.layout);
  lua_setfield(L, 5, "layout");
  sta_lua_layer_desc(L, 4, 5, &d);
  LSPLayer *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->l = NULL;
  luaL_setmetatable(L, STA_LUA_SPLAYER);
  lua_pushvalue(L, 5);
  lua_setiuservalue(L, -2, 1);
  sta_status rc = sta_sp_layer_create(&u->l, c, &d);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* layer:_forward(q, k, v, out) -> out */
static int sp_forward(lua_State *L) {
  sta_sp_layer *l = check_splayer(L, 1);
  sta_tensor *q = sta_lua_check_tensor(L, 2, "q"), *k = sta_lua_check_tensor(L, 3, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 4, "v"), *out = sta_lua_check_tensor(L, 5, "out");
  sta_context *c = sta_lua_context_enter(L);
  sta_status rc;
  STA_LUA_LONG(rc, sta_sp_layer_forward(l, q, k, v, out));
  sta_lua_context_leave(c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, 5);
  return 1;
}

static int sp_index(lua_State *L) {
  lua_pushinteger(L, sta_layer_index(sta_sp_layer_base(check_splayer(L, 1))));
  return 1;
}

static int sp_set_strategy(lua_State *L) {
  return sta_lua_layer_set_strategy(L, sta_sp_layer_base(check_splayer(L, 1)));
}

static int sp_tostring(lua_State *L) {
  LSPLayer *u = luaL_checkudata(L, 1, STA_LUA_SPLAYER);
  if (!u->l) lua_pushliteral(L, "sta.SPLayer(released)");
  else lua_pushfstring(L, "sta.SPLayer(%d)", (int)sta_layer_index(sta_sp_layer_base(u->l)));
  return 1;
}

/* _run_layers(comms, layers, qs, ks, vs, outs) -> outs, replaying the
** caller's live context on every rank's thread.  Search rows would record
** from several threads into one forward batch: refused. */
static int d_run_layers(lua_State *L) {
  sta_comm *cs[MAXRANKS];
  int32_t n = comms_of(L, 1, cs);
  run *j = lua_newuserdatauv(L, sizeof *j, 0);
  memset(j, 0, sizeof *j);
  list_len(L, 2, "layers", n);
  for (int32_t r = 0; r < n; r++) {
    lua_geti(L, 2, r + 1);
    j->layers[r] = check_splayer(L, -1);
    lua_pop(L, 1);
  }
  tensors_of(L, 3, "q", n, j->q);
  tensors_of(L, 4, "k", n, j->k);
  tensors_of(L, 5, "v", n, j->v);
  tensors_of(L, 6, "out", n, j->o);
  sta_context *entered = sta_lua_context_enter(L), *ctx = sta_context_current();
  if (ctx) { /* md and fb stay alive: the Lua context (or C's) holds them */
    j->step = sta_context_step(ctx);
    j->md = sta_context_metadata(ctx);
    j->fb = sta_context_batch(ctx);
  }
  sta_lua_context_leave(entered);
  if (!ctx)
    return sta_lua_misuse(L, "STA forward called outside a forward context (no context is live)");
  if (j->md) {
    int32_t idx = sta_layer_index(sta_sp_layer_base(j->layers[0])), nw = 0;
    const int32_t *row = NULL;
    lua_geti(L, 2, 1);
    lua_getiuservalue(L, -1, 1);
    lua_getfield(L, -1, "layout");
    int hdim = lua_tointeger(L, -1) == STA_BSHD ? 2 : 1;
    lua_pop(L, 3);
    lua_Integer heads = sta_tensor_ndim(j->q[0]) == 4 ? sta_tensor_size(j->q[0], hdim) : 0;
    if (idx < sta_metadata_layers(j->md) &&
        sta_metadata_row(j->md, idx, &nw, &row) == STA_OK && nw > 0 && nw < heads) {
        return sta_lua_misuse(L, "loopback: layer %d's row holds %d candidate windows (a search "
                    "row); search records need one rank per process", (int)idx, (int)nw);
    }
  }
  sta_status rc;
  STA_LUA_LONG(rc, sta_comm_loopback_run(cs, n, run_layer_rank, j));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushvalue(L, 6);
  return 1;
}

/* ---- registration ---------------------------------------------------------------------- */

static const luaL_Reg comm_meta[] = {
  {"__gc", comm_release}, {"__close", comm_release}, {"__tostring", comm_tostring}, {NULL, NULL}};
static const luaL_Reg comm_methods[] = {
  {"release", comm_release}, {"rank", comm_rank}, {"size", comm_size}, {"name", comm_name},
  {"barrier", comm_barrier}, {"all_to_all", comm_all_to_all}, {"all_gather", comm_all_gather},
  {"set_chunks", comm_set_chunks}, {"chunks", comm_chunks}, {NULL, NULL}};
static const luaL_Reg splayer_meta[] = {
  {"__gc", sp_release}, {"__close", sp_release}, {"__tostring", sp_tostring}, {NULL, NULL}};
static const luaL_Reg splayer_methods[] = {
  {"release", sp_release}, {"_forward", sp_forward}, {"index", sp_index},
  {"set_strategy", sp_set_strategy}, {NULL, NULL}};

static const luaL_Reg dist_funcs[] = {
  {"loopback", d_loopback}, {"_init", d_init}, {"_env", d_env}, {"_attention", d_attention},
  {"_shard", d_shard}, {"_run_attention", d_run_attention}, {"_layer", d_layer},
  {"_run_layers", d_run_layers}, {NULL, NULL}};

int luaopen_sta_dist(lua_State *L);
int luaopen_sta_dist(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_COMM, comm_meta, comm_methods, 1);
  sta_lua_new_class(L, STA_LUA_SPLAYER, splayer_meta, splayer_methods, 1);
  luaL_newlib(L, dist_funcs);
  return 1;
}
