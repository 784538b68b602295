/* test_io.c -- .npy and .safetensors: round trips, files written by hand
** byte for byte as NumPy / safetensors write them, and every malformed case
** (truncation at every byte, lies, huge sizes, bad JSON) failing cleanly. */
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

/* NumPy 1.26 np.save(np.arange(6, dtype='<f4').reshape(2, 3)) header, byte
** for byte: the dict, 20 growth-axis spaces, padding to 128 with '\n'. */
static const char NUMPY_F4_2x3[] = "\x93NUMPY\x01\x00\x76\x00"
  "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
  "                                                          \n";
static uint64_t seed_counter = 1000;

/* ---- helpers ---------------------------------------------------------- */

static const char *tpath(const char *name) { return sta_test_path(tmpdir, name); }

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(p, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

static unsigned char *read_bytes(const char *path, size_t *n) {
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

static sta_tensor *rand_tensor(sta_dtype dt, int32_t nd, const int64_t *shape) {
  sta_tensor *t = NULL;
  assert_int_equal(sta_tensor_create(&t, dt, STA_CPU, nd, shape), STA_OK);
  assert_int_equal(sta_tensor_randn(t, seed_counter++, 0.5, 2.0), STA_OK);
  return t;
}

/* Same shape, dtype and bit-identical elements. */
static void assert_same(const sta_tensor *a, const sta_tensor *b) {
  assert_int_equal(sta_tensor_dtype(a), sta_tensor_dtype(b));
  assert_int_equal(sta_tensor_ndim(a), sta_tensor_ndim(b));
  for (int32_t i = 0; i < sta_tensor_ndim(a); i++)
    assert_int_equal(sta_tensor_size(a, i), sta_tensor_size(b, i));
  double m = -1, r = -1;
  assert_int_equal(sta_tensor_compare(a, b, &m, &r), STA_OK);
  assert_true(m == 0.0);
}

/* rc is status and the message contains every given piece. */
static void expect_err(sta_status rc, sta_status want, const char *p1, const char *p2) {
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
static size_t npy_header(unsigned char *buf, int major, const char *dict) {
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
static void write_npy(const char *path, int major, const char *dict, size_t nbytes) {
  unsigned char *buf = malloc(4096 + nbytes);
  assert_non_null(buf);
  size_t h = npy_header(buf, major, dict);
  for (size_t i = 0; i < nbytes; i++) buf[h + i] = (unsigned char)(i * 7 + 1);
  write_bytes(path, buf, h + nbytes);
  free(buf);
}

static int group_setup(void **state) {
  (void)state;
  /* tmpfs first: the mutation test writes thousands of files */
  return sta_test_mkdtemp(tmpdir, sizeof tmpdir, "test-io");
}

static int group_teardown(void **state) {
  (void)state;
  return sta_test_rmdir(tmpdir);
}

/* ---- npy: round trips ----------------------------------------------- */

static void test_npy_roundtrip(void **state) {
  (void)state;
  static const int64_t shapes[][4] = {
    {7, 0, 0, 0}, {3, 5, 0, 0}, {2, 3, 4, 0}, {2, 3, 5, 7}, {1, 1, 1, 1},
    {0, 0, 0, 0}, {4, 0, 3, 0}, {1, 33, 2, 16}};
  static const int32_t ndims[] = {1, 2, 3, 4, 4, 1, 3, 4};
  for (int d = 0; d < 3; d++)
    for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
      sta_tensor *a = rand_tensor((sta_dtype)d, ndims[s], shapes[s]), *b = NULL;
      assert_int_equal(sta_npy_save(a, tpath("rt.npy")), STA_OK);
      assert_int_equal(sta_npy_load(&b, tpath("rt.npy"), 1), STA_OK);
      assert_same(a, b);
      assert_int_equal(sta_tensor_is_contiguous(b), 1);
      /* the file is exactly preamble + header (multiple of 64) + data */
      size_t n;
      unsigned char *f = read_bytes(tpath("rt.npy"), &n);
      size_t hl = (size_t)f[8] | (size_t)f[9] << 8;
      assert_int_equal((10 + hl) % 64, 0);
      assert_int_equal(f[10 + hl - 1], '\n');
      assert_int_equal(n, 10 + hl + (size_t)sta_tensor_numel(a) * sta_dtype_size(d));
      assert_memory_equal(f + 10 + hl, sta_tensor_data(a), n - 10 - hl);
      free(f);
      sta_tensor_destroy(a);
      sta_tensor_destroy(b);
    }
}

static void test_npy_save_strided(void **state) {
  (void)state;
  /* a permuted, narrowed view is written in its logical (C) order */
  int64_t shape[4] = {2, 6, 3, 4};
  int32_t perm[4] = {0, 2, 1, 3};
  for (int d = 0; d < 3; d++) {
    sta_tensor *a = rand_tensor((sta_dtype)d, 4, shape), *p = NULL, *nv = NULL, *b = NULL;
    assert_int_equal(sta_tensor_permute(&p, a, perm), STA_OK);
    assert_int_equal(sta_tensor_narrow(&nv, p, 2, 1, 4), STA_OK);
    assert_int_equal(sta_tensor_is_contiguous(nv), 0);
    assert_int_equal(sta_npy_save(nv, tpath("strided.npy")), STA_OK);
    assert_int_equal(sta_npy_load(&b, tpath("strided.npy"), 1), STA_OK);
    assert_int_equal(sta_tensor_size(b, 1), 3);
    assert_int_equal(sta_tensor_size(b, 2), 4);
    assert_same(nv, b);
    int64_t i1[4] = {1, 2, 3, 1}, i2[4] = {1, 4, 2, 1}; /* nv[a,b,c,d] = a[a,c+1,b,d] */
    double x, y;
    assert_int_equal(sta_tensor_get(b, i1, &x), STA_OK);
    assert_int_equal(sta_tensor_get(a, i2, &y), STA_OK);
    assert_true(x == y);
    sta_tensor_destroy(a);
    sta_tensor_destroy(p);
    sta_tensor_destroy(nv);
    sta_tensor_destroy(b);
  }
}

static void test_npy_save_header_exact(void **state) {
  (void)state;
  int64_t shape2[2] = {2, 3}, shape1[1] = {5};
  sta_tensor *a = rand_tensor(STA_F32, 2, shape2), *b = rand_tensor(STA_F16, 1, shape1);
  size_t n;
  assert_int_equal(sta_npy_save(a, tpath("h.npy")), STA_OK);
  unsigned char *f = read_bytes(tpath("h.npy"), &n);
  assert_int_equal(n, 128 + 24);
  assert_memory_equal(f, NUMPY_F4_2x3, 128); /* identical to NumPy's */
  free(f);
  assert_int_equal(sta_npy_save(b, tpath("h1.npy")), STA_OK);
  f = read_bytes(tpath("h1.npy"), &n);
  assert_int_equal(n, 128 + 10);
  assert_memory_equal(f + 10, "{'descr': '<f2', 'fortran_order': False, 'shape': (5,), }", 57);
  free(f);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
}

static void test_npy_bf16_convention(void **state) {
  (void)state;
  int64_t shape[2] = {3, 4};
  sta_tensor *a = rand_tensor(STA_BF16, 2, shape), *b = NULL, *f32 = NULL;
  assert_int_equal(sta_npy_save(a, tpath("bf.npy")), STA_OK);
  size_t n;
  unsigned char *f = read_bytes(tpath("bf.npy"), &n);
  assert_non_null(strstr((char *)f + 10, "'descr': '<u2'"));
  /* the data are the raw bf16 bits: the upper half of the float32 */
  assert_int_equal(sta_tensor_to(&f32, a, STA_F32, STA_CPU), STA_OK);
  const float *x = sta_tensor_data(f32);
  for (int i = 0; i < 12; i++) {
    uint16_t bits;
    uint32_t u;
    memcpy(&bits, f + 128 + 2 * i, 2);
    memcpy(&u, &x[i], 4);
    assert_int_equal(bits, u >> 16);
  }
  free(f);
  /* read back only when asked to take '<u2' as bf16 */
  b = (sta_tensor *)0x1;
  expect_err(sta_npy_load(&b, tpath("bf.npy"), 0), STA_ERR_FORMAT, tpath("bf.npy"),
             "dtype '<u2' is only read as raw bf16 bits, and as_bf16 was not set");
  assert_ptr_equal(b, (sta_tensor *)0x1);
  b = NULL;
  assert_int_equal(sta_npy_load(&b, tpath("bf.npy"), 1), STA_OK);
  assert_int_equal(sta_tensor_dtype(b), STA_BF16);
  assert_same(a, b);
  sta_tensor_destroy(b);
  /* as_bf16 does not change how '<f4' is read */
  assert_int_equal(sta_npy_save(f32, tpath("f4.npy")), STA_OK);
  b = NULL;
  assert_int_equal(sta_npy_load(&b, tpath("f4.npy"), 1), STA_OK);
  assert_int_equal(sta_tensor_dtype(b), STA_F32);
  assert_same(f32, b);
  sta_tensor_destroy(b);
  sta_tensor_destroy(f32);
  sta_tensor_destroy(a);
}

/* ---- npy: files written by hand -------------------------------------- */

/* Files as NumPy writes them. */
static void test_npy_numpy_files(void **state) {
  (void)state;
  unsigned char buf[256];
  assert_int_equal(sizeof NUMPY_F4_2x3 - 1, 128);
  memcpy(buf, NUMPY_F4_2x3, 128);
  float v[6] = {0, 1, 2, 3, 4, 5};
  memcpy(buf + 128, v, sizeof v);
  write_bytes(tpath("np1.npy"), buf, 128 + sizeof v);
  sta_tensor *t = NULL;
  assert_int_equal(sta_npy_load(&t, tpath("np1.npy"), 0), STA_OK);
  assert_int_equal(sta_tensor_ndim(t), 2);
  assert_int_equal(sta_tensor_size(t, 0), 2);
  assert_int_equal(sta_tensor_size(t, 1), 3);
  assert_memory_equal(sta_tensor_data(t), v, sizeof v);
  sta_tensor_destroy(t);

  /* the same array, fortran_order True: data column-major 0 3 1 4 2 5 */
  static const char fhdr[] = "\x93NUMPY\x01\x00\x76\x00"
    "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }"
    "                                                           \n";
  assert_int_equal(sizeof fhdr - 1, 128);
  memcpy(buf, fhdr, 128);
  float fv[6] = {0, 3, 1, 4, 2, 5};
  memcpy(buf + 128, fv, sizeof fv);
  write_bytes(tpath("npf.npy"), buf, 128 + sizeof fv);
  t = NULL;
  assert_int_equal(sta_npy_load(&t, tpath("npf.npy"), 0), STA_OK);
  assert_int_equal(sta_tensor_is_contiguous(t), 1);
  assert_int_equal(sta_tensor_size(t, 0), 2);
  assert_memory_equal(sta_tensor_data(t), v, sizeof v);
  sta_tensor_destroy(t);

  /* versions 2.0 and 3.0: a 4-byte header length */
  for (int major = 2; major <= 3; major++) {
    size_t h = npy_header(buf, major,
                          "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }");
    assert_int_equal(h % 64, 0);
    uint16_t hv[3] = {0x3c00, 0xc000, 0x0001}; /* 1, -2, smallest subnormal */
    memcpy(buf + h, hv, sizeof hv);
    write_bytes(tpath("np2.npy"), buf, h + sizeof hv);
    t = NULL;
    assert_int_equal(sta_npy_load(&t, tpath("np2.npy"), 0), STA_OK);
    assert_int_equal(sta_tensor_dtype(t), STA_F16);
    assert_int_equal(sta_tensor_size(t, 0), 3);
    int64_t i = 1;
    double x;
    assert_int_equal(sta_tensor_get(t, &i, &x), STA_OK);
    assert_true(x == -2.0);
    i = 2;
    assert_int_equal(sta_tensor_get(t, &i, &x), STA_OK);
    assert_true(x == 0x1p-24);
    sta_tensor_destroy(t);
  }
}

static void test_npy_fortran_4d(void **state) {
  (void)state;
  /* a random 4-D C array written as its transpose in Fortran order */
  int64_t shape[4] = {2, 3, 4, 5};
  int32_t rev[4] = {3, 2, 1, 0};
  sta_tensor *a = rand_tensor(STA_F32, 4, shape), *tr = NULL, *c = NULL, *b = NULL;
  assert_int_equal(sta_tensor_permute(&tr, a, rev), STA_OK); /* 5x4x3x2 view */
  assert_int_equal(sta_tensor_to(&c, tr, STA_F32, STA_CPU), STA_OK);
  /* Fortran order of shape (2,3,4,5) = C order of the reversed array */
  unsigned char *buf = malloc(4096);
  size_t h = npy_header(buf, 1, "{\"descr\": \"<f4\", \"shape\": (2, 3, 4, 5), "
                        "\"fortran_order\": True}");
  memcpy(buf + h, sta_tensor_data(c), 120 * 4);
  write_bytes(tpath("f4d.npy"), buf, h + 480);
  assert_int_equal(sta_npy_load(&b, tpath("f4d.npy"), 0), STA_OK);
  assert_same(a, b);
  free(buf);
  sta_tensor_destroy(a);
  sta_tensor_destroy(tr);
  sta_tensor_destroy(c);
  sta_tensor_destroy(b);
}

/* ---- npy: malformed files -------------------------------------------- */

static void test_npy_truncated_everywhere(void **state) {
  (void)state;
  int64_t shape[2] = {3, 2};
  sta_tensor *a = rand_tensor(STA_F16, 2, shape);
  assert_int_equal(sta_npy_save(a, tpath("full.npy")), STA_OK);
  size_t n;
  unsigned char *f = read_bytes(tpath("full.npy"), &n);
  for (size_t len = 0; len < n; len++) {
    write_bytes(tpath("cut.npy"), f, len);
    sta_tensor *t = (sta_tensor *)0x1;
    expect_err(sta_npy_load(&t, tpath("cut.npy"), 1), STA_ERR_FORMAT, tpath("cut.npy"), NULL);
    assert_ptr_equal(t, (sta_tensor *)0x1);
  }
  /* one byte more than the shape needs is a lie too */
  unsigned char *g = malloc(n + 1);
  memcpy(g, f, n);
  g[n] = 0;
  write_bytes(tpath("long.npy"), g, n + 1);
  sta_tensor *t = NULL;
  expect_err(sta_npy_load(&t, tpath("long.npy"), 1), STA_ERR_FORMAT, tpath("long.npy"),
             "shape (3, 2) of '<f2' needs 12 data bytes, the file holds 13");
  free(g);
  free(f);
  sta_tensor_destroy(a);
}

static void test_npy_malformed(void **state) {
  (void)state;
  static const struct { const char *dict; size_t data; const char *msg; } cases[] = {
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 20,
     "shape (2, 3) of '<f4' needs 24 data bytes, the file holds 20"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 28,
     "needs 24 data bytes, the file holds 28"},
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", 24,
     "unsupported dtype '<f8'"},
    {"{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }", 12,
     "unsupported dtype '<i4'"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }", 3,
     "unsupported dtype '|u1'"},
    {"{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }", 12,
     "big-endian dtype '>f4' is not supported"},
    {"{'descr': '>f2', 'fortran_order': False, 'shape': (3,), }", 6,
     "big-endian dtype '>f2'"},
    {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", 12,
     "bad header: 'descr' must be one string"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4,
     "0-d arrays are not supported"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1), }", 4,
     "bad header: 'shape' has more than 4 dimensions"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", 24,
     "bad header: negative size in 'shape'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 4,
     "bad header: size in 'shape' overflows"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 4,
     "shape (4611686018427387904, 4) is too large"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000,), }", 4,
     "shape (1000000000000) of '<f4' needs 4000000000000 data bytes, the file holds 4"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (2.5,), }", 4,
     "bad 'shape' tuple"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3], }", 24,
     "'shape' must be a tuple"},
    {"{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }", 12,
     "'fortran_order' must be True or False"},
    {"{'descr': '<f4', 'shape': (3,), }", 12, "header lacks 'fortran_order'"},
    {"{'fortran_order': False, 'shape': (3,), }", 12, "header lacks 'descr'"},
    {"{'descr': '<f4', 'fortran_order': False, }", 12, "header lacks 'shape'"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}", 12,
     "unknown key 'x'"},
    {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", 12,
     "'descr' must be one string"},
    {"{'descr': '<f4' 'fortran_order': False, 'shape': (3,), }", 12,
     "expected ',' or '}'"},
    {"{'descr' '<f4', 'fortran_order': False, 'shape': (3,), }", 12,
     "expected ':' after key 'descr'"},
    {"{'descr': '<f4, 'fortran_order': False, 'shape': (3,), }", 12, "bad header"},
    {"['descr', '<f4']", 12, "header is not a dict"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), } junk", 12,
     "junk after the header dict"},
    {"{'descr': '<f4', 'fortran_order': False, 'shape': (3,)", 12, "bad header"},
    {"", 0, "header is not a dict"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    write_npy(tpath("bad.npy"), 1, cases[i].dict, cases[i].data);
    sta_tensor *t = (sta_tensor *)0x1;
    sta_fault_arm(1000000); /* count allocations: a refused size allocates nothing big */
    sta_status rc = sta_npy_load(&t, tpath("bad.npy"), 1);
    int64_t allocs = sta_fault_count();
    sta_fault_arm(0);
    if (rc != STA_ERR_FORMAT || !strstr(sta_last_error(), cases[i].msg))
      fail_msg("case %zu: %s '%s', wanted '%s'", i, sta_status_name(rc), sta_last_error(),
               cases[i].msg);
    assert_non_null(strstr(sta_last_error(), tpath("bad.npy")));
    assert_ptr_equal(t, (sta_tensor *)0x1);
    assert_true(allocs <= 1); /* the header text only: never the data */
  }
}

