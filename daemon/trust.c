/*
 * trust.c — accusations judged by recomputation (trust.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/trust.h"

#include <sodium.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/str.h"
#include "daemon/fetcher.h"
#include "daemon/log.h"
#include "kernels/engine.h"
#include "model/ensemble.h"
#include "net/answer.h"
#include "net/frame.h"
#include "net/status_json.h"
#include "store/weights.h"

#define SEEN_MAX 256  /* verdicts remembered, for repeats (a ring) */
#define MAX_RUNNING 2 /* accusations fetched or recomputed at once; the rest wait their turn */
#define MAX_JUDGES 32 /* accusations running or waiting; more are answered busy */
#define MAX_WAITERS 8 /* repeats of one accusation in progress, answered with its verdict */
#define MAX_ROWS 256  /* samples one accusation may carry (a request's worth, and the work) */
#define PASS_ON_TIMEOUT_MS 30000

typedef struct seen {
    uint8_t key[32];
    int upheld;
    char reason[200];
} seen_t;

/* One accusation being judged. */
typedef struct judge {
    uv_work_t work;
    ts_trust_t *t;
    ts_rpc_request_t *req;
    Tessera__Accusation *acc; /* a copy of the accusation received (passed on from it) */
    ts_answer_claim_t claim;  /* the accused's */
    uint8_t key[32];
    ts_node_id_t from;                      /* who sent it to us */
    ts_fetcher_t *fetch;                    /* the expert's weights on their way here, or NULL */
    int fetched;                            /* a fetch was tried (once per accusation) */
    int running;                            /* fetching or recomputing (else waiting its turn) */
    ts_rpc_request_t *waiters[MAX_WAITERS]; /* repeats that arrived meanwhile */
    int n_waiters;
    /* the recomputation's outcome (work thread) */
    int status; /* TS_OK judged; TS_ENOTFOUND weights not here; else could not run */
    int upheld;
    double diff;
    char why[200];
} judge_t;

struct ts_trust {
    ts_trust_env_t env;
    ts_node_id_t self;
    seen_t seen[SEEN_MAX];
    uint32_t n_seen, next_seen;
    judge_t *judging[MAX_JUDGES]; /* in arrival order */
    int n_judging, n_running, closing;
    atomic_int cancel; /* set at shutdown: a recomputation stops at its next row */
    ts_trust_stats_t st;
};

static void short_id(const uint8_t *id, char out[17]) { ts_hex(id, 8, out); }

static const seen_t *seen_find(const ts_trust_t *t, const uint8_t key[32]) {
    for (uint32_t i = 0; i < t->n_seen; i++)
        if (memcmp(t->seen[i].key, key, 32) == 0)
            return &t->seen[i];
    return NULL;
}

static void seen_add(ts_trust_t *t, const uint8_t key[32], int upheld, const char *reason) {
    seen_t *s = &t->seen[t->next_seen];
    t->next_seen = (t->next_seen + 1) % SEEN_MAX;
    if (t->n_seen < SEEN_MAX)
        t->n_seen++;
    memcpy(s->key, key, 32);
    s->upheld = upheld;
    snprintf(s->reason, sizeof s->reason, "%s", reason);
}

static int reply(ts_rpc_request_t *req, int judged, int upheld, const char *reason) {
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    Tessera__AccusationVerdict v = TESSERA__ACCUSATION_VERDICT__INIT;
    v.has_upheld = v.has_judged = 1;
    v.upheld = upheld != 0;
    v.judged = judged != 0;
    v.reason = (char *)reason;
    env.body_case = TESSERA__ENVELOPE__BODY_ACCUSATION_VERDICT;
    env.accusation_verdict = &v;
    return ts_rpc_reply(req, &env);
}

static void judge_free(judge_t *j) {
    if (!j)
        return;
    ts_fetcher_free(j->fetch);
    if (j->acc)
        tessera__accusation__free_unpacked(j->acc, NULL);
    free(j);
}

/* ---- the recomputation (work thread) --------------------------------------------------------- */

/* Recomputes every row of the request with the expert's weights on a CPU engine of its own (one
 * row at a time: rows are batch invariant, so this is what any CPU replica of one class answers)
 * and compares the accused's answer with it. */
