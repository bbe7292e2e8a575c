package adapter_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// TestMain fails the package when a goroutine outlives the tests.
func TestMain(m *testing.M) { testkit.Main(m) }

// env is one test's world: an embedded NATS server with JetStream and the
// routing bucket, a client connection and a fake-but-real engine.
type env struct {
	t   *testing.T
	nc  *nats.Conn
	kv  jetstream.KeyValue
	eng *engine
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(context.Background(), jetstream.KeyValueConfig{Bucket: subjects.DefaultBucket, History: 16})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, nc: nc, kv: kv, eng: newEngine(t)}
}

// start runs an adapter for the env's engine until the test ends (or stop).
type running struct {
	a      *adapter.Adapter
	cancel context.CancelFunc
	errc   chan error
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.errc:
		r.errc <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func (e *env) config() adapter.Config {
	return adapter.Config{
		Replica:        "r-1",
		Model:          "sim-model",
		Version:        "v1",
		Pool:           "general",
		Flavor:         adapter.FlavorAuto,
		EngineURL:      e.eng.srv.URL,
		MaxBatch:       32,
		MaxQueue:       128,
		HeartbeatEvery: 20 * time.Millisecond,
		ScrapeEvery:    20 * time.Millisecond,
		KeepaliveEvery: time.Minute,
		// The accept goes alone at once, so tests see every message of the
		// protocol; TestAcceptRidesOnTheHead covers the delayed accept.
		AcceptDelay:     -1,
		DrainGrace:      5 * time.Second,
		ScrapeFailLimit: 3,
	}
}

func (e *env) start(cfg adapter.Config) *running {
	e.t.Helper()
	a, err := adapter.New(e.nc, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	// The first heartbeat is sent once the request endpoint listens.
	hb, err := e.nc.SubscribeSync(subjects.New(cfg.Prefix).Heartbeat(cfg.Replica))
	if err != nil {
		e.t.Fatal(err)
	}
	defer hb.Unsubscribe()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{a: a, cancel: cancel, errc: make(chan error, 1)}
	go func() { r.errc <- a.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-r.errc; err != nil {
			e.t.Errorf("Run: %v", err)
		}
	})
	if _, err := hb.NextMsg(5 * time.Second); err != nil {
		e.t.Fatalf("no heartbeat from %s: %v", cfg.Replica, err)
	}
	return r
}

// waitReady waits until the replica's KV state is ready.
func (e *env) waitReady(id string) {
	e.t.Helper()
	testkit.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		r, err := e.replica(id)
		if err != nil {
			return err
		}
		if r.State != subjects.StateReady {
			return fmt.Errorf("state %q", r.State)
		}
		return nil
	})
}

func (e *env) replica(id string) (table.Replica, error) {
	var r table.Replica
	entry, err := e.kv.Get(context.Background(), table.PrefixReplicas+id)
	if err != nil {
		return r, err
	}
	err = json.Unmarshal(entry.Value(), &r)
	return r, err
}

// request sends a request to the replica and returns the channel its reply
// messages arrive on.
func (e *env) request(id string, h nats.Header, body string) <-chan *nats.Msg {
	e.t.Helper()
	inbox := nats.NewInbox()
	ch := make(chan *nats.Msg, 4096)
	sub, err := e.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.PublishMsg(&nats.Msg{Subject: subjects.New("").Replica(id), Reply: inbox, Header: h, Data: []byte(body)}); err != nil {
		e.t.Fatal(err)
	}
	return ch
}

// next returns the next reply message.
func next(t *testing.T, ch <-chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no reply message within 5s")
		return nil
	}
}

// untilEnd collects reply messages up to and including the end (Llm-Eos).
func untilEnd(t *testing.T, ch <-chan *nats.Msg) []*nats.Msg {
	t.Helper()
	var out []*nats.Msg
	for {
		m := next(t, ch)
		out = append(out, m)
		if m.Header.Get(subjects.HdrEOS) == "1" {
			return out
		}
	}
}

