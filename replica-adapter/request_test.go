package adapter_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestStream checks the reply protocol of a streamed request end to end:
// accept (0), head (1) with the route headers, data (2…) carrying the
// engine's bytes unchanged, end; the model rewritten to the LoRA adapter;
// trace context passed to the engine; usage published for the tenant.
func TestStream(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(streamSSE(t))
	usage := make(chan *nats.Msg, 4)
	sub, err := e.nc.ChanSubscribe(subjects.New("").UsageAll(), usage)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	e.start(e.config())
	e.waitReady("r-1")

	h := chatHeaders("req-1")
	h.Set(subjects.HdrRouteModel, "sim-model")
	h.Set(subjects.HdrRouteLora, "lora-a")
	h.Set(subjects.HdrRoutePool, "general")
	h.Set(subjects.HdrRouteReason, "lora_affinity")
	h.Set(subjects.HdrTenant, "team-x")
	h.Set(subjects.HdrBroker, "b-1")
	h.Set(subjects.HdrPromptTokens, "10")
	h.Set(subjects.HdrMaxTokens, "20")
	h.Set(subjects.HdrTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	msgs := untilEnd(t, e.request("r-1", h, `{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"hi"}]}`))

	for i, m := range msgs {
		if got := seq(t, m); got != i {
			t.Errorf("message %d has Llm-Seq %d", i, got)
		}
		if m.Header.Get(subjects.HdrKeepalive) != "" {
			t.Errorf("keepalive %d with a fast engine", i)
		}
	}
	if len(msgs) < 4 {
		t.Fatalf("%d messages, want accept, head, data…, end", len(msgs))
	}
	accept, head, end := msgs[0], msgs[1], msgs[len(msgs)-1]
	if accept.Header.Get(subjects.HdrAccepted) != "r-1" || string(accept.Data) != `{"replica":"r-1"}` {
		t.Errorf("accept: %v %s", accept.Header, accept.Data)
	}
	for k, want := range map[string]string{
		subjects.HdrStatus:       "200",
		subjects.HdrContent:      "text/event-stream",
		subjects.HdrRouteModel:   "sim-model",
		subjects.HdrRouteLora:    "lora-a",
		subjects.HdrRoutePool:    "general",
		subjects.HdrRouteReason:  "lora_affinity",
		subjects.HdrRouteReplica: "r-1",
	} {
		if got := head.Header.Get(k); got != want {
			t.Errorf("head %s = %q, want %q", k, got, want)
		}
	}
	if len(head.Data) != 0 {
		t.Errorf("head has a body: %q", head.Data)
	}
	var body bytes.Buffer
	for _, m := range msgs[2 : len(msgs)-1] {
		body.Write(m.Data)
	}
	if want := golden(t, "vllm/chat-stream-lora.sse"); !bytes.Equal(body.Bytes(), want) {
		t.Errorf("relayed body differs from the engine's:\n%s", body.Bytes())
	}
	if len(end.Data) != 0 || end.Header.Get(subjects.HdrError) != "" {
		t.Errorf("end: %v %q", end.Header, end.Data)
	}

	got := e.eng.requests()
	if len(got) != 1 {
		t.Fatalf("engine saw %d requests", len(got))
	}
	if got[0].Body["model"] != "lora-a" {
		t.Errorf("engine got model %v, want the LoRA adapter", got[0].Body["model"])
	}
	if got[0].Header.Get("traceparent") != h.Get(subjects.HdrTraceparent) {
		t.Errorf("traceparent not passed: %q", got[0].Header.Get("traceparent"))
	}

	u := next(t, usage)
	if u.Subject != "llm.usage.team-x" {
		t.Errorf("usage on %s", u.Subject)
	}
	var ev subjects.Usage
	if err := json.Unmarshal(u.Data, &ev); err != nil {
		t.Fatal(err)
	}
	want := subjects.Usage{Tenant: "team-x", Model: "sim-model", Replica: "r-1", RequestID: "req-1",
		PromptTokens: 6, CompletionTokens: 4, ReservedTokens: 30, Broker: "b-1", EnginePromptTokens: 6}
	if ev != want {
		t.Errorf("usage %+v, want %+v", ev, want)
	}
}

// TestNonStreamServedName checks that without a LoRA the model becomes the
// engine's served name, and that a JSON body's usage is reported.
func TestNonStreamServedName(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(golden(t, "vllm/chat-completion.json"))
	})
	usage := make(chan *nats.Msg, 4)
	sub, err := e.nc.ChanSubscribe("llm.usage.acme", usage)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	cfg := e.config()
	cfg.Model = "llama-3-8b-instruct"
	cfg.EngineModel = "meta-llama/Llama-3.1-8B-Instruct"
	e.start(cfg)
	e.waitReady("r-1")

	h := chatHeaders("req-2")
	h.Set(subjects.HdrTenant, "acme")
	msgs := untilEnd(t, e.request("r-1", h, `{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`))
	if msgs[1].Header.Get(subjects.HdrStatus) != "200" || msgs[1].Header.Get(subjects.HdrContent) != "application/json" {
		t.Errorf("head: %v", msgs[1].Header)
	}
	if got := e.eng.requests()[0].Body["model"]; got != cfg.EngineModel {
		t.Errorf("engine got model %v, want %s", got, cfg.EngineModel)
	}
	var ev subjects.Usage
	if err := json.Unmarshal(next(t, usage).Data, &ev); err != nil {
		t.Fatal(err)
	}
	if ev.PromptTokens != 6 || ev.CompletionTokens != 3 || ev.Model != cfg.Model {
		t.Errorf("usage %+v", ev)
	}
}

