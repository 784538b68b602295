/*
** sta.h -- Sliding Tile Attention runtime, the one public header.
**
** The contract (tiling, windows, text tokens, strategies, contexts, search,
** error messages) is spec/STA.md.  Every call that can fail returns an
** sta_status; on failure a message naming the argument and the value is left
** for sta_last_error() (thread-local), and -- unless a function says
** otherwise -- nothing is changed: outputs, handles and the context stack are
** as they were.  The library never aborts, exits, prints or longjmps.
**
** Ownership.  Every handle (sta_tensor, sta_safetensors, sta_strategy,
** sta_metadata, sta_forward_batch, sta_context, sta_layer, sta_comm,
** sta_sp_layer) comes from one call that gives the caller a reference, and
** one call drops it: *_destroy, sta_safetensors_close, sta_context_pop.
** What holds another object keeps it alive with a reference of its own:
**   a tensor view          its storage (views and bases in any order)
**   a context              its metadata and forward batch, until popped
**   a layer                its strategy, until replaced or destroyed
**   an SP layer            its communicator and its wrapped layer
**   sta_comm_loopback_run  every communicator, for the whole run
** so handles may be destroyed in any order: an object goes when its last
** holder lets go.  Pointers returned without a reference are borrowed and
** valid while the handle they came from lives: sta_context_metadata,
** sta_context_batch, sta_context_current, sta_sp_layer_base,
** sta_safetensors_name, sta_tensor_data.  A handle whose object is gone
** (or a pointer sta never made, or NULL) is refused without being touched:
** STA_ERR_ARGUMENT "<arg>: not a live sta_<kind> (released already, or not
** made by sta)"; functions that return no status return 0, -1 or NULL and
** leave that message.  Destroying NULL or a dead handle does nothing.
** (A dead handle's address can be handed out again to a new object of the
** same kind; until then every use is caught.)
**
** Keep preprocessor lines out of the declaration block between the
** STA_DECLS markers: lua/sta/ffi.lua feeds that block to ffi.cdef.
*/
#ifndef STA_H
#define STA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STA_VERSION_MAJOR 0
#define STA_VERSION_MINOR 1
#define STA_VERSION_PATCH 0

/* STA_DECLS_BEGIN */

/*
** {======================================================================
** Status codes and errors
** =======================================================================
** Codes are stable and grouped by hundreds; sta_status_group() maps a code
** to its group (100, 200, ...).
*/
typedef enum sta_status {
  STA_OK = 0,
  /* 1xx: the caller passed a bad argument */
  STA_ERR_ARGUMENT = 100,     /* generic bad argument */
  STA_ERR_SHAPE = 101,        /* tensor shape or stride */
  STA_ERR_DTYPE = 102,        /* tensor element type */
  STA_ERR_WINDOW = 103,       /* window, tile or canvas */
  STA_ERR_KEY = 104,          /* a (step, layer, head) a strategy lacks */
  /* 2xx: the runtime state does not allow the call */
  STA_ERR_STATE = 200,        /* no live context, pop out of order, ... */
  STA_ERR_NO_BATCH = 201,     /* "forward_batch cannot be None" */
  STA_ERR_NO_STRATEGY = 202,  /* "mask_strategy cannot be None ..." */
  STA_ERR_NO_STEP0 = 203,     /* "mask_strategy[0] cannot be None ..." */
  STA_ERR_STA_PARAM = 204,    /* "Invalid STA_param" */
  STA_ERR_CANCELLED = 205,    /* stopped by sta_cancel; outputs unchanged */
  /* 3xx: valid request the runtime cannot serve */
  STA_ERR_UNSUPPORTED = 300,
  STA_ERR_SEQ_LEN = 301,      /* "seq_len N not supported for STA" */
  STA_ERR_BACKEND = 302,      /* "st attn not supported" */
  /* 4xx: out of memory */
  STA_ERR_NOMEM = 400,        /* host memory */
  STA_ERR_DEVICE_NOMEM = 401, /* device memory */
  /* 5xx: the device (driver, runtime, kernel launch) failed */
  STA_ERR_DEVICE = 500,
  /* 6xx: files and the environment */
  STA_ERR_IO = 600,           /* open, read or write failed */
  STA_ERR_FORMAT = 601,       /* malformed or truncated file */
  STA_ERR_ENV = 602           /* "STA_ATTENTION_CONFIG is not set" */
} sta_status;

/* The message of the last failed call on this thread ("" if none). */
const char *sta_last_error(void);
/* The status of the last failed call on this thread (STA_OK if none). */
sta_status sta_last_status(void);
/* Forget the last error. */
void sta_clear_error(void);
/* Constant name of a status, e.g. "STA_ERR_SHAPE". */
const char *sta_status_name(sta_status s);
/* The hundreds group of a status: 0, 100, 200, ... */
int32_t sta_status_group(sta_status s);
/* Library version string, e.g. "0.1.0". */
const char *sta_version(void);
/* Free memory that sta handed to the caller (strings from *_to_json...). */
void sta_free(void *p);
/* Cooperative cancel.  sta_cancel raises a process-wide flag; it is
** async-signal-safe, so a SIGINT handler may call it.  Long calls (the
** attention forwards, references and backwards, layer forward and
** backward, search mode, SP attention) check it between work items (CPU)
** or before each launch (GPU) and, while it is raised, stop and return
** STA_ERR_CANCELLED ("<call>: cancelled (sta_cancel) ...") with every
** output as it was: the CPU computes into a scratch output (one more
** output's worth of host memory) and copies it at the end.  A call that
** starts while the flag is raised stops at once.  The flag stays raised
** until sta_cancel_clear. */
void sta_cancel(void);
void sta_cancel_clear(void);
int32_t sta_cancel_requested(void);

/* }====================================================================== */

/*
** {======================================================================
** Tensors
** =======================================================================
** Up to 4-D, element strides (int64), f32/f16/bf16, host or CUDA memory.
** A tensor is a view onto a reference-counted storage: views share the
** storage and keep it alive, so handles can be destroyed in any order.
**
** STA_F8E4M3 (OCP FP8 E4M3: bias 7, subnormals, no infinities, largest
** 448) holds 8-bit operands for sta_attention_forward_fp8.  Host tensors
** of it convert like any dtype (to e4m3: round to nearest even, beyond
** +-448 saturated to +-448, NaN to NaN); on a device only contiguous
** copies to and from host tensors of the same dtype run, and no operation
** below the Files section (npy excepted: no such .npy type) computes on
** it: STA_ERR_UNSUPPORTED (elementwise operations) or STA_ERR_DTYPE (the
** attention's q, k, v) saying so.
**
** STA_I32 (int32) holds block lists and block sizes (sta_block_list): on
** any device, created, wrapped, viewed, copied to and from another i32
** tensor (a device side contiguous: the bytes move by the backend's
** memcpy), filled (a device tensor contiguous), read and written
** elementwise on the host (sta_tensor_get and _set, exact; a value that is
** no int32 is STA_ERR_ARGUMENT); no operation computes on it
** (STA_ERR_UNSUPPORTED) and it converts to no other dtype (STA_ERR_DTYPE),
** nor is it written to .npy or .safetensors files (STA_ERR_DTYPE).
*/
typedef enum sta_dtype {
  STA_F32 = 0, STA_F16 = 1, STA_BF16 = 2, STA_F8E4M3 = 3, STA_I32 = 4
} sta_dtype;
typedef enum sta_device { STA_CPU = 0, STA_CUDA = 1 } sta_device;

typedef struct sta_tensor sta_tensor;

/* New contiguous (row-major) tensor, uninitialised.  ndim 1..4, each size
** >= 0.  On error *out is untouched. */
sta_status sta_tensor_create(sta_tensor **out, sta_dtype dtype,
                             sta_device device, int32_t ndim,
                             const int64_t *shape);
/* Wrap caller memory (not freed by sta).  strides NULL = contiguous.  The
** memory must stay valid while any view of it exists. */
sta_status sta_tensor_wrap(sta_tensor **out, void *data, sta_dtype dtype,
                           sta_device device, int32_t ndim,
                           const int64_t *shape, const int64_t *strides);
