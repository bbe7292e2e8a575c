package test

import (
	"bytes"
	"context"
	be "encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// simCaptures holds what llm-d's vLLM simulator answered and published
// (testdata/llm-d-inference-sim/SOURCES.md).
const simCaptures = "testdata/llm-d-inference-sim"

// simTopic is the topic the simulator published its events on.
const simTopic = "kv@127.0.0.1:8123@sim-model"

// recordedSim serves the simulator's captured answers: /health, /metrics,
// /v1/models, the chat completion and the /tokenize answer of the captured
// prompt. A /tokenize of any other messages is a 400, so the adapter is
// seen asking for the captured prompt's ids.
func recordedSim(t *testing.T) *httptest.Server {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(simCaptures, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	metrics, models, chat, tokens := read("metrics.txt"), read("models.json"), read("chat-completion.json"), read("tokenize.json")
	var want struct{ Messages json.RawMessage }
	if err := json.Unmarshal(read("tokenize-request.json"), &want); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(metrics)
	})
	answer := func(b []byte) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
		}
	}
	mux.HandleFunc("GET /v1/models", answer(models))
	mux.HandleFunc("POST /v1/chat/completions", answer(chat))
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		var got struct{ Messages json.RawMessage }
		b, _ := io.ReadAll(r.Body)
		if json.Unmarshal(b, &got) != nil || !jsonEqual(got.Messages, want.Messages) {
			http.Error(w, "not the captured prompt", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(tokens)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// feedAddr is the address replica id's adapter listens on for its
// engine's events, once it does.
func feedAddr(t *testing.T, st *devstack.Stack, id string) string {
	t.Helper()
	var addr string
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if addr = st.KVEventsAddr(id); addr == "" {
			return fmt.Errorf("%s's adapter does not listen for its engine's events yet", id)
		}
		return nil
	})
	return addr
}

// simFeed publishes captured messages to an adapter's bound feed, as the
// simulator dials out to it.
type simFeed struct {
	t   *testing.T
	pub zmq4.Socket
}

func dialSimFeed(t *testing.T, endpoint string) *simFeed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pub := zmq4.NewPub(ctx)
	t.Cleanup(func() {
		pub.Close()
		cancel()
	})
	if err := pub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	return &simFeed{t: t, pub: pub}
}

// send publishes the captured message number seq with the frames the
// simulator sent: its topic, the sequence number, the msgpack batch.
func (f *simFeed) send(seq uint64, name string) {
	f.t.Helper()
	batch, err := os.ReadFile(filepath.Join(simCaptures, name))
	if err != nil {
		f.t.Fatal(err)
	}
	var s [8]byte
	be.BigEndian.PutUint64(s[:], seq)
	if err := f.pub.Send(zmq4.NewMsgFrom([]byte(simTopic), s[:], batch)); err != nil {
		f.t.Fatal(err)
	}
}

