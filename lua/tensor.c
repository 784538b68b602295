/*
** tensor.c -- the sta.Tensor class of the Lua module: creation, views,
** element access, conversion, comparison (files: files.c).
*/
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <lauxlib.h>
#include <lua.h>

#include "sta.h"
#include "sta_lua.h"

/* ---- tensors ----------------------------------------------------------- */

static int live_tensors = 0;
static uint64_t seed_counter = 0;

sta_lua_tensor *sta_lua_new_tensor(lua_State *L) {
  sta_lua_tensor *u = lua_newuserdatauv(L, sizeof *u, 1);
  u->t = NULL;
  luaL_setmetatable(L, STA_LUA_TENSOR);
  return u;
}

/* Bookkeeping once u->t holds a live tensor. */
void sta_lua_tensor_born(lua_State *L, sta_lua_tensor *u) {
  live_tensors++;
  if (sta_tensor_device(u->t) != STA_CPU) sta_lua_device_pressure(L);
}

static sta_lua_tensor *check_ltensor(lua_State *L, int idx) {
  return luaL_checkudata(L, idx, STA_LUA_TENSOR);
}

sta_tensor *sta_lua_check_tensor(lua_State *L, int idx, const char *name) {
  sta_lua_tensor *u = luaL_testudata(L, idx, STA_LUA_TENSOR);
  if (!u) sta_lua_misuse(L, "%s: expected a tensor, got %s", name, luaL_typename(L, idx));
  if (!u->t) sta_lua_misuse(L, "%s: tensor is released", name);
  return u->t;
}

static sta_tensor *check_tensor(lua_State *L, int idx) {
  return sta_lua_check_tensor(L, idx, "tensor");
}

/* An element value of t: an integer for i32, else a float. */
static void push_value(lua_State *L, const sta_tensor *t, double v) {
  if (sta_tensor_dtype(t) == STA_I32) lua_pushinteger(L, (lua_Integer)v);
  else lua_pushnumber(L, v);
}

static int tensor_release(lua_State *L) {
  sta_lua_tensor *u = check_ltensor(L, 1);
  if (u->t) {
    sta_tensor_destroy(u->t);
    u->t = NULL;
    live_tensors--;
  }
  return 0;
}

/* New contiguous tensor: pushes the userdata or raises/returns fail. */
int sta_lua_push_new_tensor(lua_State *L, sta_dtype dt, sta_device dev, int32_t nd,
                            const int64_t *shape, sta_lua_tensor **uo) {
  sta_status rc;
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  STA_LUA_CALL(rc, sta_tensor_create(&u->t, dt, dev, nd, shape));
  if (rc != STA_OK) { lua_pop(L, 1); return sta_lua_fail(L, rc); }
  sta_lua_tensor_born(L, u);
  *uo = u;
  return 1;
}

int sta_lua_push_like(lua_State *L, const sta_tensor *t, sta_tensor **out) {
  int64_t shape[4];
  int32_t nd = sta_tensor_ndim(t);
  for (int32_t i = 0; i < nd; i++) shape[i] = sta_tensor_size(t, i);
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, sta_tensor_dtype(t), sta_tensor_device(t), nd, shape, &u);
  if (r == 1) *out = u->t;
  return r;
}

static void tensor_opts(lua_State *L, int idx, sta_dtype *dt, sta_device *dev,
                        const char *const *keys) {
  *dt = STA_F32;
  *dev = STA_CPU;
  sta_lua_check_opts(L, idx, keys);
  if (lua_istable(L, idx)) {
    const char *s = sta_lua_str_field(L, idx, "dtype");
    if (s) *dt = sta_lua_parse_dtype(L, s);
    s = sta_lua_str_field(L, idx, "device");
    if (s) *dev = sta_lua_parse_device(L, s, "device");
  }
}

/* tensor(shape [, {dtype=, device=}]) -- uninitialised */
static int l_tensor(lua_State *L) {
  int64_t shape[4];
  int32_t nd = sta_lua_read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  sta_lua_tensor *u;
  static const char *const keys[] = {"dtype", "device", NULL};
  tensor_opts(L, 2, &dt, &dev, keys);
  return sta_lua_push_new_tensor(L, dt, dev, nd, shape, &u);
}

