/*
** internal.h -- what the core's modules share; not installed.  Plain C11,
** no CUDA headers (kernels/ includes it too).  This file: errors, handles,
** tensors, memory overlap, numbers (dtype conversions, the normal
** generator), the tiled order, files, text forms, JSON; at its end the
** layers above, each in its own header and included here, so that one
** include serves every module:
**   backend.h        the attention problem resolved, the backend table
**                    (the interface kernels/ implements), the CPU backend
**   fp8_internal.h   the fp8 forward's operands and quantizer rules
**   vsa_internal.h   Video Sparse Attention's cubes, params and pieces
*/
#ifndef STA_INTERNAL_H
#define STA_INTERNAL_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "mask.h" /* the mask rule (STA_HD) */
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

/* Cancel points of long calls (sta.h, sta_cancel): STA_OK, or
** STA_ERR_CANCELLED "<what>: cancelled (sta_cancel) before it finished; no
** output was changed" while the flag is raised.  Work loops check
** sta_cancel_requested() per item and, when they skipped any, return
** sta_cancelled (the flag may have been cleared meanwhile). */
sta_status sta_cancel_point(const char *what);
sta_status sta_cancelled(const char *what);

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

/* ---- handles (handle.c) ------------------------------------------------ */

/* Every object the API hands out is registered while it lives (sta.h's
** ownership rules), so a NULL, released or foreign handle is refused
** without being dereferenced. */
typedef enum sta_kind {
  STA_KIND_TENSOR = 1, STA_KIND_SAFETENSORS, STA_KIND_STRATEGY, STA_KIND_METADATA,
  STA_KIND_BATCH, STA_KIND_CONTEXT, STA_KIND_LAYER, STA_KIND_COMM, STA_KIND_SP_LAYER
} sta_kind;
/* Register p (STA_ERR_NOMEM when the table cannot grow). */
sta_status sta_handle_add(const void *p, sta_kind kind);
/* Unregister p, just before it is freed. */
void sta_handle_remove(const void *p);
/* 1 when p is a live handle of kind. */
int sta_handle_live(const void *p, sta_kind kind);
/* STA_OK when live; else STA_ERR_ARGUMENT "<arg>: expected a <kind>, got
** NULL" or "<arg>: not a live sta_<kind> (released already, or not made by
** sta)". */
sta_status sta_handle_check(const void *p, sta_kind kind, const char *arg);
/* Live handles of every kind (tests: nothing leaks). */
int64_t sta_handle_count(void);
/* Return the check's status from the calling function when it fails. */
#define STA_CHECK_HANDLE(p, kind, arg)                                        \
  do {                                                                        \
    sta_status check_rc_ = sta_handle_check((p), (kind), (arg));              \
    if (check_rc_ != STA_OK) return check_rc_;                                \
  } while (0)

/* Reference counts of shared objects (strategy, metadata, forward batch,
** communicator): the creator holds one, every holder one more. */
static inline void sta_ref_retain(int32_t *refs) {
  __atomic_add_fetch(refs, 1, __ATOMIC_ACQ_REL);
}
/* 1 when this was the last reference: free the object. */
static inline int sta_ref_release(int32_t *refs) {
  return __atomic_sub_fetch(refs, 1, __ATOMIC_ACQ_REL) == 0;
}

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
/* STA_ERR_UNSUPPORTED when t is f8e4m3 on a device (name: the argument):
** no device kernel computes on it (sta.h, STA_F8E4M3). */
sta_status sta_f8_device_check(const sta_tensor *t, const char *name);
/* STA_I32's rules (core/tensor_i32.c).  mix_check: STA_ERR_DTYPE "<op>:
** <an> is <dtype> and <bn> is <dtype> (i32 converts to no other dtype)"
** when exactly one of a, b is i32.  value: v as an int32, or
** STA_ERR_ARGUMENT unless it is an integer in range. */
sta_status sta_i32_mix_check(const char *op, const char *an, const sta_tensor *a,
                             const char *bn, const sta_tensor *b);
