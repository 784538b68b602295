/*
** bench_ops.c -- the elementwise operations and reductions against the
** device's plain copy (cudaMemcpyAsync device to device; memcpy on the
** host), measured in the same run on tensors of the pipeline's size.
**   bench_ops [--device cuda|cpu] [--rows S] [--reps N]
** Tensors are [1, S, 24, 128] (S: 115456, hunyuan-720p's sequence, on
** cuda; 11520 on the host).  Prints a table: operation, kernel path,
** ms (median), GB/s (bytes read + written / time) and % of the plain
** copy's GB/s.
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "internal.h"

typedef struct bench {
  sta_device dev;
  int64_t n;                 /* elements of one [1, S, 24, 128] tensor */
  sta_tensor *a, *b, *c, *f; /* bf16 x3, f32 */
  sta_tensor *perm, *tr_dst, *tr_src;
} bench;

static void check(sta_status rc, const char *what) {
  if (rc == STA_OK) return;
  fprintf(stderr, "bench_ops: %s: %s\n", what, sta_last_error());
  exit(1);
}

static void sync_dev(const bench *B) {
  if (B->dev == STA_CUDA) check(sta_cuda_synchronize(), "synchronize");
}

enum { PLAIN, COPY, COPY_CONV, COPY_PERM, COPY_TRANS, FILL, RANDN, AXPBY, AXPBY_F32, SCALE,
       ADD, STATS, STATS_F32, N_OPS };

static const struct {
  const char *name, *path;
  int bytes; /* per element, read + written */
} ops[N_OPS] = {
  {"plain device copy (cudaMemcpyAsync / memcpy), bf16", "-", 4},
  {"copy bf16 -> bf16", "flat", 4},
  {"copy f32 -> bf16 (conversion)", "flat", 6},
  {"copy [1,S,H,D] -> [1,H,S,D] view, bf16", "rows", 4},
  {"copy, last two dims transposed, bf16", "strided", 4},
  {"fill bf16", "flat", 2},
  {"randn bf16", "flat", 2},
  {"axpby bf16: y = a*x + b*y", "flat", 6},
  {"axpby f32 y, bf16 x (latent update in f32)", "flat", 10},
  {"scale bf16", "flat", 4},
  {"add bf16: out = x + y", "flat", 6},
  {"stats bf16 (reduced on the device)", "flat", 2},
  {"stats f32", "flat", 4},
};

static void run_op(bench *B, int op) {
  sta_stats st;
  switch (op) {
  case PLAIN: {
    const sta_backend_ops *be = sta_backend_get(B->dev);
    check(be->memcpy(sta_tensor_data(B->a), B->dev, sta_tensor_data(B->b), B->dev,
                     (size_t)B->n * 2), "plain copy");
    break;
  }
  case COPY: check(sta_tensor_copy(B->a, B->b), "copy"); break;
  case COPY_CONV: check(sta_tensor_copy(B->a, B->f), "copy f32"); break;
  case COPY_PERM: check(sta_tensor_copy(B->perm, B->b), "copy permuted"); break;
  case COPY_TRANS: check(sta_tensor_copy(B->tr_dst, B->tr_src), "copy transposed"); break;
  case FILL: check(sta_tensor_fill(B->a, 0.5), "fill"); break;
  case RANDN: check(sta_tensor_randn(B->a, 7, 0, 1), "randn"); break;
  case AXPBY: check(sta_tensor_axpby(B->a, 0.25, B->b, 0.75), "axpby"); break;
  case AXPBY_F32: check(sta_tensor_axpby(B->f, 0.25, B->b, 0.75), "axpby f32"); break;
  case SCALE: check(sta_tensor_scale(B->a, 0.999), "scale"); break;
  case ADD: check(sta_tensor_add(B->c, B->a, B->b), "add"); break;
  case STATS: check(sta_tensor_stats(B->a, &st), "stats"); break;
  default: check(sta_tensor_stats(B->f, &st), "stats f32"); break;
  }
}

