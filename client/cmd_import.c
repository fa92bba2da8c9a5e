/*
 * cmd_import.c — `tessera import CHECKPOINT.pt --out EXPERT.safetensors`: a DiT checkpoint of
 * facebookresearch/DiT (or any state dict under DiT's parameter names) into tessera's expert
 * file.
 *
 * The .pt file is read without PyTorch (model/torch_pt.h: no code in it runs). The state dict is
 * found under the names themselves, or under a prefix ("ema." first, then "model.", or
 * --prefix: a training checkpoint holds both); "module." (DataParallel) is taken off. The
 * config comes from the tensors' shapes — hidden size, channels and patch from the patch
 * embedding, depth from the blocks, classes from the label table (its last row the null
 * class), learned σ from the final layer (2C channels) — and the image side from pos_embed
 * (or --input-size); the heads, which no shape holds, from DiT's family (S 6, B 12, L and
 * XL 16) or --heads. Every tensor must be one of the model's with exactly its shape and finite
 * values, and pos_embed DiT's fixed sin-cos table; anything else is refused, naming it. The
 * expert is written with objective epsilon (DiT's; --objective) and, with --vae FILE, the latent
 * space of that VAE (model/latents.h); --partition DIR --cluster K make it an expert a node can
 * host for that partition.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "client/args.h"
#include "client/cli.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "model/dit.h"
#include "model/dit_io.h"
#include "model/latents.h"
#include "model/objective.h"
#include "model/partition.h"
#include "model/safetensors.h"
#include "model/torch_pt.h"

#define PROG "tessera import"

typedef struct {
    const char *in, *out, *prefix, *objective, *vae, *partition, *dtype;
    int input_size, heads, cluster, json, quiet;
} import_opts_t;

typedef struct {
    import_opts_t o;
    ts_pt_file_t pt;
    char prefix[256]; /* the state dict's, with its trailing '.' ("" at the top) */
    ts_dit_config_t cfg;
    ts_engine_t eng;
    int have_eng, have_model;
    ts_dit_t model;
    char err[1024];
    int usage;
} import_run_t;

/* A tensor of the state dict by its DiT name (the prefix and "module." tried). */
static const ts_pt_tensor_t *find(const import_run_t *r, const char *name) {
    char full[1024];
    snprintf(full, sizeof full, "%s%s", r->prefix, name);
    const ts_pt_tensor_t *t = ts_pt_find(&r->pt, full);
    if (!t) {
        snprintf(full, sizeof full, "%smodule.%s", r->prefix, name);
        t = ts_pt_find(&r->pt, full);
    }
    return t;
}

/* The prefix under which the state dict lies: --prefix, else the top, "ema.", "model.", or the
 * only one there is. */
static int choose_prefix(import_run_t *r) {
    static const char *key = "x_embedder.proj.weight";
    const char *found[8];
    int n = 0;
    size_t kl = strlen(key);
    for (int i = 0; i < r->pt.n && n < 8; i++) {
        const char *nm = r->pt.t[i].name;
        size_t l = strlen(nm);
        if (l >= kl && strcmp(nm + l - kl, key) == 0)
            found[n++] = nm;
    }
    if (r->o.prefix) {
        snprintf(r->prefix, sizeof r->prefix, "%s%s", r->o.prefix,
                 *r->o.prefix && r->o.prefix[strlen(r->o.prefix) - 1] != '.' ? "." : "");
        if (find(r, key))
            return TS_OK;
        return ts_fail(r->err, sizeof r->err, TS_ENOTFOUND, "no %s%s in %s", r->prefix, key,
                       r->o.in);
    }
    static const char *prefer[] = {"", "ema.", "model.", "state_dict."};
    for (size_t p = 0; p < sizeof prefer / sizeof prefer[0]; p++) {
        snprintf(r->prefix, sizeof r->prefix, "%s", prefer[p]);
        if (find(r, key))
            return TS_OK;
    }
    if (n == 1) {
        size_t l = strlen(found[0]) - kl;
        if (l >= 7 && strncmp(found[0] + l - 7, "module.", 7) == 0)
            l -= 7;
        snprintf(r->prefix, sizeof r->prefix, "%.*s", (int)l, found[0]);
        return TS_OK;
    }
    if (n == 0)
        return ts_fail(r->err, sizeof r->err, TS_EKIND,
                       "%s holds no DiT state dict (no tensor named ...x_embedder.proj.weight "
                       "among its %d)",
                       r->o.in, r->pt.n);
    r->usage = 1;
    return ts_fail(r->err, sizeof r->err, TS_EINVAL,
                   "%s holds %d state dicts (%s, %s, ...): name one with --prefix", r->o.in, n,
                   found[0], found[1]);
}

