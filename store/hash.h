/*
 * hash.h — BLAKE2b-256 hashes, the names of the weights store's chunks and files (weights.h):
 * computed, written and parsed as hex, compared.
 */
#ifndef TS_STORE_HASH_H
#define TS_STORE_HASH_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_HASH_BYTES 32
#define TS_HASH_HEX (2 * TS_HASH_BYTES + 1) /* hex digits plus the NUL */

/* A BLAKE2b-256 hash: a chunk's or a whole file's. */
typedef struct ts_hash {
    unsigned char b[TS_HASH_BYTES];
} ts_hash_t;

/* A hash as text, for messages. */
typedef struct {
    char s[TS_HASH_HEX];
} ts_hash_text_t;

/* BLAKE2b-256 of len bytes (libsodium crypto_generichash, no key). */
void ts_hash_compute(ts_hash_t *h, const void *data, size_t len);
/* Writes 64 lowercase hex digits and a NUL into out (TS_HASH_HEX bytes). */
void ts_hash_hex(const ts_hash_t *h, char *out);
/* Parses exactly 64 hex digits (either case); TS_EINVAL otherwise. */
int ts_hash_parse(const char *hex, ts_hash_t *h);
/* h as 64 lowercase hex digits. */
ts_hash_text_t ts_hash_text(const ts_hash_t *h);
/* The value of the hex digit c (either case); −1 when c is none. */
int ts_hash_digit(char c);
/* The byte order of two hashes (memcmp), for qsort and bsearch. */
int ts_hash_cmp(const void *a, const void *b);

/* libsodium picks its fastest BLAKE2b at sodium_init; calling it again is harmless, and should
 * it fail (no entropy source), hashing still works with the portable code. */
void ts_hash_ready(void);

#ifdef __cplusplus
}
#endif

#endif
