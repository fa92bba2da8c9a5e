/*
 * cmd_generate.c — `tessera generate`: routed generation from an ensemble of experts
 * (architecture.md §3, model/ensemble.h), written as a PNG grid. The experts are either
 *   --local DIR      a folder in this process (client/local.h: experts, partition, router), or
 *   --peer HOST:PORT the network's (client/netgen.h): the view, the partition and the router come
 *                    from the network; the routing and the sampler run here; each evaluation's
 *                    expert work goes to the experts' replicas (client/remote.h: replica choice,
 *                    hedging, retries, the local fallback). Same seed and same weights give the
 *                    same image as --local, bit for bit, on the CPU backend.
 * With --peer the summary adds a breakdown (network and local compute time, per-evaluation p50
 * and p99, requests, hedges, retries, fallbacks, degraded evaluations) and --trace FILE writes
 * every request as a Chrome trace (chrome://tracing, Perfetto).
 *
 * Sample i starts from the noise stream seed + i with the labels of `tessera sample` (cycling
 * through the classes, or --class), so a one-expert folder reproduces `tessera sample` bit for
 * bit, and samples are generated in chunks of 64 without the chunking changing any result
 * (routing is per sample). The summary on stderr (and --json on stdout) gives the expert
 * evaluations per sample and how the sample-forwards spread over the experts; --routing-json
 * writes every evaluation's t and, per sample, the selected experts and their weights.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/local.h"
#include "client/netgen.h"
#include "model/classifier.h"
#include "model/ensemble.h"
#include "model/fmnist.h"
#include "model/latents.h"
#include "model/png.h"
#include "model/sampler.h"

#define PROG "tessera generate"
#define CHUNK 64 /* samples per ensemble call (each expert runs at most twice that with CFG) */

typedef struct {
    int tty;
    int done, total;
    const ts_remote_t *net; /* NULL for --local */
} progress_t;

