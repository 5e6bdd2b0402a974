// Package telemetry sets up what tether reports about itself: OpenTelemetry
// tracing (configured from the standard OTEL_* environment), the Prometheus
// registry and its metrics, and the slog logger. It knows nothing of routing
// rules; the routing layer records into what this package builds.
package telemetry

import (
	"context"
	"fmt"
	"io"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Tracing is a configured tracer provider, or nothing when tracing is off.
type Tracing struct {
	// provider is nil when tracing is off: the request path then skips
	// tracing entirely rather than calling a no-op tracer.
	provider   *sdktrace.TracerProvider
	Propagator propagation.TextMapPropagator
	// Exporter names what spans are sent to ("otlp/http", "otlp/grpc",
	// "stdout"), for the startup log line.
	Exporter string
}

// Tracer returns tether's tracer, or nil when tracing is off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Tracer("github.com/tether-mcp/tether")
}

// Shutdown flushes and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// TracingOptions selects the exporter.
type TracingOptions struct {
	// Stdout, when set (--trace-stdout), writes spans there as JSON.
	Stdout io.Writer
	// Getenv reads the OTEL_* variables.
	Getenv  func(string) string
	Version string
}

// tracingWanted reports whether the environment asks for tracing. Tracing
// is off unless asked for: OTEL_TRACES_EXPORTER=otlp (or console), or an
// OTLP endpoint is configured.
func tracingWanted(getenv func(string) string) (exporter string, on bool) {
	switch strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")) {
	case "none":
		return "", false
	case "console":
		return "console", true
	case "otlp":
		return "otlp", true
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			return "otlp", true
		}
		return "", false
	default:
		return getenv("OTEL_TRACES_EXPORTER"), true
	}
}

// NewTracing builds the tracer provider the options and environment ask
// for. The OTLP exporters read the rest of the standard variables
// themselves (endpoint, headers, TLS, timeout); the SDK reads the sampler
// (OTEL_TRACES_SAMPLER) and the resource (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES).
func NewTracing(ctx context.Context, opts TracingOptions) (*Tracing, error) {
	t := &Tracing{Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	var exp sdktrace.SpanExporter
	var err error
	kind, on := tracingWanted(opts.Getenv)
	switch {
	case opts.Stdout != nil:
		exp, err = stdouttrace.New(stdouttrace.WithWriter(opts.Stdout))
		t.Exporter = "stdout"
	case !on:
		return t, nil
	case kind == "console":
		exp, err = stdouttrace.New()
		t.Exporter = "stdout"
	case kind == "otlp":
		proto := opts.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
		if proto == "" {
			proto = opts.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		switch proto {
		case "", "http/protobuf":
			exp, err = otlptracehttp.New(ctx)
			t.Exporter = "otlp/http"
		case "grpc":
			exp, err = otlptracegrpc.New(ctx)
			t.Exporter = "otlp/grpc"
		default:
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want http/protobuf or grpc", proto)
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER %q: want otlp, console or none", kind)
	}
	if err != nil {
		return nil, fmt.Errorf("trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName("tether"), semconv.ServiceVersion(opts.Version)))
	if err != nil {
		res = resource.Default()
	}
	if opts.Getenv("OTEL_SERVICE_NAME") != "" || opts.Getenv("OTEL_RESOURCE_ATTRIBUTES") != "" {
		if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
			if merged, err := resource.Merge(res, env); err == nil {
				res = merged
			}
		}
	}
	t.provider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return t, nil
}