// Behind llm-d's vLLM simulator, whose tokenizer hashes words into 32-bit
// ids (most above 2^31) and whose array-encoded events give a chain's
// first block a parent hash of 0, the feed fills the brokers' prefix
// index: a repeated prompt goes back to the replica whose engine holds
// it, by prefix from the engines' own events, and once the engine's
// events evict those blocks it is no longer sent there for its prefix.
// The engines here are the simulator's captured answers and events.
func TestLLMDSimulatorFeedRoutesByPrefix(t *testing.T) {
	engine := recordedSim(t)
	replicas := devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")
	for i := range replicas {
		replicas[i].EngineURL, replicas[i].KVEventsBind = engine.URL, "tcp://127.0.0.1:0"
	}
	st := startStack(t, devstack.Config{Replicas: replicas})

	raw, err := os.ReadFile(filepath.Join(simCaptures, "chat-request.json"))
	if err != nil {
		t.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(raw, &req); err != nil {
		t.Fatal(err)
	}
	req["model"] = "chat-small"
	body, _ := json.Marshal(req)
	fr, err := features.ParseRequest(subjects.EndpointChat, body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := features.FormatPrefixHeader(features.AppendPrefix(nil, fr.Prompt, 256, 64))
	nc := mustConnectAs(t, st, roleOperator)
	explain := func() subjects.Decision {
		t.Helper()
		x, _ := json.Marshal(map[string]any{"model": "chat-small", "prompt_tokens": fr.PromptTokens, "prefix": prefix})
		return explainOver(t, nc, x)
	}

	// The prompt is served by one replica, whose adapter learns its
	// blocks from the engine's /tokenize.
	status, h := post(t, st.GatewayURL(), "", string(body))
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	holder := h.Get("X-Switchyard-Replica")

	// Its engine stores the prompt's blocks: the captured BlockStored, on
	// that replica's feed. A PUB socket drops what it sends before the
	// subscriber's subscription reaches it, so the first message is sent
	// again until the adapter has read it.
	feed := dialSimFeed(t, feedAddr(t, st, holder))
	read := func() float64 {
		return metric(st, "switchyard_adapter_kv_events_total", map[string]string{"replica": holder, "type": "BlockStored", "reason": ""})
	}
	testkit.CheckFor(t, 15*time.Second, 300*time.Millisecond, func() error {
		if read() > 0 {
			return nil
		}
		feed.send(1, "kv-events-array-001.msgpack")
		return fmt.Errorf("the adapter has read no BlockStored (refused: %v)",
			metric(st, "switchyard_adapter_kv_events_total", map[string]string{"replica": holder, "type": "malformed"}))
	})
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if n := metric(st, "switchyard_broker_prefix_index_entries", nil); n == 0 {
			return fmt.Errorf("the brokers' prefix index is empty")
		}
		d := explain()
		if d.Replica != holder || d.PrefixSource != policy.PrefixKVEvents || d.PrefixMatched == 0 {
			return fmt.Errorf("the prompt would go to %s (%s), %d blocks matched from %q; want %s from kv-events", d.Replica, d.Reason, d.PrefixMatched, d.PrefixSource, holder)
		}
		return nil
	})
	if status, h := post(t, st.GatewayURL(), "", string(body)); status != 200 || h.Get("X-Switchyard-Replica") != holder || !strings.Contains(h.Get("X-Switchyard-Reason"), policy.ReasonPrefix) {
		t.Fatalf("the repeated prompt: %d on %s (%s), want %s by prefix", status, h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Reason"), holder)
	}

	// Fourteen other prompts filled the engine's 64 blocks: its next two
	// messages evict the prompt's.
	feed.send(2, "kv-events-array-002.msgpack")
	feed.send(3, "kv-events-array-003.msgpack")
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if d := explain(); d.Replica == holder && d.PrefixMatched > 0 {
			return fmt.Errorf("the prompt would still go to %s for %d blocks (%s)", holder, d.PrefixMatched, d.PrefixSource)
		}
		return nil
	})
	if status, h := post(t, st.GatewayURL(), "", string(body)); status != 200 || strings.Contains(h.Get("X-Switchyard-Reason"), policy.ReasonPrefix) {
		t.Fatalf("after the eviction the prompt: %d on %s (%s), want no prefix affinity", status, h.Get("X-Switchyard-Replica"), h.Get("X-Switchyard-Reason"))
	}
	if n := metric(st, "switchyard_adapter_kv_events_total", map[string]string{"replica": holder, "type": "malformed"}); n != 0 {
		t.Errorf("%v of the simulator's messages refused", n)
	}
}

