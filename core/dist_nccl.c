/*
** dist_nccl.c -- the process transports and how their ranks meet.
**
** Rendezvous: rank 0 listens, every other rank connects and says who it is
** (rank and world size), rank 0 answers each with the bootstrap bytes (the
** NCCL unique id; nothing for TCP).  Where rank 0 listens comes from a
** file (scripts/sta-launch: rank 0 binds 127.0.0.1 on a free port and
** writes it there atomically; the others poll for the file) or from
** tcp://HOST:PORT (torchrun, srun, mpirun: MASTER_ADDR and MASTER_PORT).
** The sockets stay open as the world's host star, which moves host memory
** (the SP descriptor check; all data of the TCP transport).  Every wait is
** bounded by $STA_DIST_TIMEOUT.
**
** NCCL: libnccl loaded at run time (dlopen); no NCCL or CUDA headers, the
** handful of entry points are declared here.  Also sta_comm_env and
** sta_comm_from_env.
*/
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "internal.h"

#define MAX_TCP 64

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

/* ---- time --------------------------------------------------------------------- */

static double dist_timeout(void) {
  const char *e = getenv("STA_DIST_TIMEOUT");
  double s = e ? atof(e) : 300;
  return s > 0 ? s : 300;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap(void) {
  struct timespec t = {0, 20 * 1000 * 1000};
  nanosleep(&t, NULL);
}

/* ---- the host star ------------------------------------------------------------ */

typedef struct star {
  int32_t rank, size;
  int *fd; /* rank 0: fd[j] to rank j (j >= 1); others: fd[0] to rank 0; -1: none */
} star;

static sta_status star_init(star *s, int32_t rank, int32_t size) {
  s->rank = rank;
  s->size = size;
  s->fd = sta_malloc(sizeof(int) * (size_t)size);
  if (!s->fd) return sta_error(STA_ERR_NOMEM, "out of host memory (%d sockets)", (int)size);
  for (int32_t j = 0; j < size; j++) s->fd[j] = -1;
  return STA_OK;
}

static void star_close(star *s) {
  if (s->fd)
    for (int32_t j = 0; j < s->size; j++)
      if (s->fd[j] >= 0) close(s->fd[j]);
  free(s->fd);
  s->fd = NULL;
}

/* n bytes to or from fd, each wait for the socket within until (0: the
** timeout from now).  peer < 0: the rendezvous (no peer rank yet). */
static sta_status star_io(int fd, void *buf, size_t n, int writing, int32_t peer,
                          double until) {
  char *p = buf;
  double limit = dist_timeout();
  if (until <= 0) until = now_s() + limit;
  while (n > 0) {
    struct pollfd pf = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
    double left = until - now_s();
    int r = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) {
      if (peer < 0) return sta_error(STA_ERR_IO, "rendezvous: a peer sent nothing for %g s "
                                     "(STA_DIST_TIMEOUT)", limit);
      return sta_error(STA_ERR_IO, "tcp: %s rank %d: waited %g s (STA_DIST_TIMEOUT)",
                       writing ? "sending to" : "receiving from", (int)peer, limit);
    }
    ssize_t k = r < 0 ? -1 : writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) {
      if (peer < 0) return sta_error(STA_ERR_IO, "rendezvous: %s", k == 0 ? "connection closed"
                                                                        : strerror(errno));
      return sta_error(STA_ERR_IO, "tcp: %s rank %d failed: %s",
                       writing ? "sending to" : "receiving from", (int)peer,
                       k == 0 ? "connection closed" : strerror(errno));
    }
    p += k;
    n -= (size_t)k;
  }
  return STA_OK;
}

/* A collective through rank 0.  in: bytes each rank contributes; chunk:
** bytes rank j gets from rank i (at offset j*chunk of i's contribution for
** all-to-all, 0 for gather).  One deadline for the whole collective. */
static sta_status star_exchange(star *s, const void *send, void *recv, size_t in,
                                size_t chunk, int gather) {
  int32_t p = s->size;
  size_t outb = chunk * (size_t)p;
  double until = now_s() + dist_timeout();
  sta_status rc = STA_OK;
  if (p == 1) {
    memmove(recv, send, chunk);
    return STA_OK;
  }
  if (s->rank != 0) {
    if ((rc = star_io(s->fd[0], (void *)send, in, 1, 0, until)) != STA_OK) return rc;
    return star_io(s->fd[0], recv, outb, 0, 0, until);
  }
  char *stage = sta_malloc(in * (size_t)p + outb + 1);
  if (!stage) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp exchange)");
  char *out = stage + in * (size_t)p;
  memcpy(stage, send, in);
  for (int32_t j = 1; j < p && rc == STA_OK; j++)
    rc = star_io(s->fd[j], stage + in * (size_t)j, in, 0, j, until);
  for (int32_t j = 0; j < p && rc == STA_OK; j++) {
    char *dst = j == 0 ? recv : out;
    for (int32_t i = 0; i < p; i++)
      memcpy(dst + chunk * (size_t)i, stage + in * (size_t)i + (gather ? 0 : chunk * (size_t)j),
             chunk);
    if (j > 0) rc = star_io(s->fd[j], out, outb, 1, j, until);
  }
  free(stage);
  return rc;
}

