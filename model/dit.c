/*
 * dit.c — the DiT velocity model: parameter table, initialisation, forward, backward.
 *
 * Layout. Every tensor the model trains is listed once in a parameter table (name, file shape,
 * offset into a flat slab, how to initialise it), in PyTorch's state_dict order. The same table
 * lays out the parameter slab, the gradient slab and, in model/trainer.c, the AdamW moments and the
 * EMA copy, so "all parameters" is always one contiguous tensor: zero-grad is one memset, the
 * optimiser step is one call, a checkpoint is one copy.
 *
 * Activations live in an arena sized for max_batch samples at creation; a call with B samples
 * works on the first B rows of each (a slice), so nothing is allocated per step.
 *
 * The forward pass is DiT's: patchify → linear (the stride-p conv) + pos_embed; t → sinusoid(1000·t)
 * → Linear/SiLU/Linear; y → label table; c = t_emb + y_emb; per block, adaLN(SiLU(c)) gives six
 * chunks (shift, scale, gate for attention, then for the MLP); x += gate·Attn(modulate(LN(x)))
 * and x += gate·MLP(modulate(LN(x))); the final layer modulates LN(x) with two chunks, projects
 * to p·p·C per token and unpatchifies. The backward pass walks the same list in reverse.
 */
#include "model/dit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configs --------------------------------------------------------------------------- */

int ts_dit_config_preset(const char *name, ts_dit_config_t *cfg) {
    if (!name || !cfg)
        return TS_EINVAL;
    ts_dit_config_t c = {
        .input_size = 28, .in_channels = 1, .num_classes = 10, .mlp_ratio = 4, .freq_dim = 256};
    if (strcmp(name, "tiny") == 0) {
        c.hidden_size = 128, c.depth = 4, c.num_heads = 4, c.patch_size = 4;
    } else if (strcmp(name, "mini") == 0) {
        c.hidden_size = 64, c.depth = 2, c.num_heads = 2, c.patch_size = 4;
    } else if (strcmp(name, "small") == 0) {
        c.hidden_size = 256, c.depth = 6, c.num_heads = 4, c.patch_size = 2;
    } else {
        /* DiT's family: S (384, 12, 6), B (768, 12, 12), L (1024, 24, 16), XL (1152, 28, 16) */
        char size[4] = {0};
        int patch = 0;
        if (sscanf(name, "%3[A-Z]/%d", size, &patch) != 2 ||
            (patch != 2 && patch != 4 && patch != 8))
            return TS_EINVAL;
        if (strcmp(size, "S") == 0)
            c.hidden_size = 384, c.depth = 12, c.num_heads = 6;
        else if (strcmp(size, "B") == 0)
            c.hidden_size = 768, c.depth = 12, c.num_heads = 12;
        else if (strcmp(size, "L") == 0)
            c.hidden_size = 1024, c.depth = 24, c.num_heads = 16;
        else if (strcmp(size, "XL") == 0)
            c.hidden_size = 1152, c.depth = 28, c.num_heads = 16;
        else
            return TS_EINVAL;
        c.patch_size = patch;
    }
    *cfg = c;
    return TS_OK;
}

int ts_dit_config_check(const ts_dit_config_t *c) {
    if (!c)
        return TS_EINVAL;
    if (c->input_size < 1 || c->input_size > 4096 || c->in_channels < 1 || c->in_channels > 64 ||
        c->patch_size < 1 || c->patch_size > 64 || c->hidden_size < 4 ||
        c->hidden_size > TS_DIT_MAX_DIM || c->depth < 1 || c->depth > TS_DIT_MAX_DEPTH ||
        c->num_heads < 1 || c->num_classes < 1 || c->num_classes > 1000000 || c->mlp_ratio < 1 ||
        c->mlp_ratio > 16 || c->freq_dim < 2 || c->freq_dim > TS_DIT_MAX_DIM ||
        (c->learn_sigma != 0 && c->learn_sigma != 1))
        return TS_ERANGE;
    if (c->hidden_size % c->num_heads != 0 || c->hidden_size % 4 != 0 ||
        c->input_size % c->patch_size != 0)
        return TS_EINVAL;
    return TS_OK;
}

int ts_dit_tokens(const ts_dit_config_t *cfg) {
    int g = cfg->input_size / cfg->patch_size;
    return g * g;
}

/* ---- the parameter table --------------------------------------------------------------- */

typedef struct {
    ts_dit_param_info_t *info;
    int count, cap;
    int64_t total;
} table_t;

