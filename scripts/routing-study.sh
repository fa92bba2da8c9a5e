#!/bin/bash
# routing-study.sh — the routing study of docs/routing.md, end to end, resumable: the data
# partition, the evaluation classifier, monoliths and ensembles trained with the same total
# compute under several recipes, the router, and `tessera eval` of every entry with intervals.
#
#   scripts/routing-study.sh [quick|small|full] [RUN_DIR]   (default: small, runs/routing-<budget>)
#
# Budgets (training compute in samples of a `tiny` DiT, 3 × 83.3 MFLOP each):
#   quick   480 × 64 = 30 720 samples per side; n = 500 per entry; the headline arms only (the
#           b8 monolith, the warm start, the label split) with a shorter evaluation classifier
#           (3 000 steps): a check that the whole study runs, in about 20 min on 2 cores. Its
#           numbers are not results.
#   small   2 400 × 64 = 153 600 samples per side; n = 2 000 samples per eval entry.
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
# ens-warm-b8 part-label part-random align mix part-features part-features4 part-features16
# part-hier part-k4 part-k16 part-label4 router-label; and, not in the default, mono-b8-s2
# mono-b8-s3 part-label-s2 part-ae router-ae), EVAL (0 to train only), JUDGES (judge files, comma-separated: every evaluation also
# scores its entries in each, `tessera eval --judges`).
#
# Outputs in RUN_DIR: the weights, eval-<arm>.json (tessera eval --json: FD with intervals,
# precision/recall, IS, per-class and per-cluster FD), report-<arm>.html, samples-<arm>/ (IDX),
# loss-<arm>.json (tessera loss: held-out loss per cluster, experts against the monoliths).
#
# Arms (docs/routing.md "Training recipes at equal compute"):
#   mono-s1, mono-s2  the monolith of docs/training.md (batch 64, lr 5e-4, EMA 0.999), two seeds
#   mono-b8           the monolith at batch 8 with 8× the steps (lr 2e-4): the recipe control
#   mono-b8-s2        the same with seed 2: the seed noise of the best monolith
#   mono-b8-s3        and with seed 3
#   ens-base          8 experts, today's recipe (scripts/train-ensemble.sh: batch 64, lr 5e-4,
#                     EMA 0.998), expert k with |shard k|/60 000 of the samples
#   ens-b8            8 experts at batch 8 with 8× the steps (lr 2e-4)
#   warm              a shared warm start: WARM_PCT % of the budget on all the data (batch 64)
#   ens-warm-b8       8 experts started from `warm`, the remaining budget at batch 8
#   part-label        the ens-warm-b8 recipe on `tessera partition --by label` (K = 8)
#   part-label-s2     part-label's second seed: its own warm start (`warm-s2`, seed 2) and
#                     experts of seeds 11…18, evaluated against every b8 monolith seed here
#   part-random       the same on `--by random` (the control: clusters that know nothing)
#   align             a router trained with --objective alignment through the ens-warm-b8
#                     experts (300 steps; every sample runs all 8 experts: its compute is
#                     reported with the results)
#   mix               a router trained with --objective mixture through the same experts (the
#                     loss of the weighted mixture of their velocities; 300 steps)
#   part-features     the ens-warm-b8 recipe on k-means of a separate network's features (a
#                     classifier trained here with another seed and trunk, never the evaluation
#                     classifier: the stand-in for DDM's DINOv2 embeddings)
#   part-features4, part-features16  the features partition with K = 4 and K = 16
#   part-ae           the same on k-means of an autoencoder's bottleneck (`tessera train-judge
#                     --kind ae`, seed 5, trained here without labels: not the ae judge, seed 3):
#                     an unsupervised partition, DDM's setting
#   router-ae         Paris's setting on part-ae (clusters that span classes): a router on
#                     (x_t, t) only (1 500 steps), the class given to the experts and no class
#                     prior — top1, top2 and full against the monolith (n = N_ROUTER, default
#                     2 000: full runs every expert); with the experts' held-out loss on every
#                     cluster (tessera loss), the router's calibration along t, and the same
#                     with a coverage router (--objective alignment: the experts' own losses)
#   part-hier         the same on DDM's two-level k-means (64 fine centroids merged into 8)
#   part-k4, part-k16 the same on pixel k-means with K = 4 and K = 16
#   part-label4       the same on the split by label with K = 4 (classes grouped)
#   router-label      a label-aware router (train-router --label-aware) over the ens-warm-b8
#                     experts: p(k | x_t, y) learned instead of the hand-made class prior
# and, with the routers: `tessera calibrate` of each (calib-<router>.json), then evaluations of
# the routing policies (a fitted temperature, the label-aware router) and of guidance (CFG 2,
# exact mixture guidance) against the b8 monolith, and each learned router (cluster, alignment,
# mixture) on every selection rule (top1, top2, full, held per trajectory, drawn per trajectory).
# The EMA horizon is kept in samples across batch sizes: a batch-8 run's decay cap is
# 1 − (1 − cap at batch 64) / 8 (0.999 → 0.999875, 0.998 → 0.99975), and the warm-up
# (1 + s)/(10 + s) already averages the last ~1/9 of the samples seen at any batch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
budget=${1:-small}
case "$budget" in
quick) TOTAL=480 MONO_WARMUP=20 EXP_WARMUP=4 N=${N:-500} CLS_STEPS=3000
    ARMS=${ARMS:-mono-b8 warm part-label} ;;
