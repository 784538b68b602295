/*
** npy.c -- NumPy .npy files: read versions 1.0, 2.0 and 3.0, write 1.0.
**
** dtypes: '<f4' (f32) and '<f2' (f16) both ways.  bf16 has no NumPy dtype,
** so sta writes a bf16 tensor as '<u2' holding the raw bf16 bits (the
** upper 16 bits of the float32), and reads '<u2' back as bf16 only when the
** caller says so (as_bf16); without it '<u2' is refused.  In NumPy:
**   bits = np.load("x.npy")                       # uint16
**   x = (bits.astype(np.uint32) << 16).view(np.float32)
** fortran_order True is read and copied to C order.
**
** The reader takes untrusted files: every size comes from the header and is
** checked against the file size before anything is allocated; every error
** is STA_ERR_FORMAT "<path>: <problem>" (STA_ERR_IO when the file cannot be
** opened or read).
*/
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes '<' (little-endian) data on little-endian hosts only"
#endif

static const unsigned char NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
#define NPY_MAX_HEADER (1 << 20) /* NumPy itself refuses headers > 10000 */

/* ---- the header dict ---------------------------------------------------- */

/* A tiny reader for the Python literal NumPy writes:
**   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
** Keys in any order, single or double quotes, any whitespace. */
typedef struct hdr_parser {
  const char *p, *end;
} hdr_parser;

static void skip_ws(hdr_parser *h) {
  while (h->p < h->end && (*h->p == ' ' || *h->p == '\t' || *h->p == '\n' ||
                           *h->p == '\r'))
    h->p++;
}

static int accept(hdr_parser *h, char c) {
  skip_ws(h);
  if (h->p < h->end && *h->p == c) { h->p++; return 1; }
  return 0;
}

/* A quoted string into buf (truncated to cap-1 chars; 0 on a bad string). */
static int parse_str(hdr_parser *h, char *buf, size_t cap) {
  skip_ws(h);
  if (h->p >= h->end || (*h->p != '\'' && *h->p != '"')) return 0;
  char q = *h->p++;
  size_t n = 0;
  while (h->p < h->end && *h->p != q) {
    if (*h->p == '\\' || *h->p == '\n') return 0;
    if (n + 1 < cap) buf[n++] = *h->p;
    h->p++;
  }
  if (h->p >= h->end) return 0;
  h->p++;
  buf[n] = '\0';
  return 1;
}

static int parse_word(hdr_parser *h, const char *w) {
  size_t n = strlen(w);
  skip_ws(h);
  if ((size_t)(h->end - h->p) < n || memcmp(h->p, w, n) != 0) return 0;
  h->p += n;
  return 1;
}

typedef struct npy_header {
  char descr[32];
  int fortran;
  int ndim;
  int64_t shape[STA_MAX_DIMS];
  int have_descr, have_fortran, have_shape;
} npy_header;

