/*
** vsa_rows.cu -- VSA's memory-bound passes over the rows (core/vsa_internal.h's
** contracts): the cube means, the combine out = out_s + gate * out_c, the
** backward's preparation (out_s rebuilt, dgate, G = the gradient of out_c)
** and the spread of the means' gradients; the cube order gather; the
** stream-ordered workspace.  One CTA per (cube, batch); a thread owns 8
** columns of one head (16-byte loads where the rows allow) and walks the
** cube's rows in order, so every sum is in row order.
*/
#include "vsa.cuh"

using namespace vsa;

namespace {

constexpr int RT = 128; /* threads per CTA */

template <bool V>
__global__ void __launch_bounds__(RT) means_kernel(Op x, int dt, int H, int D, int64_t M, int br,
                                                   const int32_t *sizes, float *out) {
  const int64_t m = blockIdx.x, b = blockIdx.y;
  const int n = cube_rows(sizes, m, br), chunks = (D + VEC - 1) / VEC;
  for (int u = threadIdx.x; u < H * chunks; u += RT) {
    const int h = u / chunks, d0 = (u % chunks) * VEC, nn = min(VEC, D - d0);
    float acc[VEC], t[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) acc[i] = 0.f;
#pragma unroll 4
    for (int r = 0; r < n; r++) {
      load8<V>(t, row_of(x, dt, b, m * br + r, h), dt, d0, nn);
#pragma unroll
      for (int i = 0; i < VEC; i++) acc[i] += t[i];
    }
    float *o = out + ((b * H + h) * M + m) * D + d0;
    for (int i = 0; i < nn; i++) o[i] = acc[i] / (float)n;
  }
}

/* f.o (out_s) += gate * out_c on valid rows; padding rows 0. */
template <bool V>
__global__ void __launch_bounds__(RT) combine_kernel(Op o, Op g, int dt, int H, int D, int64_t M,
                                                     int br, const int32_t *sizes,
                                                     const float *oc) {
  const int64_t m = blockIdx.x, b = blockIdx.y;
  const int n = cube_rows(sizes, m, br), chunks = (D + VEC - 1) / VEC;
  for (int u = threadIdx.x; u < br * H * chunks; u += RT) {
    const int r = u / (H * chunks), h = (u / chunks) % H, d0 = (u % chunks) * VEC;
    const int nn = min(VEC, D - d0);
    char *orow = row_of(o, dt, b, m * br + r, h);
    float x[VEC], gt[VEC];
    if (r >= n) {
#pragma unroll
      for (int i = 0; i < VEC; i++) x[i] = 0.f;
      store8<V>(orow, dt, d0, nn, x);
      continue;
    }
    const float *c = oc + ((b * H + h) * M + m) * D + d0;
    load8<V>(x, orow, dt, d0, nn);
    if (g.p) {
      load8<V>(gt, row_of(g, dt, b, m * br + r, h), dt, d0, nn);
#pragma unroll
      for (int i = 0; i < VEC; i++) x[i] += i < nn ? gt[i] * c[i] : 0.f;
    } else {
#pragma unroll
      for (int i = 0; i < VEC; i++) x[i] += i < nn ? c[i] : 0.f;
    }
    store8<V>(orow, dt, d0, nn, x);
  }
}

struct Prep {
  Op out, gate, dout, os, dg;
  int dt, H, D, br;
  int64_t M;
  const int32_t *sizes;
  const float *oc;
  float *gc;
};

/* os = out - gate * out_c, dgate = dout * out_c on valid rows (0 on the
** others), gc = sum of dout * gate over the cube's valid rows. */
template <bool V>
__global__ void __launch_bounds__(RT) prep_kernel(Prep a) {
  const int64_t m = blockIdx.x, b = blockIdx.y;
  const int dt = a.dt, n = cube_rows(a.sizes, m, a.br), chunks = (a.D + VEC - 1) / VEC;
  for (int u = threadIdx.x; u < a.H * chunks; u += RT) {
    const int h = u / chunks, d0 = (u % chunks) * VEC, nn = min(VEC, a.D - d0);
    const float *c = a.oc + ((b * a.H + h) * a.M + m) * a.D + d0;
    float acc[VEC], o[VEC], gt[VEC], dy[VEC], cc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
      acc[i] = 0.f;
      cc[i] = i < nn ? c[i] : 0.f;
      gt[i] = 1.f;
    }
    for (int r = 0; r < a.br; r++) {
      const int64_t row = m * a.br + r;
      if (r >= n) {
#pragma unroll
        for (int i = 0; i < VEC; i++) o[i] = 0.f;
        store8<V>(row_of(a.os, dt, b, row, h), dt, d0, nn, o);
        if (a.dg.p) store8<V>(row_of(a.dg, dt, b, row, h), dt, d0, nn, o);
        continue;
      }
      load8<V>(o, row_of(a.out, dt, b, row, h), dt, d0, nn);
      load8<V>(dy, row_of(a.dout, dt, b, row, h), dt, d0, nn);
      if (a.gate.p) load8<V>(gt, row_of(a.gate, dt, b, row, h), dt, d0, nn);
#pragma unroll
      for (int i = 0; i < VEC; i++) {
        o[i] = o[i] - gt[i] * cc[i];
        acc[i] += dy[i] * gt[i];
        dy[i] = dy[i] * cc[i];
      }
      store8<V>(row_of(a.os, dt, b, row, h), dt, d0, nn, o);
      if (a.dg.p) store8<V>(row_of(a.dg, dt, b, row, h), dt, d0, nn, dy);
    }
    float *g = a.gc + ((b * a.H + h) * a.M + m) * a.D + d0;
    for (int i = 0; i < nn; i++) g[i] = acc[i];
  }
}

