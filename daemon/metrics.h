/*
 * metrics.h — the daemon's metrics: a registry of counters, gauges and histograms that any
 * thread may update, and a writer of the Prometheus text exposition format (version 0.0.4) that
 * daemon/metrics_http.h serves on /metrics.
 *
 * A registry holds families (one metric name, its help, its type, at most one label name) and,
 * in each family, series (one per label value; a family without a label has exactly one).
 * Families are registered once, before the registry is shared: registration validates every name
 * (and fails on a typo or a clash) so the output is valid by construction. Updates go through
 * the family's id and a label value:
 *
 *     ts_metrics_counter_add(m, TS_M_REQUESTS, "denoise", 1);
 *     ts_metrics_observe(m, TS_M_COMPUTE_SECONDS, NULL, 0.012);
 *     ts_metrics_gauge_set(m, TS_M_GOSSIP_MEMBERS, "alive", 8);
 *
 * Updates are lock-free (C11 atomics) and allocate nothing, so the compute thread, the event
 * loop and the HTTP thread can share one registry. The first use of a new label value takes a
 * mutex once to copy it into the family; later uses find it with a scan of the published values.
 * A family holds at most TS_METRICS_MAX_SERIES label values: labels are for small fixed sets
 * (request types, member states), never for ids or addresses.
 *
 * Consistency: each number is read atomically, but a scrape is not one snapshot. A histogram's
 * _count is the sum of the bucket counts the writer read, so buckets are always cumulative and
 * monotone and the +Inf bucket always equals _count; _sum may lag or lead by the observations in
 * flight.
 *
 * The daemon's own set of families is created by ts_metrics_create_daemon with ids equal to the
 * ts_metric_id_t values below; docs/operations.md explains each one.
 */
#ifndef TS_DAEMON_METRICS_H
#define TS_DAEMON_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#define TS_METRICS_MAX_FAMILIES 64
#define TS_METRICS_MAX_SERIES 16  /* label values per family */
#define TS_METRICS_MAX_BUCKETS 32 /* finite bucket bounds per histogram (+Inf is implicit) */
#define TS_METRICS_LABEL_MAX 64   /* bytes of a label value, with its NUL */

typedef struct ts_metrics ts_metrics_t;

typedef enum {
    TS_METRIC_COUNTER = 0, /* only goes up (restarts at 0 with the process); name ends in _total */
    TS_METRIC_GAUGE,       /* a value that is set */
    TS_METRIC_HISTOGRAM,   /* observations counted in fixed buckets, with their sum */
} ts_metric_type_t;

typedef struct ts_metric_spec {
    const char *name; /* [a-zA-Z_:][a-zA-Z0-9_:]*; counters end in _total */
    const char *help; /* one line for # HELP (escaped on output) */
    ts_metric_type_t type;
    const char *label; /* the label's name ([a-zA-Z_][a-zA-Z0-9_]*, not __*, not le), or NULL */
    /* Label values shown (at 0) from the start, NULL-terminated; NULL for none. Other values are
     * added on first use. Must be NULL when label is. */
    const char *const *values;
    const double *buckets; /* histograms: finite upper bounds, strictly increasing */
    int n_buckets;         /* 1..TS_METRICS_MAX_BUCKETS for a histogram, 0 otherwise */
} ts_metric_spec_t;

/* An empty registry. *out is owned by the caller: ts_metrics_free. */
int ts_metrics_create(ts_metrics_t **out);
void ts_metrics_free(ts_metrics_t *m);

/* Adds a family; *id (may be NULL) receives its id, the next one in registration order from 0.
 * TS_EINVAL with a sentence naming the metric for a bad name, label, value or bucket list, a
 * counter not ending in _total, or a name already taken (a histogram also takes its _bucket,
 * _sum and _count names); TS_ERANGE past TS_METRICS_MAX_FAMILIES. spec's strings are copied. */
int ts_metrics_register(ts_metrics_t *m, const ts_metric_spec_t *spec, int *id, char *err,
                        size_t errlen);