static int table_add(table_t *tb, const char *name, int init, int ndim, int64_t d0, int64_t d1,
                     int64_t d2, int64_t d3) {
    if (tb->count == tb->cap)
        return TS_ENOMEM;
    ts_dit_param_info_t *p = &tb->info[tb->count++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    int64_t dims[4] = {d0, d1, d2, d3};
    p->ndim = ndim;
    p->numel = 1;
    for (int i = 0; i < ndim; i++) {
        p->shape[i] = dims[i];
        p->numel *= dims[i];
    }
    /* every tensor starts on a 16-element (64-byte) boundary */
    p->offset = (tb->total + 15) / 16 * 16;
    p->init = init;
    tb->total = p->offset + p->numel;
    return TS_OK;
}

int ts_dit_param_table(const ts_dit_config_t *c, ts_dit_param_info_t **info, int *count,
                       int64_t *total) {
    TS_TRY(ts_dit_config_check(c));
    int64_t h = c->hidden_size, C = c->in_channels, p = c->patch_size, r = c->mlp_ratio * h;
    table_t tb = {0};
    tb.cap = 11 + 10 * c->depth;
    tb.info = calloc((size_t)tb.cap, sizeof *tb.info);
    if (!tb.info)
        return TS_ENOMEM;
    int rc = TS_OK;
    char name[64];
    rc |= table_add(&tb, "x_embedder.proj.weight", TS_INIT_XAVIER, 4, h, C, p, p);
    rc |= table_add(&tb, "x_embedder.proj.bias", TS_INIT_ZERO, 1, h, 0, 0, 0);
    rc |= table_add(&tb, "t_embedder.mlp.0.weight", TS_INIT_NORMAL002, 2, h, c->freq_dim, 0, 0);
    rc |= table_add(&tb, "t_embedder.mlp.0.bias", TS_INIT_ZERO, 1, h, 0, 0, 0);
    rc |= table_add(&tb, "t_embedder.mlp.2.weight", TS_INIT_NORMAL002, 2, h, h, 0, 0);
    rc |= table_add(&tb, "t_embedder.mlp.2.bias", TS_INIT_ZERO, 1, h, 0, 0, 0);
    rc |= table_add(&tb, "y_embedder.embedding_table.weight", TS_INIT_NORMAL002, 2,
                    c->num_classes + 1, h, 0, 0);
    for (int l = 0; l < c->depth; l++) {
#define BLOCK(suffix, init, nd, a, b)                                                              \
    snprintf(name, sizeof name, "blocks.%d.%s", l, suffix);                                        \
    rc |= table_add(&tb, name, init, nd, a, b, 0, 0)
        BLOCK("attn.qkv.weight", TS_INIT_XAVIER, 2, 3 * h, h);
        BLOCK("attn.qkv.bias", TS_INIT_ZERO, 1, 3 * h, 0);
        BLOCK("attn.proj.weight", TS_INIT_XAVIER, 2, h, h);
        BLOCK("attn.proj.bias", TS_INIT_ZERO, 1, h, 0);
        BLOCK("mlp.fc1.weight", TS_INIT_XAVIER, 2, r, h);
        BLOCK("mlp.fc1.bias", TS_INIT_ZERO, 1, r, 0);
        BLOCK("mlp.fc2.weight", TS_INIT_XAVIER, 2, h, r);
        BLOCK("mlp.fc2.bias", TS_INIT_ZERO, 1, h, 0);
        BLOCK("adaLN_modulation.1.weight", TS_INIT_ZERO, 2, 6 * h, h);
        BLOCK("adaLN_modulation.1.bias", TS_INIT_ZERO, 1, 6 * h, 0);
#undef BLOCK
    }
    int64_t out = p * p * C * (c->learn_sigma ? 2 : 1); /* per token: (py, px, channel) */
    rc |= table_add(&tb, "final_layer.linear.weight", TS_INIT_ZERO, 2, out, h, 0, 0);
    rc |= table_add(&tb, "final_layer.linear.bias", TS_INIT_ZERO, 1, out, 0, 0, 0);
    rc |= table_add(&tb, "final_layer.adaLN_modulation.1.weight", TS_INIT_ZERO, 2, 2 * h, h, 0, 0);
    rc |= table_add(&tb, "final_layer.adaLN_modulation.1.bias", TS_INIT_ZERO, 1, 2 * h, 0, 0, 0);
    if (rc != TS_OK) {
        free(tb.info);
        return TS_ENOMEM;
    }
    *info = tb.info;
    *count = tb.count;
    *total = (tb.total + 15) / 16 * 16;
    return TS_OK;
}

const ts_dit_param_info_t *ts_dit_param_find(const ts_dit_t *m, const char *name) {
    for (int i = 0; m && m->info && name && i < m->n_params; i++)
        if (strcmp(m->info[i].name, name) == 0)
            return &m->info[i];
    return NULL;
}

/* A view of table entry i in slab, with the compute shape (2-D for the patch-embed weight). */
static int view_of(const ts_tensor_t *slab, const ts_dit_param_info_t *pi, ts_tensor_t *out) {
    int64_t shape[TS_MAX_DIMS];
    int ndim = pi->ndim;
    memcpy(shape, pi->shape, sizeof shape);
    if (ndim == 4) { /* (h, C, p, p) → (h, C·p·p) */
        shape[1] = pi->shape[1] * pi->shape[2] * pi->shape[3];
        ndim = 2;
    }
    char *base = (char *)slab->data + pi->offset * (int64_t)ts_dtype_size(slab->dtype);
    return ts_tensor_wrap(out, base, slab->dtype, slab->device, ndim, shape);
}

int ts_dit_bind(const ts_dit_config_t *cfg, const ts_tensor_t *slab, ts_dit_params_t *v,
                ts_dit_block_params_t *blocks) {
    ts_dit_param_info_t *info;
    int count;
    int64_t total;
    TS_TRY(ts_dit_param_table(cfg, &info, &count, &total));
    int rc = TS_OK;
    if (ts_tensor_check(slab) ||
        (slab->dtype != TS_F32 && slab->dtype != TS_BF16 && slab->dtype != TS_F16) ||
        ts_tensor_numel(slab) < total)
        rc = TS_ESHAPE;
    /* the table's order is fixed: 7 head tensors, 10 per block, 4 final */
    ts_tensor_t *head[7] = {&v->x_w, &v->x_b, &v->t_w0, &v->t_b0, &v->t_w2, &v->t_b2, &v->y_table};
    for (int i = 0; i < 7 && rc == TS_OK; i++)
        rc = view_of(slab, &info[i], head[i]);
    v->blocks = blocks;
    for (int l = 0; l < cfg->depth && rc == TS_OK; l++) {
        ts_dit_block_params_t *b = &blocks[l];
        ts_tensor_t *bt[10] = {&b->qkv_w, &b->qkv_b, &b->proj_w, &b->proj_b, &b->fc1_w,
                               &b->fc1_b, &b->fc2_w, &b->fc2_b,  &b->ada_w,  &b->ada_b};
        for (int i = 0; i < 10 && rc == TS_OK; i++)
            rc = view_of(slab, &info[7 + 10 * l + i], bt[i]);
    }
    ts_tensor_t *tail[4] = {&v->f_w, &v->f_b, &v->fada_w, &v->fada_b};
    for (int i = 0; i < 4 && rc == TS_OK; i++)
        rc = view_of(slab, &info[7 + 10 * cfg->depth + i], tail[i]);
    free(info);
    return rc;
}

/* ---- creation -------------------------------------------------------------------------- */

/* Hands out every activation tensor from the arena (or only measures, in measuring mode), but a
 * trainable model's 16-bit rooms (plan_rooms: an arena of their own). */
static int plan_acts(ts_dit_t *m, ts_arena_t *a, ts_attn_impl_t attn) {
    const ts_dit_config_t *c = &m->cfg;
    int64_t B = m->max_batch, T = ts_dit_tokens(c), h = c->hidden_size, H = c->num_heads;
    int64_t F = (int64_t)c->in_channels * c->patch_size * c->patch_size, r = c->mlp_ratio * h;
    int64_t S = c->input_size;
    ts_dit_acts_t *A = &m->acts;
#define T3(t, d2) TS_TRY(ts_arena_tensor(a, &(t), TS_F32, 3, TS_SHAPE(B, T, d2)))
#define T2(t, d1) TS_TRY(ts_arena_tensor(a, &(t), TS_F32, 2, TS_SHAPE(B, d1)))
#define T1(t, d0) TS_TRY(ts_arena_tensor(a, &(t), TS_F32, 1, TS_SHAPE(d0)))
    T3(A->patches, F);
    T3(A->x0, h);
    T2(A->tfreq, c->freq_dim);
    T2(A->t_h, h);
    T2(A->t_s, h);
    T2(A->t_emb, h);
    T2(A->y_emb, h);
    T2(A->c, h);
    T2(A->c_silu, h);
    /* A model that cannot train never reads a block's activations after the block: every block
     * of it shares block 0's buffers, and its residual stream alternates between block 0's x_out
     * and x_alt. The arena holds one block instead of depth (per sample: DiT-XL/2 at 32×32×4
     * ~30 MB instead of ~780). */
    ts_tensor_t x_alt;
    memset(&x_alt, 0, sizeof x_alt);
    if (!m->trainable && c->depth > 1)
        T3(x_alt, h);
    for (int l = 0; l < c->depth; l++) {
        ts_dit_block_acts_t *k = &A->blocks[l];
        if (!m->trainable && l > 0) {
            *k = A->blocks[0];
            k->x_in = A->blocks[l - 1].x_out;
            k->x_out = l % 2 ? x_alt : A->blocks[0].x_out;
            continue;
        }
        k->x_in = l == 0 ? A->x0 : A->blocks[l - 1].x_out;
        T2(k->mod, 6 * h);
        T3(k->ln1, h);
        T1(k->ln1_mean, B * T);
        T1(k->ln1_rstd, B * T);
        T3(k->mod1, h);
        T3(k->qkv, 3 * h);
        memset(&k->att, 0, sizeof k->att);
        memset(&k->lse, 0, sizeof k->lse);
        if (attn == TS_ATTN_COMPOSED)
            TS_TRY(ts_arena_tensor(a, &k->att, TS_F32, 4, TS_SHAPE(B, H, T, T)));
        else if (m->trainable)
            TS_TRY(ts_arena_tensor(a, &k->lse, TS_F32, 3, TS_SHAPE(B, H, T)));
        T3(k->atty, h);
        T3(k->proj, h);
        T3(k->x_mid, h);
        T3(k->ln2, h);
        T1(k->ln2_mean, B * T);
        T1(k->ln2_rstd, B * T);
        T3(k->mod2, h);
        T3(k->fc1, r);
        T3(k->gelu, r);
        T3(k->fc2, h);
        T3(k->x_out, h);
    }
    A->x_final = A->blocks[c->depth - 1].x_out;
    T2(A->fmod, 2 * h);
    T3(A->lnf, h);
    T1(A->lnf_mean, B * T);
    T1(A->lnf_rstd, B * T);
    T3(A->fx, h);
    T3(A->out_tok, F * (c->learn_sigma ? 2 : 1));
    TS_TRY(ts_arena_tensor(a, &A->out, TS_F32, 4, TS_SHAPE(B, c->in_channels, S, S)));
    memset(&A->out2, 0, sizeof A->out2);
    memset(&A->sigma, 0, sizeof A->sigma);
    if (c->learn_sigma) {
        TS_TRY(ts_arena_tensor(a, &A->out2, TS_F32, 4, TS_SHAPE(B, 2 * c->in_channels, S, S)));
        TS_TRY(ts_arena_tensor(a, &A->sigma, TS_F32, 4, TS_SHAPE(B, c->in_channels, S, S)));
    }
    if (m->trainable) {
        ts_dit_grad_acts_t *G = &m->gacts;
        T3(G->dout_tok, F);
        T3(G->dfx, h);
        T3(G->dlnf, h);
        T2(G->dfmod, 2 * h);
        T3(G->dx, h);
        T2(G->dc_silu, h);
        T2(G->dc, h);
        T2(G->dt_s, h);
        T2(G->dt_h, h);
        T2(G->dmod, 6 * h);
        T3(G->dfc2, h);
        T3(G->dgelu, r);
        T3(G->dfc1, r);
        T3(G->dmod2, h);
        T3(G->dln2, h);
        T3(G->dproj, h);
        T3(G->datty, h);
        T3(G->dqkv, 3 * h);
        memset(&G->datt, 0, sizeof G->datt);
        if (attn == TS_ATTN_COMPOSED)
            TS_TRY(ts_arena_tensor(a, &G->datt, TS_F32, 4, TS_SHAPE(B, H, T, T)));
        T3(G->dmod1, h);
        T3(G->dln1, h);
    }
#undef T1
#undef T2
#undef T3
    return TS_OK;
}

/* A trainable model's 16-bit rooms, read at bf16 and f16 only (lp): the blocks' atty16, proj's
 * 16-bit input beside the fused attention's fp32 output, into atty16[depth], and the backward's
 * one room for a linear's 16-bit dout into *dout16; empty tensors where there are none. */
static int plan_rooms(const ts_dit_t *m, ts_arena_t *a, ts_attn_impl_t attn, int lp,
                      ts_tensor_t *atty16, ts_tensor_t *dout16) {
    const ts_dit_config_t *c = &m->cfg;
    int64_t B = m->max_batch, T = ts_dit_tokens(c), h = c->hidden_size, r = c->mlp_ratio * h;
    memset(atty16, 0, (size_t)c->depth * sizeof *atty16);
    memset(dout16, 0, sizeof *dout16);
    if (!lp || !m->trainable)
        return TS_OK;
    for (int l = 0; l < c->depth && attn == TS_ATTN_FUSED; l++)
        TS_TRY(ts_arena_tensor(a, &atty16[l], TS_BF16, 3, TS_SHAPE(B, T, h)));
    return ts_arena_tensor(a, dout16, TS_BF16, 3, TS_SHAPE(B, T, r > 3 * h ? r : 3 * h));
}

/* m's 16-bit rooms laid out for attention attn, or none (lp 0), in an arena of their own —
 * moving to or from f32 leaves the activations' arena alone. On failure m keeps the rooms it
 * had. */
static int set_rooms(ts_dit_t *m, ts_attn_impl_t attn, int lp) {
    lp = lp && m->trainable;
    int depth = m->cfg.depth;
    ts_tensor_t *att = calloc((size_t)depth, sizeof *att), dout;
    if (!att)
        return TS_ENOMEM;
    ts_arena_t fresh;
    int rc = ts_arena_init(&fresh, m->eng->device, 0); /* measuring */
    if (rc == TS_OK)
        rc = plan_rooms(m, &fresh, attn, lp, att, &dout);
    size_t peak = fresh.peak;
    memset(&fresh, 0, sizeof fresh);
    if (rc == TS_OK && peak > 0 && (rc = ts_arena_init(&fresh, m->eng->device, peak)) == TS_OK)
        rc = plan_rooms(m, &fresh, attn, lp, att, &dout);
    if (rc != TS_OK) {
        ts_arena_free(&fresh);
        free(att);
        return rc;
    }
    ts_arena_free(&m->rooms);
    m->rooms = fresh;
    for (int l = 0; l < depth; l++)
        m->acts.blocks[l].atty16 = att[l];
    m->gacts.dout16 = dout;
    m->rooms_attn = attn;
    m->lp_rooms = lp;
    free(att);
    return TS_OK;
}

static ts_attn_impl_t default_attention(const ts_dit_t *m, ts_precision_t p);

/* The arena's size for attention attn: *peak bytes. TS_ERANGE when the activations of one sample
 * with the composed attention (the larger layout) pass TS_DIT_MAX_SAMPLE_BYTES (a trainable model:
 * TS_DIT_MAX_TRAIN_SAMPLE_BYTES), whichever attn is asked for. Allocates nothing; leaves m->acts
 * pointing nowhere. */
static int measure_acts(ts_dit_t *m, ts_attn_impl_t attn, size_t *peak) {
    ts_arena_t bound, measure;
    TS_TRY(ts_arena_init(&bound, m->eng->device, 0));
    TS_TRY(plan_acts(m, &bound, TS_ATTN_COMPOSED));
    uint64_t cap = m->trainable ? TS_DIT_MAX_TRAIN_SAMPLE_BYTES : TS_DIT_MAX_SAMPLE_BYTES;
    if ((uint64_t)bound.peak / (uint64_t)m->max_batch > cap)
        return TS_ERANGE; /* activations per sample beyond any model this project runs */
    TS_TRY(ts_arena_init(&measure, m->eng->device, 0));
    TS_TRY(plan_acts(m, &measure, attn));
    *peak = measure.peak;
    return TS_OK;
}

int ts_dit_create(ts_dit_t *m, const ts_dit_config_t *cfg, ts_engine_t *e, int max_batch,
                  int trainable) {
    if (!m || !cfg || !e || max_batch < 1 || max_batch > 65536)
        return TS_EINVAL;
    memset(m, 0, sizeof *m);
    TS_TRY(ts_dit_config_check(cfg));
    if (cfg->learn_sigma && trainable) /* DiT trains σ with the VLB term, not built here */
        return TS_ENOTSUP;
    m->cfg = *cfg;
    m->eng = e;
    m->max_batch = max_batch;
    m->trainable = trainable;
    m->lp_acts = e->device == TS_CUDA;
    int rc = ts_dit_param_table(cfg, &m->info, &m->n_params, &m->num_params);
    if (rc)
        return rc;
    /* a config from a file any peer may serve: its memory is bounded before anything big is
     * allocated (parameters here, activations below) */
    if ((uint64_t)m->num_params * 4u * (trainable ? 2u : 1u) > TS_DIT_MAX_BYTES) {
        ts_dit_free(m);
        return TS_ERANGE;
    }
    m->params.blocks = calloc((size_t)cfg->depth, sizeof *m->params.blocks);
    m->grads.blocks = calloc((size_t)cfg->depth, sizeof *m->grads.blocks);
    m->acts.blocks = calloc((size_t)cfg->depth, sizeof *m->acts.blocks);
    if (!m->params.blocks || !m->grads.blocks || !m->acts.blocks)
        rc = TS_ENOMEM;
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&m->param_mem, TS_F32, e->device, 1, TS_SHAPE(m->num_params));
    if (rc == TS_OK)
        rc = ts_dit_bind(cfg, &m->param_mem, &m->params, m->params.blocks);
    if (rc == TS_OK) /* "parameters zero" on every engine: a GPU's fresh memory is not */
        rc = ts_zero(e, &m->param_mem);
    if (rc == TS_OK && trainable) {
        rc = ts_tensor_alloc(&m->grad_mem, TS_F32, e->device, 1, TS_SHAPE(m->num_params));
        if (rc == TS_OK)
            rc = ts_dit_bind(cfg, &m->grad_mem, &m->grads, m->grads.blocks);
        if (rc == TS_OK)
            rc = ts_zero(e, &m->grad_mem);
    }
    int T = ts_dit_tokens(cfg);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&m->pos_embed, TS_F32, e->device, 2, TS_SHAPE(T, cfg->hidden_size));
    if (rc == TS_OK)
        rc = ts_pos_embed_2d(e, &m->pos_embed, cfg->input_size / cfg->patch_size);
    if (rc == TS_OK)
        rc = ts_tensor_alloc(&m->labels, TS_I32, e->device, 1, TS_SHAPE(max_batch));
    /* size the arena by running the plan in measuring mode, then for real */
    m->attn = default_attention(m, TS_PREC_F32);
    size_t peak = 0;
    if (rc == TS_OK)
        rc = measure_acts(m, m->attn, &peak);
    if (rc == TS_OK)
        rc = ts_arena_init(&m->arena, e->device, peak);
    if (rc == TS_OK)
        rc = plan_acts(m, &m->arena, m->attn);
    if (rc != TS_OK)
        ts_dit_free(m);
    return rc;
}

