#!/usr/bin/env bash
# Kubernetes test environment (DESIGN §7): builds etcd and kube-apiserver from
# Go modules, once, and caches the binaries outside the repository.
#
#   hack/kube-env.sh           build what is missing, print the binary directory
#   hack/kube-env.sh --check   exit 0 when both binaries are cached, 1 otherwise
#
# Pinned versions (internal/kubetest knows the same ones):
#   etcd            go.etcd.io/etcd/server/v3   v3.7.3   (the module root is package main)
#   kube-apiserver  k8s.io/kubernetes           v1.37.2  (with every k8s.io staging module
#                                                         replaced by its v0.37.2 release)
#
# Layout (the Go test helper looks here, or in $TETHER_KUBE_BIN_DIR):
#   ${TETHER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/kube}/k8s-v1.37.2-etcd-v3.7.3/
#       etcd  kube-apiserver  build.log
#
# Both are built in throwaway modules in a temporary directory (the modules'
# own replace directives keep `go install pkg@version` from working). On 2
# cores, with empty module and build caches, the first build took 8 minutes
# here (etcd 68 s, kube-apiserver 411 s, downloads included); a cached run
# returns at once. Concurrent runs wait on a lock.
set -euo pipefail

ETCD_VERSION=v3.7.3
K8S_VERSION=v1.37.2
STAGING_VERSION=v0.37.2
GO=${GO:-go}

CACHE_ROOT=${TETHER_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/kube}
BIN_DIR=${TETHER_KUBE_BIN_DIR:-$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION}

have() { [[ -x "$BIN_DIR/etcd" && -x "$BIN_DIR/kube-apiserver" ]]; }

if [[ "${1:-}" == "--check" ]]; then
	have
	exit
fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.lock"
flock 9
if have; then
	echo "$BIN_DIR"
	exit 0
fi

log() { echo "kube-env: $*" >&2; }

# Builds use the project's Go toolchain and the module proxy only; CGO is off
# so the binaries do not depend on the machine's C library.
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_etcd() {
	local m="$work/etcd"
	# errexit does not apply inside a function run as `f || ...`: every step checks.
	mkdir -p "$m" && cd "$m" || return 1
	"$GO" mod init tether.local/etcd-build || return 1
	"$GO" get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" || return 1
	"$GO" build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3 || return 1
	mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
}

build_apiserver() {
	local m="$work/kube-apiserver"
	mkdir -p "$m" && cd "$m" || return 1
	local gomod
	gomod=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p') || return 1
	[[ -f "$gomod" ]] || {
		log "cannot find go.mod of k8s.io/kubernetes@$K8S_VERSION"
		return 1
	}
	# The staging modules are the `k8s.io/X => ./staging/src/k8s.io/X` lines.
	local staging
	staging=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod" | sort -u)
	[[ -n "$staging" ]] || {
		log "no staging replaces found in $gomod"
		return 1
	}
	{
		echo "module tether.local/kube-apiserver-build"
		echo
		sed -n 's/^go \(.*\)$/go \1/p' "$gomod" | head -1
		# k8s.io/kubernetes pins its GODEBUG behaviour with godebug lines; keep them.
		sed -n '/^godebug/,/^)/p' "$gomod"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		local s
		for s in $staging; do
			echo "	$s => $s $STAGING_VERSION"
		done
		echo ")"
	} >go.mod || return 1
	log "kube-apiserver: $(wc -w <<<"$staging") staging modules replaced by $STAGING_VERSION"
	"$GO" get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" || return 1
	"$GO" build -trimpath -ldflags "-s -w" -o "$BIN_DIR/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver || return 1
	mv "$BIN_DIR/kube-apiserver.tmp" "$BIN_DIR/kube-apiserver"
}

start=$SECONDS
if [[ ! -x "$BIN_DIR/etcd" ]]; then
	log "building etcd $ETCD_VERSION (about 1 minute on 2 cores)"
	t=$SECONDS
	(build_etcd) >>"$BIN_DIR/build.log" 2>&1 || {
		tail -30 "$BIN_DIR/build.log" >&2
		exit 1
	}
	log "etcd built in $((SECONDS - t))s"
fi
if [[ ! -x "$BIN_DIR/kube-apiserver" ]]; then
	log "building kube-apiserver $K8S_VERSION (about 7 minutes on 2 cores)"
	t=$SECONDS
	(build_apiserver) >>"$BIN_DIR/build.log" 2>&1 || {
		tail -30 "$BIN_DIR/build.log" >&2
		exit 1
	}
	log "kube-apiserver built in $((SECONDS - t))s"
fi
log "done in $((SECONDS - start))s: $BIN_DIR"
echo "$BIN_DIR"
