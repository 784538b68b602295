/*
** fileio.c -- every file sta writes goes through here: a temporary file in
** the target's directory (created with O_EXCL, so it is ours), written,
** fsync'd and renamed over the target.  A failure removes the temporary
** file and nothing else: the target keeps its old contents.  A target that
** exists and is not a regular file (/dev/null, /dev/full, a FIFO) is
** written in place and never removed or renamed; a directory is refused.
** Also the whole-file text reader.
*/
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* dirname of path into a new string ("." when it has no '/'). */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return sta_strdup(".");
  size_t n = slash == path ? 1 : (size_t)(slash - path);
  char *d = sta_malloc(n + 1);
  if (d) {
    memcpy(d, path, n);
    d[n] = '\0';
  }
  return d;
}

/* ---- temporary files a signal must not leave behind ------------------------ */

/* The temporary files being written now (sta_out_remove_pending removes
** them from a signal handler): slots set with the file's name once it
** exists and cleared before the name is freed; a 65th concurrent file is
** not listed. */
#define PENDING_MAX 64
static char *pending[PENDING_MAX];

static void pending_add(char *tmp) {
  for (int i = 0; i < PENDING_MAX; i++) {
    char *none = NULL;
    if (__atomic_compare_exchange_n(&pending[i], &none, tmp, 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE))
      return;
  }
}

