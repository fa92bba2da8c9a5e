#!/bin/sh
# test_auto.sh TESSERA TESSERAD — `[expert] mode = auto` with real daemons: a seed node hosts
# cluster 0 of a 4-cluster partition; 6 auto nodes join knowing only the network (the key and
# the seed's address). They fetch the partition from the seed, spread over the clusters and,
# since nobody else has weights for clusters 1–3, train them (serving each checkpoint); every
# cluster ends up covered and every auto node serves something. Then the sole host of a cluster
# is killed (kill -9) and an auto node from a cluster with a spare replica takes it over.
# (That spare replicas follow demand is tested on the decision itself, tests/test_assign.c.)
# Waits are generous; nothing here asserts speed.
set -eu
T=${1:?usage: test_auto.sh TESSERA TESSERAD}
D=${2:?usage: test_auto.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
logs="$dir/*.log" log_grep="auto|error|warn" log_lines=8

F=$dir/experts
run "$T" partition --experts 4 --restarts 1 --max-iter 5 --seed 1 --out "$F"
run "$T" train --partition "$F" --cluster 0 --model tiny --steps 2 --batch 8 --seed 0 \
    --data-dir "$dir/st" --out "$F/expert-0.safetensors"
run "$T" keygen --network-key --out "$dir/net.key"

# node NAME MODE [BOOTSTRAP]: its identity and config
node() {
    mkdir -p "$dir/$1"
    run "$T" keygen --out "$dir/$1/id.key"
    if [ "$2" = host ]; then
        expert="mode = host
weights = $F/expert-0.safetensors
partition = $F/partition.safetensors"
    else
        expert="mode = auto
auto_interval_s = 2
auto_dwell_s = 4"
    fi
    {
        node_section "$1" "${3:-}"
        cat <<INI
[expert]
$expert
[train]
model = tiny
steps = 60
batch = 8
ckpt_every = 5
threads = 1
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
for n in 1 2 3 4 5 6; do node "auto$n" auto "$seed"; done

# view ADDR: the status of a node as JSON into $dir/s.json
view() { "$T" status --peer "$1" --network-key "$dir/net.key" --json >"$dir/s.json" 2>/dev/null; }
# covered: every cluster of the partition has a live expert, and N experts are advertised
covered() {
    "$PY" - "$dir/s.json" "$1" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
live = {m["node_id"] for m in s["members"] if m["state"] in ("alive", "suspect")}
ads = [a for a in s["adverts"] if a.get("valid") and a["node_id"] in live]
clusters = {a["cluster"] for a in ads}
sys.exit(0 if len(ads) >= int(sys.argv[2]) and clusters == {0, 1, 2, 3} else 1)
PYEOF
}
i=0
until view "$seed" && covered 7; do
    i=$((i + 1)); [ $i -lt 240 ] || fail "the auto nodes did not cover every cluster: $(head -c 600 "$dir/s.json")"
    sleep 0.5
done
n_trained=$(grep -l "no live node serves it: training it" "$dir"/auto*.log | wc -l)
[ "$(grep -l "fetching partition" "$dir"/auto*.log | wc -l)" -ge 1 ] || fail "no auto node fetched the partition"
[ "$n_trained" -ge 3 ] || fail "only $n_trained auto nodes trained a cluster nobody served"
echo "ok: 6 auto nodes fetched the partition, trained the 3 clusters nobody served, and every cluster is covered ($n_trained trained)"

# the sole host of some cluster (7 experts on 4 clusters: one has a single one) dies
victim=$("$PY" - "$dir/s.json" <<'PYEOF'
import json, sys
s = json.load(open(sys.argv[1]))
live = {m["node_id"]: m["addr"] for m in s["members"] if m["state"] == "alive"}
ads = [a for a in s["adverts"] if a.get("valid") and a["node_id"] in live]
by = {}
for a in ads:
    by.setdefault(a["cluster"], []).append(live[a["node_id"]])
k = sorted(c for c, v in by.items() if len(v) == 1)[0]
print(k, by[k][0])
PYEOF
)
k=${victim% *}
vaddr=${victim#* }
for d in "$dir"/seed "$dir"/auto[0-9]; do
    if [ "$(cat "$d/data/listen.addr")" = "$vaddr" ]; then vdir=$d; fi
done
kill -9 "$(cat "$vdir/pid")"
[ "$vdir" = "$dir/seed" ] && probe=$(cat "$dir/auto1/data/listen.addr") || probe=$seed
i=0
until view "$probe" && covered 6 &&
    "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if not any(m["addr"]==sys.argv[2] and m["state"] in ("alive","suspect") for m in s["members"]) else 1)' "$dir/s.json" "$vaddr"; do
    i=$((i + 1)); [ $i -lt 240 ] || fail "cluster $k was not taken over after its host died: $(head -c 600 "$dir/s.json")"
    sleep 0.5
done
grep -h "auto: cluster $k of partition" "$dir"/auto*.log | tail -n 1 | grep -q "uncovered" ||
    fail "no auto node logged taking cluster $k over"
echo "ok: the sole host of cluster $k was killed and an auto node took the cluster over"
