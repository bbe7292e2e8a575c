package telemetry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/internal/telemetry"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestNewExportsOnlyWithAnEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name     string
		endpoint string
		env      map[string]string
		want     bool // a provider
		err      bool
	}{
		{name: "nothing set", want: false},
		{name: "endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, want: true},
		{name: "traces endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, want: true},
		{name: "flag", endpoint: "http://127.0.0.1:4318", want: true},
		{name: "grpc", endpoint: "http://127.0.0.1:4317", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, want: true},
		{name: "sdk disabled", endpoint: "http://127.0.0.1:4318", env: map[string]string{"OTEL_SDK_DISABLED": "true"}, want: false},
		{name: "sdk not disabled", endpoint: "http://127.0.0.1:4318", env: map[string]string{"OTEL_SDK_DISABLED": "false"}, want: true},
		{name: "exporter none", endpoint: "http://127.0.0.1:4318", env: map[string]string{"OTEL_TRACES_EXPORTER": "none"}, want: false},
		{name: "bad disabled", env: map[string]string{"OTEL_SDK_DISABLED": "maybe"}, err: true},
		{name: "bad protocol", endpoint: "http://127.0.0.1:4318", env: map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: true},
		{name: "bad exporter", endpoint: "http://127.0.0.1:4318", env: map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, err: true},
		{name: "flag not a URL", endpoint: "127.0.0.1:4318", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := telemetry.New(context.Background(), telemetry.Config{Service: telemetry.ServiceBroker, Endpoint: tc.endpoint, Getenv: env(tc.env)})
			if tc.err {
				if !errors.Is(err, telemetry.ErrConfig) {
					t.Fatalf("err %v, want ErrConfig", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Shutdown(context.Background())
			if got := tr.Provider() != nil; got != tc.want {
				t.Fatalf("provider %v, want %v", got, tc.want)
			}
			if tr := telemetry.Tracer(tr.Provider(), "x"); (tr != nil) != tc.want {
				t.Fatalf("tracer %v", tr)
			}
		})
	}
}

func TestHeaderCarriesTheTraceOverNATS(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	h := nats.Header{"traceparent": {tp}, "tracestate": {"a=1"}}
	ctx := telemetry.Extract(context.Background(), h)
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsRemote() || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsSampled() {
		t.Fatalf("extracted %+v", sc)
	}
	out := nats.Header{}
	telemetry.Inject(ctx, out)
	if out.Get("traceparent") != tp || out.Get("tracestate") != "a=1" {
		t.Fatalf("injected %v", out)
	}
	// A malformed traceparent starts nothing.
	if telemetry.HasSpan(telemetry.Extract(context.Background(), nats.Header{"traceparent": {"00-zz"}})) {
		t.Fatal("a malformed traceparent was believed")
	}
}

func TestLogsCarryTheTrace(t *testing.T) {
	var buf bytes.Buffer
	log := telemetry.Logger(slog.New(slog.NewTextHandler(&buf, nil))).With("component", "x")
	h := nats.Header{"traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	log.InfoContext(telemetry.LogContext(context.Background(), h), "resuming")
	log.Info("not about a request")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%q", lines)
	}
	if !strings.Contains(lines[0], "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") || !strings.Contains(lines[0], "span_id=00f067aa0ba902b7") ||
		!strings.Contains(lines[0], "component=x") {
		t.Errorf("a request's line lacks its trace: %s", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("a line about no request has a trace: %s", lines[1])
	}
}
