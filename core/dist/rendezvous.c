/*
** rendezvous.c -- how the ranks of a process world meet, and the host star
** they keep.
**
** Rank 0 listens, every other rank connects and says who it is (rank and
** world size), rank 0 answers each with the bootstrap bytes (the NCCL
** unique id; nothing for TCP).  Where rank 0 listens comes from a file
** (scripts/sta-launch: rank 0 binds 127.0.0.1 on a free port and writes it
** there atomically; the others poll for the file) or from tcp://HOST:PORT
** (torchrun, srun, mpirun: MASTER_ADDR and MASTER_PORT).  The sockets stay
** open as the world's host star, which moves host memory (the SP
** descriptor check; all data of the TCP transport).  Every wait is bounded
** by $STA_DIST_TIMEOUT.
*/
#include <errno.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include "dist.h"

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

static sta_status star_init(star *s, int32_t rank, int32_t size) {
  s->rank = rank;
  s->size = size;
  s->fd = sta_malloc(sizeof(int) * (size_t)size);
  if (!s->fd) return sta_error(STA_ERR_NOMEM, "out of host memory (%d sockets)", (int)size);
  for (int32_t j = 0; j < size; j++) s->fd[j] = -1;
  return STA_OK;
}

void sta_star_close(star *s) {
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
  double limit = sta_dist_timeout();
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

sta_status sta_star_exchange(star *s, const void *send, void *recv, size_t in, size_t chunk,
                             int gather) {
  int32_t p = s->size;
  size_t outb = chunk * (size_t)p;
  double until = now_s() + sta_dist_timeout();
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

static int addr_is_loopback(const struct sockaddr *a) {
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
    if (!addr_is_loopback((struct sockaddr *)&a)) {
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
                       "(STA_DIST_TIMEOUT); is rank 0 running?", (int)rank, sta_dist_timeout(),
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
                     "%s:%u (%d of %d came; STA_DIST_TIMEOUT)", sta_dist_timeout(), w->host,
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
                     at.port, sta_dist_timeout(), strerror(err));
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

sta_status sta_rendezvous(star *s, int32_t rank, int32_t size, const char *at, void *boot,
                          size_t len) {
  where w;
  sta_status rc = star_init(s, rank, size);
  if (rc != STA_OK) return rc;
  if (size == 1) return STA_OK;
  if ((rc = where_parse(&w, at)) == STA_OK) {
    double until = now_s() + sta_dist_timeout();
    rc = rank == 0 ? rdv_serve(s, &w, boot, len, until) : rdv_join(s, &w, boot, len, until);
  }
  if (rc != STA_OK) sta_star_close(s);
  return rc;
}

sta_status sta_world_args(sta_comm **out, int32_t rank, int32_t size, int32_t max,
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