/* What graphs of m recorded (its buffers' layout, the kernels chosen) no longer holds: its own are
 * dropped, and graph_epoch moves for those a trainer keeps of it. */
static void graphs_stale(ts_dit_t *m) {
    ts_graph_cache_drop(&m->graphs);
    m->graph_epoch++;
}

void ts_dit_free(ts_dit_t *m) {
    if (!m)
        return;
    ts_graph_cache_drop(&m->graphs);
    ts_arena_free(&m->arena);
    ts_arena_free(&m->rooms);
    ts_tensor_free(&m->labels);
    ts_tensor_free(&m->pos_embed);
    ts_tensor_free(&m->grad_mem);
    ts_tensor_free(&m->param_mem);
    ts_tensor_free(&m->param_lp);
    free(m->wlp.blocks);
    free(m->acts.blocks);
    free(m->grads.blocks);
    free(m->params.blocks);
    free(m->info);
    memset(m, 0, sizeof *m);
}

/* ---- initialisation -------------------------------------------------------------------- */

int ts_dit_init_weights(ts_dit_t *m, uint64_t seed) {
    if (!m || !m->info)
        return TS_EINVAL;
    ts_engine_t *e = m->eng;
    TS_TRY(ts_zero(e, &m->param_mem));
    for (int i = 0; i < m->n_params; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        ts_tensor_t w;
        TS_TRY(view_of(&m->param_mem, pi, &w));
        /* each tensor draws from its own stretch of the stream: offset = its slab offset */
        uint64_t offset = (uint64_t)pi->offset;
        if (pi->init == TS_INIT_XAVIER) {
            /* U(−a, a), a = √(6 / (fan_in + fan_out)), on the 2-D view */
            double a = sqrt(6.0 / (double)(w.shape[0] + w.shape[1]));
            TS_TRY(ts_rng_uniform(e, &w, seed, offset));
            TS_TRY(ts_affine(e, &w, (float)(2.0 * a), (float)-a));
        } else if (pi->init == TS_INIT_NORMAL002) {
            TS_TRY(ts_rng_normal(e, &w, seed, offset));
            TS_TRY(ts_scale(e, &w, 0.02f));
        }
    }
    return TS_OK;
}

/* ---- forward --------------------------------------------------------------------------- */

/* The first B rows of an activation. */
static ts_tensor_t rows(const ts_tensor_t *t, int B) {
    ts_tensor_t v;
    if (ts_tensor_slice(&v, t, 0, B) != TS_OK)
        memset(&v, 0, sizeof v); /* an empty tensor: the next op reports TS_EINVAL */
    return v;
}

/* The first B·T rows of a per-token statistic (mean, rstd). */
static ts_tensor_t stat_rows(const ts_tensor_t *t, int B, int T) {
    ts_tensor_t v;
    if (ts_tensor_slice(&v, t, 0, (int64_t)B * T) != TS_OK)
        memset(&v, 0, sizeof v);
    return v;
}

/* ---- precision and attention -------------------------------------------------------------- */

/* Where the fused attention was measured faster at batch 64 (docs/benchmarks.md, "Fused
 * attention" and "Which attention, after the pool change"): the CPU's inference forward, in
 * fp32 (`small`, 196 tokens: +2–4 %; `tiny`, 49: +6–12 %) and in bf16 below BF16_COMPOSED_TOKENS
 * tokens (`tiny`: +15–21 %); at bf16 from there on the composed one, whose products are oneDNN's
 * (`small`: +11–15 %). Batch 1 of `tiny` is 6–19 % slower fused; the choice is per model, never
 * per batch (a sample's bits must not depend on its batch). Training keeps the composed one: its
 * fused backward recomputes the scores and was slower (`small` train b64 −29 % in fp32, −18 % in
 * bf16). A GPU takes the composed one until its fused kernels are measured (set_attention can
 * choose them). */
