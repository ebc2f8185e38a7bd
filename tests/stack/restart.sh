#!/usr/bin/env bash
# Restarts one process of a stack started by tests/stack/up.sh STATE_DIR with
# its own command line: TERM, wait until it is gone (KILL after 10 s), start
# it again the way up.sh does, and record it in STATE_DIR/pids so down.sh
# stops it. Returns once the new process runs, not once it is ready: the tests
# that use it check how clients ride out the gap.
#
# Usage: tests/stack/restart.sh STATE_DIR NAME   (NAME as in STATE_DIR/pids, e.g. kube-apiserver)
set -euo pipefail

if [ $# -ne 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
	exit 2
fi
S="$(cd "$1" && pwd)"
NAME=$2
PIDS="$S/pids"

LOGS="$S/logs"
# shellcheck source=tests/stack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pid=$(awk -v n="$NAME" '$3 == n { p = $1 } END { print p }' "$PIDS" 2>/dev/null || true)
if [ -z "$pid" ] || ! proc_starttime "$pid" >/dev/null; then
	echo "restart.sh: no running $NAME recorded in $PIDS" >&2
	exit 1
fi
mapfile -d '' argv <"/proc/$pid/cmdline"

kill -TERM "$pid"
for _ in $(seq 200); do
	proc_starttime "$pid" >/dev/null || break
	sleep 0.05
done
if proc_starttime "$pid" >/dev/null; then
	kill -KILL "$pid" 2>/dev/null || true
fi

start "$NAME" "${argv[@]}"
new=$LAST_PID
echo "restart.sh: $NAME restarted (pid $pid -> $new)"
