/*
** runtime.c -- what a pipeline runs with, in the Lua module: the
** sta.ForwardBatch, sta.Context (to-be-closed forward contexts, anchored
** in the registry while pushed) and sta.Layer classes.
*/
#include <stdint.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- forward batch ------------------------------------------------------- */

typedef struct { sta_forward_batch *fb; } LBatch;

static sta_forward_batch *check_batch(lua_State *L, int idx) {
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

/* forward_batch{batch_size=1, negative=false} */
static int l_forward_batch(lua_State *L) {
  static const char *const keys[] = {"batch_size", "negative", NULL};
  sta_lua_check_opts(L, 1, keys);
  int32_t bs = lua_istable(L, 1) ? sta_lua_int32_field(L, 1, "batch_size", 1) : 1;
  int neg = lua_istable(L, 1) ? sta_lua_bool_field(L, 1, "negative", 0) : 0;
  LBatch *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->fb = NULL;
  luaL_setmetatable(L, STA_LUA_BATCH);
  sta_status rc = sta_forward_batch_create(&u->fb, bs);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_forward_batch_set_negative(u->fb, neg);
  return 1;
}

static int b_size(lua_State *L) {
  lua_pushinteger(L, sta_forward_batch_size(check_batch(L, 1)));
  return 1;
}

/* fb:negative() -> flag; fb:negative(flag) sets it */
static int b_negative(lua_State *L) {
  sta_forward_batch *fb = check_batch(L, 1);
  if (!lua_isnone(L, 2)) {
    sta_forward_batch_set_negative(fb, lua_toboolean(L, 2));
    lua_settop(L, 1);
    return 1;
  }
  lua_pushboolean(L, sta_forward_batch_is_negative(fb));
  return 1;
}

static int b_records(lua_State *L) {
  lua_pushinteger(L, sta_forward_batch_records(check_batch(L, 1), lua_toboolean(L, 2)));
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
  sta_forward_batch *fb = check_batch(L, 1);
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
  sta_forward_batch *fb = check_batch(L, 1);
  const char *path = luaL_checkstring(L, 2);
  sta_status rc = sta_forward_batch_save_search(fb, lua_toboolean(L, 3), path);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int b_clear(lua_State *L) {
  sta_forward_batch_clear(check_batch(L, 1));
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

static int l_forward_context(lua_State *L) {
  static const char *const keys[] = {"step", "metadata", "batch", NULL};
  sta_lua_check_opts(L, 1, keys);
  int32_t step = 0;
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  lua_settop(L, 1);
  lua_createtable(L, 0, 2); /* 2: pins */
  if (lua_istable(L, 1)) {
    step = sta_lua_int32_field(L, 1, "step", 0);
    if (lua_getfield(L, 1, "metadata") != LUA_TNIL) {
      md = sta_lua_check_metadata(L, -1);
      lua_setfield(L, 2, "metadata");
    } else lua_pop(L, 1);
    if (lua_getfield(L, 1, "batch") != LUA_TNIL) {
      fb = check_batch(L, -1);
      lua_setfield(L, 2, "batch");
    } else lua_pop(L, 1);
  }
  if (step < 0) return sta_lua_misuse(L, "step: expected >= 0, got %d", (int)step);
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

/* ---- layers -------------------------------------------------------------- */

typedef struct { sta_layer *l; } LLayer;

static sta_layer *check_layer(lua_State *L, int idx) {
  LLayer *u = luaL_testudata(L, idx, STA_LUA_LAYER);
  if (!u) sta_lua_misuse(L, "layer: expected a layer, got %s", luaL_typename(L, idx));
  if (!u->l) sta_lua_misuse(L, "layer: released");
  return u->l;
}

static int y_release(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, STA_LUA_LAYER);
  if (u->l) { sta_layer_destroy(u->l); u->l = NULL; }
  return 0;
}

/* layer{prefix= or layer=, heads=, head_dim=, sp_rank=, sp_size=, canvas=,
** tile=, text_len=, order=, layout=, backend=, scale=, softmax=, precision=,
** strategy=} */
void sta_lua_layer_desc(lua_State *L, int opts, int pins, sta_layer_desc *d) {
  d->prefix = sta_lua_str_field(L, opts, "prefix");
  d->layer_index = sta_lua_int32_field(L, opts, "layer", 0);
  d->local_heads = sta_lua_int32_field(L, opts, "heads", 0);
  d->head_dim = sta_lua_int32_field(L, opts, "head_dim", 0);
  const char *be = sta_lua_str_field(L, opts, "backend");
  d->backend = be ? sta_lua_parse_device(L, be, "backend") : STA_CPU;
  d->scale = (float)sta_lua_num_field(L, opts, "scale", 0);
  d->softmax = sta_lua_parse_softmax(L, sta_lua_str_field(L, opts, "softmax"));
  d->precision = sta_lua_parse_precision(L, sta_lua_str_field(L, opts, "precision"));
  if (lua_getfield(L, opts, "strategy") != LUA_TNIL) {
    d->strategy = sta_lua_check_strategy(L, -1);
    lua_setfield(L, pins, "strategy");
  } else lua_pop(L, 1);
  if (d->prefix) {
    lua_getfield(L, opts, "prefix");
    lua_setfield(L, pins, "prefix");
  }
}

static int l_layer(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  static const char *const keys[] = {"prefix", "layer", "heads", "head_dim", "backend", "scale",
                                     "softmax", "precision", "strategy", "sp_rank", "sp_size",
                                     "geometry",
                                     "canvas", "tile", "text_len", "order", "layout", NULL};
  sta_lua_check_keys(L, 1, keys);
  lua_settop(L, 1);
  lua_createtable(L, 0, 2); /* 2: pins */
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  sta_lua_layer_desc(L, 1, 2, &d);
  d.sp_rank = sta_lua_int32_field(L, 1, "sp_rank", 0);
  d.sp_size = sta_lua_int32_field(L, 1, "sp_size", 1);
  sta_lua_read_geometry(L, 1, &d.geom);
  d.layout = sta_lua_parse_layout(L, sta_lua_str_field(L, 1, "layout"));
  LLayer *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->l = NULL;
  luaL_setmetatable(L, STA_LUA_LAYER);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  sta_status rc = sta_layer_create(&u->l, &d);
  return rc == STA_OK ? 1 : sta_lua_fail(L, rc);
}

/* layer:forward(q, k, v [, out | {out =, lse = true | tensor}]) -> out [, lse] */
static int y_forward(lua_State *L) {
  sta_layer *l = check_layer(L, 1);
  sta_tensor *q = sta_lua_check_tensor(L, 2, "q");
  sta_tensor *k = sta_lua_check_tensor(L, 3, "k");
  sta_tensor *v = sta_lua_check_tensor(L, 4, "v");
  sta_tensor *out = NULL, *lse = NULL;
  int want_lse = 0, r;
  lua_settop(L, 5);
  if (lua_istable(L, 5)) {
    static const char *const keys[] = {"out", "lse", NULL};
    sta_lua_check_opts(L, 5, keys);
    if (lua_getfield(L, 5, "out") != LUA_TNIL) out = sta_lua_check_tensor(L, -1, "out");
    if (lua_getfield(L, 5, "lse") != LUA_TNIL) {
      if (lua_isboolean(L, -1)) want_lse = lua_toboolean(L, -1);
      else { lse = sta_lua_check_tensor(L, -1, "lse"); want_lse = 1; }
    }
    lua_settop(L, 5);
  } else if (!lua_isnil(L, 5)) {
    out = sta_lua_check_tensor(L, 5, "out");
  }
  if (out && lua_istable(L, 5)) lua_getfield(L, 5, "out");
  else if (out) lua_pushvalue(L, 5);
  else if ((r = sta_lua_push_like(L, q, &out)) != 1) return r;
  if (want_lse) {
    if (lse) lua_getfield(L, 5, "lse");
    else {
      if (sta_tensor_ndim(q) != 4)
        return sta_lua_misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
      int bshd = sta_layer_layout(l) == STA_BSHD;
      int64_t shape[3] = {sta_tensor_size(q, 0), sta_tensor_size(q, bshd ? 2 : 1),
                          sta_tensor_size(q, bshd ? 1 : 2)};
      sta_lua_tensor *u;
      if ((r = sta_lua_push_new_tensor(L, STA_F32, sta_tensor_device(q), 3, shape, &u)) != 1)
        return r;
      lse = u->t;
    }
  }
  sta_status rc;
  sta_context *c = sta_lua_context_enter(L);
  STA_LUA_LONG(rc, sta_layer_forward_lse(l, q, k, v, out, lse));
  sta_lua_context_leave(c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return want_lse ? 2 : 1;
}

/* layer:backward(q, k, v, out, lse, dout [, {dq =, dk =, dv =}]) -> dq, dk,
** dv, under the live context of the forward */
static int y_backward(lua_State *L) {
  static const char *N[6] = {"q", "k", "v", "out", "lse", "dout"}, *G[3] = {"dq", "dk", "dv"};
  sta_layer *l = check_layer(L, 1);
  sta_tensor *t[6], *g[3];
  for (int i = 0; i < 6; i++) t[i] = sta_lua_check_tensor(L, i + 2, N[i]);
  static const char *const keys[] = {"dq", "dk", "dv", NULL};
  sta_lua_check_opts(L, 8, keys);
  lua_settop(L, 8);
  for (int i = 0; i < 3; i++) {
    if (lua_istable(L, 8) && lua_getfield(L, 8, G[i]) != LUA_TNIL) {
      g[i] = sta_lua_check_tensor(L, -1, G[i]);
      continue;
    }
    if (lua_istable(L, 8)) lua_pop(L, 1);
    int r = sta_lua_push_like(L, t[0], &g[i]);
    if (r != 1) return r;
  }
  sta_status rc;
  sta_context *c = sta_lua_context_enter(L);
  STA_LUA_LONG(rc, sta_layer_backward(l, t[0], t[1], t[2], t[3], t[4], t[5], g[0], g[1], g[2]));
  sta_lua_context_leave(c);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 3;
}

static int y_index(lua_State *L) {
  lua_pushinteger(L, sta_layer_index(check_layer(L, 1)));
  return 1;
}

int sta_lua_layer_set_strategy(lua_State *L, sta_layer *l) {
  const sta_strategy *s = lua_isnoneornil(L, 2) ? NULL : sta_lua_check_strategy(L, 2);
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "strategy");
  sta_layer_set_strategy(l, s);
  lua_settop(L, 1);
  return 1;
}

static int y_set_strategy(lua_State *L) {
  return sta_lua_layer_set_strategy(L, check_layer(L, 1));
}

static int y_tostring(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, STA_LUA_LAYER);
  if (!u->l) lua_pushliteral(L, "sta.Layer(released)");
  else lua_pushfstring(L, "sta.Layer(%d)", (int)sta_layer_index(u->l));
  return 1;
}

static int l_layer_index_from_prefix(lua_State *L) {
  int32_t i;
  sta_status rc = sta_layer_index_from_prefix(luaL_checkstring(L, 1), &i);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushinteger(L, i);
  return 1;
}

/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg batch_meta[] = {
  {"__gc", b_release}, {"__close", b_release}, {"__tostring", b_tostring}, {NULL, NULL}};
static const luaL_Reg batch_methods[] = {
  {"release", b_release}, {"size", b_size}, {"negative", b_negative},
  {"records", b_records}, {"record", b_record}, {"save_search", b_save_search},
  {"clear", b_clear}, {NULL, NULL}};

static const luaL_Reg context_meta[] = {
  {"__close", c_pop}, {"__gc", c_gc}, {"__tostring", c_tostring}, {NULL, NULL}};
static const luaL_Reg context_methods[] = {
  {"pop", c_pop}, {"step", c_step}, {"metadata", c_metadata},
  {"batch", c_batch}, {"live", c_live}, {NULL, NULL}};

static const luaL_Reg layer_meta[] = {
  {"__gc", y_release}, {"__close", y_release}, {"__tostring", y_tostring}, {NULL, NULL}};
static const luaL_Reg layer_methods[] = {
  {"release", y_release}, {"forward", y_forward}, {"backward", y_backward},
  {"index", y_index},
  {"set_strategy", y_set_strategy}, {NULL, NULL}};
static const luaL_Reg runtime_funcs[] = {
  {"forward_batch", l_forward_batch}, {"forward_context", l_forward_context},
  {"current_context", l_current_context}, {"in_forward_pass", l_in_forward_pass},
  {"context_depth", l_context_depth},
  {"layer", l_layer}, {"layer_index_from_prefix", l_layer_index_from_prefix},
  {NULL, NULL}};

void sta_lua_open_runtime(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_BATCH, batch_meta, batch_methods, 1);
  sta_lua_new_class(L, STA_LUA_CONTEXT, context_meta, context_methods, 1);
  sta_lua_new_class(L, STA_LUA_LAYER, layer_meta, layer_methods, 1);
  luaL_setfuncs(L, runtime_funcs, 0);
}
