#define _POSIX_C_SOURCE 200809L

#include "base/str.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

char *ts_dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void ts_hex(const unsigned char *bytes, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * n] = '\0';
}

void ts_errno_text(int errnum, char *buf, size_t len) {
    if (strerror_r(errnum, buf, len) != 0)
        snprintf(buf, len, "error %d", errnum);
}

void ts_err_prefix(char *err, size_t errlen, const char *prefix) {
    if (!err || errlen == 0)
        return;
    char *was = ts_dup_str(err);
    if (!was)
        return;
    ts_set_err(err, errlen, "%s%s", prefix, was);
    free(was);
}
