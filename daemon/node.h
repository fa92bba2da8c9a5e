/*
 * node.h — a whole tessera node on one libuv loop: what tesserad runs, as a library, so that a
 * test starts one (or several, on one loop) without a process. tesserad (daemon/main.c) is this
 * with a configuration file, the keys, the signals and the loop around it.
 *
 * What a node runs: the secure listener (net/rpc.h) and gossip (net/gossip.h), dial-back answers
 * and its own reachability checks (net/reach.h), relays (daemon/relaying.h), the weight server and
 * the expert, hosted or trained (daemon/host.h), `[expert] mode = auto` (daemon/auto.h), the judge
 * of accusations (daemon/trust.h), the metrics registry and its HTTP endpoint
 * (daemon/metrics_http.h), and two ticks on the loop: every second the loop-only counters are
 * copied into the metrics, the health (daemon/health.h: alone, refused) is published to /healthz
 * and to status answers, and the status page's status.json is rebuilt while someone reads it.
 *
 * Stopping is graceful: the expert stops (a training job checkpoints, queued requests are
 * answered), the node leaves the network (a signed leave), then gossip and every connection close.
 * The loop runs out once every node on it has stopped; only then is a node freed.
 */
#ifndef TS_DAEMON_NODE_H
#define TS_DAEMON_NODE_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "net/gossip.h"
#include "net/keys.h"
#include "store/store.h"

typedef struct ts_node ts_node_t;

/* Starts a node on loop: listens on cfg->listen (port 0: one the system picks), joins through
 * cfg->bootstrap, starts the expert of cfg->expert_mode, writes DATA_DIR/listen.addr (and
 * metrics.url), and logs its start-up lines (version names the build). cfg, id, nk and store must
 * outlive the node. On failure *out is NULL, err says why, and every handle the node opened is
 * closed — by closing every handle on the loop and running it: start a node that can fail on a
 * loop of its own. */
int ts_node_start(ts_node_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                  const ts_identity_t *id, const ts_netkey_t *nk, ts_store_t *store,
                  const char *version, char *err, size_t errlen);

/* The address it listens on ("host:port", the port bound), the one it advertises, and its
 * metrics URL ("" when [metrics] listen is empty). Valid while the node lives. */
const char *ts_node_listen(const ts_node_t *n);
const char *ts_node_advertise(const ts_node_t *n);
const char *ts_node_metrics_url(const ts_node_t *n);

/* Its gossip (for the membership and adverts it sees: ts_gossip_status) and metrics registry.
 * Read on the loop's thread only. */
ts_gossip_t *ts_node_gossip(ts_node_t *n);
ts_metrics_t *ts_node_metrics(ts_node_t *n);

/* /healthz's answer, callable from any thread: 1 healthy, else 0 with the reason ("starting",
 * "stopping", or the health's, e.g. "alone: ..."). */
int ts_node_health(ts_node_t *n, char *reason, size_t len);

/* Stops gracefully (above); done(arg) runs on the loop once gossip has closed and the node's
 * handles are closing, so that the caller may close its own. A second call does nothing. */
void ts_node_stop(ts_node_t *n, void (*done)(void *arg), void *arg);
/* Whether ts_node_stop was called. */
int ts_node_stopping(const ts_node_t *n);

/* Frees a node once the loop has run out (every node on it stopped); it closes and runs out any
 * handle still open on the loop first. The loop itself is the caller's. NULL-safe. */
void ts_node_free(ts_node_t *n);

#endif
