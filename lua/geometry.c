/*
** geometry.c -- the sta.Geometry class of the Lua module (canvas, tiles,
** text) and FastVideo's tiled order (tile, untile).
*/
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- geometry ------------------------------------------------------------ */

sta_geometry *sta_lua_check_geometry(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, STA_LUA_GEOMETRY);
}

/* Geometry from options at idx: geometry=G, or canvas={T,H,W}, tile=,
** text_len=, order=.  Returns 0 when no canvas was given (g canvas 0,0,0). */
int sta_lua_read_geometry(lua_State *L, int idx, sta_geometry *g) {
  sta_geometry_init(g, 0, 0, 0); /* the core's default tile */
  if (!lua_istable(L, idx)) return 0;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, "geometry") != LUA_TNIL) {
    *g = *sta_lua_check_geometry(L, -1);
    lua_pop(L, 1);
    return 1;
  }
  lua_pop(L, 1);
  int have = 0;
  if (lua_getfield(L, idx, "canvas") != LUA_TNIL) {
    sta_lua_int_list(L, -1, g->canvas, 3, "canvas");
    have = 1;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "tile") != LUA_TNIL) sta_lua_int_list(L, -1, g->tile, 3, "tile");
  lua_pop(L, 1);
  g->text_len = (int64_t)sta_lua_int_field(L, idx, "text_len", g->text_len);
  g->order = sta_lua_parse_order(L, sta_lua_str_field(L, idx, "order"));
  return have;
}

static int l_geometry(lua_State *L) {
  lua_settop(L, 1);
  sta_lua_options(L, 1, "geometry");
  sta_geometry g;
  if (!sta_lua_read_geometry(L, 1, &g))
    return sta_lua_misuse(L, "canvas: expected {T, H, W}, got nil");
  /* canvas and tile first: the video rows divide by the tile */
  sta_status rc = sta_geometry_check(&g, INT64_MAX);
  if (rc == STA_OK)
    rc = sta_geometry_check(&g, sta_geometry_video_rows(&g) + (g.text_len > 0 ? g.text_len : 0));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_geometry *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = g;
  luaL_setmetatable(L, STA_LUA_GEOMETRY);
  return 1;
}

static int l_geometry_from_seq_len(lua_State *L) {
  sta_geometry g;
  sta_status rc = sta_geometry_from_seq_len(&g, (int64_t)luaL_checkinteger(L, 1));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_geometry *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = g;
  luaL_setmetatable(L, STA_LUA_GEOMETRY);
  return 1;
}

static int g_grid(lua_State *L) {
  int32_t grid[3];
  sta_geometry_grid(sta_lua_check_geometry(L, 1), grid);
  sta_lua_push_ints(L, grid, 3);
  return 1;
}
static int g_video_tokens(lua_State *L) {
  lua_pushinteger(L, sta_geometry_video_tokens(sta_lua_check_geometry(L, 1)));
  return 1;
}
static int g_video_rows(lua_State *L) {
  lua_pushinteger(L, sta_geometry_video_rows(sta_lua_check_geometry(L, 1)));
  return 1;
}
static int g_text_len(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  lua_pushinteger(L, sta_geometry_text_len(g, (int64_t)luaL_checkinteger(L, 2)));
  return 1;
}
static int g_tiled_len(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  lua_pushinteger(L, sta_geometry_tiled_len(g, (int64_t)luaL_checkinteger(L, 2)));
  return 1;
}
static int g_check(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  sta_status rc = sta_geometry_check(g, (int64_t)luaL_checkinteger(L, 2));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}
static int g_window_check(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  int32_t w[3];
  sta_lua_int_list(L, 2, w, 3, "window");
  sta_status rc = sta_window_check(g, w);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* g:key_tiles(query_tile {it, ih, iw}, window) -> list of {it, ih, iw}
** (0-based tile coordinates) the query tile attends to. */
static int g_key_tiles(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  int32_t q[3], w[3], grid[3], start[3], count[3];
  sta_lua_int_list(L, 2, q, 3, "tile");
  sta_lua_int_list(L, 3, w, 3, "window");
  sta_geometry_grid(g, grid);
  for (int a = 0; a < 3; a++) {
    sta_status rc = sta_window_range(q[a], w[a], grid[a], &start[a], &count[a]);
    if (rc != STA_OK) return sta_lua_fail(L, rc);
  }
  lua_createtable(L, count[0] * count[1] * count[2], 0);
  int n = 0;
  for (int i = 0; i < count[0]; i++)
    for (int j = 0; j < count[1]; j++)
      for (int k = 0; k < count[2]; k++) {
        int32_t c[3] = {start[0] + i, start[1] + j, start[2] + k};
        sta_lua_push_ints(L, c, 3);
        lua_rawseti(L, -2, ++n);
      }
  return 1;
}

static int g_index(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "canvas") == 0) sta_lua_push_ints(L, g->canvas, 3);
  else if (strcmp(k, "tile") == 0) sta_lua_push_ints(L, g->tile, 3);
  else if (strcmp(k, "text_len") == 0) lua_pushinteger(L, g->text_len);
  else if (strcmp(k, "order") == 0) lua_pushstring(L, sta_lua_order_name(g->order));
  else {
    luaL_getmetatable(L, STA_LUA_GEOMETRY);
    lua_getfield(L, -1, "methods");
    lua_getfield(L, -1, k);
  }
  return 1;
}