sta_status sta_i32_value(double v, int32_t *out);
/* STA_ERR_SHAPE "<what>: shapes differ (2x3 vs 3x2)"; with names
** "<what>: shapes differ (x 2x3 vs y 3x2)". */
sta_status sta_shape_mismatch(const char *what, const char *an,
                              const sta_tensor *a, const char *bn,
                              const sta_tensor *b);

/* ---- elementwise iteration (core/tensor.c; kernels/ops.cuh) ----------- */

/* The common iteration space of up to 3 tensors of one shape, in their
** row-major element order (which is the logical index randn draws by):
** size-1 dims dropped, neighbouring dims merged where every operand's
** strides allow, right-aligned in 4 dims (leading sizes 1, strides 0).
** Operand 0 is the output. */
#define STA_ITER_OPS 3
typedef struct sta_iter {
  int32_t nops, ndim;             /* ndim: dims left, 1..4 */
  int64_t numel;
  int64_t shape[4];
  char *data[STA_ITER_OPS];       /* element 0 of each operand */
  int32_t dtype[STA_ITER_OPS];
  int64_t stride[STA_ITER_OPS][4]; /* elements */
} sta_iter;
void sta_iter_init(sta_iter *it, int32_t nops, const sta_tensor *const *t);

/* The host loops of the operations on tensors (core/cpu_ops.c), called by
** core/ops.c; tensors checked by the caller, on the host.  lincomb: out =
** a*x + b*y (y NULL: a*x).  stats: STA_ERR_NOMEM or the stats of numel > 0
** elements. */
void sta_host_copy(sta_tensor *dst, const sta_tensor *src);
void sta_host_fill(sta_tensor *t, double value);
void sta_host_randn(sta_tensor *t, uint64_t seed, double mean, double std);
void sta_host_lincomb(sta_tensor *out, float a, const sta_tensor *x, float b,
                      const sta_tensor *y);
sta_status sta_host_stats(const sta_tensor *t, sta_stats *out);

/* ---- overlap (overlap.c) ----------------------------------------------- */

/* 1 when a and b share memory: decided on their elements' bytes, not their
** spans (disjoint interleaved slices of one tensor: 0), across storages too
** (two wraps of one buffer), never across devices. */
int sta_tensor_overlaps(const sta_tensor *a, const sta_tensor *b);
/* 1 when two elements of t are one memory location (a stride-0 view, or
** strides that fold back). */
int sta_tensor_self_overlaps(const sta_tensor *t);
/* The deciders behind both: 1 yes, 0 no, -1 the search gave up on
** contrived strides (the two above answer 1 then: refused, never a false
** "disjoint"); for tests. */
int sta_overlap_decide(const sta_tensor *a, const sta_tensor *b);
int sta_self_overlap_decide(const sta_tensor *t);
/* 1 when a and b are the same elements in the same order (element 0 at
** one address, one dtype, shape and strides). */
int sta_tensor_same_view(const sta_tensor *a, const sta_tensor *b);
/* The memory checks of every call that writes: call `what` writes the nw
** tensors w (names wn) while it reads the nr tensors r (NULL entries are
** skipped).  STA_ERR_ARGUMENT when a written tensor overlaps itself
** ("<w>: more than one of its elements is one memory location ..."),
** another written one or a read one ("<w>: shares memory with <r> (the
** <what> writes <w> while reading <r>; use a separate tensor)").
** in_place (elementwise calls): a written tensor may be a read one's same
** view; then the message is "<what>: <w> overlaps <r> without being the
** same view". */
sta_status sta_check_writes(const char *what, int in_place, int nw, const sta_tensor *const *w,
                            const char *const *wn, int nr, const sta_tensor *const *r,
                            const char *const *rn);

/* The attention operands' checks (core/attention.c), shared by the VSA
** calls: t (name) is 4-D in layout with the head dimension contiguous (*o
** its sizes and strides); t is, besides, of ref's (named rn) shape bq (its S
** too unless any_s), dtype and device. */
sta_status sta_check_operand4(const sta_tensor *t, const char *name, sta_layout layout,
                              sta_bshd *o);
