#!/usr/bin/env bash
# Installs everything the integration and end-to-end tests need into a cache
# outside the repository, keyed by version: a version bump rebuilds, a rerun is
# a no-op that takes well under two seconds.
#
#   CACHE=${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}
#   $CACHE/venv-stack-<sha>/        moto[server], cargo-lambda, ziglang (tests/stack/requirements.txt)
#   $CACHE/venv-infra-<sha>/        tests/infra/requirements.txt, when that file exists
#   $CACHE/venv-gce-<sha>/          tests/gce/requirements.txt (the GCE checks: fake Compute Engine, fixtures, image)
#   $CACHE/venv-redfish-<sha>/      tests/redfish/requirements.txt (sushy-tools' Redfish emulator, the BMC of
#                                   the on-premises tests and of `make run ARGS="--cloud redfish"`; DMTF's
#                                   Redfish Service Validator)
#   $CACHE/bin/kubernetes-<ver>/    kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#   $CACHE/bin/kubernetes-<old>/    an old control plane (kube-apiserver, kube-controller-manager,
#                                   kube-scheduler; tests/stack/gomod/kubernetes-legacy) for the
#                                   legacy mode's scenarios; tests only
#   $CACHE/bin/kubernetes-<oldest>-<sha>/  the oldest control plane node-fencer supports (1.15:
#                                   kube-apiserver, kube-controller-manager, kube-scheduler;
#                                   tests/stack/gomod/kubernetes-1.15/build.sh, keyed by its files;
#                                   its source prepared in $CACHE/src-kubernetes-<oldest>); tests only
#   $CACHE/bin/hollow-kubelet-<ver>-<sha>/hollow-kubelet   the real kubelet over a fake runtime (pkg/kubemark),
#                                   tests/stack/gomod/kubernetes/hollow-kubelet, and the old control plane's
#                                   (<old>, gomod/kubernetes-legacy/hollow-kubelet); tests only
#   $CACHE/bin/etcd-<ver>/etcd
#   $CACHE/bin/kwok-<ver>/kwok
#   $CACHE/bin/external-attacher-<ver>/csi-attacher   the real CSI external-attacher sidecar
#   $CACHE/bin/pd-csi-driver-<ver>/gce-pd-csi-driver   the real PD CSI driver (its controller runs here)
#   $CACHE/bin/csi-controller-<sha>/csi-controller     tests/csi: our EBS (moto) and cStor-like controllers
#   $CACHE/bin/hclfmt-<ver>/hclfmt
#   $CACHE/bin/alertmanager-<ver>/      alertmanager, amtool
#   $CACHE/bin/prometheus-<ver>-nosd/promtool   (without the service discovery plugins)
#   $CACHE/bin/cargo-fuzz-<ver>/cargo-fuzz   (crates.io; for handler/fuzz)
#   $CACHE/bin/aws-lambda-rie-<ver>/aws-lambda-rie   AWS's Lambda Runtime Interface Emulator; tests only
#   $CACHE/bin/opentofu-<ver>/tofu  (Go module proxy; tests/infra's validate, plan and test)
#   $CACHE/bin/tflint-<ver>/tflint
#   $CACHE/bin/schema-provider-<sha>/   the schema-only provider, built from tests/infra/schema-provider
#   $CACHE/npm/                     the CDK for Terraform binding packages the schemas come from
#                                   (npm, or the npm package inside a PyPI wheel)
#   $CACHE/terraform-mirror-<sha>/  a filesystem mirror: that provider as hashicorp/aws, kubernetes,
#                                   random and google, newest and oldest release, each with the
#                                   schema of the types infra/ uses
#   $CACHE/env.sh                   `source` it: NODE_FENCER_* variables, venv bin on PATH
#
# Usage: tests/stack/setup.sh [--for-run [--cloud=aws|gce|redfish]] [--skip-checks] [--only-checks]
#                             [--skip-old-planes | --only-old-planes]
#                             [--only-python] [--skip-controllers] [--only-terraform]
#   --for-run           only what `make run` runs: the stack and Redfish venvs, etcd, the Kubernetes
#                       binaries, kwok and the CSI attach chain (no test-only tools: the infra and GCE venvs,
#                       hclfmt, cargo-fuzz, Alertmanager, promtool, OpenTofu, tflint, the old control plane,
#                       the hollow kubelet)
#   --cloud=CLOUD       with --for-run, only what that scene of `make run` runs: the PD CSI driver for
#                       gce alone, the Redfish venv for redfish alone (aws, the default scene, has neither)
#   --skip-checks       what the integration tests run (the stack, the old control plane, the hollow
#                       kubelets, Alertmanager), not the tools of the checks after them: the infra and GCE
#                       venvs, hclfmt, cargo-fuzz, amtool, promtool, OpenTofu, tflint, the provider mirror
#   --only-checks       only those tools of the checks (`make test` builds them beside the integration
#                       tests, at the lowest CPU priority)
#   --skip-old-planes   not the old control planes (v1.25.15 with its hollow kubelet, and 1.15), which
#                       only the legacy and 1.15 tests run
#   --only-old-planes   only those, and nothing else (`make test` builds them first beside the
#                       integration tests, at the lowest CPU priority; those tests wait for them)
#   --only-python       only the Python venvs (and env.sh)
#   --skip-controllers  skip kube-controller-manager, kube-scheduler, kwok and the CSI attach chain
#   --only-terraform    of the binaries, only tofu, tflint, the schema-only provider and its mirror
#
# Whatever the options, env.sh names every tool's cache path (built or not), so that
# a partial run leaves it as a full one wrote it.
set -euo pipefail

