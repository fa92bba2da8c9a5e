/*
 * relay.h — carrying a node nobody can dial (docs/protocol.md "Relays", architecture.md
 * "Relays"). A node behind a home router (NAT) can dial out but cannot be dialled. It keeps a
 * link open to a relay — any reachable node that allows it — and the relay opens an address of
 * its own for it (a TCP listener and a UDP socket on one port): the node then claims that
 * address in gossip, and whoever dials it reaches the node through the relay.
 *
 *   node N (behind NAT)          relay R                            dialer D
 *     │ relay_reserve ─────────►  opens R:p (TCP + UDP)
 *     │ ◄──── relay_event{addr = R:p}                               (N claims R:p)
 *     │                           ◄──────── TCP connect to R:p, Noise message 1 ─── D
 *     │ ◄──── relay_event{circuit = token}   (D's bytes held)
 *     │ TCP connect to R:p, "TSR1" ‖ token ─►  pairs the two sockets, splices them
 *     │ ◄════════ D's Noise handshake and frames, end to end, N the responder ════════ D
 *     │ ◄──── relay_event{datagram, from}  ◄─── a gossip datagram sent to R:p (UDP)
 *
 * The relay never terminates the dialer's session: it copies bytes between two sockets, so the
 * Noise session is end to end — the relay can neither read it nor, since the dialer checks the
 * node id the handshake proves (ts_rpc_peer_expect), answer in the node's place. The token
 * pairing a connect-back with its dialer travels only on N's own encrypted link. Gossip
 * datagrams are sealed with the network key, as any member's are; the relay forwards them
 * unopened. N's own datagrams go out directly (its router lets answers back in).
 *
 * Both sides run on the RPC endpoint's loop thread.
 */
#ifndef TS_NET_RELAY_H
#define TS_NET_RELAY_H

#include <stdint.h>

#include "net/frame.h"
#include "net/rpc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The preamble of a connect-back: these 4 bytes, then the circuit's token. */
#define TS_RELAY_MAGIC "TSR1"
#define TS_RELAY_PREAMBLE (4 + TS_FRAME_CIRCUIT_BYTES)

/* ---- the relay ------------------------------------------------------------------------------- */

typedef struct ts_relay ts_relay_t;

typedef struct ts_relay_config {
    uint32_t max_reservations; /* nodes carried at once; default 32 */
    uint32_t max_circuits;     /* per node, connections spliced or waiting; default 32 */
    uint32_t datagrams_per_s;  /* per node, gossip datagrams forwarded (burst the same); 200 */
    uint64_t bytes_per_s;      /* per node, spliced bytes both ways; default 8 MiB/s; 0: no cap */
    uint32_t circuit_wait_ms;  /* a dialer waits this long for the node's connect-back; 10000 */
    const char *bind_host;     /* where reservations listen (numeric); default "0.0.0.0" */
    const char *public_host;   /* the host in the addresses handed out (the relay's advertised
                                * host); required */
} ts_relay_config_t;

void ts_relay_config_default(ts_relay_config_t *cfg);

typedef struct ts_relay_stats {
    uint32_t reservations;                /* held now */
    uint32_t circuits;                    /* spliced now */
    uint64_t reservations_total, refused; /* granted; refused (full, closing, no port) */
    uint64_t circuits_total;              /* spliced */
    uint64_t circuits_failed; /* dialers never paired (no connect-back in time, over the cap) */
    uint64_t bytes;           /* spliced, both ways */
    uint64_t datagrams, datagrams_dropped; /* forwarded; dropped (rate, congestion) */
} ts_relay_stats_t;

/* Serves relay_reserve on rpc. TS_EINVAL (no public_host; err says), TS_ENOMEM. */
int ts_relay_serve(ts_rpc_t *rpc, const ts_relay_config_t *cfg, ts_relay_t **out, char *err,
                   size_t errlen);
void ts_relay_stats(const ts_relay_t *r, ts_relay_stats_t *st);
/* Ends every reservation (each answered relay_ended, its sockets closed) and stops serving.
 * Run the loop until the handles are closed, then ts_relay_free. */
void ts_relay_close(ts_relay_t *r);
/* TS_EBUSY while sockets are still closing. NULL-safe. */
int ts_relay_free(ts_relay_t *r);

/* ---- the node carried ------------------------------------------------------------------------ */

typedef struct ts_relay_client ts_relay_client_t;

typedef struct ts_relay_client_cbs {
    /* The reservation is live at addr (what to claim), through relay (its node id); or, with
     * addr NULL, it ended or could not be made (message says why). */
    void (*on_state)(void *arg, const char *addr, const ts_node_id_t *relay, const char *message);
    /* A gossip datagram sent to our relayed address, from its sender's address. */
    void (*on_datagram)(void *arg, const struct sockaddr *from, const uint8_t *data, size_t len);
    void *arg;
} ts_relay_client_cbs_t;

typedef struct ts_relay_client_stats {
    uint64_t circuits;        /* connect-backs started */
    uint64_t circuits_failed; /* that could not start */
    uint64_t datagrams;       /* datagrams received through the relay */
    uint64_t events_ignored;  /* relay events from a node we hold no reservation with */
} ts_relay_client_stats_t;

/* A client on rpc; it takes rpc's relay_event handler. TS_ENOMEM. */
int ts_relay_client_new(ts_rpc_t *rpc, const ts_relay_client_cbs_t *cbs, ts_relay_client_t **out);
/* Reserves at the relay at addr ("host:port"), ending a reservation held elsewhere; relay_id
 * (may be NULL) is the node the relay must prove. on_state follows. TS_EINVAL (bad address, with
 * a sentence), TS_ECLOSED, TS_ENOMEM. */
int ts_relay_client_reserve(ts_relay_client_t *c, const char *addr, const ts_node_id_t *relay_id,
                            char *err, size_t errlen);
/* 1 while a reservation is live (its address announced), 0 while asking or with none. */
int ts_relay_client_live(const ts_relay_client_t *c);
/* 1 while a reservation is asked for or live. */
int ts_relay_client_busy(const ts_relay_client_t *c);
/* The relay's address as this node dials it ("" with none). */
const char *ts_relay_client_relay(const ts_relay_client_t *c);
void ts_relay_client_stats(const ts_relay_client_t *c, ts_relay_client_stats_t *st);
/* Ends the reservation (no on_state follows). */
void ts_relay_client_stop(ts_relay_client_t *c);
/* Stops and frees; call before ts_rpc_free. NULL-safe. */
void ts_relay_client_free(ts_relay_client_t *c);

#ifdef __cplusplus
}
#endif

#endif