// TestKeepalive checks that keepalives flow while the engine is silent —
// before its headers and between its headers and its first byte — without
// advancing Llm-Seq, and stop once data flows.
func TestKeepalive(t *testing.T) {
	e := newEnv(t)
	headers, data := make(chan struct{}), make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		if !wait(r, headers) {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if !wait(r, data) {
			return
		}
		_, _ = w.Write([]byte("data: {}\n\n"))
	})
	cfg := e.config()
	cfg.KeepaliveEvery = 20 * time.Millisecond
	e.start(cfg)
	e.waitReady("r-1")
	ch := e.request("r-1", chatHeaders("req-ka"), `{"model":"x"}`)

	if m := next(t, ch); seq(t, m) != 0 || m.Header.Get(subjects.HdrAccepted) == "" {
		t.Fatalf("first message is not the accept: %v", m.Header)
	}
	waitKeepalives := func(wantSeq int) {
		for range 2 {
			m := next(t, ch)
			if m.Header.Get(subjects.HdrKeepalive) != "1" || len(m.Data) != 0 || seq(t, m) != wantSeq {
				t.Fatalf("want a keepalive with seq %d, got %v %q", wantSeq, m.Header, m.Data)
			}
		}
	}
	waitKeepalives(0)
	close(headers)
	var head *nats.Msg
	for head == nil {
		if m := next(t, ch); m.Header.Get(subjects.HdrKeepalive) == "" {
			head = m
		}
	}
	if seq(t, head) != 1 || head.Header.Get(subjects.HdrStatus) != "200" {
		t.Fatalf("want the head at seq 1, got %v", head.Header)
	}
	waitKeepalives(1)
	close(data)
	rest := untilEnd(t, ch)
	var seqs []int
	for _, m := range rest {
		if m.Header.Get(subjects.HdrKeepalive) != "" {
			continue // one may have been on its way as the data came
		}
		seqs = append(seqs, seq(t, m))
	}
	if fmt.Sprint(seqs) != "[2 3]" {
		t.Errorf("data and end seqs %v, want [2 3]", seqs)
	}
	for _, m := range rest[len(rest)-1:] {
		if m.Header.Get(subjects.HdrEOS) != "1" {
			t.Errorf("last message is not the end: %v", m.Header)
		}
	}
}

// TestEngineDiesMidStream checks that a broken engine connection ends the
// stream with Llm-Error, never a clean end.
func TestEngineDiesMidStream(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[]}\n\n"))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler) // drops the connection mid-response
	})
	e.start(e.config())
	e.waitReady("r-1")
	msgs := untilEnd(t, e.request("r-1", chatHeaders("req-die"), `{"model":"x"}`))
	end := msgs[len(msgs)-1]
	if end.Header.Get(subjects.HdrError) == "" {
		t.Fatalf("end without Llm-Error after the engine died: %v", end.Header)
	}
	if seq(t, end) != len(msgs)-1 {
		t.Errorf("end seq %d, want %d", seq(t, end), len(msgs)-1)
	}
}

// TestCancel checks that a cancel on llm.replica.<id>.cancel cancels the
// engine call of the named request.
func TestCancel(t *testing.T) {
	e := newEnv(t)
	engineSawCancel := make(chan struct{})
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {}\n\n"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
		close(engineSawCancel)
	})
	run := e.start(e.config())
	e.waitReady("r-1")
	ch := e.request("r-1", chatHeaders("req-cancel"), `{"model":"x"}`)
	for range 3 { // accept, head, first data
		next(t, ch)
	}
	if run.a.InFlight() != 1 {
		t.Errorf("in flight %d, want 1", run.a.InFlight())
	}
	// A cancel for another request changes nothing.
	cancel := func(id string) {
		if err := e.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").ReplicaCancel("r-1"), Header: nats.Header{subjects.HdrRequestID: {id}}}); err != nil {
			t.Fatal(err)
		}
	}
	cancel("someone-else")
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cancel("req-cancel")
	select {
	case <-engineSawCancel:
	case <-time.After(5 * time.Second):
		t.Fatal("the engine call was not cancelled")
	}
	end := untilEnd(t, ch)
	if got := end[len(end)-1].Header.Get(subjects.HdrError); got != "cancelled" {
		t.Errorf("end Llm-Error %q, want cancelled", got)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := run.a.InFlight(); n != 0 {
			return fmt.Errorf("in flight %d", n)
		}
		return nil
	})
}

