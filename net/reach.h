/*
 * reach.h — is this node reachable at the address it advertises? (docs/protocol.md
 * "Reachability"). A node behind a home router (NAT) or a firewall can dial out — it joins,
 * gossips, fetches — but nobody can dial it: its advert would send clients to an address that
 * does not answer. So a node asks a peer to dial it back: the peer opens a new link to the
 * advertised address, finishes the Noise handshake there, and answers whether the node that
 * proved its identity is the one that asked (anything else — a refused or timed-out connection,
 * another node at that address — is "not reachable", with the reason).
 *
 * Both sides run on the RPC endpoint's loop.
 */
#ifndef TS_NET_REACH_H
#define TS_NET_REACH_H

#include "net/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_reach ts_reach_t;

/* Answers dial_back_request on rpc from now on: one dial per address and at most 8 at once
 * (others are answered ERROR_UNAVAILABLE, as is this node's own trouble — out of memory,
 * shutting down — which says nothing about the asker). The address is dialled as given: any
 * holder of the network key can make a node dial an address (bounded as above). *out: free
 * with ts_reach_free after ts_rpc_free (every dial has answered by then). */
int ts_reach_serve(ts_rpc_t *rpc, ts_reach_t **out);
void ts_reach_free(ts_reach_t *r);

/* The outcome of a check: reachable 1 or 0, or −1 when the checker could not be asked (then
 * message says why: a refused connection, a timeout, an error answer). */
typedef void (*ts_reach_cb)(void *arg, int reachable, const char *message);

/* Asks the node at checker ("host:port") to dial this node back at self ("host:port", what it
 * advertises). cb runs exactly once, on the loop, unless the call cannot start: then TS_EINVAL
 * (a bad address, with a sentence), TS_EBUSY, TS_ECLOSED or TS_ENOMEM and no callback. */
int ts_reach_check(ts_rpc_t *rpc, const char *checker, const char *self, uint32_t timeout_ms,
                   ts_reach_cb cb, void *arg, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