/* A view of base's storage: offset (elements, relative to base's first
** element), shape and strides (elements).  Every addressed element must lie
** inside the storage. */
sta_status sta_tensor_view(sta_tensor **out, const sta_tensor *base,
                           int64_t offset, int32_t ndim,
                           const int64_t *shape, const int64_t *strides);
/* A view with dimensions reordered: new dim i is old dim perm[i]. */
sta_status sta_tensor_permute(sta_tensor **out, const sta_tensor *base,
                              const int32_t *perm);
/* A view of [start, start+len) along dim. */
sta_status sta_tensor_narrow(sta_tensor **out, const sta_tensor *base,
                             int32_t dim, int64_t start, int64_t len);
/* Release a handle (NULL is fine).  Storage goes when its last view goes. */
void sta_tensor_destroy(sta_tensor *t);

sta_dtype sta_tensor_dtype(const sta_tensor *t);
sta_device sta_tensor_device(const sta_tensor *t);
int32_t sta_tensor_ndim(const sta_tensor *t);
int64_t sta_tensor_size(const sta_tensor *t, int32_t dim);   /* -1: bad dim */
int64_t sta_tensor_stride(const sta_tensor *t, int32_t dim); /* elements */
int64_t sta_tensor_numel(const sta_tensor *t);
/* Address of element 0 (host or device pointer). */
void *sta_tensor_data(const sta_tensor *t);
int32_t sta_tensor_is_contiguous(const sta_tensor *t);
/* Bytes of one element of dtype. */
size_t sta_dtype_size(sta_dtype dtype);
/* "f32", "f16", "bf16", "f8e4m3", "i32"; sta_dtype_parse takes these,
** also "float32", "float16", "fp16", "bfloat16", "float8_e4m3fn", "e4m3",
** "int32", and returns STA_ERR_DTYPE otherwise. */
const char *sta_dtype_name(sta_dtype dtype);
sta_status sta_dtype_parse(const char *name, sta_dtype *out);

/* Copy src into dst elementwise: same shape, any strides, any dtypes
** (converted, round-to-nearest-even), any devices.  On error dst is
** unchanged. */
sta_status sta_tensor_copy(sta_tensor *dst, const sta_tensor *src);
/* New contiguous tensor holding src converted to dtype on device. */
sta_status sta_tensor_to(sta_tensor **out, const sta_tensor *src,
                         sta_dtype dtype, sta_device device);
/* Fill with normal(mean, std) draws from a counter-based generator: the
** same seed gives the same values on every machine and thread count. */
sta_status sta_tensor_randn(sta_tensor *t, uint64_t seed, double mean,
                            double std);
/* Fill with one value. */
sta_status sta_tensor_fill(sta_tensor *t, double value);
/* Read or write one element of a host tensor (index has ndim entries). */
sta_status sta_tensor_get(const sta_tensor *t, const int64_t *index,
                          double *value);
sta_status sta_tensor_set(sta_tensor *t, const int64_t *index, double value);
/* Max |a-b| and ||a-b|| / ||b|| over all elements (same shape, any device
** or dtype; computed in double on the host).  max_abs, rel_l2: either may
** be NULL. */
sta_status sta_tensor_compare(const sta_tensor *a, const sta_tensor *b,
                              double *max_abs, double *rel_l2);

/* }====================================================================== */

/*
** {======================================================================
** Elementwise operations and reductions
** =======================================================================
** On the tensors' own device: CUDA tensors are computed by device kernels
** and never pass through host memory (the few numbers of a reduction
** excepted); host tensors by the CPU.  Together with sta_tensor_copy,
** _fill and _randn above (also device kernels on CUDA; randn gives the
** same bits on every backend) these are what a pipeline step needs.
** Operands: the same shape and device, any strides, any dtypes (mixed
** freely; computed in float32, stored round-to-nearest-even).  An output
** may be exactly one of the inputs (the same view); an output that
** overlaps an input otherwise is STA_ERR_ARGUMENT.  Coefficients must be
** finite and within float32's range.  On error nothing is changed.
*/
/* y = a*x + b*y. */
sta_status sta_tensor_axpby(sta_tensor *y, double a, const sta_tensor *x,
                            double b);
/* t = a*t. */
sta_status sta_tensor_scale(sta_tensor *t, double a);
/* out = x + y. */
sta_status sta_tensor_add(sta_tensor *out, const sta_tensor *x,
                          const sta_tensor *y);

/* Summary of a tensor's values: mean, std (population, divided by count),
** min and max over the finite elements (all 0 when there are none). */
typedef struct sta_stats {
  double mean, std, min, max;
  int64_t count;     /* finite elements */
  int64_t nonfinite; /* NaN and +-inf elements */
} sta_stats;
/* Reduce t on its device (deterministic: the same tensor gives the same
** bits run to run).  On error *out is unchanged. */
sta_status sta_tensor_stats(const sta_tensor *t, sta_stats *out);

/* Bytes of tensor data sta has copied between host and device memory in
** this process, both directions (sta_tensor_to, _copy across devices,
** file I/O of device tensors...).  Reduction results (sta_tensor_stats,
** sta_head_diff) are not counted.  A pipeline step whose tensors are all
** on the device leaves it unchanged. */
int64_t sta_transfer_bytes(void);

/* }====================================================================== */

/*
** {======================================================================
** Files: .npy and .safetensors
** =======================================================================
** Readers take untrusted files: a truncated or malformed file returns
** STA_ERR_FORMAT with a message naming the file and the problem.
** .npy: '<f4', '<f2' read and written; bf16 is written as '<u2' holding the
** raw bf16 bits with dtype given explicitly when read back (see README).
*/
/* Load an .npy file into a new host tensor.  as_bf16: interpret '<u2'
** arrays as raw bf16 bits (otherwise '<u2' is refused). */
sta_status sta_npy_load(sta_tensor **out, const char *path, int32_t as_bf16);
/* Save a host or device tensor (any strides) to .npy. */
sta_status sta_npy_save(const sta_tensor *t, const char *path);

typedef struct sta_safetensors sta_safetensors;
/* Open and validate a .safetensors file (header parsed with cJSON; every
** entry's offsets checked against the file size). */
sta_status sta_safetensors_open(sta_safetensors **out, const char *path);
void sta_safetensors_close(sta_safetensors *f);
int32_t sta_safetensors_count(const sta_safetensors *f);
/* Name of entry i (0..count-1), NULL when out of range. */
const char *sta_safetensors_name(const sta_safetensors *f, int32_t i);
/* Read entry name into a new host tensor (F32, F16 or BF16). */
sta_status sta_safetensors_read(const sta_safetensors *f, const char *name,
                                sta_tensor **out);
/* Write tensors under names to path (host or device, any strides). */
sta_status sta_safetensors_save(const char *path, int32_t n,
                                const char *const *names,
                                const sta_tensor *const *tensors);
/* Every file sta writes (these, strategies, search results) is written
** atomically: a temporary file in the target's directory, fsync'd, then
** renamed over the target.  On failure only that temporary file is removed:
** an existing target keeps its old contents.  A target that exists and is
** not a regular file (/dev/null, a FIFO) is written in place and never
** removed; a directory is refused (STA_ERR_IO).  sta_file_write writes len
** bytes of data to path that way. */
sta_status sta_file_write(const char *path, const void *data, size_t len);

/* }====================================================================== */

/*
** {======================================================================
** Geometry (STA.md sections 1-3)
** =======================================================================
*/
typedef enum sta_layout {
  STA_BSHD = 0, /* [B, S, heads, D] */
  STA_BHSD = 1  /* [B, heads, S, D] */
} sta_layout;

/* The order of the sequence's rows (STA.md section 1).  UNTILED: video
** token (t, h, w) at row (t*H + h)*W + w, V rows.  TILED: FastVideo's
** tiled order, tile by tile (tile_id = (it*NH + ih)*NW + iw), each tile's
** rows ((t%tt)*th + h%th)*tw + w%tw, every tile padded to the full tile
** volume: NT*NH*NW*tt*th*tw video rows.  The text rows follow the video
** rows in both.  A padding row (a place of a partial tile with no token)
** is no token: never a key, and as a query it sees no keys: its output is
** 0, its log-sum-exp -inf, its dq, dk, dv 0; what its q, k, v hold
** (NaN included) changes nothing. */
typedef enum sta_order {
  STA_ORDER_UNTILED = 0,
  STA_ORDER_TILED = 1
} sta_order;

