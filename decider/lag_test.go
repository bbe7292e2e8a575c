package decider

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// A decider whose link stalls for twice dead_after (it holds every byte,
// as for a paused process or a stuck reader) and then delivers the backlog
// keeps its replicas throughout: its own presence does not come back to it
// either, so the silence is its own lag, not the replicas', and a metric
// and a log line say so.
func TestAStalledHeartbeatSubscriptionKeepsTheReplicas(t *testing.T) {
	_, url := natstest.Start(t)
	relay := testkit.NewRelay(t, strings.TrimPrefix(url, "nats://"))
	nc, err := nats.Connect(relay.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	pub, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pub.Close)

	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	logs := &testkit.SyncBuffer{}
	b, err := New(nc, Config{ID: "b1", Now: now, PresenceEvery: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	snap, errs := table.FromFlat(examples.Flat())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for _, id := range []string{"r-0", "r-1"} {
		v, err := table.Decode("replicas."+id, []byte(`{"model":"llama-3-8b-instruct","version":"v1.0.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`))
		if err != nil {
			t.Fatal(err)
		}
		snap.Set(v, nil)
	}
	b.SetTable(snap)
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	if err := nc.Flush(); err != nil { // its subscriptions are on the server
		t.Fatal(err)
	}

	var seq atomic.Uint64
	beat := func(at time.Time) {
		for _, id := range []string{"r-0", "r-1"} {
			data, _ := json.Marshal(subjects.Heartbeat{Replica: id, Model: "llama-3-8b-instruct", Version: "v1.0.0", Pool: "general",
				State: subjects.StateReady, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true, Seq: seq.Add(1), SentUnixMillis: at.UnixMilli()})
			if err := pub.Publish(b.subj.Heartbeat(id), data); err != nil {
				t.Fatal(err)
			}
		}
		_ = pub.Flush()
	}
	req := policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10}
	routed := func(at time.Time) error {
		d := b.router.Explain(&req, at, nil)
		if d.Err != nil || (d.Replica != "r-0" && d.Replica != "r-1") {
			return fmt.Errorf("at %v: %v (%s %s); want r-0 or r-1 kept", at.Sub(t0), d.Err, d.Replica, d.Reason)
		}
		return nil
	}
	beat(t0)
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("both heartbeats handled", func() bool {
		return b.router.HeardSince("r-0", t0, t0) && b.router.HeardSince("r-1", t0, t0)
	}))

	// The link stalls; the replicas go on beating every second for 30 s
	// (twice dead_after), and their heartbeats pile up behind it.
	relay.Cut()
	for s := 1; s <= 30; s++ {
		beat(t0.Add(time.Duration(s) * time.Second))
	}
	clock.Store(t0.Add(30 * time.Second).UnixNano())
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the lag counted and logged", func() bool {
		return testutil.ToFloat64(b.metrics.observerLags) == 1 && strings.Contains(logs.String(), "this decider lags behind the bus")
	}))
	if got, want := b.router.Deafness(now()), 30*time.Second; got != want {
		t.Errorf("deafness %v, want %v (the 30 s it heard no replica)", got, want)
	}
	if err := routed(now()); err != nil {
		t.Fatalf("while stalled: %v", err)
	}

	// The link carries again, the backlog first.
	relay.Heal()
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the backlog handled and the lag over", func() bool {
		return b.router.HeardSince("r-0", now().Add(-time.Second), now()) && b.router.Deafness(now()) == 0
	}))
	if err := routed(now()); err != nil {
		t.Fatalf("after the backlog: %v", err)
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the end of the lag logged", func() bool {
		return strings.Contains(logs.String(), "keeps up with the bus again")
	}))
}