/* Parse the dict; on failure writes a reason into why and returns 0. */
static int parse_header(const char *text, size_t len, npy_header *o,
                        char *why, size_t whycap) {
  hdr_parser h = {text, text + len};
  char key[32];
  memset(o, 0, sizeof *o);
  if (!accept(&h, '{')) { snprintf(why, whycap, "header is not a dict"); return 0; }
  for (;;) {
    if (accept(&h, '}')) break;
    if (!parse_str(&h, key, sizeof key)) {
      snprintf(why, whycap, "bad key in the header dict");
      return 0;
    }
    if (!accept(&h, ':')) {
      snprintf(why, whycap, "expected ':' after key '%s'", key);
      return 0;
    }
    if (strcmp(key, "descr") == 0) {
      if (o->have_descr++ || !parse_str(&h, o->descr, sizeof o->descr)) {
        snprintf(why, whycap, "'descr' must be one string");
        return 0;
      }
    } else if (strcmp(key, "fortran_order") == 0) {
      if (o->have_fortran++) { snprintf(why, whycap, "'fortran_order' given twice"); return 0; }
      if (parse_word(&h, "True")) o->fortran = 1;
      else if (parse_word(&h, "False")) o->fortran = 0;
      else { snprintf(why, whycap, "'fortran_order' must be True or False"); return 0; }
    } else if (strcmp(key, "shape") == 0) {
      if (o->have_shape++) { snprintf(why, whycap, "'shape' given twice"); return 0; }
      if (!accept(&h, '(')) { snprintf(why, whycap, "'shape' must be a tuple"); return 0; }
      for (;;) {
        if (accept(&h, ')')) break;
        skip_ws(&h);
        if (h.p < h.end && *h.p == '-') {
          snprintf(why, whycap, "negative size in 'shape'");
          return 0;
        }
        if (h.p >= h.end || *h.p < '0' || *h.p > '9') {
          snprintf(why, whycap, "'shape' must hold integers");
          return 0;
        }
        int64_t v = 0;
        while (h.p < h.end && *h.p >= '0' && *h.p <= '9') {
          if (v > (INT64_MAX - 9) / 10) {
            snprintf(why, whycap, "size in 'shape' overflows");
            return 0;
          }
          v = v * 10 + (*h.p++ - '0');
        }
        if (h.p < h.end && *h.p == 'L') h.p++; /* Python 2 long */
        if (o->ndim >= STA_MAX_DIMS) {
          snprintf(why, whycap, "'shape' has more than %d dimensions", STA_MAX_DIMS);
          return 0;
        }
        o->shape[o->ndim++] = v;
        if (accept(&h, ')')) break;
        if (!accept(&h, ',')) { snprintf(why, whycap, "bad 'shape' tuple"); return 0; }
      }
    } else {
      snprintf(why, whycap, "unknown key '%s' in the header dict", key);
      return 0;
    }
    if (accept(&h, '}')) break;
    if (!accept(&h, ',')) { snprintf(why, whycap, "expected ',' or '}' in the header dict"); return 0; }
  }
  skip_ws(&h);
  if (h.p != h.end) { snprintf(why, whycap, "junk after the header dict"); return 0; }
  if (!o->have_descr || !o->have_fortran || !o->have_shape) {
    snprintf(why, whycap, "header lacks '%s'",
             !o->have_descr ? "descr" : !o->have_fortran ? "fortran_order" : "shape");
    return 0;
  }
  return 1;
}

/* ---- load --------------------------------------------------------------- */

static sta_status read_exact(FILE *f, void *buf, size_t n, const char *path,
                             const char *what) {
  if (n == 0 || fread(buf, 1, n, f) == n) return STA_OK;
  if (ferror(f))
    return sta_error(STA_ERR_IO, "%s: read error in the %s: %s", path, what, strerror(errno));
  return sta_error(STA_ERR_FORMAT, "%s: truncated %s", path, what);
}

