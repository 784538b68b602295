/*
** fuzz.h -- shared by the libFuzzer targets spec/fuzz/fuzz_*.c (built by
** scripts/test/fuzz) and by spec/test_fuzz_replay.c, which includes every target
** and replays the committed corpora through it in make test / make sanitize.
** A broken invariant calls FUZZ_CHECK, which traps: libFuzzer saves the
** input as a crash, the replay test dies.
*/
#ifndef STA_FUZZ_H
#define STA_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

#define FUZZ_CHECK(cond)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: fuzz invariant failed: %s (last error: %s)\n",   \
              __FILE__, __LINE__, #cond, sta_last_error());                    \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

/* A failed call must leave its status and a non-empty message. */
static inline sta_status fuzz_status(sta_status rc) {
  if (rc != STA_OK) {
    FUZZ_CHECK(sta_last_status() == rc);
    FUZZ_CHECK(sta_last_error()[0] != '\0');
  }
  return rc;
}

/* The input read a byte at a time; 0 once it runs out. */
typedef struct fuzz_bytes {
  const uint8_t *p;
  size_t n;
} fuzz_bytes;

static inline unsigned fuzz_take(fuzz_bytes *b) {
  if (!b->n) return 0;
  b->n--;
  return *b->p++;
}

/* The input as a file (readers take paths): /dev/shm when there is one. */
static inline const char *fuzz_file(const char *tag, const uint8_t *data, size_t size) {
  static char path[8][128];
  static int k;
  char *p = path[k++ % 8];
  const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  snprintf(p, 128, "%s/sta-fuzz-%d-%s", dir, (int)getpid(), tag);
  FILE *f = fopen(p, "wb");
  FUZZ_CHECK(f != NULL);
  FUZZ_CHECK(size == 0 || fwrite(data, 1, size, f) == size);
  FUZZ_CHECK(fclose(f) == 0);
  return p;
}

#endif
