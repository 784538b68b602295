/*
** nccl.c -- the NCCL transport: CUDA memory through NCCL on the calling
** thread's stream, host memory over the rendezvous's star.  libnccl is
** loaded at run time (dlopen): no NCCL or CUDA headers, the handful of
** entry points are declared here; the device goes through the backend
** table.
*/
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include "dist.h"

/* ---- the NCCL API we use (nccl.h, stable since 2.7) ------------------------ */

typedef struct nccl_id { char internal[128]; } nccl_id;
typedef void *nccl_comm;
typedef int nccl_result; /* 0 = ncclSuccess */
enum { NCCL_INT8 = 0 };

static struct nccl_api {
  int loaded;
  char why[768];
  nccl_result (*get_unique_id)(nccl_id *id);
  nccl_result (*comm_init_rank)(nccl_comm *comm, int nranks, nccl_id id, int rank);
  nccl_result (*comm_destroy)(nccl_comm comm);
  nccl_result (*send)(const void *buf, size_t count, int type, int peer, nccl_comm comm,
                      void *stream);
  nccl_result (*recv)(void *buf, size_t count, int type, int peer, nccl_comm comm,
                      void *stream);
  nccl_result (*all_gather)(const void *send, void *recv, size_t count, int type,
                            nccl_comm comm, void *stream);
  nccl_result (*group_start)(void);
  nccl_result (*group_end)(void);
  const char *(*error_string)(nccl_result r);
  nccl_result (*get_version)(int *version);
} nccl;

static pthread_once_t nccl_once = PTHREAD_ONCE_INIT;

static void nccl_load(void) {
  const char *path = getenv("STA_NCCL_LIB");
  if (!path || !*path) path = "libnccl.so.2";
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    snprintf(nccl.why, sizeof nccl.why,
             "nccl: cannot load \"%s\" (%s); set STA_NCCL_LIB to the library's path",
             path, e ? e : "unknown error");
    return;
  }
  static const char *const names[] = {
    "ncclGetUniqueId", "ncclCommInitRank", "ncclCommDestroy", "ncclSend", "ncclRecv",
    "ncclAllGather", "ncclGroupStart", "ncclGroupEnd", "ncclGetErrorString",
    "ncclGetVersion"};
  void *sym[10];
  for (int i = 0; i < 10; i++)
    if (!(sym[i] = dlsym(h, names[i]))) {
      snprintf(nccl.why, sizeof nccl.why, "nccl: \"%s\" has no %s (NCCL >= 2.7 needed)",
               path, names[i]);
      dlclose(h);
      return;
    }
  /* object <-> function pointers: POSIX guarantees dlsym's result converts */
  memcpy(&nccl.get_unique_id, &sym[0], sizeof sym[0]);
  memcpy(&nccl.comm_init_rank, &sym[1], sizeof sym[1]);
  memcpy(&nccl.comm_destroy, &sym[2], sizeof sym[2]);
  memcpy(&nccl.send, &sym[3], sizeof sym[3]);
  memcpy(&nccl.recv, &sym[4], sizeof sym[4]);
  memcpy(&nccl.all_gather, &sym[5], sizeof sym[5]);
  memcpy(&nccl.group_start, &sym[6], sizeof sym[6]);
  memcpy(&nccl.group_end, &sym[7], sizeof sym[7]);
  memcpy(&nccl.error_string, &sym[8], sizeof sym[8]);
  memcpy(&nccl.get_version, &sym[9], sizeof sym[9]);
  nccl.loaded = 1;
}

static sta_status nccl_fail(nccl_result r, const char *what) {
  return sta_error(STA_ERR_DEVICE, "nccl: %s failed: %s (%d)", what,
                   nccl.error_string ? nccl.error_string(r) : "?", (int)r);
}

/* ---- NCCL ------------------------------------------------------------------------ */

typedef struct nccl_rank {
  nccl_comm comm;
  star st;
  sta_tensor *flag; /* device bytes for the barrier: [size] */
} nccl_rank;

static int32_t nr_rank(void *self) { return ((nccl_rank *)self)->st.rank; }
static int32_t nr_size(void *self) { return ((nccl_rank *)self)->st.size; }

