/*
 * judge.c — the judges' networks (model/judge.h): layers, forward, backward, training, files.
 */
#include "model/judge.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/str.h"
#include "kernels/engine.h"
#include "kernels/math.h"
#include "model/optim.h"
#include "model/safetensors.h"

#define MAX_LAYERS 8
#define MAX_META 16
#define FORMAT "tessera-judge/1"

typedef enum { L_CONV, L_POOL, L_LINEAR } layer_op_t;

/* One layer. Its input is (B, rows_in, cin) channels-last (a linear layer's rows are 1 and its
 * cin the flattened width); its output (B, rows_out, cout). */
typedef struct {
    layer_op_t op;
    int gelu;
    int H, W;      /* the input's spatial size (conv, pool) */
    int cin, cout; /* channels, or features of a linear layer */
    int rows_in, rows_out;
    int pidx;         /* first parameter index (conv, linear): weight pidx, bias pidx + 1 */
    float *cols;      /* conv: im2col of the input (B · H · W, 9 · cin) */
    float *pre, *act; /* output before and after GELU (act == pre without GELU) */
    float *dact, *dpre, *dcols;
} layer_t;

struct ts_judge {
    ts_engine_t *e;
    ts_judge_kind_t kind;
    int C, H, W, classes, max_batch, trainable, D, feat_layer, n_layers, n_params;
    layer_t L[MAX_LAYERS];
    ts_tensor_t p[2 * MAX_LAYERS], g[2 * MAX_LAYERS], m[2 * MAX_LAYERS], v[2 * MAX_LAYERS];
    float *x0;   /* the input, channels-last (cnn) or as given (ae) */
    float *dout; /* the loss's gradient with respect to the last layer's output */
    int n_meta;
    char *meta_k[MAX_META], *meta_v[MAX_META];
};

static const char *const KIND_NAMES[] = {"cnn", "ae"};

const char *ts_judge_kind_name(ts_judge_kind_t kind) {
    return kind == TS_JUDGE_AE ? KIND_NAMES[1] : KIND_NAMES[0];
}

int ts_judge_kind_parse(const char *name, ts_judge_kind_t *kind) {
    for (int i = 0; name && i < 2; i++)
        if (strcmp(name, KIND_NAMES[i]) == 0) {
            *kind = (ts_judge_kind_t)i;
            return TS_OK;
        }
    return TS_EINVAL;
}

ts_judge_kind_t ts_judge_kind(const ts_judge_t *j) { return j->kind; }
int ts_judge_feature_dim(const ts_judge_t *j) { return j ? j->D : 0; }

void ts_judge_shape(const ts_judge_t *j, int *channels, int *height, int *width) {
    *channels = j->C, *height = j->H, *width = j->W;
}
int ts_judge_num_params(const ts_judge_t *j) { return j ? j->n_params : 0; }

int ts_judge_param(ts_judge_t *j, int i, ts_tensor_t **param, ts_tensor_t **grad) {
    if (!j || i < 0 || i >= j->n_params)
        return TS_EINVAL;
    *param = &j->p[i];
    *grad = j->trainable ? &j->g[i] : NULL;
    return TS_OK;
}

const char *ts_judge_meta(const ts_judge_t *j, const char *key) {
    for (int i = 0; j && key && i < j->n_meta; i++)
        if (strcmp(j->meta_k[i], key) == 0)
            return j->meta_v[i];
    return NULL;
}

int ts_judge_set_meta(ts_judge_t *j, const char *key, const char *value) {
    if (!j || !key || !value)
        return TS_EINVAL;
    int i = 0;
    while (i < j->n_meta && strcmp(j->meta_k[i], key) != 0)
        i++;
    if (i == MAX_META)
        return TS_ERANGE;
    char *v = ts_dup_str(value);
    if (!v)
        return TS_ENOMEM;
    if (i == j->n_meta) {
        if (!(j->meta_k[i] = ts_dup_str(key))) {
            free(v);
            return TS_ENOMEM;
        }
        j->n_meta++;
    } else {
        free(j->meta_v[i]);
    }
    j->meta_v[i] = v;
    return TS_OK;
}

