/*
** fp8_pipes.cu -- research: which pipe each instruction of the fp8
** forward's softmax issues to on the H200, and whether two of them share
** one.  The kernel's per-score work is ex2 (MUFU.EX2), an e4m3
** pack (F2FP, two scores), an int-to-float (IADD + FADD or FFMA with a
** magic number, or I2F / I2FP), FFMA, FMNMX and FADD; the MUFU pipe does 16
** results a clock per SM (4 per SMSP).  If F2FP or the int-to-float run on
** that pipe too, the softmax's pipe time per 128-key block pair is 1.5
** times the ex2's alone, above the tensor time: that decides whether ex2
** emulation on the FMA pipe, an integer e4m3 pack or a wider key block pays.
**
** Each test runs, per thread, loops of independent asm volatile
** instructions (outputs overwritten, inputs loop-invariant: throughput,
** not latency) on one CTA of 1024 threads per SM; it prints results per
** clock per SM: the kernel timed whole by CUDA events, the SM clock
** measured by a kernel that spins on clock64 for a known count of clocks
** (also timed by events).  (The first version read clock64 around the
** loop; ptxas scheduled the loop outside the two reads and every rate came
** out near 3,400 a clock, impossible: the H200 run of 2026-12-02.)  A mix
** (e.g. ex2 + F2FP) at about the sum of its parts' times shares a pipe; at
** about the larger part's, it does not.
**
**   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o fp8_pipes research/fp8_pipes.cu
**   ./fp8_pipes        (then cuobjdump -sass fp8_pipes | grep -E 'MUFU|F2FP|I2F')
*/
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

enum { EX2, E4M3, I2F, IADD, FFMA_, FMNMX_, MIX_EX2_E4M3, MIX_EX2_I2F, MIX_EX2_FFMA, NTEST };
static const char *names[NTEST] = {
    "ex2.approx.ftz.f32 (MUFU.EX2)", "cvt.rn.satfinite.e4m3x2.f32 (F2FP)", "cvt.rn.f32.s32 (I2F*)",
    "add.s32 (IADD3 / VIADD)", "fma.rn.f32 (FFMA)", "max.f32 (FMNMX)",
    "8 ex2 + 4 e4m3x2 (the softmax's ratio)", "8 ex2 + 8 cvt.rn.f32.s32", "8 ex2 + 8 fma"};
/* instructions per thread per loop step, per test (for the rates) */
static const int per_step[NTEST] = {8, 8, 8, 8, 8, 8, 12, 16, 16};

__device__ __forceinline__ void ex2(float &o, float a) {
  asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(o) : "f"(a));
}
__device__ __forceinline__ void e4m3(uint32_t &o, float a, float b) {
  uint16_t h;
  asm volatile("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(h) : "f"(a), "f"(b));
  o = h;
}
__device__ __forceinline__ void i2f(float &o, int32_t a) {
  asm volatile("cvt.rn.f32.s32 %0, %1;" : "=f"(o) : "r"(a));
}

template <int T> __global__ void __launch_bounds__(1024, 1) pipes(float *sink, int steps) {
  float a[8], o[8];
  int32_t n[8];
  uint32_t u[8];
#pragma unroll
  for (int j = 0; j < 8; j++) {
    a[j] = -0.01f * (threadIdx.x + j);
    n[j] = threadIdx.x * 7 + j;
    o[j] = 0.0f;
    u[j] = 0;
  }
  for (int s = 0; s < steps; s++) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
      if (T == EX2 || T == MIX_EX2_E4M3 || T == MIX_EX2_I2F || T == MIX_EX2_FFMA) ex2(o[j], a[j]);
      if (T == E4M3 || (T == MIX_EX2_E4M3 && (j & 1))) e4m3(u[j], a[j], a[(j + 1) & 7]);
      if (T == I2F || T == MIX_EX2_I2F) i2f(o[(j + 4) & 7], n[j]);
      if (T == IADD) asm volatile("add.s32 %0, %1, %2;" : "=r"(u[j]) : "r"(n[j]), "r"(s));
      if (T == FFMA_ || T == MIX_EX2_FFMA)
        asm volatile("fma.rn.f32 %0, %1, %2, %3;" : "=f"(o[(j + 4) & 7]) : "f"(a[j]), "f"(a[j]), "f"(a[(j + 3) & 7]));
      if (T == FMNMX_) asm volatile("max.f32 %0, %1, %2;" : "=f"(o[j]) : "f"(a[j]), "f"(a[(j + 5) & 7]));
    }
  }
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; j++) acc += o[j] + (float)u[j];
  if (acc == 12345.0f) sink[threadIdx.x] = acc; /* keeps the outputs */
}

