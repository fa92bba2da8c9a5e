#!/bin/sh
# test_status_page.sh TESSERA EXPERTS — tesserad's status page (daemon/status_page.html) on a live
# `tessera up` network of 3 nodes hosting the demo experts:
#   - / is the page (text/html, a Content-Security-Policy, nothing loaded from elsewhere) and
#     /status.json the view `tessera status --json` prints, plus the node's own percentiles;
#   - headless Chromium (Debian's chromium) runs the page: it shows 3 members, 3 alive, the
#     uncovered cluster (4 experts on 3 nodes), and after one node is stopped it shows 2 alive
#     without being reloaded (the page refreshes itself from /status.json);
#   - the page carries no key material (no byte of a key file appears in the page or the JSON).
# Without chromium the test exits 77 (ctest: skipped) and says why; everything before the
# browser part has run by then. Waits are generous; nothing here asserts speed.
set -eu
T=${1:?usage: test_status_page.sh TESSERA EXPERTS}
E=${2:?usage: test_status_page.sh TESSERA EXPERTS}
. "$(dirname "$0")/lib.sh"
nets="$dir/net"

"$T" up --nodes 3 --experts "$E" --dir "$dir/net" --compute-threads 1 --json >"$dir/up.json" \
    2>"$dir/up.err" || { cat "$dir/up.err" >&2; fail "tessera up"; }
base=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["members"][0]["metrics"].rsplit("/", 1)[0])' "$dir/up.json")

# the two routes, over plain HTTP
"$PY" - "$base" "$dir" <<'PYEOF' || fail "the page or status.json"
import json, sys, time, urllib.request
base, d = sys.argv[1], sys.argv[2]
r = urllib.request.urlopen(base + "/", timeout=10)
page = r.read()
assert r.status == 200 and r.headers["Content-Type"].startswith("text/html"), r.headers
assert "default-src 'none'" in r.headers["Content-Security-Policy"]
assert b"src=\"http" not in page and b"href=\"http" not in page, "an external asset"
# the node publishes its status at start and every 10 s even unread: the first load is a status
# (perhaps up to 10 s old), never "no status yet"
first = urllib.request.urlopen(base + "/status.json", timeout=10)
assert first.status == 200, first.status
for i in range(100):  # read, it is published every second
    try:
        s = json.load(urllib.request.urlopen(base + "/status.json", timeout=10))
        if len(s["members"]) == 3 and all(m["state"] == "alive" for m in s["members"]):
            break
    except urllib.error.HTTPError as e:
        assert e.code == 503, e.code
    time.sleep(0.2)
else:
    sys.exit("status.json never showed 3 alive members")
assert len(s["adverts"]) == 3 and all(a["valid"] for a in s["adverts"])
assert [u["cluster"] for u in s["aggregates"]["uncovered"]] == [3], s["aggregates"]
assert "queue_wait_s" in s["node"] and "compute_s" in s["node"]
h = s["history"]  # the last ten minutes, a sample every 10 s, oldest first
assert h["every_s"] == 10 and 1 <= len(h["age_s"]) <= 60, h
assert len(h["requests_per_s"]) == len(h["latency_ms"]) == len(h["train_loss"]) == len(h["age_s"])
assert h["age_s"] == sorted(h["age_s"], reverse=True), h["age_s"]
assert s["training"] is None  # these nodes host, they do not train
assert s["bans"] == [], s["bans"]  # nobody accused anybody
assert all(a["capacity"]["device"].startswith(("cpu, ", "cuda:")) for a in s["adverts"])
open(d + "/page.html", "wb").write(page)
open(d + "/status.json", "w").write(json.dumps(s))
PYEOF
# no key material: no 16-byte run of any secret (an identity's seed, the network key), in hex or
# raw, in what the node serves
for k in "$dir"/net/network.key "$dir"/net/node-*/identity.key; do
    "$PY" - "$k" "$dir/page.html" "$dir/status.json" <<'PYEOF' || fail "key material in the page ($k)"
import sys
key = open(sys.argv[1], "rb").read()[16:48]  # the secret: the seed, or the network key
served = b"".join(open(f, "rb").read() for f in sys.argv[2:])
for i in range(0, len(key) - 15):
    w = key[i:i + 16]
    if len(w) == 16 and (w in served or w.hex().encode() in served):
        sys.exit("a key's bytes appear in what the node serves")
PYEOF
done
echo "ok: / is the page (CSP, no external assets); /status.json shows 3 alive members, the uncovered cluster, devices, percentiles; no key material"

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
    echo "SKIP: the browser part needs Debian's chromium (scripts/setup.sh installs it)"
    exit 77
fi
# dom: the page as Chromium leaves it after running its script for a few (virtual) seconds
dom() {
    timeout 60 "$CHROME" --headless=new --no-sandbox --disable-gpu --user-data-dir="$dir/chrome" \
        --virtual-time-budget=3000 --dump-dom "$base/" 2>"$dir/chrome.err"
}
dom >"$dir/dom1.html" || { tail -5 "$dir/chrome.err" >&2; fail "chromium could not load the page"; }
grep -q 'data-members="3" data-alive="3"' "$dir/dom1.html" ||
    fail "the page does not show 3 members, 3 alive: $(grep -o 'id="summary"[^<]*' "$dir/dom1.html")"
grep -q 'class="cluster uncovered"' "$dir/dom1.html" || fail "the page does not mark the uncovered cluster"
[ "$(grep -o '<tr data-state="alive"' "$dir/dom1.html" | wc -l)" = 3 ] || fail "the page lists $(grep -o '<tr data-state=' "$dir/dom1.html" | wc -l) member rows, not 3"
grep -q 'id="h-rps"[^>]*><b>[0-9.]*</b><svg class="spark"' "$dir/dom1.html" ||
    fail "the page draws no request-rate history: $(grep -o 'id="h-rps".\{0,120\}' "$dir/dom1.html")"
grep -q 'id="bans"><tr><td class="muted" colspan="5">none' "$dir/dom1.html" ||
    fail "the page's banned nodes: $(grep -o 'id="bans".\{0,80\}' "$dir/dom1.html")"
grep -q 'id="training" class="muted">no training job on this node' "$dir/dom1.html" ||
    fail "the page's training line: $(grep -o 'id="training".\{0,80\}' "$dir/dom1.html")"
echo "ok: in Chromium the page shows 3 members, 3 alive, and the uncovered cluster"

# a node leaves: the page, never reloaded by hand, follows (SIGTERM: the node says goodbye)
kill -TERM "$(cat "$dir/net/node-2/tesserad.pid")"
i=0
until dom >"$dir/dom2.html" && grep -q 'data-members="3" data-alive="2"' "$dir/dom2.html"; do
    i=$((i + 1))
    [ $i -lt 60 ] || fail "the page never showed the node gone: $(grep -o 'id="summary"[^<]*' "$dir/dom2.html")"
    sleep 0.5
done
grep -q '<tr data-state="left"\|<tr data-state="dead"' "$dir/dom2.html" || fail "no member row shows the node left or dead"
echo "ok: after a node leaves the page shows 2 alive and the node as gone"
