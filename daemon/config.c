/*
 * config.c — tesserad's INI configuration (daemon/config.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/config.h"

#include "model/dit.h"
#include "model/fmnist.h"
#include "store/peers.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* K_ADDR0: an address whose port may be 0 (any free port, which the daemon logs) */
typedef enum {
    K_PATH,
    K_ADDR,
    K_ADDR0,
    K_ADDRLIST,
    K_INT,
    K_U64,
    K_FLOAT,
    K_BOOL,
    K_LEVEL,
    K_FORMAT,
    K_MODE,
    K_MODEL,
    K_DEVICE,
    K_PRECISION,
    K_ATTENTION
} kind_t;

typedef struct {
    ts_config_key_info_t info;
    kind_t kind;
    size_t off;
    long lo, hi;     /* K_INT: the range */
    double flo, fhi; /* K_FLOAT: the range */
} key_spec_t;

#define OFF(f) offsetof(ts_daemon_config_t, f)

/* clang-format off */
static const key_spec_t KEYS[] = {
    {{"node", "identity", "path", "(required)", "the node's identity file, written by `tessera keygen --out FILE` (mode 0600)"}, K_PATH, OFF(identity), 0, 0},
    {{"node", "network_key", "path", "(required)", "the network key file, written by `tessera keygen --network-key --out FILE` (mode 0600); the same for every node of the network"}, K_PATH, OFF(network_key), 0, 0},
    {{"node", "data_dir", "path", "/var/lib/tessera", "the store (LMDB): weights, checkpoints, the address book"}, K_PATH, OFF(data_dir), 0, 0},
    {{"node", "listen", "host:port", "0.0.0.0:7420", "where to listen: TCP (RPC, transfers) and UDP (gossip) on the same port; port 0 picks a free one (logged, and written to DATA_DIR/listen.addr)"}, K_ADDR0, OFF(listen), 0, 0},
    {{"node", "advertise", "host:port", "(listen)", "the address other nodes dial; needed when listen is 0.0.0.0 or behind NAT"}, K_ADDR, OFF(advertise), 0, 0},
    {{"node", "bootstrap", "host:port list", "(none)", "nodes to join through, comma-separated; the key may be repeated and the lists add up; empty for the first node"}, K_ADDRLIST, OFF(bootstrap), 0, 0},
    {{"expert", "mode", "none|host|train|auto", "none", "none: no expert (a bootstrap or relay node); host: serve the expert in weights; train: train the expert of cluster `cluster` of partition ([train] sets how), then host it; auto: choose the cluster the network needs most, fetch its weights from a peer or, when no node has them, train them, then host it, and choose again every auto_interval_s"}, K_MODE, OFF(expert_mode), 0, 0},
    {{"expert", "weights", "path or hash", "(none)", "host: the expert, a .safetensors file from `tessera train --partition DIR --cluster K` (imported into the store at start) or the weights hash of one already in the store (required); train: where to also write the final weights as a file (optional: they go into the store in any case)"}, K_PATH, OFF(expert_weights), 0, 0},
    {{"expert", "partition", "path", "(none)", "the partition file (`tessera partition`'s partition.safetensors): host: the one the expert was trained on, for the centroid the advert carries; train: the one that defines the cluster's images; required with host and train"}, K_PATH, OFF(expert_partition), 0, 0},
    {{"expert", "router", "path", "(none)", "host and train: a router for the partition (`tessera train-router`), imported into the store and named in the advert, so that clients can fetch it from this node and route with the learned policy"}, K_PATH, OFF(expert_router), 0, 0},
    {{"expert", "auto_interval_s", "integer", "10", "auto: seconds between two choices (the first comes one interval after start, once the adverts have arrived)"}, K_INT, OFF(auto_interval_s), 1, 86400},
    {{"expert", "auto_dwell_s", "integer", "60", "auto: the least time a node serves a cluster before it may move to another (nodes do not flap)"}, K_INT, OFF(auto_dwell_s), 0, 86400},
    {{"expert", "auto_bandwidth_mib_s", "integer", "0", "auto: MiB/s of the node's own weight fetches; 0 = unlimited"}, K_INT, OFF(auto_bandwidth_mib_s), 0, 100000},
    {{"expert", "cluster", "integer", "(none)", "train: the cluster of partition to train on, 0..K-1 (required); not used otherwise (hosted weights record their cluster)"}, K_INT, OFF(expert_cluster), 0, 65535},
    {{"compute", "device", "auto|cpu|cuda[:N]", "auto", "where the expert is trained and served: " TS_DEVICE_SPEC_HELP "; the choice is logged, advertised and shown by `tessera status`"}, K_DEVICE, OFF(compute_device), 0, 0},
    {{"compute", "precision", "f32|bf16|f16", "f32", "the served expert's matrix products: f32, bf16 (bf16 weights and products, fp32 accumulation, LayerNorm, softmax and residual stream; CPU with AVX-512 BF16 and oneDNN, or a GPU of compute capability 8.0 or newer) or f16 (the same in half precision, on any GPU, for GPUs without bf16; a CPU emulates it, slower than f32). The trainer ([expert] mode = train) honours it too: bf16 or f16 training, with fp32 master weights, AdamW and EMA, and fp32 checkpoints; f16 with dynamic loss scaling. Where the precision cannot run the server and the trainer stay f32 and log why"}, K_PRECISION, OFF(compute_precision), 0, 0},
    {{"compute", "attention", "auto|measure|fused|composed", "auto", "how the served expert computes attention: auto measures the fused (flash) and the composed attention on a GPU when the expert is loaded (a few forwards at max_batch; the fused one must agree with the composed one, and is kept only where it is faster), at bf16 or f16 the linears' bias (and fc1's bias and GELU) in cuBLASLt's epilogue (kept where it agrees and is faster), and CUDA graphs of the forward with them (kept where they give the same bits and are faster); on a CPU it keeps the attention measured faster in docs/benchmarks.md. measure measures on a CPU too; fused or composed asks for one (an expert that cannot take it keeps the default). The choice and the times are logged; the attention is part of the answers' device class"}, K_ATTENTION, OFF(compute_attention), 0, 0},
    {{"train", "model", "name", "tiny", "the DiT config: mini, tiny, small, S/2, S/4, S/8, B/2 ... XL/8"}, K_MODEL, OFF(train_model), 0, 0},
    {{"train", "data", "path", TS_FMNIST_DEFAULT_DIR, "the Fashion-MNIST IDX files (Debian's dataset-fashion-mnist); the partition must have been made from this train set"}, K_PATH, OFF(train_data), 0, 0},
    {{"train", "latents", "path", "(none)", "a latent data set of `tessera encode` to train on instead of Fashion-MNIST: the partition must be a `tessera partition --latents` of it; the weights carry its latent space"}, K_PATH, OFF(train_latents), 0, 0},
    {{"train", "steps", "integer", "10000", "the run is complete at this step; raising it later continues the run"}, K_INT, OFF(train_steps), 1, 2000000000},
    {{"train", "batch", "integer", "64", "samples per step"}, K_INT, OFF(train_batch), 1, 65536},
    {{"train", "lr", "number", "0.0003", "peak learning rate (AdamW)"}, K_FLOAT, OFF(train_lr), 0, 0, 1e-9, 10},
    {{"train", "warmup", "integer", "200", "steps of linear learning-rate warm-up from 0"}, K_INT, OFF(train_warmup), 0, 1000000000},
    {{"train", "ema", "number", "0.999", "decay of the EMA weights, which are what the node serves and keeps"}, K_FLOAT, OFF(train_ema), 0, 0, 0, 1},
    {{"train", "seed", "integer", "0", "the seed of every random draw (init, data order, noise, times)"}, K_U64, OFF(train_seed), 0, 0},
    {{"train", "threads", "integer", "0", "compute threads of the training job; 0 = one per online core"}, K_INT, OFF(train_threads), 0, 1024},
    {{"train", "progress_every_s", "integer", "60", "seconds between the log's training progress lines (step, loss, steps/s, time left); the first comes after the job's first step"}, K_INT, OFF(train_progress_every_s), 1, 86400},
    {{"train", "ckpt_every", "integer", "500", "a checkpoint into the store every this many steps (and when stopped); a killed daemon resumes from the newest"}, K_INT, OFF(train_ckpt_every), 1, 1000000000},
    {{"train", "keep", "integer", "3", "checkpoints of the run kept in the store"}, K_INT, OFF(train_keep), 1, 1000000},
    {{"train", "graphs", "true|false", "false", "on a GPU (device = cuda), run each training step's forward and backward as one CUDA graph (captured at the second step: the same kernels, far fewer launches; a capture that fails falls back to the eager step and the log says so); a CPU ignores it"}, K_BOOL, OFF(train_graphs), 0, 0},
    {{"train", "serve_while_training", "true|false", "false", "serve the EMA weights of the newest checkpoint while training, instead of waiting for the end; clients use such an expert only past `generate --min-trained F` of its steps (default: finished experts only)"}, K_BOOL, OFF(train_serve_while_training), 0, 0},
    {{"train", "serve_from", "number", "0", "with serve_while_training (mode = train): serve no checkpoint before this fraction of the steps (0..1; 1: only the finished expert); an auto node always advertises its checkpoints, so that other auto nodes see the cluster taken"}, K_FLOAT, OFF(train_serve_from), 0, 0, 0, 1},
    {{"gossip", "probe_interval_ms", "integer", "1000", "SWIM protocol period: one probe per period"}, K_INT, OFF(probe_interval_ms), 50, 60000},
    {{"gossip", "probe_timeout_ms", "integer", "500", "wait for a direct ack before indirect probes; less than probe_interval_ms"}, K_INT, OFF(probe_timeout_ms), 10, 60000},
    {{"gossip", "indirect_probes", "integer", "3", "members asked to probe on our behalf (k)"}, K_INT, OFF(indirect_probes), 0, 16},
    {{"gossip", "suspicion_mult", "integer", "4", "suspicion timeout = suspicion_mult x log10(N) x probe interval (Lifeguard shortens it as confirmations arrive)"}, K_INT, OFF(suspicion_mult), 1, 100},
    {{"gossip", "retransmit_mult", "integer", "4", "each update is piggybacked retransmit_mult x log(N+1) times"}, K_INT, OFF(retransmit_mult), 1, 100},
    {{"gossip", "pushpull_interval_s", "integer", "10", "anti-entropy with one random member over TCP: digests both ways, then the members where they differ (about 240 B/s per node at any N; a verdict a node missed reaches it within one period); 0 = off"}, K_INT, OFF(pushpull_interval_s), 0, 86400},
    {{"gossip", "join_timeout_s", "integer", "15", "a node with bootstrap addresses that has no peer this long after start warns, answers /healthz 503 (alone) and joins again at this interval"}, K_INT, OFF(join_timeout_s), 1, 3600},
    {{"limits", "max_frame_mib", "integer", "64", "largest application frame accepted, MiB (checked before allocating)"}, K_INT, OFF(max_frame_mib), 1, 1024},
    {{"limits", "max_partial_frames_mib", "integer", "1024", "buffer memory of partly received frames, all connections together, MiB; the connection whose frame would go over it is closed"}, K_INT, OFF(max_partial_frames_mib), 1, 1048576},
    {{"limits", "max_connections", "integer", "256", "open TCP connections at most, in total; at the limit the oldest connection still in its handshake makes room"}, K_INT, OFF(max_connections), 1, 65536},
    {{"limits", "max_connections_per_ip", "integer", "8", "open TCP connections at most from one remote address; at the limit that address's oldest connection still in its handshake makes room"}, K_INT, OFF(max_connections_per_ip), 1, 65536},
    {{"limits", "handshake_timeout_ms", "integer", "5000", "a connection that has not finished its handshake by then is dropped"}, K_INT, OFF(handshake_timeout_ms), 100, 600000},
    {{"limits", "idle_timeout_s", "integer", "120", "a connection with no traffic for this long is closed"}, K_INT, OFF(idle_timeout_s), 1, 86400},
    {{"serve", "max_batch", "integer", "16", "forward rows per batch, and the most one request may take (a guided sample takes 2)"}, K_INT, OFF(serve_max_batch), 1, 4096},
    {{"serve", "max_wait_ms", "integer", "0", "how long the oldest queued request waits for others to batch with while the compute thread is idle (0: not at all; batches still form from what queues while one computes)"}, K_INT, OFF(serve_max_wait_ms), 0, 10000},
    {{"serve", "max_queue", "integer", "256", "rows queued before requests are answered busy; at least max_batch"}, K_INT, OFF(serve_max_queue), 1, 1048576},
    {{"serve", "compute_threads", "integer", "0", "threads of the compute engine; 0 = one per core"}, K_INT, OFF(serve_compute_threads), 0, 1024},
    {{"serve", "weights_bandwidth_mib_s", "integer", "0", "MiB/s of weight chunks served to other nodes; 0 = unlimited"}, K_INT, OFF(weights_bandwidth_mib_s), 0, 100000},
    {{"serve", "weights_max_pending", "integer", "64", "chunk requests waiting for bandwidth before busy"}, K_INT, OFF(weights_max_pending), 1, 65536},
    {{"relay", "serve", "true|false", "false", "carry nodes that cannot be dialled (behind NAT): each gets a port of this node, through which others reach it, end-to-end encrypted; this node must be reachable itself"}, K_BOOL, OFF(relay_serve), 0, 0},
    {{"relay", "max_nodes", "integer", "32", "serve: nodes carried at once"}, K_INT, OFF(relay_max_nodes), 1, 4096},
    {{"relay", "max_circuits", "integer", "32", "serve: connections spliced (or waiting) per node carried"}, K_INT, OFF(relay_max_circuits), 1, 4096},
    {{"relay", "bandwidth_mib_s", "integer", "8", "serve: MiB/s carried per node, both ways together; 0 = unlimited"}, K_INT, OFF(relay_bandwidth_mib_s), 0, 100000},
    {{"relay", "use", "true|false", "true", "when the reachability check finds this node cannot be dialled at its advertised address, take an address at a relay (any live member that serves relays) and advertise that"}, K_BOOL, OFF(relay_use), 0, 0},
    {{"relay", "via", "host:port", "(none)", "always take an address at the relay at host:port, reachable or not (a node that knows it is behind NAT, or a test)"}, K_ADDR, OFF(relay_via), 0, 0},
    {{"log", "level", "debug|info|warn|error", "info", "the least severe level written"}, K_LEVEL, OFF(log_level), 0, 0},
    {{"log", "format", "text|json", "text", "text lines, or one JSON object per line (ts, level, component, msg)"}, K_FORMAT, OFF(log_format), 0, 0},
    {{"log", "file", "path", "(stderr)", "append logs to this file instead of stderr; SIGHUP reopens it (log rotation)"}, K_PATH, OFF(log_file), 0, 0},
    {{"fault", "lie_bias", "number", "0", "tests and measurements only: add this to every element of the answers this node lies in (a liar for the spot-checks: docs/operations.md, \"Wrong answers\")"}, K_FLOAT, OFF(fault_lie_bias), 0, 0, -1e6, 1e6},
    {{"fault", "lie_noise", "number", "0", "tests and measurements only: add Gaussian noise of this standard deviation to the answers this node lies in"}, K_FLOAT, OFF(fault_lie_noise), 0, 0, 0, 1e6},
    {{"fault", "lie_scale", "number", "1", "tests and measurements only: multiply the answers this node lies in by this (an answer of the wrong size, like another expert's)"}, K_FLOAT, OFF(fault_lie_scale), 0, 0, -1e6, 1e6},
    {{"fault", "lie_rate", "number", "1", "tests and measurements only: the fraction of answers the lies above apply to (each answer drawn at random); they sign them like honest ones"}, K_FLOAT, OFF(fault_lie_rate), 0, 0, 0, 1},
    {{"fault", "lie_after", "integer", "0", "tests and measurements only: answer this many requests honestly before the lies above begin (a liar that earns the clients' trust first)"}, K_INT, OFF(fault_lie_after), 0, 1000000000},
    {{"trust", "expel", "true|false", "false", "when an accusation against a node is upheld here (its wrong answer recomputed), also take it out of the membership here: drop its gossip datagrams, refuse its signed claims, no longer list it; without it the node stays a member and only its adverts are withheld from clients"}, K_BOOL, OFF(trust_expel), 0, 0},
    {{"metrics", "listen", "host:port", "127.0.0.1:9420", "HTTP endpoint for Prometheus (/metrics) and health checks (/healthz); port 0 picks a free port (logged); empty turns it off"}, K_ADDR0, OFF(metrics_listen), 0, 0},
};
/* clang-format on */
#define N_KEYS ((int)(sizeof KEYS / sizeof KEYS[0]))

