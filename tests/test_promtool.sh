#!/bin/sh
# test_promtool.sh TEST_DAEMON_METRICS — the daemon's /metrics output (test_daemon_metrics --dump:
# every family of ts_metrics_create_daemon, with values and an awkward label value) checked by
# Prometheus' own `promtool check metrics`, which parses the text format and lints names, units
# and help.
# promtool comes with Debian's package prometheus, which scripts/setup.sh installs only with --all;
# without it the test says SKIP and exits 77 (ctest: skipped). PROMTOOL=/path overrides the lookup.
set -eu
P=${1:?usage: test_promtool.sh TEST_DAEMON_METRICS}
promtool=${PROMTOOL:-$(command -v promtool || true)}
. "$(dirname "$0")/lib.sh"
[ -n "$promtool" ] || skip "promtool not found (apt-get install prometheus, or scripts/setup.sh --all)"
out=$dir/metrics.txt
"$P" --dump >"$out"
grep -q '^tessera_requests_total{type="denoise"} 12$' "$out" ||
    fail "test_daemon_metrics --dump did not print the expected sample"
"$promtool" check metrics <"$out" || fail "promtool check metrics refused the output above"
echo "promtool check metrics: ok ($(grep -c '^# TYPE' "$out") families)"
