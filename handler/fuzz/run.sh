#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 20), one after the
# other; a crash stops the run with the input that caused it.
#
# Usage: handler/fuzz/run.sh [SECONDS] [TARGET...]
#        handler/fuzz/run.sh --build
#   make fuzz                       every target, 20 s each (what CI runs)
#   make fuzz FUZZ_SECONDS=600      a longer run
#   --build                         build the targets only (`make test` does so
#                                   beside the integration tests)
#
# The corpus grows in $CACHE/fuzz-corpus/<target>, outside the clone, seeded
# with the trigger fixtures (handler/tests/fixtures). A crash is written to
# handler/fuzz/artifacts/<target>/; copy it into handler/fuzz/regressions/ so
# that `cargo test` replays it from then on.
set -euo pipefail

build_only=0
if [ "${1:-}" = --build ]; then
	build_only=1
	shift
fi
seconds=${1:-20}
shift || true
[[ "$seconds" =~ ^[0-9]+$ ]] || {
	echo "run.sh: SECONDS must be a number, not '$seconds'" >&2
	exit 2
}
all=(classify eventbridge alertmanager direct function_url gce_audit oidc)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
	[[ " ${all[*]} " == *" $t "* ]] || {
		echo "run.sh: no fuzz target '$t' (targets: ${all[*]})" >&2
		exit 2
	}
done

CACHE="${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}"
[ -f "$CACHE/env.sh" ] || {
	echo "run.sh: $CACHE/env.sh is missing; run tests/stack/setup.sh (make setup)" >&2
	exit 1
}
# shellcheck source=/dev/null
source "$CACHE/env.sh"
[ -x "${NODE_FENCER_CARGO_FUZZ:-}" ] || {
	echo "run.sh: cargo-fuzz is not installed; run tests/stack/setup.sh (make setup)" >&2
	exit 1
}
cd "$(dirname "${BASH_SOURCE[0]}")/.."

export CARGO_TARGET_DIR="$CACHE/fuzz-target"
# cargo-fuzz hands rustc `-Z` sanitizer flags; RUSTC_BOOTSTRAP lets the stable
# toolchain, the only one these machines are sure to have, accept them.
export RUSTC_BOOTSTRAP=1
# The build is also the targets' clippy pass, warnings denied: clippy's driver
# compiles this workspace's crate (what `cargo clippy` sets), so `make test`
# lints them without compiling them a second time. Set for the runs too: cargo
# would build again for a change of the compiler.
export RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__

echo "==> building the fuzz targets (address sanitizer, coverage; clippy warnings denied)"
"$NODE_FENCER_CARGO_FUZZ" build --fuzz-dir fuzz -O
[ "$build_only" = 0 ] || exit 0
mkdir -p "$CACHE/fuzz-logs"
for t in "${targets[@]}"; do
	corpus="$CACHE/fuzz-corpus/$t"
	log="$CACHE/fuzz-logs/$t.log"
	mkdir -p "$corpus"
	echo "==> fuzzing $t for ${seconds}s (corpus: $(find "$corpus" -type f | wc -l) inputs)"
	if ! "$NODE_FENCER_CARGO_FUZZ" run --fuzz-dir fuzz -O "$t" "$corpus" tests/fixtures tests/fixtures/gce fuzz/regressions -- \
		-max_total_time="$seconds" -max_len=65536 -print_final_stats=1 >"$log" 2>&1; then
		tail -n 40 "$log" >&2
		echo "run.sh: $t failed; a crashing input is under handler/fuzz/artifacts/$t/ (log: $log)" >&2
		exit 1
	fi
	grep -E '^stat::number_of_executed_units' "$log" | sed 's/^/    /' || true
done
echo "==> no crash in ${#targets[@]} target(s)"