static void recompute(uv_work_t *w) {
    judge_t *j = w->data;
    const Tessera__DenoiseRequest *d = j->acc->request;
    ts_engine_t e;
    ts_engine_opts_t eo = {.device = TS_CPU, .threads = 1, .gpu = 0};
    ts_dit_t m;
    memset(&m, 0, sizeof m);
    ts_hash_t h;
    memcpy(h.b, d->expert_id.data, sizeof h.b);
    char err[256] = "";
    float *mine = NULL;
    j->status = ts_engine_init(&e, &eo);
    if (j->status != TS_OK) {
        snprintf(j->why, sizeof j->why, "cannot start a CPU engine to recompute");
        return;
    }
    j->status = ts_weights_open_dit(j->t->env.store, &h, &e, 2, 0, &m, err, sizeof err);
    if (j->status == TS_ECORRUPT) /* some chunk missing or bad: a fetch repairs it */
        j->status = TS_ENOTFOUND;
    if (j->status != TS_OK) {
        snprintf(j->why, sizeof j->why, "%s",
                 j->status == TS_ENOTFOUND
                     ? "cannot judge: this node does not hold the expert's weights"
                     : "cannot judge: the expert's weights do not open here");
        ts_engine_free(&e);
        return;
    }
    ts_tensor_t x, v;
    const ts_dit_config_t *c = &m.cfg;
    /* with_variance: each answer row is the prediction, then the variance (2C channels) */
    int var = d->has_with_variance && d->with_variance, f = var ? 2 : 1;
    int ok = ts_frame_tensor_view(d->x_t, &x) == TS_OK &&
             ts_frame_tensor_view(j->acc->answer->velocity, &v) == TS_OK && x.dtype == TS_F32 &&
             v.dtype == TS_F32 && x.shape[1] == c->in_channels && x.shape[2] == c->input_size &&
             x.shape[3] == c->input_size && v.ndim == x.ndim && v.shape[0] == x.shape[0] &&
             v.shape[1] == f * x.shape[1] && v.shape[2] == x.shape[2] && v.shape[3] == x.shape[3] &&
             (!var || c->learn_sigma);
    for (size_t i = 0; ok && i < d->n_class_labels; i++)
        ok = d->class_labels[i] <= c->num_classes;
    if (!ok) {
        j->status = TS_EINVAL;
        snprintf(j->why, sizeof j->why,
                 "the request or the answer does not fit the expert (F32 tensors of its shape "
                 "and labels, with the variance only where it has one, are what its replicas "
                 "answer)");
    }
    int64_t B = ok ? x.shape[0] : 0,
            chw = (int64_t)f * c->in_channels * c->input_size * c->input_size; /* an answer row */
    if (ok && !(mine = malloc((size_t)(B * chw) * sizeof *mine))) {
        j->status = TS_ENOMEM;
        snprintf(j->why, sizeof j->why, "out of memory for the recomputation");
    }
    for (int64_t i = 0; mine && j->status == TS_OK && i < B; i++) {
        if (atomic_load(&j->t->cancel)) {
            j->status = TS_ECANCELED;
            snprintf(j->why, sizeof j->why, "cannot judge: this node is shutting down");
            break;
        }
        ts_expert_job_t job = {.k = 0,
                               .m = 1,
                               .x = (const float *)x.data + i * chw / f,
                               .labels = &d->class_labels[i],
                               .t = d->t[i],
                               .cfg_scale = d->cfg_scale,
                               .with_sigma = var,
                               .v = mine + i * chw};
        j->status = ts_expert_job_run(&m, &job);
        if (j->status != TS_OK)
            snprintf(j->why, sizeof j->why, "the recomputation failed (%s)",
                     ts_strerror(j->status));
    }
    if (mine && j->status == TS_OK) {
        ts_answer_claim_t my = j->claim;
        char cls[TS_ANSWER_DEVICE_MAX + 1];
        ts_engine_device_class(&e, cls, sizeof cls);
        snprintf(my.device_class, sizeof my.device_class, "%.100s/%s", cls, ts_attn_name(m.attn));
        my.precision = TESSERA__DTYPE__DTYPE_F32;
        /* the prediction and (with_variance) the variance of each sample, judged apart */
        const ts_answer_shape_t S = {(size_t)B, (size_t)(chw / f), var};
        const float *theirs = v.data;
        j->upheld = ts_answer_far_shape(theirs, &j->claim, mine, &my, &S, d->cfg_scale);
        double dp = ts_answer_part_diff(theirs, mine, &S, 0),
               dv = ts_answer_part_diff(theirs, mine, &S, 1);
        j->diff = dv > dp ? dv : dp;
        int exact = ts_answer_exact(&j->claim, &my);
        if (j->upheld)
            snprintf(j->why, sizeof j->why,
                     "its answer is wrong: %s, recomputed here on %.60s (relative difference %.3g)",
                     exact ? "bits differ where its device class promises them"
                           : "more than ten times the tolerance off",
                     my.device_class, j->diff);
        else
            snprintf(j->why, sizeof j->why,
                     "its answer is right: it %s the recomputation here on %.60s (relative "
                     "difference %.3g)",
                     exact ? "equals" : "is within doubt of", my.device_class, j->diff);
    }
    free(mine);
    ts_dit_free(&m);
    ts_engine_free(&e);
}