static void pending_remove(const char *tmp) {
  for (int i = 0; i < PENDING_MAX && tmp; i++) {
    char *p = (char *)tmp;
    __atomic_compare_exchange_n(&pending[i], &p, NULL, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
  }
}

void sta_out_remove_pending(void) {
  for (int i = 0; i < PENDING_MAX; i++) {
    char *p = __atomic_load_n(&pending[i], __ATOMIC_ACQUIRE);
    if (p) unlink(p); /* async-signal-safe; ours: made with O_EXCL */
  }
}

/* ---- the atomic writer ----------------------------------------------------- */

static void out_reset(sta_outfile *f) {
  if (f->dirfd >= 0) close(f->dirfd);
  f->dirfd = -1;
  pending_remove(f->tmp);
  free(f->target);
  free(f->tmp);
  f->target = f->tmp = NULL;
  f->fd = -1;
}

/* The file that writing path replaces: path itself, or the end of its
** chain of symbolic links (relative ones against their link's folder),
** whether or not that file exists yet: the links stay links.  NULL and
** errno ELOOP past 40 links, ENOMEM. */
static char *link_target(const char *path) {
  char *cur = sta_strdup(path);
  for (int hops = 0; cur && hops <= 40; hops++) {
    struct stat st;
    char buf[PATH_MAX];
    if (lstat(cur, &st) != 0 || !S_ISLNK(st.st_mode)) return cur;
    ssize_t n = readlink(cur, buf, sizeof buf - 1);
    if (n <= 0) return cur;
    buf[n] = '\0';
    char *next;
    if (buf[0] == '/' || !strchr(cur, '/')) next = sta_strdup(buf);
    else {
      size_t dl = (size_t)(strrchr(cur, '/') - cur) + 1, bl = (size_t)n + 1;
      next = sta_malloc(dl + bl);
      if (next) {
        memcpy(next, cur, dl);
        memcpy(next + dl, buf, bl);
      }
    }
    free(cur);
    cur = next;
  }
  if (!cur) errno = ENOMEM;
  else {
    free(cur);
    errno = ELOOP;
  }
  return NULL;
}

sta_status sta_out_open(sta_outfile *f, const char *path, const char *label) {
  struct stat st;
  memset(f, 0, sizeof *f);
  f->fd = f->dirfd = -1;
  f->label = label;
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  if (!*path) return sta_error(STA_ERR_IO, "%s: cannot open for writing: empty file name", label);
  /* a symbolic link is followed, dangling or not: the file it names is
  ** written, the link stays */
  char *target = link_target(path);
  if (!target && errno == ENOMEM) return sta_error(STA_ERR_NOMEM, "out of host memory (file name)");
  if (!target)
    return sta_error(STA_ERR_IO, "%s: cannot open for writing: %s", label, strerror(errno));
  f->target = target;
  if (stat(target, &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) {
      out_reset(f);
      return sta_error(STA_ERR_IO, "%s: cannot open for writing: Is a directory", label);
    }
    f->fd = open(target, O_WRONLY | O_CLOEXEC);
    if (f->fd < 0) {
      int e = errno;
      out_reset(f);
      return sta_error(STA_ERR_IO, "%s: cannot open for writing: %s", label, strerror(e));
    }
    f->direct = 1;
    return STA_OK;
  }
  char *dir = dir_of(target);
  const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
  size_t cap = (dir ? strlen(dir) : 0) + 256;
  f->tmp = dir ? sta_malloc(cap) : NULL;
  if (!f->tmp) {
    free(dir);
    out_reset(f);
    return sta_error(STA_ERR_NOMEM, "out of host memory (file name)");
  }
  static unsigned counter; /* names only need to differ; O_EXCL decides */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  unsigned seed = (unsigned)ts.tv_nsec ^ ((unsigned)getpid() << 16);
  int e = 0;
  for (int tries = 0; tries < 100; tries++) {
    unsigned n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 2654435761u ^ seed;
    snprintf(f->tmp, cap, "%s/.%.180s.%ld.%08x.tmp", dir, base, (long)getpid(), n);
    f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (f->fd >= 0 || (e = errno) != EEXIST) break;
  }
  if (f->fd >= 0) { /* to fsync the rename */
    pending_add(f->tmp);
    f->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  free(dir);
  if (f->fd < 0) {
    out_reset(f);
    return sta_error(STA_ERR_IO, "%s: cannot open for writing: %s", label, strerror(e));
  }
  /* keep an existing target's permissions */
  if (stat(target, &st) == 0) (void)fchmod(f->fd, st.st_mode & 07777);
  return STA_OK;
}

void sta_out_write(sta_outfile *f, const void *data, size_t n) {
  const char *p = data;
  while (n > 0 && !f->err) {
    ssize_t w = write(f->fd, p, n > ((size_t)1 << 30) ? (size_t)1 << 30 : n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      f->err = w < 0 ? errno : ENOSPC;
      break;
    }
    p += w;
    n -= (size_t)w;
  }
}

void sta_out_abort(sta_outfile *f) {
  if (f->fd >= 0) close(f->fd);
  if (f->tmp) unlink(f->tmp); /* ours: created with O_EXCL */
  out_reset(f);
}

sta_status sta_out_commit(sta_outfile *f) {
  int e = f->err;
  if (!e && !f->direct && fsync(f->fd) != 0) e = errno;
  if (close(f->fd) != 0 && !e) e = errno;
  f->fd = -1;
  if (!e && f->tmp && rename(f->tmp, f->target) != 0) e = errno;
  if (e) {
    sta_out_abort(f);
    return sta_error(STA_ERR_IO, "%s: write failed: %s", f->label, strerror(e));
  }
  if (f->dirfd >= 0) (void)fsync(f->dirfd); /* the rename reaches the disk */
  out_reset(f);
  return STA_OK;
}

sta_status sta_write_text_file(const char *path, const char *label, const void *data,
                               size_t len) {
  sta_outfile f;
  sta_status rc = sta_out_open(&f, path, label);
  if (rc != STA_OK) return rc;
  sta_out_write(&f, data, len);
  return sta_out_commit(&f);
}

sta_status sta_file_write(const char *path, const void *data, size_t len) {
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  if (!data && len > 0) return sta_error(STA_ERR_ARGUMENT, "data: expected %zu bytes, got NULL", len);
  return sta_write_text_file(path, path, data ? data : "", len);
}

sta_status sta_read_text_file(const char *path, const char *what, char **data,
                              size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return sta_error(STA_ERR_IO, "%s: cannot open \"%s\": %s", what, path, strerror(errno));
  size_t cap = 4096, n = 0;
  char *buf = sta_malloc(cap);
  if (!buf) { fclose(f); return sta_error(STA_ERR_NOMEM, "out of host memory (reading \"%s\")", path); }
  for (;;) {
    if (n + 1 >= cap) {
      char *b = cap > SIZE_MAX / 2 ? NULL : sta_realloc(buf, cap * 2);
      if (!b) {
        free(buf);
        fclose(f);
        return sta_error(STA_ERR_NOMEM, "out of host memory (reading \"%s\")", path);
      }
      buf = b;
      cap *= 2;
    }
    size_t got = fread(buf + n, 1, cap - 1 - n, f);
    n += got;
    if (got == 0) break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad) {
    free(buf);
    return sta_error(STA_ERR_IO, "%s: cannot read \"%s\"", what, path);
  }
  buf[n] = '\0';
  *data = buf;
  *len = n;
  return STA_OK;
}
