# syntax=docker/dockerfile:1
#
# tether's image: a static binary on distroless, as the non-root user, with
# no shell. Build it from the repository root:
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t tether .
#
# cmd/tether/dockerfile_test.go builds the binary with the flags of the RUN
# line below (read from this file) and checks it is static and runs.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
# Dependencies first: this layer is reused until go.mod or go.sum change.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/tether ./cmd/tether

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tether /tether
# distroless' nonroot user (65532); the injected sidecar runs as the same.
USER 65532:65532
# 7480: MCP clients (loopback in a pod); 7481: /healthz /readyz /metrics.
EXPOSE 7480 7481
ENTRYPOINT ["/tether"]