static int l_zeros(lua_State *L) {
  int64_t shape[4];
  int32_t nd = sta_lua_read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  sta_lua_tensor *u;
  double value = 0;
  static const char *const keys[] = {"dtype", "device", "value", NULL};
  tensor_opts(L, 2, &dt, &dev, keys);
  if (lua_istable(L, 2)) value = sta_lua_num_field(L, 2, "value", 0);
  int n = sta_lua_push_new_tensor(L, dt, dev, nd, shape, &u);
  if (n != 1) return n;
  sta_status rc = sta_tensor_fill(u->t, value);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 1;
}

static uint64_t fresh_seed(void) {
  uint64_t x =
      (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull + (++seed_counter) * 0xBF58476D1CE4E5B9ull;
  x ^= (uint64_t)clock() << 17;
  return x;
}

/* randn(shape [, {seed=, dtype=, device=, mean=, std=}]) */
static int l_randn(lua_State *L) {
  int64_t shape[4];
  int32_t nd = sta_lua_read_shape(L, 1, shape);
  sta_dtype dt;
  sta_device dev;
  sta_lua_tensor *u;
  uint64_t seed;
  double mean = 0, std = 1;
  static const char *const keys[] = {"seed", "dtype", "device", "mean", "std", NULL};
  tensor_opts(L, 2, &dt, &dev, keys);
  seed = fresh_seed();
  if (lua_istable(L, 2)) {
    seed = (uint64_t)sta_lua_int_field(L, 2, "seed", (lua_Integer)seed);
    mean = sta_lua_num_field(L, 2, "mean", 0);
    std = sta_lua_num_field(L, 2, "std", 1);
  }
  int n = sta_lua_push_new_tensor(L, dt, dev, nd, shape, &u);
  if (n != 1) return n;
  sta_status rc = sta_tensor_randn(u->t, seed, mean, std);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 1;
}

static int t_randn(lua_State *L) { /* t:randn([seed [, mean, std]]) */
  sta_tensor *t = check_tensor(L, 1);
  uint64_t seed = lua_isnoneornil(L, 2) ? fresh_seed() : (uint64_t)luaL_checkinteger(L, 2);
  sta_status rc = sta_tensor_randn(t, seed, luaL_optnumber(L, 3, 0), luaL_optnumber(L, 4, 1));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int t_fill(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc = sta_tensor_fill(t, luaL_checknumber(L, 2));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

static int t_copy(lua_State *L) { /* dst:copy(src) */
  sta_tensor *dst = sta_lua_check_tensor(L, 1, "dst");
  sta_tensor *src = sta_lua_check_tensor(L, 2, "src");
  sta_status rc = sta_tensor_copy(dst, src);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
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
    static const char *const keys[] = {"dtype", "device", NULL};
    sta_lua_check_keys(L, 2, keys);
    const char *s = sta_lua_str_field(L, 2, "dtype");
    if (s) dt = sta_lua_parse_dtype(L, s);
    s = sta_lua_str_field(L, 2, "device");
    if (s) dev = sta_lua_parse_device(L, s, "device");
  } else {
    for (int i = 2; i <= top; i++) {
      const char *s = luaL_checkstring(L, i);
      sta_dtype d;
      if (sta_dtype_parse(s, &d) == STA_OK) dt = d;
      else {
        sta_clear_error();
        if (strcmp(s, "cpu") && strcmp(s, "host") && strcmp(s, "cuda") &&
            strcmp(s, "cuda:0") && strcmp(s, "gpu"))
          return sta_lua_misuse(
              L, "to: '%s' is neither a dtype (f32, f16, bf16) nor a device (cpu, cuda)", s);
        dev = sta_lua_parse_device(L, s, "device");
      }
    }
  }
  sta_status rc;
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  STA_LUA_CALL(rc, sta_tensor_to(&u->t, t, dt, dev));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

static int t_clone(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc;
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  STA_LUA_CALL(rc, sta_tensor_to(&u->t, t, sta_tensor_dtype(t), sta_tensor_device(t)));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

/* Push a view made by the caller into u->t; pins the base (index 1). */
static sta_lua_tensor *push_view_ud(lua_State *L) {
  sta_lua_tensor *u = sta_lua_new_tensor(L);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  return u;
}

/* t:view(shape [, strides [, offset]]): offset in elements from t's first */
static int t_view(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int64_t shape[4], strides[4];
  int32_t nd = sta_lua_read_shape(L, 2, shape);
  int have_strides = !lua_isnoneornil(L, 3);
  int64_t offset = (int64_t)luaL_optinteger(L, 4, 0);
  if (have_strides) {
    if (!lua_istable(L, 3) || luaL_len(L, 3) != nd)
      return sta_lua_misuse(L, "strides: expected a table of %d integers", (int)nd);
    for (int i = 0; i < nd; i++) {
      lua_geti(L, 3, i + 1);
      strides[i] = (int64_t)luaL_checkinteger(L, -1);
      lua_pop(L, 1);
    }
  } else if (!sta_tensor_is_contiguous(t)) {
    return sta_lua_misuse(L, "view: the tensor is not contiguous; give strides");
  } else {
    int64_t st = 1;
    for (int i = nd - 1; i >= 0; i--) { strides[i] = st; st *= shape[i] > 0 ? shape[i] : 1; }
  }
  sta_lua_tensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_view(&u->t, t, offset, nd, shape, strides);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

/* t:permute{2,1,3,4} -- 1-based: new dim i is old dim perm[i] */
static int t_permute(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  int32_t nd = sta_tensor_ndim(t), perm[4];
  if (lua_istable(L, 2)) sta_lua_int_list(L, 2, perm, nd, "perm");
  else {
    if (lua_gettop(L) - 1 != nd)
      return sta_lua_misuse(L, "perm: expected %d dimensions, got %d", (int)nd, lua_gettop(L) - 1);
    for (int i = 0; i < nd; i++) perm[i] = sta_lua_check_int32(L, i + 2, "perm");
  }
  for (int i = 0; i < nd; i++) perm[i]--;
  sta_lua_tensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_permute(&u->t, t, perm);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

/* t:narrow(dim, start, len) -- dim and start 1-based */
static int t_narrow(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  lua_Integer dim = luaL_checkinteger(L, 2), start = luaL_checkinteger(L, 3);
  lua_Integer len = luaL_checkinteger(L, 4);
  if (dim < 1 || dim > sta_tensor_ndim(t))
    return sta_lua_misuse(L, "dim: %I outside 1..%d", dim, (int)sta_tensor_ndim(t));
  if (start < 1 || len < 0 || start - 1 + len > sta_tensor_size(t, (int)dim - 1))
    return sta_lua_misuse(L, "narrow: [%I, %I] outside 1..%I of dim %I", start, start + len - 1,
                          (lua_Integer)sta_tensor_size(t, (int)dim - 1), dim);
  sta_lua_tensor *u = push_view_ud(L);
  sta_status rc =
      sta_tensor_narrow(&u->t, t, (int32_t)(dim - 1), (int64_t)(start - 1), (int64_t)len);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
  return 1;
}

/* t:select(i): the slice at index i (1-based) of dim 1, one dim fewer */
static int t_select(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  lua_Integer i = luaL_checkinteger(L, 2);
  int32_t nd = sta_tensor_ndim(t);
  int64_t n = sta_tensor_size(t, 0);
  if (nd < 2)
    return sta_lua_misuse(L, "select: needs a tensor of 2 or more dimensions, got %d", (int)nd);
  if (i < 1 || i > n) return sta_lua_misuse(L, "index: %I is outside 1..%I", i, (lua_Integer)n);
  int64_t shape[3], strides[3];
  for (int d = 1; d < nd; d++) {
    shape[d - 1] = sta_tensor_size(t, d);
    strides[d - 1] = sta_tensor_stride(t, d);
  }
  sta_lua_tensor *u = push_view_ud(L);
  sta_status rc = sta_tensor_view(&u->t, t, (int64_t)(i - 1) * sta_tensor_stride(t, 0), nd - 1,
                                  shape, strides);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  sta_lua_tensor_born(L, u);
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
    return sta_lua_misuse(L, "dim: %I outside 1..%d", d, (int)sta_tensor_ndim(t));
  lua_pushinteger(L, sta_tensor_size(t, (int32_t)(d - 1)));
  return 1;
}

static int t_dtype(lua_State *L) {
  lua_pushstring(L, sta_dtype_name(sta_tensor_dtype(check_tensor(L, 1))));
  return 1;
}
static int t_device(lua_State *L) {
  lua_pushstring(L, sta_lua_device_name(sta_tensor_device(check_tensor(L, 1))));
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
    sta_lua_misuse(L, "index: expected a table of %d integers, got %s", (int)nd,
                   luaL_typename(L, idx));
  if (luaL_len(L, idx) != nd)
    sta_lua_misuse(L, "index: expected %d integers, got %d", (int)nd, (int)luaL_len(L, idx));
  for (int i = 0; i < nd; i++) {
    lua_geti(L, idx, i + 1);
    ix[i] = (int64_t)luaL_checkinteger(L, -1) - 1;
    if (ix[i] < 0 || ix[i] >= sta_tensor_size(t, i))
      sta_lua_misuse(L, "index[%d]: %I is outside 1..%I", i + 1, (lua_Integer)(ix[i] + 1),
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
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  push_value(L, t, v);
  return 1;
}

static int t_set(lua_State *L) { /* t:set({i, j, ...}, value) */
  sta_tensor *t = check_tensor(L, 1);
  int64_t ix[4];
  read_index(L, t, 2, ix);
  sta_status rc = sta_tensor_set(t, ix, luaL_checknumber(L, 3));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
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
    push_value(L, t, v);
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
  } else nd = sta_lua_read_shape(L, 2, shape);
  sta_dtype dt;
  sta_device dev;
  static const char *const keys[] = {"dtype", "device", NULL};
  tensor_opts(L, 3, &dt, &dev, keys);
  int64_t numel = 1;
  for (int i = 0; i < nd; i++) numel *= shape[i];
  if ((int64_t)luaL_len(L, 1) != numel)
    return sta_lua_misuse(L, "values: expected %d numbers for the shape, got %d", (int)numel,
                          (int)luaL_len(L, 1));
  sta_lua_tensor *u;
  int r = sta_lua_push_new_tensor(L, dt, STA_CPU, nd, shape, &u);
  if (r != 1) return r;
  for (int64_t i = 0; i < numel; i++) {
    lua_geti(L, 1, (lua_Integer)(i + 1));
    int ok;
    double v = lua_tonumberx(L, -1, &ok);
    if (!ok)
      return sta_lua_misuse(L, "values[%d]: expected a number, got %s", (int)(i + 1),
                            luaL_typename(L, -1));
    lua_pop(L, 1);
    host_flat_index(u->t, i, ix);
    sta_status rc = sta_tensor_set(u->t, ix, v);
    if (rc != STA_OK) return sta_lua_fail(L, rc); /* an i32 that is no integer */
  }
  if (dev != STA_CPU) {
    lua_replace(L, 1);
    lua_settop(L, 1);
    lua_pushstring(L, sta_lua_device_name(dev));
    return t_to(L);
  }
  return 1;
}

static int t_compare(lua_State *L) { /* a:compare(b) -> max_abs, rel_l2 */
  sta_tensor *a = sta_lua_check_tensor(L, 1, "a");
  sta_tensor *b = sta_lua_check_tensor(L, 2, "b");
  double m, r;
  sta_status rc = sta_tensor_compare(a, b, &m, &r);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_pushnumber(L, m);
  lua_pushnumber(L, r);
  return 2;
}

/* y:axpby(a, x, b): y = a*x + b*y on y's device (sta_tensor_axpby: any
** dtypes and strides, float32 arithmetic).  Returns y. */
static int t_axpby(lua_State *L) {
  sta_tensor *y = sta_lua_check_tensor(L, 1, "y");
  double a = luaL_checknumber(L, 2);
  sta_tensor *x = sta_lua_check_tensor(L, 3, "x");
  double b = luaL_checknumber(L, 4);
  sta_status rc = sta_tensor_axpby(y, a, x, b);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* t:scale(a): t = a*t.  Returns t. */
static int t_scale(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  sta_status rc = sta_tensor_scale(t, luaL_checknumber(L, 2));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* t:add(x): t = t + x; t:add(x, y): t = x + y (torch7's forms).  Returns t. */
static int t_add(lua_State *L) {
  sta_tensor *t = sta_lua_check_tensor(L, 1, "out");
  sta_tensor *x = sta_lua_check_tensor(L, 2, "x");
  sta_tensor *y = lua_isnoneornil(L, 3) ? NULL : sta_lua_check_tensor(L, 3, "y");
  sta_status rc = y ? sta_tensor_add(t, x, y) : sta_tensor_add(t, t, x);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_settop(L, 1);
  return 1;
}

/* t:stats() -> {mean=, std=, min=, max=, count=, nonfinite=}, reduced on
** t's device (sta_tensor_stats). */
static int t_stats(lua_State *L) {
  sta_stats s;
  sta_status rc = sta_tensor_stats(check_tensor(L, 1), &s);
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  lua_createtable(L, 0, 6);
  lua_pushnumber(L, s.mean);
  lua_setfield(L, -2, "mean");
  lua_pushnumber(L, s.std);
  lua_setfield(L, -2, "std");
  lua_pushnumber(L, s.min);
  lua_setfield(L, -2, "min");
  lua_pushnumber(L, s.max);
  lua_setfield(L, -2, "max");
  lua_pushinteger(L, (lua_Integer)s.count);
  lua_setfield(L, -2, "count");
  lua_pushinteger(L, (lua_Integer)s.nonfinite);
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
  sta_lua_tensor *u = check_ltensor(L, 1);
  if (!u->t) {
    lua_pushliteral(L, "sta.Tensor(released)");
    return 1;
  }
  sta_tensor *t = u->t;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  lua_pushfstring(L, "sta.Tensor(%s, %s, ", sta_dtype_name(sta_tensor_dtype(t)),
                  sta_lua_device_name(sta_tensor_device(t)));
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
        return sta_lua_misuse(L, "index: %I is outside 1..%I", (lua_Integer)(ix + 1),
                              (lua_Integer)sta_tensor_size(t, 0));
      sta_status rc = sta_tensor_get(t, &ix, &v);
      if (rc != STA_OK) return sta_lua_fail(L, rc);
      push_value(L, t, v);
      return 1;
    }
    lua_settop(L, 2);
    return t_select(L);
  }
  luaL_getmetatable(L, STA_LUA_TENSOR);
  lua_getfield(L, -1, "methods");
  lua_pushvalue(L, 2);
  lua_rawget(L, -2);
  return 1;
}

static int t_newindex(lua_State *L) {
  sta_tensor *t = check_tensor(L, 1);
  if (lua_type(L, 2) != LUA_TNUMBER || sta_tensor_ndim(t) != 1)
    return sta_lua_misuse(L, "t[i] = v: only for 1-D tensors with an integer index");
  int64_t ix = (int64_t)luaL_checkinteger(L, 2) - 1;
  sta_status rc = sta_tensor_set(t, &ix, luaL_checknumber(L, 3));
  if (rc != STA_OK) return sta_lua_fail(L, rc);
  return 0;
}

static int l_live_tensors(lua_State *L) {
  lua_pushinteger(L, live_tensors);
  return 1;
}

/* ---- registration ---------------------------------------------------------- */

static const luaL_Reg tensor_meta[] = {
  {"__gc", tensor_release}, {"__close", tensor_release}, {"__tostring", t_tostring},
  {"__len", t_len}, {"__index", t_index}, {"__newindex", t_newindex}, {NULL, NULL}};
static const luaL_Reg tensor_methods[] = {
  {"release", tensor_release}, {"released", t_released},
  {"shape", t_shape}, {"size", t_size}, {"strides", t_strides}, {"dtype", t_dtype},
  {"device", t_device}, {"ndim", t_ndim}, {"numel", t_numel},
  {"is_contiguous", t_contiguous}, {"to", t_to}, {"clone", t_clone}, {"copy", t_copy},
  {"view", t_view}, {"permute", t_permute}, {"narrow", t_narrow}, {"select", t_select},
  {"get", t_get}, {"set", t_set}, {"fill", t_fill}, {"randn", t_randn},
  {"totable", t_totable}, {"compare", t_compare}, {"save", sta_lua_tensor_save},
  {"axpby", t_axpby}, {"scale", t_scale}, {"add", t_add}, {"stats", t_stats}, {NULL, NULL}};
static const luaL_Reg tensor_funcs[] = {
  {"tensor", l_tensor}, {"zeros", l_zeros}, {"randn", l_randn},
  {"from_table", l_from_table}, {NULL, NULL}};

void sta_lua_open_tensor(lua_State *L) {
  sta_lua_new_class(L, STA_LUA_TENSOR, tensor_meta, tensor_methods, 0);
  luaL_setfuncs(L, tensor_funcs, 0);
  luaL_getsubtable(L, -1, "debug");
  lua_pushcfunction(L, l_live_tensors);
  lua_setfield(L, -2, "live_tensors");
  lua_pop(L, 1);
}
