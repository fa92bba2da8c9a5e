/*
 * host.c — the weight server and the node's expert, hosted or trained (host.h).
 */
#define _POSIX_C_SOURCE 200809L

#include "daemon/host.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "daemon/expert.h"
#include "daemon/log.h"
#include "daemon/serve.h"
#include "daemon/train_job.h"
#include "daemon/weights_srv.h"
#include "kernels/engine.h"
#include "store/weights.h"

#define TICK_MS 100
#define READVERTISE_MS 10000
#define STOP_TRAIN_MS 30000

struct ts_host {
    ts_host_env_t env;
    ts_engine_t eng; /* loads weights for the server (one thread, then idle) */
    int eng_ok;
    ts_weights_srv_t *wsrv;
    ts_serve_t *serve;    /* the server of the weights advertised */
    ts_serve_t *retiring; /* a server being shut down before the next starts */
    ts_expert_info_t info;
    int has_info;
    ts_hash_t pending; /* weights to serve once retiring is gone */
    int has_pending;
    ts_train_job_t *job;
    uint64_t nomem_seen;     /* out-of-memory splits and refusals already logged */
    ts_train_job_t *old_job; /* told to stop (another cluster chosen), finishing its step and
                              * checkpoint on its own thread; reaped by the tick */
    /* the partition file and the cluster of what is served or trained: the config's, or in auto
     * mode what daemon/auto.c chose (cluster −1: nothing yet) */
    char partition[TS_CONFIG_PATH_MAX];
    int cluster;
    uv_async_t async; /* the job's notify */
    uv_timer_t timer;
    uint64_t seen_snapshots;
    int64_t seen_ckpt;
    ts_serve_stats_t base;        /* the counters of the servers retired so far */
    ts_serve_stats_t retiring_st; /* the retiring server's, read before it is freed */
    ts_serve_load_t advertised;
    uint64_t since_advert_ms;
    /* the training progress line: the step last logged (−1: none since the job started) and the
     * milliseconds since */
    int64_t logged_step;
    uint64_t since_progress_ms;
    int training_shown;   /* the gossip's status carries our job */
    char train_model[32]; /* a preset instead of [train] model ("": none) */
    int stopping, closed_handles;
    void (*done)(void *);
    void *done_arg;
};

/* ---- the advert ------------------------------------------------------------------------------- */

static void current_load(ts_host_t *h, ts_serve_load_t *l) {
    memset(l, 0, sizeof *l);
    if (h->serve)
        ts_serve_load(h->serve, l);
}

void ts_host_load(void *host, Tessera__Load *load) {
    ts_host_t *h = host;
    ts_serve_load_t l;
    current_load(h, &l);
    load->has_queue_depth = load->has_item_latency_us = load->has_requests_per_s = 1;
    load->queue_depth = l.queue_depth;
    load->item_latency_us = l.item_latency_us;
    load->requests_per_s = l.requests_per_s;
}

/* Optimiser steps per second since the job started (0 before its first step). */
static double train_rate(const ts_host_t *h, const ts_train_progress_t *p) {
    int batch = h->env.cfg->train_batch;
    return batch > 0 && p->samples_per_s > 0 ? p->samples_per_s / batch : 0.0;
}

/* Signs and announces the advert of what is served now, with capacity, load and (while
 * training) the training status. */
