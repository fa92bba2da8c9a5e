#!/bin/bash
# scripts/demo-experts.sh — how the experts the repository ships (experts/demo/) were made, with
# this project's own `tessera`: a partition of Fashion-MNIST's train set into 4 clusters, one
# `mini` expert per cluster (DiT: hidden 64, depth 2, 2 heads, patch 4; 0.7 MB each) and a small
# router. They are what `make demo` (scripts/demo.sh) starts a network with: small enough to
# ship (about 4 MB in all), trained long enough to draw recognisable clothes.
#
#   scripts/demo-experts.sh [OUT]       (default experts/demo; about 25 min on 2 cores)
#
# Environment: TESSERA (the binary, default build/client/tessera), STEPS (per expert, 8000),
# THREADS (per process, 1: the four experts train two at a time).
set -euo pipefail
T=${TESSERA:-build/client/tessera}
OUT=${1:-experts/demo}
STEPS=${STEPS:-8000}
THREADS=${THREADS:-1}
store=$(mktemp -d)
trap 'rm -rf "$store"' EXIT
mkdir -p "$OUT"
"$T" partition --experts 4 --seed 1 --out "$OUT"
train() {
    "$T" train --partition "$OUT" --cluster "$1" --model mini --steps "$STEPS" --batch 64 \
        --lr 6e-4 --warmup 200 --ema 0.999 --seed "$1" --threads "$THREADS" --log-every 500 \
        --data-dir "$store" --out "$OUT/expert-$1.safetensors"
}
train 0 & train 1 & wait
train 2 & train 3 & wait
"$T" train-router --partition "$OUT" --model mini --patch 7 --steps 3000 --threads 2 \
    --out "$OUT/router.safetensors"
# the shard lists and the picture of the clusters are not needed to generate
rm -f "$OUT"/shard-*.txt "$OUT"/clusters.png
du -sh "$OUT"
