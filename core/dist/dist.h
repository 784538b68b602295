/*
** dist.h -- what the files of the distribution layer share; not installed.
** Sequence parallelism (sta.h, "Sequence parallelism"; STA.md section 5):
**
**   comm.c          communicators over a transport table, tensor collectives
**   span.c          strided blocks of bytes per rank, and their copies
**   loopback.c      the in-process transport (P ranks as threads)
**   rendezvous.c    how process ranks meet; the host star of sockets
**   nccl.c, tcp.c   the process transports over it
**   launch.c        the world of a launcher's environment
**   shard.c         the token split of one problem over P ranks
**   ulysses.c       SP over any communicator: agreement, the chunk pipeline
**   sp_attention.c  its jobs: SP attention, SP layers
*/
#ifndef STA_DIST_H
#define STA_DIST_H

#include <pthread.h>

#include "internal.h"

/* ---- communicators (comm.c) --------------------------------------------- */

#define MAX_CHUNKS 64

/* The pipeline's second stream's events: in[c], comp[c], out[c], then
** start and end (ulysses.c, pipeline). */
enum { EV_IN = 0, EV_COMP = MAX_CHUNKS, EV_OUT = 2 * MAX_CHUNKS, EV_START = 3 * MAX_CHUNKS,
       EV_END, N_EVENTS };

struct sta_comm {
  int32_t refs; /* the creator's and every SP layer's that holds it */
  sta_transport t;
  int32_t chunks; /* sta_comm_set_chunks; 0: choose */
  sta_tensor *ws; /* SP workspace, kept between forwards (grown, never shrunk) */
  sta_tensor *dbuf; /* the descriptor's device bytes (a transport of CUDA memory only) */
  const sta_backend_ops *lanes; /* the backend of side and ev (CUDA's), once made */
  void *side;       /* the second stream, made on first use */
  void *ev[N_EVENTS];
};

/* STA_ERR_ARGUMENT "<name>: on <device>, but the <transport> communicator
** does not move <device> memory" unless c moves t's memory. */
sta_status sta_comm_check_moves(const sta_comm *c, const sta_tensor *t, const char *name);
/* Seconds any wait may take: $STA_DIST_TIMEOUT, else (or when not > 0) 300. */
double sta_dist_timeout(void);

/* ---- strided blocks (span.c) -------------------------------------------- */

int64_t sta_span_bytes(const sta_span *s);
/* Block 0 of s when its runs lie back to back and so do the size blocks
** (one buffer of size chunks, as all_to_all takes), else NULL. */
void *sta_span_dense(const sta_span *s, int32_t size);
/* s's shape with dense blocks at base. */
sta_span sta_span_packed(const sta_span *s, void *base);
/* Block dj of dst <- block sj of src, on dev: a device's copies are
** queued on this thread's stream. */
sta_status sta_span_copy(const sta_span *dst, int64_t dj, const sta_span *src, int64_t sj,
                         sta_device dev);

/* ---- the loopback transport (loopback.c) --------------------------------- */

/* 1 when c is a rank of a loopback world.  Its failure aborts the world
** (sta_comm_loopback_run), so the others need not learn of it by a
** collective. */
int sta_loopback_is(const sta_comm *c);
/* Loopback ranks share this machine's cores and the BLAS library's global
** settings: they compute one at a time.  enter 1 waits for the world's
** turn, 0 gives it back; nothing for other transports. */
void sta_loopback_turn(const sta_comm *c, int enter);

/* ---- the host star and the rendezvous (rendezvous.c) --------------------- */

typedef struct star {
  int32_t rank, size;
  int *fd; /* rank 0: fd[j] to rank j (j >= 1); others: fd[0] to rank 0; -1: none */
} star;

/* The star of rank of size through at (a file path or tcp://HOST:PORT),
** rank 0's len boot bytes going to every rank.  On error s holds no socket. */
sta_status sta_rendezvous(star *s, int32_t rank, int32_t size, const char *at, void *boot,
                          size_t len);
void sta_star_close(star *s);
/* A collective through rank 0.  in: bytes each rank contributes; chunk:
** bytes rank j gets from rank i (at offset j*chunk of i's contribution for
** all-to-all, 0 for gather).  One deadline for the whole collective. */
sta_status sta_star_exchange(star *s, const void *send, void *recv, size_t in, size_t chunk,
                             int gather);
/* The checks sta_comm_nccl and sta_comm_tcp share (max: most ranks; what:
** what the ranks share at the rendezvous, for messages). */
sta_status sta_world_args(sta_comm **out, int32_t rank, int32_t size, int32_t max,
                          const char *at, const char *what);

/* ---- the split of one problem (shard.c) ---------------------------------- */

/* P ranks, rank r; per rank: batch, heads, head dim, heads per rank, video
** tokens, video rows per rank, local rows, global rows, text rows. */
typedef struct split {
  int32_t p, r;
  int64_t b, h, d, hl, v, vr, sl, s, text;
} split;

/* STA_ERR_UNSUPPORTED unless g is in the untiled order (shards are ranges
** of untiled tokens). */
sta_status sta_split_untiled(const sta_geometry *g);
/* The checks of rank of size and the global geometry g, and the operands
** t (NULL: left out) in layout, named names; fills sp's p, r, v, vr. */
sta_status sta_split_check(split *sp, const sta_geometry *g, sta_layout layout,
                           const sta_tensor *const t[4], const char *const names[4],
                           int32_t rank, int32_t size);
/* The rest of sp from a local [B, V/P + text, H, D] operand x (named name),
** checked against the global geometry. */
sta_status sta_split_local(split *sp, const sta_geometry *g, const sta_bshd *x,
                           const char *name);

/* ---- the Ulysses pipeline (ulysses.c) and its jobs (sp_attention.c) ------ */

/* What runs on the gathered [B, V + text, heads of a chunk, D] problem. */
typedef struct sp_job {
  /* checks that need the split (may be NULL), before any data moves */
  sta_status (*prepare)(struct sp_job *j, const split *sp);
  /* check the gathered operands of chunk 0 (may be NULL) */
  sta_status (*check)(struct sp_job *j, const sta_tensor *q, const sta_tensor *k,
                      const sta_tensor *v, const sta_tensor *out);
  /* the chunk whose first local head is h0 */
  sta_status (*compute)(struct sp_job *j, int64_t h0, const sta_tensor *q, const sta_tensor *k,
                        const sta_tensor *v, sta_tensor *out);
  const sta_attention_desc *desc; /* sp_attention: the global desc */
  int32_t *windows;               /* sp_attention, per-head windows: this rank's */
  uint64_t hash;                  /* sp_attention: of the global windows */
  sta_layer *layer;               /* SP layer */
  const char *what;               /* the call, for messages: "sp attention" */
} sp_job;

/* job on this rank's shards q, k, v, out (layout, the global geometry g)
** over c: this rank's checks (pre: the caller's own status; a raised
** cancel flag), every rank's agreement, then the pipeline, whose ranks
** agree after each chunk's compute whether all go on. */
sta_status sta_sp_run(sta_comm *c, const sta_geometry *g, sta_layout layout,
                      const sta_tensor *q, const sta_tensor *k, const sta_tensor *v,
                      sta_tensor *out, sp_job *job, sta_status pre);

#endif
