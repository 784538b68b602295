/*
** cpu_common.h -- what the CPU forward and backward share: the compact
** tiled row order of one (batch, head), its work items, the key ranges of
** a query item, row loads, the OpenBLAS thread guard and the vectorised
** 2^x.  Internal; not installed.
**
** Compact order: the video tokens tile by tile (each tile holding only
** its existing tokens, in (t, h, w) order), then the text rows.  The key
** tiles of one window row along w are one contiguous block, and a full
** window is a single block.  Compact row r is sequence row token[r] (r <
** V) or r - V + video_rows: FastVideo's tiled order is the compact order
** with the partial tiles padded, so a tiled input maps the same way.
**
** Block lists (STA_MASK_BLOCKS, STA_MASK_WINDOW_OR_BLOCKS; mask.h): the
** query blocks' valid rows block after block are the compact query order,
** the key blocks' the compact key order (no text), so a run of listed
** blocks is one range of keys.  The plan holds each query block's list
** sorted (for the union only the blocks its window lacks, the rule asked
** once per listed block) and each key block's inverse, the query blocks
** that list it, sorted: the ranges the forward and the backward walk.
*/
#ifndef STA_CPU_COMMON_H
#define STA_CPU_COMMON_H

#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "internal.h"

#ifndef STA_CPU_QB
#define STA_CPU_QB 256 /* query rows per work item (a 384 tile: 2 x 192) */
#endif
#ifndef STA_CPU_KC
#define STA_CPU_KC 512 /* keys per GEMM chunk */
#endif
#ifndef STA_CPU_KV_GROUP_BYTES
/* per-(batch, head) buffers gathered at once: as many heads as fit, so a
** small problem is one parallel loop over every head's items */
#define STA_CPU_KV_GROUP_BYTES ((size_t)32 << 20)
#endif

typedef struct sta_cpu_item {
  int64_t row;   /* first row in the compact query order */
  int64_t count; /* rows */
  int64_t tile;  /* query tile id, -1 for text rows */
} sta_cpu_item;

typedef struct sta_cpu_plan {
  const sta_attn_params *p;
  int64_t ntiles, keys;   /* query blocks (tiles); keys: V + text_len (lists: valid key rows) */
  int64_t rows;           /* compact query rows: V + text rows (every query) */
  int64_t *tile_off;      /* ntiles + 1 query row offsets, compact order */
  int64_t nkb;            /* key blocks (the window: the tiles) */
  int64_t *key_off;       /* nkb + 1 key row offsets (the window: tile_off) */
  int64_t *token, *ktoken; /* compact query / key row -> sequence row, r < nmap */
  int64_t nmap, tail;     /* row r >= nmap (text) is sequence row r - nmap + tail */
  int64_t *pad, npad;     /* sequence rows that are no query: padding (out, dq 0) */
  int64_t *kpad, nkpad;   /* sequence key rows that are padding (dk, dv 0) */
  int64_t keys_end;       /* sequence rows from here on are no keys (dk, dv 0) */
  sta_cpu_item *items;
  int64_t nitems, max_ranges, max_qranges;
  float *kf, *vf;         /* keys x D */
  /* block lists: per list row (b, h, m), ln[row] key blocks at lids[row *
  ** L], sorted (the union: those outside the window); per (b, h) and key
  ** block n, the query blocks that list it at inv[bh * Mq * L + ioff[bh *
  ** (Mk + 1) + n] ..], sorted */
  int32_t *ln, *lids, *inv;
  int64_t *ioff;
} sta_cpu_plan;

/* 2^x for x <= 0, branch-free so loops over it vectorise; relative error
** ~2e-7.  Below -126 it returns 2^-126, which only meets zero sums. */
static inline float exp2_neg(float v) {
  /* NaN (a NaN or +Inf logit) comes back as NaN without reaching the int
  ** conversion below, which is undefined for NaN (UBSan); selects, so the
  ** loops still vectorise */
  int nan = v != v;
  float x = nan || v < -126.0f ? -126.0f : v;
  float n = (x + 12582912.0f) - 12582912.0f; /* round to nearest */
  float f = x - n;                           /* [-0.5, 0.5] */
  float y = 1.535336188319500e-4f; /* Cephes exp2f */
  y = y * f + 1.339887440266574e-3f;
  y = y * f + 9.618437357674640e-3f;
  y = y * f + 5.550332471162809e-2f;
  y = y * f + 2.402264791363012e-1f;
  y = y * f + 6.931472028550421e-1f;
  y = y * f + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float s;
  memcpy(&s, &bits, 4);
  return nan ? v : y * s;
}

