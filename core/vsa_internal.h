/*
** vsa_internal.h -- Video Sparse Attention (STA.md section 12; core/vsa*.c,
** kernels/vsa_*.cu): the cube order's rule, a call's resolved params, the
** CPU's pieces and reference, the benchmarks' timed marks.  Part of
** internal.h (which includes it); not installed.
*/
#ifndef STA_VSA_INTERNAL_H
#define STA_VSA_INTERNAL_H

#ifndef STA_INTERNAL_H
#error "include internal.h: it includes this header after what this one needs"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Video Sparse Attention (core/vsa*.c, kernels/vsa_*.cu) ------------ */

/* Cube order (STA.md section 12): canvas cut by cube, grid the cube grid
** (ceil per axis), vol the cube volume. */
typedef struct sta_vsa_cubes {
  int32_t canvas[3], cube[3], grid[3];
  int64_t count, vol;
} sta_vsa_cubes;
/* Valid tokens of cube c. */
STA_HD int64_t sta_cube_size(const sta_vsa_cubes *g, int64_t c) {
  const int64_t it = c / ((int64_t)g->grid[1] * g->grid[2]), ih = (c / g->grid[2]) % g->grid[1],
                iw = c % g->grid[2];
  const int64_t a = g->canvas[0] - it * g->cube[0], b = g->canvas[1] - ih * g->cube[1],
                e = g->canvas[2] - iw * g->cube[2];
  return (a < g->cube[0] ? a : g->cube[0]) * (b < g->cube[1] ? b : g->cube[1]) *
         (e < g->cube[2] ? e : g->cube[2]);
}
/* The untiled video index (t*H + h)*W + w of row j of the cube order, or
** -1 for a padding row (the rule; host and device). */
STA_HD int64_t sta_cube_token(const sta_vsa_cubes *g, int64_t j) {
  const int64_t c = j / g->vol, in = j % g->vol;
  const int64_t it = c / ((int64_t)g->grid[1] * g->grid[2]), ih = (c / g->grid[2]) % g->grid[1],
                iw = c % g->grid[2];
  const int64_t a = g->canvas[0] - it * g->cube[0], b = g->canvas[1] - ih * g->cube[1],
                e = g->canvas[2] - iw * g->cube[2];
  const int64_t st = a < g->cube[0] ? a : g->cube[0], sh = b < g->cube[1] ? b : g->cube[1],
                sw = e < g->cube[2] ? e : g->cube[2];
  if (in >= st * sh * sw) return -1;
  const int64_t lt = in / (sh * sw), lh = (in / sw) % sh, lw = in % sw;
  return ((it * g->cube[0] + lt) * g->canvas[1] + ih * g->cube[1] + lh) * g->canvas[2] +
         iw * g->cube[2] + lw;
}
/* The selection's order on a score (STA.md section 12): a larger key is
** chosen first; -0 and +0 one key, NaN above everything.  Equal keys go
** to the lower index. */
STA_HD uint32_t sta_vsa_key(float x) {
  uint32_t u;
  x = x + 0.0f; /* -0 -> +0 */
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* A VSA call resolved by core/vsa.c.  f: the fine branch (mask
** STA_MASK_BLOCKS, block_rows, q_blocks Mq, kv_blocks Mk, list_len topk,
** kv_len Sk, seq_len Sq; q, k, v; o and lse: the forward's out and lse,
** the backward's out_s scratch and lse; num, idx: the workspace's;
** q_sizes, kv_sizes: on the tensors' device, NULL for whole cubes; dout,
** dq, dk, dv in the backward).  The workspace's f32 arrays are
** contiguous: means and their gradients [B][heads][M][D], out_c
** [B][heads][Mq][D], lse_c [B][heads][Mq], the coarse matrix [B][heads][Mq]
** [Mk] (vsa_coarse leaves the probabilities A there), idx [B][heads][Mq]
** [topk], num [B][heads][Mq]. */
typedef struct sta_vsa_params {
  sta_attn_params f;
  const void *gate;          /* NULL: 1 */
  int64_t g_sb, g_ss, g_sh;
  const void *out;           /* backward: the forward's out */
  int64_t out_sb, out_ss, out_sh;
  void *dgate;               /* backward; NULL: not wanted */
  int64_t dg_sb, dg_ss, dg_sh;
  int32_t topk;
  float *qc, *kc, *vc, *oc, *lsec, *sc;
  int32_t *idx, *num;
  float *gc;                 /* backward: G[m], the gradient of out_c */
  float *dqc, *dkc, *dvc;    /* backward: the means' gradients */
} sta_vsa_params;

/* The CPU's pieces (core/vsa_cpu.c; the backend entries' contracts):
** means: qc, kc, vc.  coarse: from the means, sc = A, lsec, oc, idx
** (ascending), num.  combine: f.o += gate * oc on valid rows, 0 on padding
** rows.  backward_prep: f.o = out - gate * oc (valid rows, else 0), dgate
** = dout * oc (valid rows, else 0), gc = sum of dout * gate over each
** query cube's valid rows.  backward_coarse: from gc, the means, oc and
** sc = A: dqc, dkc, dvc, each added / the cube's size to the valid rows of
** f.dq, f.dk, f.dv (sc is overwritten). */
sta_status sta_cpu_vsa_means(const sta_vsa_params *p);
sta_status sta_cpu_vsa_coarse(const sta_vsa_params *p);
sta_status sta_cpu_vsa_combine(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_prep(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_coarse(const sta_vsa_params *p);
sta_status sta_cpu_vsa_reorder(sta_tensor *dst, const sta_tensor *src, const sta_vsa_cubes *c,
                               sta_layout layout, int32_t to_cubes);
/* The brute force in double (core/vsa_reference.c): f.o, f.lse (NULL:
** not wanted) from q, k, v, gate; the backward's f.dq, f.dk, f.dv, dgate
** from q, k, v, gate, f.dout.  Workspace unused. */
sta_status sta_cpu_vsa_reference(const sta_vsa_params *p);
sta_status sta_cpu_vsa_backward_reference(const sta_vsa_params *p);
/* STA_ERR_ARGUMENT "<wn>: shares memory with <rn> (the <what> writes ...)"
** when w and r overlap (NULL: fine). */
sta_status sta_vsa_no_alias(const char *what, const sta_tensor *w, const char *wn,
                            const sta_tensor *r, const char *rn);
/* Valid rows of query cube m and key cube n (sizes NULL: whole). */
static inline int64_t sta_vsa_qsize(const sta_vsa_params *p, int64_t m) {
  return p->f.q_sizes ? p->f.q_sizes[m] : p->f.block_rows;
}
static inline int64_t sta_vsa_kvsize(const sta_vsa_params *p, int64_t n) {
  return p->f.kv_sizes ? p->f.kv_sizes[n] : p->f.block_rows;
}
/* For benchmarks only (spec/vsa_bench.h), no user setting: timed marks.
** sta_vsa_mark_test records mark i (0..STA_VSA_MARKS-1) in the order of
** this thread's work on dev (CUDA: an event with timing on this thread's
** stream; the CPU: the clock); sta_vsa_elapsed_test waits for mark b and
** gives the ms from mark a to b.  While sta_vsa_set_marks_test's base is
** >= 0, this thread's sta_vsa_forward records marks base + 1.. after its
** checks and workspace, the means, the coarse branch and selection, the
** fine branch, the combine (sta_vsa_backward: ..., the coarse branch, the
** preparation, the fine backward, the coarse backward), the caller base +
** 0 before the call; -1 (the default): none.  The release frees this
** thread's events. */
enum { STA_VSA_MARKS = 128 };
sta_status sta_vsa_mark_test(sta_device dev, int32_t i);
sta_status sta_vsa_elapsed_test(sta_device dev, int32_t a, int32_t b, double *ms);
void sta_vsa_set_marks_test(int32_t base);
void sta_vsa_marks_release_test(void);

#ifdef __cplusplus
}
#endif

#endif