/* ---- passing an upheld accusation on ----------------------------------------------------------- */

static void on_passed(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    (void)arg;
    if (res->status != TS_OK && res->status != TS_ECANCELED && res->status != TS_ECLOSED)
        ts_log_debug("trust", "an accusation passed on was not answered: %s", res->message);
}

/* Sends the accusation j to every live member but ourselves, the accused and its sender. */
static void pass_on(ts_trust_t *t, judge_t *j) {
    Tessera__StatusRequest sr = TESSERA__STATUS_REQUEST__INIT;
    sr.has_include_members = sr.has_include_adverts = 1;
    sr.include_members = 1;
    sr.include_adverts = 0;
    Tessera__StatusResponse *st = NULL;
    if (ts_gossip_status(t->env.gossip, &sr, &st) != TS_OK)
        return;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ACCUSATION;
    env.accusation = j->acc;
    for (size_t i = 0; i < st->n_members; i++) {
        const Tessera__MemberState *m = st->members[i];
        if (m->status != TESSERA__MEMBER_STATUS__MEMBER_ALIVE || !m->addr ||
            m->node_id.len != TS_NODE_ID_BYTES ||
            memcmp(m->node_id.data, t->self.b, TS_NODE_ID_BYTES) == 0 ||
            memcmp(m->node_id.data, j->acc->accused.data, TS_NODE_ID_BYTES) == 0 ||
            memcmp(m->node_id.data, j->from.b, TS_NODE_ID_BYTES) == 0)
            continue;
        ts_rpc_peer_t *p;
        if (ts_rpc_peer_get(t->env.rpc, m->addr, &p, NULL, 0) != TS_OK)
            continue;
        ts_node_id_t want;
        memcpy(want.b, m->node_id.data, sizeof want.b);
        ts_rpc_peer_expect(p, &want);
        if (ts_rpc_call(p, &env, PASS_ON_TIMEOUT_MS, on_passed, NULL, NULL, NULL, 0) == TS_OK)
            t->st.passed_on++;
    }
    ts_gossip_status_free(st);
}

/* ---- the verdict (loop) ------------------------------------------------------------------------- */

/* Answers j's requester and every repeat that waited on it, and frees j (out of the list). */
static void finish(judge_t *j, int judged, int upheld, const char *why) {
    ts_trust_t *t = j->t;
    for (int i = 0; i < t->n_judging; i++)
        if (t->judging[i] == j) {
            memmove(&t->judging[i], &t->judging[i + 1],
                    (size_t)(t->n_judging - i - 1) * sizeof t->judging[0]);
            t->n_judging--;
            break;
        }
    if (j->running)
        t->n_running--;
    reply(j->req, judged, upheld, why);
    for (int i = 0; i < j->n_waiters; i++)
        reply(j->waiters[i], judged, upheld, why);
    judge_free(j);
}

static void start_next(ts_trust_t *t);
static int start_fetch(judge_t *j);

