/* test_cli.c -- build/sta-run end to end: files written here, outputs
** checked against sta_attention_forward called directly; --help; bad
** options (exit 2) and failed runs (exit 1) with their messages.
** sta-run is found as $BUILD/sta-run, else next to this binary's folder
** (build/test/test_cli -> build/sta-run). */
#define CLI_TEST_NAME "test-cli"
#include "cli_util.h"

/* ---- runs -------------------------------------------------------------- */

static void test_npy_bshd(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 2, 4 * 8 * 8 + 5, 3, 16);
  sta_geometry_init(&p.desc.geom, 4, 8, 8);
  int32_t t[3] = {2, 4, 4}, w[9] = {1, 1, 1, 3, 3, 3, 1, 2, 1};
  memcpy(p.desc.geom.tile, t, sizeof t);
  p.desc.geom.text_len = 3;
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 3;
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --lse l.npy --canvas 4,8,8 "
                       "--tile 2,4,4 --window 1,1,1:3,3,3:1,2,1 --text-len 3 --threads 2"), 0);
  assert_string_equal(err_text, "");
  assert_non_null(strstr(out_text, "sta-run: q 2x261x3x16 f32 bshd, canvas 4x8x8 tile 2x4x4 "
                         "text 3, window 1,1,1:3,3,3:1,2,1, cpu f32, "));
  assert_non_null(strstr(out_text, "GFLOP/s"));
  sta_tensor *o = NULL, *l = NULL, *fo = load_npy("o.npy"), *fl = load_npy("l.npy");
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 1e-6);
  assert_close(fl, l, 1e-5);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  sta_tensor_destroy(fl);
  /* --quiet, --scale and one window for all heads; --opt=value spelling;
  ** --softmax fast (the CPU computes the exact softmax for both) */
  p.desc.scale = 0.3f;
  p.desc.n_windows = 1;
  p.desc.geom.text_len = -1;
  assert_int_equal(run("--q=q.npy --k k.npy --v v.npy --out o2.npy --canvas=4,8,8 --tile 2,4,4 "
                       "--window 1,3,1 --scale 0.3 --quiet --softmax=fast"), 0);
  assert_string_equal(out_text, "");
  assert_string_equal(err_text, "");
  int32_t w1[3] = {1, 3, 1};
  memcpy(p.windows, w1, sizeof w1);
  fo = load_npy("o2.npy");
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 1e-6);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  /* --precision fp8: the fp8 forward (sta.h's scheme), not the native one */
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o3.npy --canvas 4,8,8 --tile 2,4,4 "
                       "--window 1,3,1 --scale 0.3 --precision fp8"), 0);
  assert_non_null(strstr(out_text, " fp8,"));
  fo = load_npy("o3.npy");
  p.desc.precision = STA_PRECISION_FP8;
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 1e-6);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  p.desc.precision = STA_PRECISION_NATIVE;
  direct(&p, 0, &o, &l);
  double rel = 0;
  assert_int_equal(sta_tensor_compare(fo, o, NULL, &rel), STA_OK);
  if (!(rel > 5e-3)) fail_msg("--precision fp8 gave the native output (rel %g)", rel);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  free_problem(&p);
}

/* --order tiled: q, k, v in FastVideo's tiled order (partial tiles
** padded) are read as they are, the output comes out in that order, equal
** to the direct forward in it; the untiled length is refused naming it. */
static void test_tiled_order(void **state) {
  (void)state;
  problem p;
  sta_geometry g;
  sta_geometry_init(&g, 3, 5, 7);
  g.tile[0] = 2; g.tile[1] = 4; g.tile[2] = 4; /* 2x2x2 tiles of 32, 256 rows */
  g.order = STA_ORDER_TILED;
  assert_int_equal(sta_geometry_video_rows(&g), 256);
  make_problem(&p, STA_BHSD, STA_F32, 1, 256 + 4, 2, 8);
  p.desc.geom = g;
  int32_t w[3] = {1, 1, 1};
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 1;
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --lse l.npy --canvas 3,5,7 "
                       "--tile 2,4,4 --window 1,1,1 --layout bhsd --order tiled"), 0);
  assert_string_equal(err_text, "");
  assert_non_null(strstr(out_text, "sta-run: q 1x2x260x8 f32 bhsd tiled, canvas 3x5x7 tile "
                         "2x4x4 text 4, window 1,1,1, cpu f32, "));
  sta_tensor *o = NULL, *l = NULL, *fo = load_npy("o.npy"), *fl = load_npy("l.npy");
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 0);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  sta_tensor_destroy(fl);
  free_problem(&p);
  /* the untiled length (105 video tokens + 4) in the tiled order */
  make_problem(&p, STA_BSHD, STA_F32, 1, 105 + 4, 1, 8);
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o3.npy --canvas 3,5,7 --tile 2,4,4 "
                       "--window 1,1,1 --order tiled"), 1);
  assert_non_null(strstr(err_text, "seq_len 109 not supported for STA (the tiled order of "
                                   "canvas 3x5x7 has 256 video rows"));
  free_problem(&p);
}