/* CUDA memory through NCCL on this thread's stream; host memory over the star. */
static sta_status nr_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  nccl_rank *me = self;
  nccl_result r;
  if (d == STA_CPU)
    return sta_star_exchange(&me->st, send, recv, chunk * (size_t)me->st.size, chunk, 0);
  void *stream = sta_cuda_get_stream();
  if ((r = nccl.group_start()) != 0) return nccl_fail(r, "ncclGroupStart");
  for (int32_t j = 0; j < me->st.size; j++) {
    if ((r = nccl.send((const char *)send + (size_t)j * chunk, chunk, NCCL_INT8, j, me->comm,
                       stream)) != 0 ||
        (r = nccl.recv((char *)recv + (size_t)j * chunk, chunk, NCCL_INT8, j, me->comm,
                       stream)) != 0) {
      (void)nccl.group_end();
      return nccl_fail(r, "ncclSend/ncclRecv");
    }
  }
  if ((r = nccl.group_end()) != 0) return nccl_fail(r, "ncclGroupEnd (all-to-all)");
  return STA_OK;
}

static sta_status nr_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  nccl_rank *me = self;
  nccl_result r;
  if (d == STA_CPU) return sta_star_exchange(&me->st, send, recv, chunk, chunk, 1);
  if ((r = nccl.all_gather(send, recv, chunk, NCCL_INT8, me->comm, sta_cuda_get_stream())) != 0)
    return nccl_fail(r, "ncclAllGather");
  return STA_OK;
}

static sta_status nr_barrier(void *self) {
  nccl_rank *me = self;
  char *p = sta_tensor_data(me->flag);
  sta_status rc = nr_all_gather(self, p + me->st.rank, p, 1, STA_CUDA);
  return rc == STA_OK ? sta_cuda_synchronize() : rc;
}

static void nr_destroy(void *self) {
  nccl_rank *me = self;
  if (me->comm) (void)nccl.comm_destroy(me->comm);
  sta_tensor_destroy(me->flag);
  sta_star_close(&me->st);
  free(me);
}

sta_status sta_comm_nccl(sta_comm **out, int32_t rank, int32_t size, const char *id_file,
                         int32_t device) {
  sta_status rc;
  nccl_result r;
  if ((rc = sta_world_args(out, rank, size, 1 << 20, id_file, "NCCL id")) != STA_OK) return rc;
  if (device < -1)
    return sta_error(STA_ERR_ARGUMENT, "device: expected -1 or a CUDA device, got %d", (int)device);
  pthread_once(&nccl_once, nccl_load);
  if (!nccl.loaded) return sta_error(STA_ERR_BACKEND, "%s", nccl.why);
  /* select the device before anything (the probe too) makes a context */
  const sta_backend_ops *cuda = sta_backend_get(STA_CUDA);
  int32_t ndev = device >= 0 && cuda ? cuda->device_count() : 0;
  if (ndev > 0) {
    if (device >= ndev)
      return sta_error(STA_ERR_ARGUMENT, "device: %d, but %d CUDA devices are visible",
                       (int)device, (int)ndev);
    if (cuda->set_device(device) != STA_OK)
      return sta_error(STA_ERR_DEVICE, "cuda: cannot select device %d", (int)device);
  }
  if (!sta_backend_available(STA_CUDA))
    return sta_error(STA_ERR_BACKEND, "nccl: needs a CUDA device; %s",
                     sta_backend_describe(STA_CUDA));
  /* NVLink multicast (NVLS) stays off unless the user chose otherwise */
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  nccl_id id;
  memset(&id, 0, sizeof id);
  if (rank == 0 && (r = nccl.get_unique_id(&id)) != 0) return nccl_fail(r, "ncclGetUniqueId");
  nccl_rank *me = sta_calloc(1, sizeof *me);
  if (!me) return sta_error(STA_ERR_NOMEM, "out of host memory (nccl rank)");
  if ((rc = sta_rendezvous(&me->st, rank, size, id_file, &id, sizeof id)) != STA_OK) {
    free(me);
    return rc;
  }
  int64_t n = size;
  if ((rc = sta_tensor_create(&me->flag, STA_BF16, STA_CUDA, 1, &n)) != STA_OK) {
    nr_destroy(me);
    return rc;
  }
  if ((r = nccl.comm_init_rank(&me->comm, size, id, rank)) != 0) {
    rc = nccl_fail(r, "ncclCommInitRank");
    nr_destroy(me);
    return rc;
  }
  sta_transport t = {"nccl", (1u << STA_CPU) | (1u << STA_CUDA), me, nr_rank, nr_size,
                     nr_all_to_all, nr_all_gather, nr_barrier, nr_destroy, NULL};
  if ((rc = sta_comm_create(out, &t)) != STA_OK) nr_destroy(me);
  return rc;
}

