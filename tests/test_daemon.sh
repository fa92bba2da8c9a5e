#!/bin/sh
# test_daemon.sh TESSERA TESSERAD — tesserad serving and training, as processes:
#   - 16 clients generating at once through one network each get exactly their --local image
#     (their requests are batched together by the servers: answers must not mix);
#   - SIGTERM to a node in the middle of a generation: the node drains and exits 0, the client's
#     image is unchanged (a replica takes over);
#   - train mode: a daemon training an expert (serving its snapshots, with the training status in
#     its advert) is killed with -9 after a checkpoint, restarted, resumes from the store and ends
#     with the same weights, byte for byte, as a daemon that trained without interruption; the
#     other daemon sees its advert, and each new version of it;
#   - /metrics counts the requests served.
# Experts are trained for 2 steps: this checks plumbing and exact invariants, not quality.
set -eu
T=${1:?usage: test_daemon.sh TESSERA TESSERAD}
D=${2:?usage: test_daemon.sh TESSERA TESSERAD}
. "$(dirname "$0")/lib.sh"
nets="$dir/net" logs="$dir/*.log $dir/err*.txt"

F=$dir/experts
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$F"
for k in 0 1; do
    run "$T" train --partition "$F" --cluster $k --model tiny --steps 2 --batch 8 --seed $k \
        --data-dir "$dir/st" --out "$F/expert-$k.safetensors"
done

# ---- 16 clients at once ----
"$T" up --nodes 4 --experts "$F" --dir "$dir/net" --json >"$dir/up.json" 2>"$dir/err-up.txt" ||
    fail "tessera up"
peer=$(json_get "$dir/up.json" "j['peer']")
ARGS="--n 3 --steps 3 --sampler euler --cfg 1.5 --policy uniform --select full"
for c in $(seq 1 16); do
    "$T" generate --local "$F" $ARGS --seed $((100 + c)) --out "$dir/l$c.png" 2>/dev/null || fail "local $c"
done
cpids=
for c in $(seq 1 16); do
    "$T" generate --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/c$c" \
        $ARGS --seed $((100 + c)) --out "$dir/n$c.png" 2>"$dir/err-c$c.txt" &
    cpids="$cpids $!"
done
for p in $cpids; do wait "$p" || fail "a concurrent client failed"; done
for c in $(seq 1 16); do
    cmp -s "$dir/n$c.png" "$dir/l$c.png" || fail "client $c got another image than its --local one"
done
echo "ok: 16 concurrent clients each get exactly their --local image"

# /metrics of a node counts what it served
mport=$(sed -n 's|.*metrics on http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$dir/net/node-0/tesserad.log" | head -n 1)
[ -n "$mport" ] || fail "node 0 logged no metrics address"
sleep 1.5 # the registry is refreshed every second
"$T" ping "$peer" --network-key "$dir/net/network.key" --count 2 >/dev/null 2>&1 || fail "tessera ping"
sleep 1.5 # the registry is refreshed every second
"$PY" - "$mport" <<'PY' || fail "/metrics does not count what node 0 did"
import sys, time, urllib.request
def value(prefix):
    v = [float(l.split()[-1]) for l in body.splitlines() if l.startswith(prefix)]
    return v[0] if v else 0.0
want = {  # every RPC the clients and the other nodes made of node 0, and the TCP traffic
    'tessera_requests_total{type="denoise"}': 1, 'tessera_requests_total{type="status"}': 16,
    'tessera_requests_total{type="manifest"}': 1, 'tessera_requests_total{type="chunk"}': 1,
    'tessera_requests_total{type="ping"}': 2, 'tessera_requests_total{type="push_pull"}': 1,
    'tessera_net_received_bytes_total{transport="tcp"}': 1e5,
    'tessera_net_sent_bytes_total{transport="tcp"}': 1e6,
    "tessera_batch_size_count": 1, "tessera_queue_wait_seconds_count": 1,
    "tessera_compute_seconds_sum": 1e-9}
# the registry is refreshed every second, and a client's closed connection is counted when the
# node's loop reads its end: on a loaded machine that can lag, so read again for up to 15 s
for attempt in range(16):
    body = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=10).read().decode()
    bad = ["%s = %g (want >= %g)" % (k, value(k), w) for k, w in want.items() if value(k) < w]
    # the 16 clients' connections, closed by the clients: an orderly end (eof) or, when a client
    # exits with bytes unread, a reset (io) — which one is a matter of timing
    gone = value('tessera_connection_closes_total{reason="eof"}') + \
        value('tessera_connection_closes_total{reason="io"}')
    if gone < 16:
        bad.append("connections closed by their peer (eof + io) = %g (want >= 16)" % gone)
    if value('tessera_gossip_members{state="alive"}') != 4:
        bad.append("alive members %g" % value('tessera_gossip_members{state="alive"}'))
    if not bad:
        break
    time.sleep(1)