static const char *LEVELS[] = {"debug", "info", "warn", "error"};
static const char *MODES[] = {"none", "host", "train", "auto"};

const char *ts_log_level_name(ts_log_level_t l) { return (unsigned)l < 4 ? LEVELS[l] : "?"; }

const char *ts_expert_mode_name(ts_expert_mode_t m) { return (unsigned)m < 4 ? MODES[m] : "?"; }

const ts_config_key_info_t *ts_daemon_config_key(int n) {
    return n >= 0 && n < N_KEYS ? &KEYS[n].info : NULL;
}

void ts_daemon_config_default(ts_daemon_config_t *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->data_dir, sizeof c->data_dir, "/var/lib/tessera");
    snprintf(c->listen, sizeof c->listen, "0.0.0.0:7420");
    c->probe_interval_ms = 1000;
    c->probe_timeout_ms = 500;
    c->indirect_probes = 3;
    c->suspicion_mult = 4;
    c->retransmit_mult = 4;
    c->pushpull_interval_s = 10;
    c->join_timeout_s = 15;
    c->max_frame_mib = 64;
    c->max_partial_frames_mib = 1024;
    c->max_connections = 256;
    c->max_connections_per_ip = 8;
    c->handshake_timeout_ms = 5000;
    c->idle_timeout_s = 120;
    c->serve_max_batch = 16;
    c->serve_max_wait_ms = 0;
    c->fault_lie_bias = 0.0;
    c->fault_lie_noise = 0.0;
    c->fault_lie_scale = 1.0;
    c->fault_lie_rate = 1.0;
    c->fault_lie_after = 0;
    c->trust_expel = 0;
    c->serve_max_queue = 256;
    c->serve_compute_threads = 0;
    c->weights_bandwidth_mib_s = 0;
    c->weights_max_pending = 64;
    c->relay_max_nodes = 32;
    c->relay_max_circuits = 32;
    c->relay_bandwidth_mib_s = 8;
    c->relay_use = 1;
    c->log_level = TS_LOG_INFO;
    c->log_format = TS_LOG_TEXT;
    snprintf(c->metrics_listen, sizeof c->metrics_listen, "127.0.0.1:9420");
    c->expert_mode = TS_EXPERT_NONE;
    c->expert_cluster = -1;
    c->auto_interval_s = 10;
    c->auto_dwell_s = 60;
    c->compute_device.automatic = 1;
    snprintf(c->train_model, sizeof c->train_model, "tiny");
    snprintf(c->train_data, sizeof c->train_data, "%s", TS_FMNIST_DEFAULT_DIR);
    c->train_steps = 10000;
    c->train_batch = 64;
    c->train_lr = 0.0003;
    c->train_warmup = 200;
    c->train_ema = 0.999;
    c->train_seed = 0;
    c->train_threads = 0;
    c->train_progress_every_s = 60;
    c->train_serve_from = 0.0;
    c->train_ckpt_every = 500;
    c->train_keep = 3;
    c->train_serve_while_training = 0;
    c->train_graphs = 0;
}

