package adapter

import (
	"context"
	"net/http"
	"strconv"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/subjects"
)

// requestSpans are one request's spans on this replica: the adapter's
// span, a child of the broker's decision (the traceparent the request
// arrived with), and the engine call, its child, whose traceparent the
// engine receives (docs/architecture.md, "Traces"). A nil *requestSpans is
// a replica that traces nothing.
type requestSpans struct {
	serve, engine trace.Span
	h             nats.Header
}

// traceServe starts the adapter's span of the request h.
func (a *Adapter) traceServe(ctx context.Context, h nats.Header) (context.Context, *requestSpans) {
	ctx = telemetry.Extract(ctx, h)
	ctx, span := a.tracer.Start(ctx, "switchyard.adapter", trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		span.SetAttributes(
			telemetry.AttrReplica.String(a.cfg.Replica),
			telemetry.AttrModel.String(h.Get(subjects.HdrRouteModel)),
			telemetry.AttrTenant.String(h.Get(subjects.HdrTenant)),
			telemetry.AttrRequestID.String(h.Get(subjects.HdrRequestID)),
		)
		if from := h.Get(subjects.HdrResume); from != "" {
			tokens, _ := strconv.Atoi(h.Get(subjects.HdrResumeTokens))
			span.SetAttributes(telemetry.AttrResumeFrom.String(from), telemetry.AttrResumeTokens.Int(tokens))
		}
	}
	return ctx, &requestSpans{serve: span, h: h}
}

// startEngine starts the engine call's span, a GenAI client span named
// after its operation and model.
func (s *requestSpans) startEngine(ctx context.Context, a *Adapter) context.Context {
	if s == nil {
		return ctx
	}
	endpoint := s.h.Get(subjects.HdrEndpoint)
	op := genAIOperation(endpoint)
	model := s.h.Get(subjects.HdrModel)
	ctx, s.engine = a.tracer.Start(ctx, op+" "+model, trace.WithSpanKind(trace.SpanKindClient))
	if s.engine.IsRecording() {
		method := s.h.Get(subjects.HdrMethod)
		if method == "" {
			method = http.MethodPost
		}
		s.engine.SetAttributes(
			telemetry.AttrGenAIOperation.String(op),
			telemetry.AttrGenAIRequestModel.String(model),
			telemetry.AttrGenAIResponseModel.String(a.servedModel(s.h)),
			telemetry.AttrHTTPMethod.String(method),
			telemetry.AttrURLFull.String(a.cfg.EngineURL+endpoint),
		)
		if n, err := strconv.Atoi(s.h.Get(subjects.HdrMaxTokens)); err == nil && n > 0 {
			s.engine.SetAttributes(telemetry.AttrGenAIRequestMaxTokens.Int(n))
		}
	}
	return ctx
}

// engineDone ends the engine call's span with the tokens it used.
func (s *requestSpans) engineDone(used tokens) {
	if s == nil || s.engine == nil {
		return
	}
	if s.engine.IsRecording() {
		s.engine.SetAttributes(
			telemetry.AttrGenAIUsageInputTokens.Int(used.PromptTokens),
			telemetry.AttrGenAIUsageOutputTokens.Int(used.CompletionTokens),
		)
	}
	s.engine.End()
}

// end ends the adapter's span.
func (s *requestSpans) end() {
	if s != nil {
		s.serve.End()
	}
}

// traceEngineHead records the engine's answer to the call (or the failure
// to call) on the call's span in ctx.
func traceEngineHead(ctx context.Context, resp *http.Response, err error) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(telemetry.AttrErrorType.String("call"))
		return
	}
	span.SetAttributes(telemetry.AttrHTTPStatus.Int(resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, strconv.Itoa(resp.StatusCode))
		span.SetAttributes(telemetry.AttrErrorType.String(strconv.Itoa(resp.StatusCode)))
	}
}

// traceEngineBroke marks the call's span in ctx failed: the engine's body
// broke after its head (it died mid-answer, or the call was cancelled).
func traceEngineBroke(ctx context.Context, err error) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.SetStatus(codes.Error, streamError(ctx, err))
		span.SetAttributes(telemetry.AttrErrorType.String("body"))
	}
}

// traceFirstToken records the time to first token on the call's span.
func traceFirstToken(ctx context.Context) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(telemetry.EventFirstToken)
	}
}

// continueTrace writes the engine call's trace context into req, or, on a
// replica that traces nothing, passes on the one the request came with, so
// an engine that traces (vLLM's --otlp-traces-endpoint) continues it.
func (a *Adapter) continueTrace(ctx context.Context, h nats.Header, req *http.Request) {
	if a.tracer != nil {
		telemetry.InjectHTTP(ctx, propagation.HeaderCarrier(req.Header))
		return
	}
	for _, k := range [...]string{subjects.HdrTraceparent, subjects.HdrTracestate} {
		if v := h.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
}

// genAIOperation is the GenAI operation name of an endpoint.
func genAIOperation(endpoint string) string {
	switch endpoint {
	case subjects.EndpointCompletions:
		return "text_completion"
	case subjects.EndpointEmbeddings:
		return "embeddings"
	}
	return "chat"
}
