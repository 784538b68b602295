/*
** auxlib.c -- what every C file of the Lua module shares (sta_lua.h):
** errors, device-memory pressure, option and argument readers, classes.
*/
#include <stdarg.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- errors ------------------------------------------------------------ */

/* The binding's one error policy (README, "Using it from Lua"): a failure of the
** environment returns nil, message, code -- out of host or device memory
** (400), a device failure (500), a file (600).  Everything else is misuse
** and raises: arguments (100), state (200), requests this build or machine
** does not support (300: STA.md section 9 raises "seq_len N not supported
** for STA" and "st attn not supported", the latter also for CUDA asked
** with no GPU present) and STA_ERR_ENV (section 9: "STA_ATTENTION_CONFIG
** is not set"). */
static int environment_failure(sta_status rc) {
  return sta_status_group(rc) >= 400 && rc != STA_ERR_ENV;
}

int sta_lua_fail(lua_State *L, sta_status rc) {
  if (environment_failure(rc)) {
    lua_pushnil(L);
    lua_pushstring(L, sta_last_error());
    lua_pushinteger(L, (lua_Integer)rc);
    return 3;
  }
  lua_pushstring(L, sta_last_error());
  return lua_error(L);
}

/* A binding-level misuse error: plain message, no position. */
int sta_lua_misuse(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

/* ---- device memory ------------------------------------------------------ */

static int64_t device_soft_limit = (int64_t)1 << 30;

int64_t sta_lua_device_soft_limit(void) { return device_soft_limit; }
void sta_lua_set_device_soft_limit(int64_t bytes) { device_soft_limit = bytes; }

/* ---- interrupting long calls ------------------------------------------------ */

static int interruptible = 0, long_depth = 0;
static struct sigaction saved_int;

static void on_sigint(int sig) {
  sta_cancel(); /* async-signal-safe: one atomic store */
  if (saved_int.sa_handler != SIG_DFL && saved_int.sa_handler != SIG_IGN &&
      !(saved_int.sa_flags & SA_SIGINFO) && saved_int.sa_handler)
    saved_int.sa_handler(sig);
}

void sta_lua_set_interruptible(int on) { interruptible = on != 0; }
int sta_lua_interruptible(void) { return interruptible; }

void sta_lua_long_begin(void) {
  if (!interruptible || long_depth++ > 0) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &saved_int);
}

void sta_lua_long_end(void) {
  if (!interruptible || long_depth == 0 || --long_depth > 0) return;
  sigaction(SIGINT, &saved_int, NULL);
  sta_cancel_clear(); /* this call's interrupt is spent */
}

void sta_lua_device_pressure(lua_State *L) {
  if (sta_device_bytes_in_use() > device_soft_limit) lua_gc(L, LUA_GCSTEP, 0);
}

/* ---- argument helpers -------------------------------------------------- */

/* v as an int32, or raise naming it: no silent truncation. */
static int32_t to_int32(lua_State *L, lua_Integer v, const char *name, int index) {
  if (v < INT32_MIN || v > INT32_MAX) {
    if (index > 0)
      sta_lua_misuse(L, "%s[%d]: expected a 32-bit integer, got %I", name, index, v);
    sta_lua_misuse(L, "%s: expected a 32-bit integer, got %I", name, v);
  }
  return (int32_t)v;
}

int32_t sta_lua_check_int32(lua_State *L, int idx, const char *name) {
  int ok;
  lua_Integer v = lua_tointegerx(L, idx, &ok);
  if (!ok) {
    if (lua_isnoneornil(L, idx)) sta_lua_misuse(L, "%s: expected an integer, got nil", name);
    sta_lua_misuse(L, "%s: expected an integer, got %s", name, luaL_tolstring(L, idx, NULL));
  }
  return to_int32(L, v, name, 0);
}

int32_t sta_lua_opt_int32(lua_State *L, int idx, const char *name, int32_t def) {
  return lua_isnoneornil(L, idx) ? def : sta_lua_check_int32(L, idx, name);
}

int32_t sta_lua_int32_field(lua_State *L, int t, const char *k, int32_t def) {
  return to_int32(L, sta_lua_int_field(L, t, k, def), k, 0);
}

lua_Integer sta_lua_int_field(lua_State *L, int t, const char *k, lua_Integer def) {
  lua_Integer v = def;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) sta_lua_misuse(L, "%s: expected an integer, got %s", k, luaL_tolstring(L, -1, NULL));
  }
  lua_pop(L, 1);
  return v;
}