typedef struct {
    ts_daemon_config_t *c;
    const char *name;
    char *err;
    size_t errlen;
    int line; /* the line being parsed (counted by the reader) */
    int rc;
    unsigned char seen[N_KEYS];
} parse_ctx_t;

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    return s;
}

/* Records "FILE:LINE: [section] name: <fmt with value>" and stops the parse (returns 0, which
 * tells libinih to report an error). */
static int fail(parse_ctx_t *p, const char *section, const char *name, const char *fmt, ...)
    TS_PRINTF(4, 5);
static int fail(parse_ctx_t *p, const char *section, const char *name, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    ts_set_err(p->err, p->errlen, "%s:%d: [%s] %s: %s", p->name, p->line, section, name, what);
    p->rc = TS_EINVAL;
    return 0;
}

static int add_addrs(parse_ctx_t *p, const key_spec_t *k, const char *section, const char *value) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", value);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        tok = trim(tok);
        if (!*tok)
            continue;
        if (!ts_addr_valid(tok, strlen(tok), 0))
            return fail(p, section, k->info.key, "'%s' is not host:port (port 1..65535)", tok);
        if (p->c->n_bootstrap == TS_CONFIG_MAX_BOOTSTRAP)
            return fail(p, section, k->info.key, "more than %d addresses", TS_CONFIG_MAX_BOOTSTRAP);
        snprintf(p->c->bootstrap[p->c->n_bootstrap++], TS_CONFIG_ADDR_MAX, "%s", tok);
    }
    return 1;
}

