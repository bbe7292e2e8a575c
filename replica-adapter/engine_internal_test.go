package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/subjects/reply"
)

// replyStream is a stream whose accept went out (the next message is the
// head, seq 1) and a subscription that reads what it sends.
func replyStream(t *testing.T) (*stream, *nats.Subscription) {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	return &stream{nc: nc, reply: inbox, next: 1}, sub
}

// sent reads the n messages st sent, then checks nothing more came.
func sent(t *testing.T, sub *nats.Subscription, n int) []*nats.Msg {
	t.Helper()
	var out []*nats.Msg
	for range n {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("message %d of %d: %v", len(out)+1, n, err)
		}
		out = append(out, m)
	}
	if m, err := sub.NextMsg(20 * time.Millisecond); err == nil {
		t.Fatalf("unexpected message %v %q", m.Header, m.Data)
	}
	return out
}

func TestEngineRequest(t *testing.T) {
	a := &Adapter{cfg: Config{EngineURL: "http://engine:8000", EngineModel: "served"}}
	body := []byte(`{"model":"chat-small","messages":[]}`)
	tests := []struct {
		name      string
		h         nats.Header
		wantErr   int
		wantModel string
	}{
		{"served name", nats.Header{subjects.HdrEndpoint: {"/v1/chat/completions"}}, 0, "served"},
		{"adapter", nats.Header{subjects.HdrEndpoint: {"/v1/chat/completions"}, subjects.HdrRouteLora: {"acme-lora"}}, 0, "acme-lora"},
		{"no endpoint", nats.Header{}, 400, ""},
		{"escaping endpoint", nats.Header{subjects.HdrEndpoint: {"/v1/../admin"}}, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.h.Set(subjects.HdrTraceparent, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
			req, e := a.engineRequest(context.Background(), tt.h, body)
			if tt.wantErr != 0 {
				if e == nil || e.Status != tt.wantErr {
					t.Fatalf("error %v, want status %d", e, tt.wantErr)
				}
				return
			}
			if e != nil {
				t.Fatal(e)
			}
			b, _ := io.ReadAll(req.Body)
			if req.URL.String() != "http://engine:8000/v1/chat/completions" || !strings.Contains(string(b), `"model":"`+tt.wantModel+`"`) ||
				req.Header.Get("Traceparent") == "" {
				t.Errorf("request %s %s %v", req.URL, b, req.Header)
			}
		})
	}
}

