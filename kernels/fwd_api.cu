/*
** fwd_api.cu -- the STA forward on device tensors (sta_cuda_attention,
** sta_cuda.h): the CUDA backend's limits, the kernel's argument from the
** core's resolved problem (fwd_params_init, the one place it is built),
** and the (dtype, head dim) dispatch.  The kernels are in kernel_fwd.cuh
** and around it; README.md says which file holds what.
*/
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "args_common.h"
#include "params.h"
#include "tma_map.h"

namespace sta {

/* Why the last setup_tma on this thread left a TMA path out (NULL: it
** took every map the call can use); fwd_note_launch reports it. */
static thread_local const char *tma_off;

/* Which TMA paths a call can take.  All need 16-byte aligned bases and
** strides (vec) and one way to address (batch, head): fused when the head
** stride of q, k and v is D, else heads folded with the batch when the
** batch strides allow it (or batch 1).  Tile maps also need 8x8 h/w tiles
** and an even tt (key and query blocks are 2 t-slices); border tiles run
** past the canvas: zero-filled there, masked by position.  In the tiled
** order a tile block is a run of rows: the row maps read it (no tile
** maps), which needs whole tiles: a padding row must never be read as a
** key (it may hold anything), so with partial tiles the tiles' blocks are
** gathered by token.
** The tests' setting (sta_cuda_set_tma_test, core/backend.h) turns all
** of it off (the gather path), or Q's tile maps.  Sets tma_off to the
** first reason a path was left out. */
static void setup_tma(FwdParams &x, const sta_attn_params *p, int variant) {
  const int32_t no_tma = sta_cuda_tma_test();
  x.tma = x.tma_q = x.tma_rows = x.tma_q3 = x.tma_k3 = 0;
  tma_off = NULL;
  if (no_tma & STA_TEST_NO_TMA) { tma_off = "off by the tests' setting (no TMA)"; return; }
  if (!x.vec) {
    tma_off = "an operand's base or stride is not a multiple of 16 bytes";
    return;
  }
  const int64_t D = p->head_dim;
  int fused = p->q_sh == D && p->k_sh == D && p->v_sh == D;
  int fold = p->batch == 1 || (p->q_sb == p->heads * p->q_sh && p->k_sb == p->heads * p->k_sh &&
                               p->v_sb == p->heads * p->v_sh);
  if (!fused && !fold) {
    tma_off = "heads not addressable (head stride != D, batch stride != heads x head stride)";
    return;
  }
  if (p->heads * p->batch > 0x7fffffff || p->heads * D > 0x7fffffff) {
    tma_off = "heads x batch too large";
    return;
  }
  int64_t nhb = p->heads * p->batch;
  x.tma_fused = fused;
  /* K and V row maps end at the last row that can be a key: the rows past
  ** the valid text read as zeros (tma_map.h) */
  const int64_t keys = p->video_rows + p->text_len;
  if (tma_encode(&x.rmk, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 0, 128, keys) &&
      tma_encode(&x.rmv, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 0, 128, keys) &&
      tma_encode(&x.rmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0))
    x.tma_rows = 1;
  else
    tma_off = "the driver refused a row map";
  if (p->tile[1] != 8 || p->tile[2] != 8 || p->tile[0] % 2) {
    if (!tma_off) tma_off = "tiles not 8x8 in h, w with an even depth";
    return;
  }
  if (p->tiled)
    x.tma = x.tma_rows && p->video_rows == p->video_len;
  else if (tma_encode(&x.tmk, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 1) &&
           tma_encode(&x.tmv, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 1))
    x.tma = 1;
  if (!x.tma && !tma_off)
    tma_off = p->tiled ? "tiled order with partial tiles" : "the driver refused K's or V's tile map";
  if (x.tma && !(no_tma & STA_TEST_NO_TMA_Q) &&
      (p->tiled || tma_encode(&x.tmq, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1)))
    x.tma_q = 1;
  if (x.tma && !x.tma_q && !tma_off)
    tma_off = no_tma & STA_TEST_NO_TMA_Q ? "Q's maps off by the tests' setting"
                                         : "the driver refused Q's tile map";
  /* the default kernel's 192-row maps (3 t-slices): Q in items of 192
  ** rows at D 64, K and V in blocks of 192 keys at D 128 */
  const bool by3 = x.tma_q && x.tma_rows && p->tile[0] % 3 == 0 &&
                   variant != 9;
  const int tl = !p->tiled; /* tile maps: untiled order only */
  if (by3 && D == 64 &&
      (!tl || tma_encode(&x.tmq3, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 1, 192)) &&
      tma_encode(&x.rmq3, p->q, p, p->q_sb, p->q_ss, p->q_sh, fused, nhb, 0, 192))
    x.tma_q3 = 1;
  if (by3 && D == 128 &&
      (!tl || tma_encode(&x.tmk3, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 1, 192)) &&
      (!tl || tma_encode(&x.tmv3, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 1, 192)) &&
      tma_encode(&x.rmk3, p->k, p, p->k_sb, p->k_ss, p->k_sh, fused, nhb, 0, 192, keys) &&
      tma_encode(&x.rmv3, p->v, p, p->v_sb, p->v_ss, p->v_sh, fused, nhb, 0, 192, keys))
    x.tma_k3 = 1;
  if (!tma_off && !(D == 128 ? x.tma_k3 : x.tma_q3))
    tma_off = variant == 9          ? "variant 9 by the tests' setting (the 128 x 128 kernel)"
              : p->tile[0] % 3 != 0 ? "tile depth not a multiple of 3 (no 192-row maps)"
                                    : "the driver refused a 192-row map";
}

void fwd_note_launch(const FwdParams &a, const char *kernel, const char *dtype, int d, int br,
                     int bk, int gather, int persist, int grid) {
  char gate[48] = "";
  if (a.gate_nkb) snprintf(gate, sizeof gate, "; wave gate from %d key blocks", a.gate_nkb);
  sta_cuda_note_launch(
      "forward: %s<%s, D %d>, %d query rows x %d keys, %s grid %d, %d items (%d text); loads by "
      "%s; tensor maps: K/V tiles %s, Q tiles %s, rows %s, 192-row %s%s%s%s",
      kernel, dtype, d, br, bk, persist ? "persistent" : "one CTA per item,", grid, a.n_items,
      a.n_text_items,
      gather && !(a.tma && a.tma_q && a.tma_rows) ? "TMA and the cp.async gather" : "TMA",
      a.tma ? "yes" : "no", a.tma_q ? "yes" : "no", a.tma_rows ? "yes" : "no",
      a.tma_k3 || a.tma_q3 ? "yes" : "no", gate, tma_off ? "; TMA path left out: " : "",
      tma_off ? tma_off : "");
}

void fwd_params_init(FwdParams &x, const sta_attn_params *p, int variant) {
  memset(&x, 0, sizeof x);
  common_args_init(x, p);
  x.o = p->o;
  x.lse = p->lse;
  x.o_sb = p->o_sb; x.o_ss = p->o_ss; x.o_sh = p->o_sh;
  x.lse_sb = p->lse_sb; x.lse_sh = p->lse_sh; x.lse_ss = p->lse_ss;
  x.scale_log2 = p->scale * 1.4426950408889634f;
  x.rescale_th = p->fast_softmax ? 8.0f : 0.0f;
  int64_t st[] = {p->q_sb, p->q_ss, p->q_sh, p->k_sb, p->k_ss, p->k_sh,
                  p->v_sb, p->v_ss, p->v_sh, p->o_sb, p->o_ss, p->o_sh};
  int vec = aligned16(p->q) && aligned16(p->k) && aligned16(p->v) &&
            aligned16(p->o);
  for (int i = 0; i < 12; i++)
    if (st[i] % 8) vec = 0;
  x.vec = vec;
  setup_tma(x, p, variant);
  int64_t vol[STA_MAX_HEADS];
  for (int64_t h = 0; h < p->heads; h++) {
    vol[h] = (int64_t)x.win[3 * h] * x.win[3 * h + 1] * x.win[3 * h + 2];
    /* insertion: largest window first, ties in head order (stable) */
    int64_t j = h;
    while (j > 0 && vol[x.horder[j - 1]] < vol[h]) {
      x.horder[j] = x.horder[j - 1];
      j--;
    }
    x.horder[j] = (int16_t)h;
  }
}

} /* namespace sta */