/* ---- rendezvous --------------------------------------------------------------- */

typedef struct boot_file { char magic[8]; uint32_t port; } boot_file; /* "sta-tcp" */
typedef struct hello { char magic[8]; int32_t rank, size; } hello;     /* "sta-rdv" */
typedef struct ack { char magic[8]; uint32_t len; } ack;               /* "sta-ack" */

/* Where rank 0 listens: a file (its port goes there) or tcp://HOST:PORT. */
typedef struct where {
  const char *path; /* the file, or NULL */
  char host[256], port[8];
} where;

static sta_status where_parse(where *w, const char *s) {
  memset(w, 0, sizeof *w);
  if (strncmp(s, "tcp://", 6) != 0) {
    w->path = s;
    snprintf(w->host, sizeof w->host, "127.0.0.1");
    return STA_OK;
  }
  const char *h = s + 6, *colon = strrchr(h, ':'), *hend = colon;
  if (*h == '[') { /* [v6 address]:port */
    const char *close = strchr(h, ']');
    if (close && close + 1 == colon) { h++; hend = close; }
  }
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : 0;
  if (!colon || hend == h || (size_t)(hend - h) >= sizeof w->host || !end || *end ||
      end == colon + 1 || port < 1 || port > 65535)
    return sta_error(STA_ERR_ARGUMENT, "id_file: expected a path or tcp://HOST:PORT (port "
                     "1..65535), got \"%s\"", s);
  memcpy(w->host, h, (size_t)(hend - h));
  snprintf(w->port, sizeof w->port, "%ld", port);
  return STA_OK;
}

static sta_status resolve(const where *w, struct addrinfo **res) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int e = getaddrinfo(w->host, w->port, &hints, res);
  if (e != 0)
    return sta_error(STA_ERR_IO, "rendezvous: cannot resolve \"%s\": %s", w->host,
                     e == EAI_SYSTEM ? strerror(errno) : gai_strerror(e));
  return STA_OK;
}

static int is_loopback(const struct sockaddr *a) {
  if (a->sa_family == AF_INET)
    return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
  return a->sa_family == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)a)->sin6_addr);
}

/* Rank 0's listening socket: 127.0.0.1 on a free port for a file; for
** HOST:PORT, HOST itself when it is a loopback address, else every
** interface of its family (the other ranks reach HOST from elsewhere). */
static sta_status rdv_listen(const where *w, int32_t size, int *out, uint16_t *port) {
  struct sockaddr_storage a;
  socklen_t al;
  memset(&a, 0, sizeof a);
  if (w->path) {
    struct sockaddr_in *in = (struct sockaddr_in *)&a;
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    al = sizeof *in;
  } else {
    struct addrinfo *res = NULL;
    sta_status rc = resolve(w, &res);
    if (rc != STA_OK) return rc;
    memcpy(&a, res->ai_addr, res->ai_addrlen);
    al = res->ai_addrlen;
    freeaddrinfo(res);
    if (!is_loopback((struct sockaddr *)&a)) {
      if (a.ss_family == AF_INET)
        ((struct sockaddr_in *)&a)->sin_addr.s_addr = htonl(INADDR_ANY);
      else
        ((struct sockaddr_in6 *)&a)->sin6_addr = in6addr_any;
    }
  }
  int ls = socket(a.ss_family, SOCK_STREAM, 0), one = 1;
  if (ls < 0) return sta_error(STA_ERR_IO, "rendezvous: socket failed: %s", strerror(errno));
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(ls, (struct sockaddr *)&a, al) != 0 || listen(ls, size) != 0 ||
      getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
    int e = errno;
    close(ls);
    return sta_error(STA_ERR_IO, "rendezvous: rank 0 cannot listen on %s:%s: %s%s", w->host,
                     w->path ? "0" : w->port, strerror(e),
                     e == EADDRINUSE ? " (another job's rendezvous? choose another MASTER_PORT "
                                       "or set STA_MASTER_PORT)" : "");
  }
  *port = ntohs(a.ss_family == AF_INET ? ((struct sockaddr_in *)&a)->sin_port
                                       : ((struct sockaddr_in6 *)&a)->sin6_port);
  *out = ls;
  return STA_OK;
}