/* Levenshtein distance of a and b, capped at 9 (names are short). */
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 9;
    int d[41][41];
    for (size_t i = 0; i <= la; i++)
        d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++)
        d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
    return d[la][lb] < 9 ? d[la][lb] : 9;
}

/* The unknown [section] name's complaint: the closest key ("did you mean [node] bootstrap?")
 * when one is within a third of its length, and the sections there are. */
static int unknown_key(parse_ctx_t *p, const char *section, const char *name) {
    int best = -1, best_d = 9, best_room = 0;
    for (int j = 0; j < N_KEYS; j++) {
        int d = edit_distance(KEYS[j].info.key, name);
        size_t typed = strlen(name); /* a third of what was typed may be wrong */
        if (strcmp(KEYS[j].info.section, section) != 0) {
            d += edit_distance(KEYS[j].info.section, section);
            typed += strlen(section);
        }
        if (d < best_d) {
            best_d = d;
            best = j;
            best_room = (int)(typed + 2) / 3;
        }
    }
    char hint[160] = "", sections[256] = "";
    if (best >= 0 && best_d <= best_room)
        snprintf(hint, sizeof hint, "; did you mean [%s] %s?", KEYS[best].info.section,
                 KEYS[best].info.key);
    int known_section = 0;
    size_t used = 0;
    for (int j = 0; j < N_KEYS; j++) {
        known_section |= strcmp(KEYS[j].info.section, section) == 0;
        int seen = 0;
        for (int i = 0; i < j && !seen; i++)
            seen = strcmp(KEYS[i].info.section, KEYS[j].info.section) == 0;
        if (!seen && used < sizeof sections)
            used += (size_t)snprintf(sections + used, sizeof sections - used, "%s%s",
                                     used ? ", " : "", KEYS[j].info.section);
    }
    if (known_section)
        return fail(p, section, name, "unknown key%s (configs/tesserad.ini lists every key)", hint);
    return fail(p, section, name, "unknown section or key%s (sections: %s)", hint, sections);
}