// TestEngineUnreachable checks the single head+end with 503 when the engine
// refuses the connection: it did no work, so the gateway may retry elsewhere.
func TestEngineUnreachable(t *testing.T) {
	e := newEnv(t)
	deadURL := "http://" + testkit.Refusing(t)
	cfg := e.config()
	cfg.EngineURL = deadURL
	e.start(cfg)
	msgs := untilEnd(t, e.request("r-1", chatHeaders("req-dead"), `{"model":"x"}`))
	if len(msgs) != 2 {
		t.Fatalf("%d messages, want accept and one head+end", len(msgs))
	}
	m := msgs[1]
	if seq(t, m) != 1 || m.Header.Get(subjects.HdrStatus) != "503" || m.Header.Get(subjects.HdrEOS) != "1" || m.Header.Get(subjects.HdrRetryAfter) == "" {
		t.Errorf("head+end: %v", m.Header)
	}
	var eb subjects.ErrorBody
	if err := json.Unmarshal(m.Data, &eb); err != nil {
		t.Fatalf("body %q: %v", m.Data, err)
	}
	if eb.Error.Code != subjects.CodeUpstreamError || eb.Error.Type != "server_error" {
		t.Errorf("error body %+v", eb.Error)
	}
}

// TestEngineErrors checks that engine errors pass their status through and
// are translated into the OpenAI shape (vLLM's integer code becomes a string
// code), with retry hints kept; a 404 saying the engine does not serve the
// model or endpoint the replica registered is the replica's fault, a 503
// the gateway retries elsewhere.
func TestEngineErrors(t *testing.T) {
	e := newEnv(t)
	e.start(e.config())
	e.waitReady("r-1")
	tests := []struct {
		name       string
		status     int
		body       string
		wantStatus int
		wantCode   string
		retryAfter string
	}{
		{"model not served", 404, string(golden(t, "vllm/error-unknown-model.json")), 503, subjects.CodeUpstreamError, "1"},
		{"endpoint not served", 404, `{"detail":"Not Found"}`, 503, subjects.CodeUpstreamError, "1"},
		{"stored response gone", 404, `{"error":{"message":"Response with id 'resp_1' not found.","type":"invalid_request_error","code":404}}`, 404, subjects.CodeModelNotFound, ""},
		{"429", 429, `{"error":{"message":"slow down","type":"rate_limit","code":429}}`, 429, subjects.CodeRateLimit, "2"},
		{"503", 503, `{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}`, 503, subjects.CodeModelLoading, ""},
		{"500", 500, `Internal Server Error`, 500, subjects.CodeUpstreamError, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.body))
			})
			// Each its own id: the one before may still be in hand when
			// its end has gone out, and a request in hand again is dropped.
			msgs := untilEnd(t, e.request("r-1", chatHeaders(fmt.Sprintf("req-err-%d", i)), `{"model":"x"}`))
			// The error arrives whole: accept, then one head with the body and the end.
			if len(msgs) != 2 {
				t.Fatalf("%d messages, want accept and a head with body and end", len(msgs))
			}
			head := msgs[1]
			if head.Header.Get(subjects.HdrStatus) != fmt.Sprint(tt.wantStatus) || head.Header.Get(subjects.HdrRetryAfter) != tt.retryAfter {
				t.Errorf("head %v", head.Header)
			}
			var eb struct {
				Error struct {
					Message string `json:"message"`
					Code    any    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(msgs[1].Data, &eb); err != nil {
				t.Fatalf("body %q: %v", msgs[1].Data, err)
			}
			if eb.Error.Code != tt.wantCode || eb.Error.Message == "" {
				t.Errorf("error %+v, want code %q", eb.Error, tt.wantCode)
			}
		})
	}
}

