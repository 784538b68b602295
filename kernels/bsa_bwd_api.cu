/*
** bsa_bwd_api.cu -- the block-sparse backward on device tensors
** (sta_cuda_block_attention_backward, bsa_bwd_params.h): the limits, the
** workspace, the key-to-query inversion of the lists on the device, the
** arguments and the (dtype, head dim) dispatch.
**
** The inversion, once per call, deterministic (every key block's query
** blocks ascending), no host round trip:
**   1. set: a bit per (b, h, key block n, query block m) that sees it (the
**      list's entries, for the union also the window's tiles), in a
**      bitmap [B H][Mk][ceil(Mq / 32)] (and, deterministic mode, its
**      transpose [B H][Mq][ceil(Mk / 32)]);
**   2. count: a warp per (b, h, n), popc of its row;
**   3. scan: the offsets (one block, exclusive);
**   4. fill: a warp per (b, h, n) writes its query blocks in bit order
**      (ascending m) and, deterministic, the key block's place among the
**      query block's (popc of the transpose's bits below n).
*/
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "args_common.h"
#include "bsa_bwd_params.h"
#include "bsa_inv.h"
#include "tma_map.h"

namespace sta {

struct InvArgs {
  const int32_t *num, *idx;
  int64_t L;
  int heads, bh, Mq, Mk, wq, wk; /* bh = B * H; wq, wk: words of a bitmap row */
  int uni, nwmax;
  int grid[3];
  int16_t win[3 * 1024];
  uint32_t *kq, *qk; /* qk NULL unless deterministic */
  int *cnt, *off, *k2q, *rank;
};

/* 1. thread per (bh, m, i): entry i < num of the list, or window tile i - L */
__global__ void bsa_inv_set(const __grid_constant__ InvArgs a) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t per = a.L + a.nwmax, row = t / per;
  const int64_t i = t - row * per;
  if (row >= (int64_t)a.bh * a.Mq) return;
  const int bh = (int)(row / a.Mq), m = (int)(row - (int64_t)bh * a.Mq);
  const int n = bsa_inv_entry(i, a.L, i < a.L ? a.num[row] : 0, a.idx + row * a.L, a.uni, m,
                              a.grid, a.win + 3 * (bh % a.heads));
  if (n < 0) return;
  atomicOr(&a.kq[((int64_t)bh * a.Mk + n) * a.wq + (m >> 5)], 1u << (m & 31));
  if (a.qk) atomicOr(&a.qk[((int64_t)bh * a.Mq + m) * a.wk + (n >> 5)], 1u << (n & 31));
}

/* 2. warp per (bh, n): query blocks that see it */
__global__ void bsa_inv_count(const __grid_constant__ InvArgs a) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (int64_t)a.bh * a.Mk) return;
  const uint32_t *row = a.kq + w * a.wq;
  int c = 0;
  for (int x = lane; x < a.wq; x += 32) c += __popc(row[x]);
  c = __reduce_add_sync(0xffffffffu, c);
  if (lane == 0) a.cnt[w] = c;
}

/* 3. one block of 1024: off[i] = sum of cnt[< i], off[n] = the total */
__global__ void bsa_inv_scan(const __grid_constant__ InvArgs a, int64_t n) {
  __shared__ int part[1024];
  const int t = threadIdx.x;
  const int64_t per = (n + 1023) / 1024, lo = t * per, hi = lo + per < n ? lo + per : n;
  int s = 0;
  for (int64_t i = lo; i < hi; i++) s += a.cnt[i];
  part[t] = s;
  __syncthreads();
  for (int d = 1; d < 1024; d <<= 1) { /* inclusive scan of the parts */
    const int v = t >= d ? part[t - d] : 0;
    __syncthreads();
    part[t] += v;
    __syncthreads();
  }
  int run = part[t] - s;
  for (int64_t i = lo; i < hi; i++) {
    a.off[i] = run;
    run += a.cnt[i];
  }
  if (t == 1023) a.off[n] = part[1023];
}

