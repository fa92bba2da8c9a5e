/*
 * args.h — a table-driven option parser for the `tessera` verbs.
 *
 * A verb declares its options once, as a table of {name, kind, destination, help}; the parser
 * fills the destinations from argv ("--name value" or "--name=value"), checks every value
 * (integers and floats parsed strictly, within the bounds given), and prints the verb's --help
 * from the same table, so the help can never drift from what is accepted.
 */
#ifndef TS_ARGS_H
#define TS_ARGS_H

#include <stdint.h>
#include <stdio.h>

typedef enum {
    TS_ARG_FLAG,      /* int*: set to 1, takes no value */
    TS_ARG_INT,       /* int*, within [min, max] */
    TS_ARG_I64,       /* int64_t*, within [min, max] */
    TS_ARG_U64,       /* uint64_t* (seeds) */
    TS_ARG_FLOAT,     /* float*, finite, within [min, max] */
    TS_ARG_STRING,    /* const char** */
    TS_ARG_DEVICE,    /* ts_device_spec_t* (kernels/engine.h): auto, cpu, cuda, cuda:N */
    TS_ARG_PRECISION, /* ts_precision_t* (kernels/engine.h): f32, bf16 */
} ts_arg_kind_t;

typedef struct ts_arg {
    const char *name; /* without the leading "--" */
    ts_arg_kind_t kind;
    void *dest;
    const char *meta; /* shown in help: "N", "FILE", ... */
    const char *help;
    double min, max; /* bounds for numbers (ignored when min == max == 0) */
    int required;
    int seen; /* set by the parser */
} ts_arg_t;

/* What ts_args_parse returns when every option was read and the verb goes on to run. */
#define TS_ARGS_RUN (-1)

/* Parses argv[1..argc) against the table (n entries). Returns TS_ARGS_RUN when the verb goes on,
 * else the process exit code, its reason already printed: 0 after --help (the verb's help on
 * stdout), 2 after a usage error (a message naming the option on stderr). A verb returns that
 * code as it is: `if (pr != TS_ARGS_RUN) return pr;`. */
int ts_args_parse(const char *prog, const char *summary, ts_arg_t *args, int n, int argc,
                  char **argv);
/* Whether the option name was given (after ts_args_parse). */
int ts_arg_seen(const ts_arg_t *args, int n, const char *name);
void ts_args_usage(FILE *f, const char *prog, const char *summary, const ts_arg_t *args, int n);

/* The line a verb prints on stderr when its run fails, "PROG: ERR: what rc means" ("PROG: what rc
 * means" when err is NULL or empty). Returns 1, the exit code of a failed run. */
int ts_args_fail(const char *prog, const char *err, int rc);

#endif