sta_status sta_cuda_attention(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16)
    return sta_error(STA_ERR_DTYPE,
                     "attention: dtype %s not supported on cuda (use bf16 "
                     "or f16)",
                     sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: head_dim %lld not supported on cuda (64 or "
                     "128)",
                     (long long)p->head_dim);
  if (p->heads > STA_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_MAX_HEADS);
  if (p->seq_len > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: seq_len %lld too long for the CUDA backend",
                     (long long)p->seq_len);
  if (p->grid[0] > 32767 || p->grid[1] > 32767 || p->grid[2] > 32767)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: tile grid %dx%dx%d too large for the CUDA "
                     "backend",
                     p->grid[0], p->grid[1], p->grid[2]);
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;

  /* about 10 KB: off the stack; the launch copies it */
  const size_t al = alignof(sta::FwdParams);
  const size_t asz = (sizeof(sta::FwdParams) + al - 1) & ~(al - 1);
  sta::FwdParams *x = (sta::FwdParams *)aligned_alloc(al, asz); /* for CUtensorMap */
  if (!x) return sta_error(STA_ERR_NOMEM, "attention: out of host memory");
  const int var = sta_cuda_variant_test(); /* 0 but in tests and benchmarks */
  sta::fwd_params_init(*x, p, var);
  sta_status s;
  if (p->dtype == STA_BF16)
    s = p->head_dim == 128 ? sta::run_fwd<__nv_bfloat16, 128>(*x, var)
                           : sta::run_fwd<__nv_bfloat16, 64>(*x, var);
  else
    s = p->head_dim == 128 ? sta::run_fwd<__half, 128>(*x, var) : sta::run_fwd<__half, 64>(*x, var);
  free(x);
  if (s == STA_OK && p->video_rows > p->video_len) /* the tiled order's padding rows */
    s = sta_cuda_pad_rows(p, p->o, p->o_sb, p->o_ss, p->o_sh, p->lse);
  return s;
}