double sta_lua_num_field(lua_State *L, int t, const char *k, double def) {
  double v = def;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    if (ty != LUA_TNUMBER)
      sta_lua_misuse(L, "%s: expected a number, got %s", k, luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

int sta_lua_bool_field(lua_State *L, int t, const char *k, int def) {
  int v = def;
  if (lua_getfield(L, t, k) != LUA_TNIL) v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* String field or NULL; the string stays on the stack's caller table. */
const char *sta_lua_str_field(lua_State *L, int t, const char *k) {
  const char *s = NULL;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    if (ty != LUA_TSTRING)
      sta_lua_misuse(L, "%s: expected a string, got %s", k, luaL_typename(L, -1));
    s = lua_tostring(L, -1); /* kept alive by the table */
  }
  lua_pop(L, 1);
  return s;
}

void sta_lua_check_keys(lua_State *L, int idx, const char *const *keys) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) return;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    int known = 0;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (int i = 0; keys[i] && !known; i++) known = strcmp(lua_tostring(L, -1), keys[i]) == 0;
    if (!known) {
      luaL_Buffer b;
      const char *key = luaL_tolstring(L, -1, NULL);
      luaL_buffinit(L, &b);
      for (int i = 0; keys[i]; i++) {
        if (i) luaL_addstring(&b, ", ");
        luaL_addstring(&b, keys[i]);
      }
      luaL_pushresult(&b);
      sta_lua_misuse(L, "options: unknown key '%s' (known: %s)", key, lua_tostring(L, -1));
    }
  }
}

void sta_lua_check_opts(lua_State *L, int idx, const char *const *keys) {
  if (!lua_isnoneornil(L, idx) && !lua_istable(L, idx))
    sta_lua_misuse(L, "options: expected a table, got %s", luaL_typename(L, idx));
  sta_lua_check_keys(L, idx, keys);
}

/* Read exactly n integers from the table at idx into out. */
void sta_lua_int_list(lua_State *L, int idx, int32_t *out, int n, const char *name) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    sta_lua_misuse(L, "%s: expected a table of %d integers, got %s", name, n,
                   luaL_typename(L, idx));
  if ((int)luaL_len(L, idx) != n)
    sta_lua_misuse(L, "%s: expected %d integers, got %d", name, n, (int)luaL_len(L, idx));
  for (int i = 0; i < n; i++) {
    int ok;
    lua_geti(L, idx, i + 1);
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok)
      sta_lua_misuse(L, "%s[%d]: expected an integer, got %s", name, i + 1,
                     luaL_tolstring(L, -1, NULL));
    out[i] = to_int32(L, v, name, i + 1);
    lua_pop(L, 1);
  }
}

void sta_lua_push_ints(lua_State *L, const int32_t *v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

sta_device sta_lua_parse_device(lua_State *L, const char *s, const char *name) {
  if (strcmp(s, "cpu") == 0 || strcmp(s, "host") == 0) return STA_CPU;
  if (strcmp(s, "cuda") == 0 || strcmp(s, "cuda:0") == 0 || strcmp(s, "gpu") == 0)
    return STA_CUDA;
  sta_lua_misuse(L, "%s: unknown device '%s' (expected cpu or cuda)", name, s);
  return STA_CPU;
}

const char *sta_lua_device_name(sta_device d) { return d == STA_CPU ? "cpu" : "cuda:0"; }

sta_dtype sta_lua_parse_dtype(lua_State *L, const char *s) {
  sta_dtype d;
  sta_status rc = sta_dtype_parse(s, &d);
  if (rc != STA_OK) sta_lua_fail(L, rc);
  return d;
}

sta_layout sta_lua_parse_layout(lua_State *L, const char *s) {
  if (!s || strcmp(s, "bshd") == 0 || strcmp(s, "BSHD") == 0) return STA_BSHD;
  if (strcmp(s, "bhsd") == 0 || strcmp(s, "BHSD") == 0) return STA_BHSD;
  sta_lua_misuse(L, "layout: expected \"bshd\" or \"bhsd\", got '%s'", s);
  return STA_BSHD;
}

sta_softmax sta_lua_parse_softmax(lua_State *L, const char *s) {
  if (!s || strcmp(s, "exact") == 0) return STA_SOFTMAX_EXACT;
  if (strcmp(s, "fast") == 0) return STA_SOFTMAX_FAST;
  sta_lua_misuse(L, "softmax: expected \"exact\" or \"fast\", got '%s'", s);
  return STA_SOFTMAX_EXACT;
}

sta_precision sta_lua_parse_precision(lua_State *L, const char *s) {
  if (!s || strcmp(s, "native") == 0) return STA_PRECISION_NATIVE;
  if (strcmp(s, "fp8") == 0) return STA_PRECISION_FP8;
  sta_lua_misuse(L, "precision: expected \"native\" or \"fp8\", got '%s'", s);
  return STA_PRECISION_NATIVE;
}

sta_order sta_lua_parse_order(lua_State *L, const char *s) {
  if (!s || strcmp(s, "untiled") == 0) return STA_ORDER_UNTILED;
  if (strcmp(s, "tiled") == 0) return STA_ORDER_TILED;
  sta_lua_misuse(L, "order: expected \"untiled\" or \"tiled\", got '%s'", s);
  return STA_ORDER_UNTILED;
}

const char *sta_lua_order_name(sta_order o) {
  return o == STA_ORDER_TILED ? "tiled" : "untiled";
}

/* Shape from a table of 1..4 sizes at idx. */
int32_t sta_lua_read_shape(lua_State *L, int idx, int64_t shape[4]) {
  if (!lua_istable(L, idx))
    sta_lua_misuse(L, "shape: expected a table of 1..4 sizes, got %s", luaL_typename(L, idx));
  lua_Integer n = luaL_len(L, idx);
  if (n < 1 || n > 4) sta_lua_misuse(L, "shape: expected 1..4 sizes, got %d", (int)n);
  for (int i = 0; i < n; i++) {
    int ok;
    lua_geti(L, idx, i + 1);
    shape[i] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok)
      sta_lua_misuse(L, "shape[%d]: expected an integer, got %s", i + 1,
                     luaL_tolstring(L, -1, NULL));
    if (shape[i] < 0)
      sta_lua_misuse(L, "shape[%d]: expected >= 0, got %I", i + 1, (lua_Integer)shape[i]);
    lua_pop(L, 1);
  }
  return (int32_t)n;
}