#define BF16_COMPOSED_TOKENS 128
/* Below this many tokens (a router's 16) the fused one was not measured faster: composed, which
 * also gives a model reopened for inference the bits it had while it trained (test_classifier). */
#define FUSED_MIN_TOKENS 48
static ts_attn_impl_t default_attention(const ts_dit_t *m, ts_precision_t p) {
    if (m->eng->device != TS_CPU || m->trainable || ts_dit_tokens(&m->cfg) < FUSED_MIN_TOKENS ||
        p == TS_PREC_F16)
        return TS_ATTN_COMPOSED;
    if (p == TS_PREC_BF16 && (ts_dit_tokens(&m->cfg) >= BF16_COMPOSED_TOKENS ||
                              ts_attention_fused_bf16_check(m->eng) != TS_OK))
        return TS_ATTN_COMPOSED;
    return TS_ATTN_FUSED;
}

ts_attn_impl_t ts_dit_default_attention(const ts_dit_t *m) {
    return default_attention(m, m->precision);
}

/* Lays m's activations out for attention a, with the 16-bit rooms where lp, unless that is the
 * layout m has. The rooms first (small), then the activations' arena, which only a change of
 * attention moves; on failure m keeps the layout it had. */
static int relayout(ts_dit_t *m, ts_attn_impl_t a, int lp) {
    lp = lp && m->trainable;
    if (a == m->attn && lp == m->lp_rooms && (!lp || a == m->rooms_attn))
        return TS_OK; /* (set_attention_at has made the graphs stale already) */
    ts_attn_impl_t rooms_was = m->rooms_attn;
    int lp_was = m->lp_rooms;
    TS_TRY(set_rooms(m, a, lp));
    if (a == m->attn)
        return TS_OK;
    size_t peak = 0;
    ts_arena_t fresh;
    int rc = measure_acts(m, a, &peak);
    if (rc == TS_OK)
        rc = ts_arena_init(&fresh, m->eng->device, peak);
    if (rc != TS_OK) { /* the views onto the arena m keeps: measuring pointed them nowhere, and
                        * the plan is deterministic, so laid out again from the arena's start
                        * they are the same bytes; and the rooms as they were (small: best
                        * effort) */
        ts_arena_reset(&m->arena, 0);
        TS_TRY(plan_acts(m, &m->arena, m->attn));
        (void)set_rooms(m, rooms_was, lp_was);
        return rc;
    }
    ts_arena_free(&m->arena);
    m->arena = fresh;
    m->attn = a;
    return plan_acts(m, &m->arena, a);
}

/* ts_dit_set_attention for a model at precision p (its own, or the one it is about to take). */
static int set_attention_at(ts_dit_t *m, ts_attn_impl_t a, ts_precision_t p) {
    if (!m || !m->info || (a != TS_ATTN_FUSED && a != TS_ATTN_COMPOSED))
        return TS_EINVAL;
    graphs_stale(m); /* the kernels may change with the attention */
    int lp = p != TS_PREC_F32;
    if (a == TS_ATTN_FUSED &&
        ((lp && ts_attention_fused_lp_check(m->eng, ts_precision_dtype(p)) != TS_OK) ||
         (m->eng->device == TS_CUDA &&
          (m->cfg.hidden_size / m->cfg.num_heads > TS_CUDA_FUSED_HD_MAX ||
           m->max_batch > TS_CUDA_FUSED_MAX_BATCH ||
           /* the 16-bit flash attention's heads go in steps of 8 */
           (lp && m->cfg.hidden_size / m->cfg.num_heads % 8 != 0)))))
        return TS_ENOTSUP;
    return relayout(m, a, lp);
}

int ts_dit_set_attention(ts_dit_t *m, ts_attn_impl_t a) {
    return set_attention_at(m, a, m ? m->precision : TS_PREC_F32);
}

int ts_dit_set_precision(ts_dit_t *m, ts_precision_t p, char *why, size_t why_len) {
    if (!m || !m->info)
        return TS_EINVAL;
    graphs_stale(m);
    if (p == TS_PREC_F32) {
        ts_tensor_free(&m->param_lp);
        free(m->wlp.blocks);
        memset(&m->wlp, 0, sizeof m->wlp);
        m->precision = TS_PREC_F32;
        /* back to the attention a model that never left f32 has (set_attention's default), and
         * its layout without the 16-bit rooms */
        return set_attention_at(m, default_attention(m, TS_PREC_F32), TS_PREC_F32);
    }
    TS_TRY(ts_engine_precision_check(m->eng, p, why, why_len));
    ts_dtype_t lp = ts_precision_dtype(p);
    if (m->param_lp.data && m->param_lp.dtype != lp) { /* bf16 ↔ f16: a copy of the other type */
        ts_tensor_free(&m->param_lp);
        m->precision = TS_PREC_F32; /* until the new copy is in */
    }
    /* the attention measured faster at this precision (default_attention), laid out with the
     * 16-bit rooms a trainable model reads; ts_dit_set_attention may still choose the other
     * after (at f16 on a GPU only) */
    TS_TRY(set_attention_at(m, default_attention(m, p), p));
    if (!m->wlp.blocks) {
        m->wlp.blocks = calloc((size_t)m->cfg.depth, sizeof *m->wlp.blocks);
        if (!m->wlp.blocks)
            return TS_ENOMEM;
    }
    int rc = TS_OK;
    if (!m->param_lp.data)
        rc = ts_tensor_alloc(&m->param_lp, lp, m->eng->device, 1, TS_SHAPE(m->num_params));
    if (rc == TS_OK)
        rc = ts_dit_bind(&m->cfg, &m->param_lp, &m->wlp, m->wlp.blocks);
    if (rc == TS_OK)
        rc = ts_convert(m->eng, &m->param_lp, &m->param_mem);
    if (rc == TS_OK)
        m->precision = p;
    else if (m->precision == TS_PREC_F32) /* still f32: without the rooms it had */
        (void)set_rooms(m, m->attn, 0);
    return rc;
}

int ts_dit_refresh_lp(ts_dit_t *m) {
    if (!m || !m->info)
        return TS_EINVAL;
    if (m->precision == TS_PREC_F32)
        return TS_OK;
    return ts_convert(m->eng, &m->param_lp, &m->param_mem);
}

/* The weights a linear layer multiplies by, forward and backward: the 16-bit copies at bf16 and
 * f16, else the parameters. The biases always come from the fp32 parameters. */
static const ts_dit_params_t *weights(const ts_dit_t *m) {
    return m->precision != TS_PREC_F32 ? &m->wlp : &m->params;
}

void ts_dit_set_lp_activations(ts_dit_t *m, int on) {
    if (m && m->lp_acts != (on != 0)) {
        m->lp_acts = on != 0;
        graphs_stale(m);
    }
}

/* t's storage seen as a 16-bit tensor of its shape (its fp32 room holds it twice over), when m
 * writes 16-bit activations (ts_dit_set_lp_activations); else t. Only for what the linears read
 * and nothing else does, forward or backward (a linear's backward rounds its input to 16 bits
 * for the weight's gradient, and reads it for nothing else): the same bits either way. */
static ts_tensor_t act16(const ts_dit_t *m, ts_tensor_t t) {
    if (m->fwd_lp_acts && m->precision != TS_PREC_F32) /* as the forward wrote them */
        t.dtype = ts_precision_dtype(m->precision);
    return t;
}

/* The attention's output as proj reads it: in 16 bits with 16-bit activations, written so by the
 * attention — in the room of its fp32 buffer, or, for the fused attention of a trainable model,
 * beside it in atty16 (the fused backward reads the fp32 output; the composed one does not read
 * it); else the fp32 output. */
static ts_tensor_t proj_input(const ts_dit_t *m, const ts_dit_block_acts_t *A, int B) {
    ts_tensor_t atty = rows(&A->atty, B);
    if (act16(m, atty).dtype == TS_F32)
        return atty;
    if (m->attn == TS_ATTN_COMPOSED || !m->trainable)
        return act16(m, atty);
    ts_tensor_t t = rows(&A->atty16, B);
    t.dtype = ts_precision_dtype(m->precision); /* (allocated as BF16: the same size) */
    return t;
}

/* atty = attention(qkv), keeping what the backward reads: the weights att (composed) or, in a
 * trainable model, each row's log-sum-exp (fused). */
static int attention_forward(ts_dit_t *m, const ts_dit_block_acts_t *A, int B) {
    ts_engine_t *e = m->eng;
    int H = m->cfg.num_heads, bf16 = m->precision == TS_PREC_BF16;
    ts_tensor_t qkv = rows(&A->qkv, B), atty = rows(&A->atty, B);
    if (m->attn == TS_ATTN_COMPOSED) {
        ts_tensor_t att = rows(&A->att, B), out = proj_input(m, A, B); /* fp32, or 16 bits */
        if (m->precision == TS_PREC_F16)
            return ts_attention_forward_f16(e, &out, &att, &qkv, H);
        return bf16 ? ts_attention_forward_bf16(e, &out, &att, &qkv, H)
                    : ts_attention_forward(e, &atty, &att, &qkv, H);
    }
    ts_tensor_t lse = rows(&A->lse, B), *keep = m->trainable ? &lse : NULL;
    if (m->precision != TS_PREC_F32) {
        ts_dtype_t lp = ts_precision_dtype(m->precision);
        ts_tensor_t in = proj_input(m, A, B);
        if (m->trainable && in.dtype != TS_F32) /* fp32 for the backward, 16 bits for proj */
            return ts_attention_fused_forward_lp_both(e, lp, &atty, &in, keep, &qkv, H);
        return ts_attention_fused_forward_lp(e, lp, &in, keep, &qkv, H);
    }
    return ts_attention_fused_forward(e, &atty, keep, &qkv, H);
}

