/*
** sta-run -- run Sliding Tile Attention on Q/K/V files.  See USAGE below
** (sta-run --help).  Exit status: 0 done, 1 the run failed (the library's
** message on stderr), 2 bad options (a message naming the option), 130 /
** 143 interrupted by SIGINT / SIGTERM (no temporary file left).  This
** file: the options (the core's parser, core/internal.h, reads triples and
** window lists) and the STA run; files.c the inputs and the atomic outputs,
** vsa.c --mode vsa (sta-run.h).
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sta-run.h"

#define MAX_HEADS 4096

static const char *USAGE =
"usage: sta-run --q Q --k K --v V --out OUT [options]\n"
"       sta-run --help | -h | --version\n"
"\n"
"Runs Sliding Tile Attention out = STA(q, k, v) on the CPU or a CUDA device\n"
"and writes the output (and optionally the log-sum-exp) to files.\n"
"\n"
"Files.  A tensor file is either an .npy file or NAME inside a .safetensors\n"
"file, written FILE.safetensors:NAME (':NAME' may be left out: the name is\n"
"then given by --q-name/--k-name/--v-name/--out-name/--lse-name, default\n"
"q, k, v, out, lse).  .npy: '<f4', '<f2', and '<u2' read as raw bf16 bits.\n"
"  --q PATH          queries, 4-D [B, S, heads, D] (or [B, heads, S, D])\n"
"  --k PATH          keys, same shape\n"
"  --v PATH          values, same shape\n"
"  --safetensors F   read q, k and v from F (the default for --q/--k/--v)\n"
"  --q-name N, --k-name N, --v-name N   tensor names in safetensors files\n"
"  --out PATH        output, same shape, written in q's file dtype\n"
"                    (.npy writes bf16 as '<u2' raw bits)\n"
"  --out-name N      output name in a .safetensors --out (default out)\n"
"  --lse PATH        also write the log-sum-exp, f32 [B, heads, S]; when it\n"
"                    names the same .safetensors file as --out, both go in it\n"
"  --lse-name N      its name in a .safetensors file (default lse)\n"
"  Every output is checked before the inputs are read; outputs are written\n"
"  next to their targets and moved over them only when the whole run\n"
"  succeeded (a failed or interrupted run leaves the old files, and no\n"
"  temporary file).  A symbolic link as output: the file it names is\n"
"  written.  An output .safetensors that is also an input file keeps its\n"
"  other tensors (read before anything is replaced); an output name that\n"
"  is one of this run's inputs in that file is refused.\n"
"\n"
"Geometry.\n"
"  Triples may be written T,H,W or TxHxW.\n"
"  --canvas T,H,W    video canvas in tokens (T*H*W <= S); without it the\n"
"                    canvas is inferred from S for FastVideo's known shapes\n"
"                    (115456 or 115200: 30,48,80; 82944: 36,48,48;\n"
"                    69120: 18,48,80)\n"
"  --tile TT,TH,TW   tile in tokens (default 6,8,8)\n"
"  --window KT,KH,KW window in tiles, odd or >= the tiles on that axis;\n"
"                    one per head: --window 3,3,3:1,5,7:... or\n"
"                    3x3x3,1x5x7,... (required)\n"
"  --text-len N      valid text tokens after the video (default S - the\n"
"                    video rows)\n"
"  --layout L        bshd (default) or bhsd\n"
"  --order O         the rows' token order: untiled (default; t slowest, w\n"
"                    fastest) or tiled (FastVideo's: tile after tile, each\n"
"                    padded to the tile volume; read in place, and the\n"
"                    output comes out in it)\n"
"\n"
"Compute.\n"
"  --scale S         softmax scale (default 1/sqrt(D))\n"
"  --softmax M       exact (default) or fast: the GPU's opt-in online softmax\n"
"                    that rescales less (1-3 % faster, up to twice the max\n"
"                    error on peaked rows; the CPU computes exact for both)\n"
"  --precision P     native (default: the compute dtype, float32 sums) or fp8:\n"
"                    Q, K, V quantized to 8 bits (sta.h's scheme, relative\n"
"                    error about 3e-2; on the cpu an emulation for tests)\n"
"  --device D        cpu (default) or cuda\n"
"  --dtype T         compute dtype f32, f16 or bf16 (default: q's dtype)\n"
"  --threads N       CPU threads (default: OpenMP's)\n"
"  --mode M          sta (default) or vsa: Video Sparse Attention (STA.md\n"
"                    section 12) on the video rows (no text rows; --canvas\n"
"                    required, no --window): the rows go to the cube order\n"
"                    and back (--order cubes: q, k, v, out and lse are in it)\n"
"  --sparsity S      vsa: the fraction of key cubes left out, in [0, 1):\n"
"                    topk = ceil((1 - S) * cubes)\n"
"  --topk N          vsa: key cubes per query cube (instead of --sparsity)\n"
"  --cube C          vsa: tokens a cube, 4,4,4 (default; 64 rows) or 4,8,8\n"
"  --gate PATH       vsa: the coarse branch's gate (FastVideo's\n"
"                    compress_attn_weight), q's shape (default 1)\n"
"  --gate-name N     its name in a safetensors file (default gate)\n"
"  --reference       use the brute-force reference (cpu only; slow)\n"
"  --quiet           print nothing on success\n"
"  --help, -h        this text\n"
"  --version         sta-run's and the library's version\n"
"\n"
"Prints one line: shapes, window(s), time and GFLOP/s.\n"
"\n"
"Examples:\n"
"  sta-run --q q.npy --k k.npy --v v.npy --out o.npy --canvas 12,16,16 \\\n"
"          --window 3,3,3 --text-len 0\n"
"  sta-run --safetensors qkv.safetensors --q-name q --k-name k --v-name v \\\n"
"          --out o.safetensors --lse o.safetensors --window 3x3x3,1x5x7\n"
"  sta-run --q a.safetensors:query --k k.npy --v v.npy --out o.npy \\\n"
"          --canvas 30,48,80 --window 3,3,3 --device cuda --dtype bf16\n"
"\n"
"Exit status: 0 done, 1 the run failed, 2 bad options, 130/143 interrupted\n"
"(SIGINT/SIGTERM).\n";

/* ---- option parsing ----------------------------------------------------- */

