package telemetry

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Header is a NATS message's headers as a propagation carrier. NATS header
// keys are case-sensitive and Switchyard writes traceparent and tracestate
// in lowercase, as W3C spells them, so http.Header's canonical lookup would
// miss them.
type Header nats.Header

var _ propagation.TextMapCarrier = Header(nil)

// Get returns the first value of key.
func (h Header) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key, reusing a one-value slice in place.
func (h Header) Set(key, value string) {
	if v := h[key]; len(v) == 1 {
		v[0] = value
		return
	}
	h[key] = []string{value}
}

// Keys lists the keys.
func (h Header) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Every hop speaks the W3C trace context (traceparent, tracestate), the
// engine included.

// Extract returns ctx carrying the remote span context of h's traceparent
// (ctx unchanged when it has none, or an invalid one).
func Extract(ctx context.Context, h nats.Header) context.Context {
	return propagation.TraceContext{}.Extract(ctx, Header(h))
}

// Inject writes the span context of ctx into h as traceparent and
// tracestate; nothing when ctx carries no valid span context.
func Inject(ctx context.Context, h nats.Header) {
	propagation.TraceContext{}.Inject(ctx, Header(h))
}

// InjectHTTP writes the span context of ctx into an HTTP request's headers.
func InjectHTTP(ctx context.Context, h propagation.HeaderCarrier) {
	propagation.TraceContext{}.Inject(ctx, h)
}

// ExtractHTTP returns ctx carrying the remote span context of an HTTP
// request's traceparent.
func ExtractHTTP(ctx context.Context, h propagation.HeaderCarrier) context.Context {
	return propagation.TraceContext{}.Extract(ctx, h)
}

// HasSpan reports whether ctx carries a valid span context.
func HasSpan(ctx context.Context) bool {
	return trace.SpanContextFromContext(ctx).IsValid()
}
