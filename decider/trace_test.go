package decider

import (
	"context"
	"maps"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/switchyard-llm/switchyard/subjects"
)

const clientTrace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func tracedBroker(tb testing.TB, opts ...sdktrace.TracerProviderOption) *Decider {
	b := newTestBroker(tb, 8, time.Unix(1_800_000_000, 0))
	tp := sdktrace.NewTracerProvider(opts...)
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	b.tracer = tp.Tracer("test")
	return b
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestDecisionSpan: the decision is a child of the gateway's traceparent,
// names its choice, and its context is the traceparent forwarded to the
// replica; a refusal's span has the error status with its code and
// forwards nothing.
func TestDecisionSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	b := tracedBroker(t, sdktrace.WithSpanProcessor(rec))
	s := NewScratch()
	h := gatewayHeaders()
	h[subjects.HdrTraceparent] = []string{clientTrace}
	a := b.Handle(s, "llm.gw.default", "_INBOX.gw.1", h, nil)
	msg := a.Route.Msg
	if a.Do != DoForward {
		t.Fatalf("not forwarded: %+v", a)
	}
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	d := spans[0]
	if d.Parent().SpanID().String() != "00f067aa0ba902b7" || d.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("decision span's parent %v, trace %v", d.Parent().SpanID(), d.SpanContext().TraceID())
	}
	at := attrs(d)
	want := map[attribute.Key]string{
		"switchyard.model":   msg.Header.Get(subjects.HdrRouteModel),
		"switchyard.version": msg.Header.Get(subjects.HdrRouteVersion),
		"switchyard.pool":    msg.Header.Get(subjects.HdrRoutePool),
		"switchyard.replica": msg.Header.Get(subjects.HdrRouteReplica),
		"switchyard.reason":  msg.Header.Get(subjects.HdrRouteReason),
		"switchyard.tenant":  "default",
	}
	for k, v := range want {
		if at[k].AsString() != v || v == "" {
			t.Errorf("%s = %q, want %q", k, at[k].AsString(), v)
		}
	}
	if rev := at["switchyard.table_revision"].AsInt64(); strconv.FormatInt(rev, 10) != msg.Header.Get(subjects.HdrRouteTableRev) {
		t.Errorf("table revision %d, header %s", rev, msg.Header.Get(subjects.HdrRouteTableRev))
	}
	if d.StartTime().IsZero() || d.EndTime().Before(d.StartTime()) {
		t.Errorf("times %v %v", d.StartTime(), d.EndTime())
	}
	wantTP := "00-" + d.SpanContext().TraceID().String() + "-" + d.SpanContext().SpanID().String() + "-01"
	if got := msg.Header.Get(subjects.HdrTraceparent); got != wantTP {
		t.Errorf("forwarded traceparent %q, want the decision's %q", got, wantTP)
	}

	h = gatewayHeaders()
	h[subjects.HdrTraceparent] = []string{clientTrace}
	h.Set(subjects.HdrModel, "no-such-model")
	if a := b.Handle(s, "llm.gw.default", "_INBOX.gw.2", h, nil); a.Do != DoRefuse {
		t.Fatalf("an unknown model was not refused: %+v", a)
	}
	spans = rec.Ended()
	r := spans[len(spans)-1]
	if r.Status().Code != codes.Error || r.Status().Description != subjects.CodeModelNotFound {
		t.Errorf("refusal's span status %+v", r.Status())
	}
}

// BenchmarkRoutePathTraced is BenchmarkRoutePath (8 candidates) with every
// decision sampled into a span, exported nowhere: the decision span's own
// cost. BenchmarkRoutePath is the path with tracing off.
func BenchmarkRoutePathTraced(b *testing.B) {
	br := tracedBroker(b, sdktrace.WithSampler(sdktrace.AlwaysSample()))
	sent := gatewayHeaders()
	sent[subjects.HdrTraceparent] = []string{clientTrace}
	h := maps.Clone(sent)
	s := NewScratch()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h[subjects.HdrConversation][0] = strconv.Itoa(i & 1023)
		h[subjects.HdrTraceparent] = []string{clientTrace}
		if a := br.Handle(s, "llm.gw.default", "_INBOX.gw.1", h, nil); a.Do != DoForward {
			b.Fatal("not forwarded")
		}
		for k := range h {
			if sent[k] == nil {
				delete(h, k)
			}
		}
		for len(br.out) > 0 {
			<-br.out
		}
	}
}
