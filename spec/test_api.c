/* test_api.c -- every public function of sta.h, called with NULL in each
** pointer argument and with a released handle in each handle argument (the
** calls are generated from sta.h by scripts/test/gen-api-test.lua into
** $(BUILD)/gen/test_api_calls.h; a new function is covered by the next
** build, or the build stops naming the argument it cannot fill).  Here:
** the fixture that makes valid arguments, and the checks: the class
** behind "S.C.sta_tensor_ndim(nil) segfaults". */
#include <unistd.h>

#include "internal.h"
#include "test_util.h"

enum { FX_T = 2, FX_HH = 4, FX_W = 4, FX_V = FX_T * FX_HH * FX_W, FX_TEXT = 2,
       FX_S = FX_V + FX_TEXT, FX_H = 2, FX_D = 4, FX_NUMEL = FX_S * FX_H * FX_D };

static char dir[256], path_npy[320], path_st[320], path_json[320], path_search[320];
static const char *JSON = "{\"0_0_0\": [1, 1, 1], \"0_0_1\": [1, 1, 1]}";

typedef struct fx {
  sta_tensor *made[64];
  int nmade;
  sta_tensor *tlist[1], *tensor_out;
  const char *names[1], *paths[1], *path_out, *path_npy, *path_st, *path_json, *json_text;
  sta_safetensors *safetensors, *safetensors_out;
  sta_strategy *strategy, *strategy_out;
  sta_metadata *metadata, *metadata_out;
  sta_forward_batch *batch, *batch_out;
  sta_context *context, *context_out;
  sta_layer *layer, *layer_out;
  sta_comm *comm, *comm_out;
  sta_sp_layer *sp_layer, *sp_layer_out;
  sta_geometry geom;
  sta_attention_desc desc, desc8; /* desc8: STA_PRECISION_FP8 */
  sta_vsa_desc vdesc;
  sta_layer_desc ldesc;
  sta_transport transport;
  sta_tune_report report;
  int64_t shape4[4], strides4[4], index4[4], i64out;
  int32_t perm4[4], win[3], wins[3], cands[6], fullwin[3], grid[3], iout[16];
  const int32_t *cwins;
  double dout[4];
  float fout[64], fout2[64], loss[64], buf[FX_NUMEL];
  sta_dtype dtype_out;
  sta_stats stats;
  char *json;
  int64_t live0; /* live handles before the fixture */
} fx;

#define OK(call) do { sta_status r_ = (call); \
  if (r_ != STA_OK) fail_msg("fixture: %s: %s", #call, sta_last_error()); } while (0)

static sta_tensor *fx_tensor(fx *x) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {1, FX_S, FX_H, FX_D};
  OK(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape));
  OK(sta_tensor_randn(t, (uint64_t)x->nmade + 1, 0, 1));
  assert_true(x->nmade < 64);
  return x->made[x->nmade++] = t;
}

/* f8e4m3 [1, S, H, D] (sta_attention_forward_fp8's q8, k8, v8). */
static sta_tensor *fx_tensor8(fx *x) {
  sta_tensor *t = NULL;
  int64_t shape[4] = {1, FX_S, FX_H, FX_D};
  OK(sta_tensor_create(&t, STA_F8E4M3, STA_CPU, 4, shape));
  OK(sta_tensor_randn(t, (uint64_t)x->nmade + 1, 0, 1));
  assert_true(x->nmade < 64);
  return x->made[x->nmade++] = t;
}

/* f32 [1, H, D], filled: a per-channel scale. */
static sta_tensor *fx_vscale(fx *x) {
  sta_tensor *t = NULL;
  int64_t shape[3] = {1, FX_H, FX_D};
  OK(sta_tensor_create(&t, STA_F32, STA_CPU, 3, shape));
  OK(sta_tensor_fill(t, 0.5));
  return x->made[x->nmade++] = t;
}

static sta_tensor *fx_lse(fx *x) {
  sta_tensor *t = NULL;
  int64_t shape[3] = {1, FX_H, FX_S};
  OK(sta_tensor_create(&t, STA_F32, STA_CPU, 3, shape));
  OK(sta_tensor_fill(t, 1.5));
  return x->made[x->nmade++] = t;
}

static int32_t tr_rank(void *self) { (void)self; return 0; }
static int32_t tr_size(void *self) { (void)self; return 1; }
static sta_status tr_move(void *self, const void *send, void *recv, size_t bytes, sta_device d) {
  (void)self; (void)d;
  memmove(recv, send, bytes);
  return STA_OK;
}
static sta_status tr_barrier(void *self) { (void)self; return STA_OK; }
static sta_status fx_rank_ok(void *arg, int32_t rank, sta_comm *comm) {
  (void)arg; (void)rank; (void)comm;
  return STA_OK;
}

