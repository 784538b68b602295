/*
** bsa_walk.h -- the index arithmetic of the block-sparse kernels (BLOCKS
** and WINDOW_OR_BLOCKS masks, STA.md section 12), plain C for the host
** tests and __host__ __device__ under nvcc: the work items, how a block of
** the list is cut into the kernel's key blocks, where each is loaded from
** and which of its columns are masked, the union's window tiles.
**
** A key block of the kernel holds BK rows (64, or 128 for block_rows a
** multiple of 128).  Block n of the list (block_rows bv, valid rows its
** first s = size(n)) is cut into ceil(s / BK) of them; sub-block j covers
** the block's rows [j BK, j BK + c), c = min(BK, s - j BK).  A whole one
** (c = BK) is loaded from row j BK of the block; a partial one (only the
** last) is loaded "right-aligned", from row r0 = s - BK, so that its valid
** rows land at the END of the BK rows in shared memory and nothing past
** row s of the block is ever read (those rows are padding and may hold
** anything, NaN included): rows r0 + x < 0 lie before the block and TMA
** fills them with zeros (negative box coordinates in the block's own
** dimension of a 4-D map), rows in [r0, j BK) (r0 >= 0) are valid keys
** already seen in sub-block j - 1; both are masked: the columns x < lo =
** BK - c.  So one rule (mask the first lo columns) serves every partial
** block and the loads never need a zero fill by the threads.
*/
#ifndef STA_BSA_WALK_H
#define STA_BSA_WALK_H

#include <stdint.h>

#include "mask.h" /* the window rule (sta_window_start) and STA_HD */

/* Key blocks of BK rows in a block of s valid rows. */
STA_HD int32_t bsa_subs(int32_t s, int32_t bk) { return (s + bk - 1) / bk; }

/* Sub-block j (< bsa_subs(s, bk)) of a block with s valid rows: *r0 its
** first row in the block (negative: zero rows before it), *lo the columns
** to mask (0 for a whole sub-block). */
STA_HD void bsa_sub(int32_t s, int32_t j, int32_t bk, int32_t *r0, int32_t *lo) {
  int32_t c = s - j * bk;
  c = c < bk ? c : bk;
  *r0 = c == bk ? j * bk : s - bk;
  *lo = bk - c;
}

/* Work item number item -> (batch b, head h, query block m, part q of the
** block): items in order (b, h, m, q), parts = block_rows / query rows per
** item (1 for 64-row blocks, block_rows / 128 else). */
STA_HD void bsa_item(int64_t item, int32_t q_blocks, int32_t parts, int32_t heads, int32_t *b,
                     int32_t *h, int32_t *m, int32_t *q) {
  const int64_t per = (int64_t)q_blocks * parts, bh = item / per, r = item - bh * per;
  *b = (int32_t)(bh / heads);
  *h = (int32_t)(bh - (int64_t)*b * heads);
  *m = (int32_t)(r / parts);
  *q = (int32_t)(r - (int64_t)*m * parts);
}

/* Valid query rows of part q (qr rows) of a query block with qs valid rows. */
STA_HD int32_t bsa_part_rows(int32_t qs, int32_t q, int32_t qr) {
  int32_t c = qs - q * qr;
  return c < 0 ? 0 : (c < qr ? c : qr);
}

/* ---- the union (WINDOW_OR_BLOCKS): blocks are the tiles of a grid ---- */

/* Tile n of a grid nt x nh x nw -> its coordinates. */
STA_HD void bsa_tile(int32_t n, int32_t nh, int32_t nw, int32_t *t, int32_t *h, int32_t *w) {
  *t = n / (nh * nw);
  *h = (n / nw) % nh;
  *w = n % nw;
}

/* The window of query tile m as a box (STA.md section 2's rule, core/
** mask.h): first tile st[3] and extent k[3] (win: the head's window
** clamped to the grid g[3]). */
STA_HD void bsa_window_box(int32_t m, const int32_t g[3], const int16_t *win, int32_t st[3],
                           int32_t k[3]) {
  int32_t q[3];
  bsa_tile(m, g[1], g[2], &q[0], &q[1], &q[2]);
  for (int i = 0; i < 3; i++) {
    k[i] = win[i];
    st[i] = sta_window_start(q[i], k[i], g[i]);
  }
}

/* Tile e (< k[0] k[1] k[2]) of the window box, in (t, h, w) order. */
STA_HD int32_t bsa_window_tile(int32_t e, const int32_t g[3], const int32_t st[3],
                               const int32_t k[3]) {
  const int32_t i0 = e / (k[1] * k[2]), i1 = (e / k[2]) % k[1], i2 = e % k[2];
  return ((st[0] + i0) * g[1] + st[1] + i1) * g[2] + st[2] + i2;
}

/* Is tile n in the window box? */
STA_HD int bsa_window_has(int32_t n, const int32_t g[3], const int32_t st[3], const int32_t k[3]) {
  int32_t t, h, w;
  bsa_tile(n, g[1], g[2], &t, &h, &w);
  return t >= st[0] && t < st[0] + k[0] && h >= st[1] && h < st[1] + k[1] && w >= st[2] &&
         w < st[2] + k[2];
}

#endif
