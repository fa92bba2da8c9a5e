#!/bin/sh
# test_relay.sh TESSERA TESSERAD EXPERTS — relays on loopback (net/relay.h), real daemons.
#
# A relay (the seed, [relay] serve = true) and four nodes hosting the four experts of EXPERTS.
# Two of them advertise an address where nothing listens, as a node behind a home router without
# a forwarded port would: the reachability check finds they cannot be dialled, each takes an
# address at the relay ([relay] use = true, the default) and advertises that. Then:
#   - every member sees them alive through gossip (datagrams forwarded by the relay), for 10 s;
#   - `tessera status` marks them "relayed via" the relay, in text and JSON;
#   - `tessera generate --peer` gives the image `--local` gives, byte for byte, with no degraded
#     evaluation: two of the four experts answered through the relay, end to end encrypted;
#   - `tessera ping` reaches a relayed node at its relayed address and proves its identity;
#   - the relay's /metrics count the nodes carried, the connections spliced, bytes, datagrams;
#   - a node that is reachable but names the relay (via) is carried too, and the relay's death
#     sends the carried nodes back to their own address (logged), the others staying up.
set -eu
T=${1:?usage: test_relay.sh TESSERA TESSERAD EXPERTS}
D=${2:?usage: test_relay.sh TESSERA TESSERAD EXPERTS}
F=${3:?usage: test_relay.sh TESSERA TESSERAD EXPERTS}
. "$(dirname "$0")/lib.sh"
logs="$dir/*.log" log_lines=12
metric() { # URL NAME{labels}: the value, 0 when absent
    curl -fsS "$1" | awk -v n="$2" '$1 == n { print $2; f = 1 } END { if (!f) print 0 }'
}
run "$T" keygen --network-key --out "$dir/net.key"
# ports nothing listens on: one per node, as two homes' addresses differ
closed0=$(free_port)
closed1=$(free_port)
node() { # NAME BOOTSTRAP ADVERTISE EXPERT_INDEX [EXTRA INI LINES]
    mkdir -p "$dir/$1"
    run "$T" keygen --out "$dir/$1/id.key"
    {
        node_section "$1" "$2"
        [ -n "$3" ] && printf 'advertise = %s\n' "$3"
        if [ -n "$4" ]; then
            printf '[expert]\nmode = host\nweights = %s\npartition = %s\n' \
                "$F/expert-$4.safetensors" "$F/partition.safetensors"
        fi
        printf '[gossip]\nprobe_interval_ms = 200\nprobe_timeout_ms = 100\n'
        printf '[metrics]\nlisten = 127.0.0.1:0\n[log]\nfile = %s\n' "$dir/$1.log"
        printf '%b' "${5:-}"
    } >"$dir/$1/d.ini"
    start_node "$1"
}
node relay "" "" "" '[relay]\nserve = true\n'
wait_log "$dir/relay.log" "ready" 60
seed=$(cat "$dir/relay/data/listen.addr")
grep -q "serving as a relay" "$dir/relay.log" || fail "the relay does not say it serves"
node n0 "$seed" "127.0.0.1:$closed0" 0
node n1 "$seed" "127.0.0.1:$closed1" 1
node d2 "$seed" "" 2
node d3 "$seed" "" 3
for n in n0 n1; do
    wait_log "$dir/$n.log" "NOT reachable at 127.0.0.1:" 60
    wait_log "$dir/$n.log" "reached through relay .* at 127\.0\.0\.1:[0-9]+" 60
done
echo "ok: two nodes that cannot be dialled took addresses at the relay"

# everyone sees everyone alive, and still after 10 s (gossip reaches the relayed nodes)
status() { "$T" status --peer "$1" --network-key "$dir/net.key" --json >"$dir/st.json" 2>"$dir/err.txt"; }
all_alive() { # PEER: 5 members alive, 4 adverts
    status "$1" && [ "$(json_get "$dir/st.json" "sum(m['state'] == 'alive' for m in j['members'])")" = 5 ] &&
        [ "$(json_get "$dir/st.json" "sum(1 for a in j['adverts'] if a['valid'])")" = 4 ]
}
i=0
until all_alive "$seed" && all_alive "$(cat "$dir/d2/data/listen.addr")"; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the members are not all alive: $(cat "$dir/st.json")"; sleep 0.2
done
for n in d2 d3 relay; do wc -l <"$dir/$n.log" >"$dir/$n.mark"; done
sleep 10
all_alive "$seed" || fail "after 10 s, not all alive at the relay: $(cat "$dir/st.json")"
all_alive "$(cat "$dir/d3/data/listen.addr")" || fail "after 10 s, not all alive at d3: $(cat "$dir/st.json")"
for n in d2 d3 relay; do
    tail -n +"$(($(cat "$dir/$n.mark") + 1))" "$dir/$n.log" | grep -E "gossip: .* (dead|suspect)" &&
        fail "$n suspected a member in those 10 s"