/* dqkv += the gradient of attention from datty, by the attention the forward used; with dqkv16
 * (the flash attention at 16 bits) dqkv as it ends rounded there too. */
static int attention_backward(ts_dit_t *m, const ts_dit_block_acts_t *A, int B,
                              ts_tensor_t *dqkv16) {
    ts_engine_t *e = m->eng;
    ts_dit_grad_acts_t *G = &m->gacts;
    int H = m->cfg.num_heads;
    ts_tensor_t qkv = rows(&A->qkv, B), atty = rows(&A->atty, B);
    ts_tensor_t dqkv = rows(&G->dqkv, B), datty = rows(&G->datty, B);
    if (m->attn == TS_ATTN_COMPOSED) {
        ts_tensor_t att = rows(&A->att, B), datt = rows(&G->datt, B);
        return ts_attention_backward(e, &dqkv, &datt, &datty, &qkv, &att, H);
    }
    ts_tensor_t lse = rows(&A->lse, B);
    if (m->precision != TS_PREC_F32)
        return ts_attention_fused_backward_lp(e, ts_precision_dtype(m->precision), &dqkv, dqkv16,
                                              &datty, &qkv, &atty, &lse, H);
    return ts_attention_fused_backward(e, &dqkv, &datty, &qkv, &atty, &lse, H);
}

static int block_forward(ts_dit_t *m, int l, int B) {
    ts_engine_t *e = m->eng;
    const ts_dit_block_params_t *P = &m->params.blocks[l], *W = &weights(m)->blocks[l];
    ts_dit_block_acts_t *A = &m->acts.blocks[l];
    int T = ts_dit_tokens(&m->cfg);
    ts_tensor_t c_silu = act16(m, rows(&m->acts.c_silu, B)), mod = rows(&A->mod, B);
    ts_tensor_t x_in = rows(&A->x_in, B), ln1 = rows(&A->ln1, B);
    ts_tensor_t mod1 = act16(m, rows(&A->mod1, B)); /* the linears' inputs: 16-bit, or fp32 */
    ts_tensor_t m1 = stat_rows(&A->ln1_mean, B, T), r1 = stat_rows(&A->ln1_rstd, B, T);
    ts_tensor_t qkv = rows(&A->qkv, B), atty = rows(&A->atty, B);
    ts_tensor_t proj = rows(&A->proj, B), x_mid = rows(&A->x_mid, B);
    ts_tensor_t ln2 = rows(&A->ln2, B), mod2 = act16(m, rows(&A->mod2, B));
    ts_tensor_t m2 = stat_rows(&A->ln2_mean, B, T), r2 = stat_rows(&A->ln2_rstd, B, T);
    ts_tensor_t fc1 = rows(&A->fc1, B), gelu = rows(&A->gelu, B), fc2 = rows(&A->fc2, B);
    ts_tensor_t x_out = rows(&A->x_out, B);

    TS_TRY(ts_linear_forward(e, &mod, &c_silu, &W->ada_w, &P->ada_b)); /* 6 chunks of h */
    /* attention branch: x_mid = x_in + gate_msa · proj(attn(modulate(LN(x_in)))) */
    TS_TRY(ts_layernorm_modulate_forward(e, &ln1, &m1, &r1, &mod1, &x_in, &mod, 0, 1));
    TS_TRY(ts_linear_forward(e, &qkv, &mod1, &W->qkv_w, &P->qkv_b));
    TS_TRY(attention_forward(m, A, B));
    atty = proj_input(m, A, B);
    TS_TRY(ts_linear_forward(e, &proj, &atty, &W->proj_w, &P->proj_b));
    TS_TRY(ts_gate_residual_forward(e, &x_mid, &x_in, &proj, &mod, 2));
    /* MLP branch: x_out = x_mid + gate_mlp · fc2(gelu(fc1(modulate(LN(x_mid))))) */
    TS_TRY(ts_layernorm_modulate_forward(e, &ln2, &m2, &r2, &mod2, &x_mid, &mod, 3, 4));
    if (gelu.dtype != act16(m, gelu).dtype) { /* 16-bit activations: GELU rounded as written */
        gelu = act16(m, gelu); /* fc1 kept for the backward only: else one product on a GPU */
        TS_TRY(
            ts_linear_gelu_forward_lp(e, &fc1, &gelu, &mod2, &W->fc1_w, &P->fc1_b, m->trainable));
    } else if (m->precision == TS_PREC_BF16) { /* its reader, fc2, rounds it to bf16 */
        TS_TRY(ts_linear_forward(e, &fc1, &mod2, &W->fc1_w, &P->fc1_b));
        TS_TRY(ts_gelu_forward_bf16(e, &gelu, &fc1));
    } else if (m->precision == TS_PREC_F16) { /* an F16 weight: the linear and GELU apart */
        TS_TRY(ts_linear_forward(e, &fc1, &mod2, &W->fc1_w, &P->fc1_b));
        TS_TRY(ts_gelu_forward(e, &gelu, &fc1));
    } else if (!m->trainable) { /* nothing reads fc1 again: GELU in place, one stream less */
        TS_TRY(ts_linear_gelu_forward(e, &fc1, &fc1, &mod2, &W->fc1_w, &P->fc1_b));
        gelu = fc1;
    } else {
        TS_TRY(ts_linear_gelu_forward(e, &fc1, &gelu, &mod2, &W->fc1_w, &P->fc1_b));
    }
    TS_TRY(ts_linear_forward(e, &fc2, &gelu, &W->fc2_w, &P->fc2_b));
    TS_TRY(ts_gate_residual_forward(e, &x_out, &x_mid, &fc2, &mod, 5));
    return TS_OK;
}

/* Stages the labels as an I32 tensor on the engine's device. */
static int stage_labels(ts_dit_t *m, const int32_t *y, int B, ts_tensor_t *ids) {
    for (int b = 0; b < B; b++)
        if (y[b] < 0 || y[b] > m->cfg.num_classes)
            return TS_ERANGE;
    ts_tensor_t host;
    TS_TRY(ts_tensor_wrap(&host, (void *)y, TS_I32, TS_CPU, 1, TS_SHAPE(B)));
    *ids = rows(&m->labels, B);
    return ts_tensor_copy(ids, &host);
}

/* The forward's arguments against m: TS_EINVAL or TS_ESHAPE, or TS_OK. */
static int check_inputs(const ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t,
                        const int32_t *y, int B) {
    if (!m || !x || !t || !y || B < 1 || B > m->max_batch)
        return TS_EINVAL;
    if (x->device != m->eng->device || t->device != m->eng->device)
        return TS_EDEVICE; /* as every op says it */
    if (x->dtype != TS_F32 || t->dtype != TS_F32)
        return TS_EDTYPE;
    const ts_dit_config_t *c = &m->cfg;
    if (x->ndim != 4 || x->shape[0] != B || x->shape[1] != c->in_channels ||
        x->shape[2] != c->input_size || x->shape[3] != c->input_size || ts_tensor_numel(t) != B)
        return TS_ESHAPE;
    return TS_OK;
}

/* The trunk's device work, the labels already staged in m->labels: patch embedding,
 * conditioning, the blocks. */
static int trunk_ops(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, int B) {
    m->fwd_lp_acts = m->lp_acts; /* the backward of this forward reads what it writes */
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    ts_dit_acts_t *A = &m->acts;
    const ts_dit_params_t *P = &m->params, *W = weights(m);
    int p = c->patch_size;
    ts_tensor_t ids = rows(&m->labels, B);
    /* the linears' inputs — the patches, the sinusoid, the timestep MLP's SiLU and adaLN's —
     * written in 16 bits by their producers with 16-bit activations (act16), else fp32 */
    ts_tensor_t patches = act16(m, rows(&A->patches, B)), x0 = rows(&A->x0, B);
    ts_tensor_t tfreq = act16(m, rows(&A->tfreq, B)), t_h = rows(&A->t_h, B);
    ts_tensor_t t_s = act16(m, rows(&A->t_s, B));
    ts_tensor_t t_emb = rows(&A->t_emb, B), y_emb = rows(&A->y_emb, B);
    ts_tensor_t cc = rows(&A->c, B), c_silu = act16(m, rows(&A->c_silu, B));

    /* patch embedding: the stride-p conv is a linear over (c, py, px)-ordered patches */
    TS_TRY(ts_patchify_forward(e, &patches, x, p));
    TS_TRY(ts_linear_forward(e, &x0, &patches, &W->x_w, &P->x_b));
    TS_TRY(ts_add_bcast_forward(e, &x0, &x0, &m->pos_embed));
    /* conditioning: c = MLP(sinusoid(1000·t)) + label embedding */
    TS_TRY(ts_timestep_embedding_forward(e, &tfreq, t, 1000.0f));
    TS_TRY(ts_linear_forward(e, &t_h, &tfreq, &W->t_w0, &P->t_b0));
    TS_TRY(t_s.dtype != TS_F32 ? ts_silu_forward_lp(e, &t_s, &t_h)
                               : ts_silu_forward(e, &t_s, &t_h));
    TS_TRY(ts_linear_forward(e, &t_emb, &t_s, &W->t_w2, &P->t_b2));
    /* the labels were checked on the host as they were staged (stage_labels) */
    TS_TRY(ts_embedding_forward_prechecked(e, &y_emb, &P->y_table, &ids));
    TS_TRY(ts_add(e, &cc, &t_emb, &y_emb));
    TS_TRY(c_silu.dtype != TS_F32 ? ts_silu_forward_lp(e, &c_silu, &cc)
                                  : ts_silu_forward(e, &c_silu, &cc));

    for (int l = 0; l < c->depth; l++)
        TS_TRY(block_forward(m, l, B));
    return TS_OK;
}