sta_status sta_check_like(const sta_tensor *t, const char *name, sta_layout layout,
                          const sta_tensor *ref, const char *rn, const sta_bshd *bq, sta_bshd *bt,
                          int any_s);

/* ---- numbers ---------------------------------------------------------- */

static inline float sta_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* Round to nearest even; a NaN stays a (quiet) NaN.  Branch-free, so that
** row loops vectorise. */
static inline uint16_t sta_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, nan = (u >> 16) | 0x40;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rne);
}
float sta_f16_to_f32(uint16_t h);
uint16_t sta_f32_to_f16(float f);

/* e4m3 (OCP FP8 E4M3) from float: round to nearest even, subnormals,
** |f| >= 448 (and +-Inf) saturated to +-448 as cvt.rn.satfinite does,
** NaN to 0x7f. */
STA_HD uint8_t sta_f32_to_e4m3(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;
  if (a >= 0x43e00000u) return (uint8_t)(sign | 0x7e); /* 448 */
  if (a < 0x3c800000u) {                               /* below 2^-6: steps of 2^-9 */
    float x, m;
    memcpy(&x, &a, 4);
    m = x * 512.0f;                                    /* exact */
    uint32_t n = (uint32_t)m, r = (uint32_t)(m - (float)n >= 0.5f);
    if (m - (float)n == 0.5f) r = n & 1u;              /* ties to even */
    return (uint8_t)(sign | (n + r));                  /* 8: 2^-6, the first normal */
  }
  uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20; /* 3 fraction bits, RNE */
  return (uint8_t)(sign | (r - (120u << 3)));
}
/* float of an e4m3 code (exact). */
STA_HD float sta_e4m3_to_f32(uint8_t c) {
  uint32_t e = (c >> 3) & 15u, m = c & 7u, u;
  float f;
  if (e == 15 && m == 7) u = 0x7fc00000u;
  else if (e == 0) {
    f = (float)m * 0x1p-9f;
    return (c & 0x80) ? -f : f;
  } else u = ((e + 120u) << 23) | (m << 20);
  memcpy(&f, &u, 4);
  return (c & 0x80) ? -f : f;
}
/* Load/store one element of dtype at p as float. */
static inline float sta_load_f32(const void *p, sta_dtype dt) {
  switch (dt) {
  case STA_F32: return *(const float *)p;
  case STA_F16: return sta_f16_to_f32(*(const uint16_t *)p);
  case STA_F8E4M3: return sta_e4m3_to_f32(*(const uint8_t *)p);
  default: return sta_bf16_to_f32(*(const uint16_t *)p);
  }
}
static inline void sta_store_f32(void *p, sta_dtype dt, float v) {
  switch (dt) {
  case STA_F32: *(float *)p = v; break;
  case STA_F16: *(uint16_t *)p = sta_f32_to_f16(v); break;
  case STA_F8E4M3: *(uint8_t *)p = sta_f32_to_e4m3(v); break;
  default: *(uint16_t *)p = sta_f32_to_bf16(v); break;
  }
}

/* ---- the counter-based normal generator --------------------------------- */

/* Normal draws 2p and 2p+1 of stream seed come from one pair of splitmix64
** hashes by Box-Muller.  The one body below runs on the host and on the
** device (kernels/ops_elementwise.cu), so a seed gives the same bits everywhere: no
** libm (log, sin and cos are polynomials here), only integer hashing and
** IEEE operations rounded once each.  The sta_d* helpers keep compilers
** from contracting a*b+c into an fma on one side only (nvcc would; clang
** would inside one expression).  STA_HD (static inline on the host,
** __host__ __device__ under nvcc) comes from mask.h. */
#if defined(__CUDA_ARCH__)
STA_HD double sta_dadd(double a, double b) { return __dadd_rn(a, b); }
STA_HD double sta_dmul(double a, double b) { return __dmul_rn(a, b); }
STA_HD double sta_ddiv(double a, double b) { return __ddiv_rn(a, b); }
STA_HD double sta_dfma(double a, double b, double c) { return __fma_rn(a, b, c); }
STA_HD double sta_dsqrt(double a) { return __dsqrt_rn(a); }
STA_HD float sta_fadd(float a, float b) { return __fadd_rn(a, b); }
STA_HD float sta_fmul(float a, float b) { return __fmul_rn(a, b); }
STA_HD float sta_ffma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#else
STA_HD double sta_dadd(double a, double b) { return a + b; }
STA_HD double sta_dmul(double a, double b) { return a * b; }
STA_HD double sta_ddiv(double a, double b) { return a / b; }
STA_HD double sta_dfma(double a, double b, double c) { return fma(a, b, c); }
STA_HD double sta_dsqrt(double a) { return sqrt(a); }
STA_HD float sta_fadd(float a, float b) { return a + b; }
STA_HD float sta_fmul(float a, float b) { return a * b; }
STA_HD float sta_ffma(float a, float b, float c) { return fmaf(a, b, c); }
#endif

