/*
** handle.c -- the registry of live handles: every object the public API
** hands out is entered here when made and removed when freed, so a call
** given NULL, a released handle or a pointer sta never made refuses it with
** a message instead of touching freed memory.  An open-addressing table of
** (pointer, kind) under a read-write lock; lookups compare pointers only.
*/
#include <pthread.h>
#include <stdlib.h>

#include "internal.h"

typedef struct slot {
  const void *p;
  int32_t kind;
} slot;

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static slot *table = NULL;
static size_t cap = 0, used = 0; /* cap: 0 or a power of two */

static const char *const NOUN[] = {
  "", "a tensor", "a safetensors file", "a strategy", "a table", "a batch", "a context",
  "a layer", "a communicator", "an SP layer"};
static const char *const TYPE[] = {
  "", "sta_tensor", "sta_safetensors", "sta_strategy", "sta_metadata",
  "sta_forward_batch", "sta_context", "sta_layer", "sta_comm", "sta_sp_layer"};

static size_t hash(const void *p) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)x;
}

/* Index of p, or of the empty slot where it would go. */
static size_t find(const slot *t, size_t n, const void *p) {
  size_t i = hash(p) & (n - 1);
  while (t[i].p && t[i].p != p) i = (i + 1) & (n - 1);
  return i;
}

static int grow(void) {
  size_t ncap = cap ? cap * 2 : 256;
  slot *t = sta_calloc(ncap, sizeof *t);
  if (!t) return 0;
  for (size_t i = 0; i < cap; i++)
    if (table[i].p) t[find(t, ncap, table[i].p)] = table[i];
  free(table);
  table = t;
  cap = ncap;
  return 1;
}

sta_status sta_handle_add(const void *p, sta_kind kind) {
  pthread_rwlock_wrlock(&lock);
  int ok = (used + 1) * 2 <= cap || grow();
  if (ok) {
    size_t i = find(table, cap, p);
    if (!table[i].p) used++;
    table[i].p = p;
    table[i].kind = (int32_t)kind;
  }
  pthread_rwlock_unlock(&lock);
  if (!ok) return sta_error(STA_ERR_NOMEM, "out of host memory (handle table)");
  return STA_OK;
}

void sta_handle_remove(const void *p) {
  if (!p) return;
  pthread_rwlock_wrlock(&lock);
  size_t i = cap ? find(table, cap, p) : 0;
  if (cap && table[i].p) {
    /* backward-shift deletion keeps every probe sequence unbroken */
    table[i].p = NULL;
    used--;
    for (size_t j = (i + 1) & (cap - 1); table[j].p; j = (j + 1) & (cap - 1)) {
      slot s = table[j];
      table[j].p = NULL;
      table[find(table, cap, s.p)] = s;
    }
    if (used == 0) { /* nothing left behind at exit */
      free(table);
      table = NULL;
      cap = 0;
    }
  }
  pthread_rwlock_unlock(&lock);
}

int sta_handle_live(const void *p, sta_kind kind) {
  if (!p) return 0;
  pthread_rwlock_rdlock(&lock);
  int live = 0;
  if (cap) {
    size_t i = find(table, cap, p);
    live = table[i].p == p && table[i].kind == (int32_t)kind;
  }
  pthread_rwlock_unlock(&lock);
  return live;
}

sta_status sta_handle_check(const void *p, sta_kind kind, const char *arg) {
  if (!p) return sta_error(STA_ERR_ARGUMENT, "%s: expected %s, got NULL", arg, NOUN[kind]);
  if (sta_handle_live(p, kind)) return STA_OK;
  return sta_error(STA_ERR_ARGUMENT,
                   "%s: not a live %s (released already, or not made by sta)", arg,
                   TYPE[kind]);
}

int64_t sta_handle_count(void) {
  pthread_rwlock_rdlock(&lock);
  int64_t n = (int64_t)used;
  pthread_rwlock_unlock(&lock);
  return n;
}
