package stages

import (
	"context"
	"net/http/httptrace"
)

// WithEngineTrace returns ctx with an HTTP client trace that stamps
// EngineWritten and EngineFirstByte of request id: the engine call made
// with ctx is the request's. Only a sampled request should carry it.
func WithEngineTrace(ctx context.Context, r *Recorder, id string) context.Context {
	if r == nil {
		return ctx
	}
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest:         func(httptrace.WroteRequestInfo) { r.Mark(id, EngineWritten) },
		GotFirstResponseByte: func() { r.Mark(id, EngineFirstByte) },
	})
}