/* spins for `clocks` SM clocks (each read depends on the last test) */
__global__ void spin(long long clocks) {
  const long long t0 = clock64();
  while (clock64() - t0 < clocks) {
  }
}

/* ms of the second of two launches, by events */
template <class F> static float timed(F launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launch(); /* warm-up */
  cudaEventRecord(e0);
  launch();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = -1.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return cudaGetLastError() == cudaSuccess ? ms : -1.0f;
}

static double hz; /* the SM clock, measured */

template <int T> static double run(int sms, float *sink, int steps) {
  const float ms = timed([&] { pipes<T><<<sms, 1024>>>(sink, steps); });
  if (ms <= 0.0f) return -1.0;
  /* one CTA an SM: per SM, steps x per_step x 1024 in ms x hz clocks */
  return (double)steps * per_step[T] * 1024.0 / (ms * 1e-3 * hz);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  if (sms <= 0 || sms > 1024) { printf("fp8_pipes: no GPU\n"); return 1; }
  float *sink;
  cudaMalloc(&sink, sizeof(float) * 1024);
  const long long spin_clocks = 200000000LL; /* about 0.1 s */
  const float sms_spin = timed([&] { spin<<<sms, 32>>>(spin_clocks); });
  if (sms_spin <= 0.0f) { printf("fp8_pipes: the clock kernel failed\n"); return 1; }
  hz = (double)spin_clocks / (sms_spin * 1e-3);
  const int steps = 16384; /* ex2 alone: about 4 ms */
  double r[NTEST];
  r[EX2] = run<EX2>(sms, sink, steps);
  r[E4M3] = run<E4M3>(sms, sink, steps);
  r[I2F] = run<I2F>(sms, sink, steps);
  r[IADD] = run<IADD>(sms, sink, steps);
  r[FFMA_] = run<FFMA_>(sms, sink, steps);
  r[FMNMX_] = run<FMNMX_>(sms, sink, steps);
  r[MIX_EX2_E4M3] = run<MIX_EX2_E4M3>(sms, sink, steps);
  r[MIX_EX2_I2F] = run<MIX_EX2_I2F>(sms, sink, steps);
  r[MIX_EX2_FFMA] = run<MIX_EX2_FFMA>(sms, sink, steps);
  printf("fp8_pipes: %d SMs, SM clock %.0f MHz (measured), 1024 threads a CTA, one CTA an SM; "
         "thread instructions per clock per SM\n", sms, hz / 1e6);
  for (int t = 0; t < NTEST; t++) printf("  %-42s %7.1f\n", names[t], r[t]);
  /* the mixes: clocks per step if the parts shared a pipe (sum) or not (max) */
  const double ce = 8 / r[EX2], cp = 4 / r[E4M3], ci = 8 / r[I2F], cf = 8 / r[FFMA_];
  printf("  ex2 + e4m3: %.3f clocks a thread step measured; shared pipe %.3f, separate %.3f\n",
         12 / r[MIX_EX2_E4M3], ce + cp, ce > cp ? ce : cp);
  printf("  ex2 + i2f:  %.3f clocks a thread step measured; shared pipe %.3f, separate %.3f\n",
         16 / r[MIX_EX2_I2F], ce + ci, ce > ci ? ce : ci);
  printf("  ex2 + ffma: %.3f clocks a thread step measured; shared pipe %.3f, separate %.3f\n",
         16 / r[MIX_EX2_FFMA], ce + cf, ce > cf ? ce : cf);
  return 0;
}