void ts_judge_free(ts_judge_t *j) {
    if (!j)
        return;
    for (int i = 0; i < j->n_layers; i++) {
        layer_t *l = &j->L[i];
        free(l->cols), free(l->pre), free(l->dact), free(l->dpre), free(l->dcols);
        if (l->act != l->pre)
            free(l->act);
    }
    for (int i = 0; i < j->n_params; i++)
        ts_tensor_free(&j->p[i]), ts_tensor_free(&j->g[i]), ts_tensor_free(&j->m[i]),
            ts_tensor_free(&j->v[i]);
    for (int i = 0; i < j->n_meta; i++)
        free(j->meta_k[i]), free(j->meta_v[i]);
    free(j->x0), free(j->dout);
    free(j);
}

/* ---- building -------------------------------------------------------------------------------- */

static void add_layer(ts_judge_t *j, layer_op_t op, int gelu, int H, int W, int cin, int cout) {
    layer_t *l = &j->L[j->n_layers++];
    l->op = op, l->gelu = gelu, l->H = H, l->W = W, l->cin = cin, l->cout = cout;
    l->rows_in = op == L_LINEAR ? 1 : H * W;
    l->rows_out = op == L_LINEAR ? 1 : op == L_POOL ? (H / 2) * (W / 2) : H * W;
    if (op != L_POOL) {
        l->pidx = j->n_params;
        j->n_params += 2;
    }
}

static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

static int alloc_param(ts_judge_t *j, int i, int ndim, const int64_t *shape) {
    TS_TRY(ts_tensor_alloc(&j->p[i], TS_F32, TS_CPU, ndim, shape));
    if (j->trainable) {
        TS_TRY(ts_tensor_alloc(&j->g[i], TS_F32, TS_CPU, ndim, shape));
        TS_TRY(ts_tensor_alloc(&j->m[i], TS_F32, TS_CPU, ndim, shape));
        TS_TRY(ts_tensor_alloc(&j->v[i], TS_F32, TS_CPU, ndim, shape));
    }
    return TS_OK;
}

/* The layers of a kind, their buffers and parameters (zero). */
static int build(ts_judge_t *j) {
    int C = j->C, H = j->H, W = j->W, P = C * H * W;
    if (j->kind == TS_JUDGE_CNN) {
        add_layer(j, L_CONV, 1, H, W, C, 16);
        add_layer(j, L_POOL, 0, H, W, 16, 16);
        add_layer(j, L_CONV, 1, H / 2, W / 2, 16, 32);
        add_layer(j, L_POOL, 0, H / 2, W / 2, 32, 32);
        add_layer(j, L_LINEAR, 1, 0, 0, 32 * (H / 4) * (W / 4), 128);
        add_layer(j, L_LINEAR, 0, 0, 0, 128, j->classes);
        j->feat_layer = 4;
    } else {
        add_layer(j, L_LINEAR, 1, 0, 0, P, 256);
        add_layer(j, L_LINEAR, 0, 0, 0, 256, 32);
        add_layer(j, L_LINEAR, 1, 0, 0, 32, 256);
        add_layer(j, L_LINEAR, 0, 0, 0, 256, P);
        j->feat_layer = 1;
    }
    j->D = j->L[j->feat_layer].cout;
    size_t B = (size_t)j->max_batch;
    int ok = (j->x0 = falloc(B * P)) != NULL;
    for (int i = 0; i < j->n_layers && ok; i++) {
        layer_t *l = &j->L[i];
        size_t out = B * l->rows_out * l->cout, in = B * l->rows_in * l->cin;
        if (l->op == L_CONV)
            ok &= (l->cols = falloc(B * l->rows_in * 9 * l->cin)) != NULL;
        ok &= (l->pre = falloc(out)) != NULL;
        l->act = l->gelu ? falloc(out) : l->pre;
        ok &= l->act != NULL;
        if (j->trainable) {
            ok &= (l->dact = falloc(out)) != NULL && (l->dpre = falloc(out)) != NULL;
            if (l->op == L_CONV)
                ok &= (l->dcols = falloc(B * l->rows_in * 9 * l->cin)) != NULL;
            (void)in;
        }
        if (ok && l->op != L_POOL) {
            int K = l->op == L_CONV ? 9 * l->cin : l->cin;
            if (alloc_param(j, l->pidx, 2, TS_SHAPE(l->cout, K)) != TS_OK ||
                alloc_param(j, l->pidx + 1, 1, TS_SHAPE(l->cout)) != TS_OK)
                ok = 0;
        }
    }
    if (ok && j->trainable)
        ok = (j->dout = falloc(B * (size_t)j->L[j->n_layers - 1].cout)) != NULL;
    return ok ? TS_OK : TS_ENOMEM;
}

