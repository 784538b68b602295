/*
** internal.h -- what the core's modules share; not installed.
** Plain C11, no CUDA headers: kernels/ includes this for the parameter
** struct and the backend table.
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

/* Load/store one element of dtype at p as float (below, after e4m3). */
static inline float sta_load_f32(const void *p, sta_dtype dt);
static inline void sta_store_f32(void *p, sta_dtype dt, float v);

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
  int64_t video_len, text_len; /* V tokens, valid text tokens */
  int32_t tiled;          /* rows in FastVideo's tiled order (sta_order) */
  int64_t video_rows;     /* rows of the video: V, or the padded tiles'
                             NT*NH*NW*tile volume (tiled); text follows */
  const int32_t *windows; /* heads * 3 */
  float scale;
  int32_t fast_softmax;   /* desc->softmax == STA_SOFTMAX_FAST */
  int32_t precision;      /* desc->precision (sta_precision) */
  int32_t deterministic;  /* backward: bit-identical run to run */
  /* The backward (sta_attention_backward) reads o and lse (the forward's)
  ** and dout, and writes dq, dk, dv; strides in elements as above. */
  const void *dout;
  void *dq, *dk, *dv;
  int64_t do_sb, do_ss, do_sh;
  int64_t dq_sb, dq_ss, dq_sh;
  int64_t dk_sb, dk_ss, dk_sh;
  int64_t dv_sb, dv_ss, dv_sh;
  /* The mask (sta.h, sta_mask_kind), resolved and validated by
  ** sta_attn_resolve (core/mask.c; read them with mask.h's accessors).
  ** WINDOW: windows above, the rest 0 / NULL.  BLOCKS and
  ** WINDOW_OR_BLOCKS: the lists on the tensors' device, contiguous;
  ** query block m of (b, h) sees idx[((b*heads + h)*q_blocks + m)*list_len
  ** + i] for i < num[(b*heads + h)*q_blocks + m]; block n's valid rows
  ** are [n*block_rows, n*block_rows + size) (sizes NULL: whole blocks;
  ** q_sizes is kv_sizes when the call gave none and Mq == Mk).  BLOCKS
  ** has no geometry (canvas, grid, video_len, text_len 0; windows NULL);
  ** WINDOW_OR_BLOCKS has the window's (tiled, text_len 0).  kv_len: the
  ** rows of k and v (seq_len, except that BLOCKS lets q have its own). */
  int32_t mask;                      /* sta_mask_kind */
  int32_t block_rows;                /* rows per block */
  int64_t kv_len;                    /* rows of k, v */
  int64_t q_blocks, kv_blocks;       /* Mq, Mk */
  int64_t list_len;                  /* L: idx entries per query block */
  const int32_t *num, *idx;          /* [B][heads][Mq], [B][heads][Mq][L] */
  const int32_t *q_sizes, *kv_sizes; /* [Mq], [Mk]; NULL: whole blocks */
} sta_attn_params;

/* The block lists of desc (mask BLOCKS or WINDOW_OR_BLOCKS, checked to be
** one of them) for q: every check of sta.h's sta_block_list and STA.md
** section 12 (the backend runs the kind; no fp8; block_rows; whole blocks;
** the tensors' dtype, shape, contiguity and device; the union's tiled
** geometry without text), then the lists' contents (sta_mask_check_lists);
** fills p's mask fields.  p: resolved but for them (seq_len, kv_len,
** batch, heads, tile, grid, tiled, video_rows). */
sta_status sta_mask_resolve(const sta_attention_desc *desc, const sta_tensor *q,
                            sta_attn_params *p);
/* The contents of p's lists on device dev: sizes in 1..block_rows, num in
** 0..L, indices in [0, Mk) and none twice in one list; STA_ERR_ARGUMENT
** naming (b, h, m), the entry and the value.  The seam of a device check:
** a backend's check_lists runs where it is set; otherwise the lists are
** copied to the host and checked there. */
sta_status sta_mask_check_lists(const sta_attn_params *p, sta_device dev);
/* sta_attention_flops of a block mask: 4 D per (valid query row, valid key
** row of a block it sees); 0 when the lists do not fit (batch, heads,
** seq_len) or hold a bad entry.  Device lists are copied to the host. */
double sta_mask_flops(const sta_attention_desc *desc, int64_t batch, int64_t seq_len,
                      int64_t heads, int64_t head_dim);