static int on_key(void *user, const char *section, const char *name, const char *value) {
    parse_ctx_t *p = user;
    if (p->rc != TS_OK)
        return 0;
    int i = 0;
    while (i < N_KEYS &&
           !(strcmp(KEYS[i].info.section, section) == 0 && strcmp(KEYS[i].info.key, name) == 0))
        i++;
    if (i == N_KEYS)
        return unknown_key(p, section, name);
    const key_spec_t *k = &KEYS[i];
    if (p->seen[i] && k->kind != K_ADDRLIST)
        return fail(p, section, name, "given twice");
    p->seen[i] = 1;
    char *field = (char *)p->c + k->off;
    switch (k->kind) {
    case K_PATH:
        if (strlen(value) >= TS_CONFIG_PATH_MAX)
            return fail(p, section, name, "longer than %d bytes", TS_CONFIG_PATH_MAX - 1);
        snprintf(field, TS_CONFIG_PATH_MAX, "%s", value);
        return 1;
    case K_ADDR:
    case K_ADDR0:
        if (*value && !ts_addr_valid(value, strlen(value), k->kind == K_ADDR0))
            return fail(p, section, name, "'%s' is not host:port (port %d..65535)", value,
                        k->kind == K_ADDR0 ? 0 : 1);
        snprintf(field, TS_CONFIG_ADDR_MAX, "%s", value);
        return 1;
    case K_ADDRLIST: return add_addrs(p, k, section, value);
    case K_INT: {
        char *end;
        errno = 0;
        long v = strtol(value, &end, 10);
        if (!*value || *end || errno)
            return fail(p, section, name, "'%s' is not an integer", value);
        if (v < k->lo || v > k->hi) {
            char range[64];
            snprintf(range, sizeof range, "%ld..%ld", k->lo, k->hi);
            ts_set_err(p->err, p->errlen, "%s:%d: [%s] %s: %ld is outside %s", p->name, p->line,
                       section, name, v, range);
            p->rc = TS_EINVAL;
            return 0;
        }
        *(int *)field = (int)v;
        return 1;
    }
    case K_U64: {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(value, &end, 10);
        if (!*value || *end || errno || *value == '-' || *value == '+')
            return fail(p, section, name, "'%s' is not a non-negative integer", value);
        *(uint64_t *)field = (uint64_t)v;
        return 1;
    }
    case K_FLOAT: {
        char *end;
        errno = 0;
        double v = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(v))
            return fail(p, section, name, "'%s' is not a number", value);
        if (v < k->flo || v > k->fhi)
            return fail(p, section, name, "%g is outside %g..%g", v, k->flo, k->fhi);
        *(double *)field = v;
        return 1;
    }
    case K_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "false") == 0) {
            *(int *)field = value[0] == 't';
            return 1;
        }
        return fail(p, section, name, "'%s': want true or false", value);
    case K_MODE:
        for (int m = 0; m < 4; m++)
            if (strcmp(value, MODES[m]) == 0) {
                *(ts_expert_mode_t *)field = (ts_expert_mode_t)m;
                return 1;
            }
        return fail(p, section, name, "'%s': want none, host, train or auto", value);
    case K_MODEL: {
        ts_dit_config_t cfg;
        if (strlen(value) >= TS_CONFIG_MODEL_MAX || ts_dit_config_preset(value, &cfg) != TS_OK)
            return fail(p, section, name,
                        "'%s': want a model preset (mini, tiny, small, S/2 ... XL/8)", value);
        snprintf(field, TS_CONFIG_MODEL_MAX, "%s", value);
        return 1;
    }
    case K_DEVICE:
        if (ts_device_spec_parse(value, (ts_device_spec_t *)field) != TS_OK)
            return fail(p, section, name, "'%s': want auto, cpu, cuda or cuda:N", value);
        return 1;
    case K_PRECISION:
        if (ts_precision_parse(value, (ts_precision_t *)field) != TS_OK)
            return fail(p, section, name, "'%s': want f32, bf16 or f16", value);
        return 1;
    case K_ATTENTION:
        if (ts_attn_choice_parse(value, (ts_attn_choice_t *)field) != TS_OK)
            return fail(p, section, name, "'%s': want auto, measure, fused or composed", value);
        return 1;
    case K_LEVEL:
        for (int l = 0; l < 4; l++)
            if (strcmp(value, LEVELS[l]) == 0) {
                *(ts_log_level_t *)field = (ts_log_level_t)l;
                return 1;
            }
        return fail(p, section, name, "'%s': want debug, info, warn or error", value);
    case K_FORMAT:
        if (strcmp(value, "text") == 0 || strcmp(value, "json") == 0) {
            *(ts_log_format_t *)field = value[0] == 'j' ? TS_LOG_JSON : TS_LOG_TEXT;
            return 1;
        }
        return fail(p, section, name, "'%s': want text or json", value);
    }
    return 0;
}