/* Wait up to the timeout for path, then read exactly len bytes. */
static sta_status read_id(const char *path, int32_t rank, void *id, size_t len, double until) {
  for (;;) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t n = fread(id, 1, len, f);
      fclose(f);
      if (n == len) return STA_OK;
      return sta_error(STA_ERR_FORMAT, "id_file: \"%s\" holds %zu bytes, expected %zu", path,
                       n, len);
    }
    if (now_s() >= until)
      return sta_error(STA_ERR_IO,
                       "id_file: rank %d waited %g s for \"%s\" from rank 0 "
                       "(STA_DIST_TIMEOUT); is rank 0 running?", (int)rank, dist_timeout(),
                       path);
    nap();
  }
}

/* Rank 0: accept the other ranks (a connection that does not say
** "sta-rdv" is dropped), then send each the bootstrap bytes. */
static sta_status rdv_serve(star *s, const where *w, const void *boot, size_t len,
                            double until) {
  int ls = -1;
  uint16_t port = 0;
  sta_status rc = rdv_listen(w, s->size, &ls, &port);
  if (rc != STA_OK) return rc;
  if (w->path) {
    boot_file b;
    char label[4200];
    memcpy(b.magic, "sta-tcp", 8);
    b.port = port;
    snprintf(label, sizeof label, "id_file \"%s\"", w->path);
    if ((rc = sta_write_text_file(w->path, label, &b, sizeof b)) != STA_OK) {
      close(ls);
      return rc;
    }
  }
  int32_t came = 0;
  while (came < s->size - 1 && rc == STA_OK) {
    struct pollfd pf = {ls, POLLIN, 0};
    double left = until - now_s();
    int r = left > 0 ? poll(&pf, 1, (int)(left * 1000) + 1) : 0;
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      rc = sta_error(STA_ERR_IO, "rendezvous: rank 0 waited %g s for the other ranks at "
                     "%s:%u (%d of %d came; STA_DIST_TIMEOUT)", dist_timeout(), w->host,
                     (unsigned)port, (int)came, (int)s->size - 1);
      break;
    }
    int fd = accept(ls, NULL, NULL), one = 1;
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      rc = sta_error(STA_ERR_IO, "rendezvous: accept failed: %s", strerror(errno));
      break;
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    hello h;
    double hello_until = now_s() + 5 < until ? now_s() + 5 : until;
    if (star_io(fd, &h, sizeof h, 0, -1, hello_until) != STA_OK ||
        memcmp(h.magic, "sta-rdv", 8) != 0) {
      close(fd); /* not one of ours */
      continue;
    }
    if (h.size != s->size)
      rc = sta_error(STA_ERR_IO, "rendezvous: rank %d joined a world of %d ranks, rank 0's "
                     "has %d", (int)h.rank, (int)h.size, (int)s->size);
    else if (h.rank < 1 || h.rank >= s->size || s->fd[h.rank] >= 0)
      rc = sta_error(STA_ERR_IO, "rendezvous: a peer said it is rank %d (world size %d, or "
                     "taken)", (int)h.rank, (int)s->size);
    if (rc != STA_OK) {
      close(fd);
      break;
    }
    s->fd[h.rank] = fd;
    came++;
  }
  close(ls);
  for (int32_t j = 1; j < s->size && rc == STA_OK; j++) {
    ack a;
    memcpy(a.magic, "sta-ack", 8);
    a.len = (uint32_t)len;
    rc = star_io(s->fd[j], &a, sizeof a, 1, j, until);
    if (rc == STA_OK && len) rc = star_io(s->fd[j], (void *)boot, len, 1, j, until);
  }
  return rc;
}

