/*
** internal.h -- what the core's modules share; not installed.
** Plain C11, no CUDA headers: kernels/ includes this for the parameter
** struct and the backend table.
*/
#ifndef STA_INTERNAL_H
#define STA_INTERNAL_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "sta.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ---------------------------------------------------------- */

/* Record status and a printf-style message for sta_last_error(); returns
** status so callers can `return sta_error(...)`. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
sta_status sta_error(sta_status status, const char *fmt, ...);

/* Internal allocation hooks: every host allocation of the core goes
** through these, so fault injection (STA_FAULT_INJECTION builds) can fail
** the n-th one. */
void *sta_malloc(size_t n);
void *sta_calloc(size_t count, size_t size);
void *sta_realloc(void *p, size_t n);
char *sta_strdup(const char *s);
/* Fault injection: fail the n-th allocation from now (n >= 1), 0 = off.
** sta_fault_count() counts allocations since the last arm. */
void sta_fault_arm(int64_t n);
int64_t sta_fault_count(void);
/* Allocations through the hooks that returned NULL on this thread so far
** (injected or real): a parser that got NULL from cJSON compares it before
** and after to tell "out of memory" from "malformed". */
int64_t sta_alloc_failures(void);

/* ---- tensors ---------------------------------------------------------- */

#define STA_MAX_DIMS 4

typedef struct sta_storage {
  void *data;
  size_t nbytes;
  sta_device device;
  int32_t owned; /* free data when the last reference goes */
  int32_t refs;  /* atomic */
} sta_storage;

struct sta_tensor {
  sta_storage *storage;
  int64_t offset; /* elements from storage->data */
  int32_t ndim;
  sta_dtype dtype;
  int64_t shape[STA_MAX_DIMS];
  int64_t stride[STA_MAX_DIMS];
};

/* 4-D view of a tensor as [B, S, heads, D] strides, whatever its layout. */
typedef struct sta_bshd {
  int64_t b, s, h, d;               /* sizes */
  int64_t sb, ss, sh, sd;           /* element strides */
} sta_bshd;
sta_status sta_tensor_bshd(const sta_tensor *t, sta_layout layout,
                           const char *argname, sta_bshd *out);
/* Smallest and largest element offset (in its storage) a tensor with
** numel > 0 reaches. */
void sta_tensor_extent(const sta_tensor *t, int64_t *lo, int64_t *hi);
/* "cpu" or "cuda", for messages. */
const char *sta_device_name(sta_device d);

/* ---- numbers ---------------------------------------------------------- */

static inline float sta_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t sta_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
float sta_f16_to_f32(uint16_t h);
uint16_t sta_f32_to_f16(float f);

/* Load/store one element of dtype at p as float. */
static inline float sta_load_f32(const void *p, sta_dtype dt) {
  switch (dt) {
  case STA_F32: return *(const float *)p;
  case STA_F16: return sta_f16_to_f32(*(const uint16_t *)p);
  default: return sta_bf16_to_f32(*(const uint16_t *)p);
  }
}
static inline void sta_store_f32(void *p, sta_dtype dt, float v) {
  switch (dt) {
  case STA_F32: *(float *)p = v; break;
  case STA_F16: *(uint16_t *)p = sta_f32_to_f16(v); break;
  default: *(uint16_t *)p = sta_f32_to_bf16(v); break;
  }
}

/* ---- the attention problem, resolved ---------------------------------- */

/* Everything a backend needs, validated by sta_attention_forward: sizes,
** strides in elements (d stride is 1), data pointers with offsets applied,
** geometry resolved.  windows: heads*3 ints in host memory. */
typedef struct sta_attn_params {
  const void *q, *k, *v;
  void *o;
  float *lse;            /* NULL or [B, heads, S] with lse strides */
  sta_dtype dtype;
  int64_t batch, seq_len, heads, head_dim;
  int64_t q_sb, q_ss, q_sh;
  int64_t k_sb, k_ss, k_sh;
  int64_t v_sb, v_ss, v_sh;
  int64_t o_sb, o_ss, o_sh;
  int64_t lse_sb, lse_sh, lse_ss;
  int32_t canvas[3], tile[3], grid[3];
  int64_t video_len, text_len;
  const int32_t *windows; /* heads * 3 */
  float scale;
  int32_t fast_softmax;   /* desc->softmax == STA_SOFTMAX_FAST */
  int32_t deterministic;  /* backward: bit-identical run to run */
  /* The backward (sta_attention_backward) reads o and lse (the forward's)
  ** and dout, and writes dq, dk, dv; strides in elements as above. */
  const void *dout;
  void *dq, *dk, *dv;
  int64_t do_sb, do_ss, do_sh;
  int64_t dq_sb, dq_ss, dq_sh;
  int64_t dk_sb, dk_ss, dk_sh;
  int64_t dv_sb, dv_ss, dv_sh;
} sta_attn_params;

