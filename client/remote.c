/*
 * remote.c — remote experts: replica choice, hedging, retries, the local fallback (remote.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "client/remote.h"
#include "client/remote_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/error.h"
#include "kernels/tensor.h"
#include "net/frame.h"

void ts_remote_ban(ts_replica_t *p, uint32_t ms) {
    double until = ts_now_s() + ms / 1000.0;
    if (until > p->banned_until) /* never shortens a ban, nor the run-long one of a liar */
        p->banned_until = until;
}

uint64_t ts_remote_rand(ts_remote_t *r) { /* xorshift64*: replica draws only */
    r->rng ^= r->rng >> 12;
    r->rng ^= r->rng << 25;
    r->rng ^= r->rng >> 27;
    return r->rng * 2685821657736338717ULL;
}

void ts_remote_opts_default(ts_remote_opts_t *o) {
    *o = (ts_remote_opts_t){.timeout_ms = 10000,
                            .hedge = 1,
                            .hedge_min_ms = 2,
                            .retries = 2,
                            .ban_ms = 30000,
                            .down_ms = 5000,
                            .require_signed = 1,
                            .verify_rate = TS_REMOTE_VERIFY_RATE};
}

/* ---- one job's requests ----------------------------------------------------------------------- */

/* A server's Timings (zeros when it sent none). */
typedef struct timings {
    uint32_t queue_us, compute_us, device_us;
} timings_t;

static void trace(ts_remote_t *r, const send_t *s, int status, timings_t tm, int replica,
                  double start) {
    if (!r->trace)
        return;
    if (r->n_events == r->cap_events) {
        size_t cap = r->cap_events ? 2 * r->cap_events : 256;
        ts_remote_event_t *e = realloc(r->events, cap * sizeof *e);
        if (!e)
            return; /* the trace loses an event; the generation goes on */
        r->events = e;
        r->cap_events = cap;
    }
    const ts_expert_job_t *j = s ? s->a->job : NULL;
    r->events[r->n_events++] = (ts_remote_event_t){.start_s = start - r->t0,
                                                   .dur_s = ts_now_s() - start,
                                                   .k = j ? j->k : -1,
                                                   .m = j ? j->m : 0,
                                                   .replica = replica,
                                                   .status = status,
                                                   .hedge = s ? s->hedge : 0,
                                                   .queue_us = tm.queue_us,
                                                   .compute_us = tm.compute_us,
                                                   .device_us = tm.device_us};
}

/* The predicted latency of asking replica i: its round-trip EWMA (a few ms before the first
 * answer) plus what its queue makes it wait. */
static double predicted_ms(const ts_replica_t *p) {
    double rtt = p->ewma_ms > 0.0 ? p->ewma_ms : 5.0;
    return rtt + (double)p->queue_depth * (double)p->item_latency_us / 1000.0;
}

/* Power of two choices among the replicas not tried and not banned; −1 when none is left. */
static int pick(attempt_t *a) {
    ts_remote_expert_t *ex = a->ex;
    double now = ts_now_s();
    int cand[TS_REMOTE_MAX_REPLICAS], n = 0;
    for (int i = 0; i < ex->n_rep; i++)
        if (!(a->tried & (1u << i)) && ex->rep[i].banned_until <= now && ex->rep[i].peer)
            cand[n++] = i;
    if (n == 0)
        return -1;
    if (n == 1)
        return cand[0];
    int x = cand[ts_remote_rand(a->r) % (uint64_t)n], y;
    do
        y = cand[ts_remote_rand(a->r) % (uint64_t)n];
    while (y == x);
    return predicted_ms(&ex->rep[y]) < predicted_ms(&ex->rep[x]) ? y : x;
}

/* The hedge delay: the p95 of this expert's recent round trips (nearest rank), or — with fewer
 * than 8 of them — three times the best replica's EWMA, or 50 ms with nothing measured yet. */
