#!/usr/bin/env bash
# build.sh OUT_DIR [COMMAND...]: builds the Kubernetes v1.15.12 control plane
# with the Go installed and writes OUT_DIR/COMMAND for each COMMAND, one of
# kube-apiserver, kube-controller-manager, kube-scheduler, and the CSI
# external-attacher of 1.15's day, csi-attacher (default: all four).
#
# The module zip the Go proxy serves for k8s.io/kubernetes v1.15.12 lacks
# pkg/generated/openapi/zz_generated.openapi.go, which kube-apiserver needs. So,
# once (and again whenever a file of this directory changes), this script
#   1. copies the module from the module cache into a writable work directory,
#      $NODE_FENCER_KUBE115_SRC (default: ${NODE_FENCER_CACHE:-~/.cache/node-fencer}/src-kubernetes-v1.15.12),
#      as WORK/kubernetes, checking it is the published module (its h1: hash);
#   2. copies this helper module (go.mod, go.sum, tools.go, stubs/) into WORK:
#      its go.mod replaces k8s.io/kubernetes with ./kubernetes;
#   3. builds openapi-gen at the commit v1.15.12 pins and generates the file from
#      openapi-packages.txt, as `make gen_openapi` does, checking the API rule
#      report equals the release's api/api-rules/violation_exceptions.list.
# It then builds each command in WORK, with Go's default build cache, -mod=readonly
# (go.sum is complete: the build only downloads modules into the module cache),
# CGO_ENABLED=0 and the version stamps of a v1.15.12 release build. Builds of
# several COMMANDs, or concurrent runs, share WORK under a lock (flock).
set -euo pipefail

