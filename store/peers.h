/*
 * peers.h — the address book: the peers a node has seen (the `peers` database, architecture.md §8).
 *
 * One entry per node id (32 bytes, the key): up to TS_PEER_MAX_ADDRS addresses "host:port"
 * (each 1..TS_PEER_ADDR_MAX bytes; host may be a name, an IPv4 address or a bracketed IPv6
 * address, port 1..65535), when it was last seen (unix seconds) and flags whose meaning belongs to
 * the layers above. Used by the network layer to reconnect after a restart.
 *
 * The value's encoding is versioned and length-checked (see peers.c); an entry that does not
 * decode is TS_ECORRUPT — never a crash, never a half-filled struct.
 */
#ifndef TS_PEERS_H
#define TS_PEERS_H

#include <stddef.h>
#include <stdint.h>

#include "store/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_PEER_ID_LEN 32
#define TS_PEER_MAX_ADDRS 8
#define TS_PEER_ADDR_MAX 255
/* the largest encoded entry: header + every address at full length */
#define TS_PEER_ENCODED_MAX (14 + TS_PEER_MAX_ADDRS * (1 + TS_PEER_ADDR_MAX))

typedef struct ts_peer {
    uint8_t id[TS_PEER_ID_LEN];
    int n_addrs;                                         /* 0..TS_PEER_MAX_ADDRS */
    char addrs[TS_PEER_MAX_ADDRS][TS_PEER_ADDR_MAX + 1]; /* NUL-terminated */
    int64_t last_seen;                                   /* unix seconds */
    uint32_t flags;
} ts_peer_t;

/* 1 when a[0..len) is an address the book can hold, "host:port": printable ASCII without
 * spaces, at most TS_PEER_ADDR_MAX bytes; host a name or an IPv4 address (no ':'), or an IPv6
 * address in brackets; port 1..65535 in decimal (0 too when allow_port0: "any free port", for a
 * listen address). The one rule for addresses everywhere: configs, the wire, the book. */
int ts_addr_valid(const char *a, size_t len, int allow_port0);

/* Encodes p into buf (at least TS_PEER_ENCODED_MAX bytes); *len is the encoded size.
 * TS_EINVAL when p does not hold a valid entry (too many addresses, an empty, over-long or
 * malformed "host:port"). */
int ts_peer_encode(const ts_peer_t *p, unsigned char *buf, size_t *len);
/* Decodes an entry of the node id; TS_ECORRUPT for anything but a well-formed encoding that
 * ends exactly at len. *p is written only on success. */
int ts_peer_decode(const uint8_t id[TS_PEER_ID_LEN], const unsigned char *buf, size_t len,
                   ts_peer_t *p);

/* Adds or replaces the entry of p->id. */
int ts_peers_put(ts_store_t *s, const ts_peer_t *p);
/* TS_ENOTFOUND when the node is not in the book, TS_ECORRUPT when its entry does not decode. */
int ts_peers_get(ts_store_t *s, const uint8_t id[TS_PEER_ID_LEN], ts_peer_t *p);
/* TS_ENOTFOUND when the node is not in the book. */
int ts_peers_del(ts_store_t *s, const uint8_t id[TS_PEER_ID_LEN]);

/* Called for each entry in node id order; p is only valid during the call. A return other than
 * TS_OK stops the walk and is returned by ts_peers_list. */
typedef int (*ts_peers_each_fn)(void *ctx, const ts_peer_t *p);
/* Walks the book; an entry that does not decode (or a key that is not 32 bytes) stops it with
 * TS_ECORRUPT. */
int ts_peers_list(ts_store_t *s, ts_peers_each_fn fn, void *ctx);

/* Deletes the entries last seen before older_than (unix seconds), and entries that do not
 * decode; *removed (may be NULL) is how many. */
int ts_peers_prune(ts_store_t *s, int64_t older_than, int *removed);

#ifdef __cplusplus
}
#endif

#endif
