# Shell functions shared by up.sh, down.sh and restart.sh; sourced, not run.
# start uses $S (the state directory), $LOGS and $PIDS of the caller.

# proc_starttime PID: field 22 of /proc/PID/stat (after the ")" of the
# command) of a live, non-zombie process.
proc_starttime() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	stat=${stat##*) }
	# shellcheck disable=SC2086
	set -- $stat
	[ "$1" != Z ] || return 1
	printf '%s' "${20}"
}

# start NAME CMD...: runs CMD detached with setsid (own process group), logging to
# logs/NAME.log (appended), records "PID STARTTIME NAME" in pids and sets LAST_PID.
start() {
	local name=$1 pid st
	shift
	# shellcheck disable=SC2016 # expanded by the inner shell
	setsid nohup bash -c 'echo $$ >"$0"; exec "$@"' "$S/.pid.$name" "$@" \
		>>"$LOGS/$name.log" 2>&1 </dev/null &
	for _ in $(seq 100); do
		[ -s "$S/.pid.$name" ] && break
		sleep 0.02
	done
	pid=$(cat "$S/.pid.$name")
	rm -f "$S/.pid.$name"
	st=$(proc_starttime "$pid") || st=0
	echo "$pid $st $name" >>"$PIDS"
	LAST_PID=$pid
}