STA_HD uint64_t sta_splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* log(u), u in (0, 1]: u = m 2^e with m in [sqrt(1/2), sqrt(2)),
** log(m) = 2 atanh(s), s = (m-1)/(m+1), as a series in s^2 (|s| < 0.172,
** 12 terms: below double rounding); e ln2 in two parts. */
STA_HD double sta_rng_log(double u) {
  int e;
  double m = frexp(u, &e), s, z, p;
  if (m < 0x1.6a09e667f3bcdp-1) { m = sta_dmul(m, 2.0); e -= 1; }
  s = sta_ddiv(sta_dadd(m, -1.0), sta_dadd(m, 1.0));
  z = sta_dmul(s, s);
  p = 0x1.47ae147ae147bp-4;                   /* 2/25 */
  p = sta_dfma(p, z, 0x1.642c8590b2164p-4);   /* 2/23 */
  p = sta_dfma(p, z, 0x1.8618618618618p-4);   /* 2/21 */
  p = sta_dfma(p, z, 0x1.af286bca1af28p-4);   /* 2/19 */
  p = sta_dfma(p, z, 0x1.e1e1e1e1e1e1ep-4);   /* 2/17 */
  p = sta_dfma(p, z, 0x1.1111111111111p-3);   /* 2/15 */
  p = sta_dfma(p, z, 0x1.3b13b13b13b14p-3);   /* 2/13 */
  p = sta_dfma(p, z, 0x1.745d1745d1746p-3);   /* 2/11 */
  p = sta_dfma(p, z, 0x1.c71c71c71c71cp-3);   /* 2/9 */
  p = sta_dfma(p, z, 0x1.2492492492492p-2);   /* 2/7 */
  p = sta_dfma(p, z, 0x1.999999999999ap-2);   /* 2/5 */
  p = sta_dfma(p, z, 0x1.5555555555555p-1);   /* 2/3 */
  double lm = sta_dfma(sta_dmul(s, z), p, sta_dmul(s, 2.0));
  double de = (double)e;
  return sta_dfma(de, 0x1.62e42fee00000p-1, sta_dfma(de, 0x1.a39ef35793c76p-33, lm));
}

