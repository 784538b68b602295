/*
** context.c -- the sta.Context class of the Lua module: to-be-closed
** forward contexts, kept per coroutine (STA.md section 6) and put on the
** core's stack only around a call that reads them.
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- contexts ------------------------------------------------------------ */

/* Contexts live per coroutine (STA.md section 6), as Python's contextvars
** do per task: each Lua thread has its own stack, a Lua table
**   { n = depth, steps = {step of each level}, [level] = context (weak) }
** (contexts in the weak-valued subtable ctx: { n =, steps = {...}, ctx =
** {[level] = context} }) kept in the registry under STA_LUA_STACKS, weakly
** keyed by the thread.  A
** coroutine that pushed nothing sees the main coroutine's stack.  The core
** stack of the OS thread only ever holds a context for the length of one
** call that reads it (sta_lua_context_enter/leave), so coroutines that
** yield with contexts open cannot disorder it.  A context collected
** without being popped leaves its level empty: the next forward that
** would have used it raises naming the leak, and the level goes. */
#define STA_LUA_STACKS "sta.context_stacks"

typedef struct {
  int32_t step;
  sta_metadata *md;       /* a reference of this context (sta_metadata_retain) */
  sta_forward_batch *fb;  /* likewise */
  int32_t level;          /* 1.. in its stack; 0: popped */
} LContext;

/* Push the stack table of thread th (the value at index th), made on
** first use. */
static void stack_of(lua_State *L, int th) {
  th = lua_absindex(L, th);
  if (luaL_getsubtable(L, LUA_REGISTRYINDEX, STA_LUA_STACKS) == 0) {
    lua_createtable(L, 0, 1);
    lua_pushliteral(L, "k");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
  }
  lua_pushvalue(L, th);
  if (lua_rawget(L, -2) == LUA_TNIL) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 3);
    lua_newtable(L);
    lua_createtable(L, 0, 1); /* weak values: a forgotten context can be collected */
    lua_pushliteral(L, "v");
    lua_setfield(L, -2, "__mode");
    lua_setmetatable(L, -2);
    lua_setfield(L, -2, "ctx");
    lua_pushinteger(L, 0);
    lua_setfield(L, -2, "n");
    lua_newtable(L);
    lua_setfield(L, -2, "steps");
    lua_pushvalue(L, th);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
  }
  lua_remove(L, -2);
}

static lua_Integer stack_n(lua_State *L, int st) {
  lua_getfield(L, st, "n");
  lua_Integer n = lua_tointeger(L, -1);
  lua_pop(L, 1);
  return n;
}

static void stack_set_n(lua_State *L, int st, lua_Integer n) {
  lua_pushinteger(L, n);
  lua_setfield(L, st, "n");
}

/* Push the context at level lv of stack st (nil: collected or none). */
static void stack_get(lua_State *L, int st, lua_Integer lv) {
  lua_getfield(L, st, "ctx");
  lua_rawgeti(L, -1, lv);
  lua_remove(L, -2);
}

/* Set level lv of stack st to the value on top (popped). */
static void stack_put(lua_State *L, int st, lua_Integer lv) {
  lua_getfield(L, st, "ctx");
  lua_insert(L, -2);
  lua_rawseti(L, -2, lv);
  lua_pop(L, 1);
}