static int dims_are(const ts_pt_tensor_t *t, int ndim) { return t && t->ndim == ndim; }

/* DiT's heads for its hidden sizes (S, B, L and XL); 0 for another. */
static int family_heads(int hidden) {
    return hidden == 384 ? 6 : hidden == 768 ? 12 : hidden == 1024 || hidden == 1152 ? 16 : 0;
}

/* The config from the shapes (module comment). */
static int infer_config(import_run_t *r) {
    char *err = r->err;
    size_t errlen = sizeof r->err;
    const ts_pt_tensor_t *x = find(r, "x_embedder.proj.weight"),
                         *y = find(r, "y_embedder.embedding_table.weight"),
                         *t0 = find(r, "t_embedder.mlp.0.weight"),
                         *fl = find(r, "final_layer.linear.weight"),
                         *fc1 = find(r, "blocks.0.mlp.fc1.weight"), *pe = find(r, "pos_embed");
    if (!dims_are(x, 4) || x->shape[2] != x->shape[3])
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "x_embedder.proj.weight is not a square convolution (hidden, C, p, p)");
    if (!dims_are(y, 2) || !dims_are(t0, 2) || !dims_are(fl, 2) || !dims_are(fc1, 2))
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "a DiT tensor is missing or not 2-D: y_embedder.embedding_table.weight, "
                       "t_embedder.mlp.0.weight, final_layer.linear.weight, "
                       "blocks.0.mlp.fc1.weight");
    ts_dit_config_t *c = &r->cfg;
    memset(c, 0, sizeof *c);
    c->hidden_size = (int)x->shape[0], c->in_channels = (int)x->shape[1];
    c->patch_size = (int)x->shape[2];
    c->num_classes = (int)y->shape[0] - 1; /* DiT's table: the classes, then the null label */
    c->freq_dim = (int)t0->shape[1];
    c->mlp_ratio = c->hidden_size ? (int)(fc1->shape[0] / c->hidden_size) : 0;
    while (c->depth < TS_DIT_MAX_DEPTH) {
        char name[64];
        snprintf(name, sizeof name, "blocks.%d.attn.qkv.weight", c->depth);
        if (!find(r, name))
            break;
        c->depth++;
    }
    int64_t pp = (int64_t)c->patch_size * c->patch_size * c->in_channels;
    if (fl->shape[0] == 2 * pp)
        c->learn_sigma = 1;
    else if (fl->shape[0] != pp)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "final_layer.linear.weight has %lld outputs: neither p·p·C = %lld nor, "
                       "with a learned σ, %lld",
                       (long long)fl->shape[0], (long long)pp, (long long)(2 * pp));
    if (r->o.input_size) {
        c->input_size = r->o.input_size;
    } else if (dims_are(pe, 3)) {
        int g = (int)llround(sqrt((double)pe->shape[1]));
        if ((int64_t)g * g != pe->shape[1])
            return ts_fail(err, errlen, TS_ECORRUPT, "pos_embed's %lld tokens are not a square",
                           (long long)pe->shape[1]);
        c->input_size = g * c->patch_size;
    } else {
        r->usage = 1;
        return ts_fail(err, errlen, TS_EINVAL,
                       "no pos_embed to tell the image side: pass --input-size N (DiT at 256×256: "
                       "32, its latents' side)");
    }
    c->num_heads = r->o.heads ? r->o.heads : family_heads(c->hidden_size);
    if (!c->num_heads) {
        r->usage = 1;
        return ts_fail(err, errlen, TS_EINVAL,
                       "hidden size %d is not one of DiT's family (384, 768, 1024, 1152): pass "
                       "--heads N",
                       c->hidden_size);
    }
    int rc = ts_dit_config_check(c);
    if (rc != TS_OK)
        return ts_fail(err, errlen, TS_ECORRUPT,
                       "the shapes give no valid DiT (input %d, patch %d, channels %d, hidden %d, "
                       "depth %d, heads %d, classes %d): %s",
                       c->input_size, c->patch_size, c->in_channels, c->hidden_size, c->depth,
                       c->num_heads, c->num_classes, ts_strerror(rc));
    return TS_OK;
}

