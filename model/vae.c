/*
 * vae.c — the AutoencoderKL's layers, its parameter table and its two forwards (see vae.h).
 *
 * Parameters. One function per kind of layer (build_conv, build_norm, build_resnet, build_attn)
 * registers the layer's tensors under their diffusers names and points the layer's views into
 * the slab; build_net calls them in the network's order. It runs twice: once to count the floats
 * and the entries, once, over the allocated slab, to fill the table and the views. The attention's
 * q, k and v weights are registered back to back, so one (3C, C, 1, 1) view over the three runs
 * them as a single 1×1 conv.
 *
 * Activations. A forward holds the current activation x (C, H, W) of one image in one of two
 * ping-pong buffers, buf[cur]; each layer writes its output to buf[cur ^ 1] and flips cur, using
 * buf[2] and buf[3] for its intermediates. The four buffers are as large as the largest
 * activation anywhere in the network (C·H·W; at 256×256 that is the decoder's 256 channels at
 * full resolution, 16.8 M floats), the convs' im2col scratch at most SCRATCH_FLOATS (more only
 * when one output row needs it), plus the attention's q, k, v (3C, T) and weights (T, T) at the
 * lowest resolution, T = H·W/f². Everything is one allocation (ts_vae_reserve).
 *
 * The attention is composed of existing ops on the (C, T) layout the convs leave, so no transpose
 * is needed: q, k, v = 1×1 conv of GroupNorm(x); att (T, T) = softmax_rows(qᵀ·k / √C);
 * o (C, T) = v · attᵀ; x + to_out(o).
 */
#include "model/vae.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ops.h"

#define SCRATCH_FLOATS ((int64_t)4 << 20) /* im2col tile: 16 MiB */
#define WORK_ALIGN 16                     /* floats: each workspace part on a 64-byte line */

/* ---- the layers -------------------------------------------------------------------------- */

typedef struct {
    ts_tensor_t w, b; /* w (Cout, Cin, k, k), b (Cout) */
    ts_tensor_t wlp;  /* w in 16 bits, a view of the lp slab (ts_vae_t lslab); data NULL without */
} vae_conv_t;

typedef struct {
    ts_tensor_t w, b; /* GroupNorm affine, (C) each */
} vae_norm_t;

typedef struct {
    vae_norm_t norm1, norm2;
    vae_conv_t conv1, conv2, shortcut; /* shortcut: 1×1, only when Cin ≠ Cout */
    int has_shortcut;
} vae_resnet_t;

typedef struct {
    vae_norm_t norm;
    vae_conv_t qkv, out; /* qkv (3C, C, 1, 1) over to_q, to_k, to_v; out (C, C, 1, 1) */
} vae_attn_t;

typedef struct {
    vae_resnet_t res0, res1;
    vae_attn_t attn;
} vae_mid_t;

typedef struct {
    vae_resnet_t res[TS_VAE_MAX_LAYERS + 1];
    int n_res;
    vae_conv_t sample; /* the down- or upsampler's conv */
    int has_sample;
} vae_level_t;

typedef struct {
    vae_conv_t conv_in;
    vae_level_t level[TS_VAE_MAX_BLOCKS];
    vae_mid_t mid;
    vae_norm_t norm_out;
    vae_conv_t conv_out;
} vae_coder_t;

struct ts_vae_net {
    vae_coder_t enc, dec;
    vae_conv_t quant, post_quant;
};

/* ---- config -------------------------------------------------------------------------------- */

void ts_vae_config_sd(ts_vae_config_t *c) {
    memset(c, 0, sizeof *c);
    c->in_channels = c->out_channels = 3;
    c->latent_channels = 4;
    c->n_blocks = 4;
    c->block_out[0] = 128, c->block_out[1] = 256, c->block_out[2] = c->block_out[3] = 512;
    c->layers_per_block = 2;
    c->groups = 32;
    c->eps = 1e-6f;
    c->scaling_factor = 0.18215f;
}

int ts_vae_config_check(const ts_vae_config_t *c, char *err, size_t errlen) {
    if (!c)
        return ts_fail(err, errlen, TS_EINVAL, "no VAE config");
    if (c->n_blocks < 1 || c->n_blocks > TS_VAE_MAX_BLOCKS)
        return ts_fail(err, errlen, TS_EINVAL, "VAE config: %d blocks (1 to %d supported)",
                       c->n_blocks, TS_VAE_MAX_BLOCKS);
    if (c->layers_per_block < 1 || c->layers_per_block > TS_VAE_MAX_LAYERS)
        return ts_fail(err, errlen, TS_EINVAL, "VAE config: layers_per_block %d (1 to %d)",
                       c->layers_per_block, TS_VAE_MAX_LAYERS);
    if (c->in_channels < 1 || c->out_channels < 1 || c->latent_channels < 1 || c->groups < 1)
        return ts_fail(err, errlen, TS_EINVAL,
                       "VAE config: in %d, out %d, latent %d channels and %d groups must be >= 1",
                       c->in_channels, c->out_channels, c->latent_channels, c->groups);
    for (int i = 0; i < c->n_blocks; i++)
        if (c->block_out[i] < 1 || c->block_out[i] % c->groups != 0)
            return ts_fail(err, errlen, TS_EINVAL,
                           "VAE config: block_out_channels[%d] = %d is not a positive multiple of "
                           "the %d GroupNorm groups",
                           i, c->block_out[i], c->groups);
    if (!(c->eps >= 0.0f && c->eps <= 1.0f) || !(c->scaling_factor > 0.0f) ||
        !isfinite(c->scaling_factor))
        return ts_fail(err, errlen, TS_EINVAL, "VAE config: eps %g or scaling_factor %g invalid",
                       (double)c->eps, (double)c->scaling_factor);
    return TS_OK;
}

