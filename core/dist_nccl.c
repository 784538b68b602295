/*
** dist_nccl.c -- the process transports: NCCL, libnccl loaded at run time (dlopen):
** no NCCL headers, no CUDA headers; the handful of NCCL entry points are
** declared here.  Bootstrap: rank 0 makes the unique id and shares it
** through a file (written to a temporary name, then renamed); the others
** poll for it.  The TCP transport (CPU memory, for machines without GPUs)
** shares that bootstrap.  Also sta_comm_from_env for scripts/sta-launch.
*/
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "internal.h"

#define MAX_TCP 64

#ifdef STA_WITH_CUDA
/* cudart (linked in when the CUDA backend is): choose the rank's device. */
int cudaSetDevice(int device);
int cudaGetDeviceCount(int *count);
#endif

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

/* ---- the transport ----------------------------------------------------------- */

typedef struct nccl_rank {
  nccl_comm comm;
  int32_t rank, size;
  sta_tensor *flag; /* device bytes for the barrier: [size] */
} nccl_rank;

static int32_t nr_rank(void *self) { return ((nccl_rank *)self)->rank; }
static int32_t nr_size(void *self) { return ((nccl_rank *)self)->size; }

static sta_status need_cuda(sta_device d) {
  if (d != STA_CUDA)
    return sta_error(STA_ERR_ARGUMENT, "nccl: moves cuda memory only, got %s memory",
                     d == STA_CPU ? "cpu" : "unknown");
  return STA_OK;
}

static sta_status nr_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  nccl_rank *me = self;
  void *stream = sta_cuda_get_stream();
  nccl_result r;
  sta_status rc = need_cuda(d);
  if (rc != STA_OK) return rc;
  if ((r = nccl.group_start()) != 0) return nccl_fail(r, "ncclGroupStart");
  for (int32_t j = 0; j < me->size; j++) {
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
  sta_status rc = need_cuda(d);
  if (rc != STA_OK) return rc;
  if ((r = nccl.all_gather(send, recv, chunk, NCCL_INT8, me->comm, sta_cuda_get_stream())) != 0)
    return nccl_fail(r, "ncclAllGather");
  return STA_OK;
}

static sta_status nr_barrier(void *self) {
  nccl_rank *me = self;
  char *p = sta_tensor_data(me->flag);
  sta_status rc = nr_all_gather(self, p + me->rank, p, 1, STA_CUDA);
  return rc == STA_OK ? sta_cuda_synchronize() : rc;
}

static void nr_destroy(void *self) {
  nccl_rank *me = self;
  if (me->comm) (void)nccl.comm_destroy(me->comm);
  sta_tensor_destroy(me->flag);
  free(me);
}

/* ---- bootstrap --------------------------------------------------------------- */

static double dist_timeout(void) {
  const char *e = getenv("STA_DIST_TIMEOUT");
  double s = e ? atof(e) : 300;
  return s > 0 ? s : 300;
}

/* The bootstrap bytes (an NCCL id, a TCP port) to path, atomically, so
** readers never see a partial file. */
static sta_status write_id(const char *path, const void *id, size_t len) {
  char label[4200];
  snprintf(label, sizeof label, "id_file \"%s\"", path);
  return sta_write_text_file(path, label, id, len);
}

/* Wait up to STA_DIST_TIMEOUT for path, then read exactly len bytes. */
static sta_status read_id(const char *path, int32_t rank, void *id, size_t len) {
  double limit = dist_timeout(), waited = 0;
  struct timespec nap = {0, 20 * 1000 * 1000};
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t n = fread(id, 1, len, f);
      fclose(f);
      if (n == len) return STA_OK;
      return sta_error(STA_ERR_FORMAT, "id_file: \"%s\" holds %zu bytes, expected %zu", path,
                       n, len);
    }
    if (waited >= limit)
      return sta_error(STA_ERR_IO,
                       "id_file: rank %d waited %g s for \"%s\" from rank 0 "
                       "(STA_DIST_TIMEOUT); is rank 0 running?", (int)rank, limit, path);
    nanosleep(&nap, NULL);
    waited += 0.02;
  }
}