/* The reader of ini_parse_stream over a string: one line per call, counting lines so errors can
 * name them (Debian's libinih does not pass line numbers to the handler). */
typedef struct {
    const char *at;
    parse_ctx_t *p;
} reader_t;

static char *read_line(char *buf, int size, void *stream) {
    reader_t *r = stream;
    if (!*r->at)
        return NULL;
    const char *nl = strchr(r->at, '\n');
    size_t n = nl ? (size_t)(nl - r->at) + 1 : strlen(r->at);
    if (n >= (size_t)size)
        n = (size_t)size - 1;
    memcpy(buf, r->at, n);
    buf[n] = '\0';
    r->at += n;
    r->p->line++;
    return buf;
}

/* Which [expert] keys each mode needs (1), allows (0) or refuses (−1): weights, partition,
 * cluster. */
static int check_expert(const ts_daemon_config_t *c, const char *name, char *err, size_t errlen) {
    static const int rule[4][3] = {{-1, -1, -1}, {1, 1, -1}, {0, 1, 1}, {-1, 0, -1}};
    static const char *const keys[3] = {"weights", "partition", "cluster"};
    static const char *const why[4] = {
        "set mode = host to host an expert, or mode = train to train one",
        "a hosted expert needs its weights and its partition",
        "training needs the partition and the cluster to learn",
        "an auto node chooses its cluster and fetches or trains its weights"};
    int set[3] = {c->expert_weights[0] != 0, c->expert_partition[0] != 0, c->expert_cluster >= 0};
    int m = c->expert_mode;
    for (int i = 0; i < 3; i++) {
        if (rule[m][i] == 1 && !set[i]) {
            ts_set_err(err, errlen, "%s: [expert] mode = %s needs %s: %s", name, MODES[m], keys[i],
                       why[m]);
            return TS_EINVAL;
        }
        if (rule[m][i] == -1 && set[i]) {
            ts_set_err(
                err, errlen, "%s: [expert] %s is set but mode = %s does not use it%s%s", name,
                keys[i], MODES[m], m == TS_EXPERT_NONE || m == TS_EXPERT_AUTO ? ": " : "",
                m == TS_EXPERT_NONE || m == TS_EXPERT_AUTO ? why[m]
                                                           : " (the weights record their cluster)");
            return TS_EINVAL;
        }
    }
    return TS_OK;
}

