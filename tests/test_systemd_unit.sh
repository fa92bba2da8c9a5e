#!/bin/sh
# test_systemd_unit.sh UNIT TESSERAD — configs/tesserad.service as systemd reads it:
#   - `systemd-analyze verify` prints nothing (it exits 0 even for an unknown key or a value it
#     cannot parse, and only says so on stderr, so any output is a failure);
#   - `systemd-analyze security --offline` rates its exposure at 2.0 or less ("OK"), so dropping a
#     hardening line fails here rather than on a volunteer's machine;
#   - the directives the operations guide relies on are there.
# ExecStart is pointed at the built tesserad (verify checks that the binary exists). Without
# systemd-analyze the test says SKIP and exits 77 (ctest: skipped).
set -eu
UNIT=${1:?usage: test_systemd_unit.sh UNIT TESSERAD}
D=${2:?usage: test_systemd_unit.sh UNIT TESSERAD}
. "$(dirname "$0")/lib.sh"
command -v systemd-analyze >/dev/null 2>&1 || skip "systemd-analyze not found (Debian package systemd)"
for want in '^User=tessera$' '^StateDirectory=tessera$' '^WorkingDirectory=/var/lib/tessera$' \
    '^ExecStart=/usr/local/bin/tesserad --config /etc/tessera/tesserad.ini$' \
    '^ExecReload=/bin/kill -HUP \$MAINPID$' '^Restart=on-failure$' '^KillSignal=SIGTERM$' \
    '^TimeoutStopSec=' '^NoNewPrivileges=yes$' '^ProtectSystem=strict$' '^ProtectHome=yes$' \
    '^PrivateTmp=yes$' '^PrivateDevices=yes$' '^MemoryDenyWriteExecute=yes$' \
    '^RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX$' '^ReadWritePaths=/var/lib/tessera$' \
    '^CapabilityBoundingSet=$' '^SystemCallFilter=@system-service$'; do
    grep -q "$want" "$UNIT" || fail "$UNIT has no line matching $want"
done
sed "s#^ExecStart=/usr/local/bin/tesserad #ExecStart=$D #" "$UNIT" >"$dir/tesserad.service"
grep -q "^ExecStart=$D " "$dir/tesserad.service" || fail "could not point ExecStart at $D"

systemd-analyze verify "$dir/tesserad.service" >"$dir/verify.txt" 2>&1 ||
    fail "systemd-analyze verify failed: $(cat "$dir/verify.txt")"
[ ! -s "$dir/verify.txt" ] || fail "systemd-analyze verify complained: $(cat "$dir/verify.txt")"

# --offline and --threshold came with systemd 250; an older one skips this part.
if systemd-analyze security --help 2>/dev/null | grep -q -- '--offline'; then
    if ! systemd-analyze security --offline=yes --threshold=20 "$dir/tesserad.service" \
        >"$dir/security.txt" 2>&1; then
        grep "Overall exposure" "$dir/security.txt" >&2 || cat "$dir/security.txt" >&2
        fail "the unit's exposure is over 2.0 (systemd-analyze security)"
    fi
    grep "Overall exposure" "$dir/security.txt"
else
    echo "note: systemd-analyze security --offline not available; exposure not checked"
fi
echo "ok: $UNIT verified"