sta_status sta_comm_nccl(sta_comm **out, int32_t rank, int32_t size, const char *id_file,
                         int32_t device) {
  sta_status rc;
  nccl_result r;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (size < 1) return sta_error(STA_ERR_ARGUMENT, "size: expected >= 1 ranks, got %d", (int)size);
  if (rank < 0 || rank >= size)
    return sta_error(STA_ERR_ARGUMENT, "rank: expected 0..%d, got %d", (int)size - 1, (int)rank);
  if (size > 1 && (!id_file || !*id_file))
    return sta_error(STA_ERR_ARGUMENT,
                     "id_file: expected a path to share the NCCL id (world size %d)", (int)size);
  if (device < -1)
    return sta_error(STA_ERR_ARGUMENT, "device: expected -1 or a CUDA device, got %d", (int)device);
  pthread_once(&nccl_once, nccl_load);
  if (!nccl.loaded) return sta_error(STA_ERR_BACKEND, "%s", nccl.why);
#ifdef STA_WITH_CUDA
  /* select the device before anything (the probe too) makes a context */
  if (device >= 0) {
    int n = 0;
    if (cudaGetDeviceCount(&n) == 0 && n > 0) {
      if (device >= n)
        return sta_error(STA_ERR_ARGUMENT, "device: %d, but %d CUDA devices are visible",
                         (int)device, n);
      if (cudaSetDevice(device) != 0)
        return sta_error(STA_ERR_DEVICE, "cuda: cannot select device %d", (int)device);
    }
  }
#endif
  if (!sta_backend_available(STA_CUDA))
    return sta_error(STA_ERR_BACKEND, "nccl: needs a CUDA device; %s",
                     sta_backend_describe(STA_CUDA));
  /* NVLink multicast (NVLS) stays off unless the user chose otherwise */
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  nccl_id id;
  memset(&id, 0, sizeof id);
  if (rank == 0) {
    if ((r = nccl.get_unique_id(&id)) != 0) return nccl_fail(r, "ncclGetUniqueId");
    if (size > 1 && (rc = write_id(id_file, &id, sizeof id)) != STA_OK) return rc;
  } else if ((rc = read_id(id_file, rank, &id, sizeof id)) != STA_OK)
    return rc;
  nccl_rank *me = sta_calloc(1, sizeof *me);
  if (!me) return sta_error(STA_ERR_NOMEM, "out of host memory (nccl rank)");
  me->rank = rank;
  me->size = size;
  int64_t n = size;
  if ((rc = sta_tensor_create(&me->flag, STA_BF16, STA_CUDA, 1, &n)) != STA_OK) {
    free(me);
    return rc;
  }
  if ((r = nccl.comm_init_rank(&me->comm, size, id, rank)) != 0) {
    rc = nccl_fail(r, "ncclCommInitRank");
    nr_destroy(me);
    return rc;
  }
  sta_transport t = {"nccl", 1u << STA_CUDA, me, nr_rank, nr_size, nr_all_to_all,
                     nr_all_gather, nr_barrier, nr_destroy};
  if ((rc = sta_comm_create(out, &t)) != STA_OK) nr_destroy(me);
  return rc;
}

/* ---- TCP: CPU processes (tests and machines without GPUs) --------------------
** A star through rank 0 on 127.0.0.1: rank 0 listens on a free port and
** shares it through the id file; every other rank connects and says its
** rank.  A collective: each rank sends its contribution to rank 0, which
** sends every rank what it receives.  Slow and simple: it proves the
** process-level flow (launcher, bootstrap, one rank per process). */

typedef struct tcp_boot { char magic[8]; uint32_t port; } tcp_boot;

typedef struct tcp_rank {
  int32_t rank, size;
  int fd[MAX_TCP]; /* rank 0: fd[j] to rank j (j >= 1); others: fd[0] to rank 0 */
} tcp_rank;

static int32_t tr_rank(void *self) { return ((tcp_rank *)self)->rank; }
static int32_t tr_size(void *self) { return ((tcp_rank *)self)->size; }

static sta_status tcp_io(int fd, void *buf, size_t n, int writing, int32_t peer) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0)
      return sta_error(STA_ERR_IO, "tcp: %s rank %d failed: %s", writing ? "sending to" : "receiving from",
                       (int)peer, k == 0 ? "connection closed" : strerror(errno));
    p += k;
    n -= (size_t)k;
  }
  return STA_OK;
}