int ts_dit_forward_trunk(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y,
                         int B, ts_tensor_t *x_final) {
    if (!x_final)
        return TS_EINVAL;
    TS_TRY(check_inputs(m, x, t, y, B));
    ts_tensor_t ids;
    TS_TRY(stage_labels(m, y, B, &ids));
    TS_TRY(trunk_ops(m, x, t, B));
    *x_final = rows(&m->acts.x_final, B);
    return TS_OK;
}

/* The final layer's device work, from the trunk's x_final to the unpatchified output (with
 * learn_sigma, both halves interleaved in out2). */
static int head_ops(ts_dit_t *m, int B) {
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    ts_dit_acts_t *A = &m->acts;
    const ts_dit_params_t *P = &m->params, *W = weights(m);
    ts_tensor_t c_silu = act16(m, rows(&A->c_silu, B)), xf = rows(&A->x_final, B);
    ts_tensor_t fmod = rows(&A->fmod, B), lnf = rows(&A->lnf, B);
    ts_tensor_t mf = stat_rows(&A->lnf_mean, B, ts_dit_tokens(c));
    ts_tensor_t rf = stat_rows(&A->lnf_rstd, B, ts_dit_tokens(c));
    ts_tensor_t fx = act16(m, rows(&A->fx, B)); /* the final linear's input */
    ts_tensor_t out_tok = rows(&A->out_tok, B);
    ts_tensor_t out = c->learn_sigma ? rows(&A->out2, B) : rows(&A->out, B);
    TS_TRY(ts_linear_forward(e, &fmod, &c_silu, &W->fada_w, &P->fada_b));
    TS_TRY(ts_layernorm_modulate_forward(e, &lnf, &mf, &rf, &fx, &xf, &fmod, 0, 1));
    TS_TRY(ts_linear_forward(e, &out_tok, &fx, &W->f_w, &P->f_b));
    return ts_unpatchify_forward(e, &out, &out_tok, c->patch_size);
}

/* learn_sigma: out2 (B, 2C, H, W) split into out (each sample's first C channels, the
 * prediction) and sigma (the other C). */
static int split_sigma(ts_dit_t *m, int B) {
    const ts_dit_config_t *c = &m->cfg;
    ts_dit_acts_t *A = &m->acts;
    ts_tensor_t out2 = rows(&A->out2, B), out = rows(&A->out, B), sig = rows(&A->sigma, B);
    ts_tensor_t pairs, src, dst;
    TS_TRY(ts_tensor_wrap(&pairs, out2.data, TS_F32, out2.device, 4,
                          TS_SHAPE(2 * (int64_t)B, c->in_channels, c->input_size, c->input_size)));
    for (int b = 0; b < B; b++)
        for (int half = 0; half < 2; half++) {
            TS_TRY(ts_tensor_slice(&src, &pairs, 2 * (int64_t)b + half, 1));
            TS_TRY(ts_tensor_slice(&dst, half ? &sig : &out, b, 1));
            TS_TRY(ts_tensor_copy(&dst, &src));
        }
    return TS_OK;
}

/* ---- the forward, and its CUDA graphs ------------------------------------------------------ */

void ts_dit_set_graphs(ts_dit_t *m, int on) {
    if (m) /* a trainable model's stay off: its trainer graphs the whole step */
        ts_graph_cache_set(&m->graphs, on && !m->trainable);
}

int ts_dit_forward_stage(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y,
                         int B) {
    TS_TRY(check_inputs(m, x, t, y, B));
    ts_tensor_t ids;
    return stage_labels(m, y, B, &ids);
}

typedef struct {
    ts_dit_t *m;
    const ts_tensor_t *x, *t;
    int B;
} forward_job_t;

/* The forward's device work after the labels are staged: the trunk and the head (a learned σ's
 * output is split after, by ts_tensor_copy, which no graph records). */
static int forward_work(void *ctx) {
    forward_job_t *j = ctx;
    TS_TRY(trunk_ops(j->m, j->x, j->t, j->B));
    return head_ops(j->m, j->B);
}

/* *v = the output of the forward just queued (its σ half split off first). */
static int forward_out(ts_dit_t *m, int B, ts_tensor_t *v) {
    if (m->cfg.learn_sigma)
        TS_TRY(split_sigma(m, B));
    *v = rows(&m->acts.out, B);
    return TS_OK;
}

int ts_dit_forward_queue(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, int B,
                         ts_tensor_t *v) {
    if (!m || !x || !t || !v || B < 1 || B > m->max_batch)
        return TS_EINVAL;
    forward_job_t j = {m, x, t, B};
    TS_TRY(forward_work(&j));
    return forward_out(m, B, v);
}

int ts_dit_forward(ts_dit_t *m, const ts_tensor_t *x, const ts_tensor_t *t, const int32_t *y, int B,
                   ts_tensor_t *v) {
    if (!v)
        return TS_EINVAL;
    TS_TRY(ts_dit_forward_stage(m, x, t, y, B));
    forward_job_t j = {m, x, t, B};
    ts_graph_key_t k = {{(uint64_t)B, (uint64_t)m->attn, (uint64_t)m->precision,
                         (uint64_t)m->lp_acts, (uint64_t)(uintptr_t)x->data,
                         (uint64_t)(uintptr_t)t->data, (uint64_t)(uintptr_t)m->param_lp.data,
                         (uint64_t)(uintptr_t)m->acts.x0.data}};
    TS_TRY(ts_graph_cache_run(m->eng, &m->graphs, &k, forward_work, &j)); /* off: eagerly */
    return forward_out(m, B, v);
}

int ts_dit_sigma(ts_dit_t *m, int B, ts_tensor_t *out) {
    if (!m || !out || !m->cfg.learn_sigma || B < 1 || B > m->max_batch)
        return TS_EINVAL;
    *out = rows(&m->acts.sigma, B);
    return TS_OK;
}

/* ---- backward -------------------------------------------------------------------------- */

/* Clears the first B rows of each listed scratch gradient. */
static int zero_rows(ts_engine_t *e, int B, ts_tensor_t **list, int n) {
    for (int i = 0; i < n; i++) {
        ts_tensor_t r = rows(list[i], B);
        TS_TRY(ts_zero(e, &r));
    }
    return TS_OK;
}

/* G->dout16's room as a (B, T, n) tensor of m's 16-bit dtype (n ≤ its last dimension). */
static ts_tensor_t dout16_room(const ts_dit_t *m, int B, int64_t n) {
    const ts_tensor_t *d = &m->gacts.dout16;
    ts_tensor_t v;
    if (n > d->shape[2] || ts_tensor_wrap(&v, d->data, ts_precision_dtype(m->precision), d->device,
                                          3, TS_SHAPE(B, d->shape[1], n)) != TS_OK)
        memset(&v, 0, sizeof v); /* an empty tensor: the next op reports TS_EINVAL */
    return v;
}

/* On entry G->dx holds dL/dx_out of block l; on exit dL/dx_in. Parameter gradients accumulate
 * into m->grads.blocks[l]; the adaLN input gradient into G->dc_silu. */
