/*
** launch.c -- the world a launcher's environment describes (sta_comm_env)
** and a communicator for it (sta_comm_from_env): scripts/sta-launch,
** torchrun, mpirun and srun, the rendezvous address, the transport.
*/
#include <errno.h>
#include <stdlib.h>

#include "dist.h"

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