VERSION=v1.15.12
GIT_COMMIT=e2a822d9f3c2fdb5c9bfbe64313cf9f657f0a725 # what the release binaries report
MODULE_SUM="h1:qfh+43qBbugow5Km/j9RGoAhM/rKajFb/izO4f4qltc=" # go.sum line of k8s.io/kubernetes v1.15.12
ALL_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler csi-attacher)
# v2.0.0: the newest release the Go module proxy serves that reads CSINodes at
# storage.k8s.io/v1beta1 (v2.1 and v2.2 are refused; v3 reads them at v1).
ATTACHER_VERSION=v2.0.0

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
log() { printf 'kubernetes-1.15/build.sh: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

[ $# -ge 1 ] && [ -n "$1" ] || die "usage: build.sh OUT_DIR [kube-apiserver|kube-controller-manager|kube-scheduler|csi-attacher...]"
OUT_DIR=$1
shift
COMMANDS=("$@")
[ ${#COMMANDS[@]} -gt 0 ] || COMMANDS=("${ALL_COMMANDS[@]}")
for cmd in "${COMMANDS[@]}"; do
	case " ${ALL_COMMANDS[*]} " in
	*" $cmd "*) ;;
	*) die "unknown command $cmd (one of: ${ALL_COMMANDS[*]})" ;;
	esac
done
command -v go >/dev/null 2>&1 || die "go is required"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"

CACHE="${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}"
WORK="${NODE_FENCER_KUBE115_SRC:-$CACHE/src-kubernetes-$VERSION}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

export GOFLAGS="-trimpath -buildvcs=false -gcflags=all=-dwarf=false -mod=readonly"
export CGO_ENABLED=0
export GOWORK=off

# Version stamps (hack/lib/version.sh). In 1.15 /version and --version read
# k8s.io/kubernetes/pkg/version; k8s.io/client-go/pkg/version is the clients'.
LDFLAGS="-s -w"
for pkg in k8s.io/kubernetes/pkg/version k8s.io/client-go/pkg/version; do
	LDFLAGS+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=15"
	LDFLAGS+=" -X $pkg.gitCommit=$GIT_COMMIT -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# The work directory is (re)made when its stamp differs from the files here.
HELPER_FILES=(go.mod go.sum tools.go openapi-packages.txt stubs/vbom.ml/util/go.mod build.sh)
STAMP="$(cd "$HERE" && cat "${HELPER_FILES[@]}" | sha256sum | cut -c1-32)"

prepare() {
	local t0=$SECONDS dir sum report
	log "preparing the $VERSION source in $WORK (once)"
	rm -rf "${WORK:?}/kubernetes" "${WORK:?}/stubs" "${WORK:?}/bin" "${WORK:?}/openapi-out" \
		"${WORK:?}/go.mod" "${WORK:?}/go.sum" "${WORK:?}/tools.go" "${WORK:?}/.stamp"
	# 1. The module, from the module cache (downloaded if need be).
	local json
	json="$(cd "$WORK" && GOFLAGS='' go mod download -json "k8s.io/kubernetes@$VERSION")" ||
		die "go mod download k8s.io/kubernetes@$VERSION failed: $json"
	dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	sum="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')"
	[ -d "$dir" ] || die "go mod download k8s.io/kubernetes@$VERSION gave no module directory: $json"
	[ "$sum" = "$MODULE_SUM" ] || die "k8s.io/kubernetes@$VERSION has hash $sum, expected $MODULE_SUM"
	cp -R "$dir" "$WORK/kubernetes"
	chmod -R u+w "$WORK/kubernetes"
	# 2. The helper module.
	cp "$HERE/go.mod" "$HERE/go.sum" "$HERE/tools.go" "$WORK/"
	cp -R "$HERE/stubs" "$WORK/stubs"
	# 3. zz_generated.openapi.go. openapi-gen (gengo) runs in module mode: go/build
	# finds each package with `go list` in WORK's module.
	(cd "$WORK" && go build -o bin/openapi-gen k8s.io/kube-openapi/cmd/openapi-gen)
	mkdir -p "$WORK/openapi-out"
	report="$WORK/openapi-out/violations.report"
	if ! (cd "$WORK" && bin/openapi-gen --logtostderr \
		--input-dirs "$(grep -v '^#' "$HERE/openapi-packages.txt" | grep . | paste -sd, -)" \
		--output-package k8s.io/kubernetes/pkg/generated/openapi \
		--output-file-base zz_generated.openapi \
		--go-header-file kubernetes/hack/boilerplate/boilerplate.generatego.txt \
		--report-filename "$report" \
		--output-base "$WORK/openapi-out") >"$WORK/openapi-out/openapi-gen.log" 2>&1; then
		tail -n 30 "$WORK/openapi-out/openapi-gen.log" >&2
		die "openapi-gen failed (log: $WORK/openapi-out/openapi-gen.log)"
	fi
	diff "$WORK/kubernetes/api/api-rules/violation_exceptions.list" "$report" >&2 ||
		die "openapi-gen's API rule report differs from the release's (openapi-packages.txt incomplete?)"
	cp "$WORK/openapi-out/k8s.io/kubernetes/pkg/generated/openapi/zz_generated.openapi.go" \
		"$WORK/kubernetes/pkg/generated/openapi/"
	printf '%s\n' "$STAMP" >"$WORK/.stamp"
	log "    source ready in $(elapsed $((SECONDS - t0)))"
}

exec 9>"$WORK/.lock"
flock -x 9
[ "$(cat "$WORK/.stamp" 2>/dev/null)" = "$STAMP" ] || prepare
# Builds only read WORK: let concurrent runs build together.
flock -s 9

for cmd in "${COMMANDS[@]}"; do
	t0=$SECONDS
	tmp="$OUT_DIR/.$cmd.tmp.$$"
	trap 'rm -f "$tmp"' EXIT
	case $cmd in
	csi-attacher)
		log "building $cmd $ATTACHER_VERSION"
		(cd "$WORK" && go build -ldflags "-s -w -X main.version=$ATTACHER_VERSION" -o "$tmp" \
			github.com/kubernetes-csi/external-attacher/cmd/csi-attacher)
		;;
	*)
		log "building $cmd $VERSION"
		(cd "$WORK" && go build -ldflags "$LDFLAGS" -o "$tmp" "k8s.io/kubernetes/cmd/$cmd")
		;;
	esac
	mv -f "$tmp" "$OUT_DIR/$cmd"
	trap - EXIT
	log "    $cmd built in $(elapsed $((SECONDS - t0))): $OUT_DIR/$cmd"
done
