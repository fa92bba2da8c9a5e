#!/bin/sh
# test_gpu_daemon.sh TESSERA TESSERAD — a daemon with `[compute] device = cuda` trains and serves
# on the GPU end to end: it logs and advertises a cuda device, trains 40 steps (checkpoints in
# the store, snapshots served), and `tessera generate --peer` draws images through it. The same
# run with `tessera train --device cuda` must end with finite weights. A second cuda daemon hosts
# an imported learned-σ expert, and `generate --sampler ddpm` takes its variance from the GPU.
# Where no GPU can be used (no CUDA backend in this build, no device, no driver) it exits 77
# (ctest: skipped) with the reason; everything it checks needs the GPU.
set -eu
T=${1:?usage: test_gpu_daemon.sh TESSERA TESSERAD}
D=${2:?usage: test_gpu_daemon.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
logs="$dir/d.log" log_lines=20

F=$dir/experts
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$F"
if ! "$T" train --partition "$F" --cluster 0 --model tiny --steps 20 --batch 16 --seed 0 \
    --device cuda --graphs --data-dir "$dir/st" --out "$F/expert-0.safetensors" >"$dir/out.txt" \
    2>"$dir/err.txt"; then
    if grep -q "cannot start the engine" "$dir/err.txt"; then
        echo "SKIP: no GPU here: $(grep -o 'cannot start the engine.*' "$dir/err.txt")"
        exit 77
    fi
    cat "$dir/err.txt" >&2
    fail "tessera train --device cuda"
fi
grep -q "computing on cuda:0" "$dir/err.txt" || fail "train --device cuda does not say it runs on cuda:0"
echo "ok: tessera train --device cuda trains on $(grep -o 'computing on .*' "$dir/err.txt" | cut -c14-)"
# --graphs: step 2 captured, steps 2-20 launched (model/trainer.h)
grep -q "^CUDA graphs: on, 1 captured, 19 steps launched as one" "$dir/err.txt" ||
    fail "train --graphs: $(grep -i 'graph' "$dir/err.txt")"
echo "ok: tessera train --graphs ran 19 of its 20 steps as one CUDA graph launch each"

run "$T" keygen --network-key --out "$dir/net.key"
run "$T" keygen --out "$dir/id.key"
cat >"$dir/d.ini" <<INI
[node]
identity = $dir/id.key
network_key = $dir/net.key
data_dir = $dir/data
listen = 127.0.0.1:0
[expert]
mode = train
partition = $F/partition.safetensors
cluster = 1
[compute]
device = cuda
[train]
model = tiny
steps = 40
batch = 16
ckpt_every = 10
serve_while_training = true
graphs = true
[metrics]
listen =
[log]
file = $dir/d.log
INI
"$D" --config "$dir/d.ini" &
pids=$!
i=0
until grep -q "done: 40 steps" "$dir/d.log" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 1800 ] || fail "the daemon did not finish training on the GPU"; sleep 0.1
done
grep -q "training on cuda:0" "$dir/d.log" || fail "the trainer did not log cuda:0"
grep -q "graphs: step 2's forward and backward captured into a CUDA graph" "$dir/d.log" ||
    fail "[train] graphs = true: $(grep -i 'graph' "$dir/d.log")"
i=0
until grep -q "serving expert .* on cuda:0" "$dir/d.log"; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the server is not on cuda:0"; sleep 0.1
done
peer=$(cat "$dir/data/listen.addr")
"$T" status --peer "$peer" --network-key "$dir/net.key" --json >"$dir/s.json" || fail "status"
"$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if all(a["capacity"]["device"].startswith("cuda:0, ") for a in s["adverts"]) else 1)' \
    "$dir/s.json" || fail "the advert does not name the GPU: $(head -c 400 "$dir/s.json")"
echo "ok: tesserad with device = cuda trained 40 steps and serves on the GPU, and advertises it"
# (cluster 0 has no node: it is routed around, with a warning, and the run still completes)
"$T" generate --peer "$peer" --network-key "$dir/net.key" --policy uniform --n 8 --steps 4 \
    --seed 3 --data-dir "$dir/client" --out "$dir/net.png" >"$dir/gen.txt" 2>&1 ||
    fail "generate through the GPU node: $(tail -3 "$dir/gen.txt")"
[ -s "$dir/net.png" ] || fail "generate wrote no image"
echo "ok: generate --peer drew 8 images through the GPU node"

# DDPM with DiT's learned σ served from the GPU: an imported epsilon expert with learned σ (DiT's
# published layout, random weights) on a second daemon, device = cuda, for cluster 0 (its
# answers carry their variance rows, serve.c's pinned copy); generate --peer --sampler ddpm takes
# its variance and no evaluation degrades
"$PY" "$(dirname "$0")/parity/dit_torch.py" sigma-checkpoint "$dir/sig.pt" --input-size 28 --in-channels 1 ||
    fail "making a learned-sigma checkpoint"
run "$T" import "$dir/sig.pt" --heads 4 --partition "$F" --cluster 0 --out "$dir/sig.safetensors" \
    --quiet
run "$T" keygen --out "$dir/id2.key"
cat >"$dir/d2.ini" <<INI
[node]
identity = $dir/id2.key
network_key = $dir/net.key
data_dir = $dir/data2
listen = 127.0.0.1:0
bootstrap = $peer
[expert]
mode = host
weights = $dir/sig.safetensors
partition = $F/partition.safetensors
[compute]
device = cuda
[metrics]
listen =
[log]
file = $dir/d2.log
INI
"$D" --config "$dir/d2.ini" &
pids="$pids $!"
i=0
until grep -q "serving expert .* on cuda:0" "$dir/d2.log" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the learned-σ expert is not served on cuda:0: $(tail -3 "$dir/d2.log")"; sleep 0.1
done
i=0
until "$T" status --peer "$peer" --network-key "$dir/net.key" --json >"$dir/s2.json" 2>/dev/null &&
    "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if any(a["model"].get("learn_sigma") for a in s["adverts"] if a.get("valid")) else 1)' "$dir/s2.json"; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "no advert says learn_sigma: $(head -c 400 "$dir/s2.json")"; sleep 0.2
done
"$T" generate --peer "$peer" --network-key "$dir/net.key" --sampler ddpm --n 4 --steps 4 \
    --cfg 1.5 --seed 5 --policy uniform --select full --data-dir "$dir/client2" --json \
    --out "$dir/sig.png" >"$dir/gen2.json" 2>"$dir/gen2.err" ||
    fail "generate --sampler ddpm through the GPU's learned-σ expert: $(tail -3 "$dir/gen2.err")"
[ "$(json_get "$dir/gen2.json" "j['ddpm_variance']")" = learned ] ||
    fail "ddpm's variance is not the learned one: $(cat "$dir/gen2.json")"
[ "$(json_get "$dir/gen2.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "evaluations degraded: $(cat "$dir/gen2.err")"
echo "ok: a GPU daemon serves a learned-σ expert with its variance: generate --sampler ddpm takes it"
