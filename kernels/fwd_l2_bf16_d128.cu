/*
** fwd_l2_bf16_d128.cu -- opt-in experiments on how the persistent forward
** shares the L2 (STA_FWD_L2, read per call), for bf16 D 128 where the
** default takes Wide: the kernel WideL2 (Wide with the experiments
** compiled in; the default kernels do not change).  Large windows walk
** more of a head's K and V than the L2 holds (hunyuan-720p's full window:
** 59 MB a head, the L2 50 MB), so what the L2 keeps depends on how far
** apart the CTAs walking the same keys are.  The bits of STA_FWD_L2:
**   1  hints: K/V loads evict_last, Q loads and the output evict_first
**      (FA3's choice for K, V and Q);
**   2  wave gate: items of at least STA_FWD_L2_GATE_MB (16) of K/V start
**      their keys when the waves before theirs have issued their last
**      loads (tile_scheduler.cuh, l2_gate);
**   4  pin: evict_last only for the first STA_FWD_L2_PIN_MB (20) of each
**      head's keys (frames from 0; the text rows too), the rest
**      evict_normal; Q and the output evict_first;
** (A persisting-L2 set-aside, cudaLimitPersistingL2CacheSize, was left
** out: it changes a device-wide limit, and sta changes no device setting.)
** Every setting computes the same bits as the default (the order of each
** item's keys is not touched); test_gpu_attention checks it, and
** bench_gpu.py --env STA_FWD_L2=0,1,... times them in one process.
*/
#include <stdint.h>
#include <stdlib.h>

#include "launch_fwd.cuh"

namespace sta {

/* getenv name as a number of MB within [1, 4096], or def */
static int env_mb(const char *name, int def) {
  const char *s = getenv(name);
  const int v = s ? atoi(s) : def;
  return v >= 1 && v <= 4096 ? v : def;
}

int fwd_l2_config(FwdParams &a) {
  const char *s = getenv("STA_FWD_L2");
  const int m = s ? atoi(s) & 7 : 0;
  const size_t row = 2 * 128 * sizeof(__nv_bfloat16);            /* K + V bytes of a key */
  const size_t pin = (size_t)env_mb("STA_FWD_L2_PIN_MB", 20) << 20;
  if (!m) return 0;
  a.l2 = m;
  const size_t blk = Wide<__nv_bfloat16>::BK * row;                  /* a key block: 96 KB */
  a.l2_gate_nkb = (int)((((size_t)env_mb("STA_FWD_L2_GATE_MB", 16) << 20) + blk - 1) / blk);
  const int64_t frame = (int64_t)a.cH * a.cW;
  const int64_t pin_t = (int64_t)(pin / row) / frame;
  a.l2_pin_t = (int)(pin_t < a.cT ? pin_t : a.cT);
  a.l2_pin_row = (int)(a.l2_pin_t * frame);
  return 1;
}

sta_status run_fwd_l2(FwdParams &a) { return launch_fwd<WideL2<__nv_bfloat16>, true>(a); }

} /* namespace sta */
