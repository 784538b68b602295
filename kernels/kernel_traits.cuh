/*
** kernel_traits.cuh -- what varies between the forward kernels, and where
** their shared memory is.  One kernel (kernel_fwd.cuh) and one mainloop
** serve all three shapes:
**   Square<T, D>: 128 query rows (two consumer warpgroups) x 128-key blocks,
**     K and V of a block in one ring of 3 stages, registers 64 / 216; the
**     only one with the 128-thread gather producer (for what TMA cannot
**     load), so the fallback wherever the tiles or strides rule out the
**     others;
**   Wide<T>: D 128, 128 query rows x 192-key blocks (3 t-slices of an 8x8
**     tile), so the per-block work of the loop is spread over 1.5 times the
**     keys; only two 96 KB K + V blocks fit beside Q, so K and V have rings
**     of their own (2 stages each, as in FA3: K(i + 1) is released once
**     S(i + 1) is done, V(i) once PV(i) is); registers 24 / 240;
**   Tall<T>: D 64, 192 query rows (three consumer warpgroups) x 128-key
**     blocks, 6 stages, registers 32 / 160.
** setmaxnreg moves registers only within what the launch gives the CTA
** (65536 / threads, rounded down to a multiple of 8, per thread); an
** increase beyond it never returns and the consumers hang, hence the
** static_assert. */
#ifndef STA_KERNEL_TRAITS_CUH
#define STA_KERNEL_TRAITS_CUH

#include <cuda_runtime.h> /* int4 */
#include <stddef.h>
#include <stdint.h>

namespace sta {

template <typename T_, int D_, int BR_, int BK_, int STAGES_, bool SPLIT_, int PREG_, int CREG_,
          bool GATHER_>
struct FwdTraits {
  using T = T_;
  static constexpr int D = D_;           /* head dim */
  static constexpr int BR = BR_;         /* query rows per work item */
  static constexpr int BK = BK_;         /* keys per block */
  static constexpr int STAGES = STAGES_; /* per ring */
  static constexpr bool SPLIT = SPLIT_;  /* K and V in rings of their own */
  static constexpr int PREG = PREG_, CREG = CREG_; /* setmaxnreg: producer, consumers */
  static constexpr bool GATHER = GATHER_; /* the cp.async producer where TMA cannot load */
  static constexpr int NWG = BR / 64;     /* consumer warpgroups */
  static constexpr int CTH = 128 * NWG;   /* consumer threads */
  static constexpr int THREADS = CTH + 128;
  static_assert(BR % 64 == 0 && BK % 64 == 0 && D % 64 == 0, "64-row and 64-column units");
  static_assert(!GATHER || (BK == 128 && !SPLIT), "the gather producer fills 128-key joint stages");
  static_assert(128 * (PREG + NWG * CREG) <= (65536 / THREADS) / 8 * 8 * THREADS,
                "setmaxnreg: more registers than the launch gives the CTA");
  /* dynamic shared memory: 1024 for the alignment, Q, the K and V stages,
  ** the barriers, the stages' block info, (joint rings) the gather's row
  ** tables, the item number */
  static constexpr size_t SMEM =
      1024 + (size_t)(BR * D + 2 * STAGES * BK * D) * sizeof(T) +
      ((SPLIT ? 4 : 2) * STAGES + 2) * sizeof(uint64_t) + STAGES * sizeof(int4) +
      (SPLIT ? 0 : (size_t)(2 * BK + BR) * sizeof(int)) + sizeof(int);
};
template <typename T, int D> using Square = FwdTraits<T, D, 128, 128, 3, false, 64, 216, true>;
template <typename T> using Wide = FwdTraits<T, 128, 128, 192, 2, true, 24, 240, false>;
template <typename T> using Tall = FwdTraits<T, 64, 192, 128, 6, false, 32, 160, false>;

/* Where a kernel's shared memory is: Q, the K and V stages, the barriers,
** the stages' block info, (joint rings) the gather's row tables, the item
** number, from the 1024-aligned base of the dynamic shared memory (sta_fwd
** lays it out: assigned field by field in the kernel, the compiler folds
** the constant offsets into every address, which it did not when the
** struct came from a helper; K::SMEM is its size). */
template <class K> struct FwdSmem {
  using T = typename K::T;
  T *q, *k, *v;             /* Q [BR][D]; K, V [STAGES][BK][D] */
  uint64_t *kfull, *kempty; /* per stage; joint rings: K and V of the stage */
  uint64_t *vfull, *vempty; /* split rings: V's; joint: kfull, kempty */
  uint64_t *qfull, *qempty; /* Q of the item loaded and sitem set / both free */
  int4 *binfo;              /* [STAGES]: pack_binfo of each (K) stage's block */
  int *rowtab, *qrow;       /* joint rings: the gather's [2][BK] and [BR] */
  volatile int *sitem;      /* the item being computed, -1 at the end */
};

} /* namespace sta */

#endif
