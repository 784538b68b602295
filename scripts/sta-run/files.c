/*
** files.c -- sta-run's files: the tensor inputs (.npy, F.safetensors:NAME)
** and the outputs, every one opened before anything is read or computed
** (the core's atomic files, core/internal.h) and committed only when all
** are written; SIGINT, SIGTERM and SIGHUP remove the temporary files.
*/
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sta-run.h"

/* ---- inputs ------------------------------------------------------------ */

int ends_with(const char *s, size_t len, const char *suffix) {
  size_t n = strlen(suffix);
  return len >= n && strncmp(s + len - n, suffix, n) == 0;
}

/* Split "F.safetensors[:NAME]": 1 and file/name (malloc'd file) when it
** names a safetensors file, else 0. */
static int split_st(const char *spec, const char *dflt, char **file, const char **name) {
  const char *c = strrchr(spec, ':');
  if (c && ends_with(spec, (size_t)(c - spec), ".safetensors")) {
    *file = strndup(spec, (size_t)(c - spec));
    *name = c + 1;
    return 1;
  }
  if (ends_with(spec, strlen(spec), ".safetensors")) {
    *file = strdup(spec);
    *name = dflt;
    return 1;
  }
  return 0;
}

sta_status load(const char *spec, const char *dflt_name, sta_tensor **t) {
  char *file = NULL;
  const char *name;
  if (!split_st(spec, dflt_name, &file, &name)) return sta_npy_load(t, spec, 1);
  sta_safetensors *f = NULL;
  sta_status rc = file ? sta_safetensors_open(&f, file) : STA_ERR_NOMEM;
  if (rc == STA_OK) rc = sta_safetensors_read(f, name, t);
  sta_safetensors_close(f);
  free(file);
  return rc;
}

/* ---- outputs ------------------------------------------------------------ */

void output_init(output *out, const char *opt, const char *spec, const char *dflt) {
  memset(out, 0, sizeof *out);
  const char *name = NULL;
  out->st = split_st(spec, dflt, &out->file, &name);
  if (!out->st) out->file = strdup(spec);
  out->names[0] = name;
  out->n = 1;
  snprintf(out->label, sizeof out->label, "%s %s", opt, out->file ? out->file : spec);
}

void output_free(output *out) {
  if (out->open) sta_out_abort(&out->f); /* the temporary file goes */
  sta_safetensors_close(out->keep);
  free(out->file);
  memset(out, 0, sizeof *out);
}

/* 1 when paths a and b are one existing file. */
static int same_file(const char *a, const char *b) {
  struct stat x, y;
  return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

int output_inputs(output *out, const char *const spec[3], const char *const names[3]) {
  static const char *const OPT[3] = {"--q", "--k", "--v"};
  for (int i = 0; i < 3 && out->st && out->file; i++) {
    char *in = NULL;
    const char *in_name = NULL;
    if (!split_st(spec[i], names[i], &in, &in_name)) continue;
    int same = in && same_file(in, out->file);
    for (int32_t j = 0; same && j < out->n; j++)
      if (strcmp(out->names[j], in_name) == 0) {
        int rc = bad(out->label, NULL, "'%s' is %s's tensor in that file: writing it would "
                     "replace an input of this run (choose another name)", in_name, OPT[i]);
        free(in);
        return rc;
      }
    if (same) out->keep_path = spec[i]; /* FILE.safetensors[:NAME]: the file part below */
    free(in);
  }
  return 0;
}

int output_open(output *out) {
  if (!out->file) return fprintf(stderr, "sta-run: out of memory\n"), 0;
  if (sta_out_open(&out->f, out->file, out->label) != STA_OK) {
    fprintf(stderr, "sta-run: %s (checked before computing)\n", sta_last_error());
    return 0;
  }
  out->open = 1;
  return 1;
}

sta_status output_keep(output *out) {
  char *file = NULL;
  const char *name;
  if (!out->keep_path) return STA_OK;
  if (!split_st(out->keep_path, "", &file, &name) || !file) return STA_ERR_NOMEM;
  sta_status rc = sta_safetensors_open(&out->keep, file);
  free(file);
  return rc;
}

sta_status output_write(output *out) {
  if (out->st) return sta_safetensors_write(&out->f, out->n, out->names, out->ts, out->keep);
  return sta_npy_write(&out->f, out->ts[0]);
}

sta_status output_commit(output *out) {
  if (!out->open) return STA_OK;
  out->open = 0;
  return sta_out_commit(&out->f);
}

/* SIGINT, SIGTERM, SIGHUP: no temporary file survives; exit 128 + signal. */
static void on_signal(int sig) {
  sta_out_remove_pending();
  _exit(128 + sig);
}

void catch_signals(void) {
  static const int SIGS[3] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; i++) sigaction(SIGS[i], &sa, NULL);
}