static void test_npy_bad_preamble(void **state) {
  (void)state;
  unsigned char buf[256];
  sta_tensor *t = NULL;
  const char *d = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }";
  size_t h = npy_header(buf, 1, d);
  memset(buf + h, 0, 4);
  buf[1] = 'n'; /* bad magic */
  write_bytes(tpath("m.npy"), buf, h + 4);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT, tpath("m.npy"),
             "not an .npy file (bad magic string)");
  buf[1] = 'N';
  buf[6] = 4; /* unknown version */
  write_bytes(tpath("m.npy"), buf, h + 4);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT,
             "unsupported .npy version 4.0", NULL);
  buf[6] = 1;
  buf[7] = 1;
  write_bytes(tpath("m.npy"), buf, h + 4);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT,
             "unsupported .npy version 1.1", NULL);
  buf[7] = 0;
  buf[8] = 0xff; buf[9] = 0xff; /* header length past the end */
  write_bytes(tpath("m.npy"), buf, h + 4);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT,
             "truncated header (header length 65535", NULL);
  /* a version 2 header length of 4 GiB - 1, refused before allocating */
  h = npy_header(buf, 2, d);
  buf[8] = buf[9] = buf[10] = buf[11] = 0xff;
  write_bytes(tpath("m.npy"), buf, h + 4);
  sta_fault_arm(1);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT,
             "truncated header (header length 4294967295", NULL);
  sta_fault_arm(0);
  /* a NUL inside the header */
  h = npy_header(buf, 1, d);
  buf[20] = '\0';
  write_bytes(tpath("m.npy"), buf, h + 4);
  expect_err(sta_npy_load(&t, tpath("m.npy"), 0), STA_ERR_FORMAT, "NUL byte in the header",
             NULL);
  /* garbage, empty, missing, a directory */
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 37 + 11);
  write_bytes(tpath("g.npy"), buf, sizeof buf);
  expect_err(sta_npy_load(&t, tpath("g.npy"), 0), STA_ERR_FORMAT, tpath("g.npy"),
             "bad magic");
  write_bytes(tpath("e.npy"), buf, 0);
  expect_err(sta_npy_load(&t, tpath("e.npy"), 0), STA_ERR_FORMAT, tpath("e.npy"),
             "not an .npy file (0 bytes");
  expect_err(sta_npy_load(&t, tpath("missing.npy"), 0), STA_ERR_IO, tpath("missing.npy"),
             "cannot open: No such file or directory");
  expect_err(sta_npy_load(&t, tmpdir, 0), STA_ERR_IO, tmpdir, "not a regular file");
  assert_null(t);
}

