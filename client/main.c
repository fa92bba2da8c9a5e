/*
 * main.c — the `tessera` command: parses the verb and hands over to it.
 *
 * Verbs: `train`, `sample`, `forward`, `store`, `partition`, `train-classifier`, `train-router`,
 * `calibrate`, `generate` (--local or --peer), `eval`, `keygen`, `network export`, `join`, `ping`, `status`, `up`, `down`, `pull`
 * (client/cmd_*.c), `selfcheck` (client/selfcheck.c) and `bench gemm` (kernels/gemm_bench.c,
 * shared with the bench_gemm program). Every verb takes --help; an unknown verb or option exits
 * 2 with a message naming it, a failed run exits 1.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "kernels/gemm_bench.h"
#include "client/commands.h"
#include "client/selfcheck.h"
#include "kernels/engine.h"

#ifndef TS_VERSION
#define TS_VERSION "0.0.0-dev"
#endif

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: tessera <verb> [options]\n"
        "\n"
        "verbs:\n"
        "  train         train one DiT expert with flow matching on Fashion-MNIST (or a shard)\n"
        "  sample        generate images from one expert and write a PNG grid\n"
        "  forward       one forward pass of an expert on tensors from a file (parity, debug)\n"
        "  store         the local weights store: ls, import, export, verify, gc, du, rm,\n"
        "                pin, unpin, evict\n"
        "  partition     cluster the train set into K shards (PCA + k-means++): the partition\n"
        "                artifact, shard files and a table of the clusters' class mix\n"
        "  train-classifier  train the evaluation classifier (DiT trunk, 10 labels, clean images)\n"
        "  train-router  train a router: cluster of a noisy x_t, per-t-bucket accuracy\n"
        "  calibrate     a router's calibration along t (NLL, ECE) and its fitted temperature\n"
        "  generate      generate images with a routed ensemble of experts, local (--local DIR)\n"
        "                or the network's (--peer HOST:PORT)\n"
        "  eval          compare routing policies and monoliths by FD (with intervals),\n"
        "                precision/recall, IS, per-class FD, coverage and cost\n"
        "  loss          each expert's and monolith's denoising loss on every cluster's\n"
        "                held-out images: where do the experts lose?\n"
        "  keygen        create a node identity (prints the node id) or a network key\n"
        "  ping          handshake with a node and time round trips (HOST:PORT)\n"
        "  status        the network as one node sees it: members, experts, clusters, load\n"
        "  up            start a network of daemons on this machine hosting a folder's experts\n"
        "  down          stop the network `tessera up` started\n"
        "  network       network export: the network as one file (its key, where to join) for\n"
        "                volunteers\n"
        "  join          make this machine a node of a network from its file (mode auto)\n"
        "  pull          experts' weights from the network into the store (verified, resumable)\n"
        "  selfcheck     check the compute kernels against naive references (and a CUDA\n"
        "                device against the CPU, when one is present)\n"
        "  bench gemm    GEMM throughput of the DiT configs next to the sgemm peak\n"
        "\n"
        "options:\n"
        "  -h, --help    show this text; `tessera <verb> --help` for a verb's options\n"
        "  --version     print the version and the backends built in\n");
}

static void bench_usage(FILE *f) {
    fprintf(f, "usage: tessera bench <name> [options]\n"
               "\n"
               "benchmarks:\n"
               "  gemm          GEMM throughput of the DiT configs next to the sgemm peak\n"
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
    if (strcmp(verb, "train") == 0)
        return ts_cmd_train(argc - 1, argv + 1);
    if (strcmp(verb, "sample") == 0)
        return ts_cmd_sample(argc - 1, argv + 1);
    if (strcmp(verb, "forward") == 0)
        return ts_cmd_forward(argc - 1, argv + 1);
    if (strcmp(verb, "store") == 0)
        return ts_cmd_store(argc - 1, argv + 1);
    if (strcmp(verb, "partition") == 0)
        return ts_cmd_partition(argc - 1, argv + 1);
    if (strcmp(verb, "train-classifier") == 0)
        return ts_cmd_train_classifier(argc - 1, argv + 1);
    if (strcmp(verb, "train-router") == 0)
        return ts_cmd_train_router(argc - 1, argv + 1);
    if (strcmp(verb, "calibrate") == 0)
        return ts_cmd_calibrate(argc - 1, argv + 1);
    if (strcmp(verb, "generate") == 0)
        return ts_cmd_generate(argc - 1, argv + 1);
    if (strcmp(verb, "eval") == 0)
        return ts_cmd_eval(argc - 1, argv + 1);
    if (strcmp(verb, "loss") == 0)
        return ts_cmd_loss(argc - 1, argv + 1);
    if (strcmp(verb, "keygen") == 0)
        return ts_cmd_keygen(argc - 1, argv + 1);
    if (strcmp(verb, "ping") == 0)
        return ts_cmd_ping(argc - 1, argv + 1);
    if (strcmp(verb, "status") == 0)
        return ts_cmd_status(argc - 1, argv + 1);
    if (strcmp(verb, "up") == 0)
        return ts_cmd_up(argc - 1, argv + 1);
    if (strcmp(verb, "down") == 0)
        return ts_cmd_down(argc - 1, argv + 1);
    if (strcmp(verb, "network") == 0)
        return ts_cmd_network(argc - 1, argv + 1);
    if (strcmp(verb, "join") == 0)
        return ts_cmd_join(argc - 1, argv + 1);
    if (strcmp(verb, "pull") == 0)
        return ts_cmd_pull(argc - 1, argv + 1);
    if (strcmp(verb, "selfcheck") == 0)
        return ts_cli_selfcheck(argc - 1, argv + 1);
    if (strcmp(verb, "bench") == 0)
        return cmd_bench(argc - 1, argv + 1);
    if (verb[0] == '-')
        fprintf(stderr, "tessera: unknown option '%s' (see tessera --help)\n", verb);
    else
        fprintf(stderr, "tessera: unknown verb '%s' (see tessera --help)\n", verb);
    return 2;
}