int ts_vae_factor(const ts_vae_config_t *c) { return 1 << (c->n_blocks - 1); }

/* ---- the parameter table ------------------------------------------------------------------- */

typedef struct {
    ts_vae_t *m;
    int64_t offset;          /* floats registered so far */
    int count;               /* entries registered so far */
    float *base;             /* the slab the views point into; NULL in the counting pass */
    ts_device_t dev;         /* where base is (the CPU slab, or its copy on a GPU) */
    int table;               /* fill m->params (the CPU slab's pass) */
    const uint16_t *lp_base; /* the slab in 16 bits (the convs' wlp views), or NULL */
    ts_dtype_t lp;
} builder_t;

#define NAME_LEN 80 /* sizeof ts_vae_param_t.name; the longest name here is about 55 */

/* out = a then b, cut to NAME_LEN − 1 characters (never reached by this network's names). */
static void join(char *out, const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    la = la < NAME_LEN - 1 ? la : NAME_LEN - 1;
    lb = lb < NAME_LEN - 1 - la ? lb : NAME_LEN - 1 - la;
    memmove(out, a, la); /* out may be a */
    memcpy(out + la, b, lb);
    out[la + lb] = '\0';
}

/* Registers one tensor; returns its place in the slab (NULL while counting). */
static float *param(builder_t *b, const char *name, int attn, int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    if (b->table) {
        ts_vae_param_t *p = &b->m->params[b->count];
        join(p->name, name, "");
        p->ndim = ndim;
        memcpy(p->shape, shape, (size_t)ndim * sizeof *shape);
        p->offset = b->offset;
        p->attn = attn;
    }
    float *at = b->base ? b->base + b->offset : NULL;
    b->count++;
    b->offset += n;
    return at;
}

/* A view of the builder's slab at p (nothing while counting). */
static void view(const builder_t *b, ts_tensor_t *t, float *p, int ndim, const int64_t *shape) {
    if (p)
        ts_tensor_wrap(t, p, TS_F32, b->dev, ndim, shape);
}

static void build_conv(builder_t *b, vae_conv_t *c, const char *name, int64_t cout, int64_t cin,
                       int64_t k) {
    char n[NAME_LEN];
    join(n, name, ".weight");
    int64_t at = b->offset;
    view(b, &c->w, param(b, n, 0, 4, TS_SHAPE(cout, cin, k, k)), 4, TS_SHAPE(cout, cin, k, k));
    memset(&c->wlp, 0, sizeof c->wlp);
    if (b->lp_base)
        ts_tensor_wrap(&c->wlp, (void *)(b->lp_base + at), b->lp, b->dev, 4,
                       TS_SHAPE(cout, cin, k, k));
    join(n, name, ".bias");
    view(b, &c->b, param(b, n, 0, 1, TS_SHAPE(cout)), 1, TS_SHAPE(cout));
}

static void build_norm(builder_t *b, vae_norm_t *nm, const char *name, int64_t C) {
    char n[NAME_LEN];
    join(n, name, ".weight");
    view(b, &nm->w, param(b, n, 0, 1, TS_SHAPE(C)), 1, TS_SHAPE(C));
    join(n, name, ".bias");
    view(b, &nm->b, param(b, n, 0, 1, TS_SHAPE(C)), 1, TS_SHAPE(C));
}

static void build_resnet(builder_t *b, vae_resnet_t *r, const char *name, int64_t cin,
                         int64_t cout) {
    char n[NAME_LEN];
    join(n, name, ".norm1");
    build_norm(b, &r->norm1, n, cin);
    join(n, name, ".conv1");
    build_conv(b, &r->conv1, n, cout, cin, 3);
    join(n, name, ".norm2");
    build_norm(b, &r->norm2, n, cout);
    join(n, name, ".conv2");
    build_conv(b, &r->conv2, n, cout, cout, 3);
    r->has_shortcut = cin != cout;
    if (r->has_shortcut) {
        join(n, name, ".conv_shortcut");
        build_conv(b, &r->shortcut, n, cout, cin, 1);
    }
}

/* group_norm, then to_q, to_k, to_v weights back to back, their biases likewise, then to_out.0 */
static void build_attn(builder_t *b, vae_attn_t *a, const char *name, int64_t C) {
    static const char *const proj[3] = {".to_q", ".to_k", ".to_v"};
    char n[NAME_LEN];
    join(n, name, ".group_norm");
    build_norm(b, &a->norm, n, C);
    float *w = NULL, *bias = NULL;
    for (int i = 0; i < 3; i++) {
        join(n, name, proj[i]);
        join(n, n, ".weight");
        float *p = param(b, n, 1, 2, TS_SHAPE(C, C));
        w = i == 0 ? p : w;
    }
    for (int i = 0; i < 3; i++) {
        join(n, name, proj[i]);
        join(n, n, ".bias");
        float *p = param(b, n, 1, 1, TS_SHAPE(C));
        bias = i == 0 ? p : bias;
    }
    view(b, &a->qkv.w, w, 4, TS_SHAPE(3 * C, C, 1, 1));
    view(b, &a->qkv.b, bias, 1, TS_SHAPE(3 * C));
    join(n, name, ".to_out.0.weight");
    view(b, &a->out.w, param(b, n, 1, 2, TS_SHAPE(C, C)), 4, TS_SHAPE(C, C, 1, 1));
    join(n, name, ".to_out.0.bias");
    view(b, &a->out.b, param(b, n, 1, 1, TS_SHAPE(C)), 1, TS_SHAPE(C));
}

