#!/usr/bin/env bash
# Mutation testing of the rules that decide: cargo-mutants changes one spot of
# the code at a time (a condition negated, a value replaced, a body emptied)
# and runs the tests on each change; a change no test fails on is a mutant
# that survived, a decision the tests do not pin down. It mutates the safety
# rules of handler/src/core/rules and the Node patches (DEFAULT_FILES below),
# and runs node-fencer's unit tests and the simulator (.cargo/mutants.toml;
# NODE_FENCER_SIM_SECONDS of seeds from a fixed first one, so that a rerun
# tries the same seeds).
#
# Usage: tests/mutants/run.sh [--list] [--file PATH]... [cargo-mutants options]
#   make mutants                          every file of DEFAULT_FILES (hours on 2 cores)
#   make mutants FILES=handler/src/core/rules/cap.rs   that file only
#   --list                                the mutants only, nothing built
#
# Not part of `make test`. cargo-mutants is installed once into the cache,
# keyed by its version; its builds share the cache's target directory, so
# that the dependencies are built once. The results go to target/mutants.out
# (missed.txt lists the survivors, caught.txt the others).
set -euo pipefail

CARGO_MUTANTS_VERSION=27.0.0 # crates.io cargo-mutants
CACHE="${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}"
BIN="$CACHE/bin/cargo-mutants-$CARGO_MUTANTS_VERSION/cargo-mutants"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [ ! -x "$BIN" ]; then
	command -v cargo >/dev/null || {
		echo "run.sh: cargo is required to install cargo-mutants" >&2
		exit 1
	}
	echo "==> installing cargo-mutants $CARGO_MUTANTS_VERSION (first time only, ~3 min)"
	root="$BIN.root"
	rm -rf "$root"
	CARGO_TARGET_DIR="$root/target" cargo install cargo-mutants --version "$CARGO_MUTANTS_VERSION" \
		--locked --quiet --root "$root"
	mkdir -p "$(dirname "$BIN")"
	mv -f "$root/bin/cargo-mutants" "$BIN"
	rm -rf "$root"
fi

# The rules that decide whether and what to fence, and the patches that write
# it; any --file given replaces them.
DEFAULT_FILES=(
	"handler/src/core/rules/silence/**/*.rs"
	handler/src/core/rules/power.rs
	handler/src/core/rules/identity.rs
	handler/src/core/rules/namesake.rs
	handler/src/core/rules/held_disks.rs
	handler/src/core/rules/stuck.rs
	handler/src/core/rules/decide.rs
	handler/src/core/rules/plan.rs
	handler/src/core/rules/cap.rs
	handler/src/core/rules/recovery.rs
	handler/src/core/outbound/kube_patch.rs
)
files=()
for f in "${DEFAULT_FILES[@]}"; do
	files+=(--file "$f")
done
for arg in "$@"; do
	case "$arg" in
	-f | --file | --file=*) files=() ;;
	esac
done

cd "$ROOT"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Each mutant is built from a copy of the tree into the shared cache: the
# next `make` here must not take the last mutant's build for its own
# (tests/stack/own-target.sh).
# --list builds nothing, and leaves the mark of whichever tree built last.
listing=0
for arg in "$@"; do
	[[ $arg == --list ]] && listing=1
done
if ((!listing)); then
	mkdir -p "$CARGO_TARGET_DIR"
	echo "cargo-mutants" >"$CARGO_TARGET_DIR/.built-from"
fi
# Seeds from 1 each time: a mutant caught once is caught again.
export NODE_FENCER_SIM_SECONDS="${NODE_FENCER_SIM_SECONDS:-10}"
export NODE_FENCER_SIM_FIRST_SEED="${NODE_FENCER_SIM_FIRST_SEED:-1}"
# cargo's own subcommand form: `cargo-mutants mutants ...`.
exec "$BIN" mutants --output target "${files[@]}" "$@"