/* FastVideo's tiled order (sta.h, sta_order): the tiled row of untiled
** video index x (sta_tiled_token, its inverse, is below with the fp8
** quantizer, which runs it on the device too). */
int64_t sta_tiled_row(const int32_t canvas[3], const int32_t tile[3], const int32_t grid[3],
                      int64_t x);

/* ---- backends ----------------------------------------------------------- */

struct sta_vsa_params;
struct sta_vsa_cubes;

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
  /* out = a*x + b*y in float32 (y NULL: out = a*x); operands checked by
  ** core/ops.c (one shape, this device; out is x, y or disjoint). */
  sta_status (*lincomb)(sta_tensor *out, float a, const sta_tensor *x,
                        float b, const sta_tensor *y);
  /* Reduce t on the device; only *out crosses to the host. */
  sta_status (*stats)(const sta_tensor *t, sta_stats *out);
  /* The forward at STA_PRECISION_FP8 (params' precision). */
  sta_status (*attention_fp8)(const sta_attn_params *p);
  /* The block masks (sta_mask_kind) attention and attention_backward run:
  ** bit 1 << kind; 0 (the default), the window only.  Every other kind is
  ** refused in one place, sta_mask_resolve (STA_ERR_UNSUPPORTED). */
  int32_t masks;
  /* Check resolved block lists where they live, with sta_mask_check_lists'
  ** messages; NULL: they are copied to the host and checked there. */
  sta_status (*check_lists)(const sta_attn_params *p);
  /* Video Sparse Attention's pieces around the fine branch (sta_vsa_params
  ** below; core/vsa.c drives them, the CPU's are core/vsa_cpu.c's, called
  ** directly).  NULL: VSA is not on this backend. */
  sta_status (*vsa_means)(const struct sta_vsa_params *p);
  sta_status (*vsa_coarse)(const struct sta_vsa_params *p);
  sta_status (*vsa_combine)(const struct sta_vsa_params *p);
  sta_status (*vsa_backward_prep)(const struct sta_vsa_params *p);
  sta_status (*vsa_backward_coarse)(const struct sta_vsa_params *p);
  /* Rows between the untiled and the cube order (sta_tensor_to_cubes),
  ** operands checked by core/vsa_cubes.c. */
  sta_status (*vsa_reorder)(sta_tensor *dst, const sta_tensor *src,
                            const struct sta_vsa_cubes *c, sta_layout layout, int32_t to_cubes);
  /* Scratch memory ordered with this thread's work (CUDA: cudaMallocAsync
  ** on its stream, legal in a graph capture). */
  sta_status (*workspace)(void **p, size_t nbytes);
  void (*workspace_free)(void *p);
  /* 1 while this thread's stream is being captured into a CUDA graph (no
  ** read-back then). */
  int32_t (*capturing)(void);
  /* The rest serves the sequence-parallel layer (core/dist/); NULL where
  ** the backend has no such thing (the CPU).  Devices: how many this
  ** process sees (0 when none answers), and the calling thread's choice
  ** among them (before anything else touches the device). */
  int32_t (*device_count)(void);
  sta_status (*set_device)(int32_t device);
  /* Streams and events: opaque handles for work that overlaps (a stream
  ** that does not wait for the default one); record an event on a
  ** stream, make a stream wait for an event. */
  sta_status (*stream_create)(void **stream);
  void (*stream_destroy)(void *stream);
  sta_status (*event_create)(void **event);
  void (*event_destroy)(void *event);
  sta_status (*event_record)(void *event, void *stream);
  sta_status (*stream_wait)(void *stream, void *event);
  /* height rows of width bytes, dpitch and spitch bytes apart (each >=
  ** width), between memory of this device, queued on this thread's
  ** stream. */
  sta_status (*copy_2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height);
  /* dst = x8 * scale (sta_attention_forward_fp8's operands, dequantized
  ** where they are): x8 e4m3 and dst f32 of the sizes and element strides
  ** bx, bd (data pointers at element 0); sc [B, heads, S] (per_row) or
  ** [B, heads, D], element strides sc_st; NULL where attention_fp8 is. */
  sta_status (*fp8_dequantize)(float *dst, const sta_bshd *bd, const uint8_t *x8,
                               const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                               int per_row);
} sta_backend_ops;

