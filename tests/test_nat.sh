#!/bin/sh
# test_nat.sh TESSERA TESSERAD EXPERTS — nodes behind real home routers, carried by a relay.
#
# Linux network namespaces make a small internet on this machine: a "public" namespace (a bridge,
# 10.201.0.0/24) holding the relay R, a fourth expert and the client, and two homes, each a
# router namespace (its WAN on the bridge, iptables MASQUERADE on it, IP forwarding) with a host
# namespace behind it on a private network. Each home host runs a tesserad hosting one expert and
# advertising its private address, which nobody outside can dial. Then:
#   - each home node is told it cannot be dialled, and takes an address at the relay;
#   - the public nodes, and each home node, see all four members alive (gossip reaches the homes
#     through the relay, and the homes reach each other through it);
#   - `tessera generate` from the public namespace gives the image `--local` gives, byte for byte:
#     two of its four experts answered from behind the NATs;
#   - status marks the two home nodes relayed.
# Where namespaces or the NAT cannot be made (not root, no iptables, a container without
# CAP_NET_ADMIN) the test is skipped (exit 77) with the reason.
set -eu
T=${1:?usage: test_nat.sh TESSERA TESSERAD EXPERTS}
D=${2:?usage: test_nat.sh TESSERA TESSERAD EXPERTS}
F=${3:?usage: test_nat.sh TESSERA TESSERAD EXPERTS}
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "no ip (iproute2)"
IPT=$(command -v iptables || true)
[ -n "$IPT" ] || skip "no iptables (scripts/setup.sh installs it)"
P="ts$$"
pub=${P}pub r1=${P}r1 h1=${P}h1 r2=${P}r2 h2=${P}h2
cleanup_more() {
    for n in $pub $r1 $h1 $r2 $h2; do ip netns del "$n" 2>/dev/null || true; done
}
ip netns add "$pub" 2>"$dir/ns.err" || skip "cannot create a network namespace: $(cat "$dir/ns.err")"
logs="$dir/*.log" log_lines=12
in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }

# ---- the small internet ----
ip -n "$pub" link set lo up
ip -n "$pub" link add br0 type bridge
ip -n "$pub" addr add 10.201.0.1/24 dev br0
ip -n "$pub" link set br0 up
home() { # ROUTER HOST WAN_IP LAN_PREFIX
    ip netns add "$1"
    ip netns add "$2"
    for n in "$1" "$2"; do ip -n "$n" link set lo up; done
    ip -n "$1" link add wan type veth peer name "up$1" netns "$pub"
    ip -n "$pub" link set "up$1" master br0 up
    ip -n "$1" addr add "$3/24" dev wan
    ip -n "$1" link set wan up
    ip -n "$1" route add default via 10.201.0.1
    ip -n "$1" link add lan type veth peer name eth0 netns "$2"
    ip -n "$1" addr add "$4.1/24" dev lan
    ip -n "$1" link set lan up
    ip -n "$2" addr add "$4.2/24" dev eth0
    ip -n "$2" link set eth0 up
    ip -n "$2" route add default via "$4.1"
    in_ns "$1" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
    in_ns "$1" "$IPT" -t nat -A POSTROUTING -o wan -j MASQUERADE 2>"$dir/ipt.err" ||
        skip "iptables cannot make a NAT here: $(cat "$dir/ipt.err")"
    # a home router: nothing from outside reaches the home unless it answers something from inside
    in_ns "$1" "$IPT" -A FORWARD -i wan -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
    in_ns "$1" "$IPT" -A FORWARD -i wan -j DROP
}
home "$r1" "$h1" 10.201.0.11 192.168.71
home "$r2" "$h2" 10.201.0.12 192.168.72
# reaches NS HOST: a TCP connect from NS to HOST:9 is answered (accepted or refused) within 2 s
reaches() {
    in_ns "$1" "$PY" -c '
import socket, sys
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], 9))
except ConnectionRefusedError:
    pass
except OSError:
    sys.exit(1)' "$2"
}
# the NAT works one way: a home reaches the public side, the public side does not reach a home
reaches "$h1" 10.201.0.1 || fail "home 1 cannot reach the public side"
reaches "$pub" 192.168.71.2 && fail "the public side reaches home 1"
reaches "$h2" 192.168.71.2 && fail "home 2 reaches home 1"
echo "ok: two homes behind MASQUERADE NATs, one public network"

