#!/bin/bash
# scripts/demo.sh — the main job, which `make demo` runs after setting up and building: a
# network of four tesserad daemons on this machine, each hosting one of the experts the
# repository ships (experts/demo/, made by scripts/demo-experts.sh), found by each other through
# gossip; a grid of images generated through the network, every denoising step routed to the
# experts over encrypted links; the network's status; then the network stopped.
#
#   scripts/demo.sh [OUT]     (default demo-out: the image, the network's folders and logs)
#
# Environment: BUILD (default build), NODES (4), N (images, 32), STEPS (30).
set -euo pipefail
B=${BUILD:-build}
T=$B/client/tessera
OUT=${1:-demo-out}
NODES=${NODES:-4}
N=${N:-32}
STEPS=${STEPS:-30}
EXPERTS=${EXPERTS:-experts/demo}
[ -x "$T" ] || { echo "demo: $T is not built (run make build)" >&2; exit 1; }
mkdir -p "$OUT"
net=$OUT/net
"$T" down --dir "$net" >/dev/null 2>&1 || true
echo "== tessera up: $NODES daemons on 127.0.0.1 hosting $EXPERTS"
"$T" up --nodes "$NODES" --experts "$EXPERTS" --dir "$net" --json >"$OUT/up.json"
trap '"$T" down --dir "$net"' EXIT
peer=$(sed -n 's/.*"peer":"\([^"]*\)".*/\1/p' "$OUT/up.json")
echo "== tessera generate --peer $peer: $N images, $STEPS Heun steps, learned routing, top1"
"$T" generate --peer "$peer" --network-key "$net/network.key" --data-dir "$OUT/cache" \
    --n "$N" --steps "$STEPS" --sampler heun --cfg 2 --class-prior --cols 8 \
    --out "$OUT/grid.png" --trace "$OUT/trace.json"
echo
echo "== tessera status --peer $peer"
"$T" status --peer "$peer" --network-key "$net/network.key"
echo
echo "== tessera down"
trap - EXIT
"$T" down --dir "$net"
echo
echo "The image: $OUT/grid.png   (a Chrome trace of every request: $OUT/trace.json)"
