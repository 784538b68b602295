/*
** cuda_backend.cu -- the CUDA backend table (core/backend.h): probe,
** device memory, transfers, the SM count, attention (fwd_api.cu),
** head_diff, and what the sequence-parallel layer needs (device choice,
** streams, events, 2-D copies); the elementwise operations are in
** ops_elementwise.cu and ops_stats.cu.  Never prints, never aborts: every
** failure is a status and a message.
*/
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bsa_bwd_params.h" /* sta_cuda_block_attention_backward */
#include "bsa_params.h"     /* sta_cuda_block_attention */
#include "ops.cuh" /* to_f32: the elementwise operations' conversion */
#include "vsa.cuh" /* VSA's pieces (vsa_rows.cu, vsa_coarse.cu) */

sta_status sta_cuda_fail(cudaError_t e, const char *what) {
  (void)cudaGetLastError(); /* clear a non-sticky error */
  if (e == cudaErrorMemoryAllocation)
    return sta_error(STA_ERR_DEVICE_NOMEM, "cuda: %s: out of device memory",
                     what);
  return sta_error(STA_ERR_DEVICE, "cuda: %s failed: %s (%s)", what,
                   cudaGetErrorString(e), cudaGetErrorName(e));
}

namespace {

/* ---- probe ---------------------------------------------------------------- */

__global__ void probe_kernel(int *p) {
  if (p) *p = 1;
}

struct Probe {
  int ok;
  char why[256];
};

Probe do_probe() {
  Probe r;
  r.ok = 0;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(r.why, sizeof r.why, "cuda: no usable driver or device (%s)",
             cudaGetErrorString(e));
    return r;
  }
  if (n < 1) {
    snprintf(r.why, sizeof r.why, "cuda: no CUDA device");
    return r;
  }
  int dev = 0;
  cudaDeviceProp prop;
  if ((e = cudaGetDevice(&dev)) != cudaSuccess ||
      (e = cudaGetDeviceProperties(&prop, dev)) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(r.why, sizeof r.why, "cuda: cannot query the device (%s)",
             cudaGetErrorString(e));
    return r;
  }
  if (prop.major != 9 || prop.minor != 0) {
    snprintf(r.why, sizeof r.why,
             "cuda: device %s is sm_%d%d; this build holds sm_90a code only",
             prop.name, prop.major, prop.minor);
    return r;
  }
  cudaFuncAttributes fa;
  if ((e = cudaFuncGetAttributes(&fa, probe_kernel)) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(r.why, sizeof r.why, "cuda: kernels do not load on %s (%s)",
             prop.name, cudaGetErrorString(e));
    return r;
  }
  r.ok = 1;
  snprintf(r.why, sizeof r.why, "cuda: %s (sm_%d%d, %d SMs, %.0f GiB)",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount,
           (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return r;
}

int32_t cuda_probe(const char **why) {
  static Probe r = do_probe(); /* thread-safe once */
  if (why) *why = r.why;
  return r.ok;
}

/* ---- memory --------------------------------------------------------------- */

sta_status cuda_alloc(void **p, size_t n) {
  void *d = NULL;
  cudaError_t e = cudaMalloc(&d, n ? n : 1);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorMemoryAllocation)
      return sta_error(STA_ERR_DEVICE_NOMEM,
                       "out of device memory: %zu bytes", n);
    return sta_cuda_fail(e, "cudaMalloc");
  }
  *p = d;
  return STA_OK;
}

void cuda_release(void *p) {
  if (p) (void)cudaFree(p);
}

