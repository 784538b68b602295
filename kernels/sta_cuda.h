/*
** sta_cuda.h -- what the CUDA translation units of kernels/ share.
** Not installed; C++ (nvcc) only.
*/
#ifndef STA_CUDA_H
#define STA_CUDA_H

#include <cuda_runtime.h>

#include "internal.h"

/* The stream of this thread's device work. */
static inline cudaStream_t sta_cuda_stream(void) {
  return (cudaStream_t)sta_cuda_get_stream();
}

/* Map a CUDA error to a status with a message naming what failed; clears
** the sticky-free last error. */
sta_status sta_cuda_fail(cudaError_t e, const char *what);

/* The STA forward on device tensors (kernels/sta_attention.cu). */
sta_status sta_cuda_attention(const sta_attn_params *p);

/* The STA backward on device tensors (kernels/sta_backward.cu). */
sta_status sta_cuda_attention_backward(const sta_attn_params *p);

/* Kernel variant for bf16/f16 D=128 (benchmarks): 0 = default; see
** sta_attention.cu.  Read from STA_CUDA_VARIANT at each call. */
int sta_cuda_attention_variant(void);

#endif
