/*
 * gossip.h — the gossip layer as it runs in a daemon (architecture.md §6): the SWIM core of
 * net/swim.h driven by a libuv loop, over sealed UDP datagrams and the secure TCP links of
 * net/rpc.h, with signed adverts, the address book and the status view.
 *
 * What it does, once started:
 *   - UDP: one socket bound to the listen address (the TCP listener's port; the same host:port
 *     serves both). Every datagram is a swim_wire message sealed with XChaCha20-Poly1305 under a
 *     key derived from the network key (docs/protocol.md, "Sealed datagrams"), with a per-sender
 *     replay window; anything that does not open, does not decode or replays is dropped and
 *     counted, nothing else happens.
 *   - Timers: one uv timer armed for ts_swim_next_deadline after every call into the core.
 *   - Push-pull: when the core asks (join, anti-entropy), a PushPull request over the RPC pool
 *     carries our full state (swim_wire state encoding) and its answer carries the peer's; both
 *     sides merge. A PushPull handler serves the other direction.
 *   - Adverts: our own (ts_gossip_set_advert) is signed by our identity and announced through the
 *     core (version, hash); when the core reports a member's advert newer than the one we hold,
 *     an AdvertRequest to that member fetches it; it is kept only when its signature verifies,
 *     its node id is the member's, and its hash and version are the ones the member's signed
 *     claim announced. An AdvertRequest handler answers with any advert held (ours or a cached
 *     one), so one node can tell a client about every expert.
 *   - Address book: members heard alive are written to the store's peers database (batched);
 *     at start, the most recently seen entries join the bootstrap list, so a restarted node
 *     rejoins with no bootstrap configured.
 *   - Status: a StatusRequest handler answers with this node's view (members, adverts, load,
 *     aggregates); ts_gossip_status builds the same answer for in-process callers.
 *
 * Threading: the loop's thread only. Lifetime: ts_gossip_new → ts_gossip_start → … →
 * ts_gossip_leave (optional, graceful) → ts_gossip_close → run the loop until the close callback
 * → ts_gossip_free. The rpc endpoint, the store and the keys must outlive the gossip layer.
 */
#ifndef TS_GOSSIP_H
#define TS_GOSSIP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "base/error.h"
#include "net/keys.h"
#include "net/rpc.h"
#include "net/swim.h"
#include "proto/tessera.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TS_GOSSIP_MAX_SEEDS 8 /* addresses handed to one join (ts_swim_join's bound) */

typedef struct ts_gossip ts_gossip_t;
typedef struct ts_store ts_store_t;

typedef struct ts_gossip_config {
    ts_swim_config_t swim; /* timings and bounds (sign, verify, claims are set by this layer) */
    const char *listen;    /* "ip:port" the UDP socket binds (port 0: any; see ts_gossip_port) */
    const char *advertise; /* "ip:port" in our claims; numeric; NULL or "": listen's, which must
                              then be a specific address (not 0.0.0.0 / [::]) */
    const char *const *bootstrap; /* "host:port" seeds; names are resolved at start */
    size_t n_bootstrap;
    ts_store_t *store;            /* the address book; NULL: none (nothing persisted) */
    uint32_t book_max_age_s;      /* book entries unseen this long are pruned at start (7 days) */
    uint32_t pushpull_timeout_ms; /* one push-pull exchange (5000) */
    int full_push_pull;           /* 1: exchange full states, not digests (as before digests) */
    uint32_t advert_timeout_ms;   /* one advert fetch (5000) */
    uint32_t max_state_bytes;     /* the largest push-pull state accepted (16 MiB) */
} ts_gossip_config_t;

void ts_gossip_config_default(ts_gossip_config_t *cfg);

/* A membership change, for logs and metrics: the core's event (net/swim.h), after this layer
 * has acted on it. Called on the loop thread; must not call ts_gossip_free. */
typedef void (*ts_gossip_event_fn)(void *arg, const ts_swim_event_t *ev);

/* Our load, asked for when a status answer is built (NULL: none reported). */
typedef void (*ts_gossip_load_fn)(void *arg, Tessera__Load *load);