sta_status cuda_memcpy(void *dst, sta_device dd, const void *src,
                       sta_device sd, size_t n) {
  if (n == 0) return STA_OK;
  cudaMemcpyKind kind = dd == STA_CUDA
                            ? (sd == STA_CUDA ? cudaMemcpyDeviceToDevice
                                              : cudaMemcpyHostToDevice)
                            : cudaMemcpyDeviceToHost;
  cudaStream_t s = sta_cuda_stream();
  cudaError_t e = cudaMemcpyAsync(dst, src, n, kind, s);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaMemcpyAsync");
  if (kind != cudaMemcpyDeviceToDevice) sta_transfer_account((int64_t)n);
  /* the host side may be freed or read as soon as we return */
  if (kind != cudaMemcpyDeviceToDevice &&
      (e = cudaStreamSynchronize(s)) != cudaSuccess)
    return sta_cuda_fail(e, "cudaStreamSynchronize");
  return STA_OK;
}

} /* namespace */

cudaError_t sta_cuda_ws_alloc(void **p, size_t n, cudaStream_t s) {
  static cudaMemPool_t pools[64];
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  int dev = 0;
  if (cudaStreamIsCapturing(s, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone ||
      cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return cudaMallocAsync(p, n, s);
  }
  pthread_mutex_lock(&lock);
  if (!pools[dev]) {
    cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    cudaMemPool_t pool = NULL;
    uint64_t keep = UINT64_MAX;
    if (cudaMemPoolCreate(&pool, &props) == cudaSuccess &&
        cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess)
      pools[dev] = pool;
    else if (pool)
      (void)cudaMemPoolDestroy(pool);
    (void)cudaGetLastError();
  }
  cudaMemPool_t pool = pools[dev];
  pthread_mutex_unlock(&lock);
  if (!pool) return cudaMallocAsync(p, n, s);
  cudaError_t e = cudaMallocFromPoolAsync(p, n, pool, s);
  if (e == cudaErrorMemoryAllocation) { /* what the pool keeps unused goes back, then once more */
    (void)cudaGetLastError();
    (void)cudaMemPoolTrimTo(pool, 0);
    e = cudaMallocFromPoolAsync(p, n, pool, s);
  } else if (e != cudaSuccess) { /* a pool gone with its context (a device reset): a new one next time */
    (void)cudaGetLastError();
    pthread_mutex_lock(&lock);
    if (pools[dev] == pool) pools[dev] = NULL;
    pthread_mutex_unlock(&lock);
    e = cudaMallocAsync(p, n, s);
  }
  return e;
}

int sta_cuda_sm_count(void) {
  static int n[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return 132;
  }
  if (!n[dev]) {
    int c = 0;
    if (cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || c <= 0) {
      (void)cudaGetLastError();
      c = 132;
    }
    n[dev] = c;
  }
  return n[dev];
}

namespace {

sta_status cuda_synchronize(void) {
  cudaError_t e = cudaStreamSynchronize(sta_cuda_stream());
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaStreamSynchronize");
  return STA_OK;
}

/* ---- head_diff: per-head mean |a-b| and (a-b)^2 ---------------------------- */

/* Element off of base (element-indexed: ops.cuh's ld1 takes a byte address,
** which costs this kernel 2 more registers); the conversion is ops.cuh's. */
__device__ __forceinline__ float load_as_f32(const void *base, int dt, int64_t off) {
  if (dt == STA_F32) return ((const float *)base)[off];
  return to_f32(((const uint16_t *)base)[off], dt);
}

struct DiffArgs {
  const void *a, *b;
  int dtype;
  int64_t batch, seq, heads, d;
  int64_t a_sb, a_ss, a_sh, b_sb, b_ss, b_sh;
  double *acc; /* [heads][2] */
};

/* grid: (row chunks, heads, batch); float partials per thread, double
** block totals. */
__global__ void head_diff_kernel(DiffArgs x) {
  const int64_t h = blockIdx.y, bb = blockIdx.z;
  const int64_t rows_per = (x.seq + gridDim.x - 1) / gridDim.x;
  const int64_t r0 = blockIdx.x * rows_per;
  const int64_t r1 = min(x.seq, r0 + rows_per);
  double s1 = 0, s2 = 0;
  float f1 = 0, f2 = 0;
  int64_t total = (r1 - r0) * x.d;
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    int64_t r = r0 + i / x.d, c = i % x.d;
    float va = load_as_f32(x.a, x.dtype, bb * x.a_sb + r * x.a_ss + h * x.a_sh + c);
    float vb = load_as_f32(x.b, x.dtype, bb * x.b_sb + r * x.b_ss + h * x.b_sh + c);
    float df = va - vb;
    f1 += fabsf(df);
    f2 += df * df;
    if ((i / blockDim.x) % 64 == 63) { s1 += f1; s2 += f2; f1 = f2 = 0; }
  }
  s1 += f1;
  s2 += f2;
  for (int o = 16; o > 0; o >>= 1) {
    s1 += __shfl_xor_sync(0xffffffffu, s1, o);
    s2 += __shfl_xor_sync(0xffffffffu, s2, o);
  }
  __shared__ double red[2][32];
  int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { red[0][w] = s1; red[1][w] = s2; }
  __syncthreads();
  if (threadIdx.x == 0) {
    double t1 = 0, t2 = 0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) { t1 += red[0][i]; t2 += red[1][i]; }
    atomicAdd(&x.acc[2 * h], t1);
    atomicAdd(&x.acc[2 * h + 1], t2);
  }
}

