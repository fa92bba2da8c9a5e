#!/usr/bin/env bash
# scripts/setup.sh — install the Debian packages tessera needs, when they are missing.
#
# Usage: scripts/setup.sh [--all] [--check] [--help]
#
#   (no option)  the packages the build and the test suite need (group "build"), including
#                python3-torch (PyTorch, the reference of the parity tests and benchmarks; ~1 GB
#                with its dependencies, installed once), dataset-fashion-mnist (the data), and
#                clang + libclang-rt-dev (the libFuzzer harnesses that `make test` runs).
#   --all        also the optional group: clang-format (`make format`) and prometheus (promtool,
#                for test_promtool, which skips without it). Same as
#                TESSERA_SETUP_ALL=1.
#   --check      only report what is missing; exit 1 when something is, install nothing.
#
# Idempotent: every package is checked with dpkg-query first, and when nothing is missing apt is
# not touched at all (no update, no install), so the script is quick to run before every build.
# When something is missing it runs `apt-get update` once and installs it non-interactively, with
# sudo when not run as root. The CUDA Toolkit is not installed here: it is optional (the build
# compiles the CUDA backend when it finds nvcc) and does not come from Debian main.
set -euo pipefail

# Keep in step with cmake/TesseraDeps.cmake, which names the same packages when one is missing.
# python3 + python3-torch run the PyTorch parity tests (tests/parity/), which CI must run.
BUILD_PKGS=(
    build-essential cmake pkg-config
    libuv1-dev libsodium-dev libprotobuf-c-dev protobuf-c-compiler liblmdb-dev lmdb-utils
    libopenblas-dev liblapacke-dev libcmocka-dev libdnnl-dev
    zlib1g-dev libpng-dev libinih-dev libjansson-dev libmicrohttpd-dev
    python3 python3-torch dataset-fashion-mnist
    clang libclang-rt-dev
    chromium iptables iproute2
)
# chromium (above, without its recommends: 16 packages) runs tesserad's status page in
# tests/test_status_page.sh, headless. iptables and iproute2 build the home routers (network
# namespaces behind a MASQUERADE NAT) of tests/test_nat.sh.
# clang + libclang-rt-dev (above): the libFuzzer harnesses, which `make test` runs for a short
# while (tests/fuzz/run.sh, TESSERA_FUZZ=ON).
# prometheus brings promtool, which tests/test_promtool.sh uses to check /metrics' output a second
# way (the C test's own strict parser is the first). It is optional: a 19 MB download, 96 MB
# installed, a whole Prometheus server with its web assets, for one check the suite skips without.
OPTIONAL_PKGS=(clang-format prometheus)

usage() {
    # the comment block at the top of this file, without the leading "# "
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

want_all="${TESSERA_SETUP_ALL:-0}"
check_only=0
for arg in "$@"; do
    case "$arg" in
    --all) want_all=1 ;;
    --check) check_only=1 ;;
    -h | --help)
        usage
        exit 0
        ;;
    *)
        echo "setup.sh: unknown option '$arg' (see scripts/setup.sh --help)" >&2
        exit 2
        ;;
    esac
done

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "setup.sh: dpkg-query not found: this script supports Debian and its derivatives only." >&2
    echo "          Install the equivalents of: ${BUILD_PKGS[*]}" >&2
    exit 1
fi

wanted=("${BUILD_PKGS[@]}")
group="build"
if [[ "$want_all" == 1 ]]; then
    wanted+=("${OPTIONAL_PKGS[@]}")
    group="build + optional"
fi

# A package counts as present only when dpkg says "install ok installed" (not merely known, or
# half-configured, or removed with its config files left behind).
missing=()
for pkg in "${wanted[@]}"; do
    status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
    if [[ "$status" != "install ok installed" ]]; then
        missing+=("$pkg")
    fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
    echo "setup: all ${#wanted[@]} packages present (${group})"
    exit 0
fi

echo "setup: missing (${group}): ${missing[*]}"
if [[ "$check_only" == 1 ]]; then
    exit 1
fi

sudo_cmd=()
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        sudo_cmd=(sudo)
    else
        echo "setup.sh: not root and sudo is not installed; as root, run:" >&2
        echo "    apt-get update && apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
echo "setup: apt-get update"
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
echo "setup: apt-get install ${missing[*]}"
"${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "setup: done"
