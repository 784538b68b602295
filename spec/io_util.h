/* io_util.h -- what the file tests share (test_npy.c, test_safetensors.c,
** test_files.c): a temporary folder, raw file bytes, random tensors, error
** checks, and random mutations of valid files.  Header-only. */
#ifndef STA_IO_UTIL_H
#define STA_IO_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "internal.h"
#include "test_util.h"

static char tmpdir[256];
static uint64_t seed_counter = 1000;


static inline const char *tpath(const char *name) { return sta_test_path(tmpdir, name); }

static inline void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static inline unsigned char *read_bytes(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *p = malloc((size_t)len + 1);
  assert_non_null(p);
  assert_int_equal(fread(p, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  p[len] = '\0'; /* for strstr on headers */
  *n = (size_t)len;
  return p;
}

static inline sta_tensor *rand_tensor(sta_dtype dt, int32_t nd, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, nd, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_counter++, 0.5, 2.0), STA_OK);
  return t;
}

/* Same shape, dtype and bit-identical elements. */
static inline void assert_same(const sta_tensor *a, const sta_tensor *b) {
  assert_int_equal(sta_tensor_dtype(a), sta_tensor_dtype(b));
  assert_int_equal(sta_tensor_ndim(a), sta_tensor_ndim(b));
  for (int32_t i = 0; i < sta_tensor_ndim(a); i++)
    assert_int_equal(sta_tensor_size(a, i), sta_tensor_size(b, i));
  double m = -1, r = -1;
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  assert_true(m == 0.0);
}

/* rc is status and the message contains every given piece. */
static inline void expect_err(sta_status rc, sta_status want, const char *p1, const char *p2) {
  if (rc != want)
    fail_msg("status %s, wanted %s (%s)", sta_status_name(rc), sta_status_name(want),
             sta_last_error());
  if (p1 && !strstr(sta_last_error(), p1))
    fail_msg("message '%s' lacks '%s'", sta_last_error(), p1);
  if (p2 && !strstr(sta_last_error(), p2))
    fail_msg("message '%s' lacks '%s'", sta_last_error(), p2);
}

/* An .npy file as NumPy's format.py writes it: magic, version, length,
** dict + spaces + '\n' so that the preamble + header is a multiple of 64.
** Returns bytes written into buf (header only). */
static inline size_t npy_header(unsigned char *buf, int major, const char *dict) {
  size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
  size_t total = (pre + dl + 1 + 63) / 64 * 64, hl = total - pre;
  memcpy(buf, "\x93NUMPY", 6);
  buf[6] = (unsigned char)major;
  buf[7] = 0;
  for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(hl >> (8 * i));
  memcpy(buf + pre, dict, dl);
  memset(buf + pre + dl, ' ', hl - dl - 1);
  buf[total - 1] = '\n';
  return total;
}

/* Write an .npy with dict and nbytes of data (a ramp of floats). */
static inline void write_npy(const char *path, int major, const char *dict, size_t nbytes) {
  unsigned char *buf = malloc(4096 + nbytes);
  assert_non_null(buf);
  size_t h = npy_header(buf, major, dict);
  for (size_t i = 0; i < nbytes; i++) buf[h + i] = (unsigned char)(i * 7 + 1);
  write_bytes(path, buf, h + nbytes);
  free(buf);
}

static inline int group_setup(void **state) {
  (void)state;
  /* tmpfs first: the mutation test writes thousands of files */
  return sta_test_mkdtemp(tmpdir, sizeof tmpdir, IO_TEST_NAME);
}

static inline int group_teardown(void **state) {
  (void)state;
  return sta_test_rmdir(tmpdir);
}

/* ---- random mutations of valid files ------------------------------------ */

static inline uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Mutate the first `span` bytes of a valid file many times: every load
** either succeeds with a sane tensor or fails with a message naming the
** file; never a crash (the sanitizer build checks the memory). */
static inline void mutate_file(const char *valid, const char *path, int st, int rounds) {
  size_t n;
  unsigned char *f = read_bytes(valid, &n);
  unsigned char *g = calloc(n + 16, 1); /* a lengthened file ends in zeros, not garbage (valgrind) */
  static const char alphabet[] = "{}()[],:'\" 0123456789-.eE<>fuTrueFalse\"dtypeshape\x93\\";
  uint64_t s = 0x9e3779b97f4a7c15ull ^ (uint64_t)rounds;
  int ok = 0, bad = 0;
  for (int r = 0; r < rounds; r++) {
    memcpy(g, f, n);
    size_t len = n, span = n < 200 ? n : 200;
    int edits = 1 + (int)(xorshift(&s) % 4);
    for (int e = 0; e < edits; e++) {
      size_t at = (size_t)(xorshift(&s) % span);
      switch (xorshift(&s) % 4) {
      case 0: g[at] = (unsigned char)xorshift(&s); break;
      case 1: g[at] = (unsigned char)alphabet[xorshift(&s) % (sizeof alphabet - 1)]; break;
      case 2: g[at] ^= (unsigned char)(1u << (xorshift(&s) % 8)); break;
      default: len = at + (size_t)(xorshift(&s) % (n - at + 8)); if (len > n + 8) len = n + 8;
      }
    }
    write_bytes(path, g, len);
    if (st) {
      sta_safetensors *h = NULL;
      sta_status rc = sta_safetensors_open(&h, path);
      if (rc == STA_OK) {
        for (int32_t i = 0; i < sta_safetensors_count(h); i++) {
          sta_tensor *t = NULL;
          if (sta_safetensors_read(h, sta_safetensors_name(h, i), &t) == STA_OK) {
            assert_true(sta_tensor_numel(t) >= 0);
            sta_tensor_destroy(t);
          } else assert_non_null(strstr(sta_last_error(), path));
        }
        sta_safetensors_close(h);
        ok++;
      } else {
        assert_true(rc == STA_ERR_FORMAT);
        assert_non_null(strstr(sta_last_error(), path));
        bad++;
      }
    } else {
      sta_tensor *t = NULL;
      sta_status rc = sta_npy_load(&t, path, (int32_t)(r & 1));
      if (rc == STA_OK) {
        assert_true((size_t)sta_tensor_numel(t) * sta_dtype_size(sta_tensor_dtype(t)) < len);
        sta_tensor_destroy(t);
        ok++;
      } else {
        assert_true(rc == STA_ERR_FORMAT);
        assert_non_null(strstr(sta_last_error(), path));
        bad++;
      }
    }
  }
  printf("  %s: %d of %d mutants loaded, %d refused\n", valid, ok, rounds, bad);
  assert_true(bad > rounds / 4); /* the mutants are mostly broken */
  free(g);
  free(f);
}

#endif
