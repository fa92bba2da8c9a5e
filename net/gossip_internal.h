/*
 * gossip_internal.h — internal to the gossip driver (net/gossip.h): the state behind
 * ts_gossip_t and the helpers its files share. Included only by gossip.c, gossip_push_pull.c,
 * gossip_advert.c, gossip_book.c and gossip_status.c.
 *
 * The driver is split along its seams:
 *   gossip.c            the core on the loop: addresses, the seal, replay windows, the
 *                       datagram path, TCP operations in flight, the pump, the life cycle;
 *   gossip_push_pull.c  push-pull: our state sent, the peer's merged, both ways, over RPC;
 *   gossip_advert.c     adverts: ours signed and announced, others fetched, verified, served;
 *   gossip_book.c       the address book: members heard alive written to the store, and read
 *                       back at start as seeds;
 *   gossip_status.c     the status view: ts_gossip_status and the status_request handler.
 *
 * Naming. A helper shared between these files has external linkage, so it is named
 * ts_gossip__<name> (two underscores: the module's prefix, then a name no public symbol of
 * gossip.h can take); a helper used by one file stays static with its short name. The
 * constants below are unprefixed: this header is never included outside the driver. Like
 * gossip.h, it needs _POSIX_C_SOURCE 200809L defined before the first include.
 */
#ifndef TS_GOSSIP_INTERNAL_H
#define TS_GOSSIP_INTERNAL_H

#include <stdint.h>

#include "base/list.h"
#include "net/gossip.h"

#define ADDR_STR 64   /* "[v6]:port" and a NUL */
#define RECV_BUF 2048 /* larger than any datagram we accept: a longer one is truncated */

/* ---- the state ------------------------------------------------------------------------------ */

/* One sender's replay window: the highest counter seen and which of the 64 below it were. */
typedef struct replay {
    uint8_t id[TS_SWIM_ID_LEN];
    uint64_t top, seen;
    uint64_t heard_ms; /* for eviction: the least recently heard goes first */
} replay_t;

/* An advert held: ours or one fetched and verified. */
typedef struct advert {
    uint8_t id[TS_SWIM_ID_LEN];
    uint64_t version;
    uint8_t hash[TS_SWIM_HASH_LEN];
    uint8_t *packed; /* the signed Advert, packed */
    size_t packed_len;
    Tessera__Advert *msg;      /* unpacked from packed (protobuf-c's allocator) */
    Tessera__AdvertBody *body; /* decoded from msg->body (ts_frame_free) */
} advert_t;

typedef enum { OP_PUSH_PULL, OP_FETCH } op_kind_t;

/* A TCP exchange in flight. */
typedef struct op {
    ts_list_t link;
    ts_gossip_t *g;
    op_kind_t kind;
    ts_rpc_call_t *call;
    ts_rpc_peer_t *peer;
    uint8_t id[TS_SWIM_ID_LEN]; /* the member (zero for a join's push-pull) */
} op_t;

/* A bootstrap name being resolved. */
typedef struct resolve {
    uv_getaddrinfo_t req;
    ts_gossip_t *g;
} resolve_t;

struct ts_gossip {
    uv_loop_t *loop;
    ts_rpc_t *rpc;
    char health[256];       /* StatusResponse.health ("" until set: not sent) */
    char metrics_url[128];  /* StatusResponse.metrics ("": not sent) */
    ts_gossip_training_t training; /* StatusResponse.training (step/steps 0: not sent) */
    ts_gossip_config_t cfg; /* bootstrap, listen, advertise point into the copies below */
    char listen[ADDR_STR], advertise[ADDR_STR];
    char **bootstrap;
    ts_node_id_t self;
    uint8_t sign_sk[TS_SIGN_SECRET_BYTES]; /* secret: wiped by ts_gossip_free */
    uint8_t seal_key[32];                  /* secret: wiped by ts_gossip_free */
    ts_swim_t *swim;                       /* created by start, once the port is known */
    ts_swim_addr_t self_addr;              /* the configured address (the port bound) */
    int has_relay;
    ts_node_id_t relay_id; /* that relay's node id, put into our advert */

    uv_udp_t udp;
    uv_timer_t timer, housekeeper;
    int handles; /* handles initialised and not yet closed */
    int started, closing;
    uint8_t recv_buf[RECV_BUF];
    uint64_t counter; /* the next datagram's seal counter */

    replay_t *replay;
    uint32_t n_replay, max_replay;

    advert_t *adverts; /* unordered; at most max_members */
    uint32_t n_adverts;
    Tessera__AdvertBody *own_body; /* our advert before start (announced there), else NULL */
    uint64_t own_version;

