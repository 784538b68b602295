/*
** sta_lua.h -- what the C files of the Lua module (build/lua/sta/core.so)
** share: the userdata layouts of sta_core.c and its error helpers, so
** that the other C files under lua/ (sta_dist.c) need not copy them.
*/
#ifndef STA_LUA_H
#define STA_LUA_H

#include <lua.h>

#include "sta.h"

#define STA_LUA_TENSOR "sta.Tensor"
#define STA_LUA_GEOMETRY "sta.Geometry"   /* userdata: a plain sta_geometry */
#define STA_LUA_STRATEGY "sta.Strategy"

typedef struct sta_lua_tensor { sta_tensor *t; } sta_lua_tensor;       /* NULL: released */
typedef struct sta_lua_strategy { sta_strategy *s; } sta_lua_strategy; /* NULL: released */

/* Raise sta_last_error() (status groups 100-300 and STA_ERR_ENV), or push
** nil, message, code (400, 500, 600) and return 3. */
int sta_lua_fail(lua_State *L, sta_status rc);
/* Raise a formatted message with no position prefix. */
int sta_lua_misuse(lua_State *L, const char *fmt, ...);
/* The live tensor at idx, else raise "<name>: expected a tensor, got ..." /
** "<name>: tensor is released". */
sta_tensor *sta_lua_check_tensor(lua_State *L, int idx, const char *name);
/* Push a new tensor userdata that owns t (counted, collected, closable). */
void sta_lua_push_tensor(lua_State *L, sta_tensor *t);
sta_strategy *sta_lua_check_strategy(lua_State *L, int idx);
sta_geometry *sta_lua_check_geometry(lua_State *L, int idx);

#endif
