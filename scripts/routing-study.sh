#!/bin/bash
# routing-study.sh — the routing study of docs/routing.md, end to end, resumable: the data
# partition, the evaluation classifier, monoliths and ensembles trained with the same total
# compute under several recipes, the router, and `tessera eval` of every entry with intervals.
#
#   scripts/routing-study.sh [small|full] [RUN_DIR]      (default: small, runs/routing-<budget>)
#
# Budgets (training compute in samples of a `tiny` DiT, 3 × 83.3 MFLOP each):
#   small   2 400 × 64 = 153 600 samples per side; n = 1 000 samples per eval entry.
#           About 70 min on 2 idle cores (two one-thread lanes).
#   full   12 000 × 64 = 768 000 samples per side (the monolith of docs/training.md);
#           n = 5 000 per entry. About 6 h on 2 cores.
#
# Every step is skipped when its output exists, and every training resumes from its newest
# checkpoint, so the script can be stopped and run again. Two jobs run at a time (LANES), each
# on one thread; `nice` keeps the machine usable.
#
# Environment: TESSERA (default build/client/tessera), LANES (2), N (samples per eval entry),
# ARMS (which training arms; default all of: mono-s1 mono-s2 mono-b8 ens-base ens-b8 warm
# ens-warm-b8), EVAL (0 to train only).
#
# Arms (docs/routing.md "Training recipes at equal compute"):
#   mono-s1, mono-s2  the monolith of docs/training.md (batch 64, lr 5e-4, EMA 0.999), two seeds
#   mono-b8           the monolith at batch 8 with 8× the steps (lr 2e-4): the recipe control
#   ens-base          8 experts, today's recipe (scripts/train-ensemble.sh: batch 64, lr 5e-4,
#                     EMA 0.998), expert k with |shard k|/60 000 of the samples
#   ens-b8            8 experts at batch 8 with 8× the steps (lr 2e-4)
#   warm              a shared warm start: WARM_PCT % of the budget on all the data (batch 64)
#   ens-warm-b8       8 experts started from `warm`, the remaining budget at batch 8
# The EMA horizon is kept in samples across batch sizes: a batch-8 run's decay cap is
# 1 − (1 − cap at batch 64) / 8 (0.999 → 0.999875, 0.998 → 0.99975), and the warm-up
# (1 + s)/(10 + s) already averages the last ~1/9 of the samples seen at any batch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
budget=${1:-small}
case "$budget" in
small) TOTAL=2400 MONO_WARMUP=100 EXP_WARMUP=20 N=${N:-1000} ;;
full) TOTAL=12000 MONO_WARMUP=500 EXP_WARMUP=100 N=${N:-5000} ;;
*)
    echo "usage: scripts/routing-study.sh [small|full] [RUN_DIR]" >&2
    exit 2
    ;;
esac
RUN=${2:-runs/routing-$budget}
T=$(realpath "${TESSERA:-build/client/tessera}")
LANES=${LANES:-2}
WARM_PCT=${WARM_PCT:-20}
ARMS=${ARMS:-mono-s1 mono-s2 mono-b8 ens-base ens-b8 warm ens-warm-b8}
[ -x "$T" ] || {
    echo "routing-study: $T is not built (make build)" >&2
    exit 1
}
mkdir -p "$RUN"
RUN=$(realpath "$RUN")
STORE="$RUN/store"
echo "routing-study: budget $budget ($TOTAL × 64 samples per side), run folder $RUN"

has() { [[ " $ARMS " == *" $1 "* ]]; }
log() { echo "[$(date +%H:%M:%S)] $*"; }

# the shared prerequisites, in order: partition, then the classifier
if [ ! -f "$RUN/partition8/partition.safetensors" ]; then
    log "partition (K = 8, pixel PCA + k-means)"
    nice "$T" partition --experts 8 --seed 0 --out "$RUN/partition8" --json \
        > "$RUN/partition8.json"
