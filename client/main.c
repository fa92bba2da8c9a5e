/*
 * main.c — the `tessera` command: parses the verb and hands over to it.
 *
 * Verbs: the table `verbs` below — its rows dispatch and make the usage text: the cmd_*.c verbs
 * (client/, commands.h) and `bench gemm` (kernels/gemm_bench.c, shared with the bench_gemm
 * program). Every verb takes --help; an unknown verb or option exits 2 with a
 * message naming it, a failed run exits 1.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "kernels/gemm_bench.h"
#include "client/commands.h"
#include "kernels/engine.h"

#ifndef TS_VERSION
#define TS_VERSION "0.0.0-dev"
#endif

/* Every verb: its name, what runs it, and its line in the usage text (a "\n" continues the
 * summary on the next line, indented). label, when set, is what the usage shows instead of the
 * name ("bench gemm"). Dispatch and usage both read this table. */
typedef struct verb {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    const char *label;
} verb_t;

static int cmd_bench(int argc, char **argv);

/* bench gemm's line, in the verbs' usage and in bench's own */
#define BENCH_GEMM_SUMMARY "GEMM throughput of the DiT configs next to the sgemm peak"

static const verb_t verbs[] = {
    {"train", ts_cmd_train, "train one DiT expert with flow matching on Fashion-MNIST (or a shard)",
     NULL},
    {"sample", ts_cmd_sample, "generate images from one expert and write a PNG grid", NULL},
    {"forward", ts_cmd_forward,
     "one forward pass of an expert on tensors from a file (parity, debug)", NULL},
    {"store", ts_cmd_store,
     "the local weights store: ls, import, export, verify, gc, du, rm,\npin, unpin, evict", NULL},
    {"partition", ts_cmd_partition,
     "cluster the train set into K shards (PCA + k-means++): the partition\nartifact, shard "
     "files and a table of the clusters' class mix",
     NULL},
    {"train-classifier", ts_cmd_train_classifier,
     "train the evaluation classifier (DiT trunk, 10 labels, clean images)", NULL},
    {"train-judge", ts_cmd_train_judge,
     "train a judge for eval: a plain CNN classifier or an autoencoder\n(a feature space learnt "
     "without labels)",
     NULL},
    {"encode", ts_cmd_encode,
     "a folder of PNG images through the VAE's encoder into a latent data set\n(for train "
     "--latents)",
     NULL},
    {"import", ts_cmd_import,
     "a DiT checkpoint (facebookresearch/DiT's .pt, read without PyTorch) into\nan expert file",
     NULL},
    {"judge", ts_cmd_judge,
     "score saved sample sets in several feature spaces (FD, KID, precision,\nrecall, paired "
     "differences) and say where the judges agree",
     NULL},
    {"train-router", ts_cmd_train_router,
     "train a router: cluster of a noisy x_t, per-t-bucket accuracy", NULL},
    {"calibrate", ts_cmd_calibrate,
     "a router's calibration along t (NLL, ECE) and its fitted temperature", NULL},
    {"generate", ts_cmd_generate,
     "generate images with a routed ensemble of experts, local (--local DIR)\nor the "
     "network's (--peer HOST:PORT)",
     NULL},
    {"eval", ts_cmd_eval,
     "compare routing policies and monoliths by FD (with intervals),\nprecision/recall, IS, "
     "per-class FD, coverage and cost",
     NULL},
    {"loss", ts_cmd_loss,
     "each expert's and monolith's denoising loss on every cluster's\nheld-out images: where "
     "do the experts lose?",
     NULL},
    {"keygen", ts_cmd_keygen, "create a node identity (prints the node id) or a network key", NULL},
    {"ping", ts_cmd_ping, "handshake with a node and time round trips (HOST:PORT)", NULL},
    {"status", ts_cmd_status, "the network as one node sees it: members, experts, clusters, load",
     NULL},
    {"up", ts_cmd_up, "start a network of daemons on this machine hosting a folder's experts",
     NULL},
    {"down", ts_cmd_down, "stop the network `tessera up` started", NULL},
    {"network", ts_cmd_network,
     "network export: the network as one file (its key, where to join) for\nvolunteers", NULL},
    {"join", ts_cmd_join, "make this machine a node of a network from its file (mode auto)", NULL},
    {"pull", ts_cmd_pull, "experts' weights from the network into the store (verified, resumable)",
     NULL},
    {"selfcheck", ts_cmd_selfcheck,
     "check the compute kernels against naive references (and a CUDA\ndevice against the CPU, "
     "when one is present)",
     NULL},
    {"bench", cmd_bench, BENCH_GEMM_SUMMARY, "bench gemm"},
};
#define N_VERBS (sizeof verbs / sizeof verbs[0])

static void usage(FILE *f) {
    fprintf(f, "usage: tessera <verb> [options]\n\nverbs:\n");
    for (size_t i = 0; i < N_VERBS; i++) {
        const char *label = verbs[i].label ? verbs[i].label : verbs[i].name;
        fprintf(f, "  %-*s", strlen(label) > 12 ? (int)strlen(label) + 2 : 14, label);
        for (const char *p = verbs[i].summary; *p; p++) {
            fputc(*p, f);
            if (*p == '\n')
                fprintf(f, "%16s", "");
        }
        fputc('\n', f);
    }
    fprintf(f, "\noptions:\n"
               "  -h, --help    show this text; `tessera <verb> --help` for a verb's options\n"
               "  --version     print the version and the backends built in\n");
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: tessera bench <name> [options]\n"
               "\n"
               "benchmarks:\n"
               "  gemm          " BENCH_GEMM_SUMMARY "\n"
               "\n"
               "`tessera bench <name> --help` shows a benchmark's options.\n");
}

static int cmd_bench(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "tessera bench: name a benchmark (see tessera bench --help)\n");
        return 2;
    }
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
        bench_usage(stdout);
        return 0;
    }
    if (strcmp(name, "gemm") == 0)
        return ts_gemm_bench_main(argc - 1, argv + 1, "tessera bench gemm");
    fprintf(stderr, "tessera bench: unknown benchmark '%s' (see tessera bench --help)\n", name);
    return 2;
}

int main(int argc, char **argv) {
    /* A peer that goes away while we write to it must be an error on that connection (EPIPE),
     * not the end of the process: the network verbs route around lost nodes. */
    signal(SIGPIPE, SIG_IGN);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *verb = argv[1];
    if (strcmp(verb, "-h") == 0 || strcmp(verb, "--help") == 0 || strcmp(verb, "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(verb, "--version") == 0) {
        printf("tessera %s (CPU backend: OpenBLAS; CUDA backend: %s)\n", TS_VERSION,
               ts_cuda_built() ? "built" : "not built");
        return 0;
    }
    for (size_t i = 0; i < N_VERBS; i++)
        if (strcmp(verb, verbs[i].name) == 0)
            return verbs[i].run(argc - 1, argv + 1);
    if (verb[0] == '-')
        fprintf(stderr, "tessera: unknown option '%s' (see tessera --help)\n", verb);
    else
        fprintf(stderr, "tessera: unknown verb '%s' (see tessera --help)\n", verb);
    return 2;
}