static void advertise(ts_host_t *h) {
    if (!h->has_info || !h->serve)
        return;
    const ts_daemon_config_t *c = h->env.cfg;
    ts_serve_load_t l;
    current_load(h, &l);
    Tessera__Capacity cap = TESSERA__CAPACITY__INIT;
    Tessera__Load load = TESSERA__LOAD__INIT;
    cap.has_items_per_s = cap.has_max_batch = cap.has_max_rows = cap.has_queue_limit = 1;
    /* a row is a sample (two with guidance): rows per second from the per-row latency */
    cap.items_per_s = l.item_latency_us ? 1e6f / (float)l.item_latency_us : 0.0f;
    int rows = 0;
    uint64_t model_bytes = 0, row_bytes = 0;
    /* [serve] max_batch, or what the device's memory holds */
    ts_serve_capacity(h->serve, &rows, &model_bytes, &row_bytes);
    cap.max_batch = (uint32_t)(rows / 2 > 0 ? rows / 2 : 1);
    cap.max_rows = (uint32_t)(rows > 0 ? rows : 1); /* an unguided request may carry this many */
    cap.has_model_bytes = cap.has_row_bytes = 1;
    cap.model_bytes = model_bytes;
    cap.row_bytes = row_bytes;
    cap.queue_limit = (uint32_t)c->serve_max_queue;
    char device[128];
    ts_serve_device(h->serve, device, sizeof device, NULL, 0);
    cap.device = device;
    ts_host_load(h, &load);
    ts_expert_advert_t a;
    ts_expert_advert(&h->info, &cap, &load, &a);
    Tessera__TrainingStatus tr = TESSERA__TRAINING_STATUS__INIT;
    if (h->job) {
        ts_train_progress_t p;
        ts_train_job_progress(h->job, &p);
        if (p.state == TS_TRAIN_RUNNING || p.state == TS_TRAIN_STOPPED) {
            tr.has_step = tr.has_steps = tr.has_steps_per_s = 1;
            tr.step = (uint64_t)p.snapshot_step;
            tr.steps = (uint64_t)p.steps;
            tr.steps_per_s = (float)train_rate(h, &p);
            if (isfinite(p.loss_avg)) {
                tr.has_loss = 1;
                tr.loss = p.loss_avg;
            }
            a.body.training = &tr;
        }
    }
    char err[512];
    if (ts_gossip_set_advert(h->env.gossip, &a.body, err, sizeof err) != TS_OK)
        ts_log_error("host", "cannot advertise the expert: %s", err);
    h->advertised = l;
    h->since_advert_ms = 0;
}

/* Whether the load moved enough since the last advert to sign a new one: the queue, or the
 * per-row latency or the request rate by a quarter. */
static int load_moved(const ts_serve_load_t *a, const ts_serve_load_t *b) {
    double la = a->item_latency_us, lb = b->item_latency_us;
    double ra = a->requests_per_s, rb = b->requests_per_s;
    return a->queue_depth != b->queue_depth || fabs(la - lb) > 0.25 * fmax(la, lb) ||
           fabs(ra - rb) > 0.25 * fmax(ra, rb) + 0.1;
}

/* The server's observers: the metrics' histograms, from the compute thread. */
static void observe_batch(void *ctx, int rows, uint64_t compute_us, uint64_t device_us) {
    ts_metrics_t *m = ctx;
    ts_metrics_observe(m, TS_M_BATCH_SIZE, NULL, rows);
    ts_metrics_observe(m, TS_M_COMPUTE_SECONDS, NULL, (double)compute_us / 1e6);
    if (device_us > 0)
        ts_metrics_observe(m, TS_M_DEVICE_SECONDS, NULL, (double)device_us / 1e6);
}

static void observe_queue_wait(void *ctx, uint64_t queue_us) {
    ts_metrics_observe(ctx, TS_M_QUEUE_WAIT_SECONDS, NULL, (double)queue_us / 1e6);
}

/* ---- serving a set of weights ----------------------------------------------------------------- */

/* Starts serving h->pending (in the store): the expert checked against the partition, the model
 * loaded, the server started, the advert signed. */
/* Weights that could not be served: said, and in auto mode the node chooses again. */
static void pending_failed(ts_host_t *h, const char *err) {
    ts_log_error("host", "cannot serve the new weights: %s", err);
    if (h->env.cfg->expert_mode == TS_EXPERT_AUTO && !h->serve && !h->job)
        h->cluster = -1;
}