// explainOver asks the deciders for the decision they would make.
func explainOver(t *testing.T, nc *nats.Conn, x []byte) subjects.Decision {
	t.Helper()
	msg, err := nc.Request("llm.explain.default", x, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var d subjects.Decision
	if err := json.Unmarshal(msg.Data, &d); err != nil {
		t.Fatalf("explain answered %s: %v", msg.Data, err)
	}
	return d
}

// logRecords returns the JSON log records in logs whose msg starts with
// prefix.
func logRecords(logs *testkit.SyncBuffer, prefix string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil {
			if msg, _ := r["msg"].(string); strings.HasPrefix(msg, prefix) {
				out = append(out, r)
			}
		}
	}
	return out
}

// An engine whose every KV-event message is refused (here, token ids past
// 32 bits) leaves prefix affinity on placements; that is loud: the refusals
// are counted by reason, each adapter warns once whatever their number, the
// dashboard marks the feed as failing, and a decision whose prefix came
// from placements says the replica's feed is failing.
func TestAFailingKVFeedIsLoud(t *testing.T) {
	engine := recordedSim(t)
	replicas := devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")
	for i := range replicas {
		replicas[i].EngineURL, replicas[i].KVEventsBind = engine.URL, "tcp://127.0.0.1:0"
	}
	var logs testkit.SyncBuffer
	st := startStack(t, devstack.Config{Replicas: replicas, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})

	bad, err := msgpack.Marshal([]any{1.0, []any{[]any{"BlockStored", []any{uint64(9)}, nil, []any{uint64(1) << 40}, 1}}, 0})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range replicas {
		ctx, cancel := context.WithCancel(context.Background())
		pub := zmq4.NewPub(ctx)
		t.Cleanup(func() {
			pub.Close()
			cancel()
		})
		if err := pub.Dial(feedAddr(t, st, r.ID)); err != nil {
			t.Fatal(err)
		}
		refused := func() float64 {
			return metric(st, "switchyard_adapter_kv_events_total", map[string]string{"replica": r.ID, "type": "malformed", "reason": "token_id"})
		}
		var seq uint64
		testkit.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
			if n := refused(); n >= 20 {
				return nil
			}
			seq++
			var s [8]byte
			be.BigEndian.PutUint64(s[:], seq)
			if err := pub.Send(zmq4.NewMsgFrom([]byte(simTopic), s[:], bad)); err != nil {
				t.Fatal(err)
			}
			return fmt.Errorf("%v of %s's messages refused for their token ids", refused(), r.ID)
		})
	}
	for _, r := range replicas {
		var warned int
		for _, rec := range logRecords(&logs, "KV-event message refused") {
			if rec["level"] == "WARN" && rec["replica"] == r.ID {
				warned++
				if rec["reason"] != "token_id" {
					t.Errorf("%s warned of reason %v, want token_id", r.ID, rec["reason"])
				}
			}
		}
		if warned != 1 {
			t.Errorf("%s warned %d times of its refused feed, want once", r.ID, warned)
		}
	}

	// The dashboard marks both feeds as failing; a decision for a prompt
	// with a prefix says its replica's feed is failing.
	testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		_, state := getWith(t, &http.Client{Timeout: 5 * time.Second}, st.GatewayURL()+"/ui/state")
		if n := strings.Count(state, `"kv_feed_failing":"token_id"`); n != 2 {
			return fmt.Errorf("the dashboard marks %d feeds as failing, want 2: %.300s", n, state)
		}
		return nil
	})
	nc := mustConnectAs(t, st, roleOperator)
	prompt := []byte(strings.Repeat("a long system prompt shared by many requests ", 20))
	prefix := features.FormatPrefixHeader(features.AppendPrefix(nil, prompt, 256, 64))
	x, _ := json.Marshal(map[string]any{"model": "chat-small", "prompt_tokens": len(prompt) / 4, "prefix": prefix})
	d := explainOver(t, nc, x)
	if d.Replica == "" || d.KVFeedRefused != "token_id" || d.PrefixSource == policy.PrefixKVEvents {
		t.Fatalf("decision %+v; want its replica's failing feed named (token_id)", d)
	}
}
