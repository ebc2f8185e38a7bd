#!/usr/bin/env bash
# Claims the shared Cargo build cache ($CARGO_TARGET_DIR) for this tree.
#
# Cargo knows a workspace crate by its path inside the workspace and tells
# whether it changed by its files' times. Two trees sharing one target
# directory (two clones, a worktree) therefore look alike to it: a tree
# whose files are older than another tree's last build is taken as built,
# and its tests run the other tree's code. So when another tree built
# last, every tracked file here is marked changed, and the next build
# compiles this tree's own sources.
set -euo pipefail
target=${CARGO_TARGET_DIR:?CARGO_TARGET_DIR must be set}
tree=$(pwd -P)
mark="$target/.built-from"
if [[ -f $mark && $(<"$mark") == "$tree" ]]; then
	exit 0
fi
mkdir -p "$target"
# No mark: which tree built last is unknown, so this one is taken as changed.
echo "==> $target: last built from another tree, or none known; this tree's sources marked changed" >&2
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	git ls-files -z | xargs -0 -r touch -c --
else
	find . -path ./.git -prune -o -type f -exec touch -c -- {} +
fi
printf '%s\n' "$tree" >"$mark"
