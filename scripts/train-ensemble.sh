#!/bin/sh
# train-ensemble.sh — trains one `tiny` expert per cluster of a partition with the same total
# training compute as one monolith of TOTAL_STEPS steps at batch 64 (TOTAL_STEPS × 64 samples):
# expert k gets its share |shard k| / |train set| of those samples, so every expert sees its
# shard as many times as the monolith sees the whole set, in round(samples / BATCH) steps.
#
#   scripts/train-ensemble.sh PARTITION_DIR OUT_DIR [TOTAL_STEPS]
#
# Environment: TESSERA (the binary, default build/client/tessera), BATCH (64; a smaller batch
# gives proportionally more steps for the same samples), LR (5e-4), WARMUP (100, in steps at
# batch 64: scaled by 64 / BATCH), EMA (0.998), INIT (a weights file every expert starts from: a
# shared warm start, whose own compute the caller charges to the budget), SEED (k + SEED for
# expert k, default 1), DATA_DIR (the checkpoint store, default OUT_DIR/store), CLUSTERS (which
# experts, e.g. "3 6 7"; default all) and THREADS (per training, default all cores): on a busy
# 2-core machine two scripts with THREADS=1 and disjoint CLUSTERS finish sooner than one.
# Writes OUT_DIR/expert-<k>.safetensors (with partition_id and cluster in the metadata), a copy of
# the partition artifact, and OUT_DIR/train-<k>.log. Re-running resumes unfinished experts.
set -eu
part=${1:?usage: train-ensemble.sh PARTITION_DIR OUT_DIR [TOTAL_STEPS]}
out=${2:?usage: train-ensemble.sh PARTITION_DIR OUT_DIR [TOTAL_STEPS]}
total=${3:-12000}
tessera=${TESSERA:-build/client/tessera}
batch=${BATCH:-64} lr=${LR:-5e-4} warmup=${WARMUP:-100} ema=${EMA:-0.998} threads=${THREADS:-0}
seed0=${SEED:-1}
mkdir -p "$out"
store=${DATA_DIR:-$out/store}
cp "$part/partition.safetensors" "$out/partition.safetensors"
n_all=0
for f in "$part"/shard-*.txt; do
    n_all=$((n_all + $(grep -vc '^#' "$f")))
done
all=$(k=0; while [ -f "$part/shard-$k.txt" ]; do printf '%d ' $k; k=$((k + 1)); done)
warm=$(( (warmup * 64 + batch / 2) / batch ))
for k in ${CLUSTERS:-$all}; do
    [ -f "$part/shard-$k.txt" ] || { echo "no $part/shard-$k.txt" >&2; exit 1; }
    n=$(grep -vc '^#' "$part/shard-$k.txt")
    # samples = total × 64 × n / n_all, steps = samples / batch, rounded to nearest
    steps=$(( (total * 64 * n + n_all * batch / 2) / (n_all * batch) ))
    if [ -f "$out/expert-$k.safetensors" ] && grep -q "\"train_steps\":\"$steps\"" \
        "$out/expert-$k.safetensors" 2>/dev/null; then
        echo "expert $k: done already ($steps steps)"
    else
        echo "expert $k: $n images, $steps steps × $batch"
        "$tessera" train --partition "$part" --cluster "$k" --model tiny --steps "$steps" \
            --batch "$batch" --lr "$lr" --warmup "$warm" --ema "$ema" --seed $((k + seed0)) \
            --threads "$threads" ${INIT:+--init "$INIT"} \
            --log-every 100 --ckpt-every 250 --data-dir "$store" --run "expert-$k" --resume \
            --out "$out/expert-$k.safetensors" --loss-log "$out/loss-$k.txt" \
            2> "$out/train-$k.log"
        tail -n 1 "$out/train-$k.log"
    fi
done
