/*
** bench_cpu.c -- the CPU STA forward and backward against this machine's
** sgemm rate, and the forward against dense attention, measured in the
** same run.
**   bench_cpu [--runs N] [--threads N] [--quick]
** Prints a table: workload, ms (median), GFLOP, GFLOP/s, % of sgemm, and
** the speedup over dense (full-window) attention on the same inputs; then
** the tiny-tiles table: the fast path against the reference.
*/
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "sta.h"

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void cpu_model(char *buf, size_t n) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[512];
  snprintf(buf, n, "unknown cpu");
  if (!f) return;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "model name", 10) == 0) {
      char *c = strchr(line, ':');
      if (c) {
        c += 2;
        c[strcspn(c, "\n")] = 0;
        snprintf(buf, n, "%s", c);
      }
      break;
    }
  fclose(f);
}

/* GFLOP/s of C = A op(B): one GEMM with OpenBLAS on `threads` threads
** (parallel = 0), or `threads` independent single-threaded GEMMs at once
** in an OpenMP region, as the STA forward calls them (parallel = 1).
** *per_cpu (may be NULL): GFLOP per CPU-second of the process. */
static double sgemm_rate(int m, int n, int k, int transb, int threads, int parallel,
                         double seconds, double *per_cpu) {
  int copies = parallel ? threads : 1;
  float *a = malloc(sizeof(float) * (size_t)m * k * copies);
  float *b = malloc(sizeof(float) * (size_t)k * n * copies);
  float *c = malloc(sizeof(float) * (size_t)m * n * copies);
  if (!a || !b || !c) { free(a); free(b); free(c); return 0; }
  for (size_t i = 0; i < (size_t)m * k * copies; i++) a[i] = (float)((i * 7919) % 1000) / 1000.0f;
  for (size_t i = 0; i < (size_t)k * n * copies; i++) b[i] = (float)((i * 104729) % 1000) / 1000.0f;
  memset(c, 0, sizeof(float) * (size_t)m * n * copies);
  openblas_set_num_threads(parallel ? 1 : threads);
  double best = 0, best_cpu = 0;
  for (int round = 0; round < 3; round++) {
    int reps = 1;
    double t, ct;
    for (;;) {
      t = now();
      ct = cpu_now();
      #pragma omp parallel num_threads(copies)
      {
        int id = omp_get_thread_num();
        for (int r = 0; r < reps; r++)
          cblas_sgemm(CblasRowMajor, CblasNoTrans, transb ? CblasTrans : CblasNoTrans, m, n, k,
                      1.0f, a + (size_t)id * m * k, k, b + (size_t)id * k * n, transb ? k : n,
                      0.0f, c + (size_t)id * m * n, n);
      }
      t = now() - t;
      ct = cpu_now() - ct;
      if (t > seconds / 3) break;
      reps *= 2;
    }
    double rate = 2.0 * m * n * k * reps * copies / t / 1e9;
    if (rate > best) best = rate;
    if (rate * t / ct > best_cpu) best_cpu = rate * t / ct;
  }
  if (per_cpu) *per_cpu = best_cpu;
  openblas_set_num_threads(threads);
  free(a); free(b); free(c);
  return best;
}

typedef struct workload {
  const char *name;
  int32_t canvas[3];
  int64_t text, heads, dim;
  sta_dtype dtype;
  int32_t window[3];
} workload;

static void desc_for(sta_attention_desc *d, const workload *w, const int32_t *window) {
  memset(d, 0, sizeof *d);
  sta_geometry_init(&d->geom, w->canvas[0], w->canvas[1], w->canvas[2]);
  d->layout = STA_BSHD;
  d->n_windows = 1;
  d->windows = window;
}

/* Seconds of one backward (t: q k v out dout dq dk dv); *cpu likewise. */
static double backward_seconds(const sta_attention_desc *d, sta_tensor *const *t,
                               const sta_tensor *lse, double *cpu) {
  double s = now(), c = cpu_now();
  if (sta_attention_backward(d, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6], t[7]) != STA_OK) {
    fprintf(stderr, "bench_cpu: %s\n", sta_last_error());
    exit(1);
  }
  *cpu = cpu_now() - c;
  return now() - s;
}