static sta_status load_open(FILE *f, const char *path, int64_t fsize,
                            int32_t as_bf16, sta_tensor **out) {
  unsigned char pre[12];
  char why[160];
  sta_status rc;
  if (fsize < 10)
    return sta_error(STA_ERR_FORMAT, "%s: not an .npy file (%lld bytes, too short for "
                     "the magic string and version)", path, (long long)fsize);
  if ((rc = read_exact(f, pre, 8, path, "preamble")) != STA_OK) return rc;
  if (memcmp(pre, NPY_MAGIC, 6) != 0)
    return sta_error(STA_ERR_FORMAT, "%s: not an .npy file (bad magic string)", path);
  int major = pre[6], minor = pre[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    return sta_error(STA_ERR_FORMAT, "%s: unsupported .npy version %d.%d "
                     "(expected 1.0, 2.0 or 3.0)", path, major, minor);
  size_t lenbytes = major == 1 ? 2 : 4, prefix = 8 + lenbytes;
  if (fsize < (int64_t)prefix)
    return sta_error(STA_ERR_FORMAT, "%s: truncated preamble (%lld bytes)", path,
                     (long long)fsize);
  if ((rc = read_exact(f, pre + 8, lenbytes, path, "preamble")) != STA_OK) return rc;
  uint64_t hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
  if (major != 1) hlen |= (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
  if (hlen > (uint64_t)(fsize - (int64_t)prefix))
    return sta_error(STA_ERR_FORMAT, "%s: truncated header (header length %llu, "
                     "%lld bytes left in the file)", path, (unsigned long long)hlen,
                     (long long)(fsize - (int64_t)prefix));
  if (hlen > NPY_MAX_HEADER)
    return sta_error(STA_ERR_FORMAT, "%s: header length %llu is absurd (limit %d)",
                     path, (unsigned long long)hlen, NPY_MAX_HEADER);
  char *text = sta_malloc((size_t)hlen + 1);
  if (!text) return sta_error(STA_ERR_NOMEM, "out of host memory (npy header)");
  rc = read_exact(f, text, (size_t)hlen, path, "header");
  if (rc != STA_OK) { free(text); return rc; }
  text[hlen] = '\0';
  npy_header h;
  int ok = memchr(text, '\0', (size_t)hlen) == NULL;
  if (!ok) snprintf(why, sizeof why, "NUL byte in the header");
  else ok = parse_header(text, (size_t)hlen, &h, why, sizeof why);
  free(text);
  if (!ok) return sta_error(STA_ERR_FORMAT, "%s: bad header: %s", path, why);

  sta_dtype dt;
  if (strcmp(h.descr, "<f4") == 0) dt = STA_F32;
  else if (strcmp(h.descr, "<f2") == 0) dt = STA_F16;
  else if (strcmp(h.descr, "<u2") == 0) {
    if (!as_bf16)
      return sta_error(STA_ERR_FORMAT, "%s: dtype '<u2' is only read as raw bf16 "
                       "bits, and as_bf16 was not set", path);
    dt = STA_BF16;
  } else if (h.descr[0] == '>' && (strcmp(h.descr + 1, "f4") == 0 ||
                                   strcmp(h.descr + 1, "f2") == 0 ||
                                   strcmp(h.descr + 1, "u2") == 0))
    return sta_error(STA_ERR_FORMAT, "%s: big-endian dtype '%s' is not supported "
                     "(save it as '<%s')", path, h.descr, h.descr + 1);
  else
    return sta_error(STA_ERR_FORMAT, "%s: unsupported dtype '%s' (expected '<f4', "
                     "'<f2' or '<u2' as bf16)", path, h.descr);
  if (h.ndim < 1)
    return sta_error(STA_ERR_FORMAT, "%s: 0-d arrays are not supported (shape ())", path);

  size_t es = sta_dtype_size(dt);
  int64_t avail = fsize - (int64_t)prefix - (int64_t)hlen, numel = 1;
  char shp[128];
  int n = 0;
  for (int i = 0; i < h.ndim; i++)
    n += snprintf(shp + n, sizeof shp - (size_t)n, "%s%lld", i ? ", " : "",
                  (long long)h.shape[i]);
  for (int i = 0; i < h.ndim; i++) {
    if (h.shape[i] > 0 && numel > INT64_MAX / (int64_t)es / h.shape[i])
      return sta_error(STA_ERR_FORMAT, "%s: shape (%s) is too large", path, shp);
    numel *= h.shape[i];
  }
  int64_t need = numel * (int64_t)es;
  if (need != avail)
    return sta_error(STA_ERR_FORMAT, "%s: shape (%s) of '%s' needs %lld data bytes, "
                     "the file holds %lld", path, shp, h.descr, (long long)need,
                     (long long)avail);

  /* Fortran order: read as the reversed C-order array, then transpose. */
  int64_t fshape[STA_MAX_DIMS];
  for (int i = 0; i < h.ndim; i++)
    fshape[i] = h.fortran ? h.shape[h.ndim - 1 - i] : h.shape[i];
  sta_tensor *t = NULL;
  if ((rc = sta_tensor_create(&t, dt, STA_CPU, h.ndim, fshape)) != STA_OK) return rc;
  if ((rc = read_exact(f, sta_tensor_data(t), (size_t)need, path, "data")) != STA_OK) {
    sta_tensor_destroy(t);
    return rc;
  }
  if (h.fortran && h.ndim > 1) {
    int32_t perm[STA_MAX_DIMS];
    sta_tensor *tv = NULL, *c = NULL;
    for (int i = 0; i < h.ndim; i++) perm[i] = h.ndim - 1 - i;
    rc = sta_tensor_permute(&tv, t, perm);
    if (rc == STA_OK) rc = sta_tensor_to(&c, tv, dt, STA_CPU);
    sta_tensor_destroy(tv);
    sta_tensor_destroy(t);
    if (rc != STA_OK) return rc;
    t = c;
  }
  *out = t;
  return STA_OK;
}

sta_status sta_npy_load(sta_tensor **out, const char *path, int32_t as_bf16) {
  struct stat st;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  FILE *f = fopen(path, "rb");
  if (!f) return sta_error(STA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    fclose(f);
    return sta_error(STA_ERR_IO, "%s: not a regular file", path);
  }
  sta_status rc = load_open(f, path, (int64_t)st.st_size, as_bf16, out);
  fclose(f);
  return rc;
}

/* ---- save --------------------------------------------------------------- */

/* The file's preamble + header (pre, its length *plen) and a host copy of
** t (*h): what sta_npy_write writes.  Checks t first: nothing is written
** for a tensor that cannot be. */
static sta_status npy_prepare(const sta_tensor *t, unsigned char pre[512], size_t *plen,
                              sta_tensor **h) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  sta_dtype dt = sta_tensor_dtype(t);
  if (dt == STA_F8E4M3)
    return sta_error(STA_ERR_DTYPE, "t: .npy has no f8e4m3 type (convert it with sta_tensor_to "
                     "to f32 first)");
  if (dt == STA_I32)
    return sta_error(STA_ERR_DTYPE, "t: sta writes .npy files of f32, f16 and bf16, not i32");
  const char *descr = dt == STA_F32 ? "<f4" : dt == STA_F16 ? "<f2" : "<u2";
  char shp[128], *hdr = (char *)pre + 10;
  int32_t nd = sta_tensor_ndim(t);
  int n = 0;
  for (int32_t i = 0; i < nd; i++)
    n += snprintf(shp + n, sizeof shp - (size_t)n, "%s%lld", i ? ", " : "",
                  (long long)sta_tensor_size(t, i));
  if (nd == 1) snprintf(shp + n, sizeof shp - (size_t)n, ",");
  /* As NumPy >= 1.23 writes it: the dict, 21 - digits(shape[0]) spaces
  ** (room to grow the first axis in place), spaces and '\n' so that the
  ** 10-byte preamble + header is a multiple of 64. */
  int dl = snprintf(hdr, 256, "{'descr': '%s', 'fortran_order': False, "
                    "'shape': (%s), }", descr, shp);
  int digits = snprintf(NULL, 0, "%lld", (long long)sta_tensor_size(t, 0));
  size_t grown = (size_t)dl + (size_t)(digits < 21 ? 21 - digits : 0);
  size_t total = ((size_t)10 + grown + 1 + 63) / 64 * 64, hlen = total - 10;
  memset(hdr + dl, ' ', hlen - 1 - (size_t)dl);
  hdr[hlen - 1] = '\n';
  static const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  memcpy(pre, magic, 8);
  pre[8] = (unsigned char)(hlen & 0xff);
  pre[9] = (unsigned char)(hlen >> 8);
  *plen = total;
  return sta_tensor_to(h, t, dt, STA_CPU);
}

static void npy_put(sta_outfile *f, const unsigned char *pre, size_t plen, const sta_tensor *h) {
  sta_out_write(f, pre, plen);
  sta_out_write(f, sta_tensor_data(h),
                sta_dtype_size(sta_tensor_dtype(h)) * (size_t)sta_tensor_numel(h));
}

sta_status sta_npy_write(sta_outfile *f, const sta_tensor *t) {
  unsigned char pre[512];
  size_t plen;
  sta_tensor *h = NULL;
  sta_status rc = npy_prepare(t, pre, &plen, &h);
  if (rc == STA_OK) npy_put(f, pre, plen, h);
  sta_tensor_destroy(h);
  return rc;
}

sta_status sta_npy_save(const sta_tensor *t, const char *path) {
  STA_CHECK_HANDLE(t, STA_KIND_TENSOR, "t");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  unsigned char pre[512];
  size_t plen;
  sta_tensor *h = NULL;
  sta_outfile f;
  sta_status rc = npy_prepare(t, pre, &plen, &h);
  if (rc == STA_OK && (rc = sta_out_open(&f, path, path)) == STA_OK) {
    npy_put(&f, pre, plen, h);
    rc = sta_out_commit(&f);
  }
  sta_tensor_destroy(h);
  return rc;
}
