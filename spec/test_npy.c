/* test_npy.c -- .npy files: round trips, files written by hand byte for
** byte as NumPy writes them, and every malformed case (truncation at every
** byte, lies, huge sizes, random mutations) failing cleanly, naming the
** file. */
#define IO_TEST_NAME "test-npy"
#include "io_util.h"

/* NumPy 1.26 np.save(np.arange(6, dtype='<f4').reshape(2, 3)) header, byte
** for byte: the dict, 20 growth-axis spaces, padding to 128 with '\n'. */
static const char NUMPY_F4_2x3[] = "\x93NUMPY\x01\x00\x76\x00"
  "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
  "                                                          \n";

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
static void test_npy_mutations(void **state) {
  (void)state;
  int64_t s1[3] = {2, 3, 4}, s2[1] = {9};
  sta_tensor *a = rand_tensor(STA_F32, 3, s1), *b = rand_tensor(STA_BF16, 1, s2);
  assert_int_equal(sta_npy_save(a, tpath("m1.npy")), STA_OK);
  assert_int_equal(sta_npy_save(b, tpath("m2.npy")), STA_OK);
  mutate_file(tpath("m1.npy"), tpath("mut.npy"), 0, 2000);
  mutate_file(tpath("m2.npy"), tpath("mut.npy"), 0, 2000);
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
    cmocka_unit_test(test_npy_mutations),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
