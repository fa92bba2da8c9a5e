# tests/lib.sh — the helpers the shell tests share (POSIX sh; the bash tests source it too).
# A test reads its arguments (T: tessera, D: tesserad), then sources it:
#
#     . "$(dirname "$0")/lib.sh"
#
# It makes $dir, a fresh temporary folder, and sets a trap that at exit
#   - kills -9 every process in $pids (a test appends what it starts: pids="$pids $!"),
#   - stops every `tessera up` network whose folder is in $nets (tessera down),
#   - runs the test's own cleanup_more, where the test defines one,
#   - removes $dir.
# fail prints the end of each file matching the patterns in $logs (a daemon's log, a client's
# stderr), so that a failure in CI shows what the daemons said. Daemons listen on port 0 and
# write the port they got to DATA_DIR/listen.addr: no test uses a fixed port.

PY=${TESSERA_PYTHON:-/usr/bin/python3} # a GPU machine's python3 may live elsewhere
dir=$(mktemp -d)
pids=
nets=
logs=
log_lines=15 # how much of each log fail shows
log_grep=    # when set, fail shows only the log lines matching this (grep -E)

ts_cleanup() {
    for p in $pids; do kill -9 "$p" 2>/dev/null || true; done
    for n in $nets; do
        [ -d "$n" ] && "$T" down --dir "$n" --timeout 5 >/dev/null 2>&1 || true
    done
    if command -v cleanup_more >/dev/null 2>&1; then cleanup_more; fi
    rm -rf "$dir"
}
trap ts_cleanup EXIT

# fail MESSAGE: says FAIL and why on stderr, with the end of each log in $logs, and exits 1.
fail() {
    echo "FAIL: $*" >&2
    for f in $logs; do
        [ -f "$f" ] || continue
        echo "--- $f" >&2
        if [ -n "$log_grep" ]; then
            grep -E "$log_grep" "$f" | tail -n "$log_lines" >&2 || true
        else
            tail -n "$log_lines" "$f" >&2 || true
        fi
    done
    exit 1
}

# skip REASON: says why, and exits 77 (ctest: skipped).
skip() {
    echo "SKIP: $*"
    exit 77
}

# run CMD...: quiet unless it fails; its stdout is in $dir/out.txt, its stderr in $dir/err.txt.
run() { "$@" >"$dir/out.txt" 2>"$dir/err.txt" || { cat "$dir/err.txt" >&2; fail "$*"; }; }

# json_get FILE EXPR: prints the Python expression EXPR over the JSON object j read from FILE.
json_get() { "$PY" -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"; }

# wait_log FILE REGEX [SECONDS]: until a line of FILE matches REGEX (grep -E), up to SECONDS (120).
wait_log() {
    _n=$((${3:-120} * 10))
    _i=0
    while ! grep -qsE "$2" "$1"; do
        _i=$((_i + 1))
        [ $_i -lt $_n ] || fail "no /$2/ in $1 after ${3:-120} s"
        sleep 0.1
    done
}

# wait_listen NODE_DIR WHAT [SECONDS]: until the daemon of NODE_DIR has written
# NODE_DIR/data/listen.addr, up to SECONDS (30); fails with "WHAT did not start".
wait_listen() {
    _n=$((${3:-30} * 10))
    _i=0
    while [ ! -s "$1/data/listen.addr" ]; do
        _i=$((_i + 1))
        [ $_i -lt $_n ] || fail "$2 did not start"
        sleep 0.1
    done
}

# free_port: a loopback TCP port nothing listens on (bound, noted, let go).
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# node_section NAME [BOOTSTRAP] [NETWORK_KEY]: prints the [node] section of a daemon whose files
# live in $dir/NAME (id.key, data/), listening on a port of its own choosing, in the network of
# NETWORK_KEY ($dir/net.key).
node_section() {
    printf '[node]\nidentity = %s\nnetwork_key = %s\ndata_dir = %s\nlisten = 127.0.0.1:0\n' \
        "$dir/$1/id.key" "${3:-$dir/net.key}" "$dir/$1/data"
    [ -z "${2:-}" ] || printf 'bootstrap = %s\n' "$2"
}

# start_node NAME: starts tesserad on $dir/NAME/d.ini in the background, its stderr into
# $dir/NAME.err and its process id into $dir/NAME/pid (and $pids).
start_node() {
    "$D" --config "$dir/$1/d.ini" 2>>"$dir/$1.err" &
    pids="$pids $!"
    echo $! >"$dir/$1/pid"
}
