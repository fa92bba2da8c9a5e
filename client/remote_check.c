/*
 * remote_check.c — spot-checks of remote answers (client/remote.h): a fraction of the answers,
 * and every answer of a replica not vouched for yet, asked again of a second replica; agreeing
 * answers are trusted, a disagreement is decided by the cached weights or a third replica, and
 * the replica whose answer loses is banned for the run, its answer replaced.
 */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "client/remote_internal.h"
#include "net/frame.h"

/* Cancels the sends of a still in flight (their callbacks see `cancelling` and do nothing). */
static void cancel_inflight(attempt_t *a) {
    double now = ts_now_s();
    a->cancelling = 1;
    for (int i = 0; i < a->n_sends; i++)
        if (a->sends[i].call) {
            ts_remote_slower_than(&a->ex->rep[a->sends[i].replica],
                                  (now - a->sends[i].start) * 1e3);
            ts_rpc_cancel(a->sends[i].call);
        }
    a->cancelling = 0;
}

/* A replica to check an answer of class cls and precision prec with: one not asked yet, not
 * banned, of that class and precision (or whose class is not known yet) — preferred — or any
 * other. −1 when none is left. */
int ts_remote_pick_checker(attempt_t *a, const char *cls, uint8_t prec) {
    ts_remote_expert_t *ex = a->ex;
    double now = ts_now_s();
    int any = -1;
    for (int i = 0; i < ex->n_rep; i++) {
        const ts_replica_t *p = &ex->rep[i];
        if ((a->tried & (1u << i)) || p->banned_until > now || !p->peer)
            continue;
        if (p->precision == 0 || (p->precision == prec && strcmp(p->device_class, cls) == 0))
            return i;
        if (any < 0)
            any = i;
    }
    return any;
}

/* Whether an agreement vouches for both replicas: the same bits, or fp32 within its tolerance (a
 * replica that claims bf16 is compared loosely, and is never vouched for by it). */
static int vouches(const ts_answer_claim_t *cx, const ts_answer_claim_t *cy) {
    return ts_answer_exact(cx, cy) || ts_answer_tolerance(cx, cy, 1.0f) == TS_ANSWER_TOL_F32;
}

/* Replicas i and j (−1: none) are vouched for: an answer of theirs agreed with another's (or with
 * the cached weights') in this run. */
static void vouch(attempt_t *a, int i, int j) {
    ts_replica_t *p = &a->ex->rep[i];
    p->vouched = p->agreed = 1;
    if (j >= 0)
        a->ex->rep[j].vouched = a->ex->rep[j].agreed = 1;
}

/* Held answer slot k (m answer rows, ts_remote_row floats each). */
float *ts_remote_held(attempt_t *a, int k) {
    return a->held + (size_t)k * (size_t)a->job->m * ts_remote_row(a->r, a->job);
}

/* The replicas an accusation goes to: every other replica of the expert not caught itself, up to
 * this many (they hold the weights, so they can judge it, and pass it on to every member); and
 * the accusations in flight at once (the rest are not sent: the judges pass them on anyway). */
#define ACCUSE_MAX 4
#define ACCUSE_CALLS (int)(sizeof((ts_remote_t *)0)->accusals / sizeof(ts_rpc_call_t *))
#define ACCUSE_TIMEOUT_MS 30000

static void on_verdict(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    ts_remote_t *r = arg;
    for (int i = 0; i < ACCUSE_CALLS; i++)
        if (r->accusals[i] == call)
            r->accusals[i] = NULL;
    r->accusing--;
    const Tessera__AccusationVerdict *v =
        res->status == TS_OK && res->reply ? res->reply->accusation_verdict : NULL;
    if (v && v->upheld)
        r->st.accusations_upheld++;
    else if (v && v->judged)
        r->st.accusations_refused++;
    else
        r->st.accusations_unjudged++;
}

/* Sends the evidence that replica i's answer in slot k is wrong — the request as asked and its
 * signed answer as received (daemon/trust.h) — to the expert's other replicas. */