/* Seconds of one forward; *cpu its process CPU seconds. */
static double forward_seconds(const sta_attention_desc *d, sta_tensor *const *t, double *cpu) {
  double s = now(), c = cpu_now();
  if (sta_attention_forward(d, t[0], t[1], t[2], t[3], NULL) != STA_OK) {
    fprintf(stderr, "bench_cpu: %s\n", sta_last_error());
    exit(1);
  }
  *cpu = cpu_now() - c;
  return now() - s;
}

static void loadavg(char *buf, size_t n) {
  FILE *f = fopen("/proc/loadavg", "r");
  snprintf(buf, n, "?");
  if (f) {
    if (fgets(buf, (int)n, f)) buf[strcspn(buf, "\n")] = 0;
    fclose(f);
  }
}

/* Tiny tiles (a token or two each, many heads): the fast path against the
** brute-force reference, best of runs each, forward and backward (it was
** once slower: heads are now gathered per pass, short key ranges per GEMM;
** spec/test_small_tiles.c checks that they agree). */
static void tiny_tiles(int runs, int quick) {
  static const struct { int32_t canvas[3], tile[3], win; int64_t heads, text; } C[] = {
      {{5, 6, 10}, {1, 1, 1}, 3, 24, 0}, {{5, 6, 10}, {1, 1, 1}, 1, 24, 0},
      {{4, 6, 8}, {1, 2, 1}, 3, 16, 4}, {{3, 5, 7}, {2, 1, 1}, 5, 8, 0}};
  printf("\nTiny tiles, f32, D 64: the fast path against the brute-force reference (ms, best "
         "of %d)\n\n| canvas | tile | window | heads | text | forward | reference | backward | "
         "reference |\n|---|---|---|---|---|---|---|---|---|\n", runs);
  for (int c = 0; c < (quick ? 2 : 4); c++) {
    const int64_t S = (int64_t)C[c].canvas[0] * C[c].canvas[1] * C[c].canvas[2] + C[c].text;
    int64_t shape[4] = {1, S, C[c].heads, 64}, ls[3] = {1, C[c].heads, S};
    sta_tensor *t[8], *lse = NULL;
    int ok = sta_tensor_create(&lse, STA_F32, STA_CPU, 3, ls) == STA_OK;
    for (int i = 0; i < 8; i++) {
      t[i] = NULL;
      ok = ok && sta_tensor_create(&t[i], STA_F32, STA_CPU, 4, shape) == STA_OK &&
           sta_tensor_randn(t[i], 300 + (uint64_t)i, 0, 1) == STA_OK;
    }
    sta_attention_desc d;
    memset(&d, 0, sizeof d);
    sta_geometry_init(&d.geom, C[c].canvas[0], C[c].canvas[1], C[c].canvas[2]);
    memcpy(d.geom.tile, C[c].tile, sizeof d.geom.tile);
    int32_t w[3] = {C[c].win, C[c].win, C[c].win};
    d.n_windows = 1;
    d.windows = w;
    double best[4] = {1e9, 1e9, 1e9, 1e9};
    ok = ok && sta_attention_forward(&d, t[0], t[1], t[2], t[3], lse) == STA_OK;
    for (int r = 0; ok && r < runs; r++) {
      double t0 = cpu_now();
      ok = sta_attention_forward(&d, t[0], t[1], t[2], t[3], NULL) == STA_OK;
      double t1 = cpu_now();
      ok = ok && sta_attention_reference(&d, t[0], t[1], t[2], t[4], NULL) == STA_OK;
      double t2 = cpu_now();
      ok = ok && sta_attention_backward(&d, t[0], t[1], t[2], t[3], lse, t[4], t[5], t[6],
                                        t[7]) == STA_OK;
      double t3 = cpu_now();
      ok = ok && sta_attention_backward_reference(&d, t[0], t[1], t[2], t[4], t[5], t[6],
                                                  t[7]) == STA_OK;
      double dt[4] = {t1 - t0, t2 - t1, t3 - t2, cpu_now() - t3};
      for (int k = 0; k < 4; k++) best[k] = dt[k] < best[k] ? dt[k] : best[k];
    }
    if (!ok) printf("| %dx%dx%d | failed: %s |\n", (int)C[c].canvas[0], (int)C[c].canvas[1],
                    (int)C[c].canvas[2], sta_last_error());
    else
      printf("| %dx%dx%d | %dx%dx%d | %d | %lld | %lld | %.2f | %.2f | %.2f | %.2f |\n",
             (int)C[c].canvas[0], (int)C[c].canvas[1], (int)C[c].canvas[2], (int)C[c].tile[0],
             (int)C[c].tile[1], (int)C[c].tile[2], (int)C[c].win, (long long)C[c].heads,
             (long long)C[c].text, 1e3 * best[0], 1e3 * best[1], 1e3 * best[2], 1e3 * best[3]);
    for (int i = 0; i < 8; i++) sta_tensor_destroy(t[i]);
    sta_tensor_destroy(lse);
  }
}