sta_status cuda_head_diff(const sta_attn_params *p, float *l1, float *l2) {
  if (p->heads == 0) return STA_OK;
  cudaStream_t s = sta_cuda_stream();
  size_t nb = sizeof(double) * 2 * (size_t)p->heads;
  double *acc = NULL;
  cudaError_t e = cudaMallocAsync((void **)&acc, nb, s);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaMallocAsync");
  double *host = (double *)malloc(nb);
  if (!host) {
    cudaFreeAsync(acc, s);
    return sta_error(STA_ERR_NOMEM, "head_diff: out of host memory");
  }
  sta_status rc = STA_OK;
  e = cudaMemsetAsync(acc, 0, nb, s);
  if (e == cudaSuccess && p->batch > 0 && p->seq_len > 0 && p->head_dim > 0) {
    DiffArgs x;
    x.a = p->q; x.b = p->o; x.dtype = (int)p->dtype;
    x.batch = p->batch; x.seq = p->seq_len; x.heads = p->heads; x.d = p->head_dim;
    x.a_sb = p->q_sb; x.a_ss = p->q_ss; x.a_sh = p->q_sh;
    x.b_sb = p->o_sb; x.b_ss = p->o_ss; x.b_sh = p->o_sh;
    x.acc = acc;
    int64_t chunks = (p->seq_len * p->head_dim + 32767) / 32768;
    if (chunks > 4096) chunks = 4096;
    if (chunks > p->seq_len) chunks = p->seq_len;
    if (chunks < 1) chunks = 1;
    if (p->heads > 65535 || p->batch > 65535) {
      rc = sta_error(STA_ERR_UNSUPPORTED, "head_diff: %lld heads x batch %lld too large for cuda",
                     (long long)p->heads, (long long)p->batch);
    } else {
      head_diff_kernel<<<dim3((unsigned)chunks, (unsigned)p->heads, (unsigned)p->batch), 256, 0, s>>>(x);
      e = cudaGetLastError();
    }
  }
  if (rc == STA_OK && e == cudaSuccess)
    e = cudaMemcpyAsync(host, acc, nb, cudaMemcpyDeviceToHost, s);
  if (rc == STA_OK && e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (rc == STA_OK && e != cudaSuccess) rc = sta_cuda_fail(e, "head_diff");
  cudaFreeAsync(acc, s);
  if (rc == STA_OK) {
    double n = (double)p->batch * (double)p->seq_len * (double)p->head_dim;
    for (int64_t h = 0; h < p->heads; h++) {
      l1[h] = n > 0 ? (float)(host[2 * h] / n) : 0.f;
      l2[h] = n > 0 ? (float)(host[2 * h + 1] / n) : 0.f;
    }
  }
  free(host);
  return rc;
}

/* ---- devices, streams, events, 2-D copies (core/dist/) --------------------- */

int32_t cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

sta_status cuda_set_device(int32_t device) {
  cudaError_t e = cudaSetDevice(device);
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "cudaSetDevice");
}

