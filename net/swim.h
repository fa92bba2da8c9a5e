/*
 * swim.h — gossip membership (architecture.md §6): SWIM with Lifeguard's refinements, as a pure
 * state machine.
 *
 * One ts_swim_t is one node's view of the network: which members exist, whether each is alive,
 * suspect, dead or gone, at which incarnation, at which address, and which advert version it
 * serves. It reads no clock, opens no socket, starts no thread and keeps no global state. Time
 * and packets come in as arguments; what the node wants done goes out through three queues the
 * caller drains after every call:
 *
 *   in                                   out
 *   ts_swim_tick(now)                    ts_swim_next_packet()   a datagram to send: address +
 *   ts_swim_on_packet(now, from, msg)                            message struct (swim_wire.h
 *   ts_swim_join(now, seeds)                                     encodes it)
 *   ts_swim_leave(now)                   ts_swim_next_event()    membership changes, and two
 *   ts_swim_set_advert(now, ver, hash)                           requests: "push-pull with X",
 *   ts_swim_merge_state(now, peer, …)                            "fetch X's advert"
 *                                        ts_swim_next_deadline() when to call tick next
 *
 * Every input function may queue packets and events; after it returns the caller drains both
 * (until they return 0) and arms one timer for ts_swim_next_deadline(). The queues are bounded
 * (config); what overflows is dropped and counted in ts_swim_stats_t, never allocated. Apart
 * from ts_swim_create, nothing allocates.
 *
 * Messages are plaintext structs. Sealing (XChaCha20-Poly1305 under the network key, with the
 * sender id and a replay counter, architecture.md §5) is the transport's job, between
 * ts_swim_wire_encode and the socket; the packet budget below leaves it TS_SWIM_SEAL_RESERVE bytes.
 *
 * Signed claims. A node's statements about itself — "I am alive at incarnation i, at this
 * address, serving advert version v with hash h", and "I am leaving" — are claims signed by the
 * node (Ed25519 in the daemon, through the sign and verify callbacks given at creation). Every
 * alive or leave claim received is verified before it can change the view; one that fails is
 * dropped and counted. Suspect and dead updates are accusations by others and carry the
 * accuser's id instead. The advert digest (version, hash) travels inside the alive claim, so
 * the same signature authenticates it and nobody but X can announce X's adverts.
 *
 * Not thread-safe: one thread drives a ts_swim_t (and the claims pool it uses) at a time.
 */
#ifndef TS_SWIM_H
#define TS_SWIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TS_SWIM_ID_LEN 32   /* node id = the node's Ed25519 public key */
#define TS_SWIM_SIG_LEN 64  /* an Ed25519 signature */
#define TS_SWIM_HASH_LEN 32 /* BLAKE2b-256 of the signed advert */

/* A datagram may be at most TS_SWIM_PACKET_MAX bytes once sealed; the core's plaintext gets
 * TS_SWIM_PLAIN_MAX of them and the transport keeps TS_SWIM_SEAL_RESERVE for its nonce, tag and
 * counter (XChaCha20-Poly1305: 24 + 16, plus an 8-byte counter, with 16 to spare). */
#define TS_SWIM_PACKET_MAX 1400
#define TS_SWIM_SEAL_RESERVE 64
#define TS_SWIM_PLAIN_MAX (TS_SWIM_PACKET_MAX - TS_SWIM_SEAL_RESERVE)

/* The most piggybacked updates one packet can carry: the plaintext budget over the smallest
 * encoded update (swim_wire.c checks this against its sizes at compile time). */
#define TS_SWIM_MAX_UPDATES 18

/* An IPv6 address (IPv4 as ::ffff:a.b.c.d) and a port. */
typedef struct ts_swim_addr {
    uint8_t ip[16];
    uint16_t port;
} ts_swim_addr_t;

/* ---- claims and updates ---------------------------------------------------------------------- */

typedef enum {
    TS_SWIM_CLAIM_ALIVE = 1, /* "alive at incarnation, address, advert" */
    TS_SWIM_CLAIM_LEAVE = 2, /* "leaving at incarnation" (address and advert unused, zero) */
} ts_swim_claim_kind_t;

