#!/bin/sh
# test_join.sh TESSERA TESSERAD EXPERTS — a network as one file, joined in one command:
#   - `tessera network export --from-up` writes the file (0600, the key and every node's
#     address), and never overwrites one;
#   - `tessera join FILE` makes a node folder: network.key and identity.key (0600), tesserad.ini
#     in mode auto with the network's bootstrap addresses, tesserad.service with --systemd; it
#     refuses a folder that already holds a node;
#   - the joined daemon, started as join says, picks a cluster, fetches that expert's weights from
#     a peer and serves them (the network then advertises one more expert);
#   - broken network files (not one, no key, a key that is not hex, no address) are refused with
#     the file and line named.
set -eu
T=${1:?usage: test_join.sh TESSERA TESSERAD EXPERTS}
D=${2:?usage: test_join.sh TESSERA TESSERAD EXPERTS}
E=${3:?usage: test_join.sh TESSERA TESSERAD EXPERTS}
. "$(dirname "$0")/lib.sh"
nets="$dir/net" logs="$dir/vol.log"
mode() { stat -c %a "$1"; }

"$T" up --nodes 4 --experts "$E" --dir "$dir/net" --compute-threads 1 --json >"$dir/up.json" \
    2>"$dir/up.err" || { cat "$dir/up.err" >&2; fail "tessera up"; }
"$T" network export --from-up "$dir/net" --out "$dir/net.tessera" >/dev/null || fail "export"
[ "$(mode "$dir/net.tessera")" = 600 ] || fail "the network file is mode $(mode "$dir/net.tessera")"
head -n 1 "$dir/net.tessera" | grep -qx "tessera-network 1" || fail "no header"
[ "$(grep -c '^bootstrap 127.0.0.1:' "$dir/net.tessera")" = 4 ] || fail "not 4 bootstrap lines"
if "$T" network export --from-up "$dir/net" --out "$dir/net.tessera" 2>"$dir/err.txt"; then
    fail "export overwrote a network file"
fi
grep -q "never overwritten" "$dir/err.txt" || fail "export: $(cat "$dir/err.txt")"
echo "ok: network export writes the key and 4 addresses, mode 0600, and never overwrites"

"$T" join "$dir/net.tessera" --dir "$dir/vol" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
    --systemd --json >"$dir/join.json" || fail "join"
for f in network.key identity.key; do
    [ "$(mode "$dir/vol/$f")" = 600 ] || fail "$f is mode $(mode "$dir/vol/$f")"
done
grep -qx "mode = auto" "$dir/vol/tesserad.ini" || fail "the config is not in mode auto"
grep -q "^bootstrap = 127.0.0.1:[0-9]*, 127.0.0.1" "$dir/vol/tesserad.ini" || fail "no bootstrap line"
grep -q "^ExecStart=.*tesserad --config $dir/vol/tesserad.ini" "$dir/vol/tesserad.service" ||
    fail "the unit does not run the config"
grep -qx "User=$(id -un)" "$dir/vol/tesserad.service" || fail "the unit does not run as the user who joined"
cmp -s "$dir/vol/network.key" "$dir/net/network.key" || fail "the joined key differs from the network's"
if "$T" join "$dir/net.tessera" --dir "$dir/wild" 2>"$dir/err.txt"; then
    fail "join wrote a config listening on 0.0.0.0 with nothing to advertise"
fi
grep -q "add --advertise HOST:PORT" "$dir/err.txt" || fail "join 0.0.0.0: $(cat "$dir/err.txt")"
[ ! -e "$dir/wild" ] || fail "a refused join left $dir/wild behind"
if "$T" join "$dir/net.tessera" --dir "$dir/vol" --advertise 127.0.0.1:9 2>"$dir/err.txt"; then fail "join into a node folder"; fi
grep -q "already holds a node" "$dir/err.txt" || fail "join again: $(cat "$dir/err.txt")"
if command -v systemd-analyze >/dev/null 2>&1; then
    systemd-analyze verify "$dir/vol/tesserad.service" 2>"$dir/sa.txt" ||
        grep -qv "tesserad.service" "$dir/sa.txt" || fail "systemd-analyze: $(cat "$dir/sa.txt")"
fi
echo "ok: join writes the keys (0600), a mode-auto config and a unit, and refuses a node folder"

# broken files
bad() { # CONTENT WANT
    printf '%b' "$1" >"$dir/bad.tessera"
    if "$T" join "$dir/bad.tessera" --dir "$dir/badnode" --listen 127.0.0.1:0 2>"$dir/err.txt"; then
        fail "join took: $1"
    fi
    grep -q "$2" "$dir/err.txt" || fail "join of a bad file said: $(cat "$dir/err.txt"), want $2"
}
bad 'hello\n' "bad.tessera:1: not a tessera network file"
bad 'tessera-network 1\nbootstrap 127.0.0.1:1\n' "no key line"
bad "tessera-network 1\nkey $(printf 'zz%.0s' $(seq 32))\nbootstrap 127.0.0.1:1\n" "bad.tessera:2: the key is not hex"
bad "tessera-network 1\nkey $(printf 'ab%.0s' $(seq 32))\n" "no bootstrap address"
bad "tessera-network 1\nkey $(printf 'ab%.0s' $(seq 32))\nbootstrap nohost\n" "bad.tessera:3:"
bad "tessera-network 1\nsecret x\n" "unknown line"
echo "ok: broken network files are refused with the file and line"

# the joined node, started as join says: it picks a cluster and fetches its expert
"$D" --config "$dir/vol/tesserad.ini" >"$dir/vol.log" 2>&1 &
pids=$!
i=0
until grep -qs "weights .* of cluster [0-9]* fetched; serving them" "$dir/vol.log"; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "the joined node never fetched an expert"; sleep 0.1
done
grep -q "serving expert" "$dir/vol.log" || sleep 2
peer=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["peer"])' "$dir/up.json")
i=0
until "$T" status --peer "$peer" --network-key "$dir/net/network.key" --json 2>/dev/null |
    "$PY" -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if len([a for a in s["adverts"] if a.get("valid")]) == 5 else 1)'; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the network never saw the joined node's expert"; sleep 0.2
done
echo "ok: the joined node chose $(grep -o 'auto: cluster [0-9]*' "$dir/vol.log" | head -n 1 | cut -d' ' -f2-), fetched its weights and serves them"
