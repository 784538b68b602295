/*
** bsa_inv.h -- the block-sparse backward's index arithmetic, plain C for the
** host tests (spec/test_gpu_blocks.c's test_inverse emulates the whole
** inversion and every CTA's walk with these) and __host__ __device__ under
** nvcc (bsa_bwd_api.cu's inversion kernels, kernel_bsa_bwd.cuh):
**   - which key block entry i of query block m's row names (the list's
**     entries, then for the union the window's tiles);
**   - a key block's rank among a query block's (the deterministic turns);
**   - the 64-row parts of a query block (the producer's walk, the count);
**   - where (row r, column c) of a staged 64 x W dQ block is.
*/
#ifndef STA_BSA_INV_H
#define STA_BSA_INV_H

#include <stdint.h>

#include "bsa_walk.h"

/* Entry i (< L + the window's tiles) of row (bh, m) of the lists: its key
** block, or -1 (past the row's count, past the window's tiles). num_row:
** the row's count, idx_row its L entries; uni: the union (g the tile grid,
** win the head's clamped window). */
STA_HD int32_t bsa_inv_entry(int64_t i, int64_t L, int32_t num_row, const int32_t *idx_row,
                             int uni, int32_t m, const int32_t g[3], const int16_t *win) {
  if (i < L) return i < num_row ? idx_row[i] : -1;
  if (!uni) return -1;
  int32_t st[3], k[3];
  bsa_window_box(m, g, win, st, k);
  const int64_t e = i - L;
  if (e >= (int64_t)k[0] * k[1] * k[2]) return -1;
  return bsa_window_tile((int32_t)e, g, st, k);
}

/* Population count of a 32-bit word (the device's __popc). */
STA_HD int32_t bsa_popc(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __popc(x);
#else
  return __builtin_popcount(x);
#endif
}

/* The rank of key block n among those that query block m sees: the bits
** below n of m's row of the transposed bitmap (qrow, ceil(Mk / 32) words). */
STA_HD int32_t bsa_inv_rank(const uint32_t *qrow, int32_t n) {
  int32_t r = bsa_popc(qrow[n >> 5] & ((1u << (n & 31)) - 1u));
  for (int32_t y = 0; y < (n >> 5); y++) r += bsa_popc(qrow[y]);
  return r;
}

/* 64-row parts of a query block with qs valid rows (at least one: a part
** is walked even for qs 0, as the count below says). */
STA_HD int32_t bsa_bwd_parts(int32_t qs) { return qs > 64 ? (qs + 63) >> 6 : 1; }

/* The producer's walk over a CTA's query blocks: entries [e, e1) of the
** inverse (k2q), each query block's parts; bv the block rows, q_sizes NULL
** for whole blocks. */
typedef struct bsa_qwalk {
  int32_t e, e1, m, j, nj;
} bsa_qwalk;
STA_HD void bsa_qwalk_enter(bsa_qwalk *w, const int32_t *k2q, const int32_t *q_sizes, int32_t bv) {
  if (w->e >= w->e1) return;
  w->m = k2q[w->e];
  w->nj = bv == 64 ? 1 : q_sizes ? bsa_bwd_parts(q_sizes[w->m]) : bv / 64;
  w->j = 0;
}
STA_HD void bsa_qwalk_start(bsa_qwalk *w, int32_t e0, int32_t e1, const int32_t *k2q,
                            const int32_t *q_sizes, int32_t bv) {
  w->e = e0;
  w->e1 = e1;
  w->m = w->j = w->nj = 0;
  bsa_qwalk_enter(w, k2q, q_sizes, bv);
}
STA_HD void bsa_qwalk_next(bsa_qwalk *w, const int32_t *k2q, const int32_t *q_sizes, int32_t bv) {
  if (++w->j < w->nj) return;
  ++w->e;
  bsa_qwalk_enter(w, k2q, q_sizes, bv);
}
/* The walk's length: the consumers' loop count (the same sum). */
STA_HD int32_t bsa_qwalk_count(int32_t e0, int32_t e1, const int32_t *k2q, const int32_t *q_sizes,
                               int32_t bv) {
  if (bv == 64 || !q_sizes) return (e1 - e0) * (bv / 64);
  int32_t c = 0;
  for (int32_t e = e0; e < e1; e++) c += bsa_bwd_parts(q_sizes[k2q[e]]);
  return c;
}

/* f32 offset of (row r, column c) in a 64 x W staged dQ block: 8-float
** chunks XOR-swizzled by row (kernels/bwd_slots.cuh's dq_off, the same
** layout, so prep and post of both backwards agree). */
STA_HD int32_t bsa_dq_off(int32_t W, int32_t r, int32_t c) {
  return r * W + ((((c >> 3) ^ (r & (W / 8 - 1)))) << 3) + (c & 7);
}

#endif
