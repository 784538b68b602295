/*
** tune.c -- sta.tune of the Lua module: a mask strategy from saved search
** files (STA.md section 7).
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- tuning -------------------------------------------------------------- */

/* tune{files={...}, skip_steps=, full=} -> strategy, report; sta_tune_defaults
** for what is left out */
static int l_tune(lua_State *L) {
  lua_settop(L, 1);
  sta_lua_options(L, 1, "tune"); /* files: a list of strings now */
  int32_t full[3], skip;
  sta_tune_defaults(full, &skip);
  if (lua_getfield(L, 1, "full") != LUA_TNIL) sta_lua_int_list(L, -1, full, 3, "full");
  lua_pop(L, 1);
  skip = sta_lua_int32_field(L, 1, "skip_steps", skip);
  lua_getfield(L, 1, "files");
  int32_t n = (int32_t)luaL_len(L, 2);
  const char **paths = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n ? n : 1), 0);
  for (int32_t i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    paths[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* kept alive by the files table */
  }
  sta_tune_report rep;
  memset(&rep, 0, sizeof rep);
  sta_lua_strategy *u = sta_lua_new_strategy(L);
  sta_status rc = sta_tune(&u->s, n, paths, skip, full, &rep);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, rep.sparsity);
  lua_setfield(L, -2, "sparsity");
  int nw = rep.n_windows < 16 ? rep.n_windows : 16;
  sta_lua_push_window_list(L, &rep.windows[0][0], nw);
  lua_setfield(L, -2, "windows");
  lua_createtable(L, nw, 0);
  for (int i = 0; i < nw; i++) {
    lua_pushinteger(L, rep.counts[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "counts");
  return 2;
}

void sta_lua_open_tune(lua_State *L) {
  lua_pushcfunction(L, l_tune);
  lua_setfield(L, -2, "tune");
}
