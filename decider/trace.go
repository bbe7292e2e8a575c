package decider

import (
	"context"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/internal/telemetry"
	"github.com/switchyard-llm/switchyard/subjects"
)

// traceDecision records d as the decision span, a child of the sender's
// traceparent, from the decision's start to now, and writes the span's
// context into h as the traceparent the replica's adapter continues
// (docs/architecture.md, "Traces"). A refusal sets the span's status to its
// code. It is called only when the broker has a tracer.
func (dec *Decider) traceDecision(tenant string, h nats.Header, d *policy.Decision, start time.Time) {
	ctx := telemetry.Extract(context.Background(), h)
	ctx, span := dec.tracer.Start(ctx, "switchyard.decide", trace.WithSpanKind(trace.SpanKindInternal), trace.WithTimestamp(start))
	if span.IsRecording() {
		span.SetAttributes(
			telemetry.AttrModel.String(d.Model),
			telemetry.AttrVersion.String(d.Version),
			telemetry.AttrPool.String(d.Pool),
			telemetry.AttrReplica.String(d.Replica),
			telemetry.AttrReason.String(d.Reason),
			telemetry.AttrTenant.String(tenant),
			telemetry.AttrTableRevision.Int64(int64(d.TableRevision)),
			attribute.String("switchyard.broker", dec.cfg.ID),
		)
		if d.Requested != "" && d.Requested != d.Model {
			span.SetAttributes(attribute.String("switchyard.requested", d.Requested))
		}
		if id := h.Get(subjects.HdrRequestID); id != "" {
			span.SetAttributes(telemetry.AttrRequestID.String(id))
		}
		if from := h.Get(subjects.HdrResume); from != "" {
			tokens, _ := strconv.Atoi(h.Get(subjects.HdrResumeTokens))
			span.SetAttributes(telemetry.AttrResumeFrom.String(from), telemetry.AttrResumeTokens.Int(tokens))
		}
		if d.Err != nil {
			span.SetStatus(codes.Error, d.Err.Code)
			span.SetAttributes(telemetry.AttrErrorType.String(d.Err.Code), telemetry.AttrHTTPStatus.Int(d.Err.Status))
		}
	}
	span.End(trace.WithTimestamp(dec.cfg.Now()))
	if d.Err == nil {
		telemetry.Inject(ctx, h)
	}
}
