/* Choosing a model's attention (and, on a GPU, its forward graphs) by measuring them on the
 * machine that runs it: model/dit.h ts_dit_tune, ts_dit_choose_attention. */
#include "model/dit.h"

#include "base/clock.h"
#include "base/error.h"
#include "kernels/backend.h"
#include "kernels/ref.h"
#include "model/quality.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const CHOICES[] = {"auto", "measure", "fused", "composed"};

int ts_attn_choice_parse(const char *s, ts_attn_choice_t *out) {
    for (int i = 0; s && i < 4; i++)
        if (strcmp(s, CHOICES[i]) == 0) {
            *out = (ts_attn_choice_t)i;
            return TS_OK;
        }
    return TS_EINVAL;
}

const char *ts_attn_choice_name(ts_attn_choice_t c) { return (unsigned)c < 4 ? CHOICES[c] : "?"; }

const char *ts_attn_name(ts_attn_impl_t a) { return a == TS_ATTN_FUSED ? "fused" : "composed"; }

/* The largest relative RMS difference between the fused and the composed forward that still
 * counts as the same model (docs/architecture.md, "Choosing the attention"): at f32 they differ
 * by their order of summation (test_dit_tune: ~2e-7 on `tiny`), at bf16 or f16 also by where
 * they round their 16-bit operands (~7e-4 at bf16). A kernel that computes something else — a
 * wrong tile, an unset fragment — is off by order 1. */
#define SAME_F32 1e-3
#define SAME_LP 1e-1

static double same_bound(ts_precision_t p) { return p == TS_PREC_F32 ? SAME_F32 : SAME_LP; }

/* a is faster than b by more than the timer's noise */
static int faster(double a, double b) { return a > 0.0 && a < 0.97 * b; }

ts_attn_impl_t ts_dit_tune_pick(const ts_dit_tune_t *t, ts_precision_t p, ts_attn_impl_t def) {
    if (!(t->ms[TS_ATTN_COMPOSED] > 0.0))
        return def;
    if (!(t->ms[TS_ATTN_FUSED] > 0.0) || !(t->fused_diff <= same_bound(p)))
        return TS_ATTN_COMPOSED;
    if (faster(t->ms[TS_ATTN_FUSED], t->ms[TS_ATTN_COMPOSED]))
        return TS_ATTN_FUSED;
    if (faster(t->ms[TS_ATTN_COMPOSED], t->ms[TS_ATTN_FUSED]))
        return TS_ATTN_COMPOSED;
    return def;
}

/* The epilogues change where the bias is added (the products may take other kernels, so other
 * orders of summation) and, for fc1 with 16-bit activations, take cuBLASLt's own GELU (and
 * maybe a bias rounded to 16 bits): their output within this of the two kernels' — ten times the
 * fused-against-composed difference measured at bf16 — while a missing or doubled bias, or a
 * GELU that is not one, is not. */
#define SAME_EPILOGUE 1e-2

int ts_dit_tune_epilogues_keep(const ts_dit_tune_t *t, ts_attn_impl_t a) {
    return t->epilogues_diff <= SAME_EPILOGUE && faster(t->ms_epilogues, t->ms[a]);
}

int ts_dit_tune_graphs_keep(const ts_dit_tune_t *t, ts_attn_impl_t a) {
    return t->graphs_same && faster(t->ms_graphs, t->epilogues ? t->ms_epilogues : t->ms[a]);
}

/* The inputs of the measurement: x ~ a fixed pseudo-random pattern in [−1, 1], t spread over
 * (0, 1), labels cycling over the classes and the null label. */
typedef struct {
    ts_tensor_t x, t; /* on the engine's device */
    int32_t *y;       /* host */
    float *out[2];    /* host: each attention's output (then the graphs') */
    int64_t n;        /* floats per output */
} probe_t;

static void probe_free(probe_t *p) {
    ts_tensor_free(&p->x);
    ts_tensor_free(&p->t);
    free(p->y);
    free(p->out[0]);
    free(p->out[1]);
}

