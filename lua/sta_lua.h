/*
** sta_lua.h -- what the C files of the Lua module (build/lua/sta/core.so)
** share.  One file per class, as LuaSocket and luv are laid out:
**   auxlib.c    errors, device-memory pressure, argument readers, classes
**   tensor.c    sta.Tensor              files.c     .npy, .safetensors
**   geometry.c  sta.Geometry, tiling    attention.c  the attention calls
**   sparse.c    block lists, VSA, the cube order
**   strategy.c  sta.Strategy, sta.Metadata
**   batch.c     sta.ForwardBatch        context.c   sta.Context
**   layer.c     sta.Layer
**   tune.c      sta.tune                core.c      luaopen_sta_core
**   dist.c      sta.Comm, sta.SPLayer (luaopen_sta_dist)
**
** Errors, two channels (as Lua's io library), in every file through
** sta_lua_fail and sta_lua_misuse:
**   - misuse raises: bad arguments, wrong types, a state that does not
**     allow the call, unsupported requests (status groups 100, 200, 300)
**     and STA_ERR_ENV ("STA_ATTENTION_CONFIG is not set", which STA.md
**     section 9 wants raised).  The error value is exactly sta_last_error()
**     (or a binding message naming the argument and value), a string with
**     no position prefix, so callers can compare it.
**   - failures of the environment return nil, message, code: out of host
**     or device memory (400), device failures (500), files (600).
** Indices: tensor dimensions and element indices are 1-based (Lua);
** domain ids -- step, layer, head, tile coordinates -- are 0-based as in
** STA.md and the strategy files ("14_3_7").
** Device memory: the collector does not see it, so every allocation on a
** device steps the collector when sta_device_bytes_in_use() is above a soft
** limit, and an STA_ERR_DEVICE_NOMEM is retried once after a full collect.
** Objects: userdata created released (NULL handle) before allocating;
** __gc and __close are one idempotent release; views pin their base with a
** user value; forward contexts are kept per coroutine (context.c) and put
** on the core's stack only for the length of a call that reads them.
*/
#ifndef STA_LUA_H
#define STA_LUA_H

#include <stdint.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"

#define STA_LUA_TENSOR "sta.Tensor"
#define STA_LUA_GEOMETRY "sta.Geometry"   /* userdata: a plain sta_geometry */
#define STA_LUA_STRATEGY "sta.Strategy"
#define STA_LUA_METADATA "sta.Metadata"
#define STA_LUA_BATCH "sta.ForwardBatch"
#define STA_LUA_CONTEXT "sta.Context"
#define STA_LUA_LAYER "sta.Layer"
#define STA_LUA_COMM "sta.Comm"
#define STA_LUA_SPLAYER "sta.SPLayer"

typedef struct sta_lua_tensor { sta_tensor *t; } sta_lua_tensor;       /* NULL: released */
typedef struct sta_lua_strategy { sta_strategy *s; } sta_lua_strategy; /* NULL: released */

/* ---- errors (auxlib.c) ---------------------------------------------------- */

/* The one error policy (auxlib.c): raise sta_last_error() for misuse
** (status groups 100-300 and STA_ERR_ENV), or push nil, message, code for
** failures of the environment (400, 500, 600) and return 3. */
int sta_lua_fail(lua_State *L, sta_status rc);
/* Raise a formatted message with no position prefix. */
int sta_lua_misuse(lua_State *L, const char *fmt, ...);

/* ---- device memory (auxlib.c) --------------------------------------------- */

/* rc = expr, run again after a full collect when the device is out of memory. */
#define STA_LUA_CALL(rc, expr)                                              \
  do {                                                                      \
    (rc) = (expr);                                                          \
    if ((rc) == STA_ERR_DEVICE_NOMEM) {                                     \
      lua_gc(L, LUA_GCCOLLECT);                                             \
      (rc) = (expr);                                                        \
    }                                                                       \
  } while (0)
/* A long call (attention, layer forwards): while sta.interruptible(true)
** is on, SIGINT raises the core's cancel flag (sta_cancel), so the call
** stops at its next work item with STA_ERR_CANCELLED; the previous handler
** runs too (lua.c's, which stops the chunk), and the flag is cleared when
** the call returns. */
#define STA_LUA_LONG(rc, expr)                                              \
  do {                                                                      \
    sta_lua_long_begin();                                                   \
    STA_LUA_CALL(rc, expr);                                                 \
    sta_lua_long_end();                                                     \
  } while (0)
void sta_lua_long_begin(void);
void sta_lua_long_end(void);
void sta_lua_set_interruptible(int on);
int sta_lua_interruptible(void);
/* Step the collector when device bytes in use pass the soft limit. */
void sta_lua_device_pressure(lua_State *L);
int64_t sta_lua_device_soft_limit(void);
void sta_lua_set_device_soft_limit(int64_t bytes);

/* ---- arguments (auxlib.c) ------------------------------------------------- */