# ---- the nodes ----
"$T" keygen --network-key --out "$dir/net.key" >/dev/null 2>&1 || fail "keygen"
node() { # NAME NS LISTEN BOOTSTRAP EXPERT [EXTRA]
    mkdir -p "$dir/$1"
    "$T" keygen --out "$dir/$1/id.key" >/dev/null 2>&1 || fail "keygen $1"
    {
        printf '[node]\nidentity = %s\nnetwork_key = %s\ndata_dir = %s\nlisten = %s\n' \
            "$dir/$1/id.key" "$dir/net.key" "$dir/$1/data" "$3"
        [ -n "$4" ] && printf 'bootstrap = %s\n' "$4"
        printf '[expert]\nmode = host\nweights = %s\npartition = %s\n' \
            "$F/expert-$5.safetensors" "$F/partition.safetensors"
        printf '[gossip]\nprobe_interval_ms = 200\nprobe_timeout_ms = 100\n'
        printf '[metrics]\nlisten =\n[log]\nfile = %s\n' "$dir/$1.log"
        printf '%b' "${6:-}"
    } >"$dir/$1/d.ini"
    ip netns exec "$2" "$D" --config "$dir/$1/d.ini" 2>>"$dir/$1.err" &
    pids="$pids $!"
}
seed=10.201.0.1:7420
node relay "$pub" "$seed" "" 2 '[relay]\nserve = true\n'
wait_log "$dir/relay.log" "ready" 60
node pub3 "$pub" 10.201.0.1:7421 "$seed" 3
node home1 "$h1" 192.168.71.2:7420 "$seed" 0
node home2 "$h2" 192.168.72.2:7420 "$seed" 1
for n in home1 home2; do
    wait_log "$dir/$n.log" "NOT reachable at 192\.168\.7[12]\.2:7420" 60
    wait_log "$dir/$n.log" "reached through relay .* at 10\.201\.0\.1:[0-9]+" 60
done
echo "ok: both home nodes found they cannot be dialled and took addresses at the relay"

all_alive() { # NS PEER
    in_ns "$1" "$T" status --peer "$2" --network-key "$dir/net.key" --json >"$dir/st.json" 2>/dev/null &&
        [ "$(json_get "$dir/st.json" "sum(m['state'] == 'alive' for m in j['members'])")" = 4 ] &&
        [ "$(json_get "$dir/st.json" "sum(1 for a in j['adverts'] if a['valid'])")" = 4 ]
}
i=0
until all_alive "$pub" "$seed" && all_alive "$pub" 10.201.0.1:7421 &&
    all_alive "$h1" 192.168.71.2:7420 && all_alive "$h2" 192.168.72.2:7420; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "not all alive everywhere: $(cat "$dir/st.json")"; sleep 0.2
done
echo "ok: every node, public or behind a NAT, sees all four alive with their adverts"

all_alive "$pub" "$seed"
[ "$(json_get "$dir/st.json" "sum(1 for m in j['members'] if m.get('relayed_via'))")" = 2 ] ||
    fail "status marks $(json_get "$dir/st.json" "[m.get('relayed_via') for m in j['members']]")"
echo "ok: status marks the two home nodes relayed"

GEN="--n 8 --steps 4 --seed 5 --policy uniform --select full"
"$T" generate --local "$F" $GEN --out "$dir/local.png" >/dev/null 2>&1 || fail "generate --local"
in_ns "$pub" "$T" generate --peer "$seed" --network-key "$dir/net.key" --data-dir "$dir/cache" \
    --json $GEN --out "$dir/net.png" >"$dir/gen.json" 2>"$dir/gen.err" ||
    { cat "$dir/gen.err"; fail "generate --peer"; }
cmp -s "$dir/net.png" "$dir/local.png" || fail "the network's image differs from --local's"
[ "$(json_get "$dir/gen.json" "j['network']['degraded_evaluations']")" = 0 ] ||
    fail "degraded: $(cat "$dir/gen.json")"
echo "ok: generate from the public side = --local, byte for byte, two experts behind NATs"