int bad(const char *opt, const char *val, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "sta-run: %s", opt);
  if (val) fprintf(stderr, " '%s'", val);
  fprintf(stderr, ": ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see sta-run --help)\n");
  return 2;
}

/* A full integer in [lo, hi]. */
static int parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
  char *end;
  errno = 0;
  if (!*s || ((*s < '0' || *s > '9') && *s != '-' && *s != '+')) return 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return 0;
  *out = v;
  return 1;
}

static int parse_args(int argc, char **argv, options *o) {
  memset(o, 0, sizeof *o);
  o->q_name = "q"; o->k_name = "k"; o->v_name = "v";
  o->out_name = "out"; o->lse_name = "lse";
  o->text_len = -1;
  o->layout = STA_BSHD;
  o->device = STA_CPU;
  for (int i = 1; i < argc; i++) {
    char optbuf[64];
    const char *a = argv[i], *val = NULL;
    if (!strcmp(a, "-h")) a = "--help";
    if (strncmp(a, "--", 2) != 0)
      return bad(a, NULL, "unexpected argument, options start with --");
    const char *eq = strchr(a, '=');
    if (eq) {
      snprintf(optbuf, sizeof optbuf, "%.*s", (int)(eq - a), a);
      a = optbuf;
      val = eq + 1;
    }
    if (!strcmp(a, "--help")) { fputs(USAGE, stdout); return -1; }
    if (!strcmp(a, "--version")) {
      if (val) return bad(a, val, "takes no value");
      printf("sta-run %s (libsta %s)\n", sta_version(), sta_version());
      return -1;
    }
    if (!strcmp(a, "--reference") || !strcmp(a, "--quiet")) {
      if (val) return bad(a, val, "takes no value");
      if (!strcmp(a, "--reference")) o->reference = 1; else o->quiet = 1;
      continue;
    }
    static const char *const WITH_VALUE[] = {
      "--q", "--k", "--v", "--out", "--lse", "--safetensors", "--q-name", "--k-name",
      "--v-name", "--out-name", "--lse-name", "--canvas", "--tile", "--window",
      "--text-len", "--scale", "--softmax", "--precision", "--layout", "--order", "--threads",
      "--device", "--dtype", "--mode", "--sparsity", "--topk", "--cube", "--gate", "--gate-name",
      NULL};
    int known = 0;
    for (int j = 0; WITH_VALUE[j]; j++) known |= !strcmp(a, WITH_VALUE[j]);
    if (!known) return bad(a, NULL, "unknown option");
    if (!val) {
      if (i + 1 >= argc) return bad(a, NULL, "expects a value");
      val = argv[++i];
    }
    int64_t n;
    if (!strcmp(a, "--q")) o->q = val;
    else if (!strcmp(a, "--k")) o->k = val;
    else if (!strcmp(a, "--v")) o->v = val;
    else if (!strcmp(a, "--out")) o->out = val;
    else if (!strcmp(a, "--lse")) o->lse = val;
    else if (!strcmp(a, "--safetensors")) o->st = val;
    else if (!strcmp(a, "--q-name")) o->q_name = val;
    else if (!strcmp(a, "--k-name")) o->k_name = val;
    else if (!strcmp(a, "--v-name")) o->v_name = val;
    else if (!strcmp(a, "--out-name")) o->out_name = val;
    else if (!strcmp(a, "--lse-name")) o->lse_name = val;
    else if (!strcmp(a, "--canvas")) {
      if (sta_parse_triple(val, a, 1, 1 << 20, o->canvas) != STA_OK)
        return bad(a, val, "expected T,H,W or TxHxW, three integers >= 1");
      o->have_canvas = 1;
    } else if (!strcmp(a, "--tile")) {
      if (sta_parse_triple(val, a, 1, 1 << 20, o->tile) != STA_OK)
        return bad(a, val, "expected TT,TH,TW or TTxTHxTW, three integers >= 1");
      o->have_tile = 1;
    } else if (!strcmp(a, "--window")) {
      free(o->windows);
      o->windows = NULL;
      sta_status rc = sta_parse_windows(val, a, MAX_HEADS, &o->windows, &o->n_windows);
      if (rc == STA_ERR_NOMEM) return bad(a, NULL, "out of memory");
      if (rc != STA_OK)
        return bad(a, val, "expected KT,KH,KW or KTxKHxKW (integers >= 1), or one such per "
                   "head: 3,3,3:1,5,7 or 3x3x3,1x5x7");
    } else if (!strcmp(a, "--text-len")) {
      if (!parse_i64(val, 0, INT64_MAX, &n)) return bad(a, val, "expected an integer >= 0");
      o->text_len = n;
    } else if (!strcmp(a, "--scale")) {
      char *end;
      errno = 0;
      o->scale = strtod(val, &end);
      if (!*val || *end || errno || !(o->scale > 0) || o->scale > 1e30)
        return bad(a, val, "expected a number > 0");
    } else if (!strcmp(a, "--softmax")) {
      if (!strcmp(val, "exact")) o->softmax = STA_SOFTMAX_EXACT;
      else if (!strcmp(val, "fast")) o->softmax = STA_SOFTMAX_FAST;
      else return bad(a, val, "expected exact or fast");
    } else if (!strcmp(a, "--precision")) {
      if (!strcmp(val, "native")) o->precision = STA_PRECISION_NATIVE;
      else if (!strcmp(val, "fp8")) o->precision = STA_PRECISION_FP8;
      else return bad(a, val, "expected native or fp8");
    } else if (!strcmp(a, "--layout")) {
      if (!strcmp(val, "bshd")) o->layout = STA_BSHD;
      else if (!strcmp(val, "bhsd")) o->layout = STA_BHSD;
      else return bad(a, val, "expected bshd or bhsd");
    } else if (!strcmp(a, "--order")) {
      if (!strcmp(val, "untiled")) o->order = STA_ORDER_UNTILED;
      else if (!strcmp(val, "tiled")) o->order = STA_ORDER_TILED;
      else if (!strcmp(val, "cubes")) o->cube_order = 1; /* --mode vsa */
      else return bad(a, val, "expected untiled, tiled or cubes");
    } else if (!strcmp(a, "--threads")) {
      if (!parse_i64(val, 1, 4096, &n)) return bad(a, val, "expected an integer 1..4096");
      o->threads = (int32_t)n;
    } else if (!strcmp(a, "--device")) {
      if (!strcmp(val, "cpu")) o->device = STA_CPU;
      else if (!strcmp(val, "cuda")) o->device = STA_CUDA;
      else return bad(a, val, "expected cpu or cuda");
    } else if (!strcmp(a, "--dtype")) {
      if (sta_dtype_parse(val, &o->dtype) != STA_OK || o->dtype == STA_F8E4M3 ||
          o->dtype == STA_I32)
        return bad(a, val, "expected f32, f16 or bf16");
      o->have_dtype = 1;
    } else if (!strcmp(a, "--mode")) {
      if (!strcmp(val, "sta")) o->mode = MODE_STA;
      else if (!strcmp(val, "vsa")) o->mode = MODE_VSA;
      else return bad(a, val, "expected sta or vsa");
    } else if (!strcmp(a, "--sparsity")) {
      char *end;
      errno = 0;
      o->sparsity = strtod(val, &end);
      if (!*val || *end || errno || !(o->sparsity >= 0 && o->sparsity < 1))
        return bad(a, val, "expected a number in [0, 1)");
      o->have_sparsity = 1;
    } else if (!strcmp(a, "--topk")) {
      if (!parse_i64(val, 1, INT32_MAX, &n)) return bad(a, val, "expected an integer >= 1");
      o->topk = (int32_t)n;
    } else if (!strcmp(a, "--cube")) {
      if (sta_parse_triple(val, a, 1, 4096, o->cube) != STA_OK)
        return bad(a, val, "expected CT,CH,CW or CTxCHxCW, three integers >= 1");
      o->have_cube = 1;
    } else if (!strcmp(a, "--gate")) o->gate = val;
    else if (!strcmp(a, "--gate-name")) o->gate_name = val;
  }
  if (o->mode == MODE_VSA) { /* what VSA takes, and what it does not */
    if (!o->have_canvas) return bad("--canvas", NULL, "is required with --mode vsa");
    if (o->have_sparsity == (o->topk > 0))
      return bad("--sparsity", NULL, "or --topk: give one with --mode vsa");
    static const struct { int given; const char *opt; } NOT[] = {{0, "--window"},
      {0, "--text-len"}, {0, "--tile"}, {0, "--order tiled"}, {0, "--softmax"}, {0, "--precision"}};
    int given[6] = {o->windows != NULL, o->text_len >= 0, o->have_tile,
                    o->order == STA_ORDER_TILED, o->softmax != STA_SOFTMAX_EXACT,
                    o->precision != STA_PRECISION_NATIVE};
    for (int j = 0; j < 6; j++)
      if (given[j]) return bad(NOT[j].opt, NULL, "is STA's, not taken with --mode vsa");
    if (!o->gate_name) o->gate_name = "gate";
  } else if (o->cube_order || o->have_cube || o->have_sparsity || o->topk || o->gate) {
    return bad(o->cube_order ? "--order cubes" : o->have_cube ? "--cube" : o->have_sparsity
               ? "--sparsity" : o->topk ? "--topk" : "--gate", NULL, "needs --mode vsa");
  }
  if (!o->q && !o->st) return bad("--q", NULL, "is required (or --safetensors)");
  if (!o->k && !o->st) return bad("--k", NULL, "is required (or --safetensors)");
  if (!o->v && !o->st) return bad("--v", NULL, "is required (or --safetensors)");
  if (!o->out) return bad("--out", NULL, "is required");
  if (!o->windows && o->mode == MODE_STA) return bad("--window", NULL, "is required");
  if (o->lse && strcmp(o->lse, o->out) == 0 && !ends_with(o->out, strlen(o->out), ".safetensors"))
    return bad("--lse", o->lse, "is the --out file (one .npy holds one array)");
  if (o->reference && o->device != STA_CPU)
    return bad("--reference", NULL, "runs on the cpu only, not with --device cuda");
  return 0;
}