/* Every parameter from the state dict into the model's slab; strict both ways. */
static int copy_weights(import_run_t *r) {
    char *err = r->err;
    size_t errlen = sizeof r->err;
    ts_dit_t *m = &r->model;
    float *slab = m->param_mem.data;
    size_t pl = strlen(r->prefix);
    for (int i = 0; i < m->n_params; i++) {
        const ts_dit_param_info_t *pi = &m->info[i];
        const ts_pt_tensor_t *t = find(r, pi->name);
        if (!t)
            return ts_fail(err, errlen, TS_ECORRUPT, "%s%s is missing", r->prefix, pi->name);
        int same = t->ndim == pi->ndim;
        for (int d = 0; same && d < pi->ndim; d++)
            same = t->shape[d] == pi->shape[d];
        if (!same)
            return ts_fail(err, errlen, TS_ECORRUPT,
                           "%s%s has another shape than the model's (%d dims; the config "
                           "inferred: hidden %d, depth %d, patch %d, channels %d)",
                           r->prefix, pi->name, t->ndim, r->cfg.hidden_size, r->cfg.depth,
                           r->cfg.patch_size, r->cfg.in_channels);
        if (t->dtype == TS_PT_OTHER)
            return ts_fail(err, errlen, TS_ECORRUPT, "%s%s is not floating point (%s)", r->prefix,
                           pi->name, t->storage_type);
        float *dst = slab + pi->offset;
        TS_TRY(ts_pt_to_f32(t, dst));
        for (int64_t k = 0; k < pi->numel; k++)
            if (!isfinite(dst[k]))
                return ts_fail(err, errlen, TS_ENONFINITE, "%s%s: element %lld is not finite",
                               r->prefix, pi->name, (long long)k);
    }
    /* nothing else under the prefix but pos_embed, which must be DiT's table */
    for (int i = 0; i < r->pt.n; i++) {
        const char *nm = r->pt.t[i].name;
        if (strncmp(nm, r->prefix, pl) != 0)
            continue;
        const char *rest = nm + pl;
        if (strncmp(rest, "module.", 7) == 0)
            rest += 7;
        if (strcmp(rest, "pos_embed") == 0) {
            const ts_pt_tensor_t *t = &r->pt.t[i];
            int64_t n = ts_pt_numel(t), T = ts_dit_tokens(&r->cfg);
            if (n != T * r->cfg.hidden_size || t->dtype == TS_PT_OTHER)
                return ts_fail(err, errlen, TS_ECORRUPT, "pos_embed is not (1, %lld, %d)",
                               (long long)T, r->cfg.hidden_size);
            float *pe = malloc((size_t)n * sizeof *pe);
            int rc = !pe ? TS_ENOMEM : ts_pt_to_f32(t, pe);
            if (rc == TS_OK) /* half an ulp more for a 16-bit table, as the loader allows */
                rc = ts_dit_check_pos_embed(m, pe,
                                            t->dtype == TS_PT_BF16  ? 0x1p-8
                                            : t->dtype == TS_PT_F16 ? 0x1p-11
                                                                    : 0.0,
                                            err, errlen);
            free(pe);
            if (rc != TS_OK)
                return rc;
            continue;
        }
        if (!ts_dit_param_find(m, rest))
            return ts_fail(err, errlen, TS_ECORRUPT,
                           "%s is not a parameter of the DiT (a model of another architecture, "
                           "or a newer DiT variant)",
                           nm);
    }
    return TS_OK;
}