fi

# finished FILE STEPS: the weights file exists and was written at the end of a STEPS-step run
# (the trainer also writes it at every checkpoint)
finished() { [ -f "$1" ] && grep -q "\"train_steps\":\"$2\"" "$1" 2>/dev/null; }

# train NAME --steps N ARGS...: one monolith-style run (all of the data) into $RUN/NAME.safetensors
train() {
    local name=$1
    shift
    finished "$RUN/$name.safetensors" "$2" && return 0
    log "train $name: $*"
    nice "$T" train --model tiny --threads 1 --data-dir "$STORE" --run "$name" --resume \
        --ckpt-every 400 --log-every 200 --loss-log "$RUN/$name.loss" \
        --out "$RUN/$name.safetensors" "$@" > "$RUN/$name.log" 2>&1
    log "done $name: $(tail -n 1 "$RUN/$name.log")"
}

# ensemble NAME [ENV...]: 8 experts into $RUN/NAME/ (scripts/train-ensemble.sh)
ensemble() {
    local name=$1
    shift
    mkdir -p "$RUN/$name"
    log "ensemble $name: $*"
    env "$@" TESSERA="$T" THREADS=1 DATA_DIR="$STORE/$name" nice scripts/train-ensemble.sh \
        "$RUN/partition8" "$RUN/$name" "${TOTAL_OVERRIDE:-$TOTAL}" > "$RUN/$name.log" 2>&1
    log "done $name"
}

classifier() {
    [ -f "$RUN/classifier.safetensors" ] && return 0
    log "evaluation classifier (patch 7, depth 2, 9 000 steps)"
    nice "$T" train-classifier --patch 7 --depth 2 --steps 9000 --no-augment --threads 1 \
        --seed 0 --out "$RUN/classifier.safetensors" > "$RUN/classifier.log" 2>&1
}

router() {
    [ -f "$RUN/router.safetensors" ] && return 0
    log "router (patch 7, depth 2, 1 500 steps)"
    nice "$T" train-router --partition "$RUN/partition8" --steps 1500 --patch 7 --depth 2 \
        --threads 1 --seed 0 --out "$RUN/router.safetensors" > "$RUN/router.log" 2>&1
}

# a pool of LANES jobs
jobs_run() {
    while [ "$(jobs -rp | wc -l)" -ge "$LANES" ]; do wait -n || true; done
    "$@" &
}

b8_steps=$((TOTAL * 8))
jobs_run classifier
has mono-s1 && jobs_run train mono-s1 --steps "$TOTAL" --batch 64 --lr 5e-4 \
    --warmup "$MONO_WARMUP" --ema 0.999 --seed 1
has mono-s2 && jobs_run train mono-s2 --steps "$TOTAL" --batch 64 --lr 5e-4 \
    --warmup "$MONO_WARMUP" --ema 0.999 --seed 2
has ens-base && jobs_run ensemble ens-base BATCH=64 LR=5e-4 WARMUP="$EXP_WARMUP" EMA=0.998
has ens-b8 && jobs_run ensemble ens-b8 BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975
warm_steps=$((TOTAL * WARM_PCT / 100))
if has warm || has ens-warm-b8; then
    # the warm start must exist before its experts start
    train warm --steps "$warm_steps" --batch 64 --lr 5e-4 --warmup "$EXP_WARMUP" --ema 0.998 \
        --seed 1
fi
has ens-warm-b8 && TOTAL_OVERRIDE=$((TOTAL - warm_steps)) jobs_run ensemble ens-warm-b8 \
    BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975 INIT="$RUN/warm.safetensors"
has mono-b8 && jobs_run train mono-b8 --steps "$b8_steps" --batch 8 --lr 2e-4 \
    --warmup $((MONO_WARMUP * 8)) --ema 0.999875 --seed 1
jobs_run router
wait
log "training done"
[ "${EVAL:-1}" = 0 ] && exit 0