static uint64_t hedge_delay_ms(const ts_remote_t *r, const ts_remote_expert_t *ex) {
    double d;
    if (ex->n_rtt >= 8) {
        double s[TS_REMOTE_RTT_WINDOW];
        int n = ex->n_rtt;
        memcpy(s, ex->rtt, (size_t)n * sizeof *s);
        for (int i = 1; i < n; i++) /* insertion sort: 64 values at most */
            for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
                double t = s[j];
                s[j] = s[j - 1];
                s[j - 1] = t;
            }
        d = s[(int)ceil(0.95 * n) - 1];
    } else {
        double best = 0.0;
        for (int i = 0; i < ex->n_rep; i++)
            if (ex->rep[i].ewma_ms > 0.0 && (best == 0.0 || ex->rep[i].ewma_ms < best))
                best = ex->rep[i].ewma_ms;
        d = best > 0.0 ? 3.0 * best : 50.0;
    }
    return (uint64_t)ceil(d < r->o.hedge_min_ms ? r->o.hedge_min_ms : d);
}

static void on_answer(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg);

/* A note cut at a byte count may end inside a UTF-8 character: drop that partial character, so
 * the note stays valid UTF-8 (the JSON summary takes only valid strings). */
static void utf8_trim(char *s) {
    size_t n = strlen(s), i = n;
    while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80) /* continuation bytes */
        i--;
    if (i == 0 || ((unsigned char)s[i - 1] & 0x80) == 0)
        return; /* ASCII last, or nothing but continuations: nothing to judge */
    unsigned char lead = (unsigned char)s[i - 1];
    size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (n - (i - 1) < want)
        s[i - 1] = '\0';
}

int ts_remote_request(const attempt_t *a, Tessera__DenoiseRequest *dr, Tessera__Tensor *x,
                      ts_tensor_t *xt) {
    const ts_remote_t *r = a->r;
    const ts_expert_job_t *j = a->job;
    tessera__tensor__init(x); /* the job's rows, F32 (m, C, H, W), by net/frame.h's codec */
    TS_TRY(ts_tensor_wrap(xt, (float *)j->x, TS_F32, TS_CPU, 4,
                          TS_SHAPE(j->m, r->channels, r->size, r->size)));
    TS_TRY(ts_frame_tensor_set(x, xt));
    tessera__denoise_request__init(dr);
    dr->has_expert_id = dr->has_cfg_scale = 1;
    dr->expert_id.data = a->ex->weights_hash;
    dr->expert_id.len = sizeof a->ex->weights_hash;
    dr->x_t = x;
    dr->n_t = (size_t)j->m;
    dr->t = a->t;
    dr->n_class_labels = (size_t)j->m;
    dr->class_labels = (int32_t *)j->labels;
    dr->cfg_scale = j->cfg_scale;
    dr->has_with_variance = dr->with_variance = j->with_sigma != 0;
    return TS_OK;
}

/* Sends the job to replica i; on an immediate refusal, marks it tried and returns the error. */
int ts_remote_send_to(attempt_t *a, int i, int hedge) {
    ts_remote_t *r = a->r;
    if (a->n_sends >= MAX_SENDS)
        return TS_ERANGE;
    a->tried |= 1u << i;
    send_t *s = &a->sends[a->n_sends];
    *s = (send_t){.a = a, .replica = i, .hedge = hedge, .start = ts_now_s()};
    Tessera__Tensor x;
    Tessera__DenoiseRequest dr;
    ts_tensor_t xt;
    TS_TRY(ts_remote_request(a, &dr, &x, &xt));
    Tessera__Envelope env = TESSERA__ENVELOPE__INIT;
    env.body_case = TESSERA__ENVELOPE__BODY_DENOISE_REQUEST;
    env.denoise_request = &dr;
    if (!a->hashed) { /* the same request goes to every replica asked: hashed once */
        TS_TRY(ts_answer_request_hash(&dr, a->req_hash));
        a->hashed = 1;
    }
    char err[256] = "";
    ts_replica_t *p = &a->ex->rep[i];
    /* counted before the call: a connection that fails while sending runs on_answer inside it */
    a->n_sends++;
    a->inflight++;
    int rc = ts_rpc_call(p->peer, &env, r->o.timeout_ms, on_answer, s, &s->call, err, sizeof err);
    if (rc != TS_OK) { /* refused at once, no callback */
        a->n_sends--;
        a->inflight--;
        p->failed++;
        snprintf(a->note, sizeof a->note, "%.64s: %.120s", p->addr, *err ? err : ts_strerror(rc));
        utf8_trim(a->note);
        if (rc == TS_ECLOSED) /* unreachable (in backoff after a refused connect): leave it */
            ts_remote_ban(p, r->o.down_ms);
        return rc;
    }
    p->sent++;
    r->st.requests++;
    r->st.bytes_out += x.data.len;
    return TS_OK;
}