/* The stack the running coroutine sees: its own when it holds a level,
** else the main coroutine's.  Pushes it. */
static void visible_stack(lua_State *L) {
  lua_pushthread(L);
  stack_of(L, -1);
  lua_remove(L, -2);
  if (stack_n(L, lua_gettop(L)) == 0) {
    lua_pop(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
    stack_of(L, -1);
    lua_remove(L, -2);
  }
}

/* Raise for a context that was collected at level lv of stack st (and drop
** it, with the collected levels right below it): the forward it would have
** served does not run. */
static int leaked(lua_State *L, int st, lua_Integer lv) {
  lua_getfield(L, st, "steps");
  lua_rawgeti(L, -1, lv);
  lua_Integer step = lua_tointeger(L, -1), below = lv - 1;
  lua_pop(L, 2);
  for (; below > 0; below--) {
    stack_get(L, st, below);
    int live = lua_touserdata(L, -1) != NULL;
    lua_pop(L, 1);
    if (live) break;
  }
  stack_set_n(L, st, below);
  if (below < lv - 1)
    return sta_lua_misuse(L,
                          "forward context: the context of step %I (level %I) and %I below it were "
                          "garbage-collected without being closed; they have been popped (open "
                          "contexts with `local ctx <close> = sta.forward_context{...}`)", step, lv,
                          lv - 1 - below);
  return sta_lua_misuse(L,
                        "forward context: the context of step %I (level %I) was garbage-collected "
                        "without being closed; it has been popped (open contexts with `local ctx "
                        "<close> = sta.forward_context{...}`)", step, lv);
}

/* The innermost live context the running coroutine sees, or NULL; raises
** when that level's context was collected (leak). */
static LContext *innermost(lua_State *L) {
  visible_stack(L);
  int st = lua_gettop(L);
  lua_Integer n = stack_n(L, st);
  LContext *u = NULL;
  if (n > 0) {
    stack_get(L, st, n);
    u = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (!u) leaked(L, st, n);
  }
  lua_pop(L, 1);
  return u;
}

sta_context *sta_lua_context_enter(lua_State *L) {
  LContext *u = innermost(L);
  if (!u) return NULL; /* none of ours: the thread's own stack (contexts from C) decides */
  sta_context *c = NULL;
  if (sta_context_push(&c, u->step, u->md, u->fb) != STA_OK)
    sta_lua_misuse(L, "%s", sta_last_error());
  return c;
}

void sta_lua_context_leave(sta_context *c) {
  if (c) sta_context_pop(c);
}

/* forward_context{step=, metadata=, batch=} (sta.options; sta.forward_context
** of init.lua builds the metadata from strategy=, layers=, heads=) */
static int l_forward_context(lua_State *L) {
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  lua_settop(L, 1);
  sta_lua_options(L, 1, "forward_context"); /* fills step's default */
  lua_createtable(L, 0, 2); /* 2: pins */
  int32_t step = sta_lua_int32_field(L, 1, "step", 0);
  if (lua_getfield(L, 1, "strategy") != LUA_TNIL)
    return sta_lua_misuse(L, "strategy: give it to sta.forward_context (sta.core's takes metadata=)");
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "metadata") != LUA_TNIL) {
    md = sta_lua_check_metadata(L, -1);
    lua_setfield(L, 2, "metadata");
  } else lua_pop(L, 1);
  if (lua_getfield(L, 1, "batch") != LUA_TNIL) {
    fb = sta_lua_check_batch(L, -1);
    lua_setfield(L, 2, "batch");
  } else lua_pop(L, 1);
  lua_pushthread(L);
  stack_of(L, -1); /* 4: this coroutine's stack */
  lua_Integer n = stack_n(L, 4);
  if (n >= (1 << 16))
    return sta_lua_misuse(L, "forward context: stack too deep (%d contexts)", (int)n);
  LContext *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->step = step;
  u->md = NULL;
  u->fb = NULL;
  u->level = 0;
  luaL_setmetatable(L, STA_LUA_CONTEXT);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  /* the context's own references, dropped when it is popped or collected */
  if (md) sta_metadata_retain(u->md = md);
  if (fb) sta_forward_batch_retain(u->fb = fb);
  u->level = (int32_t)n + 1;
  lua_pushvalue(L, -1);
  stack_put(L, 4, n + 1);
  lua_getfield(L, 4, "steps");
  lua_pushinteger(L, step);
  lua_rawseti(L, -2, n + 1);
  lua_pop(L, 1);
  stack_set_n(L, 4, n + 1);
  return 1;
}

static void drop_refs(LContext *u) {
  sta_metadata_destroy(u->md);
  sta_forward_batch_destroy(u->fb);
  u->md = NULL;
  u->fb = NULL;
  u->level = 0;
}

/* ctx:pop() / __close: pops once; later calls do nothing.  Levels above it
** whose contexts were collected go with it. */
static int c_pop(lua_State *L) {
  LContext *u = luaL_checkudata(L, 1, STA_LUA_CONTEXT);
  if (!u->level) return 0;
  /* find the stack holding it: the running coroutine's, else the main one's */
  lua_pushthread(L);
  stack_of(L, -1);
  int st = lua_gettop(L);
  int found = 0;
  for (int pass = 0; pass < 2 && !found; pass++) {
    if (pass) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, LUA_RIDX_MAINTHREAD);
      stack_of(L, -1);
      lua_replace(L, st);
      lua_pop(L, 1);
    }
    stack_get(L, st, u->level);
    found = lua_touserdata(L, -1) == u;
    lua_pop(L, 1);
  }
  if (!found)
    return sta_lua_misuse(L, "forward context: pop of a context of another coroutine (step %d)",
                          (int)u->step);
  lua_Integer n = stack_n(L, st);
  for (lua_Integer i = n; i > u->level; i--) {
    stack_get(L, st, i);
    int live = lua_touserdata(L, -1) != NULL;
    lua_pop(L, 1);
    if (live)
      return sta_lua_misuse(L,
                            "forward context: pop of a context that is not the innermost (it is "
                            "at level %d of depth %d)", (int)u->level, (int)n);
  }
  for (lua_Integer i = n; i >= u->level; i--) {
    lua_pushnil(L);
    stack_put(L, st, i);
  }
  stack_set_n(L, st, u->level - 1);
  drop_refs(u);
  return 0;
}

