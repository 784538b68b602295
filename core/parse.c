/*
** parse.c -- the text forms of triples and window lists, one parser for
** every front end (sta-run now; the Lua and Python strings can call it):
**   triple   "T,H,W" or "TxHxW"
**   windows  "3,3,3:1,5,7" (comma triples joined by ':') or "3x3x3,1x5x7"
**            (x triples joined by ',' or ':'); one spelling per string.
** Integers are decimal, without sign or spaces, in lo..hi.
*/
#include <stdlib.h>

#include "internal.h"

/* A decimal in lo..hi at s[0..len), nothing else. */
static int parse_int(const char *s, size_t len, int32_t lo, int32_t hi, int32_t *out) {
  int64_t v = 0;
  if (len == 0 || len > 10) return 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return 0;
    v = v * 10 + (s[i] - '0');
  }
  if (v < lo || v > hi) return 0;
  *out = (int32_t)v;
  return 1;
}

/* Three integers at s[0..len) separated by sep. */
static int parse_three(const char *s, size_t len, char sep, int32_t lo, int32_t hi,
                       int32_t out[3]) {
  size_t start = 0;
  for (int i = 0; i < 3; i++) {
    size_t end = start;
    while (end < len && s[end] != sep) end++;
    if ((i < 2) != (end < len)) return 0;
    if (!parse_int(s + start, end - start, lo, hi, &out[i])) return 0;
    start = end + 1;
  }
  return 1;
}

/* 'x' when s[0..len) holds an x, else ','. */
static char spelling(const char *s, size_t len) {
  return memchr(s, 'x', len) ? 'x' : ',';
}

sta_status sta_parse_triple(const char *s, const char *what, int32_t lo, int32_t hi,
                            int32_t out[3]) {
  if (!s) return sta_error(STA_ERR_ARGUMENT, "%s: expected a string, got NULL", what);
  int32_t v[3];
  size_t len = strlen(s);
  if (!parse_three(s, len, spelling(s, len), lo, hi, v))
    return sta_error(STA_ERR_ARGUMENT, "%s: '%.64s' is not T,H,W or TxHxW (three integers "
                     "%d..%d)", what, s, (int)lo, (int)hi);
  memcpy(out, v, sizeof v);
  return STA_OK;
}

sta_status sta_parse_windows(const char *s, const char *what, int32_t max_n, int32_t **out,
                             int32_t *n) {
  if (!s) return sta_error(STA_ERR_ARGUMENT, "%s: expected a string, got NULL", what);
  size_t len = strlen(s);
  char sep = spelling(s, len); /* inside a triple */
  int32_t count = 1;
  for (size_t i = 0; i < len; i++)
    count += s[i] == ':' || (sep == 'x' && s[i] == ',');
  if (count > max_n)
    return sta_error(STA_ERR_ARGUMENT, "%s: %d windows, at most %d", what, (int)count,
                     (int)max_n);
  int32_t *w = sta_malloc(sizeof(int32_t) * 3 * (size_t)count);
  if (!w) return sta_error(STA_ERR_NOMEM, "out of host memory (%s)", what);
  size_t start = 0;
  for (int32_t i = 0; i < count; i++) {
    size_t end = start;
    while (end < len && s[end] != ':' && !(sep == 'x' && s[end] == ',')) end++;
    if (!parse_three(s + start, end - start, sep, 1, 1 << 20, w + 3 * i)) {
      free(w);
      return sta_error(STA_ERR_ARGUMENT, "%s: '%.64s' is not KT,KH,KW or KTxKHxKW (three "
                       "integers 1..%d), or a list of them: 3,3,3:1,5,7 or 3x3x3,1x5x7",
                       what, s, 1 << 20);
    }
    start = end + 1;
  }
  *out = w;
  *n = count;
  return STA_OK;
}
