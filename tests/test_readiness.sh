#!/bin/sh
# test_readiness.sh TESSERA TESSERAD — an expert still training is kept out of the images, and the
# node training it shows its work:
#   - a seed node hosts cluster 0 of a 2-cluster partition; a second node trains cluster 1
#     (a long run, serving each checkpoint, as an auto node does);
#   - the trainer logs its progress (step, loss, steps/s, time left) from its first step, and its
#     own status answer carries the job before any snapshot is advertised;
#   - `status` does not count cluster 1 as covered while its only expert trains, and says so;
#   - `generate --peer` does not route to it: cluster 1 is uncovered, named, with the trainer's
#     step; the image equals, byte for byte, the image of the network once the trainer has left;
#   - `--min-trained 0` uses it (cluster 1 gets evaluations, and the image differs);
#   - both experts advertise their held-out loss, and `--ready-loss R` admits the training expert
#     when its loss is within R of the finished expert's, or keeps it out naming both losses.
# Waits are generous; nothing here asserts speed.
set -eu
T=${1:?usage: test_readiness.sh TESSERA TESSERAD}
D=${2:?usage: test_readiness.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
logs="$dir/*.log $dir/*.err $dir/err*.txt"

F=$dir/experts
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$F"
run "$T" train --partition "$F" --cluster 0 --model tiny --steps 2 --batch 8 --seed 0 \
    --data-dir "$dir/st" --out "$F/expert-0.safetensors"
run "$T" keygen --network-key --out "$dir/net.key"

# node NAME MODE [BOOTSTRAP [TRAIN_LINE]]: a host of cluster 0, or a trainer of cluster 1
node() {
    mkdir -p "$dir/$1"
    run "$T" keygen --out "$dir/$1/id.key"
    if [ "$2" = host ]; then
        expert="mode = host
weights = $F/expert-0.safetensors
partition = $F/partition.safetensors"
    else
        expert="mode = train
partition = $F/partition.safetensors
cluster = 1"
    fi
    {
        node_section "$1" "${3:-}"
        cat <<INI
[expert]
$expert
[train]
model = tiny
steps = 100000
batch = 4
ckpt_every = 400
threads = 1
serve_while_training = true
progress_every_s = 1
${4:-}
[serve]
compute_threads = 1
[gossip]
probe_interval_ms = 200
probe_timeout_ms = 100
[metrics]
listen =
[log]
file = $dir/$1.log
INI
    } >"$dir/$1/d.ini"
    start_node "$1"
}
node seed host
wait_listen "$dir/seed" "the seed"
seed=$(cat "$dir/seed/data/listen.addr")
node trainer train "$seed"
wait_listen "$dir/trainer" "the trainer" 60
taddr=$(cat "$dir/trainer/data/listen.addr")

# the progress line from the first step, and again (every second here)
wait_log "$dir/trainer.log" "step [0-9]+/100000 \([0-9.]+%\), loss [0-9.]+ .*steps/s.* to go"
n1=$(grep -cE "step [0-9]+/100000 \(" "$dir/trainer.log")
wait_log "$dir/trainer.log" "step [0-9]+/100000 \(.*served from its newest checkpoint"
[ "$(grep -cE "step [0-9]+/100000 \(" "$dir/trainer.log")" -gt "$n1" ] ||
    fail "only one progress line"
echo "ok: the trainer logs its progress: $(grep -m1 -oE "step [0-9]+/100000 .*" "$dir/trainer.log")"

# its own status answer: the job, with its rate and time left
"$T" status --peer "$taddr" --network-key "$dir/net.key" --json >"$dir/own.json" 2>"$dir/err-st.txt" ||
    fail "status of the trainer"
"$PY" - "$dir/own.json" <<'PYEOF' || fail "the trainer's status has no training job: $(head -c 600 "$dir/own.json")"
import json, sys
j = json.load(open(sys.argv[1]))
t = j["training"]
assert t and t["steps"] == 100000 and 0 < t["step"] < 100000 and t["cluster"] == 1, t
assert t["steps_per_s"] > 0 and t["eta_s"] > 0 and len(t["partition_id"]) == 64, t
PYEOF
"$T" status --peer "$taddr" --network-key "$dir/net.key" >"$dir/own.txt" 2>>"$dir/err-st.txt" ||
    fail "status (text) of the trainer"
grep -qE "this node trains cluster 1 of partition [0-9a-f]+: step [0-9]+ of 100000 .*left" "$dir/own.txt" ||
    fail "status does not show the node's training: $(cat "$dir/own.txt")"
echo "ok: the trainer's status shows its job: $(grep -m1 'this node trains' "$dir/own.txt")"

# the seed's view, once the trainer's advert (a training snapshot) has reached it
advert_seen() {
    "$T" status --peer "$seed" --network-key "$dir/net.key" --json >"$dir/s.json" 2>/dev/null &&
        "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if any(a.get("valid") and a["cluster"]==1 and a["training"] for a in j["adverts"]) else 1)' "$dir/s.json"
}
i=0
until advert_seen; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the seed never saw the trainer's advert: $(head -c 600 "$dir/s.json")"
    sleep 0.2
done
"$PY" - "$dir/s.json" <<'PYEOF' || fail "status counts a training expert as covering: $(head -c 800 "$dir/s.json")"
import json, sys
a = json.load(open(sys.argv[1]))["aggregates"]
assert [c["cluster"] for c in a["clusters"]] == [0], a
u = [c for c in a["uncovered"] if c["cluster"] == 1]
assert u and u[0]["training_experts"] == 1, a
PYEOF
"$T" status --peer "$seed" --network-key "$dir/net.key" >"$dir/s.txt" 2>/dev/null || fail "status (text)"
grep -qE "uncovered: [0-9a-f]+:1 \(1 training\)" "$dir/s.txt" ||
    fail "status does not say cluster 1's expert is training: $(cat "$dir/s.txt")"
echo "ok: status counts cluster 1 uncovered while its only expert trains ($(grep -m1 'uncovered:' "$dir/s.txt"))"

GEN="--n 8 --steps 3 --sampler euler --seed 5 --policy uniform --select full"
gen() { # gen NAME ARGS...: through the seed, JSON summary in NAME.json
    name=$1
    shift
    "$T" generate --peer "$seed" --network-key "$dir/net.key" --data-dir "$dir/cache" --json \
        $GEN "$@" --out "$dir/$name.png" >"$dir/$name.json" 2>"$dir/err-$name.txt" ||
        fail "generate $name: $(cat "$dir/err-$name.txt")"
}
gen held
grep -qE "cluster 1: 1 expert still training, not used \(the furthest, at $taddr: step [0-9]+ of 100000" \
    "$dir/err-held.txt" || fail "generate does not say why cluster 1 is not used: $(cat "$dir/err-held.txt")"
grep -q "UNCOVERED: cluster 1, routed around" "$dir/err-held.txt" || fail "no UNCOVERED line: $(cat "$dir/err-held.txt")"
"$PY" - "$dir/held.json" <<'PYEOF' || fail "the summary of the held-back run: $(cat "$dir/held.json")"
import json, sys
j = json.load(open(sys.argv[1]))
u = j["uncovered"]
assert len(u) == 1 and u[0]["cluster"] == 1 and u[0]["reason"] == "training", u
assert u[0]["training"]["steps"] == 100000 and u[0]["training"]["experts"] == 1, u
assert j["expert_share"][1] == 0 and j["expert_share"][0] == 1, j["expert_share"]
PYEOF
echo "ok: generate keeps the training expert out and says so: $(grep -m1 'cluster 1: ' "$dir/err-held.txt")"

gen any --min-trained 0
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["expert_share"][1] > 0 and not j["uncovered"] else 1)' \
    "$dir/any.json" || fail "--min-trained 0 did not use the training expert: $(cat "$dir/any.json")"
cmp -s "$dir/any.png" "$dir/held.png" && fail "--min-trained 0 gave the same image"
echo "ok: --min-trained 0 uses it"

# the held-out loss: expert-0 (finished: `tessera train` wrote it into its metadata) and the
# trainer's snapshot advertise theirs; the trainer's own status has its newest; the loss bar
# admits the training expert when generous and keeps it out when strict, naming both losses
"$T" status --peer "$seed" --network-key "$dir/net.key" --json >"$dir/s.json" 2>/dev/null || fail "status"
"$T" status --peer "$taddr" --network-key "$dir/net.key" --json >"$dir/own.json" 2>/dev/null || fail "status"
"$PY" - "$dir/s.json" "$dir/own.json" <<'PYEOF' || fail "held-out loss in the adverts: $(head -c 900 "$dir/s.json")"
import json, sys
seen, own = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
by = {a["cluster"]: a for a in seen["adverts"] if a.get("valid")}
assert by[0]["heldout_loss"] > 0 and by[0]["training"] is None, by[0]
assert by[1]["heldout_loss"] > 0 and by[1]["training"], by[1]
t = own["training"]
assert t["heldout_loss"] > 0 and 0 < t["heldout_step"] <= t["step"], t
PYEOF
echo "ok: finished and training experts advertise their held-out loss"
gen loose --ready-loss 1000
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if j["expert_share"][1] > 0 and not j["uncovered"] else 1)' \
    "$dir/loose.json" || fail "--ready-loss 1000 did not use the training expert: $(cat "$dir/loose.json")"