done
echo "ok: every member sees the relayed nodes alive for 10 s, none suspected"

status "$seed" || fail "status at the relay"
relay_id=$(json_get "$dir/st.json" "j['node_id']")
[ "$(json_get "$dir/st.json" "sum(1 for m in j['members'] if m.get('relayed_via'))")" = 2 ] ||
    fail "status --json marks $(json_get "$dir/st.json" "[m.get('relayed_via') for m in j['members']]")"
status "$(cat "$dir/d2/data/listen.addr")"
[ "$(json_get "$dir/st.json" "sorted(set(a.get('relayed_via') or '' for a in j['adverts']))")" = "['', '$relay_id']" ] ||
    fail "adverts' relayed_via: $(json_get "$dir/st.json" "[a.get('relayed_via') for a in j['adverts']]")"
run "$T" status --peer "$seed" --network-key "$dir/net.key"
[ "$(grep -c "relayed via ${relay_id%"${relay_id#????????}"}" "$dir/out.txt")" = 2 ] ||
    fail "status does not mark the two relayed nodes: $(cat "$dir/out.txt")"
echo "ok: status marks the two relayed nodes, in text and JSON"

# generation through the network equals --local: the relayed experts answered
GEN="--n 8 --steps 4 --seed 3 --policy uniform --select full"
run "$T" generate --local "$F" $GEN --out "$dir/local.png"
"$T" generate --peer "$seed" --network-key "$dir/net.key" --data-dir "$dir/cache" --json $GEN \
    --out "$dir/net.png" >"$dir/gen.json" 2>"$dir/err-gen.txt" || { cat "$dir/err-gen.txt"; fail "generate --peer"; }
cmp -s "$dir/net.png" "$dir/local.png" || fail "the network's image differs from --local's"
[ "$(json_get "$dir/gen.json" "j['network']['degraded_evaluations']")" = 0 ] || fail "degraded: $(cat "$dir/gen.json")"
echo "ok: generate --peer through two relayed experts = --local, byte for byte"

# ping a relayed node at its relayed address: the handshake proves that node, not the relay
n0addr=$(json_get "$dir/st.json" "[m['addr'] for m in j['members'] if m.get('relayed_via')][0]")
"$T" ping "$n0addr" --network-key "$dir/net.key" --count 5 --json >"$dir/ping.json" 2>"$dir/err.txt" ||
    fail "ping through the relay: $(cat "$dir/err.txt")"
pid=$(json_get "$dir/ping.json" "j['node_id']")
[ "$pid" != "$relay_id" ] || fail "ping at the relayed address reached the relay itself"
echo "ok: ping at a relayed address ($n0addr) reaches the node behind the relay"

murl=$(cat "$dir/relay/data/metrics.url")
sleep 1.2
[ "$(metric "$murl" tessera_relay_nodes)" = 2 ] || fail "tessera_relay_nodes $(metric "$murl" tessera_relay_nodes)"
spliced=$(metric "$murl" 'tessera_relay_circuits_total{outcome="spliced"}')
bytes=$(metric "$murl" tessera_relay_bytes_total)
dgrams=$(metric "$murl" 'tessera_relay_datagrams_total{outcome="forwarded"}')
[ "$spliced" -gt 0 ] && [ "$bytes" -gt 1000 ] && [ "$dgrams" -gt 10 ] ||
    fail "relay metrics: spliced $spliced, bytes $bytes, datagrams $dgrams"
[ "$(metric "$(cat "$dir/n0/data/metrics.url")" tessera_relayed)" = 1 ] || fail "n0: tessera_relayed is not 1"
[ "$(metric "$(cat "$dir/d2/data/metrics.url")" tessera_relayed)" = 0 ] || fail "d2: tessera_relayed is not 0"
echo "ok: the relay's metrics: 2 nodes, $spliced connections spliced, $bytes bytes, $dgrams datagrams"

# a reachable node that names the relay is carried too
node v4 "$seed" "" "" "[relay]\nvia = $seed\n"
wait_log "$dir/v4.log" "reached through relay .* at 127\.0\.0\.1:[0-9]+" 60
echo "ok: [relay] via carries a reachable node"

# the relay dies: the carried nodes go back to their own address, and say so
kill -9 "$(cat "$dir/relay/pid")"
for n in n0 n1 v4; do wait_log "$dir/$n.log" "no relay at" 60; done
"$T" status --peer "$(cat "$dir/d2/data/listen.addr")" --network-key "$dir/net.key" --json \
    >/dev/null || fail "d2 went down with the relay"
echo "ok: the relay's death is logged by the nodes it carried; the others stay up"