static void test_bhsd_bf16_reference(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BHSD, STA_BF16, 1, 3 * 5 * 7 + 2, 2, 8);
  sta_geometry_init(&p.desc.geom, 3, 5, 7);
  int32_t t[3] = {2, 2, 3}, w[3] = {1, 3, 3};
  memcpy(p.desc.geom.tile, t, sizeof t);
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 1;
  save_qkv_npy(&p); /* bf16 as '<u2' raw bits */
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out ob.npy --canvas 3,5,7 --tile 2,2,3 "
                       "--window 1,3,3 --layout bhsd --reference"), 0);
  assert_non_null(strstr(out_text, "q 1x2x107x8 bf16 bhsd"));
  assert_non_null(strstr(out_text, "cpu bf16 reference"));
  sta_tensor *o = NULL, *l = NULL, *fo = load_npy("ob.npy");
  assert_int_equal(sta_tensor_dtype(fo), STA_BF16);
  direct(&p, 1, &o, &l);
  assert_close(fo, o, 0);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  /* computing in f32 from bf16 files: the output is written in bf16 */
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out of.npy --canvas 3,5,7 --tile 2,2,3 "
                       "--window 1,3,3 --layout bhsd --dtype f32"), 0);
  fo = load_npy("of.npy");
  assert_int_equal(sta_tensor_dtype(fo), STA_BF16);
  sta_tensor *q32 = NULL, *k32 = NULL, *v32 = NULL, *o32 = NULL, *ob = NULL;
  assert_int_equal(sta_tensor_to(&q32, p.q, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&k32, p.k, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&v32, p.v, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_tensor_to(&o32, q32, STA_F32, STA_CPU), STA_OK);
  assert_int_equal(sta_attention_forward(&p.desc, q32, k32, v32, o32, NULL), STA_OK);
  assert_int_equal(sta_tensor_to(&ob, o32, STA_BF16, STA_CPU), STA_OK);
  assert_close(fo, ob, 0);
  sta_tensor_destroy(q32);
  sta_tensor_destroy(k32);
  sta_tensor_destroy(v32);
  sta_tensor_destroy(o32);
  sta_tensor_destroy(ob);
  sta_tensor_destroy(fo);
  free_problem(&p);
}