/* cos and sin of 2 pi k 2^-53 (k < 2^53): the nearest quarter turn q is
** taken in integers (exact), the rest |theta| <= pi/4 by Taylor series
** (to theta^19 and theta^20: below double rounding). */
STA_HD void sta_rng_sincos(uint64_t k, double *c, double *s) {
  uint64_t q = (k + ((uint64_t)1 << 49)) >> 51;
  double x = (double)((int64_t)k - (int64_t)(q << 51)) * 0x1.0p-53;
  double th = sta_dmul(x, 0x1.921fb54442d18p+2), z = sta_dmul(th, th), ps, pc;
  ps = -0x1.2f49b46814157p-57;                 /* -1/19! */
  ps = sta_dfma(ps, z, 0x1.952c77030ad4ap-49); /* 1/17! */
  ps = sta_dfma(ps, z, -0x1.ae7f3e733b81fp-41);
  ps = sta_dfma(ps, z, 0x1.6124613a86d09p-33);
  ps = sta_dfma(ps, z, -0x1.ae64567f544e4p-26);
  ps = sta_dfma(ps, z, 0x1.71de3a556c734p-19);
  ps = sta_dfma(ps, z, -0x1.a01a01a01a01ap-13);
  ps = sta_dfma(ps, z, 0x1.1111111111111p-7);
  ps = sta_dfma(ps, z, -0x1.5555555555555p-3); /* -1/3! */
  pc = 0x1.e542ba4020225p-62;                  /* 1/20! */
  pc = sta_dfma(pc, z, -0x1.6827863b97d97p-53); /* -1/18! */
  pc = sta_dfma(pc, z, 0x1.ae7f3e733b81fp-45);
  pc = sta_dfma(pc, z, -0x1.93974a8c07c9dp-37);
  pc = sta_dfma(pc, z, 0x1.1eed8eff8d898p-29);
  pc = sta_dfma(pc, z, -0x1.27e4fb7789f5cp-22);
  pc = sta_dfma(pc, z, 0x1.a01a01a01a01ap-16);
  pc = sta_dfma(pc, z, -0x1.6c16c16c16c17p-10);
  pc = sta_dfma(pc, z, 0x1.5555555555555p-5);
  pc = sta_dfma(pc, z, -0.5);                  /* -1/2! */
  double sn = sta_dfma(sta_dmul(th, z), ps, th), cs = sta_dfma(z, pc, 1.0);
  switch (q & 3) {
  case 0: *c = cs; *s = sn; break;
  case 1: *c = -sn; *s = cs; break;
  case 2: *c = -cs; *s = -sn; break;
  default: *c = sn; *s = -cs; break;
  }
}

/* Normal draws 2*pair and 2*pair + 1 of stream seed. */
STA_HD void sta_randn_pair(uint64_t seed, uint64_t pair, double *even,
                           double *odd) {
  uint64_t base = sta_splitmix64(seed) ^ (pair * 0xd1b54a32d192ed03ull);
  uint64_t h1 = sta_splitmix64(base), h2 = sta_splitmix64(base ^ 0x8cb92ba72f3d8dd7ull);
  double u1 = ((double)(h1 >> 11) + 1.0) * 0x1.0p-53; /* (0, 1] */
  double r = sta_dsqrt(sta_dmul(-2.0, sta_rng_log(u1))), c, s;
  sta_rng_sincos(h2 >> 11, &c, &s);
  *even = sta_dmul(r, c);
  *odd = sta_dmul(r, s);
}

/* The stored value of a draw: mean + std * g, rounded once to float. */
STA_HD float sta_randn_value(double g, double mean, double std) {
  return (float)sta_dadd(mean, sta_dmul(std, g));
}

/* Normal draw number i of stream seed (sta_randn_pair; core/cpu_ops.c). */
double sta_randn_at(uint64_t seed, uint64_t i);

/* ---- FastVideo's tiled order (sta.h, sta_order; geometry.c) ----------- */

/* The tiled row of untiled video index x. */
int64_t sta_tiled_row(const int32_t canvas[3], const int32_t tile[3], const int32_t grid[3],
                      int64_t x);
/* Its inverse (the rule, host and device): the untiled video index
** (t*H + h)*W + w of row j < NT*NH*NW*tile volume of FastVideo's tiled
** order, or -1 for a padding row. */
STA_HD int64_t sta_tiled_token(const int32_t canvas[3], const int32_t tile[3],
                               const int32_t grid[3], int64_t j) {
  int64_t tv = (int64_t)tile[0] * tile[1] * tile[2];
  int64_t id = j / tv, in = j % tv;
  int64_t it = id / ((int64_t)grid[1] * grid[2]), ih = (id / grid[2]) % grid[1], iw = id % grid[2];
  int64_t lt = in / ((int64_t)tile[1] * tile[2]), lh = (in / tile[2]) % tile[1], lw = in % tile[2];
  int64_t t = it * tile[0] + lt, h = ih * tile[1] + lh, w = iw * tile[2] + lw;
  if (t >= canvas[0] || h >= canvas[1] || w >= canvas[2]) return -1;
  return (t * canvas[1] + h) * canvas[2] + w;
}

/* ---- files (fileio.c) ------------------------------------------------------ */

