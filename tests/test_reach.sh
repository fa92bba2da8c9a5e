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
. "$(dirname "$0")/lib.sh"
logs="$dir/*.log" log_lines=8
run "$T" keygen --network-key --out "$dir/net.key"
# a port nothing listens on: bind one, note it, let it go
closed=$(free_port)
node() { # NAME [BOOTSTRAP] [ADVERTISE]
    mkdir -p "$dir/$1"
    run "$T" keygen --out "$dir/$1/id.key"
    {
        node_section "$1" "${2:-}"
        cat <<INI
${3:+advertise = $3}
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
