/*
** safetensors.c -- .safetensors files (Hugging Face): an 8-byte
** little-endian header length N, N bytes of JSON
**   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
**    "__metadata__": {"k": "v"}, ...}
** then the data, offsets relative to its start.
**
** Open validates the structure of every entry: a dtype string, shape of
** integers >= 0, 0 <= begin <= end <= data size, no two entries
** overlapping, and for a dtype of known size (every one safetensors
** defines) shape x size = end - begin.  Which dtypes sta reads (F32, F16,
** BF16, F8_E4M3) matters only to sta_safetensors_read of that tensor: a
** file whose other tensors are I64, or of a dtype newer than this reader,
** opens, and reading such a tensor fails naming it.  Any failure:
** STA_ERR_FORMAT "<path>: <problem>", naming the entry.  The file stays
** open (read with pread, so concurrent reads from threads are fine) until
** close.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "internal.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data on little-endian hosts only"
#endif

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* the reference reader's limit */
#define ST_MAX_SIZE ((int64_t)1 << 53)     /* JSON integers stay exact */

typedef struct st_entry {
  char *name;
  char dtype[12];
  int32_t esize;   /* bytes per element */
  int32_t ndim;    /* may exceed STA_MAX_DIMS; refused at read */
  int64_t shape[8];
  int64_t begin, end; /* relative to the data start */
} st_entry;

struct sta_safetensors {
  char *path;
  int fd;
  int64_t data_start;
  int32_t n;
  st_entry *e;
  char *meta; /* the __metadata__ object as JSON text, or NULL */
};

static const struct { const char *name; int32_t size; } ST_DTYPES[] = {
  {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8}, {"U64", 8},
  {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2}, {"I8", 1}, {"U8", 1},
  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};

static int32_t dtype_size_of(const char *name) {
  for (size_t i = 0; i < sizeof ST_DTYPES / sizeof ST_DTYPES[0]; i++)
    if (strcmp(name, ST_DTYPES[i].name) == 0) return ST_DTYPES[i].size;
  return 0;
}

static void free_entries(st_entry *e, int32_t n) {
  if (!e) return;
  for (int32_t i = 0; i < n; i++) free(e[i].name);
  free(e);
}

static void st_free(sta_safetensors *f) {
  if (f->fd >= 0) close(f->fd);
  free_entries(f->e, f->n);
  free(f->path);
  free(f->meta);
  free(f);
}

void sta_safetensors_close(sta_safetensors *f) {
  if (!sta_handle_live(f, STA_KIND_SAFETENSORS)) return;
  sta_handle_remove(f);
  st_free(f);
}

/* Read exactly n bytes at off; short read = truncated file. */
static sta_status pread_all(int fd, void *buf, size_t n, int64_t off,
                            const char *path, const char *what) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return sta_error(STA_ERR_IO, "%s: read error in the %s: %s", path, what,
                       strerror(errno));
    }
    if (r == 0) return sta_error(STA_ERR_FORMAT, "%s: truncated %s", path, what);
    p += r;
    n -= (size_t)r;
    off += r;
  }
  return STA_OK;
}

/* A JSON number that is an integer in 0..ST_MAX_SIZE. */
static int json_size(const cJSON *j, int64_t *v) {
  if (!cJSON_IsNumber(j)) return 0;
  double d = j->valuedouble;
  if (!(d >= 0) || d > (double)ST_MAX_SIZE || d != (double)(int64_t)d) return 0;
  *v = (int64_t)d;
  return 1;
}

