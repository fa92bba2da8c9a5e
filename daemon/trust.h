/*
 * trust.h — accusations (docs/protocol.md "Accusations"): a node's answer to the evidence that
 * another node answered a denoising request wrongly.
 *
 * A client that catches a lie (client/remote_check.c) sends an Accusation — the request as asked
 * and the accused's answer as received, its signature included — to the nodes it knows. This
 * module serves that request:
 *
 *   1. The accused's signature must be over this answer to this request (net/answer.h): an
 *      answer can then be pinned on the node that signed it and on no other. The accused must be
 *      a live (or suspect) member advertising that expert here: evidence against a key pair that
 *      serves nothing is not judged. At most 256 samples.
 *   2. The request is recomputed with the expert's weights from this node's store, on a CPU
 *      engine of its own, on the loop's work pool. A node that does not hold the weights fetches
 *      them first (daemon/fetcher.h: verified against the weights hash, so any member
 *      advertising the expert will do, the accused too); when none can give them it cannot
 *      judge, says so and does nothing else.
 *   3. The accused's answer is compared with the recomputation by net/answer.h's rules: upheld
 *      only when it is wrong beyond doubt (a bit off where the device classes promise the same
 *      bits, else ten times the tolerance, which grows with the request's guidance). Nothing is
 *      decided by counting who agrees, so no set of colluding nodes can get an honest one banned.
 *   4. Upheld: the node is banned here (net/gossip.h ts_gossip_ban: its adverts are no longer
 *      passed on to clients; with [trust] expel it leaves the membership here too), and the
 *      accusation is passed on to every other live member, which judges it the same way.
 *
 * The answer (AccusationVerdict) says whether it was judged, upheld, and why. An accusation is
 * the accused and everything its signature covers; each is judged once: a repeat is answered
 * with the first verdict (one that arrives while it is judged waits for it). Two are fetched or
 * recomputed at once, up to 32 wait their turn, more are answered busy. Threading: the loop's,
 * except the recomputation.
 */
#ifndef TS_DAEMON_TRUST_H
#define TS_DAEMON_TRUST_H

#include <stdint.h>
#include <uv.h>

#include "net/gossip.h"
#include "net/keys.h"
#include "net/rpc.h"
#include "store/store.h"

typedef struct ts_trust ts_trust_t;

typedef struct ts_trust_env {
    uv_loop_t *loop;
    ts_rpc_t *rpc;       /* the accusation handler is installed here */
    ts_gossip_t *gossip; /* bans, and the members accusations are passed on to */
    ts_store_t *store;   /* the experts' weights the recomputation reads */
    const ts_node_id_t *self;
    int expel;               /* [trust] expel */
    const char *identity;    /* this node's identity and network key files, for fetching the */
    const char *network_key; /* weights it does not hold (NULL: it judges only what it holds) */
} ts_trust_env_t;

/* What happened to the accusations this node received and sent. */
typedef struct ts_trust_stats {
    uint64_t received; /* every accusation, repeats included */
    uint64_t upheld;   /* judged: the answer was wrong; the accused is banned here */
    uint64_t refused;  /* judged: bad signature, or the answer is right */
    uint64_t
        unverifiable; /* not judged: accused itself, not accusable, too big, no weights, closing */
    uint64_t repeats; /* answered with an earlier verdict */
    uint64_t passed_on; /* sent on to other members after an upheld one */
} ts_trust_stats_t;

/* Installs the accusation handler. TS_ENOMEM, TS_EINVAL. */
int ts_trust_new(ts_trust_t **out, const ts_trust_env_t *env);
void ts_trust_get_stats(const ts_trust_t *t, ts_trust_stats_t *st);
/* Stops taking accusations (they get ERROR_UNAVAILABLE), answers those waiting or fetching
 * weights ("cannot judge": the fetch stops), and has the recomputations running stop at their
 * next row. Before the loop's handles are closed. */
void ts_trust_shutdown(ts_trust_t *t);
/* Shuts down, then frees: TS_EBUSY while a recomputation still runs (run the loop and call
 * again). NULL-safe. */
int ts_trust_free(ts_trust_t *t);

#endif