static void build_mid(builder_t *b, vae_mid_t *mid, const char *coder, int64_t C) {
    char n[NAME_LEN];
    join(n, coder, ".mid_block.resnets.0");
    build_resnet(b, &mid->res0, n, C, C);
    join(n, coder, ".mid_block.attentions.0");
    build_attn(b, &mid->attn, n, C);
    join(n, coder, ".mid_block.resnets.1");
    build_resnet(b, &mid->res1, n, C, C);
}

static void build_net(builder_t *b, const ts_vae_config_t *c, struct ts_vae_net *net) {
    const int n = c->n_blocks, L = c->latent_channels, *ch = c->block_out;
    char name[NAME_LEN];
    vae_coder_t *enc = &net->enc, *dec = &net->dec;

    build_conv(b, &enc->conv_in, "encoder.conv_in", ch[0], c->in_channels, 3);
    for (int i = 0; i < n; i++) {
        vae_level_t *lv = &enc->level[i];
        lv->n_res = c->layers_per_block;
        for (int k = 0; k < lv->n_res; k++) {
            snprintf(name, sizeof name, "encoder.down_blocks.%d.resnets.%d", i, k);
            build_resnet(b, &lv->res[k], name, k > 0 ? ch[i] : ch[i > 0 ? i - 1 : 0], ch[i]);
        }
        lv->has_sample = i < n - 1;
        if (lv->has_sample) {
            snprintf(name, sizeof name, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            build_conv(b, &lv->sample, name, ch[i], ch[i], 3);
        }
    }
    build_mid(b, &enc->mid, "encoder", ch[n - 1]);
    build_norm(b, &enc->norm_out, "encoder.conv_norm_out", ch[n - 1]);
    build_conv(b, &enc->conv_out, "encoder.conv_out", 2 * L, ch[n - 1], 3);
    build_conv(b, &net->quant, "quant_conv", 2 * L, 2 * L, 1);

    build_conv(b, &net->post_quant, "post_quant_conv", L, L, 1);
    build_conv(b, &dec->conv_in, "decoder.conv_in", ch[n - 1], L, 3);
    build_mid(b, &dec->mid, "decoder", ch[n - 1]);
    for (int j = 0; j < n; j++) { /* up block j: channels ch[n−1−j], from ch[n−j] */
        vae_level_t *lv = &dec->level[j];
        int out = ch[n - 1 - j], prev = ch[j > 0 ? n - j : n - 1];
        lv->n_res = c->layers_per_block + 1;
        for (int k = 0; k < lv->n_res; k++) {
            snprintf(name, sizeof name, "decoder.up_blocks.%d.resnets.%d", j, k);
            build_resnet(b, &lv->res[k], name, k > 0 ? out : prev, out);
        }
        lv->has_sample = j < n - 1;
        if (lv->has_sample) {
            snprintf(name, sizeof name, "decoder.up_blocks.%d.upsamplers.0.conv", j);
            build_conv(b, &lv->sample, name, out, out, 3);
        }
    }
    build_norm(b, &dec->norm_out, "decoder.conv_norm_out", ch[0]);
    build_conv(b, &dec->conv_out, "decoder.conv_out", c->out_channels, ch[0], 3);
}

int ts_vae_new(ts_vae_t **out, const ts_vae_config_t *cfg, char *err, size_t errlen) {
    if (!out)
        return ts_fail(err, errlen, TS_EINVAL, "ts_vae_new: no output pointer");
    *out = NULL;
    TS_TRY(ts_vae_config_check(cfg, err, errlen));
    ts_vae_t *m = calloc(1, sizeof *m);
    struct ts_vae_net *net = calloc(1, sizeof *net);
    if (!m || !net) {
        free(m);
        free(net);
        return ts_fail(err, errlen, TS_ENOMEM, "out of memory for the VAE");
    }
    m->cfg = *cfg;
    m->net = net;
    builder_t count = {m, 0, 0, NULL, TS_CPU, 0, NULL, TS_F32};
    build_net(&count, cfg, net);
    m->params = calloc((size_t)count.count, sizeof *m->params);
    int rc = m->params ? ts_tensor_alloc(&m->slab, TS_F32, TS_CPU, 1, TS_SHAPE(count.offset))
                       : TS_ENOMEM;
    if (rc != TS_OK) {
        ts_vae_free(m);
        return ts_fail(err, errlen, rc, "cannot allocate the VAE's %lld parameters",
                       (long long)count.offset);
    }
    builder_t fill = {m, 0, 0, m->slab.data, TS_CPU, 1, NULL, TS_F32};
    build_net(&fill, cfg, net);
    m->n_params = fill.count;
    *out = m;
    return TS_OK;
}

void ts_vae_free(ts_vae_t *m) {
    if (!m)
        return;
    ts_tensor_free(&m->dslab);
    ts_tensor_free(&m->lslab);
    ts_tensor_free(&m->dlslab);
    free(m->dnet);
    ts_tensor_free(&m->slab);
    ts_tensor_free(&m->work);
    free(m->params);
    free(m->net);
    free(m);
}

int64_t ts_vae_numel(const ts_vae_t *m) { return ts_tensor_numel(&m->slab); }

void ts_vae_weights_changed(ts_vae_t *m) {
    if (m)
        m->dslab_stale = m->lslab_stale = m->dlslab_stale = 1;
}

/* At a 16-bit precision: the slab of e's net (src) converted into *ls once, and net's convs given
 * views of it (wlp); again after the weights changed or the precision did. */
static int lp_views(ts_vae_t *m, ts_engine_t *e, const ts_tensor_t *src, ts_tensor_t *ls,
                    int *stale, struct ts_vae_net *net, char *err, size_t errlen) {
    if (m->precision == TS_PREC_F32 || (src->device == TS_CPU && !m->cpu_lp_weights))
        return TS_OK;
    ts_dtype_t lp = ts_precision_dtype(m->precision);
    if (!ls->data || ls->dtype != lp || ls->device != src->device) {
        builder_t plain = {m, 0, 0, src->data, src->device, 0, NULL, TS_F32};
        build_net(&plain, &m->cfg, net); /* no view outlives the slab it points into */
        ts_tensor_free(ls);
        int rc = ts_tensor_alloc(ls, lp, src->device, 1, TS_SHAPE(ts_tensor_numel(src)));
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "cannot allocate the VAE's %s weights (%.1f MiB)",
                           ts_precision_name(m->precision),
                           (double)ts_tensor_numel(src) * 2.0 / 1048576.0);
        *stale = 1;
    }
    if (*stale) {
        int rc = ts_convert(e, ls, src);
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "cannot convert the VAE's weights to %s",
                           ts_precision_name(m->precision));
        builder_t b = {m, 0, 0, src->data, src->device, 0, ls->data, lp};
        build_net(&b, &m->cfg, net);
        *stale = 0;
    }
    return TS_OK;
}