static void test_npy_args(void **state) {
  (void)state;
  int64_t shape[1] = {4};
  sta_tensor *a = rand_tensor(STA_F32, 1, shape), *t = NULL;
  expect_err(sta_npy_load(NULL, "x.npy", 0), STA_ERR_ARGUMENT,
             "out: expected a pointer, got NULL", NULL);
  expect_err(sta_npy_load(&t, NULL, 0), STA_ERR_ARGUMENT,
             "path: expected a file name, got NULL", NULL);
  expect_err(sta_npy_save(NULL, "x.npy"), STA_ERR_ARGUMENT, "t: expected a tensor, got NULL",
             NULL);
  expect_err(sta_npy_save(a, NULL), STA_ERR_ARGUMENT, "path: expected a file name, got NULL",
             NULL);
  expect_err(sta_npy_save(a, "/nonexistent-dir/x.npy"), STA_ERR_IO,
             "/nonexistent-dir/x.npy: cannot open for writing", NULL);
  assert_null(t);
  sta_tensor_destroy(a);
}

static void test_npy_alloc_failures(void **state) {
  (void)state;
  int64_t shape[2] = {4, 3};
  sta_tensor *a = rand_tensor(STA_F32, 2, shape), *tr = NULL;
  int32_t perm[2] = {1, 0};
  assert_int_equal(sta_tensor_permute(&tr, a, perm), STA_OK);
  /* fortran file: load needs header, tensor, view, copy allocations */
  unsigned char buf[512];
  size_t h = npy_header(buf, 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }");
  memcpy(buf + h, sta_tensor_data(a), 48);
  write_bytes(tpath("fa.npy"), buf, h + 48);
  int failures = 0;
  for (int64_t k = 1; k < 40; k++) {
    sta_tensor *t = (sta_tensor *)0x1;
    sta_fault_arm(k);
    sta_status rc = sta_npy_load(&t, tpath("fa.npy"), 0);
    sta_fault_arm(0);
    if (rc == STA_OK) {
      assert_same(tr, t);
      sta_tensor_destroy(t);
      break;
    }
    expect_err(rc, STA_ERR_NOMEM, "out of host memory", NULL);
    assert_ptr_equal(t, (sta_tensor *)0x1);
    failures++;
  }
  assert_true(failures >= 3);
  /* save: every failing allocation leaves no file behind */
  for (int64_t k = 1; k < 10; k++) {
    unlink(tpath("fs.npy"));
    sta_fault_arm(k);
    sta_status rc = sta_npy_save(tr, tpath("fs.npy"));
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    expect_err(rc, STA_ERR_NOMEM, NULL, NULL);
    assert_int_equal(access(tpath("fs.npy"), F_OK), -1);
  }
  sta_tensor_destroy(tr);
  sta_tensor_destroy(a);
}

