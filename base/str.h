/*
 * str.h — the string helpers every layer needs: a malloc'd copy, lower-case hex, and the words of
 * an errno or a prefix put before an error sentence.
 */
#ifndef TS_BASE_STR_H
#define TS_BASE_STR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A malloc'd copy of s (NULL when out of memory). */
char *ts_dup_str(const char *s);

/* out (2·n + 1 chars) = the lower-case hex of bytes[0..n), NUL-terminated. */
void ts_hex(const unsigned char *bytes, size_t n, char *out);

/* buf = strerror_r's words for errnum ("error N" when it has none). */
void ts_errno_text(int errnum, char *buf, size_t len);

/* Puts prefix in front of the sentence already in err (err may be NULL or errlen 0). */
void ts_err_prefix(char *err, size_t errlen, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif
