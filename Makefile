# The two commands of the README: `make demo` and `make test`.
GO ?= go

.PHONY: demo test check unit conformance bench bench-full microbench bench-report bench-report-full fuzz build kube-env h2spec image docker-image

demo:
	$(GO) run ./cmd/tether demo

# Everything CI runs: static checks, the race-enabled test suite, and the
# MCP conformance suite directly and through tether. The Kubernetes test
# environment is built first (once, cached outside the repo), and tests that
# need it fail instead of skipping (TETHER_REQUIRE_KUBE), so CI never passes
# by skipping them; likewise the Redis Cluster tests and redis-cli
# (TETHER_REQUIRE_REDIS_TOOLS); likewise h2spec, the HTTP/2 conformance
# suite run against the h2c client listener (TETHER_REQUIRE_H2SPEC,
# e2e/h2spec_test.go).
test: export TETHER_REQUIRE_KUBE = 1
test: export TETHER_REQUIRE_REDIS_TOOLS = 1
test: export TETHER_REQUIRE_H2SPEC = 1
test: check kube-env h2spec unit conformance

# etcd and kube-apiserver for the discovery end-to-end tests (DESIGN §7):
# about 8 minutes the first time on 2 cores, then cached.
kube-env:
	GO=$(GO) bash hack/kube-env.sh

# h2spec for e2e's TestH2Spec: built from the Go module proxy (about 2
# minutes the first time on 2 cores), then cached.
h2spec:
	GO=$(GO) bash hack/h2spec.sh

# bench/, hack/image/ and deploy/helm/ are modules of their own (the load
# generator's, the image builder's and Helm's dependencies stay out of
# tether's go.mod): every Go step runs in each module.
check:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags tether_sidecar ./cmd/tether/
	cd bench && $(GO) vet ./...
	cd hack/image && $(GO) vet ./...
	cd deploy/helm && $(GO) vet ./...
	$(GO) mod tidy -diff
	cd bench && $(GO) mod tidy -diff
	cd hack/image && $(GO) mod tidy -diff
	cd deploy/helm && $(GO) mod tidy -diff

unit:
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -tags tether_sidecar -run 'CommandsOfThisBuild|Dependencies' ./cmd/tether/
	cd bench && $(GO) test -race -count=1 ./...
	cd hack/image && $(GO) test -race -count=1 ./...
	cd deploy/helm && $(GO) test -race -count=1 ./...

conformance:
	bash hack/conformance.sh

# Go micro-benchmarks of the hot paths (pick, session lookup, the request
# path), with allocations.
microbench:
	$(GO) test -run '^$$' -bench . -benchmem ./internal/balancer/ ./internal/session/ ./internal/proxy/ ./internal/h1/ ./internal/server/

# The benchmark report (bench/README.md): the seed bug in network namespaces
# with kube-proxy's iptables rules, overhead against direct/nginx/HAProxy,
# failover, placement, a rolling update (--drain proactive vs on-failure),
# open streams (RSS and CPU per open SSE stream against nginx and HAProxy).
# About 14 minutes on 2 cores; -full runs longer.
# Installs nginx, haproxy, redis-server and iptables with apt when missing.
bench bench-report:
	cd bench && $(GO) run ./cmd/tetherbench -out results -readme README.md

bench-full bench-report-full:
	cd bench && $(GO) run ./cmd/tetherbench -full -out results -readme README.md

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzClassify$$' -fuzztime 60s ./internal/proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzScanMatchesEncodingJSON$$' -fuzztime 60s ./internal/proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzClassifyModern$$' -fuzztime 60s ./internal/proxy/
	$(GO) test -run '^$$' -fuzz '^FuzzParseHead$$' -fuzztime 60s ./internal/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzReadAnswer$$' -fuzztime 60s ./internal/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzAnswerStream$$' -fuzztime 60s ./internal/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzConn$$' -fuzztime 60s ./internal/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzConnDiff$$' -fuzztime 60s ./internal/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzWatchStream$$' -fuzztime 60s ./internal/discovery/

# bin/tether has every command; bin/tether-sidecar is the image's binary
# (serve, explain, status, drain and version only).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=auto -ldflags "-s -w -X main.version=$$(git describe --tags --always --dirty 2>/dev/null || echo dev)" -o bin/tether ./cmd/tether
	CGO_ENABLED=0 $(GO) build -tags tether_sidecar -trimpath -buildvcs=auto -ldflags "-s -w -X main.version=$$(git describe --tags --always --dirty 2>/dev/null || echo dev)" -o bin/tether-sidecar ./cmd/tether

# The container images: the sidecar's (-tags tether_sidecar) and the
# webhook's (the full binary). `make image` needs no container engine:
# hack/image builds them from the Dockerfile's build commands and config, on
# a base of distroless' files made in the build, as OCI image layouts
# (bin/images/tether/, bin/images/tether-webhook/) and tarballs for
# `docker load` (bin/images/*.tar); then its test (also in unit) builds both
# again and checks them: config, files (no shell), the binary run from each
# image, the same digests twice.
# PLATFORM=linux/arm64 builds for arm64. `make docker-image` builds the same
# images with Docker, into its image store.
IMAGE ?= ghcr.io/tether-mcp/tether:dev
WEBHOOK_IMAGE ?= ghcr.io/tether-mcp/tether-webhook:dev
PLATFORM ?= linux/amd64
image:
	cd hack/image && $(GO) run . -root $(CURDIR) -out $(CURDIR)/bin/images -image $(IMAGE) -webhook-image $(WEBHOOK_IMAGE) -platform $(PLATFORM)
	cd hack/image && $(GO) test -count=1 -run 'TestImages$$' .

docker-image:
	docker build --build-arg VERSION=$$(git describe --tags --always --dirty 2>/dev/null || echo dev) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) -t $(IMAGE) .
	docker build --build-arg VERSION=$$(git describe --tags --always --dirty 2>/dev/null || echo dev) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) --target webhook -t $(WEBHOOK_IMAGE) .
