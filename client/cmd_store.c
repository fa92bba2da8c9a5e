/*
 * cmd_store.c — `tessera store`: the weights in the local store (store/weights.h).
 *
 *   tessera store ls                 the experts held, one line each
 *   tessera store import FILE        add a safetensors file; prints its weights hash
 *   tessera store export HASH FILE   write it back out, byte-identical
 *   tessera store verify             check every chunk of every expert (exit 1 if any is bad)
 *   tessera store gc                 delete chunks no expert references
 *   tessera store du                 space used, unique against logical bytes
 *   tessera store rm HASH            forget an expert (and gc)
 *   tessera store pin|unpin HASH     pinned experts are never evicted
 *   tessera store evict --budget N   drop least recently used unpinned experts down to N bytes
 *
 * HASH may be a unique prefix of at least 8 hex digits. Every sub-verb takes --data-dir DIR (the
 * store; default $XDG_DATA_HOME/tessera), --map-size BYTES (the initial LMDB map; it grows as
 * needed) and --json (one JSON document on stdout instead of text). Operands are picked out of
 * argv before the options are parsed, so they may come before or after them.
 */
#define _POSIX_C_SOURCE 200809L

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client/args.h"
#include "client/commands.h"
#include "client/jsonout.h"
#include "store/weights.h"

#define MAX_OPERANDS 2

typedef struct cli cli_t;

typedef struct verb {
    const char *name;
    const char *operands; /* shown in usage: "FILE", "HASH FILE", "" */
    int n_operands;
    const char *summary;
    int (*run)(cli_t *c);
} verb_t;

struct cli {
    const verb_t *verb;
    char prog[64]; /* "tessera store import" */
    const char *op[MAX_OPERANDS];
    int n_ops; /* operands given (more than MAX_OPERANDS are counted, not kept) */
    int json, pin;
    const char *data_dir, *map_size, *budget;
    uint64_t budget_bytes;
    ts_store_t *s;
};

/* ---- output helpers ------------------------------------------------------------------------ */

/* "18.3 MiB" */
static const char *human(uint64_t bytes, char *buf, size_t len) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 4)
        v /= 1024, u++;
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

static void when(int64_t t, char *buf, size_t len) {
    time_t tt = (time_t)t;
    struct tm tm;
    if (t <= 0 || !localtime_r(&tt, &tm) || strftime(buf, len, "%Y-%m-%d %H:%M", &tm) == 0)
        snprintf(buf, len, "-");
}

static int fail(const cli_t *c, int rc, const char *err) { return ts_args_fail(c->prog, err, rc); }

/* Parses "1048576", "512M", "1.5G", "64KiB" (binary multiples). */
static int parse_bytes(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || !isfinite(v) || v < 0)
        return TS_EINVAL;
    double mult = 1;
    switch (*end) {
    case 'k':
    case 'K': mult = 1024.0, end++; break;
    case 'm':
    case 'M': mult = 1024.0 * 1024, end++; break;
    case 'g':
    case 'G': mult = 1024.0 * 1024 * 1024, end++; break;
    case 't':
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024, end++; break;
    default: break;
    }
    if (mult > 1 && strcmp(end, "iB") == 0)
        end += 2;
    else if (strcmp(end, "B") == 0)
        end++;
    if (*end || v * mult > 0x1p62)
        return TS_EINVAL;
    *out = (uint64_t)(v * mult);
    return TS_OK;
}

/* The expert named by an operand (a hash or a unique prefix). */
static int resolve(cli_t *c, const char *text, ts_hash_t *h) {
    char err[256] = "";
    int rc = ts_weights_resolve(c->s, text, h, err, sizeof err);
    if (rc)
        fprintf(stderr, "%s: %s\n", c->prog, err);
    return rc;
}