/* ---- safetensors ------------------------------------------------------ */

/* A .safetensors file from a JSON header (padded to 8) and data bytes. */
static void write_st(const char *path, const char *json, const void *data, size_t n) {
  size_t jl = strlen(json), pl = (jl + 7) / 8 * 8;
  unsigned char *buf = malloc(8 + pl + n + 1);
  assert_non_null(buf);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)pl >> (8 * i));
  memcpy(buf + 8, json, jl);
  memset(buf + 8 + jl, ' ', pl - jl);
  if (n) memcpy(buf + 8 + pl, data, n);
  write_bytes(path, buf, 8 + pl + n);
  free(buf);
}

static void test_st_roundtrip(void **state) {
  (void)state;
  static const int64_t shapes[5][4] = {{2, 3, 4, 5}, {7, 0, 0, 0}, {3, 0, 2, 0},
                                       {1, 17, 3, 8}, {4, 4, 0, 0}};
  static const int32_t nd[5] = {4, 1, 3, 4, 2};
  static const char *names[5] = {"q", "layer.0.weight", "empty", "a \"quoted\" \\ name\t",
                                 "\xc3\xa9t\xc3\xa9"};
  sta_tensor *ts[5];
  int32_t perm[2] = {1, 0};
  for (int i = 0; i < 5; i++) ts[i] = rand_tensor((sta_dtype)(i % 3), nd[i], shapes[i]);
  sta_tensor *p = NULL; /* a non-contiguous one */
  assert_int_equal(sta_tensor_permute(&p, ts[4], perm), STA_OK);
  sta_tensor_destroy(ts[4]);
  ts[4] = p;
  assert_int_equal(sta_safetensors_save(tpath("rt.safetensors"), 5, names,
                                        (const sta_tensor *const *)ts), STA_OK);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("rt.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 5);
  for (int i = 0; i < 5; i++) {
    assert_string_equal(sta_safetensors_name(f, i), names[i]);
    sta_tensor *t = NULL;
    assert_int_equal(sta_safetensors_read(f, names[i], &t), STA_OK);
    assert_same(ts[i], t);
    sta_tensor_destroy(t);
  }
  assert_null(sta_safetensors_name(f, 5));
  assert_null(sta_safetensors_name(f, -1));
  sta_tensor *t = (sta_tensor *)0x1;
  expect_err(sta_safetensors_read(f, "nope", &t), STA_ERR_KEY, tpath("rt.safetensors"),
             "no tensor named 'nope'");
  assert_ptr_equal(t, (sta_tensor *)0x1);
  sta_safetensors_close(f);
  /* header: 8-byte length, a multiple of 8, padded with spaces */
  size_t n;
  unsigned char *b = read_bytes(tpath("rt.safetensors"), &n);
  uint64_t hl;
  memcpy(&hl, b, 8);
  assert_int_equal(hl % 8, 0);
  assert_int_equal(b[8], '{');
  size_t data = 0;
  for (int i = 0; i < 5; i++)
    data += (size_t)sta_tensor_numel(ts[i]) * sta_dtype_size(sta_tensor_dtype(ts[i]));
  assert_int_equal(n, 8 + hl + data);
  free(b);
  for (int i = 0; i < 5; i++) sta_tensor_destroy(ts[i]);
  sta_safetensors_close(NULL);
  assert_int_equal(sta_safetensors_count(NULL), 0);
}

static void test_st_header_exact(void **state) {
  (void)state;
  int64_t s1[2] = {2, 2}, s2[1] = {3};
  sta_tensor *ts[2] = {rand_tensor(STA_F32, 2, s1), rand_tensor(STA_BF16, 1, s2)};
  const char *names[2] = {"b", "a"}; /* kept in the given order */
  assert_int_equal(sta_safetensors_save(tpath("x.safetensors"), 2, names,
                                        (const sta_tensor *const *)ts), STA_OK);
  size_t n;
  unsigned char *b = read_bytes(tpath("x.safetensors"), &n);
  const char *want = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                     "\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
  size_t wl = strlen(want), pl = (wl + 7) / 8 * 8;
  uint64_t hl;
  memcpy(&hl, b, 8);
  assert_int_equal(hl, pl);
  assert_memory_equal(b + 8, want, wl);
  for (size_t i = wl; i < pl; i++) assert_int_equal(b[8 + i], ' ');
  assert_int_equal(n, 8 + pl + 22);
  assert_memory_equal(b + 8 + pl, sta_tensor_data(ts[0]), 16);
  assert_memory_equal(b + 8 + pl + 16, sta_tensor_data(ts[1]), 6);
  free(b);
  /* zero tensors: "{}" padded to 8 */
  assert_int_equal(sta_safetensors_save(tpath("e.safetensors"), 0, NULL, NULL), STA_OK);
  b = read_bytes(tpath("e.safetensors"), &n);
  assert_int_equal(n, 16);
  assert_memory_equal(b, "\x08\0\0\0\0\0\0\0{}      ", 16);
  free(b);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("e.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 0);
  sta_safetensors_close(f);
  sta_tensor_destroy(ts[0]);
  sta_tensor_destroy(ts[1]);
}

/* A file as other writers make it: __metadata__, entries out of offset
** order, a dtype sta lists but does not read. */
static void test_st_foreign_file(void **state) {
  (void)state;
  float a[6];
  uint16_t h[4] = {0x3c00, 0x4000, 0xbc00, 0x7c00}; /* 1, 2, -1, inf */
  int64_t ids[2] = {7, -9};
  for (int i = 0; i < 6; i++) a[i] = (float)i * 0.25f - 1.0f;
  float sc = 3.5f;
  unsigned char data[24 + 8 + 16 + 4];
  memcpy(data, ids, 16);
  memcpy(data + 16, h, 8);
  memcpy(data + 24, a, 24);
  memcpy(data + 48, &sc, 4);
  write_st(tpath("foreign.safetensors"),
           "{\"__metadata__\": {\"format\": \"pt\", \"note\": \"x\"},\n"
           "  \"w\": {\"data_offsets\": [24, 48], \"shape\": [3, 2], \"dtype\": \"F32\"},\n"
           "  \"h\": {\"dtype\": \"F16\", \"shape\": [2, 1, 2], \"data_offsets\": [16, 24]},\n"
           "  \"ids\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]},\n"
           "  \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [48, 52]}}",
           data, sizeof data);
  sta_safetensors *f = NULL;
  assert_int_equal(sta_safetensors_open(&f, tpath("foreign.safetensors")), STA_OK);
  assert_int_equal(sta_safetensors_count(f), 4);
  assert_string_equal(sta_safetensors_name(f, 0), "w");
  assert_string_equal(sta_safetensors_name(f, 2), "ids");
  sta_tensor *t = NULL;
  assert_int_equal(sta_safetensors_read(f, "w", &t), STA_OK);
  assert_int_equal(sta_tensor_size(t, 0), 3);
  assert_memory_equal(sta_tensor_data(t), a, 24);
  sta_tensor_destroy(t);
  t = NULL;
  assert_int_equal(sta_safetensors_read(f, "h", &t), STA_OK);
  assert_int_equal(sta_tensor_dtype(t), STA_F16);
  int64_t idx[3] = {1, 0, 1};
  double x;
  assert_int_equal(sta_tensor_get(t, idx, &x), STA_OK);
  assert_true(isinf(x) && x > 0);
  sta_tensor_destroy(t);
  t = (sta_tensor *)0x1;
  expect_err(sta_safetensors_read(f, "ids", &t), STA_ERR_DTYPE, tpath("foreign.safetensors"),
             "tensor 'ids' has unsupported dtype I64 (expected F32, F16, BF16 or F8_E4M3)");
  expect_err(sta_safetensors_read(f, "s", &t), STA_ERR_SHAPE,
             "tensor 's' has 0 dimensions (sta reads 1..4)", NULL);
  assert_ptr_equal(t, (sta_tensor *)0x1);
  expect_err(sta_safetensors_read(NULL, "w", &t), STA_ERR_ARGUMENT, "f: expected", NULL);
  expect_err(sta_safetensors_read(f, NULL, &t), STA_ERR_ARGUMENT, "name: expected", NULL);
  expect_err(sta_safetensors_read(f, "w", NULL), STA_ERR_ARGUMENT, "out: expected", NULL);
  sta_safetensors_close(f);
}

static void test_st_malformed(void **state) {
  (void)state;
  static const struct { const char *json; size_t data; const char *msg; } cases[] = {
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8,
     "the header is not valid JSON"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}} x", 8,
     "junk after the JSON header"},
    {"[1, 2]", 0, "the header does not start with '{'"},
    {"{\"a\": [1, 2]}", 0, "entry 'a' is not a JSON object"},
    {"{\"a\": {\"dtype\": 5, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': 'dtype' must be a string"},
    {"{\"a\": {\"dtype\": \"F99\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': unknown dtype 'F99'"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": 2, \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': 'shape' must be an array"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2, -1], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': shape[1] must be an integer >= 0"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': shape[0] must be an integer >= 0"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': shape[0] must be an integer >= 0"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": [0, 4]}}",
     4, "entry 'a': 9 dimensions (at most 8)"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': shape and dtype F32 need 12 bytes, data_offsets [0, 8] hold 8"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [100000000, 10000000], "
     "\"data_offsets\": [0, 8]}}", 8, "entry 'a': shape and dtype F32 need 4000000000000000 "},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
     "\"data_offsets\": [0, 8]}}", 8, "entry 'a': shape is too large"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8,
     "entry 'a': data_offsets [8, 0] are outside the 8 data bytes"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", 8,
     "entry 'a': data_offsets [4, 12] are outside the 8 data bytes"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0]}}", 8,
     "entry 'a': 'data_offsets' must be [begin, end]"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, -8]}}", 8,
     "entry 'a': 'data_offsets' must be [begin, end]"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8,
     "entry 'a': 'data_offsets' must be [begin, end]"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8], \"x\": 1}}", 8,
     "entry 'a': unexpected or repeated key 'x'"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"b\": {\"dtype\": \"F16\", \"shape\": [2], \"data_offsets\": [6, 10]}}", 16,
     "entries 'a' [0, 8] and 'b' [6, 10] overlap"},
    {"{\"b\": {\"dtype\": \"F16\", \"shape\": [4], \"data_offsets\": [4, 12]},"
     " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 16,
     "entries 'a' [0, 8] and 'b' [4, 12] overlap"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
     " \"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", 16,
     "entry 'a' appears twice"},
    {"{\"__metadata__\": {\"k\": 1}}", 0, "__metadata__ value 'k' is not a string"},
    {"{\"__metadata__\": [\"k\"]}", 0, "__metadata__ must be an object of strings"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    unsigned char data[16];
    for (int j = 0; j < 16; j++) data[j] = (unsigned char)(j * 13 + (int)i);
    write_st(tpath("bad.safetensors"), cases[i].json, data, cases[i].data);
    sta_safetensors *f = (sta_safetensors *)0x1;
    sta_status rc = sta_safetensors_open(&f, tpath("bad.safetensors"));
    if (rc != STA_ERR_FORMAT || !strstr(sta_last_error(), cases[i].msg))
      fail_msg("case %zu: %s '%s', wanted '%s'", i, sta_status_name(rc), sta_last_error(),
               cases[i].msg);
    assert_non_null(strstr(sta_last_error(), tpath("bad.safetensors")));
    assert_ptr_equal(f, (sta_safetensors *)0x1);
  }
}

