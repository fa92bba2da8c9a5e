#!/bin/sh
# test_netgen.sh TESSERA BAD_EXPERT TESSERAD — `tessera generate --peer` against real tesserad networks
# started by `tessera up`, with experts trained for 2 steps (the plumbing and the exact
# invariants, not quality):
#   - the network's image equals --local's with the same seed, byte for byte;
#   - kill -9 of a node mid-generation, with a replica alive: the same image, nothing degraded;
#   - a stalled node (SIGSTOP) is hedged or retried around: the same image;
#   - a replica answering garbage (tests/ts_bad_expert.c) is banned: the same image;
#   - tessera pull fetches the experts into a store (a second pull fetches nothing), and
#     --prefer-local then runs them here: the same image, no request;
#   - a client with another network key is refused, with a sentence;
#   - kill -9 of the only replica of a cluster mid-generation: the generation completes, degraded,
#     and says so, and no request waits out its (60 s) deadline — nor right after the kill, while
#     the view still has the node alive;
#   - a cluster no node serves and no store holds is routed around from the first step (a warning
#     naming it and its routing mass, `uncovered` in the JSON, nothing degraded, no request for
#     it); --require-coverage refuses;
#   - the same cluster's weights in the store (`tessera pull` from another network) serve it
#     after its hosts are gone: the --local image byte for byte;
#   - entering through a node that hosts nothing (no partition, no router): the partition and the
#     router come from the nodes that advertise them; the uniform policy fetches no router;
#   - --class C turns the class prior on by default and the summary says so.
# Waits have generous deadlines (the machine may be loaded); nothing here asserts speed.
set -eu
T=${1:?usage: test_netgen.sh TESSERA BAD_EXPERT TESSERAD}
BAD=${2:?usage: test_netgen.sh TESSERA BAD_EXPERT TESSERAD}
D=${3:?usage: test_netgen.sh TESSERA BAD_EXPERT TESSERAD}
. "$(dirname "$0")/lib.sh"
nets="$dir/netA $dir/netB $dir/netC" logs="$dir/err*.txt $dir/bare/d.log" log_lines=20
peer_of() { json_get "$dir/$1.json" "j['peer']"; }
node_pid() { cat "$dir/$1/node-$2/tesserad.pid"; }

F=$dir/experts
run "$T" partition --experts 2 --restarts 1 --max-iter 5 --seed 1 --out "$F"
for k in 0 1; do
    run "$T" train --partition "$F" --cluster $k --model tiny --steps 2 --batch 8 --seed $k \
        --data-dir "$dir/st" --out "$F/expert-$k.safetensors"
done
run "$T" train-router --partition "$F" --steps 2 --batch 8 --eval-n 16 --patch 7 --depth 1 \
    --out "$F/router.safetensors"

# GEN: the learned policy (the router comes from the network); FULL and LONG: every cluster at
# every step, so that each node's loss is felt.
GEN="--n 16 --steps 4 --sampler heun --cfg 1.5 --seed 3"
FULL="--n 16 --steps 4 --sampler heun --cfg 1.5 --seed 3 --policy uniform --select full"
LONG="--n 64 --steps 16 --sampler heun --cfg 1.5 --seed 4 --policy uniform --select full"
run "$T" generate --local "$F" $GEN --out "$dir/local.png"
run "$T" generate --local "$F" $FULL --out "$dir/local-full.png"
run "$T" generate --local "$F" $LONG --out "$dir/local-long.png"

# netgen NAME NET ARGS...: generate through network NET; JSON summary in NAME.json
netgen() {
    name=$1 net=$2
    shift 2
    "$T" generate --peer "$(peer_of "$net")" --network-key "$dir/$net/network.key" \
        --data-dir "$dir/cache" --json "$@" >"$dir/$name.json" 2>"$dir/err-$name.txt"
}

# A: 4 nodes, 2 clusters: 2 replicas each.
"$T" up --nodes 4 --experts "$F" --dir "$dir/netA" --json >"$dir/netA.json" 2>"$dir/err-up.txt" ||
    fail "tessera up"
# up --json names each node's metrics URL; the node's status says the same
m0=$(json_get "$dir/netA.json" "j['members'][0]['metrics']")
case "$m0" in http://127.0.0.1:*/metrics) ;; *) fail "up --json: node 0's metrics: '$m0'" ;; esac
"$T" status --peer "$(peer_of netA)" --network-key "$dir/netA/network.key" --json >"$dir/stA.json" ||
    fail "status"