static int new_judge(ts_judge_t **out, ts_judge_kind_t kind, int C, int H, int W, int classes,
                     ts_engine_t *e, int max_batch, int trainable, char *err, size_t errlen) {
    *out = NULL;
    if (!e || e->device != TS_CPU) {
        ts_set_err(err, errlen, "judge: the judges run on the CPU engine only");
        return TS_ENOTSUP;
    }
    /* floats per sample the buffers take, at most: a cnn's first convolution's columns and four
     * copies of its output dominate; an ae's input, output and their gradients */
    int fits = C >= 1 && H >= 4 && W >= 4 && C <= 64 && H <= 1024 && W <= 1024 && max_batch >= 1 &&
               max_batch <= 65536;
    int64_t per = fits ? (int64_t)H * W * (kind == TS_JUDGE_CNN ? 9 * C + 4 * 16 + 64 : 8 * C) : 0;
    if (!fits || (kind == TS_JUDGE_CNN && (H % 4 || W % 4 || classes < 2 || classes > 100000)) ||
        per * max_batch > (int64_t)1 << 28) {
        ts_set_err(err, errlen,
                   "judge: images %d×%d×%d, %d classes, batch %d are not a %s judge's shape", C, H,
                   W, classes, max_batch, ts_judge_kind_name(kind));
        return TS_EINVAL;
    }
    ts_judge_t *j = calloc(1, sizeof *j);
    if (!j)
        return TS_ENOMEM;
    j->e = e, j->kind = kind, j->C = C, j->H = H, j->W = W; /* checked above */
    j->classes = kind == TS_JUDGE_CNN ? classes : 0;
    j->max_batch = max_batch, j->trainable = trainable;
    int rc = build(j);
    if (rc != TS_OK) {
        ts_set_err(err, errlen, "judge: no memory for a batch of %d", max_batch);
        ts_judge_free(j);
        return rc;
    }
    *out = j;
    return TS_OK;
}

/* Uniform ±√(6 / (fan_in + fan_out)) from the Philox stream of seed, block i per 4 values. */
static void init_uniform(ts_tensor_t *w, uint64_t seed, uint64_t *block) {
    float *d = w->data;
    int64_t n = ts_tensor_numel(w), out = w->shape[0], in = w->shape[1];
    float a = sqrtf(6.0f / (float)(in + out));
    for (int64_t i = 0; i < n; i += 4) {
        ts_u32x4_t r = ts_rng_block(seed, (*block)++);
        for (int k = 0; k < 4 && i + k < n; k++)
            d[i + k] = a * (2.0f * ((float)(r.v[k] >> 8) * (1.0f / 16777216.0f)) - 1.0f);
    }
}

int ts_judge_create(ts_judge_t **out, ts_judge_kind_t kind, int channels, int height, int width,
                    int classes, uint64_t seed, ts_engine_t *e, int max_batch, int trainable,
                    char *err, size_t errlen) {
    if (!out)
        return TS_EINVAL;
    TS_TRY(new_judge(out, kind, channels, height, width, classes, e, max_batch, trainable, err,
                     errlen));
    uint64_t block = 0;
    for (int i = 0; i < (*out)->n_params; i += 2)
        init_uniform(&(*out)->p[i], seed, &block);
    char s[32];
    snprintf(s, sizeof s, "%llu", (unsigned long long)seed);
    int rc = ts_judge_set_meta(*out, "seed", s);
    if (rc != TS_OK) {
        ts_judge_free(*out);
        *out = NULL;
    }
    return rc;
}

/* ---- forward and backward -------------------------------------------------------------------- */