static int probe_init(probe_t *p, const ts_dit_t *m, int B) {
    memset(p, 0, sizeof *p);
    const ts_dit_config_t *c = &m->cfg;
    int64_t chw = (int64_t)c->in_channels * c->input_size * c->input_size;
    p->n = (int64_t)B * chw; /* the forward's velocity (a learned σ is apart: ts_dit_sigma) */
    ts_tensor_t hx = {0}, ht = {0};
    int rc = ts_tensor_alloc(&hx, TS_F32, TS_CPU, 4,
                             TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&ht, TS_F32, TS_CPU, 1, TS_SHAPE(B));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&p->x, TS_F32, m->eng->device, 4,
                             TS_SHAPE(B, c->in_channels, c->input_size, c->input_size));
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&p->t, TS_F32, m->eng->device, 1, TS_SHAPE(B));
    if (rc == TS_OK) {
        p->y = malloc((size_t)B * sizeof *p->y);
        p->out[0] = malloc((size_t)p->n * sizeof(float));
        p->out[1] = malloc((size_t)p->n * sizeof(float));
        if (!p->y || !p->out[0] || !p->out[1])
            rc = TS_ENOMEM;
    }
    if (rc == TS_OK) {
        float *xs = hx.data, *ts = ht.data;
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (int64_t i = 0; i < (int64_t)B * chw; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            xs[i] = (float)((double)(s >> 11) / (double)(1ull << 53)) * 2.0f - 1.0f;
        }
        for (int b = 0; b < B; b++) {
            ts[b] = ((float)b + 0.5f) / (float)B;
            p->y[b] = b % (c->num_classes + 1);
        }
        rc = ts_tensor_copy(&p->x, &hx);
        if (rc == TS_OK)
            rc = ts_tensor_copy(&p->t, &ht);
    }
    ts_tensor_free(&hx);
    ts_tensor_free(&ht);
    if (rc != TS_OK)
        probe_free(p);
    return rc;
}

/* One forward at B, its output copied to host (out may be NULL: timing only, then the engine is
 * synchronised instead). */
static int forward(ts_dit_t *m, probe_t *p, int B, float *out) {
    ts_tensor_t v;
    TS_TRY(ts_dit_forward(m, &p->x, &p->t, p->y, B, &v));
    if (!out)
        return ts_engine_sync(m->eng);
    ts_tensor_t h;
    TS_TRY(ts_tensor_wrap(&h, out, TS_F32, TS_CPU, v.ndim, v.shape));
    return ts_tensor_copy(&h, &v);
}

/* Median milliseconds per forward of reps forwards (after the one the caller made). */
static int time_forward(ts_dit_t *m, probe_t *p, int B, int reps, double *ms) {
    double t[TS_DIT_TUNE_MAX_REPS];
    for (int r = 0; r < reps; r++) {
        double t0 = ts_now_s();
        TS_TRY(forward(m, p, B, NULL));
        t[r] = (ts_now_s() - t0) * 1e3;
    }
    *ms = ts_quantile(t, reps, 0.5);
    return TS_OK;
}

/* sqrt(Σ(a − b)²) / sqrt(Σ b²), kernels/ref.h's normalised error: +inf where a is not finite and
 * b is. */
static double rel_rms(const float *a, const float *b, int64_t n) {
    return sqrt(ts_ref_nmse(a, b, n));
}