static int start_pending(ts_host_t *h, char *err, size_t errlen) {
    const ts_daemon_config_t *c = h->env.cfg;
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h->pending, hex);
    h->has_pending = 0;
    ts_expert_info_t info;
    int rc = ts_expert_prepare(h->env.store, hex, h->partition, &info, err, errlen);
    if (rc == TS_OK && c->expert_router[0])
        rc = ts_expert_add_router(h->env.store, c->expert_router, &info, err, errlen);
    ts_dit_t m;
    memset(&m, 0, sizeof m);
    if (rc == TS_OK)
        rc = ts_weights_open_dit(h->env.store, &h->pending, &h->eng, 1, 0, &m, err, errlen);
    if (rc == TS_OK) {
        ts_serve_expert_t x = {.cfg = m.cfg, .params = &m.param_mem};
        memcpy(x.id, h->pending.b, sizeof x.id);
        ts_serve_opts_t so;
        ts_serve_opts_default(&so);
        so.max_batch = c->serve_max_batch;
        so.max_wait_ms = c->serve_max_wait_ms;
        so.max_queue = c->serve_max_queue;
        so.compute_threads = c->serve_compute_threads;
        so.device = c->compute_device;
        so.precision = c->compute_precision;
        so.attention = c->compute_attention;
        so.identity = h->env.identity;
        so.lie_bias = c->fault_lie_bias;
        so.lie_noise = c->fault_lie_noise;
        so.lie_scale = c->fault_lie_scale;
        so.lie_rate = c->fault_lie_rate;
        so.lie_seed = uv_hrtime(); /* a liar's draws differ from run to run */
        so.lie_after = (uint64_t)c->fault_lie_after;
        if (c->fault_lie_bias != 0.0 || c->fault_lie_noise != 0.0 || c->fault_lie_scale != 1.0)
            ts_log_warn("host",
                        "[fault] lie_* is set: this node answers %.0f%% of its requests wrongly "
                        "on purpose (tests and measurements only; clients that check will ban it)",
                        100.0 * c->fault_lie_rate);
        if (h->env.metrics) {
            so.on_batch = observe_batch;
            so.on_queue_wait = observe_queue_wait;
            so.observe_ctx = h->env.metrics;
        }
        rc = ts_serve_new(&h->serve, h->env.loop, h->env.rpc, &x, &so, err, errlen);
        ts_dit_free(&m);
    }
    if (rc != TS_OK) {
        ts_expert_info_free(&info);
        return rc;
    }
    if (h->has_info)
        ts_expert_info_free(&h->info);
    h->info = info;
    h->has_info = 1;
    char device[128], note[1024];
    ts_serve_device(h->serve, device, sizeof device, note, sizeof note);
    ts_log_info("host", "serving expert %.16s (cluster %u of %u, h%d d%d p%d) on %s", hex,
                info.cluster, info.num_clusters, info.config.hidden_size, info.config.depth,
                info.config.patch_size, note);
    advertise(h);
    return TS_OK;
}

/* Serves the weights h (in the store) from now on: at once when nothing is served, else once the
 * current server has finished its batch and gone. */
static void serve_weights(ts_host_t *h, const ts_hash_t *w) {
    h->pending = *w;
    h->has_pending = 1;
    if (h->serve) {
        ts_serve_shutdown(h->serve);
        if (h->retiring) /* a third set arrived while the second was still pending */
            return;
        h->retiring = h->serve;
        h->serve = NULL;
        return;
    }
    if (!h->retiring) {
        char err[1024];
        if (start_pending(h, err, sizeof err) != TS_OK)
            pending_failed(h, err);
    }
}

/* ---- the training job ------------------------------------------------------------------------- */

static void notify(void *ctx) { uv_async_send(ctx); }