/* Sends to the best replica left; TS_ENOTFOUND when none is left. */
static int send_next(attempt_t *a, int hedge) {
    for (;;) {
        int i = pick(a);
        if (i < 0)
            return TS_ENOTFOUND;
        int rc = ts_remote_send_to(a, i, hedge);
        if (rc == TS_OK)
            return TS_OK;
        if (rc == TS_ERANGE)
            return rc;
        a->last_error = rc; /* refused at once (congested): the next replica */
    }
}

static void on_hedge(uv_timer_t *t) {
    attempt_t *a = t->data;
    if (!a || a->done || a->inflight != 1 || a->phase != 0)
        return;
    if (send_next(a, 1) == TS_OK)
        a->r->st.hedges++;
}

/* Reads the answer into dst (m·chw floats, twice that with_sigma): an F32 (m, C, H, W) tensor of
 * finite values ((m, 2C, H, W) with_sigma: each sample's answer, then its variance), signed
 * by replica p's node (its claim and signature into c and sig), else TS_ECORRUPT — or TS_EKIND
 * for an answer that carries no signature where the options require one. */
static int take_answer(attempt_t *a, const Tessera__Envelope *env, timings_t *tm, float *dst,
                       ts_replica_t *p, ts_answer_claim_t *c, uint8_t sig[TS_SIGNATURE_BYTES]) {
    const ts_remote_t *r = a->r;
    const ts_expert_job_t *j = a->job;
    const Tessera__DenoiseResponse *d = env->denoise_response;
    const Tessera__Tensor *v = d ? d->velocity : NULL;
    ts_tensor_t got;
    if (!v ||
        ts_frame_check_tensor(v, TS_FRAME_DTYPE_BIT(TESSERA__DTYPE__DTYPE_F32),
                              TS_FRAME_CHECK_FINITE, "velocity", NULL, 0) != TS_OK ||
        ts_frame_tensor_view(v, &got) != TS_OK || got.ndim != 4 || got.shape[0] != j->m ||
        got.shape[1] != r->channels * (j->with_sigma ? 2 : 1) || got.shape[2] != r->size ||
        got.shape[3] != r->size)
        return TS_ECORRUPT;
    memset(c, 0, sizeof *c);
    if (ts_answer_claim_of(c, env->request_id, a->req_hash, a->ex->weights_hash, d) == TS_OK) {
        memcpy(sig, d->signature.data, TS_SIGNATURE_BYTES);
        if (!p->has_node || ts_answer_verify(c, &p->node, sig) != TS_OK)
            return TS_ECORRUPT; /* signed, but not by the node asked, or not this answer */
        snprintf(p->device_class, sizeof p->device_class, "%s", c->device_class);
        p->precision = c->precision;
    } else if (r->o.require_signed) {
        return TS_EKIND; /* unsigned: an older tesserad, or not a tesserad */
    }
    memcpy(dst, got.data, ts_tensor_nbytes(&got));
    if (d->timings) {
        tm->queue_us = d->timings->queue_us;
        tm->compute_us = d->timings->compute_us;
        tm->device_us = d->timings->device_us;
    }
    return TS_OK;
}

/* What is known of a replica that did not answer within ms: its EWMA is at least that. */
void ts_remote_slower_than(ts_replica_t *p, double ms) {
    if (p->ewma_ms < ms)
        p->ewma_ms = ms;
}

static void note_rtt(ts_remote_expert_t *ex, ts_replica_t *p, double ms) {
    p->ewma_ms = p->ewma_ms > 0.0 ? 0.8 * p->ewma_ms + 0.2 * ms : ms;
    ex->rtt[ex->rtt_next] = ms;
    ex->rtt_next = (ex->rtt_next + 1) % TS_REMOTE_RTT_WINDOW;
    if (ex->n_rtt < TS_REMOTE_RTT_WINDOW)
        ex->n_rtt++;
}

void ts_remote_touch(ts_remote_t *r, ts_replica_t *p, const ts_expert_job_t *j) {
    if (!p->touched || !j->rows)
        return;
    for (int i = 0; i < j->m; i++) {
        int s = r->row_base + j->rows[i];
        if (s >= 0 && s < r->track_n)
            p->touched[s] = 1;
    }
}