/* Creates the layer for the node with identity id on network nk, over rpc (whose handlers for
 * PUSH_PULL, ADVERT_REQUEST and STATUS_REQUEST it installs). Nothing is bound yet.
 * TS_EINVAL with a sentence (a bad address, a bad swim config), TS_ENOMEM. */
int ts_gossip_new(uv_loop_t *loop, ts_rpc_t *rpc, const ts_identity_t *id, const ts_netkey_t *nk,
                  const ts_gossip_config_t *cfg, ts_gossip_t **out, char *err, size_t errlen);

void ts_gossip_on_event(ts_gossip_t *g, ts_gossip_event_fn fn, void *arg);
void ts_gossip_on_load(ts_gossip_t *g, ts_gossip_load_fn fn, void *arg);

/* Binds the UDP socket, loads the address book and joins through the bootstrap addresses and
 * the book (up to TS_GOSSIP_MAX_SEEDS in all; none: this node starts a network of its own).
 * TS_EIO with a sentence when the socket cannot be bound. */
int ts_gossip_start(ts_gossip_t *g, char *err, size_t errlen);

/* The UDP port bound (after ts_gossip_start). */
int ts_gossip_port(const ts_gossip_t *g);
/* The addresses a join goes to (resolved bootstrap addresses and address-book entries); 0: this
 * node started a network of its own. */
uint32_t ts_gossip_n_seeds(const ts_gossip_t *g);
/* Handles one datagram as if it had arrived on the UDP socket from `from` (the seal, the replay
 * window, the decoder, the SWIM core): what the socket's callback does, for the fuzz harness. */
struct sockaddr;
void ts_gossip_receive_datagram(ts_gossip_t *g, const struct sockaddr *from, const uint8_t *data,
                                size_t len);
/* Joins through the seeds again (a node that is alone retries). */
void ts_gossip_rejoin(ts_gossip_t *g);
/* The health status answers carry (StatusResponse.health): "ok" or a sentence; copied. */
void ts_gossip_set_health(ts_gossip_t *g, const char *health);
/* Moves this node, in its claims, to addr ("ip:port", numeric): the address a relay holds for
 * it (net/relay.h), relay that relay's node id, which our advert then carries as relay_id (a
 * new version, re-signed). addr NULL: back to the configured address, no relay. After start;
 * TS_EINVAL otherwise or for a bad address (err says why). */
int ts_gossip_set_relay(ts_gossip_t *g, const char *addr, const ts_node_id_t *relay, char *err,
                        size_t errlen);
/* The /metrics URL status answers carry (StatusResponse.metrics); copied; NULL or "": none. */
void ts_gossip_set_metrics_url(ts_gossip_t *g, const char *url);

/* This node's own training job, as status answers carry it (StatusResponse.training) from its
 * first step, before any snapshot of it is advertised. */
typedef struct ts_gossip_training {
    int active;            /* 0: no job (not sent) */
    uint64_t step, steps;  /* steps done, of the run's total */
    float loss;            /* running average; NaN: none yet */
    float steps_per_s;     /* since the job started; 0: not measured yet */
    uint8_t partition[32]; /* partition_id */
    uint32_t cluster;
    int served; /* a snapshot of it is advertised */
    float heldout_loss;    /* model/heldout.h, at heldout_step; NaN: not measured yet */
    uint64_t heldout_step;
} ts_gossip_training_t;
void ts_gossip_set_training(ts_gossip_t *g, const ts_gossip_training_t *t); /* NULL: none */

/* Whether an advert's expert is trained to the end: no training status, or its step has
 * reached its total. Clients route to these by default; status counts only these as covering. */
int ts_advert_trained(const Tessera__AdvertBody *b);

/* Announces our advert: body->version is set here (one more than the last), the body is signed
 * with our identity and its hash (BLAKE2b-256 of the AdvertBody bytes) gossiped in our claim.
 * The body is copied. Before ts_gossip_start it is checked and kept, and announced by start.
 * TS_EINVAL with a sentence for a body that breaks docs/protocol.md's rules. */
int ts_gossip_set_advert(ts_gossip_t *g, const Tessera__AdvertBody *body, char *err, size_t errlen);

/* Leaves gracefully (a signed leave, spread as far as it goes), then calls done once (done may
 * be NULL). TS_EINVAL before start or after close. */