template <bool V>
__global__ void __launch_bounds__(RT) spread_kernel(Op x, int dt, int H, int D, int64_t M, int br,
                                                    const int32_t *sizes, const float *gm) {
  const int64_t m = blockIdx.x, b = blockIdx.y;
  const int n = cube_rows(sizes, m, br), chunks = (D + VEC - 1) / VEC;
  for (int u = threadIdx.x; u < n * H * chunks; u += RT) {
    const int r = u / (H * chunks), h = (u / chunks) % H, d0 = (u % chunks) * VEC;
    const int nn = min(VEC, D - d0);
    const float *g = gm + ((b * H + h) * M + m) * D + d0;
    char *row = row_of(x, dt, b, m * br + r, h);
    float t[VEC];
    load8<V>(t, row, dt, d0, nn);
#pragma unroll
    for (int i = 0; i < VEC; i++) t[i] += i < nn ? g[i] / (float)n : 0.f;
    store8<V>(row, dt, d0, nn, t);
  }
}

/* One row j of the cube order per CTA (x), batch y: copied from / to the
** untiled row sta_cube_token(j), or zeroed (padding, to the cube order). */
template <typename E>
__global__ void reorder_kernel(sta_vsa_cubes g, char *cb, sta_bshd bc, char *ub, sta_bshd bu,
                               int to_cubes) {
  const int64_t j = blockIdx.x, b = blockIdx.y, r = sta_cube_token(&g, j);
  if (r < 0 && !to_cubes) return;
  for (int64_t u = threadIdx.x; u < bc.h * bc.d; u += blockDim.x) {
    const int64_t h = u / bc.d, d = u % bc.d;
    E *c = (E *)cb + b * bc.sb + j * bc.ss + h * bc.sh + d * bc.sd;
    if (r < 0) {
      *c = E();
      continue;
    }
    E *x = (E *)ub + b * bu.sb + r * bu.ss + h * bu.sh + d * bu.sd;
    if (to_cubes) *c = *x;
    else *x = *c;
  }
}

