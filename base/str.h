/*
 * str.h — the string helpers every layer needs: a malloc'd copy and lower-case hex.
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

#ifdef __cplusplus
}
#endif

#endif