/* A statement a node signs about itself. sig covers ts_swim_claim_signed_bytes(claim)
 * (swim_wire.h): a domain tag, then every field but sig. */
typedef struct ts_swim_claim {
    uint8_t id[TS_SWIM_ID_LEN];
    uint8_t sig[TS_SWIM_SIG_LEN];
    uint8_t advert_hash[TS_SWIM_HASH_LEN];
    uint64_t advert_version; /* 0: no advert yet */
    uint32_t incarnation;
    ts_swim_addr_t addr;
    uint8_t kind; /* ts_swim_claim_kind_t */
} ts_swim_claim_t;

/* "id is suspect / dead at incarnation", said by from. */
typedef struct ts_swim_accusation {
    uint8_t id[TS_SWIM_ID_LEN];
    uint8_t from[TS_SWIM_ID_LEN];
    uint32_t incarnation;
} ts_swim_accusation_t;

typedef enum {
    TS_SWIM_UP_ALIVE = 1,   /* u.claim, kind ALIVE */
    TS_SWIM_UP_SUSPECT = 2, /* u.accuse */
    TS_SWIM_UP_DEAD = 3,    /* u.accuse */
    TS_SWIM_UP_LEAVE = 4,   /* u.claim, kind LEAVE */
} ts_swim_update_type_t;

/* One piggybacked membership update. */
typedef struct ts_swim_update {
    uint8_t type; /* ts_swim_update_type_t */
    union {
        ts_swim_claim_t claim;
        ts_swim_accusation_t accuse;
    } u;
} ts_swim_update_t;

/* ---- messages -------------------------------------------------------------------------------- */

typedef enum {
    TS_SWIM_PING = 1,     /* "are you there?" — seq, target (the id meant to answer) */
    TS_SWIM_ACK = 2,      /* "yes" — seq of the ping, or of the ping-req it answers; flags */
    TS_SWIM_PING_REQ = 3, /* "ping target at target_addr for me" — seq, target, target_addr */
    TS_SWIM_NACK = 4,     /* "I pinged it for you and heard nothing" — seq of the ping-req */
    TS_SWIM_GOSSIP = 5,   /* updates only */
} ts_swim_msg_type_t;

/* ACK flags. WHO_ARE_YOU: the pinger is not in our member table, so its claim never reached
 * us; it answers by sending us its claim. */
#define TS_SWIM_ACK_WHO_ARE_YOU 0x01

/* One datagram's content: a header and up to TS_SWIM_MAX_UPDATES piggybacked updates. */
typedef struct ts_swim_msg {
    uint8_t type; /* ts_swim_msg_type_t */
    uint8_t from[TS_SWIM_ID_LEN];
    uint32_t seq;
    uint8_t flags;                  /* ACK */
    uint8_t target[TS_SWIM_ID_LEN]; /* PING, PING_REQ */
    ts_swim_addr_t target_addr;     /* PING_REQ */
    uint8_t n_updates;
    ts_swim_update_t updates[TS_SWIM_MAX_UPDATES];
} ts_swim_msg_t;

/* ---- members, state, events ------------------------------------------------------------------ */

typedef enum {
    TS_SWIM_ALIVE = 1,
    TS_SWIM_SUSPECT = 2,
    TS_SWIM_DEAD = 3,
    TS_SWIM_LEFT = 4,
} ts_swim_state_t;

/* One member as a node sees it; also the unit of push-pull's full state. claim is the member's
 * latest signed claim: its alive claim (for DEAD and SUSPECT members too, the last one heard),
 * or its leave claim once it has LEFT. incarnation is the state's, which may exceed the
 * claim's: a suspicion at a newer incarnation than the last claim heard. */
typedef struct ts_swim_member_info {
    ts_swim_claim_t claim;
    uint32_t incarnation;
    uint8_t state;     /* ts_swim_state_t */
    int64_t change_ms; /* when the state last changed, on the caller's clock */
} ts_swim_member_info_t;