static void on_train(uv_async_t *a) {
    ts_host_t *h = a->data;
    if (!h->job || h->stopping)
        return;
    ts_train_progress_t p;
    ts_train_job_progress(h->job, &p);
    if (p.ckpt_step != h->seen_ckpt && p.ckpt_step >= 0) {
        h->seen_ckpt = p.ckpt_step;
        char f16[96] = "", ho[64] = "";
        if (isfinite(p.heldout_loss) && p.heldout_step == p.ckpt_step)
            snprintf(ho, sizeof ho, " (held-out loss %.4f at step %lld)", (double)p.heldout_loss,
                     (long long)p.heldout_step);
        if (p.f16)
            snprintf(f16, sizeof f16, "; f16 loss scale 2^%d, %lld steps skipped",
                     ts_log2i(p.loss_scale), (long long)p.skipped);
        ts_log_info("train",
                    "checkpoint of step %lld in the store; at step %lld/%lld, loss %.4f%s, %.0f "
                    "samples/s (a step %.1f ms, %.1f ms of it on the device's timeline)%s",
                    (long long)p.ckpt_step, (long long)p.step, (long long)p.steps,
                    (double)p.loss_avg, ho, p.samples_per_s, p.step_s * 1e3, p.step_device_s * 1e3,
                    f16);
    }
    /* a train-mode node serves its checkpoints only past [train] serve_from of the run; an auto
     * node advertises every one (its advert is how the other auto nodes see the cluster taken;
     * clients leave an unfinished expert out by their own bar) */
    int past_bar = h->env.cfg->expert_mode == TS_EXPERT_AUTO ||
                   (double)p.snapshot_step >= h->env.cfg->train_serve_from * (double)p.steps;
    if (p.state == TS_TRAIN_RUNNING && p.snapshots != h->seen_snapshots && past_bar &&
        (h->env.cfg->train_serve_while_training || h->env.cfg->expert_mode == TS_EXPERT_AUTO)) {
        h->seen_snapshots = p.snapshots;
        ts_train_snapshot_t *s = ts_train_job_snapshot(h->job);
        if (s) {
            serve_weights(h, &s->hash);
            ts_train_snapshot_release(s);
        }
    }
    if (p.state == TS_TRAIN_DONE) {
        ts_train_job_stop(h->job, 0);
        char hex[TS_HASH_HEX];
        ts_hash_hex(&p.weights, hex);
        char ho[48] = "";
        if (isfinite(p.heldout_loss))
            snprintf(ho, sizeof ho, ", held-out loss %.4f", (double)p.heldout_loss);
        ts_log_info("train", "done: %lld steps, loss %.4f%s; weights %.16s in the store",
                    (long long)p.steps, (double)p.loss_avg, ho, hex);
        ts_train_job_free(h->job);
        h->job = NULL;
        serve_weights(h, &p.weights);
    } else if (p.state == TS_TRAIN_FAILED) {
        ts_log_error("train",
                     "the training job failed: %s (the last checkpoint is intact; a "
                     "restart resumes from it)",
                     p.message);
        ts_train_job_stop(h->job, 0);
        ts_train_job_free(h->job);
        h->job = NULL;
        if (h->env.cfg->expert_mode == TS_EXPERT_AUTO && !h->serve)
            h->cluster = -1; /* nothing served: the auto node chooses again */
    }
}