typedef struct sta_geometry {
  int32_t canvas[3]; /* T, H, W in tokens */
  int32_t tile[3];   /* tt, th, tw; default 6, 8, 8 */
  int64_t text_len;  /* valid text tokens; -1 = S - video rows */
  sta_order order;   /* of the rows; 0 = STA_ORDER_UNTILED */
} sta_geometry;

/* canvas T x H x W, tile 6x8x8, text_len -1, untiled order. */
void sta_geometry_init(sta_geometry *g, int32_t t, int32_t h, int32_t w);
/* Check canvas, tile, order and (seq_len) text length; seq_len shorter
** than the video rows gives "seq_len N not supported for STA" (in the
** tiled order followed by the rows it needs). */
sta_status sta_geometry_check(const sta_geometry *g, int64_t seq_len);
/* Tile grid NT, NH, NW; video tokens V. */
void sta_geometry_grid(const sta_geometry *g, int32_t grid[3]);
int64_t sta_geometry_video_tokens(const sta_geometry *g);
/* Rows the video takes in g's order: V untiled, NT*NH*NW*tile volume
** tiled (partial tiles padded); the text rows start there. */
int64_t sta_geometry_video_rows(const sta_geometry *g);
/* Resolved text length for a sequence of seq_len rows. */
int64_t sta_geometry_text_len(const sta_geometry *g, int64_t seq_len);
/* Check one window against the grid (odd or >= axis tiles, >= 1). */
sta_status sta_window_check(const sta_geometry *g, const int32_t window[3]);
/* Key-tile range on one axis (STA.md section 2): q the query tile, k the
** window, c the tiles on the axis.  Returns STA_ERR_WINDOW for bad k. */
sta_status sta_window_range(int32_t q, int32_t k, int32_t c, int32_t *start,
                            int32_t *count);
/* Known FastVideo canvas for seq_len (115456 and 115200: 30x48x80,
** 82944: 36x48x48, 69120: 18x48x80), else STA_ERR_SEQ_LEN. */
sta_status sta_geometry_from_seq_len(sta_geometry *g, int64_t seq_len);
/* Tiled sequence length of an untiled one of seq_len rows: NT*NH*NW*tile
** volume (padded) + text rows (g's order is not read); -1 when seq_len is
** shorter than the video or the sum would pass INT64_MAX. */
int64_t sta_geometry_tiled_len(const sta_geometry *g, int64_t seq_len);
/* Conversions between the untiled and FastVideo's tiled order (the
** attention reads either in place: set geom.order).  in/out: 4-D in
** layout; tile maps [.., S, ..] to [.., tiled_len, ..] (padding rows
** zero), untile the reverse (padding ignored).  Text rows keep their
** order after the video.  g's order is not read. */
sta_status sta_tensor_tile(sta_tensor *out, const sta_tensor *in,
                           const sta_geometry *g, sta_layout layout);
sta_status sta_tensor_untile(sta_tensor *out, const sta_tensor *in,
                             const sta_geometry *g, sta_layout layout);

/* }====================================================================== */

/*
** {======================================================================
** STA forward (STA.md sections 2-4)
** =======================================================================
*/
/* Softmax numerics of the forward (STA.md section 4).  EXACT, the
** default, keeps the exact running maximum: every row's largest weight is
** exactly 1 before the final division.  FAST (opt-in, GPU kernels) moves
** the running maximum only when a key block's exceeds it by more than 8
** (exp2 domain), so the output is rescaled almost never: 1-3 % faster, up
** to twice the maximum error on sharply peaked rows (BENCHMARKS.md).  The
** CPU backend computes EXACT for both. */
typedef enum sta_softmax {
  STA_SOFTMAX_EXACT = 0,
  STA_SOFTMAX_FAST = 1
} sta_softmax;

/* Compute precision of the forward (STA.md section 11).  NATIVE, the
** default, computes in the inputs' dtype with float32 accumulation.  FP8
** (opt-in, never chosen for the caller) quantizes Q, K, V to 8 bits and
** runs both GEMMs in 8 bits; out and lse come out as for NATIVE.  The
** scheme (research/fp8_sim.py, BENCHMARKS.md's ledger): K smoothed (its
** per-channel mean over the keys subtracted; lse corrected back), Q and K
** channels equalized by powers of two, Q and K in int8 (Q with one scale
** per row, K with one per 64 rows of the tiled order; a key with a NaN or
** Inf keeps its own), V in e4m3 with one scale per channel, P = exp2(s -
** m) against the running maximum over steps of 64 keys, P * 448 in e4m3.
** Its error
** against the exact result is no worse than the SageAttention2 scheme's
** on the same inputs: relative L2 about 4e-2 on randn, cosine 0.9993
** (bf16: 2.3e-3).  A NaN or Inf input reaches only the rows that see it,
** as in NATIVE (a non-finite V element gives NaN, not Inf).  The CPU
** backend computes FP8 by a reference that quantizes exactly so (an
** emulation for tests, not a fast path: every query row against every
** key, in double); CUDA runs the same quantization on the device and an
** sm_90a kernel with 8-bit wgmma (bf16, f16 and f32 inputs, D 64 and
** 128), equal to the reference up to the order and width of its sums.
** The backward has no FP8 mode (STA_ERR_UNSUPPORTED). */
typedef enum sta_precision {
  STA_PRECISION_NATIVE = 0,
  STA_PRECISION_FP8 = 1
} sta_precision;

/* The mask: which keys each query row sees (STA.md sections 2, 3 and 12).
** WINDOW, the default, is STA's tile window (desc->windows, desc->geom).
** BLOCKS takes the choice as data: the rows are cut into blocks of
** block_rows rows (q into Mq = Sq / block_rows blocks, k and v into Mk =
** Sk / block_rows, Sq and Sk multiples of block_rows), and query block m
** of (batch b, head h) sees the key blocks idx[b][h][m][0 .. num[b][h][m]),
** FastVideo's q2k_idx / q2k_num.  Block n's first kv_sizes[n] rows are
** keys, the rest padding that is never a key (q_sizes likewise for the
** query blocks: a padding query row's output is 0, its lse -inf, its
** gradients 0); a query block with an empty list outputs 0 and lse -inf.
** q may have another sequence length than k and v (its own Mq); no text
** rows and no geometry (desc->geom and desc->windows are not read).
** WINDOW_OR_BLOCKS (NABLA): a key block is seen when the window or the
** list holds it; the blocks are then the tiles of desc->geom (order
** STA_ORDER_TILED, block_rows = the tile volume, Mq = Mk = the tiles, no
** text rows: Sq = Sk = the padded tiles' rows), valid rows a prefix of
** each block as for BLOCKS (the sizes, not the canvas, say which: the
** canvas only places the blocks on the tile grid), and window membership
** is STA.md section 2's rule on the tile grid.  A list with an index
** outside [0, Mk), or an index twice in one query block's list, is
** STA_ERR_ARGUMENT naming (b, h, m) and the index; num outside [0, L] and
** sizes outside 1..block_rows likewise.  Entries of idx past num are never
** read.  The lists live on q's device; the CPU backend runs every kind,
** CUDA the window only so far (others STA_ERR_UNSUPPORTED); fp8 runs the
** window only (STA_ERR_UNSUPPORTED).  A key block's keys are walked in
** block order whatever the list's order, so a list's order changes no
** bit of the result on the CPU. */
typedef enum sta_mask_kind {
  STA_MASK_WINDOW = 0,
  STA_MASK_BLOCKS = 1,
  STA_MASK_WINDOW_OR_BLOCKS = 2
} sta_mask_kind;

typedef struct sta_block_list {
  int32_t block_rows;         /* rows per block, >= 1; 0 = 64 (WINDOW_OR_BLOCKS: the tile volume) */
  const sta_tensor *num;      /* i32 [B, heads, Mq], contiguous */
  const sta_tensor *idx;      /* i32 [B, heads, Mq, L], contiguous, L >= every num */
  const sta_tensor *kv_sizes; /* NULL: every key block whole; else i32 [Mk] in 1..block_rows */
  const sta_tensor *q_sizes;  /* NULL: kv_sizes when Mq == Mk (else whole); else i32 [Mq] */
} sta_block_list;