static json_t *info_json(const ts_weights_info_t *info) {
    char hex[TS_HASH_HEX], desc[64];
    ts_hash_hex(&info->hash, hex);
    ts_weights_describe(info, desc, sizeof desc);
    json_t *meta = json_object();
    for (int i = 0; meta && i < info->n_meta; i++)
        json_object_set_new(meta, info->meta_keys[i], json_string(info->meta_vals[i]));
    return json_pack("{s:s, s:I, s:I, s:i, s:s, s:o, s:b, s:I, s:I, s:I}", "hash", hex, "size",
                     (json_int_t)info->size, "chunks", (json_int_t)info->n_chunks, "tensors",
                     info->n_tensors, "config", desc, "metadata", meta ? meta : json_object(),
                     "pinned", info->pinned, "lru", (json_int_t)info->lru, "last_used",
                     (json_int_t)info->last_used, "imported", (json_int_t)info->imported);
}

/* ---- ls ------------------------------------------------------------------------------------ */

typedef struct {
    cli_t *c;
    json_t *arr;
    int n;
} ls_t;

static int ls_one(void *ctx, const ts_weights_info_t *info) {
    ls_t *l = ctx;
    if (l->arr)
        return json_array_append_new(l->arr, info_json(info)) == 0 ? TS_OK : TS_ENOMEM;
    char hex[TS_HASH_HEX], size[32], desc[64], used[32];
    ts_hash_hex(&info->hash, hex);
    ts_weights_describe(info, desc, sizeof desc);
    when(info->last_used, used, sizeof used);
    if (l->n++ == 0)
        printf("%-16s  %10s  %7s  %-24s  %-6s  %s\n", "HASH", "SIZE", "TENSORS", "CONFIG", "PINNED",
               "LAST USED");
    printf("%.16s  %10s  %7d  %-24s  %-6s  %s\n", hex, human(info->size, size, sizeof size),
           info->n_tensors, desc, info->pinned ? "yes" : "no", used);
    return TS_OK;
}

static int run_ls(cli_t *c) {
    ls_t l = {c, c->json ? json_array() : NULL, 0};
    int rc = ts_weights_list(c->s, ls_one, &l);
    if (rc) {
        json_decref(l.arr);
        return fail(c, rc,
                    rc == TS_ECORRUPT ? "a manifest is damaged (tessera store verify names it, "
                                        "tessera store rm HASH removes it)"
                                      : "listing the weights failed");
    }
    if (c->json)
        ts_json_print(l.arr);
    else if (l.n == 0)
        fprintf(stderr, "no weights in %s (tessera store import FILE adds some)\n",
                ts_store_dir(c->s));
    return 0;
}

/* ---- import, export ------------------------------------------------------------------------ */

static void on_progress(void *ctx, uint64_t done, uint64_t total) {
    const char *path = ctx;
    fprintf(stderr, "\rimporting %s: %.1f / %.1f MiB   ", path, (double)done / (1 << 20),
            (double)total / (1 << 20));
}

static int print_info(void *ctx, const ts_weights_info_t *info) {
    const cli_t *c = ctx;
    char hex[TS_HASH_HEX], size[32], desc[64];
    ts_hash_hex(&info->hash, hex);
    if (c->json) {
        ts_json_print(info_json(info));
        return TS_OK;
    }
    ts_weights_describe(info, desc, sizeof desc);
    fprintf(stderr, "%s: %s, %llu chunks, %d tensors, %s%s\n", c->op[0],
            human(info->size, size, sizeof size), (unsigned long long)info->n_chunks,
            info->n_tensors, desc, info->pinned ? ", pinned" : "");
    printf("%s\n", hex);
    return TS_OK;
}

static int run_import(cli_t *c) {
    char err[512] = "";
    ts_hash_t h;
    int tty = isatty(STDERR_FILENO);
    int rc = ts_weights_import_file(c->s, c->op[0], &h, tty ? on_progress : NULL, (void *)c->op[0],
                                    err, sizeof err);
    if (tty)
        fprintf(stderr, "\r\033[K");
    if (rc == TS_OK && c->pin && (rc = ts_weights_pin(c->s, &h, 1)) != TS_OK)
        snprintf(err, sizeof err, "pinning the imported weights failed");
    if (rc == TS_OK)
        rc = ts_weights_info(c->s, &h, print_info, c);
    return rc ? fail(c, rc, err) : 0;
}