static int g_tostring(lua_State *L) {
  sta_geometry *g = sta_lua_check_geometry(L, 1);
  int32_t grid[3];
  sta_geometry_grid(g, grid);
  lua_pushfstring(L, "sta.Geometry(canvas %dx%dx%d, tile %dx%dx%d, grid %dx%dx%d, text_len %d%s)",
                  g->canvas[0], g->canvas[1], g->canvas[2], g->tile[0], g->tile[1], g->tile[2],
                  grid[0], grid[1], grid[2], (int)g->text_len,
                  g->order == STA_ORDER_TILED ? ", tiled order" : "");
  return 1;
}

static int l_window_range(lua_State *L) { /* window_range(q, k, c) -> start, count */
  int32_t s, c;
  sta_status rc =
      sta_window_range(sta_lua_check_int32(L, 1, "q"), sta_lua_check_int32(L, 2, "k"),
                       sta_lua_check_int32(L, 3, "c"), &s, &c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushinteger(L, s);
  lua_pushinteger(L, c);
  return 2;
}

/* tile(in, geometry [, layout]) / untile(in, geometry, seq_len [, layout]) */
static int l_tile(lua_State *L) {
  sta_tensor *in = sta_lua_check_tensor(L, 1, "in");
  sta_geometry *g = sta_lua_check_geometry(L, 2);
  sta_layout layout = sta_lua_parse_layout(L, luaL_optstring(L, 3, "bshd"));
  int64_t shape[4];
  int sdim = layout == STA_BSHD ? 1 : 2;
  if (sta_tensor_ndim(in) != 4)
    return sta_lua_misuse(L, "in: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(in));
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(in, i);
  shape[sdim] = sta_geometry_tiled_len(g, shape[sdim]);
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, sta_tensor_dtype(in), sta_tensor_device(in), 4, shape, &u);
  if (r != 1) return r;
  sta_status rc = sta_tensor_tile(u->t, in, g, layout);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 1;
}

static int l_untile(lua_State *L) {
  sta_tensor *in = sta_lua_check_tensor(L, 1, "in");
  sta_geometry *g = sta_lua_check_geometry(L, 2);
  lua_Integer seq = luaL_checkinteger(L, 3);
  sta_layout layout = sta_lua_parse_layout(L, luaL_optstring(L, 4, "bshd"));
  int64_t shape[4];
  int sdim = layout == STA_BSHD ? 1 : 2;
  if (sta_tensor_ndim(in) != 4)
    return sta_lua_misuse(L, "in: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(in));
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(in, i);
  shape[sdim] = (int64_t)seq;
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, sta_tensor_dtype(in), sta_tensor_device(in), 4, shape, &u);
  if (r != 1) return r;
  sta_status rc = sta_tensor_untile(u->t, in, g, layout);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 1;
}
/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg geometry_meta[] = {
  {"__index", g_index}, {"__tostring", g_tostring}, {NULL, NULL}};
static const luaL_Reg geometry_methods[] = {
  {"grid", g_grid}, {"video_tokens", g_video_tokens}, {"video_rows", g_video_rows},
  {"text_len_for", g_text_len},
  {"tiled_len", g_tiled_len}, {"check", g_check}, {"window_check", g_window_check},
  {"key_tiles", g_key_tiles}, {NULL, NULL}};
static const luaL_Reg geometry_funcs[] = {
  {"geometry", l_geometry}, {"geometry_from_seq_len", l_geometry_from_seq_len},
  {"window_range", l_window_range}, {"tile", l_tile}, {"untile", l_untile}, {NULL, NULL}};

void sta_lua_open_geometry(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_GEOMETRY, geometry_meta, geometry_methods, 0);
  luaL_setfuncs(L, geometry_funcs, 0);
}