/* Zero-initialise (sta_attention_desc d = {0}) and set what you need:
** every zero field means its default. */
typedef struct sta_attention_desc {
  sta_geometry geom;
  sta_layout layout;      /* of q, k, v, out */
  int32_t n_windows;      /* 1 (all heads) or heads */
  const int32_t *windows; /* n_windows * 3 ints: Kt, Kh, Kw */
  float scale;            /* <= 0: 1/sqrt(D) */
  sta_softmax softmax;    /* forward numerics; 0 = STA_SOFTMAX_EXACT */
  int32_t deterministic;  /* backward: 1 = bit-identical gradients run to
                             run; on the GPU the dQ adds are then ordered,
                             about 3x the time (BENCHMARKS.md); the CPU is
                             always deterministic */
  sta_precision precision; /* forward compute; 0 = STA_PRECISION_NATIVE */
  sta_mask_kind mask;     /* which keys each query sees; 0 = STA_MASK_WINDOW */
  const sta_block_list *blocks; /* STA_MASK_BLOCKS, STA_MASK_WINDOW_OR_BLOCKS */
} sta_attention_desc;

/* out = STA(q, k, v).  q, k, v, out: 4-D in desc->layout, one shape
** [B, S, heads, D] (or BHSD; STA_MASK_BLOCKS: k and v [B, Sk, heads, D]),
** same dtype and device, last dim contiguous;
** rows in desc->geom.order (the tiled order is read in place, no copy).
** lse: NULL or f32 [B, heads, S] on the same device (natural log).  Runs on
** the backend of the tensors' device.  On error out and lse are unchanged. */
sta_status sta_attention_forward(const sta_attention_desc *desc,
                                 const sta_tensor *q, const sta_tensor *k,
                                 const sta_tensor *v, sta_tensor *out,
                                 sta_tensor *lse);
/* The fp8 forward of operands already in 8 bits (projections that emit
** fp8): q8, k8, v8 STA_F8E4M3, shaped, laid out and ordered as q, k, v of
** sta_attention_forward (last dim contiguous), on one device; they stand
** for q8 * q_scale, k8 * k_scale, v8 * v_scale: q_scale and k_scale f32
** [B, heads, S] (a scale per row; a view with stride 0 gives one per head
** or per tensor), v_scale f32 [B, heads, D] (per channel).  out: f32, f16
** or bf16 of q8's shape; lse as for sta_attention_forward.
** desc->precision must be STA_PRECISION_FP8.  Computes what the FP8
** forward computes on the dequantized values (float32 products): the
** scheme requantizes them (K smoothed, Q to int8 per row, K per 64 rows,
** V to e4m3 per channel), on the operands' device (dequantized there to float32
** scratch by the device's backend).
** On error out and lse are unchanged. */
sta_status sta_attention_forward_fp8(const sta_attention_desc *desc,
                                     const sta_tensor *q8, const sta_tensor *k8,
                                     const sta_tensor *v8,
                                     const sta_tensor *q_scale,
                                     const sta_tensor *k_scale,
                                     const sta_tensor *v_scale, sta_tensor *out,
                                     sta_tensor *lse);
/* Dense masked attention, the brute-force reference: the same function
** computed one query row at a time in double.  Host tensors only; slow.
** desc->precision FP8: the fp8 reference (what sta_attention_forward
** computes for FP8 on the CPU). */
sta_status sta_attention_reference(const sta_attention_desc *desc,
                                   const sta_tensor *q, const sta_tensor *k,
                                   const sta_tensor *v, sta_tensor *out,
                                   sta_tensor *lse);
/* Gradients of the forward (STA.md section 10): given the forward's out
** and lse (f32 [B, heads, S], as sta_attention_forward returns it) and
** dout = dLoss/dout, write dq, dk, dv = dLoss/dq, dk, dv.  desc, q, k, v
** as for the forward (same windows, text_len and scale); out, dout, dq,
** dk, dv: the shape, dtype, device and layout of q (STA_MASK_BLOCKS: dk
** and dv those of k), last dim contiguous, strides free.  Rows that are
** never keys (past the valid text; padding rows of the tiled order or of
** partial blocks) get dk = dv = 0 exactly, padding rows and query blocks
** with an empty list dq = 0 too.  Every
** check runs before any work; on error dq, dk, dv are unchanged. */
sta_status sta_attention_backward(const sta_attention_desc *desc,
                                  const sta_tensor *q, const sta_tensor *k,
                                  const sta_tensor *v, const sta_tensor *out,
                                  const sta_tensor *lse,
                                  const sta_tensor *dout, sta_tensor *dq,
                                  sta_tensor *dk, sta_tensor *dv);
/* The brute-force gradient of sta_attention_reference, in double, from q,
** k, v and dout alone (out and lse are recomputed).  Host tensors only;
** slow. */
sta_status sta_attention_backward_reference(const sta_attention_desc *desc,
                                            const sta_tensor *q,
                                            const sta_tensor *k,
                                            const sta_tensor *v,
                                            const sta_tensor *dout,
                                            sta_tensor *dq, sta_tensor *dk,
                                            sta_tensor *dv);
/* Work of a forward in FLOP (4*D per (query, key) pair, both GEMMs); 0 for
** a problem the forward refuses (geometry, seq_len, n_windows vs heads).  A
** block mask counts the valid query rows against the valid key rows of
** the blocks each sees (the lists read on the host; device lists copied
** there); 0 when the lists do not fit (batch, heads, seq_len) or hold a
** bad entry. */
double sta_attention_flops(const sta_attention_desc *desc, int64_t batch,
                           int64_t seq_len, int64_t heads, int64_t head_dim);
/* Per-head L1 = mean|a-b| and L2 = mean((a-b)^2) over batch, rows, D, in
** float32.  a, b: same shape in layout; l1, l2: heads floats each. */
sta_status sta_head_diff(const sta_tensor *a, const sta_tensor *b,
                         sta_layout layout, float *l1, float *l2);

/* }====================================================================== */

/*
** {======================================================================
** Video Sparse Attention (STA.md section 12)
** =======================================================================
** VSA as FastVideo's video_sparse_attn computes it.  Rows are in cube
** order: the canvas cut into cubes of block_rows tokens (64: 4x4x4; 256:
** 4x8x8), cube after cube, each cube's valid tokens first and padding
** rows after (sta_tensor_to_cubes makes it from the untiled order).  Per
** (batch, head): the means of q, k, v over each cube's valid rows; dense
** softmax attention between the cubes (out_c); the topk key cubes of each
** query cube by the coarse scores (exactly topk, ties towards the lower
** index); the fine branch, block-sparse attention over the selected cubes
** (sta_attention_forward with STA_MASK_BLOCKS); out = out_c * gate +
** out_s on valid rows, 0 on padding rows.
**
** Operands: q [B, Sq, heads, D], k and v [B, Sk, heads, D] in
** desc->layout (Sq = Mq * block_rows, Sk = Mk * block_rows); gate, out,
** dout, dq and dgate of q's shape, dk and dv of k's; one dtype (f32, f16,
** bf16) and device, the head dimension contiguous, strides otherwise free.
** The sizes are i32 tensors on q's device; on CUDA they are read back and
** checked before any work, except while the thread's stream is being
** captured into a CUDA graph: then an out-of-range size is clamped into
** 1..block_rows (memory-safe, no error).
**
** Why a forward and a backward and no state between them: the backward
** recomputes the means, the coarse branch and the selection from q, k, v
** (the forward's bits: every VSA kernel is deterministic) and the fine
** branch's output as out - gate * out_c (a few percent of the backward's
** time), so it takes what flash attention's backward takes: the
** forward's inputs, out and lse.  A PyTorch autograd function saves (q,
** k, v, gate, out, lse) and calls the backward with tensors only, under
** torch.compile and in CUDA graphs (device scratch is stream-ordered); Lua
** and C call the two functions; no caller buffer holds VSA's internals
** and no activation is saved twice.  sta_vsa_coarse gives the coarse
** branch and the selection alone (FastVideo's q2k_idx / q2k_num), for
** callers that compose the fine branch themselves or inspect it.
*/
typedef struct sta_vsa_desc {
  sta_layout layout;          /* of every 4-D operand */
  int32_t block_rows;         /* rows per cube: 64 or 256; 0 = 64 */
  int32_t topk;               /* key cubes per query cube, 1..Mk (sta_vsa_topk) */
  float scale;                /* both branches; <= 0: 1/sqrt(D) */
  int32_t deterministic;      /* the backward's, as sta_attention_desc's */
  const sta_tensor *kv_sizes; /* NULL: whole key cubes; else i32 [Mk] in 1..block_rows */
  const sta_tensor *q_sizes;  /* NULL: kv_sizes when Mq == Mk, else whole; else i32 [Mq] */
} sta_vsa_desc;

