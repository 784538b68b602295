/*
** overlap.c -- whether strided views share memory, decided on the elements
** (bytes), not on their spans: two interleaved head slices of one tensor
** are disjoint; a stride-0 view, or one whose strides fold back onto
** themselves, has elements that are one location.
**
** A view's bytes are base + sum c_t x_t, 0 <= x_t <= u_t (one term per
** dimension of size > 1, strides made positive, and one for the bytes of
** an element).  Two views share a byte when a bounded linear equation with
** positive coefficients has a solution; a view overlaps itself when one
** with a nonzero difference does.  Terms are first merged where that is
** exact (equal coefficients add their bounds; c' = c (u + 1) nests into
** one term), then a depth-first search takes the largest coefficient
** first, keeps only the values the remaining terms can complete (their
** bounds and their gcd) and solves the last two terms by Euclid.  Strided
** views of real tensors (narrowed, permuted, interleaved, expanded) take a
** handful of steps; contrived strides could take many, so the search stops
** after STA_OVERLAP_WORK steps and answers "may share", which callers
** refuse: never a false "disjoint".
*/
#include <stdint.h>
#include <stdlib.h>

#include "internal.h"

#define MAXT 18 /* terms of two views: 2 x (4 dims + 1 byte term), merged */
#define STA_OVERLAP_WORK (1 << 20)

typedef struct terms {
  int n;
  int64_t c[MAXT], u[MAXT];
} terms;

static int64_t gcd64(int64_t a, int64_t b) {
  while (b) { int64_t t = a % b; a = b; b = t; }
  return a < 0 ? -a : a;
}

static void add_term(terms *t, int64_t c, int64_t u) {
  if (u > 0 && c > 0) { t->c[t->n] = c; t->u[t->n] = u; t->n++; }
}

/* Sort by coefficient (descending), then merge equal coefficients and
** nested pairs (c_big = c_small (u_small + 1)) until nothing changes. */
static void normalise(terms *t) {
  for (int changed = 1; changed;) {
    changed = 0;
    for (int i = 1; i < t->n; i++) /* insertion sort, descending */
      for (int j = i; j > 0 && t->c[j] > t->c[j - 1]; j--) {
        int64_t c = t->c[j], u = t->u[j];
        t->c[j] = t->c[j - 1]; t->u[j] = t->u[j - 1];
        t->c[j - 1] = c; t->u[j - 1] = u;
      }
    for (int i = 0; i + 1 < t->n && !changed; i++) {
      int64_t cb = t->c[i], ub = t->u[i], cs = t->c[i + 1], us = t->u[i + 1];
      if (cb == cs) t->u[i] = ub + us;
      else if (cb / cs == us + 1 && cb % cs == 0) {
        t->c[i] = cs;
        t->u[i] = (ub + 1) * (us + 1) - 1;
      } else continue;
      for (int j = i + 1; j + 1 < t->n; j++) { t->c[j] = t->c[j + 1]; t->u[j] = t->u[j + 1]; }
      t->n--;
      changed = 1;
    }
  }
}

typedef struct search {
  const terms *t;
  int64_t rest[MAXT + 1], g[MAXT + 1]; /* sum c u and gcd of terms i.. */
  int64_t work;
} search;

/* x with a x + b y = gcd(a, b) (a, b > 0). */
static __int128 ext_euclid(int64_t a, int64_t b) {
  __int128 x0 = 1, x1 = 0, r0 = a, r1 = b;
  while (r1) {
    __int128 q = r0 / r1, t;
    t = r0 - q * r1; r0 = r1; r1 = t;
    t = x0 - q * x1; x0 = x1; x1 = t;
  }
  return x0;
}

/* The least x >= lo with c x = r (mod m), m > 0; c x = r solvable mod m. */
static __int128 first_solution(int64_t c, int64_t r, int64_t m, __int128 lo) {
  int64_t h = gcd64(c, m), mm = m / h;
  if (mm == 1) return lo;
  __int128 inv = ext_euclid((c / h) % mm, mm) % mm;
  __int128 x0 = ((__int128)(r / h) % mm * inv) % mm;
  if (x0 < 0) x0 += mm;
  __int128 d = (x0 - lo) % mm;
  if (d < 0) d += mm;
  return lo + d;
}

static int64_t ceil_div(int64_t a, int64_t b) { /* b > 0 */
  return a <= 0 ? -((-a) / b) : (a + b - 1) / b;
}

