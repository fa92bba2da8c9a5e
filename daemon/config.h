/*
 * config.h — tesserad's configuration: an INI file (parsed by Debian's libinih), every key
 * declared once in a table that also drives validation, the defaults and `tesserad --help-config`.
 * configs/tesserad.ini documents every key with its default; a test checks that the file and the
 * table agree.
 *
 * Strictness: an unknown section or key, a value that does not parse, or one outside its range is
 * an error naming the file, the line, the key and what is accepted — a typo in a volunteer's
 * config must not silently fall back to a default. A key given twice is an error too, except the
 * list keys (bootstrap), whose values add up.
 *
 * Paths in the file are taken as written; relative ones are relative to the daemon's working
 * directory (the systemd unit sets it to the state directory).
 */
#ifndef TS_DAEMON_CONFIG_H
#define TS_DAEMON_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/engine.h"
#include "model/dit.h"

#define TS_CONFIG_PATH_MAX 1024
#define TS_CONFIG_ADDR_MAX 272 /* "host:port" (store/peers.h's bound) */
#define TS_CONFIG_MAX_BOOTSTRAP 32

typedef enum { TS_LOG_DEBUG = 0, TS_LOG_INFO, TS_LOG_WARN, TS_LOG_ERROR } ts_log_level_t;
typedef enum { TS_LOG_TEXT = 0, TS_LOG_JSON } ts_log_format_t;
/* What the node does with an expert ([expert] mode). */
typedef enum {
    TS_EXPERT_NONE = 0,
    TS_EXPERT_HOST,
    TS_EXPERT_TRAIN,
    TS_EXPERT_AUTO
} ts_expert_mode_t;

#define TS_CONFIG_MODEL_MAX 32 /* a model preset's name ("tiny", "XL/8") */

typedef struct ts_daemon_config {
    /* [node] */
    char identity[TS_CONFIG_PATH_MAX];    /* the node's identity file (tessera keygen) */
    char network_key[TS_CONFIG_PATH_MAX]; /* the network key file (tessera keygen --network-key) */
    char data_dir[TS_CONFIG_PATH_MAX];    /* the store: weights, checkpoints, address book */
    char listen[TS_CONFIG_ADDR_MAX];      /* TCP and UDP, host:port */
    char advertise[TS_CONFIG_ADDR_MAX];   /* what others dial; "" = listen */
    char bootstrap[TS_CONFIG_MAX_BOOTSTRAP][TS_CONFIG_ADDR_MAX];
    int n_bootstrap;
    /* [expert] */
    ts_expert_mode_t expert_mode;
    char expert_weights[TS_CONFIG_PATH_MAX];   /* host: the expert; train: "" or a copy's path */
    char expert_partition[TS_CONFIG_PATH_MAX]; /* host and train */
    int expert_cluster;                        /* train: the cluster to learn; −1 when not set */
    char expert_router[TS_CONFIG_PATH_MAX];    /* host and train: "" = none */
    /* [train] (mode = train): daemon/train_job.h's options */
    char train_model[TS_CONFIG_MODEL_MAX];
    char train_data[TS_CONFIG_PATH_MAX];    /* the Fashion-MNIST IDX folder */
    char train_latents[TS_CONFIG_PATH_MAX]; /* a latent data set instead ("": none) */
    int train_steps, train_batch, train_warmup, train_threads, train_ckpt_every, train_keep;
    int train_progress_every_s; /* between the log's training progress lines */
    double train_lr, train_ema;
    double train_serve_from; /* serve_while_training: no checkpoint before this fraction */
    uint64_t train_seed;
    int train_serve_while_training;    /* 0 or 1 */
    int train_graphs;                  /* 0 or 1: the steps through CUDA graphs */
    int auto_interval_s, auto_dwell_s; /* [expert] mode = auto: how often to choose, min dwell */
    int auto_bandwidth_mib_s;          /* its fetches' bandwidth, MiB/s; 0 = unlimited */
    /* [compute] */
    ts_device_spec_t compute_device;  /* the engine of the trainer and the server */
    ts_precision_t compute_precision; /* the server's and the trainer's products */
    ts_attn_choice_t compute_attention; /* how the server chooses its attention */
    /* [gossip] */
    int probe_interval_ms, probe_timeout_ms, indirect_probes, suspicion_mult, retransmit_mult;
    int pushpull_interval_s;
    int join_timeout_s; /* alone this long with seeds: warn, /healthz 503, join again */
    /* [limits] */
    int max_frame_mib, max_connections, max_connections_per_ip;
    int max_partial_frames_mib; /* net/conn.h max_partial_bytes, MiB */
    int handshake_timeout_ms, idle_timeout_s;
    /* [serve] */
    int serve_max_batch, serve_max_wait_ms, serve_max_queue, serve_compute_threads;
    /* [fault]: wrong answers on purpose, for the spot-checks' tests and measurements */
    double fault_lie_bias, fault_lie_noise, fault_lie_scale, fault_lie_rate;
    int fault_lie_after;
    /* [trust]: what an upheld accusation does here besides the ban (daemon/trust.h) */
    int trust_expel;
    int weights_bandwidth_mib_s, weights_max_pending;
    /* [relay] (net/relay.h) */
    int relay_serve, relay_use; /* carry others; take an address at a relay when unreachable */
    int relay_max_nodes, relay_max_circuits, relay_bandwidth_mib_s;
    char relay_via[TS_CONFIG_ADDR_MAX]; /* always this relay; "" = choose when unreachable */
    /* [log] */
    ts_log_level_t log_level;
    ts_log_format_t log_format;
    char log_file[TS_CONFIG_PATH_MAX]; /* "" = stderr */
    /* [metrics] */
    char metrics_listen[TS_CONFIG_ADDR_MAX]; /* HTTP /metrics and /healthz; "" = off */
} ts_daemon_config_t;

/* The defaults of every key (identity and network_key have none: they are required). */
void ts_daemon_config_default(ts_daemon_config_t *c);

/* Reads path over the defaults. TS_ENOTFOUND (no such file), TS_EIO, or TS_EINVAL with the
 * sentence "FILE:LINE: [section] key: problem"; then checks the whole (required keys, listen and
 * advertise addresses, timeouts consistent). */
int ts_daemon_config_load(ts_daemon_config_t *c, const char *path, char *err, size_t errlen);

/* Same as ts_daemon_config_load on text held in memory (name is used in messages). */
int ts_daemon_config_parse(ts_daemon_config_t *c, const char *text, const char *name, char *err,
                           size_t errlen);

/* One key of the table, for --help-config and the documentation test. */
typedef struct ts_config_key_info {
    const char *section, *key, *type, *deflt, *doc;
} ts_config_key_info_t;

/* The n-th key of the table (NULL past the end). */
const ts_config_key_info_t *ts_daemon_config_key(int n);

const char *ts_log_level_name(ts_log_level_t l);
const char *ts_expert_mode_name(ts_expert_mode_t m); /* "none", "host", "train" */

#endif