int ts_dit_tune(ts_dit_t *m, int batch, int reps, ts_dit_tune_t *out) {
    if (!m || !m->info || !out || m->trainable || batch < 1 || batch > m->max_batch || reps < 1 ||
        reps > TS_DIT_TUNE_MAX_REPS)
        return TS_EINVAL;
    memset(out, 0, sizeof *out);
    out->batch = batch;
    out->reps = reps;
    out->attn = m->attn;
    ts_attn_impl_t def = ts_dit_default_attention(m);
    ts_attn_impl_t was = m->attn;
    int graphs_was = m->graphs.on == 1;
    probe_t p;
    TS_TRY(probe_init(&p, m, batch));
    ts_dit_set_graphs(m, 0);
    /* the epilogues (the engine's setting) off while the attentions are timed, so that the
     * two-kernel forward is what they are measured against; a cuBLASLt that could not start
     * (−1) is left so */
    int epi_was = ts_cuda_epilogues(m->eng);
    int epi = m->eng->device == TS_CUDA && m->precision != TS_PREC_F32 && epi_was != -1 &&
              ts_cuda_set_epilogues(m->eng, 0) == TS_OK;
    /* the composed attention: the reference every other choice is checked against */
    int rc = ts_dit_set_attention(m, TS_ATTN_COMPOSED);
    if (rc == TS_OK)
        rc = forward(m, &p, batch, p.out[0]);
    if (rc == TS_OK)
        rc = time_forward(m, &p, batch, reps, &out->ms[TS_ATTN_COMPOSED]);
    /* the fused one, where the model can take it; one that fails to run is not taken (a kernel
     * refusing its launch), and the composed one must still run after it */
    int frc = rc == TS_OK ? ts_dit_set_attention(m, TS_ATTN_FUSED) : rc;
    if (frc == TS_OK) {
        frc = forward(m, &p, batch, p.out[1]);
        if (frc == TS_OK) {
            out->fused_diff = rel_rms(p.out[1], p.out[0], p.n);
            frc = time_forward(m, &p, batch, reps, &out->ms[TS_ATTN_FUSED]);
        }
    } else if (frc == TS_ENOMEM && rc == TS_OK) {
        rc = frc;
    }
    if (frc != TS_OK)
        out->ms[TS_ATTN_FUSED] = 0.0;
    ts_attn_impl_t pick = ts_dit_tune_pick(out, m->precision, def);
    if (rc == TS_OK) {
        double f = out->ms[TS_ATTN_FUSED], c = out->ms[TS_ATTN_COMPOSED];
        if (frc == TS_ENOTSUP)
            snprintf(out->note, sizeof out->note, "composed (the fused attention cannot run here)");
        else if (frc != TS_OK)
            snprintf(out->note, sizeof out->note, "composed (the fused attention failed: %s)",
                     ts_strerror(frc));
        else if (!(out->fused_diff <= same_bound(m->precision)))
            snprintf(out->note, sizeof out->note,
                     "composed (the fused attention's output differs from the composed one's by "
                     "%.3g, relative RMS, more than %.0e)",
                     out->fused_diff, same_bound(m->precision));
        else
            snprintf(out->note, sizeof out->note,
                     "%s (fused %.3f ms, composed %.3f ms per forward at batch %d%s)",
                     ts_attn_name(pick), f, c, batch,
                     !faster(f, c) && !faster(c, f) ? ": within 3 %, the default" : "");
        rc = ts_dit_set_attention(m, pick);
    }
    if (rc == TS_OK && frc != TS_OK && frc != TS_ENOTSUP) /* does the GPU still work? */
        rc = forward(m, &p, batch, NULL);
    /* the epilogues, at bf16 or f16 on a GPU: measured against the two kernels' forward */
    if (rc == TS_OK && epi) {
        rc = forward(m, &p, batch, p.out[0]);
        int64_t calls = ts_cuda_epilogue_calls(m->eng);
        int erc = rc == TS_OK ? ts_cuda_set_epilogues(m->eng, 1) : rc;
        if (erc == TS_ENOTSUP && ts_cuda_epilogues(m->eng) == -1)
            erc = TS_OK; /* cuBLASLt could not start: not a failure, no product takes them */
        else if (erc == TS_OK)
            erc = forward(m, &p, batch, p.out[1]);
        int ran = erc == TS_OK && ts_cuda_epilogue_calls(m->eng) > calls;
        if (ran) {
            out->epilogues_measured = 1;
            out->epilogues_diff = rel_rms(p.out[1], p.out[0], p.n);
            erc = time_forward(m, &p, batch, reps, &out->ms_epilogues);
        }
        out->epilogues = erc == TS_OK && ran && ts_dit_tune_epilogues_keep(out, pick);
        int lt_dead = ts_cuda_epilogues(m->eng) == -1;
        if (!lt_dead)
            (void)ts_cuda_set_epilogues(m->eng, out->epilogues);
        size_t used = strlen(out->note);
        if (rc == TS_OK && erc != TS_OK)
            snprintf(out->note + used, sizeof out->note - used, "; epilogues off (they failed: %s)",
                     ts_strerror(erc));
        else if (rc == TS_OK && !ran)
            snprintf(out->note + used, sizeof out->note - used, "; epilogues off (%s)",
                     lt_dead ? "cuBLASLt could not start" : "no product took them");
        else if (rc == TS_OK)
            snprintf(out->note + used, sizeof out->note - used,
                     "; epilogues %s (%.3f ms per forward, output %.2g off)",
                     out->epilogues ? "on" : "off", out->ms_epilogues, out->epilogues_diff);
    }
    /* graphs, on a GPU: the chosen attention's forward through them must give the same bits
     * as the eager forward just before, and be faster */
    if (rc == TS_OK && m->eng->device == TS_CUDA) {
        out->graphs_measured = 1;
        float *eager = p.out[0], *graphed = p.out[1];
        int64_t captures = m->graphs.captures, launches = m->graphs.launches;
        ts_dit_set_graphs(m, 1);
        rc = forward(m, &p, batch, eager); /* a key seen once: eager */
        if (rc == TS_OK)
            rc = forward(m, &p, batch, graphed); /* seen twice: captured, then launched */
        int ran =
            m->graphs.on == 1 && m->graphs.captures > captures && m->graphs.launches > launches;
        if (rc == TS_OK && ran) {
            out->graphs_same = memcmp(eager, graphed, (size_t)p.n * sizeof(float)) == 0;
            rc = time_forward(m, &p, batch, reps, &out->ms_graphs);
        }
        out->graphs = rc == TS_OK && ran && ts_dit_tune_graphs_keep(out, pick);
        size_t used = strlen(out->note);
        if (rc == TS_OK)
            snprintf(out->note + used, sizeof out->note - used, "; graphs %s",
                     !ran                ? "off (the capture failed)"
                     : !out->graphs_same ? "off (their output differs from the eager one)"
                     : out->graphs       ? "on"
                                         : "off (not faster)");
        used = strlen(out->note);
        if (rc == TS_OK && ran)
            snprintf(out->note + used, sizeof out->note - used, " (%.3f ms per forward)",
                     out->ms_graphs);
        ts_dit_set_graphs(m, out->graphs);
    } else if (rc == TS_OK) {
        ts_dit_set_graphs(m, graphs_was);
    }
    if (rc != TS_OK) { /* back to what m and its engine had, where it can be */
        (void)ts_dit_set_attention(m, was);
        ts_dit_set_graphs(m, graphs_was);
        if (epi && ts_cuda_epilogues(m->eng) != -1)
            (void)ts_cuda_set_epilogues(m->eng, epi_was);
        out->epilogues = 0;
    }
    out->attn = m->attn;
    probe_free(&p);
    return rc;
}

