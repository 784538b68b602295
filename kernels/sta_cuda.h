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

/* Stream-ordered scratch of n bytes on stream s, freed by cudaFreeAsync:
** from the library's memory pool on the current device (cuda_backend.cu),
** which keeps what it has reserved between calls (its release threshold
** is all of it), so that a call after a synchronization does not map its
** workspace again (the device's default pool gives back what it holds at
** every synchronization: about 1.2 ms for the fp8 forward's 1.1 GB at
** hunyuan-720p, BENCHMARKS.md); under stream capture, and where the pool
** cannot be made, cudaMallocAsync (the graph's own memory).  Out of memory
** in the pool: its unused memory is given back and the allocation tried
** once more; any other failure (the pool gone with a device reset): the
** pool is dropped (made again on the next call) and cudaMallocAsync
** answers. */
cudaError_t sta_cuda_ws_alloc(void **p, size_t n, cudaStream_t s);

/* Multiprocessors of the current device (132 when it cannot be asked):
** the persistent forward's grid, the elementwise operations' block cap. */
int sta_cuda_sm_count(void);

/* Elementwise operations and reductions (ops_elementwise.cu,
** ops_stats.cu), the backend table's copy, fill, randn, lincomb and stats. */
sta_status sta_cuda_copy(sta_tensor *dst, const sta_tensor *src);
sta_status sta_cuda_fill(sta_tensor *t, double value);
sta_status sta_cuda_randn(sta_tensor *t, uint64_t seed, double mean, double std);
sta_status sta_cuda_lincomb(sta_tensor *out, float a, const sta_tensor *x, float b,
                            const sta_tensor *y);
sta_status sta_cuda_stats(const sta_tensor *t, sta_stats *out);

/* The STA forward on device tensors (kernels/fwd_api.cu). */
sta_status sta_cuda_attention(const sta_attn_params *p);
/* The same at STA_PRECISION_FP8 (kernels/fp8_api.cu): the quantize
** pre-pass, then the fp8 kernel. */
sta_status sta_cuda_attention_fp8(const sta_attn_params *p);
/* The backend's fp8_dequantize (core/backend.h) on this thread's stream
** (kernels/fp8_quant.cu). */
sta_status sta_cuda_fp8_dequantize(float *dst, const sta_bshd *bd, const uint8_t *x8,
                                   const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                                   int per_row);

/* A CUtensorMap (m, 64-byte aligned) of a [B, S, heads, D] operand with
** 64-column boxes and the 128-byte swizzle (tma_map.h's tma_encode, for C
** callers): tile: dims (C0, W, H, T, N), box 64 x 8 x 8 x rows/64 x 1; else
** dims (C0, S, N), box 64 x rows x 1.  fused: C0 = heads*D, N = batch; else
** C0 = D, N = nhb.  0 when the driver refuses the layout. */
int sta_cuda_encode_map(void *m, const void *base, const sta_attn_params *p, int64_t sb,
                        int64_t ss, int64_t sh, int fused, int64_t nhb, int tile, int rows);

/* The padding rows of the tiled order (p->tiled, video_rows > video_len;
** kernels/tiled_pad.cu): row j of every (batch, head) of t (bf16 or f16,
** element strides sb, ss, sh) set to 0 and, lse given, lse (p's lse
** strides) to -inf, on this thread's stream. */
sta_status sta_cuda_pad_rows(const sta_attn_params *p, void *t, int64_t sb, int64_t ss,
                             int64_t sh, float *lse);

/* The STA backward on device tensors (kernels/bwd_api.cu). */
sta_status sta_cuda_attention_backward(const sta_attn_params *p);

#endif