int main(int argc, char **argv) {
  bench B;
  int reps = 20;
  int64_t rows = 0;
  memset(&B, 0, sizeof B);
  B.dev = sta_backend_available(STA_CUDA) ? STA_CUDA : STA_CPU;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      i++;
      B.dev = !strcmp(argv[i], "cpu") ? STA_CPU : STA_CUDA;
    } else if (!strcmp(argv[i], "--rows") && i + 1 < argc) rows = atoll(argv[++i]);
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_ops [--device cuda|cpu] [--rows S] [--reps N]\n");
      return 2;
    }
  }
  if (B.dev == STA_CUDA && !sta_backend_available(STA_CUDA)) {
    fprintf(stderr, "bench_ops: %s\n", sta_backend_describe(STA_CUDA));
    return 1;
  }
  if (reps < 1) reps = 1;
  if (rows < 1) rows = B.dev == STA_CUDA ? 115456 : 11520;
  int64_t shape[4] = {1, rows, 24, 128}, bhsd[4] = {1, 24, rows, 128};
  int32_t swap[4] = {0, 2, 1, 3};
  B.n = rows * 24 * 128;
  check(sta_tensor_create(&B.a, STA_BF16, B.dev, 4, shape), "tensor");
  check(sta_tensor_create(&B.b, STA_BF16, B.dev, 4, shape), "tensor");
  check(sta_tensor_create(&B.c, STA_BF16, B.dev, 4, shape), "tensor");
  check(sta_tensor_create(&B.f, STA_F32, B.dev, 4, shape), "tensor");
  sta_tensor *bh = NULL;
  check(sta_tensor_create(&bh, STA_BF16, B.dev, 4, bhsd), "tensor");
  check(sta_tensor_permute(&B.perm, bh, swap), "permute"); /* [1,S,H,D] view of BHSD */
  int64_t m = B.n / 128, sd[2] = {m, 128}, st[2] = {1, m};
  check(sta_tensor_view(&B.tr_dst, B.a, 0, 2, sd, (int64_t[2]){128, 1}), "view");
  check(sta_tensor_view(&B.tr_src, B.b, 0, 2, sd, st), "view"); /* b as [128, m], transposed */
  check(sta_tensor_randn(B.b, 1, 0, 1), "randn");
  check(sta_tensor_randn(B.f, 2, 0, 1), "randn");
  check(sta_tensor_randn(B.a, 3, 0, 1), "randn");

  printf("bench_ops: %s; tensors [1, %lld, 24, 128] (%lld elements, %.0f MB in bf16); %d reps\n\n",
         sta_backend_describe(B.dev), (long long)rows, (long long)B.n, (double)B.n * 2 / 1e6, reps);
  printf("| operation | path | ms (median of %d) | GB/s | %% of plain copy |\n", reps);
  printf("|---|---|---:|---:|---:|\n");
  double *ts = malloc(sizeof(double) * (size_t)reps), copy_rate = 0;
  int64_t moved = sta_transfer_bytes();
  for (int op = 0; op < N_OPS; op++) {
    for (int w = 0; w < 3; w++) run_op(&B, op);
    sync_dev(&B);
    for (int r = 0; r < reps; r++) {
      double t0 = now();
      run_op(&B, op);
      sync_dev(&B);
      ts[r] = now() - t0;
    }
    double t = median(ts, reps), rate = (double)B.n * ops[op].bytes / t / 1e9;
    if (op == PLAIN) copy_rate = rate;
    printf("| %s | %s | %.3f | %.0f | %.0f %% |\n", ops[op].name, ops[op].path, t * 1e3, rate,
           100 * rate / copy_rate);
    fflush(stdout);
  }
  printf("\nhost<->device bytes moved by the operations: %lld\n",
         (long long)(sta_transfer_bytes() - moved));
  free(ts);
  sta_tensor *all[8] = {B.a, B.b, B.c, B.f, bh, B.perm, B.tr_dst, B.tr_src};
  for (int i = 0; i < 8; i++) sta_tensor_destroy(all[i]);
  return 0;
}