int ts_dit_choose_attention(ts_dit_t *m, ts_attn_choice_t c, int batch, char *note,
                            size_t note_len) {
    if (!m || !m->info || (unsigned)c > TS_ATTN_CHOOSE_COMPOSED)
        return TS_EINVAL;
    if (c == TS_ATTN_CHOOSE_MEASURE ||
        (c == TS_ATTN_CHOOSE_AUTO && m->eng->device != TS_CPU && !m->trainable)) {
        ts_dit_tune_t t;
        int rc = ts_dit_tune(m, batch, 5, &t);
        if (rc == TS_OK) {
            snprintf(note, note_len, "attention measured: %s", t.note);
            return TS_OK;
        }
        /* the measurement failed (the tune put m back): the default, if it can be had — under
         * auto whatever the reason (a node keeps serving as it would without measuring; a
         * broken device shows in its forwards), under measure only for want of memory */
        int drc = ts_dit_set_attention(m, ts_dit_default_attention(m));
        snprintf(note, note_len, "attention %s (measuring failed: %s)", ts_attn_name(m->attn),
                 ts_strerror(rc));
        int keep = rc == TS_ENOMEM || (c == TS_ATTN_CHOOSE_AUTO && rc != TS_EINVAL);
        return keep && drc == TS_OK ? TS_OK : rc;
    }
    if (c == TS_ATTN_CHOOSE_AUTO) {
        snprintf(note, note_len, "attention %s (the default)", ts_attn_name(m->attn));
        return TS_OK;
    }
    ts_attn_impl_t want = c == TS_ATTN_CHOOSE_FUSED ? TS_ATTN_FUSED : TS_ATTN_COMPOSED;
    int rc = ts_dit_set_attention(m, want);
    if (rc == TS_ENOTSUP) {
        snprintf(note, note_len, "attention %s (%s cannot run here)", ts_attn_name(m->attn),
                 ts_attn_name(want));
        return TS_OK;
    }
    snprintf(note, note_len, "attention %s%s", ts_attn_name(m->attn),
             rc == TS_OK ? "" : " (switching failed)");
    return rc;
}