small) TOTAL=2400 MONO_WARMUP=100 EXP_WARMUP=20 N=${N:-2000} ;;
full) TOTAL=12000 MONO_WARMUP=500 EXP_WARMUP=100 N=${N:-5000} ;;
*)
    echo "usage: scripts/routing-study.sh [quick|small|full] [RUN_DIR]" >&2
    exit 2
    ;;
esac
RUN=${2:-runs/routing-$budget}
T=$(realpath "${TESSERA:-build/client/tessera}")
LANES=${LANES:-2}
WARM_PCT=${WARM_PCT:-20}
ARMS=${ARMS:-mono-s1 mono-s2 mono-b8 ens-base ens-b8 warm ens-warm-b8 part-label part-random align mix part-features part-features4 part-features16 part-hier part-k4 part-k16 part-label4 router-label}
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

# ensemble NAME [ENV...]: 8 experts into $RUN/NAME/ (scripts/train-ensemble.sh) on the
# partition $PART (default partition8)
ensemble() {
    local name=$1
    shift
    mkdir -p "$RUN/$name"
    log "ensemble $name: $*"
    env "$@" TESSERA="$T" THREADS=1 DATA_DIR="$STORE/$name" nice scripts/train-ensemble.sh \
        "$RUN/${PART:-partition8}" "$RUN/$name" "${TOTAL_OVERRIDE:-$TOTAL}" > "$RUN/$name.log" 2>&1
    log "done $name"
}

