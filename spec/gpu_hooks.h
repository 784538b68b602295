/* gpu_hooks.h -- the library's test-only kernel settings (core/backend.h:
** sta_cuda_set_variant_test, sta_cuda_set_tma_test,
** sta_cuda_set_bsa_pairs_test, sta_cuda_set_bsa_sort_test) for the GPU tests
** (header-only).  The library reads no environment variable to choose a
** kernel; a GPU test's main reads these test-only ones and calls the
** setters (scripts/test/test-gpu sets them for its variant runs):
**   STA_TEST_CUDA_VARIANT  2: one CTA per work item, 9: the 128 x 128 kernel
**   STA_TEST_NO_TMA        1: every load by the cp.async gather
**   STA_TEST_NO_TMA_Q      1: the forward gathers Q
**   STA_TEST_BSA_PAIRS     the paired block-sparse forward (block_rows 64): 0 the
**                          default (D 128), 1 at D 64 too, 2 with the pre-pass's
**                          rank path, -1 never (the split kernel)
**   STA_TEST_BSA_SORT      the block-sparse lists' order: 0 the default (sorted
**                          on the device unless known ascending), -1 as given,
**                          1 sorted always */
#ifndef STA_GPU_HOOKS_H
#define STA_GPU_HOOKS_H

#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* Call in main, after sta_test_begin. */
static inline void sta_test_kernel_settings(void) {
  const char *v = getenv("STA_TEST_CUDA_VARIANT"), *t = getenv("STA_TEST_NO_TMA"),
             *q = getenv("STA_TEST_NO_TMA_Q"), *pr = getenv("STA_TEST_BSA_PAIRS"),
             *so = getenv("STA_TEST_BSA_SORT");
  sta_cuda_set_variant_test(v ? atoi(v) : 0);
  sta_cuda_set_tma_test((t && atoi(t) ? STA_TEST_NO_TMA : 0) | (q && atoi(q) ? STA_TEST_NO_TMA_Q : 0));
  sta_cuda_set_bsa_pairs_test(pr ? atoi(pr) : 0);
  sta_cuda_set_bsa_sort_test(so ? atoi(so) : 0);
  if (sta_cuda_variant_test() || sta_cuda_tma_test() || sta_cuda_bsa_pairs_test() ||
      sta_cuda_bsa_sort_test())
    printf("# kernel settings (tests only): variant %d%s%s%s%s\n", (int)sta_cuda_variant_test(),
           sta_cuda_tma_test() & STA_TEST_NO_TMA ? ", no TMA" : "",
           sta_cuda_tma_test() & STA_TEST_NO_TMA_Q ? ", no TMA for Q" : "",
           sta_cuda_bsa_pairs_test() == 2   ? ", block-sparse pairs at D 64 too (rank path)"
           : sta_cuda_bsa_pairs_test() == 1 ? ", block-sparse pairs at D 64 too"
           : sta_cuda_bsa_pairs_test() < 0  ? ", block-sparse split kernel only"
                                            : "",
           sta_cuda_bsa_sort_test() > 0   ? ", block-sparse lists sorted always"
           : sta_cuda_bsa_sort_test() < 0 ? ", block-sparse lists as given"
                                          : "");
}

/* The settings as they are, then the defaults (a test that checks which
** kernel the default takes); sta_test_kernels_put restores them. */
typedef struct sta_test_kernels { int32_t variant, tma, pairs, sort; } sta_test_kernels;
static inline sta_test_kernels sta_test_kernels_default(void) {
  sta_test_kernels k = {sta_cuda_variant_test(), sta_cuda_tma_test(), sta_cuda_bsa_pairs_test(),
                        sta_cuda_bsa_sort_test()};
  sta_cuda_set_variant_test(0);
  sta_cuda_set_tma_test(0);
  sta_cuda_set_bsa_pairs_test(0);
  sta_cuda_set_bsa_sort_test(0);
  return k;
}
static inline void sta_test_kernels_put(sta_test_kernels k) {
  sta_cuda_set_variant_test(k.variant);
  sta_cuda_set_tma_test(k.tma);
  sta_cuda_set_bsa_pairs_test(k.pairs);
  sta_cuda_set_bsa_sort_test(k.sort);
}

#endif
