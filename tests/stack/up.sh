#!/usr/bin/env bash
# Starts a local test stack on 127.0.0.1 with ports picked at run time, so
# several stacks can run side by side:
#   etcd, kube-apiserver (static token auth, Node,RBAC authorization) and a moto
#   server (EC2 API); with --controllers also kube-controller-manager,
#   kube-scheduler and kwok (simulated nodes and pods).
# Every process runs in the background in its own process group (setsid);
# pids are recorded in STATE_DIR/pids, logs go to STATE_DIR/logs/<name>.log.
# Stop with tests/stack/down.sh STATE_DIR.
#
# Usage: tests/stack/up.sh STATE_DIR [--controllers] [--old-control-plane | --oldest-control-plane]
#                          [--watch-pid PID]
#   --controllers    also start kube-controller-manager, kube-scheduler and kwok
#   --old-control-plane
#                    run the old control plane setup.sh builds for the legacy
#                    mode's scenarios (NODE_FENCER_KUBE_LEGACY_BIN) instead of
#                    NODE_FENCER_KUBE_BIN's; etcd, kwok and moto are the same
#   --oldest-control-plane
#                    run the oldest Kubernetes node-fencer supports, 1.15
#                    (NODE_FENCER_KUBE_OLDEST_BIN, built from
#                    tests/stack/gomod/kubernetes-1.15), with what it needs
#                    beyond the others' flags: no insecure ports, /healthz for
#                    readiness (1.15 has no /readyz)
#   --watch-pid PID  start a detached watchdog that runs down.sh STATE_DIR as
#                    soon as process PID is gone (a test that dies leaks nothing)
#
# Writes:
#   STATE_DIR/kubeconfig              admin (user admin, group system:masters)
#   STATE_DIR/kubeconfig-node-fencer  user node-fencer, group node-fencer: no
#                                     rights until a test grants RBAC
#   STATE_DIR/env                     `export` lines (see tests/stack/README.md)
#
# Tunables (environment):
#   NODE_FENCER_NODE_MONITOR_GRACE_PERIOD  kube-controller-manager's
#       --node-monitor-grace-period (default 10s): how long after the last
#       heartbeat a Node turns Ready=Unknown
#   NODE_FENCER_KWOK_LEASE_SECONDS  kwok's --node-lease-duration-seconds
#       (default 8; kwok renews every quarter of it, here every 2s)
#   NODE_FENCER_STACK_TIMEOUT  seconds to wait for each component (default 90)
#
# kwok and heartbeats: kwok manages only Nodes annotated
# kwok.x-k8s.io/node=fake. For each one it holds the Node's Lease in
# kube-node-lease (holderIdentity = kwok's id) and renews it; the node
# lifecycle controller takes a renewed lease as the kubelet's heartbeat. Stages
# (tests/stack/kwok-stages.yaml) make such a Node Ready and its Pods Running.
# To stop ONE node's heartbeats (the node "dies"), take its Lease away from
# kwok:
#   kubectl -n kube-node-lease patch lease NODE --type=merge \
#     -p '{"spec":{"holderIdentity":"stopped-by-test","leaseDurationSeconds":86400}}'
# kwok then sees the lease held by someone else: it stops renewing it and treats
# the Node and its Pods as read-only (no stage brings the Node back to Ready,
# Pods being deleted stay Terminating, as with a dead kubelet). After the grace
# period the controller manager sets Ready=Unknown and adds the
# node.kubernetes.io/unreachable taints. To revive it, give the lease back:
#   kubectl -n kube-node-lease patch lease NODE --type=merge \
#     -p '{"spec":{"holderIdentity":null}}'
# Removing the kwok.x-k8s.io/node annotation does NOT stop the heartbeats in kwok
# v0.8.0: its informer filters the update out instead of releasing the lease.
set -euo pipefail

usage() {
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}
die() {
	printf 'up.sh: error: %s\n' "$*" >&2
	exit 1
}
log() { printf '==> %s\n' "$*"; }

