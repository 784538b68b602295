/* bwd_f16_d128.cu -- the backward's kernels for f16, head dim 128. */
#include "bwd_rows.cuh"

namespace sta {
template sta_status run_bwd<__half, 128>(const sta_attn_params *, const BwdArgs &, const RowArgs &,
                                      cudaStream_t);
} /* namespace sta */
