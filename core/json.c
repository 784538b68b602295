/*
** json.c -- the one entry of every JSON reader (strategy files, search
** results, safetensors headers): cJSON parses, then what cJSON lets
** through is refused here.  Text after the value: cJSON stops at the end
** of the first value.  A NUL byte inside it, raw or as \u0000 in a string:
** cJSON's strings end at the first NUL, so a key "0_0_0\u0000junk" would
** read as "0_0_0".
*/
#include <cJSON.h>

#include "internal.h"

/* Offset of the first NUL that cJSON's strings would cut at in text[0,
** end) (a raw NUL byte or a \u0000 escape inside a string), or -1. */
static int64_t first_nul(const char *text, size_t end) {
  int in_string = 0;
  for (size_t i = 0; i < end; i++) {
    char c = text[i];
    if (c == '\0') return (int64_t)i;
    if (!in_string) {
      in_string = c == '"';
      continue;
    }
    if (c == '"') in_string = 0;
    else if (c == '\\' && i + 1 < end) {
      if (text[i + 1] == 'u' && i + 5 < end && memcmp(text + i + 2, "0000", 4) == 0)
        return (int64_t)i;
      i++; /* the escaped character (the rest of \uXXXX is hex digits) */
    }
  }
  return -1;
}

sta_status sta_json_parse(const char *text, size_t len, const char *what, int trailing_nul,
                          struct cJSON **out) {
  const char *end = NULL;
  int64_t failed = sta_alloc_failures();
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root && sta_alloc_failures() != failed)
    return sta_error(STA_ERR_NOMEM, "%s: out of host memory (parsing JSON)", what);
  if (!root)
    return sta_error(STA_ERR_FORMAT, "%s: malformed JSON at byte %zu", what,
                     end && end >= text ? (size_t)(end - text) : (size_t)0);
  size_t stop = (size_t)(end - text);
  int64_t nul = first_nul(text, stop);
  sta_status rc = STA_OK;
  if (nul >= 0)
    rc = sta_error(STA_ERR_FORMAT, "%s: NUL character in a string at byte %lld (\\u0000 or a "
                   "NUL byte: the name or value would end there)", what, (long long)nul);
  for (const char *p = end; rc == STA_OK && p < text + len; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && !(trailing_nul && *p == '\0'))
      rc = sta_error(STA_ERR_FORMAT, "%s: unexpected text after the JSON object at byte %zu",
                     what, (size_t)(p - text));
  if (rc != STA_OK) {
    cJSON_Delete(root);
    return rc;
  }
  *out = root;
  return STA_OK;
}