classifier() {
    [ -f "$RUN/classifier.safetensors" ] && return 0
    log "evaluation classifier (patch 7, depth 2, ${CLS_STEPS:-9000} steps)"
    nice "$T" train-classifier --patch 7 --depth 2 --steps "${CLS_STEPS:-9000}" --no-augment --threads 1 \
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
has mono-b8-s2 && jobs_run train mono-b8-s2 --steps "$b8_steps" --batch 8 --lr 2e-4 \
    --warmup $((MONO_WARMUP * 8)) --ema 0.999875 --seed 2
has mono-b8-s3 && jobs_run train mono-b8-s3 --steps "$b8_steps" --batch 8 --lr 2e-4 \
    --warmup $((MONO_WARMUP * 8)) --ema 0.999875 --seed 3
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
# the cluster router: for the learned policy's arms (the label split is routed by the class)
if [[ " $ARMS " == *" ens-"* || " $ARMS " == *" align "* || " $ARMS " == *" mix "* ||
    " $ARMS " == *" router-label "* ]]; then
    jobs_run router
fi
for by in label random; do
    if { has "part-$by" || has "part-$by-s2"; } && [ ! -f "$RUN/partition8-$by/partition.safetensors" ]; then
        nice "$T" partition --experts 8 --by "$by" --seed 0 --out "$RUN/partition8-$by" --json \
            > "$RUN/partition8-$by.json"
    fi
done
has part-label && PART=partition8-label TOTAL_OVERRIDE=$((TOTAL - warm_steps)) \
    jobs_run ensemble part-label BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975 \
    INIT="$RUN/warm.safetensors"
# a second seed of the label-split ensemble: its own warm start (seed 2) and experts (seeds 11…18)
if has part-label-s2; then
    train warm-s2 --steps "$warm_steps" --batch 64 --lr 5e-4 --warmup "$EXP_WARMUP" --ema 0.998 \
        --seed 2
    PART=partition8-label TOTAL_OVERRIDE=$((TOTAL - warm_steps)) jobs_run ensemble part-label-s2 \
        BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975 INIT="$RUN/warm-s2.safetensors" SEED=11
fi
has part-random && PART=partition8-random TOTAL_OVERRIDE=$((TOTAL - warm_steps)) \
    jobs_run ensemble part-random BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975 \
    INIT="$RUN/warm.safetensors"
# partition strategies (docs/routing.md §4): each with the ens-warm-b8 recipe
partition() { # NAME ARGS...: $RUN/NAME/ and $RUN/NAME.json
    local name=$1
    shift
    [ -f "$RUN/$name/partition.safetensors" ] && return 0
    nice "$T" partition --seed 0 --out "$RUN/$name" --json "$@" > "$RUN/$name.json"
}
features() { has part-features || has part-features4 || has part-features16; }
if features && [ ! -f "$RUN/featnet.safetensors" ]; then
    log "the features network (patch 4, depth 2, seed 1, 3 000 steps)"
    nice "$T" train-classifier --patch 4 --depth 2 --steps 3000 --threads 1 --seed 1 \
        --out "$RUN/featnet.safetensors" > "$RUN/featnet.log" 2>&1
fi
for k in 8 4 16; do
    arm=part-features$([ "$k" = 8 ] || echo "$k")
    has "$arm" && partition "partition$k-features" --experts "$k" --features "$RUN/featnet.safetensors"
done
if has part-ae && [ ! -f "$RUN/aenet.safetensors" ]; then
    log "the unsupervised features network (an autoencoder, seed 5, 3 000 steps)"
    nice "$T" train-judge --kind ae --seed 5 --steps 3000 --threads 1 \
        --out "$RUN/aenet.safetensors" > "$RUN/aenet.log" 2>&1
fi
has part-ae && partition partition8-ae --experts 8 --features "$RUN/aenet.safetensors"
has part-hier && partition partition8-hier --experts 8 --hierarchical 64
has part-k4 && partition partition4 --experts 4
has part-k16 && partition partition16 --experts 16
has part-label4 && partition partition4-label --experts 4 --by label
for arm in features:partition8-features ae:partition8-ae features4:partition4-features \
    features16:partition16-features label4:partition4-label hier:partition8-hier k16:partition16 \
    k4:partition4; do
    has "part-${arm%%:*}" || continue
    PART=${arm#*:} TOTAL_OVERRIDE=$((TOTAL - warm_steps)) jobs_run ensemble "part-${arm%%:*}" \
        BATCH=8 LR=2e-4 WARMUP="$EXP_WARMUP" EMA=0.99975 INIT="$RUN/warm.safetensors"
done
if has router-ae && [ ! -f "$RUN/router-ae.safetensors" ]; then
    log "router on the autoencoder partition (patch 7, depth 2, 1 500 steps)"
    nice "$T" train-router --partition "$RUN/partition8-ae" --steps 1500 --patch 7 --depth 2 \
        --threads 1 --seed 0 --out "$RUN/router-ae.safetensors" > "$RUN/router-ae.log" 2>&1
fi
if has router-label && [ ! -f "$RUN/router-label.safetensors" ]; then
    log "router, label-aware (patch 7, depth 2, 1 500 steps, label dropout 0.1)"
    jobs_run sh -c "nice '$T' train-router --partition '$RUN/partition8' --label-aware \
        --steps 1500 --patch 7 --depth 2 --threads 1 --seed 0 \
        --out '$RUN/router-label.safetensors' > '$RUN/router-label.log' 2>&1"
fi
wait
# the routers trained through the frozen ens-warm-b8 experts (every sample runs all eight)
for obj in align:alignment mix:mixture; do
    name=router-${obj%%:*}
    if has "${obj%%:*}" && [ ! -f "$RUN/$name.safetensors" ]; then
        log "router, ${obj#*:} objective through the ens-warm-b8 experts"
        nice "$T" train-router --partition "$RUN/partition8" --objective "${obj#*:}" \
            --experts "$RUN/ens-warm-b8" --steps 300 --patch 7 --depth 2 --threads "$LANES" \
            --seed 0 --out "$RUN/$name.safetensors" > "$RUN/$name.log" 2>&1
    fi
done
log "training done"
[ "${EVAL:-1}" = 0 ] && exit 0

# ---- evaluation -----------------------------------------------------------------------------
# Each ensemble folder gets the router; "monolith" is the first entry of every run, so that every
# entry has its paired difference to it.
COMMON=(--classifier "$RUN/classifier.safetensors" --steps 20 --sampler euler
    --seed 0 --bootstrap 200 --threads 1 --json)
[ -n "${JUDGES:-}" ] && COMMON+=(--judges "$JUDGES")
evaluate() { # NAME DIR MONOLITHS POLICIES (COMMON_CFG: the guidance scale, default 1; EVAL_N:
    # the samples per entry, default N)
    [ -f "$RUN/eval-$1.json" ] && return 0
    mkdir -p "$RUN/samples-$1"
    nice "$T" eval --local "$2" --monolith "$3" --policies "$4" "${COMMON[@]}" --n "${EVAL_N:-$N}" \
        --cfg "${COMMON_CFG:-1}" \
        --save-samples "$RUN/samples-$1" --report "$RUN/report-$1.html" \
        > "$RUN/eval-$1.json" 2> "$RUN/eval-$1.log" || rm -f "$RUN/eval-$1.json"
    log "evaluated $1"
}
losses() { # DIR
    [ -f "$RUN/loss-$1.json" ] && return 0
    nice "$T" loss --local "$RUN/$1" \
        --monolith "$RUN/mono-s1.safetensors,$RUN/mono-s2.safetensors,$RUN/mono-b8.safetensors" \
        --per-cluster 128 --threads 1 --json > "$RUN/loss-$1.json" 2> "$RUN/loss-$1.err" ||
        rm -f "$RUN/loss-$1.json"
    log "losses of $1"
}
HEAD="monolith learned+prior:top1 centroid+prior:top1 learned+prior+hold:top1 learned+prior:top2"
for arm in ens-base ens-b8 ens-warm-b8 part-label part-random; do
    has "$arm" || continue
    cp "$RUN/router.safetensors" "$RUN/$arm/router.safetensors" 2>/dev/null || true
done
has ens-base && jobs_run evaluate base "$RUN/ens-base" \
    "$RUN/mono-s1.safetensors,$RUN/mono-s2.safetensors,$RUN/mono-b8.safetensors" \
    "monolith monolith2 monolith3 learned+prior:top1 centroid+prior:top1 learned+prior+hold:top1 learned+prior:top2 learned:top1"
has ens-b8 && jobs_run evaluate b8 "$RUN/ens-b8" "$RUN/mono-s1.safetensors" "$HEAD"
has ens-warm-b8 && has mono-s1 && jobs_run evaluate warm "$RUN/ens-warm-b8" \
    "$RUN/mono-s1.safetensors" "$HEAD"
# the label partition: a class's expert is known, the prior routes exactly (uniform+prior)
# the headline pairs: against the best monolith recipe (b8), with a router-free entry
has ens-b8 && jobs_run evaluate b8-vs-mb8 "$RUN/ens-b8" "$RUN/mono-b8.safetensors" \
    "monolith learned+prior:top1 uniform+prior:top1"
has ens-warm-b8 && jobs_run evaluate warm-vs-mb8 "$RUN/ens-warm-b8" "$RUN/mono-b8.safetensors" \
    "monolith learned+prior:top1 uniform+prior:top1 learned+prior+draw:full"
# the label partition: a class's expert is known, the prior routes exactly (uniform+prior)
has part-label && jobs_run evaluate label "$RUN/part-label" "$RUN/mono-b8.safetensors" \
    "monolith uniform+prior:top1"
# the seeds: the second label-split ensemble against the b8 monoliths this run folder holds
# (samples of the first seeds, in earlier run folders, pair with these in `tessera judge`)
if has part-label-s2; then
    monos=""
    for m in mono-b8-s3 mono-b8-s2 mono-b8; do
        [ -f "$RUN/$m.safetensors" ] && monos+="${monos:+,}$RUN/$m.safetensors"
    done
    pols=monolith
    [[ $monos == *,* ]] && pols+=" monolith2"
    [[ $monos == *,*,* ]] && pols+=" monolith3"
    jobs_run evaluate label-s2 "$RUN/part-label-s2" "$monos" "$pols uniform+prior:top1"
fi
has part-random && jobs_run evaluate random "$RUN/part-random" "$RUN/mono-b8.safetensors" \
    "monolith uniform:top1 uniform:full"
with_router() { # ROUTER: $RUN/ens-warm-b8-ROUTER, the warm-b8 experts with $RUN/router-ROUTER
    mkdir -p "$RUN/ens-warm-b8-$1"
    cp "$RUN"/ens-warm-b8/expert-*.safetensors "$RUN/ens-warm-b8/partition.safetensors" \
        "$RUN/ens-warm-b8-$1/"
    cp "$RUN/router-$1.safetensors" "$RUN/ens-warm-b8-$1/router.safetensors"
}
for r in align mix; do
    has "$r" || continue
    with_router "$r"
    jobs_run evaluate "$r" "$RUN/ens-warm-b8-$r" "$RUN/mono-b8.safetensors" \
        "monolith learned:top1 learned+prior:top1"
done
# (not the label split: tessera loss groups the test images by nearest centroid, which for a
# split by label is not its clusters)
for arm in ens-base ens-b8 ens-warm-b8; do
    has "$arm" && has mono-s1 && has mono-s2 && jobs_run losses "$arm"
done
# partition strategies: router-free (uniform+prior) and by the centroids (centroid+prior)
# the unsupervised partition against two monolith seeds
# (those of the b8 recipe that this run folder holds: an earlier run's samples of another seed
# can be paired with these by `tessera judge`, since sample i's noise and class are the same)
if has part-ae; then
    monos=""
    for m in mono-b8 mono-b8-s2; do
        [ -f "$RUN/$m.safetensors" ] && monos+="${monos:+,}$RUN/$m.safetensors"
    done
    pols=monolith
    [[ $monos == *,* ]] && pols+=" monolith2"
    jobs_run evaluate part-ae "$RUN/part-ae" "$monos" "$pols uniform+prior:top1 centroid+prior:top1"
fi
# Paris's setting: the router on (x_t, t) alone over the unsupervised partition's experts
if has router-ae && has part-ae; then
    mkdir -p "$RUN/part-ae-router"
    cp "$RUN"/part-ae/expert-*.safetensors "$RUN/part-ae/partition.safetensors" "$RUN/part-ae-router/"
    cp "$RUN/router-ae.safetensors" "$RUN/part-ae-router/router.safetensors"
    mono=$RUN/mono-b8.safetensors
    [ -f "$mono" ] || mono=$RUN/mono-b8-s2.safetensors
    EVAL_N=${N_ROUTER:-2000} jobs_run evaluate part-ae-router "$RUN/part-ae-router" "$mono" \
        "monolith learned:top1 learned:top2 learned:full"
    [ -f "$RUN/loss-part-ae.json" ] || nice "$T" loss --local "$RUN/part-ae" --monolith "$mono" \
        --per-cluster 128 --threads 1 --json > "$RUN/loss-part-ae.json"
    [ -f "$RUN/calib-router-ae.json" ] || nice "$T" calibrate --router "$RUN/router-ae.safetensors" \
        --partition "$RUN/partition8-ae" --threads 1 --json > "$RUN/calib-router-ae.json"
    # the coverage router: trained on the experts' own losses (the alignment objective)
    [ -f "$RUN/router-ae-align.safetensors" ] || nice "$T" train-router --partition \
        "$RUN/partition8-ae" --objective alignment --experts "$RUN/part-ae" --steps 300 --patch 7 \
        --depth 2 --threads 1 --seed 0 --out "$RUN/router-ae-align.safetensors" \
        > "$RUN/router-ae-align.log" 2>&1
    mkdir -p "$RUN/part-ae-align"
    cp "$RUN"/part-ae/expert-*.safetensors "$RUN/part-ae/partition.safetensors" "$RUN/part-ae-align/"
    cp "$RUN/router-ae-align.safetensors" "$RUN/part-ae-align/router.safetensors"
    EVAL_N=${N_ROUTER:-2000} jobs_run evaluate part-ae-align "$RUN/part-ae-align" "$mono" \
        "monolith learned:top1 learned:top2 learned:full"
fi
for arm in features features4 features16 label4 hier k16 k4; do
    has "part-$arm" && jobs_run evaluate "part-$arm" "$RUN/part-$arm" "$RUN/mono-b8.safetensors" \
        "monolith uniform+prior:top1 centroid+prior:top1"
done
wait
# the routers' calibration, then the routing policies with a fitted temperature and with the
# label-aware router, and guidance (CFG 2, exact mixture guidance), all against the b8 monolith
calibrate() { # NAME
    [ -f "$RUN/calib-$1.json" ] && return 0
    nice "$T" calibrate --router "$RUN/$1.safetensors" --partition "$RUN/partition8" \
        --threads 1 --json > "$RUN/calib-$1.json" || rm -f "$RUN/calib-$1.json"
}
if has ens-warm-b8; then
    calibrate router
    temp=$(python3 -c "import json,sys; print('%.3f' % json.load(open(sys.argv[1]))['temperature'])" \
        "$RUN/calib-router.json")
    jobs_run evaluate policies "$RUN/ens-warm-b8" "$RUN/mono-b8.safetensors" \
        "monolith learned+prior:top1 learned+prior+temp=$temp:top1 uniform+prior:top1 centroid+prior:top1"
    COMMON_CFG=2 jobs_run evaluate cfg2 "$RUN/ens-warm-b8" "$RUN/mono-b8.safetensors" \
        "monolith learned+prior:top1 learned+prior+exact:top1"
fi
if has part-label; then
    COMMON_CFG=2 jobs_run evaluate label-cfg2 "$RUN/part-label" "$RUN/mono-b8.safetensors" \
        "monolith uniform+prior:top1 uniform+prior+exact:top1"
fi
if has router-label && has ens-warm-b8; then
    calibrate router-label
    mkdir -p "$RUN/ens-warm-b8-label"
    cp "$RUN"/ens-warm-b8/expert-*.safetensors "$RUN/ens-warm-b8/partition.safetensors" \
        "$RUN/ens-warm-b8-label/"
    cp "$RUN/router-label.safetensors" "$RUN/ens-warm-b8-label/router.safetensors"
    jobs_run evaluate router-label "$RUN/ens-warm-b8-label" "$RUN/mono-b8.safetensors" \
        "monolith learned:top1 learned+prior:top1"
fi
# each learned router on every selection rule
RULES="monolith learned+prior:top1 learned+prior:top2 learned+prior:full learned+prior+hold:top1 learned+prior+draw:full"
if has ens-warm-b8; then
    jobs_run evaluate rules-cluster "$RUN/ens-warm-b8" "$RUN/mono-b8.safetensors" "$RULES"
    for r in align mix; do
        has "$r" && jobs_run evaluate "rules-$r" "$RUN/ens-warm-b8-$r" "$RUN/mono-b8.safetensors" \
            "$RULES"
    done
fi
wait
log "evaluation done: $RUN/eval-*.json, $RUN/loss-*.json"
