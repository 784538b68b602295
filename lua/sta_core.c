/*
** sta_core.c -- the Lua 5.4 binding of core/sta.h: require "sta.core".
** lua/sta/init.lua ("sta") builds the documented API on top of this.
**
** Errors, two channels (as Lua's io library):
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
** user value; pushed contexts are anchored in the registry until popped.
*/
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dlfcn.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

#define TENSOR STA_LUA_TENSOR
#define GEOMETRY STA_LUA_GEOMETRY
#define STRATEGY STA_LUA_STRATEGY
#define METADATA "sta.Metadata"
#define BATCH "sta.ForwardBatch"
#define CONTEXT "sta.Context"
#define LAYER "sta.Layer"
#define ANCHOR "sta.contexts" /* registry: lightuserdata ctx -> userdata */

/* fault injection hook of the core (core/internal.h), for specs */
void sta_fault_arm(int64_t n);

static int live_tensors = 0;
static int64_t device_soft_limit = (int64_t)1 << 30;
static uint64_t seed_counter = 0;

/* ---- errors ------------------------------------------------------------ */

/* Raise or return nil, message, code by the status group of rc. */
#define sta_fail sta_lua_fail
int sta_lua_fail(lua_State *L, sta_status rc) {
  int32_t g = sta_status_group(rc);
  if (g >= 400 && rc != STA_ERR_ENV) {
    lua_pushnil(L);
    lua_pushstring(L, sta_last_error());
    lua_pushinteger(L, (lua_Integer)rc);
    return 3;
  }
  lua_pushstring(L, sta_last_error());
  return lua_error(L);
}

/* A binding-level misuse error: plain message, no position. */
#define misuse sta_lua_misuse
int sta_lua_misuse(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return lua_error(L);
}

#define CALL(rc, expr)                                                      \
  do {                                                                      \
    (rc) = (expr);                                                          \
    if ((rc) == STA_ERR_DEVICE_NOMEM) {                                     \
      lua_gc(L, LUA_GCCOLLECT);                                             \
      (rc) = (expr);                                                        \
    }                                                                       \
  } while (0)

static void device_pressure(lua_State *L) {
  if (sta_device_bytes_in_use() > device_soft_limit) lua_gc(L, LUA_GCSTEP, 0);
}

/* ---- argument helpers -------------------------------------------------- */

static lua_Integer int_field(lua_State *L, int t, const char *k, lua_Integer def) {
  lua_Integer v = def;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    int ok;
    v = lua_tointegerx(L, -1, &ok);
    if (!ok) misuse(L, "%s: expected an integer, got %s", k, luaL_tolstring(L, -1, NULL));
  }
  lua_pop(L, 1);
  return v;
}

static double num_field(lua_State *L, int t, const char *k, double def) {
  double v = def;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    if (ty != LUA_TNUMBER) misuse(L, "%s: expected a number, got %s", k, luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static int bool_field(lua_State *L, int t, const char *k, int def) {
  int v = def;
  if (lua_getfield(L, t, k) != LUA_TNIL) v = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

/* String field or NULL; the string stays on the stack's caller table. */
static const char *str_field(lua_State *L, int t, const char *k) {
  const char *s = NULL;
  int ty = lua_getfield(L, t, k);
  if (ty != LUA_TNIL) {
    if (ty != LUA_TSTRING) misuse(L, "%s: expected a string, got %s", k, luaL_typename(L, -1));
    s = lua_tostring(L, -1); /* kept alive by the table */
  }
  lua_pop(L, 1);
  return s;
}

static void check_opts(lua_State *L, int idx) {
  if (!lua_isnoneornil(L, idx) && !lua_istable(L, idx))
    misuse(L, "options: expected a table, got %s", luaL_typename(L, idx));
}

/* Read exactly n integers from the table at idx into out. */
static void int_list(lua_State *L, int idx, int32_t *out, int n, const char *name) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    misuse(L, "%s: expected a table of %d integers, got %s", name, n, luaL_typename(L, idx));
  if ((int)luaL_len(L, idx) != n)
    misuse(L, "%s: expected %d integers, got %d", name, n, (int)luaL_len(L, idx));
  for (int i = 0; i < n; i++) {
    int ok;
    lua_geti(L, idx, i + 1);
    lua_Integer v = lua_tointegerx(L, -1, &ok);
    if (!ok)
      misuse(L, "%s[%d]: expected an integer, got %s", name, i + 1, luaL_tolstring(L, -1, NULL));
    out[i] = (int32_t)v;
    lua_pop(L, 1);
  }
}

static void push_ints(lua_State *L, const int32_t *v, int n) {
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    lua_pushinteger(L, v[i]);
    lua_rawseti(L, -2, i + 1);
  }
}

static sta_device parse_device(lua_State *L, const char *s) {
  if (strcmp(s, "cpu") == 0 || strcmp(s, "host") == 0) return STA_CPU;
  if (strcmp(s, "cuda") == 0 || strcmp(s, "cuda:0") == 0 || strcmp(s, "gpu") == 0)
    return STA_CUDA;
  misuse(L, "device: unknown device '%s' (expected cpu or cuda)", s);
  return STA_CPU;
}

static const char *device_name(sta_device d) { return d == STA_CPU ? "cpu" : "cuda:0"; }

static sta_dtype parse_dtype(lua_State *L, const char *s) {
  sta_dtype d;
  sta_status rc = sta_dtype_parse(s, &d);
  if (rc != STA_OK) sta_fail(L, rc);
  return d;
}

static sta_layout parse_layout(lua_State *L, const char *s) {
  if (!s || strcmp(s, "bshd") == 0 || strcmp(s, "BSHD") == 0) return STA_BSHD;
  if (strcmp(s, "bhsd") == 0 || strcmp(s, "BHSD") == 0) return STA_BHSD;
  misuse(L, "layout: expected \"bshd\" or \"bhsd\", got '%s'", s);
  return STA_BSHD;
}

/* Shape from a table of 1..4 sizes at idx. */
static int32_t read_shape(lua_State *L, int idx, int64_t shape[4]) {
  if (!lua_istable(L, idx))
    misuse(L, "shape: expected a table of 1..4 sizes, got %s", luaL_typename(L, idx));
  lua_Integer n = luaL_len(L, idx);
  if (n < 1 || n > 4) misuse(L, "shape: expected 1..4 sizes, got %d", (int)n);
  for (int i = 0; i < n; i++) {
    int ok;
    lua_geti(L, idx, i + 1);
    shape[i] = (int64_t)lua_tointegerx(L, -1, &ok);
    if (!ok)
      misuse(L, "shape[%d]: expected an integer, got %s", i + 1, luaL_tolstring(L, -1, NULL));
    if (shape[i] < 0) misuse(L, "shape[%d]: expected >= 0, got %I", i + 1, (lua_Integer)shape[i]);
    lua_pop(L, 1);
  }
  return (int32_t)n;
}

/* ---- tensors ----------------------------------------------------------- */

typedef sta_lua_tensor LTensor;

static LTensor *new_tensor_ud(lua_State *L) {
  LTensor *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->t = NULL;
  luaL_setmetatable(L, TENSOR);
  return u;
}

/* Bookkeeping once u->t holds a live tensor. */
static void tensor_born(lua_State *L, LTensor *u) {
  live_tensors++;
  if (sta_tensor_device(u->t) != STA_CPU) device_pressure(L);
}

void sta_lua_push_tensor(lua_State *L, sta_tensor *t) {
  LTensor *u = new_tensor_ud(L);
  u->t = t;
  tensor_born(L, u);
}

static LTensor *check_ltensor(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, TENSOR);
}

#define check_tensor_named sta_lua_check_tensor
sta_tensor *sta_lua_check_tensor(lua_State *L, int idx, const char *name) {
  LTensor *u = luaL_testudata(L, idx, TENSOR);
  if (!u) misuse(L, "%s: expected a tensor, got %s", name, luaL_typename(L, idx));
  if (!u->t) misuse(L, "%s: tensor is released", name);
  return u->t;
}

static sta_tensor *check_tensor(lua_State *L, int idx) {
  return check_tensor_named(L, idx, "tensor");
}

static int tensor_release(lua_State *L) {
  LTensor *u = check_ltensor(L, 1);
  if (u->t) {
    sta_tensor_destroy(u->t);
    u->t = NULL;
    live_tensors--;
  }
  return 0;
}

/* New contiguous tensor: pushes the userdata or raises/returns fail. */
static int push_new_tensor(lua_State *L, sta_dtype dt, sta_device dev, int32_t nd,
                           const int64_t *shape, LTensor **uo) {
  sta_status rc;
  LTensor *u = new_tensor_ud(L);
  CALL(rc, sta_tensor_create(&u->t, dt, dev, nd, shape));
  if (rc != STA_OK) { lua_pop(L, 1); return sta_fail(L, rc); }
  tensor_born(L, u);
  *uo = u;
  return 1;
}

static void tensor_opts(lua_State *L, int idx, sta_dtype *dt, sta_device *dev) {
  *dt = STA_F32;
  *dev = STA_CPU;
  check_opts(L, idx);
  if (lua_istable(L, idx)) {
    const char *s = str_field(L, idx, "dtype");
    if (s) *dt = parse_dtype(L, s);
    s = str_field(L, idx, "device");
    if (s) *dev = parse_device(L, s);
  }
}

/* tensor(shape [, {dtype=, device=}]) -- uninitialised */
static int l_tensor(lua_State *L) {
  int64_t shape[4];
  int32_t nd = read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  LTensor *u;
  tensor_opts(L, 2, &dt, &dev);
  return push_new_tensor(L, dt, dev, nd, shape, &u);
}

