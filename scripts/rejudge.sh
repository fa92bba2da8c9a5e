#!/bin/bash
# rejudge.sh — the routing study's committed samples re-scored by every judge (docs/routing.md,
# "Every judge"): the evaluation classifier as the study trained it, a plain CNN classifier of
# another seed and an autoencoder trained without labels (`tessera train-judge`), each kept with
# the results; then `tessera judge` (FD and KID with paired 95 % intervals, precision, recall) on
# the headline at the full budget, on the first small-budget study's entries, on the
# unsupervised partition at the full budget (with and without a router), on the small
# budget's partition and policy tables re-run with every judge, on the seeds of the
# full-budget headline (three monoliths, two label-split ensembles), and on the small budget's
# recipe and router tables re-run with every judge.
#
#   scripts/rejudge.sh [OUT_DIR]   (default docs/results/judges; resumable: a file that exists is
#                                   not made again)
#
# Environment: TESSERA (default build/client/tessera), THREADS (default 2), BOOT (200).
# About 25 min on 2 idle cores (the classifier's 9 000 steps take 6 of them).
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TESSERA:-build/client/tessera}
OUT=${1:-docs/results/judges}
THREADS=${THREADS:-2}
BOOT=${BOOT:-200}
mkdir -p "$OUT"
log() { echo "[$(date +%H:%M:%S)] $*"; }

# the judges (the classifier with the study's own command: scripts/routing-study.sh)
[ -f "$OUT/classifier.safetensors" ] || {
    log "evaluation classifier (patch 7, depth 2, 9000 steps, seed 0)"
    nice "$T" train-classifier --patch 7 --depth 2 --steps 9000 --no-augment --threads 1 --seed 0 \
        --out "$OUT/classifier.safetensors" --json >"$OUT/classifier.json" 2>"$OUT/classifier.log"
}
[ -f "$OUT/judge-cnn-s2.safetensors" ] || {
    log "judge: cnn, seed 2, 2000 steps"
    nice "$T" train-judge --kind cnn --seed 2 --steps 2000 --threads "$THREADS" --json \
        --out "$OUT/judge-cnn-s2.safetensors" >"$OUT/judge-cnn-s2.json" 2>"$OUT/judge-cnn-s2.log"
}
[ -f "$OUT/judge-ae-s3.safetensors" ] || {
    log "judge: ae, seed 3, 3000 steps"
    nice "$T" train-judge --kind ae --seed 3 --steps 3000 --threads "$THREADS" --json \
        --out "$OUT/judge-ae-s3.safetensors" >"$OUT/judge-ae-s3.json" 2>"$OUT/judge-ae-s3.log"
}
JUDGES="$OUT/classifier.safetensors,$OUT/judge-cnn-s2.safetensors,$OUT/judge-ae-s3.safetensors"

# the floor: N train images as a sample set (what a perfect generator would score at this n), in
# a temporary folder: train-data-N.idx.gz
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
floor() { # N
    /usr/bin/python3 - "$TMP" "$1" <<'PYEOF'
import gzip, struct, sys
d, n = sys.argv[1], int(sys.argv[2])
src = "/usr/share/datasets/fashion-mnist/train-"
with gzip.open(src + "images-idx3-ubyte.gz") as f:
    f.read(16); pix = f.read(n * 784)
with gzip.open(src + "labels-idx1-ubyte.gz") as f:
    f.read(8); lab = f.read(n)
with gzip.open(f"{d}/train-data-{n}.idx.gz", "wb") as f:
    f.write(struct.pack(">IIII", 2051, n, 28, 28) + pix)
with gzip.open(f"{d}/train-data-{n}-labels.idx.gz", "wb") as f:
    f.write(struct.pack(">II", 2049, n) + lab)
PYEOF
}