/* topk = ceil((1 - sparsity) * cubes) in IEEE double (FastVideo's VSA
** backend): sparsity in [0, 1) and cubes >= 1, so 1 <= topk <= cubes.
** On error *topk is unchanged. */
sta_status sta_vsa_topk(double sparsity, int64_t cubes, int32_t *topk);
/* The cubes of a canvas (T, H, W tokens) cut by cube (ct, ch, cw; e.g.
** 4, 4, 4): ceil(T/ct) * ceil(H/ch) * ceil(W/cw) of them.  Every entry
** >= 1 and the cube volume at most 4096.  On error *count is unchanged. */
sta_status sta_vsa_cube_count(const int32_t canvas[3], const int32_t cube[3],
                              int64_t *count);
/* Each cube's valid tokens (FastVideo's variable_block_sizes): sizes i32
** [cube count], on any device.  On error sizes is unchanged. */
sta_status sta_vsa_cube_sizes(sta_tensor *sizes, const int32_t canvas[3],
                              const int32_t cube[3]);
/* The untiled video rows (section 1: T*H*W rows, no text) to cube order
** (count * cube volume rows; padding rows 0) and back (padding rows
** ignored).  in, out: 4-D in layout, the same batch, heads and D, dtype
** and device.  On error out is unchanged. */
sta_status sta_tensor_to_cubes(sta_tensor *out, const sta_tensor *in,
                               const int32_t canvas[3], const int32_t cube[3],
                               sta_layout layout);
sta_status sta_tensor_from_cubes(sta_tensor *out, const sta_tensor *in,
                                 const int32_t canvas[3], const int32_t cube[3],
                                 sta_layout layout);
/* out = VSA(q, k, v).  gate: NULL (1) or q's shape.  lse: NULL or f32 [B,
** heads, Sq], the fine branch's log-sum-exp (sta_vsa_backward needs it).
** Runs on the tensors' backend.  On error out and lse are unchanged. */
sta_status sta_vsa_forward(const sta_vsa_desc *desc, const sta_tensor *q,
                           const sta_tensor *k, const sta_tensor *v,
                           const sta_tensor *gate, sta_tensor *out,
                           sta_tensor *lse);
/* The gradients of sta_vsa_forward (STA.md section 12): desc, q, k, v,
** gate as for the forward, out and lse what it returned, dout =
** dLoss/dout; writes dq, dk, dv and dgate (NULL when gate is NULL or its
** gradient is not wanted).  Padding rows get 0.  Every check runs before
** any work; on error dq, dk, dv, dgate are unchanged. */
sta_status sta_vsa_backward(const sta_vsa_desc *desc, const sta_tensor *q,
                            const sta_tensor *k, const sta_tensor *v,
                            const sta_tensor *gate, const sta_tensor *out,
                            const sta_tensor *lse, const sta_tensor *dout,
                            sta_tensor *dq, sta_tensor *dk, sta_tensor *dv,
                            sta_tensor *dgate);
/* The coarse branch and the selection alone: out_c f32 [B, heads, Mq, D]
** (the coarse output of each query cube), lse_c f32 [B, heads, Mq], idx
** i32 [B, heads, Mq, topk] (the selected key cubes, ascending), num i32
** [B, heads, Mq] (topk): a block list for sta_attention_forward.  Each
** may be NULL.  On error nothing is written. */
sta_status sta_vsa_coarse(const sta_vsa_desc *desc, const sta_tensor *q,
                          const sta_tensor *k, const sta_tensor *v,
                          sta_tensor *out_c, sta_tensor *lse_c,
                          sta_tensor *idx, sta_tensor *num);
/* The brute-force VSA in double, independent of the fast path: means,
** scores, selection, every valid query row against its selected cubes'
** valid keys, the combine.  Host tensors only; slow. */
sta_status sta_vsa_reference(const sta_vsa_desc *desc, const sta_tensor *q,
                             const sta_tensor *k, const sta_tensor *v,
                             const sta_tensor *gate, sta_tensor *out,
                             sta_tensor *lse);
/* The reference's gradient in double from q, k, v, gate and dout alone
** (dgate as for sta_vsa_backward).  Host tensors only; slow. */
sta_status sta_vsa_backward_reference(const sta_vsa_desc *desc,
                                      const sta_tensor *q, const sta_tensor *k,
                                      const sta_tensor *v,
                                      const sta_tensor *gate,
                                      const sta_tensor *dout, sta_tensor *dq,
                                      sta_tensor *dk, sta_tensor *dv,
                                      sta_tensor *dgate);

/* }====================================================================== */

/*
** {======================================================================
** Backends
** =======================================================================
** The CPU backend is always there.  The CUDA backend is compiled in when
** nvcc was found at build time and is usable when a device answers the
** probe; any probe failure means CPU only.
*/
/* 1 if the backend for device can run now. */
int32_t sta_backend_available(sta_device device);
/* Why CUDA is unavailable (or its device name when it is). */
const char *sta_backend_describe(sta_device device);
/* Threads of the CPU backend (0 = OpenMP default). */
void sta_set_num_threads(int32_t n);
int32_t sta_get_num_threads(void);
/* CUDA stream used by this thread's device work (NULL = default stream). */
void sta_cuda_set_stream(void *stream);
void *sta_cuda_get_stream(void);
/* Wait for this thread's stream. */
sta_status sta_cuda_synchronize(void);
/* One line on this thread's last CUDA forward launch: the kernel (Wide,
** Tall or Square, dtype, head dim), rows x keys per block, grid and work
** items, whether TMA or the cp.async gather loads, the tensor maps it got,
** the wave gate's threshold where it is on and, when a TMA path was left
** out, why.  "" before the first.  For diagnosing a slow call; the text
** may change between versions. */
const char *sta_cuda_last_launch(void);
/* Device bytes held by sta tensors now, and the peak since reset. */
int64_t sta_device_bytes_in_use(void);
int64_t sta_device_bytes_peak(void);
void sta_device_reset_peak(void);

/* }====================================================================== */

/*
** {======================================================================
** Mask strategies (STA.md section 5)
** =======================================================================
** A window for every (step, layer, head); FastVideo's JSON format
** {"t_l_h": [Kt, Kh, Kw], ...}.
*/
typedef struct sta_strategy sta_strategy;

sta_status sta_strategy_create(sta_strategy **out);
void sta_strategy_destroy(sta_strategy *s);
/* Parse FastVideo JSON (STA_ERR_FORMAT naming the first bad key or value:
** keys "step_layer_head" of non-negative decimal ints, values 3 positive
** integers, no repeated key).  On error *out is untouched. */
sta_status sta_strategy_parse(sta_strategy **out, const char *json,
                              size_t len);
sta_status sta_strategy_load(sta_strategy **out, const char *path);
/* The file named by STA_ATTENTION_CONFIG, else
** SGLANG_DIFFUSION_ATTENTION_CONFIG, else FASTVIDEO_ATTENTION_CONFIG;
** none set: STA_ERR_ENV "STA_ATTENTION_CONFIG is not set". */
sta_status sta_strategy_load_default(sta_strategy **out);
/* Keys sorted by (step, layer, head); *json freed with sta_free. */
sta_status sta_strategy_to_json(const sta_strategy *s, char **json);
sta_status sta_strategy_save(const sta_strategy *s, const char *path);
/* One window everywhere; full (may be NULL when full_steps is 0) for
** steps < full_steps. */
sta_status sta_strategy_uniform(sta_strategy **out, int32_t steps,
                                int32_t layers, int32_t heads,
                                const int32_t window[3],
                                const int32_t full[3], int32_t full_steps);
sta_status sta_strategy_set(sta_strategy *s, int32_t step, int32_t layer,
                            int32_t head, const int32_t window[3]);