/* grid (M, B) or an error when it does not fit. */
sta_status grid_of(int64_t M, int64_t B, dim3 *g) {
  if (M < 1 || B < 1) return STA_OK;
  if (M > INT32_MAX || B > 65535)
    return sta_error(STA_ERR_UNSUPPORTED, "vsa: %lld cubes x batch %lld too large for cuda",
                     (long long)M, (long long)B);
  *g = dim3((unsigned)M, (unsigned)B);
  return STA_OK;
}

} /* namespace */

sta_status sta_cuda_vsa_means(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  const void *x[3] = {f->q, f->k, f->v};
  const int64_t st[3][3] = {{f->q_sb, f->q_ss, f->q_sh}, {f->k_sb, f->k_ss, f->k_sh},
                            {f->v_sb, f->v_ss, f->v_sh}};
  float *out[3] = {p->qc, p->kc, p->vc};
  cudaStream_t s = sta_cuda_stream();
  for (int i = 0; i < 3; i++) {
    const int64_t M = i ? f->kv_blocks : f->q_blocks;
    const int32_t *sz = i ? f->kv_sizes : f->q_sizes;
    dim3 g(0);
    sta_status rc = grid_of(M, f->batch, &g);
    if (rc != STA_OK) return rc;
    Op o = {(char *)x[i], st[i][0], st[i][1], st[i][2]};
    if (vec_ok(x[i], st[i][0], st[i][1], st[i][2], f->head_dim, f->dtype))
      means_kernel<true><<<g, RT, 0, s>>>(o, f->dtype, (int)f->heads, (int)f->head_dim, M,
                                          f->block_rows, sz, out[i]);
    else
      means_kernel<false><<<g, RT, 0, s>>>(o, f->dtype, (int)f->heads, (int)f->head_dim, M,
                                           f->block_rows, sz, out[i]);
    if ((rc = launched("vsa means")) != STA_OK) return rc;
  }
  return STA_OK;
}

sta_status sta_cuda_vsa_combine(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  dim3 g(0);
  sta_status rc = grid_of(f->q_blocks, f->batch, &g);
  if (rc != STA_OK) return rc;
  Op o = {(char *)f->o, f->o_sb, f->o_ss, f->o_sh}, gt = {(char *)p->gate, p->g_sb, p->g_ss, p->g_sh};
  const bool v = vec_ok(f->o, f->o_sb, f->o_ss, f->o_sh, f->head_dim, f->dtype) &&
                 (!p->gate || vec_ok(p->gate, p->g_sb, p->g_ss, p->g_sh, f->head_dim, f->dtype));
  cudaStream_t s = sta_cuda_stream();
  if (v)
    combine_kernel<true><<<g, RT, 0, s>>>(o, gt, f->dtype, (int)f->heads, (int)f->head_dim,
                                          f->q_blocks, f->block_rows, f->q_sizes, p->oc);
  else
    combine_kernel<false><<<g, RT, 0, s>>>(o, gt, f->dtype, (int)f->heads, (int)f->head_dim,
                                           f->q_blocks, f->block_rows, f->q_sizes, p->oc);
  return launched("vsa combine");
}

sta_status sta_cuda_vsa_backward_prep(const sta_vsa_params *p) {
  const sta_attn_params *f = &p->f;
  dim3 g(0);
  sta_status rc = grid_of(f->q_blocks, f->batch, &g);
  if (rc != STA_OK) return rc;
  Prep a;
  a.out = Op{(char *)p->out, p->out_sb, p->out_ss, p->out_sh};
  a.gate = Op{(char *)p->gate, p->g_sb, p->g_ss, p->g_sh};
  a.dout = Op{(char *)f->dout, f->do_sb, f->do_ss, f->do_sh};
  a.os = Op{(char *)f->o, f->o_sb, f->o_ss, f->o_sh};
  a.dg = Op{(char *)p->dgate, p->dg_sb, p->dg_ss, p->dg_sh};
  a.dt = f->dtype; a.H = (int)f->heads; a.D = (int)f->head_dim; a.br = f->block_rows;
  a.M = f->q_blocks; a.sizes = f->q_sizes; a.oc = p->oc; a.gc = p->gc;
  const Op *ops[5] = {&a.out, &a.gate, &a.dout, &a.os, &a.dg};
  bool v = true;
  for (int i = 0; i < 5; i++)
    if (ops[i]->p) v = v && vec_ok(ops[i]->p, ops[i]->sb, ops[i]->ss, ops[i]->sh, a.D, a.dt);
  if (v) prep_kernel<true><<<g, RT, 0, sta_cuda_stream()>>>(a);
  else prep_kernel<false><<<g, RT, 0, sta_cuda_stream()>>>(a);
  return launched("vsa backward prep");
}

