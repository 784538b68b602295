/*
** fp8_api.cu -- the fp8 forward on device tensors (sta_cuda_attention_fp8,
** sta_cuda.h; the backend's attention_fp8): the CUDA backend's limits, the
** quantize pre-pass (fp8_quant.cu) into a stream-ordered workspace, the
** kernel's argument (built only here: the TMA maps over the workspace
** too) and the head dim dispatch (the kernel, kernel_fp8.cuh, writes the
** tiled order's padding rows itself, any dtype).  What it computes is
** core/cpu_fp8.c's reference up to the order and width of its sums.
*/
#include <stdlib.h>
#include <string.h>

#include "args_common.h"
#include "kernel_fp8.cuh"
#include "tma_map.h"

namespace {

/* Device buffers of o in one allocation (sta_fp8_ops_alloc's sizes, each
** 256-byte aligned); *ws to free. */
sta_status ops_alloc(sta_fp8_ops *o, void **ws, int64_t batch, int64_t heads, int64_t rows,
                     int64_t D, cudaStream_t sm) {
  const size_t bh = (size_t)(batch * heads), r = (size_t)rows, d = (size_t)D;
  const size_t n[9] = {bh * r * d, bh * r * d, bh * d * r, 4 * bh * r, 4 * bh * r,
                       4 * bh * r, 4 * bh * d, 4 * bh * d, bh * d};
  size_t off[9], total = 0;
  for (int i = 0; i < 9; i++) {
    off[i] = total;
    total += (n[i] + 255) & ~(size_t)255;
  }
  cudaError_t e = sta_cuda_ws_alloc(ws, total, sm);
  if (e != cudaSuccess) return sta_cuda_fail(e, "fp8 attention: operand workspace");
  char *b = (char *)*ws;
  memset(o, 0, sizeof *o);
  o->batch = batch; o->heads = heads; o->rows = rows; o->head_dim = D;
  o->q8 = (int8_t *)(b + off[0]);
  o->k8 = (int8_t *)(b + off[1]);
  o->v8 = (uint8_t *)(b + off[2]);
  o->q_scale = (float *)(b + off[3]);
  o->k_scale = (float *)(b + off[4]);
  o->q_bias = (float *)(b + off[5]);
  o->k_mean = (float *)(b + off[6]);
  o->v_scale = (float *)(b + off[7]);
  o->eq = (int8_t *)(b + off[8]);
  return STA_OK;
}

void params_init(sta::Fp8Params &x, const sta_attn_params *p, const sta_fp8_ops &o) {
  memset(&x, 0, sizeof x);
  x.q8 = o.q8; x.k8 = o.k8; x.v8 = o.v8;
  x.q_scale = o.q_scale; x.k_scale = o.k_scale; x.q_bias = o.q_bias; x.v_scale = o.v_scale;
  x.o = p->o;
  x.lse = p->lse;
  x.o_sb = p->o_sb; x.o_ss = p->o_ss; x.o_sh = p->o_sh;
  x.lse_sb = p->lse_sb; x.lse_sh = p->lse_sh; x.lse_ss = p->lse_ss;
  sta_fp8_geom_init(&x.g, p);
  x.R = x.g.rows;
  x.heads = (int)p->heads;
  x.out_dt = (int)p->dtype;
  x.vol = p->tile[0] * p->tile[1] * p->tile[2];
  x.qbpt = (x.vol + sta::FP8_BM - 1) / sta::FP8_BM;
  x.n_video_items = (int)((int64_t)p->grid[0] * p->grid[1] * p->grid[2] * x.qbpt);
  x.v_vec = x.R % 16 == 0;
  x.has_pad = x.g.tiled_video != x.g.video_len;
  x.scale_log2 = p->scale * 1.4426950408889634f;
  x.scale = p->scale;
  sta::clamp_windows(x.win, p);
}

/* The kernel's maps over o's buffers (x->R and x->v_vec set): Q and K rows
** of D bytes, boxes of 128 rows; V [B*H][D][R] in boxes of 128 keys where
** R % 16 == 0 (v_vec).  False when the driver refuses one:
** within the limits below (16-byte strides, dims below 2^32) only a driver
** without the encoder does. */
bool tma_maps(sta::Fp8Params *x, const sta_fp8_ops &o) {
  const uint64_t R = (uint64_t)x->R, D = (uint64_t)o.head_dim,
                 bh = (uint64_t)(o.batch * o.heads);
  const uint64_t qd[3] = {D, R, bh}, qs[2] = {D, R * D};
  const uint32_t qbox[3] = {(uint32_t)D, sta::FP8_BM, 1}, kbox[3] = {(uint32_t)D, sta::FP8_BK, 1};
  if (!sta::tma_encode_bytes(&x->mq, o.q8, qd, qs, qbox) ||
      !sta::tma_encode_bytes(&x->mk, o.k8, qd, qs, kbox))
    return false;
  if (!x->v_vec) return true;
  const uint64_t vd[3] = {R, D, bh}, vs[2] = {R, D * R};
  const uint32_t vbox[3] = {sta::FP8_BK, (uint32_t)D, 1};
  return sta::tma_encode_bytes(&x->mv, o.v8, vd, vs, vbox);
}

} /* namespace */