static void test_st_bad_length(void **state) {
  (void)state;
  sta_safetensors *f = NULL;
  unsigned char buf[64];
  memset(buf, ' ', sizeof buf);
  memcpy(buf + 8, "{}", 2);
  /* header length past the end, absurd, tiny */
  static const uint64_t lens[] = {57, 1ull << 40, 0xffffffffffffffffull, 0, 1};
  static const char *what[] = {"header length 57 is impossible for a file of 64 bytes",
                               "header length 1099511627776 is impossible",
                               "header length 18446744073709551615 is impossible",
                               "header length 0 is impossible",
                               "header length 1 is impossible"};
  for (int i = 0; i < 5; i++) {
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(lens[i] >> (8 * b));
    write_bytes(tpath("len.safetensors"), buf, sizeof buf);
    sta_fault_arm(1000000);
    expect_err(sta_safetensors_open(&f, tpath("len.safetensors")), STA_ERR_FORMAT,
               tpath("len.safetensors"), what[i]);
    assert_true(sta_fault_count() <= 2); /* the handle and its path only */
    sta_fault_arm(0);
  }
  /* a 150 MB header in a (sparse) 200 MB file: over the limit, refused
  ** before allocating */
  uint64_t big = 150u << 20;
  for (int b = 0; b < 8; b++) buf[b] = (unsigned char)(big >> (8 * b));
  write_bytes(tpath("big.safetensors"), buf, sizeof buf);
  assert_int_equal(truncate(tpath("big.safetensors"), 200 << 20), 0);
  sta_fault_arm(1000000);
  expect_err(sta_safetensors_open(&f, tpath("big.safetensors")), STA_ERR_FORMAT,
             tpath("big.safetensors"), "header length 157286400 is over the limit of 104857600");
  assert_true(sta_fault_count() <= 2);
  sta_fault_arm(0);
  unlink(tpath("big.safetensors"));
  write_bytes(tpath("short.safetensors"), buf, 5);
  expect_err(sta_safetensors_open(&f, tpath("short.safetensors")), STA_ERR_FORMAT,
             "not a .safetensors file (5 bytes", NULL);
  expect_err(sta_safetensors_open(&f, tpath("none.safetensors")), STA_ERR_IO,
             tpath("none.safetensors"), "cannot open");
  expect_err(sta_safetensors_open(&f, tmpdir), STA_ERR_IO, "not a regular file", NULL);
  /* NUL in the header */
  memcpy(buf, "\x08\0\0\0\0\0\0\0{}\0     ", 16);
  write_bytes(tpath("nul.safetensors"), buf, 16);
  expect_err(sta_safetensors_open(&f, tpath("nul.safetensors")), STA_ERR_FORMAT,
             "NUL byte in the JSON header", NULL);
  expect_err(sta_safetensors_open(NULL, "x"), STA_ERR_ARGUMENT, "out: expected", NULL);
  expect_err(sta_safetensors_open(&f, NULL), STA_ERR_ARGUMENT, "path: expected", NULL);
  assert_null(f);
  /* garbage */
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 101 + 3);
  write_bytes(tpath("garbage.safetensors"), buf, sizeof buf);
  expect_err(sta_safetensors_open(&f, tpath("garbage.safetensors")), STA_ERR_FORMAT,
             tpath("garbage.safetensors"), "is impossible");
  assert_null(f);
}

