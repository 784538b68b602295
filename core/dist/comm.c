/*
** comm.c -- communicators over a transport table (sta.h, sta_transport):
** create, reference counts, rank and size, the head chunks of the SP
** pipeline, the tensor collectives; the one timeout of every wait of the
** distribution layer.
*/
#include <stdlib.h>

#include "dist.h"

double sta_dist_timeout(void) {
  const char *e = getenv("STA_DIST_TIMEOUT");
  double s = e ? atof(e) : 300;
  return s > 0 ? s : 300;
}

/* ---- communicators -------------------------------------------------------- */

sta_status sta_comm_create(sta_comm **out, const sta_transport *t) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!t) return sta_error(STA_ERR_ARGUMENT, "transport: expected a table, got NULL");
  if (!t->rank || !t->size || !t->all_to_all || !t->all_gather || !t->barrier)
    return sta_error(STA_ERR_ARGUMENT,
                     "transport: rank, size, all_to_all, all_gather and barrier "
                     "must all be set");
  int32_t r = t->rank(t->self), n = t->size(t->self);
  if (n < 1 || r < 0 || r >= n)
    return sta_error(STA_ERR_ARGUMENT, "transport: rank %d of size %d is not a rank",
                     (int)r, (int)n);
  sta_comm *c = sta_calloc(1, sizeof *c);
  if (!c) return sta_error(STA_ERR_NOMEM, "out of host memory (communicator)");
  sta_status rc = sta_handle_add(c, STA_KIND_COMM);
  if (rc != STA_OK) { free(c); return rc; }
  c->refs = 1;
  c->t = *t;
  if (!c->t.name) c->t.name = "custom";
  *out = c;
  return STA_OK;
}

void sta_comm_retain(sta_comm *c) { sta_ref_retain(&c->refs); }

void sta_comm_destroy(sta_comm *c) {
  if (!sta_handle_live(c, STA_KIND_COMM) || !sta_ref_release(&c->refs)) return;
  sta_handle_remove(c);
  if (c->t.destroy) c->t.destroy(c->t.self);
  sta_tensor_destroy(c->ws);
  sta_tensor_destroy(c->dbuf);
  for (int i = 0; i < N_EVENTS && c->lanes; i++)
    if (c->ev[i]) c->lanes->event_destroy(c->ev[i]);
  if (c->side) c->lanes->stream_destroy(c->side);
  free(c);
}

static int live(const sta_comm *c) {
  return sta_handle_check(c, STA_KIND_COMM, "comm") == STA_OK;
}

int32_t sta_comm_rank(const sta_comm *c) { return live(c) ? c->t.rank(c->t.self) : -1; }
int32_t sta_comm_size(const sta_comm *c) { return live(c) ? c->t.size(c->t.self) : 0; }
const char *sta_comm_name(const sta_comm *c) { return live(c) ? c->t.name : "none"; }

sta_status sta_comm_set_chunks(sta_comm *c, int32_t n) {
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  if (n < 0 || n > MAX_CHUNKS)
    return sta_error(STA_ERR_ARGUMENT, "n: expected 0 (choose) or 1..%d chunks, got %d",
                     MAX_CHUNKS, (int)n);
  c->chunks = n;
  return STA_OK;
}

int32_t sta_comm_chunks(const sta_comm *c) { return live(c) ? c->chunks : 0; }

sta_status sta_comm_barrier(sta_comm *c) {
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  return c->t.barrier(c->t.self);
}

sta_status sta_comm_check_moves(const sta_comm *c, const sta_tensor *t, const char *name) {
  sta_device d = sta_tensor_device(t);
  if (!(c->t.devices & (1u << d)))
    return sta_error(STA_ERR_ARGUMENT, "%s: on %s, but the %s communicator does not move %s memory",
                     name, sta_device_name(d), c->t.name, sta_device_name(d));
  return STA_OK;
}

/* Checks shared by the tensor collectives; *bytes = send's size in bytes. */
static sta_status collective_args(const sta_comm *c, const sta_tensor *send,
                                  const sta_tensor *recv, size_t *bytes) {
  sta_status rc;
  STA_CHECK_HANDLE(c, STA_KIND_COMM, "comm");
  STA_CHECK_HANDLE(send, STA_KIND_TENSOR, "send");
  STA_CHECK_HANDLE(recv, STA_KIND_TENSOR, "recv");
  if (!sta_tensor_is_contiguous(send))
    return sta_error(STA_ERR_SHAPE, "send: expected a contiguous tensor");
  if (!sta_tensor_is_contiguous(recv))
    return sta_error(STA_ERR_SHAPE, "recv: expected a contiguous tensor");
  if (send->dtype != recv->dtype)
    return sta_error(STA_ERR_DTYPE, "recv: dtype %s differs from send's %s",
                     sta_dtype_name(recv->dtype), sta_dtype_name(send->dtype));
  if (sta_tensor_device(send) != sta_tensor_device(recv))
    return sta_error(STA_ERR_ARGUMENT, "recv: on %s while send is on %s",
                     sta_device_name(sta_tensor_device(recv)), sta_device_name(sta_tensor_device(send)));
  if ((rc = sta_comm_check_moves(c, send, "send")) != STA_OK) return rc;
  *bytes = (size_t)sta_tensor_numel(send) * sta_dtype_size(send->dtype);
  return STA_OK;
}

sta_status sta_comm_all_to_all(sta_comm *c, const sta_tensor *send, sta_tensor *recv) {
  size_t bytes;
  sta_status rc = collective_args(c, send, recv, &bytes);
  if (rc != STA_OK) return rc;
  int32_t p = sta_comm_size(c);
  int64_t n = sta_tensor_numel(send);
  if (sta_tensor_numel(recv) != n)
    return sta_error(STA_ERR_SHAPE, "recv: %lld elements, expected send's %lld",
                     (long long)sta_tensor_numel(recv), (long long)n);
  if (n % p != 0)
    return sta_error(STA_ERR_SHAPE, "send: %lld elements are not divisible by the %d ranks",
                     (long long)n, (int)p);
  return c->t.all_to_all(c->t.self, sta_tensor_data(send), sta_tensor_data(recv),
                         bytes / (size_t)p, sta_tensor_device(send));
}

sta_status sta_comm_all_gather(sta_comm *c, const sta_tensor *send, sta_tensor *recv) {
  size_t bytes;
  sta_status rc = collective_args(c, send, recv, &bytes);
  if (rc != STA_OK) return rc;
  int32_t p = sta_comm_size(c);
  int64_t n = sta_tensor_numel(send);
  if (sta_tensor_numel(recv) != n * p)
    return sta_error(STA_ERR_SHAPE, "recv: %lld elements, expected %d ranks x %lld",
                     (long long)sta_tensor_numel(recv), (int)p, (long long)n);
  return c->t.all_gather(c->t.self, sta_tensor_data(send), sta_tensor_data(recv), bytes,
                         sta_tensor_device(send));
}