/* in: bytes each rank contributes; chunk: bytes rank j gets from rank i
** (at offset j*chunk of i's contribution for all-to-all, 0 for gather). */
static sta_status tcp_exchange(tcp_rank *me, const void *send, void *recv, size_t in,
                               size_t chunk, int gather) {
  int32_t p = me->size;
  size_t outb = chunk * (size_t)p;
  sta_status rc = STA_OK;
  if (me->rank != 0) {
    if ((rc = tcp_io(me->fd[0], (void *)send, in, 1, 0)) != STA_OK) return rc;
    return tcp_io(me->fd[0], recv, outb, 0, 0);
  }
  char *stage = sta_malloc(in * (size_t)p + outb + 1);
  if (!stage) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp exchange)");
  char *out = stage + in * (size_t)p;
  memcpy(stage, send, in);
  for (int32_t j = 1; j < p && rc == STA_OK; j++)
    rc = tcp_io(me->fd[j], stage + in * (size_t)j, in, 0, j);
  for (int32_t j = 0; j < p && rc == STA_OK; j++) {
    char *dst = j == 0 ? recv : out;
    for (int32_t i = 0; i < p; i++)
      memcpy(dst + chunk * (size_t)i, stage + in * (size_t)i + (gather ? 0 : chunk * (size_t)j),
             chunk);
    if (j > 0) rc = tcp_io(me->fd[j], out, outb, 1, j);
  }
  free(stage);
  return rc;
}

static sta_status tr_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  tcp_rank *me = self;
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return tcp_exchange(me, send, recv, chunk * (size_t)me->size, chunk, 0);
}

static sta_status tr_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return tcp_exchange(self, send, recv, chunk, chunk, 1);
}

static sta_status tr_barrier(void *self) {
  tcp_rank *me = self;
  char one = 1, all[MAX_TCP];
  return tcp_exchange(me, &one, all, 1, 1, 1);
}

static void tr_destroy(void *self) {
  tcp_rank *me = self;
  for (int32_t j = 0; j < MAX_TCP; j++)
    if (me->fd[j] >= 0) close(me->fd[j]);
  free(me);
}

/* Wait for fd to be readable (accept) within the timeout. */
static int wait_readable(int fd, double seconds) {
  struct pollfd pf = {fd, POLLIN, 0};
  int r;
  do r = poll(&pf, 1, (int)(seconds * 1000)); while (r < 0 && errno == EINTR);
  return r > 0;
}

static sta_status tcp_boot_rank0(tcp_rank *me, const char *id_file) {
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  sta_status rc = STA_OK;
  if (ls < 0) return sta_error(STA_ERR_IO, "tcp: socket failed: %s", strerror(errno));
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, me->size) != 0 ||
      getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
    rc = sta_error(STA_ERR_IO, "tcp: cannot listen on 127.0.0.1: %s", strerror(errno));
    close(ls);
    return rc;
  }
  tcp_boot b;
  memcpy(b.magic, "sta-tcp", 8);
  b.port = ntohs(a.sin_port);
  if ((rc = write_id(id_file, &b, sizeof b)) != STA_OK) {
    close(ls);
    return rc;
  }
  double limit = dist_timeout();
  for (int32_t k = 1; k < me->size && rc == STA_OK; k++) {
    int32_t who = -1;
    if (!wait_readable(ls, limit)) {
      rc = sta_error(STA_ERR_IO, "tcp: rank 0 waited %g s for rank connections "
                     "(%d of %d came; STA_DIST_TIMEOUT)", limit, (int)k - 1, (int)me->size - 1);
      break;
    }
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) { rc = sta_error(STA_ERR_IO, "tcp: accept failed: %s", strerror(errno)); break; }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if ((rc = tcp_io(fd, &who, sizeof who, 0, -1)) != STA_OK) { close(fd); break; }
    if (who < 1 || who >= me->size || me->fd[who] >= 0) {
      close(fd);
      rc = sta_error(STA_ERR_IO, "tcp: a peer said it is rank %d (world size %d, or taken)",
                     (int)who, (int)me->size);
      break;
    }
    me->fd[who] = fd;
  }
  close(ls);
  return rc;
}