sta_status cuda_stream_create(void **stream) {
  cudaStream_t s = NULL;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaStreamCreateWithFlags");
  *stream = s;
  return STA_OK;
}

void cuda_stream_destroy(void *stream) {
  if (stream) (void)cudaStreamDestroy((cudaStream_t)stream);
}

sta_status cuda_event_create(void **event) {
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaEventCreateWithFlags");
  *event = ev;
  return STA_OK;
}

void cuda_event_destroy(void *event) {
  if (event) (void)cudaEventDestroy((cudaEvent_t)event);
}

sta_status cuda_event_record(void *event, void *stream) {
  cudaError_t e = cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream);
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "cudaEventRecord");
}

sta_status cuda_timer_create(void **event) {
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreate(&ev);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaEventCreate (timer)");
  *event = ev;
  return STA_OK;
}

sta_status cuda_event_elapsed(void *start, void *end, double *ms) {
  float f = 0;
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)end);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&f, (cudaEvent_t)start, (cudaEvent_t)end);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaEventElapsedTime");
  *ms = f;
  return STA_OK;
}

sta_status cuda_stream_wait(void *stream, void *event) {
  cudaError_t e = cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0);
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "cudaStreamWaitEvent");
}

sta_status cuda_copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                        size_t height) {
  cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault,
                                    sta_cuda_stream());
  return e == cudaSuccess ? STA_OK : sta_cuda_fail(e, "cudaMemcpy2DAsync");
}

/* The window (fwd_api.cu) or a block list (bsa_api.cu). */
sta_status cuda_attention(const sta_attn_params *p) {
  return p->mask == STA_MASK_WINDOW ? sta_cuda_attention(p) : sta_cuda_block_attention(p);
}

sta_status cuda_attention_backward(const sta_attn_params *p) {
  return p->mask == STA_MASK_WINDOW ? sta_cuda_attention_backward(p)
                                    : sta_cuda_block_attention_backward(p);
}

const sta_backend_ops cuda_ops = {
    "cuda",      cuda_probe,     cuda_alloc,  cuda_release,
    cuda_memcpy, sta_cuda_copy,  sta_cuda_fill, sta_cuda_randn,
    cuda_attention, cuda_head_diff, cuda_synchronize, cuda_attention_backward,
    sta_cuda_lincomb, sta_cuda_stats, sta_cuda_attention_fp8,
    /* the block-sparse kernels (bsa_api.cu, bsa_bwd_api.cu) and their list check */
    1 << STA_MASK_BLOCKS | 1 << STA_MASK_WINDOW_OR_BLOCKS, sta_cuda_check_lists,
    /* VSA's pieces around the fine branch (vsa_rows.cu, vsa_coarse.cu) */
    sta_cuda_vsa_means, sta_cuda_vsa_coarse, sta_cuda_vsa_combine, sta_cuda_vsa_backward_prep,
    sta_cuda_vsa_backward_coarse, sta_cuda_vsa_reorder, sta_cuda_vsa_workspace,
    sta_cuda_vsa_workspace_free, sta_cuda_vsa_capturing,
    /* devices, streams, events, 2-D copies (core/dist/) */
    cuda_device_count, cuda_set_device, cuda_stream_create, cuda_stream_destroy,
    cuda_event_create, cuda_event_destroy, cuda_event_record, cuda_stream_wait,
    cuda_copy_2d,
    /* sta_attention_forward_fp8's operands dequantized (fp8_quant.cu) */
    sta_cuda_fp8_dequantize,
    /* timing events (the benchmarks' marks) */
    cuda_timer_create, cuda_event_elapsed};

} /* namespace */

extern "C" const sta_backend_ops *sta_cuda_backend(void) { return &cuda_ops; }