/* cols (B · H · W, 9 · c) of x (B, H, W, c) channels-last, padded by zeros */
static void im2col(float *cols, const float *x, int B, int H, int W, int c) {
    for (int b = 0; b < B; b++)
        for (int y = 0; y < H; y++)
            for (int xx = 0; xx < W; xx++) {
                float *row = cols + (((int64_t)b * H + y) * W + xx) * 9 * c;
                for (int ky = 0; ky < 3; ky++)
                    for (int kx = 0; kx < 3; kx++) {
                        int sy = y + ky - 1, sx = xx + kx - 1;
                        float *dst = row + (ky * 3 + kx) * c;
                        if (sy < 0 || sy >= H || sx < 0 || sx >= W)
                            memset(dst, 0, (size_t)c * sizeof *dst);
                        else
                            memcpy(dst, x + (((int64_t)b * H + sy) * W + sx) * c,
                                   (size_t)c * sizeof *dst);
                    }
            }
}

/* dx (B, H, W, c) += the columns' gradients put back where im2col took them */
static void col2im(float *dx, const float *dcols, int B, int H, int W, int c) {
    for (int b = 0; b < B; b++)
        for (int y = 0; y < H; y++)
            for (int xx = 0; xx < W; xx++) {
                const float *row = dcols + (((int64_t)b * H + y) * W + xx) * 9 * c;
                for (int ky = 0; ky < 3; ky++)
                    for (int kx = 0; kx < 3; kx++) {
                        int sy = y + ky - 1, sx = xx + kx - 1;
                        if (sy < 0 || sy >= H || sx < 0 || sx >= W)
                            continue;
                        float *d = dx + (((int64_t)b * H + sy) * W + sx) * c;
                        const float *s = row + (ky * 3 + kx) * c;
                        for (int k = 0; k < c; k++)
                            d[k] += s[k];
                    }
            }
}

/* out (B, H/2, W/2, c) = the mean of each 2×2 block of x (B, H, W, c); back: dx += dout / 4 */
static void pool(float *out, const float *x, int B, int H, int W, int c) {
    int h = H / 2, w = W / 2;
    for (int b = 0; b < B; b++)
        for (int y = 0; y < h; y++)
            for (int xx = 0; xx < w; xx++)
                for (int k = 0; k < c; k++) {
                    const float *p = x + (((int64_t)b * H + 2 * y) * W + 2 * xx) * c + k;
                    out[(((int64_t)b * h + y) * w + xx) * c + k] =
                        0.25f * ((p[0] + p[c]) + (p[(int64_t)W * c] + p[(int64_t)W * c + c]));
                }
}

static void pool_backward(float *dx, const float *dout, int B, int H, int W, int c) {
    int h = H / 2, w = W / 2;
    for (int b = 0; b < B; b++)
        for (int y = 0; y < h; y++)
            for (int xx = 0; xx < w; xx++)
                for (int k = 0; k < c; k++) {
                    float g = 0.25f * dout[(((int64_t)b * h + y) * w + xx) * c + k];
                    float *p = dx + (((int64_t)b * H + 2 * y) * W + 2 * xx) * c + k;
                    p[0] += g, p[c] += g, p[(int64_t)W * c] += g, p[(int64_t)W * c + c] += g;
                }
}

static int wrap2(ts_tensor_t *t, float *d, int64_t rows, int64_t cols) {
    return ts_tensor_wrap(t, d, TS_F32, TS_CPU, 2, TS_SHAPE(rows, cols));
}

static const float *layer_input(const ts_judge_t *j, int i) {
    return i == 0 ? j->x0 : j->L[i - 1].act;
}

