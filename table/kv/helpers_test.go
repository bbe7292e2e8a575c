package kv_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/table"
	"github.com/switchyard-llm/switchyard/table/kv"
)

const bucket = "llm-routing-test"

type env struct {
	srv *server.Server
	url string
	nc  *nats.Conn
	js  jetstream.JetStream
	kv  jetstream.KeyValue
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// connect dials url the way the components do: retrying, reconnecting.
func connect(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := natsconn.Connect(context.Background(), natsconn.Options{URL: url, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv, url := natstest.Start(t)
	nc, js := connect(t, url)
	if err := natsconn.WaitConnected(ctxT(t), nc); err != nil {
		t.Fatal(err)
	}
	b, err := kv.EnsureBucket(ctxT(t), js, bucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	return &env{srv: srv, url: url, nc: nc, js: js, kv: b}
}

func devTable(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	flat, errs := table.ParseFlat(examples.Table())
	if len(errs) > 0 {
		t.Fatalf("dev table: %v", errs)
	}
	return flat
}

// recorder keeps what a watcher reported.
type recorder struct {
	mu      sync.Mutex
	snaps   []*table.Snapshot
	invalid map[string]int
}

func (r *recorder) onSnapshot(s *table.Snapshot) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snaps = append(r.snaps, s)
}

func (r *recorder) onInvalid(key string, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.invalid == nil {
		r.invalid = map[string]int{}
	}
	r.invalid[key]++
}

func (r *recorder) invalidCount(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.invalid[key]
}

func (r *recorder) snapshots() []*table.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*table.Snapshot(nil), r.snaps...)
}

// startWatcher runs a watcher until the test ends and waits for its Run to
// return then.
func startWatcher(t *testing.T, js jetstream.JetStream, cfg kv.Config) (*kv.Watcher, *recorder) {
	t.Helper()
	rec := &recorder{}
	cfg.Bucket = bucket
	cfg.OnSnapshot = rec.onSnapshot
	cfg.OnInvalid = rec.onInvalid
	if cfg.MaxRetry == 0 {
		cfg.MaxRetry = 500 * time.Millisecond
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w := kv.New(js, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, rec
}

func waitReady(t *testing.T, w *kv.Watcher) {
	t.Helper()
	select {
	case <-w.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("watcher not ready")
	}
	if w.Snapshot() == nil {
		t.Fatal("nil snapshot after Ready")
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func put(t *testing.T, b jetstream.KeyValue, key, value string) uint64 {
	t.Helper()
	rev, err := b.PutString(ctxT(t), key, value)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// snapshotHas waits until the watcher's table has key with a value
// containing want ("" waits for the key to be gone).
func snapshotHas(t *testing.T, w *kv.Watcher, key, want string) {
	t.Helper()
	snapshotHasWithin(t, 10*time.Second, w, key, want)
}

// snapshotHasWithin is snapshotHas waiting up to d.
func snapshotHasWithin(t *testing.T, d time.Duration, w *kv.Watcher, key, want string) {
	t.Helper()
	testkit.CheckFor(t, d, 10*time.Millisecond, func() error {
		s := w.Snapshot()
		if s == nil {
			return fmt.Errorf("no snapshot")
		}
		raw, ok := s.Raw[key]
		switch {
		case want == "" && ok:
			return fmt.Errorf("%s still present: %s", key, raw)
		case want != "" && !ok:
			return fmt.Errorf("%s absent", key)
		case want != "" && !json.Valid(raw):
			return fmt.Errorf("%s not JSON", key)
		case want != "" && !strings.Contains(string(raw), want):
			return fmt.Errorf("%s = %s, want it to contain %s", key, raw, want)
		}
		return nil
	})
}
