/*
** core.c -- luaopen_sta_core, the entry of the Lua module
** (require "sta.core"; lua/sta/init.lua builds "sta" on top): backends,
** info, errors, small utilities, and the registration of every class.
*/
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* error recording and fault injection of the core (core/internal.h), for
** specs */
sta_status sta_error(sta_status status, const char *fmt, ...);
void sta_fault_arm(int64_t n);

/* ---- backends, info, errors ------------------------------------------------ */

static int l_backends(lua_State *L) {
  int n = 0;
  lua_newtable(L);
  if (sta_backend_available(STA_CPU)) { lua_pushliteral(L, "cpu"); lua_rawseti(L, -2, ++n); }
  if (sta_backend_available(STA_CUDA)) { lua_pushliteral(L, "cuda"); lua_rawseti(L, -2, ++n); }
  return 1;
}

static int l_backend_available(lua_State *L) {
  lua_pushboolean(L,
                  sta_backend_available(sta_lua_parse_device(L, luaL_checkstring(L, 1), "device")));
  return 1;
}

static int l_info(lua_State *L) {
  lua_createtable(L, 0, 9);
  lua_pushstring(L, sta_version());
  lua_setfield(L, -2, "version");
  l_backends(L);
  lua_setfield(L, -2, "backends");
  lua_pushinteger(L, sta_get_num_threads());
  lua_setfield(L, -2, "threads");
  lua_pushstring(L, sta_backend_describe(STA_CPU));
  lua_setfield(L, -2, "cpu");
  lua_pushstring(L, sta_backend_describe(STA_CUDA));
  lua_setfield(L, -2, "cuda");
  lua_pushinteger(L, sta_device_bytes_in_use());
  lua_setfield(L, -2, "device_bytes");
  lua_pushinteger(L, sta_device_bytes_peak());
  lua_setfield(L, -2, "device_peak");
  lua_pushinteger(L, sta_lua_device_soft_limit());
  lua_setfield(L, -2, "device_soft_limit");
  lua_pushinteger(L, sta_transfer_bytes());
  lua_setfield(L, -2, "transfer_bytes");
  return 1;
}

static int l_set_num_threads(lua_State *L) {
  sta_set_num_threads(sta_lua_check_int32(L, 1, "n"));
  return 0;
}
static int l_get_num_threads(lua_State *L) {
  lua_pushinteger(L, sta_get_num_threads());
  return 1;
}
static int l_synchronize(lua_State *L) {
  sta_status rc = sta_cuda_synchronize();
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}
/* last_launch() -> this thread's last CUDA forward launch, one line ("" before one) */
static int l_last_launch(lua_State *L) {
  lua_pushstring(L, sta_cuda_last_launch());
  return 1;
}
static int l_transfer_bytes(lua_State *L) {
  lua_pushinteger(L, sta_transfer_bytes());
  return 1;
}
static int l_device_bytes(lua_State *L) {
  lua_pushinteger(L, sta_device_bytes_in_use());
  lua_pushinteger(L, sta_device_bytes_peak());
  return 2;
}
static int l_set_device_soft_limit(lua_State *L) {
  sta_lua_set_device_soft_limit((int64_t)luaL_checkinteger(L, 1));
  return 0;
}
static int l_last_error(lua_State *L) {
  lua_pushstring(L, sta_last_error());
  lua_pushinteger(L, sta_last_status());
  return 2;
}
static int l_status_name(lua_State *L) {
  lua_pushstring(L, sta_status_name((sta_status)luaL_checkinteger(L, 1)));
  return 1;
}
/* now() -> monotonic seconds (wall clock, for timing) */
static int l_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec + (lua_Number)ts.tv_nsec * 1e-9);
  return 1;
}

/* history(path): when the interpreter has GNU readline (Debian's lua5.4
** does), read path into its history now and write it back when the state
** closes.  Found with dlsym, so the module never links readline.  Returns
** true when readline history is available. */
typedef int (*history_fn)(const char *);
static char history_path[1024];

static history_fn history_lookup(const char *name) {
  void *p = dlsym(RTLD_DEFAULT, name);
  history_fn f = NULL;
  if (p) memcpy(&f, &p, sizeof f); /* POSIX: object to function pointer */
  return f;
}

static int history_save(lua_State *L) {
  (void)L;
  history_fn w = history_lookup("write_history");
  if (w && history_path[0]) w(history_path);
  return 0;
}

static int l_history(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  history_fn r = history_lookup("read_history");
  if (!r || !history_lookup("write_history")) { lua_pushboolean(L, 0); return 1; }
  snprintf(history_path, sizeof history_path, "%s", path);
  r(history_path);
  sta_lua_registry_sentinel(L, "sta.history", history_save);
  lua_pushboolean(L, 1);
  return 1;
}