STATE_DIR=""
CONTROLLERS=0
OLD=0
OLDEST=0
WATCH_PID=""
while [ $# -gt 0 ]; do
	case "$1" in
	--controllers) CONTROLLERS=1 ;;
	--old-control-plane) OLD=1 ;;
	--oldest-control-plane) OLDEST=1 ;;
	--watch-pid)
		[ $# -ge 2 ] || die "--watch-pid needs a PID"
		WATCH_PID=$2
		shift
		;;
	--watch-pid=*) WATCH_PID=${1#--watch-pid=} ;;
	-h | --help)
		usage
		exit 0
		;;
	-*) die "unknown option: $1 (see --help)" ;;
	*)
		[ -z "$STATE_DIR" ] || die "only one STATE_DIR, got '$STATE_DIR' and '$1'"
		STATE_DIR=$1
		;;
	esac
	shift
done
[ -n "$STATE_DIR" ] || {
	usage >&2
	exit 2
}
if [ -n "$WATCH_PID" ]; then
	[[ "$WATCH_PID" =~ ^[0-9]+$ ]] || die "--watch-pid: not a pid: $WATCH_PID"
	[ -d "/proc/$WATCH_PID" ] || die "--watch-pid: no process $WATCH_PID"
fi

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=tests/stack/lib.sh
source "$HERE/lib.sh"
T_START=$(date +%s%N)

# --- binaries ------------------------------------------------------------------

CACHE="${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}"
if [ -z "${NODE_FENCER_KUBE_BIN:-}" ] && [ -f "$CACHE/env.sh" ]; then
	# shellcheck source=/dev/null
	. "$CACHE/env.sh"
fi
need_bin() { # need_bin WHAT PATH
	if [ -z "$2" ] || [ ! -x "$2" ]; then
		die "$1 not found${2:+ at $2}: run tests/stack/setup.sh first"
	fi
}
ETCD="${NODE_FENCER_ETCD:-}"
KUBE_BIN="${NODE_FENCER_KUBE_BIN:-}"
[ "$OLD" = 0 ] || [ "$OLDEST" = 0 ] || die "--old-control-plane and --oldest-control-plane exclude each other"
if [ "$OLD" = 1 ]; then
	KUBE_BIN="${NODE_FENCER_KUBE_LEGACY_BIN:-}"
	[ -n "$KUBE_BIN" ] || die "--old-control-plane: NODE_FENCER_KUBE_LEGACY_BIN is not set: run tests/stack/setup.sh first"
fi
# 1.15 also serves plain HTTP (apiserver 8080, controller-manager 10252,
# scheduler 10251) unless told not to, and answers readiness on /healthz.
API_EXTRA=()
CONTROLLER_EXTRA=()
READY_PATH=readyz
if [ "$OLDEST" = 1 ]; then
	KUBE_BIN="${NODE_FENCER_KUBE_OLDEST_BIN:-}"
	[ -n "$KUBE_BIN" ] || die "--oldest-control-plane: NODE_FENCER_KUBE_OLDEST_BIN is not set: run tests/stack/setup.sh first"
	API_EXTRA=(--insecure-port=0)
	CONTROLLER_EXTRA=(--port=0)
	READY_PATH=healthz
fi
MOTO="${NODE_FENCER_VENV:+$NODE_FENCER_VENV/bin/moto_server}"
KWOK="${NODE_FENCER_KWOK:-}"
need_bin etcd "$ETCD"
need_bin kube-apiserver "${KUBE_BIN:+$KUBE_BIN/kube-apiserver}"
need_bin moto_server "$MOTO"
if [ "$CONTROLLERS" = 1 ]; then
	need_bin kube-controller-manager "${KUBE_BIN:+$KUBE_BIN/kube-controller-manager}"
	need_bin kube-scheduler "${KUBE_BIN:+$KUBE_BIN/kube-scheduler}"
	need_bin kwok "$KWOK"
fi
for tool in openssl curl python3 setsid nohup; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is required: run tests/stack/setup.sh first"
done

GRACE="${NODE_FENCER_NODE_MONITOR_GRACE_PERIOD:-10s}"
LEASE_SECONDS="${NODE_FENCER_KWOK_LEASE_SECONDS:-8}"
TIMEOUT="${NODE_FENCER_STACK_TIMEOUT:-90}"

# --- state dir -----------------------------------------------------------------

mkdir -p "$STATE_DIR"
S="$(cd "$STATE_DIR" && pwd)"
PIDS="$S/pids"
LOGS="$S/logs"

# alive PID [STARTTIME]: the process exists, is no zombie and (if given) has
# that start time (guards against a recycled pid).
alive() {
	local st
	st=$(proc_starttime "$1") || return 1
	[ -z "${2:-}" ] || [ "$st" = "$2" ]
}

