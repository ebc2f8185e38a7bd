# Every workflow of node-fencer in one place. `make help` lists them.
#
# Slow builds are cached outside the clone, keyed by version: Rust artefacts in
# $(CACHE)/target, the Go-built Kubernetes binaries and the Python tools in
# $(CACHE) (see tests/stack/README.md).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CACHE ?= $(or $(NODE_FENCER_CACHE),$(HOME)/.cache/node-fencer)
export NODE_FENCER_CACHE := $(CACHE)
export CARGO_TARGET_DIR ?= $(CACHE)/target
# Another tree that built into the same cache last would pass for this one
# (tests/stack/own-target.sh says why): its sources are marked changed.
_ := $(shell CARGO_TARGET_DIR='$(CARGO_TARGET_DIR)' bash tests/stack/own-target.sh)
export CARGO_TERM_COLOR ?= never
TOOLS := source "$(CACHE)/env.sh"
STACK_DIR ?= $(CURDIR)/tests/.stack

.PHONY: help setup fmt lint lint-build lint-build-tests lint-build-images unit test infra-test gce-test redfish-test manifest fuzz sim mutants run bench bench-budget package stack-up stack-down clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: ## install everything the project needs (idempotent; cached by version)
	bash tests/stack/setup.sh

fmt: ## format the Rust code
	cargo fmt --all
	cargo fmt --manifest-path handler/fuzz/Cargo.toml

lint: ## rustfmt check and clippy with warnings as errors: the workspace, each shipped build's features (Lambda, Cloud Run, on-premises), the core alone, the fuzz targets
	cargo fmt --all --check
	cargo fmt --manifest-path handler/fuzz/Cargo.toml --check
	cargo clippy --workspace --all-targets --locked -- -D warnings
	cargo clippy -p node-fencer --all-targets --locked -- -D warnings
	cargo clippy -p node-fencer --features serve,google-cloud --all-targets --locked -- -D warnings
	cargo clippy -p node-fencer --features serve,redfish --all-targets --locked -- -D warnings
	cargo clippy -p node-fencer --no-default-features --all-targets --locked -- -D warnings
	cargo clippy --manifest-path handler/fuzz/Cargo.toml --all-targets --locked -- -D warnings

# `make test` lints while it builds: with clippy's driver as the workspace's
# compiler (RUSTC_WORKSPACE_WRAPPER and CLIPPY_ARGS, what `cargo clippy` sets),
# each build of the workspace's crates is also their clippy pass, warnings
# denied, while the dependencies build with rustc as ever. The dependencies (the
# AWS SDK above all) then compile once, for the build, instead of once checked
# for `make lint` and once built: on 2 cores that check took 17 to 21 minutes
# of a cold run. `cargo test --no-run` of the workspace builds every target
# (lib, tests, bins, integration tests: what `--all-targets` checks) with the
# features unified, every image's; then the Lambda build's lib and binary
# with its own features (the build the emulators run, so the tests build
# nothing of it again): `lint-build-tests`. Then each other shipped build's
# library with its own features (Cloud Run, on-premises, and the core alone:
# `lint-build-images`), which `make test` runs beside the integration tests,
# in its late build: they write no binary the tests start (their `main` is
# the Lambda build's, 21 lines without a feature of its own; `make lint`
# checks it under each feature set). Those builds build no test targets:
# each test build is a full compile of the crate again (about a minute cold
# on 2 cores), and the tests' code is the same in every image. The
# integration tests run under the same variables, so nothing is built again
# between the phases. The fuzz targets are linted by their own build
# (handler/fuzz/run.sh), which `make test` runs beside the integration tests.
# No incremental compilation: each of these builds compiles the workspace's
# crates once, from scratch on a cold machine, and keeping the incremental
# state costs a quarter of their CPU (the Lambda build of node-fencer, lib and
# binary: 35 to 40 s of CPU with it, 26 to 29 s without).
LINTING_BUILD := export RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__ CARGO_INCREMENTAL=0
lint-build: lint-build-tests lint-build-images ## what make test runs for the lint: rustfmt check, then the workspace's test build and each shipped build, compiled by clippy's driver (warnings denied)

lint-build-tests:
	cargo fmt --all --check
	cargo fmt --manifest-path handler/fuzz/Cargo.toml --check
	$(LINTING_BUILD) && cargo test --workspace --locked --no-run
	$(LINTING_BUILD) && cargo build -p node-fencer --locked --bins

lint-build-images:
	$(LINTING_BUILD) && cargo build -p node-fencer --features serve,google-cloud --locked --lib
	$(LINTING_BUILD) && cargo build -p node-fencer --features serve,redfish --locked --lib
	$(LINTING_BUILD) && cargo build -p node-fencer --no-default-features --locked --lib

unit: ## the pure core's unit and property tests (no stack needed)
	cargo test --locked -p node-fencer