/* Missing key: STA_ERR_KEY naming "step_layer_head". */
sta_status sta_strategy_get(const sta_strategy *s, int32_t step,
                            int32_t layer, int32_t head, int32_t window[3]);
int64_t sta_strategy_count(const sta_strategy *s);
/* 1 + the largest step, layer and head present (0s when empty). */
void sta_strategy_extent(const sta_strategy *s, int32_t *steps,
                         int32_t *layers, int32_t *heads);
/* Every (step, layer, head) below the counts present, else STA_ERR_KEY
** naming the first missing key. */
sta_status sta_strategy_check(const sta_strategy *s, int32_t steps,
                              int32_t layers, int32_t heads);
/* 1 - sum(window volume) / sum(full volume), volumes in tiles clamped to
** grid (NT, NH, NW). */
sta_status sta_strategy_sparsity(const sta_strategy *s,
                                 const int32_t grid[3], double *sparsity);
/* 1 when both hold the same keys and windows. */
int32_t sta_strategy_equal(const sta_strategy *a, const sta_strategy *b);

/* }====================================================================== */

/*
** {======================================================================
** Attention metadata: one step's [layer][head] window table (STA_param)
** =======================================================================
** A row with fewer windows than the model's total heads is a search row:
** candidate windows, the full window last (STA.md section 7).
*/
typedef struct sta_metadata sta_metadata;

sta_status sta_metadata_create(sta_metadata **out, int32_t layers);
void sta_metadata_destroy(sta_metadata *m);
/* One more reference, for a holder outside the core (a binding's context);
** dropped by sta_metadata_destroy.  A NULL or dead handle: nothing. */
void sta_metadata_retain(sta_metadata *m);
int32_t sta_metadata_layers(const sta_metadata *m);
/* Set row layer to n windows (n*3 ints). */
sta_status sta_metadata_set_row(sta_metadata *m, int32_t layer, int32_t n,
                                const int32_t *windows);
/* Borrowed view of a row; *n = 0 for an unset row. */
sta_status sta_metadata_row(const sta_metadata *m, int32_t layer,
                            int32_t *n, const int32_t **windows);
/* The table of step from a strategy, layers x heads.  s NULL:
** STA_ERR_NO_STRATEGY; no step 0 in s: STA_ERR_NO_STEP0. */
sta_status sta_metadata_from_strategy(sta_metadata **out,
                                      const sta_strategy *s, int32_t step,
                                      int32_t layers, int32_t heads);
/* A search table: every layer's row is the candidates (full last). */
sta_status sta_metadata_search(sta_metadata **out, int32_t layers,
                               int32_t n_candidates,
                               const int32_t *candidates);

/* }====================================================================== */

/*
** {======================================================================
** Forward batch and search results
** =======================================================================
*/
typedef struct sta_forward_batch sta_forward_batch;

sta_status sta_forward_batch_create(sta_forward_batch **out,
                                    int32_t batch_size);
void sta_forward_batch_destroy(sta_forward_batch *fb);
/* One more reference, as sta_metadata_retain. */
void sta_forward_batch_retain(sta_forward_batch *fb);
int32_t sta_forward_batch_size(const sta_forward_batch *fb);
/* The classifier-free-guidance negative flag. */
void sta_forward_batch_set_negative(sta_forward_batch *fb, int32_t negative);
int32_t sta_forward_batch_is_negative(const sta_forward_batch *fb);
/* The sparsity of VSA-mode layers (SGLang's VSA_sparsity): the fraction of
** key cubes each query cube leaves out, in [0, 1); 0 (every cube) until
** set.  On error (a value outside [0, 1)) nothing is changed.  The getter
** gives 0 for a NULL or released batch. */
sta_status sta_forward_batch_set_vsa_sparsity(sta_forward_batch *fb, double sparsity);
double sta_forward_batch_vsa_sparsity(const sta_forward_batch *fb);
/* Search records held (positive or negative list). */
int32_t sta_forward_batch_records(const sta_forward_batch *fb,
                                  int32_t negative);
/* Record, by hand or from a search-mode layer: step, layer, candidates
** (n*3, sparse ones only), l1 and l2 [n][heads]. */
sta_status sta_forward_batch_record(sta_forward_batch *fb, int32_t negative,
                                    int32_t step, int32_t layer, int32_t n,
                                    const int32_t *candidates, int32_t heads,
                                    const float *l1, const float *l2);
/* Write one list (positive or negative) in FastVideo's per-prompt layout:
** {"L2_loss": {"[3, 1, 10]": [step][layer][head]}, "L1_loss": {...}},
** steps in the order first recorded, layers in record order.  An empty
** list is STA_ERR_STATE; records with other candidates or head counts than
** the first are STA_ERR_ARGUMENT; on error nothing is written. */
sta_status sta_forward_batch_save_search(const sta_forward_batch *fb,
                                         int32_t negative, const char *path);
void sta_forward_batch_clear(sta_forward_batch *fb);

/* }====================================================================== */

/*
** {======================================================================
** Forward contexts (STA.md section 6)
** =======================================================================
** A per-thread stack.  A context holds a reference to its metadata and
** forward batch until it is popped.
*/
typedef struct sta_context sta_context;

/* Push; md and fb may be NULL. */
sta_status sta_context_push(sta_context **out, int32_t step,
                            sta_metadata *md, sta_forward_batch *fb);
/* Pop ctx, which must be the innermost; otherwise STA_ERR_STATE and the
** stack is unchanged.  A popped context is freed: drop the handle. */
sta_status sta_context_pop(sta_context *ctx);
/* The live (innermost) context or NULL. */
sta_context *sta_context_current(void);
int32_t sta_context_depth(void);
/* 1 when a live context has a forward batch. */
int32_t sta_in_forward_pass(void);
int32_t sta_context_step(const sta_context *ctx);
sta_metadata *sta_context_metadata(const sta_context *ctx);
sta_forward_batch *sta_context_batch(const sta_context *ctx);

/* }====================================================================== */

/*
** {======================================================================
** The STA layer
** =======================================================================
*/
typedef struct sta_layer sta_layer;

/* What a layer computes.  STA: the windows of the live context's metadata
** row (or of the layer's strategy).  VSA (STA.md section 12): q, k, v
** [B, cubes * |cube|, heads, D] in the cube order of the layer's canvas
** (sta_tensor_to_cubes), the forward batch's sparsity
** (sta_forward_batch_set_vsa_sparsity, SGLang's VSA_sparsity) made a topk
** per step (sta_vsa_topk over the cubes), every cube (sparsity 0) while the
** context's step is below dense_steps; gate 1 (a gate goes through
** sta_layer_resolve_vsa and sta_vsa_forward).  A VSA layer takes no text
** rows, no strategy, no sequence parallelism (sp_size 1), the exact
** softmax and native precision (else STA_ERR_UNSUPPORTED at creation). */
typedef enum sta_layer_mode { STA_LAYER_STA = 0, STA_LAYER_VSA = 1 } sta_layer_mode;

typedef struct sta_layer_desc {
  const char *prefix;          /* module prefix (layer = prefix.split('.')
                                  [-3]); NULL to use layer_index */
  int32_t layer_index;         /* used when prefix is NULL */
  int32_t local_heads;         /* heads on this rank */
  int32_t head_dim;
  int32_t sp_rank, sp_size;    /* sequence parallel; 0, 1 when alone */
  sta_geometry geom;           /* canvas 0,0,0: known shape by seq_len */
  sta_layout layout;
  sta_device backend;
  float scale;                 /* <= 0: 1/sqrt(head_dim) */
  const sta_strategy *strategy; /* used when the context has no metadata;
                                   the layer holds a reference */
  sta_softmax softmax;         /* 0 = STA_SOFTMAX_EXACT (sta_attention_desc) */
  sta_precision precision;     /* 0 = STA_PRECISION_NATIVE (sta_attention_desc) */
  sta_layer_mode mode;         /* 0 = STA_LAYER_STA */
  int32_t cube[3];             /* VSA: tokens a cube, 0,0,0 = 4,4,4 (64 rows); 4,8,8: 256 */
  int32_t dense_steps;         /* VSA: steps below it select every cube; >= 0 */
} sta_layer_desc;

