#!/bin/sh
# bench_relay.sh TESSERA TESSERAD [OUT.json] — what a relay costs, on loopback, side by side in
# one run: the same node, first carried by a relay ([relay] via, no bandwidth cap), then — the
# relay killed — at its own address.
#   latency:    `tessera ping` round trips (200) to the node through the relay, and directly;
#   throughput: `tessera pull` of a 30 MB expert (a `small` DiT) from the node, 3 times each way.
# Prints a table and writes the raw numbers as JSON (docs/benchmarks.md, "Relays").
set -eu
T=${1:?usage: bench_relay.sh TESSERA TESSERAD [OUT.json]}
D=${2:?usage: bench_relay.sh TESSERA TESSERAD [OUT.json]}
OUT=${3:-}
PY=/usr/bin/python3
ROOT=$(cd "$(dirname "$0")/.." && pwd)
F=$ROOT/experts/demo
dir=$(mktemp -d)
pids=
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
wait_log() {
    i=0
    while ! grep -qsE "$2" "$1"; do
        i=$((i + 1)); [ $i -lt 600 ] || { echo "no /$2/ in $1" >&2; tail "$1" >&2; exit 1; }; sleep 0.1
    done
}
"$T" keygen --network-key --out "$dir/net.key" >/dev/null
"$T" train --partition "$F" --cluster 0 --model small --steps 1 --batch 2 --warmup 0 \
    --data-dir "$dir/st" --out "$dir/big.safetensors" >/dev/null 2>&1
node() { # NAME BOOTSTRAP EXTRA
    mkdir -p "$dir/$1"
    "$T" keygen --out "$dir/$1/id.key" >/dev/null
    {
        printf '[node]\nidentity = %s\nnetwork_key = %s\ndata_dir = %s\nlisten = 127.0.0.1:0\n' \
            "$dir/$1/id.key" "$dir/net.key" "$dir/$1/data"
        [ -n "$2" ] && printf 'bootstrap = %s\n' "$2"
        printf '[metrics]\nlisten =\n[log]\nfile = %s\n' "$dir/$1.log"
        printf '%b' "${3:-}"
    } >"$dir/$1/d.ini"
    "$D" --config "$dir/$1/d.ini" 2>>"$dir/$1.err" &
    pids="$pids $!"
    echo $! >"$dir/$1.pid"
}
node relay "" '[relay]\nserve = true\nbandwidth_mib_s = 0\n'
wait_log "$dir/relay.log" ready
seed=$(cat "$dir/relay/data/listen.addr")
node n "$seed" "[relay]\nvia = $seed\n[expert]\nmode = host\nweights = $dir/big.safetensors\npartition = $F/partition.safetensors\n"
wait_log "$dir/n.log" "reached through relay .* at (127\.0\.0\.1:[0-9]+)"
relayed=$(grep -oE "reached through relay .* at 127\.0\.0\.1:[0-9]+" "$dir/n.log" | grep -oE "[0-9.]+:[0-9]+$" | tail -1)
direct=$(cat "$dir/n/data/listen.addr")
sleep 2
ping() { "$T" ping "$1" --network-key "$dir/net.key" --count 200 --json; }
pull() { # PEER RUN: one pull into a fresh store
    "$T" pull --all --peer "$1" --network-key "$dir/net.key" --data-dir "$dir/pull-$2" --json
}
ping "$relayed" >"$dir/ping-relayed.json"
ping "$direct" >"$dir/ping-direct.json"
for i in 1 2 3; do pull "$seed" "r$i" >>"$dir/pull-relayed.jsonl"; done
grep -q "\"from\":\"$relayed\"" "$dir/pull-relayed.jsonl" || { echo "the pull did not go through the relay" >&2; exit 1; }
kill -9 "$(cat "$dir/relay.pid")"
wait_log "$dir/n.log" "no relay at"
sleep 3 # the node's claim at its own address spreads
node s2 "$direct" ""
wait_log "$dir/s2.log" ready
sleep 2
for i in 1 2 3; do pull "$(cat "$dir/s2/data/listen.addr")" "d$i" >>"$dir/pull-direct.jsonl"; done
grep -q "\"from\":\"$direct\"" "$dir/pull-direct.jsonl" || { echo "the direct pull went elsewhere" >&2; cat "$dir/pull-direct.jsonl" >&2; exit 1; }
"$PY" - "$dir" "$OUT" <<'EOF'
import json, statistics, sys
d, out = sys.argv[1], sys.argv[2]
ping = {k: json.load(open(f"{d}/ping-{k}.json")) for k in ("direct", "relayed")}
pull = {k: [json.loads(l) for l in open(f"{d}/pull-{k}.jsonl")] for k in ("direct", "relayed")}
mibs = {k: [p["bytes_fetched"] / p["seconds"] / 2**20 for p in v] for k, v in pull.items()}
res = {"ping_rtt_ms": {k: v["rtt_ms"] for k, v in ping.items()},
       "handshake_ms": {k: v["handshake_ms"] for k, v in ping.items()},
       "pull_mib_s": mibs, "pull_bytes": pull["direct"][0]["bytes_fetched"]}
print("%-10s %12s %12s %12s %14s" % ("path", "rtt p50 ms", "rtt p99 ms", "handshake ms", "pull MiB/s"))
for k in ("direct", "relayed"):
    r = ping[k]["rtt_ms"]
    print("%-10s %12.3f %12.3f %12.3f %14.1f" % (k, r["p50"], r["p99"], ping[k]["handshake_ms"],
                                                 statistics.median(mibs[k])))
a, b = ping["direct"]["rtt_ms"]["p50"], ping["relayed"]["rtt_ms"]["p50"]
print("relay adds %.3f ms to a round trip (p50); carries %.0f%% of the direct pull's throughput"
      % (b - a, 100 * statistics.median(mibs["relayed"]) / statistics.median(mibs["direct"])))
if out:
    json.dump(res, open(out, "w"), indent=1)
EOF