static int check_whole(ts_daemon_config_t *c, const char *name, char *err, size_t errlen) {
    if (!c->identity[0] || !c->network_key[0]) {
        ts_set_err(err, errlen,
                   "%s: [node] %s is required (create one with `tessera keygen %s--out FILE`)",
                   name, !c->identity[0] ? "identity" : "network_key",
                   !c->identity[0] ? "" : "--network-key ");
        return TS_EINVAL;
    }
    int rc = check_expert(c, name, err, errlen);
    if (rc != TS_OK)
        return rc;
    if (c->expert_router[0] && c->expert_mode == TS_EXPERT_NONE) {
        ts_set_err(err, errlen,
                   "%s: [expert] router is served with an expert: set mode = host "
                   "or train",
                   name);
        return TS_EINVAL;
    }
    if (c->probe_timeout_ms >= c->probe_interval_ms) {
        ts_set_err(err, errlen,
                   "%s: [gossip] probe_timeout_ms (%d) must be less than "
                   "probe_interval_ms (%d)",
                   name, c->probe_timeout_ms, c->probe_interval_ms);
        return TS_EINVAL;
    }
    if (c->max_connections_per_ip > c->max_connections) {
        ts_set_err(err, errlen,
                   "%s: [limits] max_connections_per_ip (%d) exceeds "
                   "max_connections (%d)",
                   name, c->max_connections_per_ip, c->max_connections);
        return TS_EINVAL;
    }
    if (c->serve_max_queue < c->serve_max_batch) {
        ts_set_err(err, errlen, "%s: [serve] max_queue (%d) is less than max_batch (%d)", name,
                   c->serve_max_queue, c->serve_max_batch);
        return TS_EINVAL;
    }
    if (!c->listen[0] || !strrchr(c->listen, ':')) {
        ts_set_err(err, errlen,
                   "%s: [node] listen is empty: give the host:port to listen on "
                   "(port 0 picks a free one)",
                   name);
        return TS_EINVAL;
    }
    if (!c->advertise[0]) {
        const char *colon = strrchr(c->listen, ':');
        size_t host = (size_t)(colon - c->listen);
        if ((host == 7 && strncmp(c->listen, "0.0.0.0", 7) == 0) ||
            (host == 4 && strncmp(c->listen, "[::]", 4) == 0)) {
            ts_set_err(err, errlen,
                       "%s: [node] listen is %s, which other nodes cannot dial: set [node] "
                       "advertise to this machine's reachable host:port",
                       name, c->listen);
            return TS_EINVAL;
        }
        snprintf(c->advertise, sizeof c->advertise, "%s", c->listen);
    }
    return TS_OK;
}