/* prefix "transformer.double_blocks.7.attn.impl" gives layer 7. */
sta_status sta_layer_index_from_prefix(const char *prefix, int32_t *layer);
sta_status sta_layer_create(sta_layer **out, const sta_layer_desc *desc);
void sta_layer_destroy(sta_layer *l);
int32_t sta_layer_index(const sta_layer *l);
/* The layout of the layer's operands (STA_BSHD for NULL). */
sta_layout sta_layer_layout(const sta_layer *l);
/* Replace the layer's strategy (the layer holds a reference); NULL clears
** it. */
sta_status sta_layer_set_strategy(sta_layer *l, const sta_strategy *s);
/* Run STA for the live context: its step's row for this layer, this rank's
** global heads.  Search rows run every candidate, write the full-window
** output and record L1/L2 into the context's forward batch.  Every check
** runs before any work; on error out is unchanged.  Search records hold
** this rank's heads, 0..local_heads-1 (the global heads when sp_size is 1):
** each rank saves its own file. */
sta_status sta_layer_forward(sta_layer *l, const sta_tensor *q,
                             const sta_tensor *k, const sta_tensor *v,
                             sta_tensor *out);
/* sta_layer_forward that also writes the log-sum-exp (lse: NULL, or f32
** [B, local heads, S] as for sta_attention_forward; in search mode the full
** window's), which sta_layer_backward needs. */
sta_status sta_layer_forward_lse(sta_layer *l, const sta_tensor *q,
                                 const sta_tensor *k, const sta_tensor *v,
                                 sta_tensor *out, sta_tensor *lse);
/* The gradients of this layer's forward (STA.md section 10) under the live
** context: the same step, row and windows as the forward saw, so call it
** with the context of the forward still live.  out and lse are that
** forward's; the rest as for sta_attention_backward.  A search row (mask
** search) has no backward: STA_ERR_UNSUPPORTED saying so.  On error dq,
** dk, dv are unchanged. */
sta_status sta_layer_backward(sta_layer *l, const sta_tensor *q,
                              const sta_tensor *k, const sta_tensor *v,
                              const sta_tensor *out, const sta_tensor *lse,
                              const sta_tensor *dout, sta_tensor *dq,
                              sta_tensor *dk, sta_tensor *dv);
/* The attention the layer's forward runs for q under the live context,
** as a plain descriptor: the geometry (from q's length when the layer has
** none), layout, scale, softmax, precision, and this rank's windows, one per
** local head, copied to windows (local_heads * 3 ints) where desc->windows
** points.  sta_attention_forward(desc, q, k, v, ...) computes what
** sta_layer_forward does, and sta_attention_backward(desc, ...) its
** gradients with no context at all: a binding keeps desc with the
** forward's out and lse, so its backward uses the windows the forward used
** whatever the context, the strategy or the layer hold by then (STA.md
** section 10).  A search row: STA_ERR_UNSUPPORTED, as sta_layer_backward.
** The checks of sta_layer_forward on the context and q; on error desc and
** windows are unchanged. */
sta_status sta_layer_resolve(sta_layer *l, const sta_tensor *q,
                             sta_attention_desc *desc, int32_t *windows);
/* sta_layer_resolve for a VSA layer: the VSA its forward runs for q under
** the live context, as a plain descriptor (layout, block_rows, the step's
** topk, scale; kv_sizes the layer's own cube sizes, valid while the layer
** lives), and the layer's canvas and cube (each may be NULL), from which a
** binding rebuilds the sizes.  sta_vsa_forward(desc, q, k, v, gate, ...)
** computes what sta_layer_forward does with that gate, and
** sta_vsa_backward(desc, ...) its gradients with no context.  An STA layer
** here, or a VSA layer in sta_layer_resolve: STA_ERR_STATE.  On error
** desc, canvas and cube are unchanged. */
sta_status sta_layer_resolve_vsa(sta_layer *l, const sta_tensor *q, sta_vsa_desc *desc,
                                 int32_t *canvas, int32_t *cube);

/* }====================================================================== */

/*
** {======================================================================
** Tuning (STA.md section 7)
** =======================================================================
*/
typedef struct sta_tune_report {
  double sparsity;          /* of the written strategy, against full */
  int32_t n_windows;        /* distinct windows chosen (<= 16) */
  int32_t windows[16][3];   /* in candidate order, full last */
  int64_t counts[16];       /* (step, layer, head) entries choosing each */
} sta_tune_report;

/* Average L2 over the saved search files, full window for steps below
** skip_steps, argmin per (step, layer, head) afterwards (ties: first
** listed, in the first file's key order).  report may be NULL; it lists
** at most 16 windows.  A malformed file, or one whose candidates or
** [step][layer][head] sizes differ from the first's: STA_ERR_FORMAT naming
** it and the bad part.  On error *out is untouched. */
sta_status sta_tune(sta_strategy **out, int32_t n_files,
                    const char *const *paths, int32_t skip_steps,
                    const int32_t full[3], sta_tune_report *report);
/* FastVideo's defaults for sta_tune (STA.md section 7): full window 3, 6,
** 10 (Wan 18x48x80) and skip_steps 12. */
void sta_tune_defaults(int32_t full[3], int32_t *skip_steps);

/* }====================================================================== */

/*
** {======================================================================
** Sequence parallelism (Ulysses; STA.md section 5)
** =======================================================================
** P ranks each hold V/P video tokens of ALL heads plus every text row:
** q, k, v, out are [B, V/P + text, H, D] (or BHSD), rank r holding video
** tokens r*V/P .. (r+1)*V/P - 1 in the untiled order (the only order
** taken here: a tiled geometry is STA_ERR_UNSUPPORTED); text rows are
** replicated.  An all-to-all gives rank r the whole video for its heads
** r*H/P .. (r+1)*H/P - 1, it runs STA with those GLOBAL heads' windows on
** [B, V + text, H/P, D], a second all-to-all returns the video output to
** the token split and an all-gather over heads gives every rank the text
** output of all heads.  V % P and H % P must be 0.
**
** The rank's heads go in chunks (sta_comm_set_chunks): the all-to-all of
** chunk c+1 and the return of chunk c-1 run while STA computes chunk c.
** The shards are read and written in place (no staging copy of q, k, v or
** out) where the transport moves strided blocks (all_to_all_spans);
** otherwise one side of each exchange is packed into a per-chunk buffer.
** On CUDA the exchanges run on a second stream of the communicator,
** ordered by events with the calling thread's stream (sta_cuda_set_stream):
** the call returns without waiting for the device, like any forward.
**
** A communicator moves bytes through a transport: loopback (P ranks in one
** process, one thread each, sharing one world), NCCL (libnccl.so.2, or
** $STA_NCCL_LIB, loaded at run time) or TCP (CPU processes).  Collectives
** must be entered by every rank of the group in the same order.
*/
/* A strided block of bytes per rank: block j (the one for, or from, rank
** j) starts j * peer bytes after base; it is n[2] x n[1] x n[0] runs of
** run contiguous bytes, consecutive runs of level i pitch[i] bytes apart,
** read in that order (n[0] fastest). */
typedef struct sta_span {
  void *base;
  int64_t peer;
  int64_t run;
  int64_t n[3];
  int64_t pitch[3];
} sta_span;

typedef struct sta_transport {
  const char *name;     /* "loopback", "nccl", ... */
  uint32_t devices;     /* bit (1u << sta_device) per memory it moves */
  void *self;           /* passed to every call */
  int32_t (*rank)(void *self);
  int32_t (*size)(void *self);
  /* send: size chunks of chunk_bytes, chunk j goes to rank j; recv: chunk
  ** j comes from rank j. */
  sta_status (*all_to_all)(void *self, const void *send, void *recv,
                           size_t chunk_bytes, sta_device device);
  /* recv: size chunks, chunk j is rank j's send. */
  sta_status (*all_gather)(void *self, const void *send, void *recv,
                           size_t chunk_bytes, sta_device device);
  sta_status (*barrier)(void *self);
  void (*destroy)(void *self); /* may be NULL */
  /* May be NULL (sta then packs strided blocks for all_to_all).  For each
  ** i < n: send[i]'s block j goes to rank j, into its recv[i] block r (r
  ** this rank); send[i] and recv[i] have the same run and n[]. */
  sta_status (*all_to_all_spans)(void *self, int32_t n, const sta_span *send,
                                 const sta_span *recv, sta_device device);
} sta_transport;

