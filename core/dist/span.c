/*
** span.c -- strided blocks of bytes per rank (sta.h, sta_span): their
** sizes, the dense form a transport's all_to_all takes, and copies
** between two of one shape on the host or on a device's stream.
*/
#include "dist.h"

int64_t sta_span_bytes(const sta_span *s) { return s->run * s->n[0] * s->n[1] * s->n[2]; }

void *sta_span_dense(const sta_span *s, int32_t size) {
  int64_t b = s->run;
  for (int i = 0; i < 3; i++) {
    if (s->n[i] > 1 && s->pitch[i] != b) return NULL;
    b *= s->n[i];
  }
  return size == 1 || s->peer == b ? s->base : NULL;
}

sta_span sta_span_packed(const sta_span *s, void *base) {
  sta_span d = *s;
  d.base = base;
  d.pitch[0] = s->run;
  d.pitch[1] = s->run * s->n[0];
  d.pitch[2] = d.pitch[1] * s->n[1];
  d.peer = sta_span_bytes(s);
  return d;
}

/* Fold the levels two spans of one shape both keep contiguous into the
** run (and drop levels of one), so a copy takes few, long runs. */
static void span_fold(sta_span *a, sta_span *b) {
  int64_t n[3], pa[3], pb[3];
  int k = 0;
  for (int i = 0; i < 3; i++) {
    if (a->n[i] == 1) continue;
    int64_t ea = k ? n[k - 1] * pa[k - 1] : a->run, eb = k ? n[k - 1] * pb[k - 1] : b->run;
    if (a->pitch[i] == ea && b->pitch[i] == eb) {
      if (k) n[k - 1] *= a->n[i];
      else { a->run *= a->n[i]; b->run *= a->n[i]; }
      continue;
    }
    n[k] = a->n[i]; pa[k] = a->pitch[i]; pb[k] = b->pitch[i];
    k++;
  }
  for (; k < 3; k++) { n[k] = 1; pa[k] = pb[k] = 0; }
  for (int i = 0; i < 3; i++) {
    a->n[i] = b->n[i] = n[i];
    a->pitch[i] = pa[i];
    b->pitch[i] = pb[i];
  }
}

/* One run and n[] of each, folded here (span_fold). */
sta_status sta_span_copy(const sta_span *dst_, int64_t dj, const sta_span *src_, int64_t sj,
                         sta_device dev) {
  sta_span dst = *dst_, src = *src_;
  span_fold(&dst, &src);
  const char *s0 = (const char *)src.base + sj * src.peer;
  char *d0 = (char *)dst.base + dj * dst.peer;
  int64_t run = src.run, n0 = src.n[0];
  const sta_backend_ops *b = dev == STA_CPU ? NULL : sta_backend_get(dev);
  if (dev != STA_CPU && (!b || !b->copy_2d))
    return sta_backend_missing(dev);
  for (int64_t i2 = 0; i2 < src.n[2]; i2++)
    for (int64_t i1 = 0; i1 < src.n[1]; i1++) {
      const char *s = s0 + i2 * src.pitch[2] + i1 * src.pitch[1];
      char *d = d0 + i2 * dst.pitch[2] + i1 * dst.pitch[1];
      if (dev == STA_CPU) {
        for (int64_t i0 = 0; i0 < n0; i0++)
          memcpy(d + i0 * dst.pitch[0], s + i0 * src.pitch[0], (size_t)run);
        continue;
      }
      sta_status rc = STA_OK;
      if (n0 == 1 || (src.pitch[0] >= run && dst.pitch[0] >= run))
        rc = b->copy_2d(d, (size_t)(n0 == 1 ? run : dst.pitch[0]), s,
                        (size_t)(n0 == 1 ? run : src.pitch[0]), (size_t)run, (size_t)n0);
      else /* overlapping or negative pitches: run by run */
        for (int64_t i0 = 0; i0 < n0 && rc == STA_OK; i0++)
          rc = b->copy_2d(d + i0 * dst.pitch[0], (size_t)run, s + i0 * src.pitch[0],
                          (size_t)run, (size_t)run, 1);
      if (rc != STA_OK) return rc;
    }
  return STA_OK;
}

