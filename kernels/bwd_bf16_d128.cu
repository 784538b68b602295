/* bwd_bf16_d128.cu -- the backward's kernels for bf16, head dim 128. */
#include "bwd_rows.cuh"

namespace sta {
template sta_status run_bwd<__nv_bfloat16, 128>(const sta_attn_params *, const BwdArgs &, const RowArgs &,
                                      cudaStream_t);
} /* namespace sta */