/* "4m05s", "1h52m", "3d04h": the time left at this rate; "unknown" before the first step. */
static void eta_text(int64_t left, double rate, char *out, size_t len) {
    if (!(rate > 0.0)) {
        snprintf(out, len, "unknown");
        return;
    }
    double s = (double)left / rate;
    if (s < 60.0)
        snprintf(out, len, "%.0fs", s);
    else if (s < 3600.0)
        snprintf(out, len, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else if (s < 86400.0)
        snprintf(out, len, "%dh%02dm", (int)(s / 3600), (int)s / 60 % 60);
    else
        snprintf(out, len, "%dd%02dh", (int)(s / 86400), (int)s / 3600 % 24);
}

/* Every tick while a job runs: the progress line in the log after its first step and then
 * every [train] progress_every_s, and the job in our status answers (from its first step, before
 * any snapshot is advertised). */
static void training_tick(ts_host_t *h) {
    if (!h->job) {
        if (h->training_shown) {
            ts_gossip_set_training(h->env.gossip, NULL);
            h->training_shown = 0;
        }
        return;
    }
    ts_train_progress_t p;
    ts_train_job_progress(h->job, &p);
    if (p.state != TS_TRAIN_RUNNING)
        return;
    double rate = train_rate(h, &p);
    ts_gossip_training_t t = {.active = 1,
                              .step = (uint64_t)p.step,
                              .steps = (uint64_t)p.steps,
                              .loss = p.loss_avg,
                              .steps_per_s = (float)rate,
                              .cluster = (uint32_t)(h->cluster > 0 ? h->cluster : 0),
                              .served = h->has_info && h->serve && p.snapshot_step >= 0,
                              .heldout_loss = p.heldout_loss,
                              .heldout_step = p.heldout_step >= 0 ? (uint64_t)p.heldout_step : 0};
    /* the run id is tesserad/<partition_id>/<cluster>/<digits> */
    char hex[TS_HASH_HEX];
    ts_hash_t pid;
    if (sscanf(p.run_id, "tesserad/%64[0-9a-f]/", hex) == 1 && ts_hash_parse(hex, &pid) == TS_OK)
        memcpy(t.partition, pid.b, sizeof t.partition);
    ts_gossip_set_training(h->env.gossip, &t);
    h->training_shown = 1;
    h->since_progress_ms += TICK_MS;
    int first = h->logged_step < 0 && p.step > p.resumed_from;
    int due = h->logged_step >= 0 && p.step > h->logged_step &&
              h->since_progress_ms >= (uint64_t)h->env.cfg->train_progress_every_s * 1000u;
    if (!first && !due)
        return;
    char eta[32], ho[96] = "";
    eta_text(p.steps - p.step, rate, eta, sizeof eta);
    if (isfinite(p.heldout_loss))
        snprintf(ho, sizeof ho, ", held-out loss %.4f at step %lld", (double)p.heldout_loss,
                 (long long)p.heldout_step);
    ts_log_info("train",
                "step %lld/%lld (%.1f%%), loss %.4f (running average %.4f)%s, %.2f steps/s, %.0f "
                "samples/s; about %s to go%s",
                (long long)p.step, (long long)p.steps, 100.0 * (double)p.step / (double)p.steps,
                (double)p.loss, (double)p.loss_avg, ho, rate, p.samples_per_s, eta,
                t.served ? "; served from its newest checkpoint, which clients skip until the "
                           "run is done"
                         : "");
    h->logged_step = p.step;
    h->since_progress_ms = 0;
}

/* Starts the training job of h->cluster of h->partition as [train] says (auto mode: serving
 * every checkpoint while it trains, so that the cluster is advertised at once). */
static int start_training(ts_host_t *h, char *err, size_t errlen) {
    const ts_daemon_config_t *c = h->env.cfg;
    ts_train_job_opts_t o;
    ts_train_job_opts_from_config(&o, c, h->env.store);
    o.partition = h->partition;
    o.cluster = h->cluster;
    if (h->train_model[0])
        o.model = h->train_model;
    if (c->expert_mode == TS_EXPERT_AUTO)
        o.snapshots = 1, o.out = NULL;
    o.notify = notify;
    o.ctx = &h->async;
    int rc = ts_train_job_start(&h->job, &o, err, errlen);
    h->logged_step = -1;
    h->since_progress_ms = 0;
    if (rc == TS_OK) {
        ts_train_progress_t p;
        ts_train_job_progress(h->job, &p);
        ts_log_info("train", "training run %s: cluster %d, from step %lld of %lld%s", p.run_id,
                    h->cluster, (long long)p.resumed_from, (long long)p.steps,
                    p.resumed_from ? " (resumed from the store)" : "");
    }
    return rc;
}

/* Ends the training job now (it checkpoints), if there is one. */
/* Frees the old job once its thread has ended (wait_ms: how long to wait for it; -1 for ever);
 * 1 when there is none left. */
static int reap_old_job(ts_host_t *h, int wait_ms) {
    if (!h->old_job)
        return 1;
    if (ts_train_job_stop(h->old_job, wait_ms) != TS_OK)
        return 0;
    ts_train_job_free(h->old_job);
    h->old_job = NULL;
    ts_log_info("train", "the previous training run stopped; its last checkpoint is in the store");
    return 1;
}

/* Stops the training job without waiting on the loop: it finishes its step and checkpoint on
 * its own thread while the loop goes on serving, and the tick frees it. Only one waits so: a
 * job still stopping from before is waited for here (seconds at most, and rare). */
static void end_training(ts_host_t *h) {
    if (!h->job)
        return;
    reap_old_job(h, -1);
    ts_train_job_request_stop(h->job);
    h->old_job = h->job;
    h->job = NULL;
}

int ts_host_cluster(const ts_host_t *h) { return h ? h->cluster : -1; }

const char *ts_host_partition(const ts_host_t *h) { return h ? h->partition : ""; }

int ts_host_serve_expert(ts_host_t *h, const char *partition, int cluster, const ts_hash_t *w) {
    if (!h || !partition || !w || cluster < 0 || h->stopping)
        return TS_EINVAL;
    end_training(h);
    snprintf(h->partition, sizeof h->partition, "%s", partition);
    h->cluster = cluster;
    serve_weights(h, w);
    return TS_OK;
}

void ts_host_set_train_model(ts_host_t *h, const char *preset) {
    if (h)
        snprintf(h->train_model, sizeof h->train_model, "%s", preset ? preset : "");
}

int ts_host_train_expert(ts_host_t *h, const char *partition, int cluster, char *err,
                         size_t errlen) {
    if (!h || !partition || cluster < 0 || h->stopping)
        return TS_EINVAL;
    end_training(h);
    snprintf(h->partition, sizeof h->partition, "%s", partition);
    h->cluster = cluster;
    h->seen_snapshots = 0, h->seen_ckpt = -1;
    int rc = start_training(h, err, errlen);
    if (rc != TS_OK && !h->serve)
        h->cluster = -1; /* nothing served, nothing trained: choose again */
    return rc;
}

/* ---- the tick: retiring servers, re-adverts, stopping ----------------------------------------- */

static void handle_closed(uv_handle_t *x) {
    ts_host_t *h = x->data;
    if (++h->closed_handles == 2 && h->done)
        h->done(h->done_arg);
}

/* Adds a retired server's counters to the base, so that the metrics never go down. */
static void add_stats(ts_serve_stats_t *to, const ts_serve_stats_t *s) {
    to->requests += s->requests;
    for (int o = 0; o < TS_SERVE_OUTCOMES; o++)
        to->answered[o] += s->answered[o];
    to->batches += s->batches;
    to->rows += s->rows;
    to->nomem_splits += s->nomem_splits;
    to->nomem_refused += s->nomem_refused;
}

/* Frees a server that was shut down, once it has finished; 1 when it is gone. */
static int reap(ts_host_t *h, ts_serve_t **s) {
    ts_serve_stats(*s, &h->retiring_st);
    if (ts_serve_free(*s) != TS_OK)
        return 0;
    add_stats(&h->base, &h->retiring_st);
    *s = NULL;
    return 1;
}

static void on_tick(uv_timer_t *t) {
    ts_host_t *h = t->data;
    reap_old_job(h, 0);
    if (h->retiring && reap(h, &h->retiring)) {
        if (h->has_pending && !h->stopping) {
            char err[1024];
            if (start_pending(h, err, sizeof err) != TS_OK)
                pending_failed(h, err);
        }
    }
    if (h->stopping) {
        if (h->serve)
            reap(h, &h->serve);
        if (h->wsrv && ts_weights_srv_free(h->wsrv) == TS_OK)
            h->wsrv = NULL;
        if (!h->serve && !h->retiring && !h->wsrv) {
            uv_timer_stop(&h->timer);
            uv_close((uv_handle_t *)&h->timer, handle_closed);
            uv_close((uv_handle_t *)&h->async, handle_closed);
        }
        return;
    }
    training_tick(h);
    h->since_advert_ms += TICK_MS;
    if (h->serve && h->since_advert_ms >= READVERTISE_MS) {
        ts_serve_load_t l;
        current_load(h, &l);
        if (load_moved(&l, &h->advertised) || h->job)
            advertise(h);
        else
            h->since_advert_ms = 0;
    }
}

/* ---- lifecycle -------------------------------------------------------------------------------- */

int ts_host_new(ts_host_t **out, const ts_host_env_t *env, char *err, size_t errlen) {
    *out = NULL;
    ts_host_t *h = calloc(1, sizeof *h);
    if (!h) {
        ts_set_err(err, errlen, "out of memory");
        return TS_ENOMEM;
    }
    h->env = *env;
    h->seen_ckpt = -1;
    h->logged_step = -1;
    const ts_daemon_config_t *c = env->cfg;
    snprintf(h->partition, sizeof h->partition, "%s", c->expert_partition);
    h->cluster = c->expert_mode == TS_EXPERT_TRAIN ? c->expert_cluster : -1;
    ts_engine_opts_t eo = {TS_CPU, 1, 0};
    int rc = ts_engine_init(&h->eng, &eo);
    h->eng_ok = rc == TS_OK;
    ts_weights_srv_opts_t wo;
    ts_weights_srv_opts_default(&wo);
    wo.bandwidth = (uint64_t)c->weights_bandwidth_mib_s << 20;
    wo.max_pending = c->weights_max_pending;
    if (rc == TS_OK)
        rc = ts_weights_srv_new(&h->wsrv, env->loop, env->rpc, env->store, &wo);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "cannot start the weight server: %s", ts_strerror(rc));
        ts_host_free(h);
        return rc;
    }
    uv_timer_init(env->loop, &h->timer);
    uv_async_init(env->loop, &h->async, on_train);
    h->timer.data = h->async.data = h;
    uv_timer_start(&h->timer, on_tick, TICK_MS, TICK_MS);
    if (c->expert_mode == TS_EXPERT_HOST) {
        ts_expert_info_t info;
        rc = ts_expert_prepare(env->store, c->expert_weights, c->expert_partition, &info, err,
                               errlen);
        if (rc == TS_OK) {
            h->pending = info.weights_hash;
            h->has_pending = 1;
            ts_expert_info_free(&info);
            rc = start_pending(h, err, errlen);
        }
    } else if (c->expert_mode == TS_EXPERT_TRAIN) {
        rc = start_training(h, err, errlen);
    }
    *out = h;
    return rc; /* on failure the caller stops and frees h like a running one */
}