/* ---- run --------------------------------------------------------------- */

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void shape_str(const sta_tensor *t, char *buf, size_t cap) {
  int n = 0;
  buf[0] = '\0';
  for (int32_t i = 0; i < sta_tensor_ndim(t) && (size_t)n < cap; i++)
    n += snprintf(buf + n, cap - (size_t)n, "%s%lld", i ? "x" : "",
                  (long long)sta_tensor_size(t, i));
}

static int fail(void) {
  fprintf(stderr, "sta-run: %s\n", sta_last_error());
  return 1;
}

/* No --canvas and a length of no known shape: STA.md's message, then what
** would have worked (and a layout hint when the other middle dimension is a
** known length). */
static int unknown_length(const options *o, const sta_tensor *q, int64_t s) {
  char msg[512], hint[160] = "";
  sta_geometry g;
  int od = o->layout == STA_BSHD ? 2 : 1;
  int64_t other = sta_tensor_size(q, od);
  snprintf(msg, sizeof msg, "%s", sta_last_error());
  if (sta_geometry_from_seq_len(&g, other) == STA_OK)
    snprintf(hint, sizeof hint, "; dim %d has %lld, a known length: [B, %s, D] needs --layout "
             "%s", od, (long long)other, od == 2 ? "heads, S" : "S, heads",
             od == 2 ? "bhsd" : "bshd");
  fprintf(stderr, "sta-run: %s (no --canvas given, and %lld rows match none of the known "
          "lengths: 115456 or 115200 (30,48,80), 82944 (36,48,48), 69120 (18,48,80); give "
          "--canvas T,H,W%s)\n", msg, (long long)s, hint);
  return 1;
}

