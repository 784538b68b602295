/*
** backend.h -- the attention problem resolved (sta_attn_params, the masks'
** resolution) and the backend table behind which the CPU (core/cpu_*.c)
** and CUDA (kernels/) implementations sit; device accounting, test-only
** kernel setters.  Part of internal.h (which includes it); not installed.
*/
#ifndef STA_BACKEND_H
#define STA_BACKEND_H

#ifndef STA_INTERNAL_H
#error "include internal.h: it includes this header after what this one needs"
#endif

#ifdef __cplusplus
extern "C" {
#endif

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
  int32_t lists_sorted; /* 1: each list's first num entries ascending (VSA's
                           selection writes them so): the CUDA forward need
                           not sort a copy (sta_cuda_set_bsa_sort_test) */
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
  /* Video Sparse Attention's pieces around the fine branch (sta_vsa_params:
  ** vsa_internal.h; core/vsa.c drives them, the CPU's are core/vsa_cpu.c's,
  ** called directly).  NULL: VSA is not on this backend. */
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
  /* Timing events (the benchmarks' marks, sta_vsa_mark_test): an event that
  ** keeps its time (record and destroy as above), and the ms between two
  ** recorded ones, waiting for the later.  NULL: no timing here. */
  sta_status (*timer_create)(void **event);
  sta_status (*event_elapsed)(void *start, void *end, double *ms);
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
/* For tests and benchmarks only, like the above (the GPU tests' mains take
** STA_TEST_BSA_PAIRS, bench_blocks.py --pairs calls it through ctypes):
** the block-sparse forward of mask BLOCKS at block_rows 64 where its loads
** are by TMA: 0 (the default) the paired kernel (kernels/README.md: one CTA
** serves query blocks 2p and 2p + 1 and loads the union of their lists
** once) at D 128, the split kernel at D 64 (where the paired one measured
** slower); 1 the paired kernel at both; 2 the same with the pre-pass's
** path for large Mk (ranks, kernels/bsa_pairs.cu) at any Mk; -1 the split
** kernel always. */
void sta_cuda_set_bsa_pairs_test(int32_t on);
int32_t sta_cuda_bsa_pairs_test(void);
/* For tests and benchmarks only (bench_blocks.py --pairs --sort): the
** order in which the block-sparse forward's kernels that walk a list in
** its own order (all but the paired one, which walks the union ascending)
** see it.  0 (the default): a copy sorted ascending on the device first
** (kernels/bsa_pairs.cu), unless the caller's lists are known ascending
** (sta_attn_params.lists_sorted: VSA's); -1 the lists as the caller
** ordered them; 1 sorted even where known ascending.  Other values are
** taken as 0. */
void sta_cuda_set_bsa_sort_test(int32_t on);
int32_t sta_cuda_bsa_sort_test(void);

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

#ifdef __cplusplus
}
#endif

#endif