/* Windows list {{Kt,Kh,Kw}, ...} at idx into a userdata array left on the
** stack. */
int32_t *sta_lua_window_list(lua_State *L, int idx, int32_t *n, const char *name) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    sta_lua_misuse(L, "%s: expected a list of windows, got %s", name, luaL_typename(L, idx));
  int32_t k = (int32_t)luaL_len(L, idx);
  int32_t *w = lua_newuserdatauv(L, sizeof(int32_t) * 3 * (size_t)(k ? k : 1), 0);
  for (int32_t i = 0; i < k; i++) {
    char nm[48];
    snprintf(nm, sizeof nm, "%s[%d]", name, (int)i + 1);
    lua_geti(L, idx, i + 1);
    sta_lua_int_list(L, -1, w + 3 * i, 3, nm);
    lua_pop(L, 1);
  }
  *n = k;
  return w;
}

int32_t *sta_lua_windows(lua_State *L, int idx, int32_t *n) {
  idx = lua_absindex(L, idx);
  if (lua_isnoneornil(L, idx)) /* as sta-run: no silent default */
    sta_lua_misuse(L, "window: required ({Kt, Kh, Kw} for every head, or a list of them, one "
                      "per head)");
  if (!lua_istable(L, idx))
    sta_lua_misuse(L, "window: expected {Kt, Kh, Kw} or a list per head, got %s",
                   luaL_typename(L, idx));
  lua_geti(L, idx, 1);
  int per_head = lua_istable(L, -1);
  lua_pop(L, 1);
  if (per_head) return sta_lua_window_list(L, idx, n, "window");
  int32_t *w = lua_newuserdatauv(L, 3 * sizeof(int32_t), 0);
  sta_lua_int_list(L, idx, w, 3, "window");
  *n = 1;
  return w;
}

void sta_lua_push_window_list(lua_State *L, const int32_t *w, int32_t n) {
  lua_createtable(L, n, 0);
  for (int32_t i = 0; i < n; i++) {
    sta_lua_push_ints(L, w + 3 * i, 3);
    lua_rawseti(L, -2, i + 1);
  }
}

/* ---- options (lua/sta/options.lua) ---------------------------------------- */

#define STA_LUA_OPTIONS "sta.options"

void sta_lua_load_options(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "sta.options");
  lua_call(L, 1, 1);
  lua_setfield(L, LUA_REGISTRYINDEX, STA_LUA_OPTIONS);
}

void sta_lua_options(lua_State *L, int idx, const char *call) {
  idx = lua_absindex(L, idx);
  lua_getfield(L, LUA_REGISTRYINDEX, STA_LUA_OPTIONS);
  lua_getfield(L, -1, "check");
  lua_remove(L, -2);
  lua_pushstring(L, call);
  lua_pushvalue(L, idx);
  lua_pushliteral(L, "lua");
  lua_call(L, 3, 1); /* raises the schema's message */
  lua_replace(L, idx);
}

/* ---- classes ------------------------------------------------------------ */

void sta_lua_new_class(lua_State *L, const char *name, const luaL_Reg *meta,
                       const luaL_Reg *methods, int index_is_methods) {
  luaL_newmetatable(L, name); /* reuses the existing one when run twice */
  luaL_setfuncs(L, meta, 0);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  if (index_is_methods) {
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, "__index");
  }
  lua_setfield(L, -2, "methods");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__name");
  lua_pop(L, 1);
}

/* A userdata in the registry under key whose __gc calls gc: it runs at
** lua_close (or when key is set again and the old one is collected). */
void sta_lua_registry_sentinel(lua_State *L, const char *key, lua_CFunction gc) {
  lua_newuserdatauv(L, 1, 0);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, key);
}
