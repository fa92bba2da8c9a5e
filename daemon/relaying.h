/*
 * relaying.h — tesserad's relays ([relay]; net/relay.h for the protocol): serving as one
 * (serve = true), and being carried by one — when the reachability check finds this node cannot
 * be dialled (use = true), or always through a named relay (via). Every change is one log line
 * ("relay: ..."), and /metrics has tessera_relayed and the relay's own counters.
 *
 * Choosing a relay: the configured one, else the live members in turn (one attempt at a time;
 * a member that does not serve relays answers ERROR_UNSUPPORTED at once). A reservation not
 * live within 15 s is given up for the next candidate; a lost one is replaced at the next tick
 * (5 s). A node carried that becomes reachable (a port forwarded) releases its relay.
 */
#ifndef TS_DAEMON_RELAYING_H
#define TS_DAEMON_RELAYING_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "net/gossip.h"
#include "net/rpc.h"

typedef struct ts_relaying ts_relaying_t;

/* Starts what cfg asks for; advertise and listen are the node's addresses (the relay hands out
 * advertise's host, and listens on listen's). Everything given must outlive it. TS_EINVAL with
 * a sentence, TS_ENOMEM. */
int ts_relaying_start(ts_relaying_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                      ts_rpc_t *rpc, ts_gossip_t *gossip, const char *listen, const char *advertise,
                      const uint8_t self_id[32], char *err, size_t errlen);
/* What the reachability check found: 1, 0, −1 not known. */
void ts_relaying_reachable(ts_relaying_t *r, int reachable);
/* Its gauges and counters into m (once a second, on the loop). */
void ts_relaying_metrics(ts_relaying_t *r, ts_metrics_t *m);
/* The node is leaving the network: the reservation held goes on carrying its leave, but one that
 * ends is not replaced, nor is its end worth a warning (the relay may be leaving too). */
void ts_relaying_leaving(ts_relaying_t *r);
/* Ends the reservation held and every one carried; stops the timer. Before ts_rpc_shutdown. */
void ts_relaying_close(ts_relaying_t *r);
/* After the loop has closed everything. NULL-safe. */
void ts_relaying_free(ts_relaying_t *r);

#endif
