/* hash.c — BLAKE2b-256 hashes of the weights store (store/hash.h). */
#include "store/hash.h"

#include <string.h>

#include <sodium.h>

#include "base/error.h"
#include "base/str.h"

/* libsodium picks its fastest BLAKE2b at sodium_init; calling it again is harmless, and should
 * it fail (no entropy source), hashing still works with the portable code. */
void ts_hash_ready(void) {
    int rc = sodium_init();
    (void)rc;
}

void ts_hash_compute(ts_hash_t *h, const void *data, size_t len) {
    ts_hash_ready();
    crypto_generichash(h->b, TS_HASH_BYTES, data, len, NULL, 0);
}

void ts_hash_hex(const ts_hash_t *h, char *out) { ts_hex(h->b, TS_HASH_BYTES, out); }

int ts_hash_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int ts_hash_parse(const char *hex, ts_hash_t *h) {
    if (!hex || !h || strlen(hex) != 2 * TS_HASH_BYTES)
        return TS_EINVAL;
    ts_hash_t out;
    for (int i = 0; i < TS_HASH_BYTES; i++) {
        int hi = ts_hash_digit(hex[2 * i]), lo = ts_hash_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return TS_EINVAL;
        out.b[i] = (unsigned char)(hi << 4 | lo);
    }
    *h = out;
    return TS_OK;
}

ts_hash_text_t ts_hash_text(const ts_hash_t *h) {
    ts_hash_text_t out;
    ts_hash_hex(h, out.s);
    return out;
}

int ts_hash_cmp(const void *a, const void *b) { return memcmp(a, b, TS_HASH_BYTES); }