// TestClientKVTransferParamsNeverReachTheEngine: kv_transfer_params would
// have a KV-transfer engine pull blocks from a host the client names, or
// hold blocks nobody pulls; only a prefill leg's own reach the engine.
func TestClientKVTransferParamsNeverReachTheEngine(t *testing.T) {
	a := &Adapter{cfg: Config{EngineURL: "http://engine:8000", EngineModel: "served"}}
	h := nats.Header{subjects.HdrEndpoint: {"/v1/chat/completions"}}
	forged := `{"do_remote_prefill":true,"remote_host":"attacker.example","remote_port":5600,"remote_block_ids":[1]}`
	read := func(req *http.Request) map[string]json.RawMessage {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.NewDecoder(req.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, body := range []string{
		`{"model":"m","messages":[],"kv_transfer_params":` + forged + `}`,
		`{"kv_transfer_params":` + forged + `,"model":"m","messages":[],"kv_transfer_params":` + forged + `}`,
	} {
		req, e := a.engineRequest(context.Background(), h, []byte(body))
		if e != nil {
			t.Fatal(e)
		}
		if got := read(req)["kv_transfer_params"]; string(got) != "null" {
			t.Errorf("%s: the engine got kv_transfer_params %s", body, got)
		}
	}
	// A body without them is sent without them, and a leg's are written.
	req, e := a.engineRequest(context.Background(), h, []byte(`{"model":"m","messages":[]}`))
	if e != nil {
		t.Fatal(e)
	}
	if _, has := read(req)["kv_transfer_params"]; has {
		t.Error("kv_transfer_params added to a body without them")
	}
	leg := `{"do_remote_prefill":true,"remote_engine_id":"e1"}`
	req, e = a.engineRequestKV(context.Background(), h, []byte(`{"model":"m","kv_transfer_params":`+forged+`}`), []byte(leg))
	if e != nil {
		t.Fatal(e)
	}
	if got := read(req)["kv_transfer_params"]; string(got) != leg {
		t.Errorf("a decode leg's engine got kv_transfer_params %s, want the leg's", got)
	}
}

func TestEngineHeadAnswersAnEngineError(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/ok" {
			_, _ = io.WriteString(w, `{}`)
			return
		}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"object":"error","message":"queue full","code":429}`)
	}))
	defer eng.Close()
	m, err := newMetrics(nil, "r-0")
	if err != nil {
		t.Fatal(err)
	}
	a := &Adapter{cfg: Config{Replica: "r-0"}, client: eng.Client(), metrics: m}
	st, sub := replyStream(t)
	ctx := context.Background()
	ok, _ := http.NewRequestWithContext(ctx, http.MethodPost, eng.URL+"/v1/ok", nil)
	resp := a.engineHead(ctx, st, nats.Header{}, ok)
	if resp == nil || resp.StatusCode != 200 {
		t.Fatalf("a success is the caller's to relay, got %v", resp)
	}
	resp.Body.Close()
	sent(t, sub, 0)

	busy, _ := http.NewRequestWithContext(ctx, http.MethodPost, eng.URL+"/v1/busy", nil)
	if resp := a.engineHead(ctx, st, nats.Header{}, busy); resp != nil {
		t.Fatal("an engine error must be answered here")
	}
	got := sent(t, sub, 1)[0]
	if got.Header.Get(subjects.HdrStatus) != "429" || got.Header.Get(subjects.HdrEOS) == "" || !strings.Contains(string(got.Data), "queue full") {
		t.Errorf("engine error relayed as %v %q, want one message: 429, the message, the end", got.Header, got.Data)
	}
}

func TestAnswerInline(t *testing.T) {
	hd := func() reply.Frame { return reply.Frame{Kind: reply.Head, Status: 200} }
	t.Run("fits", func(t *testing.T) {
		st, sub := replyStream(t)
		scan := usageScanner{}
		next, err := answerInline(context.Background(), st, hd(), strings.NewReader(`{"usage":{"prompt_tokens":3,"completion_tokens":2}}`), 1024, &scan)
		if next != phaseEnded || err != nil {
			t.Fatalf("phase %d, err %v; want ended", next, err)
		}
		m := sent(t, sub, 1)[0]
		if m.Header.Get(subjects.HdrSeq) != "1" || m.Header.Get(subjects.HdrEOS) == "" || len(m.Data) == 0 {
			t.Errorf("one message with head, body and end, got %v %q", m.Header, m.Data)
		}
		if u, ok := scan.Finish(); !ok || u.CompletionTokens != 2 {
			t.Errorf("usage %+v %v", u, ok)
		}
	})
	t.Run("too large", func(t *testing.T) {
		st, sub := replyStream(t)
		scan := usageScanner{}
		body := strings.NewReader(strings.Repeat("x", 100))
		next, err := answerInline(context.Background(), st, hd(), body, 10, &scan)
		if next != phaseNext || err != nil {
			t.Fatalf("phase %d, err %v; want the stream phase next", next, err)
		}
		ms := sent(t, sub, 2)
		if ms[0].Header.Get(subjects.HdrStatus) != "200" || len(ms[0].Data) != 0 || len(ms[1].Data) != 11 {
			t.Errorf("head then the first 11 bytes, got %v %d bytes, %d bytes", ms[0].Header, len(ms[0].Data), len(ms[1].Data))
		}
		if body.Len() != 89 {
			t.Errorf("%d bytes left for the stream phase, want 89", body.Len())
		}
	})
	t.Run("broken", func(t *testing.T) {
		st, sub := replyStream(t)
		broke := errors.New("connection reset")
		next, err := answerInline(context.Background(), st, hd(), iotest.ErrReader(broke), 10, &usageScanner{})
		if next != phaseEnded || !errors.Is(err, broke) {
			t.Fatalf("phase %d, err %v; want ended with the read error", next, err)
		}
		ms := sent(t, sub, 2)
		if !strings.Contains(ms[1].Header.Get(subjects.HdrError), "connection reset") {
			t.Errorf("end %v, want Llm-Error", ms[1].Header)
		}
	})
}

func TestRelayStream(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n"
	for _, tt := range []struct {
		name    string
		body    io.Reader
		wantErr string
	}{
		{"whole", strings.NewReader(sse), ""},
		{"broken", io.MultiReader(strings.NewReader(sse[:20]), iotest.ErrReader(errors.New("connection reset"))), "connection reset"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st, sub := replyStream(t)
			st.startKeepalive(time.Hour)
			firsts := 0
			scan := usageScanner{sse: true}
			ended, err := relayStream(context.Background(), st, iotest.OneByteReader(tt.body), make([]byte, 64), &scan, func() { firsts++ }, nil)
			if (err == nil) != (tt.wantErr == "") || ended != (tt.wantErr == "") {
				t.Fatalf("err %v, ended %v, want %q", err, ended, tt.wantErr)
			}
			n := len(sse)
			if tt.wantErr != "" {
				n = 20
			}
			ms := sent(t, sub, n+1)
			var got strings.Builder
			for i, m := range ms[:n] {
				if m.Header.Get(subjects.HdrSeq) != strconv.Itoa(i+1) {
					t.Fatalf("message %d has seq %s", i, m.Header.Get(subjects.HdrSeq))
				}
				got.Write(m.Data)
			}
			end := ms[n]
			if got.String() != sse[:n] || end.Header.Get(subjects.HdrEOS) == "" || !strings.Contains(end.Header.Get(subjects.HdrError), tt.wantErr) {
				t.Errorf("relayed %q then %v", got.String(), end.Header)
			}
			if firsts != 1 || st.kaOn {
				t.Errorf("first byte seen %d times, keepalive on %v; want once, off", firsts, st.kaOn)
			}
		})
	}
}

// TestUnreachableMarkEndsOnlyByWhatBeganAfterIt: an answer (or a scrape)
// begun before a request failed to connect (the last one, when several
// did) says nothing of the engine since, and must not end the mark.
func TestUnreachableMarkEndsOnlyByWhatBeganAfterIt(t *testing.T) {
	var l loadState
	if l.clearUnreachable(1) {
		t.Fatal("ended a mark never set")
	}
	l.unreachableAt.Store(100)
	if l.clearUnreachable(50) || l.clearUnreachable(100) {
		t.Fatal("an answer begun before the mark ended it")
	}
	if !l.clearUnreachable(150) || l.unreachableAt.Load() != 0 {
		t.Fatal("an answer begun after the mark did not end it")
	}
	if l.clearUnreachable(200) {
		t.Fatal("ended twice")
	}
	// A later failure moves the mark on: an answer sent between the two
	// failures does not end it.
	if !l.markUnreachable(300) || l.markUnreachable(400) || l.markUnreachable(350) || l.unreachableAt.Load() != 400 {
		t.Fatalf("mark at %d, want 400, new only the first time", l.unreachableAt.Load())
	}
	if l.clearUnreachable(380) || !l.clearUnreachable(450) {
		t.Fatal("the mark did not follow the last failure")
	}
}