/* __gc: a context collected while pushed (no <close>, no pop): its level
** is already empty (weak); drop its references.  The leak is reported by
** the next forward that would have used it. */
static int c_gc(lua_State *L) {
  LContext *u = luaL_checkudata(L, 1, STA_LUA_CONTEXT);
  drop_refs(u);
  return 0;
}

static LContext *check_live_context(lua_State *L, int idx) {
  LContext *u = luaL_checkudata(L, idx, STA_LUA_CONTEXT);
  if (!u->level) sta_lua_misuse(L, "context: already popped");
  return u;
}

static int c_step(lua_State *L) {
  lua_pushinteger(L, check_live_context(L, 1)->step);
  return 1;
}

static int c_pinned(lua_State *L, const char *field) {
  check_live_context(L, 1);
  lua_getiuservalue(L, 1, 1);
  lua_getfield(L, -1, field);
  return 1;
}
static int c_metadata(lua_State *L) { return c_pinned(L, "metadata"); }
static int c_batch(lua_State *L) { return c_pinned(L, "batch"); }

static int c_live(lua_State *L) {
  lua_pushboolean(L, ((LContext *)luaL_checkudata(L, 1, STA_LUA_CONTEXT))->level != 0);
  return 1;
}

static int c_tostring(lua_State *L) {
  LContext *u = luaL_checkudata(L, 1, STA_LUA_CONTEXT);
  if (!u->level) lua_pushliteral(L, "sta.Context(popped)");
  else lua_pushfstring(L, "sta.Context(step %d)", (int)u->step);
  return 1;
}

/* The innermost live context the running coroutine sees (skipping levels
** whose contexts were collected), pushed, or nil; *depth: its live levels. */
static void visible_live(lua_State *L, int *depth) {
  visible_stack(L);
  int st = lua_gettop(L);
  lua_Integer n = stack_n(L, st);
  int d = 0, pushed = 0;
  for (lua_Integer i = n; i >= 1; i--) {
    stack_get(L, st, i);
    if (lua_touserdata(L, -1)) {
      d++;
      if (!pushed) { pushed = 1; lua_insert(L, st); st++; continue; }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1); /* the stack */
  if (!pushed) lua_pushnil(L);
  *depth = d;
}

static int l_current_context(lua_State *L) {
  int d;
  visible_live(L, &d); /* nil also when only C pushed contexts */
  return 1;
}

static int l_in_forward_pass(lua_State *L) {
  int d;
  visible_live(L, &d);
  LContext *u = lua_touserdata(L, -1);
  lua_pushboolean(L, u ? u->fb != NULL : sta_in_forward_pass());
  return 1;
}

/* Live contexts the running coroutine sees, plus any pushed from C on this
** thread. */
static int l_context_depth(lua_State *L) {
  int d;
  visible_live(L, &d);
  lua_pushinteger(L, d + sta_context_depth());
  return 1;
}
/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg context_meta[] = {
  {"__close", c_pop}, {"__gc", c_gc}, {"__tostring", c_tostring}, {NULL, NULL}};
static const luaL_Reg context_methods[] = {
  {"pop", c_pop}, {"step", c_step}, {"metadata", c_metadata},
  {"batch", c_batch}, {"live", c_live}, {NULL, NULL}};
static const luaL_Reg context_funcs[] = {
  {"forward_context", l_forward_context}, {"current_context", l_current_context},
  {"in_forward_pass", l_in_forward_pass}, {"context_depth", l_context_depth}, {NULL, NULL}};

void sta_lua_open_context(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_CONTEXT, context_meta, context_methods, 1);
  luaL_setfuncs(L, context_funcs, 0);
}