static int forward(ts_judge_t *j, const float *x, int B) {
    if (!j || !x || B < 1 || B > j->max_batch)
        return TS_EINVAL;
    int C = j->C, HW = j->H * j->W;
    if (j->kind == TS_JUDGE_CNN) /* (B, C, H, W) → channels-last */
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++)
                for (int p = 0; p < HW; p++)
                    j->x0[((int64_t)b * HW + p) * C + c] = x[((int64_t)b * C + c) * HW + p];
    else
        memcpy(j->x0, x, (size_t)B * C * HW * sizeof *x);
    for (int i = 0; i < j->n_layers; i++) {
        layer_t *l = &j->L[i];
        float *in = (float *)layer_input(j, i);
        if (l->op == L_POOL) {
            pool(l->pre, in, B, l->H, l->W, l->cin);
            continue;
        }
        int64_t M = (int64_t)B * l->rows_in, K = l->op == L_CONV ? 9 * l->cin : l->cin;
        if (l->op == L_CONV)
            im2col(l->cols, in, B, l->H, l->W, l->cin);
        ts_tensor_t ti, to, ta;
        TS_TRY(wrap2(&ti, l->op == L_CONV ? l->cols : in, M, K));
        TS_TRY(wrap2(&to, l->pre, M, l->cout));
        if (l->gelu) {
            TS_TRY(wrap2(&ta, l->act, M, l->cout));
            TS_TRY(ts_linear_gelu_forward(j->e, &to, &ta, &ti, &j->p[l->pidx], &j->p[l->pidx + 1]));
        } else {
            TS_TRY(ts_linear_forward(j->e, &to, &ti, &j->p[l->pidx], &j->p[l->pidx + 1]));
        }
    }
    return TS_OK;
}

int ts_judge_run(ts_judge_t *j, const float *x, int B, float *features, float *outputs) {
    TS_TRY(forward(j, x, B));
    const layer_t *f = &j->L[j->feat_layer], *last = &j->L[j->n_layers - 1];
    if (features)
        memcpy(features, f->act, (size_t)B * j->D * sizeof *features);
    if (outputs)
        memcpy(outputs, last->act, (size_t)B * last->cout * sizeof *outputs);
    for (int64_t i = 0; features && i < (int64_t)B * j->D; i++)
        if (!isfinite(features[i]))
            return TS_ENONFINITE;
    return TS_OK;
}

int ts_judge_features(ts_judge_t *j, const float *x, int B, float *features) {
    return ts_judge_run(j, x, B, features, NULL);
}

/* The loss of the last layer's output and its gradient into j->dout, in double. */
static int loss_of(ts_judge_t *j, const float *x, const int32_t *labels, int B, double *loss) {
    const layer_t *last = &j->L[j->n_layers - 1];
    int K = last->cout;
    double sum = 0.0;
    if (j->kind == TS_JUDGE_CNN) {
        for (int b = 0; b < B; b++) {
            if (!labels || labels[b] < 0 || labels[b] >= K)
                return TS_ERANGE;
            const float *z = last->act + (int64_t)b * K;
            double mx = z[0], s = 0.0;
            for (int k = 1; k < K; k++)
                mx = z[k] > mx ? z[k] : mx;
            for (int k = 0; k < K; k++)
                s += exp((double)z[k] - mx);
            sum += log(s) + mx - (double)z[labels[b]];
            for (int k = 0; k < K; k++)
                j->dout[(int64_t)b * K + k] =
                    (float)((exp((double)z[k] - mx) / s - (k == labels[b])) / B);
        }
        *loss = sum / B;
    } else {
        int64_t n = (int64_t)B * K;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)last->act[i] - (double)x[i];
            sum += d * d;
            j->dout[i] = (float)(2.0 * d / (double)n);
        }
        *loss = sum / (double)n;
    }
    return isfinite(*loss) ? TS_OK : TS_ENONFINITE;
}

