#!/bin/bash
# bench/bench_netgen.sh — generation over the network against the same generation in one process
# (the network generation benchmark), in one run on this machine:
#   - time per step with 4 experts and top2 routing, over a loopback network of 4 tesserad
#     (`tessera generate --peer`) against `tessera generate --local`, at batch 1 and batch 64;
#   - images per second of the network with top1 against one local expert of the same size
#     (a one-expert folder, which is `tessera sample` bit for bit), routing every step and
#     routing until t = 0.5 (--route until=0.5).
# Times are the generations' own (their JSON "seconds": the sampling loop, not start-up).
# The experts are `tiny` (the compute of real ones) trained for 2 steps: speed does not depend
# on the weights' values. Each measurement is the median of REPS runs.
#
#   bench/bench_netgen.sh [BUILD]     (default build; prints a Markdown table and JSON lines)
#
# Environment: REPS (3), STEPS (20), THREADS (compute threads of the client and of each daemon,
# default 2), DAEMON_THREADS (of each daemon alone, default THREADS: 1 gives the four daemons
# the machine's two cores between them, as machines of their own would not need to), MAX_BATCH
# (each daemon's [serve] max_batch in rows, default 16, the daemon's default).
set -euo pipefail
B=${1:-build}
T=$B/client/tessera
REPS=${REPS:-3}
STEPS=${STEPS:-20}
THREADS=${THREADS:-2}
DAEMON_THREADS=${DAEMON_THREADS:-$THREADS}
UNTIL=${UNTIL:-0.5}        # --route until=UNTIL for the last row
MAX_BATCH=${MAX_BATCH:-16} # each daemon's [serve] max_batch (rows); 16 is the daemon's default
dir=$(mktemp -d)
trap '"$T" down --dir "$dir/net" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
q() { "$@" >/dev/null 2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; exit 1; }; }

F=$dir/experts
q "$T" partition --experts 4 --restarts 1 --max-iter 5 --seed 1 --out "$F"
for k in 0 1 2 3; do
    q "$T" train --partition "$F" --cluster $k --model tiny --steps 2 --batch 8 --seed $k \
        --data-dir "$dir/st" --out "$F/expert-$k.safetensors"
done
q "$T" train-router --partition "$F" --steps 2 --batch 8 --eval-n 16 --patch 7 --depth 1 \
    --out "$F/router.safetensors"
"$T" up --nodes 4 --experts "$F" --dir "$dir/net" --compute-threads "$DAEMON_THREADS" --max-batch "$MAX_BATCH" --json \
    >"$dir/up.json" 2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; exit 1; }
peer=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["peer"])' "$dir/up.json")
NET=(--peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cache")

# seconds ARGS...: the generation's own wall time (its JSON summary), median of REPS runs
seconds() {
    for r in $(seq "$REPS"); do
        "$T" "$@" --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["seconds"])'
    done | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
COMMON=(--steps "$STEPS" --sampler euler --threads "$THREADS")
echo "| measurement | network | local | network − local | ratio |"
echo "|---|---|---|---|---|"
for n in 1 64; do
    net=$(seconds generate "${NET[@]}" --n $n "${COMMON[@]}" --select top2 --out "$dir/n.png")
    loc=$(seconds generate --local "$F" --n $n "${COMMON[@]}" --select top2 --out "$dir/l.png")
    python3 - "$n" "$net" "$loc" "$STEPS" <<'PY'
import json, sys
n, net, loc, steps = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
a, b = 1e3 * net / steps, 1e3 * loc / steps
print(f"| ms per step, top2 of 4, batch {n} | {a:.2f} | {b:.2f} | {a - b:+.2f} ms | {a / b:.3f} |")
print(json.dumps({"bench": "netgen_step", "batch": n, "network_ms": a, "local_ms": b}), file=sys.stderr)
PY
done
net=$(seconds generate "${NET[@]}" --n 64 "${COMMON[@]}" --select top1 --out "$dir/n.png")
# the router's late evaluations skipped (docs/routing.md: the FD does not move)
until=$(seconds generate "${NET[@]}" --n 64 "${COMMON[@]}" --select top1 --route "until=$UNTIL" \
    --out "$dir/n.png")
mkdir -p "$dir/one" && cp "$F/expert-0.safetensors" "$dir/one/" # one expert: `tessera sample`
loc=$(seconds generate --local "$dir/one" --n 64 "${COMMON[@]}" --out "$dir/l.png")
python3 - "$net" "$until" "$loc" "$UNTIL" <<'PY'
import json, sys
net, until, loc, until_t = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
print(f"| images/s, 64 images: network top1 of 4 vs one local expert | {64 / net:.1f} | {64 / loc:.1f} | | {loc / net:.3f} |")
print(f"| images/s, the same with --route until={until_t} | {64 / until:.1f} | {64 / loc:.1f} | | {loc / until:.3f} |")
print(json.dumps({"bench": "netgen_images", "network_img_s": 64 / net,
                  "network_until_img_s": 64 / until, "local_img_s": 64 / loc}), file=sys.stderr)
PY
