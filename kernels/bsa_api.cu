/*
** bsa_api.cu -- the block-sparse forward on device tensors
** (sta_cuda_block_attention, bsa_params.h: masks BLOCKS and
** WINDOW_OR_BLOCKS): the backend's limits, BsaParams (built only here) with
** its TMA maps, and the (dtype, head dim) dispatch.  The kernels:
** kernel_bsa.cuh.
*/
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "args_common.h"
#include "bsa_params.h"
#include "tma_map.h"

namespace sta {

/* Why the last setup on this thread left TMA out (NULL: it did not). */
static thread_local const char *bsa_tma_off;
/* the note of the lists' copy sorted on the device, or NULL */
static thread_local const char *bsa_sorted;

/* The TMA maps where alignment and strides allow them: 16-byte aligned
** bases and strides, and one way to address (batch, head) for q, k and v
** (head stride D: heads fused with D; else a batch stride that folds into
** the heads', or batch 1).  Q by rows (box qr rows), K and V by block
** (4-D: the rows of a block, then the blocks; box bk rows). */
static void bsa_setup_tma(BsaParams &x, const sta_attn_params *p, int qr, int bk) {
  x.tma = 0;
  bsa_tma_off = NULL;
  if (!x.vec) {
    bsa_tma_off = "an operand's base or stride is not a multiple of 16 bytes";
    return;
  }
  if (sta_cuda_tma_test() & STA_TEST_NO_TMA) {
    bsa_tma_off = "the tests' setting (no TMA)";
    return;
  }
  const int64_t D = p->head_dim, H = p->heads;
  const int fused = p->q_sh == D && p->k_sh == D && p->v_sh == D;
  const int fold = p->batch == 1 || (p->q_sb == H * p->q_sh && p->k_sb == H * p->k_sh &&
                                     p->v_sb == H * p->v_sh);
  if (!fused && !fold) {
    bsa_tma_off = "heads not addressable (head stride != D, batch stride != heads x head stride)";
    return;
  }
  x.tma_fused = fused;
  const uint64_t c0 = (uint64_t)(fused ? H * D : D), nn = (uint64_t)(fused ? p->batch : p->batch * H);
  const bool bf = p->dtype == STA_BF16;
  auto enc = [&](CUtensorMap *m, const void *base, int64_t ss, int64_t sb, int64_t sh, int64_t rows,
                 bool blocks, int box_rows) {
    const uint64_t ns = (uint64_t)(fused ? sb : sh) * 2;
    if (!blocks) {
      const uint64_t dims[3] = {c0, (uint64_t)rows, nn}, st[2] = {(uint64_t)ss * 2, ns};
      const uint32_t box[3] = {64, (uint32_t)box_rows, 1};
      return tma_encode_nd(m, base, bf, 3, dims, st, box);
    }
    const uint64_t dims[4] = {c0, (uint64_t)p->block_rows, (uint64_t)p->kv_blocks, nn};
    const uint64_t st[3] = {(uint64_t)ss * 2, (uint64_t)ss * p->block_rows * 2, ns};
    const uint32_t box[4] = {64, (uint32_t)box_rows, 1, 1};
    return tma_encode_nd(m, base, bf, 4, dims, st, box);
  };
  if (enc(&x.tmq, p->q, p->q_ss, p->q_sb, p->q_sh, p->seq_len, false, qr) &&
      enc(&x.tmk, p->k, p->k_ss, p->k_sb, p->k_sh, 0, true, bk) &&
      enc(&x.tmv, p->v, p->v_ss, p->v_sb, p->v_sh, 0, true, bk))
    x.tma = 1;
  else
    bsa_tma_off = "the driver refused a tensor map";
}

void bsa_note_launch(const BsaParams &x, const char *kernel, const char *dtype, int d, int qr,
                     int bk, int grid) {
  sta_cuda_note_launch(
      "forward: block-sparse %s<%s, D %d>, block_rows %d, %d query rows x %d keys, %s grid %d, "
      "%d items, %s%s; loads by %s%s%s",
      kernel, dtype, d, x.bv, qr, bk, x.sched ? "persistent" : "one CTA per item,", grid,
      x.n_items, x.uni ? "window or blocks" : "blocks", bsa_sorted ? bsa_sorted : "",
      x.tma ? "TMA" : "the cp.async gather",
      bsa_tma_off ? "; TMA left out: " : "", bsa_tma_off ? bsa_tma_off : "");
}

static void bsa_params_init(BsaParams &x, const sta_attn_params *p) {
  memset(&x, 0, sizeof x);
  x.q = p->q; x.k = p->k; x.v = p->v;
  x.o = p->o;
  x.lse = p->lse;
  x.q_sb = p->q_sb; x.q_ss = p->q_ss; x.q_sh = p->q_sh;
  x.k_sb = p->k_sb; x.k_ss = p->k_ss; x.k_sh = p->k_sh;
  x.v_sb = p->v_sb; x.v_ss = p->v_ss; x.v_sh = p->v_sh;
  x.o_sb = p->o_sb; x.o_ss = p->o_ss; x.o_sh = p->o_sh;
  x.lse_sb = p->lse_sb; x.lse_sh = p->lse_sh; x.lse_ss = p->lse_ss;
  x.heads = (int)p->heads;
  x.batch = (int)p->batch;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->o_sb, p->o_ss, p->o_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) && aligned16(p->o);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  x.bv = p->block_rows;
  x.Mq = (int)p->q_blocks;
  x.Mk = (int)p->kv_blocks;
  x.L = p->list_len;
  x.num = p->num;
  x.idx = p->idx;
  x.q_sizes = p->q_sizes;
  x.kv_sizes = p->kv_sizes;
  x.uni = p->mask == STA_MASK_WINDOW_OR_BLOCKS;
  if (x.uni) {
    for (int i = 0; i < 3; i++) x.grid[i] = p->grid[i];
    clamp_windows(x.win, p);
  }
  x.scale_log2 = p->scale * 1.4426950408889634f;
  x.rescale_th = p->fast_softmax ? 8.0f : 0.0f;
}

} /* namespace sta */