static void on_answer(ts_rpc_call_t *call, const ts_rpc_result_t *res, void *arg) {
    (void)call;
    send_t *s = arg;
    attempt_t *a = s->a;
    ts_remote_t *r = a->r;
    ts_replica_t *p = &a->ex->rep[s->replica];
    s->call = NULL;
    a->inflight--;
    if (a->done || a->cancelling)
        return; /* the loser of a hedge, cancelled or late */
    int status = res->status;
    const char *why = res->message && *res->message ? res->message : NULL;
    timings_t tm = {0, 0, 0};
    if (status == TS_OK) {
        int k = a->phase; /* where the answer goes: the job, or a check's slot */
        ts_answer_claim_t claim;
        uint8_t sig[TS_SIGNATURE_BYTES];
        /* a replica caught lying meanwhile (another piece's check): its answers are refused */
        status = isinf(p->banned_until)
                     ? TS_EPEER
                     : take_answer(a, res->reply, &tm, k == 0 ? a->job->v : ts_remote_held(a, k), p,
                                   &claim, sig);
        if (status == TS_OK) {
            p->answered++;
            r->st.answers++;
            r->st.bytes_in += (size_t)a->job->m * ts_remote_row(r, a->job) * sizeof(float);
            if (s->hedge) {
                p->hedges_won++;
                r->st.hedge_wins++;
            }
            note_rtt(a->ex, p, (double)res->rtt_ns / 1e6);
            r->st.server_queue_s += tm.queue_us / 1e6;
            r->st.server_compute_s += tm.compute_us / 1e6;
            r->st.server_device_s += tm.device_us / 1e6;
            trace(r, s, TS_OK, tm, s->replica, s->start);
            if (k > 0) {
                a->held_rep[k] = s->replica;
                a->held_claim[k] = claim;
                memcpy(a->held_sig[k], sig, TS_SIGNATURE_BYTES);
                ts_remote_check_judge(a, k);
            } else if (!ts_remote_check_start(a, s->replica, &claim, sig)) {
                ts_remote_touch(r, p, a->job); /* taken unchecked */
                ts_remote_finish(a, TS_OK);
            }
            return;
        }
        /* A wrong answer is worse than none: that replica is not asked again for a while. */
        p->garbage++;
        r->st.garbage++;
        why = status == TS_EPEER   ? "an answer from a replica caught lying"
              : status == TS_EKIND ? "an unsigned answer (an older tesserad?)"
                                   : "a malformed, wrongly signed or wrong answer";
        ts_remote_ban(p, r->o.ban_ms);
    } else if (status == TS_EBUSY) {
        r->st.busy++;
    } else if (status != TS_ECANCELED) {
        r->st.errors++;
        /* a connection that failed or a request that timed out: the replica is taken as down
         * for a while, so that the next evaluations do not wait on it again */
        if (status == TS_ECLOSED || status == TS_ETIMEDOUT)
            ts_remote_ban(p, r->o.down_ms);
    }
    p->failed++;
    a->last_error = status;
    if (status != TS_ECANCELED) {
        snprintf(a->note, sizeof a->note, "%.64s: %.120s", p->addr,
                 why ? why : ts_strerror(status));
        utf8_trim(a->note);
    }
    if (status != TS_ECANCELED)
        ts_remote_slower_than(p, (ts_now_s() - s->start) * 1e3);
    trace(r, s, status, (timings_t){0, 0, 0}, s->replica, s->start);
    if (a->inflight > 0)
        return; /* the other request may still answer */
    while (a->retries_left > 0) {
        a->retries_left--;
        r->st.retries++;
        if (a->phase > 0) { /* a check: another replica of the answer's class */
            int i = ts_remote_pick_checker(a, a->held_claim[0].device_class,
                                           a->held_claim[0].precision);
            if (i >= 0 && ts_remote_send_to(a, i, 0) == TS_OK)
                return;
            continue;
        }
        if (send_next(a, 0) == TS_OK)
            return;
    }
    if (a->phase > 0) { /* the check could not be made: the first answer stands, unchecked */
        if (a->phase == 2)
            r->st.undecided++; /* a disagreement nobody broke */
        else
            r->st.checks_failed++;
        ts_remote_touch(r, &a->ex->rep[a->held_rep[0]], a->job);
        ts_remote_finish(a, TS_OK);
        return;
    }
    ts_remote_finish(a, status);
}