/* core/fp8_internal.h: the keys a step of this build's online softmax */
int32_t sta_cuda_fp8_step_test(int32_t head_dim) {
  return sta::FP8_BK / (head_dim == 64 ? sta::fp8_h<64>() : sta::fp8_h<128>());
}

sta_status sta_cuda_attention_fp8(const sta_attn_params *p) {
  if (p->dtype != STA_BF16 && p->dtype != STA_F16 && p->dtype != STA_F32)
    return sta_error(STA_ERR_DTYPE,
                     "attention: dtype %s not supported by the fp8 forward on cuda (use bf16, "
                     "f16 or f32)", sta_dtype_name(p->dtype));
  if (p->head_dim != 64 && p->head_dim != 128)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: head_dim %lld not supported on cuda (64 or 128)",
                     (long long)p->head_dim);
  if (p->heads > STA_MAX_HEADS)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: %lld heads exceed the CUDA backend's %d",
                     (long long)p->heads, STA_MAX_HEADS);
  if (p->seq_len > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: seq_len %lld too long for the CUDA backend",
                     (long long)p->seq_len);
  if (p->batch * p->heads > 65535)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: batch x heads %lld exceeds the fp8 kernel's 65535",
                     (long long)(p->batch * p->heads));
  if (p->batch == 0 || p->heads == 0 || p->seq_len == 0) return STA_OK;
  sta_fp8_geom g;
  sta_fp8_geom_init(&g, p);
  if (g.rows > 0x3fffffff)
    return sta_error(STA_ERR_UNSUPPORTED, "attention: %lld padded rows too many for the fp8 kernel",
                     (long long)g.rows);
  cudaStream_t sm = sta_cuda_stream();
  sta_fp8_ops o;
  void *ws = NULL;
  sta_status s = ops_alloc(&o, &ws, p->batch, p->heads, g.rows, p->head_dim, sm);
  if (s != STA_OK) return s;
  /* the kernel's argument, about 7 KB: off the stack */
  sta::Fp8Params *x = (sta::Fp8Params *)aligned_alloc(alignof(sta::Fp8Params),
                                                       sizeof(sta::Fp8Params));
  if (!x) s = sta_error(STA_ERR_NOMEM, "attention: out of host memory");
  if (s == STA_OK) {
    params_init(*x, p, o);
    /* no cp.async path for Q: without the maps the kernel cannot run */
    if (!tma_maps(x, o))
      s = sta_error(STA_ERR_BACKEND, "fp8 attention: the driver refused a TMA map (the fp8 "
                    "kernel loads by TMA)");
  }
  if (s == STA_OK) s = sta_cuda_fp8_quantize(p, &o);
  if (s == STA_OK) {
    const int64_t bh = p->batch * p->heads;
    const int64_t items =
        x->n_video_items + (g.rows - g.tiled_video + sta::FP8_BM - 1) / sta::FP8_BM;
    s = p->head_dim == 128 ? sta::run_fp8<128>(*x, bh, items) : sta::run_fp8<64>(*x, bh, items);
  }
  free(x);
  const cudaError_t e = cudaFreeAsync(ws, sm);
  if (e != cudaSuccess && s == STA_OK) s = sta_cuda_fail(e, "fp8 attention: freeing the workspace");
  return s;
}