/* 4. warp per (bh, n): its query blocks ascending (and their ranks) */
__global__ void bsa_inv_fill(const __grid_constant__ InvArgs a) {
  const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= (int64_t)a.bh * a.Mk) return;
  const int bh = (int)(w / a.Mk), n = (int)(w - (int64_t)bh * a.Mk);
  const uint32_t *row = a.kq + w * a.wq;
  int pos = a.off[w];
  for (int x0 = 0; x0 < a.wq; x0 += 32) {
    const uint32_t bits = x0 + lane < a.wq ? row[x0 + lane] : 0u;
    const int c = __popc(bits);
    int pre = c; /* inclusive prefix over the lanes */
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, pre, d);
      if (lane >= d) pre += v;
    }
    int p = pos + pre - c;
    for (uint32_t b = bits; b; b &= b - 1, p++) {
      const int m = (x0 + lane) * 32 + __ffs(b) - 1;
      a.k2q[p] = m;
      if (a.qk) a.rank[p] = bsa_inv_rank(a.qk + ((int64_t)bh * a.Mq + m) * a.wk, n);
    }
    pos += __shfl_sync(0xffffffffu, pre, 31);
  }
}

/* The row maps of Q and dO (64 rows, as the forward's Q map). */
static void bsa_bwd_tma(BsaBwdArgs &x, const sta_attn_params *p) {
  x.tma = 0;
  if (!x.vec || (sta_cuda_tma_test() & STA_TEST_NO_TMA)) return; /* the tests' gather-only runs */
  const int64_t D = p->head_dim, H = p->heads;
  const int fused = p->q_sh == D && p->do_sh == D;
  const int fold = p->batch == 1 || (p->q_sb == H * p->q_sh && p->do_sb == H * p->do_sh);
  if (!fused && !fold) return;
  x.tma_fused = fused;
  const uint64_t c0 = (uint64_t)(fused ? H * D : D), nn = (uint64_t)(fused ? p->batch : p->batch * H);
  const uint32_t box[3] = {64, 64, 1};
  const bool bf = p->dtype == STA_BF16;
  const uint64_t dq[3] = {c0, (uint64_t)p->seq_len, nn};
  const uint64_t sq[2] = {(uint64_t)p->q_ss * 2, (uint64_t)(fused ? p->q_sb : p->q_sh) * 2};
  const uint64_t so[2] = {(uint64_t)p->do_ss * 2, (uint64_t)(fused ? p->do_sb : p->do_sh) * 2};
  x.tma = tma_encode_nd(&x.rmq, p->q, bf, 3, dq, sq, box) &&
          tma_encode_nd(&x.rmdo, p->dout, bf, 3, dq, so, box);
}

} /* namespace sta */

using namespace sta;

