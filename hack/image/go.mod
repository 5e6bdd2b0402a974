module github.com/tether-mcp/tether/hack/image

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/tether-mcp/tether v0.0.0-00010101000000-000000000000
)

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.25.0 // indirect
)

// The builder reads the Dockerfile with the reader of this checkout
// (internal/dockerfile), the one cmd/tether's Dockerfile test uses.
replace github.com/tether-mcp/tether => ../..
