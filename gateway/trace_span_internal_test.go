package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestServerSpan: the gateway's span continues the client's traceparent,
// takes its place on the request (so the NATS headers name it), and
// records the status the handler wrote; without a tracer the handler is
// the one given.
func TestServerSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	g := &Gateway{tracer: tp.Tracer("test")}
	var seen string
	h := g.traced("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		seen = r.Header.Get("Traceparent")
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	h(httptest.NewRecorder(), req)

	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	s := spans[0]
	if s.Name() != "POST /v1/chat/completions" || s.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("span %q, parent %v", s.Name(), s.Parent().SpanID())
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + s.SpanContext().SpanID().String() + "-01"
	if seen != want || !validTraceparent(seen) {
		t.Errorf("the request carries %q, want the gateway span's %q", seen, want)
	}
	status := 0
	for _, kv := range s.Attributes() {
		if kv.Key == "http.response.status_code" {
			status = int(kv.Value.AsInt64())
		}
	}
	if status != http.StatusServiceUnavailable || s.Status().Code != codes.Error {
		t.Errorf("status %d, span status %v", status, s.Status())
	}

	plain := &Gateway{}
	called := false
	plain.traced("/x", func(http.ResponseWriter, *http.Request) { called = true })(httptest.NewRecorder(), req)
	if !called || len(rec.Ended()) != 1 {
		t.Error("a gateway without a tracer made a span or skipped the handler")
	}
}