typedef struct sta_comm sta_comm;

/* A communicator over a caller's transport (the table is copied; its
** destroy runs in sta_comm_destroy).  On error t->destroy is not called. */
sta_status sta_comm_create(sta_comm **out, const sta_transport *t);
/* size (1..64) communicators of one in-process world, comms[r] is rank r.
** Each rank's collectives must run on its own thread (see
** sta_comm_loopback_run); a wait longer than $STA_DIST_TIMEOUT seconds
** (default 300) fails.  Moves CPU and CUDA memory, strided blocks in place.
** Destroy each one.  On error none is made. */
sta_status sta_comm_loopback(sta_comm **comms, int32_t size);
/* NCCL rank of size ranks.  The ranks meet at id_file (NULL for a world
** of one): a file path (rank 0 listens on 127.0.0.1 and writes its port
** there atomically, the others wait for the file) or tcp://HOST:PORT
** (rank 0 listens on PORT: of HOST when HOST is a loopback address, else
** of every interface; the others connect, retrying).  Every wait is
** bounded by $STA_DIST_TIMEOUT seconds.  Rank 0 sends the NCCL unique id;
** the sockets stay as the world's host links, which move CPU memory (NCCL
** moves CUDA memory).  device: the CUDA device to use (-1 = keep the
** current one).  No NCCL library or no GPU: STA_ERR_BACKEND saying which;
** a rendezvous that fails (timeout, address in use, a rank of another
** world size): STA_ERR_IO saying so. */
sta_status sta_comm_nccl(sta_comm **out, int32_t rank, int32_t size,
                         const char *id_file, int32_t device);
/* TCP rank of size (1..64) ranks: the rendezvous of sta_comm_nccl, then
** every collective through rank 0 over those sockets; CPU memory only.  For
** processes without GPUs: tests, the launcher on a CPU machine. */
sta_status sta_comm_tcp(sta_comm **out, int32_t rank, int32_t size,
                        const char *id_file);
/* The world the launcher's environment describes, from the first of these
** families that is set (its rank and size variables both, else
** STA_ERR_ENV naming the missing one): scripts/sta-launch (STA_RANK,
** STA_WORLD_SIZE, STA_LOCAL_RANK), torchrun (RANK, WORLD_SIZE,
** LOCAL_RANK), mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
** OMPI_COMM_WORLD_LOCAL_RANK), srun (SLURM_PROCID, SLURM_NTASKS,
** SLURM_LOCALID).  local_rank defaults to the rank; none set: rank 0 of
** 1.  *family: 0 none, 1 sta-launch, 2 torchrun, 3 mpirun, 4 srun.  On
** error nothing is written. */
sta_status sta_comm_env(int32_t *rank, int32_t *size, int32_t *local_rank,
                        int32_t *family);
/* A communicator for sta_comm_env's world.  The ranks meet at
** STA_DIST_ID_FILE (scripts/sta-launch) or else at
** tcp://MASTER_ADDR:PORT, PORT being STA_MASTER_PORT or MASTER_PORT + 1
** (torchrun's agent, or torch.distributed, holds MASTER_PORT itself); a
** world of one needs neither.  STA_DIST_BACKEND: "nccl" (the default; the
** CUDA device is the local rank modulo the visible devices), "tcp", or
** "loopback" for a world of one. */
sta_status sta_comm_from_env(sta_comm **out);
void sta_comm_destroy(sta_comm *c);
int32_t sta_comm_rank(const sta_comm *c);
int32_t sta_comm_size(const sta_comm *c);
/* The transport's name, e.g. "loopback". */
const char *sta_comm_name(const sta_comm *c);
/* Head chunks of the SP pipeline: n >= 1 (it must divide each rank's
** heads), or 0 (the default) to choose: 1 on the CPU and in a world of
** one, else the largest divisor of the rank's heads up to 4.  In a world
** of one, n > 1 still runs the pipeline (to test it).  SP layers run one
** chunk.  Every rank must use the same n (the SP call checks).  n outside
** 0..64: STA_ERR_ARGUMENT and the setting unchanged. */
sta_status sta_comm_set_chunks(sta_comm *c, int32_t n);
int32_t sta_comm_chunks(const sta_comm *c);
sta_status sta_comm_barrier(sta_comm *c);
/* Tensor collectives: contiguous tensors of one dtype, on a device the
** transport moves.  all_to_all: send and recv have equal numel, a multiple
** of the size; all_gather: recv numel = size * send numel.  A bad argument
** changes nothing; a transport that fails midway may leave recv partly
** written. */
sta_status sta_comm_all_to_all(sta_comm *c, const sta_tensor *send,
                               sta_tensor *recv);
sta_status sta_comm_all_gather(sta_comm *c, const sta_tensor *send,
                               sta_tensor *recv);
/* Run fn(arg, r, comms[r]) for every rank on its own thread and wait for
** all.  When a rank fails the world is aborted (ranks waiting in a
** collective return STA_ERR_STATE) and the first failing rank's status is
** returned with its message prefixed "rank r: ". */
typedef sta_status (*sta_rank_fn)(void *arg, int32_t rank, sta_comm *comm);
sta_status sta_comm_loopback_run(sta_comm *const *comms, int32_t size,
                                 sta_rank_fn fn, void *arg);

/* Rank's shard of a full [B, S, H, D] tensor (canvas of g): local is
** [B, V/size + S - V, H, D] in layout.  unshard writes a shard back into
** full (its video rows and, all ranks holding the same, the text rows).
** On error the destination is unchanged. */
sta_status sta_sp_shard(sta_tensor *local, const sta_tensor *full,
                        const sta_geometry *g, sta_layout layout,
                        int32_t rank, int32_t size);
sta_status sta_sp_unshard(sta_tensor *full, const sta_tensor *local,
                          const sta_geometry *g, sta_layout layout,
                          int32_t rank, int32_t size);
/* Ulysses STA: desc as for sta_attention_forward on the whole problem
** (global canvas and text_len; n_windows 1 or the global heads H); q, k,
** v, out this rank's shards (the head dimension contiguous; out shares no
** memory with q, k or v).  Before any data moves, the ranks exchange a
** descriptor of their call (shapes, dtype, layout, device, geometry,
** windows, scale, chunks) and all return the same error when they
** disagree ("ranks disagree on ..."), or when one rank's own checks fail
** ("rank r: <its error>"; in a loopback world that rank returns at once
** and its run aborts the others).  After such an error nothing has moved,
** out is unchanged and the communicator is ready for the next call.  The
** ranks agree again after each head chunk's compute: when one failed or
** was cancelled (sta_cancel on its process), every rank returns its error
** at once ("rank r: sp attention: cancelled (sta_cancel) ..."), out holding
** the heads of the chunks that finished before it (the message says how
** many; none: out unchanged), and the next call works.  A transport or
** device failure while data moves may leave out partly written.  The buffers (the gathered q, k, v, out of two chunks
** and the pack buffer) stay in c for the next call, grown as needed, until
** sta_comm_destroy. */
sta_status sta_sp_attention(sta_comm *c, const sta_attention_desc *desc,
                            const sta_tensor *q, const sta_tensor *k,
                            const sta_tensor *v, sta_tensor *out);

/* An STA layer under sequence parallelism: desc as for sta_layer_create
** with local_heads = H / size and an explicit canvas; sp_rank and sp_size
** are taken from c (the SP layer holds a reference to it).  forward takes
** shards as sta_sp_attention does (the descriptor also compares the layer
** index and the context's step) and runs sta_layer_forward (live context,
** strategy or metadata row, search mode) on this rank's global heads. */
typedef struct sta_sp_layer sta_sp_layer;
sta_status sta_sp_layer_create(sta_sp_layer **out, sta_comm *c,
                               const sta_layer_desc *desc);
void sta_sp_layer_destroy(sta_sp_layer *l);
/* The wrapped layer (e.g. for sta_layer_set_strategy). */
sta_layer *sta_sp_layer_base(const sta_sp_layer *l);
sta_status sta_sp_layer_forward(sta_sp_layer *l, const sta_tensor *q,
                                const sta_tensor *k, const sta_tensor *v,
                                sta_tensor *out);

/* }====================================================================== */

/* STA_DECLS_END */

#ifdef __cplusplus
}
#endif

#endif /* STA_H */