# The whole script is one function, read completely before it runs, so editing
# or updating this file during a long build does not disturb the running copy;
# the `exit` on its call's line keeps bash from reading the edited file on.
main() {
	usage() {
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
	}

	ONLY_PYTHON=0
	SKIP_CONTROLLERS=0
	ONLY_TERRAFORM=0
	FOR_RUN=0
	RUN_CLOUD=""
	SKIP_CHECKS=0
	ONLY_CHECKS=0
	OLD_PLANES=build # build, skip or only
	for arg in "$@"; do
		case "$arg" in
		--for-run) FOR_RUN=1 ;;
		--cloud=aws | --cloud=gce | --cloud=redfish) RUN_CLOUD=${arg#--cloud=} ;;
		--cloud=* | --cloud)
			echo "setup.sh: $arg: the scene is aws, gce or redfish, as --cloud=CLOUD" >&2
			exit 2
			;;
		--skip-checks) SKIP_CHECKS=1 ;;
		--only-checks) ONLY_CHECKS=1 ;;
		--skip-old-planes | --only-old-planes)
			if [ "$OLD_PLANES" != build ]; then
				echo "setup.sh: --skip-old-planes and --only-old-planes exclude each other" >&2
				exit 2
			fi
			OLD_PLANES=${arg%-old-planes}
			OLD_PLANES=${OLD_PLANES#--}
			;;
		--only-python) ONLY_PYTHON=1 ;;
		--skip-controllers) SKIP_CONTROLLERS=1 ;;
		--only-terraform) ONLY_TERRAFORM=1 ;;
		-h | --help)
			usage
			exit 0
			;;
		*)
			echo "setup.sh: unknown option: $arg" >&2
			usage >&2
			exit 2
			;;
		esac
	done
	if [ "$SKIP_CHECKS" = 1 ] && [ "$ONLY_CHECKS" = 1 ]; then
		echo "setup.sh: --skip-checks and --only-checks exclude each other" >&2
		exit 2
	fi
	if [ "$OLD_PLANES" = only ] &&
		[ "$FOR_RUN$SKIP_CHECKS$ONLY_CHECKS$ONLY_PYTHON$SKIP_CONTROLLERS$ONLY_TERRAFORM" != 000000 ]; then
		echo "setup.sh: --only-old-planes goes alone: it builds the old control planes and nothing else" >&2
		exit 2
	fi
	if [ -n "$RUN_CLOUD" ] && [ "$FOR_RUN" = 0 ]; then
		echo "setup.sh: --cloud=$RUN_CLOUD picks a scene of make run: it goes with --for-run" >&2
		exit 2
	fi

	HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
	REPO="$(cd "$HERE/../.." && pwd)"
	CACHE="${NODE_FENCER_CACHE:-$HOME/.cache/node-fencer}"

	# Versions. Kubernetes and etcd come from the helper modules' go.mod files, so
	# bumping them there (and running `go mod tidy`) is all a version bump takes.
	KWOK_VERSION=v0.8.0   # sigs.k8s.io/kwok
	HCLFMT_VERSION=v2.25.0 # github.com/hashicorp/hcl/v2
	CARGO_FUZZ_VERSION=0.13.2 # crates.io cargo-fuzz
	ALERTMANAGER_VERSION=v0.34.2 # github.com/prometheus/alertmanager (alertmanager, amtool)
	PROMETHEUS_VERSION=v0.316.0  # github.com/prometheus/prometheus (promtool): v0.3XX.Y is Prometheus 3.XX.Y
	OPENTOFU_VERSION=v1.10.10    # github.com/opentofu/opentofu (tofu)
	TFLINT_VERSION=v0.61.0       # github.com/terraform-linters/tflint (its terraform ruleset is bundled)
	# AWS's Lambda Runtime Interface Emulator: the Runtime API of Lambda's base
	# images. The module has no tagged releases on the proxy: its pseudo-version.
	RIE_VERSION=v0.0.0-20261030222936-bef5c4ba774d # github.com/aws/aws-lambda-runtime-interface-emulator
	# The CSI attach chain of the scenarios: the real external-attacher sidecar and
	# the real PD CSI driver (its controller service, against the fake Compute
	# Engine), built from their released modules as the project releases them.
	EXTERNAL_ATTACHER_VERSION=v4.13.0 # github.com/kubernetes-csi/external-attacher/v4 (csi-attacher)
	PD_CSI_VERSION=v1.28.1            # sigs.k8s.io/gcp-compute-persistent-disk-csi-driver (gce-pd-csi-driver)
	# The providers' schemas, from the CDK for Terraform bindings on npm: each
	# package is generated from one provider release (named in the comment).
	# The newest release of each, and the oldest one at the floor infra/ claims
	# (aws >= 6.29, kubernetes >= 2.23, random >= 3.5, google >= 6.1) that has
	# bindings the converter reads: none exist for aws 6.29, so 6.25 (v6 only
	# adds arguments); the converter needs bindings from cdktf 0.20 on, so
	# kubernetes 2.25.2 and random 3.6.0; google 6.1.0 is the first 6.x with
	# bindings. The newest google bindings are not on npm: their PyPI
	# distribution carries the same npm package as its jsii assembly
	# ("pypi:" entries, fetched with pip).
	CDK_PACKAGES=(
		"aws=@cdktn/provider-aws@25.7.0"                # hashicorp/aws 6.66.0
		"kubernetes=@cdktf/provider-kubernetes@12.1.1"  # hashicorp/kubernetes 2.38.0
		"random=@cdktn/provider-random@15.0.1"          # hashicorp/random 3.9.1
		"google=pypi:cdktn-provider-google==21.1.0"     # hashicorp/google 8.7.0
		"aws=@cdktf/provider-aws@21.22.1"               # hashicorp/aws 6.25.0
		"kubernetes=@cdktf/provider-kubernetes@11.0.0"  # hashicorp/kubernetes 2.25.2
		"random=@cdktf/provider-random@11.0.0"          # hashicorp/random 3.6.0
		"google=@cdktf/provider-google@14.0.0"          # hashicorp/google 6.1.0
	)

	log() { printf '==> %s\n' "$*"; }
	die() {
		printf 'setup.sh: error: %s\n' "$*" >&2
		exit 1
	}
	have() { command -v "$1" >/dev/null 2>&1; }
	elapsed() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

	# gomod_version GO_MOD MODULE: the version MODULE is required at in GO_MOD.
	gomod_version() {
		awk -v m="$2" '
			$1 == "require" && $2 == m { print $3; exit }
			$1 == m && $2 ~ /^v[0-9]/ { print $2; exit }
		' "$1"
	}

	KUBE_VERSION="$(gomod_version "$HERE/gomod/kubernetes/go.mod" k8s.io/kubernetes)"
	KUBE_LEGACY_VERSION="$(gomod_version "$HERE/gomod/kubernetes-legacy/go.mod" k8s.io/kubernetes)"
	KUBE_OLDEST_VERSION="$(gomod_version "$HERE/gomod/kubernetes-1.15/go.mod" k8s.io/kubernetes)"
	ETCD_VERSION="$(gomod_version "$HERE/gomod/etcd/go.mod" go.etcd.io/etcd/server/v3)"
	[ -n "$KUBE_VERSION" ] || die "no k8s.io/kubernetes version in tests/stack/gomod/kubernetes/go.mod"
	[ -n "$KUBE_LEGACY_VERSION" ] || die "no k8s.io/kubernetes version in tests/stack/gomod/kubernetes-legacy/go.mod"
	[ -n "$KUBE_OLDEST_VERSION" ] || die "no k8s.io/kubernetes version in tests/stack/gomod/kubernetes-1.15/go.mod"
	[ -n "$ETCD_VERSION" ] || die "no go.etcd.io/etcd/server/v3 version in tests/stack/gomod/etcd/go.mod"

	KUBE_BIN="$CACHE/bin/kubernetes-$KUBE_VERSION"
	KUBE_LEGACY_BIN="$CACHE/bin/kubernetes-$KUBE_LEGACY_VERSION"
	# Keyed by the helper's files, build.sh included: an edit rebuilds it.
	KUBE_OLDEST_SHA="$(cd "$HERE/gomod/kubernetes-1.15" && find . -type f ! -name README.md -print0 | sort -z |
		xargs -0 cat | sha256sum | cut -c1-16)"
	KUBE_OLDEST_BIN="$CACHE/bin/kubernetes-$KUBE_OLDEST_VERSION-$KUBE_OLDEST_SHA"
	# The external-attacher of 1.15's day, built there too (its version is build.sh's).
	ATTACHER_OLDEST_VERSION="$(sed -n 's/^ATTACHER_VERSION=//p' "$HERE/gomod/kubernetes-1.15/build.sh")"
	HOLLOW_KUBELET_SHA="$(cd "$HERE/gomod/kubernetes" && cat go.mod go.sum hollow-kubelet/*.go | sha256sum | cut -c1-16)"
	HOLLOW_KUBELET_BIN="$CACHE/bin/hollow-kubelet-$KUBE_VERSION-$HOLLOW_KUBELET_SHA/hollow-kubelet"
	HOLLOW_KUBELET_LEGACY_SHA="$(cd "$HERE/gomod/kubernetes-legacy" && cat go.mod go.sum hollow-kubelet/*.go | sha256sum | cut -c1-16)"
	HOLLOW_KUBELET_LEGACY_BIN="$CACHE/bin/hollow-kubelet-$KUBE_LEGACY_VERSION-$HOLLOW_KUBELET_LEGACY_SHA/hollow-kubelet"
	ETCD_BIN="$CACHE/bin/etcd-$ETCD_VERSION/etcd"
	KWOK_BIN="$CACHE/bin/kwok-$KWOK_VERSION/kwok"
	HCLFMT_BIN="$CACHE/bin/hclfmt-$HCLFMT_VERSION/hclfmt"
	CARGO_FUZZ_BIN="$CACHE/bin/cargo-fuzz-$CARGO_FUZZ_VERSION/cargo-fuzz"
	ALERTMANAGER_BIN="$CACHE/bin/alertmanager-$ALERTMANAGER_VERSION"
	PROMTOOL_BIN="$CACHE/bin/prometheus-$PROMETHEUS_VERSION-nosd/promtool"
	TOFU_BIN="$CACHE/bin/opentofu-$OPENTOFU_VERSION/tofu"
	TFLINT_BIN="$CACHE/bin/tflint-$TFLINT_VERSION/tflint"
	RIE_BIN="$CACHE/bin/aws-lambda-rie-$RIE_VERSION/aws-lambda-rie"
	CSI_ATTACHER_BIN="$CACHE/bin/external-attacher-$EXTERNAL_ATTACHER_VERSION/csi-attacher"
	PD_CSI_BIN="$CACHE/bin/pd-csi-driver-$PD_CSI_VERSION/gce-pd-csi-driver"
	CSI_CONTROLLER_SRC="$REPO/tests/csi"
	# Keyed by its source, so an edit rebuilds it.
	CSI_CONTROLLER_SHA="$(cd "$CSI_CONTROLLER_SRC" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)"
	CSI_CONTROLLER_BIN="$CACHE/bin/csi-controller-$CSI_CONTROLLER_SHA/csi-controller"
	SCHEMA_PROVIDER_SRC="$REPO/tests/infra/schema-provider"
	SCHEMA_CONVERTER="$REPO/tests/infra/cdk_schema.py"
	# Keyed by the provider's source, so an edit rebuilds it.
	SCHEMA_PROVIDER_SHA="$(cd "$SCHEMA_PROVIDER_SRC" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)"
	SCHEMA_PROVIDER_BIN="$CACHE/bin/schema-provider-$SCHEMA_PROVIDER_SHA/terraform-provider-schema-only"
	# The resource and data source types infra/ uses ("data.TYPE" for data
	# sources): the schemas hold these and nothing else.
	TF_TYPES="$(cat "$REPO"/infra/modules/*/*.tf "$REPO"/infra/examples/*/*.tf |
		sed -n 's/^\(resource\|data\) "\([a-z0-9_]*\)".*/\1 \2/p' | sort -u |
		awk '{ print ($1 == "data" ? "data." : "") $2 }')"
	TF_MIRROR_SHA="$( (printf '%s\n' "$SCHEMA_PROVIDER_SHA" "${CDK_PACKAGES[@]}" "$TF_TYPES"; cat "$SCHEMA_CONVERTER") |
		sha256sum | cut -c1-16)"
	TF_MIRROR="$CACHE/terraform-mirror-$TF_MIRROR_SHA"

	# --- prerequisites ---------------------------------------------------------

	if ! have openssl || ! have curl; then
		if [ "$(id -u)" = 0 ] && have apt-get; then
			log "installing openssl and curl with apt-get"
			apt-get update -qq
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl curl >/dev/null
		else
			die "openssl and curl are required (e.g. sudo apt-get install -y openssl curl)"
		fi
	fi
	# systemd-analyze checks infra/onprem's unit (tests/infra/test_onprem.py).
	if [ "$ONLY_PYTHON" = 0 ] && [ "$FOR_RUN" = 0 ] && [ "$SKIP_CHECKS" = 0 ] && ! have systemd-analyze; then
		if [ "$(id -u)" = 0 ] && have apt-get; then
			log "installing systemd-analyze (Debian's systemd package) with apt-get"
			apt-get update -qq
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null
		else
			die "systemd-analyze is required for the unit checks (e.g. sudo apt-get install -y systemd)"
		fi
	fi
	have python3 || die "python3 (>= 3.9, with the venv module) is required"
	have flock || die "flock (util-linux) is required"
	if [ "$ONLY_PYTHON" = 0 ] && [ "$FOR_RUN" = 0 ] && [ "$SKIP_CHECKS" = 0 ]; then
		have npm || die "npm is required to download the provider schema packages (${CDK_PACKAGES[*]#*=})"
	fi
	if [ "$ONLY_PYTHON" = 0 ]; then
		have go || die "go is required to build the control plane binaries (k8s.io/kubernetes $KUBE_VERSION needs the Go version named in tests/stack/gomod/kubernetes/go.mod); install Go, or use --only-python"
	fi

	mkdir -p "$CACHE/bin"
	exec 9>"$CACHE/.setup.lock"
	if ! flock -n 9; then
		log "waiting for another setup.sh run to finish"
		flock 9
	fi

	# Temporary build outputs (moved into place when complete) and a venv being
	# created: removed if the run fails or is interrupted.
	TMP_PATHS=()
	VENV_IN_PROGRESS=""
	cleanup() {
		local p
		# A background build still running when this run fails is stopped.
		for p in "${BG_PIDS[@]+"${BG_PIDS[@]}"}"; do
			kill "$p" 2>/dev/null || true
		done
		for p in "${TMP_PATHS[@]+"${TMP_PATHS[@]}"}" "$VENV_IN_PROGRESS"; do
			[ -z "$p" ] || rm -rf "$p"
		done
	}
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM

	# --- Python venvs --------------------------------------------------------------

	# venv_path NAME REQUIREMENTS: $CACHE/venv-NAME-<sha of REQUIREMENTS>.
	venv_path() {
		printf '%s/venv-%s-%s' "$CACHE" "$1" "$(sha256sum "$2" | cut -c1-16)"
	}
	venv_ready() { [ -f "$1/.complete" ] && [ -x "$1/bin/python" ]; }

	# ensure_venv NAME REQUIREMENTS: sets VENV_DIR to $CACHE/venv-NAME-<sha>.
	ensure_venv() {
		local name=$1 req=$2 t0
		VENV_DIR="$(venv_path "$name" "$req")"
		# A venv is not relocatable, so it is built in place; .complete marks it usable.
		if venv_ready "$VENV_DIR"; then
			return 0
		fi
		log "creating Python venv $name from ${req#"$REPO"/} (first time only, ~1-2 min)"
		t0=$SECONDS
		rm -rf "$VENV_DIR"
		VENV_IN_PROGRESS="$VENV_DIR"
		python3 -m venv "$VENV_DIR"
		"$VENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-input -q --upgrade pip
		"$VENV_DIR/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$req"
		touch "$VENV_DIR/.complete"
		VENV_IN_PROGRESS=""
		log "    venv $name ready in $(elapsed $((SECONDS - t0))): $VENV_DIR"
	}

	STACK_VENV="$(venv_path stack "$HERE/requirements.txt")"
	INFRA_VENV=""
	if [ -f "$REPO/tests/infra/requirements.txt" ]; then
		INFRA_VENV="$(venv_path infra "$REPO/tests/infra/requirements.txt")"
	fi
	GCE_VENV="$(venv_path gce "$REPO/tests/gce/requirements.txt")"
	REDFISH_VENV="$(venv_path redfish "$REPO/tests/redfish/requirements.txt")"

	# What a run builds. want_* say which groups this run's options ask for:
	# the stack (what `make run` and the integration tests run), the test-only
	# tools of the integration tests, and the tools of the checks after them.
	want_stack() { [ "$ONLY_CHECKS" = 0 ]; }
	want_test_tools() { [ "$FOR_RUN" = 0 ]; }
	want_checks() { want_test_tools && [ "$SKIP_CHECKS" = 0 ]; }
	want_kubernetes() { [ "$ONLY_PYTHON" = 0 ] && [ "$ONLY_TERRAFORM" = 0 ]; }
	want_controllers() { want_kubernetes && [ "$SKIP_CONTROLLERS" = 0 ]; }
	want_terraform() { [ "$ONLY_PYTHON" = 0 ] && want_checks; }
	# The tools of one cloud's scene: every scene's, unless `make run` names one.
	want_cloud() { [ -z "$RUN_CLOUD" ] || [ "$RUN_CLOUD" = "$1" ]; }

	# --- Go binaries -----------------------------------------------------------------

	# No DWARF: the binaries are linked without it (-ldflags -w) anyway, so the
	# compiler need not write it either. tflint from an empty build cache, two
	# builds each: 247 and 231 s of CPU with it, 218 and 234 s without, and a
	# fifth less written to the build cache (544 MB against 683 MB). Stack
	# traces keep their files and lines (those are pclntab, not DWARF).
	export GOFLAGS="-trimpath -buildvcs=false -gcflags=all=-dwarf=false"
	export CGO_ENABLED=0

	# install_bin NAME VERSION DEST ESTIMATE -- COMMAND...: unless DEST exists, runs
	# COMMAND with $OUT set to a temporary path it must write the binary to, then
	# moves that into place, so an interrupted build never leaves a broken cache.
	install_bin() {
		local name=$1 version=$2 dest=$3 estimate=$4 t0
		shift 5
		[ -x "$dest" ] && return 0
		log "building $name $version (first time only, $estimate)"
		t0=$SECONDS
		mkdir -p "$(dirname "$dest")"
		OUT="$(dirname "$dest")/.$name.tmp.$$"
		TMP_PATHS+=("$OUT")
		"$@"
		[ -x "$OUT" ] || die "building $name produced no binary"
		mv -f "$OUT" "$dest"
		log "    $name built in $(elapsed $((SECONDS - t0))): $dest"
	}

	# Version stamps the Kubernetes release build sets (hack/lib/version.sh).
	kube_ldflags() { # kube_ldflags VERSION
		local minor=${1#v1.} pkg flags=""
		minor=${minor%%.*}
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
			flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
		done
		printf '%s' "-s -w$flags"
	}

	build_kube() { # build_kube CMD
		(cd "$HERE/gomod/kubernetes" && go build -ldflags "$(kube_ldflags "$KUBE_VERSION")" -o "$OUT" "k8s.io/kubernetes/cmd/$1")
	}
	# Our hollow kubelet: a package of the same helper module, in Go's default
	# build cache, so it compiles only the kubelet's own packages.
	build_hollow_kubelet() {
		(cd "$HERE/gomod/kubernetes" && go build -ldflags "$(kube_ldflags "$KUBE_VERSION")" -o "$OUT" ./hollow-kubelet)
	}
	# The old control plane's, in its helper module (shared files linked).
	build_hollow_kubelet_legacy() {
		(cd "$HERE/gomod/kubernetes-legacy" &&
			go build -tags providerless -ldflags "$(kube_ldflags "$KUBE_LEGACY_VERSION")" -o "$OUT" ./hollow-kubelet)
	}
	# The old control plane, with the Go installed. `providerless` leaves the
	# in-tree cloud providers out (their SDKs are a third of the build); the
	# scenarios' volumes are all CSI.
	build_kube_legacy() { # build_kube_legacy CMD
		(cd "$HERE/gomod/kubernetes-legacy" &&
			go build -tags providerless -ldflags "$(kube_ldflags "$KUBE_LEGACY_VERSION")" \
				-o "$OUT" "k8s.io/kubernetes/cmd/$1")
	}
	# The oldest control plane: its module zip lacks a generated file, which
	# build.sh makes in a work copy of the module first (see its README).
	build_kube_oldest() { # build_kube_oldest CMD
		TMP_PATHS+=("$OUT.d")
		"$HERE/gomod/kubernetes-1.15/build.sh" "$OUT.d" "$1"
		mv -f "$OUT.d/$1" "$OUT"
		rm -rf "$OUT.d"
	}
	# A debug build: cargo-fuzz only drives cargo and libFuzzer, so its own speed
	# does not show, while its build does (29 s against 45 s for a release build,
	# crates downloaded).
	build_cargo_fuzz() {
		have cargo || die "cargo is required to install cargo-fuzz"
		local root="$OUT.root"
		TMP_PATHS+=("$root")
		CARGO_TARGET_DIR="$root/target" cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" \
			--locked --debug --quiet --root "$root"
		mv -f "$root/bin/cargo-fuzz" "$OUT"
		rm -rf "$root"
	}
	build_etcd() {
		(cd "$HERE/gomod/etcd" && go build -ldflags "-s -w" -o "$OUT" go.etcd.io/etcd/server/v3)
	}
	# go_install PACKAGE@VERSION BINARY [LDFLAGS]: `go install` outside any module.
	go_install() {
		local gobin="$OUT.d"
		TMP_PATHS+=("$gobin")
		(cd "$CACHE" && GOBIN="$gobin" go install -ldflags "-s -w ${3:-}" "$1")
		mv -f "$gobin/$2" "$OUT"
		rm -rf "$gobin"
	}

	# Alertmanager and Prometheus are built from a writable copy of their module (the
	# module cache's is read-only) with the module's own go.mod and go.sum, so the
	# dependencies are the ones the release pins; a go.work the module ships is
	# ignored, as it names directories the module zip leaves out. Alertmanager embeds
	# its web UI's built assets, which the module lacks: a placeholder page stands in.
	# Every build here uses Go's one default build cache (with -trimpath a package's
	# entry does not depend on the copy's path): a package two tools share at one
	# version compiles once, across set-up runs too. amtool, built after the tests
	# start, reuses Alertmanager's packages (118 s alone, 3 s after it).
	# module_copy MODULE@VERSION: sets SRC to this run's writable copy of the module.
	module_copy() {
		local dir
		SRC="$CACHE/.src-${1//[\/@]/_}.$$"
		[ -d "$SRC" ] && return 0
		dir="$(cd "$CACHE" && go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
		[ -d "$dir" ] || die "go mod download $1 gave no module directory"
		TMP_PATHS+=("$SRC")
		cp -R "$dir" "$SRC"
		chmod -R u+w "$SRC"
	}
	# build_in_module MODULE@VERSION PACKAGE [LDFLAGS]
	build_in_module() { # build_in_module MODULE@VERSION PACKAGE [LDFLAGS [TAGS]]
		module_copy "$1"
		(cd "$SRC" && GOWORK=off GOFLAGS="$GOFLAGS -mod=readonly" \
			go build -tags "${4:-}" -ldflags "-s -w ${3:-}" -o "$OUT" "$2")
	}
	version_ldflags() { # version_ldflags VERSION: the stamps `promu` sets
		printf '%s' "-X github.com/prometheus/common/version.Version=$1 -X github.com/prometheus/common/version.BuildDate=19700101-00:00:00"
	}
	build_alertmanager() { # build_alertmanager CMD
		module_copy "github.com/prometheus/alertmanager@$ALERTMANAGER_VERSION"
		mkdir -p "$SRC/ui/app/dist"
		[ -e "$SRC/ui/app/dist/index.html" ] ||
			echo '<!doctype html><title>Alertmanager</title><p>Web UI not built.' >"$SRC/ui/app/dist/index.html"
		build_in_module "github.com/prometheus/alertmanager@$ALERTMANAGER_VERSION" "./cmd/$1" \
			"$(version_ldflags "${ALERTMANAGER_VERSION#v}")"
	}
	# promtool only checks and tests rule files here: `remove_all_sd` leaves out
	# the service discovery plugins (the clouds' SDKs, Consul, ...), which are
	# most of its build, as Prometheus' own slim builds do.
	build_promtool() {
		local n=${PROMETHEUS_VERSION#v0.} minor
		minor=${n%%.*}
		build_in_module "github.com/prometheus/prometheus@$PROMETHEUS_VERSION" ./cmd/promtool \
			"$(version_ldflags "$((10#$minor / 100)).$((10#$minor % 100)).${n#*.}")" remove_all_sd
	}

	# OpenTofu's go.mod has a replace directive, so `go install` refuses it: it
	# is built inside a copy of its module, as Alertmanager is.
	build_tofu() {
		build_in_module "github.com/opentofu/opentofu@$OPENTOFU_VERSION" ./cmd/tofu
	}
	# The external-attacher's go.mod has replace directives, so `go install`
	# refuses it: it is built inside a copy of its module. Both stamp the version
	# their release builds set (the PD driver refuses to start without one).
	build_csi_attacher() {
		build_in_module "github.com/kubernetes-csi/external-attacher/v4@$EXTERNAL_ATTACHER_VERSION" ./cmd/csi-attacher \
			"-X main.version=$EXTERNAL_ATTACHER_VERSION"
	}
	build_pd_csi() {
		go_install "sigs.k8s.io/gcp-compute-persistent-disk-csi-driver/cmd/gce-pd-csi-driver@$PD_CSI_VERSION" \
			gce-pd-csi-driver "-X main.version=$PD_CSI_VERSION"
	}
	build_csi_controller() {
		(cd "$CSI_CONTROLLER_SRC" && GOFLAGS="$GOFLAGS -mod=readonly" \
			go build -ldflags "-s -w -X main.version=$CSI_CONTROLLER_SHA" -o "$OUT" .)
	}
	build_tflint() {
		go_install "github.com/terraform-linters/tflint@$TFLINT_VERSION" tflint
	}
	build_schema_provider() {
		(cd "$SCHEMA_PROVIDER_SRC" && GOFLAGS="$GOFLAGS -mod=readonly" \
			go build -ldflags "-s -w" -o "$OUT" .)
	}
	# npm_tarball PACKAGE@VERSION: sets TARBALL to the package's tarball in
	# $CACHE/npm, fetched once with `npm pack` (a download, nothing installed).
	npm_tarball() {
		local spec=$1 name tmp
		name="$(printf '%s' "${spec%@*}" | sed -e 's|^@||' -e 's|/|-|')-${spec##*@}.tgz"
		TARBALL="$CACHE/npm/$name"
		[ -f "$TARBALL" ] && return 0
		tmp="$CACHE/npm/.tmp.$$"
		TMP_PATHS+=("$tmp")
		mkdir -p "$tmp"
		(cd "$tmp" && npm pack --silent --cache "$tmp/.npm-cache" "$spec" >/dev/null)
		[ -f "$tmp/$name" ] || die "npm pack $spec gave no $name"
		mv -f "$tmp/$name" "$TARBALL"
		rm -rf "$tmp"
	}
	# pypi_tarball NAME==VERSION: sets TARBALL to the npm package a jsii
	# distribution on PyPI carries (<module>/_jsii/*.jsii.tgz of its wheel), in
	# $CACHE/npm, fetched once with `pip download` (nothing installed).
	pypi_tarball() {
		local spec=$1 name tmp wheel
		name="$(printf '%s' "${spec%%==*}" | tr '_' '-')-${spec##*==}.tgz"
		TARBALL="$CACHE/npm/$name"
		[ -f "$TARBALL" ] && return 0
		tmp="$CACHE/npm/.tmp.$$"
		TMP_PATHS+=("$tmp")
		mkdir -p "$tmp"
		"$STACK_VENV/bin/python" -m pip download --disable-pip-version-check --no-input -q \
			--no-deps --no-cache-dir --only-binary=:all: -d "$tmp" "$spec"
		wheel="$(find "$tmp" -maxdepth 1 -name '*.whl' | head -n 1)"
		[ -n "$wheel" ] || die "pip download $spec gave no wheel"
		"$STACK_VENV/bin/python" - "$wheel" "$tmp/$name" <<-'PY'
			import shutil, sys, zipfile
			with zipfile.ZipFile(sys.argv[1]) as wheel:
			    (member,) = [n for n in wheel.namelist() if n.endswith(".jsii.tgz") and "/_jsii/" in n]
			    with wheel.open(member) as src, open(sys.argv[2], "wb") as dst:
			        shutil.copyfileobj(src, dst)
		PY
		mv -f "$tmp/$name" "$TARBALL"
		rm -rf "$tmp"
	}
	# The schema-only provider once for each provider it stands for, beside the
	# schema of the types infra/ uses, laid out as a filesystem mirror for the
	# provider_installation of a TF_CLI_CONFIG_FILE.
	build_mirror() {
		local tmp="$TF_MIRROR.tmp.$$" entry provider types version dir t0=$SECONDS
		[ -d "$TF_MIRROR" ] && return 0
		log "writing the provider schemas and their mirror (first time only, <1 min)"
		TMP_PATHS+=("$tmp")
		mkdir -p "$tmp"
		for entry in "${CDK_PACKAGES[@]}"; do
			provider=${entry%%=*}
			case "${entry#*=}" in
			pypi:*) pypi_tarball "${entry#*=pypi:}" ;;
			*) npm_tarball "${entry#*=}" ;;
			esac
			types="$(printf '%s\n' "$TF_TYPES" | { grep -E "^(data\.)?${provider}_" || true; } | paste -sd, -)"
			python3 "$SCHEMA_CONVERTER" --package "$TARBALL" --provider "$provider" --types "$types" -o "$tmp/$provider.json"
			version="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$tmp/$provider.json")"
			dir="$tmp/registry.opentofu.org/hashicorp/$provider/$version/$(go env GOOS)_$(go env GOARCH)"
			mkdir -p "$dir"
			ln -f "$SCHEMA_PROVIDER_BIN" "$dir/terraform-provider-${provider}_v$version" 2>/dev/null ||
				cp "$SCHEMA_PROVIDER_BIN" "$dir/terraform-provider-${provider}_v$version"
			mv "$tmp/$provider.json" "$dir/schema.json"
		done
		mv "$tmp" "$TF_MIRROR"
		log "    mirror ready in $(elapsed $((SECONDS - t0))): $TF_MIRROR"
	}

	# Every build this run's options ask for, in order: with STEP=plan, lists
	# what is missing with a rough time each (2 cores, Go's module cache warm)
	# and adds up the minutes; with STEP=build, builds it.
	venv_step() { # venv_step NAME DIR REQUIREMENTS
		if [ "$STEP" = plan ]; then
			venv_ready "$2" || plan_add "Python venv $1" "~1-2 min" 2
		else
			ensure_venv "$1" "$3"
		fi
	}
	bin_step() { # bin_step NAME VERSION DEST ESTIMATE MINUTES -- COMMAND...
		if [ "$STEP" = plan ]; then
			[ -x "$3" ] || plan_add "$1 $2" "$4" "$5"
		else
			install_bin "$1" "$2" "$3" "$4" -- "${@:7}"
		fi
	}
	# The CSI attach chain: three Go builds of several minutes that need nothing
	# else built, run one after the other in the background beside the steps
	# after them (whose downloads and links leave a core idle), their output
	# prefixed with [csi]; wait_bg waits for them before env.sh is written.
	BG_PIDS=()
	csi_steps() {
		bin_step csi-attacher "$EXTERNAL_ATTACHER_VERSION" "$CSI_ATTACHER_BIN" "~3-5 min" 4 -- build_csi_attacher
		if want_cloud gce; then
			bin_step gce-pd-csi-driver "$PD_CSI_VERSION" "$PD_CSI_BIN" "~3-5 min" 4 -- build_pd_csi
		fi
		bin_step csi-controller "$CSI_CONTROLLER_SHA" "$CSI_CONTROLLER_BIN" "~1-2 min" 2 -- build_csi_controller
	}
	in_background() { # in_background FUNCTION: runs it now when planning
		if [ "$STEP" = plan ]; then
			"$1"
			return 0
		fi
		(
			TMP_PATHS=()
			BG_PIDS=()
			trap cleanup EXIT
			trap 'exit 143' TERM
			"$1"
		) > >(sed -u 's/^/[csi] /') 2>&1 &
		BG_PIDS+=("$!")
	}
	wait_bg() {
		local pid failed=0
		for pid in "${BG_PIDS[@]+"${BG_PIDS[@]}"}"; do
			wait "$pid" || failed=1
		done
		BG_PIDS=()
		[ "$failed" = 0 ] || die "the CSI attach chain's build failed (its lines above start with [csi])"
	}
	# The old control planes run only the legacy mode's scenarios (v1.25.15,
	# with its hollow kubelet) and the 1.15 tests.
	old_plane_steps() {
		bin_step "kube-apiserver (old)" "$KUBE_LEGACY_VERSION" "$KUBE_LEGACY_BIN/kube-apiserver" "~3 min" 3 -- build_kube_legacy kube-apiserver
		bin_step "kube-controller-manager (old)" "$KUBE_LEGACY_VERSION" "$KUBE_LEGACY_BIN/kube-controller-manager" "~1 min" 1 -- build_kube_legacy kube-controller-manager
		bin_step "kube-scheduler (old)" "$KUBE_LEGACY_VERSION" "$KUBE_LEGACY_BIN/kube-scheduler" "<1 min" 1 -- build_kube_legacy kube-scheduler
		bin_step "hollow-kubelet (old)" "$KUBE_LEGACY_VERSION" "$HOLLOW_KUBELET_LEGACY_BIN" "~2-4 min" 3 -- build_hollow_kubelet_legacy
		bin_step "kube-apiserver (oldest)" "$KUBE_OLDEST_VERSION" "$KUBE_OLDEST_BIN/kube-apiserver" "~3-4 min" 4 -- build_kube_oldest kube-apiserver
		bin_step "kube-controller-manager (oldest)" "$KUBE_OLDEST_VERSION" "$KUBE_OLDEST_BIN/kube-controller-manager" "<1 min" 1 -- build_kube_oldest kube-controller-manager
		bin_step "kube-scheduler (oldest)" "$KUBE_OLDEST_VERSION" "$KUBE_OLDEST_BIN/kube-scheduler" "<1 min" 1 -- build_kube_oldest kube-scheduler
		bin_step "csi-attacher (oldest)" "$ATTACHER_OLDEST_VERSION" "$KUBE_OLDEST_BIN/csi-attacher" "<1 min" 1 -- build_kube_oldest csi-attacher
	}
	steps() {
		if [ "$OLD_PLANES" = only ]; then
			old_plane_steps
			return 0
		fi
		if want_stack && want_controllers; then
			in_background csi_steps
		fi
		# The stack venv also fetches the provider packages PyPI carries (the mirror).
		venv_step stack "$STACK_VENV" "$HERE/requirements.txt"
		if want_stack && want_cloud redfish; then
			venv_step redfish "$REDFISH_VENV" "$REPO/tests/redfish/requirements.txt"
		fi
		if want_checks; then
			[ -z "$INFRA_VENV" ] || venv_step infra "$INFRA_VENV" "$REPO/tests/infra/requirements.txt"
			venv_step gce "$GCE_VENV" "$REPO/tests/gce/requirements.txt"
		fi
		if want_kubernetes && want_stack; then
			bin_step etcd "$ETCD_VERSION" "$ETCD_BIN" "~1 min" 1 -- build_etcd
			bin_step kube-apiserver "$KUBE_VERSION" "$KUBE_BIN/kube-apiserver" "~4 min" 4 -- build_kube kube-apiserver
			if want_controllers; then
				bin_step kube-controller-manager "$KUBE_VERSION" "$KUBE_BIN/kube-controller-manager" "~1 min" 1 -- build_kube kube-controller-manager
				bin_step kube-scheduler "$KUBE_VERSION" "$KUBE_BIN/kube-scheduler" "<1 min" 1 -- build_kube kube-scheduler
				bin_step kwok "$KWOK_VERSION" "$KWOK_BIN" "~1-2 min" 2 -- \
					go_install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
			fi
			if want_controllers && want_test_tools; then
				bin_step hollow-kubelet "$KUBE_VERSION" "$HOLLOW_KUBELET_BIN" "~2-3 min" 3 -- build_hollow_kubelet
				[ "$OLD_PLANES" = skip ] || old_plane_steps
			fi
			# kubectl: a test's NodeCleanup deletes its Nodes with it on drop (a drop
			# cannot await); `make run --keep` names it to look at the stack.
			bin_step kubectl "$KUBE_VERSION" "$KUBE_BIN/kubectl" "~1 min" 1 -- build_kube kubectl
			# The webhook scenarios' Alertmanager, and the Runtime API as Lambda serves it.
			if want_test_tools; then
				bin_step alertmanager "$ALERTMANAGER_VERSION" "$ALERTMANAGER_BIN/alertmanager" "~2 min" 2 -- build_alertmanager alertmanager
				bin_step aws-lambda-rie "$RIE_VERSION" "$RIE_BIN" "<1 min" 1 -- \
					go_install "github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie@$RIE_VERSION" aws-lambda-rie
			fi
		fi
		if want_kubernetes && want_checks; then
			bin_step hclfmt "$HCLFMT_VERSION" "$HCLFMT_BIN" "<1 min" 1 -- \
				go_install "github.com/hashicorp/hcl/v2/cmd/hclfmt@$HCLFMT_VERSION" hclfmt
			bin_step cargo-fuzz "$CARGO_FUZZ_VERSION" "$CARGO_FUZZ_BIN" "<1 min" 1 -- build_cargo_fuzz
			bin_step amtool "$ALERTMANAGER_VERSION" "$ALERTMANAGER_BIN/amtool" "<1 min" 1 -- build_alertmanager amtool
			bin_step promtool "$PROMETHEUS_VERSION" "$PROMTOOL_BIN" "~5-8 min" 8 -- build_promtool
		fi
		if want_terraform; then
			bin_step tofu "$OPENTOFU_VERSION" "$TOFU_BIN" "~4 min" 4 -- build_tofu
			bin_step tflint "$TFLINT_VERSION" "$TFLINT_BIN" "~2 min" 2 -- build_tflint
			bin_step schema-provider "$SCHEMA_PROVIDER_SHA" "$SCHEMA_PROVIDER_BIN" "<1 min" 1 -- build_schema_provider
			if [ "$STEP" = plan ]; then
				[ -d "$TF_MIRROR" ] || plan_add "the provider schemas' mirror" "<1 min" 1
			else
				build_mirror
			fi
		fi
	}
	PLAN=()
	PLAN_MINUTES=0
	plan_add() { # plan_add WHAT ESTIMATE MINUTES
		PLAN+=("$1 ($2)")
		PLAN_MINUTES=$((PLAN_MINUTES + $3))
	}
	STEP=plan steps
	if [ ${#PLAN[@]} -gt 0 ]; then
		log "to build, first time only (about $PLAN_MINUTES min on 2 idle cores in all, more on a busy machine; each is cached by version):"
		printf '      %s\n' "${PLAN[@]}"
	fi
	STEP=build steps
	wait_bg
	[ "$OLD_PLANES" = only ] || [ -x "$STACK_VENV/bin/moto_server" ] || die "moto_server missing from $STACK_VENV (delete it and rerun)"
	[ "$OLD_PLANES" = only ] || [ -x "$STACK_VENV/bin/cargo-lambda" ] || die "cargo-lambda missing from $STACK_VENV (delete it and rerun)"
	[ "$OLD_PLANES" = only ] || ! want_stack || ! want_cloud redfish || [ -x "$REDFISH_VENV/bin/sushy-emulator" ] || die "sushy-emulator missing from $REDFISH_VENV (delete it and rerun)"

	# --- env.sh ------------------------------------------------------------------------

	q() { printf '%q' "$1"; }
	{
		echo "# Written by tests/stack/setup.sh; source it to use the cached test tools."
		echo "export NODE_FENCER_CACHE=$(q "$CACHE")"
		echo "export NODE_FENCER_KUBE_BIN=$(q "$KUBE_BIN")"
		echo "export NODE_FENCER_KUBE_LEGACY_BIN=$(q "$KUBE_LEGACY_BIN")"
		echo "export NODE_FENCER_KUBE_OLDEST_BIN=$(q "$KUBE_OLDEST_BIN")"
		echo "export NODE_FENCER_ETCD=$(q "$ETCD_BIN")"
		echo "export NODE_FENCER_KWOK=$(q "$KWOK_BIN")"
		echo "export NODE_FENCER_HOLLOW_KUBELET=$(q "$HOLLOW_KUBELET_BIN")"
		echo "export NODE_FENCER_HOLLOW_KUBELET_LEGACY=$(q "$HOLLOW_KUBELET_LEGACY_BIN")"
		echo "export NODE_FENCER_CSI_ATTACHER=$(q "$CSI_ATTACHER_BIN")"
		echo "export NODE_FENCER_CSI_ATTACHER_OLDEST=$(q "$KUBE_OLDEST_BIN/csi-attacher")"
		echo "export NODE_FENCER_PD_CSI_DRIVER=$(q "$PD_CSI_BIN")"
		echo "export NODE_FENCER_CSI_CONTROLLER=$(q "$CSI_CONTROLLER_BIN")"
		echo "export NODE_FENCER_HCLFMT=$(q "$HCLFMT_BIN")"
		echo "export NODE_FENCER_CARGO_FUZZ=$(q "$CARGO_FUZZ_BIN")"
		echo "export NODE_FENCER_ALERTMANAGER=$(q "$ALERTMANAGER_BIN/alertmanager")"
		echo "export NODE_FENCER_AMTOOL=$(q "$ALERTMANAGER_BIN/amtool")"
		echo "export NODE_FENCER_PROMTOOL=$(q "$PROMTOOL_BIN")"
		echo "export NODE_FENCER_TOFU=$(q "$TOFU_BIN")"
		echo "export NODE_FENCER_TFLINT=$(q "$TFLINT_BIN")"
		echo "export NODE_FENCER_LAMBDA_RIE=$(q "$RIE_BIN")"
		echo "export NODE_FENCER_TF_MIRROR=$(q "$TF_MIRROR")"
		echo "export NODE_FENCER_VENV=$(q "$STACK_VENV")"
		if [ -n "$INFRA_VENV" ]; then
			echo "export NODE_FENCER_INFRA_VENV=$(q "$INFRA_VENV")"
		fi
		echo "export NODE_FENCER_GCE_VENV=$(q "$GCE_VENV")"
		echo "export NODE_FENCER_REDFISH_VENV=$(q "$REDFISH_VENV")"
		echo "case \":\$PATH:\" in *:\"\$NODE_FENCER_VENV/bin\":*) ;; *) export PATH=\"\$NODE_FENCER_VENV/bin:\$PATH\" ;; esac"
	} >"$CACHE/.env.sh.tmp.$$"
	if cmp -s "$CACHE/.env.sh.tmp.$$" "$CACHE/env.sh"; then
		rm -f "$CACHE/.env.sh.tmp.$$"
	else
		mv -f "$CACHE/.env.sh.tmp.$$" "$CACHE/env.sh"
	fi

	missing=()
	for b in "$ETCD_BIN" "$KUBE_BIN/kube-apiserver" "$KUBE_BIN/kube-controller-manager" \
		"$KUBE_BIN/kube-scheduler" "$KUBE_LEGACY_BIN/kube-apiserver" "$KUBE_LEGACY_BIN/kube-controller-manager" \
		"$KUBE_LEGACY_BIN/kube-scheduler" "$KUBE_OLDEST_BIN/kube-apiserver" "$KUBE_OLDEST_BIN/kube-controller-manager" \
		"$KUBE_OLDEST_BIN/kube-scheduler" "$KUBE_OLDEST_BIN/csi-attacher" "$KWOK_BIN" "$HOLLOW_KUBELET_BIN" "$HOLLOW_KUBELET_LEGACY_BIN" "$CSI_ATTACHER_BIN" "$PD_CSI_BIN" "$CSI_CONTROLLER_BIN" "$HCLFMT_BIN" "$CARGO_FUZZ_BIN" "$KUBE_BIN/kubectl" "$RIE_BIN" \
		"$ALERTMANAGER_BIN/alertmanager" "$ALERTMANAGER_BIN/amtool" "$PROMTOOL_BIN" \
		"$TOFU_BIN" "$TFLINT_BIN" "$SCHEMA_PROVIDER_BIN" "$TF_MIRROR"; do
		[ -x "$b" ] || missing+=("${b#"$CACHE"/}")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		log "not built (by option): ${missing[*]}"
	fi
	log "ready in $(elapsed "$SECONDS"): source $CACHE/env.sh"
}

main "$@"; exit