func seq(t *testing.T, m *nats.Msg) int {
	t.Helper()
	n, err := strconv.Atoi(m.Header.Get(subjects.HdrSeq))
	if err != nil {
		t.Fatalf("message without a valid Llm-Seq: %v", m.Header)
	}
	return n
}

func chatHeaders(reqID string) nats.Header {
	return nats.Header{
		subjects.HdrRequestID: {reqID},
		subjects.HdrEndpoint:  {subjects.EndpointChat},
		subjects.HdrStream:    {"1"},
	}
}

// engine is a real HTTP server that speaks the engine's API from the golden
// files: /health, /metrics and /slots, and a chat endpoint whose behaviour
// each test sets.
type engine struct {
	srv     *httptest.Server
	health  atomic.Int32
	stall   atomic.Int64 // nanoseconds /health takes to answer
	metrics atomic.Value // string: the testdata file served on /metrics
	// metricsAt is when /metrics last answered (unix ms).
	metricsAt atomic.Int64
	slots     atomic.Value // string: the testdata file served on /slots ("" = 404)
	// key, when not "", is the API key /v1 requires, as vLLM's --api-key:
	// /health and /metrics stay open.
	key atomic.Value

	mu   sync.Mutex
	chat http.HandlerFunc
	got  []seen
}

// seen is a request the engine received.
type seen struct {
	Path   string
	Body   map[string]any
	Header http.Header
}

func newEngine(t *testing.T) *engine {
	e := &engine{}
	e.health.Store(http.StatusOK)
	e.metrics.Store("vllm/metrics-under-load.txt")
	e.slots.Store("")
	e.key.Store("")
	mux := http.NewServeMux()
	unauthorized := func(w http.ResponseWriter, r *http.Request) bool {
		k := e.key.Load().(string)
		if k == "" || r.Header.Get("Authorization") == "Bearer "+k {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = w.Write(golden(t, "vllm/error-unauthorized.json"))
		return true
	}
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		if !unauthorized(w, r) {
			_, _ = w.Write(golden(t, "vllm/models.json"))
		}
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if d := time.Duration(e.stall.Load()); d > 0 {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
		}
		w.WriteHeader(int(e.health.Load()))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		name := e.metrics.Load().(string)
		if name == "" {
			http.Error(w, "broken", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(golden(t, name))
		e.metricsAt.Store(time.Now().UnixMilli())
	})
	mux.HandleFunc("GET /slots", func(w http.ResponseWriter, r *http.Request) {
		name := e.slots.Load().(string)
		if name == "" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(golden(t, name))
	})
	mux.HandleFunc("POST /v1/", func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &body)
		e.mu.Lock()
		e.got = append(e.got, seen{Path: r.URL.Path, Body: body, Header: r.Header.Clone()})
		h := e.chat
		e.mu.Unlock()
		if unauthorized(w, r) {
			return
		}
		if h == nil {
			http.Error(w, "no handler", http.StatusInternalServerError)
			return
		}
		h(w, r)
	})
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *engine) handle(h http.HandlerFunc) {
	e.mu.Lock()
	e.chat = h
	e.mu.Unlock()
}

func (e *engine) requests() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.got...)
}

func golden(t *testing.T, name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Error(err)
	}
	return b
}

// sseChunks splits an SSE file into its events, each with its blank line.
func sseChunks(b []byte) [][]byte {
	var out [][]byte
	for len(b) > 0 {
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			return append(out, b)
		}
		out = append(out, b[:i+2])
		b = b[i+2:]
	}
	return out
}

// streamSSE writes the golden SSE events, flushing after each.
func streamSSE(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, c := range sseChunks(golden(t, "vllm/chat-stream-lora.sse")) {
			_, _ = w.Write(c)
			w.(http.Flusher).Flush()
		}
	}
}

var errNotYet = errors.New("not yet")

// wait blocks an engine handler until ch closes, or the call is cancelled (so
// a failed test never leaves a handler, and httptest's Close, hanging).
func wait(r *http.Request, ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-r.Context().Done():
		return false
	}
}
