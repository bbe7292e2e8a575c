package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/switchyard-llm/switchyard/internal/telemetry"
)

// startTracing builds a part's tracer provider from the OTEL_*
// environment (none without an endpoint); stop flushes its spans once the
// part has stopped.
func startTracing(ctx context.Context, service string, log *slog.Logger) (*telemetry.Tracing, func(), error) {
	t, err := telemetry.New(ctx, telemetry.Config{Service: service})
	if err != nil {
		return nil, nil, usageError{err}
	}
	if t != nil {
		log.Info("exporting traces over OTLP", "service", service)
	}
	return t, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := t.Shutdown(ctx); err != nil {
			log.Warn("spans not flushed", "err", err)
		}
	}, nil
}
