/*
** ptx.cuh -- sm_90 PTX the kernels are built from: shared-memory
** addresses, cp.async, mbarriers, TMA tensor copies, L2 eviction
** policies, named barriers, setmaxnreg, proxy fences, ex2.  Nothing here
** knows about attention; a backward or fp8 kernel includes it as it is.
*/
#ifndef STA_PTX_CUH
#define STA_PTX_CUH

#include <cuda.h> /* CUtensorMap (types only: no -lcuda) */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

namespace sta {

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- cp.async ------------------------------------------------------------ */

/* 16 bytes from src into shared dst; nbytes < 16 zero-fills the rest. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src,
                                           int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(nbytes));
}
/* 4 bytes from src into shared dst (4-byte aligned); nbytes 0 zero-fills. */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int nbytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(nbytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}
__device__ __forceinline__ void cp_async_wait_1() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}
/* Before shared memory written by ordinary stores or cp.async is read by
** the tensor cores or the copy engine (with a barrier after it). */
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- math ---------------------------------------------------------------- */

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* ---- barriers ------------------------------------------------------------ */

/* Named barrier id over n threads: wait, or arrive without waiting. */
__device__ __forceinline__ void bar_named(int id, int n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive_named(int id, int n) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ void mbar_init(uint64_t *b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(b))
               : "memory");
}
#ifdef STA_HANG_TRAP
/* debug builds only: a wait that has spun for ~1 s prints which barrier
** (its offset from the 1024-aligned shared-memory base, the parity; lane 0
** of each warp, 48 prints in all) and gives up, so the kernel ends, wrong,
** and the prints flush (it found a producer waiting for consumers that
** were stuck in setmaxnreg) */
static __device__ int sta_hang_prints;
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  const long long t0 = clock64();
  for (;;) {
    uint32_t ok;
    asm volatile("{\n.reg .pred P1;\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, P1;\n}\n"
                 : "=r"(ok) : "r"(smem_u32(b)), "r"(parity) : "memory");
    if (ok) return;
    if (clock64() - t0 > 2000000000LL) {
      extern __shared__ unsigned char smem_raw[];
      if ((threadIdx.x & 31) == 0 && atomicAdd(&sta_hang_prints, 1) < 48)
        printf("hang: block %d tid %d barrier at +%u parity %d\n", blockIdx.x, threadIdx.x,
               (unsigned)(smem_u32(b) - ((smem_u32(smem_raw) + 1023) & ~1023u)), parity);
      return;
    }
  }
}
#else
__device__ __forceinline__ void mbar_wait(uint64_t *b, int parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE_%=;\nbra WAIT_%=;\nDONE_%=:\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
#endif
/* Arrive and expect bytes more of TMA traffic on b. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t *b, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   smem_u32(b)),
               "r"(bytes)
               : "memory");
}

/* ---- TMA ------------------------------------------------------------------ */

/* One box of tensor map m at coordinates (c0, ...) into shared dst,
** completing on bar; HINT: with the L2 eviction policy pol (l2_policy). */
template <bool HINT = false>
__device__ __forceinline__ void tma_load_5d(void *dst, const CUtensorMap *m,
                                            int c0, int c1, int c2, int c3,
                                            int c4, uint64_t *bar, uint64_t pol = 0) {
  if constexpr (HINT)
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::"
        "bytes.L2::cache_hint [%0], [%1, {%2, %3, %4, %5, %6}], [%7], %8;\n" ::"r"(
            smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "r"(c4), "r"(smem_u32(bar)), "l"(pol)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::"
        "bytes [%0], [%1, {%2, %3, %4, %5, %6}], [%7];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
        "r"(c4), "r"(smem_u32(bar))
        : "memory");
}
template <bool HINT = false>
__device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *m,
                                            int c0, int c1, int c2,
                                            uint64_t *bar, uint64_t pol = 0) {
  if constexpr (HINT)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::"
        "bytes.L2::cache_hint [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2),
        "r"(smem_u32(bar)), "l"(pol)
        : "memory");
  else
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::"
        "bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(m)), "r"(c0), "r"(c1), "r"(c2),
        "r"(smem_u32(bar))
        : "memory");
}

/* ---- L2 eviction policies ------------------------------------------------ */

/* A policy for every line an access with it touches (createpolicy,
** fraction 1): P 0 evict_normal, 1 evict_first (read once: Q, the
** output), 2 evict_last (kept over the others). */
template <int P> __device__ __forceinline__ uint64_t l2_policy() {
  uint64_t pol;
  if constexpr (P == 1)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(pol));
  else if constexpr (P == 2)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(pol));
  return pol;
}
/* 4 bytes to global memory with L2 policy pol */
__device__ __forceinline__ void st_global_hint(void *p, uint32_t v, uint64_t pol) {
  asm volatile("st.global.L2::cache_hint.b32 [%0], %1, %2;\n" ::"l"(p), "r"(v), "l"(pol)
               : "memory");
}

/* ---- registers ------------------------------------------------------------ */

/* setmaxnreg: this warpgroup's registers per thread down or up to N.  The
** kernel needs a register cap at entry (__launch_bounds__(threads, 1)),
** each role one branch, and the sum within what the launch gives the CTA:
** an increase beyond it never returns. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

/* ---- bulk copies (1-D) ------------------------------------------------- */

/* bytes (a multiple of 16) from global to shared, completing on bar */
__device__ __forceinline__ void bulk_load(void *dst, const void *src, int bytes, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
/* f32 add of bytes from shared into global, asynchronous: one bulk group */
__device__ __forceinline__ void bulk_reduce_add(float *dst, const float *src, int bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
      "cp.async.bulk.commit_group;\n" ::"l"(dst), "r"(smem_u32(src)), "r"(bytes)
      : "memory");
}
/* every bulk group but the newest has read its shared memory */
__device__ __forceinline__ void bulk_wait_read1() {
  asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
}
/* every bulk group has completed */
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

/* ---- global flags ----------------------------------------------------- */

__device__ __forceinline__ int ld_acquire(const int *p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int *p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

} /* namespace sta */


#endif
