/*
** tcp.c -- the TCP transport, for CPU processes (tests and machines
** without GPUs): every collective goes through rank 0 over the
** rendezvous's star.  Slow and simple; it proves the process-level flow
** (launcher, rendezvous, one rank per process).
*/
#include <stdlib.h>

#include "dist.h"

#define MAX_TCP 64

typedef struct tcp_rank { star st; } tcp_rank;

static int32_t tr_rank(void *self) { return ((tcp_rank *)self)->st.rank; }
static int32_t tr_size(void *self) { return ((tcp_rank *)self)->st.size; }

static sta_status tr_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  tcp_rank *me = self;
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return sta_star_exchange(&me->st, send, recv, chunk * (size_t)me->st.size, chunk, 0);
}

static sta_status tr_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return sta_star_exchange(&((tcp_rank *)self)->st, send, recv, chunk, chunk, 1);
}

static sta_status tr_barrier(void *self) {
  tcp_rank *me = self;
  char one = 1, *all = sta_malloc((size_t)me->st.size);
  if (!all) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp barrier)");
  sta_status rc = sta_star_exchange(&me->st, &one, all, 1, 1, 1);
  free(all);
  return rc;
}

static void tr_destroy(void *self) {
  tcp_rank *me = self;
  sta_star_close(&me->st);
  free(me);
}

sta_status sta_comm_tcp(sta_comm **out, int32_t rank, int32_t size, const char *id_file) {
  sta_status rc = sta_world_args(out, rank, size, MAX_TCP, id_file, "TCP port");
  if (rc != STA_OK) return rc;
  tcp_rank *me = sta_calloc(1, sizeof *me);
  if (!me) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp rank)");
  if ((rc = sta_rendezvous(&me->st, rank, size, id_file, NULL, 0)) != STA_OK) {
    free(me);
    return rc;
  }
  sta_transport t = {"tcp", 1u << STA_CPU, me, tr_rank, tr_size, tr_all_to_all,
                     tr_all_gather, tr_barrier, tr_destroy, NULL};
  if ((rc = sta_comm_create(out, &t)) != STA_OK) tr_destroy(me);
  return rc;
}

