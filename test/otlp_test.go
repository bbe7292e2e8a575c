package test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// collector is an OTLP/HTTP trace receiver speaking the published
// protocol (protobuf on /v1/traces), as an OpenTelemetry collector does.
type collector struct {
	srv *httptest.Server

	mu       sync.Mutex
	posts    int
	spans    []span
	failures []string
}

// span is a received span with the service that sent it.
type span struct {
	service string
	*tracepb.Span
}

func newCollector(t *testing.T) *collector {
	c := &collector{}
	c.srv = httptest.NewServer(http.HandlerFunc(c.serve))
	t.Cleanup(c.srv.Close)
	return c
}

// listenCollector serves the collector on addr.
func listenCollector(t *testing.T, addr string) (*collector, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &collector{}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(c.serve))
	c.srv.Listener.Close()
	c.srv.Listener = ln
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c, nil
}

func (c *collector) serve(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.posts++
	b, err := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	switch {
	case err != nil:
	case r.Method != http.MethodPost || r.URL.Path != "/v1/traces":
		err = fmt.Errorf("%s %s", r.Method, r.URL.Path)
	case r.Header.Get("Content-Type") != "application/x-protobuf":
		err = fmt.Errorf("content type %q", r.Header.Get("Content-Type"))
	default:
		err = proto.Unmarshal(b, &req)
	}
	if err != nil {
		c.failures = append(c.failures, err.Error())
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	for _, rs := range req.ResourceSpans {
		service := stringAttr(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.spans = append(c.spans, span{service, s})
			}
		}
	}
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// trace returns the spans received of the trace id (hex), or what was
// wrong with an export the collector refused.
func (c *collector) trace(id string) ([]span, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.failures) > 0 {
		return nil, errors.New("the collector refused an export: " + strings.Join(c.failures, "; "))
	}
	var out []span
	for _, s := range c.spans {
		if hex.EncodeToString(s.TraceId) == id {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *collector) received() (posts, spans int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts, len(c.spans)
}

func stringAttr(kvs []*commonpb.KeyValue, k string) string {
	for _, kv := range kvs {
		if kv.Key == k {
			return kv.Value.GetStringValue()
		}
	}
	return ""
}

func intAttr(kvs []*commonpb.KeyValue, k string) (int64, bool) {
	for _, kv := range kvs {
		if kv.Key == k {
			if v, ok := kv.Value.GetValue().(*commonpb.AnyValue_IntValue); ok {
				return v.IntValue, true
			}
		}
	}
	return 0, false
}

func hasEvent(s span, name string) *tracepb.Span_Event {
	for _, e := range s.Events {
		if e.Name == name {
			return e
		}
	}
	return nil
}

// find returns the spans of service whose name has the prefix.
func find(spans []span, service, name string) []span {
	var out []span
	for _, s := range spans {
		if s.service == service && strings.HasPrefix(s.Name, name) {
			out = append(out, s)
		}
	}
	return out
}

func childrenOf(spans []span, parent span, service, name string) []span {
	var out []span
	for _, s := range find(spans, service, name) {
		if string(s.ParentSpanId) == string(parent.SpanId) {
			out = append(out, s)
		}
	}
	return out
}

// chain is one attempt's spans: decision, adapter, engine call.
type chain struct{ decision, adapter, engine span }

// chainUnder finds the decision span under parent, and the adapter's and
// the engine call's spans under it, in parent order. The decision is the
// broker's, or the gateway's when it decides (decide, gateway.Decide*):
// never both, never the other's.
func chainUnder(spans []span, parent span, decide string) ([]chain, error) {
	decider, other := "switchyard-gateway", "switchyard-broker"
	if decide == gateway.DecideBroker {
		decider, other = other, decider
	}
	if n := len(childrenOf(spans, parent, other, "switchyard.decide")); n > 0 {
		return nil, fmt.Errorf("%d decision spans of %s under %x, which did not decide", n, other, parent.SpanId)
	}
	var out []chain
	for _, d := range childrenOf(spans, parent, decider, "switchyard.decide") {
		as := childrenOf(spans, d, "switchyard-adapter", "switchyard.adapter")
		if len(as) != 1 {
			return nil, fmt.Errorf("decision %x has %d adapter spans under it", d.SpanId, len(as))
		}
		es := childrenOf(spans, as[0], "switchyard-adapter", "chat ")
		if len(es) != 1 {
			return nil, fmt.Errorf("adapter span %x has %d engine call spans under it", as[0].SpanId, len(es))
		}
		out = append(out, chain{d, as[0], es[0]})
	}
	return out, nil
}

func streamChat(t *testing.T, url, traceparent, body string, n int, after func()) *reading {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Traceparent", traceparent)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	a := newReading()
	a.status = resp.StatusCode
	if err := readStream(resp.Body, a, n, after); err != nil {
		t.Fatal(err)
	}
	return a
}

// checkTimes checks that every span has its start and end, in order.
func checkTimes(t *testing.T, spans ...span) {
	t.Helper()
	for _, s := range spans {
		if s.StartTimeUnixNano == 0 || s.EndTimeUnixNano < s.StartTimeUnixNano {
			t.Errorf("span %s (%s): start %d end %d", s.Name, s.service, s.StartTimeUnixNano, s.EndTimeUnixNano)
		}
	}
}

// TestTracesFollowAStreamedChat runs a streamed chat with a client's
// traceparent through the dev stack exporting to an OTLP collector: one
// trace runs gateway → decision → adapter → engine call in parent order,
// each span carrying its attributes and its times, and the engine received
// the engine call's traceparent, in the client's trace.
func TestTracesFollowAStreamedChat(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	eachDecider(t, func(t *testing.T, decide string) { tracesFollowAStreamedChat(t, decide) })
}

func tracesFollowAStreamedChat(t *testing.T, decide string) {
	col := newCollector(t)
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l8-gen-0"), OTLPEndpoint: col.srv.URL,
		Gateway: gateway.Config{Decide: decide}})

	const traceID, clientSpan = "5bf92f3577b34da6a3ce929d0e0e4737", "00f067aa0ba902b8"
	body := `{"model":"chat-small","max_tokens":20,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
	got := streamChat(t, st.GatewayURL(), "00-"+traceID+"-"+clientSpan+"-01", body, 0, nil)
	if !got.done || got.completed == 0 {
		t.Fatalf("the chat did not complete: %+v", got)
	}

	var spans []span
	var c chain
	var gw span
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		var err error
		if spans, err = col.trace(traceID); err != nil {
			return err
		}
		gws := find(spans, "switchyard-gateway", "POST /v1/chat/completions")
		if len(gws) != 1 {
			return fmt.Errorf("%d gateway spans in the trace (of %d spans)", len(gws), len(spans))
		}
		gw = gws[0]
		chains, err := chainUnder(spans, gw, decide)
		if err != nil {
			return err
		}
		if len(chains) != 1 {
			return fmt.Errorf("%d decisions under the gateway's span", len(chains))
		}
		c = chains[0]
		return nil
	})

	if hex.EncodeToString(gw.ParentSpanId) != clientSpan || gw.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("gateway span: parent %x kind %v; want the client's span %s, server", gw.ParentSpanId, gw.Kind, clientSpan)
	}
	if m, route := stringAttr(gw.Attributes, "http.request.method"), stringAttr(gw.Attributes, "http.route"); m != "POST" || route != "/v1/chat/completions" {
		t.Errorf("gateway span: method %q route %q", m, route)
	}
	if code, _ := intAttr(gw.Attributes, "http.response.status_code"); code != 200 {
		t.Errorf("gateway span: status %d", code)
	}

	d := c.decision.Attributes
	for k, want := range map[string]string{
		"switchyard.model": "llama-3-8b-instruct", "switchyard.replica": "l8-gen-0", "switchyard.tenant": "default",
	} {
		if got := stringAttr(d, k); got != want {
			t.Errorf("decision %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"switchyard.version", "switchyard.pool", "switchyard.reason"} {
		if stringAttr(d, k) == "" {
			t.Errorf("decision lacks %s: %v", k, d)
		}
	}
	if rev, ok := intAttr(d, "switchyard.table_revision"); !ok || rev <= 0 {
		t.Errorf("decision table revision %d, %v", rev, ok)
	}

	e := c.engine
	if e.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("engine call span kind %v", e.Kind)
	}
	if m := stringAttr(e.Attributes, "gen_ai.request.model"); m != "chat-small" {
		t.Errorf("gen_ai.request.model %q", m)
	}
	if m := stringAttr(e.Attributes, "gen_ai.response.model"); m == "" {
		t.Errorf("no gen_ai.response.model: %v", e.Attributes)
	}
	if n, _ := intAttr(e.Attributes, "gen_ai.request.max_tokens"); n != 20 {
		t.Errorf("gen_ai.request.max_tokens %d", n)
	}
	if in, _ := intAttr(e.Attributes, "gen_ai.usage.input_tokens"); in != int64(got.prompt) || in == 0 {
		t.Errorf("gen_ai.usage.input_tokens %d, client saw %d", in, got.prompt)
	}
	if out, _ := intAttr(e.Attributes, "gen_ai.usage.output_tokens"); out != int64(got.completed) {
		t.Errorf("gen_ai.usage.output_tokens %d, client saw %d", out, got.completed)
	}
	if ev := hasEvent(e, "gen_ai.first_token"); ev == nil || ev.TimeUnixNano < e.StartTimeUnixNano || ev.TimeUnixNano > e.EndTimeUnixNano {
		t.Errorf("engine call span: time to first token event %v", ev)
	}
	checkTimes(t, gw, c.decision, c.adapter, c.engine)
	if !(gw.StartTimeUnixNano <= c.decision.StartTimeUnixNano && c.decision.EndTimeUnixNano <= c.adapter.StartTimeUnixNano &&
		c.adapter.StartTimeUnixNano <= e.StartTimeUnixNano) {
		t.Errorf("hops out of order: gateway %d, decision %d-%d, adapter %d, engine %d",
			gw.StartTimeUnixNano, c.decision.StartTimeUnixNano, c.decision.EndTimeUnixNano, c.adapter.StartTimeUnixNano, e.StartTimeUnixNano)
	}

	want := "00-" + traceID + "-" + hex.EncodeToString(e.SpanId) + "-01"
	if tps := st.Engine("l8-gen-0").Traceparents(); len(tps) == 0 || tps[len(tps)-1] != want {
		t.Errorf("the engine received traceparents %q, want %q last", tps, want)
	}
}

// TestResumedStreamIsOneTrace kills the engine under a streamed answer: the
// stream continued on the other replica is one trace, the gateway's span
// records the resume, and the continuation hangs under a resume span
// linked to the attempt before it.
func TestResumedStreamIsOneTrace(t *testing.T) {
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	eachDecider(t, func(t *testing.T, decide string) { resumedStreamIsOneTrace(t, decide) })
}

func resumedStreamIsOneTrace(t *testing.T, decide string) {
	col := newCollector(t)
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DeterministicText: true, OTLPEndpoint: col.srv.URL,
		Gateway: gateway.Config{Decide: decide}})

	const traceID = "6bf92f3577b34da6a3ce929d0e0e4738"
	killed := ""
	got := streamChat(t, st.GatewayURL(), "00-"+traceID+"-00f067aa0ba902b9-01", resumeBody(true, ""), 100, func() {
		for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
			if st.Engine(id).InFlight() > 0 {
				killed = id
				st.Faults(id).Kill()
				t.Cleanup(func() { _ = st.Faults(id).Restart() })
				return
			}
		}
		t.Error("no engine works on the answer")
	})
	if !got.done || got.errCode != "" {
		t.Fatalf("the resumed stream did not complete: status %d, error %q", got.status, got.errCode)
	}
	if killed == "" {
		t.Fatal("no engine was killed")
	}

	var gw, resume span
	var first, second []chain
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		spans, err := col.trace(traceID)
		if err != nil {
			return err
		}
		gws := find(spans, "switchyard-gateway", "POST ")
		if len(gws) != 1 {
			return fmt.Errorf("%d gateway spans in the trace (of %d)", len(gws), len(spans))
		}
		gw = gws[0]
		rs := childrenOf(spans, gw, "switchyard-gateway", "switchyard.resume")
		if len(rs) != 1 {
			return fmt.Errorf("%d resume spans under the gateway's", len(rs))
		}
		resume = rs[0]
		if first, err = chainUnder(spans, gw, decide); err != nil {
			return err
		}
		if second, err = chainUnder(spans, resume, decide); err != nil {
			return err
		}
		if len(first) != 1 || len(second) != 1 {
			return fmt.Errorf("%d attempts under the gateway's span, %d under the resume", len(first), len(second))
		}
		return nil
	})
	ev := hasEvent(gw, "switchyard.resume")
	if ev == nil {
		t.Fatalf("the gateway's span records no resume: %v", gw.Events)
	}
	if from := stringAttr(ev.Attributes, "switchyard.resume.from"); from != killed {
		t.Errorf("resume event from %q, want %q", from, killed)
	}
	if len(resume.Links) != 1 || string(resume.Links[0].SpanId) != string(gw.SpanId) || string(resume.Links[0].TraceId) != string(gw.TraceId) {
		t.Errorf("the resume span links %v, want the first attempt's parent (the gateway span %x)", resume.Links, gw.SpanId)
	}
	if st := first[0].engine.Status; st.GetCode() != tracepb.Status_STATUS_CODE_ERROR || st.GetMessage() == "" {
		t.Errorf("the killed engine's call span has status %v, want the error", st)
	}
	if st := second[0].engine.Status; st.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("the continuation's engine call failed: %v", st)
	}
	if r := stringAttr(first[0].decision.Attributes, "switchyard.replica"); r != killed {
		t.Errorf("first decision chose %q, the engine killed was %q", r, killed)
	}
	d2 := second[0].decision
	if r := stringAttr(d2.Attributes, "switchyard.replica"); r == killed || r == "" {
		t.Errorf("the continuation went to %q (killed: %q)", r, killed)
	}
	if from := stringAttr(d2.Attributes, "switchyard.resume.from"); from != killed {
		t.Errorf("the continuation's decision resumes from %q, want %q", from, killed)
	}
	if n, _ := intAttr(second[0].adapter.Attributes, "switchyard.resume.tokens"); n <= 0 {
		t.Errorf("the continuation's adapter span carries %d resumed tokens", n)
	}
	checkTimes(t, gw, resume, first[0].decision, first[0].adapter, first[0].engine, d2, second[0].adapter, second[0].engine)
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		tps := st.Engine(id).Traceparents()
		if len(tps) == 0 || !strings.Contains(tps[len(tps)-1], traceID) {
			t.Errorf("engine %s received %q, want the client's trace %s", id, tps, traceID)
		}
	}
}

// TestNoTracesExported: with OTEL_SDK_DISABLED=true, or with no endpoint,
// the stack sends the collector nothing, and the engine still receives
// the client's trace (propagation does not need an exporter).
func TestNoTracesExported(t *testing.T) {
	const traceID = "7bf92f3577b34da6a3ce929d0e0e4739"
	body := `{"model":"chat-small","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	run := func(t *testing.T, cfg devstack.Config, col *collector) {
		t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
		cfg.Replicas = devstack.ReplicasNamed("l8-gen-0")
		st := launch(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := st.Ready(ctx); err != nil {
			t.Fatal(err)
		}
		if got := streamChat(t, st.GatewayURL(), "00-"+traceID+"-00f067aa0ba902ba-01", body, 0, nil); !got.done {
			t.Fatalf("chat: status %d, error %q", got.status, got.errCode)
		}
		if tps := st.Engine("l8-gen-0").Traceparents(); len(tps) == 0 || !strings.Contains(tps[len(tps)-1], traceID) {
			t.Errorf("the engine received %q, want the client's trace", tps)
		}
		// Closing the stack flushes whatever the parts batched.
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		if posts, spans := col.received(); posts != 0 || spans != 0 {
			t.Fatalf("the collector received %d exports (%d spans); want none", posts, spans)
		}
	}
	t.Run("sdk disabled", func(t *testing.T) {
		t.Setenv("OTEL_SDK_DISABLED", "true")
		col := newCollector(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", col.srv.URL)
		run(t, devstack.Config{OTLPEndpoint: col.srv.URL}, col)
	})
	t.Run("no endpoint", func(t *testing.T) {
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
		// An exporter built without an endpoint would send to the OTLP
		// default, localhost:4318: the collector listens there.
		col, err := listenCollector(t, "127.0.0.1:4318")
		if err != nil {
			t.Skipf("the OTLP default port is taken: %v", err)
		}
		run(t, devstack.Config{}, col)
	})
}
