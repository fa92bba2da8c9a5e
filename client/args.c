/* args.c — the option parser of the `tessera` verbs (see args.h). */
#include "client/args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "kernels/engine.h"

#define HELP_COL 29    /* where an option's help starts */
#define HELP_WIDTH 100 /* the line it wraps at */

/* text wrapped at HELP_WIDTH, its first line starting at column col (already there) and the
 * others indented to indent. */
static void wrap(FILE *f, const char *text, int col, int indent) {
    const char *p = text;
    while (*p) {
        int room = HELP_WIDTH - col;
        size_t len = strlen(p);
        if ((int)len <= room) {
            fprintf(f, "%s\n", p);
            return;
        }
        int cut = room;
        while (cut > 0 && p[cut] != ' ')
            cut--;
        if (cut == 0) { /* one word longer than the room: it goes whole */
            cut = room;
            while (p[cut] && p[cut] != ' ')
                cut++;
        }
        fprintf(f, "%.*s\n%*s", cut, p, indent, "");
        p += cut;
        while (*p == ' ')
            p++;
        col = indent;
    }
    fprintf(f, "\n");
}

/* The summary's lines that begin with tag ("usage:", "example:"), each printed by itself; how
 * many. */
static int tagged_lines(FILE *f, const char *summary, const char *tag) {
    int n = 0;
    for (const char *line = summary; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (strncmp(line, tag, strlen(tag)) == 0) {
            fprintf(f, "%.*s\n", (int)len, line);
            n++;
        }
        line = end ? end + 1 : NULL;
    }
    return n;
}

void ts_args_usage(FILE *f, const char *prog, const char *summary, const ts_arg_t *args, int n) {
    /* one usage line: the summary's, else the required options and [options] */
    if (!tagged_lines(f, summary, "usage:")) {
        fprintf(f, "usage: %s", prog);
        for (int i = 0; i < n; i++)
            if (args[i].required)
                fprintf(f, " --%s %s", args[i].name, args[i].meta ? args[i].meta : "X");
        fprintf(f, " [options]\n");
    }
    fprintf(f, "\n");
    for (const char *line = summary; line && *line;) { /* the description */
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (strncmp(line, "usage:", 6) != 0 && strncmp(line, "example:", 8) != 0) {
            char text[2048];
            snprintf(text, sizeof text, "%.*s", (int)len, line);
            wrap(f, text, 0, 0);
        }
        line = end ? end + 1 : NULL;
    }
    fprintf(f, "\noptions:\n");
    for (int i = 0; i < n; i++) {
        char left[96], help[1200];
        if (args[i].kind == TS_ARG_FLAG)
            snprintf(left, sizeof left, "--%s", args[i].name);
        else
            snprintf(left, sizeof left, "--%s %s", args[i].name, args[i].meta ? args[i].meta : "X");
        snprintf(help, sizeof help, "%s%s", args[i].help,
                 args[i].required && !strstr(args[i].help, "(required)") ? " (required)" : "");
        if ((int)strlen(left) + 3 > HELP_COL) { /* a long name: its help on the next line */
            fprintf(f, "  %s\n%*s", left, HELP_COL, "");
        } else {
            fprintf(f, "  %-*s ", HELP_COL - 3, left);
        }
        wrap(f, help, HELP_COL, HELP_COL);
    }
    fprintf(f, "  %-*s %s\n", HELP_COL - 3, "-h, --help", "show this text");
    if (strstr(summary, "example:")) {
        fprintf(f, "\n");
        tagged_lines(f, summary, "example:");
    }
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
        ((ts_device_spec_t *)a->dest)->named = 1;
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
            return 0;
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
    return TS_ARGS_RUN;
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