/* Ends a job: cancels what is still in flight, and when the network failed it, runs the expert
 * from cached weights if there are any. */
void ts_remote_finish(attempt_t *a, int status) {
    ts_remote_t *r = a->r;
    a->done = 1;
    uv_timer_stop(a->hedge_timer);
    double now = ts_now_s();
    for (int i = 0; i < a->n_sends; i++)
        if (a->sends[i].call) {
            /* a request that lost the race took at least this long: a replica that has not
             * answered must not look fast because it never answered */
            ts_remote_slower_than(&a->ex->rep[a->sends[i].replica],
                                  (now - a->sends[i].start) * 1e3);
            ts_rpc_cancel(a->sends[i].call); /* runs on_answer now, which sees done */
        }
    if (status != TS_OK && a->ex->local) {
        double t = ts_now_s();
        status = ts_expert_job_run(a->ex->local, a->job);
        r->st.local_runs++;
        r->st.local_s += ts_now_s() - t;
        trace(r, NULL, status, (timings_t){0, 0, 0}, -1, t);
    }
    if (status != TS_OK && a->whole->status == TS_OK) {
        a->whole->status = status;
        r->st.failed_jobs++;
        ts_remote_fail_t *f = &r->fail[a->ex - r->experts];
        f->jobs++;
        /* a job that sent nothing (every replica taken as down) keeps the failure that put them
         * there */
        if (a->note[0])
            snprintf(f->note, sizeof f->note, "%s", a->note);
        else if (!f->note[0])
            snprintf(f->note, sizeof f->note, "%s",
                     a->ex->n_rep ? "every replica is down or banned" : ts_strerror(status));
    }
    priv(r)->pending--;
}

/* Attempt slot i, made (with its timer) on first use; NULL when out of memory. */
static attempt_t *slot(ts_remote_t *r, int i) {
    remote_priv_t *pv = priv(r);
    if (i >= pv->n_slots) {
        int cap = i + 16;
        attempt_t **a = realloc(pv->att, (size_t)cap * sizeof *a);
        if (!a)
            return NULL;
        pv->att = a;
        for (int j = pv->n_slots; j < cap; j++) {
            pv->att[j] = calloc(1, sizeof **pv->att);
            uv_timer_t *t = malloc(sizeof *t);
            if (!pv->att[j] || !t) {
                free(pv->att[j]);
                free(t);
                pv->n_slots = j;
                return NULL;
            }
            uv_timer_init(r->loop, t);
            t->data = NULL;
            pv->att[j]->hedge_timer = t;
        }
        pv->n_slots = cap;
    }
    return pv->att[i];
}

/* Samples per request for expert ex: the least its replicas take (0: any). A replica that says
 * how many forward rows it takes (Capacity.max_rows) takes that many unguided samples, half as
 * many guided; one that does not, the samples it advertises (good guided or not). */
static int piece_size(const ts_remote_expert_t *ex, float cfg_scale) {
    int cap = 0;
    for (int i = 0; i < ex->n_rep; i++) {
        const ts_replica_t *p = &ex->rep[i];
        int m = (int)p->max_samples;
        if (p->max_rows > 0) {
            int by_rows = (int)p->max_rows / (cfg_scale != 1.0f ? 2 : 1);
            m = by_rows > m ? by_rows : m;
        }
        if (m > 0 && (cap == 0 || m < cap))
            cap = m;
    }
    return cap;
}

