/* args.c — the option parser of the `tessera` verbs (see args.h). */
#include "client/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/engine.h"

void ts_args_usage(FILE *f, const char *prog, const char *summary, const ts_arg_t *args, int n) {
    fprintf(f, "usage: %s [options]\n\n%s\n\noptions:\n", prog, summary);
    for (int i = 0; i < n; i++) {
        char left[64];
        if (args[i].kind == TS_ARG_FLAG)
            snprintf(left, sizeof left, "--%s", args[i].name);
        else
            snprintf(left, sizeof left, "--%s %s", args[i].name, args[i].meta ? args[i].meta : "X");
        fprintf(f, "  %-26s %s%s\n", left, args[i].help, args[i].required ? " (required)" : "");
    }
    fprintf(f, "  %-26s %s\n", "-h, --help", "show this text");
}

static int bad_value(const char *prog, const ts_arg_t *a, const char *v, const char *why) {
    fprintf(stderr, "%s: --%s %s: %s (see %s --help)\n", prog, a->name, v, why, prog);
    return 2;
}

static int in_bounds(const ts_arg_t *a, double x) {
    return (a->min == 0 && a->max == 0) || (x >= a->min && x <= a->max);
}

static int set_value(const char *prog, ts_arg_t *a, const char *v) {
    char *end = NULL;
    char why[96];
    snprintf(why, sizeof why, "must be a number in [%g, %g]", a->min, a->max);
    errno = 0;
    switch (a->kind) {
    case TS_ARG_INT:
    case TS_ARG_I64: {
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end || !in_bounds(a, (double)x))
            return bad_value(prog, a, v, a->min == 0 && a->max == 0 ? "must be an integer" : why);
        if (a->kind == TS_ARG_INT)
            *(int *)a->dest = (int)x;
        else
            *(int64_t *)a->dest = x;
        return 0;
    }
    case TS_ARG_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-')
            return bad_value(prog, a, v, "must be a non-negative integer");
        *(uint64_t *)a->dest = x;
        return 0;
    }
    case TS_ARG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x) || !in_bounds(a, x))
            return bad_value(prog, a, v, a->min == 0 && a->max == 0 ? "must be a number" : why);
        *(float *)a->dest = (float)x;
        return 0;
    }
    case TS_ARG_STRING:
        if (!*v)
            return bad_value(prog, a, v, "must not be empty");
        *(const char **)a->dest = v;
        return 0;
    case TS_ARG_DEVICE:
        if (ts_device_spec_parse(v, (ts_device_spec_t *)a->dest) != TS_OK)
            return bad_value(prog, a, v, "must be auto, cpu, cuda or cuda:N");
        return 0;
    case TS_ARG_PRECISION:
        if (ts_precision_parse(v, (ts_precision_t *)a->dest) != TS_OK)
            return bad_value(prog, a, v, "must be f32, bf16 or f16");
        return 0;
    default: return 2;
    }
}

int ts_args_parse(const char *prog, const char *summary, ts_arg_t *args, int n, int argc,
                  char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            ts_args_usage(stdout, prog, summary, args, n);
            return 1;
        }
        if (strncmp(s, "--", 2) != 0) {
            fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", prog, s, prog);
            return 2;
        }
        const char *name = s + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        ts_arg_t *a = NULL;
        for (int k = 0; k < n && !a; k++)
            if (strlen(args[k].name) == len && strncmp(args[k].name, name, len) == 0)
                a = &args[k];
        if (!a) {
            fprintf(stderr, "%s: unknown option '--%.*s' (see %s --help)\n", prog, (int)len, name,
                    prog);
            return 2;
        }
        a->seen = 1;
        if (a->kind == TS_ARG_FLAG) {
            if (eq) {
                fprintf(stderr, "%s: --%s takes no value\n", prog, a->name);
                return 2;
            }
            *(int *)a->dest = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "%s: --%s needs a value (%s)\n", prog, a->name,
                    a->meta ? a->meta : "X");
            return 2;
        }
        if (set_value(prog, a, v))
            return 2;
    }
    for (int k = 0; k < n; k++)
        if (args[k].required && !args[k].seen) {
            fprintf(stderr, "%s: --%s is required (see %s --help)\n", prog, args[k].name, prog);
            return 2;
        }
    return 0;
}

int ts_arg_seen(const ts_arg_t *args, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(args[i].name, name) == 0)
            return args[i].seen;
    return 0;
}

int ts_args_fail(const char *prog, const char *err, int rc) {
    int said = err && *err;
    fprintf(stderr, "%s: %s%s%s\n", prog, said ? err : "", said ? ": " : "", ts_strerror(rc));
    return 1;
}