static void judged(uv_work_t *w, int status) {
    judge_t *j = w->data;
    ts_trust_t *t = j->t;
    if (status == 0 && j->status == TS_ENOTFOUND && !j->fetched && !t->closing) {
        j->fetched = 1; /* the weights are not here: fetched, then recomputed */
        j->status = TS_OK;
        if (start_fetch(j) == TS_OK)
            return;
        j->status = TS_ENOTFOUND;
    }
    char acc[17], from[17];
    short_id(j->acc->accused.data, acc);
    short_id(j->from.b, from);
    if (status != 0 || j->status != TS_OK || t->closing) { /* not judged: nothing is remembered */
        t->st.unverifiable++;
        const char *why =
            status != 0 || t->closing ? "cannot judge: this node is shutting down" : j->why;
        ts_log_info("trust", "an accusation of %s from %s not judged: %s", acc, from, why);
        finish(j, 0, 0, why);
        start_next(t);
        return;
    }
    if (!j->upheld) {
        t->st.refused++;
        seen_add(t, j->key, 0, j->why);
        ts_log_warn("trust", "an accusation of %s from %s refused: %s", acc, from, j->why);
        finish(j, 1, 0, j->why);
        start_next(t);
        return;
    }
    ts_gossip_ban_info_t b;
    memset(&b, 0, sizeof b);
    memcpy(b.id, j->acc->accused.data, sizeof b.id);
    memcpy(b.expert, j->acc->request->expert_id.data, sizeof b.expert);
    snprintf(b.reason, sizeof b.reason, "%s", j->why);
    b.expelled = t->env.expel;
    int fresh = ts_gossip_ban(t->env.gossip, &b);
    if (fresh < 0) { /* judged, but the ban could not be kept: said so, not remembered */
        t->st.unverifiable++;
        ts_log_warn("trust", "node %s answered wrongly (%s), but cannot be banned here: %s", acc,
                    j->why, ts_strerror(fresh));
        finish(j, 0, 0, "cannot judge: the ban cannot be kept here (too many bans, or memory)");
        start_next(t);
        return;
    }
    t->st.upheld++;
    seen_add(t, j->key, 1, j->why);
    if (fresh == 1) {
        ts_log_warn("trust", "node %s banned%s: %s (accusation from %s)", acc,
                    t->env.expel ? " and expelled" : "", j->why, from);
        pass_on(t, j);
    }
    finish(j, 1, 1, j->why);
    start_next(t);
}

static int start_recompute(judge_t *j) {
    return uv_queue_work(j->t->env.loop, &j->work, recompute, judged) == 0 ? TS_OK : TS_EIO;
}

static void on_fetched(ts_fetcher_t *f, int rc, const char *err, void *arg) {
    (void)f;
    judge_t *j = arg;
    ts_trust_t *t = j->t;
    ts_fetcher_free(j->fetch); /* allowed from here */
    j->fetch = NULL;
    if (rc == TS_OK) {
        if (start_recompute(j) == TS_OK)
            return;
    }
    t->st.unverifiable++;
    char why[200];
    snprintf(why, sizeof why, "cannot judge: the expert's weights could not be fetched (%.120s)",
             err && *err ? err : ts_strerror(rc));
    ts_log_info("trust", "%s", why);
    finish(j, 0, 0, why);
    start_next(t);
}

/* This node's view of the members and their adverts. */
typedef struct view {
    Tessera__StatusResponse *st;
    ts_status_adverts_t ad;
} view_t;

static int view_open(ts_trust_t *t, view_t *v) {
    memset(v, 0, sizeof *v);
    if (ts_gossip_status(t->env.gossip, NULL, &v->st) != TS_OK)
        return TS_ENOMEM;
    if (ts_status_adverts_decode(v->st, &v->ad) != TS_OK) {
        ts_gossip_status_free(v->st);
        return TS_ENOMEM;
    }
    return TS_OK;
}

static void view_close(view_t *v) {
    ts_status_adverts_free(&v->ad);
    ts_gossip_status_free(v->st);
}

/* Whether member `id` is alive or suspect here and advertises `expert` — what makes a node
 * accusable (evidence against a key pair that serves nothing is not judged); and (addr, may be
 * NULL) the address of a live member advertising the expert, another than `id` when there is one
 * (any can give its weights: they are checked against their hash). */
static int serves(const view_t *v, const uint8_t *id, const uint8_t *expert, const char **addr) {
    int found = 0;
    const char *other = NULL, *its = NULL;
    for (size_t i = 0; i < v->st->n_members; i++) {
        const Tessera__MemberState *m = v->st->members[i];
        const Tessera__AdvertBody *b = ts_status_advert_of(v->st, &v->ad, &m->node_id);
        if (!b || b->weights_hash.len != 32 || memcmp(b->weights_hash.data, expert, 32) != 0 ||
            m->node_id.len != TS_NODE_ID_BYTES ||
            (m->status != TESSERA__MEMBER_STATUS__MEMBER_ALIVE &&
             m->status != TESSERA__MEMBER_STATUS__MEMBER_SUSPECT))
            continue;
        int is_it = memcmp(m->node_id.data, id, TS_NODE_ID_BYTES) == 0;
        found |= is_it;
        if (m->addr && m->status == TESSERA__MEMBER_STATUS__MEMBER_ALIVE)
            *(is_it ? &its : &other) = m->addr;
    }
    if (addr)
        *addr = other ? other : its;
    return found;
}

