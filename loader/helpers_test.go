package loader_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/loader"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// env is an embedded JetStream server with the routing bucket, a
// connection for the test, and the statuses heard on llm.control.load.status.
type env struct {
	t   *testing.T
	url string
	nc  *nats.Conn
	kv  jetstream.KeyValue
	s   subjects.Subjects

	mu       sync.Mutex
	statuses []subjects.LoadStatus
}

func newEnv(t *testing.T, models map[string]string) *env {
	t.Helper()
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bucket, err := kv.EnsureBucket(ctx, js, subjects.DefaultBucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, url: url, nc: nc, kv: bucket}
	for name, v := range models {
		if _, err := bucket.Put(ctx, "models."+name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	sub, err := nc.Subscribe(e.s.ControlLoadStatus(), func(m *nats.Msg) {
		var st subjects.LoadStatus
		if json.Unmarshal(m.Data, &st) == nil {
			e.mu.Lock()
			e.statuses = append(e.statuses, st)
			e.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return e
}

// start runs a loader on its own connection until the test ends.
func (e *env) start(cfg loader.Config) *prometheus.Registry {
	e.t.Helper()
	nc, err := nats.Connect(e.url)
	if err != nil {
		e.t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	if cfg.IdleCheck == 0 {
		cfg.IdleCheck = 50 * time.Millisecond
	}
	l, err := loader.New(nc, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("loader: %v", err)
		}
		nc.Close()
	})
	// The loader is serving once its queue subscription exists: a load
	// request before then would find no one.
	testkit.CheckFor(e.t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the loader subscribed", l.Serving))
	return reg
}

// request publishes n load requests for model, as brokers do.
func (e *env) request(model, version string, n int) {
	e.t.Helper()
	b, _ := json.Marshal(subjects.ControlLoad{Model: model, Version: version, Tenant: "default", Requested: time.Now().UnixMilli()})
	for range n {
		if err := e.nc.Publish(e.s.ControlLoad(), b); err != nil {
			e.t.Fatal(err)
		}
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// heartbeat publishes one heartbeat of a replica of model.
func (e *env) heartbeat(replica, model, version, state string, running int) {
	b, _ := json.Marshal(subjects.Heartbeat{Replica: replica, Model: model, Version: version, Pool: "general", State: state, Running: running, ScrapeOK: true, SentUnixMillis: time.Now().UnixMilli()})
	_ = e.nc.Publish(e.s.Heartbeat(replica), b)
}

// phases lists the phases heard for model, in order.
func (e *env) phases(model string) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var p []string
	for _, st := range e.statuses {
		if st.Model == model {
			p = append(p, st.Phase)
		}
	}
	return p
}

func (e *env) last(model, phase string) (subjects.LoadStatus, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.statuses) - 1; i >= 0; i-- {
		if st := e.statuses[i]; st.Model == model && st.Phase == phase {
			return st, true
		}
	}
	return subjects.LoadStatus{}, false
}

func (e *env) count(model, phase string) int {
	n := 0
	for _, p := range e.phases(model) {
		if p == phase {
			n++
		}
	}
	return n
}

// script writes an executable shell script that appends its arguments to
// a log file, then runs body; it returns the script and the log.
func script(t *testing.T, body string) (path, log string) {
	t.Helper()
	dir := t.TempDir()
	path, log = filepath.Join(dir, "action.sh"), filepath.Join(dir, "calls.log")
	src := fmt.Sprintf("#!/bin/sh\necho \"$SWITCHYARD_ACTION $*\" >> %q\n%s\n", log, body)
	if err := os.WriteFile(path, []byte(src), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, log
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