int ts_judge_loss_backward(ts_judge_t *j, const float *x, const int32_t *labels, int B,
                           float *loss) {
    if (!j || !j->trainable)
        return TS_EINVAL;
    TS_TRY(forward(j, x, B));
    double value;
    TS_TRY(loss_of(j, x, labels, B, &value));
    if (loss)
        *loss = (float)value;
    for (int i = 0; i < j->n_params; i++)
        memset(j->g[i].data, 0, (size_t)ts_tensor_numel(&j->g[i]) * sizeof(float));
    for (int i = j->n_layers - 1; i >= 0; i--) {
        layer_t *l = &j->L[i];
        size_t out = (size_t)B * l->rows_out * l->cout;
        const float *dact = i == j->n_layers - 1 ? j->dout : l->dact;
        float *din = i > 0 ? j->L[i - 1].dact : NULL; /* the input's gradient, cleared here */
        if (din)
            memset(din, 0, (size_t)B * l->rows_in * l->cin * sizeof *din);
        if (l->op == L_POOL) {
            pool_backward(din, dact, B, l->H, l->W, l->cin);
            continue;
        }
        int64_t M = (int64_t)B * l->rows_in, K = l->op == L_CONV ? 9 * l->cin : l->cin;
        ts_tensor_t tda, tdp, tp, ti, tdi;
        const float *dpre = dact;
        if (l->gelu) {
            memset(l->dpre, 0, out * sizeof *l->dpre);
            TS_TRY(wrap2(&tda, (float *)dact, M, l->cout));
            TS_TRY(wrap2(&tdp, l->dpre, M, l->cout));
            TS_TRY(wrap2(&tp, l->pre, M, l->cout));
            TS_TRY(ts_gelu_backward(j->e, &tdp, &tda, &tp));
            dpre = l->dpre;
        }
        TS_TRY(wrap2(&tdp, (float *)dpre, M, l->cout));
        TS_TRY(wrap2(&ti, l->op == L_CONV ? l->cols : (float *)layer_input(j, i), M, K));
        float *dcols = l->op == L_CONV ? l->dcols : din;
        if (dcols && l->op == L_CONV)
            memset(dcols, 0, (size_t)M * K * sizeof *dcols);
        if (dcols && (l->op != L_CONV || din))
            TS_TRY(wrap2(&tdi, dcols, M, K));
        TS_TRY(ts_linear_backward(j->e, din ? &tdi : NULL, &j->g[l->pidx], &j->g[l->pidx + 1], &tdp,
                                  &ti, &j->p[l->pidx]));
        if (l->op == L_CONV && din)
            col2im(din, dcols, B, l->H, l->W, l->cin);
    }
    return TS_OK;
}

/* ---- training and scoring -------------------------------------------------------------------- */

static float lr_at(float lr, int64_t steps, int64_t s) {
    int warm = (int)(steps / 20) > 0 ? (int)(steps / 20) : 1;
    return ts_optim_lr(lr, warm, steps, s);
}

/* The permutation of n for epoch ep of seed (Fisher–Yates on Philox words). */
static void shuffle(int32_t *perm, int n, uint64_t seed, int64_t ep) {
    for (int i = 0; i < n; i++)
        perm[i] = i;
    uint64_t block = (uint64_t)ep << 40;
    for (int i = n - 1; i > 0; i--) {
        ts_u32x4_t r = ts_rng_block(seed ^ 0x6a75646765ULL, block++);
        int k = (int)(((uint64_t)r.v[0] * (uint64_t)(i + 1)) >> 32);
        int32_t t = perm[i];
        perm[i] = perm[k], perm[k] = t;
    }
}