typedef enum {
    TS_SWIM_EV_JOINED = 1,    /* a member we did not know, alive */
    TS_SWIM_EV_SUSPECT,       /* a member became suspect */
    TS_SWIM_EV_DEAD,          /* a member was declared dead (by us or by someone we heard) */
    TS_SWIM_EV_ALIVE_AGAIN,   /* a suspect, dead or departed member is alive at a newer
                                   incarnation */
    TS_SWIM_EV_LEFT,          /* a member left gracefully (its signed leave) */
    TS_SWIM_EV_REAPED,        /* a dead or departed member was forgotten */
    TS_SWIM_EV_ADDR_CHANGED,  /* a member's claim moved it to a new address */
    TS_SWIM_EV_ADVERT_NEEDED, /* request: a member's advert (version, hash) is newer than the
                                   one we hold: fetch it from that member over TCP */
    TS_SWIM_EV_PUSH_PULL,     /* request: exchange full state with this member over TCP now
                                   (ts_swim_state_export both ways, ts_swim_merge_state); for a
                                   join, id is all zeros and only addr is known */
    TS_SWIM_EV_REFUTED,       /* we were suspected or declared dead and answered with a new
                                   incarnation (incarnation: the new one) */
} ts_swim_event_type_t;

typedef struct ts_swim_event {
    uint8_t type;  /* ts_swim_event_type_t */
    uint8_t state; /* the member's state after the change (ts_swim_state_t) */
    uint8_t id[TS_SWIM_ID_LEN];
    ts_swim_addr_t addr;
    uint32_t incarnation;
    uint64_t advert_version;
    uint8_t advert_hash[TS_SWIM_HASH_LEN];
    int64_t at_ms;
} ts_swim_event_t;

/* Counters, for status and for tests. All only grow. */
typedef struct ts_swim_stats {
    uint64_t packets_in, packets_out;
    uint64_t probes, probes_failed, probes_abandoned; /* abandoned: we stalled, not them */
    uint64_t ping_reqs_sent, nacks_received, acks_relayed, nacks_sent;
    uint64_t claims_verified, claims_rejected; /* rejected: the signature did not verify */
    uint64_t stale_ignored;                    /* updates older than what we hold */
    uint64_t refutations;
    uint64_t suspicions, confirmations, deaths_declared; /* deaths: by our own timer */
    uint64_t last_chance_pings; /* to a suspect, a probe interval before our verdict */
    uint64_t stalls_detected;   /* ticks far past their deadline */
    uint64_t broadcasts_dropped, events_dropped, packets_dropped; /* full queues */
    uint64_t suspicions_dropped, relays_dropped, claims_dropped, members_dropped;
    uint64_t pings_misaddressed; /* pings for another id: a stale address */
    uint64_t sign_failures;      /* the sign callback failed: our claim did not change */
} ts_swim_stats_t;

/* ---- configuration --------------------------------------------------------------------------- */

/* sign: writes the caller's signature over msg[0..len) to sig; 0 on success. Called for our own
 * claims (creation, refutation, advert change, leave). verify: 0 when sig is id's valid
 * signature over msg[0..len), anything else when not. Both are called synchronously from the
 * ts_swim_* call that needs them and must not call back into the core. */
typedef int (*ts_swim_sign_fn)(void *ctx, const uint8_t *msg, size_t len,
                               uint8_t sig[TS_SWIM_SIG_LEN]);
typedef int (*ts_swim_verify_fn)(void *ctx, const uint8_t id[TS_SWIM_ID_LEN], const uint8_t *msg,
                                 size_t len, const uint8_t sig[TS_SWIM_SIG_LEN]);

typedef struct ts_swim_claims ts_swim_claims_t;

