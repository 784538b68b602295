/*
** tile_scheduler.cu -- the host side of tile_scheduler.cuh.
*/
#include <pthread.h>

#include "tile_scheduler.cuh"

namespace sta {

/* The persistent kernel's counters: a ring of slots per device, zeroed
** once; each launch takes the next slot and its last CTA zeroes it again,
** so launches in flight on different streams do not share one.  The ring
** is allocated by the first launch on a device; *slot = NULL (use the
** one-CTA-per-item kernel) when that launch is being captured into a CUDA
** graph, where cudaMalloc is not allowed.  The allocation runs in relaxed
** capture mode so that another thread's capture is not invalidated. */
constexpr int SCHED_SLOTS = 256, SCHED_INTS = 4;
sta_status sched_slot(int **slot) {
  static int *ring[64];
  static unsigned next[64];
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  *slot = NULL;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return sta_cuda_fail(e, "cudaGetDevice");
  if (dev < 0 || dev >= 64) return STA_OK;
  pthread_mutex_lock(&mu);
  if (!ring[dev]) {
    cudaStream_t st = sta_cuda_stream();
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(st, &cs) != cudaSuccess) {
      (void)cudaGetLastError();
      cs = cudaStreamCaptureStatusActive;
    }
    if (cs != cudaStreamCaptureStatusNone) {
      pthread_mutex_unlock(&mu);
      return STA_OK;
    }
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    int *r = NULL;
    e = cudaMalloc((void **)&r, SCHED_SLOTS * SCHED_INTS * sizeof(int));
    if (e == cudaSuccess) e = cudaMemsetAsync(r, 0, SCHED_SLOTS * SCHED_INTS * sizeof(int), st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st); /* for every stream */
    (void)cudaThreadExchangeStreamCaptureMode(&mode);
    if (e != cudaSuccess) {
      if (r) cudaFree(r);
      pthread_mutex_unlock(&mu);
      return sta_cuda_fail(e, "attention scheduler counters");
    }
    ring[dev] = r;
  }
  *slot = ring[dev] + SCHED_INTS * (next[dev]++ % SCHED_SLOTS);
  pthread_mutex_unlock(&mu);
  return STA_OK;
}

/* The work items of a launch with BR-row query items (a.qbpt set by the
** caller): text query blocks first, then the tiles' query blocks; sets
** a.n_text_qblocks, a.n_text_items, a.n_items (0: nothing to launch). */
sta_status count_items(FwdParams &a, int BR) {
  a.n_text_qblocks = (a.S - a.VR + BR - 1) / BR;
  int64_t nt = (int64_t)a.batch * a.heads * a.n_text_qblocks;
  int64_t n = nt + (int64_t)a.batch * a.heads * a.NT * a.NH * a.NW * a.qbpt;
  a.n_items = 0;
  if (n <= 0) return STA_OK;
  if (n > 0x7fffffff)
    return sta_error(STA_ERR_UNSUPPORTED,
                     "attention: %lld work items, too many for the CUDA backend",
                     (long long)n);
  a.n_text_items = (int)nt;
  a.n_items = (int)n;
  return STA_OK;
}

/* a.gate_nkb of a persistent launch (tile_scheduler.cuh) */
int wave_gate_nkb(const FwdParams &a, int grid, int bk, int64_t blk) {
  const int64_t t = sta_cuda_wave_gate_test();
  const int64_t bytes = t ? t : WAVE_GATE_BYTES;
  if (bytes < 0 || a.n_items <= grid) return 0;
  const int64_t nkb = (bytes + blk - 1) / blk;
  /* the longest item: a text query block (every key) or a tile's query
  ** block under the largest window (window_plan's nkb) */
  int64_t most = a.n_text_items ? (a.V + a.text_len + bk - 1) / bk : 0;
  const int64_t bpt = (a.tile_vol + bk - 1) / bk, tb = (a.text_len + bk - 1) / bk;
  for (int h = 0; h < a.heads; h++) {
    const int64_t w = (int64_t)a.win[3 * h] * a.win[3 * h + 1] * a.win[3 * h + 2] * bpt + tb;
    most = w > most ? w : most;
  }
  return most >= nkb ? (int)nkb : 0;
}

} /* namespace sta */