/* The views a forward on e runs: the CPU slab's, or those of its copy on e's device, made (or
 * refreshed after ts_vae_weights_changed) here. */
static int net_for(ts_vae_t *m, ts_engine_t *e, const struct ts_vae_net **net, char *err,
                   size_t errlen) {
    if (e->device == TS_CPU) {
        *net = m->net;
        return lp_views(m, e, &m->slab, &m->lslab, &m->lslab_stale, m->net, err, errlen);
    }
    if (!m->dslab.data || m->dslab.device != e->device || m->dslab_gpu != e->gpu) {
        ts_tensor_free(&m->dslab);
        free(m->dnet);
        m->dnet = calloc(1, sizeof *m->dnet);
        int rc = m->dnet ? ts_tensor_alloc(&m->dslab, TS_F32, e->device, 1,
                                           TS_SHAPE(ts_tensor_numel(&m->slab)))
                         : TS_ENOMEM;
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "cannot allocate the VAE's %.1f MiB on the GPU",
                           (double)ts_tensor_nbytes(&m->slab) / 1048576.0);
        builder_t dev = {m, 0, 0, m->dslab.data, e->device, 0, NULL, TS_F32};
        build_net(&dev, &m->cfg, m->dnet);
        m->dslab_gpu = e->gpu;
        m->dslab_stale = 1;
        ts_tensor_free(&m->dlslab); /* its views were in the old net */
    }
    if (m->dslab_stale) {
        int rc = ts_tensor_copy(&m->dslab, &m->slab);
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "cannot copy the VAE's weights to the GPU");
        m->dslab_stale = 0;
        m->dlslab_stale = 1;
    }
    *net = m->dnet;
    return lp_views(m, e, &m->dslab, &m->dlslab, &m->dlslab_stale, m->dnet, err, errlen);
}

/* ---- workspace ----------------------------------------------------------------------------- */

typedef struct {
    int64_t act, qkv, att, scratch; /* floats of each part */
} work_plan_t;

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t align_up(int64_t n) { return (n + WORK_ALIGN - 1) / WORK_ALIGN * WORK_ALIGN; }

/* The parts' sizes for images of H × W (see the top of the file); −1 for a bad size. */
static int plan_work(const ts_vae_config_t *c, int64_t H, int64_t W, work_plan_t *p) {
    const int n = c->n_blocks, f = ts_vae_factor(c);
    if (H < f || W < f || H % f != 0 || W % f != 0)
        return -1;
    int64_t act = max64(c->in_channels, c->out_channels) * H * W, row = 0, whole = 0;
    for (int l = 0; l < n; l++) { /* resolution level l: H/2^l; channels of this and the next */
        int64_t Hl = H >> l, Wl = W >> l, ch = c->block_out[l];
        if (l > 0)
            ch = max64(ch, c->block_out[l - 1]);
        if (l + 1 < n)
            ch = max64(ch, c->block_out[l + 1]);
        act = max64(act, ch * Hl * Wl);
        row = max64(row, 9 * ch * Wl);
        whole = max64(whole, 9 * ch * Hl * Wl);
    }
    int64_t T = (H / f) * (W / f);
    act = max64(act, 2 * c->latent_channels * T);
    p->act = align_up(act);
    p->qkv = align_up(3 * c->block_out[n - 1] * T);
    p->att = align_up(T * T);
    p->scratch = align_up(max64(row, whole < SCRATCH_FLOATS ? whole : SCRATCH_FLOATS));
    return 0;
}

size_t ts_vae_work_bytes(const ts_vae_config_t *c, int64_t height, int64_t width) {
    work_plan_t p;
    if (!c || plan_work(c, height, width, &p) != 0)
        return 0;
    return (size_t)(4 * p.act + p.qkv + p.att + p.scratch) * sizeof(float);
}