sta_status sta_cuda_block_attention(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE, "attention: dtype %s not supported on cuda (use bf16 or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: head_dim %lld not supported on cuda (64 or 128)",
                     (long long)p->head_dim);
  if (p->block_rows != 64 && (p->block_rows % 128 != 0 || p->block_rows > 1024))
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: block_rows %d not supported on cuda (64 or a multiple of 128 "
                     "up to 1024)",
                     (int)p->block_rows);
  if (p->heads > STA_BSA_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_BSA_MAX_HEADS);
  if (p->seq_len > 0x3fffffff || p->kv_len > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: seq_len %lld or kv_len %lld too long for the CUDA backend",
                     (long long)p->seq_len, (long long)p->kv_len);
  if (p->batch == 0 || p->heads == 0 || p->q_blocks == 0) return STA_OK;

  const size_t al = alignof(sta::BsaParams);
  sta::BsaParams *x =
      (sta::BsaParams *)aligned_alloc(al, (sizeof(sta::BsaParams) + al - 1) & ~(al - 1));
  if (!x) return sta_error(STA_ERR_NOMEM, "attention: out of host memory");
  sta::bsa_params_init(*x, p);
  const int D = (int)p->head_dim, bk = p->block_rows == 64 ? 64 : 128;
  /* the paired kernel (kernel_bsa.cuh's run_bsa) where the split kernel
  ** would load by TMA (Q boxes of 128 rows): by default at D 128 (BENCHMARKS.md:
  ** 1.11x the split kernel on random lists, 1.20x on VSA-like local ones;
  ** 0.99x at D 64), at D 64 too or never by the test-only setter; every other
  ** kernel walks each list ascending: a copy sorted on the device first
  ** unless the caller's lists are (1.07x at D 64 on torch.topk-ordered
  ** lists, 1.02x at block_rows 256) */
  const int32_t pt = sta_cuda_bsa_pairs_test(), so = sta_cuda_bsa_sort_test();
  const bool pairs = pt >= 0 && (pt > 0 || D == 128) && bk == 64 && p->mask == STA_MASK_BLOCKS;
  sta::bsa_setup_tma(*x, p, bk == 64 && !pairs ? 64 : 128, bk);
  void *ws = NULL;
  sta_status s = STA_OK;
  sta::bsa_sorted = NULL;
  if (pairs && x->tma) {
    x->pairs = pt == 2 ? 2 : 1; /* 2: the pre-pass's rank path */
    s = sta::bsa_pairs_prepass(*x, &ws);
  } else if (so == 1 || (so == 0 && !p->lists_sorted)) {
    s = sta::bsa_sort_prepass(*x, &ws);
    if (s == STA_OK && ws) sta::bsa_sorted = "; lists sorted on the device";
  }
  if (s == STA_OK) {
    if (p->dtype == STA_BF16)
      s = D == 128 ? sta::run_bsa<__nv_bfloat16, 128>(*x) : sta::run_bsa<__nv_bfloat16, 64>(*x);
    else
      s = D == 128 ? sta::run_bsa<__half, 128>(*x) : sta::run_bsa<__half, 64>(*x);
  }
  const sta_status sr = sta::bsa_pairs_release(ws);
  if (s == STA_OK) s = sr;
  free(x);
  return s;
}
