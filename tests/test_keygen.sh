#!/usr/bin/env bash
# test_keygen.sh — `tessera keygen` as a user runs it (net/keys.h behind it).
#
#   - an identity: exit 0, a 16-hex-digit node id and the 64-digit public key on stdout, an
#     80-byte file of mode 0600 whose stored public key is the one printed (read from the file
#     here, independently of tessera);
#   - never overwritten: a second run on the same file exits 1 naming the file, which is unchanged;
#   - --json: one object with kind, file and node_id, whose prefix is node_id_short;
#   - a network key: a 48-byte file of mode 0600, and no node id printed;
#   - no secret on stdout: the seed's hex never appears in what was printed;
#   - usage errors (no --out) exit 2.
#
# usage: test_keygen.sh PATH/TO/tessera
set -euo pipefail

tessera=$1
. "$(dirname "$0")/lib.sh"

# Hex of bytes [from, from + n) of a file.
hex_bytes() { od -An -v -tx1 -j "$2" -N "$3" "$1" | tr -d ' \n'; }

# An identity, text output.
out=$("$tessera" keygen --out "$dir/node.key")
short=$(printf '%s\n' "$out" | sed -n 's/^node id: \([0-9a-f]*\)$/\1/p')
full=$(printf '%s\n' "$out" | sed -n 's/^public key: \([0-9a-f]*\)$/\1/p')
[ ${#short} -eq 16 ] || fail "no 16-digit node id in: $out"
[ ${#full} -eq 64 ] || fail "no 64-digit public key in: $out"
[ "${full:0:16}" = "$short" ] || fail "node id $short is not a prefix of the public key $full"
[ "$(stat -c %a "$dir/node.key")" = 600 ] || fail "mode $(stat -c %a "$dir/node.key"), want 600"
[ "$(stat -c %s "$dir/node.key")" = 80 ] || fail "size $(stat -c %s "$dir/node.key"), want 80"
[ "$(head -c 16 "$dir/node.key")" = "tessera/ed25519" ] || fail "wrong header" # $() drops the \n
[ "$(hex_bytes "$dir/node.key" 48 32)" = "$full" ] || fail "printed key is not the file's"
seed=$(hex_bytes "$dir/node.key" 16 32)
case "$out" in *"$seed"*) fail "the secret seed was printed" ;; esac

# Never overwritten.
before=$(sha256sum <"$dir/node.key")
rc=0
"$tessera" keygen --out "$dir/node.key" >"$dir/stdout" 2>"$dir/stderr" || rc=$?
[ $rc -eq 1 ] || fail "keygen over an existing file: exit $rc, want 1"
grep -q "already exists" "$dir/stderr" || fail "no 'already exists' in: $(cat "$dir/stderr")"
grep -qF "$dir/node.key" "$dir/stderr" || fail "the message does not name the file"
[ "$(sha256sum <"$dir/node.key")" = "$before" ] || fail "the existing key file was changed"
rc=0
"$tessera" keygen --network-key --out "$dir/node.key" >/dev/null 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "keygen --network-key over an identity: exit $rc, want 1"

# --json.
json=$("$tessera" keygen --out "$dir/b.key" --json)
jfull=$(printf '%s' "$json" | sed -n 's/.*"node_id":"\([0-9a-f]*\)".*/\1/p')
jshort=$(printf '%s' "$json" | sed -n 's/.*"node_id_short":"\([0-9a-f]*\)".*/\1/p')
[ ${#jfull} -eq 64 ] || fail "no node_id in: $json"
[ "${jfull:0:16}" = "$jshort" ] || fail "node_id_short is not node_id's prefix: $json"
[ "$(hex_bytes "$dir/b.key" 48 32)" = "$jfull" ] || fail "json node_id is not the file's key"
printf '%s' "$json" | grep -q '"kind":"identity"' || fail "no kind in: $json"
[ "$jfull" != "$full" ] || fail "two identities with the same key"
case "$json" in *"$(hex_bytes "$dir/b.key" 16 32)"*) fail "the secret seed was printed" ;; esac

# A network key.
out=$("$tessera" keygen --out "$dir/net.key" --network-key)
[ "$(stat -c %a "$dir/net.key")" = 600 ] || fail "network key mode $(stat -c %a "$dir/net.key")"
[ "$(stat -c %s "$dir/net.key")" = 48 ] || fail "network key size $(stat -c %s "$dir/net.key")"
case "$out" in *"node id"*) fail "a network key has no node id: $out" ;; esac
case "$out" in *"$(hex_bytes "$dir/net.key" 16 32)"*) fail "the network key was printed" ;; esac
json=$("$tessera" keygen --out "$dir/net2.key" --network-key --json)
printf '%s' "$json" | grep -q '"kind":"network-key"' || fail "no kind in: $json"

# Usage.
rc=0
"$tessera" keygen >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "keygen without --out: exit $rc, want 2"
"$tessera" keygen --help | grep -q -- "--network-key" || fail "--help does not list --network-key"

echo "tessera keygen: ok"