/* ts_vae_reserve with the workspace on dev (ordinal gpu for a GPU): moved there when it is
 * elsewhere. */
static int reserve_on(ts_vae_t *m, ts_device_t dev, int gpu, int64_t height, int64_t width,
                      char *err, size_t errlen) {
    if (ts_vae_work_bytes(&m->cfg, height, width) == 0)
        return ts_fail(err, errlen, TS_ESHAPE,
                       "image size %lldx%lld: height and width must be positive multiples of %d",
                       (long long)height, (long long)width, ts_vae_factor(&m->cfg));
    const int here = m->work.data && m->work.device == dev && (dev == TS_CPU || m->work_gpu == gpu);
    if (here && height <= m->work_h && width <= m->work_w)
        return TS_OK;
    if (!here)
        m->work_h = m->work_w = 0;
    int64_t h = height > m->work_h ? height : m->work_h, w = width > m->work_w ? width : m->work_w;
    size_t bytes = ts_vae_work_bytes(&m->cfg, h, w);
    ts_tensor_free(&m->work);
    m->work_h = m->work_w = 0;
    int rc = ts_tensor_alloc(&m->work, TS_F32, dev, 1, TS_SHAPE((int64_t)(bytes / 4)));
    if (rc != TS_OK)
        return ts_fail(
            err, errlen, rc, "cannot allocate %.1f MiB of VAE workspace for %lldx%lld on the %s",
            (double)bytes / 1048576.0, (long long)h, (long long)w, dev == TS_CPU ? "CPU" : "GPU");
    m->work_h = h, m->work_w = w, m->work_gpu = gpu;
    return TS_OK;
}

int ts_vae_reserve(ts_vae_t *m, int64_t height, int64_t width, char *err, size_t errlen) {
    ts_device_t dev = m->work.data ? m->work.device : TS_CPU;
    return reserve_on(m, dev, m->work_gpu, height, width, err, errlen);
}

/* ---- one image through the layers ---------------------------------------------------------- */

typedef struct {
    ts_engine_t *e;
    const ts_vae_config_t *cfg;
    float *buf[4];       /* x is buf[cur]; a layer writes buf[cur ^ 1]; 2 and 3 are scratch */
    float *qkv, *att;    /* the attention's (3C, T) and (T, T) */
    ts_tensor_t scratch; /* the convs' im2col */
    int cur;
    ts_device_t dev;          /* the engine's, where the workspace is */
    int lp_weights;           /* the convs read their 16-bit weights (wlp) at bf16 / f16 */
    int64_t C, H, W;          /* x's shape */
    ts_precision_t precision; /* the products' (ts_vae_set_precision) */
} run_t;

static const ts_conv2d_t SAME = {1, 1, 1, 1, 1};  /* 3×3, stride 1, pad 1 */
static const ts_conv2d_t POINT = {1, 0, 0, 0, 0}; /* 1×1 */
static const ts_conv2d_t DOWN = {2, 0, 1, 0, 1};  /* 3×3, stride 2, pad bottom and right */

/* A (1, C, H, W) view of p, in r's workspace. */
static ts_tensor_t img4(const run_t *r, float *p, int64_t C, int64_t H, int64_t W) {
    ts_tensor_t t = {p, TS_F32, r->dev, 4, {1, C, H, W}, 0};
    return t;
}

static int run_init(run_t *r, ts_vae_t *m, ts_engine_t *e) {
    work_plan_t p;
    if (plan_work(&m->cfg, m->work_h, m->work_w, &p) != 0)
        return TS_EINVAL;
    float *w = m->work.data;
    memset(r, 0, sizeof *r);
    r->e = e;
    r->dev = e->device;
    r->cfg = &m->cfg;
    r->precision = m->precision;
    r->lp_weights = e->device != TS_CPU || m->cpu_lp_weights;
    for (int i = 0; i < 4; i++)
        r->buf[i] = w + i * p.act;
    r->qkv = w + 4 * p.act;
    r->att = r->qkv + p.qkv;
    return ts_tensor_wrap(&r->scratch, r->att + p.att, TS_F32, r->dev, 1, TS_SHAPE(p.scratch));
}

static int conv(run_t *r, ts_tensor_t *y, const ts_tensor_t *x, const vae_conv_t *c,
                const ts_conv2d_t *g) {
    ts_conv2d_t gp = *g;
    gp.precision = r->precision;
    /* at 16 bits, the weight converted once (lp_views): no product rounds it again */
    const ts_tensor_t *w =
        r->lp_weights && r->precision != TS_PREC_F32 && c->wlp.data ? &c->wlp : &c->w;
    return ts_conv2d_forward(r->e, y, x, w, &c->b, &gp, &r->scratch);
}

/* c = α·op(a)·op(b) in the run's precision */
static int product(run_t *r, ts_tensor_t *c, const ts_tensor_t *a, int ta, const ts_tensor_t *b,
                   int tb, float alpha) {
    return r->precision == TS_PREC_BF16  ? ts_matmul_bf16(r->e, c, a, ta, b, tb, alpha, 0.0f)
           : r->precision == TS_PREC_F16 ? ts_matmul_f16(r->e, c, a, ta, b, tb, alpha, 0.0f)
                                         : ts_matmul(r->e, c, a, ta, b, tb, alpha, 0.0f);
}