rejudge() { # NAME DIR N ENTRY...: the first N samples of the entries of DIR (an entry with a
    # '/' is a path of its own), then the floor of N train images
    local name=$1 dir=$2 n=$3 files="" f
    shift 3
    [ -f "$OUT/rejudge-$name.json" ] && return 0
    for e in "$@"; do
        case $e in */*) f=$e ;; *) f=$dir/$e ;; esac
        files="${files:+$files,}$f.idx.gz"
    done
    floor "$n"
    files="$files,$TMP/train-data-$n.idx.gz"
    log "rejudge $name: $*"
    nice "$T" judge --samples "$files" --judges "$JUDGES" --bootstrap "$BOOT" --threads "$THREADS" \
        --n "$n" >"$OUT/rejudge-$name.txt" 2>"$OUT/rejudge-$name.log"
    nice "$T" judge --samples "$files" --judges "$JUDGES" --bootstrap "$BOOT" --threads "$THREADS" \
        --n "$n" --json >"$OUT/rejudge-$name.json" 2>>"$OUT/rejudge-$name.log"
}
# the headline: the b8 monolith against the label-split ensemble, n = 5 000 each (and the floor)
rejudge full docs/results/routing-full 5000 monolith best-ensemble
# the small budget's first study (one b8 monolith for all of them), n = 2 000 each
rejudge small docs/results/routing-small 2000 monolith best-ensemble monolith-b64 \
    ens-warm-b8-learned+prior_top1 ens-b8-learned+prior_top1 ens-base-learned+prior_top1
# the unsupervised partition at the full budget (routing-study.sh full, arms mono-b8-s2 part-ae,
# and the router on its clusters: docs/results/routing-ae/README.md), against both monolith
# seeds, with the label split beside it; then Paris's setting — a router on (x_t, t) only — at
# n = 2 000
AE=docs/results/routing-ae
FULL=docs/results/routing-full
rejudge full-ae "$AE" 5000 "$FULL/monolith" monolith-s2 ae-uniform+prior_top1 \
    ae-centroid+prior_top1 "$FULL/best-ensemble"
# the headline against the second monolith seed: the seed noise beside the effect
rejudge full-s2 "$AE" 5000 monolith-s2 "$FULL/best-ensemble" "$FULL/monolith" ae-uniform+prior_top1
# the supervised-features partition (k-means on a classifier's features) at the full budget
rejudge full-features "$AE" 5000 monolith-s2 features-uniform+prior_top1 \
    features-centroid+prior_top1 "$FULL/monolith" "$FULL/best-ensemble"
rejudge full-ae-router "$AE" 2000 "$FULL/monolith" monolith-s2 ae-learned_top1 ae-learned_top2 \
    ae-learned_full
# the small budget's partition and policy tables, re-run with every judge (`JUDGES=… ARMS="mono-b8
# warm ens-warm-b8 part-label part-random part-features part-features4 part-features16 part-hier
# part-k16" scripts/routing-study.sh small`: docs/results/routing-small-judged/): each partition
# paired with DDM's pixel k-means (its router-free entry), and each selection rule and policy
# with the learned router's top1, n = 2 000
SJ=docs/results/routing-small-judged
rejudge small-partitions "$SJ" 2000 warm-vs-mb8-uniform+prior_top1 monolith \
    label-uniform+prior_top1 part-features-uniform+prior_top1 part-features4-uniform+prior_top1 \
    part-features16-uniform+prior_top1 part-hier-uniform+prior_top1 part-k16-uniform+prior_top1 \
    random-uniform_top1
rejudge small-rules "$SJ" 2000 warm-vs-mb8-learned+prior_top1 rules-cluster-learned+prior_top2 \
    rules-cluster-learned+prior_full rules-cluster-learned+prior+hold_top1 \
    warm-vs-mb8-learned+prior+draw_full warm-vs-mb8-uniform+prior_top1 \
    policies-centroid+prior_top1 policies-learned+prior+temp_0.882_top1 monolith
# seeds at the full budget: three b8 monolith seeds and two seeds of the label-split ensemble
# (routing-study.sh full, arms mono-b8-s3 part-label-s2: docs/results/routing-seeds/), every
# pair in every judge, n = 5 000
SEEDS=docs/results/routing-seeds
# (`tessera judge` pairs every set with the first: each seed of either side comes first once)
rejudge full-seeds "$SEEDS" 5000 "$FULL/monolith" "$AE/monolith-s2" monolith-s3 \
    "$FULL/best-ensemble" label-s2-uniform+prior_top1
rejudge full-seeds-m2 "$SEEDS" 5000 "$AE/monolith-s2" monolith-s3 "$FULL/best-ensemble" \
    label-s2-uniform+prior_top1
rejudge full-seeds-m3 "$SEEDS" 5000 monolith-s3 "$FULL/best-ensemble" label-s2-uniform+prior_top1
rejudge full-seeds-e1 "$SEEDS" 5000 "$FULL/best-ensemble" label-s2-uniform+prior_top1
# the small budget's recipe and router tables, re-run with every judge (`JUDGES=… ARMS="mono-s1
# mono-s2 mono-b8 ens-base ens-b8 warm ens-warm-b8 align mix router-label"
# scripts/routing-study.sh small`: docs/results/routing-small-judged2/, its own draw of every
# set): the recipes against today's monolith (batch 64, seed 1), the ensembles against the b8
# monolith, the routers against the cluster router's top1 and each router's rules against its
# top1, n = 2 000
SJ2=docs/results/routing-small-judged2
rejudge small-recipes "$SJ2" 2000 mono-b64-s1 mono-b64-s2 mono-b8 base-learned+prior_top1 \
    base-learned_top1 b8-learned+prior_top1 warm-learned+prior_top1
rejudge small-recipes-mb8 "$SJ2" 2000 mono-b8 base-learned+prior_top1 b8-learned+prior_top1 \
    b8-uniform+prior_top1 warm-learned+prior_top1
rejudge small-routers "$SJ2" 2000 warm-learned+prior_top1 align-learned+prior_top1 \
    mix-learned+prior_top1 label-learned_top1 label-learned+prior_top1 align-learned_top1 \
    mix-learned_top1 mono-b8
rejudge small-rules-base "$SJ2" 2000 base-learned+prior_top1 base-learned+prior_top2 \
    base-centroid+prior_top1 base-learned+prior+hold_top1
rejudge small-rules-b8 "$SJ2" 2000 b8-learned+prior_top1 b8-learned+prior_top2 \
    b8-centroid+prior_top1 b8-learned+prior+hold_top1
rejudge small-rules-align "$SJ2" 2000 align-learned+prior_top1 rules-align-learned+prior_top2 \
    rules-align-learned+prior_full rules-align-learned+prior+hold_top1 \
    rules-align-learned+prior+draw_full
rejudge small-rules-mix "$SJ2" 2000 mix-learned+prior_top1 rules-mix-learned+prior_top2 \
    rules-mix-learned+prior_full rules-mix-learned+prior+hold_top1 \
    rules-mix-learned+prior+draw_full
log "done: $OUT/rejudge-*.txt and .json"
