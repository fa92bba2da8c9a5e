/*
 * netfile.h — a network as one file: what a volunteer needs to join it and nothing else, the
 * network key and the addresses to join through. `tessera network export` writes it,
 * `tessera join` reads it (docs/operations.md, "Joining a network"). It is a secret (whoever
 * holds it is inside the network): it is written with mode 0600 and never overwritten, and
 * shared only with people let in. Its format, one item per line, '#' comments:
 *
 *   tessera-network 1
 *   key <64 hex digits: the network key>
 *   bootstrap <host:port>          (one line each, at least one)
 */
#ifndef TS_CLIENT_NETFILE_H
#define TS_CLIENT_NETFILE_H

#include <stddef.h>

#include "net/keys.h"

#define TS_NETFILE_MAX_BOOTSTRAP 64
#define TS_NETFILE_ADDR_MAX 256

typedef struct ts_netfile {
    ts_netkey_t key;
    int n;
    char bootstrap[TS_NETFILE_MAX_BOOTSTRAP][TS_NETFILE_ADDR_MAX];
} ts_netfile_t;

/* Adds addr (host:port) to the bootstrap addresses. */
int ts_netfile_add_bootstrap(ts_netfile_t *nf, const char *addr, char *err, size_t errlen);
/* Reads and parses the network file at path. The key is wiped by the caller (ts_netkey_wipe),
 * also after an error: a key line may have been read before it. */
int ts_netfile_read(ts_netfile_t *nf, const char *path, char *err, size_t errlen);
/* Writes the network file: the header, the key, one bootstrap line per address (mode 0600, never
 * overwriting). */
int ts_netfile_write(const ts_netfile_t *nf, const char *out, char *err, size_t errlen);

#endif