static void test_st_truncated_everywhere(void **state) {
  (void)state;
  int64_t s1[2] = {3, 2}, s2[1] = {5};
  sta_tensor *ts[2] = {rand_tensor(STA_F16, 2, s1), rand_tensor(STA_F32, 1, s2)};
  const char *names[2] = {"x", "y"};
  assert_int_equal(sta_safetensors_save(tpath("full.safetensors"), 2, names,
                                        (const sta_tensor *const *)ts), STA_OK);
  size_t n;
  unsigned char *b = read_bytes(tpath("full.safetensors"), &n);
  for (size_t len = 0; len < n; len++) {
    write_bytes(tpath("cut.safetensors"), b, len);
    sta_safetensors *f = (sta_safetensors *)0x1;
    expect_err(sta_safetensors_open(&f, tpath("cut.safetensors")), STA_ERR_FORMAT,
               tpath("cut.safetensors"), NULL);
    assert_ptr_equal(f, (sta_safetensors *)0x1);
  }
  /* a file cut after opening: the read fails cleanly */
  sta_safetensors *f = NULL;
  write_bytes(tpath("cut.safetensors"), b, n);
  assert_int_equal(sta_safetensors_open(&f, tpath("cut.safetensors")), STA_OK);
  assert_int_equal(truncate(tpath("cut.safetensors"), (off_t)n - 4), 0);
  sta_tensor *t = (sta_tensor *)0x1;
  expect_err(sta_safetensors_read(f, "y", &t), STA_ERR_FORMAT,
             "truncated data of tensor 'y'", NULL);
  assert_ptr_equal(t, (sta_tensor *)0x1);
  t = NULL;
  assert_int_equal(sta_safetensors_read(f, "x", &t), STA_OK);
  assert_same(ts[0], t);
  sta_tensor_destroy(t);
  sta_safetensors_close(f);
  free(b);
  sta_tensor_destroy(ts[0]);
  sta_tensor_destroy(ts[1]);
}