/* STA_ERR_BACKEND "st attn not supported (<why>)" for a device whose
** backend is not available: STA.md section 9's text, then the probe's
** reason (not compiled in, no driver, no device, another architecture). */
sta_status sta_backend_missing(sta_device device);
/* The backend table for a device, NULL when not compiled in. */
const sta_backend_ops *sta_backend_get(sta_device device);
/* Compiled in when STA_WITH_CUDA is defined (kernels/cuda_backend.cu). */
const sta_backend_ops *sta_cuda_backend(void);

/* Device byte accounting, called by the tensor module. */
void sta_device_account(int64_t delta);
/* Count bytes of tensor data a backend moved between host and device
** (sta_transfer_bytes). */
void sta_transfer_account(int64_t bytes);
/* Record what this thread's CUDA forward just launched, for
** sta_cuda_last_launch (printf-style, cut at 511 bytes). */
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
void sta_cuda_note_launch(const char *fmt, ...);
/* For tests only (spec/test_gpu_attention.c), no user setting: the K/V
** bytes of a work item from which this thread's persistent CUDA forwards
** hold it at the wave gate (kernels/tile_scheduler.cuh); 0 (the default)
** WAVE_GATE_BYTES there, -1 no gate, small values gate small geometries. */
void sta_cuda_set_wave_gate_test(int64_t bytes);
int64_t sta_cuda_wave_gate_test(void);
/* For tests and benchmarks only, no user setting (the library reads no
** environment variable to choose a kernel; the GPU tests' mains take
** STA_TEST_CUDA_VARIANT, STA_TEST_NO_TMA and STA_TEST_NO_TMA_Q, the
** benchmarks call these through ctypes).  Process-wide, so that every
** thread of a caller takes them (torch runs a backward on its own thread).
** variant: the CUDA forward's kernel (kernels/launch_fwd.cuh, run_fwd): 0
** the default, 2 one CTA per work item (what the first launch under a
** CUDA-graph capture runs), 9 the 128 x 128 kernel; any other value is 0.
** tma: bits STA_TEST_NO_TMA (forward and backward load everything by the
** cp.async gather) and STA_TEST_NO_TMA_Q (the forward gathers Q); 0 the
** default. */
enum { STA_TEST_NO_TMA = 1, STA_TEST_NO_TMA_Q = 2 };
void sta_cuda_set_variant_test(int32_t variant);
int32_t sta_cuda_variant_test(void);
void sta_cuda_set_tma_test(int32_t flags);
int32_t sta_cuda_tma_test(void);

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
#else
STA_HD double sta_dadd(double a, double b) { return a + b; }
STA_HD double sta_dmul(double a, double b) { return a * b; }
STA_HD double sta_ddiv(double a, double b) { return a / b; }
STA_HD double sta_dfma(double a, double b, double c) { return fma(a, b, c); }
STA_HD double sta_dsqrt(double a) { return sqrt(a); }
STA_HD float sta_fadd(float a, float b) { return a + b; }
STA_HD float sta_fmul(float a, float b) { return a * b; }
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

/* ---- FastVideo's tiled order; the fp8 forward's operands -------------- */