print("\n".join(bad))
if bad:
    print("\n".join(l for l in body.splitlines() if l.startswith("tessera_connection_closes_total")))
sys.exit(1 if bad else 0)
PY
echo "ok: /metrics counts every RPC by type, TCP bytes, closes by reason, batches, waits, compute, members"

# ---- SIGTERM in the middle of a generation ----
LONG="--n 32 --steps 16 --sampler heun --cfg 1.5 --seed 9 --policy uniform --select full"
"$T" generate --local "$F" $LONG --out "$dir/long-local.png" 2>/dev/null || fail "local long"
"$T" generate --peer "$peer" --network-key "$dir/net/network.key" --data-dir "$dir/cl" \
    $LONG --out "$dir/long-net.png" --json >"$dir/long.json" 2>"$dir/err-long.txt" &
gen=$!
sleep 1
victim=$(cat "$dir/net/node-3/tesserad.pid")
kill -TERM "$victim"
rc=0
while kill -0 "$victim" 2>/dev/null; do sleep 0.1; done
wait $gen || fail "the generation failed when a node was stopped with SIGTERM"
cmp -s "$dir/long-net.png" "$dir/long-local.png" || fail "a SIGTERM'd node changed the image"
grep -q "stopped" "$dir/net/node-3/tesserad.log" || fail "node 3 did not log its stop"
echo "ok: SIGTERM mid-generation: the node drains and stops, the image is unchanged"
"$T" down --dir "$dir/net" >/dev/null

# ---- train mode: kill -9 and resume, bit for bit ----
"$T" keygen --network-key --out "$dir/tk.key" >/dev/null
# trainer NAME [BOOTSTRAP]: a config for a training daemon NAME
trainer() {
    mkdir -p "$dir/$1"
    [ -f "$dir/$1/id.key" ] || "$T" keygen --out "$dir/$1/id.key" --json >"$dir/$1/id.json"
    {
        node_section "$1" "${2:-}" "$dir/tk.key"
        cat <<INI
[expert]
mode = train
partition = $F/partition.safetensors
cluster = 1
[train]
model = tiny
steps = 200
batch = 8
ckpt_every = 20
threads = 1
serve_while_training = true
[gossip]
probe_interval_ms = 200
probe_timeout_ms = 100
[metrics]
listen =
[log]
file = $dir/$1.log
INI
    } >"$dir/$1/d.ini"
}
trainer straight
"$D" --config "$dir/straight/d.ini" &
p1=$!
pids="$pids $p1"
wait_listen "$dir/straight" "the first trainer"
saddr=$(cat "$dir/straight/data/listen.addr")
trainer killed "$saddr"
kid=$(sed 's/.*"node_id":"\([0-9a-f]*\)".*/\1/' "$dir/killed/id.json")
"$D" --config "$dir/killed/d.ini" &
p2=$!
pids="$pids $p2"
wait_log "$dir/killed.log" "checkpoint of step [0-9]+ in the store; at step [0-9]+/200"
kill -9 $p2
wait $p2 2>/dev/null || true
"$D" --config "$dir/killed/d.ini" &
p2=$!
pids="$pids $p2"
wait_log "$dir/killed.log" "from step [1-9][0-9]* of 200 \(resumed from the store\)"
# its adverts, as the other node sees them: the training status, and new versions as it goes
seen_version() {
    "$T" status --peer "$saddr" --network-key "$dir/tk.key" --json 2>/dev/null |
        "$PY" -c 'import json,sys; j=json.load(sys.stdin); v=[a["version"] for a in j["adverts"] if a["node_id"]==sys.argv[1]]; print(v[0] if v else 0)' "$kid"
}
i=0
v1=0
while [ "$v1" = 0 ]; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the other node never saw the trainer's advert"; sleep 0.1
    v1=$(seen_version)