/* The last two terms: c1 x + c2 y = r, 0 <= x <= u1, 0 <= y <= u2. */
static int two_terms(int64_t c1, int64_t u1, int64_t c2, int64_t u2, int64_t r) {
  int64_t g = gcd64(c1, c2);
  if (r % g) return 0;
  int64_t lo = ceil_div(r - (int64_t)((__int128)c2 * u2 > r ? r : c2 * u2), c1);
  if (lo < 0) lo = 0;
  __int128 x = first_solution(c1, r, c2, lo); /* y integral, y <= u2 from lo */
  if (x > u1) return 0;
  __int128 rem = (__int128)r - (__int128)c1 * x;
  return rem >= 0 && rem / c2 <= u2;
}

/* 1: sum_{t >= i} c_t x_t = r has a solution; 0: none; -1: gave up. */
static int dfs(search *s, int i, int64_t r) {
  const terms *t = s->t;
  if (r < 0 || r > s->rest[i]) return 0;
  if (i == t->n) return r == 0;
  if (r % s->g[i]) return 0;
  if (++s->work > STA_OVERLAP_WORK) return -1;
  int64_t c = t->c[i], u = t->u[i];
  if (i == t->n - 1) return r % c == 0 && r / c <= u;
  if (i == t->n - 2) return two_terms(c, u, t->c[i + 1], t->u[i + 1], r);
  int64_t lo = ceil_div(r - s->rest[i + 1], c), hi = r / c < u ? r / c : u;
  if (lo < 0) lo = 0;
  int64_t m = s->g[i + 1] / gcd64(c, s->g[i + 1]); /* x's step */
  int gave_up = 0;
  for (__int128 x = first_solution(c, r, s->g[i + 1], lo); x <= hi; x += m) {
    int k = dfs(s, i + 1, r - (int64_t)(c * x));
    if (k == 1) return 1;
    if (k < 0) gave_up = 1;
    if (s->work > STA_OVERLAP_WORK) return -1;
  }
  return gave_up ? -1 : 0;
}

/* Whether sum c_t x_t = r (0 <= x_t <= u_t) has a solution: 1, 0, or -1
** when the search gave up. */
static int solvable(terms *t, int64_t r) {
  search s;
  normalise(t);
  s.t = t;
  s.work = 0;
  s.rest[t->n] = 0;
  s.g[t->n] = 0;
  for (int i = t->n - 1; i >= 0; i--) {
    s.rest[i] = s.rest[i + 1] + t->c[i] * t->u[i];
    s.g[i] = gcd64(t->c[i], s.g[i + 1]);
  }
  return dfs(&s, 0, r);
}

/* ---- views ---------------------------------------------------------------- */

/* The address of element 0 of t, as an integer (host or device). */
static int64_t address(const sta_tensor *t) {
  return (int64_t)(uintptr_t)sta_tensor_data(t);
}

/* t's byte terms into v (strides made positive; base the lowest address);
** bytes: add the term of an element's bytes. */
static void view_terms(const sta_tensor *t, int bytes, int64_t *base, terms *v) {
  int64_t es = (int64_t)sta_dtype_size(t->dtype), b = address(t);
  v->n = 0;
  for (int32_t d = 0; d < t->ndim; d++) {
    int64_t s = t->stride[d] * es, u = t->shape[d] - 1;
    if (s < 0) { b += s * u; s = -s; }
    add_term(v, s, u);
  }
  if (bytes) add_term(v, 1, es - 1);
  *base = b;
}

int sta_overlap_decide(const sta_tensor *a, const sta_tensor *b) {
  if (a->storage->device != b->storage->device || sta_tensor_numel(a) == 0 ||
      sta_tensor_numel(b) == 0)
    return 0;
  int64_t alo, ahi, blo, bhi;
  terms ta, tb, all;
  view_terms(a, 1, &alo, &ta);
  view_terms(b, 1, &blo, &tb);
  ahi = alo;
  bhi = blo;
  for (int i = 0; i < ta.n; i++) ahi += ta.c[i] * ta.u[i];
  for (int i = 0; i < tb.n; i++) bhi += tb.c[i] * tb.u[i];
  if (ahi < blo || bhi < alo) return 0;
  /* alo + sum ca x = blo + sum cb y, y = ub - y': sum ca x + sum cb y' =
  ** blo - alo + sum cb ub */
  int64_t r = blo - alo;
  all = ta;
  for (int i = 0; i < tb.n; i++) {
    r += tb.c[i] * tb.u[i];
    add_term(&all, tb.c[i], tb.u[i]);
  }
  return solvable(&all, r);
}