/* Defaults in ts_swim_config_default; docs/architecture.md ("Gossip") says why each. */
typedef struct ts_swim_config {
    int probe_interval_ms;        /* a probe round: one member pinged (1000) */
    int probe_timeout_ms;         /* direct ack wait before asking others (500) */
    int indirect_probes;          /* k members asked to ping-req (3) */
    int gossip_interval_ms;       /* a gossip round, when updates are queued (200) */
    int gossip_fanout;            /* members each gossip round goes to (3) */
    int retransmit_mult;          /* λ: an update is sent λ·⌈log10(n+1)⌉ times (4) */
    int suspicion_mult;           /* α: shortest suspicion α·log10(n)·probe_interval (4) */
    int suspicion_max_mult;       /* β: a lone accusation waits β times the shortest (6) */
    int suspicion_min_ms;         /* floor of the shortest suspicion (2000) */
    int suspicion_confirm;        /* K: independent accusers that bring it to the shortest (3) */
    int health_max;               /* Lifeguard's local health multiplier cap S (8) */
    int stall_slack_ms;           /* a tick this late, nothing in between: we stalled (250) */
    int push_pull_interval_ms;    /* anti-entropy, scaled up past 32 members (30000); 0: never */
    bool push_pull_fixed;         /* the period does not grow with n: exchanges by digests cost
                                   * the same at any size (false: memberlist's log scaling) */
    int join_retry_ms;            /* retry the seeds while we know nobody (5000) */
    int dead_retention_ms;        /* dead and departed members are remembered this long (600000) */
    int leave_linger_ms;          /* after leave, keep gossiping at most this long (5000) */
    int max_packet;               /* plaintext budget of one datagram (TS_SWIM_PLAIN_MAX) */
    uint32_t initial_incarnation; /* (0) a restart may begin at 0 again: the node moves above
                                     its old claims as soon as it hears one */
    /* bounds of the preallocated tables */
    uint32_t max_members;    /* including ourselves (1024) */
    uint32_t max_broadcasts; /* queued updates (256) */
    uint32_t max_suspicions; /* members suspect at once with their accusers tracked (256) */
    uint32_t max_events;     /* undrained events (256) */
    uint32_t max_outbox;     /* undrained packets (64) */
    uint32_t max_relays;     /* ping-reqs being served at once (32) */
    /* signatures (required) */
    ts_swim_sign_fn sign;
    ts_swim_verify_fn verify;
    void *crypto_ctx;
    /* where signed claims are kept: NULL (the default) for a private pool sized from the bounds
     * above; or a pool shared by many cores in one process (the simulator), which must outlive
     * them. */
    ts_swim_claims_t *claims;
} ts_swim_config_t;

void ts_swim_config_default(ts_swim_config_t *cfg);

/* ---- the claims pool ------------------------------------------------------------------------- */

/* Signed claims are immutable values, kept once per pool with a reference count. A core uses a
 * private pool unless config.claims names one to share: N cores simulating N nodes hold N
 * member tables of N entries, but only about N distinct claims, so sharing brings the
 * simulator's memory from O(N²) claims (160 bytes each) to O(N). Capacity is fixed at creation;
 * a claim that does not fit is dropped and counted by the core that wanted it. */
int ts_swim_claims_create(uint32_t capacity, ts_swim_claims_t **out);
void ts_swim_claims_free(ts_swim_claims_t *pool);
uint32_t ts_swim_claims_count(const ts_swim_claims_t *pool); /* distinct claims held */

/* ---- the core -------------------------------------------------------------------------------- */

typedef struct ts_swim ts_swim_t;

/* Creates the view of node self_id at self_addr, alive at cfg->initial_incarnation with no
 * advert, knowing nobody; signs its first claim (cfg->sign); draws its random choices from seed
 * (same seed, same inputs: same outputs). Allocates every table once, sized by cfg. Free with
 * ts_swim_free. TS_EINVAL for a bad config (timeouts not positive, probe timeout not below the
 * interval, a bound of 0, no sign or verify), TS_ENOMEM, or sign's failure as TS_EINVAL. */
int ts_swim_create(const ts_swim_config_t *cfg, const uint8_t self_id[TS_SWIM_ID_LEN],
                   const ts_swim_addr_t *self_addr, uint64_t seed, int64_t now_ms, ts_swim_t **out);
void ts_swim_free(ts_swim_t *s);