static void test_safetensors(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F16, 1, 6 * 8 * 8, 2, 16);
  sta_geometry_init(&p.desc.geom, 6, 8, 8);
  int32_t t[3] = {3, 4, 4}, w[3] = {1, 1, 1};
  memcpy(p.desc.geom.tile, t, sizeof t);
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 1;
  const char *names[4] = {"query", "key", "value", "unused"};
  const sta_tensor *ts[4] = {p.q, p.k, p.v, p.q};
  assert_int_equal(sta_safetensors_save(tpath("in.safetensors"), 4, names, ts), STA_OK);
  /* --safetensors with names; out and lse into one file */
  assert_int_equal(run("--safetensors in.safetensors --q-name query --k-name key --v-name value "
                       "--out res.safetensors --lse res.safetensors --out-name o --lse-name l "
                       "--canvas 6,8,8 --tile 3,4,4 --window 1,1,1 --quiet"), 0);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("res.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 2);
  sta_tensor *fo = NULL, *fl = NULL, *o = NULL, *l = NULL;
  assert_int_equal(sta_safetensors_read(f, "o", &fo), STA_OK);
  assert_int_equal(sta_safetensors_read(f, "l", &fl), STA_OK);
  sta_safetensors_close(f);
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 2e-3); /* f16: allow one rounding flip */
  assert_close(fl, l, 1e-5);
  sta_tensor_destroy(fo);
  sta_tensor_destroy(fl);
  /* FILE.safetensors:NAME mixed with .npy; default output name "out" */
  assert_int_equal(sta_npy_save(p.k, tpath("k.npy")), STA_OK);
  assert_int_equal(run("--q in.safetensors:query --k k.npy --v in.safetensors:value "
                       "--out o.safetensors --lse l.npy --canvas 6,8,8 --tile 3,4,4 "
                       "--window 1,1,1 --quiet"), 0);
  assert_int_equal(sta_safetensors_open(&f, tpath("o.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 1);
  assert_string_equal(sta_safetensors_name(f, 0), "out");
  assert_int_equal(sta_safetensors_read(f, "out", &fo), STA_OK);
  sta_safetensors_close(f);
  fl = load_npy("l.npy");
  assert_close(fo, o, 2e-3);
  assert_close(fl, l, 1e-5);
  sta_tensor_destroy(fo);
  sta_tensor_destroy(fl);
  /* a missing name is a failed run naming it */
  assert_int_equal(run("--q in.safetensors:nope --k k.npy --v k.npy --out x.npy "
                       "--canvas 6,8,8 --window 1,1,1"), 1);
  assert_non_null(strstr(err_text, "in.safetensors: no tensor named 'nope'"));
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  free_problem(&p);
}

static void test_inferred_canvas(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 69120, 1, 4); /* 18 x 48 x 80 */
  assert_int_equal(sta_geometry_from_seq_len(&p.desc.geom, 69120), STA_OK);
  int32_t w[3] = {1, 1, 1};
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 1;
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --window 1,1,1"), 0);
  assert_non_null(strstr(out_text, "canvas 18x48x80 tile 6x8x8 text 0, window 1,1,1"));
  sta_tensor *o = NULL, *l = NULL, *fo = load_npy("o.npy");
  direct(&p, 0, &o, &l);
  assert_close(fo, o, 1e-6);
  sta_tensor_destroy(o);
  sta_tensor_destroy(l);
  sta_tensor_destroy(fo);
  free_problem(&p);
  /* an unknown length without --canvas */
  make_problem(&p, STA_BSHD, STA_F32, 1, 300, 1, 4);
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --window 3,3,3"), 1);
  assert_string_equal(err_text, "sta-run: seq_len 300 not supported for STA (no --canvas given, "
                                "and 300 rows match none of the known lengths: 115456 or 115200 "
                                "(30,48,80), 82944 (36,48,48), 69120 (18,48,80); give --canvas "
                                "T,H,W)\n");
  free_problem(&p);
}

static void test_help(void **state) {
  (void)state;
  assert_int_equal(run("--help"), 0);
  static const char *opts[] = {
    "--q ", "--k ", "--v ", "--out ", "--lse ", "--safetensors ", "--q-name", "--k-name",
    "--v-name", "--out-name", "--lse-name", "--canvas ", "--tile ", "--window ", "--text-len ",
    "--scale ", "--softmax ", "exact", "fast", "--precision ", "fp8", "--layout ", "--threads ", "--device ", "--dtype ", "--reference", "--quiet",
    "--help", "bshd", "bhsd", "cuda", "bf16", "FILE.safetensors:NAME", "Example", "Exit status"};
  for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++)
    if (!strstr(out_text, opts[i])) fail_msg("--help does not mention '%s'", opts[i]);
  assert_string_equal(err_text, "");
  /* --help wins over everything else; -h is --help */
  assert_int_equal(run("--q x --help"), 0);
  assert_non_null(strstr(out_text, "usage: sta-run"));
  char help[8192];
  snprintf(help, sizeof help, "%s", out_text);
  assert_int_equal(run("-h"), 0);
  assert_string_equal(out_text, help);
  assert_non_null(strstr(help, "TxHxW"));
  assert_non_null(strstr(help, "3x3x3,1x5x7"));
  /* --version: sta-run's and the library's */
  assert_int_equal(run("--version"), 0);
  char want[64];
  snprintf(want, sizeof want, "sta-run %s (libsta %s)\n", sta_version(), sta_version());
  assert_string_equal(out_text, want);
  assert_string_equal(err_text, "");
}

