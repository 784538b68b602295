/*
** bsa_bwd_f16_d64.cu -- the block-sparse backward kernels of f16, head
** dim 64 (kernel_bsa_bwd.cuh's run_bsa_bwd, one instantiation per file so
** that they compile in parallel).
*/
#include "kernel_bsa_bwd.cuh"

namespace sta {
template sta_status run_bsa_bwd<__half, 64>(const BsaBwdArgs &, const BsaRowArgs &, cudaStream_t);
}