/* Validate one entry of the header into e. */
static sta_status parse_entry(const cJSON *j, const char *path, int64_t data_size,
                              st_entry *e) {
  const char *nm = j->string;
  if (!cJSON_IsObject(j))
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s' is not a JSON object", path, nm);
  const cJSON *dt = NULL, *sh = NULL, *off = NULL, *c;
  cJSON_ArrayForEach(c, j) {
    if (strcmp(c->string, "dtype") == 0 && !dt) dt = c;
    else if (strcmp(c->string, "shape") == 0 && !sh) sh = c;
    else if (strcmp(c->string, "data_offsets") == 0 && !off) off = c;
    else
      return sta_error(STA_ERR_FORMAT, "%s: entry '%s': unexpected or repeated key '%s'",
                       path, nm, c->string);
  }
  if (!cJSON_IsString(dt))
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': 'dtype' must be a string", path, nm);
  size_t dl = strlen(dt->valuestring);
  if (dl < 1 || dl >= sizeof e->dtype)
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': dtype '%.20s' is not a dtype name", path,
                     nm, dt->valuestring);
  e->esize = dtype_size_of(dt->valuestring); /* 0: unknown here, checked when read */
  memcpy(e->dtype, dt->valuestring, dl + 1);
  if (!cJSON_IsArray(sh))
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': 'shape' must be an array", path, nm);
  int ndim = cJSON_GetArraySize(sh);
  if (ndim > 8)
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': %d dimensions (at most 8)", path, nm,
                     ndim);
  int64_t numel = 1;
  e->ndim = 0;
  cJSON_ArrayForEach(c, sh) {
    int64_t v;
    if (!json_size(c, &v))
      return sta_error(STA_ERR_FORMAT, "%s: entry '%s': shape[%d] must be an integer >= 0",
                       path, nm, (int)e->ndim);
    if (v > 0 && numel > ST_MAX_SIZE / v)
      return sta_error(STA_ERR_FORMAT, "%s: entry '%s': shape is too large", path, nm);
    numel *= v;
    e->shape[e->ndim++] = v;
  }
  if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
      !json_size(cJSON_GetArrayItem(off, 0), &e->begin) ||
      !json_size(cJSON_GetArrayItem(off, 1), &e->end))
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': 'data_offsets' must be "
                     "[begin, end], integers >= 0", path, nm);
  if (e->begin > e->end || e->end > data_size)
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': data_offsets [%lld, %lld] are "
                     "outside the %lld data bytes", path, nm, (long long)e->begin,
                     (long long)e->end, (long long)data_size);
  if (e->esize && (numel > ST_MAX_SIZE / e->esize || numel * e->esize != e->end - e->begin))
    return sta_error(STA_ERR_FORMAT, "%s: entry '%s': shape and dtype %s need %lld bytes, "
                     "data_offsets [%lld, %lld] hold %lld", path, nm, e->dtype,
                     numel > ST_MAX_SIZE / e->esize ? -1LL : (long long)(numel * e->esize),
                     (long long)e->begin, (long long)e->end,
                     (long long)(e->end - e->begin));
  return STA_OK;
}

static int by_begin(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  return x->end < y->end ? -1 : x->end > y->end;
}