int main(int argc, char **argv) {
  int runs = 5, threads = 0, quick = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--runs") && i + 1 < argc) runs = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--quick")) quick = 1;
    else {
      fprintf(stderr, "usage: %s [--runs N] [--threads N] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (runs < 1) runs = 1;
  if (threads > 0) sta_set_num_threads(threads);
  threads = sta_get_num_threads();
  char model[256];
  cpu_model(model, sizeof model);
  printf("# sta CPU benchmark\n");
  printf("cpu: %s, %d threads; %s\n", model, threads, openblas_get_config());
  char load[128];
  loadavg(load, sizeof load);
  printf("backend: %s; load average at the start: %s\n\n", sta_backend_describe(STA_CPU), load);

  /* sgemm at the shapes of the STA work (D 64, a 384-row tile against the
  ** 6912 window keys of the workload below) and a big square one */
  double secs = quick ? 0.3 : 1.0;
  struct { const char *what; int m, n, k, tb, par; } g[] = {
    {"square 2048^3, one GEMM on all threads", 2048, 2048, 2048, 0, 0},
    {"S = Q K^T  384x6912x64, one per thread", 384, 6912, 64, 1, 1},
    {"O = P V    384x64x6912, one per thread", 384, 64, 6912, 0, 1},
    {"S = Q K^T  128x512x64,  one per thread", 128, 512, 64, 1, 1},
    {"O = P V    128x64x512,  one per thread", 128, 64, 512, 0, 1},
  };
  int ng = (int)(sizeof g / sizeof g[0]);
  double best = 0;
  printf("| sgemm (%d threads) | GFLOP/s | GFLOP per CPU-second |\n|---|---|---|\n", threads);
  for (int i = 0; i < ng; i++) {
    double pc, r = sgemm_rate(g[i].m, g[i].n, g[i].k, g[i].tb, threads, g[i].par, secs, &pc);
    if (r > best) best = r;
    printf("| %s | %.1f | %.1f |\n", g[i].what, r, pc);
  }
  printf("\nbest of the above: %.1f GFLOP/s\n\n", best);

  workload wl[] = {
    {"12x24x40 h8 d64 f32, text 0", {12, 24, 40}, 0, 8, 64, STA_F32, {3, 3, 3}},
    {"12x24x40 h8 d64 f32, text 64", {12, 24, 40}, 64, 8, 64, STA_F32, {3, 3, 3}},
    {"12x24x40 h8 d64 bf16, text 64", {12, 24, 40}, 64, 8, 64, STA_BF16, {3, 3, 3}},
    {"12x24x40 h4 d128 bf16, text 0", {12, 24, 40}, 0, 4, 128, STA_BF16, {3, 3, 3}},
  };
  int nw = quick ? 2 : (int)(sizeof wl / sizeof wl[0]);
  printf("Each round runs the square sgemm on all threads, the STA forward, the dense\n"
         "forward and the STA backward back to back (the backward's GFLOP count 2.5x the\n"
         "forward's: five GEMMs to two, the convention of FlashAttention's papers).  %% of sgemm = median over rounds of (rate / that round's\n"
         "sgemm rate), by wall time and by process CPU time (GFLOP per CPU-second): load\n"
         "from other processes cancels out of the ratios, the CPU one most.\n\n");
  printf("| workload | window | ms (median of %d) | GFLOP | GFLOP/s | sgemm GFLOP/s (same rounds) "
         "| %% of sgemm (wall) | %% of sgemm (CPU time) | speedup vs dense (backward: its time over the forward's) |\n", runs);
  printf("|---|---|---|---|---|---|---|---|---|\n");
  double *ts = malloc(sizeof(double) * (size_t)runs * 10);
  double *td = ts + runs, *tg = td + runs, *rs = tg + runs, *rd = rs + runs, *cs = rd + runs,
         *cd = cs + runs, *tb = cd + runs, *rb = tb + runs, *cb = rb + runs;
  for (int i = 0; i < nw; i++) {
    const workload *w = &wl[i];
    int64_t S = (int64_t)w->canvas[0] * w->canvas[1] * w->canvas[2] + w->text;
    int64_t shape[4] = {1, S, w->heads, w->dim};
    sta_tensor *t[8] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL}, *lse = NULL;
    int64_t lshape[3] = {1, w->heads, S};
    if (sta_tensor_create(&lse, STA_F32, STA_CPU, 3, lshape) != STA_OK) {
      fprintf(stderr, "bench_cpu: %s\n", sta_last_error());
      return 1;
    }
    for (int j = 0; j < 8; j++) {
      if (sta_tensor_create(&t[j], w->dtype, STA_CPU, 4, shape) != STA_OK) {
        fprintf(stderr, "bench_cpu: %s\n", sta_last_error());
        return 1;
      }
      sta_tensor_randn(t[j], 100 + (uint64_t)j, 0.0, 1.0);
    }
    static const int32_t full[3] = {1 << 20, 1 << 20, 1 << 20};
    sta_attention_desc ds, dd;
    desc_for(&ds, w, w->window);
    desc_for(&dd, w, full);
    double fs = sta_attention_flops(&ds, 1, S, w->heads, w->dim);
    double fd = sta_attention_flops(&dd, 1, S, w->heads, w->dim);
    double c1, c2, gc;
    forward_seconds(&ds, t, &c1); /* warm-up */
    if (sta_attention_forward(&ds, t[0], t[1], t[2], t[3], lse) != STA_OK) {
      fprintf(stderr, "bench_cpu: %s\n", sta_last_error());
      return 1;
    }
    double c3;
    backward_seconds(&ds, t, lse, &c3); /* warm-up */
    for (int r = 0; r < runs; r++) {
      tg[r] = sgemm_rate(2048, 2048, 2048, 0, threads, 0, 0.3, &gc);
      ts[r] = forward_seconds(&ds, t, &c1);
      td[r] = forward_seconds(&dd, t, &c2);
      rs[r] = fs / ts[r] / 1e9 / tg[r];
      rd[r] = fd / td[r] / 1e9 / tg[r];
      cs[r] = fs / c1 / 1e9 / gc;
      cd[r] = fd / c2 / 1e9 / gc;
      tb[r] = backward_seconds(&ds, t, lse, &c3);
      rb[r] = 2.5 * fs / tb[r] / 1e9 / tg[r];
      cb[r] = 2.5 * fs / c3 / 1e9 / gc;
    }
    double ms = 1e3 * median(ts, runs), md = 1e3 * median(td, runs), g0 = median(tg, runs);
    double es = median(rs, runs), ed = median(rd, runs), ecs = median(cs, runs),
           ecd = median(cd, runs);
    printf("| %s | %d,%d,%d | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.2fx |\n", w->name,
           w->window[0], w->window[1], w->window[2], ms, fs / 1e9, fs / ms / 1e6, g0, 100 * es,
           100 * ecs, md / ms);
    printf("| %s | dense | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | 1.00x |\n", w->name, md,
           fd / 1e9, fd / md / 1e6, g0, 100 * ed, 100 * ecd);
    double mb = 1e3 * median(tb, runs), eb = median(rb, runs), ecb = median(cb, runs);
    printf("| %s | %d,%d,%d backward | %.1f | %.1f | %.1f | %.1f | %.0f%% | %.0f%% | %.2fx the "
           "forward |\n", w->name, w->window[0], w->window[1], w->window[2], mb, 2.5 * fs / 1e9,
           2.5 * fs / mb / 1e6, g0, 100 * eb, 100 * ecb, mb / ms);
    for (int j = 0; j < 8; j++) sta_tensor_destroy(t[j]);
    sta_tensor_destroy(lse);
    fflush(stdout);
  }
  free(ts);
  tiny_tiles(runs, quick);
  loadavg(load, sizeof load);
  printf("\nload average at the end: %s\n", load);
  return 0;
}