/* Argument idx as a 32-bit integer; raise "<name>: expected a 32-bit
** integer, got N" outside int32 (no silent truncation), or on a non-integer. */
int32_t sta_lua_check_int32(lua_State *L, int idx, const char *name);
int32_t sta_lua_opt_int32(lua_State *L, int idx, const char *name, int32_t def);
/* An int32 field of the options table at t, def when absent, range-checked. */
int32_t sta_lua_int32_field(lua_State *L, int t, const char *k, int32_t def);
/* Fields of the options table at t, def when absent; raise on a wrong type. */
lua_Integer sta_lua_int_field(lua_State *L, int t, const char *k, lua_Integer def);
double sta_lua_num_field(lua_State *L, int t, const char *k, double def);
int sta_lua_bool_field(lua_State *L, int t, const char *k, int def);
/* String field or NULL; the string stays alive in the table. */
const char *sta_lua_str_field(lua_State *L, int t, const char *k);
/* The options table at idx (which must exist: lua_settop first) checked
** against the schema of call in lua/sta/options.lua (keys, kinds, ranges,
** required options) and replaced by its normalized plain copy: triples and
** windows as tables of integers (their string spellings parsed), aliases
** under their names, absent options absent (the core's defaults apply).
** Misuse raises the schema's message, the same as the FFI's and Python's. */
void sta_lua_options(lua_State *L, int idx, const char *call);
/* luaopen: require "sta.options" once for sta_lua_options. */
void sta_lua_load_options(lua_State *L);
/* Raise unless idx is none, nil or a table whose keys are all in keys
** (NULL-terminated): "options: unknown key 'windws' (known: ...)". */
void sta_lua_check_opts(lua_State *L, int idx, const char *const *keys);
/* The same for a table known to be there. */
void sta_lua_check_keys(lua_State *L, int idx, const char *const *keys);
/* Exactly n integers from the table at idx into out. */
void sta_lua_int_list(lua_State *L, int idx, int32_t *out, int n, const char *name);
void sta_lua_push_ints(lua_State *L, const int32_t *v, int n);
/* "cpu" ("host") or "cuda" ("cuda:0", "gpu"); name: the argument, for the
** message. */
sta_device sta_lua_parse_device(lua_State *L, const char *s, const char *name);
const char *sta_lua_device_name(sta_device d);
sta_dtype sta_lua_parse_dtype(lua_State *L, const char *s);
/* "bshd" (also NULL) or "bhsd", either case. */
sta_layout sta_lua_parse_layout(lua_State *L, const char *s);
/* "exact" (also NULL) or "fast": sta_attention_desc.softmax. */
sta_softmax sta_lua_parse_softmax(lua_State *L, const char *s);
/* "native" (also NULL) or "fp8": sta_attention_desc.precision. */
sta_precision sta_lua_parse_precision(lua_State *L, const char *s);
/* "untiled" (also NULL) or "tiled" (FastVideo's): sta_geometry.order. */
sta_order sta_lua_parse_order(lua_State *L, const char *s);
const char *sta_lua_order_name(sta_order o);
/* Shape from a table of 1..4 sizes at idx; returns the dimensions. */
int32_t sta_lua_read_shape(lua_State *L, int idx, int64_t shape[4]);
/* Windows list {{Kt,Kh,Kw}, ...} at idx into a userdata array left on the
** stack. */
int32_t *sta_lua_window_list(lua_State *L, int idx, int32_t *n, const char *name);
/* Windows at idx: {Kt, Kh, Kw} for every head, or a list of them, one per
** head; a userdata array left on the stack.  nil raises (no default). */
int32_t *sta_lua_windows(lua_State *L, int idx, int32_t *n);
void sta_lua_push_window_list(lua_State *L, const int32_t *w, int32_t n);

/* ---- classes (auxlib.c) --------------------------------------------------- */

/* Metatable name with meta and a methods table (also __index when
** index_is_methods); safe to run twice. */
void sta_lua_new_class(lua_State *L, const char *name, const luaL_Reg *meta,
                       const luaL_Reg *methods, int index_is_methods);
/* A userdata in the registry under key whose __gc calls gc at lua_close. */
void sta_lua_registry_sentinel(lua_State *L, const char *key, lua_CFunction gc);

/* ---- the classes' shared entry points ---------------------------------- */

/* tensor.c: a released tensor userdata; counting once u->t is set. */
sta_lua_tensor *sta_lua_new_tensor(lua_State *L);
void sta_lua_tensor_born(lua_State *L, sta_lua_tensor *u);
/* The live tensor at idx, else raise "<name>: expected a tensor, got ..." /
** "<name>: tensor is released". */
sta_tensor *sta_lua_check_tensor(lua_State *L, int idx, const char *name);
/* New contiguous tensor pushed as *uo; 1, or what sta_lua_fail returns. */
int sta_lua_push_new_tensor(lua_State *L, sta_dtype dt, sta_device dev, int32_t nd,
                            const int64_t *shape, sta_lua_tensor **uo);
