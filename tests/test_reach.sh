#!/bin/sh
# test_reach.sh TESSERA TESSERAD — is a node reachable at the address it advertises? Two real
# daemons: the seed advertises its real address, the other one an address where nothing listens
# (as a node behind a home router would, without a forwarded port). Each asks the other to dial
# it back (net/reach.h): the seed logs that it is reachable; the other logs a warning that it is
# NOT reachable, with the reason and what to do. A malformed dial-back request (no address) is
# refused and the daemon stays up.
set -eu
T=${1:?usage: test_reach.sh TESSERA TESSERAD}
D=${2:?usage: test_reach.sh TESSERA TESSERAD}
PY=/usr/bin/python3
dir=$(mktemp -d)
pids=
cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*" >&2
    for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 8 "$f" >&2; }; done
    exit 1
}
run() { "$@" >"$dir/out.txt" 2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; fail "$*"; }; }
wait_log() { # FILE REGEX: up to 120 s
    i=0
    while ! grep -qsE "$2" "$1"; do
        i=$((i + 1)); [ $i -lt 1200 ] || fail "no /$2/ in $1 after 120 s"; sleep 0.1
    done
}
run "$T" keygen --network-key --out "$dir/net.key"
# a port nothing listens on: bind one, note it, let it go
closed=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
node() { # NAME [BOOTSTRAP] [ADVERTISE]
    mkdir -p "$dir/$1"
    run "$T" keygen --out "$dir/$1/id.key"
    cat >"$dir/$1/d.ini" <<INI
[node]
identity = $dir/$1/id.key
network_key = $dir/net.key
data_dir = $dir/$1/data
listen = 127.0.0.1:0
${3:+advertise = $3}
${2:+bootstrap = $2}
[gossip]
probe_interval_ms = 200
probe_timeout_ms = 100
[metrics]
listen =
[log]
file = $dir/$1.log
INI
    "$D" --config "$dir/$1/d.ini" 2>>"$dir/$1.err" &
    pids="$pids $!"
}
node seed
wait_log "$dir/seed.log" "listening on"
seed=$(cat "$dir/seed/data/listen.addr")
node natted "$seed" "127.0.0.1:$closed"
node third "$seed"
wait_log "$dir/natted.log" "NOT reachable at 127.0.0.1:$closed"
grep "NOT reachable" "$dir/natted.log" | grep -q "forward the port" || fail "the warning does not say what to do"
wait_log "$dir/seed.log" "reachable at $seed: a peer dialled it back"
echo "ok: the seed is reachable at $seed; the node advertising 127.0.0.1:$closed is told it is not, and what to do"
"$T" status --peer "$seed" --network-key "$dir/net.key" --json >/dev/null || fail "the seed is down"
echo "ok: the daemons stay up"
