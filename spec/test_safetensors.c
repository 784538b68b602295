/* test_safetensors.c -- .safetensors files: round trips, headers exactly
** as the reference writer makes them, files from other writers, and every
** malformed case (bad JSON, trailing text, NUL in names, lies about
** lengths, truncation at every byte, random mutations) failing cleanly,
** naming the file; a tensor of a dtype sta does not read fails only when
** it is read. */
#define IO_TEST_NAME "test-safetensors"
#include "io_util.h"

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
     "the JSON header: malformed JSON at byte"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}} x", 8,
     "the JSON header: unexpected text after the JSON object at byte 62"},
    {"{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}} {}", 8,
     "the JSON header: unexpected text after the JSON object at byte 62"},
    {"{\"a\\u0000b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "the JSON header: NUL character in a string at byte 3"},
    {"{\"a\": {\"dtype\": \"F32\\u0000\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "the JSON header: NUL character in a string at byte 20"},
    {"{\"a\": {\"dtype\": \"\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': dtype '' is not a dtype name"},
    {"{\"a\": {\"dtype\": \"F8_E4M3_AND_MORE\", \"shape\": [2], \"data_offsets\": [0, 8]}}",
     8, "entry 'a': dtype 'F8_E4M3_AND_MORE' is not a dtype name"},
    {"{\"a\": {\"dtype\": \"F99\", \"shape\": [2], \"data_offsets\": [0, 9]}}", 8,
     "entry 'a': data_offsets [0, 9] are outside the 8 data bytes"},
    {"[1, 2]", 0, "the header does not start with '{'"},
    {"{\"a\": [1, 2]}", 0, "entry 'a' is not a JSON object"},
    {"{\"a\": {\"dtype\": 5, \"shape\": [2], \"data_offsets\": [0, 8]}}", 8,
     "entry 'a': 'dtype' must be a string"},
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

/* Tensors of dtypes sta does not read (I64 indices, BOOL masks, a dtype
** newer than this reader) beside the ones it reads: the file opens, the
** others read, and only reading such a tensor fails, naming it (an
** unknown dtype anywhere once refused the whole file). */
static void test_st_other_dtypes(void **state) {
  (void)state;
  int64_t shape[2] = {2, 3};
  sta_tensor *q = rand_tensor(STA_F32, 2, shape), *got = NULL;
  char json[512];
  snprintf(json, sizeof json,
           "{\"idx\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [0, 16]}, "
           "\"q\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [16, 40]}, "
           "\"mask\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [40, 43]}, "
           "\"new\": {\"dtype\": \"F4_E2M1\", \"shape\": [6], \"data_offsets\": [43, 46]}, "
           "\"__metadata__\": {\"format\": \"pt\"}}");
  unsigned char data[46];
  for (int i = 0; i < 46; i++) data[i] = (unsigned char)(i * 29 + 3);
  memcpy(data + 16, sta_tensor_data(q), 24);
  write_st(tpath("mixed.safetensors"), json, data, sizeof data);
  sta_safetensors *f = NULL;
  if (sta_safetensors_open(&f, tpath("mixed.safetensors")) != STA_OK)
    fail_msg("open: %s", sta_last_error());
  assert_int_equal(sta_safetensors_count(f), 4);
  assert_int_equal(sta_safetensors_read(f, "q", &got), STA_OK);
  assert_same(q, got);
  static const char *const other[3][2] = {{"idx", "I64"}, {"mask", "BOOL"}, {"new", "F4_E2M1"}};
  for (int i = 0; i < 3; i++) {
    sta_tensor *t = (sta_tensor *)0x1;
    char want[96];
    snprintf(want, sizeof want, "tensor '%s' has unsupported dtype %s", other[i][0], other[i][1]);
    expect_err(sta_safetensors_read(f, other[i][0], &t), STA_ERR_DTYPE, want,
               tpath("mixed.safetensors"));
    assert_ptr_equal(t, (sta_tensor *)0x1);
  }
  sta_safetensors_close(f);
  sta_tensor_destroy(got);
  sta_tensor_destroy(q);
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
             "unexpected text after the JSON object at byte 2", NULL);
  memcpy(buf, "\x08\0\0\0\0\0\0\0{\"\0\":1} ", 16);
  write_bytes(tpath("nul.safetensors"), buf, 16);
  expect_err(sta_safetensors_open(&f, tpath("nul.safetensors")), STA_ERR_FORMAT,
             "NUL character in a string at byte 2", NULL);
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
** their host copies (skipped without a CUDA device). */static void test_st_mutations(void **state) {
  (void)state;
  int64_t s1[3] = {2, 3, 4}, s2[1] = {9};
  sta_tensor *a = rand_tensor(STA_F32, 3, s1), *b = rand_tensor(STA_BF16, 1, s2);
  const char *names[2] = {"alpha", "beta"};
  const sta_tensor *ts[2] = {a, b};
  assert_int_equal(sta_safetensors_save(tpath("m.safetensors"), 2, names, ts), STA_OK);
  mutate_file(tpath("m.safetensors"), tpath("mut.safetensors"), 1, 2000);
  sta_tensor_destroy(a);
  sta_tensor_destroy(b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_st_roundtrip),
    cmocka_unit_test(test_st_header_exact),
    cmocka_unit_test(test_st_foreign_file),
    cmocka_unit_test(test_st_malformed),
    cmocka_unit_test(test_st_other_dtypes),
    cmocka_unit_test(test_st_bad_length),
    cmocka_unit_test(test_st_truncated_everywhere),
    cmocka_unit_test(test_st_save_args),
    cmocka_unit_test(test_st_mutations),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