/* Parse the JSON header text into f's entries. */
static sta_status parse_header(sta_safetensors *f, const char *text, size_t len,
                               int64_t data_size) {
  const char *path = f->path;
  char what[600];
  cJSON *root = NULL;
  snprintf(what, sizeof what, "%s: the JSON header", path);
  sta_status rc = sta_json_parse(text, len, what, 0, &root);
  if (rc != STA_OK) return rc;
  if (!cJSON_IsObject(root))
    rc = sta_error(STA_ERR_FORMAT, "%s: the header must be a JSON object", path);
  int32_t n = 0;
  const cJSON *c;
  if (rc == STA_OK) cJSON_ArrayForEach(c, root) {
    if (strcmp(c->string, "__metadata__") == 0) {
      const cJSON *m;
      if (!cJSON_IsObject(c)) {
        rc = sta_error(STA_ERR_FORMAT, "%s: __metadata__ must be an object of strings", path);
        break;
      }
      cJSON_ArrayForEach(m, c) if (!cJSON_IsString(m)) {
        rc = sta_error(STA_ERR_FORMAT, "%s: __metadata__ value '%s' is not a string",
                       path, m->string);
        break;
      }
      if (rc != STA_OK) break;
      char *mt = f->meta ? NULL : cJSON_PrintUnformatted(c); /* kept by a rewrite */
      if (!f->meta && (!mt || !(f->meta = sta_strdup(mt))))
        rc = sta_error(STA_ERR_NOMEM, "out of host memory (safetensors header)");
      cJSON_free(mt);
      if (rc != STA_OK) break;
    } else n++;
  }
  st_entry *e = NULL;
  const st_entry **order = NULL;
  if (rc == STA_OK) {
    e = sta_calloc((size_t)n, sizeof *e);
    order = sta_calloc((size_t)n, sizeof *order);
    if (!e || !order) rc = sta_error(STA_ERR_NOMEM, "out of host memory (safetensors header)");
  }
  int32_t k = 0;
  if (rc == STA_OK) cJSON_ArrayForEach(c, root) {
    if (strcmp(c->string, "__metadata__") == 0) continue;
    for (int32_t i = 0; i < k; i++)
      if (strcmp(e[i].name, c->string) == 0) {
        rc = sta_error(STA_ERR_FORMAT, "%s: entry '%s' appears twice", path, c->string);
        break;
      }
    if (rc == STA_OK) rc = parse_entry(c, path, data_size, &e[k]);
    if (rc == STA_OK && !(e[k].name = sta_strdup(c->string)))
      rc = sta_error(STA_ERR_NOMEM, "out of host memory (safetensors names)");
    if (rc != STA_OK) break;
    order[k] = &e[k];
    k++;
  }
  if (rc == STA_OK) {
    qsort(order, (size_t)n, sizeof *order, by_begin);
    for (int32_t i = 1; i < n; i++)
      if (order[i]->begin < order[i - 1]->end) {
        rc = sta_error(STA_ERR_FORMAT, "%s: entries '%s' [%lld, %lld] and '%s' [%lld, %lld] "
                       "overlap", path, order[i - 1]->name, (long long)order[i - 1]->begin,
                       (long long)order[i - 1]->end, order[i]->name,
                       (long long)order[i]->begin, (long long)order[i]->end);
        break;
      }
  }
  cJSON_Delete(root);
  free(order);
  if (rc != STA_OK) { free_entries(e, k); return rc; }
  f->e = e;
  f->n = n;
  return STA_OK;
}

sta_status sta_safetensors_open(sta_safetensors **out, const char *path) {
  struct stat st;
  unsigned char lenb[8];
  sta_status rc;
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  sta_safetensors *f = sta_calloc(1, sizeof *f);
  if (!f) return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors handle)");
  f->fd = -1;
  if (!(f->path = sta_strdup(path))) {
    st_free(f);
    return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors handle)");
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    rc = sta_error(STA_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    st_free(f);
    return rc;
  }
  if (fstat(f->fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    st_free(f);
    return sta_error(STA_ERR_IO, "%s: not a regular file", path);
  }
  int64_t fsize = (int64_t)st.st_size;
  if (fsize < 8) {
    st_free(f);
    return sta_error(STA_ERR_FORMAT, "%s: not a .safetensors file (%lld bytes, too short "
                     "for the header length)", path, (long long)fsize);
  }
  if ((rc = pread_all(f->fd, lenb, 8, 0, path, "header length")) != STA_OK) {
    st_free(f);
    return rc;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | lenb[i];
  if (hlen > (uint64_t)(fsize - 8) || hlen > ST_MAX_HEADER || hlen < 2) {
    if (hlen > (uint64_t)(fsize - 8) || hlen < 2)
      rc = sta_error(STA_ERR_FORMAT, "%s: header length %llu is impossible for a file of "
                     "%lld bytes", path, (unsigned long long)hlen, (long long)fsize);
    else
      rc = sta_error(STA_ERR_FORMAT, "%s: header length %llu is over the limit of %llu",
                     path, (unsigned long long)hlen, (unsigned long long)ST_MAX_HEADER);
    st_free(f);
    return rc;
  }
  char *text = sta_malloc((size_t)hlen);
  if (!text) {
    st_free(f);
    return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors header)");
  }
  rc = pread_all(f->fd, text, (size_t)hlen, 8, path, "header");
  if (rc == STA_OK && text[0] != '{')
    rc = sta_error(STA_ERR_FORMAT, "%s: the header does not start with '{'", path);
  f->data_start = 8 + (int64_t)hlen;
  if (rc == STA_OK) rc = parse_header(f, text, (size_t)hlen, fsize - f->data_start);
  free(text);
  if (rc == STA_OK) rc = sta_handle_add(f, STA_KIND_SAFETENSORS);
  if (rc != STA_OK) { st_free(f); return rc; }
  *out = f;
  return STA_OK;
}

