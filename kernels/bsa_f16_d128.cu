/*
** bsa_f16_d128.cu -- the block-sparse forward kernels of f16, head dim 128
** (kernel_bsa.cuh's run_bsa, one instantiation per file so that they
** compile in parallel).
*/
#include "kernel_bsa.cuh"

namespace sta {
template sta_status run_bsa<__half, 128>(BsaParams &);
}