cmp -s "$dir/loose.png" "$dir/any.png" || fail "--ready-loss 1000 and --min-trained 0 differ"
gen strict --ready-loss 0.001
grep -qE "cluster 1: 1 expert still training, not used \(.*held-out loss [0-9.]+ against [0-9.]+ for the finished experts" \
    "$dir/err-strict.txt" || fail "the held-out losses are not named: $(cat "$dir/err-strict.txt")"
"$PY" - "$dir/strict.json" <<'PYEOF' || fail "--ready-loss 0.001: $(cat "$dir/strict.json")"
import json, sys
j = json.load(open(sys.argv[1]))
u = j["uncovered"]
assert len(u) == 1 and u[0]["cluster"] == 1 and j["expert_share"][1] == 0, j
t = u[0]["training"]
assert t["heldout_loss"] > 0 and t["reference_loss"] > 0, t
PYEOF
cmp -s "$dir/strict.png" "$dir/held.png" || fail "--ready-loss 0.001 differs from the default"
echo "ok: --ready-loss admits the training expert by its held-out loss, or keeps it out and says why"

# a trainer told to serve only past half its run: its checkpoints stay unadvertised
node late train "$seed" "serve_from = 0.5"
wait_log "$dir/late.log" "checkpoint of step [0-9]+ in the store"
wait_listen "$dir/late" "the late trainer" 60
laddr=$(cat "$dir/late/data/listen.addr")
sleep 2 # an advert would have reached the seed by now
"$T" status --peer "$laddr" --network-key "$dir/net.key" --json >"$dir/late.json" 2>/dev/null ||
    fail "status of the late trainer"