/* Fetches the expert's weights from a live member advertising them — another than the accused
 * when one does (what arrives is checked against their hash, so the accused could not cheat
 * either). */
static int start_fetch(judge_t *j) {
    ts_trust_t *t = j->t;
    ts_hash_t h;
    memcpy(h.b, j->acc->request->expert_id.data, sizeof h.b);
    snprintf(j->why, sizeof j->why, "cannot judge: this node does not hold the expert's weights");
    if (!t->env.identity || !t->env.network_key)
        return TS_ENOTFOUND;
    view_t v;
    if (view_open(t, &v) != TS_OK)
        return TS_ENOMEM;
    const char *peer = NULL;
    serves(&v, j->acc->accused.data, h.b, &peer);
    int rc = TS_ENOTFOUND;
    if (peer) {
        ts_fetcher_opts_t o = {.peer = peer,
                               .file = h,
                               .identity = t->env.identity,
                               .network_key = t->env.network_key};
        rc = ts_fetcher_start(&j->fetch, t->env.loop, t->env.store, &o, on_fetched, j);
        if (rc == TS_OK)
            ts_log_info("trust", "fetching an expert's weights from %s to judge an accusation",
                        peer);
    } else {
        snprintf(j->why, sizeof j->why,
                 "cannot judge: this node does not hold the expert's weights and no live member "
                 "advertises them");
    }
    view_close(&v);
    return rc;
}

/* Starts the accusations waiting their turn, in arrival order, while there is room. */
static void start_next(ts_trust_t *t) {
    for (int i = 0; i < t->n_judging && t->n_running < MAX_RUNNING && !t->closing;) {
        judge_t *j = t->judging[i];
        if (j->running) {
            i++;
            continue;
        }
        j->running = 1;
        t->n_running++;
        if (start_recompute(j) == TS_OK) {
            i++;
            continue;
        }
        t->st.unverifiable++;
        finish(j, 0, 0, "cannot judge: the recomputation cannot start");
    }
}

/* ---- the handler --------------------------------------------------------------------------------- */