/* Both spellings of triples and window lists give the same run:
** T,H,W and TxHxW; 1,1,1:3,3,3:1,2,1 and 1x1x1,3x3x3,1x2x1. */
static void test_spellings(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 3, 8);
  save_qkv_npy(&p);
  static const char *const forms[4][3] = {
    {"4,8,8", "2,4,4", "1,1,1:3,3,3:1,2,1"},
    {"4x8x8", "2x4x4", "1x1x1,3x3x3,1x2x1"},
    {"4x8x8", "2,4,4", "1x1x1:3x3x3:1x2x1"},
    {"4,8,8", "2x4x4", "1,1,1:3,3,3:1,2,1"},
  };
  sta_tensor *first = NULL;
  for (int i = 0; i < 4; i++) {
    assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out s%d.npy --canvas %s --tile %s "
                         "--window %s", i, forms[i][0], forms[i][1], forms[i][2]), 0);
    assert_non_null(strstr(out_text, "canvas 4x8x8 tile 2x4x4 text 0, window "
                                     "1,1,1:3,3,3:1,2,1,"));
    char name[16];
    snprintf(name, sizeof name, "s%d.npy", i);
    sta_tensor *t = load_npy(name);
    if (first) {
      assert_close(t, first, 0);
      sta_tensor_destroy(t);
    } else first = t;
  }
  sta_tensor_destroy(first);
  free_problem(&p);
}

/* 'seq_len N not supported for STA' keeps STA.md's text and says what was
** expected: the canvas's rows, and --layout bhsd for a [B, heads, S, D]
** file read as bshd. */
static void test_seq_len_hints(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BHSD, STA_F32, 1, 4 * 8 * 8, 2, 8); /* [1, 2, 256, 8] */
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --canvas 4x8x8 "
                       "--window 1,1,1"), 1);
  assert_string_equal(err_text, "sta-run: seq_len 2 not supported for STA (canvas 4x8x8 has 256 "
                                "video rows, q has 2; q's dim 2 has 256: [B, heads, S, D] needs "
                                "layout bhsd)\n");
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --canvas 4x8x8 "
                       "--window 1,1,1 --layout bhsd --quiet"), 0);
  free_problem(&p);
  make_problem(&p, STA_BHSD, STA_BF16, 1, 69120, 1, 4); /* a known length, heads first */
  save_qkv_npy(&p);
  assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out o.npy --window 1,1,1"), 1);
  assert_string_equal(err_text, "sta-run: seq_len 1 not supported for STA (no --canvas given, "
                                "and 1 rows match none of the known lengths: 115456 or 115200 "
                                "(30,48,80), 82944 (36,48,48), 69120 (18,48,80); give --canvas "
                                "T,H,W; dim 2 has 69120, a known length: [B, heads, S, D] needs "
                                "--layout bhsd)\n");
  free_problem(&p);
}

