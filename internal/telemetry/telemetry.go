// Package telemetry sets up a part's OpenTelemetry tracing from the standard
// environment (OTEL_EXPORTER_OTLP_*, OTEL_TRACES_SAMPLER, OTEL_BSP_*,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_SDK_DISABLED) and holds
// what the parts share to continue a trace across NATS: the W3C trace
// context carried in a message's headers, and the span attribute names.
//
// Nothing here is global: New returns a provider that the caller passes to
// each part in its config, and shuts down when the part stops. Without an
// endpoint New returns nil, and a part given no provider makes no spans at
// all (docs/architecture.md, "Traces").
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/internal/buildinfo"
)

// The default service names, one per part (OTEL_SERVICE_NAME overrides).
const (
	ServiceGateway = "switchyard-gateway"
	ServiceBroker  = "switchyard-broker"
	ServiceAdapter = "switchyard-adapter"
)

// ErrConfig is wrapped by every configuration error New returns.
var ErrConfig = errors.New("telemetry: invalid configuration")

// Config says how a part exports its spans. The environment says the rest,
// as the OpenTelemetry specification defines it.
type Config struct {
	// Service is the default service.name (OTEL_SERVICE_NAME wins).
	Service string
	// Endpoint, when set, is the collector's base URL, as
	// OTEL_EXPORTER_OTLP_ENDPOINT (`switchyard dev --otlp-endpoint`); it
	// takes precedence over the environment's endpoints.
	Endpoint string
	// Getenv reads the environment (nil: os.Getenv). The exporters and the
	// SDK read the process environment themselves for the rest.
	Getenv func(string) string
}

// Tracing is a part's tracer provider, exporting over OTLP.
type Tracing struct {
	tp        *sdktrace.TracerProvider
	transport *http.Transport // nil for gRPC
}

// New builds the tracer provider cfg and the environment describe, or
// returns nil when nothing is to be exported: no endpoint is configured,
// OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none. It connects to
// nothing: spans are batched and sent in the background.
func New(ctx context.Context, cfg Config) (*Tracing, error) {
	env := cfg.Getenv
	if env == nil {
		env = os.Getenv
	}
	if disabled, err := boolEnv(env, "OTEL_SDK_DISABLED"); err != nil || disabled {
		return nil, err
	}
	switch x := strings.TrimSpace(env("OTEL_TRACES_EXPORTER")); x {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q: want otlp or none", ErrConfig, x)
	}
	endpoint := cfg.Endpoint
	if endpoint == "" && env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && env("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, nil
	}
	if cfg.Service == "" {
		return nil, fmt.Errorf("%w: no service name", ErrConfig)
	}
	protocol := env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = env("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	t := &Tracing{}
	var client otlptrace.Client
	switch protocol {
	case "", "http/protobuf":
		// The exporter's own client would share one transport across the
		// process; a transport of ours is closed with the provider.
		t.transport = http.DefaultTransport.(*http.Transport).Clone()
		opts := []otlptracehttp.Option{otlptracehttp.WithHTTPClient(&http.Client{Transport: t.transport, Timeout: 10 * time.Second})}
		if endpoint != "" {
			u, err := endpointURL(endpoint)
			if err != nil {
				return nil, err
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(strings.TrimRight(u, "/")+"/v1/traces"))
		}
		client = otlptracehttp.NewClient(opts...)
	case "grpc":
		var opts []otlptracegrpc.Option
		if endpoint != "" {
			u, err := endpointURL(endpoint)
			if err != nil {
				return nil, err
			}
			opts = append(opts, otlptracegrpc.WithEndpointURL(u))
		}
		client = otlptracegrpc.NewClient(opts...)
	default:
		return nil, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_PROTOCOL=%q: want http/protobuf or grpc", ErrConfig, protocol)
	}
	// The exporter connects lazily; New only builds it.
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	// Later options win: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// (WithFromEnv) override the part's defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(
			attribute.String("service.name", cfg.Service),
			attribute.String("service.version", buildinfo.Read().Version),
		),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("%w: resource: %v", ErrConfig, err)
	}
	// No sampler option: the SDK reads OTEL_TRACES_SAMPLER and its
	// argument, and defaults to parentbased_always_on, so a client's
	// sampled flag decides. WithBatcher reads OTEL_BSP_*.
	t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return t, nil
}

// Provider is the tracer provider to put in a part's config; nil for a nil
// Tracing, so a part without an endpoint gets no provider and makes no spans.
func (t *Tracing) Provider() trace.TracerProvider {
	if t == nil {
		return nil
	}
	return t.tp
}

// Shutdown flushes the spans still batched and stops the exporter.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	err := t.tp.Shutdown(ctx)
	if t.transport != nil {
		t.transport.CloseIdleConnections()
	}
	return err
}

// Tracer is the tracer of a part given provider, nil when there is none:
// parts test for nil, so no span is begun, and nothing allocated, on a
// path whose part traces nothing.
func Tracer(provider trace.TracerProvider, name string) trace.Tracer {
	if provider == nil {
		return nil
	}
	return provider.Tracer(name, trace.WithInstrumentationVersion(buildinfo.Read().Version))
}

func endpointURL(s string) (string, error) {
	if !strings.HasPrefix(s, "http://") && !strings.HasPrefix(s, "https://") {
		return "", fmt.Errorf("%w: otlp-endpoint %q: want an http:// or https:// URL", ErrConfig, s)
	}
	return s, nil
}

func boolEnv(env func(string) string, k string) (bool, error) {
	v := strings.TrimSpace(env(k))
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("%w: %s=%q: want true or false", ErrConfig, k, v)
	}
	return b, nil
}
