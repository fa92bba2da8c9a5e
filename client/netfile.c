/* netfile.c — the network file (netfile.h): parsed, read and written. */
#define _XOPEN_SOURCE 700 /* strtok_r, fchmod, O_NOFOLLOW */

#include "client/netfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sodium.h>
#include <unistd.h>

#include "base/error.h"
#include "base/file.h"
#include "base/str.h"
#include "net/conn.h"
#include "net/keys.h"

/* errno's words into eb (which holds 128 bytes). */
static const char *etext(int e, char *eb) {
    ts_errno_text(e, eb, 128);
    return eb;
}

/* Creates path with mode 0600 (never overwriting) and writes text. */
static int write_secret(const char *path, const char *text, char *err, size_t errlen) {
    char eb[128];
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        ts_set_err(err, errlen, "%s: %s", path,
                   errno == EEXIST ? "exists (a secret file is never overwritten)"
                                   : etext(errno, eb));
        return errno == EEXIST ? TS_EEXIST : TS_EIO;
    }
    size_t len = strlen(text);
    int ok = fchmod(fd, 0600) == 0 && write(fd, text, len) == (ssize_t)len && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) {
        unlink(path);
        ts_set_err(err, errlen, "%s: cannot write it: %s", path, etext(e, eb));
        return TS_EIO;
    }
    return TS_OK;
}

int ts_netfile_add_bootstrap(ts_netfile_t *nf, const char *addr, char *err, size_t errlen) {
    char host[TS_NETFILE_ADDR_MAX];
    int port;
    if (nf->n >= TS_NETFILE_MAX_BOOTSTRAP) {
        ts_set_err(err, errlen, "more than %d bootstrap addresses", TS_NETFILE_MAX_BOOTSTRAP);
        return TS_EINVAL;
    }
    if (strlen(addr) >= TS_NETFILE_ADDR_MAX ||
        ts_net_parse_addr(addr, host, sizeof host, &port, 0, err, errlen) != TS_OK) {
        if (!*err)
            ts_set_err(err, errlen, "'%s' is not host:port", addr);
        return TS_EINVAL;
    }
    snprintf(nf->bootstrap[nf->n++], TS_NETFILE_ADDR_MAX, "%s", addr);
    return TS_OK;
}

static int nibble(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* Parses the network file's text. The key is wiped by the caller (ts_netkey_wipe). */
static int netfile_parse(ts_netfile_t *nf, char *text, const char *path, char *err, size_t errlen) {
    memset(nf, 0, sizeof *nf);
    int line = 0, have_key = 0, have_magic = 0;
    for (char *save = NULL, *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        line++;
        while (*l == ' ' || *l == '\t')
            l++;
        size_t n = strlen(l);
        while (n && (l[n - 1] == '\r' || l[n - 1] == ' ' || l[n - 1] == '\t'))
            l[--n] = '\0';
        if (!*l || *l == '#')
            continue;
        if (!have_magic) {
            if (strcmp(l, "tessera-network 1") != 0) {
                ts_set_err(err, errlen,
                           "%s:%d: not a tessera network file (want the line "
                           "'tessera-network 1' first)",
                           path, line);
                return TS_ECORRUPT;
            }
            have_magic = 1;
        } else if (strncmp(l, "key ", 4) == 0) {
            const char *hex = l + 4;
            if (strlen(hex) != 2 * TS_NETKEY_BYTES) {
                ts_set_err(err, errlen, "%s:%d: the key must be %d hex digits", path, line,
                           2 * TS_NETKEY_BYTES);
                return TS_ECORRUPT;
            }
            for (int i = 0; i < TS_NETKEY_BYTES; i++) {
                int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
                if (hi < 0 || lo < 0) {
                    ts_set_err(err, errlen, "%s:%d: the key is not hex", path, line);
                    return TS_ECORRUPT;
                }
                nf->key.k[i] = (uint8_t)(hi << 4 | lo);
            }
            have_key = 1;
        } else if (strncmp(l, "bootstrap ", 10) == 0) {
            char sub[256] = "";
            if (ts_netfile_add_bootstrap(nf, l + 10, sub, sizeof sub) != TS_OK) {
                ts_set_err(err, errlen, "%s:%d: %s", path, line, sub);
                return TS_ECORRUPT;
            }
        } else {
            ts_set_err(err, errlen, "%s:%d: unknown line (want key or bootstrap)", path, line);
            return TS_ECORRUPT;
        }
    }
    if (!have_magic || !have_key || nf->n == 0) {
        ts_set_err(err, errlen, "%s: %s", path,
                   !have_magic ? "empty: not a tessera network file"
                   : !have_key ? "no key line"
                               : "no bootstrap address (nobody to join through)");
        return TS_ECORRUPT;
    }
    return TS_OK;
}

int ts_netfile_read(ts_netfile_t *nf, const char *path, char *err, size_t errlen) {
    char eb[128];
    FILE *f = fopen(path, "rb");
    if (!f) {
        ts_set_err(err, errlen, "%s: %s", path, etext(errno, eb));
        return errno == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    char *text = calloc(1, 65537);
    size_t n = text ? fread(text, 1, 65536, f) : 0;
    int big = text && !feof(f);
    fclose(f);
    if (!text)
        return TS_ENOMEM;
    int rc = TS_OK;
    if (big) {
        ts_set_err(err, errlen, "%s: over 64 KiB: not a tessera network file", path);
        rc = TS_ECORRUPT;
    } else {
        text[n] = '\0';
        rc = netfile_parse(nf, text, path, err, errlen);
    }
    sodium_memzero(text, 65537);
    free(text);
    return rc;
}

/* Writes the network file: the header, the key, one bootstrap line per address (mode 0600). */
int ts_netfile_write(const ts_netfile_t *nf, const char *out, char *err, size_t errlen) {
    size_t cap = 256 + (size_t)nf->n * (TS_NETFILE_ADDR_MAX + 16);
    char *text = calloc(1, cap), hex[2 * TS_NETKEY_BYTES + 1];
    if (!text)
        return TS_ENOMEM;
    ts_hex(nf->key.k, TS_NETKEY_BYTES, hex);
    size_t n = (size_t)snprintf(text, cap,
                                "tessera-network 1\n# a tessera network: share this file only "
                                "with people you let in\nkey %s\n",
                                hex);
    sodium_memzero(hex, sizeof hex);
    for (int i = 0; i < nf->n; i++)
        n += (size_t)snprintf(text + n, cap - n, "bootstrap %s\n", nf->bootstrap[i]);
    int rc = write_secret(out, text, err, errlen);
    sodium_memzero(text, cap);
    free(text);
    return rc;
}