done
i=0
until [ "$(seen_version)" -gt "$v1" ]; do
    i=$((i + 1)); [ $i -lt 1200 ] || fail "the trainer's advert never changed (version $v1)"; sleep 0.1
done
echo "ok: the trainer's advert reaches another node, and its changes propagate (version $v1 → $(seen_version))"
# the device it computes on: logged with the reason auto chose it, and advertised
"$T" status --peer "$saddr" --network-key "$dir/tk.key" --json 2>/dev/null >"$dir/dev.json"
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); d=[a["capacity"]["device"] for a in j["adverts"] if a["node_id"]==sys.argv[2]]; sys.exit(0 if d and d[0].startswith(("cpu, ", "cuda:")) else 1)' \
    "$dir/dev.json" "$kid" || fail "the trainer's advert names no device: $(head -c 400 "$dir/dev.json")"
grep -q "training on \(cpu, [0-9]* thread\|cuda:\)" "$dir/killed.log" ||
    fail "the trainer does not log its device: $(grep -m1 training "$dir/killed.log")"
grep -q "training on .*; memory [0-9.]* GiB for batch [0-9]* ([0-9.]* MiB per sample)" \
    "$dir/killed.log" || fail "the trainer does not log its memory: $(grep -m1 'training on' "$dir/killed.log")"
# the memory it serves with, known from the config: model bytes and bytes per row, advertised
"$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); c=[a["capacity"] for a in j["adverts"] if a["node_id"]==sys.argv[2]]; sys.exit(0 if c and c[0]["model_bytes"] > c[0]["row_bytes"] > 0 and c[0]["max_rows"] >= 1 else 1)' \
    "$dir/dev.json" "$kid" || fail "the advert's capacity has no memory figures: $(head -c 600 "$dir/dev.json")"
echo "ok: the device is logged ($(grep -m1 -o 'training on .*' "$dir/killed.log")) and advertised"
# 200 steps each, two trainers serving beside the clients on 2 cores: under AddressSanitizer the
# engine's own linear tiles are instrumented (OpenBLAS's kernels never were), which doubles a step
wait_log "$dir/straight.log" "done: 200 steps" 600
wait_log "$dir/killed.log" "done: 200 steps" 600
w1=$(sed -n 's/.*done: 200 steps.*weights \([0-9a-f]*\) in the store.*/\1/p' "$dir/straight.log")
w2=$(sed -n 's/.*done: 200 steps.*weights \([0-9a-f]*\) in the store.*/\1/p' "$dir/killed.log")
[ -n "$w1" ] && [ "$w1" = "$w2" ] || fail "resumed after kill -9: weights $w2, uninterrupted: $w1"
wait_log "$dir/killed.log" "serving expert $w2"
kill -TERM $p1 $p2
wait $p1 || fail "the training daemon did not exit 0 on SIGTERM"
wait $p2 || fail "the resumed daemon did not exit 0 on SIGTERM"
pids=
echo "ok: train mode resumes after kill -9 and ends with the same weights ($w1)"