/* Starts one piece: rows [start, start + m) of job j, in attempt slot a. */
static int start_piece(ts_remote_t *r, attempt_t *a, ts_expert_job_t *j, int start, int m) {
    uv_timer_t *timer = a->hedge_timer;
    float *t = a->t, *held_buf = a->held;
    int cap_t = a->cap_t;
    size_t cap_held = a->cap_held;
    size_t chw = (size_t)r->chw;
    *a = (attempt_t){.r = r,
                     .whole = j,
                     .ex = &r->experts[j->k],
                     .hedge_timer = timer,
                     .t = t,
                     .cap_t = cap_t,
                     .held = held_buf,
                     .cap_held = cap_held,
                     .retries_left = r->o.retries,
                     .last_error = TS_ENOTFOUND};
    a->piece = *j;
    a->piece.m = m;
    a->piece.rows = j->rows + start;
    a->piece.x = j->x + (size_t)start * chw;
    a->piece.labels = j->labels + start;
    a->piece.v = j->v + (size_t)start * ts_remote_row(r, j);
    a->job = &a->piece;
    if (a->cap_t < m) {
        float *nt = realloc(a->t, (size_t)m * sizeof *nt);
        if (!nt)
            return TS_ENOMEM;
        a->t = nt;
        a->cap_t = m;
    }
    for (int b = 0; b < m; b++)
        a->t[b] = j->t;
    timer->data = a;
    if (r->o.prefer_local && a->ex->local) {
        ts_remote_finish(a, TS_ENOTSUP); /* straight to the cached weights */
        return TS_OK;
    }
    if (send_next(a, 0) != TS_OK) {
        ts_remote_finish(a, a->last_error);
        return TS_OK;
    }
    if (r->o.hedge && a->ex->n_rep > 1)
        uv_timer_start(timer, on_hedge, hedge_delay_ms(r, a->ex), 0);
    return TS_OK;
}

/* ---- the hook --------------------------------------------------------------------------------- */

int ts_remote_eval(void *ctx, ts_expert_job_t *jobs, int n) {
    ts_remote_t *r = ctx;
    remote_priv_t *pv = priv(r);
    double t0 = ts_now_s();
    r->st.evaluations++;
    r->st.jobs += (uint64_t)n;
    int rc = TS_OK, used = 0;
    pv->pending = 0;
    for (int i = 0; i < n; i++) {
        jobs[i].status = TS_OK;
        int cap = piece_size(&r->experts[jobs[i].k], jobs[i].cfg_scale);
        for (int start = 0; start < jobs[i].m; start += cap ? cap : jobs[i].m)
            pv->pending++;
    }
    for (int i = 0; i < n && rc == TS_OK; i++) {
        ts_expert_job_t *j = &jobs[i];
        int cap = piece_size(&r->experts[j->k], j->cfg_scale);
        for (int start = 0; start < j->m && rc == TS_OK; start += cap ? cap : j->m) {
            int m = cap && j->m - start > cap ? cap : j->m - start;
            attempt_t *a = slot(r, used++);
            rc = a ? start_piece(r, a, j, start, m) : TS_ENOMEM;
        }
    }
    /* Wait for the answers. A loop with nothing left to run while pieces are pending would spin:
     * that cannot happen while calls are outstanding (their deadlines are timers). */
    while (pv->pending > 0 && rc == TS_OK)
        if (uv_run(r->loop, UV_RUN_ONCE) == 0 && pv->pending > 0)
            rc = TS_EIO;
    for (int i = 0; i < used && i < pv->n_slots; i++) {
        attempt_t *a = pv->att[i];
        if (!a->done && a->job)
            ts_remote_finish(a, TS_ECANCELED);
        a->hedge_timer->data = NULL;
    }
    int degraded = 0;
    for (int i = 0; i < n; i++)
        degraded |= jobs[i].status != TS_OK;
    if (degraded && r->st.degraded_evaluations < 64)
        r->degraded_at[r->st.degraded_evaluations] = r->st.evaluations;
    r->st.degraded_evaluations += (uint64_t)degraded;
    double dt = ts_now_s() - t0;
    r->st.network_s += dt;
    if (r->n_eval == r->cap_eval) {
        size_t cap = r->cap_eval ? 2 * r->cap_eval : 128;
        double *e = realloc(r->eval_ms, cap * sizeof *e);
        if (e) {
            r->eval_ms = e;
            r->cap_eval = cap;
        }
    }
    if (r->n_eval < r->cap_eval)
        r->eval_ms[r->n_eval++] = dt * 1e3;
    return rc;
}

/* ---- setup ------------------------------------------------------------------------------------ */