int32_t sta_safetensors_count(const sta_safetensors *f) {
  return sta_handle_check(f, STA_KIND_SAFETENSORS, "f") == STA_OK ? f->n : 0;
}

const char *sta_safetensors_name(const sta_safetensors *f, int32_t i) {
  if (sta_handle_check(f, STA_KIND_SAFETENSORS, "f") != STA_OK) return NULL;
  return i >= 0 && i < f->n ? f->e[i].name : NULL;
}

sta_status sta_safetensors_read(const sta_safetensors *f, const char *name,
                                sta_tensor **out) {
  STA_CHECK_HANDLE(f, STA_KIND_SAFETENSORS, "f");
  if (!name) return sta_error(STA_ERR_ARGUMENT, "name: expected a string, got NULL");
  if (!out) return sta_error(STA_ERR_ARGUMENT, "out: expected a pointer, got NULL");
  const st_entry *e = NULL;
  for (int32_t i = 0; i < f->n && !e; i++)
    if (strcmp(f->e[i].name, name) == 0) e = &f->e[i];
  if (!e) return sta_error(STA_ERR_KEY, "%s: no tensor named '%s'", f->path, name);
  sta_dtype dt;
  if (strcmp(e->dtype, "F32") == 0) dt = STA_F32;
  else if (strcmp(e->dtype, "F16") == 0) dt = STA_F16;
  else if (strcmp(e->dtype, "BF16") == 0) dt = STA_BF16;
  else if (strcmp(e->dtype, "F8_E4M3") == 0) dt = STA_F8E4M3;
  else
    return sta_error(STA_ERR_DTYPE, "%s: tensor '%s' has unsupported dtype %s "
                     "(expected F32, F16, BF16 or F8_E4M3)", f->path, name, e->dtype);
  if (e->ndim < 1 || e->ndim > STA_MAX_DIMS)
    return sta_error(STA_ERR_SHAPE, "%s: tensor '%s' has %d dimensions (sta reads 1..%d)",
                     f->path, name, (int)e->ndim, STA_MAX_DIMS);
  sta_tensor *t = NULL;
  sta_status rc = sta_tensor_create(&t, dt, STA_CPU, e->ndim, e->shape);
  if (rc != STA_OK) return rc;
  char what[300];
  snprintf(what, sizeof what, "data of tensor '%s'", name);
  rc = pread_all(f->fd, sta_tensor_data(t), (size_t)(e->end - e->begin),
                 f->data_start + e->begin, f->path, what);
  if (rc != STA_OK) { sta_tensor_destroy(t); return rc; }
  *out = t;
  return STA_OK;
}

/* ---- save --------------------------------------------------------------- */

/* Append s (JSON-escaped, quoted) to the buffer at *pos; returns the
** length it needs when buf is NULL. */
static size_t json_quote(char *buf, size_t pos, const char *s) {
  size_t n = pos;
  if (buf) buf[n] = '"';
  n++;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    char esc[8];
    int k;
    if (*p == '"' || *p == '\\') k = snprintf(esc, sizeof esc, "\\%c", *p);
    else if (*p < 0x20) k = snprintf(esc, sizeof esc, "\\u%04x", *p);
    else { esc[0] = (char)*p; k = 1; }
    if (buf) memcpy(buf + n, esc, (size_t)k);
    n += (size_t)k;
  }
  if (buf) buf[n] = '"';
  return n + 1;
}

/* What a write puts in the file: the n named tensors (host copies h) after
** the entries kept from keep (kept[0..nk-1], indices into keep->e). */
typedef struct st_plan {
  int32_t n, nk;
  const char *const *names;
  sta_tensor **h;
  const sta_safetensors *keep;
  int32_t *kept;
} st_plan;