if [ -f "$PIDS" ]; then
	while read -r pid st name; do
		if [ -n "${pid:-}" ] && alive "$pid" "$st"; then
			die "a stack is already running in $S ($name, pid $pid): tests/stack/down.sh $S"
		fi
	done <"$PIDS"
fi
rm -rf "$S/etcd" "$S/pki" "$S/kwok-home" "$LOGS" "$PIDS" "$S/env" \
	"$S"/kubeconfig "$S"/kubeconfig-*
mkdir -p "$LOGS" "$S/pki"
: >"$PIDS"

SUCCESS=0
on_exit() {
	if [ "$SUCCESS" != 1 ]; then
		echo "up.sh: failed; stopping what was started (logs kept in $LOGS)" >&2
		"$HERE/down.sh" "$S" >/dev/null 2>&1 || true
	fi
}
trap on_exit EXIT


# wait_for NAME PID CMD...: polls CMD until it succeeds; fails with the log's
# tail if process PID exits or TIMEOUT seconds pass.
wait_for() {
	local name=$1 pid=$2 t0=$SECONDS logname=${WAIT_LOG:-$1}
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ! alive "$pid"; then
			echo "---- last lines of $LOGS/$logname.log ----" >&2
			tail -n 30 "$LOGS/$logname.log" >&2 || true
			die "$logname exited during startup; see $LOGS/$logname.log"
		fi
		if [ $((SECONDS - t0)) -ge "$TIMEOUT" ]; then
			echo "---- last lines of $LOGS/$logname.log ----" >&2
			tail -n 30 "$LOGS/$logname.log" >&2 || true
			die "$name not ready after ${TIMEOUT}s; see $LOGS/$logname.log"
		fi
		sleep 0.2
	done
	log "$name ready ($((SECONDS - t0))s)"
}

# --- watchdog --------------------------------------------------------------------

