package gateway

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/internal/telemetry"
)

// traced gives an API route the gateway's server span (HTTP semantic
// conventions), continuing the client's traceparent. The span's context
// replaces the client's traceparent on the request, so the headers the
// request carries over NATS name the gateway's span as the decision's
// parent (docs/architecture.md, "Traces"). Without a tracer the handler is
// returned as it is: a gateway that traces nothing pays nothing.
func (g *Gateway) traced(route string, next http.HandlerFunc) http.HandlerFunc {
	if g.tracer == nil {
		return next
	}
	return func(w http.ResponseWriter, r *http.Request) {
		ctx := telemetry.ExtractHTTP(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := g.tracer.Start(ctx, r.Method+" "+route, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		defer func() {
			// A stream cut for a client that stopped reading ends by
			// aborting the connection (rule.go, conclude): the span
			// says so before the abort goes on up to net/http.
			if p := recover(); p != nil {
				span.SetStatus(codes.Error, "connection aborted")
				span.SetAttributes(telemetry.AttrErrorType.String("connection_aborted"))
				panic(p)
			}
		}()
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		if span.IsRecording() {
			span.SetAttributes(
				telemetry.AttrHTTPMethod.String(r.Method),
				telemetry.AttrHTTPRoute.String(route),
				telemetry.AttrURLPath.String(r.URL.Path),
				telemetry.AttrURLScheme.String(scheme),
				telemetry.AttrServerAddress.String(r.Host),
				telemetry.AttrNetworkVersion.String(protocolVersion(r)),
			)
			if ua := r.UserAgent(); ua != "" {
				span.SetAttributes(telemetry.AttrUserAgent.String(ua))
			}
		}
		telemetry.InjectHTTP(ctx, propagation.HeaderCarrier(r.Header))
		sw := &statusWriter{ResponseWriter: w}
		next(sw, r.WithContext(ctx))
		if !span.IsRecording() {
			return
		}
		status := sw.status
		if status == 0 {
			status = http.StatusOK
		}
		span.SetAttributes(telemetry.AttrHTTPStatus.Int(status))
		if id := w.Header().Get("X-Request-Id"); id != "" {
			span.SetAttributes(attribute.String("switchyard.client_request_id", id))
		}
		if r := w.Header().Get("X-Switchyard-Replica"); r != "" {
			span.SetAttributes(telemetry.AttrReplica.String(r))
		}
		if status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(status))
			span.SetAttributes(telemetry.AttrErrorType.Int(status))
		}
	}
}

// traceAttempt marks, on the gateway's span in ctx, that the request goes
// to another replica (event: telemetry.EventRetry before the first byte,
// telemetry.EventResume after it), and gives that attempt a span of its
// own, a child of the gateway's span linked to the attempt before it, whose
// context the attempt's traceparent carries: the new decision, adapter and
// engine call stay in the one trace. The returned func ends the span.
func (g *Gateway) traceAttempt(ctx context.Context, u *upstream, event string, res result, carried int) func() {
	if g.tracer == nil {
		return func() {}
	}
	server := trace.SpanFromContext(ctx)
	if !server.IsRecording() {
		return func() {}
	}
	attrs := []attribute.KeyValue{
		telemetry.AttrCause.String(res.kind.cause()),
		telemetry.AttrResumeFrom.String(res.replica),
	}
	if event == telemetry.EventResume {
		attrs = append(attrs, telemetry.AttrResumeTokens.Int(carried))
	}
	server.AddEvent(event, trace.WithAttributes(attrs...))
	prev := trace.SpanContextFromContext(telemetry.Extract(context.Background(), u.hdr))
	_, span := g.tracer.Start(ctx, event, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...), trace.WithLinks(trace.Link{SpanContext: prev}))
	next := trace.ContextWithSpan(ctx, span)
	telemetry.Inject(next, u.hdr)
	return func() { span.End() }
}

// statusWriter remembers the status the handler wrote, for the span.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (Flush and the
// write deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func protocolVersion(r *http.Request) string {
	switch r.ProtoMajor {
	case 2:
		return "2"
	case 3:
		return "3"
	}
	if r.ProtoMinor == 0 {
		return "1.0"
	}
	return "1.1"
}

// clientTraceparent is the client's traceparent when it is valid W3C, else
// a new trace's.
func clientTraceparent(r *http.Request) string {
	if tp := r.Header.Get("Traceparent"); validTraceparent(tp) {
		return tp
	}
	return newTraceparent()
}