static void accuse(attempt_t *a, int i, int k) {
    ts_remote_t *r = a->r;
    ts_expert_job_t *j = a->job;
    ts_replica_t *p = &a->ex->rep[i];
    const ts_answer_claim_t *c = &a->held_claim[k];
    if (!p->has_node || c->device_class[0] == '\0')
        return; /* an unsigned answer is no evidence */
    ts_tensor_t xt, vt;
    Tessera__Tensor x, v = TESSERA__TENSOR__INIT;
    Tessera__DenoiseRequest dr; /* as it was sent */
    if (ts_remote_request(a, &dr, &x, &xt) != TS_OK ||
        ts_tensor_wrap(&vt, ts_remote_held(a, k), TS_F32, TS_CPU, 4,
                       TS_SHAPE(j->m, r->channels * (j->with_sigma ? 2 : 1), r->size, r->size)) !=
            TS_OK ||
        ts_frame_tensor_set(&v, &vt) != TS_OK)
        return;
    Tessera__DenoiseResponse ans = TESSERA__DENOISE_RESPONSE__INIT;
    ans.velocity = &v;
    ans.has_signature = ans.has_precision = 1;
    ans.signature.data = a->held_sig[k];
    ans.signature.len = TS_SIGNATURE_BYTES;
    ans.device_class = (char *)c->device_class;
    ans.precision = (Tessera__DType)c->precision;
    Tessera__Accusation acc = TESSERA__ACCUSATION__INIT;
    acc.has_accused = acc.has_request_id = 1;
    acc.accused.data = p->node.b;
    acc.accused.len = sizeof p->node.b;
    acc.request_id = c->request_id;
    acc.request = &dr;
    acc.answer = &ans;
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_ACCUSATION;
    env.accusation = &acc;
    int sent = 0;
    for (int q = 0; q < a->ex->n_rep && sent < ACCUSE_MAX; q++) {
        ts_replica_t *o = &a->ex->rep[q];
        if (q == i || !o->peer || isinf(o->banned_until))
            continue;
        int slot = 0;
        while (slot < ACCUSE_CALLS && r->accusals[slot])
            slot++;
        if (slot == ACCUSE_CALLS)
            break;
        if (ts_rpc_call(o->peer, &env, ACCUSE_TIMEOUT_MS, on_verdict, r, &r->accusals[slot], NULL,
                        0) == TS_OK) {
            r->accusing++;
            r->st.accusations_sent++;
            sent++;
        }
    }
}

/* Replica i answered wrongly (its answer in slot k), as the check showed: never asked again by
 * this client, and accused before the other replicas. */
static void caught(attempt_t *a, int i, int k) {
    ts_replica_t *p = &a->ex->rep[i];
    p->lies++;
    p->banned_until = INFINITY;
    p->vouched = p->remembered = p->agreed = 0;
    if (a->r->st.liars++ == 0) {
        a->r->st.first_catch_requests = a->r->st.requests;
        a->r->st.first_catch_s = ts_now_s() - a->r->t0;
    }
    snprintf(a->note, sizeof a->note, "%.64s: a wrong answer, caught by a spot-check", p->addr);
    accuse(a, i, k);
}

/* Whether to check the answer just taken: every answer of a replica not vouched for yet, then at
 * the rate asked, when another replica can (a disagreement may then be decided by the cached
 * weights). On yes the answer is kept (slot 0) and the check is asked; 1 then. */
int ts_remote_check_start(attempt_t *a, int replica, const ts_answer_claim_t *c,
                          const uint8_t sig[TS_SIGNATURE_BYTES]) {
    ts_remote_t *r = a->r;
    /* every answer of a replica not vouched for yet is checked (one that lies on every answer
     * is caught at once, even with several answers in flight), then the drawn fraction */
    ts_replica_t *p = &a->ex->rep[replica];
    if (p->remembered &&
        (c->precision != p->vouch_precision || strcmp(c->device_class, p->vouch_class) != 0))
        p->vouched = p->remembered = 0; /* not what was vouched for: checked from the start */
    int first = !p->vouched;
    if (r->o.verify_rate <= 0.0 ||
        (!first && (double)(ts_remote_rand(r) >> 11) * 0x1.0p-53 >= r->o.verify_rate))
        return 0;
    int i = ts_remote_pick_checker(a, c->device_class, c->precision);
    if (i < 0)
        return 0; /* nothing to check with: the cached weights alone do not make a check */
    size_t n = (size_t)a->job->m * ts_remote_row(r, a->job);
    if (a->cap_held < 3 * n) {
        float *h = realloc(a->held, 3 * n * sizeof *h);
        if (!h)
            return 0;
        a->held = h;
        a->cap_held = 3 * n;
    }
    uv_timer_stop(a->hedge_timer);
    cancel_inflight(a); /* a hedge still out: its answer is no longer wanted */
    memcpy(ts_remote_held(a, 0), a->job->v, n * sizeof(float));
    a->held_rep[0] = replica;
    a->held_claim[0] = *c;
    memcpy(a->held_sig[0], sig, TS_SIGNATURE_BYTES);
    a->phase = 1;
    a->retries_left = r->o.retries;
    r->st.checks++;
    a->ex->rep[replica].checked++;
    for (; i >= 0; i = ts_remote_pick_checker(a, c->device_class, c->precision)) {
        int rc = ts_remote_send_to(a, i, 0); /* a refusal marks it tried: the next */
        if (rc == TS_OK)
            return 1;
        if (rc == TS_ERANGE) /* no send left for this piece */
            break;
    }
    a->phase = 0; /* every checker refused at once: the answer stands unchecked */
    r->st.checks_failed++;
    return 0;
}

/* The check's answer k (1: the second replica's, 2: a tie-breaker's) is in slot k: agreeing
 * answers are trusted; a disagreement is broken by the cached weights or a third replica, and
 * the one that loses is caught. The job then holds the answer that stands. */