/* Build the header (both passes: buf NULL measures). */
static size_t build_header(char *buf, const st_plan *pl) {
  static const char *DT[4] = {"F32", "F16", "BF16", "F8_E4M3"};
  size_t pos = 0;
  int64_t off = 0;
  char tmp[256];
#define PUT(str) do { size_t l_ = strlen(str); if (buf) memcpy(buf + pos, str, l_); pos += l_; } while (0)
  PUT("{");
  if (pl->keep && pl->keep->meta) {
    PUT("\"__metadata__\":");
    PUT(pl->keep->meta);
  }
  for (int32_t i = 0; i < pl->nk + pl->n; i++) {
    const st_entry *e = i < pl->nk ? &pl->keep->e[pl->kept[i]] : NULL;
    const sta_tensor *t = e ? NULL : pl->h[i - pl->nk];
    int32_t nd = e ? e->ndim : sta_tensor_ndim(t);
    if (i || (pl->keep && pl->keep->meta)) PUT(",");
    pos = json_quote(buf, pos, e ? e->name : pl->names[i - pl->nk]);
    PUT(":{\"dtype\":");
    pos = json_quote(buf, pos, e ? e->dtype : DT[sta_tensor_dtype(t)]);
    PUT(",\"shape\":[");
    for (int32_t d = 0; d < nd; d++) {
      snprintf(tmp, sizeof tmp, "%s%lld", d ? "," : "",
               (long long)(e ? e->shape[d] : sta_tensor_size(t, d)));
      PUT(tmp);
    }
    int64_t nb = e ? e->end - e->begin
                   : sta_tensor_numel(t) * (int64_t)sta_dtype_size(sta_tensor_dtype(t));
    snprintf(tmp, sizeof tmp, "],\"data_offsets\":[%lld,%lld]}", (long long)off,
             (long long)(off + nb));
    PUT(tmp);
    off += nb;
  }
  PUT("}");
#undef PUT
  return pos;
}

static sta_status check_save_args(int32_t n, const char *const *names,
                                  const sta_tensor *const *tensors) {
  if (n < 0) return sta_error(STA_ERR_ARGUMENT, "n: expected >= 0, got %d", (int)n);
  if (n > 0 && !names) return sta_error(STA_ERR_ARGUMENT, "names: expected an array, got NULL");
  if (n > 0 && !tensors)
    return sta_error(STA_ERR_ARGUMENT, "tensors: expected an array, got NULL");
  for (int32_t i = 0; i < n; i++) {
    if (!names[i])
      return sta_error(STA_ERR_ARGUMENT, "names[%d]: expected a string, got NULL", (int)i);
    char arg[32];
    snprintf(arg, sizeof arg, "tensors[%d]", (int)i);
    STA_CHECK_HANDLE(tensors[i], STA_KIND_TENSOR, arg);
    if (sta_tensor_dtype(tensors[i]) == STA_I32)
      return sta_error(STA_ERR_DTYPE, "%s: sta writes safetensors of f32, f16, bf16 and "
                       "f8e4m3, not i32", arg);
    if (strcmp(names[i], "__metadata__") == 0)
      return sta_error(STA_ERR_ARGUMENT, "names[%d]: '__metadata__' is reserved", (int)i);
    for (int32_t j = 0; j < i; j++)
      if (strcmp(names[i], names[j]) == 0)
        return sta_error(STA_ERR_ARGUMENT, "names[%d]: '%s' repeats names[%d]", (int)i,
                         names[i], (int)j);
  }
  return STA_OK;
}

static void plan_free(st_plan *pl) {
  if (pl->h)
    for (int32_t i = 0; i < pl->n; i++) sta_tensor_destroy(pl->h[i]);
  free(pl->h);
  free(pl->kept);
}