static void on_accusation(ts_rpc_request_t *req, const Tessera__Envelope *env, void *arg) {
    ts_trust_t *t = arg;
    const Tessera__Accusation *a = env->accusation; /* its form checked by net/frame_check.c */
    t->st.received++;
    if (t->closing) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_UNAVAILABLE, "shutting down");
        return;
    }
    if (memcmp(a->accused.data, t->self.b, TS_NODE_ID_BYTES) == 0) {
        t->st.unverifiable++;
        reply(req, 0, 0, "this node is the accused: another node judges it");
        return;
    }
    char id[17];
    short_id(a->accused.data, id);
    uint8_t req_hash[TS_ANSWER_HASH_BYTES];
    ts_answer_claim_t claim;
    ts_node_id_t accused;
    memcpy(accused.b, a->accused.data, sizeof accused.b);
    if (ts_answer_request_hash(a->request, req_hash) != TS_OK ||
        ts_answer_claim_of(&claim, a->request_id, req_hash, a->request->expert_id.data,
                           a->answer) != TS_OK ||
        ts_answer_verify(&claim, &accused, a->answer->signature.data) != TS_OK) {
        t->st.refused++;
        ts_log_warn("trust",
                    "an accusation of %s refused: its signature is not %s's over that "
                    "answer to that request",
                    id, id);
        reply(req, 1, 0, "the signature is not the accused's over this answer to this request");
        return;
    }
    /* one accusation: the accused and everything its signature covers (the request's id and
     * hash, the answer's hash, the expert, the precision and the device class) */
    uint8_t key[32], claim_bytes[TS_ANSWER_CLAIM_MAX];
    size_t claim_len = ts_answer_claim_bytes(&claim, claim_bytes);
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, sizeof key);
    crypto_generichash_update(&hs, accused.b, sizeof accused.b);
    crypto_generichash_update(&hs, claim_bytes, claim_len);
    crypto_generichash_final(&hs, key, sizeof key);
    const seen_t *s = seen_find(t, key);
    if (s) {
        t->st.repeats++;
        reply(req, 1, s->upheld, s->reason);
        return;
    }
    if (ts_gossip_banned(t->env.gossip, accused.b)) {
        t->st.repeats++;
        reply(req, 1, 1, "already banned here");
        return;
    }
    for (int i = 0; i < t->n_judging; i++)
        if (memcmp(t->judging[i]->key, key, sizeof key) == 0) { /* answered with its verdict */
            judge_t *o = t->judging[i];
            if (o->n_waiters == MAX_WAITERS) {
                ts_rpc_reply_busy(req, 1000);
                return;
            }
            t->st.repeats++;
            o->waiters[o->n_waiters++] = req;
            return;
        }
    if (a->request->x_t->shape[0] > MAX_ROWS) {
        t->st.unverifiable++;
        reply(req, 0, 0, "cannot judge: more samples than one accusation may carry (256)");
        return;
    }
    view_t v;
    if (view_open(t, &v) != TS_OK) {
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    int accusable = serves(&v, accused.b, a->request->expert_id.data, NULL);
    view_close(&v);
    if (!accusable) {
        t->st.unverifiable++;
        reply(req, 0, 0,
              "cannot judge: the accused is not a live member advertising that expert here");
        return;
    }
    if (t->n_judging >= MAX_JUDGES) {
        ts_rpc_reply_busy(req, 1000);
        return;
    }
    judge_t *j = calloc(1, sizeof *j);
    size_t n = protobuf_c_message_get_packed_size(&a->base);
    uint8_t *packed = j ? malloc(n ? n : 1) : NULL; /* a copy that outlives the request's */
    if (packed) {
        protobuf_c_message_pack(&a->base, packed);
        j->acc = tessera__accusation__unpack(NULL, n, packed);
    }
    free(packed);
    if (!j || !j->acc) {
        judge_free(j);
        ts_rpc_reply_error(req, TESSERA__ERROR_CODE__ERROR_INTERNAL, "out of memory");
        return;
    }
    j->t = t;
    j->req = req;
    j->claim = claim;
    memcpy(j->key, key, sizeof key);
    j->from = *ts_rpc_request_peer(req);
    j->work.data = j;
    t->judging[t->n_judging++] = j;
    start_next(t);
}

int ts_trust_new(ts_trust_t **out, const ts_trust_env_t *env) {
    *out = NULL;
    if (!env || !env->loop || !env->rpc || !env->gossip || !env->store || !env->self)
        return TS_EINVAL;
    ts_trust_t *t = calloc(1, sizeof *t);
    if (!t)
        return TS_ENOMEM;
    t->env = *env;
    t->self = *env->self;
    t->env.self = &t->self;
    atomic_init(&t->cancel, 0);
    int rc = ts_rpc_handle(env->rpc, TESSERA__ENVELOPE__BODY_ACCUSATION, on_accusation, t);
    if (rc != TS_OK) {
        free(t);
        return rc;
    }
    *out = t;
    return TS_OK;
}

void ts_trust_get_stats(const ts_trust_t *t, ts_trust_stats_t *st) {
    if (t)
        *st = t->st;
    else
        memset(st, 0, sizeof *st);
}

void ts_trust_shutdown(ts_trust_t *t) {
    if (!t || t->closing)
        return;
    t->closing = 1; /* the handler stays: later accusations are answered ERROR_UNAVAILABLE */
    atomic_store(&t->cancel, 1);
    for (int i = 0; i < t->n_judging;) { /* a fetch and a wait stop; a recomputation ends soon */
        judge_t *j = t->judging[i];
        if (j->running && !j->fetch) {
            i++;
            continue;
        }
        t->st.unverifiable++;
        finish(j, 0, 0, "cannot judge: this node is shutting down");
    }
}

int ts_trust_free(ts_trust_t *t) {
    if (!t)
        return TS_OK;
    ts_trust_shutdown(t);
    if (t->n_judging)
        return TS_EBUSY;
    ts_rpc_handle(t->env.rpc, TESSERA__ENVELOPE__BODY_ACCUSATION, NULL, NULL);
    free(t);
    return TS_OK;
}
