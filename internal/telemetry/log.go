package telemetry

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"
)

// LogHandler wraps h so that a record logged with a context carrying a span
// (slog's *Context methods) has the span's trace_id and span_id: a log line
// about a request finds its trace in the tracing backend.
func LogHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(traceHandler); ok {
		return h
	}
	return traceHandler{h}
}

// Logger is l with LogHandler; nil stays nil.
func Logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	if _, ok := l.Handler().(traceHandler); ok {
		return l
	}
	return slog.New(LogHandler(l.Handler()))
}

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r = r.Clone()
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}

// LogContext is ctx for a log line about the request h: with its span, or,
// in a part that makes no spans, with the trace the request came with, so
// the line has trace_id and span_id either way.
func LogContext(ctx context.Context, h nats.Header) context.Context {
	if HasSpan(ctx) {
		return ctx
	}
	return Extract(ctx, h)
}