/* Check the arguments, list what keep keeps, make contiguous host copies
** (so a device error writes nothing).  plan_free it either way. */
static sta_status plan_make(st_plan *pl, int32_t n, const char *const *names,
                            const sta_tensor *const *tensors, const sta_safetensors *keep) {
  memset(pl, 0, sizeof *pl);
  sta_status rc = check_save_args(n, names, tensors);
  if (rc != STA_OK) return rc;
  if (keep) STA_CHECK_HANDLE(keep, STA_KIND_SAFETENSORS, "keep");
  pl->names = names;
  pl->keep = keep;
  pl->h = sta_calloc((size_t)n, sizeof *pl->h);
  pl->kept = keep ? sta_calloc((size_t)keep->n + 1, sizeof *pl->kept) : NULL;
  if (!pl->h || (keep && !pl->kept)) return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors)");
  pl->n = n;
  for (int32_t i = 0; keep && i < keep->n; i++) {
    int named = 0;
    for (int32_t j = 0; j < n && !named; j++) named = strcmp(keep->e[i].name, names[j]) == 0;
    if (!named) pl->kept[pl->nk++] = i;
  }
  for (int32_t i = 0; i < n && rc == STA_OK; i++)
    rc = sta_tensor_to(&pl->h[i], tensors[i], sta_tensor_dtype(tensors[i]), STA_CPU);
  return rc;
}

/* Write the planned file into f. */
static sta_status plan_write(const st_plan *pl, sta_outfile *f) {
  size_t hl = build_header(NULL, pl), padded = (hl + 7) / 8 * 8;
  char *hdr = sta_malloc(8 + padded);
  if (!hdr) return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors header)");
  for (int i = 0; i < 8; i++) hdr[i] = (char)(((uint64_t)padded >> (8 * i)) & 0xff);
  build_header(hdr + 8, pl);
  memset(hdr + 8 + hl, ' ', padded - hl);
  sta_out_write(f, hdr, 8 + padded);
  free(hdr);
  sta_status rc = STA_OK;
  if (pl->nk) { /* the kept tensors' bytes, as they are */
    enum { CHUNK = 1 << 20 };
    char *buf = sta_malloc(CHUNK);
    if (!buf) return sta_error(STA_ERR_NOMEM, "out of host memory (safetensors copy)");
    for (int32_t i = 0; i < pl->nk && rc == STA_OK; i++) {
      const st_entry *e = &pl->keep->e[pl->kept[i]];
      for (int64_t at = e->begin; at < e->end && rc == STA_OK; at += CHUNK) {
        size_t len = (size_t)(e->end - at < CHUNK ? e->end - at : CHUNK);
        rc = pread_all(pl->keep->fd, buf, len, pl->keep->data_start + at, pl->keep->path,
                       "data of a tensor kept by the rewrite");
        if (rc == STA_OK) sta_out_write(f, buf, len);
      }
    }
    free(buf);
  }
  for (int32_t i = 0; i < pl->n && rc == STA_OK; i++)
    sta_out_write(f, sta_tensor_data(pl->h[i]),
                  sta_dtype_size(sta_tensor_dtype(pl->h[i])) * (size_t)sta_tensor_numel(pl->h[i]));
  return rc;
}

sta_status sta_safetensors_write(sta_outfile *f, int32_t n, const char *const *names,
                                 const sta_tensor *const *tensors, const sta_safetensors *keep) {
  st_plan pl;
  sta_status rc = plan_make(&pl, n, names, tensors, keep);
  if (rc == STA_OK) rc = plan_write(&pl, f);
  plan_free(&pl);
  return rc;
}

sta_status sta_safetensors_save(const char *path, int32_t n,
                                const char *const *names,
                                const sta_tensor *const *tensors) {
  if (!path) return sta_error(STA_ERR_ARGUMENT, "path: expected a file name, got NULL");
  st_plan pl;
  sta_outfile f;
  sta_status rc = plan_make(&pl, n, names, tensors, NULL);
  if (rc == STA_OK && (rc = sta_out_open(&f, path, path)) == STA_OK) {
    rc = plan_write(&pl, &f);
    if (rc == STA_OK) rc = sta_out_commit(&f);
    else sta_out_abort(&f);
  }
  plan_free(&pl);
  return rc;
}