/* x ← x + conv2(SiLU(norm2(conv1(SiLU(norm1(x)))))), x through conv_shortcut when C changes */
static int resnet_forward(run_t *r, const vae_resnet_t *rb) {
    const int G = r->cfg->groups;
    const float eps = r->cfg->eps;
    const int64_t Cin = r->C, Cout = rb->conv1.w.shape[0], H = r->H, W = r->W;
    ts_tensor_t x = img4(r, r->buf[r->cur], Cin, H, W), y = img4(r, r->buf[r->cur ^ 1], Cout, H, W);
    ts_tensor_t a = img4(r, r->buf[2], Cin, H, W), h = img4(r, r->buf[3], Cout, H, W);
    ts_tensor_t a2 = img4(r, r->buf[2], Cout, H, W), s = img4(r, r->buf[3], Cout, H, W);
    TS_TRY(ts_groupnorm_silu_forward(r->e, &a, &x, &rb->norm1.w, &rb->norm1.b, G, eps));
    TS_TRY(conv(r, &h, &a, &rb->conv1, &SAME));
    TS_TRY(ts_groupnorm_silu_forward(r->e, &a2, &h, &rb->norm2.w, &rb->norm2.b, G, eps));
    TS_TRY(conv(r, &y, &a2, &rb->conv2, &SAME));
    if (rb->has_shortcut) {
        TS_TRY(conv(r, &s, &x, &rb->shortcut, &POINT));
        TS_TRY(ts_add(r->e, &y, &y, &s));
    } else {
        TS_TRY(ts_add(r->e, &y, &y, &x));
    }
    r->cur ^= 1;
    r->C = Cout;
    return TS_OK;
}

/* x ← x + to_out(v · softmax(qᵀk / √C)ᵀ), q, k, v = to_q, to_k, to_v of GroupNorm(x); one head
 * over the T = H·W pixels */
static int attn_forward(run_t *r, const vae_attn_t *at) {
    const int64_t C = r->C, H = r->H, W = r->W, T = H * W;
    ts_tensor_t x = img4(r, r->buf[r->cur], C, H, W), y = img4(r, r->buf[r->cur ^ 1], C, H, W);
    ts_tensor_t h = img4(r, r->buf[2], C, H, W), qkv = img4(r, r->qkv, 3 * C, H, W);
    ts_tensor_t q, k, v, att, o;
    TS_TRY(ts_tensor_wrap(&q, r->qkv, TS_F32, r->dev, 2, TS_SHAPE(C, T)));
    TS_TRY(ts_tensor_wrap(&k, r->qkv + C * T, TS_F32, r->dev, 2, TS_SHAPE(C, T)));
    TS_TRY(ts_tensor_wrap(&v, r->qkv + 2 * C * T, TS_F32, r->dev, 2, TS_SHAPE(C, T)));
    TS_TRY(ts_tensor_wrap(&att, r->att, TS_F32, r->dev, 2, TS_SHAPE(T, T)));
    TS_TRY(ts_tensor_wrap(&o, r->buf[2], TS_F32, r->dev, 2, TS_SHAPE(C, T)));
    TS_TRY(
        ts_groupnorm_forward(r->e, &h, &x, &at->norm.w, &at->norm.b, r->cfg->groups, r->cfg->eps));
    TS_TRY(conv(r, &qkv, &h, &at->qkv, &POINT));
    TS_TRY(product(r, &att, &q, 1, &k, 0, (float)(1.0 / sqrt((double)C))));
    TS_TRY(ts_softmax_forward(r->e, &att, &att)); /* row t: query t over the keys, in fp32 */
    TS_TRY(product(r, &o, &v, 0, &att, 1, 1.0f));
    ts_tensor_t o4 = img4(r, r->buf[2], C, H, W);
    TS_TRY(conv(r, &y, &o4, &at->out, &POINT));
    TS_TRY(ts_add(r->e, &y, &y, &x));
    r->cur ^= 1;
    return TS_OK;
}

static int mid_forward(run_t *r, const vae_mid_t *mid) {
    TS_TRY(resnet_forward(r, &mid->res0));
    TS_TRY(attn_forward(r, &mid->attn));
    return resnet_forward(r, &mid->res1);
}

/* x ← conv 3×3 stride 2 of x padded (0, 1, 0, 1): half the side */
static int down_forward(run_t *r, const vae_conv_t *c) {
    int64_t Ho = ts_conv2d_out_dim(r->H, 3, 2, 0, 1), Wo = ts_conv2d_out_dim(r->W, 3, 2, 0, 1);
    ts_tensor_t x = img4(r, r->buf[r->cur], r->C, r->H, r->W),
                y = img4(r, r->buf[r->cur ^ 1], r->C, Ho, Wo);
    TS_TRY(conv(r, &y, &x, c, &DOWN));
    r->cur ^= 1;
    r->H = Ho, r->W = Wo;
    return TS_OK;
}

/* x ← conv 3×3 of x repeated 2×2: twice the side */
static int up_forward(run_t *r, const vae_conv_t *c) {
    const int64_t C = r->C, H2 = 2 * r->H, W2 = 2 * r->W;
    ts_tensor_t x = img4(r, r->buf[r->cur], C, r->H, r->W), u = img4(r, r->buf[2], C, H2, W2);
    ts_tensor_t y = img4(r, r->buf[r->cur ^ 1], C, H2, W2);
    TS_TRY(ts_upsample_nearest2x_forward(r->e, &u, &x));
    TS_TRY(conv(r, &y, &u, c, &SAME));
    r->cur ^= 1;
    r->H = H2, r->W = W2;
    return TS_OK;
}

