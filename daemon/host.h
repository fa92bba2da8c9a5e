/*
 * host.h — what a node offers the network, on the daemon's loop: the weight server (every file in
 * the store, to any node or client), and the expert of `[expert] mode`:
 *
 *   host   the weights and partition of the config are checked and imported (daemon/expert.h),
 *          served (daemon/serve.h: queue, batcher, compute thread) and advertised by gossip;
 *   train  the training job (daemon/train_job.h) runs on its own thread, resuming its run from the
 *          store; with serve_while_training every checkpoint's EMA weights are served and
 *          advertised (with the training status) as soon as they are published; at the end the
 *          final weights are, as in host mode.
 *
 * Switching the served weights (a new snapshot) shuts the current server down — its batch in
 * progress finishes and is answered — and starts the next once it is gone; requests that arrive
 * in between are answered ERROR_UNSUPPORTED by the RPC layer (a client retries on a replica).
 *
 * The advert carries capacity (samples per second from the measured per-row latency, the most
 * samples a request may carry, the queue limit) and load (queue depth, per-row latency, request
 * rate); it is signed again when the load has moved materially, at most every 10 s.
 */
#ifndef TS_DAEMON_HOST_H
#define TS_DAEMON_HOST_H

#include <uv.h>

#include "daemon/config.h"
#include "daemon/metrics.h"
#include "net/gossip.h"
#include "net/rpc.h"
#include "proto/tessera.pb-c.h"
#include "store/store.h"
#include "store/weights.h"

typedef struct ts_host ts_host_t;

typedef struct ts_host_env {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    ts_gossip_t *gossip;
    ts_store_t *store;
    ts_metrics_t *metrics; /* may be NULL */
    const ts_daemon_config_t *cfg;
    const ts_identity_t *identity; /* signs the served answers; NULL: unsigned */
} ts_host_env_t;

/* Starts the weight server and the configured expert (hosting or training). Everything that bad
 * configuration or files can break fails here, with a sentence: then *out is NULL when nothing
 * was started, or a host to stop and free as usual. Everything in env must outlive the host. */
int ts_host_new(ts_host_t **out, const ts_host_env_t *env, char *err, size_t errlen);

/* Auto mode (daemon/auto.h). The cluster served or trained now (−1: none). */
int ts_host_cluster(const ts_host_t *h);
/* The partition file of that cluster ("" when none). */
const char *ts_host_partition(const ts_host_t *h);
/* Serves the weights w (in the store) of cluster of partition (a file) from now on, ending a
 * training job if one runs; the switch happens as for a new snapshot. TS_EINVAL. */
int ts_host_serve_expert(ts_host_t *h, const char *partition, int cluster, const ts_hash_t *w);
/* Trains cluster of partition as [train] says (serving each checkpoint), ending a training job
 * that runs; the server of the previous expert goes on until the first checkpoint replaces it.
 * The job's error, with a sentence. */
int ts_host_train_expert(ts_host_t *h, const char *partition, int cluster, char *err,
                         size_t errlen);
/* The model preset the next training job uses instead of [train] model (auto mode: the one the
 * network's experts of the partition use); NULL: [train] model again. */
void ts_host_set_train_model(ts_host_t *h, const char *preset);

/* Our load, for the status answer (ts_gossip_load_fn). */
void ts_host_load(void *host, Tessera__Load *load);

/* Copies the servers' and the job's counters into the metrics (call on the loop, e.g. every
 * second). */
void ts_host_metrics(ts_host_t *h);

/* Stops: the training job checkpoints and ends (waiting up to 30 s for its step), the servers
 * answer what is queued ERROR_UNAVAILABLE and finish their batch in progress; done runs once
 * everything has stopped. Idempotent. */
void ts_host_stop(ts_host_t *h, void (*done)(void *arg), void *arg);

/* Frees a stopped host (after done ran, or, for one whose start failed, once the loop has closed
 * its handles and run out). NULL-safe. */
void ts_host_free(ts_host_t *h);

#endif
