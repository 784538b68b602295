/*
** backend.c -- the backend table (CPU always; CUDA when compiled in and a
** device answers the probe), threads, streams, device byte accounting.
*/
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

static int32_t n_threads = 0;
static _Thread_local void *cuda_stream = NULL;
static _Thread_local char last_launch[512];
static _Thread_local int64_t wave_gate_test; /* sta_cuda_set_wave_gate_test */
static int32_t variant_test, tma_test, bsa_pairs_test, bsa_sort_test; /* process-wide; __atomic builtins */
static int64_t dev_in_use = 0, dev_peak = 0; /* __atomic builtins (clang refuses them on _Atomic) */
static int64_t transferred = 0;

static int32_t cpu_probe(const char **why) {
  if (why) *why = "host";
  return 1;
}

static sta_status cpu_alloc(void **p, size_t n) {
  *p = sta_malloc(n);
  return *p ? STA_OK : sta_error(STA_ERR_NOMEM, "out of host memory: %zu bytes", n);
}

static sta_status cpu_memcpy(void *dst, sta_device dd, const void *src,
                             sta_device sd, size_t n) {
  (void)dd; (void)sd;
  memcpy(dst, src, n);
  return STA_OK;
}

static sta_status cpu_sync(void) { return STA_OK; }

static const sta_backend_ops cpu_ops = {
  .name = "cpu", .probe = cpu_probe, .alloc = cpu_alloc, .release = free,
  .memcpy = cpu_memcpy, .attention = sta_cpu_attention, .head_diff = sta_cpu_head_diff,
  .synchronize = cpu_sync, .attention_backward = sta_cpu_attention_backward,
  .attention_fp8 = sta_cpu_fp8_attention, .fp8_dequantize = sta_cpu_fp8_dequantize,
  .masks = 1 << STA_MASK_BLOCKS | 1 << STA_MASK_WINDOW_OR_BLOCKS};

#ifdef STA_WITH_CUDA
static int cuda_state = -1; /* -1 unprobed, 0 no, 1 yes */
static const char *cuda_why = "not probed";
#endif

const sta_backend_ops *sta_backend_get(sta_device device) {
  if (device == STA_CPU) return &cpu_ops;
#ifdef STA_WITH_CUDA
  if (device == STA_CUDA) return sta_cuda_backend();
#endif
  return NULL;
}

#ifdef STA_WITH_CUDA
static void cuda_probe_once(void) {
  if (cuda_state >= 0) return;
  #pragma omp critical(sta_cuda_probe)
  if (cuda_state < 0) {
    const char *why = "unknown";
    const sta_backend_ops *b = sta_cuda_backend();
    int ok = b && b->probe(&why);
    cuda_why = why;
    cuda_state = ok ? 1 : 0;
  }
}
#endif

int32_t sta_backend_available(sta_device device) {
  if (device == STA_CPU) return 1;
#ifdef STA_WITH_CUDA
  if (device == STA_CUDA) {
    if (getenv("STA_DISABLE_CUDA")) return 0;
    cuda_probe_once();
    return cuda_state == 1;
  }
#endif
  return 0;
}

const char *sta_backend_describe(sta_device device) {
  if (device == STA_CPU) return "cpu: OpenMP + OpenBLAS";
#ifdef STA_WITH_CUDA
  if (device == STA_CUDA) {
    if (getenv("STA_DISABLE_CUDA")) return "cuda: disabled by STA_DISABLE_CUDA";
    cuda_probe_once();
    return cuda_why;
  }
  return "unknown device";
#else
  return device == STA_CUDA ? "cuda: not compiled in (nvcc was not found at build time)"
                            : "unknown device";
#endif
}

void sta_set_num_threads(int32_t n) { n_threads = n > 0 ? n : 0; }

int32_t sta_get_num_threads(void) {
  return n_threads > 0 ? n_threads : omp_get_max_threads();
}

void sta_cuda_set_stream(void *stream) { cuda_stream = stream; }
void *sta_cuda_get_stream(void) { return cuda_stream; }

void sta_cuda_note_launch(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_launch, sizeof last_launch, fmt, ap);
  va_end(ap);
}

const char *sta_cuda_last_launch(void) { return last_launch; }

void sta_cuda_set_wave_gate_test(int64_t bytes) { wave_gate_test = bytes; }
int64_t sta_cuda_wave_gate_test(void) { return wave_gate_test; }

void sta_cuda_set_variant_test(int32_t variant) {
  __atomic_store_n(&variant_test, variant == 2 || variant == 9 ? variant : 0, __ATOMIC_RELAXED);
}
int32_t sta_cuda_variant_test(void) { return __atomic_load_n(&variant_test, __ATOMIC_RELAXED); }
void sta_cuda_set_tma_test(int32_t flags) {
  __atomic_store_n(&tma_test, flags & (STA_TEST_NO_TMA | STA_TEST_NO_TMA_Q), __ATOMIC_RELAXED);
}
int32_t sta_cuda_tma_test(void) { return __atomic_load_n(&tma_test, __ATOMIC_RELAXED); }
void sta_cuda_set_bsa_pairs_test(int32_t on) {
  __atomic_store_n(&bsa_pairs_test, on == 2 ? 2 : on == 1 ? 1 : on < 0 ? -1 : 0, __ATOMIC_RELAXED);
}
int32_t sta_cuda_bsa_pairs_test(void) {
  return __atomic_load_n(&bsa_pairs_test, __ATOMIC_RELAXED);
}
void sta_cuda_set_bsa_sort_test(int32_t on) {
  __atomic_store_n(&bsa_sort_test, on == 1 || on == -1 ? on : 0, __ATOMIC_RELAXED);
}
int32_t sta_cuda_bsa_sort_test(void) { return __atomic_load_n(&bsa_sort_test, __ATOMIC_RELAXED); }
sta_status sta_backend_missing(sta_device device) {
  return sta_error(STA_ERR_BACKEND, "st attn not supported (%s)", sta_backend_describe(device));
}

sta_status sta_cuda_synchronize(void) {
  if (!sta_backend_available(STA_CUDA)) return sta_backend_missing(STA_CUDA);
  return sta_backend_get(STA_CUDA)->synchronize();
}

void sta_device_account(int64_t delta) {
  int64_t now = __atomic_add_fetch(&dev_in_use, delta, __ATOMIC_ACQ_REL),
          peak = __atomic_load_n(&dev_peak, __ATOMIC_ACQUIRE);
  while (now > peak && !__atomic_compare_exchange_n(&dev_peak, &peak, now, 0,
                                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {}
}

int64_t sta_device_bytes_in_use(void) { return __atomic_load_n(&dev_in_use, __ATOMIC_ACQUIRE); }
int64_t sta_device_bytes_peak(void) { return __atomic_load_n(&dev_peak, __ATOMIC_ACQUIRE); }
void sta_device_reset_peak(void) {
  __atomic_store_n(&dev_peak, sta_device_bytes_in_use(), __ATOMIC_RELEASE);
}

void sta_transfer_account(int64_t bytes) {
  __atomic_add_fetch(&transferred, bytes, __ATOMIC_RELAXED);
}

int64_t sta_transfer_bytes(void) { return __atomic_load_n(&transferred, __ATOMIC_RELAXED); }