    ts_list_t ops;
    uint32_t n_push_pulls, n_fetches;
    resolve_t *resolves;
    uint32_t n_resolves, pending_resolves;
    ts_swim_addr_t seeds[TS_GOSSIP_MAX_SEEDS];
    uint32_t n_seeds;

    uint8_t (*dirty)[TS_SWIM_ID_LEN]; /* members heard alive since the last book write */
    uint32_t n_dirty;
    int book_full; /* the dirty list overflowed, or a refresh is due: write every live member */
    int64_t book_refreshed_ms;

    ts_swim_member_info_t *members; /* max_members entries, scratch for export and decode */

    ts_gossip_ban_info_t *bans; /* in the order made (gossip_ban.c) */
    uint32_t n_bans, cap_bans;

    ts_gossip_event_fn on_event;
    void *on_event_arg;
    ts_gossip_load_fn on_load;
    void *on_load_arg;
    void (*leave_done)(ts_gossip_t *, void *);
    void *leave_arg;
    void (*closed)(ts_gossip_t *, void *);
    void *closed_arg;
    ts_gossip_stats_t st;
};

static inline int64_t now_ms(const ts_gossip_t *g) { return (int64_t)uv_now(g->loop); }

/* ---- gossip.c ------------------------------------------------------------------------------- */

/* Drains the core's packets and events and re-arms its timer: after every call into the core. */
void ts_gossip__pump(ts_gossip_t *g);
/* "a.b.c.d:port" or "[v6]:port". */
void ts_gossip__addr_str(const ts_swim_addr_t *a, char out[ADDR_STR]);
/* A numeric "ip:port" (IPv6 in brackets) into a; port 0 allowed when allow_zero. */
int ts_gossip__addr_parse(const char *s, ts_swim_addr_t *a, int allow_zero, char *err,
                          size_t errlen);
/* A TCP exchange with member id (zero for a join's push-pull), counted in g; NULL without
 * memory. */
op_t *ts_gossip__op_new(ts_gossip_t *g, op_kind_t kind, const uint8_t id[TS_SWIM_ID_LEN]);
void ts_gossip__op_free(op_t *op);
/* Sends env to addr as op's call; on failure the op is freed and -1 returned. */
int ts_gossip__op_call(op_t *op, const ts_swim_addr_t *addr, const Tessera__Envelope *env,
                       uint32_t timeout_ms, ts_rpc_cb cb);

/* ---- gossip_push_pull.c --------------------------------------------------------------------- */

/* Starts the push-pull the core asked for in ev (with ev->id, or a seed at ev->addr). */
void ts_gossip__start_push_pull(ts_gossip_t *g, const ts_swim_event_t *ev);
/* The push_pull handler. */
void ts_gossip__serve_push_pull(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg);

/* ---- gossip_advert.c ------------------------------------------------------------------------ */

/* The advert held for member id, or NULL. */
advert_t *ts_gossip__advert_find(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]);
/* Frees what a holds and zeroes it. */
void ts_gossip__advert_clear(advert_t *a);
/* Forgets the advert held for member id (a reaped member's). */
void ts_gossip__advert_drop(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]);
/* Asks member id, at addr, for its advert of at least version. */
void ts_gossip__start_fetch(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN],
                            const ts_swim_addr_t *addr, uint64_t version);
/* Fetches the adverts of live members whose claim announces one we do not hold. */
void ts_gossip__reconcile_adverts(ts_gossip_t *g);
/* Signs body (version set) as our advert, keeps it and announces it to the core. */
int ts_gossip__announce_own(ts_gossip_t *g, Tessera__AdvertBody *body, char *err, size_t errlen);
/* The advert_request handler. */
void ts_gossip__serve_advert(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg);

/* ---- gossip_book.c -------------------------------------------------------------------------- */

/* Marks member id, heard alive, for the next book write. */
void ts_gossip__book_mark(ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]);
/* Writes the marked members (or, for a refresh, every live member) that are alive now. */
void ts_gossip__book_flush(ts_gossip_t *g);
/* Prunes the book and adds its most recently seen entries to the seeds. */
void ts_gossip__book_load(ts_gossip_t *g);
/* Adds a to the seeds unless it is ourselves, already there, or the seeds are full; 1 when
 * added. */
int ts_gossip__seed_add(ts_gossip_t *g, const ts_swim_addr_t *a);

/* ---- gossip_ban.c ---------------------------------------------------------------------------- */

/* Whether member id's datagrams are dropped (it was expelled). */
int ts_gossip__expelled(const ts_gossip_t *g, const uint8_t id[TS_SWIM_ID_LEN]);

/* ---- gossip_status.c ------------------------------------------------------------------------ */

/* The status_request handler. */
void ts_gossip__serve_status(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg);

#endif