int ts_judge_train(ts_judge_t *j, const ts_dataset_t *data, int64_t steps, int batch, float lr,
                   uint64_t seed, int64_t report, ts_judge_progress_fn progress, void *ctx,
                   char *err, size_t errlen) {
    if (!j || !j->trainable || !data || data->n < batch || batch < 1 || batch > j->max_batch ||
        steps < 1 || !(lr > 0.0f)) {
        ts_set_err(err, errlen, "judge: cannot train (batch %d of %d images, %lld steps)", batch,
                   data ? data->n : 0, (long long)steps);
        return TS_EINVAL;
    }
    if (data->channels != j->C || data->height != j->H || data->width != j->W) {
        ts_set_err(err, errlen, "judge: the images are %d×%d×%d, the judge's %d×%d×%d",
                   data->channels, data->height, data->width, j->C, j->H, j->W);
        return TS_EINVAL;
    }
    if (j->kind == TS_JUDGE_CNN && !data->labels) {
        ts_set_err(err, errlen, "judge: a cnn learns the labels, and these images have none");
        return TS_EINVAL;
    }
    int64_t P = (int64_t)j->C * j->H * j->W;
    int32_t *perm = malloc((size_t)data->n * sizeof *perm);
    int32_t *labels = malloc((size_t)batch * sizeof *labels);
    float *x = malloc((size_t)(batch * P) * sizeof *x);
    ts_optim_slab_t slabs[2 * MAX_LAYERS];
    ts_tensor_t sumsq = {0};
    int rc =
        perm && x && labels ? ts_tensor_alloc(&sumsq, TS_F32, TS_CPU, 1, TS_SHAPE(1)) : TS_ENOMEM;
    for (int i = 0; i < j->n_params; i++)
        slabs[i] = (ts_optim_slab_t){&j->p[i], &j->g[i], &j->m[i], &j->v[i]};
    int per_epoch = data->n / batch;
    double acc = 0.0;
    int64_t since = 0;
    for (int64_t s = 0; rc == TS_OK && s < steps; s++) {
        int64_t ep = s / per_epoch, pos = s % per_epoch;
        if (pos == 0)
            shuffle(perm, data->n, seed, ep);
        for (int b = 0; b < batch; b++) {
            int32_t k = perm[pos * batch + b];
            memcpy(x + b * P, data->images + (int64_t)k * P, (size_t)P * sizeof *x);
            labels[b] = data->labels ? data->labels[k] : 0;
        }
        float loss = 0.0f;
        rc = ts_judge_loss_backward(j, x, labels, batch, &loss);
        ts_adamw_t hp = {lr_at(lr, steps, s), TS_OPTIM_BETA1, TS_OPTIM_BETA2, TS_OPTIM_EPS, 0.0f};
        if (rc == TS_OK)
            rc = ts_optim_step(j->e, slabs, j->n_params, &hp, s + 1, TS_OPTIM_GRAD_CLIP, &sumsq,
                               NULL);
        acc += loss, since++;
        if (rc == TS_OK && progress && (s + 1 == steps || (report > 0 && (s + 1) % report == 0))) {
            progress(ctx, s + 1, steps, acc / (double)since);
            acc = 0.0, since = 0;
        }
    }
    if (rc != TS_OK)
        ts_set_err(err, errlen, "judge: training stopped: %s", ts_strerror(rc));
    char s[32];
    snprintf(s, sizeof s, "%lld", (long long)steps);
    if (rc == TS_OK)
        rc = ts_judge_set_meta(j, "steps", s);
    ts_tensor_free(&sumsq);
    free(perm), free(x), free(labels);
    return rc;
}

int ts_judge_score(ts_judge_t *j, const ts_dataset_t *data, double *score, char *err,
                   size_t errlen) {
    if (!j || !data || data->n < 1 || !score || data->channels != j->C || data->height != j->H ||
        data->width != j->W) {
        ts_set_err(err, errlen, "judge: nothing to score, or images of another shape");
        return TS_EINVAL;
    }
    int64_t P = (int64_t)j->C * j->H * j->W;
    int K = j->L[j->n_layers - 1].cout;
    float *out = malloc((size_t)j->max_batch * K * sizeof *out);
    if (!out)
        return ts_fail(err, errlen, TS_ENOMEM, "judge: no memory to score a batch of %d",
                       j->max_batch);
    double sum = 0.0;
    int rc = TS_OK;
    for (int lo = 0; rc == TS_OK && lo < data->n; lo += j->max_batch) {
        int B = data->n - lo < j->max_batch ? data->n - lo : j->max_batch;
        const float *x = data->images + lo * P;
        rc = ts_judge_run(j, x, B, NULL, out);
        for (int b = 0; rc == TS_OK && b < B; b++) {
            const float *z = out + (int64_t)b * K;
            if (j->kind == TS_JUDGE_CNN) {
                int best = 0;
                for (int k = 1; k < K; k++)
                    best = z[k] > z[best] ? k : best;
                sum += data->labels && best == data->labels[lo + b];
            } else {
                for (int64_t i = 0; i < P; i++) {
                    double d = (double)z[i] - (double)x[b * P + i];
                    sum += d * d / (double)P;
                }
            }
        }
    }
    free(out);
    if (rc != TS_OK)
        ts_set_err(err, errlen, "judge: scoring failed: %s", ts_strerror(rc));
    *score = sum / data->n;
    return rc;
}

/* ---- files ------------------------------------------------------------------------------------ */