/* debug.fail(code [, message]): what a call that fails with code does
** (sta_lua_fail), for specs of the error policy. */
static int l_fail(lua_State *L) {
  sta_status rc = (sta_status)luaL_checkinteger(L, 1);
  sta_error(rc, "%s", luaL_optstring(L, 2, sta_status_name(rc)));
  return sta_lua_fail(L, rc);
}

static int l_fault_arm(lua_State *L) {
  sta_fault_arm((int64_t)luaL_checkinteger(L, 1));
  return 0;
}

/* ---- registration ---------------------------------------------------------- */








/* Cooperative cancel (sta.h): sta.cancel(), sta.cancel_clear(),
** sta.cancelled(); sta.interruptible(on): SIGINT during a long call raises
** the flag (the REPL turns it on). */
static int l_cancel(lua_State *L) { (void)L; sta_cancel(); return 0; }
static int l_cancel_clear(lua_State *L) { (void)L; sta_cancel_clear(); return 0; }
static int l_cancelled(lua_State *L) {
  lua_pushboolean(L, sta_cancel_requested());
  return 1;
}
static int l_interruptible(lua_State *L) {
  if (!lua_isnone(L, 1)) sta_lua_set_interruptible(lua_toboolean(L, 1));
  lua_pushboolean(L, sta_lua_interruptible());
  return 1;
}

static const luaL_Reg core_funcs[] = {
  {"cancel", l_cancel}, {"cancel_clear", l_cancel_clear}, {"cancelled", l_cancelled},
  {"interruptible", l_interruptible},
  {"backends", l_backends}, {"backend_available", l_backend_available}, {"info", l_info},
  {"set_num_threads", l_set_num_threads}, {"get_num_threads", l_get_num_threads},
  {"synchronize", l_synchronize}, {"device_bytes", l_device_bytes},
  {"transfer_bytes", l_transfer_bytes}, {"last_launch", l_last_launch},
  {"set_device_soft_limit", l_set_device_soft_limit},
  {"status_name", l_status_name}, {"now", l_now}, {"history", l_history},
  {NULL, NULL}};
static const luaL_Reg debug_funcs[] = {
  {"last_error", l_last_error}, {"fault_arm", l_fault_arm}, {"fail", l_fail}, {NULL, NULL}};

static void push_status_table(lua_State *L) {
  static const sta_status all[] = {
    STA_OK, STA_ERR_ARGUMENT, STA_ERR_SHAPE, STA_ERR_DTYPE, STA_ERR_WINDOW, STA_ERR_KEY,
    STA_ERR_STATE, STA_ERR_NO_BATCH, STA_ERR_NO_STRATEGY, STA_ERR_NO_STEP0,
    STA_ERR_STA_PARAM, STA_ERR_UNSUPPORTED, STA_ERR_SEQ_LEN, STA_ERR_BACKEND,
    STA_ERR_NOMEM, STA_ERR_DEVICE_NOMEM, STA_ERR_DEVICE, STA_ERR_IO, STA_ERR_FORMAT,
    STA_ERR_ENV};
  lua_createtable(L, 0, (int)(sizeof all / sizeof all[0]));
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    const char *n = sta_status_name(all[i]);
    if (strncmp(n, "STA_ERR_", 8) == 0) n += 8;
    else if (strncmp(n, "STA_", 4) == 0) n += 4;
    lua_pushinteger(L, all[i]);
    lua_setfield(L, -2, n);
  }
}

/* Lua dlcloses C modules when a state closes; this one must stay: the
** OpenMP and OpenBLAS worker threads it started would run unmapped code.
** Re-open ourselves with RTLD_NODELETE (no new load, just the flag). */
static void pin_library(void) {
  Dl_info info;
  if (dladdr((void *)(uintptr_t)pin_library, &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

int luaopen_sta_core(lua_State *L);
int luaopen_sta_core(lua_State *L) {
  pin_library();
  luaL_newlib(L, core_funcs);
  luaL_newlib(L, debug_funcs);
  lua_setfield(L, -2, "debug");
  sta_lua_load_options(L);
  sta_lua_open_tensor(L);
  sta_lua_open_files(L);
  sta_lua_open_geometry(L);
  sta_lua_open_attention(L);
  sta_lua_open_sparse(L);
  sta_lua_open_strategy(L);
  sta_lua_open_batch(L);
  sta_lua_open_context(L);
  sta_lua_open_layer(L);
  sta_lua_open_tune(L);
  push_status_table(L);
  lua_setfield(L, -2, "status");
  lua_pushstring(L, sta_version());
  lua_setfield(L, -2, "version");
  return 1;
}

