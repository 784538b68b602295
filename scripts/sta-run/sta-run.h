/*
** sta-run.h -- what sta-run's files share: the options (sta-run.c parses
** them and runs STA), the tensor files and the atomic outputs (files.c),
** the VSA mode (vsa.c).
*/
#ifndef STA_RUN_H
#define STA_RUN_H

#include "internal.h"

/* The options, as parse_args (sta-run.c) reads them. */
typedef struct options {
  const char *q, *k, *v, *out, *lse, *st;
  const char *q_name, *k_name, *v_name, *out_name, *lse_name;
  int have_canvas, have_tile, have_dtype;
  int32_t canvas[3], tile[3];
  int32_t n_windows, *windows;
  int64_t text_len;
  double scale;
  sta_softmax softmax;
  sta_precision precision;
  sta_layout layout;
  sta_order order;
  int32_t threads;
  sta_device device;
  sta_dtype dtype;
  int reference, quiet;
  /* --mode vsa (vsa.c) */
  int mode, cube_order, have_cube, have_sparsity;
  double sparsity;
  int32_t topk, cube[3];
  const char *gate, *gate_name;
} options;

enum { MODE_STA, MODE_VSA };

/* ---- sta-run.c ---------------------------------------------------------- */

/* A bad option: "sta-run: OPT 'VAL': message (see sta-run --help)" on
** stderr (val may be NULL); returns 2, the exit status. */
int bad(const char *opt, const char *val, const char *fmt, ...);
/* Seconds on the monotonic clock. */
double now_s(void);
/* t's shape as "2x3x4". */
void shape_str(const sta_tensor *t, char *buf, size_t cap);

/* ---- files.c: inputs, outputs, signals ---------------------------------- */

/* 1 when the len first characters of s end with suffix. */
int ends_with(const char *s, size_t len, const char *suffix);
/* The tensor of a file spec: an .npy path, or F.safetensors[:NAME] (NAME
** default dflt_name). */
sta_status load(const char *spec, const char *dflt_name, sta_tensor **t);

/* Every output is opened before anything is read or computed (the core's
** atomic file: a temporary file next to the target, renamed over it when
** committed), written after the run and committed only when all are
** written: a failed run leaves no output behind and the targets' old
** contents in place; SIGINT and SIGTERM remove the temporary files. */
typedef struct output {
  char label[600];           /* "--out FILE": what messages name */
  char *file;                /* the file part of the spec */
  int st;                    /* .safetensors */
  int32_t n;                 /* tensors in it: out, lse, or both */
  const char *names[2];
  const sta_tensor *ts[2];
  sta_outfile f;
  int open;
  const char *keep_path;     /* an input file it rewrites: its tensors kept */
  sta_safetensors *keep;
} output;
/* out for option opt ("--out") naming spec (default tensor name dflt). */
void output_init(output *out, const char *opt, const char *spec, const char *dflt);
/* Closes out (an open file not committed: its temporary file removed). */
void output_free(output *out);
/* An output .safetensors that is also an input file keeps that file's
** tensors; writing over one of this run's inputs there is refused (2). */
int output_inputs(output *out, const char *const spec[3], const char *const names[3]);
/* Open out's atomic file: 0 and a message when it cannot be written. */
int output_open(output *out);
/* Open the input file out keeps (after the inputs are read). */
sta_status output_keep(output *out);
/* Write out's tensors into its file (not yet committed). */
sta_status output_write(output *out);
/* Move out's written file over its target. */
sta_status output_commit(output *out);
/* SIGINT, SIGTERM, SIGHUP: no temporary file survives; exit 128 + signal. */
void catch_signals(void);

/* ---- vsa.c: --mode vsa -------------------------------------------------- */

/* out (and lse) = VSA(q, k, v) of the options: the cube sizes of --canvas
** and --cube, topk from --sparsity or --topk, the gate file; rows converted
** to the cube order and back unless --order cubes. */
sta_status vsa_forward(const options *o, sta_tensor *const dev[3], sta_tensor *out,
                       sta_tensor *lse);
/* The line of a VSA run (what vsa_forward ran). */
void vsa_print(const options *o, const sta_tensor *q, sta_dtype file_dt, sta_dtype dt);

#endif