static int level_forward(run_t *r, const vae_level_t *lv, int down) {
    for (int k = 0; k < lv->n_res; k++)
        TS_TRY(resnet_forward(r, &lv->res[k]));
    if (!lv->has_sample)
        return TS_OK;
    return down ? down_forward(r, &lv->sample) : up_forward(r, &lv->sample);
}

/* y = conv_out(SiLU(norm_out(x))) */
static int head_forward(run_t *r, const vae_coder_t *cd, ts_tensor_t *y) {
    ts_tensor_t x = img4(r, r->buf[r->cur], r->C, r->H, r->W),
                h = img4(r, r->buf[2], r->C, r->H, r->W);
    TS_TRY(ts_groupnorm_silu_forward(r->e, &h, &x, &cd->norm_out.w, &cd->norm_out.b, r->cfg->groups,
                                     r->cfg->eps));
    return conv(r, y, &h, &cd->conv_out, &SAME);
}

/* image (1, in, H, W) → mean · scaling_factor and logvar (1, L, H/f, W/f); logvar nullable */
static int encode_one(run_t *r, const struct ts_vae_net *net, const ts_tensor_t *image,
                      ts_tensor_t *mean, ts_tensor_t *logvar) {
    const vae_coder_t *enc = &net->enc;
    const int64_t L = r->cfg->latent_channels;
    r->cur = 0, r->C = r->cfg->block_out[0], r->H = image->shape[2], r->W = image->shape[3];
    ts_tensor_t x = img4(r, r->buf[0], r->C, r->H, r->W), staged;
    if (image->device != r->dev) { /* a CPU image for a GPU engine: into buf[1], free till later */
        staged = img4(r, r->buf[1], image->shape[1], r->H, r->W);
        TS_TRY(ts_tensor_copy(&staged, image));
        image = &staged;
    }
    TS_TRY(conv(r, &x, image, &enc->conv_in, &SAME));
    for (int i = 0; i < r->cfg->n_blocks; i++)
        TS_TRY(level_forward(r, &enc->level[i], 1));
    TS_TRY(mid_forward(r, &enc->mid));
    ts_tensor_t moments = img4(r, r->buf[3], 2 * L, r->H, r->W);
    ts_tensor_t q = img4(r, r->buf[r->cur ^ 1], 2 * L, r->H, r->W);
    TS_TRY(head_forward(r, enc, &moments));
    TS_TRY(conv(r, &q, &moments, &net->quant, &POINT)); /* (mean, logvar) along the channels */
    ts_tensor_t m = img4(r, q.data, L, r->H, r->W);
    TS_TRY(ts_scale(r->e, &m, r->cfg->scaling_factor)); /* on the engine, then out */
    TS_TRY(ts_tensor_copy(mean, &m));
    if (logvar) {
        ts_tensor_t lv = img4(r, (float *)q.data + L * r->H * r->W, L, r->H, r->W);
        TS_TRY(ts_tensor_copy(logvar, &lv));
    }
    return TS_OK;
}

/* z (1, L, h, w), scaled → image (1, out, h·f, w·f) */
static int decode_one(run_t *r, const struct ts_vae_net *net, const ts_tensor_t *z,
                      ts_tensor_t *image) {
    const vae_coder_t *dec = &net->dec;
    const int64_t L = r->cfg->latent_channels, h = z->shape[2], w = z->shape[3];
    ts_tensor_t zs = img4(r, r->buf[2], L, h, w), p = img4(r, r->buf[3], L, h, w);
    TS_TRY(ts_tensor_copy(&zs, z));
    TS_TRY(ts_scale(r->e, &zs, 1.0f / r->cfg->scaling_factor));
    TS_TRY(conv(r, &p, &zs, &net->post_quant, &POINT));
    r->cur = 0, r->C = r->cfg->block_out[r->cfg->n_blocks - 1], r->H = h, r->W = w;
    ts_tensor_t x = img4(r, r->buf[0], r->C, h, w);
    TS_TRY(conv(r, &x, &p, &dec->conv_in, &SAME));
    TS_TRY(mid_forward(r, &dec->mid));
    for (int j = 0; j < r->cfg->n_blocks; j++)
        TS_TRY(level_forward(r, &dec->level[j], 0));
    if (image->device == r->dev)
        return head_forward(r, dec, image);
    /* a CPU image for a GPU engine: the head writes buf[cur ^ 1], which it does not read */
    ts_tensor_t y = img4(r, r->buf[r->cur ^ 1], image->shape[1], r->H, r->W);
    TS_TRY(head_forward(r, dec, &y));
    return ts_tensor_copy(image, &y);
}

/* ---- the public forwards ------------------------------------------------------------------- */

/* t is an F32 tensor (B, C, H, W) with C = channels (B, H, W > 0 unless noted), on the CPU or
 * on e's device. */
static int check_images(const ts_engine_t *e, const ts_tensor_t *t, int64_t channels,
                        const char *what, char *err, size_t errlen) {
    char d[96];
    if (ts_tensor_check(t) != TS_OK || t->dtype != TS_F32 ||
        (t->device != TS_CPU && t->device != e->device) || t->ndim != 4 || t->shape[1] != channels)
        return ts_fail(err, errlen, TS_ESHAPE,
                       "%s is %s; want F32 (B, %lld, H, W) on the cpu or the engine's device", what,
                       t ? ts_tensor_describe(t, d, sizeof d) : "missing", (long long)channels);
    return TS_OK;
}