static int block_backward(ts_dit_t *m, int l, int B) {
    ts_engine_t *e = m->eng;
    const ts_dit_block_params_t *P = &weights(m)->blocks[l]; /* the forward's weights */
    ts_dit_block_params_t *D = &m->grads.blocks[l];
    ts_dit_block_acts_t *A = &m->acts.blocks[l];
    ts_dit_grad_acts_t *G = &m->gacts;
    int T = ts_dit_tokens(&m->cfg);
    ts_tensor_t *scratch[] = {&G->dmod,  &G->dfc2,  &G->dgelu, &G->dfc1,  &G->dmod2, &G->dln2,
                              &G->dproj, &G->datty, &G->dqkv,  &G->dmod1, &G->dln1};
    TS_TRY(zero_rows(e, B, scratch, (int)(sizeof scratch / sizeof scratch[0])));
    ts_tensor_t dx = rows(&G->dx, B), dmod = rows(&G->dmod, B), dc_silu = rows(&G->dc_silu, B);
    ts_tensor_t dfc2 = rows(&G->dfc2, B), dgelu = rows(&G->dgelu, B), dfc1 = rows(&G->dfc1, B);
    ts_tensor_t dmod2 = rows(&G->dmod2, B), dln2 = rows(&G->dln2, B), dproj = rows(&G->dproj, B);
    ts_tensor_t datty = rows(&G->datty, B), dqkv = rows(&G->dqkv, B);
    ts_tensor_t dmod1 = rows(&G->dmod1, B), dln1 = rows(&G->dln1, B);
    /* the linears' inputs as the forward wrote them: 16-bit, or fp32 */
    ts_tensor_t c_silu = act16(m, rows(&m->acts.c_silu, B)), mod = rows(&A->mod, B);
    ts_tensor_t x_in = rows(&A->x_in, B), ln1 = rows(&A->ln1, B);
    ts_tensor_t mod1 = act16(m, rows(&A->mod1, B));
    ts_tensor_t m1 = stat_rows(&A->ln1_mean, B, T), r1 = stat_rows(&A->ln1_rstd, B, T);
    ts_tensor_t atty = proj_input(m, A, B); /* as proj read it */
    ts_tensor_t proj = rows(&A->proj, B), x_mid = rows(&A->x_mid, B), ln2 = rows(&A->ln2, B);
    ts_tensor_t mod2 = act16(m, rows(&A->mod2, B));
    ts_tensor_t m2 = stat_rows(&A->ln2_mean, B, T), r2 = stat_rows(&A->ln2_rstd, B, T);
    ts_tensor_t fc1 = rows(&A->fc1, B), gelu = act16(m, rows(&A->gelu, B));
    ts_tensor_t fc2 = rows(&A->fc2, B);

    /* MLP branch. The residual's identity path is dx itself: it already holds dL/dx_out, which
     * is the direct part of dL/dx_mid, so only the branch's contribution is added to it. */
    if (gelu.dtype != TS_F32) { /* 16-bit activations: each dout rounded as it is written */
        ts_tensor_t dfc2_16 = dout16_room(m, B, dfc2.shape[2]);
        ts_tensor_t dfc1_16 = dout16_room(m, B, dfc1.shape[2]);
        TS_TRY(ts_gate_residual_backward_lp(e, NULL, &dfc2, &dfc2_16, &dmod, &dx, &fc2, &mod, 5));
        TS_TRY(ts_linear_backward_lp(e, &dgelu, &D->fc2_w, &D->fc2_b, &dfc2, &dfc2_16, &gelu,
                                     &P->fc2_w));
        TS_TRY(ts_gelu_backward_lp(e, &dfc1, &dfc1_16, &dgelu, &fc1));
        TS_TRY(ts_linear_backward_lp(e, &dmod2, &D->fc1_w, &D->fc1_b, &dfc1, &dfc1_16, &mod2,
                                     &P->fc1_w));
    } else {
        TS_TRY(ts_gate_residual_backward(e, NULL, &dfc2, &dmod, &dx, &fc2, &mod, 5));
        TS_TRY(ts_linear_backward(e, &dgelu, &D->fc2_w, &D->fc2_b, &dfc2, &gelu, &P->fc2_w));
        TS_TRY(ts_gelu_backward(e, &dfc1, &dgelu, &fc1));
        TS_TRY(ts_linear_backward(e, &dmod2, &D->fc1_w, &D->fc1_b, &dfc1, &mod2, &P->fc1_w));
    }
    TS_TRY(ts_modulate_backward(e, &dln2, &dmod, &dmod2, &ln2, &mod, 3, 4));
    TS_TRY(ts_layernorm_backward(e, &dx, &dln2, &x_mid, &m2, &r2));
    /* attention branch: dx now holds dL/dx_mid */
    if (atty.dtype != TS_F32) { /* proj's input in 16 bits (the attention wrote it): its dout
                                 * too, rounded as it is written */
        ts_tensor_t dproj16 = dout16_room(m, B, dproj.shape[2]);
        TS_TRY(ts_gate_residual_backward_lp(e, NULL, &dproj, &dproj16, &dmod, &dx, &proj, &mod, 2));
        TS_TRY(ts_linear_backward_lp(e, &datty, &D->proj_w, &D->proj_b, &dproj, &dproj16, &atty,
                                     &P->proj_w));
    } else {
        TS_TRY(ts_gate_residual_backward(e, NULL, &dproj, &dmod, &dx, &proj, &mod, 2));
        TS_TRY(ts_linear_backward(e, &datty, &D->proj_w, &D->proj_b, &dproj, &atty, &P->proj_w));
    }
    /* the flash attention with 16-bit activations writes qkv's dout rounded too */
    if (m->attn == TS_ATTN_FUSED && mod1.dtype != TS_F32) {
        ts_tensor_t dqkv16 = dout16_room(m, B, dqkv.shape[2]);
        TS_TRY(attention_backward(m, A, B, &dqkv16));
        TS_TRY(ts_linear_backward_lp(e, &dmod1, &D->qkv_w, &D->qkv_b, &dqkv, &dqkv16, &mod1,
                                     &P->qkv_w));
    } else {
        TS_TRY(attention_backward(m, A, B, NULL));
        TS_TRY(ts_linear_backward(e, &dmod1, &D->qkv_w, &D->qkv_b, &dqkv, &mod1, &P->qkv_w));
    }
    TS_TRY(ts_modulate_backward(e, &dln1, &dmod, &dmod1, &ln1, &mod, 0, 1));
    TS_TRY(ts_layernorm_backward(e, &dx, &dln1, &x_in, &m1, &r1));
    /* adaLN: all six chunks' gradients are in dmod */
    TS_TRY(ts_linear_backward(e, &dc_silu, &D->ada_w, &D->ada_b, &dmod, &c_silu, &P->ada_w));
    return TS_OK;
}

/* Clears the scratch gradients the trunk's backward accumulates into (dx, dc_silu and the
 * conditioning's), for B samples. */
static int zero_trunk_scratch(ts_dit_t *m, int B) {
    ts_dit_grad_acts_t *G = &m->gacts;
    ts_tensor_t *scratch[] = {&G->dx, &G->dc_silu, &G->dc, &G->dt_s, &G->dt_h};
    return zero_rows(m->eng, B, scratch, (int)(sizeof scratch / sizeof scratch[0]));
}

/* The trunk's backward: on entry G->dx holds dL/dx_final and G->dc_silu whatever the head above
 * the trunk contributed to dL/dSiLU(c) (the DiT's final adaLN; nothing for the classifier). */
static int trunk_backward(ts_dit_t *m, int B) {
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    ts_dit_acts_t *A = &m->acts;
    ts_dit_grad_acts_t *G = &m->gacts;
    const ts_dit_params_t *P = weights(m); /* the forward's weights */
    ts_dit_params_t *D = &m->grads;
    ts_tensor_t dx = rows(&G->dx, B), dc_silu = rows(&G->dc_silu, B), dc = rows(&G->dc, B);
    ts_tensor_t dt_s = rows(&G->dt_s, B), dt_h = rows(&G->dt_h, B), cc = rows(&A->c, B);
    ts_tensor_t patches = act16(m, rows(&A->patches, B)), t_s = act16(m, rows(&A->t_s, B));
    ts_tensor_t t_h = rows(&A->t_h, B), tfreq = act16(m, rows(&A->tfreq, B));
    ts_tensor_t ids = rows(&m->labels, B);
    for (int l = c->depth - 1; l >= 0; l--)
        TS_TRY(block_backward(m, l, B));
    /* patch embedding (the input image needs no gradient; pos_embed is fixed) */
    TS_TRY(ts_linear_backward(e, NULL, &D->x_w, &D->x_b, &dx, &patches, &P->x_w));
    /* conditioning */
    TS_TRY(ts_silu_backward(e, &dc, &dc_silu, &cc));
    TS_TRY(ts_embedding_backward_prechecked(e, &D->y_table, &dc, &ids)); /* as staged */
    TS_TRY(ts_linear_backward(e, &dt_s, &D->t_w2, &D->t_b2, &dc, &t_s, &P->t_w2));
    TS_TRY(ts_silu_backward(e, &dt_h, &dt_s, &t_h));
    TS_TRY(ts_linear_backward(e, NULL, &D->t_w0, &D->t_b0, &dt_h, &tfreq, &P->t_w0));
    return TS_OK;
}

int ts_dit_backward_trunk(ts_dit_t *m, const ts_tensor_t *dx_final, int B) {
    if (!m || !dx_final || !m->trainable || B < 1 || B > m->max_batch)
        return TS_EINVAL;
    ts_tensor_t xf = rows(&m->acts.x_final, B), dx = rows(&m->gacts.dx, B);
    if (!ts_tensor_same_shape(dx_final, &xf))
        return TS_ESHAPE;
    if (dx_final->data == m->gacts.dx.data)
        return TS_EINVAL; /* the scratch is cleared first */
    TS_TRY(zero_trunk_scratch(m, B));
    TS_TRY(ts_tensor_copy(&dx, dx_final));
    return trunk_backward(m, B);
}