static void fx_open(fx *x) {
  memset(x, 0, sizeof *x);
  while (sta_context_current()) sta_context_pop(sta_context_current()); /* a failed test's */
  x->live0 = sta_handle_count();
  sta_geometry_init(&x->geom, FX_T, FX_HH, FX_W);
  x->geom.tile[0] = 1; x->geom.tile[1] = 2; x->geom.tile[2] = 2; /* grid 2x2x2 */
  for (int i = 0; i < 3; i++) { x->win[i] = 1; x->wins[i] = 1; x->fullwin[i] = 3; x->grid[i] = 2; }
  for (int i = 0; i < 6; i++) x->cands[i] = i < 3 ? 1 : 3;
  x->desc.geom = x->geom;
  x->desc.n_windows = 1;
  x->desc.windows = x->win;
  x->desc8 = x->desc;
  x->desc8.precision = STA_PRECISION_FP8;
  x->vdesc.topk = 1;
  int64_t shape[4] = {1, FX_S, FX_H, FX_D};
  for (int i = 0; i < 4; i++) { x->shape4[i] = shape[i]; x->perm4[i] = i; }
  x->strides4[3] = 1;
  for (int i = 2; i >= 0; i--) x->strides4[i] = x->strides4[i + 1] * shape[i + 1];
  for (int i = 0; i < 64; i++) x->loss[i] = 0.25f;
  x->path_out = sta_test_path(dir, "out");
  x->path_npy = path_npy;
  x->path_st = path_st;
  x->path_json = path_json;
  x->json_text = JSON;
  x->names[0] = "q";
  x->paths[0] = path_search;
  x->tlist[0] = fx_tensor(x);
  OK(sta_strategy_uniform(&x->strategy, 1, 1, FX_H, x->win, NULL, 0));
  OK(sta_metadata_from_strategy(&x->metadata, x->strategy, 0, 1, FX_H));
  OK(sta_forward_batch_create(&x->batch, 1));
  OK(sta_context_push(&x->context, 0, x->metadata, x->batch));
  x->ldesc.local_heads = FX_H;
  x->ldesc.head_dim = FX_D;
  x->ldesc.sp_size = 1;
  x->ldesc.geom = x->geom;
  x->ldesc.strategy = x->strategy;
  OK(sta_layer_create(&x->layer, &x->ldesc));
  OK(sta_comm_loopback(&x->comm, 1));
  OK(sta_sp_layer_create(&x->sp_layer, x->comm, &x->ldesc));
  OK(sta_safetensors_open(&x->safetensors, path_st));
  sta_transport t = {"fake", 1u << STA_CPU, NULL, tr_rank, tr_size, tr_move, tr_move,
                     tr_barrier, NULL, NULL};
  x->transport = t;
}

static void fx_close(fx *x) {
  while (sta_context_current()) OK(sta_context_pop(sta_context_current()));
  for (int i = 0; i < x->nmade; i++) sta_tensor_destroy(x->made[i]);
  sta_tensor_destroy(x->tensor_out);
  sta_safetensors_close(x->safetensors);
  sta_safetensors_close(x->safetensors_out);
  sta_strategy_destroy(x->strategy);
  sta_strategy_destroy(x->strategy_out);
  sta_metadata_destroy(x->metadata);
  sta_metadata_destroy(x->metadata_out);
  sta_forward_batch_destroy(x->batch);
  sta_forward_batch_destroy(x->batch_out);
  sta_layer_destroy(x->layer);
  sta_layer_destroy(x->layer_out);
  sta_sp_layer_destroy(x->sp_layer);
  sta_sp_layer_destroy(x->sp_layer_out);
  sta_comm_destroy(x->comm);
  sta_comm_destroy(x->comm_out);
  sta_free(x->json);
  sta_cuda_set_stream(NULL);
  if (sta_handle_count() != x->live0)
    fail_msg("%lld handles left alive after the call",
             (long long)(sta_handle_count() - x->live0));
}

/* Handles made and released again: what a caller holds after destroy. */
static void *fx_dead_tensor(void) {
  sta_tensor *t = NULL;
  int64_t n = 1;
  OK(sta_tensor_create(&t, STA_F32, STA_CPU, 1, &n));
  sta_tensor_destroy(t);
  return t;
}
static void *fx_dead_strategy(void) {
  sta_strategy *s = NULL;
  OK(sta_strategy_create(&s));
  sta_strategy_destroy(s);
  return s;
}
static void *fx_dead_metadata(void) {
  sta_metadata *m = NULL;
  OK(sta_metadata_create(&m, 1));
  sta_metadata_destroy(m);
  return m;
}
static void *fx_dead_batch(void) {
  sta_forward_batch *b = NULL;
  OK(sta_forward_batch_create(&b, 1));
  sta_forward_batch_destroy(b);
  return b;
}
static void *fx_dead_context(void) {
  sta_context *c = NULL;
  OK(sta_context_push(&c, 0, NULL, NULL));
  OK(sta_context_pop(c));
  return c;
}
static void *fx_dead_layer(void) {
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.local_heads = 1;
  d.head_dim = 4;
  d.sp_size = 1;
  sta_layer *l = NULL;
  OK(sta_layer_create(&l, &d));
  sta_layer_destroy(l);
  return l;
}
static void *fx_dead_comm(void) {
  sta_comm *c = NULL;
  OK(sta_comm_loopback(&c, 1));
  sta_comm_destroy(c);
  return c;
}
static void *fx_dead_sp_layer(void) {
  sta_comm *c = NULL;
  sta_sp_layer *l = NULL;
  sta_layer_desc d;
  memset(&d, 0, sizeof d);
  d.local_heads = 1;
  d.head_dim = 4;
  sta_geometry_init(&d.geom, 2, 2, 2);
  OK(sta_comm_loopback(&c, 1));
  OK(sta_sp_layer_create(&l, c, &d));
  sta_comm_destroy(c);
  sta_sp_layer_destroy(l);
  return l;
}
static void *fx_dead_safetensors(void) {
  sta_safetensors *f = NULL;
  OK(sta_safetensors_open(&f, path_st));
  sta_safetensors_close(f);
  return f;
}
static const sta_tensor *dead_tensors[1];
static const sta_tensor *const *fx_dead_list_tensor(void) {
  dead_tensors[0] = fx_dead_tensor();
  return dead_tensors;
}
static sta_comm *dead_comms[1];
static sta_comm *const *fx_dead_list_comm(void) {
  dead_comms[0] = fx_dead_comm();
  return dead_comms;
}

