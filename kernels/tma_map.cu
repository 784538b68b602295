/*
** tma_map.cu -- tma_encode (tma_map.h), and sta_cuda_encode_map (sta_cuda.h)
** over it.
*/
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "tma_map.h"

namespace sta {

static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                         cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)f;
  }();
  return fn;
}

bool tma_encode(CUtensorMap *m, const void *base, const sta_attn_params *p, int64_t sb,
                int64_t ss, int64_t sh, int fused, int64_t nhb, int tile, int rows,
                int64_t extent) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!enc) return false;
  cuuint64_t c0 = (cuuint64_t)(fused ? p->heads * p->head_dim : p->head_dim);
  cuuint64_t nn = (cuuint64_t)(fused ? p->batch : nhb);
  cuuint64_t ns = (cuuint64_t)(fused ? sb : sh) * 2;
  cuuint64_t dims[5], strides[4];
  cuuint32_t box[5], es[5] = {1, 1, 1, 1, 1};
  cuuint32_t rank;
  if (tile) {
    rank = 5;
    dims[0] = c0; dims[1] = (cuuint64_t)p->canvas[2];
    dims[2] = (cuuint64_t)p->canvas[1]; dims[3] = (cuuint64_t)p->canvas[0];
    dims[4] = nn;
    strides[0] = (cuuint64_t)ss * 2;
    strides[1] = (cuuint64_t)(ss * p->canvas[2] * 2);
    strides[2] = (cuuint64_t)(ss * p->canvas[2] * p->canvas[1] * 2);
    strides[3] = ns;
    box[0] = 64; box[1] = 8; box[2] = 8; box[3] = (cuuint32_t)(rows / 64); box[4] = 1;
  } else {
    rank = 3;
    dims[0] = c0;
    dims[1] = (cuuint64_t)(extent > 0 && extent < p->seq_len ? extent : p->seq_len);
    dims[2] = nn;
    strides[0] = (cuuint64_t)ss * 2;
    strides[1] = ns;
    box[0] = 64; box[1] = (cuuint32_t)rows; box[2] = 1;
  }
  CUresult r = enc(m, p->dtype == STA_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                   rank, const_cast<void *>(base), dims, strides, box, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool tma_encode_bytes(CUtensorMap *m, const void *base, const uint64_t dims[3],
                      const uint64_t strides[2], const uint32_t box[3]) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!enc || (box[0] != 64 && box[0] != 128)) return false;
  cuuint64_t d[3] = {dims[0], dims[1], dims[2]}, st[2] = {strides[0], strides[1]};
  cuuint32_t bx[3] = {box[0], box[1], box[2]}, es[3] = {1, 1, 1};
  CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void *>(base), d, st, bx, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE,
                   box[0] == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

bool tma_encode_nd(CUtensorMap *m, const void *base, bool bf16, int rank, const uint64_t *dims,
                   const uint64_t *strides, const uint32_t *box) {
  PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!enc || rank < 2 || rank > 5) return false;
  cuuint64_t d[5], st[4];
  cuuint32_t bx[5], es[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < rank; i++) {
    d[i] = dims[i];
    bx[i] = box[i];
    if (i > 0) st[i - 1] = strides[i - 1];
  }
  CUresult r = enc(m, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                   (cuuint32_t)rank, const_cast<void *>(base), d, st, bx, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

} /* namespace sta */

int sta_cuda_encode_map(void *m, const void *base, const sta_attn_params *p, int64_t sb,
                        int64_t ss, int64_t sh, int fused, int64_t nhb, int tile, int rows) {
  return sta::tma_encode((CUtensorMap *)m, base, p, sb, ss, sh, fused, nhb, tile, rows);
}