"$T" status --peer "$seed" --network-key "$dir/net.key" --json >"$dir/s.json" 2>/dev/null ||
    fail "status of the seed"
"$PY" - "$dir/late.json" "$dir/s.json" <<'PYEOF' || fail "serve_from: $(head -c 600 "$dir/late.json")"
import json, sys
own, seen = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert own["training"] and own["training"]["served"] is False, own["training"]
assert not any(a["node_id"] == own["node_id"] for a in seen["adverts"]), "advertised before the bar"
PYEOF
grep -q "host: serving" "$dir/late.log" && fail "serve_from = 0.5 served a checkpoint at the start"
kill -TERM "$(cat "$dir/late/pid")"
echo "ok: [train] serve_from keeps a train-mode node's checkpoints unadvertised until the bar"

# the network without the trainer: the same image as while it was held back
kill -TERM "$(cat "$dir/trainer/pid")"
i=0
until "$T" status --peer "$seed" --network-key "$dir/net.key" --json >"$dir/s.json" 2>/dev/null &&
    "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if not any(m["addr"]==sys.argv[2] and m["state"] in ("alive","suspect") for m in j["members"]) else 1)' "$dir/s.json" "$taddr"; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the seed still sees the trainer"
    sleep 0.2
done
gen without
cmp -s "$dir/without.png" "$dir/held.png" ||
    fail "the image with a held-back training expert differs from the network without it"
echo "ok: with the training expert held back the image equals the network without it, byte for byte"
