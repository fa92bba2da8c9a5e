# tessera — the entry points. A thin wrapper around scripts/setup.sh, CMake and ctest; everything
# real lives in CMakeLists.txt. `make help` lists the targets.
#
#   make demo    set up, build (Release, CUDA when nvcc is found), run the main job
#   make test    set up, build, run every test; then the same suite in a sanitizer build; then
#                the fuzz harnesses for FUZZ_SECONDS (30) each
#
# Builds are incremental: the build trees are configured once and reconfigured only when the
# options below change (CMake itself reruns when a CMakeLists.txt changes).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
# The steps of a target run in order (set up before building); the parallelism is inside the
# builds (JOBS) rather than between targets.
.NOTPARALLEL:
MAKEFLAGS += --no-print-directory

JOBS      ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE     ?= cmake
CTEST     ?= ctest
BUILD     ?= build
SAN_BUILD ?= build-san
CUDA      ?= AUTO

RELEASE_OPTS := -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=$(CUDA) -DTESSERA_SANITIZE=OFF
SAN_OPTS     := -DCMAKE_BUILD_TYPE=Debug -DTESSERA_CUDA=OFF -DTESSERA_SANITIZE=ON

# Sanitizer run-time settings: stop at the first report, with a stack trace.
SAN_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1 \
           UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

CLANG_FORMAT ?= clang-format
FORMAT_DIRS  := base kernels model store net daemon client bench tests
FORMAT_FILES  = $(shell find $(FORMAT_DIRS) -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) 2>/dev/null)

.PHONY: help setup setup-all build build-san demo selfcheck test test-release test-san test-fuzz clean format format-check

help:
	@echo "tessera make targets:"
	@echo "  make demo          set up, build (Release), run the main job: scripts/demo.sh (a network of"
	@echo "                    four daemons on this machine, a grid generated through it)"
	@echo "  make selfcheck     set up, build, run: tessera selfcheck; tessera bench gemm"
	@echo "  make test          set up, build, ctest; then build-san/ (ASan+UBSan) and ctest there; then the fuzzers"
	@echo "  make test-fuzz     the libFuzzer harnesses for FUZZ_SECONDS (default 30) each, in build-fuzz/"
	@echo "  make build         configure + build $(BUILD)/ (Release, TESSERA_CUDA=$(CUDA))"
	@echo "  make setup         install missing Debian packages (scripts/setup.sh)"
	@echo "  make setup-all     also the optional ones: clang-format, prometheus (promtool)"
	@echo "  make format        clang-format -i every C/CUDA source"
	@echo "  make format-check  report sources that are not formatted (changes nothing)"
	@echo "  make clean         remove $(BUILD)/ and $(SAN_BUILD)/"
	@echo "variables: CUDA=AUTO|ON|OFF (default AUTO), JOBS=N (default: nproc = $(JOBS))"

setup:
	@bash scripts/setup.sh

setup-all:
	@bash scripts/setup.sh --all

# configure DIR OPTIONS: runs CMake when DIR is not configured yet or was configured with other
# options (the options are remembered in DIR/.tessera-options); otherwise leaves it alone.
define configure
	@if [[ ! -f $(1)/CMakeCache.txt || "$$(cat $(1)/.tessera-options 2>/dev/null)" != "$(2)" ]]; then \
	    echo "== configure $(1): $(2)"; \
	    $(CMAKE) -S . -B $(1) $(2); \
	    echo "$(2)" > $(1)/.tessera-options; \
	fi
endef

build:
	$(call configure,$(BUILD),$(RELEASE_OPTS))
	@echo "== build $(BUILD)/ (-j$(JOBS))"
	@$(CMAKE) --build $(BUILD) -j$(JOBS)

build-san:
	$(call configure,$(SAN_BUILD),$(SAN_OPTS))
	@echo "== build $(SAN_BUILD)/ (-j$(JOBS))"
	@$(CMAKE) --build $(SAN_BUILD) -j$(JOBS)

demo: setup build
	@BUILD=$(BUILD) bash scripts/demo.sh

# The kernel self-check and the GEMM benchmark (what `make demo` ran before the network existed).
selfcheck: setup build
	@echo "== $(BUILD)/client/tessera selfcheck"
	@$(BUILD)/client/tessera selfcheck
	@echo
	@echo "== $(BUILD)/client/tessera bench gemm"
	@$(BUILD)/client/tessera bench gemm

test-release: build
	@echo "== ctest $(BUILD)/"
	@$(CTEST) --test-dir $(BUILD) --output-on-failure

# The *_poisoned variants (the same tests with every allocation filled with NaN bytes) run in the
# Release pass only: under the sanitizers they would run the code their plain twins run.
test-san: build-san
	@echo "== ctest $(SAN_BUILD)/ (AddressSanitizer + UndefinedBehaviorSanitizer; *_poisoned in the Release pass)"
	@$(SAN_ENV) $(CTEST) --test-dir $(SAN_BUILD) --output-on-failure -E '_poisoned$$'

# Both suites run even when the first fails, so one run reports everything; the exit status is
# non-zero when either failed.
# The nine libFuzzer harnesses (frame decoder, Envelope unpacking, handshake responder, gossip
# wire and a gossip node's sealed datagram path, safetensors, partition and router files, IDX data, tesserad's config), each for
# FUZZ_SECONDS, built with clang in build-fuzz/ (tests/fuzz/run.sh).
FUZZ_SECONDS ?= 30
test-fuzz: setup
	@echo "== fuzz: each harness for $(FUZZ_SECONDS) s (build-fuzz/)"
	@JOBS=$(JOBS) tests/fuzz/run.sh $(FUZZ_SECONDS)

test: setup
	@status=0; \
	$(MAKE) --no-print-directory test-release || status=1; \
	$(MAKE) --no-print-directory test-san || status=1; \
	$(MAKE) --no-print-directory test-fuzz || status=1; \
	if [[ $$status -ne 0 ]]; then echo "== make test: FAILED (see above)"; else echo "== make test: all suites passed"; fi; \
	exit $$status

format:
	@files="$(FORMAT_FILES)"; [[ -n "$$files" ]] && $(CLANG_FORMAT) -i $$files; \
	echo "clang-format: $$(wc -w <<< "$$files") files formatted"

format-check:
	@files="$(FORMAT_FILES)"; [[ -z "$$files" ]] || $(CLANG_FORMAT) --dry-run --Werror $$files

clean:
	rm -rf $(BUILD) $(SAN_BUILD) build-fuzz