static int run_export(cli_t *c) {
    ts_hash_t h;
    if (resolve(c, c->op[0], &h))
        return 1;
    char err[512] = "", hex[TS_HASH_HEX];
    int rc = ts_weights_export(c->s, &h, c->op[1], err, sizeof err);
    if (rc)
        return fail(c, rc, err);
    ts_hash_hex(&h, hex);
    struct stat st;
    long long size = stat(c->op[1], &st) == 0 ? (long long)st.st_size : -1;
    if (c->json)
        ts_json_print(
            json_pack("{s:s, s:s, s:I}", "hash", hex, "path", c->op[1], "size", (json_int_t)size));
    else
        fprintf(stderr, "wrote %s (%lld bytes, weights %.16s)\n", c->op[1], size, hex);
    return 0;
}

/* ---- verify -------------------------------------------------------------------------------- */

typedef struct {
    cli_t *c;
    json_t *arr;
} verify_out_t;

static void on_problem(void *ctx, const ts_weights_problem_t *p) {
    verify_out_t *v = ctx;
    char w[TS_HASH_HEX], ch[TS_HASH_HEX];
    ts_hash_hex(&p->weights, w);
    ts_hash_hex(&p->chunk_hash, ch);
    if (v->arr) {
        json_t *o = json_pack("{s:s, s:I, s:s}", "weights", w, "chunk", (json_int_t)p->chunk,
                              "what", p->what);
        if (o && p->chunk >= 0)
            json_object_set_new(o, "chunk_hash", json_string(ch));
        json_array_append_new(v->arr, o);
    } else if (p->chunk >= 0) {
        printf("weights %.16s: %s (chunk hash %s)\n", w, p->what, ch);
    } else {
        printf("weights %.16s: %s\n", w, p->what);
    }
}

static int run_verify(cli_t *c) {
    verify_out_t v = {c, c->json ? json_array() : NULL};
    ts_weights_verify_stats_t st;
    int n = ts_weights_verify(c->s, on_problem, &v, &st);
    if (n < 0) {
        json_decref(v.arr);
        return fail(c, n, "verifying the store failed");
    }
    char b[32];
    if (c->json)
        ts_json_print(json_pack("{s:b, s:I, s:I, s:I, s:o}", "ok", n == 0, "manifests",
                                (json_int_t)st.manifests, "chunks", (json_int_t)st.chunks, "bytes",
                                (json_int_t)st.bytes, "problems", v.arr));
    else if (n == 0)
        printf("ok: %llu manifests, %llu chunks, %s verified\n", (unsigned long long)st.manifests,
               (unsigned long long)st.chunks, human(st.bytes, b, sizeof b));
    else
        printf("%d problem%s in %llu manifests: import the files again, or fetch the chunks; "
               "tessera store rm HASH forgets an expert\n",
               n, n == 1 ? "" : "s", (unsigned long long)st.manifests);
    return n == 0 ? 0 : 1;
}

/* ---- gc, du, rm ---------------------------------------------------------------------------- */

static int report_gc(const cli_t *c, const ts_weights_gc_t *g, const char *hex) {
    char b[32];
    if (c->json) {
        json_t *o = json_pack("{s:I, s:I}", "freed_chunks", (json_int_t)g->chunks, "freed_bytes",
                              (json_int_t)g->bytes);
        if (o && hex)
            json_object_set_new(o, "removed", json_string(hex));
        ts_json_print(o);
    } else {
        if (hex)
            printf("removed %s\n", hex);
        printf("freed %llu chunk%s (%s)\n", (unsigned long long)g->chunks,
               g->chunks == 1 ? "" : "s", human(g->bytes, b, sizeof b));
    }
    return 0;
}

static int run_gc(cli_t *c) {
    ts_weights_gc_t g;
    int rc = ts_weights_gc(c->s, &g);
    if (rc)
        return fail(c, rc,
                    rc == TS_ECORRUPT ? "a manifest is damaged, so gc cannot tell orphans apart "
                                        "(tessera store verify names it)"
                                      : "gc failed");
    return report_gc(c, &g, NULL);
}

static int run_rm(cli_t *c) {
    ts_hash_t h;
    if (resolve(c, c->op[0], &h))
        return 1;
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h, hex);
    int rc = ts_weights_remove(c->s, &h);
    ts_weights_gc_t g = {0};
    if (rc == TS_OK)
        rc = ts_weights_gc(c->s, &g);
    return rc ? fail(c, rc, "removing the weights failed") : report_gc(c, &g, hex);
}