#ifdef __AVX512F__
/* 2^x of 16 lanes (x <= 0): the same polynomial, scalef does the exponent
** and flushes below 2^-149 to zero; NaN stays NaN. */
static inline __m512 exp2_neg16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x); /* -Inf -> 0, NaN stays */
  __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_sub_ps(x, n);
  __m512 y = _mm512_set1_ps(1.535336188319500e-4f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.339887440266574e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(9.618437357674640e-3f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(5.550332471162809e-2f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.402264791363012e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(6.931472028550421e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}
#endif


/* Block offsets, compact-row -> sequence-row maps, the padding rows, the
** query work items (text rows first: the largest items start first), the
** sorted lists and their inverse (list kinds) and kf/vf (keys x D
** floats).  On failure returns STA_ERR_NOMEM (no message); free with
** sta_cpu_plan_free either way. */
sta_status sta_cpu_plan_make(sta_cpu_plan *pl, const sta_attn_params *p);
void sta_cpu_plan_free(sta_cpu_plan *pl);
/* Work items over the compact rows of nblocks blocks at offsets off: the
** text_rows rows from off[nblocks] (tile -1) in blocks of STA_CPU_QB
** first, then each block in equal parts of at most STA_CPU_QB rows.  The
** forward's query items take every row after the video; the backward's key
** items only the valid text keys.  *out from sta_malloc; STA_ERR_NOMEM (no
** message) on failure. */
sta_status sta_cpu_items(const int64_t *off, int64_t nblocks, int64_t text_rows,
                         sta_cpu_item **out, int64_t *count);
/* Key row ranges [lo, hi) (compact order) that query block `tile` (-1: text
** rows, every key) of (b, head) sees, in order, merged where adjacent; at
** most pl->max_ranges. */
int64_t sta_cpu_key_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t tile,
                           int64_t *lo, int64_t *hi);
/* Query row ranges [lo, hi) (compact order) that see key block `kb` (-1:
** text keys, every query) of (b, head), in order, merged where adjacent;
** at most pl->max_qranges. */
int64_t sta_cpu_query_ranges(const sta_cpu_plan *pl, int64_t b, int64_t head, int64_t kb,
                             int64_t *lo, int64_t *hi);
/* Sequence row of compact query row r, and of compact key row r. */
static inline int64_t sta_cpu_row_token(const sta_cpu_plan *pl, int64_t r) {
  return r < pl->nmap ? pl->token[r] : r - pl->nmap + pl->tail;
}
static inline int64_t sta_cpu_key_token(const sta_cpu_plan *pl, int64_t r) {
  return r < pl->nmap ? pl->ktoken[r] : r - pl->nmap + pl->tail;
}
/* Zero the D elements of row t of (b, h) of an operand at base (strides
** sb, ss, sh in elements, d stride 1). */
static inline void sta_cpu_zero_row(const sta_attn_params *p, void *base, int64_t sb,
                                    int64_t ss, int64_t sh, int64_t b, int64_t t, int64_t h) {
  memset((char *)base + (b * sb + t * ss + h * sh) * (int64_t)sta_dtype_size(p->dtype), 0,
         sta_dtype_size(p->dtype) * (size_t)p->head_dim);
}
/* Convert one row of D elements at src (dtype dt) into f32 dst, times s. */
void sta_cpu_load_row(float *dst, const char *src, sta_dtype dt, int64_t D, float s);
/* Store D floats times s as dtype dt at dst. */
void sta_cpu_store_row(char *dst, sta_dtype dt, const float *src, int64_t D, float s);
/* Hold OpenBLAS at one thread while any CPU attention runs (enter 1) and
** restore its setting when the last one leaves (enter 0). */
void sta_cpu_blas_single(int enter);

#endif