/* The untiled video index (t*H + h)*W + w of row j < NT*NH*NW*tile volume
** of FastVideo's tiled order, or -1 for a padding row. */
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
/* int8 code of f: round to nearest even, saturated to +-127, NaN to 0. */
STA_HD int8_t sta_f32_to_i8(float f) {
  if (!(f == f)) return 0;
  if (f >= 127.0f) return 127;
  if (f <= -127.0f) return -127;
  return (int8_t)sta_fadd(sta_fadd(f, 12582912.0f), -12582912.0f); /* nearest even */
}
/* max(m, |x|), NaN once either is NaN: the quantizer's amax of a row on
** the host and the device (order-free, so a warp may reduce it in any
** order): a non-finite element makes its own row's scale NaN or Inf. */
STA_HD float sta_amax_nan(float m, float x) {
  float a = fabsf(x);
  return a > m || a != a ? a : m;
}
/* max(m, |x|) over the finite x only: the per-channel amax (q, v) and the
** keys' max / min, which every row of a head shares, so that a NaN or Inf
** element moves no other row (order-free as sta_amax_nan). */
STA_HD float sta_amax_finite(float m, float x) {
  float a = fabsf(x);
  return a > m && a < INFINITY ? a : m;
}
/* x where finite, else 0: the keys' channel sums (k_mean). */
STA_HD float sta_finite_or0(float x) { return fabsf(x) < INFINITY ? x : 0.0f; }
/* 2^e, |e| <= 63, as a float: x * sta_pow2f(e) is exact. */
STA_HD float sta_pow2f(int e) {
  uint32_t u = (uint32_t)(e + 127) << 23;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
/* qmax / amax, 0 when amax is not > 0 (NaN included). */
STA_HD float sta_fp8_inv(float qmax, float amax) { return amax > 0.0f ? qmax / amax : 0.0f; }
/* The e4m3 code of v (V's element, inv = 448 / the channel's amax): the
** NaN code for a non-finite v (e4m3 has no Inf; saturating would hide it). */
STA_HD uint8_t sta_fp8_vcode(float v, float inv) {
  return fabsf(v) < INFINITY ? sta_f32_to_e4m3(sta_fmul(v, inv)) : (uint8_t)0x7f;
}
/* The channel exponent of sta_fp8_ops.eq from the channel's amax of q
** (qam) and of the smoothed k (kam). */
STA_HD int sta_fp8_exponent(float qam, float kam) {
  if (!(qam > 0.0f && kam > 0.0f)) return 0;
  float ratio = kam / qam;
  if (!(ratio > 0.0f && ratio < INFINITY)) return 0;
  int ex;
  (void)frexpf(ratio, &ex);
  ex /= 2;
  return ex > 63 ? 63 : ex < -63 ? -63 : ex;
}

/* The fp8 forward's operands, as its quantize pre-pass writes them (the
** scheme: sta.h, sta_precision; research/fp8_sim.py).  Rows in FastVideo's
** tiled order, partial tiles padded (the kernel loads every block by TMA
** as rows), text after: `rows` = NT*NH*NW*tile volume + the input's text
** rows.  Per (batch, head), in this order:
**   k_mean[D]   the mean of k over the keys (video tokens, valid text):
**               sums in double over the rows' chunks of STA_FP8_CHUNK in
**               row order, chunk sums in order, / count, to float; a
**               non-finite element adds 0 (any offset leaves the softmax
**               as it is: one bad key moves no other row)
**   eq[D]       channel exponents e: q * 2^e, k * 2^-e (q . k unchanged):
**               the frexp exponent of f32(amax k' / amax q) halved toward
**               zero (amax over the finite elements: k' from the keys'
**               finite max and min less k_mean, q over every query row),
**               |e| <= 63; 0 where either amax is 0 or the ratio not finite
**   q8, k8 [rows][D]  int8: x' = q * 2^e (or k' * 2^-e, k' = f32(k -
**               k_mean)); per row amax (NaN if any is NaN: sta_amax_nan),
**               inv = 127 / amax (0 when amax is 0 or NaN), code =
**               rint(f32(x' * inv)), scale = amax / 127 (a row with a NaN
**               or Inf gets a NaN or Inf scale: only the rows that see it
**               come out NaN); k8's (and k_scale's) row of key r is
**               sta_fp8_kslot(r, rows)
**   q_scale, k_scale [rows]; q_bias[rows] = q . k_mean (double, channel
**               order, to float): lse = ln(l) + m ln 2 + scale * q_bias
**   v_scale[D]  the finite amax of v over the keys / 448
**   v8 [D][rows]  e4m3 of y = f32(v * (448 / amax)) (inv 0 when amax is
**               0), transposed (K-major for wgmma's 8-bit B); a non-finite
**               v the NaN code 0x7f (sta_fp8_vcode)
** Padding rows are all 0 (codes, scales, bias); rows that are never keys
** (text past text_len) have k8 = v8 = 0 and k_scale 0.
** The attention over them (cpu_fp8.c, kernels/mainloop_fp8.cuh): s = (q8 .
** k8) q_scale k_scale * scale log2(e), key blocks of STA_FP8_BK rows in the
** kernel's walk; m the running maximum after the key's block; P = exp2(s -
** m), its row sum l; P8 = e4m3(P * STA_FP8_PSCALE); out = (sum P8 V8) /
** (STA_FP8_PSCALE l) * v_scale, every block's sums rescaled by 2^(its m -
** the next m) as the maximum moves. */
#define STA_FP8_PSCALE 448.0f
#define STA_FP8_BK 128
#define STA_FP8_CHUNK 1024
typedef struct sta_fp8_geom {
  int32_t canvas[3], tile[3], grid[3];
  int32_t tiled;          /* the input's rows are in the tiled order */
  int64_t video_len;      /* V */
  int64_t video_rows;     /* the input's video rows */
  int64_t tiled_video;    /* NT*NH*NW*tile volume */
  int64_t rows;           /* tiled_video + the input's text rows */
  int64_t keys_end;       /* tiled_video + text_len: rows past it are no keys */
} sta_fp8_geom;
typedef struct sta_fp8_ops {
  int64_t batch, heads, rows, head_dim;
  int8_t *q8, *k8;        /* [B][H][rows][D]; k8 and k_scale rows in sta_fp8_kslot's order */
  uint8_t *v8;            /* [B][H][D][rows] */
  float *q_scale, *k_scale, *q_bias; /* [B][H][rows] */
  float *k_mean, *v_scale; /* [B][H][D] */
  int8_t *eq;             /* [B][H][D] */
} sta_fp8_ops;

/* Input row of quantized row r, or -1 for a padding row. */
STA_HD int64_t sta_fp8_source(const sta_fp8_geom *g, int64_t r) {
  if (r >= g->tiled_video) return r - g->tiled_video + g->video_rows;
  if (g->tiled) return sta_tiled_token(g->canvas, g->tile, g->grid, r) < 0 ? -1 : r;
  return sta_tiled_token(g->canvas, g->tile, g->grid, r);
}
/* The kernel's key order (kernels/producer_fp8.cuh): in each 16 keys of a
** block, S accumulator column c holds key sta_fp8_col_key(c), the k order
** of the thread's 8-bit A fragment of P.  The pre-pass stores k8 and
** k_scale so (TMA copies blocks that start on a 16-row boundary as they
** are): key r at row sta_fp8_kslot(r, rows), the inverse permutation
** within each whole 16 rows, the last partial 16 in order. */
STA_HD int sta_fp8_col_key(int c) {
  const int cc = c & 15;
  return (c & ~15) + 4 * ((cc >> 1) & 3) + 2 * (cc >> 3) + (cc & 1);
}
STA_HD int64_t sta_fp8_kslot(int64_t r, int64_t rows) {
  const int64_t k = r & 15;
  if (r >= (rows & ~(int64_t)15)) return r;
  return (r & ~(int64_t)15) + 8 * ((k >> 1) & 1) + 4 * (k >> 3) + 2 * ((k >> 2) & 1) + (k & 1);
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

/* The fp8 geometry of resolved params. */
void sta_fp8_geom_init(sta_fp8_geom *g, const sta_attn_params *p);
/* Host buffers for o (one block, freed by sta_fp8_ops_free; o zeroed
** first, so freeing a failed alloc is fine).  STA_ERR_NOMEM on failure. */
sta_status sta_fp8_ops_alloc(sta_fp8_ops *o, int64_t batch, int64_t heads, int64_t rows,
                             int64_t head_dim);
void sta_fp8_ops_free(sta_fp8_ops *o);
/* The pre-pass on the host (p's q, k, v on the host, any dtype). */
sta_status sta_cpu_fp8_quantize(const sta_attn_params *p, sta_fp8_ops *o);
/* The FP8 forward on the host: the pre-pass, then every query row against
** its keys in double (sta.h, sta_precision). */
sta_status sta_cpu_fp8_attention(const sta_attn_params *p);
/* The backend table's fp8_dequantize on the host. */
sta_status sta_cpu_fp8_dequantize(float *dst, const sta_bshd *bd, const uint8_t *x8,
                                  const sta_bshd *bx, const float *sc, const int64_t sc_st[3],
                                  int per_row);
#if defined(STA_WITH_CUDA) || defined(__CUDACC__)
/* The pre-pass on the device (kernels/fp8_quant.cu): o's buffers device
** memory of sta_fp8_ops_alloc's sizes; on this thread's stream. */
sta_status sta_cuda_fp8_quantize(const sta_attn_params *p, const sta_fp8_ops *o);
/* For tests only (spec/test_gpu_fp8.c), no user setting: 1 (the default)
** lets this thread's fp8 forwards take the bandwidth pre-pass where it
** applies (kernels/fp8_prepass.cu), 0 forces the portable one
** (fp8_quant.cu's kernels); the two write the same bits. */
void sta_cuda_set_fp8_prepass_test(int fast);
#endif

/* ---- Video Sparse Attention (core/vsa*.c, kernels/vsa_*.cu) ------------ */

/* Cube order (STA.md section 12): canvas cut by cube, grid the cube grid
** (ceil per axis), vol the cube volume. */
typedef struct sta_vsa_cubes {
  int32_t canvas[3], cube[3], grid[3];
  int64_t count, vol;
} sta_vsa_cubes;
/* Valid tokens of cube c. */
STA_HD int64_t sta_cube_size(const sta_vsa_cubes *g, int64_t c) {
  const int64_t it = c / ((int64_t)g->grid[1] * g->grid[2]), ih = (c / g->grid[2]) % g->grid[1],
                iw = c % g->grid[2];
  const int64_t a = g->canvas[0] - it * g->cube[0], b = g->canvas[1] - ih * g->cube[1],
                e = g->canvas[2] - iw * g->cube[2];
  return (a < g->cube[0] ? a : g->cube[0]) * (b < g->cube[1] ? b : g->cube[1]) *
         (e < g->cube[2] ? e : g->cube[2]);
}
/* The untiled video index (t*H + h)*W + w of row j of the cube order, or
** -1 for a padding row (the rule; host and device). */
STA_HD int64_t sta_cube_token(const sta_vsa_cubes *g, int64_t j) {
  const int64_t c = j / g->vol, in = j % g->vol;
  const int64_t it = c / ((int64_t)g->grid[1] * g->grid[2]), ih = (c / g->grid[2]) % g->grid[1],
                iw = c % g->grid[2];
  const int64_t a = g->canvas[0] - it * g->cube[0], b = g->canvas[1] - ih * g->cube[1],
                e = g->canvas[2] - iw * g->cube[2];
  const int64_t st = a < g->cube[0] ? a : g->cube[0], sh = b < g->cube[1] ? b : g->cube[1],
                sw = e < g->cube[2] ? e : g->cube[2];
  if (in >= st * sh * sw) return -1;
  const int64_t lt = in / (sh * sw), lh = (in / sw) % sh, lw = in % sw;
  return ((it * g->cube[0] + lt) * g->canvas[1] + ih * g->cube[1] + lh) * g->canvas[2] +
         iw * g->cube[2] + lw;
}
/* The selection's order on a score (STA.md section 12): a larger key is
** chosen first; -0 and +0 one key, NaN above everything.  Equal keys go
** to the lower index. */
STA_HD uint32_t sta_vsa_key(float x) {
  uint32_t u;
  x = x + 0.0f; /* -0 -> +0 */
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A VSA call resolved by core/vsa.c.  f: the fine branch (mask
** STA_MASK_BLOCKS, block_rows, q_blocks Mq, kv_blocks Mk, list_len topk,
** kv_len Sk, seq_len Sq; q, k, v; o and lse: the forward's out and lse,
** the backward's out_s scratch and lse; num, idx: the workspace's;
** q_sizes, kv_sizes: on the tensors' device, NULL for whole cubes; dout,
** dq, dk, dv in the backward).  The workspace's f32 arrays are
** contiguous: means and their gradients [B][heads][M][D], out_c
** [B][heads][Mq][D], lse_c [B][heads][Mq], the coarse matrix [B][heads][Mq]
** [Mk] (vsa_coarse leaves the probabilities A there), idx [B][heads][Mq]
** [topk], num [B][heads][Mq]. */
typedef struct sta_vsa_params {
  sta_attn_params f;
  const void *gate;          /* NULL: 1 */
  int64_t g_sb, g_ss, g_sh;
  const void *out;           /* backward: the forward's out */
  int64_t out_sb, out_ss, out_sh;
  void *dgate;               /* backward; NULL: not wanted */
  int64_t dg_sb, dg_ss, dg_sh;
  int32_t topk;
  float *qc, *kc, *vc, *oc, *lsec, *sc;
  int32_t *idx, *num;
  float *gc;                 /* backward: G[m], the gradient of out_c */
  float *dqc, *dkc, *dvc;    /* backward: the means' gradients */
} sta_vsa_params;

/* The CPU's pieces (core/vsa_cpu.c; the backend entries' contracts):
** means: qc, kc, vc.  coarse: from the means, sc = A, lsec, oc, idx
** (ascending), num.  combine: f.o += gate * oc on valid rows, 0 on padding
** rows.  backward_prep: f.o = out - gate * oc (valid rows, else 0), dgate
** = dout * oc (valid rows, else 0), gc = sum of dout * gate over each
** query cube's valid rows.  backward_coarse: from gc, the means, oc and
** sc = A: dqc, dkc, dvc, each added / the cube's size to the valid rows of
** f.dq, f.dk, f.dv (sc is overwritten). */
sta_status sta_cpu_vsa_means(const sta_vsa_params *p);
sta_status sta_cpu_vsa_coarse(const sta_vsa_params *p);
sta_status sta_cpu_vsa_combine(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_prep(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_coarse(const sta_vsa_params *p);
sta_status sta_cpu_vsa_reorder(sta_tensor *dst, const sta_tensor *src, const sta_vsa_cubes *c,
                               sta_layout layout, int32_t to_cubes);
/* The brute force in double (core/vsa_reference.c): f.o, f.lse (NULL:
** not wanted) from q, k, v, gate; the backward's f.dq, f.dk, f.dv, dgate
** from q, k, v, gate, f.dout.  Workspace unused. */
sta_status sta_cpu_vsa_reference(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_reference(const sta_vsa_params *p);
/* STA_ERR_ARGUMENT "<wn>: shares memory with <rn> (the <what> writes ...)"
** when w and r overlap (NULL: fine). */
sta_status sta_vsa_no_alias(const char *what, const sta_tensor *w, const char *wn,
                            const sta_tensor *r, const char *rn);
/* Valid rows of query cube m and key cube n (sizes NULL: whole). */
static inline int64_t sta_vsa_qsize(const sta_vsa_params *p, int64_t m) {
  return p->f.q_sizes ? p->f.q_sizes[m] : p->f.block_rows;
}
static inline int64_t sta_vsa_kvsize(const sta_vsa_params *p, int64_t n) {
  return p->f.kv_sizes ? p->f.kv_sizes[n] : p->f.block_rows;
}
/* For benchmarks only (spec/vsa_bench.h), no user setting: timed marks.
** sta_vsa_mark_test records mark i (0..STA_VSA_MARKS-1) in the order of
** this thread's work on dev (CUDA: an event with timing on this thread's
** stream; the CPU: the clock); sta_vsa_elapsed_test waits for mark b and
** gives the ms from mark a to b.  While sta_vsa_set_marks_test's base is
** >= 0, this thread's sta_vsa_forward records marks base + 1.. after its
** checks and workspace, the means, the coarse branch and selection, the
** fine branch, the combine (sta_vsa_backward: ..., the coarse branch, the
** preparation, the fine backward, the coarse backward), the caller base +
** 0 before the call; -1 (the default): none.  The release frees this
** thread's events. */
enum { STA_VSA_MARKS = 128 };
sta_status sta_vsa_mark_test(sta_device dev, int32_t i);
sta_status sta_vsa_elapsed_test(sta_device dev, int32_t a, int32_t b, double *ms);
void sta_vsa_set_marks_test(int32_t base);
void sta_vsa_marks_release_test(void);
#if defined(STA_WITH_CUDA) || defined(__CUDACC__)
/* Their CUDA side (kernels/vsa_rows.cu). */
sta_status sta_cuda_vsa_mark(int32_t i);
sta_status sta_cuda_vsa_elapsed(int32_t a, int32_t b, float *ms);
void sta_cuda_vsa_marks_release(void);
#endif

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

#endif
