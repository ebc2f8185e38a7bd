#!/usr/bin/env bash
# Stops a stack started by tests/stack/up.sh STATE_DIR: sends TERM to every
# process recorded in STATE_DIR/pids and to its process group, waits, then
# KILLs what is left. Idempotent: a stopped or never started STATE_DIR is fine.
# Logs and data stay in STATE_DIR for inspection.
#
# Usage: tests/stack/down.sh STATE_DIR
set -euo pipefail

if [ $# -ne 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
fi
[ -d "$1" ] || exit 0
S="$(cd "$1" && pwd)"
PIDS="$S/pids"
[ -f "$PIDS" ] || exit 0

GRACE_SECONDS="${NODE_FENCER_STACK_STOP_TIMEOUT:-10}"

# shellcheck source=tests/stack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# alive PID STARTTIME: still the process that up.sh started (not a recycled pid).
alive() {
	local st
	st=$(proc_starttime "$1") || return 1
	[ "$2" = 0 ] || [ "$st" = "$2" ]
}

# Entries: "PID STARTTIME NAME". The watchdog execs this script, so skip our own
# pid; it exits by itself when this script ends.
pids=() starts=() names=()
while read -r pid st name; do
	[[ "${pid:-}" =~ ^[0-9]+$ ]] || continue
	[ "$pid" != $$ ] || continue
	alive "$pid" "${st:-0}" || continue
	pids+=("$pid")
	starts+=("${st:-0}")
	names+=("${name:-?}")
done <"$PIDS"

signal_all() { # signal_all SIGNAL [NAME-TO-SKIP]
	local i
	for i in "${!pids[@]}"; do
		[ "${names[$i]}" != "${2:-}" ] || continue
		alive "${pids[$i]}" "${starts[$i]}" || continue
		# Each process leads its own process group (started with setsid).
		kill "-$1" -- "-${pids[$i]}" 2>/dev/null || true
		kill "-$1" "${pids[$i]}" 2>/dev/null || true
	done
}
any_alive() { # any_alive [NAME-TO-SKIP]
	local i
	for i in "${!pids[@]}"; do
		[ "${names[$i]}" != "${1:-}" ] || continue
		alive "${pids[$i]}" "${starts[$i]}" && return 0
	done
	return 1
}
wait_gone() { # wait_gone SECONDS [NAME-TO-SKIP]
	local deadline=$((SECONDS + $1))
	while any_alive "${2:-}"; do
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.1
	done
}

if [ ${#pids[@]} -gt 0 ]; then
	# etcd last: kube-apiserver shuts down in about a second while etcd is
	# there, and hangs without it.
	signal_all TERM etcd
	wait_gone "$GRACE_SECONDS" etcd || true
	signal_all TERM
	if ! wait_gone "$GRACE_SECONDS"; then
		for i in "${!pids[@]}"; do
			if alive "${pids[$i]}" "${starts[$i]}"; then
				echo "down.sh: ${names[$i]} (pid ${pids[$i]}) ignored TERM: killing it" >&2
			fi
		done
		signal_all KILL
		wait_gone 5 || {
			echo "down.sh: some processes did not exit: ${pids[*]}" >&2
			exit 1
		}
	fi
fi
mv -f "$PIDS" "$PIDS.stopped"
echo "==> stack in $S stopped"