static void test_st_save_args(void **state) {
  (void)state;
  int64_t s[1] = {3};
  sta_tensor *a = rand_tensor(STA_F32, 1, s);
  const sta_tensor *ts[2] = {a, a}, *tn[2] = {a, NULL};
  const char *names[2] = {"a", "b"}, *dup[2] = {"a", "a"}, *meta[1] = {"__metadata__"},
             *nn[2] = {"a", NULL};
  const char *p = tpath("args.safetensors");
  unlink(p);
  expect_err(sta_safetensors_save(NULL, 1, names, ts), STA_ERR_ARGUMENT, "path: expected",
             NULL);
  expect_err(sta_safetensors_save(p, -1, names, ts), STA_ERR_ARGUMENT,
             "n: expected >= 0, got -1", NULL);
  expect_err(sta_safetensors_save(p, 1, NULL, ts), STA_ERR_ARGUMENT, "names: expected", NULL);
  expect_err(sta_safetensors_save(p, 1, names, NULL), STA_ERR_ARGUMENT, "tensors: expected",
             NULL);
  expect_err(sta_safetensors_save(p, 2, nn, ts), STA_ERR_ARGUMENT,
             "names[1]: expected a string, got NULL", NULL);
  expect_err(sta_safetensors_save(p, 2, names, tn), STA_ERR_ARGUMENT,
             "tensors[1]: expected a tensor, got NULL", NULL);
  expect_err(sta_safetensors_save(p, 2, dup, ts), STA_ERR_ARGUMENT,
             "names[1]: 'a' repeats names[0]", NULL);
  expect_err(sta_safetensors_save(p, 1, meta, ts), STA_ERR_ARGUMENT,
             "names[0]: '__metadata__' is reserved", NULL);
  assert_int_equal(access(p, F_OK), -1); /* nothing written */
  expect_err(sta_safetensors_save("/nonexistent-dir/x.safetensors", 1, names, ts), STA_ERR_IO,
             "/nonexistent-dir/x.safetensors: cannot open for writing", NULL);
  /* the same tensor under two names is fine */
  assert_int_equal(sta_safetensors_save(p, 2, names, ts), STA_OK);
  /* allocation failures: an error, no file, then success */
  for (int64_t k = 1; k < 20; k++) {
    unlink(p);
    sta_fault_arm(k);
    sta_status rc = sta_safetensors_save(p, 2, names, ts);
    sta_fault_arm(0);
    if (rc == STA_OK) break;
    expect_err(rc, STA_ERR_NOMEM, NULL, NULL);
    assert_int_equal(access(p, F_OK), -1);
  }
  for (int64_t k = 1; k < 20; k++) {
    sta_safetensors *f = (sta_safetensors *)0x1;
    sta_fault_arm(k);
    sta_status rc = sta_safetensors_open(&f, p);
    sta_fault_arm(0);
    if (rc == STA_OK) { sta_safetensors_close(f); break; }
    expect_err(rc, STA_ERR_NOMEM, NULL, NULL);
    assert_ptr_equal(f, (sta_safetensors *)0x1);
  }
  sta_tensor_destroy(a);
}