int ts_remote_init(ts_remote_t *r, uv_loop_t *loop, ts_rpc_t *rpc, ts_remote_expert_t *experts,
                   int K, int channels, int size, const ts_remote_opts_t *o, int trace_on,
                   char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->loop = loop;
    r->rpc = rpc;
    r->K = K;
    r->experts = experts;
    r->channels = channels;
    r->size = size;
    r->chw = (int64_t)channels * size * size;
    r->trace = trace_on;
    r->t0 = ts_now_s();
    r->rng = 0x9E3779B97F4A7C15ULL ^ (uint64_t)(r->t0 * 1e9);
    if (o)
        r->o = *o;
    else
        ts_remote_opts_default(&r->o);
    for (int k = 0; k < K; k++) {
        ts_remote_expert_t *ex = &experts[k];
        if (ex->n_rep < 0 || ex->n_rep > TS_REMOTE_MAX_REPLICAS ||
            (ex->n_rep == 0 && !ex->local && !ex->absent)) {
            ts_set_err(err, errlen,
                       "expert %d has no replica in the network and no cached "
                       "weights",
                       k);
            return TS_EINVAL;
        }
        for (int i = 0; i < ex->n_rep; i++) {
            int rc = ts_rpc_peer_get(rpc, ex->rep[i].addr, &ex->rep[i].peer, err, errlen);
            if (rc != TS_OK)
                return rc;
            if (ex->rep[i].has_node)
                ts_rpc_peer_expect(ex->rep[i].peer, &ex->rep[i].node);
        }
    }
    remote_priv_t *pv = calloc(1, sizeof *pv);
    r->fail = calloc((size_t)(K > 0 ? K : 1), sizeof *r->fail);
    if (!pv || !r->fail) {
        free(pv);
        free(r->fail);
        r->fail = NULL;
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    r->impl = pv;
    return TS_OK;
}

static void timer_closed(uv_handle_t *h) { free(h); }

int ts_remote_track(ts_remote_t *r, int n) {
    for (int k = 0; k < r->K; k++)
        for (int i = 0; i < r->experts[k].n_rep; i++) {
            ts_replica_t *p = &r->experts[k].rep[i];
            uint8_t *t = realloc(p->touched, n > 0 ? (size_t)n : 1);
            if (!t)
                return TS_ENOMEM;
            memset(t, 0, n > 0 ? (size_t)n : 1);
            p->touched = t;
        }
    r->track_n = n;
    r->row_base = 0;
    return TS_OK;
}

int ts_remote_suspects(const ts_remote_t *r, uint8_t *suspect) {
    memset(suspect, 0, (size_t)r->track_n);
    int n = 0;
    for (int k = 0; k < r->K; k++)
        for (int i = 0; i < r->experts[k].n_rep; i++) {
            const ts_replica_t *p = &r->experts[k].rep[i];
            if (!p->lies || !p->touched)
                continue;
            for (int s = 0; s < r->track_n; s++)
                if (p->touched[s] && !suspect[s]) {
                    suspect[s] = 1;
                    n++;
                }
        }
    return n;
}

static void settle_timeout(uv_timer_t *t) { *(int *)t->data = 1; }

void ts_remote_settle(ts_remote_t *r, uint32_t timeout_ms) {
    if (r->accusing <= 0)
        return;
    uv_timer_t *t = malloc(sizeof *t);
    if (!t)
        return;
    int expired = 0;
    uv_timer_init(r->loop, t);
    t->data = &expired;
    uv_timer_start(t, settle_timeout, timeout_ms, 0);
    while (r->accusing > 0 && !expired)
        uv_run(r->loop, UV_RUN_ONCE);
    uv_timer_stop(t);
    uv_close((uv_handle_t *)t, timer_closed);
}

void ts_remote_free(ts_remote_t *r) {
    for (int i = 0; i < (int)(sizeof r->accusals / sizeof r->accusals[0]); i++)
        if (r->accusals[i])
            ts_rpc_cancel(r->accusals[i]); /* its callback clears the slot */
    remote_priv_t *pv = priv(r);
    if (pv) {
        for (int i = 0; i < pv->n_slots; i++) {
            uv_close((uv_handle_t *)pv->att[i]->hedge_timer, timer_closed);
            free(pv->att[i]->t);
            free(pv->att[i]->held);
            free(pv->att[i]);
        }
        free(pv->att);
        free(pv);
    }
    for (int k = 0; r->experts && k < r->K; k++)
        for (int i = 0; i < r->experts[k].n_rep; i++) {
            free(r->experts[k].rep[i].touched);
            r->experts[k].rep[i].touched = NULL;
        }
    free(r->events);
    free(r->eval_ms);
    free(r->fail);
    r->fail = NULL;
    r->impl = NULL;
    r->events = NULL;
    r->eval_ms = NULL;
}