void ts_host_metrics(ts_host_t *h) {
    ts_metrics_t *m = h->env.metrics;
    if (!m)
        return;
    ts_serve_stats_t st = h->base;
    if (h->serve) {
        ts_serve_stats_t now;
        ts_serve_stats(h->serve, &now);
        add_stats(&st, &now);
    }
    {
        ts_serve_load_t l;
        current_load(h, &l);
        /* the retired servers' counts plus the current one's: never going down (requests and
         * errors by type are counted for every RPC by net/rpc, in main.c) */
        ts_metrics_counter_set(m, TS_M_BUSY, NULL, st.answered[TS_SERVE_BUSY]);
        ts_metrics_counter_set(m, TS_M_DEADLINE_DROPS, NULL, st.answered[TS_SERVE_DEADLINE]);
        ts_metrics_counter_set(m, TS_M_DENOISE_STEPS, NULL, st.batches);
        ts_metrics_counter_set(m, TS_M_DENOISE_SAMPLES, NULL, st.rows);
        ts_metrics_gauge_set(m, TS_M_QUEUE_DEPTH, NULL, l.queue_depth);
        ts_metrics_counter_set(m, TS_M_OUT_OF_MEMORY, "split", st.nomem_splits);
        ts_metrics_counter_set(m, TS_M_OUT_OF_MEMORY, "refused", st.nomem_refused);
        if (st.nomem_splits + st.nomem_refused != h->nomem_seen) {
            h->nomem_seen = st.nomem_splits + st.nomem_refused;
            ts_serve_stats_t now = {0};
            if (h->serve)
                ts_serve_stats(h->serve, &now);
            ts_log_warn("serve",
                        "out of device memory: %llu batches split, %llu requests refused (too big "
                        "alone); batches now at most %u rows",
                        (unsigned long long)st.nomem_splits, (unsigned long long)st.nomem_refused,
                        now.rows_cap);
        }
        size_t total = 0, used = 0;
        if (h->serve && ts_serve_memory(h->serve, &total, &used) == TS_OK) {
            ts_metrics_gauge_set(m, TS_M_DEVICE_MEMORY, "total", (double)total);
            ts_metrics_gauge_set(m, TS_M_DEVICE_MEMORY, "used", (double)used);
        }
        double util = 0.0;
        if (h->serve && ts_serve_utilization(h->serve, &util) == TS_OK)
            ts_metrics_gauge_set(m, TS_M_DEVICE_UTILIZATION, NULL, util);
    }
    if (h->job) {
        ts_train_progress_t p;
        ts_train_job_progress(h->job, &p);
        ts_metrics_gauge_set(m, TS_M_TRAIN_STEP, NULL, (double)p.step);
        if (isfinite(p.loss))
            ts_metrics_gauge_set(m, TS_M_TRAIN_LOSS, NULL, p.loss);
        ts_metrics_counter_set(m, TS_M_TRAIN_SAMPLES, NULL,
                               (uint64_t)p.step * (uint64_t)h->env.cfg->train_batch);
        ts_metrics_gauge_set(m, TS_M_TRAIN_STEP_SECONDS, "wall", p.step_s);
        ts_metrics_gauge_set(m, TS_M_TRAIN_STEP_SECONDS, "device", p.step_device_s);
    }
}