sta_status sta_cuda_vsa_spread(const sta_vsa_params *p, int kv, void *x, int64_t sb, int64_t ss,
                               int64_t sh, const float *gm) {
  const sta_attn_params *f = &p->f;
  const int64_t M = kv ? f->kv_blocks : f->q_blocks;
  const int32_t *sz = kv ? f->kv_sizes : f->q_sizes;
  dim3 g(0);
  sta_status rc = grid_of(M, f->batch, &g);
  if (rc != STA_OK) return rc;
  Op o = {(char *)x, sb, ss, sh};
  if (vec_ok(x, sb, ss, sh, f->head_dim, f->dtype))
    spread_kernel<true><<<g, RT, 0, sta_cuda_stream()>>>(o, f->dtype, (int)f->heads,
                                                         (int)f->head_dim, M, f->block_rows, sz,
                                                         gm);
  else
    spread_kernel<false><<<g, RT, 0, sta_cuda_stream()>>>(o, f->dtype, (int)f->heads,
                                                          (int)f->head_dim, M, f->block_rows, sz,
                                                          gm);
  return launched("vsa spread");
}

sta_status sta_cuda_vsa_reorder(sta_tensor *dst, const sta_tensor *src, const sta_vsa_cubes *c,
                                sta_layout layout, int32_t to_cubes) {
  const sta_tensor *u = to_cubes ? src : dst, *cu = to_cubes ? dst : src;
  sta_bshd bu, bc;
  sta_status rc;
  if ((rc = sta_tensor_bshd(u, layout, "u", &bu)) != STA_OK ||
      (rc = sta_tensor_bshd(cu, layout, "c", &bc)) != STA_OK)
    return rc;
  dim3 g(0);
  if ((rc = grid_of(bc.s, bc.b, &g)) != STA_OK) return rc;
  if (bc.s == 0 || bc.b == 0 || bc.h * bc.d == 0) return STA_OK;
  char *ub = (char *)sta_tensor_data(u), *cb = (char *)sta_tensor_data(cu);
  const int t = bc.h * bc.d >= 256 ? 256 : 64;
  cudaStream_t s = sta_cuda_stream();
  switch (sta_dtype_size(src->dtype)) {
  case 1: reorder_kernel<uint8_t><<<g, t, 0, s>>>(*c, cb, bc, ub, bu, to_cubes); break;
  case 2: reorder_kernel<uint16_t><<<g, t, 0, s>>>(*c, cb, bc, ub, bu, to_cubes); break;
  default: reorder_kernel<uint32_t><<<g, t, 0, s>>>(*c, cb, bc, ub, bu, to_cubes); break;
  }
  return launched("vsa cube order");
}

sta_status sta_cuda_vsa_workspace(void **p, size_t nbytes) {
  cudaError_t e = cudaMallocAsync(p, nbytes ? nbytes : 1, sta_cuda_stream());
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "cudaMallocAsync (VSA workspace)");
}

void sta_cuda_vsa_workspace_free(void *p) {
  if (p) (void)cudaFreeAsync(p, sta_cuda_stream());
}

int32_t sta_cuda_vsa_capturing(void) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(sta_cuda_stream(), &cs) != cudaSuccess) {
    (void)cudaGetLastError();
    return 1; /* cannot tell: do not read back */
  }
  return cs != cudaStreamCaptureStatusNone;
}