/* A function run at the start of every ts_metrics_write, on the writer's thread, to refresh
 * gauges that are read rather than pushed (the daemon's: resident memory). At most 4. */
typedef void (*ts_metrics_collect_fn)(ts_metrics_t *m, void *user);
int ts_metrics_add_collector(ts_metrics_t *m, ts_metrics_collect_fn fn, void *user);

/*
 * Updates, from any thread. label is the label value: NULL for a family without a label,
 * non-NULL (valid UTF-8, shorter than TS_METRICS_LABEL_MAX) for one with. They return TS_OK;
 * TS_EINVAL for an unknown id, an update of the wrong type, or a bad label value; TS_ERANGE when
 * the family already holds TS_METRICS_MAX_SERIES other values (the update is dropped). Callers
 * on hot paths may ignore the result: the tests hold the daemon's call sites to TS_OK.
 */
int ts_metrics_counter_add(ts_metrics_t *m, int id, const char *label, uint64_t n);
/* Sets a counter to a cumulative total counted elsewhere (a module's own stats struct, mirrored
 * periodically). The caller keeps it monotone. */
int ts_metrics_counter_set(ts_metrics_t *m, int id, const char *label, uint64_t total);
int ts_metrics_gauge_set(ts_metrics_t *m, int id, const char *label, double v);
int ts_metrics_gauge_add(ts_metrics_t *m, int id, const char *label, double delta);
/* Counts v in the first bucket whose bound is >= v (+Inf past the last) and adds it to the sum.
 * NaN is refused (TS_EINVAL): it would poison the sum for the life of the process. */
int ts_metrics_observe(ts_metrics_t *m, int id, const char *label, double v);

/* Reads one series back (tests, and the status answer's load figures). A counter or gauge gives
 * its value, a histogram its count. TS_ENOTFOUND when that label value was never used. */
int ts_metrics_get(ts_metrics_t *m, int id, const char *label, double *out);

/* The q-quantile (0 ≤ q ≤ 1) of a histogram series, estimated as Prometheus's
 * histogram_quantile does: the bucket holding rank q·count, linear between its bounds (the first
 * bucket from 0); a rank in the +Inf bucket answers the highest finite bound. *count (may be
 * NULL) gets the observations. TS_ENOTFOUND when the series has none; TS_EINVAL for a metric
 * that is not a histogram or q outside [0, 1]. */
int ts_metrics_quantile(ts_metrics_t *m, int id, const char *label, double q, double *out,
                        uint64_t *count);

/* The whole registry in the text exposition format 0.0.4: families in registration order, each
 * as # HELP, # TYPE, then its series in label-value order of first use. *out is a NUL-terminated
 * malloc'd buffer the caller frees; *len its length. TS_ENOMEM. */
int ts_metrics_write(ts_metrics_t *m, char **out, size_t *len);

/* ---- the daemon's metrics ------------------------------------------------------------------ */

/* Every family tesserad exports, in registration order (so each is its own id). Names, labels
 * and buckets are in metrics.c's table; docs/operations.md says what each one means. */