static int run_du(cli_t *c) {
    ts_weights_du_t d;
    int rc = ts_weights_du(c->s, &d);
    if (rc)
        return fail(c, rc, "reading the store failed");
    char path[4200], b1[32], b2[32], b3[32];
    snprintf(path, sizeof path, "%s/data.mdb", ts_store_dir(c->s));
    struct stat st;
    uint64_t file = stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
    double ratio = d.unique_bytes ? (double)d.logical_bytes / (double)d.unique_bytes : 1.0;
    if (c->json) {
        ts_json_print(json_pack(
            "{s:s, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I}", "dir", ts_store_dir(c->s),
            "manifests", (json_int_t)d.manifests, "pinned", (json_int_t)d.pinned, "chunks",
            (json_int_t)d.chunks, "unique_bytes", (json_int_t)d.unique_bytes, "logical_bytes",
            (json_int_t)d.logical_bytes, "dedup_ratio", ratio, "orphan_chunks",
            (json_int_t)d.orphan_chunks, "orphan_bytes", (json_int_t)d.orphan_bytes, "map_size",
            (json_int_t)d.map_size, "file_size", (json_int_t)file));
        return 0;
    }
    printf("store          %s\n", ts_store_dir(c->s));
    printf("experts        %llu (%llu pinned)\n", (unsigned long long)d.manifests,
           (unsigned long long)d.pinned);
    printf("chunks         %llu\n", (unsigned long long)d.chunks);
    printf("unique bytes   %s (%llu)\n", human(d.unique_bytes, b1, sizeof b1),
           (unsigned long long)d.unique_bytes);
    printf("logical bytes  %s (%llu), dedup ratio %.2f\n", human(d.logical_bytes, b2, sizeof b2),
           (unsigned long long)d.logical_bytes, ratio);
    printf("orphans        %llu chunks, %s (tessera store gc deletes them)\n",
           (unsigned long long)d.orphan_chunks, human(d.orphan_bytes, b3, sizeof b3));
    printf("map size       %s\n", human(d.map_size, b1, sizeof b1));
    printf("data.mdb       %s\n", human(file, b2, sizeof b2));
    return 0;
}

/* ---- pin, unpin, evict --------------------------------------------------------------------- */

static int set_pin(cli_t *c, int on) {
    ts_hash_t h;
    if (resolve(c, c->op[0], &h))
        return 1;
    char hex[TS_HASH_HEX];
    ts_hash_hex(&h, hex);
    int rc = ts_weights_pin(c->s, &h, on);
    if (rc)
        return fail(c, rc, on ? "pinning failed" : "unpinning failed");
    if (c->json)
        ts_json_print(json_pack("{s:s, s:b}", "hash", hex, "pinned", on));
    else
        printf("%s %s\n", on ? "pinned" : "unpinned", hex);
    return 0;
}

static int run_pin(cli_t *c) { return set_pin(c, 1); }
static int run_unpin(cli_t *c) { return set_pin(c, 0); }

typedef struct {
    cli_t *c;
    json_t *arr;
} evict_out_t;

static void on_evict(void *ctx, const ts_weights_info_t *info) {
    evict_out_t *e = ctx;
    if (e->arr) {
        json_array_append_new(e->arr, info_json(info));
        return;
    }
    char hex[TS_HASH_HEX], b[32], desc[64];
    ts_hash_hex(&info->hash, hex);
    ts_weights_describe(info, desc, sizeof desc);
    printf("evicted %.16s  %s  %s\n", hex, human(info->size, b, sizeof b), desc);
}