int ts_judge_save(const ts_judge_t *j, const char *path, char *err, size_t errlen) {
    if (!j || !path)
        return TS_EINVAL;
    char names[2 * MAX_LAYERS][24];
    ts_st_entry_t ent[2 * MAX_LAYERS];
    for (int i = 0; i < j->n_params; i++) {
        snprintf(names[i], sizeof names[i], "l%d.%s", i / 2, i % 2 ? "bias" : "weight");
        ent[i] = (ts_st_entry_t){
            .name = names[i], .dtype = TS_ST_F32, .ndim = j->p[i].ndim, .data = j->p[i].data};
        for (int d = 0; d < j->p[i].ndim; d++)
            ent[i].shape[d] = j->p[i].shape[d];
    }
    char dims[4][16];
    snprintf(dims[0], 16, "%d", j->C), snprintf(dims[1], 16, "%d", j->H);
    snprintf(dims[2], 16, "%d", j->W), snprintf(dims[3], 16, "%d", j->classes);
    const char *meta[2 * (MAX_META + 6)];
    int n = 0;
    const char *fixed[] = {"format",   FORMAT,  "kind",        ts_judge_kind_name(j->kind),
                           "channels", dims[0], "height",      dims[1],
                           "width",    dims[2], "num_classes", dims[3]};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i += 2)
        meta[n++] = fixed[i], meta[n++] = fixed[i + 1];
    for (int i = 0; i < j->n_meta; i++)
        meta[n++] = j->meta_k[i], meta[n++] = j->meta_v[i];
    return ts_st_write(path, ent, j->n_params, meta, n / 2, err, errlen);
}

static int meta_int(const ts_st_file_t *f, const char *key, int *out) {
    const char *s = ts_st_meta(f, key);
    char *end;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || end == s || *end || v < 0 || v > 1000000)
        return 0;
    *out = (int)v;
    return 1;
}

int ts_judge_open(ts_judge_t **out, const char *path, ts_engine_t *e, int max_batch, char *err,
                  size_t errlen) {
    if (!out || !path)
        return TS_EINVAL;
    *out = NULL;
    ts_st_file_t f;
    TS_TRY(ts_st_read(path, &f, err, errlen));
    const char *format = ts_st_meta(&f, "format");
    ts_judge_kind_t kind;
    int C, H, W, K, rc = TS_EKIND;
    if (!format || strcmp(format, FORMAT) != 0) {
        ts_set_err(err, errlen, "%s: not a judge (format \"%s\", expected \"%s\")", path,
                   format ? format : "", FORMAT);
    } else if (ts_judge_kind_parse(ts_st_meta(&f, "kind"), &kind) != TS_OK ||
               !meta_int(&f, "channels", &C) || !meta_int(&f, "height", &H) ||
               !meta_int(&f, "width", &W) || !meta_int(&f, "num_classes", &K)) {
        rc = TS_ECORRUPT;
        ts_set_err(err, errlen,
                   "%s: a judge without a valid kind, channels, height, width or "
                   "num_classes",
                   path);
    } else {
        rc = new_judge(out, kind, C, H, W, K, e, max_batch, 0, err, errlen);
    }
    for (int i = 0; rc == TS_OK && i < (*out)->n_params; i++) {
        char name[24];
        snprintf(name, sizeof name, "l%d.%s", i / 2, i % 2 ? "bias" : "weight");
        const ts_st_tensor_t *t = ts_st_find(&f, name);
        const ts_tensor_t *p = &(*out)->p[i];
        int fits = t && t->ndim == p->ndim;
        for (int d = 0; fits && d < p->ndim; d++)
            fits = t->shape[d] == p->shape[d];
        if (!fits || ts_st_to_f32(t, p->data, ts_tensor_numel(p)) != TS_OK) {
            rc = TS_ECORRUPT;
            ts_set_err(err, errlen, "%s: tensor %s is missing or of the wrong shape", path, name);
        }
    }
    for (int i = 0; rc == TS_OK && i < f.n_meta; i++) {
        static const char *const own[] = {"format", "kind",  "channels",
                                          "height", "width", "num_classes"};
        int skip = 0;
        for (size_t k = 0; k < sizeof own / sizeof own[0]; k++)
            skip |= strcmp(f.meta_keys[i], own[k]) == 0;
        if (!skip && (*out)->n_meta < MAX_META)
            rc = ts_judge_set_meta(*out, f.meta_keys[i], f.meta_vals[i]);
    }
    ts_st_free(&f);
    if (rc != TS_OK) {
        ts_judge_free(*out);
        *out = NULL;
    }
    return rc;
}