void ts_remote_check_judge(attempt_t *a, int k) {
    ts_remote_t *r = a->r;
    size_t n = (size_t)a->job->m * ts_remote_row(r, a->job);
    /* the prediction and (with_sigma) the variance of each sample, judged apart */
    const ts_answer_shape_t S = {(size_t)a->job->m, (size_t)r->chw, a->job->with_sigma != 0};
    const float cfg = a->job->cfg_scale;
    ts_answer_claim_t *c = a->held_claim;
    if (k == 1 &&
        ts_answer_agree_shape(ts_remote_held(a, 1), &c[1], ts_remote_held(a, 0), &c[0], &S, cfg)) {
        r->st.checks_agreed++;
        if (!ts_answer_exact(&c[0], &c[1])) {
            double d = ts_answer_part_diff(ts_remote_held(a, 1), ts_remote_held(a, 0), &S, 0);
            double dv = ts_answer_part_diff(ts_remote_held(a, 1), ts_remote_held(a, 0), &S, 1);
            d = dv > d ? dv : d;
            r->st.agreed_max_diff = d > r->st.agreed_max_diff ? d : r->st.agreed_max_diff;
        }
        if (vouches(&c[0], &c[1]))
            vouch(a, a->held_rep[0], a->held_rep[1]);
        ts_remote_finish(a, TS_OK); /* the job's v is the first answer */
        return;
    }
    if (k == 1) {
        r->st.mismatches++;
        if (a->ex->local) { /* the cached weights (fp32) decide: one answer within its
                             * tolerance of them, the other beyond ten times its own */
            ts_expert_job_t mine = *a->job;
            mine.v = ts_remote_held(a, 2);
            double t0 = ts_now_s();
            int rc = ts_expert_job_run(a->ex->local, &mine);
            r->st.local_runs++;
            r->st.local_s += ts_now_s() - t0;
            /* each answer against the cached weights' (F32): its own precision's tolerance */
            const float *h0 = ts_remote_held(a, 0), *h1 = ts_remote_held(a, 1),
                        *h2 = ts_remote_held(a, 2);
            int ok0 = rc == TS_OK && ts_answer_near(h0, &c[0], h2, &c[0], &S, cfg, 1.0);
            int ok1 = rc == TS_OK && ts_answer_near(h1, &c[1], h2, &c[1], &S, cfg, 1.0);
            int bad0 = rc == TS_OK && !ts_answer_near(h0, &c[0], h2, &c[0], &S, cfg, 10.0);
            int bad1 = rc == TS_OK && !ts_answer_near(h1, &c[1], h2, &c[1], &S, cfg, 10.0);
            int liar = ok0 && bad1 ? 1 : ok1 && bad0 ? 0 : -1;
            if (liar >= 0) {
                caught(a, a->held_rep[liar], liar);
                if (c[1 - liar].precision == TESSERA__DTYPE__DTYPE_F32)
                    vouch(a, a->held_rep[1 - liar], -1);
                if (liar == 0)
                    memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
                ts_remote_finish(a, TS_OK);
                return;
            }
        }
        a->phase = 2;
        a->retries_left = r->o.retries;
        for (int i = ts_remote_pick_checker(a, c[0].device_class, c[0].precision); i >= 0;
             i = ts_remote_pick_checker(a, c[0].device_class, c[0].precision)) {
            int rc = ts_remote_send_to(a, i, 0);
            if (rc == TS_OK)
                return;
            if (rc == TS_ERANGE)
                break;
        }
        r->st.undecided++;
        ts_remote_touch(r, &a->ex->rep[a->held_rep[0]], a->job);
        ts_remote_finish(a, TS_OK); /* nothing breaks the tie: the first answer stands, unproven */
        return;
    }
    float *h0 = ts_remote_held(a, 0), *h1 = ts_remote_held(a, 1), *h2 = ts_remote_held(a, 2);
    int liar = ts_answer_agree_shape(h2, &c[2], h0, &c[0], &S, cfg) &&
                       ts_answer_far_shape(h1, &c[1], h2, &c[2], &S, cfg)
                   ? 1
               : ts_answer_agree_shape(h2, &c[2], h1, &c[1], &S, cfg) &&
                       ts_answer_far_shape(h0, &c[0], h2, &c[2], &S, cfg)
                   ? 0
                   : -1;
    if (liar >= 0) {
        caught(a, a->held_rep[liar], liar);
        if (vouches(&c[1 - liar], &c[2]))
            vouch(a, a->held_rep[1 - liar], a->held_rep[2]);
        if (liar == 0)
            memcpy(a->job->v, ts_remote_held(a, 1), n * sizeof(float));
    } else {
        r->st.undecided++; /* the first answer stands, unproven */
        ts_remote_touch(r, &a->ex->rep[a->held_rep[0]], a->job);
    }
    ts_remote_finish(a, TS_OK);
}