static int run_evict(cli_t *c) {
    uint64_t budget = c->budget_bytes;
    evict_out_t e = {c, c->json ? json_array() : NULL};
    ts_weights_evict_t r;
    int rc = ts_weights_evict(c->s, budget, on_evict, &e, &r);
    if (rc) {
        json_decref(e.arr);
        return fail(c, rc,
                    rc == TS_ECORRUPT ? "a manifest is damaged (tessera store verify names it)"
                                      : "eviction failed");
    }
    char b1[32], b2[32], b3[32];
    if (c->json) {
        ts_json_print(json_pack("{s:o, s:I, s:I, s:I, s:I}", "evicted", e.arr, "freed_chunks",
                                (json_int_t)r.freed_chunks, "freed_bytes",
                                (json_int_t)r.freed_bytes, "unique_bytes",
                                (json_int_t)r.unique_bytes, "budget", (json_int_t)budget));
    } else {
        printf("%d evicted, %s freed; the weights now take %s (budget %s)\n", r.evicted,
               human(r.freed_bytes, b1, sizeof b1), human(r.unique_bytes, b2, sizeof b2),
               human(budget, b3, sizeof b3));
    }
    if (r.unique_bytes > budget)
        fprintf(stderr, "%s: pinned experts alone exceed the budget (unpin some, or raise it)\n",
                c->prog);
    return 0;
}

/* ---- dispatch ------------------------------------------------------------------------------ */

static const verb_t verbs[] = {
    {"ls", "", 0, "List the experts in the store.", run_ls},
    {"import", "FILE", 1, "Import a safetensors file; prints its weights hash.", run_import},
    {"export", "HASH FILE", 2, "Write an expert back out as a safetensors file (byte-identical).",
     run_export},
    {"verify", "", 0, "Check every chunk of every expert; exit 1 when anything is bad.",
     run_verify},
    {"gc", "", 0, "Delete the chunks no expert references.", run_gc},
    {"du", "", 0, "Show the space the weights take (unique and logical bytes).", run_du},
    {"rm", "HASH", 1, "Remove an expert from the store (then gc).", run_rm},
    {"pin", "HASH", 1, "Pin an expert: eviction never removes it.", run_pin},
    {"unpin", "HASH", 1, "Unpin an expert.", run_unpin},
    {"evict", "", 0, "Evict least recently used unpinned experts until the weights fit the budget.",
     run_evict},
};
#define N_VERBS ((int)(sizeof verbs / sizeof verbs[0]))

static void usage(FILE *f) {
    fprintf(f, "usage: tessera store <verb> [operands] [options]\n\nverbs:\n");
    for (int i = 0; i < N_VERBS; i++) {
        char left[32];
        snprintf(left, sizeof left, "%s %s", verbs[i].name, verbs[i].operands);
        fprintf(f, "  %-18s %s\n", left, verbs[i].summary);
    }
    fprintf(f, "\nHASH is a weights hash or a unique prefix of at least 8 hex digits.\n"
               "`tessera store <verb> --help` shows a verb's options.\n");
}

static int open_store(cli_t *c) {
    ts_store_opts_t o = {.dir = c->data_dir};
    if (c->map_size) {
        uint64_t m;
        if (parse_bytes(c->map_size, &m) != TS_OK || m == 0) {
            fprintf(stderr, "%s: --map-size %s: must be a byte count such as 64M\n", c->prog,
                    c->map_size);
            return 2;
        }
        o.map_size = (size_t)m;
    }
    char err[512] = "";
    int rc = ts_store_open(&c->s, &o, err, sizeof err);
    return rc ? fail(c, rc, err) : 0;
}

static const verb_t *find_verb(const char *name) {
    for (int i = 0; i < N_VERBS; i++)
        if (strcmp(name, verbs[i].name) == 0)
            return &verbs[i];
    return NULL;
}

/* The sub-verb's options into args (room for 6): the common three, and --pin for import, --budget
 * for evict. Returns how many. */
static int verb_options(cli_t *c, ts_arg_t *args) {
    int n = 0;
    args[n++] = (ts_arg_t){"data-dir", TS_ARG_STRING, &c->data_dir, "DIR",
                           "the store (default $XDG_DATA_HOME/tessera, else "
                           "~/.local/share/tessera)"};
    args[n++] = (ts_arg_t){"map-size", TS_ARG_STRING, &c->map_size, "BYTES",
                           "initial LMDB map size, e.g. 64M (default 64M; it grows as needed)"};
    args[n++] =
        (ts_arg_t){"json", TS_ARG_FLAG, &c->json, NULL, "print one JSON document on stdout"};
    if (strcmp(c->verb->name, "import") == 0)
        args[n++] = (ts_arg_t){"pin", TS_ARG_FLAG, &c->pin, NULL,
                               "pin the imported expert (never evicted)"};
    if (strcmp(c->verb->name, "evict") == 0)
        args[n++] = (ts_arg_t){"budget",
                               TS_ARG_STRING,
                               &c->budget,
                               "BYTES",
                               "bytes the weights may take (K, M, G, T suffixes: binary)",
                               0,
                               0,
                               1};
    return n;
}

