/*
 * netclient.h — what every networked `tessera` verb (ping, status, and later generate and pull)
 * does before its first request: load the keys, start a loop, a net/conn.h endpoint and an RPC
 * endpoint, and name the peer.
 *
 * A client needs the network key (the Noise psk) to talk to a network at all. It needs no
 * identity of its own: without --identity it makes a fresh one for the run (the handshake still
 * proves who the *peer* is). Every error is printed on stderr as "PROG: sentence".
 */
#ifndef TS_NETCLIENT_H
#define TS_NETCLIENT_H

#include <stdint.h>
#include <uv.h>

#include "net/rpc.h"

typedef struct ts_netclient {
    uv_loop_t loop;
    ts_net_t *net;
    ts_rpc_t *rpc;
    ts_rpc_peer_t *peer; /* the peer named at open */
    const char *addr;
} ts_netclient_t;

/* Opens the client endpoint for peer addr ("host:port"). id_path may be NULL (a fresh identity
 * for this run). timeout_ms bounds connect + handshake. Returns 0, or the exit code to return:
 * 2 for a bad address, 1 for a key file that cannot be used or an endpoint that cannot start
 * (the reason printed). The keys are wiped before it returns. */
int ts_netclient_open(ts_netclient_t *c, const char *prog, const char *addr, const char *id_path,
                      const char *nk_path, uint32_t timeout_ms);

/* Sends req to peer and runs the loop until the answer: *reply is a copy the caller frees with
 * ts_frame_free. TS_OK with the answer (of the kind the request calls for); otherwise the call's
 * status (net/rpc.h: TS_EBUSY, TS_EPEER, TS_ETIMEDOUT, TS_ECLOSED, ...) with the reason in err. */
int ts_netclient_call(ts_netclient_t *c, ts_rpc_peer_t *peer, const Tessera__Envelope *req,
                      uint32_t timeout_ms, Tessera__Envelope **reply, char *err, size_t errlen);

/* Stops everything started by open: runs the loop until the connections have closed, then frees
 * the endpoints and closes the loop. */
void ts_netclient_close(ts_netclient_t *c);

#endif
