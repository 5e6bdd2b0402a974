# syntax=docker/dockerfile:1
#
# tether's images: a static binary on distroless, as the non-root user, with
# no shell. Build them from the repository root:
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t tether .
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) --target webhook -t tether-webhook .
#
# The default image is the sidecar's: the binary built with -tags
# tether_sidecar (serve, explain, status and version; the process on every
# request links nothing it does not use). The webhook image (--target
# webhook) has the full binary, for deploy/webhook.
#
# cmd/tether/dockerfile_test.go builds both binaries with the flags of the
# RUN lines below (read from this file) and checks they are static and run.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS source
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .

FROM source AS build-full
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/tether ./cmd/tether

FROM source AS build-sidecar
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -tags tether_sidecar -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/tether ./cmd/tether

FROM gcr.io/distroless/static-debian12:nonroot AS webhook
COPY --from=build-full /out/tether /tether
USER 65532:65532
# 8443: the admission webhook (deploy/webhook).
EXPOSE 8443
ENTRYPOINT ["/tether"]

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build-sidecar /out/tether /tether
# distroless' nonroot user (65532); the injected sidecar runs as the same.
USER 65532:65532
# 7480: MCP clients (loopback in a pod); 7481: /healthz /readyz /metrics.
EXPOSE 7480 7481
ENTRYPOINT ["/tether"]