/* The message names the argument: "<arg>: ...", "<arg>[i]...", "<arg>, ...". */
static int names_arg(const char *msg, const char *arg) {
  size_t n = strlen(arg);
  for (const char *p = strstr(msg, arg); p; p = strstr(p + 1, arg))
    if ((p == msg || p[-1] == ' ' || p[-1] == '(' || p[-1] == ',') &&
        (p[n] == ':' || p[n] == '[' || p[n] == ',' || p[n] == ' '))
      return 1;
  return 0;
}

static void fx_refused(sta_status rc, const char *fn, const char *arg, const char *alias,
                       int dead) {
  const char *what = dead ? "a released handle" : "NULL";
  if (rc == STA_OK) fail_msg("%s: accepted %s as %s", fn, what, arg);
  if (sta_status_group(rc) != 100)
    fail_msg("%s: %s as %s gave %s, expected a 1xx status (%s)", fn, what, arg,
             sta_status_name(rc), sta_last_error());
  if (sta_last_status() != rc || !sta_last_error()[0])
    fail_msg("%s: status %s but sta_last_status %s, message '%s'", fn, sta_status_name(rc),
             sta_status_name(sta_last_status()), sta_last_error());
  if (!names_arg(sta_last_error(), arg) && !names_arg(sta_last_error(), alias))
    fail_msg("%s: %s as %s: the message '%s' does not name it", fn, what, arg, sta_last_error());
  if (dead && !strstr(sta_last_error(), "not a live"))
    fail_msg("%s: a released %s: message '%s'", fn, arg, sta_last_error());
}

static void fx_consistent(sta_status rc, const char *fn) {
  if (rc != STA_OK && (sta_last_status() != rc || !sta_last_error()[0]))
    fail_msg("%s: status %s but sta_last_status %s, message '%s'", fn, sta_status_name(rc),
             sta_status_name(sta_last_status()), sta_last_error());
}

static void fx_dead_reported(const char *fn, const char *arg) {
  if (!strstr(sta_last_error(), "not a live"))
    fail_msg("%s: a released %s left the message '%s'", fn, arg, sta_last_error());
}

#include "test_api_calls.h"

static int setup(void **state) {
  (void)state;
  if (sta_test_mkdtemp(dir, sizeof dir, "test-api")) return -1;
  snprintf(path_npy, sizeof path_npy, "%s/q.npy", dir);
  snprintf(path_st, sizeof path_st, "%s/q.safetensors", dir);
  snprintf(path_json, sizeof path_json, "%s/s.json", dir);
  snprintf(path_search, sizeof path_search, "%s/r.json", dir);
  sta_tensor *t = NULL;
  sta_strategy *s = NULL;
  sta_forward_batch *fb = NULL;
  int64_t shape[4] = {1, FX_S, FX_H, FX_D};
  int32_t w[3] = {1, 1, 1}, cands[3] = {1, 1, 1};
  float loss[FX_H] = {0.5f, 0.25f};
  OK(sta_tensor_create(&t, STA_F32, STA_CPU, 4, shape));
  OK(sta_tensor_randn(t, 7, 0, 1));
  const char *names[1] = {"q"};
  const sta_tensor *ts[1] = {t};
  OK(sta_npy_save(t, path_npy));
  OK(sta_safetensors_save(path_st, 1, names, ts));
  OK(sta_strategy_uniform(&s, 1, 1, FX_H, w, NULL, 0));
  OK(sta_strategy_save(s, path_json));
  OK(sta_forward_batch_create(&fb, 1));
  OK(sta_forward_batch_record(fb, 0, 0, 0, 1, cands, FX_H, loss, loss));
  OK(sta_forward_batch_save_search(fb, 0, path_search));
  sta_tensor_destroy(t);
  sta_strategy_destroy(s);
  sta_forward_batch_destroy(fb);
  printf("# %d public functions of sta.h called with NULL and released handles\n", FX_NFUNCS);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  return sta_test_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {FX_TESTS};
  return cmocka_run_group_tests(tests, setup, teardown);
}