static sta_status tcp_boot_rank(tcp_rank *me, const char *id_file) {
  tcp_boot b;
  sta_status rc = read_id(id_file, me->rank, &b, sizeof b);
  if (rc != STA_OK) return rc;
  if (memcmp(b.magic, "sta-tcp", 8) != 0)
    return sta_error(STA_ERR_FORMAT, "id_file: \"%s\" holds no sta-tcp bootstrap (an NCCL id?)",
                     id_file);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons((uint16_t)b.port);
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (fd < 0) return sta_error(STA_ERR_IO, "tcp: socket failed: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    rc = sta_error(STA_ERR_IO, "tcp: rank %d cannot connect to rank 0 on 127.0.0.1:%u: %s",
                   (int)me->rank, (unsigned)b.port, strerror(errno));
    close(fd);
    return rc;
  }
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  me->fd[0] = fd;
  return tcp_io(fd, &me->rank, sizeof me->rank, 1, 0);
}

sta_status sta_comm_tcp(sta_comm **out, int32_t rank, int32_t size, const char *id_file) {
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (size < 1 || size > MAX_TCP)
    return sta_error(STA_ERR_ARGUMENT, "size: expected 1..%d ranks, got %d", MAX_TCP, (int)size);
  if (rank < 0 || rank >= size)
    return sta_error(STA_ERR_ARGUMENT, "rank: expected 0..%d, got %d", (int)size - 1, (int)rank);
  if (size > 1 && (!id_file || !*id_file))
    return sta_error(STA_ERR_ARGUMENT,
                     "id_file: expected a path to share the TCP port (world size %d)", (int)size);
  tcp_rank *me = sta_calloc(1, sizeof *me);
  if (!me) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp rank)");
  me->rank = rank;
  me->size = size;
  for (int32_t j = 0; j < MAX_TCP; j++) me->fd[j] = -1;
  rc = size == 1 ? STA_OK : rank == 0 ? tcp_boot_rank0(me, id_file) : tcp_boot_rank(me, id_file);
  if (rc == STA_OK) {
    sta_transport t = {"tcp", 1u << STA_CPU, me, tr_rank, tr_size, tr_all_to_all,
                       tr_all_gather, tr_barrier, tr_destroy};
    rc = sta_comm_create(out, &t);
  }
  if (rc != STA_OK) tr_destroy(me);
  return rc;
}

/* ---- from the launcher's environment ------------------------------------------- */

static sta_status env_int(const char *name, int32_t def, int32_t lo, int32_t *v) {
  const char *s = getenv(name);
  *v = def;
  if (!s || !*s) return STA_OK;
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (*end || errno || x < lo || x > (1 << 20))
    return sta_error(STA_ERR_ENV, "%s: expected an integer >= %d, got \"%s\"", name, (int)lo, s);
  *v = (int32_t)x;
  return STA_OK;
}

sta_status sta_comm_from_env(sta_comm **out) {
  int32_t rank, size, local;
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if ((rc = env_int("STA_WORLD_SIZE", 1, 1, &size)) != STA_OK ||
      (rc = env_int("STA_RANK", 0, 0, &rank)) != STA_OK ||
      (rc = env_int("STA_LOCAL_RANK", rank, 0, &local)) != STA_OK)
    return rc;
  if (rank >= size)
    return sta_error(STA_ERR_ENV, "STA_RANK: %d is not below STA_WORLD_SIZE %d", (int)rank,
                     (int)size);
  const char *be = getenv("STA_DIST_BACKEND");
  if (be && strcmp(be, "tcp") == 0) return sta_comm_tcp(out, rank, size, getenv("STA_DIST_ID_FILE"));
  if (be && strcmp(be, "loopback") == 0) {
    if (size != 1)
      return sta_error(STA_ERR_ENV,
                       "STA_DIST_BACKEND: loopback joins no other process (STA_WORLD_SIZE "
                       "%d); use nccl", (int)size);
    return sta_comm_loopback(out, 1);
  }
  if (be && *be && strcmp(be, "nccl") != 0)
    return sta_error(STA_ERR_ENV, "STA_DIST_BACKEND: expected nccl, tcp or loopback, got \"%s\"",
                     be);
#ifdef STA_WITH_CUDA
  /* a launcher that shows each rank only its own GPU: local rank r -> device 0 */
  int n = 0;
  if (cudaGetDeviceCount(&n) == 0 && n > 0) local %= n;
#endif
  rc = sta_comm_nccl(out, rank, size, getenv("STA_DIST_ID_FILE"), local);
  if (rc == STA_ERR_BACKEND) { /* no GPU: say what works here */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s; without GPUs set STA_DIST_BACKEND=tcp (scripts/sta-launch "
             "does when it finds no CUDA device)", sta_last_error());
    return sta_error(rc, "%s", msg);
  }
  return rc;
}