/* Runs every timer due at now_ms: probe rounds and their timeouts, gossip, suspicion timeouts,
 * relayed probes, push-pull and join retries, reaping. Calling it early does nothing harmful.
 * Calling it more than stall_slack_ms after ts_swim_next_deadline(), with no datagram handed in
 * meanwhile, tells the core that it was not running (a stalled process): it then blames
 * itself, not the member it was probing. An event loop that runs timers before reading its
 * sockets (libuv does) gives it exactly that picture after a stall. */
int ts_swim_tick(ts_swim_t *s, int64_t now_ms);

/* The earliest time at which ts_swim_tick has work to do. */
int64_t ts_swim_next_deadline(const ts_swim_t *s);

/* Handles one decoded datagram that arrived from address from. msg is only read. TS_EINVAL for
 * NULL arguments or an unknown message type; everything else a peer can send (bad signatures,
 * stale or unknown members, acks nobody asked for) is ignored and counted, not an error. */
int ts_swim_on_packet(ts_swim_t *s, int64_t now_ms, const ts_swim_addr_t *from,
                      const ts_swim_msg_t *msg);

/* Asks to join through seeds[0..n) (n ≤ 8, addresses only): queues a PUSH_PULL request and a
 * gossip datagram carrying our claim for each, and repeats every join_retry_ms while we know no
 * other live member. TS_EINVAL when n is 0 or above 8. */
int ts_swim_join(ts_swim_t *s, int64_t now_ms, const ts_swim_addr_t *seeds, size_t n);

/* Leaves gracefully: signs a leave claim at our incarnation, sends it to up to twice the gossip
 * fanout members at once and keeps gossiping it (no more probing) until it has been sent its
 * retransmit limit or leave_linger_ms has passed; see ts_swim_leave_done. Idempotent. */
int ts_swim_leave(ts_swim_t *s, int64_t now_ms);
/* True once a leave has been spread as far as it will be: the caller may stop. */
bool ts_swim_leave_done(const ts_swim_t *s, int64_t now_ms);

/* Announces our advert (version, hash): a new alive claim, gossiped. TS_EINVAL unless version
 * is greater than the current one; TS_ENOTSUP after leave. */
int ts_swim_set_advert(ts_swim_t *s, int64_t now_ms, uint64_t version,
                       const uint8_t hash[TS_SWIM_HASH_LEN]);

/* Moves us to addr (a relay's address for us, or back): a new alive claim at the next
 * incarnation, gossiped network-wide. TS_OK and nothing new when addr is the current one;
 * TS_EINVAL for port 0; TS_ENOTSUP after leave; TS_ERANGE at the last incarnation. */
int ts_swim_set_addr(ts_swim_t *s, int64_t now_ms, const ts_swim_addr_t *addr);

/* Output queues. Each returns 1 and fills its argument when it took one item, 0 when the queue
 * is empty. A packet's piggyback is chosen when it is taken, so take packets only to send them. */
int ts_swim_next_packet(ts_swim_t *s, ts_swim_addr_t *to, ts_swim_msg_t *msg);
int ts_swim_next_event(ts_swim_t *s, ts_swim_event_t *ev);

/* ---- anti-entropy and inspection ------------------------------------------------------------- */

/* Number of members known (any state), ourselves included: the size of a full state. */
uint32_t ts_swim_member_count(const ts_swim_t *s);
/* Members in a given state, ourselves included. */
uint32_t ts_swim_count(const ts_swim_t *s, ts_swim_state_t state);

/* Writes up to max members (ourselves first) to out; returns how many were written. */
uint32_t ts_swim_state_export(const ts_swim_t *s, ts_swim_member_info_t *out, uint32_t max);

/* Merges a full state received from peer_id through push-pull: each claim is treated as if it
 * had been gossiped (verified, ignored when stale); a member the peer holds suspect becomes an
 * accusation by the peer, and so does one it holds dead (we suspect what others report dead
 * rather than believe it outright: the member can still refute); a member the peer holds
 * suspect or dead and we do not know is skipped (its old claim would revive it). What is new
 * to us is gossiped on, except during a join (ts_swim_join from knowing nobody, until the first
 * merge teaches us someone): then it is new only to us. change_ms is ignored. */
