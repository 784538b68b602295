/*
** mask.h -- the mask's one home: which key blocks a query block sees
** (STA.md sections 2, 10 and 12), written once for the C core and the CUDA
** kernels.  Plain C, no CUDA headers; every function is STA_HD (static
** inline on the host, __host__ __device__ under nvcc).  Internal; not
** installed.
**
** The window rule, on one axis of c tiles with the window k clamped to the
** axis (1 <= k <= c, sta_window_span): query tile q sees the k tiles
** [start(q), start(q) + k), start(q) = min(max(q - k/2, 0), c - k).  Since
** start never decreases with q, the query tiles whose window holds key
** tile kt are one range [lo, hi] (sta_window_seen_by), never empty (kt
** sees itself).  A 3-D window is the product of its three axes
** (sta_window_holds_tile: membership between two tiles of a grid).
**
** Block lists (sta.h, sta_block_list; resolved into sta_attn_params):
** query block m of (batch b, head h) sees the key blocks idx[row*L + i],
** i < num[row], row = (b*heads + h)*Mq + m (sta_list_row); block n's valid
** rows are its first size(n) rows (a prefix, FastVideo's VSA cube order),
** size(n) = sizes[n], or the whole block when sizes is NULL.
*/
#ifndef STA_MASK_H
#define STA_MASK_H

#include <stdint.h>

#ifndef STA_HD
#if defined(__CUDACC__)
#define STA_HD static __host__ __device__ __forceinline__
#else
#define STA_HD static inline
#endif
#endif

/* ---- the window rule ----------------------------------------------------- */

/* The window k (>= 1) clamped to an axis of c tiles: the tiles it sees. */
STA_HD int32_t sta_window_span(int32_t k, int32_t c) { return k < c ? k : c; }

/* First key tile of query tile q (0 <= q < c) for a window of k tiles,
** 1 <= k <= c (clamped: sta_window_span). */
STA_HD int32_t sta_window_start(int32_t q, int32_t k, int32_t c) {
  int32_t s = q - k / 2;
  s = s < 0 ? 0 : s;
  return s < c - k ? s : c - k;
}

/* Does query tile q's window (k clamped, as above) hold key tile kt? */
STA_HD int sta_window_holds(int32_t q, int32_t kt, int32_t k, int32_t c) {
  int32_t s = sta_window_start(q, k, c);
  return kt >= s && kt < s + k;
}

/* The query tiles [*lo, *hi] whose window (k clamped, as above) holds key
** tile kt (0 <= kt < c), in closed form.  lo: the first q with start(q) >
** kt - k, which is 0 while kt - k + 1 <= 0 (start(0) = 0), else kt - k + 1 +
** k/2 (start grows by one per q there and cannot be clamped to c - k below
** it); hi: the last q with start(q) <= kt, which is c - 1 once kt >= c - k
** (no start exceeds c - k), else kt + k/2 (start unclamped). */
STA_HD void sta_window_seen_by(int32_t kt, int32_t k, int32_t c, int32_t *lo, int32_t *hi) {
  const int32_t a = kt - k + 1;
  *lo = a <= 0 ? 0 : a + k / 2;
  *hi = kt >= c - k ? c - 1 : kt + k / 2;
}

/* Does the window win (per axis, not clamped) of query tile m hold key
** tile n, tiles numbered (t*NH + h)*NW + w on grid g (the union's rule)? */
STA_HD int sta_window_holds_tile(const int32_t g[3], const int32_t *win, int64_t m, int64_t n) {
  const int64_t hw = (int64_t)g[1] * g[2];
  const int32_t q[3] = {(int32_t)(m / hw), (int32_t)((m / g[2]) % g[1]), (int32_t)(m % g[2])};
  const int32_t k[3] = {(int32_t)(n / hw), (int32_t)((n / g[2]) % g[1]), (int32_t)(n % g[2])};
  for (int i = 0; i < 3; i++)
    if (!sta_window_holds(q[i], k[i], sta_window_span(win[i], g[i]), g[i])) return 0;
  return 1;
}

/* ---- block lists --------------------------------------------------------- */

/* Row of (batch b, head h, query block m) in num, and (times L) in idx. */
STA_HD int64_t sta_list_row(int64_t b, int64_t h, int64_t m, int64_t heads, int64_t q_blocks) {
  return (b * heads + h) * q_blocks + m;
}
/* Entries of list row `row` (validated: 0..L). */
STA_HD int32_t sta_list_count(const int32_t *num, int64_t row) { return num[row]; }
/* Key block of entry i of list row `row` (L entries a row). */
STA_HD int32_t sta_list_block(const int32_t *idx, int64_t list_len, int64_t row, int32_t i) {
  return idx[row * list_len + i];
}
/* Valid rows of block n: its first sizes[n] rows, all block_rows when
** sizes is NULL. */
STA_HD int32_t sta_block_valid(const int32_t *sizes, int64_t n, int32_t block_rows) {
  return sizes ? sizes[n] : block_rows;
}

#endif