/* Ranks 1..: reach rank 0 (retrying until the timeout: it may not listen
** yet), say who we are, receive len bootstrap bytes. */
static sta_status rdv_join(star *s, const where *w, void *boot, size_t len, double until) {
  where at = *w;
  sta_status rc;
  if (w->path) {
    boot_file b;
    if ((rc = read_id(w->path, s->rank, &b, sizeof b, until)) != STA_OK) return rc;
    if (memcmp(b.magic, "sta-tcp", 8) != 0)
      return sta_error(STA_ERR_FORMAT, "id_file: \"%s\" holds no sta bootstrap", w->path);
    snprintf(at.port, sizeof at.port, "%u", (unsigned)b.port);
  }
  struct addrinfo *res = NULL;
  if ((rc = resolve(&at, &res)) != STA_OK) return rc;
  int fd = -1, err = 0, one = 1;
  for (;;) {
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
      fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (fd < 0) { err = errno; continue; }
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        err = errno;
        close(fd);
        fd = -1;
      }
    }
    if (fd >= 0 || now_s() >= until) break;
    nap();
  }
  freeaddrinfo(res);
  if (fd < 0)
    return sta_error(STA_ERR_IO, "rendezvous: rank %d cannot reach rank 0 at %s:%s within "
                     "%g s (STA_DIST_TIMEOUT): %s; is rank 0 running?", (int)s->rank, at.host,
                     at.port, dist_timeout(), strerror(err));
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  s->fd[0] = fd;
  hello h;
  memcpy(h.magic, "sta-rdv", 8);
  h.rank = s->rank;
  h.size = s->size;
  ack a;
  if ((rc = star_io(fd, &h, sizeof h, 1, 0, until)) != STA_OK) return rc;
  if (star_io(fd, &a, sizeof a, 0, 0, until) != STA_OK || memcmp(a.magic, "sta-ack", 8) != 0)
    return sta_error(STA_ERR_IO, "rendezvous: rank %d: rank 0 at %s:%s gave up on the "
                     "rendezvous (its own error says why)", (int)s->rank, at.host, at.port);
  if (a.len != len)
    return sta_error(STA_ERR_IO, "rendezvous: rank 0 sent %u bootstrap bytes, rank %d "
                     "expected %zu (a TCP rank meeting an NCCL world?)", (unsigned)a.len,
                     (int)s->rank, len);
  return len ? star_io(fd, boot, len, 0, 0, until) : STA_OK;
}

/* The star of rank of size through at (a file path or tcp://HOST:PORT),
** rank 0's boot bytes going to every rank.  On error s holds no socket. */
static sta_status rendezvous(star *s, int32_t rank, int32_t size, const char *at, void *boot,
                             size_t len) {
  where w;
  sta_status rc = star_init(s, rank, size);
  if (rc != STA_OK) return rc;
  if (size == 1) return STA_OK;
  if ((rc = where_parse(&w, at)) == STA_OK) {
    double until = now_s() + dist_timeout();
    rc = rank == 0 ? rdv_serve(s, &w, boot, len, until) : rdv_join(s, &w, boot, len, until);
  }
  if (rc != STA_OK) star_close(s);
  return rc;
}

/* The checks sta_comm_nccl and sta_comm_tcp share. */
static sta_status world_args(sta_comm **out, int32_t rank, int32_t size, int32_t max,
                             const char *at, const char *what) {
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (size < 1 || size > max)
    return sta_error(STA_ERR_ARGUMENT, "size: expected 1..%d ranks, got %d", (int)max,
                     (int)size);
  if (rank < 0 || rank >= size)
    return sta_error(STA_ERR_ARGUMENT, "rank: expected 0..%d, got %d", (int)size - 1, (int)rank);
  if (size > 1 && (!at || !*at))
    return sta_error(STA_ERR_ARGUMENT,
                     "id_file: expected a path or tcp://HOST:PORT to share the %s (world "
                     "size %d)", what, (int)size);
  if (size > 1) {
    where w;
    return where_parse(&w, at);
  }
  return STA_OK;
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
    return star_exchange(&me->st, send, recv, chunk * (size_t)me->st.size, chunk, 0);
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
  if (d == STA_CPU) return star_exchange(&me->st, send, recv, chunk, chunk, 1);
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
  star_close(&me->st);
  free(me);
}