int ts_swim_merge_state(ts_swim_t *s, int64_t now_ms, const uint8_t peer_id[TS_SWIM_ID_LEN],
                        const ts_swim_member_info_t *entries, uint32_t n);

/* Push-pull by digests. A full state grows with n; two views that agree should cost nothing
 * to compare. So the members are split into TS_SWIM_DIGEST_BUCKETS buckets by the first byte of
 * their id, and a digest holds one 64-bit hash per bucket: the XOR of a hash of each member's
 * id, state class (live — alive or suspect —, dead, left), address and advert (version, hash).
 * Incarnations and suspicions are left out on purpose: refutations and suspicions are local
 * (they reach only the accusers and the suspect's witnesses), so views differ in them all the
 * time, and a difference in them alone is not worth a member's 164 bytes.
 *
 * An exchange: A sends its digest; B answers with the mask of buckets whose hashes differ and
 * its members in them (ts_swim_state_export_buckets); A merges those (ts_swim_merge_state) and
 * sends its own members in the same buckets, which B merges. Bytes: the digest (2 KiB) and the
 * members of the differing buckets, about n/256 each. */
#define TS_SWIM_DIGEST_BUCKETS 256
#define TS_SWIM_DIGEST_MASK_BYTES (TS_SWIM_DIGEST_BUCKETS / 8)

typedef struct ts_swim_digest {
    uint64_t bucket[TS_SWIM_DIGEST_BUCKETS];
} ts_swim_digest_t;

/* Our digest. O(members). */
void ts_swim_state_digest(const ts_swim_t *s, ts_swim_digest_t *d);
/* Sets in mask (zeroed first) the bucket bits where a and b differ; returns how many. */
uint32_t ts_swim_digest_diff(const ts_swim_digest_t *a, const ts_swim_digest_t *b,
                             uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES]);
/* Writes up to max members whose bucket is set in mask to out; returns how many. */
uint32_t ts_swim_state_export_buckets(const ts_swim_t *s,
                                      const uint8_t mask[TS_SWIM_DIGEST_MASK_BYTES],
                                      ts_swim_member_info_t *out, uint32_t max);
/* The bucket of a member id. */
static inline uint32_t ts_swim_digest_bucket(const uint8_t id[TS_SWIM_ID_LEN]) { return id[0]; }

/* The member id as we see it; TS_ENOTFOUND when unknown (or reaped). */
int ts_swim_member_get(const ts_swim_t *s, const uint8_t id[TS_SWIM_ID_LEN],
                       ts_swim_member_info_t *info);

/* Our incarnation, our local health multiplier (0..health_max), the updates queued for gossip,
 * our counters. */
uint32_t ts_swim_incarnation(const ts_swim_t *s);
int ts_swim_health(const ts_swim_t *s);
uint32_t ts_swim_pending_broadcasts(const ts_swim_t *s);
void ts_swim_get_stats(const ts_swim_t *s, ts_swim_stats_t *st);

/* Checks the core's internal invariants (the member index, the probe order, the suspicion and
 * gossip tables and their back-pointers, the per-state counts): TS_OK, or TS_ECORRUPT when one
 * does not hold — a bug in the core. O(max_members); for tests and debugging. */
int ts_swim_validate(const ts_swim_t *s);

/* The timing the core uses now, for n known live members (for docs and tests): the suspicion
 * timeout's floor and ceiling, and the retransmit limit. */
int64_t ts_swim_suspicion_min_ms(const ts_swim_config_t *cfg, uint32_t n);
int64_t ts_swim_suspicion_max_ms(const ts_swim_config_t *cfg, uint32_t n);
int ts_swim_retransmit_limit(const ts_swim_config_t *cfg, uint32_t n);

const char *ts_swim_state_name(int state);
const char *ts_swim_event_name(int type);

#ifdef __cplusplus
}
#endif

#endif
