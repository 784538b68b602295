/*
** bsa_bwd_bf16_d128.cu -- the block-sparse backward kernels of bf16, head
** dim 128 (kernel_bsa_bwd.cuh's run_bsa_bwd, one instantiation per file so
** that they compile in parallel).
*/
#include "kernel_bsa_bwd.cuh"

namespace sta {
template sta_status run_bsa_bwd<__nv_bfloat16, 128>(const BsaBwdArgs &, const BsaRowArgs &, cudaStream_t);
}