# `make test` runs in three phases, each filling both cores of a small machine.
# 1. The tools the integration tests run from their start (`setup.sh
#    --skip-checks --skip-old-planes`, [setup] lines) build beside the Rust
#    builds, which are the lint too (`make lint-build-tests`: the test build
#    and the Lambda build the emulators run, [cargo] lines): on a cold machine
#    each leaves a core idle for long stretches (rustc on the AWS SDK's
#    largest crates, the Go linker).
# 2. The integration tests, whose controllers keep time, with the old control
#    planes (`setup.sh --only-old-planes`), the tools of the checks after them
#    (`setup.sh --only-checks`), the fuzz targets and the other images' lint
#    (`make lint-build-images`), and last the deployable zip's release
#    build (`make package`'s), building beside them at the
#    lowest CPU priority ([checks] lines): the tests mostly wait on timers and
#    leave the cores idle, and a niced build takes only that. The legacy and
#    1.15 tests wait for their control plane, the witness test for
#    promtool, and the release bootstrap's test under the emulator for the
#    zip (the one of an earlier run removed first, so none is stale), while
#    that build runs (NODE_FENCER_LATE_BUILD_PID names it;
#    tests/src/late_build.rs). That build is the longer of the two on a cold
#    machine, so it starts as soon as phase 1's set-up is done: the last of
#    the Rust builds (one crate at a time, each shipped build's) leave a core
#    to it. Started beside the whole Rust build instead, niced, it still slowed
#    the Rust test build from 8 m 35 s to 14 m 15 s on 2 cores.
# 3. The fuzz run (one libFuzzer process at a time) beside the infra and GCE
#    checks (mostly one core each), and the Redfish checks beside both: they
#    mostly wait for the emulator's power changes (1 to 11 s each).
# Each runs in a subshell with pipefail, so that its own failure, not its
# prefixing `sed`'s, is what `wait` reports; a failed phase stops the builds
# beside it.
# The deployable zip: `make package`, and the last of the late build, which
# marks it written whole (ZIP_BUILT) for the test that waits for it.
PACKAGE_BUILD := cargo lambda build --release --locked --package node-fencer --bin node-fencer --output-format zip --lambda-dir target/lambda
ZIP_BUILT := target/lambda/node-fencer/bootstrap.zip.built
LATE_BUILD := nice -n 19 bash tests/stack/setup.sh --only-old-planes && nice -n 19 bash tests/stack/setup.sh --only-checks && nice -n 19 bash handler/fuzz/run.sh --build && nice -n 19 $(MAKE) --no-print-directory lint-build-images && $(TOOLS) && nice -n 19 $(PACKAGE_BUILD) && touch $(ZIP_BUILT)
test: ## everything CI runs: lint, unit, integration against the real stack, infra, GCE and Redfish checks, a short fuzz run
	@echo "==> make test: the stack's tools ([setup] lines) build beside the lint and the Rust builds ([cargo] lines); cached, so only the first run is long"
	rm -f target/lambda/node-fencer/bootstrap.zip $(ZIP_BUILT)
	( set -o pipefail; bash tests/stack/setup.sh --skip-checks --skip-old-planes 2>&1 | sed -u 's/^/[setup] /' ) & setup=$$!; \
	( set -o pipefail; $(MAKE) --no-print-directory lint-build-tests 2>&1 | sed -u 's/^/[cargo] /' ) & cargo=$$!; \
	wait $$setup || { wait $$cargo || true; exit 1; }; \
	echo "==> the old control planes, the checks' tools and the fuzz targets ([checks] lines) build at the lowest CPU priority, beside the Rust builds and then the integration tests"; \
	setsid -w bash -c 'set -o pipefail; { $(LATE_BUILD); } 2>&1 | sed -u "s/^/[checks] /"' & checks=$$!; \
	wait $$cargo || { kill -- -$$checks 2>/dev/null || true; exit 1; }; \
	echo "==> the integration tests"; \
	$(TOOLS) && $(LINTING_BUILD) && NODE_FENCER_LATE_BUILD_PID=$$checks cargo test --workspace --locked \
	  || { kill -- -$$checks 2>/dev/null || true; exit 1; }; \
	wait $$checks
	( set -o pipefail; $(MAKE) --no-print-directory fuzz 2>&1 | sed -u 's/^/[fuzz] /' ) & fuzz=$$!; \
	( set -o pipefail; $(MAKE) --no-print-directory redfish-test 2>&1 | sed -u 's/^/[redfish] /' ) & redfish=$$!; \
	{ $(MAKE) --no-print-directory infra-test && $(MAKE) --no-print-directory gce-test; } \
	  || { wait $$fuzz || true; wait $$redfish || true; exit 1; }; \
	wait $$fuzz; wait $$redfish

infra-test: ## Terraform parse, format, IAM/RBAC equality, checkov, amtool, promtool; tofu validate and plan
	$(TOOLS) && "$$NODE_FENCER_INFRA_VENV/bin/python" -m pytest tests/infra -q

gce-test: ## the fake Compute Engine held to Google's API description and client; the GCE trigger fixtures
	$(TOOLS) && "$$NODE_FENCER_GCE_VENV/bin/python" -m pytest tests/gce -q