static void test_bad_options(void **state) {
  (void)state;
  static const struct { const char *args, *msg; } cases[] = {
    {"--bogus", "sta-run: --bogus: unknown option"},
    {"stray", "sta-run: stray: unexpected argument, options start with --"},
    {"--q", "sta-run: --q: expects a value"},
    {"--canvas 1,2 --q a", "sta-run: --canvas '1,2': expected T,H,W or TxHxW, three integers >= 1"},
    {"--canvas 1x2", "sta-run: --canvas '1x2': expected T,H,W or TxHxW"},
    {"--canvas 1x2,3", "sta-run: --canvas '1x2,3': expected T,H,W or TxHxW"},
    {"--canvas 1x2x3x4", "sta-run: --canvas '1x2x3x4': expected T,H,W or TxHxW"},
    {"--window 3x3x3:1,5,7", "sta-run: --window '3x3x3:1,5,7': expected KT,KH,KW or KTxKHxKW"},
    {"--window 3,3,3,1,5,7", "sta-run: --window '3,3,3,1,5,7': expected KT,KH,KW or KTxKHxKW"},
    {"--window 3x3x3,", "sta-run: --window '3x3x3,': expected KT,KH,KW or KTxKHxKW"},
    {"--version=1", "sta-run: --version '1': takes no value"},
    {"--canvas 1,2,0", "sta-run: --canvas '1,2,0': expected T,H,W"},
    {"--canvas 1,2,3,4", "sta-run: --canvas '1,2,3,4': expected T,H,W"},
    {"--canvas a,b,c", "sta-run: --canvas 'a,b,c': expected T,H,W"},
    {"--tile 6,8", "sta-run: --tile '6,8': expected TT,TH,TW or TTxTHxTW, three integers >= 1"},
    {"--window 3,3", "sta-run: --window '3,3': expected KT,KH,KW or KTxKHxKW (integers >= 1), "
                     "or one such per head: 3,3,3:1,5,7 or 3x3x3,1x5x7"},
    {"--window 3,3,3:", "sta-run: --window '3,3,3:': expected KT,KH,KW"},
    {"--window 3,3,3:1,x,1", "sta-run: --window '3,3,3:1,x,1': expected KT,KH,KW"},
    {"--text-len -1", "sta-run: --text-len '-1': expected an integer >= 0"},
    {"--text-len 5x", "sta-run: --text-len '5x': expected an integer >= 0"},
    {"--scale 0", "sta-run: --scale '0': expected a number > 0"},
    {"--scale nan", "sta-run: --scale 'nan': expected a number > 0"},
    {"--scale ''", "sta-run: --scale '': expected a number > 0"},
    {"--softmax slow", "sta-run: --softmax 'slow': expected exact or fast"},
    {"--precision fp16", "sta-run: --precision 'fp16': expected native or fp8"},
    {"--dtype f8e4m3", "sta-run: --dtype 'f8e4m3': expected f32, f16 or bf16"},
    {"--layout bsdh", "sta-run: --layout 'bsdh': expected bshd or bhsd"},
    {"--order fastvideo", "sta-run: --order 'fastvideo': expected untiled, tiled or cubes"},
    {"--threads 0", "sta-run: --threads '0': expected an integer 1..4096"},
    {"--device tpu", "sta-run: --device 'tpu': expected cpu or cuda"},
    {"--dtype f64", "sta-run: --dtype 'f64': expected f32, f16 or bf16"},
    {"--quiet=1", "sta-run: --quiet '1': takes no value"},
    {"--k k --v v --out o --window 3,3,3", "sta-run: --q: is required (or --safetensors)"},
    {"--q q --v v --out o --window 3,3,3", "sta-run: --k: is required (or --safetensors)"},
    {"--q q --k k --out o --window 3,3,3", "sta-run: --v: is required (or --safetensors)"},
    {"--q q --k k --v v --window 3,3,3", "sta-run: --out: is required"},
    {"--q q --k k --v v --out o", "sta-run: --window: is required"},
    {"--q q --k k --v v --out o --window 3,3,3 --reference --device cuda",
     "sta-run: --reference: runs on the cpu only, not with --device cuda"},
    {"", "sta-run: --q: is required"},
    {"--q q --k k --v v --out o.npy --lse o.npy --window 3,3,3",
     "sta-run: --lse 'o.npy': is the --out file (one .npy holds one array)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run("%s", cases[i].args);
    if (rc != 2 || !strstr(err_text, cases[i].msg) || !strstr(err_text, "(see sta-run --help)"))
      fail_msg("'%s': exit %d, stderr '%s', wanted 2 and '%s'", cases[i].args, rc, err_text,
               cases[i].msg);
    assert_string_equal(out_text, "");
  }
}

static void test_failed_runs(void **state) {
  (void)state;
  problem p;
  make_problem(&p, STA_BSHD, STA_F32, 1, 4 * 8 * 8, 3, 8);
  save_qkv_npy(&p);
  int64_t s3[3] = {4, 5, 6};
  sta_tensor *t3 = NULL;
  assert_int_equal(sta_tensor_create(&t3, STA_F32, STA_CPU, 3, s3), STA_OK);
  assert_int_equal(sta_tensor_randn(t3, seed_counter++, 0, 1), STA_OK);
  assert_int_equal(sta_npy_save(t3, tpath("three.npy")), STA_OK);
  FILE *g = fopen(tpath("garbage.npy"), "wb");
  assert_non_null(g);
  fputs("definitely not numpy", g);
  fclose(g);
  static const struct { const char *args, *msg; int code; } cases[] = {
    {"--q missing.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 --window 1,1,1",
     "missing.npy: cannot open: No such file or directory", 1},
    {"--q garbage.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 --window 1,1,1",
     "garbage.npy: not an .npy file (bad magic string)", 1},
    {"--q q.npy --k three.npy --v v.npy --out fail.npy --canvas 4,8,8 --window 1,1,1",
     "sta-run: --k three.npy: expected a 4-D tensor, got shape 4x5x6", 1},
    {"--q q.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 --tile 1,8,8 --window 2,1,1",
     "sta-run: window: Kt = 2 is even and smaller than the 4 tiles on the t axis", 1},
    {"--q q.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 --tile 1,8,8 --window 1,1,1:3,3,3",
     "sta-run: --window: 2 windows given for 3 heads (give one, or one per head)", 2},
    {"--q q.npy --k k.npy --v v.npy --out fail.npy --canvas 5,8,8 --window 1,1,1",
     "sta-run: seq_len 256 not supported for STA", 1},
    {"--q q.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 --text-len 1 --window 1,1,1",
     "sta-run: text_len: 1 is outside 0..0", 1},
    {"--q q.npy --k k.npy --v v.npy --out /nonexistent-dir/o.npy --canvas 4,8,8 --window 1,1,1",
     "sta-run: --out /nonexistent-dir/o.npy: cannot open for writing: No such file or "
     "directory (checked before computing)", 1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = run("%s", cases[i].args);
    if (rc != cases[i].code || !strstr(err_text, cases[i].msg))
      fail_msg("'%s': exit %d, stderr '%s', wanted %d and '%s'", cases[i].args, rc, err_text,
               cases[i].code, cases[i].msg);
  }
  if (!sta_backend_available(STA_CUDA)) {
    assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out fail.npy --canvas 4,8,8 "
                         "--window 1,1,1 --device cuda"), 1);
    char want[400]; /* STA.md's text, then the probe's reason */
    snprintf(want, sizeof want, "sta-run: st attn not supported (%s)\n",
             sta_backend_describe(STA_CUDA));
    assert_string_equal(err_text, want);
  }
  assert_int_equal(access(tpath("fail.npy"), F_OK), -1); /* no failed run wrote it */
  sta_tensor_destroy(t3);
  free_problem(&p);
}

