/*
** tma_map.h -- TMA tensor maps of STA operands straight from untiled
** memory (core/sta.h's [B, S, heads, D] views, any strides TMA allows), in
** the layout the wgmma kernels read: boxes of 64 columns, 128-byte swizzle.
** Host only; the driver's encoder is looked up at run time (no -lcuda).
*/
#ifndef STA_TMA_MAP_H
#define STA_TMA_MAP_H

#include <cuda.h>

#include "sta_cuda.h"

namespace sta {

/* One map of base (a tensor of p's shape and dtype, strides sb, ss, sh in
** elements).  tile: dims (C0, W, H, T, N) with a 64 x 8 x 8 x rows/64 x 1
** box, so one box is rows/64 t-slices of an 8x8 tile of one head, rows past
** the canvas zero-filled; else rows: dims (C0, S, N) with a 64 x rows x 1
** box.  fused: C0 = heads*D and N = batch (stride sb: the head is a column
** offset, head*D); else C0 = D and N = nhb (stride sh: heads, with the
** batch folded in when sb = heads*sh).  extent (rows maps only): the rows
** the map reaches, rows past it read as zeros (0: seq_len; K and V pass
** the rows that can be keys, so that the rows past the valid text, never
** keys and never read, cannot bring a NaN into P V as 0 x NaN).  False
** when the driver refuses. */
bool tma_encode(CUtensorMap *m, const void *base, const sta_attn_params *p, int64_t sb,
                int64_t ss, int64_t sh, int fused, int64_t nhb, int tile, int rows = 128,
                int64_t extent = 0);

/* A 3-D map of bytes at base (16-byte aligned): dims[0] contiguous,
** strides (bytes, multiples of 16) of dims 1 and 2, boxes of box[0..2]
** with the 128-byte swizzle (box[0] 128) or the 64-byte one (box[0] 64);
** out-of-range elements read as zero.  False when the driver refuses. */
bool tma_encode_bytes(CUtensorMap *m, const void *base, const uint64_t dims[3],
                      const uint64_t strides[2], const uint32_t box[3]);

/* A map of bf16 (bf16 true) or f16 elements at base with rank (2..5)
** dims (dims[0] contiguous), byte strides of dims 1.. (multiples of 16),
** boxes of box[0] (64: 128 bytes, the 128-byte swizzle) x box[1..];
** coordinates may start before a dim (negative) or run past it: those
** elements read as zero.  False when the driver refuses. */
bool tma_encode_nd(CUtensorMap *m, const void *base, bool bf16, int rank, const uint64_t *dims,
                   const uint64_t *strides, const uint32_t *box);

} /* namespace sta */

#endif
