# syntax=docker/dockerfile:1
#
# tether's images: a static binary on distroless, as the non-root user, with
# no shell. Build them from the repository root:
#
#   make docker-image
#
# which runs, with REVISION the commit (for the labels):
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) --build-arg REVISION=$(git rev-parse HEAD) -t tether .
#   docker build --build-arg VERSION=... --build-arg REVISION=... --target webhook -t tether-webhook .
#
# Without a container engine, `make image` (hack/image) builds the same two
# images from this file: it reads the go build lines, the COPY, USER,
# EXPOSE, ENTRYPOINT and LABEL of the final stages, and makes the files of
# distroless that tether uses (passwd and group with nonroot, the CA
# certificates, /tmp) instead of pulling it. Keep the final stages to those
# instructions, or teach hack/image the new one; it refuses another base.
#
# The default image is the sidecar's: the binary built with -tags
# tether_sidecar (serve, explain, status, drain and version; the process on every
# request links nothing it does not use). The webhook image (--target
# webhook) has the full binary, for deploy/webhook.
#
# cmd/tether/dockerfile_test.go builds both binaries with the flags of the
# RUN lines below (read from this file) and checks they are static and run;
# hack/image's test builds both images and checks their config and files.

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
ARG VERSION=dev
ARG REVISION=unknown
COPY --from=build-full /out/tether /tether
LABEL org.opencontainers.image.title="tether-webhook" \
      org.opencontainers.image.source="https://github.com/tether-mcp/tether" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
USER 65532:65532
# 8443: the admission webhook (deploy/webhook).
EXPOSE 8443
ENTRYPOINT ["/tether"]

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
ARG REVISION=unknown
COPY --from=build-sidecar /out/tether /tether
LABEL org.opencontainers.image.title="tether" \
      org.opencontainers.image.source="https://github.com/tether-mcp/tether" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
# distroless' nonroot user (65532); the injected sidecar runs as the same.
USER 65532:65532
# 7480: MCP clients (loopback in a pod); 7481: /healthz /readyz /metrics.
EXPOSE 7480 7481
ENTRYPOINT ["/tether"]