static int run(options *o) {
  const char *spec[3] = {o->q ? o->q : o->st, o->k ? o->k : o->st, o->v ? o->v : o->st};
  const char *names[3] = {o->q_name, o->k_name, o->v_name};
  const char *opt[3] = {"--q", "--k", "--v"};
  sta_tensor *in[3] = {NULL, NULL, NULL}, *dev[3] = {NULL, NULL, NULL};
  sta_tensor *out = NULL, *lse = NULL, *hout = NULL, *hlse = NULL;
  int rc = 1;
  char sh[64];
  output oo, ol;
  /* every output first: nothing is read or computed for a run that could
  ** not write its results (one file when --lse names --out's safetensors) */
  output_init(&oo, "--out", o->out, o->out_name);
  memset(&ol, 0, sizeof ol);
  if (o->lse) output_init(&ol, "--lse", o->lse, o->lse_name);
  int shared = o->lse && oo.st && ol.st && oo.file && ol.file && strcmp(oo.file, ol.file) == 0;
  if (shared) {
    oo.names[1] = ol.names[0];
    oo.n = 2;
    output_free(&ol);
  }
  if ((rc = output_inputs(&oo, spec, names)) != 0 ||
      (o->lse && !shared && (rc = output_inputs(&ol, spec, names)) != 0))
    goto done;
  rc = 1;
  if (!output_open(&oo) || (o->lse && !shared && !output_open(&ol))) goto done;
  for (int i = 0; i < 3; i++) {
    if (load(spec[i], names[i], &in[i]) != STA_OK) { rc = fail(); goto done; }
    if (sta_tensor_ndim(in[i]) != 4) {
      shape_str(in[i], sh, sizeof sh);
      fprintf(stderr, "sta-run: %s %s: expected a 4-D tensor, got shape %s\n", opt[i],
              spec[i], sh);
      goto done;
    }
  }
  if (output_keep(&oo) != STA_OK || output_keep(&ol) != STA_OK) { rc = fail(); goto done; }
  int si = o->layout == STA_BSHD ? 1 : 2, hi = o->layout == STA_BSHD ? 2 : 1;
  int64_t B = sta_tensor_size(in[0], 0), S = sta_tensor_size(in[0], si),
          H = sta_tensor_size(in[0], hi), D = sta_tensor_size(in[0], 3);

  sta_attention_desc desc;
  memset(&desc, 0, sizeof desc);
  if (o->have_canvas)
    sta_geometry_init(&desc.geom, o->canvas[0], o->canvas[1], o->canvas[2]);
  else if (sta_geometry_from_seq_len(&desc.geom, S) != STA_OK) {
    rc = unknown_length(o, in[0], S);
    goto done;
  }
  if (o->have_tile) memcpy(desc.geom.tile, o->tile, sizeof o->tile);
  desc.geom.text_len = o->text_len;
  desc.geom.order = o->order;
  desc.layout = o->layout;
  desc.n_windows = o->n_windows;
  desc.windows = o->windows;
  desc.scale = (float)o->scale;
  desc.softmax = o->softmax;
  desc.precision = o->precision;
  if (o->mode == MODE_STA && o->n_windows != 1 && o->n_windows != H) {
    rc = bad("--window", NULL, "%d windows given for %lld heads (give one, or one per head)",
             (int)o->n_windows, (long long)H);
    goto done;
  }
  if (o->threads) sta_set_num_threads(o->threads);
  sta_dtype file_dt = sta_tensor_dtype(in[0]);
  sta_dtype dt = o->have_dtype ? o->dtype : file_dt;
  for (int i = 0; i < 3; i++)
    if (sta_tensor_to(&dev[i], in[i], dt, o->device) != STA_OK) { rc = fail(); goto done; }
  int64_t oshape[4], lshape[3] = {B, H, S};
  for (int i = 0; i < 4; i++) oshape[i] = sta_tensor_size(in[0], i);
  if (sta_tensor_create(&out, dt, o->device, 4, oshape) != STA_OK ||
      (o->lse && sta_tensor_create(&lse, STA_F32, o->device, 3, lshape) != STA_OK)) {
    rc = fail();
    goto done;
  }
  if (o->device == STA_CUDA && sta_cuda_synchronize() != STA_OK) { rc = fail(); goto done; }
  double t0 = now_s();
  sta_status st = o->mode == MODE_VSA ? vsa_forward(o, dev, out, lse)
                  : o->reference
                      ? sta_attention_reference(&desc, dev[0], dev[1], dev[2], out, lse)
                      : sta_attention_forward(&desc, dev[0], dev[1], dev[2], out, lse);
  if (st == STA_OK && o->device == STA_CUDA) st = sta_cuda_synchronize();
  double dt_s = now_s() - t0;
  if (st != STA_OK) { rc = fail(); goto done; }
  if (sta_tensor_to(&hout, out, file_dt, STA_CPU) != STA_OK ||
      (lse && sta_tensor_to(&hlse, lse, STA_F32, STA_CPU) != STA_OK)) {
    rc = fail();
    goto done;
  }
  oo.ts[0] = hout;
  oo.ts[1] = hlse; /* when shared */
  ol.ts[0] = hlse;
  if (output_write(&oo) != STA_OK || (ol.open && output_write(&ol) != STA_OK) ||
      output_commit(&oo) != STA_OK || output_commit(&ol) != STA_OK) {
    rc = fail();
    goto done;
  }
  if (!o->quiet && o->mode == MODE_VSA) vsa_print(o, in[0], file_dt, dt);
  else if (!o->quiet) {
    double flop = sta_attention_flops(&desc, B, S, H, D);
    char win[80];
    size_t wl = 0;
    for (int32_t i = 0; i < o->n_windows && wl < sizeof win; i++)
      wl += (size_t)snprintf(win + wl, sizeof win - wl, "%s%d,%d,%d", i ? ":" : "",
                             (int)o->windows[3 * i], (int)o->windows[3 * i + 1],
                             (int)o->windows[3 * i + 2]);
    if (wl >= sizeof win) /* too long for one line */
      snprintf(win, sizeof win, "%d per head", (int)o->n_windows);
    shape_str(in[0], sh, sizeof sh);
    printf("sta-run: q %s %s %s%s, canvas %dx%dx%d tile %dx%dx%d text %lld, window %s, "
           "%s %s%s%s, %.3f ms, %.2f GFLOP/s (%.3f GFLOP)\n",
           sh, sta_dtype_name(file_dt), o->layout == STA_BSHD ? "bshd" : "bhsd",
           o->order == STA_ORDER_TILED ? " tiled" : "",
           (int)desc.geom.canvas[0], (int)desc.geom.canvas[1], (int)desc.geom.canvas[2],
           (int)desc.geom.tile[0], (int)desc.geom.tile[1], (int)desc.geom.tile[2],
           (long long)sta_geometry_text_len(&desc.geom, S), win,
           o->device == STA_CPU ? "cpu" : "cuda", sta_dtype_name(dt),
           o->precision == STA_PRECISION_FP8 ? " fp8" : "", o->reference ? " reference" : "",
           dt_s * 1e3,
           dt_s > 0 ? flop / dt_s * 1e-9 : 0.0, flop * 1e-9);
  }
  rc = 0;
done:
  output_free(&oo); /* after a failure: the temporary files go */
  output_free(&ol);
  for (int i = 0; i < 3; i++) { sta_tensor_destroy(in[i]); sta_tensor_destroy(dev[i]); }
  sta_tensor_destroy(out);
  sta_tensor_destroy(lse);
  sta_tensor_destroy(hout);
  sta_tensor_destroy(hlse);
  return rc;
}

int main(int argc, char **argv) {
  options o;
  catch_signals();
  int rc = parse_args(argc, argv, &o);
  if (rc == 0) rc = run(&o);
  else if (rc < 0) rc = 0; /* --help */
  free(o.windows);
  return rc;
}