static int parse_opts(int argc, char **argv, import_opts_t *o) {
    *o = (import_opts_t){.objective = "epsilon", .dtype = "f32", .cluster = -1};
    /* clang-format off */
    ts_arg_t args[] = {
        {"out", TS_ARG_STRING, &o->out, "FILE", "the expert to write (safetensors)", 0, 0, 1},
        {"prefix", TS_ARG_STRING, &o->prefix, "NAME", "the state dict's key in a checkpoint holding several (default: the top, else ema, else model)"},
        {"input-size", TS_ARG_INT, &o->input_size, "N", "the image (latent) side, when the file has no pos_embed", 1, 4096},
        {"heads", TS_ARG_INT, &o->heads, "N", "attention heads (default: DiT's family by hidden size)", 1, 1024},
        {"objective", TS_ARG_STRING, &o->objective, "NAME", "what the model predicts: epsilon (DiT's, default), v_prediction, x0 or velocity"},
        {"vae", TS_ARG_STRING, &o->vae, "FILE", "the VAE whose latents the model works on (sd-vae-ft-mse or -ema): its latent space goes into the file"},
        {"partition", TS_ARG_STRING, &o->partition, "DIR", "a `tessera partition` folder: the expert serves cluster --cluster of it"},
        {"cluster", TS_ARG_INT, &o->cluster, "K", "with --partition", 0, 1000000},
        {"dtype", TS_ARG_STRING, &o->dtype, "NAME", "the file's dtype: f32 (default), bf16 or f16"},
        {"quiet", TS_ARG_FLAG, &o->quiet, NULL, "no summary on stderr"},
        {"json", TS_ARG_FLAG, &o->json, NULL, "print the summary as one JSON object on stdout"},
    };
    /* clang-format on */
    if (argc >= 2 && argv[1][0] != '-') { /* the checkpoint comes first */
        o->in = argv[1];
        argv[1] = argv[0];
        argc--, argv++;
    }
    int pr = ts_args_parse(
        PROG " CHECKPOINT.pt",
        "Convert a DiT checkpoint (facebookresearch/DiT's .pt, read without PyTorch) into a "
        "tessera expert.\nexample: tessera import DiT-XL-2-256x256.pt --vae "
        "sd-vae-ft-ema.safetensors --out dit-xl-256.safetensors",
        args, (int)(sizeof args / sizeof args[0]), argc, argv);
    if (pr != TS_ARGS_RUN)
        return pr;
    ts_objective_t obj;
    if (!o->in)
        fprintf(stderr, PROG ": which checkpoint? usage: " PROG " CHECKPOINT.pt --out FILE\n");
    else if (ts_objective_parse(o->objective, &obj) != TS_OK)
        fprintf(stderr, PROG ": --objective %s: must be epsilon, v_prediction, x0 or velocity\n",
                o->objective);
    else if ((o->partition != NULL) != (o->cluster >= 0))
        fprintf(stderr, PROG ": --partition and --cluster go together\n");
    else if (strcmp(o->dtype, "f32") != 0 && strcmp(o->dtype, "bf16") != 0 &&
             strcmp(o->dtype, "f16") != 0)
        fprintf(stderr, PROG ": --dtype %s: must be f32, bf16 or f16\n", o->dtype);
    else
        return TS_ARGS_RUN;
    return 2;
}