/* ---- backends ----------------------------------------------------------- */

typedef struct sta_backend_ops {
  const char *name;
  /* 1 if usable; else 0 and *why says why. */
  int32_t (*probe)(const char **why);
  sta_status (*alloc)(void **p, size_t nbytes);
  void (*release)(void *p);
  /* dst/src device kinds given; at least one is this backend's. */
  sta_status (*memcpy)(void *dst, sta_device dd, const void *src,
                       sta_device sd, size_t nbytes);
  /* Strided copy with conversion between two tensors on this device. */
  sta_status (*copy)(sta_tensor *dst, const sta_tensor *src);
  sta_status (*fill)(sta_tensor *t, double value);
  sta_status (*randn)(sta_tensor *t, uint64_t seed, double mean, double std);
  sta_status (*attention)(const sta_attn_params *p);
  /* per-head mean |a-b| and (a-b)^2; a, b as params' q and o fields:
  ** uses batch, seq_len, heads, head_dim, q_* (a) and o_* (b) strides. */
  sta_status (*head_diff)(const sta_attn_params *p, float *l1, float *l2);
  sta_status (*synchronize)(void);
  /* The gradients (params' backward fields); NULL: not implemented here. */
  sta_status (*attention_backward)(const sta_attn_params *p);
} sta_backend_ops;

/* The backend table for a device, NULL when not compiled in. */
const sta_backend_ops *sta_backend_get(sta_device device);
/* Compiled in when STA_WITH_CUDA is defined (kernels/cuda_backend.cu). */
const sta_backend_ops *sta_cuda_backend(void);

/* Device byte accounting, called by the tensor module. */
void sta_device_account(int64_t delta);

/* CPU implementations, used by the CPU backend and tests. */
sta_status sta_cpu_attention(const sta_attn_params *p);
sta_status sta_cpu_attention_reference(const sta_attn_params *p);
sta_status sta_cpu_head_diff(const sta_attn_params *p, float *l1, float *l2);
sta_status sta_cpu_attention_backward(const sta_attn_params *p);
/* The double-precision gradient of the reference from q, k, v, dout alone
** (o and lse unused). */
sta_status sta_cpu_attention_backward_reference(const sta_attn_params *p);

/* Resolve desc and tensors into params (all checks of the forward).  On
** success p->windows is a heads*3 array from sta_malloc: free() it.
** sta_attn_run: the forward of resolved params on device's backend (a
** caller may change windows and the output between runs of one resolve). */
sta_status sta_attn_resolve(const sta_attention_desc *desc,
                            const sta_tensor *q, const sta_tensor *k,
                            const sta_tensor *v, const sta_tensor *out,
                            const sta_tensor *lse, sta_attn_params *p);
sta_status sta_attn_run(const sta_attn_params *p, sta_device device);

/* Normal draw number i of stream seed (counter-based, Box-Muller on a
** splitmix64 hash): identical on every backend. */
double sta_randn_at(uint64_t seed, uint64_t i);

/* ---- runtime (strategy.c) ----------------------------------------------- */

/* Whole file into a NUL-terminated sta_malloc buffer; errors (STA_ERR_IO)
** read "<what>: cannot open \"<path>\": <reason>". */
sta_status sta_read_text_file(const char *path, const char *what, char **data,
                              size_t *len);
sta_status sta_write_text_file(const char *path, const char *what,
                               const char *text);
/* 1 when s has an entry for step. */
int32_t sta_strategy_has_step(const sta_strategy *s, int32_t step);

#ifdef __cplusplus
}
#endif

#endif