redfish-test: ## the Redfish emulator and DMTF's validator against it
	$(TOOLS) && "$$NODE_FENCER_REDFISH_VENV/bin/python" -m pytest tests/redfish -q

manifest: ## write infra/manifest.json (AWS actions, Kubernetes rules, variables) from the code
	cargo run --locked -q -p node-fencer -- manifest > infra/manifest.json

FUZZ_SECONDS ?= 20
fuzz: setup ## every fuzz target for FUZZ_SECONDS each (default 20; a longer run: FUZZ_SECONDS=600)
	bash handler/fuzz/run.sh $(FUZZ_SECONDS)

# `make sim` builds the simulator as `make test` builds it (the workspace's
# features, clippy's driver as the compiler), so that after a `make test`
# nothing is compiled again: `cargo run -p node-fencer-sim` alone would build
# the dependency tree once more, with that crate's features only. The binary is
# then started as built. `make test` runs the simulator too, for about 20 s
# (its crate's own `cargo test`); docs/simulator.md says what it models.
SECONDS ?= 60
sim: ## the deterministic simulator: fresh seeds for SECONDS of wall time (default 60), or one seed replayed with SEED=N (NO_STALE_NODES=1: without the stale-Node moves, as seeds drew before they were in the default world; NO_ACTIVE_FENCING=1: without active fencing, likewise; MOVES=0,4,9: only those moves, a shrunk failure's replay); a failure is shrunk to its fewest moves
	$(LINTING_BUILD) && cargo build --locked --workspace --bins
	"$$CARGO_TARGET_DIR/debug/sim" $(if $(SEED),--seed $(SEED),--seconds $(SECONDS)) $(if $(NO_STALE_NODES),--no-stale-nodes) $(if $(NO_ACTIVE_FENCING),--no-active-fencing) $(if $(MOVES),--moves $(MOVES))

FILES ?=
mutants: ## cargo-mutants over the rules that decide, against the unit tests and the simulator (hours; FILES=path... for some files; not in make test)
	bash tests/mutants/run.sh $(foreach f,$(FILES),--file $(f))

# `make run` builds only what it runs: the stack's tools for the scene ARGS names
# (`setup.sh --for-run --cloud=...`: no test-only tools, and the PD CSI driver or
# the Redfish venv only for the scene that runs them) and, side by side with
# them, the Rust binaries with cargo's progress in view: local-run, and the function the emulator starts (the
# handler's main as the harness builds it, node-fencer-full, on either cloud: one
# feature set, so the dependency tree is built once), so that its first
# invocation does not compile in silence. Side by side because each leaves a core idle for long
# stretches (rustc on the AWS SDK's largest crates, the Go linker). local-run is
# then started as built, not with `cargo run`: cargo would give it CARGO_MANIFEST_DIR
# and CARGO_PKG_*, which the emulator's own cargo inherits, and ring's build script
# reruns on a change of those, recompiling ring and what depends on it.
RUN_CLOUD = $(if $(findstring gce,$(ARGS)),gce,$(if $(findstring redfish,$(ARGS)),redfish,aws))
run: ## the seed scenario on the local stack, node-fencer under the Lambda runtime emulator (ARGS="--cloud gce", "--cloud redfish", --help)
	@echo "==> make run: the $(RUN_CLOUD) scene's tools ([setup] lines) and the Rust binaries ([cargo] lines) build side by side, the first time only"
	( set -o pipefail; bash tests/stack/setup.sh --for-run --cloud=$(RUN_CLOUD) 2>&1 | sed -u 's/^/[setup] /' ) & setup=$$!; \
	( set -o pipefail; { echo "==> building local-run and the function (first time only: about 10 min on 2 idle cores, most of it the AWS SDK; later, seconds)"; \
	  cargo build --locked -p node-fencer-tests --bin local-run --bin node-fencer-full; } 2>&1 | sed -u 's/^/[cargo] /' ) \
	  || { wait $$setup || true; exit 1; }; \
	wait $$setup
	$(TOOLS) && "$$CARGO_TARGET_DIR/debug/local-run" $(ARGS)

bench: setup ## the recovery-time benchmark (ARGS=--help for its options)
	$(TOOLS) && cargo run --locked -q -p node-fencer-tests --bin bench-recovery -- $(ARGS)

bench-budget: package ## the performance budget of the release build: cold start, CPU per event, RSS, zip, storm growth (ARGS=--help)
	$(TOOLS) && cargo run --locked -q -p node-fencer-tests --bin bench-budget -- $(ARGS)

package: setup ## the deployable bootstrap zip for provided.al2023 (x86_64)
	$(TOOLS) && $(PACKAGE_BUILD)
	@ls -l target/lambda/node-fencer/bootstrap.zip

stack-up: setup ## start the local stack with controllers and kwok in $(STACK_DIR)
	bash tests/stack/up.sh "$(STACK_DIR)" --controllers

stack-down: ## stop the local stack in $(STACK_DIR)
	bash tests/stack/down.sh "$(STACK_DIR)"

clean: ## remove this clone's build output (the shared cache stays)
	cargo clean
