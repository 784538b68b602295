/*
** files.c -- tensors in files, for the Lua module: .npy (sta.load,
** t:save) and .safetensors (sta.load_safetensors, sta.save_safetensors).
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- files --------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int l_npy_load(lua_State *L) { /* npy_load(path [, as_bf16]) */
  const char *path = luaL_checkstring(L, 1);
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  sta_status rc = sta_npy_load(&u->t, path, lua_toboolean(L, 2));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

int sta_lua_tensor_save(lua_State *L) { /* t:save(path [, name]) */
  sta_tensor *t = sta_lua_check_tensor(L, 1, "tensor");
  const char *path = luaL_checkstring(L, 2);
  sta_status rc;
  if (ends_with(path, ".safetensors")) {
    const char *name = luaL_optstring(L, 3, "tensor");
    const sta_tensor *ts[1] = {t};
    rc = sta_safetensors_save(path, 1, &name, ts);
  } else rc = sta_npy_save(t, path);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* load_safetensors(path) -> {name = tensor, ...}, {names in file order} */
static int l_load_safetensors(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  sta_safetensors *f = NULL;
  sta_status rc = sta_safetensors_open(&f, path);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  int32_t n = sta_safetensors_count(f);
  lua_createtable(L, 0, n);
  lua_createtable(L, n, 0);
  for (int32_t i = 0; i < n; i++) {
    const char *name = sta_safetensors_name(f, i);
    sta_lua_tensor *u = sta_lua_new_tensor(L);
    rc = sta_safetensors_read(f, name, &u->t);
    if (rc != STA_OK) {
      sta_safetensors_close(f);
      return sta_lua_fail(L, rc);
    }
    sta_lua_tensor_born(L, u);
    lua_setfield(L, -3, name);
    lua_pushstring(L, name);
    lua_rawseti(L, -2, i + 1);
  }
  sta_safetensors_close(f);
  return 2;
}

/* save_safetensors(path, {name = tensor, ...}): names written sorted */
static int l_save_safetensors(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  int n = 0;
  lua_newtable(L); /* 3: sorted names */
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING) sta_lua_misuse(L, "tensors: keys must be names (strings)");
    sta_lua_check_tensor(L, -1, lua_tostring(L, -2));
    lua_pop(L, 1);
    lua_pushvalue(L, -1);
    lua_rawseti(L, 3, ++n);
  }
  lua_getglobal(L, "table");
  lua_getfield(L, -1, "sort");
  lua_pushvalue(L, 3);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
  const char **names = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n ? n : 1), 0);
  const sta_tensor **ts = lua_newuserdatauv(L, sizeof(sta_tensor *) * (size_t)(n ? n : 1), 0);
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, 3, i + 1);
    names[i] = lua_tostring(L, -1);
    lua_gettable(L, 2);
    ts[i] = sta_lua_check_tensor(L, -1, "tensor");
    lua_pop(L, 1);
  }
  sta_status rc = sta_safetensors_save(path, n, names, ts);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* write_file(path, text): path replaced atomically (sta_file_write) ->
** true, or nil, message, code */
static int l_write_file(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  size_t len;
  const char *text = luaL_checklstring(L, 2, &len);
  sta_status rc = sta_file_write(path, text, len);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static const luaL_Reg files_funcs[] = {
  {"npy_load", l_npy_load}, {"load_safetensors", l_load_safetensors},
  {"save_safetensors", l_save_safetensors}, {"write_file", l_write_file}, {NULL, NULL}};

void sta_lua_open_files(lua_State *L) { luaL_setfuncs(L, files_funcs, 0); }