static int on_step(void *ctx, int step, int steps) {
    progress_t *p = ctx;
    p->done++;
    if (!p->tty)
        return 0;
    fprintf(stderr, "\rgenerating: step %d/%d (total %d/%d)", step, steps, p->done, p->total);
    if (p->net)
        fprintf(stderr, ", %llu requests, network %.1f s, local %.1f s, %llu degraded",
                (unsigned long long)p->net->st.requests, p->net->st.network_s - p->net->st.local_s,
                p->net->st.local_s, (unsigned long long)p->net->st.degraded_evaluations);
    fprintf(stderr, "   ");
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The network part of the summary: stderr lines and a JSON object. */
/* Samples recomputed after liars were caught (repair, below). */
typedef struct repair_stats {
    int repaired, rounds, unrepaired; /* distinct samples; rounds; still suspect at the end */
    int64_t forwards;                 /* the rounds' sample-forwards (not in the main counts) */
    double seconds;
} repair_stats_t;

static json_t *network_summary(const repair_stats_t *gr, const ts_netgen_t *g,
                               const ts_local_stats_t *ls) {
    const ts_remote_t *r = &g->remote;
    const ts_remote_stats_t *st = &r->st;
    double p50 = 0.0, p99 = 0.0;
    if (r->n_eval) {
        double *s = malloc(r->n_eval * sizeof *s);
        if (s) {
            memcpy(s, r->eval_ms, r->n_eval * sizeof *s);
            qsort(s, r->n_eval, sizeof *s, cmp_double);
            p50 = s[(size_t)((r->n_eval - 1) * 0.5)];
            p99 = s[(size_t)((r->n_eval - 1) * 0.99)];
            free(s);
        }
    }
    fprintf(stderr,
            "network: %llu evaluations, %.1f ms p50 / %.1f ms p99 each; %llu requests, %llu "
            "hedges (%llu won), %llu retries, %llu busy, %llu errors, %llu garbage, %llu local "
            "runs (%.2f s), %llu evaluations degraded\n",
            (unsigned long long)st->evaluations, p50, p99, (unsigned long long)st->requests,
            (unsigned long long)st->hedges, (unsigned long long)st->hedge_wins,
            (unsigned long long)st->retries, (unsigned long long)st->busy,
            (unsigned long long)st->errors, (unsigned long long)st->garbage,
            (unsigned long long)st->local_runs, st->local_s,
            (unsigned long long)st->degraded_evaluations);
    fprintf(stderr,
            "breakdown: policy %.3f s, network %.3f s (servers' queue %.3f s and compute %.3f s, "
            "%.3f s of it on their devices, summed over requests), local fallback %.3f s, "
            "combine %.3f s, of %.3f s\n",
            ls->policy_s, st->network_s - st->local_s, st->server_queue_s, st->server_compute_s,
            st->server_device_s, st->local_s, ls->combine_s, ls->seconds);
    if (st->checks || st->liars)
        fprintf(stderr,
                "checks: %llu answers spot-checked (rate %.3g): %llu agreed, %llu disagreed, "
                "%llu wrong answers caught, %llu undecided, %llu could not be checked\n",
                (unsigned long long)st->checks, r->o.verify_rate,
                (unsigned long long)st->checks_agreed, (unsigned long long)st->mismatches,
                (unsigned long long)st->liars, (unsigned long long)st->undecided,
                (unsigned long long)st->checks_failed);
    if (gr->repaired)
        fprintf(stderr,
                "repaired: %d sample%s recomputed in %d round%s (%.2f s), the liars banned: an "
                "unchecked answer of a liar caught later had gone into them%s\n",
                gr->repaired, gr->repaired == 1 ? "" : "s", gr->rounds, gr->rounds == 1 ? "" : "s",
                gr->seconds,
                gr->unrepaired ? "; SOME STILL CARRY UNCHECKED ANSWERS OF A LIAR (rounds spent)"
                               : "");
    if (st->accusations_sent)
        fprintf(stderr,
                "accusations: %llu sent to other replicas: %llu upheld (the liar is banned "
                "there and the evidence passed on), %llu refused, %llu not judged\n",
                (unsigned long long)st->accusations_sent,
                (unsigned long long)st->accusations_upheld,
                (unsigned long long)st->accusations_refused,
                (unsigned long long)st->accusations_unjudged);
    for (int k = 0; k < g->K; k++)
        for (int i = 0; i < g->experts[k].n_rep; i++)
            if (g->experts[k].rep[i].lies)
                fprintf(stderr,
                        "  LIAR: %s (expert of cluster %d): %llu wrong answer%s caught; not "
                        "asked again\n",
                        g->experts[k].rep[i].addr, k, (unsigned long long)g->experts[k].rep[i].lies,
                        g->experts[k].rep[i].lies == 1 ? "" : "s");
    json_t *degraded = json_array();
    if (st->degraded_evaluations) {
        fprintf(stderr,
                "DEGRADED: %llu of %llu evaluations ran without some expert (it failed "
                "and had no replica or cached weights); its samples were routed among "
                "the others. Evaluations:",
                (unsigned long long)st->degraded_evaluations, (unsigned long long)st->evaluations);
        for (uint64_t i = 0; i < st->degraded_evaluations && i < 64; i++) {
            fprintf(stderr, " %llu", (unsigned long long)r->degraded_at[i]);
            json_array_append_new(degraded, json_integer((json_int_t)r->degraded_at[i]));
        }
        fprintf(stderr, "%s\n", st->degraded_evaluations > 64 ? " …" : "");
    }
    json_t *failed = json_array();
    for (int k = 0; k < g->K; k++) {
        const ts_remote_fail_t *f = &r->fail[k];
        if (!f->jobs)
            continue;
        fprintf(stderr, "  expert of cluster %d: %llu job%s failed; the last: %s\n", k,
                (unsigned long long)f->jobs, f->jobs == 1 ? "" : "s", f->note);
        json_array_append_new(failed, json_pack("{s:i, s:I, s:s}", "cluster", k, "jobs",
                                                (json_int_t)f->jobs, "last", f->note));
    }
    json_t *j = json_pack(
        "{s:s, s:i, s:i, s:i, s:I, s:f, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
        "s:I, s:I, s:f, s:f, s:I, s:I}",
        "partition_id", g->partition_id, "experts", g->K, "replicas", g->n_replicas, "cached",
        g->n_cached, "evaluations", (json_int_t)st->evaluations, "eval_ms_p50", p50, "eval_ms_p99",
        p99, "requests", (json_int_t)st->requests, "answers", (json_int_t)st->answers, "hedges",
        (json_int_t)st->hedges, "hedge_wins", (json_int_t)st->hedge_wins, "retries",
        (json_int_t)st->retries, "busy", (json_int_t)st->busy, "errors", (json_int_t)st->errors,
        "garbage", (json_int_t)st->garbage, "local_runs", (json_int_t)st->local_runs, "network_s",
        st->network_s - st->local_s, "local_s", st->local_s, "degraded_evaluations",
        (json_int_t)st->degraded_evaluations, "failed_jobs", (json_int_t)st->failed_jobs);
    if (j) {
        json_object_set_new(j, "policy_s", json_real(ls->policy_s));
        json_object_set_new(j, "combine_s", json_real(ls->combine_s));
        json_object_set_new(j, "server_queue_s", json_real(st->server_queue_s));
        json_object_set_new(j, "server_compute_s", json_real(st->server_compute_s));
        json_object_set_new(j, "server_device_s", json_real(st->server_device_s));
        json_object_set_new(j, "degraded_at", degraded);
        json_t *liars = json_array();
        for (int k = 0; k < g->K; k++)
            for (int i = 0; i < g->experts[k].n_rep; i++)
                if (g->experts[k].rep[i].lies)
                    json_array_append_new(
                        liars,
                        json_pack("{s:s, s:i, s:I, s:I}", "addr", g->experts[k].rep[i].addr,
                                  "cluster", k, "lies", (json_int_t)g->experts[k].rep[i].lies,
                                  "checked", (json_int_t)g->experts[k].rep[i].checked));
        json_object_set_new(j, "checks",
                            json_pack("{s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:o}", "rate",
                                      r->o.verify_rate, "checked", (json_int_t)st->checks, "agreed",
                                      (json_int_t)st->checks_agreed, "disagreed",
                                      (json_int_t)st->mismatches, "wrong_answers",
                                      (json_int_t)st->liars, "undecided", (json_int_t)st->undecided,
                                      "failed", (json_int_t)st->checks_failed, "caught", liars));
        json_t *ck = json_object_get(j, "checks");
        if (ck) {
            json_object_set_new(ck, "first_catch_requests",
                                json_integer((json_int_t)st->first_catch_requests));
            json_object_set_new(ck, "first_catch_s", json_real(st->first_catch_s));
            json_object_set_new(ck, "agreed_max_diff", json_real(st->agreed_max_diff));
            json_object_set_new(ck, "vouch_ttl_s", json_integer((json_int_t)g->vouch_ttl_s));
            json_object_set_new(ck, "remembered", json_integer(g->n_remembered));
            json_object_set_new(ck, "repaired_samples", json_integer(gr->repaired));
            json_object_set_new(ck, "repair_rounds", json_integer(gr->rounds));
            json_object_set_new(ck, "repair_forwards", json_integer((json_int_t)gr->forwards));
            json_object_set_new(ck, "repair_s", json_real(gr->seconds));
            json_object_set_new(ck, "unrepaired_samples", json_integer(gr->unrepaired));
            json_object_set_new(ck, "accusations",
                                json_pack("{s:I, s:I, s:I, s:I}", "sent",
                                          (json_int_t)st->accusations_sent, "upheld",
                                          (json_int_t)st->accusations_upheld, "refused",
                                          (json_int_t)st->accusations_refused, "unjudged",
                                          (json_int_t)st->accusations_unjudged));
        }
        json_object_set_new(j, "failed_experts", failed);
    } else {
        json_decref(degraded);
        json_decref(failed);
    }
    return j;
}

/* Every request as a Chrome trace "complete" event: one row (tid) per expert. */
static int write_trace(const char *path, const ts_remote_t *r, char *err, size_t errlen) {
    json_t *events = json_array();
    for (size_t i = 0; events && i < r->n_events; i++) {
        const ts_remote_event_t *e = &r->events[i];
        char name[64];
        if (e->replica < 0)
            snprintf(name, sizeof name, "expert %d local", e->k);
        else
            snprintf(name, sizeof name, "expert %d → replica %d%s", e->k, e->replica,
                     e->hedge ? " (hedge)" : "");
        json_array_append_new(
            events, json_pack("{s:s, s:s, s:f, s:f, s:i, s:i, s:{s:i, s:s, s:i, s:i, s:i}}", "name",
                              name, "ph", "X", "ts", e->start_s * 1e6, "dur", e->dur_s * 1e6, "pid",
                              1, "tid", e->k, "args", "rows", e->m, "status",
                              e->status == TS_OK ? "ok" : ts_strerror(e->status), "queue_us",
                              (int)e->queue_us, "compute_us", (int)e->compute_us, "device_us",
                              (int)e->device_us));
    }
    json_t *root = json_pack("{s:o}", "traceEvents", events);
    int rc = root && json_dump_file(root, path, JSON_COMPACT) == 0 ? TS_OK : TS_EIO;
    if (rc)
        ts_set_err(err, errlen, "--trace %s: cannot write the file", path);
    json_decref(root);
    return rc;
}

/* The routing record of all chunks: w[(e · N + i) · K + k] for evaluation e, sample i. */
typedef struct {
    int n_eval, N, K;
    float *t;
    ts_policy_t *policy;
    float *w;
} record_t;

static void record_chunk(void *ctx, const ts_ensemble_t *ens, int start) {
    record_t *r = ctx;
    for (int e = 0; e < ens->n_steps && e < r->n_eval; e++) {
        r->t[e] = ens->steps[e].t;
        r->policy[e] = ens->steps[e].policy;
        memcpy(r->w + ((size_t)e * r->N + start) * r->K, ens->steps[e].w,
               (size_t)ens->n * r->K * sizeof(float));
    }
}

static int write_routing_json(const char *path, const record_t *r, json_t *header, char *err,
                              size_t errlen) {
    json_t *root = json_deep_copy(header), *evals = json_array();
    if (!root || !evals) {
        json_decref(root);
        json_decref(evals);
        return TS_ENOMEM;
    }
    for (int e = 0; e < r->n_eval; e++) {
        json_t *samples = json_array();
        for (int i = 0; i < r->N; i++) {
            const float *w = r->w + ((size_t)e * r->N + i) * r->K;
            json_t *ks = json_array(), *ws = json_array();
            for (int k = 0; k < r->K; k++)
                if (w[k] != 0.0f) {
                    json_array_append_new(ks, json_integer(k));
                    json_array_append_new(ws, json_real(w[k]));
                }
            json_array_append_new(samples, json_pack("{s:o, s:o}", "experts", ks, "weights", ws));
        }
        json_array_append_new(evals, json_pack("{s:i, s:f, s:s, s:o}", "eval", e, "t",
                                               (double)r->t[e], "policy",
                                               ts_policy_name(r->policy[e]), "samples", samples));
    }
    json_object_set_new(root, "routing", evals);
    int rc = json_dump_file(root, path, JSON_COMPACT) == 0 ? TS_OK : TS_EIO;
    if (rc)
        ts_set_err(err, errlen, "--routing-json %s: cannot write the file", path);
    json_decref(root);
    return rc;
}

/* ---- the verb: parse → validate → open → run → print ---------------------------------------- */

typedef struct {
    const char *dir, *policy_s, *select_s, *sampler, *peer, *nk, *identity, *data_dir, *partition;
    const char *vae;
    const char *trace, *cls, *out, *routing_json, *trajectory, *fmnist_dir;
    int prefer_local, no_hedge, timeout_ms, retries, n, steps, threads, cols, json, class_prior;
    int quiet;
    ts_device_spec_t device;  /* --device (zeroed: the CPU): --local and --prefer-local */
    ts_precision_t precision; /* --precision (zeroed: f32): the experts of --local */
    const char *attention;    /* --attention (NULL: each expert's default): those of --local */
    int no_prior, exact, require_coverage, tau_set;
    float cfg, tau, router_temp, min_trained, ready_loss;
    float verify;      /* --verify; < 0: not given (TS_REMOTE_VERIFY_RATE) */
    int64_t vouch_ttl; /* --vouch-ttl; < 0: not given (TS_NETGEN_VOUCH_TTL_S) */
    uint64_t seed;
} gen_opts_t;

/* Everything one run opens and allocates (gen_free releases it all). */
typedef struct {
    gen_opts_t o;
    ts_policy_t policy;
    ts_selection_t sel;
    ts_sampler_opts_t so;
    int hold, label, chunk, pairs, usage, said;
    float hold_t; /* --route until=T */
    ts_engine_t eng;
    ts_local_t loc;
    ts_netgen_t net;
    float *images, *log_prior;
    int32_t *labels;
    uint64_t *seeds;
    int64_t *use;
    double *absent_mass;
    record_t rec;
    const char *prior_used;
    ts_local_stats_t st;
    repair_stats_t rep;
    char err[1024];
} gen_run_t;

/* The options from the command line: TS_ARGS_RUN, or the exit code (ts_args_parse). */
static int parse_opts(int argc, char **argv, gen_opts_t *o) {
    *o = (gen_opts_t){.policy_s = "learned",
                      .select_s = "top1",
                      .sampler = "heun",
                      .timeout_ms = 10000,
                      .retries = 2,
                      .trajectory = "step",
                      .fmnist_dir = TS_FMNIST_DEFAULT_DIR,
                      .n = 64,
                      .steps = 30,
                      .cfg = 1.0f,
                      .router_temp = 1.0f,
                      .verify = -1.0f,
                      .vouch_ttl = -1,
                      .min_trained = (float)TS_NETGEN_MIN_TRAINED};
    o->device = (ts_device_spec_t){.automatic = 1}; /* as tesserad: a GPU when there is one */
    ts_arg_t args[] = {
        {"local", TS_ARG_STRING, &o->dir, "DIR",
         "the experts of a folder: partition.safetensors, expert-<k>.safetensors (k = 0..K-1, or "
         "any .safetensors with metadata cluster), optional router.safetensors"},
        {"peer", TS_ARG_STRING, &o->peer, "HOST:PORT",
         "the experts of the network this node belongs to (instead of --local)"},
        {"network-key", TS_ARG_STRING, &o->nk, "FILE", "with --peer: the network key"},
        {"identity", TS_ARG_STRING, &o->identity, "FILE",
         "with --peer: an identity to connect with (default: a fresh one)"},
        {"data-dir", TS_ARG_STRING, &o->data_dir, "DIR",
         "with --peer: the store that caches the partition, the router and pulled weights "
         "(default: the user's store)"},
        {"partition", TS_ARG_STRING, &o->partition, "ID",
         "with --peer: the partition to use, by id prefix (default: the one most clusters of the "
         "network serve)"},
        {"require-coverage", TS_ARG_FLAG, &o->require_coverage, NULL,
         "with --peer: refuse when a cluster has no live expert and no cached weights (default: "
         "route around it from the first step, with a warning)"},
        {"min-trained", TS_ARG_FLOAT, &o->min_trained, "F",
         "with --peer: use an expert whose node is still training it once it has done this "
         "fraction of its steps (default 1: only finished experts; 0: any)",
         0, 1},
        {"ready-loss", TS_ARG_FLOAT, &o->ready_loss, "R",
         "with --peer: also use one whose weights' held-out loss is at most R times the finished "
         "experts' of its partition (e.g. 1.05; default 0: off)",
         0, 1000},
        {"prefer-local", TS_ARG_FLAG, &o->prefer_local, NULL,
         "with --peer: run the experts whose weights are in the store here (`tessera pull`)"},
        {"verify", TS_ARG_FLOAT, &o->verify, "RATE",
         "with --peer: the fraction of answers spot-checked by asking a second replica of the "
         "expert (bits equal, or a third replica or the cached weights decide; a replica caught "
         "lying is not asked again); every answer of a replica is checked until one agrees "
         "(default 0.02; 0: off)",
         0, 1},
        {"vouch-ttl", TS_ARG_I64, &o->vouch_ttl, "SECONDS",
         "with --peer: a replica vouched for by an earlier run in this store at most SECONDS "
         "ago starts vouched for, on the device class and precision it was vouched for on (its "
         "answers checked at the rate only); a replica caught lying is forgotten (default 3600; "
         "0: each run checks every replica's first answers)",
         0, 100LL * 365 * 86400},
        {"no-hedge", TS_ARG_FLAG, &o->no_hedge, NULL,
         "with --peer: never send a second request to another replica"},
        {"timeout-ms", TS_ARG_INT, &o->timeout_ms, "N", "with --peer: per request (default 10000)",
         1, 3600000},
        {"retries", TS_ARG_INT, &o->retries, "N",
         "with --peer: other replicas tried after a failure (default 2)", 0, 16},
        {"trace", TS_ARG_STRING, &o->trace, "FILE",
         "with --peer: write every request as a Chrome trace (JSON)"},
        {"policy", TS_ARG_STRING, &o->policy_s, "NAME",
         "learned (router), centroid (distance of x0-hat to the centroids), confidence (every "
         "expert every step), uniform (default learned)"},
        {"select", TS_ARG_STRING, &o->select_s, "SEL",
         "top1, topK, full, threshold=p, or a schedule like \"t>0.7:full,t>0.3:top2,top1\" "
         "(default top1)"},
        {"tau", TS_ARG_FLOAT, &o->tau, "T",
         "temperature of centroid/confidence: w ~ exp(-d2/T) (default: the partition's mean "
         "squared distance of an image to its centroid)",
         0, 1e30},
        {"n", TS_ARG_INT, &o->n, "N", "number of samples (default 64)", 1, 100000},
        {"steps", TS_ARG_INT, &o->steps, "S", "integration steps (default 30)", 1, 10000},
        {"sampler", TS_ARG_STRING, &o->sampler, "NAME",
         "euler, heun, ddim or ddpm (DDPM-schedule grids: DiT's linear beta over 1000 steps; "
         "default heun)"},
        {"cfg", TS_ARG_FLOAT, &o->cfg, "S",
         "classifier-free guidance scale inside each expert, 1 = off (default 1)", 0, 100},
        {"class", TS_ARG_STRING, &o->cls, "C",
         "class label or name (" TS_FMNIST_CLASS_LIST "), or 'null' (default: cycle through the "
         "classes)"},
        {"seed", TS_ARG_U64, &o->seed, "S", "sample i uses noise stream seed+i (default 0)"},
        {"out", TS_ARG_STRING, &o->out, "FILE", "PNG grid to write", 0, 0, 1},
        {"vae", TS_ARG_STRING, &o->vae, "FILE",
         "latent experts' VAE: the samples decoded on the CPU after the last step, the grid in "
         "RGB"},
        {"cols", TS_ARG_INT, &o->cols, "N", "grid columns (default: square)", 0, 10000},
        {"routing-json", TS_ARG_STRING, &o->routing_json, "FILE",
         "write every evaluation's routing (t; per sample the experts and weights) as JSON"},
        {"route", TS_ARG_STRING, &o->trajectory, "WHEN",
         "step (route every evaluation), hold (route once at t = 1 and keep those weights), draw "
         "(draw one expert per sample from the first evaluation's weights and keep it), or "
         "until=T (route every evaluation while t > T, then keep the last weights; 0 < T < 1) "
         "(default step)"},
        {"class-prior", TS_ARG_FLAG, &o->class_prior, NULL,
         "class-aware routing: add log p(class | cluster), the clusters' class mix in the train "
         "set, to every policy's scores (default: on with --class C, since no router sees "
         "labels; it needs the partition and the train labels of --data)"},
        {"no-class-prior", TS_ARG_FLAG, &o->no_prior, NULL, "never add the class prior"},
        {"exact-guidance", TS_ARG_FLAG, &o->exact, NULL,
         "with --local and --cfg ≠ 1: route the guidance's unconditional half by p(k | x_t) (the "
         "scores without the class prior) and its conditional half by p(k | x_t, y)"},
        {"router-temp", TS_ARG_FLOAT, &o->router_temp, "T",
         "with --local: divide the router's logits by T before the class prior (default 1)", 1e-6,
         1e6},
        {"data", TS_ARG_STRING, &o->fmnist_dir, "DIR",
         "Fashion-MNIST IDX directory, for --class-prior (default " TS_FMNIST_DEFAULT_DIR ")"},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print a JSON summary on stdout"},
        {"quiet", TS_ARG_FLAG, &o->quiet, NULL,
         "no progress line and no notes while opening (the summary, with what was uncovered or "
         "degraded, stays); the progress line is also off when stderr is not a terminal"},
        {"threads", TS_ARG_INT, &o->threads, "N", "compute threads (default: all cores)", 0, 1024},
        {"device", TS_ARG_DEVICE, &o->device, "NAME",
         "where to compute: " TS_DEVICE_SPEC_HELP " (default auto)"},
        {"precision", TS_ARG_PRECISION, &o->precision, "P",
         "the local experts' and the VAE's matrix products in " TS_PRECISION_HELP},
        {"attention", TS_ARG_STRING, &o->attention, "A",
         "the local experts' attention (a node chooses its own: [compute] "
         "attention): " TS_CLI_ATTENTION_HELP},
    };
    int n = (int)(sizeof args / sizeof args[0]);
    int pr = ts_args_parse(PROG,
                           "Generate images with a routed ensemble of experts — a folder's, or the "
                           "network's — routing every step of every sample, and write a grid.\n"
                           "example: tessera generate --local experts/demo --n 16 --out grid.png\n"
                           "example: tessera generate --peer 127.0.0.1:7420 --network-key "
                           "tessera-net/network.key --class sneaker --n 16 --out grid.png",
                           args, n, argc, argv);
    o->tau_set = ts_arg_seen(args, n, "tau");
    return pr;
}

/* What the options say, checked without opening anything: 0, or 2 with the message printed. */
static int validate(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    r->so = (ts_sampler_opts_t){.steps = o->steps};
    r->hold = strcmp(o->trajectory, "hold") == 0   ? TS_HOLD_FIRST
              : strcmp(o->trajectory, "draw") == 0 ? TS_HOLD_DRAW
                                                   : TS_HOLD_NONE;
    if (strncmp(o->trajectory, "until=", 6) == 0) {
        char *end = NULL;
        double v = strtod(o->trajectory + 6, &end);
        if (end != o->trajectory + 6 && !*end && v > 0.0 && v < 1.0) {
            r->hold = TS_HOLD_BELOW;
            r->hold_t = (float)v;
        }
    }
    if (ts_policy_parse(o->policy_s, &r->policy) != TS_OK)
        fprintf(stderr, PROG ": --policy %s: must be learned, centroid, confidence or uniform\n",
                o->policy_s);
    else if (ts_selection_parse(o->select_s, &r->sel, r->err, sizeof r->err) != TS_OK)
        fprintf(stderr, PROG ": --select: %s\n", r->err);
    else if (ts_sampler_parse(o->sampler, &r->so.kind) != TS_OK)
        fprintf(stderr, PROG ": --sampler %s: must be euler, heun, ddim or ddpm\n", o->sampler);
    else if (r->so.kind >= TS_SAMPLER_DDIM && o->steps > 1000)
        fprintf(stderr, PROG ": --sampler %s takes at most 1000 steps (the schedule's)\n",
                o->sampler);
    else if (!o->dir == !o->peer)
        fprintf(stderr, PROG ": name the experts: --local DIR or --peer HOST:PORT (one of them)\n");
    else if (o->peer && !o->nk)
        fprintf(stderr, PROG ": --peer needs --network-key FILE\n");
    else if (!o->peer && (o->nk || o->identity || o->data_dir || o->partition || o->prefer_local ||
                          o->no_hedge || o->trace || o->require_coverage || o->verify >= 0 ||
                          o->vouch_ttl >= 0 || o->min_trained != (float)TS_NETGEN_MIN_TRAINED ||
                          o->ready_loss > 0))
        fprintf(stderr, PROG ": --network-key, --identity, --data-dir, --partition, "
                             "--require-coverage, --min-trained, --ready-loss, --prefer-local, "
                             "--verify, --vouch-ttl, --no-hedge and "
                             "--trace go with --peer\n");
    else if (o->peer && (o->exact || o->router_temp != 1.0f))
        fprintf(stderr, PROG ": --exact-guidance and --router-temp go with --local\n");
    else if (o->class_prior && o->no_prior)
        fprintf(stderr, PROG ": --class-prior and --no-class-prior: choose one\n");
    else if (r->hold == TS_HOLD_NONE && strcmp(o->trajectory, "step") != 0)
        fprintf(stderr, PROG ": --route %s: must be step, hold, draw or until=T (0 < T < 1)\n",
                o->trajectory);
    else if (r->hold && strcmp(o->policy_s, "confidence") == 0)
        fprintf(stderr, PROG ": --route %s: the confidence policy scores every step\n",
                o->trajectory);
    else if (o->tau_set && !(o->tau > 0.0f))
        fprintf(stderr, PROG ": --tau %g: must be > 0\n", (double)o->tau);
    else if (o->cls && strcmp(o->cls, "null") != 0 &&
             strspn(o->cls, "0123456789") != strlen(o->cls) && ts_fmnist_class_parse(o->cls) < 0)
        fprintf(stderr, PROG ": --class %s: must be a label, a class name (%s) or 'null'\n", o->cls,
                TS_FMNIST_CLASS_LIST);
    else if (o->peer && o->attention)
        fprintf(stderr, PROG ": --attention goes with --local (a node chooses its own: [compute] "
                             "attention)\n");
    else if (ts_cli_attention_ok(o->attention, PROG))
        return 0;
    return 2;
}

/* The engine and the experts (a folder, or the network as one), the policy's needs, tau and the
 * class asked for. */
static int open_experts(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    /* the learned policy needs a router; the centroid policy uses one for its first step */
    int wants_router = r->policy == TS_POLICY_LEARNED    ? TS_NETGEN_ROUTER_REQUIRED
                       : r->policy == TS_POLICY_CENTROID ? TS_NETGEN_ROUTER_OPTIONAL
                                                         : TS_NETGEN_ROUTER_NONE;
    int rc = ts_cli_engine(&r->eng, &o->device, o->threads, PROG, r->err, sizeof r->err);
    if (rc == TS_OK && o->peer) {
        ts_netgen_opts_t no = {.peer = o->peer,
                               .network_key = o->nk,
                               .identity = o->identity,
                               .data_dir = o->data_dir,
                               .partition = o->partition,
                               .trace = o->trace != NULL,
                               .load_router = wants_router,
                               .require_coverage = o->require_coverage,
                               .min_trained = o->min_trained,
                               .ready_loss = o->ready_loss,
                               .quiet = o->quiet,
                               .cls = o->cls,
                               .vouch_ttl_s =
                                   o->vouch_ttl >= 0 ? o->vouch_ttl : TS_NETGEN_VOUCH_TTL_S};
        ts_remote_opts_default(&no.remote);
        no.remote.prefer_local = o->prefer_local;
        no.remote.hedge = !o->no_hedge;
        no.remote.timeout_ms = (uint32_t)o->timeout_ms;
        no.remote.retries = o->retries;
        if (o->verify >= 0)
            no.remote.verify_rate = o->verify;
        rc = ts_netgen_open(&r->net, &no, &r->eng, r->chunk, r->pairs, &r->loc, PROG, r->err,
                            sizeof r->err);
        r->said = rc != TS_OK && r->net.said;
        r->usage = rc != TS_OK && r->net.usage;
    } else if (rc == TS_OK) {
        rc = ts_local_open(&r->loc, o->dir, &r->eng, r->chunk, r->pairs, wants_router, PROG, r->err,
                           sizeof r->err);
    }
    if (rc == TS_OK)
        rc = ts_local_set_precision(&r->loc, o->precision, PROG, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_local_set_attention(&r->loc, o->attention, PROG, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = ts_local_check_policy(&r->loc, r->policy, PROG, r->err, sizeof r->err);
    if (rc == TS_OK &&
        (rc = ts_local_check_sampler(&r->loc, r->so.kind, o->sampler, r->err, sizeof r->err)))
        r->usage = 1;
    int C = r->loc.cfg.in_channels;
    if (rc == TS_OK && !o->vae && C != 1 && C != 3) { /* a PNG holds grey or RGB */
        rc = ts_fail(r->err, sizeof r->err, TS_EINVAL,
                     "the experts make latents of %d channels: pass --vae FILE (the VAE whose "
                     "latents they learnt) to decode them into pictures",
                     C);
        r->usage = 1;
    }
    if (rc != TS_OK)
        return rc;
    if (!o->tau_set)
        r->o.tau = ts_local_default_tau(&r->loc);
    if (ts_local_parse_class(o->cls, r->loc.cfg.num_classes, &r->label, r->err, sizeof r->err) !=
        TS_OK) {
        r->usage = 1;
        return TS_EINVAL;
    }
    return TS_OK;
}

/* Asking for a class gets that class: no router sees labels, so with --class C the class prior
 * is on unless --no-class-prior; asked for explicitly, its absence is an error. */
static int class_prior(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    int auto_prior = !o->class_prior && !o->no_prior && r->label >= 0 &&
                     r->label < r->loc.cfg.num_classes && r->loc.ex.K > 1;
    if (!o->class_prior && !auto_prior)
        return TS_OK;
    int32_t *train_labels = NULL; /* the labels alone: the prior needs no pixels */
    int n_train = 0;
    char sub[512] = "";
    int rc =
        ts_fmnist_load_labels(o->fmnist_dir, "train", &train_labels, &n_train, sub, sizeof sub);
    if (rc == TS_OK)
        rc = ts_local_class_prior(&r->loc, train_labels, n_train, TS_FMNIST_NUM_CLASSES,
                                  &r->log_prior, sub, sizeof sub);
    free(train_labels);
    if (rc == TS_OK) {
        r->prior_used = auto_prior ? "class (default with --class)" : "class";
    } else if (auto_prior) {
        fprintf(stderr,
                PROG ": warning: no class prior (%s): the router does not see labels, so "
                     "samples of class %d may come out as other classes\n",
                sub, r->label);
        rc = TS_OK;
    } else {
        snprintf(r->err, sizeof r->err, "--class-prior: %s", sub);
    }
    return rc;
}

/* The samples' labels and seeds, the images, the per-expert counts and the routing record. */
static int alloc_buffers(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    const ts_dit_config_t *c = &r->loc.cfg;
    int n = o->n, K = r->loc.ex.K;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    r->images = malloc((size_t)(n * chw) * sizeof *r->images);
    r->labels = malloc((size_t)n * sizeof *r->labels);
    r->seeds = malloc((size_t)n * sizeof *r->seeds);
    r->use = calloc((size_t)K, sizeof *r->use);
    if (!r->images || !r->labels || !r->seeds || !r->use)
        return TS_ENOMEM;
    for (int i = 0; i < n; i++) {
        r->labels[i] = r->label >= 0 ? r->label : i % c->num_classes;
        r->seeds[i] = o->seed + (uint64_t)i;
    }
    if (o->routing_json) {
        record_t *rec = &r->rec;
        rec->n_eval = o->steps * (r->so.kind == TS_SAMPLER_HEUN ? 2 : 1);
        rec->N = n;
        rec->K = K;
        rec->t = calloc((size_t)rec->n_eval, sizeof *rec->t);
        rec->policy = calloc((size_t)rec->n_eval, sizeof *rec->policy);
        rec->w = calloc((size_t)rec->n_eval * n * K, sizeof *rec->w);
        if (!rec->t || !rec->policy || !rec->w)
            return TS_ENOMEM;
    }
    if (r->loc.absent && !(r->absent_mass = calloc((size_t)K, sizeof *r->absent_mass)))
        return TS_ENOMEM;
    return TS_OK;
}

#define REPAIR_ROUNDS 4

/* The samples an answer of a caught liar went into, generated again with the liars banned (a
 * sample depends only on its seed, label and the answers it gets: the same bits as if no liar had
 * answered), until a round catches no new liar; each round recomputes only what the liars caught
 * in the round before touched. */
static int repair(gen_run_t *r, const ts_local_gen_t *gen) {
    ts_remote_t *rm = &r->net.remote;
    const ts_dit_config_t *c = &r->loc.cfg;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    int n = r->o.n, rc = TS_OK;
    uint8_t *sus = malloc((size_t)n);
    int *at = malloc((size_t)n * sizeof *at), *next = malloc((size_t)n * sizeof *next);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    uint64_t *seeds = malloc((size_t)n * sizeof *seeds);
    float *x = malloc((size_t)(n * chw) * sizeof *x);
    if (!sus || !at || !next || !labels || !seeds || !x)
        rc = TS_ENOMEM;
    int m = 0; /* the samples to recompute, as indices of the whole run */
    if (rc == TS_OK) {
        ts_remote_suspects(rm, sus);
        for (int i = 0; i < n; i++)
            if (sus[i])
                at[m++] = i;
    }
    r->rep.repaired = m; /* later rounds recompute some of these again */
    while (rc == TS_OK && m > 0 && r->rep.rounds < REPAIR_ROUNDS) {
        r->rep.rounds++;
        for (int j = 0; j < m; j++) {
            labels[j] = r->labels[at[j]];
            seeds[j] = r->seeds[at[j]];
        }
        ts_local_gen_t g = *gen;
        g.n = m;
        g.labels = labels;
        g.seeds = seeds;
        g.on_chunk = NULL; /* the routing record keeps the first run's */
        g.record = 0;
        g.on_step = NULL;
        ts_local_stats_t st = {0}; /* the summary's counts stay the first run's */
        rc = ts_remote_track(rm, m);
        if (rc == TS_OK)
            rc = ts_local_generate(&r->loc, &r->eng, &g, x, &st, r->err, sizeof r->err);
        if (rc != TS_OK)
            break;
        r->rep.forwards += st.forwards;
        r->rep.seconds += st.seconds;
        for (int j = 0; j < m; j++)
            memcpy(r->images + (size_t)at[j] * (size_t)chw, x + (size_t)j * (size_t)chw,
                   (size_t)chw * sizeof *x);
        ts_remote_suspects(rm, sus); /* of this round's m samples */
        int m2 = 0;
        for (int j = 0; j < m; j++)
            if (sus[j])
                next[m2++] = at[j];
        memcpy(at, next, (size_t)m2 * sizeof *at);
        m = m2;
    }
    r->rep.unrepaired = m;
    free(sus);
    free(at);
    free(next);
    free(labels);
    free(seeds);
    free(x);
    if (rc == TS_ENOMEM)
        snprintf(r->err, sizeof r->err, "out of memory recomputing the samples liars touched");
    return rc;
}

/* The samples, then the PNG grid. */
static int run(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    const ts_dit_config_t *c = &r->loc.cfg;
    progress_t prog = {isatty(STDERR_FILENO) && !o->quiet, 0,
                       o->steps * ((o->n + r->chunk - 1) / r->chunk),
                       o->peer ? &r->net.remote : NULL};
    ts_local_gen_t gen = {.policy = r->policy,
                          .select = r->sel,
                          .tau = o->tau,
                          .cfg = o->cfg,
                          .log_prior = r->log_prior,
                          .hold = r->hold,
                          .hold_t = r->hold_t,
                          .exact_guidance = o->exact,
                          .router_temp = o->router_temp,
                          .sampler = r->so,
                          .n = o->n,
                          .labels = r->labels,
                          .seeds = r->seeds,
                          .on_chunk = o->routing_json ? record_chunk : NULL,
                          .chunk_ctx = &r->rec,
                          .record = o->routing_json != NULL,
                          .on_step = on_step,
                          .step_ctx = &prog,
                          .chunk_start = o->peer ? &r->net.remote.row_base : NULL};
    r->st = (ts_local_stats_t){.use = r->use, .absent_mass = r->absent_mass};
    /* the VAE checked before the work: one of another latent space is refused now */
    int rc = o->vae ? ts_cli_vae_check(o->vae, r->loc.ex.latent_space, "the experts", r->err,
                                       sizeof r->err)
                    : TS_OK;
    char space[32];
    if (rc == TS_OK && !o->vae && r->loc.ex.latent_space[0] && !o->quiet)
        fprintf(stderr,
                PROG ": the experts work in the latent space of %s: --vae FILE (that VAE) decodes "
                     "their samples into pictures; without it their channels are drawn as they "
                     "are\n",
                ts_latent_space_name(r->loc.ex.latent_space, space, sizeof space));
    if (rc == TS_OK && o->peer)
        rc = ts_remote_track(&r->net.remote, o->n);
    if (rc == TS_OK)
        rc = ts_local_generate(&r->loc, &r->eng, &gen, r->images, &r->st, r->err, sizeof r->err);
    if (prog.tty)
        fprintf(stderr, "\n");
    if (rc == TS_OK && o->peer)
        rc = repair(r, &gen);
    float *decoded = NULL; /* --vae: the latents decoded into images */
    int C = c->in_channels, side = c->input_size;
    if (rc == TS_OK && o->vae)
        rc = ts_cli_vae_decode(o->vae, &r->eng, o->precision, r->images, o->n, c->in_channels,
                               c->input_size, "the experts", &decoded, &C, &side, r->err,
                               sizeof r->err);
    if (rc == TS_OK)
        rc = ts_png_write_grid(o->out, decoded ? decoded : r->images, o->n, C, side, side, o->cols,
                               2, r->err, sizeof r->err);
    free(decoded);
    return rc;
}

/* The summary as JSON, and its human lines on stderr (cost, expert use, prior, uncovered). */
static json_t *summary(const gen_run_t *r, const char *sel_text) {
    const gen_opts_t *o = &r->o;
    int n = o->n, K = r->loc.ex.K;
    int64_t forwards = r->st.forwards;
    double evals = (double)forwards / n, secs = r->st.seconds;
    json_t *sum = json_pack(
        "{s:i, s:i, s:i, s:s, s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:s}", "n", n, "experts", K,
        "steps", o->steps, "sampler", o->sampler, "policy", ts_policy_name(r->policy), "selection",
        sel_text, "tau", (double)o->tau, "cfg", (double)o->cfg, "evals_per_sample", evals,
        "router_evals_per_sample", (double)r->st.router_evals / n, "seconds", secs, "out", o->out);
    if (!sum)
        return NULL;
    json_object_set_new(sum, "class_prior", json_boolean(r->log_prior != NULL));
    json_object_set_new(sum, "prior", json_string(r->prior_used));
    json_object_set_new(sum, "exact_guidance", json_boolean(o->exact && o->cfg != 1.0f));
    json_object_set_new(sum, "router_temp", json_real(o->router_temp));
    json_object_set_new(sum, "route", json_string(o->trajectory));
    /* DDPM's noise: the experts' learned σ, or the posterior's β̃ */
    if (r->so.kind == TS_SAMPLER_DDPM)
        json_object_set_new(sum, "ddpm_variance",
                            json_string(r->st.learned_variance ? "learned" : "posterior"));
    json_t *share = json_array(), *unc = json_array();
    fprintf(stderr,
            "%d samples, %d %s steps, policy %s, selection %s, cfg %g: %.1f expert evaluations "
            "per sample, %.2f s (%.1f samples/s) → %s\nexpert use:",
            n, o->steps, o->sampler, ts_policy_name(r->policy), sel_text, (double)o->cfg, evals,
            secs, n / secs, o->out);
    for (int k = 0; k < K; k++) {
        double f = forwards > 0 ? (double)r->use[k] / (double)forwards : 0.0;
        fprintf(stderr, " %d:%.0f%%", k, 100.0 * f);
        json_array_append_new(share, json_real(f));
    }
    fprintf(stderr, "\nprior: %s\n", r->prior_used);
    if (r->so.kind == TS_SAMPLER_DDPM)
        fprintf(stderr, "ddpm variance: %s\n",
                r->st.learned_variance ? "the experts' learned σ (DiT's)"
                                       : "the posterior's β̃ (no expert here gives a learned σ)");
    if (r->loc.absent) {
        for (int k = 0; k < K; k++)
            if (r->loc.absent[k]) {
                double mass =
                    r->st.absent_routed ? r->absent_mass[k] / (double)r->st.absent_routed : 0.0;
                const ts_netgen_held_t *h = r->net.held ? &r->net.held[k] : NULL;
                char why[320] = "no live expert and no cached weights";
                if (h && h->n)
                    ts_netgen_held_text(&r->net, k, why, sizeof why);
                fprintf(stderr,
                        "UNCOVERED: cluster %d, routed around (%.1f%% of the routing mass): %s\n",
                        k, 100.0 * mass, why);
                json_t *u = json_pack("{s:i, s:f, s:s}", "cluster", k, "mass", mass, "reason",
                                      h && h->n ? "training" : "no expert");
                json_t *tj = u && h && h->n ? json_pack("{s:i, s:I, s:I, s:s}", "experts", h->n,
                                                        "step", (json_int_t)h->step, "steps",
                                                        (json_int_t)h->steps, "addr", h->addr)
                                            : NULL;
                if (tj && isfinite(h->heldout))
                    json_object_set_new(tj, "heldout_loss", json_real(h->heldout));
                if (tj && isfinite(h->reference))
                    json_object_set_new(tj, "reference_loss", json_real(h->reference));
                if (tj)
                    json_object_set_new(u, "training", tj);
                json_array_append_new(unc, u);
            }
    }
    json_object_set_new(sum, "uncovered", unc);
    json_object_set_new(sum, "expert_share", share);
    return sum;
}

/* The summary, then what else was asked for: the network's numbers, the trace, the routing. */
static int print_results(gen_run_t *r) {
    const gen_opts_t *o = &r->o;
    char sel_text[256];
    ts_selection_format(&r->sel, sel_text, sizeof sel_text);
    json_t *sum = summary(r, sel_text);
    int rc = TS_OK;
    if (o->peer && sum) {
        ts_remote_settle(&r->net.remote, 10000); /* the verdicts of accusations sent */
        json_t *nsum = network_summary(&r->rep, &r->net, &r->st);
        if (nsum)
            json_object_set_new(sum, "network", nsum);
    }
    if (o->peer && o->trace) {
        rc = write_trace(o->trace, &r->net.remote, r->err, sizeof r->err);
        if (rc == TS_OK)
            fprintf(stderr, "trace → %s\n", o->trace);
    }
    if (o->routing_json && sum) {
        rc = write_routing_json(o->routing_json, &r->rec, sum, r->err, sizeof r->err);
        if (rc == TS_OK)
            fprintf(stderr, "routing → %s\n", o->routing_json);
    }
    if (o->json && sum) {
        json_dumpf(sum, stdout, JSON_COMPACT);
        printf("\n");
    }
    json_decref(sum);
    return rc;
}

static void gen_free(gen_run_t *r) {
    free(r->images);
    free(r->labels);
    free(r->seeds);
    free(r->use);
    free(r->log_prior);
    free(r->absent_mass);
    free(r->rec.t);
    free(r->rec.policy);
    free(r->rec.w);
    ts_local_free(&r->loc);
    ts_netgen_close(&r->net);
    ts_engine_free(&r->eng);
}

int ts_cmd_generate(int argc, char **argv) {
    gen_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int pr = parse_opts(argc, argv, &r->o);
    if (pr == TS_ARGS_RUN && validate(r))
        pr = 2;
    if (pr != TS_ARGS_RUN) {
        free(r);
        return pr;
    }
    r->prior_used = "none";
    r->chunk = r->o.n < CHUNK ? r->o.n : CHUNK;
    r->pairs = r->o.cfg != 1.0f ? 2 : 1;
    int rc = open_experts(r);
    if (rc == TS_OK)
        rc = class_prior(r);
    if (rc == TS_OK)
        rc = alloc_buffers(r);
    if (rc == TS_OK)
        rc = run(r);
    if (rc == TS_OK)
        rc = print_results(r);
    if (rc != TS_OK && !r->said)
        ts_args_fail(PROG, r->err, rc);
    int code = rc == TS_OK ? 0 : r->usage ? 2 : 1;
    gen_free(r);
    free(r);
    return code;
}
