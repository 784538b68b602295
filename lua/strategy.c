/*
** strategy.c -- the sta.Strategy (FastVideo mask strategy: a window per
** step, layer and head) and sta.Metadata (one step's window table) classes
** of the Lua module.
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- strategies ---------------------------------------------------------- */

sta_lua_strategy *sta_lua_new_strategy(lua_State *L) {
  sta_lua_strategy *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->s = NULL;
  luaL_setmetatable(L, STA_LUA_STRATEGY);
  return u;
}

sta_strategy *sta_lua_check_strategy(lua_State *L, int idx) {
  sta_lua_strategy *u = luaL_testudata(L, idx, STA_LUA_STRATEGY);
  if (!u) sta_lua_misuse(L, "strategy: expected a strategy, got %s", luaL_typename(L, idx));
  if (!u->s) sta_lua_misuse(L, "strategy: released");
  return u->s;
}

static int s_release(lua_State *L) {
  sta_lua_strategy *u = luaL_checkudata(L, 1, STA_LUA_STRATEGY);
  if (u->s) { sta_strategy_destroy(u->s); u->s = NULL; }
  return 0;
}

static int l_strategy_new(lua_State *L) {
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_strategy_create(&u->s);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int l_strategy_parse(lua_State *L) {
  size_t len;
  const char *json = luaL_checklstring(L, 1, &len);
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_strategy_parse(&u->s, json, len);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int l_strategy_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_strategy_load(&u->s, path);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int l_strategy_default(lua_State *L) {
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_strategy_load_default(&u->s);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* uniform{steps=, layers=, heads=, window=, full=, full_steps=} (sta.options) */
static int l_strategy_uniform(lua_State *L) {
  lua_settop(L, 1);
  sta_lua_options(L, 1, "uniform");
  int32_t w[3], full[3];
  int have_full = 0;
  lua_getfield(L, 1, "window");
  if (lua_istable(L, -1)) { /* one window for every head */
    lua_geti(L, -1, 1);
    if (lua_istable(L, -1)) sta_lua_misuse(L, "window: expected one window {Kt, Kh, Kw}, got a list");
    lua_pop(L, 1);
  }
  sta_lua_int_list(L, -1, w, 3, "window");
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "full") != LUA_TNIL) {
    sta_lua_int_list(L, -1, full, 3, "full");
    have_full = 1;
  }
  lua_pop(L, 1);
  int32_t steps = sta_lua_int32_field(L, 1, "steps", 0);
  int32_t layers = sta_lua_int32_field(L, 1, "layers", 0);
  int32_t heads = sta_lua_int32_field(L, 1, "heads", 0);
  int32_t full_steps = sta_lua_int32_field(L, 1, "full_steps", 0);
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_strategy_uniform(&u->s, steps, layers, heads, w, have_full ? full : NULL,
                                       full_steps);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int s_get(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  int32_t w[3];
  sta_status rc =
      sta_strategy_get(s, sta_lua_check_int32(L, 2, "step"), sta_lua_check_int32(L, 3, "layer"),
                       sta_lua_check_int32(L, 4, "head"), w);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_push_ints(L, w, 3);
  return 1;
}

static int s_set(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  int32_t w[3];
  sta_lua_int_list(L, 5, w, 3, "window");
  sta_status rc =
      sta_strategy_set(s, sta_lua_check_int32(L, 2, "step"), sta_lua_check_int32(L, 3, "layer"),
                       sta_lua_check_int32(L, 4, "head"), w);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int s_save(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  sta_status rc = sta_strategy_save(s, luaL_checkstring(L, 2));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int s_to_json(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  char *json = NULL;
  sta_status rc = sta_strategy_to_json(s, &json);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushstring(L, json);
  sta_free(json);
  return 1;
}

static int s_count(lua_State *L) {
  lua_pushinteger(L, sta_strategy_count(sta_lua_check_strategy(L, 1)));
  return 1;
}

static int s_extent(lua_State *L) {
  int32_t a, b, c;
  sta_strategy_extent(sta_lua_check_strategy(L, 1), &a, &b, &c);
  lua_pushinteger(L, a);
  lua_pushinteger(L, b);
  lua_pushinteger(L, c);
  return 3;
}

static int s_check(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  sta_status rc =
      sta_strategy_check(s, sta_lua_check_int32(L, 2, "steps"), sta_lua_check_int32(L, 3, "layers"),
                         sta_lua_check_int32(L, 4, "heads"));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* s:sparsity(grid {NT,NH,NW} or geometry) */
static int s_sparsity(lua_State *L) {
  sta_strategy *s = sta_lua_check_strategy(L, 1);
  int32_t grid[3];
  sta_geometry *g = luaL_testudata(L, 2, STA_LUA_GEOMETRY);
  if (g) sta_geometry_grid(g, grid);
  else sta_lua_int_list(L, 2, grid, 3, "grid");
  double sp;
  sta_status rc = sta_strategy_sparsity(s, grid, &sp);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushnumber(L, sp);
  return 1;
}

static int s_equal(lua_State *L) {
  lua_pushboolean(L,
                  sta_strategy_equal(sta_lua_check_strategy(L, 1), sta_lua_check_strategy(L, 2)));
  return 1;
}

static int s_tostring(lua_State *L) {
  sta_lua_strategy *u = luaL_checkudata(L, 1, STA_LUA_STRATEGY);
  if (!u->s) { lua_pushliteral(L, "sta.Strategy(released)"); return 1; }
  int32_t a, b, c;
  sta_strategy_extent(u->s, &a, &b, &c);
  lua_pushfstring(L, "sta.Strategy(%d entries, %d steps x %d layers x %d heads)",
                  (int)sta_strategy_count(u->s), a, b, c);
  return 1;
}

/* ---- metadata ------------------------------------------------------------ */

typedef struct { sta_metadata *m; } LMetadata;

static LMetadata *new_metadata_ud(lua_State *L) {
  LMetadata *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->m = NULL;
  luaL_setmetatable(L, STA_LUA_METADATA);
  return u;
}

sta_metadata *sta_lua_check_metadata(lua_State *L, int idx) {
  LMetadata *u = luaL_testudata(L, idx, STA_LUA_METADATA);
  if (!u) sta_lua_misuse(L, "metadata: expected metadata, got %s", luaL_typename(L, idx));
  if (!u->m) sta_lua_misuse(L, "metadata: released");
  return u->m;
}

static int m_release(lua_State *L) {
  LMetadata *u = luaL_checkudata(L, 1, STA_LUA_METADATA);
  if (u->m) { sta_metadata_destroy(u->m); u->m = NULL; }
  return 0;
}

static int l_metadata_new(lua_State *L) {
  int32_t layers = sta_lua_check_int32(L, 1, "layers");
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_create(&u->m, layers);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

static int m_set_row(lua_State *L) { /* md:set_row(layer, {{..}, ...}) */
  sta_metadata *m = sta_lua_check_metadata(L, 1);
  int32_t layer = sta_lua_check_int32(L, 2, "layer"), n;
  int32_t *w = sta_lua_window_list(L, 3, &n, "windows");
  sta_status rc = sta_metadata_set_row(m, layer, n, w);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int m_row(lua_State *L) {
  sta_metadata *m = sta_lua_check_metadata(L, 1);
  int32_t n;
  const int32_t *w;
  sta_status rc = sta_metadata_row(m, sta_lua_check_int32(L, 2, "layer"), &n, &w);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_push_window_list(L, w, n);
  return 1;
}

static int m_layers(lua_State *L) {
  lua_pushinteger(L, sta_metadata_layers(sta_lua_check_metadata(L, 1)));
  return 1;
}

static int m_tostring(lua_State *L) {
  LMetadata *u = luaL_checkudata(L, 1, STA_LUA_METADATA);
  if (!u->m) lua_pushliteral(L, "sta.Metadata(released)");
  else lua_pushfstring(L, "sta.Metadata(%d layers)", (int)sta_metadata_layers(u->m));
  return 1;
}

/* metadata_from_strategy(strategy_or_nil, step, layers, heads) */
static int l_metadata_from_strategy(lua_State *L) {
  const sta_strategy *s = lua_isnil(L, 1) ? NULL : sta_lua_check_strategy(L, 1);
  int32_t step = sta_lua_check_int32(L, 2, "step"), layers = sta_lua_check_int32(L, 3, "layers");
  int32_t heads = sta_lua_check_int32(L, 4, "heads");
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_from_strategy(&u->m, s, step, layers, heads);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* metadata_search(layers, {{..}, ..., full}) */
static int l_metadata_search(lua_State *L) {
  int32_t layers = sta_lua_check_int32(L, 1, "layers"), n;
  int32_t *w = sta_lua_window_list(L, 2, &n, "candidates");
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_search(&u->m, layers, n, w);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg strategy_meta[] = {
  {"__gc", s_release}, {"__close", s_release}, {"__tostring", s_tostring},
  {"__len", s_count}, {"__eq", s_equal}, {NULL, NULL}};
static const luaL_Reg strategy_methods[] = {
  {"release", s_release}, {"get", s_get}, {"set", s_set}, {"save", s_save},
  {"to_json", s_to_json}, {"count", s_count}, {"extent", s_extent}, {"check", s_check},
  {"sparsity", s_sparsity}, {"equal", s_equal}, {NULL, NULL}};

static const luaL_Reg metadata_meta[] = {
  {"__gc", m_release}, {"__close", m_release}, {"__tostring", m_tostring}, {NULL, NULL}};
static const luaL_Reg metadata_methods[] = {
  {"release", m_release}, {"set_row", m_set_row}, {"row", m_row}, {"layers", m_layers},
  {NULL, NULL}};
static const luaL_Reg strategy_funcs[] = {
  {"new", l_strategy_new}, {"parse", l_strategy_parse}, {"load", l_strategy_load},
  {"default", l_strategy_default}, {"uniform", l_strategy_uniform}, {NULL, NULL}};
static const luaL_Reg metadata_funcs[] = {
  {"new", l_metadata_new}, {"from_strategy", l_metadata_from_strategy},
  {"search", l_metadata_search}, {NULL, NULL}};

/* sta.metadata(layers) is sta.metadata.new(layers) */
static int metadata_call(lua_State *L) {
  lua_remove(L, 1);
  return l_metadata_new(L);
}

/* sta.strategy.*, sta.metadata.* (also callable) */
void sta_lua_open_strategy(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_STRATEGY, strategy_meta, strategy_methods, 1);
  sta_lua_new_class(L, STA_LUA_METADATA, metadata_meta, metadata_methods, 1);
  luaL_newlib(L, strategy_funcs);
  lua_setfield(L, -2, "strategy");
  luaL_newlib(L, metadata_funcs);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, metadata_call);
  lua_setfield(L, -2, "__call");
  lua_setmetatable(L, -2);
  lua_setfield(L, -2, "metadata");
}
