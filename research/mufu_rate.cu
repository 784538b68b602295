/*
** mufu_rate.cu -- how many exponentials a clock an SM gives through
** ex2.approx.f32 against ex2.approx.f16x2 (two halves an instruction) and
** ex2.approx.ftz.bf16x2: issue 32's question whether the fp8 forward's
** softmax can take its 2^x two at a time (mainloop_fp8.cuh).  Each thread
** runs 8 independent chains (enough to fill the pipe); the rate is
** instructions an SM a clock, and exponentials an SM a clock.
**
**   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o mufu_rate research/mufu_rate.cu
**   ./mufu_rate
*/
#include <cstdint>
#include <cstdio>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

constexpr int ITERS = 4096, CH = 8;

__global__ void k_f32(float *out, float seed) {
  float x[CH];
  for (int c = 0; c < CH; c++) x[c] = seed * (threadIdx.x + c) * 1e-6f - 1.0f;
  for (int i = 0; i < ITERS; i++)
#pragma unroll
    for (int c = 0; c < CH; c++) {
      float y;
      asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x[c]));
      x[c] = y - 1.5f; /* keeps the chain; one FADD an ex2 */
    }
  float s = 0;
  for (int c = 0; c < CH; c++) s += x[c];
  if (s == 12345.0f) out[0] = s;
}

__global__ void k_f16x2(float *out, float seed) {
  uint32_t x[CH];
  const __half2 d = __floats2half2_rn(1.5f, 1.5f);
  for (int c = 0; c < CH; c++) {
    __half2 h = __floats2half2_rn(seed * (threadIdx.x + c) * 1e-6f - 1.0f, -0.5f);
    x[c] = *(uint32_t *)&h;
  }
  for (int i = 0; i < ITERS; i++)
#pragma unroll
    for (int c = 0; c < CH; c++) {
      uint32_t y;
      asm volatile("ex2.approx.f16x2 %0, %1;" : "=r"(y) : "r"(x[c]));
      __half2 h = __hsub2(*(__half2 *)&y, d); /* one HADD2 an ex2 (two exponentials) */
      x[c] = *(uint32_t *)&h;
    }
  float s = 0;
  for (int c = 0; c < CH; c++) s += __low2float(*(__half2 *)&x[c]);
  if (s == 12345.0f) out[0] = s;
}

__global__ void k_bf16x2(float *out, float seed) {
  uint32_t x[CH];
  for (int c = 0; c < CH; c++) x[c] = 0xbf80bf00u + c; /* about -1, -0.5 */
  for (int i = 0; i < ITERS; i++)
#pragma unroll
    for (int c = 0; c < CH; c++) {
      uint32_t y;
      asm volatile("ex2.approx.ftz.bf16x2 %0, %1;" : "=r"(y) : "r"(x[c]));
      x[c] = y ^ 0x80008000u; /* negate both: one LOP3 an ex2 */
    }
  uint32_t s = 0;
  for (int c = 0; c < CH; c++) s += x[c];
  if (s == 12345u + (uint32_t)seed) out[0] = (float)s;
}

int main() {
  int sms = 0, clk = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, 0); /* kHz, the boost clock */
  float *out;
  cudaMalloc(&out, 4);
  const int blocks = sms * 4, threads = 512;
  struct { const char *name; void (*k)(float *, float); int per; } ks[] = {
      {"ex2.approx.ftz.f32", k_f32, 1},
      {"ex2.approx.f16x2", k_f16x2, 2},
      {"ex2.approx.ftz.bf16x2", k_bf16x2, 2}};
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int round = 0; round < 2; round++)
    for (auto &k : ks) {
      k.k<<<blocks, threads>>>(out, 1.0f); /* warm */
      cudaEventRecord(a);
      k.k<<<blocks, threads>>>(out, 1.0f);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      float ms = 0;
      cudaEventElapsedTime(&ms, a, b);
      const double instr = (double)blocks * threads * ITERS * CH;
      const double clocks = ms * 1e-3 * clk * 1e3; /* at the boost clock */
      printf("round %d %-24s %8.3f ms  %6.2f instr/SM/clk  %6.2f exp/SM/clk (at %d MHz)\n", round,
             k.name, ms, instr / sms / clocks, instr * k.per / sms / clocks, clk / 1000);
    }
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("error: %s\n", cudaGetErrorString(e)); return 1; }
  return 0;
}