/* Saving device tensors (strided, every dtype) writes the same files as
** their host copies (skipped without a CUDA device). */
static void test_save_device(void **state) {
  (void)state;
  if (!sta_backend_available(STA_CUDA)) skip();
  int64_t shape[3] = {3, 5, 8};
  int32_t perm[3] = {1, 0, 2};
  for (int d = 0; d < 3; d++) {
    sta_tensor *h = rand_tensor((sta_dtype)d, 3, shape), *dev = NULL, *dp = NULL, *hp = NULL;
    sta_tensor *a = NULL, *b = NULL;
    assert_int_equal(sta_tensor_to(&dev, h, (sta_dtype)d, STA_CUDA), STA_OK);
    assert_int_equal(sta_tensor_permute(&dp, dev, perm), STA_OK);
    assert_int_equal(sta_tensor_permute(&hp, h, perm), STA_OK);
    assert_int_equal(sta_npy_save(dp, tpath("dev.npy")), STA_OK);
    assert_int_equal(sta_npy_load(&a, tpath("dev.npy"), 1), STA_OK);
    assert_same(hp, a);
    const char *names[2] = {"dev", "host"};
    const sta_tensor *ts[2] = {dp, h};
    assert_int_equal(sta_safetensors_save(tpath("dev.safetensors"), 2, names, ts), STA_OK);
    sta_safetensors *f = NULL;
    assert_int_equal(sta_safetensors_open(&f, tpath("dev.safetensors")), STA_OK);
    assert_int_equal(sta_safetensors_read(f, "dev", &b), STA_OK);
    assert_same(hp, b);
    sta_safetensors_close(f);
    sta_tensor_destroy(a);
    sta_tensor_destroy(b);
    sta_tensor_destroy(h);
    sta_tensor_destroy(hp);
    sta_tensor_destroy(dev);
    sta_tensor_destroy(dp);
  }
}

/* ---- random mutations of valid files ------------------------------------ */

static uint64_t xorshift(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

/* Mutate the first `span` bytes of a valid file many times: every load
** either succeeds with a sane tensor or fails with a message naming the
** file; never a crash (the sanitizer build checks the memory). */
static void mutate_file(const char *valid, const char *path, int st, int rounds) {
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

static void test_mutations(void **state) {
  (void)state;
  int64_t s1[3] = {2, 3, 4}, s2[1] = {9};
  sta_tensor *a = rand_tensor(STA_F32, 3, s1), *b = rand_tensor(STA_BF16, 1, s2);
  assert_int_equal(sta_npy_save(a, tpath("m1.npy")), STA_OK);
  assert_int_equal(sta_npy_save(b, tpath("m2.npy")), STA_OK);
  const char *names[2] = {"alpha", "beta"};
  const sta_tensor *ts[2] = {a, b};
  assert_int_equal(sta_safetensors_save(tpath("m.safetensors"), 2, names, ts), STA_OK);
  mutate_file(tpath("m1.npy"), tpath("mut.npy"), 0, 2000);
  mutate_file(tpath("m2.npy"), tpath("mut.npy"), 0, 2000);
  mutate_file(tpath("m.safetensors"), tpath("mut.safetensors"), 1, 2000);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_npy_roundtrip),
    cmocka_unit_test(test_npy_save_strided),
    cmocka_unit_test(test_npy_save_header_exact),
    cmocka_unit_test(test_npy_bf16_convention),
    cmocka_unit_test(test_npy_numpy_files),
    cmocka_unit_test(test_npy_fortran_4d),
    cmocka_unit_test(test_npy_truncated_everywhere),
    cmocka_unit_test(test_npy_malformed),
    cmocka_unit_test(test_npy_bad_preamble),
    cmocka_unit_test(test_npy_args),
    cmocka_unit_test(test_npy_alloc_failures),
    cmocka_unit_test(test_st_roundtrip),
    cmocka_unit_test(test_st_header_exact),
    cmocka_unit_test(test_st_foreign_file),
    cmocka_unit_test(test_st_malformed),
    cmocka_unit_test(test_st_bad_length),
    cmocka_unit_test(test_st_truncated_everywhere),
    cmocka_unit_test(test_st_save_args),
    cmocka_unit_test(test_mutations),
    cmocka_unit_test(test_save_device),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