int ts_dit_backward(ts_dit_t *m, const ts_tensor_t *dv, int B) {
    if (!m || !dv || !m->trainable || B < 1 || B > m->max_batch)
        return TS_EINVAL;
    const ts_dit_config_t *c = &m->cfg;
    ts_engine_t *e = m->eng;
    ts_dit_acts_t *A = &m->acts;
    ts_dit_grad_acts_t *G = &m->gacts;
    const ts_dit_params_t *P = weights(m); /* the forward's weights */
    ts_dit_params_t *D = &m->grads;
    int p = c->patch_size, T = ts_dit_tokens(c);
    ts_tensor_t out = rows(&A->out, B);
    if (!ts_tensor_same_shape(dv, &out))
        return TS_ESHAPE;
    ts_tensor_t *scratch[] = {&G->dout_tok, &G->dfx, &G->dlnf, &G->dfmod};
    TS_TRY(zero_rows(e, B, scratch, (int)(sizeof scratch / sizeof scratch[0])));
    TS_TRY(zero_trunk_scratch(m, B));
    ts_tensor_t dout_tok = rows(&G->dout_tok, B), dfx = rows(&G->dfx, B);
    ts_tensor_t dlnf = rows(&G->dlnf, B), dfmod = rows(&G->dfmod, B), dx = rows(&G->dx, B);
    ts_tensor_t dc_silu = rows(&G->dc_silu, B);
    ts_tensor_t xf = rows(&A->x_final, B), fmod = rows(&A->fmod, B), lnf = rows(&A->lnf, B);
    ts_tensor_t mf = stat_rows(&A->lnf_mean, B, T), rf = stat_rows(&A->lnf_rstd, B, T);
    ts_tensor_t fx = act16(m, rows(&A->fx, B)), c_silu = act16(m, rows(&A->c_silu, B));

    /* final layer: its adaLN adds into dc_silu, its LayerNorm gives dL/dx_final in dx */
    TS_TRY(ts_unpatchify_backward(e, &dout_tok, dv, p));
    TS_TRY(ts_linear_backward(e, &dfx, &D->f_w, &D->f_b, &dout_tok, &fx, &P->f_w));
    TS_TRY(ts_modulate_backward(e, &dlnf, &dfmod, &dfx, &lnf, &fmod, 0, 1));
    TS_TRY(ts_linear_backward(e, &dc_silu, &D->fada_w, &D->fada_b, &dfmod, &c_silu, &P->fada_w));
    TS_TRY(ts_layernorm_backward(e, &dx, &dlnf, &xf, &mf, &rf));
    return trunk_backward(m, B);
}

int ts_dit_zero_grad(ts_dit_t *m) {
    if (!m || !m->trainable)
        return TS_EINVAL;
    return ts_zero(m->eng, &m->grad_mem);
}

/* ---- memory, from the config -------------------------------------------------------------- */

/* The activations' arena for cfg at batch B (plan_acts in measuring mode: nothing allocated),
 * and with lp_rooms the 16-bit rooms' (plan_rooms) on top. */
static int measure_plan(const ts_dit_config_t *cfg, int trainable, ts_attn_impl_t a, int B,
                        int lp_rooms, uint64_t *peak) {
    ts_dit_t m;
    memset(&m, 0, sizeof m);
    m.cfg = *cfg;
    m.max_batch = B;
    m.trainable = trainable;
    m.acts.blocks = calloc((size_t)cfg->depth, sizeof *m.acts.blocks);
    ts_tensor_t *att16 = calloc((size_t)cfg->depth, sizeof *att16), dout16;
    if (!m.acts.blocks || !att16) {
        free(m.acts.blocks), free(att16);
        return TS_ENOMEM;
    }
    ts_arena_t ar, rooms;
    int rc = ts_arena_init(&ar, TS_CPU, 0);
    if (rc == TS_OK)
        rc = plan_acts(&m, &ar, a);
    if (rc == TS_OK)
        rc = ts_arena_init(&rooms, TS_CPU, 0);
    if (rc == TS_OK)
        rc = plan_rooms(&m, &rooms, a, lp_rooms, att16, &dout16);
    *peak = rc == TS_OK ? ar.peak + rooms.peak : 0;
    free(m.acts.blocks), free(att16);
    return rc;
}

static uint64_t round_up(uint64_t n) { return (n + TS_ALIGN - 1) / TS_ALIGN * TS_ALIGN; }

int ts_dit_memory(const ts_dit_config_t *cfg, ts_precision_t p, ts_attn_impl_t a,
                  ts_dit_memory_t *out) {
    if (!cfg || !out || (a != TS_ATTN_FUSED && a != TS_ATTN_COMPOSED))
        return TS_EINVAL;
    memset(out, 0, sizeof *out);
    TS_TRY(ts_dit_config_check(cfg));
    int n = 0;
    int64_t total = 0;
    ts_dit_param_info_t *info = NULL;
    TS_TRY(ts_dit_param_table(cfg, &info, &n, &total));
    free(info);
    uint64_t slab = round_up((uint64_t)total * 4u);
    uint64_t T = (uint64_t)ts_dit_tokens(cfg), h = (uint64_t)cfg->hidden_size;
    uint64_t H = (uint64_t)cfg->num_heads, r = (uint64_t)cfg->mlp_ratio * h;
    uint64_t chw = (uint64_t)cfg->in_channels * (uint64_t)cfg->input_size * cfg->input_size;
    out->params = slab;
    out->grads = slab;
    out->adamw = 2 * slab;
    out->ema = slab;
    /* the same bounds ts_dit_create applies, so what this sizes can be built: a model that may
     * be served but not trained (its training layout past the bounds) has can_train = 0 */
    uint64_t bound = 0;
    if ((uint64_t)total * 4u > TS_DIT_MAX_BYTES)
        return TS_ERANGE;
    TS_TRY(measure_plan(cfg, 0, TS_ATTN_COMPOSED, 1, 0, &bound));
    if (bound > TS_DIT_MAX_SAMPLE_BYTES)
        return TS_ERANGE;
    TS_TRY(measure_plan(cfg, 1, TS_ATTN_COMPOSED, 1, 0, &bound));
    out->can_train = bound <= TS_DIT_MAX_TRAIN_SAMPLE_BYTES &&
                     (uint64_t)total * 8u <= TS_DIT_MAX_BYTES && !cfg->learn_sigma;
    uint64_t pos = round_up(T * h * 4u);
    /* Per sample: the arena at 64 samples over 64, rounded up (at least the sum of every
     * tensor's bytes per sample); fixed: the arena of one sample, which covers each tensor's
     * rounding to TS_ALIGN. So fixed + B · per bounds the arena at any B from above, by at most
     * about one sample. */
    for (int trainable = 0; trainable < 1 + out->can_train; trainable++) {
        uint64_t one = 0, many = 0;
        TS_TRY(measure_plan(cfg, trainable, a, 1, p != TS_PREC_F32, &one));
        TS_TRY(measure_plan(cfg, trainable, a, 64, p != TS_PREC_F32, &many));
        uint64_t per = (many + 63u) / 64u, fixed = one;
        per += 4u + chw * 4u + 4u; /* a label, and the forward's inputs x and t */
        if (trainable)
            per += 5u * chw * 4u + 4u; /* the trainer's x0, eps, xt, target, dv and t */
        /* each allocation beside the arena rounds up to TS_ALIGN: the model's three and its
         * rooms' arena, the inputs' two and the trainer's eight */
        *(trainable ? &out->train_fixed : &out->infer_fixed) = fixed + pos + 17u * TS_ALIGN;
        *(trainable ? &out->train_per_sample : &out->infer_per_sample) = per;
    }
    if (p != TS_PREC_F32) {
        /* The 16-bit copy, and the products' operand buffer: both operands of the largest
         * product, as wide as fp32 (the CPU's f16 emulation widens them back; a GPU keeps them
         * in 16 bits: half of this), with the GPU buffer's quarter of slack. Per sample: a
         * linear's input and output rows (backward), two heads' spans of qkv (q·kᵀ), the
         * attention weights with v's span (p·v); fixed: the largest weight. */
        out->params_lp = round_up((uint64_t)total * 2u);
        uint64_t per = T * (r + h);
        per = 6u * T * h > per ? 6u * T * h : per;
        per = H * T * T + 3u * T * h > per ? H * T * T + 3u * T * h : per;
        uint64_t fixed = r * h > 6u * h * h ? r * h : 6u * h * h;
        out->infer_per_sample += per * 4u * 5u / 4u;
        out->train_per_sample += out->can_train ? per * 4u * 5u / 4u : 0;
        out->infer_fixed += fixed * 4u * 5u / 4u;
        out->train_fixed += out->can_train ? fixed * 4u * 5u / 4u : 0;
    }
    return TS_OK;
}

uint64_t ts_dit_memory_total(const ts_dit_memory_t *mem, int training, int batch) {
    if (!mem || batch < 0)
        return 0;
    uint64_t b = (uint64_t)batch;
    if (!training)
        return mem->params + mem->params_lp + mem->infer_fixed + b * mem->infer_per_sample;
    if (!mem->can_train)
        return UINT64_MAX; /* no trainable model of this config can be built */
    return mem->params + mem->params_lp + mem->grads + mem->adamw + mem->ema + mem->train_fixed +
           b * mem->train_per_sample;
}

int ts_dit_memory_max_batch(const ts_dit_memory_t *mem, int training, uint64_t budget, int cap) {
    if (!mem || cap < 1 || (training && !mem->can_train))
        return 0;
    uint64_t base = ts_dit_memory_total(mem, training, 0);
    uint64_t per = training ? mem->train_per_sample : mem->infer_per_sample;
    if (budget <= base || per == 0)
        return budget > base ? cap : 0;
    uint64_t n = (budget - base) / per;
    return n > (uint64_t)cap ? cap : (int)n;
}

double ts_dit_flops_per_sample(const ts_dit_config_t *c) {
    double T = ts_dit_tokens(c), h = c->hidden_size, r = (double)c->mlp_ratio * h;
    double F = (double)c->in_channels * c->patch_size * c->patch_size;
    double block = T * (h * 3 * h + h * h + 2 * h * r) /* qkv, proj, fc1, fc2 */
                   + 2 * T * T * h                     /* QKᵀ and PV over all heads */
                   + 6 * h * h;                        /* adaLN */
    double macs = T * F * h + c->freq_dim * h + h * h + c->depth * block + 2 * h * h + T * h * F;
    return 2.0 * macs;
}