static int l_zeros(lua_State *L) {
  int64_t shape[4];
  int32_t nd = read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  LTensor *u;
  double value = 0;
  tensor_opts(L, 2, &dt, &dev);
  if (lua_istable(L, 2)) value = num_field(L, 2, "value", 0);
  int n = push_new_tensor(L, dt, dev, nd, shape, &u);
  if (n != 1) return n;
  sta_status rc = sta_tensor_fill(u->t, value);
  if (rc != STA_OK) return sta_fail(L, rc);
  return 1;
}

static uint64_t fresh_seed(void) {
  uint64_t x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + (++seed_counter) * 0xBF58476D1CE4E5B9ull;
  x ^= (uint64_t)clock() << 17;
  return x;
}

/* randn(shape [, {seed=, dtype=, device=, mean=, std=}]) */
static int l_randn(lua_State *L) {
  int64_t shape[4];
  int32_t nd = read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  LTensor *u;
  uint64_t seed;
  double mean = 0, std = 1;
  tensor_opts(L, 2, &dt, &dev);
  seed = fresh_seed();
  if (lua_istable(L, 2)) {
    seed = (uint64_t)int_field(L, 2, "seed", (lua_Integer)seed);
    mean = num_field(L, 2, "mean", 0);
    std = num_field(L, 2, "std", 1);
  }
  int n = push_new_tensor(L, dt, dev, nd, shape, &u);
  if (n != 1) return n;
  sta_status rc = sta_tensor_randn(u->t, seed, mean, std);
  if (rc != STA_OK) return sta_fail(L, rc);
  return 1;
}