int sta_self_overlap_decide(const sta_tensor *t) {
  int64_t base;
  terms v;
  if (sta_tensor_numel(t) <= 1) return 0;
  for (int32_t d = 0; d < t->ndim; d++)
    if (t->shape[d] > 1 && t->stride[d] == 0) return 1;
  view_terms(t, 0, &base, &v);
  /* ascending; nested strides (each beyond the span of the smaller ones)
  ** address distinct elements: the common case, decided at once */
  for (int i = 1; i < v.n; i++)
    for (int j = i; j > 0 && v.c[j] < v.c[j - 1]; j--) {
      int64_t c = v.c[j], u = v.u[j];
      v.c[j] = v.c[j - 1]; v.u[j] = v.u[j - 1];
      v.c[j - 1] = c; v.u[j - 1] = u;
    }
  int64_t span = 0;
  int nested = 1;
  for (int i = 0; i < v.n && nested; i++) {
    nested = v.c[i] > span;
    span += v.c[i] * v.u[i];
  }
  if (nested) return 0;
  /* two index vectors differ first at term k (d_k = 1 + y > 0 by symmetry,
  ** d_j = x_j - u_j after it): c_k y + sum_{j>k} c_j x_j = sum_{j>k} c_j u_j
  ** - c_k, y <= u_k - 1, x_j <= 2 u_j */
  int result = 0;
  for (int k = 0; k < v.n && result != 1; k++) {
    terms e;
    int64_t r = -v.c[k];
    e.n = 0;
    add_term(&e, v.c[k], v.u[k] - 1);
    for (int j = k + 1; j < v.n; j++) {
      r += v.c[j] * v.u[j];
      add_term(&e, v.c[j], 2 * v.u[j]);
    }
    int s = solvable(&e, r);
    if (s != 0) result = s;
  }
  return result;
}

int sta_tensor_overlaps(const sta_tensor *a, const sta_tensor *b) {
  return sta_overlap_decide(a, b) != 0;
}

int sta_tensor_self_overlaps(const sta_tensor *t) {
  return sta_self_overlap_decide(t) != 0;
}

int sta_tensor_same_view(const sta_tensor *a, const sta_tensor *b) {
  if (a->storage->device != b->storage->device || a->dtype != b->dtype ||
      a->ndim != b->ndim || sta_tensor_data(a) != sta_tensor_data(b))
    return 0;
  for (int32_t i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i]))
      return 0;
  return 1;
}

sta_status sta_check_writes(const char *what, int in_place, int nw, const sta_tensor *const *w,
                            const char *const *wn, int nr, const sta_tensor *const *r,
                            const char *const *rn) {
  for (int i = 0; i < nw; i++)
    if (w[i] && sta_tensor_self_overlaps(w[i]))
      return sta_error(STA_ERR_ARGUMENT,
                       "%s: more than one of its elements is one memory location (a stride-0 "
                       "or self-overlapping view), and the %s writes it: use a tensor whose "
                       "elements are distinct (a contiguous copy)", wn[i], what);
  for (int i = 0; i < nw; i++) {
    if (!w[i]) continue;
    for (int pass = 0; pass < 2; pass++) { /* the other written ones, then the read ones */
      int n = pass ? nr : i;
      const sta_tensor *const *o = pass ? r : w;
      const char *const *on = pass ? rn : wn;
      for (int j = 0; j < n; j++) {
        if (!o[j] || !sta_tensor_overlaps(w[i], o[j])) continue;
        if (in_place && sta_tensor_same_view(w[i], o[j])) continue;
        if (in_place)
          return sta_error(STA_ERR_ARGUMENT, "%s: %s overlaps %s without being the same view",
                           what, wn[i], on[j]);
        return sta_error(STA_ERR_ARGUMENT,
                         "%s: shares memory with %s (the %s writes %s while %s %s; use a "
                         "separate tensor)", wn[i], on[j], what, wn[i],
                         pass ? "reading" : "writing", on[j]);
      }
    }
  }
  return STA_OK;
}
