package decider

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// A decider whose server goes away and comes back counts the replicas'
// silence without its own absence: replicas heard just before it left are
// still candidates after an absence longer than dead_after.
func TestADecidersReconnectKeepsItsReplicas(t *testing.T) {
	srv, url := natstest.Start(t)
	nc, err := nats.Connect(url, nats.ReconnectWait(10*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var clock atomic.Int64
	clock.Store(t0.UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()).UTC() }
	b, err := New(nc, Config{ID: "b1", Now: now})
	if err != nil {
		t.Fatal(err)
	}
	snap, errs := table.FromFlat(examples.Flat())
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	v, err := table.Decode("replicas.r-0", []byte(`{"model":"llama-3-8b-instruct","version":"v1.0.0","pool":"general","max_batch":32,"max_queue":128,"state":"ready"}`))
	if err != nil {
		t.Fatal(err)
	}
	snap.Set(v, nil)
	b.SetTable(snap)
	b.router.ObserveHeartbeat(&subjects.Heartbeat{Replica: "r-0", Model: "llama-3-8b-instruct", Version: "v1.0.0", Pool: "general",
		State: subjects.StateReady, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true}, t0)
	req0 := policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10}
	if d := b.router.Explain(&req0, t0.Add(time.Second), nil); d.Replica != "r-0" {
		t.Fatalf("before: %v (%s)", d.Err, d.Reason)
	}
	if err := b.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)

	// The server goes away at t0+1s, a second after the heartbeat; the
	// decider is back at t0+14s.
	clock.Store(t0.Add(time.Second).UnixNano())
	port := srv.Addr().(*net.TCPAddr).Port
	srv.Shutdown()
	srv.WaitForShutdown()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, testkit.Cond("the decider to notice its absence", func() bool { return b.away.Load() != 0 }))
	if got := time.Unix(0, b.away.Load()).UTC(); !got.Equal(t0) {
		t.Fatalf("the absence began at %v, want %v (the last heartbeat heard)", got, t0)
	}
	clock.Store(t0.Add(14 * time.Second).UnixNano())
	natstest.RunServer(t, &server.Options{Host: "127.0.0.1", Port: port})
	testkit.CheckFor(t, 10*time.Second, 5*time.Millisecond, testkit.Cond("the decider back on the bus", func() bool {
		return nc.IsConnected() && b.away.Load() == 0
	}))
	// 20 s after its heartbeat, 7 s of them with the decider present.
	req := policy.Request{Tenant: "default", Model: "chat-small", Endpoint: subjects.EndpointChat, PromptTokens: 10}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if d := b.router.Explain(&req, t0.Add(20*time.Second), nil); d.Replica != "r-0" {
			return fmt.Errorf("after the reconnect: %v (%s); want r-0 kept", d.Err, d.Reason)
		}
		return nil
	})
}