sta_status sta_cuda_block_attention_backward(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE, "backward: dtype %s not supported on cuda (use bf16 or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: head_dim %lld not supported on cuda (64 or 128)",
                     (long long)p->head_dim);
  if (p->block_rows != 64 && (p->block_rows % 128 != 0 || p->block_rows > 1024))
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: block_rows %d not supported on cuda (64 or a multiple of 128 "
                     "up to 1024)",
                     (int)p->block_rows);
  if (p->heads > 1024)
    return sta_error(STA_ERR_UNSUPPORTED, "backward: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, 1024);
  if (p->seq_len > 0x3fffffff || p->kv_len > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "backward: seq_len %lld or kv_len %lld too long for the CUDA backend",
                     (long long)p->seq_len, (long long)p->kv_len);
  if (p->batch == 0 || p->heads == 0 || p->q_blocks == 0) return STA_OK;

  const size_t al = alignof(BsaBwdArgs);
  BsaBwdArgs *xp = (BsaBwdArgs *)aligned_alloc(al, (sizeof(BsaBwdArgs) + al - 1) & ~(al - 1));
  InvArgs *ia = (InvArgs *)malloc(sizeof(InvArgs));
  if (!xp || !ia) {
    free(xp);
    free(ia);
    return sta_error(STA_ERR_NOMEM, "backward: out of host memory");
  }
  memset(xp, 0, sizeof *xp);
  memset(ia, 0, sizeof *ia);
  BsaBwdArgs &x = *xp;
  x.q = p->q; x.k = p->k; x.v = p->v; x.dout = p->dout;
  x.dk = p->dk; x.dv = p->dv;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.do_sb = p->do_sb; x.do_ss = p->do_ss; x.do_sh = p->do_sh;
  x.dk_sb = p->dk_sb; x.dk_ss = p->dk_ss; x.dk_sh = p->dk_sh;
  x.dv_sb = p->dv_sb; x.dv_ss = p->dv_ss; x.dv_sh = p->dv_sh;
  x.heads = (int)p->heads;
  x.batch = (int)p->batch;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->do_sb, p->do_ss, p->do_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) && aligned16(p->dout);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  x.pair4 = ((uintptr_t)p->dk % 4 == 0) && ((uintptr_t)p->dv % 4 == 0);
  const int64_t gs[] = {p->dk_sb, p->dk_ss, p->dk_sh, p->dv_sb, p->dv_ss, p->dv_sh};
  for (int i = 0; i < 6; i++)
    if (gs[i] % 2) x.pair4 = 0;
  x.bv = p->block_rows;
  x.Mq = (int)p->q_blocks;
  x.Mk = (int)p->kv_blocks;
  x.subs = x.bv == 64 ? 1 : x.bv / 128;
  x.q_sizes = p->q_sizes;
  x.kv_sizes = p->kv_sizes;
  x.scale = p->scale;
  x.scale_log2 = p->scale * 1.4426950408889634f;
  bsa_bwd_tma(x, p);

  BsaRowArgs ra;
  memset(&ra, 0, sizeof ra);
  ra.o = p->o; ra.dout = p->dout; ra.lse = p->lse; ra.dq = p->dq;
  ra.o_sb = p->o_sb; ra.o_ss = p->o_ss; ra.o_sh = p->o_sh;
  ra.do_sb = p->do_sb; ra.do_ss = p->do_ss; ra.do_sh = p->do_sh;
  ra.dq_sb = p->dq_sb; ra.dq_ss = p->dq_ss; ra.dq_sh = p->dq_sh;
  ra.lse_sb = p->lse_sb; ra.lse_sh = p->lse_sh; ra.lse_ss = p->lse_ss;
  ra.Sq = (int)p->seq_len;
  ra.rows = p->batch * p->heads * p->seq_len;

  /* the inversion's arguments */
  InvArgs &iv = *ia;
  iv.num = p->num; iv.idx = p->idx; iv.L = p->list_len;
  iv.heads = x.heads; iv.bh = x.batch * x.heads; iv.Mq = x.Mq; iv.Mk = x.Mk;
  iv.wq = (x.Mq + 31) / 32; iv.wk = (x.Mk + 31) / 32;
  iv.uni = p->mask == STA_MASK_WINDOW_OR_BLOCKS;
  if (iv.uni) {
    for (int i = 0; i < 3; i++) iv.grid[i] = p->grid[i];
    clamp_windows(iv.win, p);
    for (int h = 0; h < x.heads; h++) {
      const int v = iv.win[3 * h] * iv.win[3 * h + 1] * iv.win[3 * h + 2];
      iv.nwmax = v > iv.nwmax ? v : iv.nwmax;
    }
  }

  /* the workspace, stream-ordered: dQ accumulator, LSE2, D, turns, bitmaps,
  ** counts, offsets, the inverse (and ranks) */
  cudaStream_t sm = sta_cuda_stream();
  const int64_t rows = ra.rows, nslots = rows / 64, nk = (int64_t)iv.bh * x.Mk;
  const int64_t entries = (int64_t)iv.bh * x.Mq * (p->list_len + iv.nwmax);
  auto up = [](size_t b) { return (b + 255) & ~(size_t)255; };
  const size_t b_acc = up(sizeof(float) * (size_t)rows * (size_t)p->head_dim);
  const size_t b_row = up(sizeof(float) * (size_t)rows);
  const size_t b_turn = p->deterministic ? up(sizeof(int) * (size_t)nslots * 2) : 0;
  const size_t b_kq = up(4 * (size_t)nk * iv.wq);
  const size_t b_qk = p->deterministic ? up(4 * (size_t)iv.bh * x.Mq * iv.wk) : 0;
  const size_t b_cnt = up(4 * (size_t)nk), b_off = up(4 * (size_t)(nk + 1));
  const size_t b_k2q = up(4 * (size_t)(entries > 0 ? entries : 1));
  const size_t b_rank = p->deterministic ? b_k2q : 0;
  const size_t total = b_acc + 2 * b_row + b_turn + b_kq + b_qk + b_cnt + b_off + b_k2q + b_rank;
  char *ws = NULL;
  cudaError_t e = sta_cuda_ws_alloc((void **)&ws, total, sm);
  sta_status s = STA_OK;
  if (e != cudaSuccess) {
    ws = NULL;
    s = sta_cuda_fail(e, "backward: workspace");
  } else {
    char *w = ws;
    x.dqacc = (float *)w; w += b_acc;
    x.lse2 = (const float *)w; w += b_row;
    x.dd = (const float *)w; w += b_row;
    x.turn = b_turn ? (int *)w : NULL; w += b_turn;
    iv.kq = (uint32_t *)w; w += b_kq;
    iv.qk = b_qk ? (uint32_t *)w : NULL; w += b_qk;
    iv.cnt = (int *)w; w += b_cnt;
    iv.off = (int *)w; w += b_off;
    iv.k2q = (int *)w; w += b_k2q;
    iv.rank = b_rank ? (int *)w : NULL;
    x.k2q_off = iv.off; x.k2q_idx = iv.k2q; x.k2q_rank = iv.rank;
    /* the turns and both bitmaps are contiguous after the rows */
    e = cudaMemsetAsync((char *)ws + b_acc + 2 * b_row, 0, b_turn + b_kq + b_qk, sm);
    if (e != cudaSuccess) s = sta_cuda_fail(e, "backward: zeroing the workspace");
  }
  if (s == STA_OK && nk > 0) {
    const int64_t nset = (int64_t)iv.bh * x.Mq * (iv.L + iv.nwmax);
    if (nset > 0) bsa_inv_set<<<(unsigned)((nset + 255) / 256), 256, 0, sm>>>(iv);
    bsa_inv_count<<<(unsigned)((nk * 32 + 255) / 256), 256, 0, sm>>>(iv);
    bsa_inv_scan<<<1, 1024, 0, sm>>>(iv, nk);
    bsa_inv_fill<<<(unsigned)((nk * 32 + 255) / 256), 256, 0, sm>>>(iv);
    if ((e = cudaGetLastError()) != cudaSuccess) s = sta_cuda_fail(e, "backward: the inversion");
  }
  if (s == STA_OK) {
    const int D = (int)p->head_dim;
    if (p->dtype == STA_BF16)
      s = D == 128 ? run_bsa_bwd<__nv_bfloat16, 128>(x, ra, sm) : run_bsa_bwd<__nv_bfloat16, 64>(x, ra, sm);
    else
      s = D == 128 ? run_bsa_bwd<__half, 128>(x, ra, sm) : run_bsa_bwd<__half, 64>(x, ra, sm);
  }
  if (ws) {
    e = cudaFreeAsync(ws, sm);
    if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "backward: freeing the workspace");
  }
  free(xp);
  free(ia);
  return s;
}
