/*
** error.c -- thread-local last error, status names, allocation hooks.
*/
#include <stdio.h>
#include <stdlib.h>

#include <cJSON.h>

#include "internal.h"

static _Thread_local char err_msg[1024];
static _Thread_local sta_status err_status = STA_OK;

sta_status sta_error(sta_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  err_status = status;
  return status;
}

const char *sta_last_error(void) { return err_msg; }

/* ---- cancel ------------------------------------------------------------- */

static int32_t cancel_flag = 0; /* __atomic builtins: lock-free, signal-safe */

void sta_cancel(void) { __atomic_store_n(&cancel_flag, 1, __ATOMIC_RELEASE); }
void sta_cancel_clear(void) { __atomic_store_n(&cancel_flag, 0, __ATOMIC_RELEASE); }
int32_t sta_cancel_requested(void) { return __atomic_load_n(&cancel_flag, __ATOMIC_ACQUIRE); }

sta_status sta_cancelled(const char *what) {
  return sta_error(STA_ERR_CANCELLED,
                   "%s: cancelled (sta_cancel) before it finished; no output was changed", what);
}

sta_status sta_cancel_point(const char *what) {
  return sta_cancel_requested() ? sta_cancelled(what) : STA_OK;
}
sta_status sta_last_status(void) { return err_status; }

void sta_clear_error(void) {
  err_msg[0] = '\0';
  err_status = STA_OK;
}

const char *sta_status_name(sta_status s) {
  switch (s) {
  case STA_OK: return "STA_OK";
  case STA_ERR_ARGUMENT: return "STA_ERR_ARGUMENT";
  case STA_ERR_SHAPE: return "STA_ERR_SHAPE";
  case STA_ERR_DTYPE: return "STA_ERR_DTYPE";
  case STA_ERR_WINDOW: return "STA_ERR_WINDOW";
  case STA_ERR_KEY: return "STA_ERR_KEY";
  case STA_ERR_STATE: return "STA_ERR_STATE";
  case STA_ERR_NO_BATCH: return "STA_ERR_NO_BATCH";
  case STA_ERR_NO_STRATEGY: return "STA_ERR_NO_STRATEGY";
  case STA_ERR_NO_STEP0: return "STA_ERR_NO_STEP0";
  case STA_ERR_STA_PARAM: return "STA_ERR_STA_PARAM";
  case STA_ERR_CANCELLED: return "STA_ERR_CANCELLED";
  case STA_ERR_UNSUPPORTED: return "STA_ERR_UNSUPPORTED";
  case STA_ERR_SEQ_LEN: return "STA_ERR_SEQ_LEN";
  case STA_ERR_BACKEND: return "STA_ERR_BACKEND";
  case STA_ERR_NOMEM: return "STA_ERR_NOMEM";
  case STA_ERR_DEVICE_NOMEM: return "STA_ERR_DEVICE_NOMEM";
  case STA_ERR_DEVICE: return "STA_ERR_DEVICE";
  case STA_ERR_IO: return "STA_ERR_IO";
  case STA_ERR_FORMAT: return "STA_ERR_FORMAT";
  case STA_ERR_ENV: return "STA_ERR_ENV";
  }
  return "STA_ERR_UNKNOWN";
}

int32_t sta_status_group(sta_status s) { return ((int32_t)s / 100) * 100; }

const char *sta_version(void) { return "0.1.0"; }

void sta_free(void *p) { free(p); }

/* ---- allocation, with fault injection --------------------------------- */

static _Atomic int64_t fault_at = 0; /* fail when the counter reaches it */
static _Atomic int64_t fault_counter = 0;

static _Thread_local int64_t alloc_failures = 0;

static void *json_malloc(size_t n) { return sta_malloc(n); }

void sta_fault_arm(int64_t n) {
  /* From the first arm on, cJSON allocates through the hooks too, so JSON
  ** parsing and printing fail under injection.  Only then: a host program's
  ** own cJSON hooks are left alone in normal use.  Both allocate with
  ** malloc and free with free, so objects made before the switch are fine. */
  static cJSON_Hooks hooks = {json_malloc, free};
  static _Atomic int installed = 0;
  if (!installed++) cJSON_InitHooks(&hooks);
  fault_counter = 0;
  fault_at = n;
}

int64_t sta_fault_count(void) { return fault_counter; }

int64_t sta_alloc_failures(void) { return alloc_failures; }

static int fault_now(void) {
  int64_t c = ++fault_counter;
  return fault_at > 0 && c == fault_at;
}

static void *counted(void *p) {
  if (!p) alloc_failures++;
  return p;
}

void *sta_malloc(size_t n) { return counted(fault_now() ? NULL : malloc(n ? n : 1)); }

void *sta_calloc(size_t count, size_t size) {
  return counted(fault_now() ? NULL : calloc(count ? count : 1, size ? size : 1));
}

void *sta_realloc(void *p, size_t n) {
  return counted(fault_now() ? NULL : realloc(p, n ? n : 1));
}

char *sta_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = sta_malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}