/* A new contiguous tensor of t's shape, dtype and device pushed as *out; 1,
** or what sta_lua_fail returns. */
int sta_lua_push_like(lua_State *L, const sta_tensor *t, sta_tensor **out);
/* files.c: t:save(path [, name]) */
int sta_lua_tensor_save(lua_State *L);
/* geometry.c */
sta_geometry *sta_lua_check_geometry(lua_State *L, int idx);
/* Geometry from options at idx: geometry=G, or canvas={T,H,W}, tile=,
** text_len=, order=.  Returns 0 when no canvas was given (g: canvas
** 0,0,0 with the tile, text_len and order given). */
int sta_lua_read_geometry(lua_State *L, int idx, sta_geometry *g);
/* attention.c: the descriptor of an attention call from its options at
** opts (which must exist), checked against the schema of call and replaced
** by the normalized copy; canvas absent: the known shape of q's length.
** d->windows lives in a userdata left on the stack: keep it there. */
void sta_lua_read_desc(lua_State *L, int opts, const char *call, sta_tensor *q,
                       sta_attention_desc *d);
/* d as the options table sta_lua_read_desc reads back (unset fields left
** out), pushed. */
void sta_lua_push_desc(lua_State *L, const sta_attention_desc *d);
/* *out: the tensor opts[key] if given, else a new one like t; pushed.  1,
** or what sta_lua_fail returns. */
int sta_lua_opt_or_like(lua_State *L, int opts, const char *key, sta_tensor *t, sta_tensor **out);
/* A forward's outputs from its options at opts (a table or nil): out
** (opts.out, else a new one like q, which must be 4-D) and, when opts.lse
** asks (*want_lse), lse (opts.lse, else a new f32 [B, heads, S] on q's
** device), pushed in that order.  1, or what sta_lua_fail returns. */
int sta_lua_push_outputs(lua_State *L, int opts, sta_tensor *q, sta_layout layout,
                         sta_tensor **out, sta_tensor **lse, int *want_lse);
/* The lse to write, pushed: opts.lse if it is a tensor (*lse already set),
** else a new f32 [B, heads, S] on q's device.  1, or what sta_lua_fail
** returns. */
int sta_lua_push_lse(lua_State *L, int opts, sta_tensor *q, sta_layout layout, sta_tensor **lse);
/* sparse.c: the VSA of a call's options at opts (which must exist; checked
** against the schema of call and replaced by the normalized copy): canvas,
** cube, sparsity or topk, layout, scale, deterministic; the cube sizes an
** i32 tensor on q's device left on the stack (keep it there); q's and k's
** rows must be the canvas's cube order.  *gate: the gate option or NULL. */
void sta_lua_read_vsa(lua_State *L, int opts, const char *call, sta_tensor *q,
                      sta_tensor *k, sta_vsa_desc *d, sta_tensor **gate);
/* The options of sta.vsa_backward that reproduce a VSA call (canvas, cube,
** topk, layout, scale; gate when not NULL, the tensor at gate_idx), pushed. */
void sta_lua_push_vsa(lua_State *L, const sta_vsa_desc *d, const int32_t canvas[3],
                      const int32_t cube[3], int gate_idx);
/* sta.vsa_backward's work after its options: dq, dk, dv (and dgate with a
** gate) from grads (a table or nil: dq=, dk=, dv=, dgate=) or new; pushed,
** returns their count or what sta_lua_fail returns.  t: q, k, v, out, lse,
** dout. */
int sta_lua_vsa_backward(lua_State *L, const sta_vsa_desc *d, sta_tensor *const *t,
                         sta_tensor *gate, int grads);
/* strategy.c */
sta_lua_strategy *sta_lua_new_strategy(lua_State *L);
sta_strategy *sta_lua_check_strategy(lua_State *L, int idx);
sta_metadata *sta_lua_check_metadata(lua_State *L, int idx);
/* batch.c: the live forward batch at idx, else raise naming "batch". */
sta_forward_batch *sta_lua_check_batch(lua_State *L, int idx);
/* layer.c: sta.layer's options at opts that SP layers share (prefix=,
** layer=, heads=, head_dim=, backend=, scale=, softmax=, precision=, strategy=) into d, the
** strategy and prefix pinned in the table at pins. */
void sta_lua_layer_desc(lua_State *L, int opts, int pins, sta_layer_desc *d);
/* Around a core call that reads the live forward context: push on this OS
** thread's core stack the context the running coroutine sees (context.c;
** raises when that context was collected without being closed), and pop it
** again.  NULL: the coroutine sees none of the binding's contexts. */
sta_context *sta_lua_context_enter(lua_State *L);
void sta_lua_context_leave(sta_context *c);
/* layer:set_strategy(s or nil) for l, the layer at 1; pins s in its user
** value 1. */
int sta_lua_layer_set_strategy(lua_State *L, sta_layer *l);

/* Each adds its classes and functions to the module table on top. */
void sta_lua_open_tensor(lua_State *L);
void sta_lua_open_files(lua_State *L);
void sta_lua_open_geometry(lua_State *L);
void sta_lua_open_strategy(lua_State *L);
void sta_lua_open_attention(lua_State *L);
void sta_lua_open_sparse(lua_State *L);
void sta_lua_open_batch(lua_State *L);
void sta_lua_open_context(lua_State *L);
void sta_lua_open_layer(lua_State *L);
void sta_lua_open_tune(lua_State *L);

#endif