/* Picks the operands out of argv[2..] into c->op (counting them in c->n_ops); the rest — the
 * sub-verb's name first, then the options with their values — goes into rest for the option
 * parser. Returns 1 when -h or --help came (the sub-verb's usage is then printed), else 0. */
static int pick_operands(cli_t *c, const ts_arg_t *args, int n_args, int argc, char **argv,
                         char **rest, int *n_rest) {
    *n_rest = 0;
    rest[(*n_rest)++] = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            char prog[96];
            snprintf(prog, sizeof prog, "%s%s%s", c->prog, *c->verb->operands ? " " : "",
                     c->verb->operands);
            ts_args_usage(stdout, prog, c->verb->summary, args, n_args);
            return 1;
        }
        if (strncmp(a, "--", 2) == 0) {
            rest[(*n_rest)++] = argv[i];
            const char *name = a + 2;
            size_t len = strcspn(name, "=");
            for (int k = 0; k < n_args; k++)
                if (!name[len] && strlen(args[k].name) == len &&
                    strncmp(args[k].name, name, len) == 0 && args[k].kind != TS_ARG_FLAG &&
                    i + 1 < argc)
                    rest[(*n_rest)++] = argv[++i]; /* the option's value */
        } else if (a[0] == '-' && a[1]) {
            rest[(*n_rest)++] = argv[i]; /* the parser names it */
        } else if (c->n_ops < MAX_OPERANDS) {
            c->op[c->n_ops++] = a;
        } else {
            c->n_ops++;
        }
    }
    return 0;
}

/* The operands, then the options, of the sub-verb c->verb: TS_ARGS_RUN when the run goes on, else
 * the exit code (0 after --help, 1 out of memory, 2 after a usage error). */
static int parse_cli(cli_t *c, int argc, char **argv) {
    ts_arg_t args[6];
    int n_args = verb_options(c, args);
    char **rest = malloc((size_t)argc * sizeof *rest);
    if (!rest)
        return 1;
    int n_rest = 0;
    int help = pick_operands(c, args, n_args, argc, argv, rest, &n_rest);
    int pr = help ? 0 : ts_args_parse(c->prog, c->verb->summary, args, n_args, n_rest, rest);
    free(rest);
    return pr;
}

/* The number of operands and --budget: 0, or 2 with the message printed. */
static int validate(cli_t *c) {
    if (c->n_ops != c->verb->n_operands) {
        if (c->verb->n_operands == 0)
            fprintf(stderr, "%s: takes no operands (see %s --help)\n", c->prog, c->prog);
        else
            fprintf(stderr, "%s: expects %s (see %s --help)\n", c->prog, c->verb->operands,
                    c->prog);
        return 2;
    }
    if (c->budget && parse_bytes(c->budget, &c->budget_bytes) != TS_OK) {
        fprintf(stderr, "%s: --budget %s: must be a byte count such as 1073741824, 512M or 2G\n",
                c->prog, c->budget);
        return 2;
    }
    return 0;
}

int ts_cmd_store(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    cli_t c = {0};
    if (!(c.verb = find_verb(argv[1]))) {
        fprintf(stderr, "tessera store: unknown verb '%s' (see tessera store --help)\n", argv[1]);
        return 2;
    }
    snprintf(c.prog, sizeof c.prog, "tessera store %s", c.verb->name);
    int code = parse_cli(&c, argc, argv);
    if (code != TS_ARGS_RUN)
        return code;
    if (validate(&c))
        return 2;
    int rc = open_store(&c);
    if (rc == 0)
        rc = c.verb->run(&c);
    ts_store_close(c.s);
    return rc;
}
