/*
** bsa_traits.cuh -- what varies between the block-sparse forward kernels
** and where their shared memory is.  Two shapes, one kernel
** (kernel_bsa.cuh):
**   BK 64 (block_rows 64, "split"): a work item is one query block of 64
**     rows; BOTH consumer warpgroups hold those 64 rows and split the
**     block's key list between them (blocks 0, 2, 4.. and 1, 3, 5..), each
**     with its own online softmax, merged through shared memory at the end
**     (split-K inside the CTA), so that one's softmax runs under the
**     other's GEMMs as in the 128-row kernels; key blocks of 64 rows
**     (S: m64n64, PV: m64nD k64);
**   BK 128 (block_rows a multiple of 128, "shared"): a work item is 128
**     query rows (a part of a block), the two warpgroups 64 rows each,
**     sharing every 128-row key block as the STA kernels do.
**   BK 64 with PAIRS ("paired", pairs_bsa.cuh; sta_cuda_set_bsa_pairs_test):
**     a work item is two query blocks (2p, 2p + 1: 128 rows, warpgroup w
**     the block 2p + w) walking the union of their lists (bsa_pairs.cu),
**     each key block loaded once and computed by the warpgroups whose
**     block lists it; no merge buffers (each stores its own rows).
** A joint K/V ring of STAGES stages; the producer warpgroup (the last)
** has 128 threads: one issues every load by TMA, or all gather by
** cp.async where TMA cannot load.
*/
#ifndef STA_BSA_TRAITS_CUH
#define STA_BSA_TRAITS_CUH

#include <stddef.h>
#include <stdint.h>

namespace sta {

template <typename T_, int D_, int BK_, bool PAIRS_ = false> struct BsaTraits {
  using T = T_;
  static constexpr int D = D_, BK = BK_;
  static constexpr bool PAIRS = PAIRS_;
  static_assert(!PAIRS || BK == 64, "the paired kernel: 64-row blocks");
  static constexpr bool SPLIT = BK == 64 && !PAIRS;
  static constexpr int QR = SPLIT ? 64 : 128; /* query rows per item */
  static constexpr int STAGES = BK == 64 ? (D == 128 ? 6 : 8) : (D == 128 ? 3 : 6);
  static constexpr int THREADS = 384, CTH = 256;
  static constexpr int PREG = 104, CREG = 200; /* setmaxnreg: producer, consumers */
  static_assert(128 * (PREG + 2 * CREG) <= (65536 / THREADS) / 8 * 8 * THREADS,
                "setmaxnreg: more registers than the launch gives the CTA");
  /* byte offsets from the 1024-aligned base: Q [D/64][QR][64], K and V
  ** [STAGES][D/64][BK][64] (swizzled), the split kernel's merge buffers
  ** (X: half of a warpgroup's O, f32 [D/4][128 threads]; ML: (m, l) of
  ** both warpgroups' 64 rows), the barriers (kfull, kempty per stage, qfull,
  ** qempty), each stage's masked columns, the item, its key blocks and
  ** valid query rows */
  static constexpr int OQ = 0;
  static constexpr int OK = OQ + QR * D * 2;
  static constexpr int OV = OK + STAGES * BK * D * 2;
  static constexpr int OX = OV + STAGES * BK * D * 2;
  static constexpr int OML = OX + (SPLIT ? D / 4 * 128 * 4 : 0);
  static constexpr int OBAR = OML + (SPLIT ? 2 * 64 * 2 * 4 : 0);
  static constexpr int OLO = OBAR + (2 * STAGES + 2) * 8;
  static constexpr int OITEM = OLO + STAGES * 4;
  static constexpr size_t SMEM = (size_t)OITEM + (PAIRS ? 32 : 16) + 1024; /* + the alignment */
  static_assert(SMEM <= 232448, "more shared memory than an sm_90 CTA has");
};

template <class K> struct BsaSmem {
  using T = typename K::T;
  T *q, *k, *v;
  float *x, *ml;
  uint64_t *kfull, *kempty, *qfull, *qempty;
  volatile int *lo;    /* [STAGES]: columns to mask (bsa_walk.h); the paired kernel: | flags << 8 */
  volatile int *sitem; /* [0] the item (-1: the end), [1] its key blocks, [2] its valid query rows;
                       ** the paired kernel: [2], [3] valid rows of 2p, 2p + 1 (-1: no block
                       ** 2p + 1), [4], [5] their key blocks */
};

} /* namespace sta */

#endif