/* On a machine with a CUDA device: sta-run --device cuda against the CPU
** forward (skipped elsewhere). */
static void test_cuda(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA)) skip();
  problem p;
  make_problem(&p, STA_BSHD, STA_BF16, 1, 12 * 16 * 16 + 7, 4, 128);
  sta_geometry_init(&p.desc.geom, 12, 16, 16);
  int32_t w[12] = {1, 1, 1, 3, 1, 1, 1, 2, 1, 3, 3, 3};
  memcpy(p.windows, w, sizeof w);
  p.desc.n_windows = 4;
  save_qkv_npy(&p);
  for (int k = 0; k < 2; k++) {
    const char *dt = k ? "f16" : "bf16";
    assert_int_equal(run("--q q.npy --k k.npy --v v.npy --out oc.npy --lse lc.npy "
                         "--canvas 12,16,16 --window 1,1,1:3,1,1:1,2,1:3,3,3 --device cuda "
                         "--dtype %s", dt), 0);
    assert_non_null(strstr(out_text, "cuda"));
    sta_tensor *o = NULL, *l = NULL, *fo = load_npy("oc.npy"), *fl = load_npy("lc.npy");
    direct(&p, 0, &o, &l);
    double m, r;
    assert_int_equal(sta_tensor_compare(fo, o, &m, &r), STA_OK);
    if (!(r < 0.02)) fail_msg("%s: rel L2 %g against the CPU forward", dt, r);
    assert_int_equal(sta_tensor_compare(fl, l, &m, &r), STA_OK);
    if (!(m < 0.05)) fail_msg("%s: lse max diff %g", dt, m);
    sta_tensor_destroy(o);
    sta_tensor_destroy(l);
    sta_tensor_destroy(fo);
    sta_tensor_destroy(fl);
  }
  free_problem(&p);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_npy_bshd),
    cmocka_unit_test(test_bhsd_bf16_reference),
    cmocka_unit_test(test_tiled_order),
    cmocka_unit_test(test_safetensors),
    cmocka_unit_test(test_inferred_canvas),
    cmocka_unit_test(test_help),
    cmocka_unit_test(test_spellings),
    cmocka_unit_test(test_seq_len_hints),
    cmocka_unit_test(test_bad_options),
    cmocka_unit_test(test_failed_runs),
    cmocka_unit_test(test_cuda),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