void ts_host_stop(ts_host_t *h, void (*done)(void *arg), void *arg) {
    if (h->stopping)
        return;
    h->stopping = 1;
    h->done = done;
    h->done_arg = arg;
    reap_old_job(h, STOP_TRAIN_MS);
    if (h->job) {
        if (ts_train_job_stop(h->job, STOP_TRAIN_MS) != TS_OK)
            ts_log_warn("train",
                        "the training step did not end within %d s; the last "
                        "checkpoint is intact",
                        STOP_TRAIN_MS / 1000);
        else
            ts_log_info("train", "stopped; checkpointed in the store");
    }
    if (h->serve)
        ts_serve_shutdown(h->serve);
    if (h->wsrv)
        ts_weights_srv_shutdown(h->wsrv);
}

void ts_host_free(ts_host_t *h) {
    if (!h)
        return;
    if (h->job && ts_train_job_stop(h->job, 0) != TS_OK)
        ts_train_job_stop(h->job, -1);
    ts_train_job_free(h->job);
    reap_old_job(h, -1);
    /* a host whose start failed was stopped with the loop's handles closed under it, before its
     * tick could free its servers: they are closed now, and free at once */
    if ((h->serve && ts_serve_free(h->serve) != TS_OK) ||
        (h->retiring && ts_serve_free(h->retiring) != TS_OK) ||
        (h->wsrv && ts_weights_srv_free(h->wsrv) != TS_OK))
        ts_log_error("daemon", "an expert's server was still running when the host was freed");
    if (h->has_info)
        ts_expert_info_free(&h->info);
    if (h->eng_ok)
        ts_engine_free(&h->eng);
    free(h);
}