// TestBadRequest checks the adapter's own 400s, after the accept.
func TestBadRequest(t *testing.T) {
	e := newEnv(t)
	e.start(e.config())
	for name, tc := range map[string]struct {
		endpoint, body string
	}{
		"no endpoint":       {"", `{"model":"x"}`},
		"path escape":       {"/v1/../admin", `{"model":"x"}`},
		"body not a object": {subjects.EndpointChat, `[1,2]`},
	} {
		t.Run(name, func(t *testing.T) {
			h := chatHeaders("req-bad-" + strings.ReplaceAll(name, " ", "-")) // an id of its own: the one before may still be in hand
			h.Set(subjects.HdrEndpoint, tc.endpoint)
			msgs := untilEnd(t, e.request("r-1", h, tc.body))
			if len(msgs) != 2 || msgs[1].Header.Get(subjects.HdrStatus) != "400" || !strings.Contains(string(msgs[1].Data), subjects.CodeInvalidRequest) {
				t.Errorf("want accept then a 400 head+end, got %d messages, last %v %s", len(msgs), msgs[len(msgs)-1].Header, msgs[len(msgs)-1].Data)
			}
		})
	}
	if n := len(e.eng.requests()); n != 0 {
		t.Errorf("the engine saw %d bad requests", n)
	}
}

// TestDeadline checks that Llm-Deadline bounds the engine call: an engine
// still silent at the deadline gets a 504 head+end.
func TestDeadline(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	})
	e.start(e.config())
	h := chatHeaders("req-late")
	h.Set(subjects.HdrDeadline, strconv.FormatInt(time.Now().Add(50*time.Millisecond).UnixMilli(), 10))
	msgs := untilEnd(t, e.request("r-1", h, `{"model":"x"}`))
	last := msgs[len(msgs)-1]
	if len(msgs) != 2 || last.Header.Get(subjects.HdrStatus) != "504" || !strings.Contains(string(last.Data), subjects.CodeUpstreamTimeout) {
		t.Errorf("want accept and a 504 head+end, got %d messages, last %v %s", len(msgs), last.Header, last.Data)
	}
}

// TestReplyInHeader: a request forwarded without a reply is answered on its
// Llm-Reply (a direct tenant's service-import reply), and only inside the
// reply space.
func TestReplyInHeader(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(streamSSE(t))
	e.start(e.config())
	e.waitReady("r-1")
	send := func(reply string) <-chan *nats.Msg {
		ch := make(chan *nats.Msg, 256)
		sub, err := e.nc.ChanSubscribe(reply, ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
		h := chatHeaders("req-" + reply)
		h.Set(subjects.HdrReply, reply)
		if err := e.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").Replica("r-1"), Header: h,
			Data: []byte(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)}); err != nil {
			t.Fatal(err)
		}
		return ch
	}
	outside := send("llm.heartbeat.r-2")
	msgs := untilEnd(t, send("_R_.abc.def"))
	if len(msgs) < 3 || msgs[0].Header.Get(subjects.HdrAccepted) != "r-1" {
		t.Fatalf("answer on Llm-Reply: %d messages", len(msgs))
	}
	// Both requests were sent before the answered one ended, and the
	// adapter takes them in order: the first was dropped, not delayed.
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-outside:
		t.Errorf("answered outside the reply space on %s: %v", m.Subject, m.Header)
	default:
	}
}

// A body past the length joined into one buffer goes to the engine part by
// part, and arrives whole: every member rewritten or kept, its length
// declared (not chunked).
func TestALongBodyReachesTheEngineWhole(t *testing.T) {
	e := newEnv(t)
	e.eng.handle(streamSSE(t))
	e.start(e.config())
	e.waitReady("r-1")
	prompt := strings.Repeat("a long pasted document, ", 4096) // ~96 KiB
	h := chatHeaders("req-long")
	h.Set(subjects.HdrMaxTokens, "20")
	untilEnd(t, e.request("r-1", h, `{"model":"chat-small","stream":true,"messages":[{"role":"user","content":"`+prompt+`"}],"max_tokens":900}`))
	got := e.eng.requests()
	if len(got) != 1 {
		t.Fatalf("engine saw %d requests", len(got))
	}
	b := got[0].Body
	msgs, _ := b["messages"].([]any)
	if len(msgs) != 1 || msgs[0].(map[string]any)["content"] != prompt {
		t.Fatalf("the prompt did not arrive whole (%d messages)", len(msgs))
	}
	if b["max_tokens"] != float64(20) || b["stream"] != true || b["model"] == "chat-small" {
		t.Errorf("engine got model %v, max_tokens %v, stream %v", b["model"], b["max_tokens"], b["stream"])
	}
	if cl := got[0].Header.Get("Content-Length"); cl == "" || got[0].Header.Get("Transfer-Encoding") != "" {
		t.Errorf("Content-Length %q, Transfer-Encoding %q: want the length declared", cl, got[0].Header.Get("Transfer-Encoding"))
	}
}