int ts_daemon_config_parse(ts_daemon_config_t *c, const char *text, const char *name, char *err,
                           size_t errlen) {
    ts_daemon_config_default(c);
    parse_ctx_t p = {.c = c, .name = name, .err = err, .errlen = errlen, .rc = TS_OK};
    reader_t r = {text, &p};
    int line = ini_parse_stream(read_line, &r, on_key, &p);
    if (p.rc != TS_OK)
        return p.rc;
    if (line != 0) {
        ts_set_err(err, errlen,
                   "%s:%d: not an INI line (want [section], key = value, or a "
                   "comment starting with ; or #)",
                   name, line);
        return TS_EINVAL;
    }
    return check_whole(c, name, err, errlen);
}

int ts_daemon_config_load(ts_daemon_config_t *c, const char *path, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        ts_set_err(err, errlen, "%s: %s", path, strerror(e));
        return e == ENOENT ? TS_ENOTFOUND : TS_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *text = malloc(cap + 1);
    if (!text) {
        fclose(f);
        return TS_ENOMEM;
    }
    n = fread(text, 1, cap + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > cap) {
        free(text);
        ts_set_err(err, errlen, bad ? "%s: cannot read the file" : "%s: larger than 64 KiB", path);
        return bad ? TS_EIO : TS_EINVAL;
    }
    text[n] = '\0';
    if (memchr(text, '\0', n)) {
        free(text);
        ts_set_err(err, errlen, "%s: a NUL byte: not a text file", path);
        return TS_EINVAL;
    }
    int rc = ts_daemon_config_parse(c, text, path, err, errlen);
    free(text);
    return rc;
}