static int t_randn(lua_State *L) { /* t:randn([seed [, mean, std]]) */
  sta_tensor *t = check_tensor(L, 1);
  uint64_t seed = lua_isnoneornil(L, 2) ? fresh_seed() : (uint64_t)luaL_checkinteger(L, 2);
  sta_status rc = sta_tensor_randn(t, seed, luaL_optnumber(L, 3, 0), luaL_optnumber(L, 4, 1));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int t_fill(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc = sta_tensor_fill(t, luaL_checknumber(L, 2));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int t_copy(lua_State *L) { /* dst:copy(src) */
  sta_tensor *dst = check_tensor_named(L, 1, "dst");
  sta_tensor *src = check_tensor_named(L, 2, "src");
  sta_status rc = sta_tensor_copy(dst, src);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* t:to(dtype_or_device, ...) or t:to{dtype=, device=} */
static int t_to(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_dtype dt = sta_tensor_dtype(t);
  sta_device dev = sta_tensor_device(t);
  int top = lua_gettop(L);
  if (lua_istable(L, 2)) {
    const char *s = str_field(L, 2, "dtype");
    if (s) dt = parse_dtype(L, s);
    s = str_field(L, 2, "device");
    if (s) dev = parse_device(L, s);
  } else {
    for (int i = 2; i <= top; i++) {
      const char *s = luaL_checkstring(L, i);
      sta_dtype d;
      if (sta_dtype_parse(s, &d) == STA_OK) dt = d;
      else {
        sta_clear_error();
        if (strcmp(s, "cpu") && strcmp(s, "host") && strcmp(s, "cuda") &&
            strcmp(s, "cuda:0") && strcmp(s, "gpu"))
          return misuse(L, "to: '%s' is neither a dtype (f32, f16, bf16) nor a device (cpu, cuda)", s);
        dev = parse_device(L, s);
      }
    }
  }
  sta_status rc;
  LTensor *u = new_tensor_ud(L);
  CALL(rc, sta_tensor_to(&u->t, t, dt, dev));
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

static int t_clone(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc;
  LTensor *u = new_tensor_ud(L);
  CALL(rc, sta_tensor_to(&u->t, t, sta_tensor_dtype(t), sta_tensor_device(t)));
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

/* Push a view made by the caller into u->t; pins the base (index 1). */
static LTensor *push_view_ud(lua_State *L) {
  LTensor *u = new_tensor_ud(L);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return u;
}

/* t:view(shape [, strides [, offset]]): offset in elements from t's first */
static int t_view(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int64_t shape[4], strides[4];
  int32_t nd = read_shape(L, 2, shape);
  int have_strides = !lua_isnoneornil(L, 3);
  int64_t offset = (int64_t)luaL_optinteger(L, 4, 0);
  if (have_strides) {
    if (!lua_istable(L, 3) || luaL_len(L, 3) != nd)
      return misuse(L, "strides: expected a table of %d integers", (int)nd);
    for (int i = 0; i < nd; i++) {
      lua_geti(L, 3, i + 1);
      strides[i] = (int64_t)luaL_checkinteger(L, -1);
      lua_pop(L, 1);
    }
  } else if (!sta_tensor_is_contiguous(t)) {
    return misuse(L, "view: the tensor is not contiguous; give strides");
  } else {
    int64_t st = 1;
    for (int i = nd - 1; i >= 0; i--) { strides[i] = st; st *= shape[i] > 0 ? shape[i] : 1; }
  }
  LTensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_view(&u->t, t, offset, nd, shape, strides);
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

/* t:permute{2,1,3,4} -- 1-based: new dim i is old dim perm[i] */
static int t_permute(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int32_t nd = sta_tensor_ndim(t), perm[4];
  if (lua_istable(L, 2)) int_list(L, 2, perm, nd, "perm");
  else {
    if (lua_gettop(L) - 1 != nd)
      return misuse(L, "perm: expected %d dimensions, got %d", (int)nd, lua_gettop(L) - 1);
    for (int i = 0; i < nd; i++) perm[i] = (int32_t)luaL_checkinteger(L, i + 2);
  }
  for (int i = 0; i < nd; i++) perm[i]--;
  LTensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_permute(&u->t, t, perm);
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

/* t:narrow(dim, start, len) -- dim and start 1-based */
static int t_narrow(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  lua_Integer dim = luaL_checkinteger(L, 2), start = luaL_checkinteger(L, 3);
  lua_Integer len = luaL_checkinteger(L, 4);
  if (dim < 1 || dim > sta_tensor_ndim(t))
    return misuse(L, "dim: %I outside 1..%d", dim, (int)sta_tensor_ndim(t));
  if (start < 1 || len < 0 || start - 1 + len > sta_tensor_size(t, (int)dim - 1))
    return misuse(L, "narrow: [%I, %I] outside 1..%I of dim %I", start, start + len - 1,
                  (lua_Integer)sta_tensor_size(t, (int)dim - 1), dim);
  LTensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_narrow(&u->t, t, (int32_t)(dim - 1), (int64_t)(start - 1), (int64_t)len);
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

/* t:select(i): the slice at index i (1-based) of dim 1, one dim fewer */
static int t_select(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  lua_Integer i = luaL_checkinteger(L, 2);
  int32_t nd = sta_tensor_ndim(t);
  int64_t n = sta_tensor_size(t, 0);
  if (nd < 2) return misuse(L, "select: needs a tensor of 2 or more dimensions, got %d", (int)nd);
  if (i < 1 || i > n) return misuse(L, "index: %I is outside 1..%I", i, (lua_Integer)n);
  int64_t shape[3], strides[3];
  for (int d = 1; d < nd; d++) {
    shape[d - 1] = sta_tensor_size(t, d);
    strides[d - 1] = sta_tensor_stride(t, d);
  }
  LTensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_view(&u->t, t, (int64_t)(i - 1) * sta_tensor_stride(t, 0), nd - 1,
                                  shape, strides);
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

static int t_shape(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int32_t nd = sta_tensor_ndim(t);
  lua_createtable(L, nd, 0);
  for (int i = 0; i < nd; i++) {
    lua_pushinteger(L, sta_tensor_size(t, i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int t_strides(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int32_t nd = sta_tensor_ndim(t);
  lua_createtable(L, nd, 0);
  for (int i = 0; i < nd; i++) {
    lua_pushinteger(L, sta_tensor_stride(t, i));
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}

static int t_size(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) return t_shape(L);
  lua_Integer d = luaL_checkinteger(L, 2);
  if (d < 1 || d > sta_tensor_ndim(t))
    return misuse(L, "dim: %d outside 1..%d", (int)d, (int)sta_tensor_ndim(t));
  lua_pushinteger(L, sta_tensor_size(t, (int32_t)(d - 1)));
  return 1;
}

static int t_dtype(lua_State *L) {
  lua_pushstring(L, sta_dtype_name(sta_tensor_dtype(check_tensor(L, 1))));
  return 1;
}
static int t_device(lua_State *L) {
  lua_pushstring(L, device_name(sta_tensor_device(check_tensor(L, 1))));
  return 1;
}
static int t_ndim(lua_State *L) {
  lua_pushinteger(L, sta_tensor_ndim(check_tensor(L, 1)));
  return 1;
}
static int t_numel(lua_State *L) {
  lua_pushinteger(L, sta_tensor_numel(check_tensor(L, 1)));
  return 1;
}
static int t_contiguous(lua_State *L) {
  lua_pushboolean(L, sta_tensor_is_contiguous(check_tensor(L, 1)));
  return 1;
}
static int t_released(lua_State *L) {
  lua_pushboolean(L, check_ltensor(L, 1)->t == NULL);
  return 1;
}

static void read_index(lua_State *L, sta_tensor *t, int idx, int64_t ix[4]) {
  int32_t nd = sta_tensor_ndim(t);
  if (!lua_istable(L, idx))
    misuse(L, "index: expected a table of %d integers, got %s", (int)nd, luaL_typename(L, idx));
  if (luaL_len(L, idx) != nd)
    misuse(L, "index: expected %d integers, got %d", (int)nd, (int)luaL_len(L, idx));
  for (int i = 0; i < nd; i++) {
    lua_geti(L, idx, i + 1);
    ix[i] = (int64_t)luaL_checkinteger(L, -1) - 1;
    if (ix[i] < 0 || ix[i] >= sta_tensor_size(t, i))
      misuse(L, "index[%d]: %I is outside 1..%I", i + 1, (lua_Integer)(ix[i] + 1),
             (lua_Integer)sta_tensor_size(t, i));
    lua_pop(L, 1);
  }
}

static int t_get(lua_State *L) { /* t:get{i, j, ...} 1-based */
  sta_tensor *t = check_tensor(L, 1);
  int64_t ix[4];
  double v;
  read_index(L, t, 2, ix);
  sta_status rc = sta_tensor_get(t, ix, &v);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushnumber(L, v);
  return 1;
}

static int t_set(lua_State *L) { /* t:set({i, j, ...}, value) */
  sta_tensor *t = check_tensor(L, 1);
  int64_t ix[4];
  read_index(L, t, 2, ix);
  sta_status rc = sta_tensor_set(t, ix, luaL_checknumber(L, 3));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* Walk every element of a host tensor in row-major order. */
static int64_t host_flat_index(sta_tensor *t, int64_t flat, int64_t ix[4]) {
  int32_t nd = sta_tensor_ndim(t);
  for (int d = nd - 1; d >= 0; d--) {
    int64_t n = sta_tensor_size(t, d);
    ix[d] = n ? flat % n : 0;
    flat = n ? flat / n : 0;
  }
  return 0;
}

/* t:totable(): flat list of a host tensor's values in row-major order */
static int t_totable(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int64_t n = sta_tensor_numel(t), ix[4];
  if (sta_tensor_device(t) != STA_CPU) {
    /* copy to host first */
    lua_settop(L, 1);
    lua_pushstring(L, "cpu");
    t_to(L);
    t = check_tensor(L, -1);
  }
  lua_createtable(L, (int)(n < 1 << 24 ? n : 0), 0);
  for (int64_t i = 0; i < n; i++) {
    double v;
    host_flat_index(t, i, ix);
    sta_tensor_get(t, ix, &v);
    lua_pushnumber(L, v);
    lua_rawseti(L, -2, (lua_Integer)(i + 1));
  }
  return 1;
}

/* from_table(values, shape [, opts]): values flat (row-major) */
static int l_from_table(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int64_t shape[4], ix[4];
  int32_t nd;
  if (lua_isnoneornil(L, 2)) {
    shape[0] = (int64_t)luaL_len(L, 1);
    nd = 1;
  } else nd = read_shape(L, 2, shape);
  sta_dtype dt;
  sta_device dev;
  tensor_opts(L, 3, &dt, &dev);
  int64_t numel = 1;
  for (int i = 0; i < nd; i++) numel *= shape[i];
  if ((int64_t)luaL_len(L, 1) != numel)
    return misuse(L, "values: expected %d numbers for the shape, got %d", (int)numel,
                  (int)luaL_len(L, 1));
  LTensor *u;
  int r = push_new_tensor(L, dt, STA_CPU, nd, shape, &u);
  if (r != 1) return r;
  for (int64_t i = 0; i < numel; i++) {
    lua_geti(L, 1, (lua_Integer)(i + 1));
    int ok;
    double v = lua_tonumberx(L, -1, &ok);
    if (!ok) return misuse(L, "values[%d]: expected a number, got %s", (int)(i + 1), luaL_typename(L, -1));
    lua_pop(L, 1);
    host_flat_index(u->t, i, ix);
    sta_tensor_set(u->t, ix, v);
  }
  if (dev != STA_CPU) {
    lua_replace(L, 1);
    lua_settop(L, 1);
    lua_pushstring(L, device_name(dev));
    return t_to(L);
  }
  return 1;
}

static int t_compare(lua_State *L) { /* a:compare(b) -> max_abs, rel_l2 */
  sta_tensor *a = check_tensor_named(L, 1, "a");
  sta_tensor *b = check_tensor_named(L, 2, "b");
  double m, r;
  sta_status rc = sta_tensor_compare(a, b, &m, &r);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushnumber(L, m);
  lua_pushnumber(L, r);
  return 2;
}

/* Host f32 contiguous copy of t (a new handle), or raise/fail. */
static sta_tensor *host_f32(lua_State *L, const sta_tensor *t, sta_status *rc) {
  sta_tensor *h = NULL;
  *rc = sta_tensor_to(&h, t, STA_F32, STA_CPU);
  (void)L;
  return h;
}

/* y:axpby(a, x, b): y = a*x + b*y elementwise (any dtype, device or
** strides; computed in float32 on the host).  Returns y. */
static int t_axpby(lua_State *L) {
  sta_tensor *y = check_tensor_named(L, 1, "y");
  float a = (float)luaL_checknumber(L, 2);
  sta_tensor *x = check_tensor_named(L, 3, "x");
  float b = (float)luaL_checknumber(L, 4);
  int32_t nd = sta_tensor_ndim(y);
  int same = nd == sta_tensor_ndim(x);
  for (int i = 0; same && i < nd; i++) same = sta_tensor_size(x, i) == sta_tensor_size(y, i);
  if (!same) return misuse(L, "x: shape differs from y's");
  sta_status rc;
  sta_tensor *hx = host_f32(L, x, &rc), *hy = NULL;
  if (rc == STA_OK) hy = host_f32(L, y, &rc);
  if (rc == STA_OK) {
    float *px = sta_tensor_data(hx), *py = sta_tensor_data(hy);
    int64_t n = sta_tensor_numel(hy);
    for (int64_t i = 0; i < n; i++) py[i] = a * px[i] + b * py[i];
    rc = sta_tensor_copy(y, hy);
  }
  sta_tensor_destroy(hx);
  sta_tensor_destroy(hy);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* t:stats() -> {mean=, std=, min=, max=, nonfinite=} over all elements */
static int t_stats(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc;
  sta_tensor *h = host_f32(L, t, &rc);
  if (rc != STA_OK) return sta_fail(L, rc);
  const float *p = sta_tensor_data(h);
  int64_t n = sta_tensor_numel(h), bad = 0, good = 0;
  double sum = 0, sq = 0, lo = 0, hi = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = p[i];
    if (v != v || v > 3.4e38 || v < -3.4e38) { bad++; continue; }
    if (good == 0 || v < lo) lo = v;
    if (good == 0 || v > hi) hi = v;
    good++;
    sum += v;
  }
  double mean = good ? sum / (double)good : 0;
  for (int64_t i = 0; i < n; i++) {
    double v = p[i];
    if (v == v && v <= 3.4e38 && v >= -3.4e38) sq += (v - mean) * (v - mean);
  }
  sta_tensor_destroy(h);
  lua_createtable(L, 0, 5);
  lua_pushnumber(L, mean);
  lua_setfield(L, -2, "mean");
  lua_pushnumber(L, good ? sqrt(sq / (double)good) : 0);
  lua_setfield(L, -2, "std");
  lua_pushnumber(L, lo);
  lua_setfield(L, -2, "min");
  lua_pushnumber(L, hi);
  lua_setfield(L, -2, "max");
  lua_pushinteger(L, bad);
  lua_setfield(L, -2, "nonfinite");
  return 1;
}

static int t_len(lua_State *L) {
  lua_pushinteger(L, sta_tensor_size(check_tensor(L, 1), 0));
  return 1;
}

static void add_values(lua_State *L, luaL_Buffer *b, sta_tensor *t, int dim, int64_t *ix) {
  int64_t n = sta_tensor_size(t, dim);
  luaL_addchar(b, '{');
  for (int64_t i = 0; i < n; i++) {
    ix[dim] = i;
    if (i) luaL_addstring(b, ", ");
    if (dim == sta_tensor_ndim(t) - 1) {
      double v;
      sta_tensor_get(t, ix, &v);
      char num[32];
      snprintf(num, sizeof num, "%.4g", v);
      luaL_addstring(b, num);
    } else add_values(L, b, t, dim + 1, ix);
  }
  luaL_addchar(b, '}');
}

static int t_tostring(lua_State *L) {
  LTensor *u = check_ltensor(L, 1);
  if (!u->t) {
    lua_pushliteral(L, "sta.Tensor(released)");
    return 1;
  }
  sta_tensor *t = u->t;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "sta.Tensor(%s, %s, ", sta_dtype_name(sta_tensor_dtype(t)),
                  device_name(sta_tensor_device(t)));
  luaL_addvalue(&b);
  for (int i = 0; i < sta_tensor_ndim(t); i++) {
    char num[32];
    snprintf(num, sizeof num, i ? "x%lld" : "%lld", (long long)sta_tensor_size(t, i));
    luaL_addstring(&b, num);
  }
  luaL_addchar(&b, ')');
  if (sta_tensor_device(t) == STA_CPU && sta_tensor_numel(t) <= 24 && sta_tensor_numel(t) > 0) {
    int64_t ix[4] = {0, 0, 0, 0};
    luaL_addchar(&b, ' ');
    add_values(L, &b, t, 0, ix);
  }
  luaL_pushresult(&b);
  return 1;
}

/* t[i]: element (1-D) or the slice i of dim 1; methods otherwise */
static int t_index(lua_State *L) {
  if (lua_type(L, 2) == LUA_TNUMBER) {
    sta_tensor *t = check_tensor(L, 1);
    if (sta_tensor_ndim(t) == 1) {
      int64_t ix = (int64_t)luaL_checkinteger(L, 2) - 1;
      double v;
      if (ix < 0 || ix >= sta_tensor_size(t, 0))
        return misuse(L, "index: %I is outside 1..%I", (lua_Integer)(ix + 1),
                      (lua_Integer)sta_tensor_size(t, 0));
      sta_status rc = sta_tensor_get(t, &ix, &v);
      if (rc != STA_OK) return sta_fail(L, rc);
      lua_pushnumber(L, v);
      return 1;
    }
    lua_settop(L, 2);
    return t_select(L);
  }
  luaL_getmetatable(L, TENSOR);
  lua_getfield(L, -1, "methods");
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

static int t_newindex(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  if (lua_type(L, 2) != LUA_TNUMBER || sta_tensor_ndim(t) != 1)
    return misuse(L, "t[i] = v: only for 1-D tensors with an integer index");
  int64_t ix = (int64_t)luaL_checkinteger(L, 2) - 1;
  sta_status rc = sta_tensor_set(t, &ix, luaL_checknumber(L, 3));
  if (rc != STA_OK) return sta_fail(L, rc);
  return 0;
}

/* ---- files --------------------------------------------------------------- */

static int ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static int l_npy_load(lua_State *L) { /* npy_load(path [, as_bf16]) */
  const char *path = luaL_checkstring(L, 1);
  LTensor *u = new_tensor_ud(L);
  sta_status rc = sta_npy_load(&u->t, path, lua_toboolean(L, 2));
  if (rc != STA_OK) return sta_fail(L, rc);
  tensor_born(L, u);
  return 1;
}

static int t_save(lua_State *L) { /* t:save(path [, name]) */
  sta_tensor *t = check_tensor(L, 1);
  const char *path = luaL_checkstring(L, 2);
  sta_status rc;
  if (ends_with(path, ".safetensors")) {
    const char *name = luaL_optstring(L, 3, "tensor");
    const sta_tensor *ts[1] = {t};
    rc = sta_safetensors_save(path, 1, &name, ts);
  } else rc = sta_npy_save(t, path);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* load_safetensors(path) -> {name = tensor, ...}, {names in file order} */
static int l_load_safetensors(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  sta_safetensors *f = NULL;
  sta_status rc = sta_safetensors_open(&f, path);
  if (rc != STA_OK) return sta_fail(L, rc);
  int32_t n = sta_safetensors_count(f);
  lua_createtable(L, 0, n);
  lua_createtable(L, n, 0);
  for (int32_t i = 0; i < n; i++) {
    const char *name = sta_safetensors_name(f, i);
    LTensor *u = new_tensor_ud(L);
    rc = sta_safetensors_read(f, name, &u->t);
    if (rc != STA_OK) {
      sta_safetensors_close(f);
      return sta_fail(L, rc);
    }
    tensor_born(L, u);
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
    if (lua_type(L, -2) != LUA_TSTRING) misuse(L, "tensors: keys must be names (strings)");
    check_tensor_named(L, -1, lua_tostring(L, -2));
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
    ts[i] = check_tensor(L, -1);
    lua_pop(L, 1);
  }
  sta_status rc = sta_safetensors_save(path, n, names, ts);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* ---- geometry ------------------------------------------------------------ */

#define check_geometry sta_lua_check_geometry
sta_geometry *sta_lua_check_geometry(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, GEOMETRY);
}

/* Geometry from options at idx: geometry=G, or canvas={T,H,W}, tile=,
** text_len=.  Returns 0 when no canvas was given (g canvas 0,0,0). */
static int read_geometry(lua_State *L, int idx, sta_geometry *g) {
  memset(g, 0, sizeof *g);
  g->tile[0] = 6; g->tile[1] = 8; g->tile[2] = 8;
  g->text_len = -1;
  if (!lua_istable(L, idx)) return 0;
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, idx, "geometry") != LUA_TNIL) {
    *g = *check_geometry(L, -1);
    lua_pop(L, 1);
    return 1;
  }
  lua_pop(L, 1);
  int have = 0;
  if (lua_getfield(L, idx, "canvas") != LUA_TNIL) {
    int_list(L, -1, g->canvas, 3, "canvas");
    have = 1;
  }
  lua_pop(L, 1);
  if (lua_getfield(L, idx, "tile") != LUA_TNIL) int_list(L, -1, g->tile, 3, "tile");
  lua_pop(L, 1);
  g->text_len = (int64_t)int_field(L, idx, "text_len", -1);
  return have;
}

static int l_geometry(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  sta_geometry g;
  if (!read_geometry(L, 1, &g)) return misuse(L, "canvas: expected {T, H, W}, got nil");
  sta_status rc = sta_geometry_check(&g, sta_geometry_video_tokens(&g) +
                                             (g.text_len > 0 ? g.text_len : 0));
  if (rc != STA_OK) return sta_fail(L, rc);
  sta_geometry *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = g;
  luaL_setmetatable(L, GEOMETRY);
  return 1;
}

static int l_geometry_from_seq_len(lua_State *L) {
  sta_geometry g;
  sta_status rc = sta_geometry_from_seq_len(&g, (int64_t)luaL_checkinteger(L, 1));
  if (rc != STA_OK) return sta_fail(L, rc);
  sta_geometry *u = lua_newuserdatauv(L, sizeof *u, 0);
  *u = g;
  luaL_setmetatable(L, GEOMETRY);
  return 1;
}

static int g_grid(lua_State *L) {
  int32_t grid[3];
  sta_geometry_grid(check_geometry(L, 1), grid);
  push_ints(L, grid, 3);
  return 1;
}
static int g_video_tokens(lua_State *L) {
  lua_pushinteger(L, sta_geometry_video_tokens(check_geometry(L, 1)));
  return 1;
}
static int g_text_len(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  lua_pushinteger(L, sta_geometry_text_len(g, (int64_t)luaL_checkinteger(L, 2)));
  return 1;
}
static int g_tiled_len(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  lua_pushinteger(L, sta_geometry_tiled_len(g, (int64_t)luaL_checkinteger(L, 2)));
  return 1;
}
static int g_check(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  sta_status rc = sta_geometry_check(g, (int64_t)luaL_checkinteger(L, 2));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}
static int g_window_check(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  int32_t w[3];
  int_list(L, 2, w, 3, "window");
  sta_status rc = sta_window_check(g, w);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* g:key_tiles(query_tile {it, ih, iw}, window) -> list of {it, ih, iw}
** (0-based tile coordinates) the query tile attends to. */
static int g_key_tiles(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  int32_t q[3], w[3], grid[3], start[3], count[3];
  int_list(L, 2, q, 3, "tile");
  int_list(L, 3, w, 3, "window");
  sta_geometry_grid(g, grid);
  for (int a = 0; a < 3; a++) {
    sta_status rc = sta_window_range(q[a], w[a], grid[a], &start[a], &count[a]);
    if (rc != STA_OK) return sta_fail(L, rc);
  }
  lua_createtable(L, count[0] * count[1] * count[2], 0);
  int n = 0;
  for (int i = 0; i < count[0]; i++)
    for (int j = 0; j < count[1]; j++)
      for (int k = 0; k < count[2]; k++) {
        int32_t c[3] = {start[0] + i, start[1] + j, start[2] + k};
        push_ints(L, c, 3);
        lua_rawseti(L, -2, ++n);
      }
  return 1;
}

static int g_index(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  const char *k = luaL_checkstring(L, 2);
  if (strcmp(k, "canvas") == 0) push_ints(L, g->canvas, 3);
  else if (strcmp(k, "tile") == 0) push_ints(L, g->tile, 3);
  else if (strcmp(k, "text_len") == 0) lua_pushinteger(L, g->text_len);
  else {
    luaL_getmetatable(L, GEOMETRY);
    lua_getfield(L, -1, "methods");
    lua_getfield(L, -1, k);
  }
  return 1;
}

static int g_tostring(lua_State *L) {
  sta_geometry *g = check_geometry(L, 1);
  int32_t grid[3];
  sta_geometry_grid(g, grid);
  lua_pushfstring(L, "sta.Geometry(canvas %dx%dx%d, tile %dx%dx%d, grid %dx%dx%d, text_len %d)",
                  g->canvas[0], g->canvas[1], g->canvas[2], g->tile[0], g->tile[1], g->tile[2],
                  grid[0], grid[1], grid[2], (int)g->text_len);
  return 1;
}

static int l_window_range(lua_State *L) { /* window_range(q, k, c) -> start, count */
  int32_t s, c;
  sta_status rc = sta_window_range((int32_t)luaL_checkinteger(L, 1), (int32_t)luaL_checkinteger(L, 2),
                                   (int32_t)luaL_checkinteger(L, 3), &s, &c);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushinteger(L, s);
  lua_pushinteger(L, c);
  return 2;
}

/* tile(in, geometry [, layout]) / untile(in, geometry, seq_len [, layout]) */
static int l_tile(lua_State *L) {
  sta_tensor *in = check_tensor_named(L, 1, "in");
  sta_geometry *g = check_geometry(L, 2);
  sta_layout layout = parse_layout(L, luaL_optstring(L, 3, "bshd"));
  int64_t shape[4];
  int sdim = layout == STA_BSHD ? 1 : 2;
  if (sta_tensor_ndim(in) != 4) return misuse(L, "in: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(in));
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(in, i);
  shape[sdim] = sta_geometry_tiled_len(g, shape[sdim]);
  LTensor *u;
  int r = push_new_tensor(L, sta_tensor_dtype(in), sta_tensor_device(in), 4, shape, &u);
  if (r != 1) return r;
  sta_status rc = sta_tensor_tile(u->t, in, g, layout);
  if (rc != STA_OK) return sta_fail(L, rc);
  return 1;
}

static int l_untile(lua_State *L) {
  sta_tensor *in = check_tensor_named(L, 1, "in");
  sta_geometry *g = check_geometry(L, 2);
  lua_Integer seq = luaL_checkinteger(L, 3);
  sta_layout layout = parse_layout(L, luaL_optstring(L, 4, "bshd"));
  int64_t shape[4];
  int sdim = layout == STA_BSHD ? 1 : 2;
  if (sta_tensor_ndim(in) != 4) return misuse(L, "in: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(in));
  for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(in, i);
  shape[sdim] = (int64_t)seq;
  LTensor *u;
  int r = push_new_tensor(L, sta_tensor_dtype(in), sta_tensor_device(in), 4, shape, &u);
  if (r != 1) return r;
  sta_status rc = sta_tensor_untile(u->t, in, g, layout);
  if (rc != STA_OK) return sta_fail(L, rc);
  return 1;
}

/* ---- attention ----------------------------------------------------------- */

/* Windows from opts.window: {Kt,Kh,Kw} or a per-head list of them.  The
** array is a userdata left on the stack.  Default {3,3,3}. */
static int32_t *read_windows(lua_State *L, int opts, int32_t *n) {
  int32_t *w;
  if (!lua_istable(L, opts) || lua_getfield(L, opts, "window") == LUA_TNIL) {
    if (lua_istable(L, opts)) lua_pop(L, 1);
    w = lua_newuserdatauv(L, 3 * sizeof(int32_t), 0);
    w[0] = w[1] = w[2] = 3;
    *n = 1;
    return w;
  }
  int wi = lua_gettop(L);
  if (!lua_istable(L, wi)) misuse(L, "window: expected {Kt, Kh, Kw} or a list per head, got %s", luaL_typename(L, wi));
  lua_geti(L, wi, 1);
  int per_head = lua_istable(L, -1);
  lua_pop(L, 1);
  if (!per_head) {
    w = lua_newuserdatauv(L, 3 * sizeof(int32_t), 0);
    int_list(L, wi, w, 3, "window");
    *n = 1;
  } else {
    int32_t k = (int32_t)luaL_len(L, wi);
    w = lua_newuserdatauv(L, 3 * sizeof(int32_t) * (size_t)k, 0);
    for (int32_t i = 0; i < k; i++) {
      char name[32];
      snprintf(name, sizeof name, "window[%d]", (int)i + 1);
      lua_geti(L, wi, i + 1);
      int_list(L, -1, w + 3 * i, 3, name);
      lua_pop(L, 1);
    }
    *n = k;
  }
  lua_remove(L, wi);
  return w;
}

/* attention(q, k, v [, opts]) -> out [, lse]; reference with ref = 1 */
static int attention_common(lua_State *L, int ref) {
  sta_tensor *q = check_tensor_named(L, 1, "q");
  sta_tensor *k = check_tensor_named(L, 2, "k");
  sta_tensor *v = check_tensor_named(L, 3, "v");
  check_opts(L, 4);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  d.layout = parse_layout(L, lua_istable(L, 4) ? str_field(L, 4, "layout") : NULL);
  int sdim = d.layout == STA_BSHD ? 1 : 2;
  if (!read_geometry(L, 4, &d.geom)) {
    sta_geometry gk;
    if (sta_tensor_ndim(q) != 4)
      return misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
    sta_status rc = sta_geometry_from_seq_len(&gk, sta_tensor_size(q, sdim));
    if (rc != STA_OK) return sta_fail(L, rc);
    gk.text_len = d.geom.text_len;
    gk.tile[0] = d.geom.tile[0]; gk.tile[1] = d.geom.tile[1]; gk.tile[2] = d.geom.tile[2];
    d.geom = gk;
  }
  d.windows = read_windows(L, 4, &d.n_windows);
  d.scale = lua_istable(L, 4) ? (float)num_field(L, 4, "scale", 0) : 0;
  sta_tensor *out = NULL, *lse = NULL;
  int want_lse = 0;
  int top = lua_gettop(L);
  if (lua_istable(L, 4)) {
    if (lua_getfield(L, 4, "out") != LUA_TNIL) out = check_tensor_named(L, -1, "out");
    if (lua_getfield(L, 4, "lse") != LUA_TNIL) {
      if (lua_isboolean(L, -1)) want_lse = lua_toboolean(L, -1);
      else { lse = check_tensor_named(L, -1, "lse"); want_lse = 1; }
    }
  }
  sta_status rc;
  int nret = 0;
  if (out) lua_getfield(L, 4, "out");
  else {
    int64_t shape[4];
    if (sta_tensor_ndim(q) != 4)
      return misuse(L, "q: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(q));
    for (int i = 0; i < 4; i++) shape[i] = sta_tensor_size(q, i);
    LTensor *u;
    int r = push_new_tensor(L, sta_tensor_dtype(q), sta_tensor_device(q), 4, shape, &u);
    if (r != 1) return r;
    out = u->t;
  }
  nret = 1;
  if (want_lse) {
    if (lse) lua_getfield(L, 4, "lse");
    else {
      int64_t shape[3];
      int hdim = d.layout == STA_BSHD ? 2 : 1;
      shape[0] = sta_tensor_size(q, 0);
      shape[1] = sta_tensor_size(q, hdim);
      shape[2] = sta_tensor_size(q, sdim);
      LTensor *u;
      int r = push_new_tensor(L, STA_F32, sta_tensor_device(q), 3, shape, &u);
      if (r != 1) return r;
      lse = u->t;
    }
    nret = 2;
  }
  if (ref) rc = sta_attention_reference(&d, q, k, v, out, lse);
  else CALL(rc, sta_attention_forward(&d, q, k, v, out, lse));
  if (rc != STA_OK) return sta_fail(L, rc);
  (void)top;
  return nret;
}

static int l_attention(lua_State *L) { return attention_common(L, 0); }
static int l_reference(lua_State *L) { return attention_common(L, 1); }

/* flops{canvas=, tile=, text_len=, window=, batch=, seq_len=, heads=, head_dim=} */
static int l_flops(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  sta_attention_desc d;
  memset(&d, 0, sizeof d);
  if (!read_geometry(L, 1, &d.geom)) return misuse(L, "canvas: expected {T, H, W}, got nil");
  d.windows = read_windows(L, 1, &d.n_windows);
  int64_t seq = (int64_t)int_field(L, 1, "seq_len", sta_geometry_video_tokens(&d.geom) +
                                                      (d.geom.text_len > 0 ? d.geom.text_len : 0));
  lua_pushnumber(L, sta_attention_flops(&d, (int64_t)int_field(L, 1, "batch", 1), seq,
                                        (int64_t)int_field(L, 1, "heads", 1),
                                        (int64_t)int_field(L, 1, "head_dim", 128)));
  return 1;
}

/* head_diff(a, b [, layout]) -> l1 list, l2 list (per head) */
static int l_head_diff(lua_State *L) {
  sta_tensor *a = check_tensor_named(L, 1, "a");
  sta_tensor *b = check_tensor_named(L, 2, "b");
  sta_layout layout = parse_layout(L, luaL_optstring(L, 3, "bshd"));
  if (sta_tensor_ndim(a) != 4) return misuse(L, "a: expected a 4-D tensor, got %d-D", (int)sta_tensor_ndim(a));
  int64_t heads = sta_tensor_size(a, layout == STA_BSHD ? 2 : 1);
  float *l1 = lua_newuserdatauv(L, sizeof(float) * (size_t)(heads ? heads : 1), 0);
  float *l2 = lua_newuserdatauv(L, sizeof(float) * (size_t)(heads ? heads : 1), 0);
  sta_status rc = sta_head_diff(a, b, layout, l1, l2);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_createtable(L, (int)heads, 0);
  lua_createtable(L, (int)heads, 0);
  for (int64_t h = 0; h < heads; h++) {
    lua_pushnumber(L, l1[h]);
    lua_rawseti(L, -3, h + 1);
    lua_pushnumber(L, l2[h]);
    lua_rawseti(L, -2, h + 1);
  }
  return 2;
}

/* ---- strategies ---------------------------------------------------------- */

typedef sta_lua_strategy LStrategy;

static LStrategy *new_strategy_ud(lua_State *L) {
  LStrategy *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->s = NULL;
  luaL_setmetatable(L, STRATEGY);
  return u;
}

#define check_strategy sta_lua_check_strategy
sta_strategy *sta_lua_check_strategy(lua_State *L, int idx) {
  LStrategy *u = luaL_testudata(L, idx, STRATEGY);
  if (!u) misuse(L, "strategy: expected a strategy, got %s", luaL_typename(L, idx));
  if (!u->s) misuse(L, "strategy: released");
  return u->s;
}

static int s_release(lua_State *L) {
  LStrategy *u = luaL_checkudata(L, 1, STRATEGY);
  if (u->s) { sta_strategy_destroy(u->s); u->s = NULL; }
  return 0;
}

static int l_strategy_new(lua_State *L) {
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_strategy_create(&u->s);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

static int l_strategy_parse(lua_State *L) {
  size_t len;
  const char *json = luaL_checklstring(L, 1, &len);
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_strategy_parse(&u->s, json, len);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

static int l_strategy_load(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_strategy_load(&u->s, path);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

static int l_strategy_default(lua_State *L) {
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_strategy_load_default(&u->s);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

/* uniform{steps=, layers=, heads=, window=, full=, full_steps=} */
static int l_strategy_uniform(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  int32_t w[3] = {3, 3, 3}, full[3];
  int have_full = 0;
  if (lua_getfield(L, 1, "window") != LUA_TNIL) int_list(L, -1, w, 3, "window");
  lua_pop(L, 1);
  if (lua_getfield(L, 1, "full") != LUA_TNIL) { int_list(L, -1, full, 3, "full"); have_full = 1; }
  lua_pop(L, 1);
  int32_t steps = (int32_t)int_field(L, 1, "steps", 1);
  int32_t layers = (int32_t)int_field(L, 1, "layers", 1);
  int32_t heads = (int32_t)int_field(L, 1, "heads", 1);
  int32_t full_steps = (int32_t)int_field(L, 1, "full_steps", 0);
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_strategy_uniform(&u->s, steps, layers, heads, w, have_full ? full : NULL,
                                       full_steps);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

static int s_get(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  int32_t w[3];
  sta_status rc = sta_strategy_get(s, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_checkinteger(L, 3),
                                   (int32_t)luaL_checkinteger(L, 4), w);
  if (rc != STA_OK) return sta_fail(L, rc);
  push_ints(L, w, 3);
  return 1;
}

static int s_set(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  int32_t w[3];
  int_list(L, 5, w, 3, "window");
  sta_status rc = sta_strategy_set(s, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_checkinteger(L, 3),
                                   (int32_t)luaL_checkinteger(L, 4), w);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int s_save(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  sta_status rc = sta_strategy_save(s, luaL_checkstring(L, 2));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int s_to_json(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  char *json = NULL;
  sta_status rc = sta_strategy_to_json(s, &json);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushstring(L, json);
  sta_free(json);
  return 1;
}

static int s_count(lua_State *L) {
  lua_pushinteger(L, sta_strategy_count(check_strategy(L, 1)));
  return 1;
}

static int s_extent(lua_State *L) {
  int32_t a, b, c;
  sta_strategy_extent(check_strategy(L, 1), &a, &b, &c);
  lua_pushinteger(L, a);
  lua_pushinteger(L, b);
  lua_pushinteger(L, c);
  return 3;
}

static int s_check(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  sta_status rc = sta_strategy_check(s, (int32_t)luaL_checkinteger(L, 2), (int32_t)luaL_checkinteger(L, 3),
                                     (int32_t)luaL_checkinteger(L, 4));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* s:sparsity(grid {NT,NH,NW} or geometry) */
static int s_sparsity(lua_State *L) {
  sta_strategy *s = check_strategy(L, 1);
  int32_t grid[3];
  sta_geometry *g = luaL_testudata(L, 2, GEOMETRY);
  if (g) sta_geometry_grid(g, grid);
  else int_list(L, 2, grid, 3, "grid");
  double sp;
  sta_status rc = sta_strategy_sparsity(s, grid, &sp);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushnumber(L, sp);
  return 1;
}

static int s_equal(lua_State *L) {
  lua_pushboolean(L, sta_strategy_equal(check_strategy(L, 1), check_strategy(L, 2)));
  return 1;
}

static int s_tostring(lua_State *L) {
  LStrategy *u = luaL_checkudata(L, 1, STRATEGY);
  if (!u->s) { lua_pushliteral(L, "sta.Strategy(released)"); return 1; }
  int32_t a, b, c;
  sta_strategy_extent(u->s, &a, &b, &c);
  lua_pushfstring(L, "sta.Strategy(%d entries, %d steps x %d layers x %d heads)",
                  (int)sta_strategy_count(u->s), a, b, c);
  return 1;
}

/* ---- metadata ------------------------------------------------------------ */

typedef struct { sta_metadata *m; } LMetadata;

static LMetadata *new_metadata_ud(lua_State *L) {
  LMetadata *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->m = NULL;
  luaL_setmetatable(L, METADATA);
  return u;
}

static sta_metadata *check_metadata(lua_State *L, int idx) {
  LMetadata *u = luaL_testudata(L, idx, METADATA);
  if (!u) misuse(L, "metadata: expected metadata, got %s", luaL_typename(L, idx));
  if (!u->m) misuse(L, "metadata: released");
  return u->m;
}

static int m_release(lua_State *L) {
  LMetadata *u = luaL_checkudata(L, 1, METADATA);
  if (u->m) { sta_metadata_destroy(u->m); u->m = NULL; }
  return 0;
}

static int l_metadata_new(lua_State *L) {
  lua_Integer layers = luaL_checkinteger(L, 1);
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_create(&u->m, (int32_t)layers);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

/* Windows list {{Kt,Kh,Kw}, ...} at idx into a userdata array left on the
** stack. */
static int32_t *window_list(lua_State *L, int idx, int32_t *n, const char *name) {
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx)) misuse(L, "%s: expected a list of windows, got %s", name, luaL_typename(L, idx));
  int32_t k = (int32_t)luaL_len(L, idx);
  int32_t *w = lua_newuserdatauv(L, sizeof(int32_t) * 3 * (size_t)(k ? k : 1), 0);
  for (int32_t i = 0; i < k; i++) {
    char nm[48];
    snprintf(nm, sizeof nm, "%s[%d]", name, (int)i + 1);
    lua_geti(L, idx, i + 1);
    int_list(L, -1, w + 3 * i, 3, nm);
    lua_pop(L, 1);
  }
  *n = k;
  return w;
}

static void push_window_list(lua_State *L, const int32_t *w, int32_t n) {
  lua_createtable(L, n, 0);
  for (int32_t i = 0; i < n; i++) {
    push_ints(L, w + 3 * i, 3);
    lua_rawseti(L, -2, i + 1);
  }
}

static int m_set_row(lua_State *L) { /* md:set_row(layer, {{..}, ...}) */
  sta_metadata *m = check_metadata(L, 1);
  lua_Integer layer = luaL_checkinteger(L, 2);
  int32_t n;
  int32_t *w = window_list(L, 3, &n, "windows");
  sta_status rc = sta_metadata_set_row(m, (int32_t)layer, n, w);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int m_row(lua_State *L) {
  sta_metadata *m = check_metadata(L, 1);
  int32_t n;
  const int32_t *w;
  sta_status rc = sta_metadata_row(m, (int32_t)luaL_checkinteger(L, 2), &n, &w);
  if (rc != STA_OK) return sta_fail(L, rc);
  push_window_list(L, w, n);
  return 1;
}

static int m_layers(lua_State *L) {
  lua_pushinteger(L, sta_metadata_layers(check_metadata(L, 1)));
  return 1;
}

static int m_tostring(lua_State *L) {
  LMetadata *u = luaL_checkudata(L, 1, METADATA);
  if (!u->m) lua_pushliteral(L, "sta.Metadata(released)");
  else lua_pushfstring(L, "sta.Metadata(%d layers)", (int)sta_metadata_layers(u->m));
  return 1;
}

/* metadata_from_strategy(strategy_or_nil, step, layers, heads) */
static int l_metadata_from_strategy(lua_State *L) {
  const sta_strategy *s = lua_isnil(L, 1) ? NULL : check_strategy(L, 1);
  int32_t step = (int32_t)luaL_checkinteger(L, 2), layers = (int32_t)luaL_checkinteger(L, 3);
  int32_t heads = (int32_t)luaL_checkinteger(L, 4);
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_from_strategy(&u->m, s, step, layers, heads);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

/* metadata_search(layers, {{..}, ..., full}) */
static int l_metadata_search(lua_State *L) {
  int32_t layers = (int32_t)luaL_checkinteger(L, 1), n;
  int32_t *w = window_list(L, 2, &n, "candidates");
  LMetadata *u = new_metadata_ud(L);
  sta_status rc = sta_metadata_search(&u->m, layers, n, w);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

/* ---- forward batch ------------------------------------------------------- */

typedef struct { sta_forward_batch *fb; } LBatch;

static sta_forward_batch *check_batch(lua_State *L, int idx) {
  LBatch *u = luaL_testudata(L, idx, BATCH);
  if (!u) misuse(L, "batch: expected a forward batch, got %s", luaL_typename(L, idx));
  if (!u->fb) misuse(L, "batch: released");
  return u->fb;
}

static int b_release(lua_State *L) {
  LBatch *u = luaL_checkudata(L, 1, BATCH);
  if (u->fb) { sta_forward_batch_destroy(u->fb); u->fb = NULL; }
  return 0;
}

/* forward_batch{batch_size=1, negative=false} */
static int l_forward_batch(lua_State *L) {
  check_opts(L, 1);
  int32_t bs = lua_istable(L, 1) ? (int32_t)int_field(L, 1, "batch_size", 1) : 1;
  int neg = lua_istable(L, 1) ? bool_field(L, 1, "negative", 0) : 0;
  LBatch *u = lua_newuserdatauv(L, sizeof *u, 0);
  u->fb = NULL;
  luaL_setmetatable(L, BATCH);
  sta_status rc = sta_forward_batch_create(&u->fb, bs);
  if (rc != STA_OK) return sta_fail(L, rc);
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
    misuse(L, "%s: expected %d lists (one per candidate)", name, (int)n);
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
      misuse(L, "%s[%d]: expected a list of %d numbers (one per head)", name, (int)c + 1, (int)*heads);
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
  int neg = bool_field(L, 2, "negative", 0);
  int32_t step = (int32_t)int_field(L, 2, "step", 0), layer = (int32_t)int_field(L, 2, "layer", 0);
  int32_t n, heads = -1;
  lua_getfield(L, 2, "candidates");
  int32_t *cand = window_list(L, -1, &n, "candidates");
  float *l1 = loss_table(L, 2, "l1", n, &heads);
  float *l2 = loss_table(L, 2, "l2", n, &heads);
  sta_status rc = sta_forward_batch_record(fb, neg, step, layer, n, cand, heads, l1, l2);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int b_save_search(lua_State *L) {
  sta_forward_batch *fb = check_batch(L, 1);
  const char *path = luaL_checkstring(L, 2);
  sta_status rc = sta_forward_batch_save_search(fb, lua_toboolean(L, 3), path);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int b_clear(lua_State *L) {
  sta_forward_batch_clear(check_batch(L, 1));
  lua_settop(L, 1);
  return 1;
}

static int b_tostring(lua_State *L) {
  LBatch *u = luaL_checkudata(L, 1, BATCH);
  if (!u->fb) lua_pushliteral(L, "sta.ForwardBatch(released)");
  else
    lua_pushfstring(L, "sta.ForwardBatch(size %d, %s, %d+%d records)", (int)sta_forward_batch_size(u->fb),
                    sta_forward_batch_is_negative(u->fb) ? "negative" : "positive",
                    (int)sta_forward_batch_records(u->fb, 0), (int)sta_forward_batch_records(u->fb, 1));
  return 1;
}

/* ---- contexts ------------------------------------------------------------ */

typedef struct { sta_context *c; } LContext;

/* forward_context{step=, metadata=, batch=} -- pushed; a to-be-closed
** value.  User value 1 pins {metadata, batch}. */
static int l_forward_context(lua_State *L) {
  check_opts(L, 1);
  int32_t step = 0;
  sta_metadata *md = NULL;
  sta_forward_batch *fb = NULL;
  lua_settop(L, 1);
  lua_createtable(L, 0, 2); /* 2: pins */
  if (lua_istable(L, 1)) {
    step = (int32_t)int_field(L, 1, "step", 0);
    if (lua_getfield(L, 1, "metadata") != LUA_TNIL) {
      md = check_metadata(L, -1);
      lua_setfield(L, 2, "metadata");
    } else lua_pop(L, 1);
    if (lua_getfield(L, 1, "batch") != LUA_TNIL) {
      fb = check_batch(L, -1);
      lua_setfield(L, 2, "batch");
    } else lua_pop(L, 1);
  }
  LContext *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->c = NULL;
  luaL_setmetatable(L, CONTEXT);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  sta_status rc = sta_context_push(&u->c, step, md, fb);
  if (rc != STA_OK) return sta_fail(L, rc);
  /* anchor while pushed */
  luaL_getsubtable(L, LUA_REGISTRYINDEX, ANCHOR);
  lua_pushlightuserdata(L, u->c);
  lua_pushvalue(L, -3);
  lua_rawset(L, -3);
  lua_pop(L, 1);
  return 1;
}

static void unanchor(lua_State *L, sta_context *c) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, ANCHOR);
  lua_pushlightuserdata(L, c);
  lua_pushnil(L);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

/* ctx:pop() / __close: pops once; later calls do nothing */
static int c_pop(lua_State *L) {
  LContext *u = luaL_checkudata(L, 1, CONTEXT);
  if (!u->c) return 0;
  sta_status rc = sta_context_pop(u->c);
  if (rc != STA_OK) return sta_fail(L, rc);
  unanchor(L, u->c);
  u->c = NULL;
  return 0;
}

static LContext *check_live_context(lua_State *L, int idx) {
  LContext *u = luaL_checkudata(L, idx, CONTEXT);
  if (!u->c) misuse(L, "context: already popped");
  return u;
}

static int c_step(lua_State *L) {
  lua_pushinteger(L, sta_context_step(check_live_context(L, 1)->c));
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
  lua_pushboolean(L, luaL_checkudata(L, 1, CONTEXT) == NULL ? 0 : ((LContext *)lua_touserdata(L, 1))->c != NULL);
  return 1;
}

static int c_tostring(lua_State *L) {
  LContext *u = luaL_checkudata(L, 1, CONTEXT);
  if (!u->c) lua_pushliteral(L, "sta.Context(popped)");
  else lua_pushfstring(L, "sta.Context(step %d)", (int)sta_context_step(u->c));
  return 1;
}

/* A userdata in the registry under key whose __gc calls gc: it runs at
** lua_close (or when key is set again and the old one is collected). */
static void registry_sentinel(lua_State *L, const char *key, lua_CFunction gc) {
  lua_newuserdatauv(L, 1, 0);
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, gc);
  lua_setfield(L, -2, "__gc");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, key);
}

/* At lua_close: pop what this state pushed and never popped, innermost
** first, so the thread's context stack keeps no pointer into a closed
** state.  Runs from a sentinel's __gc made in luaopen (finalized last). */
static int contexts_atclose(lua_State *L) {
  luaL_getsubtable(L, LUA_REGISTRYINDEX, ANCHOR);
  for (sta_context *c; (c = sta_context_current()) != NULL;) {
    lua_pushlightuserdata(L, c);
    if (lua_rawget(L, -2) == LUA_TNIL) break; /* not ours */
    LContext *u = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (sta_context_pop(c) != STA_OK) break;
    if (u) u->c = NULL;
    lua_pushlightuserdata(L, c);
    lua_pushnil(L);
    lua_rawset(L, -3);
  }
  return 0;
}

static int l_current_context(lua_State *L) {
  sta_context *c = sta_context_current();
  if (!c) { lua_pushnil(L); return 1; }
  luaL_getsubtable(L, LUA_REGISTRYINDEX, ANCHOR);
  lua_pushlightuserdata(L, c);
  lua_rawget(L, -2);
  return 1; /* nil when pushed from C, not from this binding */
}

static int l_in_forward_pass(lua_State *L) {
  lua_pushboolean(L, sta_in_forward_pass());
  return 1;
}

static int l_context_depth(lua_State *L) {
  lua_pushinteger(L, sta_context_depth());
  return 1;
}

/* ---- layers -------------------------------------------------------------- */

typedef struct { sta_layer *l; } LLayer;

static sta_layer *check_layer(lua_State *L, int idx) {
  LLayer *u = luaL_testudata(L, idx, LAYER);
  if (!u) misuse(L, "layer: expected a layer, got %s", luaL_typename(L, idx));
  if (!u->l) misuse(L, "layer: released");
  return u->l;
}

static int y_release(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, LAYER);
  if (u->l) { sta_layer_destroy(u->l); u->l = NULL; }
  return 0;
}

/* layer{prefix= or layer=, heads=, head_dim=, sp_rank=, sp_size=, canvas=,
** tile=, text_len=, layout=, backend=, scale=, strategy=} */
static int l_layer(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.prefix = str_field(L, 1, "prefix");
  d.layer_index = (int32_t)int_field(L, 1, "layer", 0);
  d.local_heads = (int32_t)int_field(L, 1, "heads", 0);
  d.head_dim = (int32_t)int_field(L, 1, "head_dim", 0);
  d.sp_rank = (int32_t)int_field(L, 1, "sp_rank", 0);
  d.sp_size = (int32_t)int_field(L, 1, "sp_size", 1);
  read_geometry(L, 1, &d.geom);
  d.layout = parse_layout(L, str_field(L, 1, "layout"));
  const char *be = str_field(L, 1, "backend");
  d.backend = be ? parse_device(L, be) : STA_CPU;
  d.scale = (float)num_field(L, 1, "scale", 0);
  lua_createtable(L, 0, 2); /* 2: pins */
  if (lua_getfield(L, 1, "strategy") != LUA_TNIL) {
    d.strategy = check_strategy(L, -1);
    lua_setfield(L, 2, "strategy");
  } else lua_pop(L, 1);
  if (d.prefix) {
    lua_getfield(L, 1, "prefix");
    lua_setfield(L, 2, "prefix");
  }
  LLayer *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->l = NULL;
  luaL_setmetatable(L, LAYER);
  lua_pushvalue(L, 2);
  lua_setiuservalue(L, -2, 1);
  sta_status rc = sta_layer_create(&u->l, &d);
  return rc == STA_OK ? 1 : sta_fail(L, rc);
}

static int y_forward(lua_State *L) { /* layer:forward(q, k, v [, out]) -> out */
  sta_layer *l = check_layer(L, 1);
  sta_tensor *q = check_tensor_named(L, 2, "q");
  sta_tensor *k = check_tensor_named(L, 3, "k");
  sta_tensor *v = check_tensor_named(L, 4, "v");
  sta_tensor *out;
  lua_settop(L, 5);
  if (!lua_isnil(L, 5)) {
    out = check_tensor_named(L, 5, "out");
  } else {
    int64_t shape[4];
    int32_t nd = sta_tensor_ndim(q);
    for (int i = 0; i < nd; i++) shape[i] = sta_tensor_size(q, i);
    LTensor *u;
    int r = push_new_tensor(L, sta_tensor_dtype(q), sta_tensor_device(q), nd, shape, &u);
    if (r != 1) return r;
    lua_replace(L, 5);
    out = u->t;
  }
  sta_status rc;
  CALL(rc, sta_layer_forward(l, q, k, v, out));
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_settop(L, 5);
  return 1;
}

static int y_index(lua_State *L) {
  lua_pushinteger(L, sta_layer_index(check_layer(L, 1)));
  return 1;
}

static int y_set_strategy(lua_State *L) {
  sta_layer *l = check_layer(L, 1);
  const sta_strategy *s = lua_isnoneornil(L, 2) ? NULL : check_strategy(L, 2);
  lua_getiuservalue(L, 1, 1);
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "strategy");
  sta_layer_set_strategy(l, s);
  lua_settop(L, 1);
  return 1;
}

static int y_tostring(lua_State *L) {
  LLayer *u = luaL_checkudata(L, 1, LAYER);
  if (!u->l) lua_pushliteral(L, "sta.Layer(released)");
  else lua_pushfstring(L, "sta.Layer(%d)", (int)sta_layer_index(u->l));
  return 1;
}

static int l_layer_index_from_prefix(lua_State *L) {
  int32_t i;
  sta_status rc = sta_layer_index_from_prefix(luaL_checkstring(L, 1), &i);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushinteger(L, i);
  return 1;
}

/* ---- tuning -------------------------------------------------------------- */

/* tune{files={...}, skip_steps=12, full={3,6,10}} -> strategy, report */
static int l_tune(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  int32_t full[3] = {3, 6, 10};
  if (lua_getfield(L, 1, "full") != LUA_TNIL) int_list(L, -1, full, 3, "full");
  lua_pop(L, 1);
  int32_t skip = (int32_t)int_field(L, 1, "skip_steps", 12);
  if (lua_getfield(L, 1, "files") != LUA_TTABLE)
    return misuse(L, "files: expected a list of search files, got %s", luaL_typename(L, -1));
  int32_t n = (int32_t)luaL_len(L, 2);
  const char **paths = lua_newuserdatauv(L, sizeof(char *) * (size_t)(n ? n : 1), 0);
  for (int32_t i = 0; i < n; i++) {
    lua_geti(L, 2, i + 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      return misuse(L, "files[%d]: expected a path, got %s", (int)i + 1, luaL_typename(L, -1));
    paths[i] = lua_tostring(L, -1);
    lua_pop(L, 1); /* kept alive by the files table */
  }
  sta_tune_report rep;
  memset(&rep, 0, sizeof rep);
  LStrategy *u = new_strategy_ud(L);
  sta_status rc = sta_tune(&u->s, n, paths, skip, full, &rep);
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, rep.sparsity);
  lua_setfield(L, -2, "sparsity");
  int nw = rep.n_windows < 16 ? rep.n_windows : 16;
  push_window_list(L, &rep.windows[0][0], nw);
  lua_setfield(L, -2, "windows");
  lua_createtable(L, nw, 0);
  for (int i = 0; i < nw; i++) {
    lua_pushinteger(L, rep.counts[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "counts");
  return 2;
}

/* ---- backends, info, errors ------------------------------------------------ */

static int l_backends(lua_State *L) {
  int n = 0;
  lua_newtable(L);
  if (sta_backend_available(STA_CPU)) { lua_pushliteral(L, "cpu"); lua_rawseti(L, -2, ++n); }
  if (sta_backend_available(STA_CUDA)) { lua_pushliteral(L, "cuda"); lua_rawseti(L, -2, ++n); }
  return 1;
}

static int l_backend_available(lua_State *L) {
  lua_pushboolean(L, sta_backend_available(parse_device(L, luaL_checkstring(L, 1))));
  return 1;
}

static int l_info(lua_State *L) {
  lua_createtable(L, 0, 8);
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
  lua_pushinteger(L, device_soft_limit);
  lua_setfield(L, -2, "device_soft_limit");
  return 1;
}

static int l_set_num_threads(lua_State *L) {
  sta_set_num_threads((int32_t)luaL_checkinteger(L, 1));
  return 0;
}
static int l_get_num_threads(lua_State *L) {
  lua_pushinteger(L, sta_get_num_threads());
  return 1;
}
static int l_synchronize(lua_State *L) {
  sta_status rc = sta_cuda_synchronize();
  if (rc != STA_OK) return sta_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}
static int l_device_bytes(lua_State *L) {
  lua_pushinteger(L, sta_device_bytes_in_use());
  lua_pushinteger(L, sta_device_bytes_peak());
  return 2;
}
static int l_set_device_soft_limit(lua_State *L) {
  device_soft_limit = (int64_t)luaL_checkinteger(L, 1);
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
static int l_live_tensors(lua_State *L) {
  lua_pushinteger(L, live_tensors);
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
  registry_sentinel(L, "sta.history", history_save);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_fault_arm(lua_State *L) {
  sta_fault_arm((int64_t)luaL_checkinteger(L, 1));
  return 0;
}

/* ---- registration ---------------------------------------------------------- */

static void new_class(lua_State *L, const char *name, const luaL_Reg *meta,
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

static const luaL_Reg tensor_meta[] = {
  {"__gc", tensor_release}, {"__close", tensor_release}, {"__tostring", t_tostring},
  {"__len", t_len}, {"__index", t_index}, {"__newindex", t_newindex}, {NULL, NULL}};
static const luaL_Reg tensor_methods[] = {
  {"release", tensor_release}, {"free", tensor_release}, {"released", t_released},
  {"shape", t_shape}, {"size", t_size}, {"strides", t_strides}, {"dtype", t_dtype},
  {"device", t_device}, {"ndim", t_ndim}, {"numel", t_numel},
  {"is_contiguous", t_contiguous}, {"to", t_to}, {"clone", t_clone}, {"copy", t_copy},
  {"view", t_view}, {"permute", t_permute}, {"narrow", t_narrow}, {"select", t_select},
  {"get", t_get}, {"set", t_set}, {"fill", t_fill}, {"randn", t_randn},
  {"totable", t_totable}, {"compare", t_compare}, {"save", t_save},
  {"axpby", t_axpby}, {"stats", t_stats}, {NULL, NULL}};

static const luaL_Reg geometry_meta[] = {
  {"__index", g_index}, {"__tostring", g_tostring}, {NULL, NULL}};
static const luaL_Reg geometry_methods[] = {
  {"grid", g_grid}, {"video_tokens", g_video_tokens}, {"text_len_for", g_text_len},
  {"tiled_len", g_tiled_len}, {"check", g_check}, {"window_check", g_window_check},
  {"key_tiles", g_key_tiles}, {NULL, NULL}};

static const luaL_Reg strategy_meta[] = {
  {"__gc", s_release}, {"__close", s_release}, {"__tostring", s_tostring},
  {"__len", s_count}, {"__eq", s_equal}, {NULL, NULL}};
static const luaL_Reg strategy_methods[] = {
  {"release", s_release}, {"get", s_get}, {"set", s_set}, {"save", s_save},
  {"to_json", s_to_json}, {"count", s_count}, {"extent", s_extent}, {"check", s_check},
  {"sparsity", s_sparsity}, {"equal", s_equal}, {NULL, NULL}};

static const luaL_Reg metadata_meta[] = {
  {"__gc", m_release}, {"__close", m_release}, {"__tostring", m_tostring}, {NULL, NULL}};
static const luaL_Reg metadata_methods[] = {
  {"release", m_release}, {"set_row", m_set_row}, {"row", m_row}, {"layers", m_layers},
  {NULL, NULL}};

static const luaL_Reg batch_meta[] = {
  {"__gc", b_release}, {"__close", b_release}, {"__tostring", b_tostring}, {NULL, NULL}};
static const luaL_Reg batch_methods[] = {
  {"release", b_release}, {"size", b_size}, {"negative", b_negative},
  {"records", b_records}, {"record", b_record}, {"save_search", b_save_search},
  {"clear", b_clear}, {NULL, NULL}};

static const luaL_Reg context_meta[] = {
  {"__close", c_pop}, {"__tostring", c_tostring}, {NULL, NULL}};
static const luaL_Reg context_methods[] = {
  {"pop", c_pop}, {"close", c_pop}, {"step", c_step}, {"metadata", c_metadata},
  {"batch", c_batch}, {"live", c_live}, {NULL, NULL}};

static const luaL_Reg layer_meta[] = {
  {"__gc", y_release}, {"__close", y_release}, {"__tostring", y_tostring}, {NULL, NULL}};
static const luaL_Reg layer_methods[] = {
  {"release", y_release}, {"forward", y_forward}, {"index", y_index},
  {"set_strategy", y_set_strategy}, {NULL, NULL}};

static const luaL_Reg core_funcs[] = {
  {"tensor", l_tensor}, {"zeros", l_zeros}, {"randn", l_randn},
  {"from_table", l_from_table}, {"npy_load", l_npy_load},
  {"load_safetensors", l_load_safetensors}, {"save_safetensors", l_save_safetensors},
  {"geometry", l_geometry}, {"geometry_from_seq_len", l_geometry_from_seq_len},
  {"window_range", l_window_range}, {"tile", l_tile}, {"untile", l_untile},
  {"attention", l_attention}, {"reference", l_reference}, {"flops", l_flops},
  {"head_diff", l_head_diff},
  {"strategy_new", l_strategy_new}, {"strategy_parse", l_strategy_parse},
  {"strategy_load", l_strategy_load}, {"strategy_default", l_strategy_default},
  {"strategy_uniform", l_strategy_uniform},
  {"metadata", l_metadata_new}, {"metadata_from_strategy", l_metadata_from_strategy},
  {"metadata_search", l_metadata_search},
  {"forward_batch", l_forward_batch}, {"forward_context", l_forward_context},
  {"current_context", l_current_context}, {"in_forward_pass", l_in_forward_pass},
  {"context_depth", l_context_depth},
  {"layer", l_layer}, {"layer_index_from_prefix", l_layer_index_from_prefix},
  {"tune", l_tune},
  {"backends", l_backends}, {"backend_available", l_backend_available}, {"info", l_info},
  {"set_num_threads", l_set_num_threads}, {"get_num_threads", l_get_num_threads},
  {"synchronize", l_synchronize}, {"device_bytes", l_device_bytes},
  {"set_device_soft_limit", l_set_device_soft_limit},
  {"last_error", l_last_error}, {"status_name", l_status_name},
  {"live_tensors", l_live_tensors}, {"fault_arm", l_fault_arm}, {"now", l_now},
  {"history", l_history},
  {NULL, NULL}};

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
  new_class(L, TENSOR, tensor_meta, tensor_methods, 0);
  new_class(L, GEOMETRY, geometry_meta, geometry_methods, 0);
  new_class(L, STRATEGY, strategy_meta, strategy_methods, 1);
  new_class(L, METADATA, metadata_meta, metadata_methods, 1);
  new_class(L, BATCH, batch_meta, batch_methods, 1);
  new_class(L, CONTEXT, context_meta, context_methods, 1);
  new_class(L, LAYER, layer_meta, layer_methods, 1);
  if (lua_getfield(L, LUA_REGISTRYINDEX, "sta.atclose") == LUA_TNIL)
    registry_sentinel(L, "sta.atclose", contexts_atclose);
  lua_pop(L, 1);
  luaL_newlib(L, core_funcs);
  push_status_table(L);
  lua_setfield(L, -2, "status");
  lua_pushstring(L, sta_version());
  lua_setfield(L, -2, "version");
  return 1;
}