/* Whole file into a NUL-terminated sta_malloc buffer; errors (STA_ERR_IO)
** read "<what>: cannot open \"<path>\": <reason>". */
sta_status sta_read_text_file(const char *path, const char *what, char **data,
                              size_t *len);
/* An output file written atomically: open makes a temporary file in the
** target's directory; write appends (the first error is kept); commit
** fsyncs it and renames it over the target; abort (or a failed commit)
** removes the temporary file and nothing else.  A target that exists and
** is not a regular file is written in place, never removed; a directory is
** refused.  Errors: STA_ERR_IO "<label>: cannot open for writing: <why>",
** "<label>: write failed: <why>". */
typedef struct sta_outfile {
  int fd, dirfd, direct, err;
  char *target, *tmp;
  const char *label;
} sta_outfile;
sta_status sta_out_open(sta_outfile *f, const char *path, const char *label);
void sta_out_write(sta_outfile *f, const void *data, size_t n);
sta_status sta_out_commit(sta_outfile *f);
void sta_out_abort(sta_outfile *f);
/* The .npy and .safetensors writers into an open sta_outfile (what
** sta_npy_save and sta_safetensors_save write; the caller commits or
** aborts f).  keep: NULL, or an open .safetensors file whose tensors not
** among names are copied in as they are (dtypes sta does not read
** included), with its __metadata__: a rewrite of an input file that keeps
** what it held.  Nothing is written when the arguments are refused. */
sta_status sta_npy_write(sta_outfile *f, const sta_tensor *t);
sta_status sta_safetensors_write(sta_outfile *f, int32_t n, const char *const *names,
                                 const sta_tensor *const *tensors,
                                 const sta_safetensors *keep);
/* Remove every temporary file of an sta_outfile open now: async-signal-safe,
** for a program's SIGINT/SIGTERM handler (sta-run) before it exits. */
void sta_out_remove_pending(void);
/* open, write, commit. */
sta_status sta_write_text_file(const char *path, const char *label, const void *data,
                               size_t len);

/* ---- text forms (parse.c) ------------------------------------------------- */

/* A triple "T,H,W" or "TxHxW" of integers in lo..hi into out; on error
** STA_ERR_ARGUMENT "<what>: '<s>' is not T,H,W or TxHxW (...)", out
** unchanged. */
sta_status sta_parse_triple(const char *s, const char *what, int32_t lo, int32_t hi,
                            int32_t out[3]);
/* A window or a list of them: "3,3,3:1,5,7" or "3x3x3,1x5x7" ("3x3x3:1x5x7"
** too), each integer 1..2^20, at most max_n windows: *out (3 * *n ints,
** sta_malloc: free()) and *n; on error STA_ERR_ARGUMENT naming what. */
sta_status sta_parse_windows(const char *s, const char *what, int32_t max_n, int32_t **out,
                             int32_t *n);

/* ---- JSON (json.c) ------------------------------------------------------- */

/* Every JSON reader's parse: len bytes of text as one JSON value (cJSON's
** tree into *root, cJSON_Delete it).  Refused (STA_ERR_FORMAT, messages
** prefixed "<what>: "): malformed JSON ("malformed JSON at byte N"),
** anything but whitespace after the value ("unexpected text after the
** JSON object at byte N"; trailing NUL bytes allowed when trailing_nul),
** a NUL in a string, raw or \u0000 ("NUL character in a string at byte N
** ..."; cJSON would cut a key there).  STA_ERR_NOMEM when cJSON ran out of
** memory. */
struct cJSON;
sta_status sta_json_parse(const char *text, size_t len, const char *what, int trailing_nul,
                          struct cJSON **root);

/* ---- runtime (strategy.c) ----------------------------------------------- */

/* 1 when s has an entry for step. */
int32_t sta_strategy_has_step(const sta_strategy *s, int32_t step);
/* One more reference for a holder; its *_destroy drops it. */
void sta_strategy_retain(const sta_strategy *s);
void sta_comm_retain(sta_comm *c);


#ifdef __cplusplus
}
#endif

#include "backend.h"
#include "fp8_internal.h"
#include "vsa_internal.h"

#endif