static int check_engine(ts_vae_t *m, ts_engine_t *e, char *err, size_t errlen) {
    if (!m || !e)
        return ts_fail(err, errlen, TS_EINVAL, "no VAE or no engine");
    if (e->device != TS_CPU && e->device != TS_CUDA)
        return ts_fail(err, errlen, TS_ENOTSUP, "the VAE runs on a CPU or CUDA engine");
    char why[256] = "";
    if (m->precision != TS_PREC_F32 && ts_engine_precision_check(e, m->precision, why, sizeof why))
        return ts_fail(err, errlen, TS_ENOTSUP, "the VAE's %s products cannot run here: %s",
                       ts_precision_name(m->precision), why);
    return TS_OK;
}

int ts_vae_set_precision(ts_vae_t *m, ts_engine_t *e, ts_precision_t p, char *err, size_t errlen) {
    if (!m || (p != TS_PREC_F32 && p != TS_PREC_BF16 && p != TS_PREC_F16))
        return ts_fail(err, errlen, TS_EINVAL, "ts_vae_set_precision: no VAE or no precision");
    char why[256] = "";
    if (e && p != TS_PREC_F32 && ts_engine_precision_check(e, p, why, sizeof why))
        return ts_fail(err, errlen, TS_ENOTSUP, "%s products cannot run here: %s",
                       ts_precision_name(p), why);
    m->precision = p;
    return TS_OK;
}

int ts_vae_encode(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *latent, ts_tensor_t *logvar,
                  const ts_tensor_t *image, char *err, size_t errlen) {
    TS_TRY(check_engine(m, e, err, errlen));
    const ts_vae_config_t *c = &m->cfg;
    TS_TRY(check_images(e, image, c->in_channels, "the image", err, errlen));
    TS_TRY(check_images(e, latent, c->latent_channels, "the latent", err, errlen));
    const int64_t B = image->shape[0], H = image->shape[2], W = image->shape[3];
    const int f = ts_vae_factor(c);
    TS_TRY(reserve_on(m, e->device, e->gpu, H, W, err, errlen));
    const struct ts_vae_net *net;
    TS_TRY(net_for(m, e, &net, err, errlen));
    if (latent->shape[0] != B || latent->shape[2] != H / f || latent->shape[3] != W / f)
        return ts_fail(err, errlen, TS_ESHAPE,
                       "latent is (%lld, %lld, %lld, %lld); want (%lld, "
                       "%d, %lld, %lld) for images of %lldx%lld",
                       (long long)latent->shape[0], (long long)latent->shape[1],
                       (long long)latent->shape[2], (long long)latent->shape[3], (long long)B,
                       c->latent_channels, (long long)(H / f), (long long)(W / f), (long long)H,
                       (long long)W);
    if (logvar && !ts_tensor_same_shape(logvar, latent))
        return ts_fail(err, errlen, TS_ESHAPE, "logvar's shape differs from the latent's");
    run_t r;
    TS_TRY(run_init(&r, m, e));
    for (int64_t b = 0; b < B; b++) {
        ts_tensor_t x, mean, lv;
        TS_TRY(ts_tensor_slice(&x, image, b, 1));
        TS_TRY(ts_tensor_slice(&mean, latent, b, 1));
        if (logvar)
            TS_TRY(ts_tensor_slice(&lv, logvar, b, 1));
        int rc = encode_one(&r, net, &x, &mean, logvar ? &lv : NULL);
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "VAE encode of image %lld failed", (long long)b);
    }
    return TS_OK;
}

int ts_vae_decode(ts_vae_t *m, ts_engine_t *e, ts_tensor_t *image, const ts_tensor_t *latent,
                  char *err, size_t errlen) {
    TS_TRY(check_engine(m, e, err, errlen));
    const ts_vae_config_t *c = &m->cfg;
    TS_TRY(check_images(e, latent, c->latent_channels, "the latent", err, errlen));
    TS_TRY(check_images(e, image, c->out_channels, "the image", err, errlen));
    const int64_t B = latent->shape[0], f = ts_vae_factor(c);
    const int64_t H = latent->shape[2] * f, W = latent->shape[3] * f;
    if (image->shape[0] != B || image->shape[2] != H || image->shape[3] != W)
        return ts_fail(err, errlen, TS_ESHAPE,
                       "image is (%lld, %lld, %lld, %lld); want (%lld, %d, "
                       "%lld, %lld) for latents of %lldx%lld",
                       (long long)image->shape[0], (long long)image->shape[1],
                       (long long)image->shape[2], (long long)image->shape[3], (long long)B,
                       c->out_channels, (long long)H, (long long)W, (long long)latent->shape[2],
                       (long long)latent->shape[3]);
    TS_TRY(reserve_on(m, e->device, e->gpu, H, W, err, errlen));
    const struct ts_vae_net *net;
    TS_TRY(net_for(m, e, &net, err, errlen));
    run_t r;
    TS_TRY(run_init(&r, m, e));
    for (int64_t b = 0; b < B; b++) {
        ts_tensor_t z, x;
        TS_TRY(ts_tensor_slice(&z, latent, b, 1));
        TS_TRY(ts_tensor_slice(&x, image, b, 1));
        int rc = decode_one(&r, net, &z, &x);
        if (rc != TS_OK)
            return ts_fail(err, errlen, rc, "VAE decode of image %lld failed", (long long)b);
    }
    return TS_OK;
}