sta_status sta_comm_nccl(sta_comm **out, int32_t rank, int32_t size, const char *id_file,
                         int32_t device) {
  sta_status rc;
  nccl_result r;
  if ((rc = world_args(out, rank, size, 1 << 20, id_file, "NCCL id")) != STA_OK) return rc;
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
  if ((rc = rendezvous(&me->st, rank, size, id_file, &id, sizeof id)) != STA_OK) {
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

/* ---- TCP: CPU processes (tests and machines without GPUs) --------------------
** Every collective goes through rank 0 over the star: slow and simple; it
** proves the process-level flow (launcher, rendezvous, one rank per
** process). */

typedef struct tcp_rank { star st; } tcp_rank;

static int32_t tr_rank(void *self) { return ((tcp_rank *)self)->st.rank; }
static int32_t tr_size(void *self) { return ((tcp_rank *)self)->st.size; }

static sta_status tr_all_to_all(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  tcp_rank *me = self;
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return star_exchange(&me->st, send, recv, chunk * (size_t)me->st.size, chunk, 0);
}

static sta_status tr_all_gather(void *self, const void *send, void *recv, size_t chunk,
                                sta_device d) {
  if (d != STA_CPU) return sta_error(STA_ERR_ARGUMENT, "tcp: moves cpu memory only");
  return star_exchange(&((tcp_rank *)self)->st, send, recv, chunk, chunk, 1);
}

static sta_status tr_barrier(void *self) {
  tcp_rank *me = self;
  char one = 1, *all = sta_malloc((size_t)me->st.size);
  if (!all) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp barrier)");
  sta_status rc = star_exchange(&me->st, &one, all, 1, 1, 1);
  free(all);
  return rc;
}

static void tr_destroy(void *self) {
  tcp_rank *me = self;
  star_close(&me->st);
  free(me);
}

sta_status sta_comm_tcp(sta_comm **out, int32_t rank, int32_t size, const char *id_file) {
  sta_status rc = world_args(out, rank, size, MAX_TCP, id_file, "TCP port");
  if (rc != STA_OK) return rc;
  tcp_rank *me = sta_calloc(1, sizeof *me);
  if (!me) return sta_error(STA_ERR_NOMEM, "out of host memory (tcp rank)");
  if ((rc = rendezvous(&me->st, rank, size, id_file, NULL, 0)) != STA_OK) {
    free(me);
    return rc;
  }
  sta_transport t = {"tcp", 1u << STA_CPU, me, tr_rank, tr_size, tr_all_to_all,
                     tr_all_gather, tr_barrier, tr_destroy, NULL};
  if ((rc = sta_comm_create(out, &t)) != STA_OK) tr_destroy(me);
  return rc;
}

/* ---- from the launcher's environment ------------------------------------------- */

/* The launchers whose variables sta reads, in this order (sta.h). */
static const struct family {
  const char *rank, *size, *local, *who;
} families[] = {
  {"STA_RANK", "STA_WORLD_SIZE", "STA_LOCAL_RANK", "scripts/sta-launch"},
  {"RANK", "WORLD_SIZE", "LOCAL_RANK", "torchrun"},
  {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "mpirun"},
  {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "srun"},
};
#define N_FAMILIES ((int32_t)(sizeof families / sizeof families[0]))

static const char *env_of(const char *name) {
  const char *s = getenv(name);
  return s && *s ? s : NULL;
}

static sta_status env_int(const char *name, int32_t def, int32_t lo, int32_t *v) {
  const char *s = env_of(name);
  *v = def;
  if (!s) return STA_OK;
  char *end;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (*end || errno || x < lo || x > (1 << 20))
    return sta_error(STA_ERR_ENV, "%s: expected an integer >= %d, got \"%s\"", name, (int)lo, s);
  *v = (int32_t)x;
  return STA_OK;
}

sta_status sta_comm_env(int32_t *rank, int32_t *size, int32_t *local_rank, int32_t *family) {
  const char *names[4] = {"rank", "size", "local_rank", "family"};
  int32_t *outs[4] = {rank, size, local_rank, family};
  for (int i = 0; i < 4; i++)
    if (!outs[i]) return sta_error(STA_ERR_ARGUMENT, "%s: expected a pointer, got NULL", names[i]);
  int32_t r = 0, n = 1, l = 0, f = 0;
  sta_status rc;
  for (int32_t i = 0; i < N_FAMILIES && f == 0; i++) {
    const struct family *x = &families[i];
    const char *rs = env_of(x->rank), *ns = env_of(x->size);
    if (!rs && !ns) continue;
    if ((rc = env_int(x->size, 1, 1, &n)) != STA_OK || (rc = env_int(x->rank, 0, 0, &r)) != STA_OK)
      return rc;
    if (!rs || !ns)
      return sta_error(STA_ERR_ENV, "%s: not set, but %s is (%s sets both)",
                       rs ? x->size : x->rank, rs ? x->rank : x->size, x->who);
    if (r >= n)
      return sta_error(STA_ERR_ENV, "%s: %d is not below %s %d", x->rank, (int)r, x->size,
                       (int)n);
    if ((rc = env_int(x->local, r, 0, &l)) != STA_OK) return rc;
    f = i + 1;
  }
  *rank = r;
  *size = n;
  *local_rank = l;
  *family = f;
  return STA_OK;
}

/* Where the ranks of a world of size meet: STA_DIST_ID_FILE, else
** tcp://MASTER_ADDR:port, port = STA_MASTER_PORT or MASTER_PORT + 1. */
static sta_status env_rendezvous(char *at, size_t cap, int32_t size, int32_t family) {
  const char *file = env_of("STA_DIST_ID_FILE"), *addr = env_of("MASTER_ADDR");
  const char *mp = env_of("MASTER_PORT"), *sp = env_of("STA_MASTER_PORT");
  int32_t port;
  sta_status rc;
  at[0] = '\0';
  if (size == 1) return STA_OK; /* nobody to meet */
  if (file) {
    snprintf(at, cap, "%s", file);
    return STA_OK;
  }
  if (!addr)
    return sta_error(STA_ERR_ENV, "MASTER_ADDR: not set; a world of %d ranks (from %s's %s) "
                     "meets at MASTER_ADDR:MASTER_PORT (or STA_DIST_ID_FILE)", (int)size,
                     families[family - 1].who, families[family - 1].size);
  if (sp) {
    if ((rc = env_int("STA_MASTER_PORT", 0, 1, &port)) != STA_OK) return rc;
  } else {
    if (!mp) return sta_error(STA_ERR_ENV, "MASTER_PORT: not set, but MASTER_ADDR is");
    if ((rc = env_int("MASTER_PORT", 0, 1, &port)) != STA_OK) return rc;
    port++; /* MASTER_PORT itself is torchrun's (or torch.distributed's) store */
  }
  if (port > 65535)
    return sta_error(STA_ERR_ENV, "%s: port %d is outside 1..65535", sp ? "STA_MASTER_PORT"
                     : "MASTER_PORT", (int)port);
  if (strchr(addr, ':')) snprintf(at, cap, "tcp://[%s]:%d", addr, (int)port);
  else snprintf(at, cap, "tcp://%s:%d", addr, (int)port);
  return STA_OK;
}

sta_status sta_comm_from_env(sta_comm **out) {
  int32_t rank, size, local, family;
  char at[600];
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if ((rc = sta_comm_env(&rank, &size, &local, &family)) != STA_OK) return rc;
  const char *be = env_of("STA_DIST_BACKEND");
  if (be && strcmp(be, "nccl") != 0 && strcmp(be, "tcp") != 0 && strcmp(be, "loopback") != 0)
    return sta_error(STA_ERR_ENV, "STA_DIST_BACKEND: expected nccl, tcp or loopback, got \"%s\"",
                     be);
  if (be && strcmp(be, "loopback") == 0) {
    if (size != 1)
      return sta_error(STA_ERR_ENV,
                       "STA_DIST_BACKEND: loopback joins no other process (%s %d); use nccl",
                       families[family - 1].size, (int)size);
    return sta_comm_loopback(out, 1);
  }
  if ((rc = env_rendezvous(at, sizeof at, size, family)) != STA_OK) return rc;
  if (be && strcmp(be, "tcp") == 0) rc = sta_comm_tcp(out, rank, size, at);
  else {
    /* a launcher that shows each rank only its own GPU: local rank r -> device 0 */
    const sta_backend_ops *cuda = sta_backend_get(STA_CUDA);
    int32_t n = cuda ? cuda->device_count() : 0;
    if (n > 0) local %= n;
    rc = sta_comm_nccl(out, rank, size, at, local);
    if (rc == STA_ERR_BACKEND) { /* no GPU: say what works here */
      char msg[1024];
      snprintf(msg, sizeof msg, "%s; without GPUs set STA_DIST_BACKEND=tcp (scripts/sta-launch "
               "does when it finds no CUDA device)", sta_last_error());
      return sta_error(rc, "%s", msg);
    }
  }
  if (rc == STA_ERR_IO && family > 0) { /* say where the world came from */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s [rank %d of %d from %s: %s, %s]", sta_last_error(), (int)rank,
             (int)size, families[family - 1].who, families[family - 1].rank,
             families[family - 1].size);
    return sta_error(rc, "%s", msg);
  }
  return rc;
}
