/*
** fwd_bf16_d128.cu -- the forward kernels of bf16, head dim 128 (launch_fwd.cuh's
** run_fwd, one instantiation per file so that they compile in parallel).
*/
#include "launch_fwd.cuh"

namespace sta {
template sta_status run_fwd<__nv_bfloat16, 128>(FwdParams &, int);
}
