#!/usr/bin/env bash
# h2spec (github.com/summerwind/h2spec), the HTTP/2 conformance suite, built
# once from the Go module proxy and cached outside the repository, for
# e2e/h2spec_test.go (TestH2Spec): it runs h2spec against tether's client
# listener over h2c (prior knowledge), and against a plain net/http h2c
# server, and allows tether only the failures net/http has itself.
#
#   hack/h2spec.sh           build what is missing, print the binary's path
#   hack/h2spec.sh --check   exit 0 when the binary is cached, 1 otherwise
#
# Pinned version (e2e/h2spec_test.go knows the same one):
#   h2spec  github.com/summerwind/h2spec  v2.2.1+incompatible  (its newest release;
#           the module has no go.mod, so its dependencies are pinned here)
#
# Layout (the Go test looks here, or at $TETHER_H2SPEC):
#   ${TETHER_H2SPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/h2spec}/h2spec-v2.2.1/
#       h2spec  build.log
#
# It is built in a throwaway module in a temporary directory, with its
# dependencies at the versions below (h2spec's Gopkg.lock predates modules;
# golang.org/x/net is tether's own). On 2 busy cores, with empty module and
# build caches, the first build took about 2 minutes here; a cached run
# returns at once. Concurrent runs wait on a lock.
set -euo pipefail

H2SPEC_VERSION=v2.2.1+incompatible
H2SPEC_RELEASE=v2.2.1
X_NET_VERSION=v0.59.0
COBRA_VERSION=v1.10.2
PFLAG_VERSION=v1.0.9
COLOR_VERSION=v1.19.0
GO=${GO:-go}

CACHE_ROOT=${TETHER_H2SPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tether/h2spec}
BIN_DIR=$CACHE_ROOT/h2spec-$H2SPEC_RELEASE

have() { [[ -x "$BIN_DIR/h2spec" ]]; }

if [[ "${1:-}" == "--check" ]]; then
	have
	exit
fi

mkdir -p "$BIN_DIR"
exec 9>"$BIN_DIR/.lock"
flock 9
if have; then
	echo "$BIN_DIR/h2spec"
	exit 0
fi

log() { echo "h2spec: $*" >&2; }

# Builds use the project's Go toolchain and the module proxy only; CGO is off
# so the binary does not depend on the machine's C library.
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_h2spec() {
	# errexit does not apply inside a function run as `f || ...`: every step checks.
	cd "$work" || return 1
	"$GO" mod init tether.local/h2spec-build || return 1
	"$GO" get "github.com/summerwind/h2spec/cmd/h2spec@$H2SPEC_VERSION" \
		"golang.org/x/net@$X_NET_VERSION" \
		"github.com/spf13/cobra@$COBRA_VERSION" \
		"github.com/spf13/pflag@$PFLAG_VERSION" \
		"github.com/fatih/color@$COLOR_VERSION" || return 1
	cat go.mod
	"$GO" build -trimpath \
		-ldflags "-s -w -X main.VERSION=${H2SPEC_RELEASE#v} -X main.COMMIT=$H2SPEC_RELEASE" \
		-o "$BIN_DIR/h2spec.tmp" github.com/summerwind/h2spec/cmd/h2spec || return 1
	mv "$BIN_DIR/h2spec.tmp" "$BIN_DIR/h2spec"
}

start=$SECONDS
log "building h2spec $H2SPEC_RELEASE"
(build_h2spec) >>"$BIN_DIR/build.log" 2>&1 || {
	tail -30 "$BIN_DIR/build.log" >&2
	exit 1
}
log "built in $((SECONDS - start))s: $BIN_DIR/h2spec"
echo "$BIN_DIR/h2spec"
