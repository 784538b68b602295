/*
** batch.c -- the sta.ForwardBatch class of the Lua module: the request
** batch a forward context carries (size, the CFG negative flag, mask-search
** records).
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- forward batch ------------------------------------------------------- */

typedef struct { sta_forward_batch *fb; } LBatch;

sta_forward_batch *sta_lua_check_batch(lua_State *L, int idx) {
  LBatch *u = luaL_testudata(L, idx, STA_LUA_BATCH);
  if (!u) sta_lua_misuse(L, "batch: expected a forward batch, got %s", luaL_typename(L, idx));
  if (!u->fb) sta_lua_misuse(L, "batch: released");
  return u->fb;
}

static int b_release(lua_State *L) {
  LBatch *u = luaL_checkudata(L, 1, STA_LUA_BATCH);
  if (u->fb) { sta_forward_batch_destroy(u->fb); u->fb = NULL; }
  return 0;
}

/* forward_batch{batch_size=1, negative=false} (sta.options) */
static int l_forward_batch(lua_State *L) {
  lua_settop(L, 1);
  sta_lua_options(L, 1, "forward_batch"); /* fills batch_size's default */
  int32_t bs = sta_lua_int32_field(L, 1, "batch_size", 0);
  int neg = sta_lua_bool_field(L, 1, "negative", 0);
  double vs = sta_lua_num_field(L, 1, "vsa_sparsity", 0);
  LBatch *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->fb = NULL;
  luaL_setmetatable(L, STA_LUA_BATCH);
  sta_status rc = sta_forward_batch_create(&u->fb, bs);
  if (rc == STA_OK) rc = sta_forward_batch_set_vsa_sparsity(u->fb, vs);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_forward_batch_set_negative(u->fb, neg);
  return 1;
}

/* fb:vsa_sparsity() -> the VSA layers' sparsity; fb:vsa_sparsity(s) sets
** it (SGLang's VSA_sparsity, per step) */
static int b_vsa_sparsity(lua_State *L) {
  sta_forward_batch *fb = sta_lua_check_batch(L, 1);
  if (!lua_isnone(L, 2)) {
    int ok;
    double s = lua_tonumberx(L, 2, &ok);
    if (!ok)
      return sta_lua_misuse(L, "sparsity: expected a number in [0, 1), got %s",
                            luaL_typename(L, 2));
    sta_status rc = sta_forward_batch_set_vsa_sparsity(fb, s);
    if (rc != STA_OK) return sta_lua_fail(L, rc);
    lua_settop(L, 1);
    return 1;
  }
  lua_pushnumber(L, sta_forward_batch_vsa_sparsity(fb));
  return 1;
}

static int b_size(lua_State *L) {
  lua_pushinteger(L, sta_forward_batch_size(sta_lua_check_batch(L, 1)));
  return 1;
}

/* fb:negative() -> flag; fb:negative(flag) sets it */
static int b_negative(lua_State *L) {
  sta_forward_batch *fb = sta_lua_check_batch(L, 1);
  if (!lua_isnone(L, 2)) {
    sta_forward_batch_set_negative(fb, lua_toboolean(L, 2));
    lua_settop(L, 1);
    return 1;
  }
  lua_pushboolean(L, sta_forward_batch_is_negative(fb));
  return 1;
}

static int b_records(lua_State *L) {
  lua_pushinteger(L, sta_forward_batch_records(sta_lua_check_batch(L, 1), lua_toboolean(L, 2)));
  return 1;
}

/* fb:record{negative=, step=, layer=, candidates={{..}}, l1={{per head}..}, l2=} */
static float *loss_table(lua_State *L, int t, const char *name, int32_t n, int32_t *heads) {
  if (lua_getfield(L, t, name) != LUA_TTABLE || luaL_len(L, -1) != n)
    sta_lua_misuse(L, "%s: expected %d lists (one per candidate)", name, (int)n);
  int li = lua_gettop(L);
  if (*heads < 0) {
    lua_geti(L, li, 1);
    *heads = lua_istable(L, -1) ? (int32_t)luaL_len(L, -1) : 0;
    lua_pop(L, 1);
  }
  float *l = lua_newuserdatauv(L, sizeof(float) * (size_t)(n * *heads + 1), 0);
  for (int32_t c = 0; c < n; c++) {
    lua_geti(L, li, c + 1);
    if (!lua_istable(L, -1) || luaL_len(L, -1) != *heads)
      sta_lua_misuse(L, "%s[%d]: expected a list of %d numbers (one per head)", name, (int)c + 1,
                     (int)*heads);
    for (int32_t j = 0; j < *heads; j++) {
      lua_geti(L, -1, j + 1);
      l[c * *heads + j] = (float)luaL_checknumber(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  lua_remove(L, li); /* leaves the array userdata */
  return l;
}

static int b_record(lua_State *L) {
  sta_forward_batch *fb = sta_lua_check_batch(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  static const char *const keys[] = {"negative", "step", "layer", "candidates", "l1", "l2", NULL};
  sta_lua_check_keys(L, 2, keys);
  int neg = sta_lua_bool_field(L, 2, "negative", 0);
  int32_t step = sta_lua_int32_field(L, 2, "step", 0),
          layer = sta_lua_int32_field(L, 2, "layer", 0);
  int32_t n, heads = -1;
  lua_getfield(L, 2, "candidates");
  int32_t *cand = sta_lua_window_list(L, -1, &n, "candidates");
  float *l1 = loss_table(L, 2, "l1", n, &heads);
  float *l2 = loss_table(L, 2, "l2", n, &heads);
  sta_status rc = sta_forward_batch_record(fb, neg, step, layer, n, cand, heads, l1, l2);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int b_save_search(lua_State *L) {
  sta_forward_batch *fb = sta_lua_check_batch(L, 1);
  const char *path = luaL_checkstring(L, 2);
  sta_status rc = sta_forward_batch_save_search(fb, lua_toboolean(L, 3), path);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int b_clear(lua_State *L) {
  sta_forward_batch_clear(sta_lua_check_batch(L, 1));
  lua_settop(L, 1);
  return 1;
}

static int b_tostring(lua_State *L) {
  LBatch *u = luaL_checkudata(L, 1, STA_LUA_BATCH);
  if (!u->fb) lua_pushliteral(L, "sta.ForwardBatch(released)");
  else
    lua_pushfstring(
        L, "sta.ForwardBatch(size %d, %s, %d+%d records)", (int)sta_forward_batch_size(u->fb),
        sta_forward_batch_is_negative(u->fb) ? "negative" : "positive",
        (int)sta_forward_batch_records(u->fb, 0), (int)sta_forward_batch_records(u->fb, 1));
  return 1;
}
/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg batch_meta[] = {
  {"__gc", b_release}, {"__close", b_release}, {"__tostring", b_tostring}, {NULL, NULL}};
static const luaL_Reg batch_methods[] = {
  {"release", b_release}, {"size", b_size}, {"negative", b_negative},
  {"vsa_sparsity", b_vsa_sparsity},
  {"records", b_records}, {"record", b_record}, {"save_search", b_save_search},
  {"clear", b_clear}, {NULL, NULL}};
static const luaL_Reg batch_funcs[] = {{"forward_batch", l_forward_batch}, {NULL, NULL}};

void sta_lua_open_batch(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_BATCH, batch_meta, batch_methods, 1);
  luaL_setfuncs(L, batch_funcs, 0);
}