[ "$(json_get "$dir/stA.json" "j['metrics']")" = "$m0" ] &&
    [ "$(json_get "$dir/stA.json" "j['health']")" = ok ] ||
    fail "status: metrics or health: $(head -c 300 "$dir/stA.json")"
echo "ok: up and status name each node's metrics URL; status says the node is healthy"
netgen same netA $GEN --out "$dir/net.png" || fail "generate --peer"
cmp -s "$dir/net.png" "$dir/local.png" || fail "the network's image differs from --local's"
[ "$(json_get "$dir/same.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "a healthy network degraded"
echo "ok: generate --peer = --local, byte for byte"

# requests cut by the rows a node takes (Capacity.max_rows, [serve] max_batch = 16; no
# spot-checks, which would add requests): 16 samples
# of a cluster are one request unguided, two of 8 guided (each 16 forward rows)
UNG="--n 16 --steps 4 --sampler heun --cfg 1 --seed 3 --policy uniform --select full"
run "$T" generate --local "$F" $UNG --out "$dir/local-ung.png"
netgen ung netA $UNG --verify 0 --out "$dir/ung.png" || fail "generate --peer, unguided"
cmp -s "$dir/ung.png" "$dir/local-ung.png" || fail "unguided: the network's image differs from --local's"
netgen full netA $FULL --verify 0 --out "$dir/full.png" || fail "generate --peer, full"
cmp -s "$dir/full.png" "$dir/local-full.png" || fail "full: the network's image differs from --local's"
per_eval() { json_get "$dir/$1.json" \
    "(j['network']['requests'] - j['network']['hedges'] - j['network']['retries']) / j['network']['evaluations']"; }
[ "$(per_eval ung)" = 2.0 ] && [ "$(per_eval full)" = 4.0 ] ||
    fail "requests per evaluation: unguided $(per_eval ung) (want 2: one per cluster), guided $(per_eval full) (want 4)"
echo "ok: requests carry max_rows samples unguided, half guided: 2 and 4 per evaluation, the same images"

# tessera pull: the experts into a store, verified; then --prefer-local runs them here
"$T" pull --all --peer "$(peer_of netA)" --network-key "$dir/netA/network.key" \
    --data-dir "$dir/pulled" --json >"$dir/pull.json" 2>"$dir/err-pull.txt" || fail "tessera pull --all"
[ "$(wc -l <"$dir/pull.json")" -eq 2 ] || fail "pull --all: $(cat "$dir/pull.json")"
"$T" pull --all --peer "$(peer_of netA)" --network-key "$dir/netA/network.key" \
    --data-dir "$dir/pulled" --json >"$dir/pull2.json" 2>/dev/null || fail "tessera pull again"
grep -q '"present":false' "$dir/pull2.json" && fail "a second pull fetched again: $(cat "$dir/pull2.json")"
"$T" generate --peer "$(peer_of netA)" --network-key "$dir/netA/network.key" \
    --data-dir "$dir/pulled" --prefer-local $GEN --json --out "$dir/pl.png" >"$dir/pl.json" \
    2>"$dir/err-pl.txt" || fail "generate --prefer-local"
cmp -s "$dir/pl.png" "$dir/local.png" || fail "--prefer-local changed the image"
[ "$(json_get "$dir/pl.json" "j['network']['requests']")" = 0 ] &&
    [ "$(json_get "$dir/pl.json" "j['network']['local_runs']")" -gt 0 ] ||
    fail "--prefer-local asked the network: $(cat "$dir/pl.json")"
echo "ok: tessera pull --all, then --prefer-local runs the cached experts: the same image"

# kill -9 mid-generation, with a replica alive (node i hosts cluster i mod 2)
netgen kill netA $LONG --out "$dir/kill.png" &
gen=$!
sleep 1
kill -9 "$(node_pid netA 1)"
wait $gen || fail "the generation failed when a replica was killed"
cmp -s "$dir/kill.png" "$dir/local-long.png" || fail "killing a replica changed the image"
[ "$(json_get "$dir/kill.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "a killed replica degraded the generation though another was alive"
echo "ok: kill -9 of a replica mid-generation: the same image"

# a stalled node: hedged or retried around
kill -STOP "$(node_pid netA 2)"
netgen stall netA $FULL --timeout-ms 3000 --out "$dir/stall.png" || fail "generate with a stalled node"
kill -CONT "$(node_pid netA 2)"
cmp -s "$dir/stall.png" "$dir/local-full.png" || fail "a stalled node changed the image"
moved=$(json_get "$dir/stall.json" "j['network']['hedges'] + j['network']['retries']")
[ "$moved" -gt 0 ] || fail "no request was hedged or retried around the stalled node"
echo "ok: a stalled node is hedged around ($moved hedges and retries): the same image"

# a replica that answers garbage
"$BAD" --bootstrap "$(peer_of netA)" --network-key "$dir/netA/network.key" --cluster 0 \
    >"$dir/bad.txt" 2>"$dir/err-bad.txt" &
badpid=$!
pids=$badpid
i=0
while ! grep -q listening "$dir/bad.txt" 2>/dev/null; do
    i=$((i + 1))
    [ $i -lt 300 ] || fail "the bad expert did not advertise"
    sleep 0.1
done
i=0
# (nodes 0 and 2 already advertise cluster 0: wait for a third advert, the bad expert's, from a
# live member — with two, the client may never have heard of the bad one)
until "$T" status --peer "$(peer_of netA)" --network-key "$dir/netA/network.key" --json \
    >"$dir/st.json" 2>/dev/null &&
    [ "$(json_get "$dir/st.json" "sum(1 for a in j['adverts'] if a.get('cluster') == 0)")" -ge 3 ] &&
    [ "$(json_get "$dir/st.json" "len([a for a in j['adverts'] if a.get('cluster') == 0 and a['node_id'] not in [m['node_id'] for m in j['members'] if m['state'] != 'alive']])")" -ge 3 ]; do
    i=$((i + 1))
    [ $i -lt 120 ] || fail "the bad expert's advert did not reach node 0"
    sleep 0.5
done
netgen garbage netA $LONG --out "$dir/garbage.png" || fail "generate with a lying replica"
cmp -s "$dir/garbage.png" "$dir/local-long.png" || fail "a lying replica changed the image"
[ "$(json_get "$dir/garbage.json" "j['network']['garbage']")" -ge 1 ] ||
    fail "the lying replica was never caught (or never asked)"
kill "$badpid"; wait "$badpid" || true; pids=
echo "ok: a replica answering garbage is banned: the same image"

# a client without the network key
"$T" keygen --network-key --out "$dir/other.key" >/dev/null
rc=0
"$T" generate --peer "$(peer_of netA)" --network-key "$dir/other.key" $GEN \
    --out "$dir/x.png" >/dev/null 2>"$dir/err-key.txt" || rc=$?
[ $rc -eq 1 ] || fail "a client with another network key: exit $rc, want 1"
[ ! -e "$dir/x.png" ] || fail "a client with another network key got an image"
grep -qi "network key\|handshake" "$dir/err-key.txt" || fail "no reason given: $(cat "$dir/err-key.txt")"
echo "ok: a client with another network key is refused"
"$T" down --dir "$dir/netA" >/dev/null

# B: one replica per cluster; kill one mid-generation: degraded, and said
"$T" up --nodes 2 --experts "$F" --dir "$dir/netB" --json >"$dir/netB.json" 2>"$dir/err-up.txt" ||
    fail "tessera up (B)"
# With a 60 s request deadline: a lost host must cost a round trip, not the deadline — every
# request to it fails at once (its connection dropped, reconnecting refused), none times out.
no_timeouts() { # no_timeouts TRACE: no request of the trace waited out its deadline
    "$PY" -c "import json,sys; ev=json.load(open(sys.argv[1]))['traceEvents']; \
bad=[e for e in ev if e['args']['status']=='timed out']; \
sys.exit(0 if not bad else 1)" "$1"
}
netgen degraded netB $LONG --timeout-ms 60000 --trace "$dir/degraded.trace" \
    --out "$dir/degraded.png" &
gen=$!
sleep 1
kill -9 "$(node_pid netB 1)"
wait $gen || fail "the generation failed instead of degrading"
[ "$(json_get "$dir/degraded.json" "j['network']['degraded_evaluations']")" -gt 0 ] ||
    fail "losing a cluster's only replica did not degrade the generation"
grep -q "DEGRADED" "$dir/err-degraded.txt" || fail "the degraded generation did not say so"
# and which expert failed, on which node, and why
grep -qE "^  expert of cluster [01]: [0-9]+ jobs? failed; the last: 127\.0\.0\.1:[0-9]+: " \
    "$dir/err-degraded.txt" || fail "DEGRADED does not name the expert and node: $(cat "$dir/err-degraded.txt")"
[ "$(json_get "$dir/degraded.json" "len(j['network']['failed_experts'])")" -ge 1 ] ||
    fail "the JSON names no failed expert: $(cat "$dir/degraded.json")"
no_timeouts "$dir/degraded.trace" || fail "a request to the killed host waited out its deadline"
echo "ok: losing a cluster's only replica: completed, degraded, and said so; nothing timed out"
# right after: the node is still alive in the view (gossip takes seconds), but refuses
netgen after netB $LONG --timeout-ms 60000 --trace "$dir/after.trace" --out "$dir/after.png" ||
    fail "the generation after the kill failed"
no_timeouts "$dir/after.trace" || fail "a request to the dead host waited out its deadline"
echo "ok: a host that died between generations costs a refused connect, not a deadline"
# every answer in the trace carries the server's device time, inside its compute time
"$PY" -c "import json,sys; ev=json.load(open(sys.argv[1]))['traceEvents']; \
ok=[e['args'] for e in ev if e['args']['status']=='ok' and 'replica' in e['name']]; \
sys.exit(0 if ok and all(0 < a['device_us'] <= a['compute_us'] for a in ok) else 1)" \
    "$dir/after.trace" || fail "the trace's answers lack the servers' device time"
"$T" down --dir "$dir/netB" >/dev/null

# C: one node for two clusters: cluster 1 is uncovered
"$T" up --nodes 1 --experts "$F" --dir "$dir/netC" --json >"$dir/netC.json" 2>"$dir/err-up.txt" ||
    fail "tessera up (C)"
netgen uncovered netC $FULL --data-dir "$dir/empty" --out "$dir/unc.png" ||
    fail "an uncovered cluster stopped the generation"
grep -q "WARNING: cluster 1 of partition" "$dir/err-uncovered.txt" ||
    fail "no warning names the uncovered cluster"
grep -q "UNCOVERED: cluster 1, routed around ([0-9.]*% of the routing mass): no live expert" \
    "$dir/err-uncovered.txt" || fail "the summary does not give the uncovered cluster's mass"
[ "$(json_get "$dir/uncovered.json" "[u['cluster'] for u in j['uncovered']]")" = "[1]" ] ||
    fail "JSON uncovered: $(cat "$dir/uncovered.json")"
mass=$(json_get "$dir/uncovered.json" "j['uncovered'][0]['mass']")
"$PY" -c "import sys; sys.exit(0 if abs(float(sys.argv[1]) - 0.5) < 1e-6 else 1)" "$mass" ||
    fail "uncovered mass $mass: uniform weights over 2 experts give cluster 1 exactly half"
[ "$(json_get "$dir/uncovered.json" "j['expert_share'][1]")" = 0.0 ] &&
    [ "$(json_get "$dir/uncovered.json" "j['network']['degraded_evaluations']")" = 0 ] &&
    [ "$(json_get "$dir/uncovered.json" "j['network']['failed_jobs']")" = 0 ] ||
    fail "the uncovered cluster was asked: $(cat "$dir/uncovered.json")"
rc=0
netgen cover netC $GEN --data-dir "$dir/empty" --require-coverage --out "$dir/x.png" || rc=$?
[ $rc -eq 1 ] || fail "--require-coverage with an uncovered cluster: exit $rc, want 1"
grep -q "cluster 1 of partition .* has no live expert" "$dir/err-cover.txt" ||
    fail "--require-coverage: $(cat "$dir/err-cover.txt")"
# routed once per trajectory (--route hold): the mass is per routing, the same half
netgen uncovered-hold netC $FULL --route hold --data-dir "$dir/empty" --out "$dir/unc-h.png" ||
    fail "--route hold with an uncovered cluster"
"$PY" -c "import json,sys; m=json.load(open(sys.argv[1]))['uncovered'][0]['mass']; sys.exit(0 if abs(m - 0.5) < 1e-6 else 1)" \
    "$dir/uncovered-hold.json" || fail "--route hold: uncovered mass $(cat "$dir/uncovered-hold.json")"
echo "ok: an uncovered cluster is routed around from the first step (mass $mass); --require-coverage refuses"

# the pulled weights of cluster 1 serve it with no host anywhere: the --local image
netgen cached netC $GEN --data-dir "$dir/pulled" --require-coverage --out "$dir/cached.png" ||
    fail "the pulled weights of a cluster with no host did not serve"
cmp -s "$dir/cached.png" "$dir/local.png" || fail "the cached cluster changed the image"
[ "$(json_get "$dir/cached.json" "j['uncovered']")" = "[]" ] &&
    [ "$(json_get "$dir/cached.json" "j['network']['local_runs']")" -gt 0 ] ||
    fail "cluster 1 was not served from the store: $(cat "$dir/cached.json")"
echo "ok: weights in the store serve a cluster whose hosts are gone: the --local image"

# D: a node hosting nothing joins C; entering through it works
mkdir -p "$dir/bare"
"$T" keygen --out "$dir/bare/id.key" >/dev/null
{
    node_section bare "$(peer_of netC)" "$dir/netC/network.key"
    cat <<INI
[gossip]
probe_interval_ms = 500
probe_timeout_ms = 250
[metrics]
listen =
[log]
file = $dir/bare/d.log
INI
} >"$dir/bare/d.ini"
"$D" --config "$dir/bare/d.ini" >/dev/null 2>&1 &
barepid=$!
pids=$barepid
wait_listen "$dir/bare" "the bare node"
bare=$(cat "$dir/bare/data/listen.addr")
i=0
until "$T" status --peer "$bare" --network-key "$dir/netC/network.key" --json >"$dir/st.json" \
    2>/dev/null && [ "$(json_get "$dir/st.json" "len(j['adverts'])")" -ge 1 ]; do
    i=$((i + 1))
    [ $i -lt 120 ] || fail "the bare node never saw the advert"
    sleep 0.5
done
"$T" generate --peer "$bare" --network-key "$dir/netC/network.key" --data-dir "$dir/pulled2" \
    --json $GEN --out "$dir/bare.png" >"$dir/bare.json" 2>"$dir/err-bare.txt" ||
    fail "entering through a node without a router"
grep -q "fetched the router from" "$dir/err-bare.txt" || fail "no router fetched: $(cat "$dir/err-bare.txt")"
"$T" generate --peer "$bare" --network-key "$dir/netC/network.key" --data-dir "$dir/pulled3" \
    --json $FULL --out "$dir/bare-u.png" >"$dir/bare-u.json" 2>"$dir/err-bare-u.txt" ||
    fail "the uniform policy through a node without a router"
grep -q "fetched the router" "$dir/err-bare-u.txt" && fail "the uniform policy fetched a router"
grep -q "fetched the partition from" "$dir/err-bare-u.txt" || fail "no partition fetched"
kill "$barepid"; wait "$barepid" || true
echo "ok: any entry node works: the partition and the router come from the nodes that hold them"

# --class C: the class prior is on by default, and said
netgen cls netC --n 4 --steps 2 --class 7 --data-dir "$dir/pulled" --data "$dir/nodata" \
    --out "$dir/cls.png" || fail "generate --class 7 without the train labels"
grep -q "warning: no class prior" "$dir/err-cls.txt" || fail "no warning: $(cat "$dir/err-cls.txt")"
[ "$(json_get "$dir/cls.json" "j['prior']")" = none ] || fail "prior: $(cat "$dir/cls.json")"
# the data is installed by scripts/setup.sh (dataset-fashion-mnist)
netgen cls2 netC --n 4 --steps 2 --class 7 --data-dir "$dir/pulled" --out "$dir/cls2.png" ||
    fail "generate --class 7"
[ "$(json_get "$dir/cls2.json" "j['prior']")" = "class (default with --class)" ] ||
    fail "--class 7 did not turn the class prior on: $(cat "$dir/cls2.json")"
grep -q "^prior: class (default with --class)" "$dir/err-cls2.txt" || fail "the summary does not say"
netgen cls3 netC --n 4 --steps 2 --class 7 --no-class-prior --data-dir "$dir/pulled" \
    --out "$dir/cls3.png" || fail "generate --class 7 --no-class-prior"
[ "$(json_get "$dir/cls3.json" "j['prior']")" = none ] || fail "--no-class-prior"
echo "ok: --class turns the class prior on by default (--no-class-prior off), and says so"