int ts_gossip_leave(ts_gossip_t *g, void (*done)(ts_gossip_t *g, void *arg), void *arg);

/* Stops timers, closes the socket, flushes the address book, cancels exchanges in flight; calls
 * closed once everything has closed. */
void ts_gossip_close(ts_gossip_t *g, void (*closed)(ts_gossip_t *g, void *arg), void *arg);
void ts_gossip_free(ts_gossip_t *g);

/* The core, for inspection (member counts, ts_swim_member_get, stats); NULL before
 * ts_gossip_start, which creates it (its first claim needs the bound port). */
const ts_swim_t *ts_gossip_swim(const ts_gossip_t *g);

/* The status answer as this node sees it now: members (when req asks), adverts (when req asks),
 * our load, aggregates; req NULL asks for everything. *out owns all its memory. Free with
 * ts_gossip_status_free. TS_ENOMEM. */
int ts_gossip_status(ts_gossip_t *g, const Tessera__StatusRequest *req,
                     Tessera__StatusResponse **out);
void ts_gossip_status_free(Tessera__StatusResponse *resp);

/* The advert held for a member (the signed Advert as received, packed), TS_ENOTFOUND. */
int ts_gossip_advert_get(const ts_gossip_t *g, const uint8_t id[TS_NODE_ID_BYTES],
                         const uint8_t **packed, size_t *len);

/* Whether a's signature is its node's over its body (docs/protocol.md §9): what a client checks
 * of the adverts a status answer relays. TS_OK, or TS_ECORRUPT (malformed or not verifying). It
 * does not say the advert is current: only the node's gossiped claim does. */
int ts_gossip_advert_check(const Tessera__Advert *a);

/* ---- bans (daemon/trust.h: an accusation upheld) ---------------------------------------------
 * A banned node's adverts are no longer passed on: status answers leave them out (and out of
 * the aggregates) and list the ban instead; advert requests for it are answered NOT_FOUND. It
 * stays a member unless expelled: then its datagrams are dropped, its signed claims are refused
 * whoever relays them (so its view here stops at its last claim before the ban), and status
 * answers no longer list it among the members. A ban lasts as long as the process. */
typedef struct ts_gossip_ban_info {
    uint8_t id[TS_NODE_ID_BYTES];
    uint8_t expert[32];  /* the expert it answered for wrongly */
    char reason[256];    /* what was found, for people */
    uint64_t since_ms;   /* Unix ms */
    int expelled;
} ts_gossip_ban_info_t;

/* Bans b->id (copied; since_ms set here). 1 when it is new, 0 when the node was already banned
 * (nothing changes), TS_ERANGE when as many nodes as max_members are banned already, TS_ENOMEM. */
int ts_gossip_ban(ts_gossip_t *g, const ts_gossip_ban_info_t *b);
/* The ban of node id, or NULL. */
const ts_gossip_ban_info_t *ts_gossip_banned(const ts_gossip_t *g, const uint8_t id[TS_NODE_ID_BYTES]);
/* The bans, in the order they were made. */
const ts_gossip_ban_info_t *ts_gossip_bans(const ts_gossip_t *g, uint32_t *n);

/* Counters of this layer (the core's are in ts_swim_get_stats). */
typedef struct ts_gossip_stats {
    uint64_t udp_in, udp_out, udp_bytes_in, udp_bytes_out;
    uint64_t udp_unsealed_failed; /* wrong key, tampered, truncated */
    uint64_t udp_replayed;        /* a counter already seen or too old */
    uint64_t udp_malformed;       /* opened but did not decode */
    uint64_t udp_expelled;        /* from a node expelled here (a ban with expel) */
    uint64_t udp_send_failed;
    uint64_t pushpull_ok, pushpull_failed, pushpull_served;
    uint64_t pushpull_digests; /* of the push-pulls started, those by digest (not joins) */
    uint64_t pushpull_buckets; /* differing buckets found in the digests served */
    uint64_t adverts_fetched, adverts_rejected, adverts_served;
    uint64_t book_writes;
} ts_gossip_stats_t;
void ts_gossip_get_stats(const ts_gossip_t *g, ts_gossip_stats_t *st);

#ifdef __cplusplus
}
#endif

#endif