/* The expert file: the weights and their metadata. */
static int write_expert(import_run_t *r, int64_t *params) {
    const import_opts_t *o = &r->o;
    char space[TS_LATENT_SPACE_HEX] = "", pid[65] = "", cluster[16], src[65];
    const char *base = strrchr(o->in, '/') ? strrchr(o->in, '/') + 1 : o->in;
    int rc = o->vae ? ts_latent_space_of(o->vae, space, r->err, sizeof r->err) : TS_OK;
    if (rc == TS_OK)
        rc = ts_file_blake2b(o->in, src, r->err, sizeof r->err);
    if (rc == TS_OK && o->partition) {
        char path[4096];
        ts_partition_t part;
        snprintf(path, sizeof path, "%s/partition.safetensors", o->partition);
        rc = ts_partition_load(path, &part, r->err, sizeof r->err);
        if (rc == TS_OK && o->cluster >= part.K)
            rc = ts_fail(r->err, sizeof r->err, TS_EINVAL, "cluster %d: %s has clusters 0..%d",
                         o->cluster, path, part.K - 1);
        if (rc == TS_OK)
            memcpy(pid, part.id, sizeof pid);
        if (rc == TS_OK || rc == TS_EINVAL)
            ts_partition_free(&part);
    }
    snprintf(cluster, sizeof cluster, "%d", o->cluster);
    const char *kv[16] = {"objective", o->objective, "weights",        "imported",
                          "source",    base,         "source_blake2b", src};
    int n = 4;
    if (space[0])
        kv[2 * n] = TS_LATENT_SPACE_KEY, kv[2 * n + 1] = space, n++;
    if (pid[0]) {
        kv[2 * n] = "partition_id", kv[2 * n + 1] = pid, n++;
        kv[2 * n] = "cluster", kv[2 * n + 1] = cluster, n++;
    }
    ts_st_dtype_t dt = strcmp(o->dtype, "bf16") == 0  ? TS_ST_BF16
                       : strcmp(o->dtype, "f16") == 0 ? TS_ST_F16
                                                      : TS_ST_F32;
    if (rc == TS_OK)
        rc = ts_dit_save(&r->model, &r->model.param_mem, o->out, dt, kv, n, r->err, sizeof r->err);
    *params = r->model.num_params;
    return rc;
}

int ts_cmd_import(int argc, char **argv) {
    import_run_t *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    int pr = parse_opts(argc, argv, &r->o);
    if (pr != TS_ARGS_RUN) {
        free(r);
        return pr;
    }
    const import_opts_t *o = &r->o;
    int64_t params = 0;
    ts_device_spec_t cpu = {.device = TS_CPU};
    int rc = ts_pt_open(o->in, &r->pt, r->err, sizeof r->err);
    if (rc == TS_OK)
        rc = choose_prefix(r);
    if (rc == TS_OK)
        rc = infer_config(r);
    if (rc == TS_OK && (rc = ts_cli_engine(&r->eng, &cpu, 1, NULL, r->err, sizeof r->err)) == TS_OK)
        r->have_eng = 1;
    if (rc == TS_OK) {
        rc = ts_dit_create(&r->model, &r->cfg, &r->eng, 1, 0);
        r->have_model = rc == TS_OK;
        if (rc != TS_OK)
            ts_set_err(r->err, sizeof r->err, "cannot build the DiT (%d parameters' worth): %s",
                       r->cfg.hidden_size, ts_strerror(rc));
    }
    if (rc == TS_OK)
        rc = copy_weights(r);
    if (rc == TS_OK)
        rc = write_expert(r, &params);
    if (rc == TS_OK && !o->quiet) {
        const ts_dit_config_t *c = &r->cfg;
        fprintf(stderr,
                PROG ": %s%s%s → %s: DiT of %lld parameters (hidden %d, depth %d, heads %d, "
                     "patch %d, %d×%d×%d, %d classes and the null label, learned σ %s), "
                     "objective %s%s\n",
                o->in, *r->prefix ? " under " : "", r->prefix, o->out, (long long)params,
                c->hidden_size, c->depth, c->num_heads, c->patch_size, c->in_channels,
                c->input_size, c->input_size, c->num_classes, c->learn_sigma ? "yes" : "no",
                o->objective, o->vae ? ", latents of the VAE given" : "");
    }
    if (rc == TS_OK && o->json) {
        const ts_dit_config_t *c = &r->cfg;
        ts_json_print(json_pack(
            "{s:s, s:s, s:s, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:s}", "in", o->in, "out",
            o->out, "prefix", r->prefix, "params", (json_int_t)params, "input_size", c->input_size,
            "in_channels", c->in_channels, "patch_size", c->patch_size, "hidden_size",
            c->hidden_size, "depth", c->depth, "num_heads", c->num_heads, "num_classes",
            c->num_classes, "learn_sigma", c->learn_sigma, "objective", o->objective));
    }
    if (rc != TS_OK)
        ts_args_fail(PROG, r->err, rc);
    int code = rc == TS_OK ? 0 : r->usage ? 2 : 1;
    if (r->have_model)
        ts_dit_free(&r->model);
    if (r->have_eng)
        ts_engine_free(&r->eng);
    ts_pt_close(&r->pt);
    free(r);
    return code;
}