typedef enum {
    TS_M_BUILD_INFO = 0,       /* tessera_build_info{version} = 1 */
    TS_M_START_TIME,           /* process_start_time_seconds */
    TS_M_RESIDENT_MEMORY,      /* process_resident_memory_bytes (collected at each scrape) */
    TS_M_REQUESTS,             /* tessera_requests_total{type} */
    TS_M_REQUEST_ERRORS,       /* tessera_request_errors_total{type} */
    TS_M_BUSY,                 /* tessera_busy_total: requests refused over the queue limit */
    TS_M_DEADLINE_DROPS,       /* tessera_deadline_dropped_total: expired before compute */
    TS_M_QUEUE_DEPTH,          /* tessera_queue_depth: requests waiting now */
    TS_M_BATCH_SIZE,           /* tessera_batch_size: samples per computed batch */
    TS_M_QUEUE_WAIT_SECONDS,   /* tessera_queue_wait_seconds: enqueue to start of compute */
    TS_M_COMPUTE_SECONDS,      /* tessera_compute_seconds: one batch on the device */
    TS_M_DENOISE_STEPS,        /* tessera_denoise_steps_total: expert evaluations (batches) */
    TS_M_DENOISE_SAMPLES,      /* tessera_denoise_samples_total: samples evaluated */
    TS_M_TRAIN_STEP,           /* tessera_train_step: the optimiser step reached */
    TS_M_TRAIN_LOSS,           /* tessera_train_loss: the last step's loss */
    TS_M_TRAIN_SAMPLES,        /* tessera_train_samples_total */
    TS_M_GOSSIP_MEMBERS,       /* tessera_gossip_members{state} */
    TS_M_NET_RECEIVED_BYTES,   /* tessera_net_received_bytes_total{transport} */
    TS_M_NET_SENT_BYTES,       /* tessera_net_sent_bytes_total{transport} */
    TS_M_HANDSHAKE_FAILURES,   /* tessera_handshake_failures_total{reason} */
    TS_M_CONNECTIONS,          /* tessera_connections: open TCP connections */
    TS_M_REQUESTS_BUSY,        /* tessera_requests_busy_total{type}: answered Busy */
    TS_M_CONN_CLOSES,          /* tessera_connection_closes_total{reason} */
    TS_M_CONN_REFUSED,         /* tessera_connections_refused_total: over the connection limits */
    TS_M_DEVICE_MEMORY,        /* tessera_device_memory_bytes{kind}: a GPU server's total, used */
    TS_M_REACHABLE,            /* tessera_reachable: 1, 0, −1 not known yet (net/reach.h) */
    TS_M_RELAYED,              /* tessera_relayed: 1 while reached through a relay (net/relay.h) */
    TS_M_RELAY_NODES,          /* tessera_relay_nodes: nodes this relay carries now */
    TS_M_RELAY_CIRCUITS,       /* tessera_relay_circuits: connections it splices now */
    TS_M_RELAY_CIRCUITS_TOTAL, /* tessera_relay_circuits_total{outcome}: spliced, failed */
    TS_M_RELAY_BYTES,          /* tessera_relay_bytes_total: spliced bytes, both ways */
    TS_M_RELAY_DATAGRAMS,      /* tessera_relay_datagrams_total{outcome}: forwarded, dropped */
    TS_M_OUT_OF_MEMORY,        /* tessera_serve_out_of_memory_total{action}: split, refused */
    TS_M_DEVICE_UTILIZATION,   /* tessera_device_utilization_ratio: a GPU server's busy share */
    TS_M_DEVICE_SECONDS,       /* tessera_device_seconds: a batch's device time (CUDA events) */
    TS_M_TRAIN_STEP_SECONDS,   /* tessera_train_step_seconds{clock}: the last step, wall, device */
    TS_M_BLAS_KERNELS,         /* tessera_blas_kernels_info{core} = 1: OpenBLAS's kernel set */
    TS_M_BLAS_WEAKER,          /* tessera_blas_kernels_weaker: 1 when weaker than the CPU runs */
    TS_M_ACCUSATIONS,          /* tessera_accusations_total{outcome}: daemon/trust.h */
    TS_M_BANNED_NODES,         /* tessera_banned_nodes: nodes whose adverts this node withholds */
    TS_M_COUNT
} ts_metric_id_t;

/* A registry with every TS_M_* family registered, tessera_build_info{version} set to 1,
 * process_start_time_seconds set to now, and the collector of process_resident_memory_bytes
 * (RSS from /proc/self/statm). *out: ts_metrics_free. */
int ts_metrics_create_daemon(ts_metrics_t **out, const char *version);

/* The resident set size of this process in bytes (/proc/self/statm × page size); TS_EIO. */
int ts_metrics_read_rss(uint64_t *bytes);

#endif
