/*
 * auto.h — `[expert] mode = auto`: the node chooses what to serve. Every auto_interval_s on the
 * loop it reads its own view of the network (ts_gossip_status: members and their adverts), picks
 * the partition (the configured one, else the one most live experts advertise), makes sure the
 * partition file is here (fetched from a node that advertises it), asks daemon/assign.h which
 * cluster to serve, and when that changes either fetches the weights most replicas of that
 * cluster serve (daemon/fetcher.h: verified, resumable, bandwidth-limited) and hosts them, or,
 * when no live node serves the cluster, trains it (daemon/host.h), serving every checkpoint.
 *
 * One fetch at a time; a failed fetch is retried at the next choice (from another replica when
 * there is one). Every decision is logged with its reason ("auto: cluster 3 of partition …:
 * uncovered; fetching weights … from …").
 */
#ifndef TS_DAEMON_AUTO_H
#define TS_DAEMON_AUTO_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/host.h"
#include "net/gossip.h"
#include "store/store.h"

typedef struct ts_auto ts_auto_t;

/* Starts choosing (the first choice one interval from now). Everything given must outlive the
 * controller. TS_ENOMEM. */
int ts_auto_start(ts_auto_t **out, uv_loop_t *loop, const ts_daemon_config_t *cfg,
                  ts_gossip_t *gossip, ts_host_t *host, ts_store_t *store,
                  const uint8_t self_id[32]);

/* Stops the timer and a fetch in progress (after its chunk in flight); frees once the handles
 * have closed.
 * NULL-safe. */
void ts_auto_stop(ts_auto_t *a);

#endif
