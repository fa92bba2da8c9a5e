#!/bin/sh
# test_churn.sh TESSERA — churn at process level, short: scripts/churn.sh for
# 20 s (8 daemons, 4 clients generating continuously, a kill -9, restart, SIGTERM or new node
# every 2 s): every generation completes (degraded ones are reported, not failed), no daemon
# dies that was not stopped, and no surviving daemon's resident memory grows by 32 MiB.
# docs/benchmarks.md has the 60 s run and the load test.
set -eu
T=${1:?usage: test_churn.sh TESSERA}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/tests/lib.sh"
out=$dir/churn.json
cd "$ROOT"
# Under AddressSanitizer (make test's second run) freed memory waits in ASan's quarantine, which
# reads as growth: turn the quarantine off so that the RSS check measures the daemons' own memory.
if [ -n "${ASAN_OPTIONS:-}" ]; then
    ASAN_OPTIONS="$ASAN_OPTIONS:quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
    export ASAN_OPTIONS
fi
bash scripts/churn.sh --tessera "$T" --seconds 20 --interval 2 --out "$out" ||
    fail "churn: $(cat "$out")"
"$PY" - "$out" <<'PY' || exit 1
import json, sys
j = json.load(open(sys.argv[1]))
a = j["actions"]
bad = []
if j["completed"] < 20: bad.append("only %d generations" % j["completed"])
if min(a["kill9"], a["term"], a["restart"], a["add"]) < 1: bad.append("not every action ran: %s" % a)
if j["rss_growth_kib_max"] >= 32768: bad.append("RSS grew by %d KiB" % j["rss_growth_kib_max"])
if bad:
    print("FAIL:", "; ".join(bad), json.dumps(j)); sys.exit(1)
print("ok: churn: %d generations completed (%d degraded), %s, no unexpected death, RSS +%d KiB at most"
      % (j["completed"], j["degraded"], a, j["rss_growth_kib_max"]))
PY