if [ -n "$WATCH_PID" ]; then
	WATCH_ST=$(proc_starttime "$WATCH_PID") || die "--watch-pid: no process $WATCH_PID"
	# The watchdog execs down.sh, which recognises itself in pids and skips it.
	# shellcheck disable=SC2016 # expanded by the inner shell
	start watchdog bash -c '
		state=$0 pid=$1 want=$2 down=$3
		while stat=$(cat "/proc/$pid/stat" 2>/dev/null); do
			stat=${stat##*) }
			# shellcheck disable=SC2086
			set -- $stat
			[ "$1" != Z ] && [ "${20}" = "$want" ] || break
			sleep 1
		done
		echo "watched process $pid is gone: stopping the stack"
		exec "$down" "$state"
	' "$S" "$WATCH_PID" "$WATCH_ST" "$HERE/down.sh"
	log "watchdog: runs down.sh when pid $WATCH_PID exits"
fi

# --- ports, certificates, tokens ------------------------------------------------

# Free ports, all bound at once so they are distinct.
read -r P_ETCD P_PEER P_API P_MOTO P_KCM P_SCHED P_KWOK < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(7)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
')

PKI="$S/pki"
cat >"$PKI/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
CN = node-fencer-test
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.0.0.1
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
(
	cd "$PKI"
	exec 2>"$PKI/openssl.log"
	openssl ecparam -name prime256v1 -genkey -noout -out ca.key
	openssl req -x509 -new -config openssl.cnf -extensions v3_ca -key ca.key \
		-subj "/CN=node-fencer-test-ca" -days 3650 -out ca.crt
	openssl ecparam -name prime256v1 -genkey -noout -out apiserver.key
	openssl req -new -config openssl.cnf -key apiserver.key -subj "/CN=kube-apiserver" -out apiserver.csr
	openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 8)" \
		-days 3650 -extfile openssl.cnf -extensions v3_server -out apiserver.crt
	openssl genrsa -out sa.key 2048
	openssl rsa -in sa.key -pubout -out sa.pub
) || die "openssl failed; see $PKI/openssl.log"
chmod 600 "$PKI"/*.key

token() { openssl rand -hex 24; }
ADMIN_TOKEN=$(token)
RESTRICTED_TOKEN=$(token)
KCM_TOKEN=$(token)
SCHED_TOKEN=$(token)
KWOK_TOKEN=$(token)
# token,user,uid,"groups". The controller manager runs every controller with
# its own identity (--use-service-account-credentials=false), which then needs
# the rights of all of them: system:masters.
cat >"$PKI/tokens.csv" <<EOF
$ADMIN_TOKEN,admin,admin,"system:masters"
$RESTRICTED_TOKEN,node-fencer,node-fencer,"node-fencer"
$KCM_TOKEN,system:kube-controller-manager,system:kube-controller-manager,"system:masters"
$SCHED_TOKEN,system:kube-scheduler,system:kube-scheduler
$KWOK_TOKEN,kwok-controller,kwok-controller,"system:masters"
EOF
chmod 600 "$PKI/tokens.csv"

APISERVER="https://127.0.0.1:$P_API"
CA_DATA=$(base64 -w0 <"$PKI/ca.crt")
kubeconfig() { # kubeconfig FILE USER TOKEN
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: node-fencer-test
  cluster:
    server: $APISERVER
    certificate-authority-data: $CA_DATA
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@node-fencer-test
  context:
    cluster: node-fencer-test
    user: $2
current-context: $2@node-fencer-test
EOF
	chmod 600 "$1"
}
kubeconfig "$S/kubeconfig" admin "$ADMIN_TOKEN"
kubeconfig "$S/kubeconfig-node-fencer" node-fencer "$RESTRICTED_TOKEN"
kubeconfig "$S/kubeconfig-controller-manager" system:kube-controller-manager "$KCM_TOKEN"
kubeconfig "$S/kubeconfig-scheduler" system:kube-scheduler "$SCHED_TOKEN"
kubeconfig "$S/kubeconfig-kwok" kwok-controller "$KWOK_TOKEN"

# --- etcd, kube-apiserver, moto ----------------------------------------------------

ETCD_ARGS=(
	--name=default
	--data-dir="$S/etcd"
	--listen-client-urls="http://127.0.0.1:$P_ETCD"
	--advertise-client-urls="http://127.0.0.1:$P_ETCD"
	--listen-peer-urls="http://127.0.0.1:$P_PEER"
	--initial-advertise-peer-urls="http://127.0.0.1:$P_PEER"
	--initial-cluster="default=http://127.0.0.1:$P_PEER"
	--initial-cluster-state=new
	--log-level=warn
)
if "$ETCD" --help 2>&1 | grep -q -- '--unsafe-no-fsync'; then
	ETCD_ARGS+=(--unsafe-no-fsync)
fi
start etcd "$ETCD" "${ETCD_ARGS[@]}"
PID_ETCD=$LAST_PID
# moto starts in parallel with etcd and the apiserver.
start moto "$MOTO" -H 127.0.0.1 -p "$P_MOTO"
PID_MOTO=$LAST_PID
wait_for etcd "$PID_ETCD" curl -fsS "http://127.0.0.1:$P_ETCD/health"

start kube-apiserver "$KUBE_BIN/kube-apiserver" \
	--etcd-servers="http://127.0.0.1:$P_ETCD" \
	--bind-address=127.0.0.1 \
	--advertise-address=127.0.0.1 \
	--secure-port="$P_API" \
	--cert-dir="$PKI/apiserver-serving" \
	--tls-cert-file="$PKI/apiserver.crt" \
	--tls-private-key-file="$PKI/apiserver.key" \
	--token-auth-file="$PKI/tokens.csv" \
	--authorization-mode=Node,RBAC \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$PKI/sa.pub" \
	--service-account-signing-key-file="$PKI/sa.key" \
	--service-cluster-ip-range=10.0.0.0/24 \
	--allow-privileged=true \
	--endpoint-reconciler-type=none \
	--profiling=false \
	"${API_EXTRA[@]}"
PID_APISERVER=$LAST_PID

api_ready() {
	[ "$(curl -fsS --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "$APISERVER/$READY_PATH")" = ok ]
}
wait_for kube-apiserver "$PID_APISERVER" api_ready
wait_for moto "$PID_MOTO" curl -fsS "http://127.0.0.1:$P_MOTO/moto-api/data.json"

# --- controllers --------------------------------------------------------------------

if [ "$CONTROLLERS" = 1 ]; then
	start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
		--kubeconfig="$S/kubeconfig-controller-manager" \
		--bind-address=127.0.0.1 \
		--secure-port="$P_KCM" \
		--cert-dir="$PKI/controller-manager-serving" \
		--leader-elect=false \
		--controllers='*' \
		--use-service-account-credentials=false \
		--service-account-private-key-file="$PKI/sa.key" \
		--root-ca-file="$PKI/ca.crt" \
		--cluster-signing-cert-file="$PKI/ca.crt" \
		--cluster-signing-key-file="$PKI/ca.key" \
		--flex-volume-plugin-dir="$S/flexvolume" \
		--node-monitor-period=2s \
		--node-monitor-grace-period="$GRACE" \
		"${CONTROLLER_EXTRA[@]}"
	PID_KCM=$LAST_PID
	start kube-scheduler "$KUBE_BIN/kube-scheduler" \
		--kubeconfig="$S/kubeconfig-scheduler" \
		--bind-address=127.0.0.1 \
		--secure-port="$P_SCHED" \
		--cert-dir="$PKI/scheduler-serving" \
		--leader-elect=false \
		"${CONTROLLER_EXTRA[@]}"
	PID_SCHED=$LAST_PID
	# HOME points into STATE_DIR so that no ~/.kwok/kwok.yaml is loaded.
	start kwok env HOME="$S/kwok-home" "$KWOK" \
		--kubeconfig="$S/kubeconfig-kwok" \
		--config="$HERE/kwok-stages.yaml" \
		--manage-all-nodes=false \
		--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
		--node-lease-duration-seconds="$LEASE_SECONDS" \
		--cidr=10.244.0.0/16 \
		--node-ip=10.1.0.1 \
		--server-address="127.0.0.1:$P_KWOK"
	PID_KWOK=$LAST_PID

	wait_for kube-controller-manager "$PID_KCM" \
		curl -fsSk "https://127.0.0.1:$P_KCM/healthz"
	wait_for kube-scheduler "$PID_SCHED" curl -fsSk "https://127.0.0.1:$P_SCHED/healthz"
	wait_for kwok "$PID_KWOK" curl -fsS "http://127.0.0.1:$P_KWOK/healthz"
	# Pods can be created once the service account controller made "default".
	sa_ready() {
		curl -fsS --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" \
			"$APISERVER/api/v1/namespaces/default/serviceaccounts/default"
	}
	WAIT_LOG=kube-controller-manager wait_for "default service account" "$PID_KCM" sa_ready
fi

# --- env ----------------------------------------------------------------------------

envline() { printf 'export %s=%q\n' "$1" "$2"; }
{
	envline NODE_FENCER_STACK_DIR "$S"
	envline KUBECONFIG "$S/kubeconfig"
	envline NODE_FENCER_KUBECONFIG_RESTRICTED "$S/kubeconfig-node-fencer"
	envline NODE_FENCER_APISERVER "$APISERVER"
	envline NODE_FENCER_ADMIN_TOKEN "$ADMIN_TOKEN"
	envline NODE_FENCER_RESTRICTED_TOKEN "$RESTRICTED_TOKEN"
	envline NODE_FENCER_CA_FILE "$PKI/ca.crt"
	envline NODE_FENCER_STACK_CONTROLLERS "$CONTROLLERS"
	envline NODE_FENCER_STACK_OLD_CONTROL_PLANE "$OLD"
	envline NODE_FENCER_STACK_OLDEST_CONTROL_PLANE "$OLDEST"
	envline NODE_FENCER_NODE_MONITOR_GRACE_PERIOD "$GRACE"
	envline AWS_ENDPOINT_URL "http://127.0.0.1:$P_MOTO"
	envline AWS_REGION us-east-1
	envline AWS_DEFAULT_REGION us-east-1
	envline AWS_ACCESS_KEY_ID testing
	envline AWS_SECRET_ACCESS_KEY testing
	envline AWS_EC2_METADATA_DISABLED true
} >"$S/env.tmp"
mv -f "$S/env.tmp" "$S/env"

SUCCESS=1
T_END=$(date +%s%N)
ms=$(((T_END - T_START) / 1000000))
echo
log "stack up in $((ms / 1000)).$(printf '%03d' $((ms % 1000)))s$([ "$CONTROLLERS" = 1 ] && echo " (with controllers and kwok)")"
echo "    apiserver:  $APISERVER"
echo "    kubeconfig: $S/kubeconfig (admin), $S/kubeconfig-node-fencer (restricted)"
echo "    env:        source $S/env"
echo "    EC2 (moto): http://127.0.0.1:$P_MOTO"
echo "    logs:       $LOGS/<name>.log"
echo "    stop:       $HERE/down.sh $S"
