package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestARequestWaitsForItsReplicasToReconnect: the NATS server of a model's
// only replica dies, and the replica reconnects to another a moment later,
// as every client of a dead server does. A request sent in between meets
// nothing listening on the replica's subjects; it is neither failed 502
// (the replica gone) nor 503 no_replicas (none left once it is left out):
// it waits for the replica's return, within --offline-wait, and is served.
// Both ways a gateway decides. The wait is not a loop of decisions (each
// takes quota and budget): a gateway that decides decides again only once
// it hears the replica back, one that does not asks the brokers again
// after a pause that doubles.
func TestARequestWaitsForItsReplicasToReconnect(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: devstack.ReplicasNamed("l70-gen-0")})
	// The one replica of llama-3-8b-instruct (chat-small), its adapter
	// connected through a relay that plays its server dying.
	rl := testkit.NewRelay(t, strings.TrimPrefix(st.NATSURL(), "nats://"))
	const id = "l8-gen-0"
	role := adapterRole(id)
	if _, err := st.Auth().WriteCreds(st.CredsDir(), role); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(rl.URL(), nats.Name(id), nats.UserCredentials(st.Creds(role)),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	eng := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{Model: "llama-3-8b-instruct"}, Speed: 4})
	ln := testkit.Listen(t)
	a, err := adapter.New(nc, adapter.Config{
		Replica: id, Model: "llama-3-8b-instruct", Version: "v1.0.0", Flavor: "vllm",
		EngineURL: "http://" + ln.Addr().String(), MaxBatch: 32, MaxQueue: 128,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = eng.Serve(ctx, ln); done <- struct{}{} }()
	go func() { _ = a.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	gnc, err := connectAs(st, roleGateway)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(gnc.Close)
	// A gateway that does not decide hears of no replica's absence from
	// NATS (no-responders go to the publisher, the broker): it probes the
	// routed replica at the accept timeout, here well inside the
	// replica's absence.
	brokerReg := prometheus.NewRegistry()
	_, viaBroker := gatewayOnConn(t, gnc, gateway.Config{Decide: gateway.DecideBroker, AcceptTimeout: 200 * time.Millisecond, Registerer: brokerReg})
	body := `{"model":"chat-small","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	for _, tt := range []struct {
		name      string
		url       string
		reg       prometheus.Gatherer
		decisions float64 // at most, for the request
	}{
		{"deciding gateway", st.GatewayURL(), st.Registry(), 3},
		{"through a broker", viaBroker, brokerReg, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			testkit.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
				if status, _, b := chatOnce(t, tt.url, body, nil); status != 200 {
					return fmt.Errorf("%d %s", status, b)
				}
				return nil
			})
			waits := testkit.Sum(tt.reg, "switchyard_gateway_replica_waits_total", nil)
			decided := testkit.Sum(st.Registry(), "switchyard_broker_decisions_total", nil)
			const away = 600 * time.Millisecond
			rl.Down()
			down := time.Now()
			healed := time.AfterFunc(away, rl.Heal)
			defer func() { healed.Stop(); rl.Heal() }()
			// The server drops the adapter's subscriptions once it has read
			// the closed connection; on a busy machine that can come after
			// the request, which then meets no absence but a lost message.
			testkit.CheckFor(t, away/2, 5*time.Millisecond, func() error {
				if _, err := gnc.Request(subjects.New("").Replica(id), nil, 20*time.Millisecond); !errors.Is(err, nats.ErrNoResponders) {
					return fmt.Errorf("the server still routes to the replica (%v)", err)
				}
				return nil
			})
			start := time.Now()
			status, _, b := chatOnce(t, tt.url, body, nil)
			took, sinceDown := time.Since(start), time.Since(down)
			if status != 200 {
				t.Fatalf("a request sent while its one replica reconnected: %d %s after %v; want 200", status, b, took.Round(time.Millisecond))
			}
			if sinceDown < away/2 {
				t.Errorf("answered %v after the replica went away, before it could have reconnected (%v): it did not meet the replica gone", sinceDown.Round(time.Millisecond), away)
			}
			if n := testkit.Sum(tt.reg, "switchyard_gateway_replica_waits_total", nil); n <= waits {
				t.Errorf("switchyard_gateway_replica_waits_total %v, was %v: no wait counted", n, waits)
			}
			n := testkit.Sum(st.Registry(), "switchyard_broker_decisions_total", nil) - decided
			if n > tt.decisions {
				t.Errorf("%v decisions for the one request, want at most %v: the wait decided again and again", n, tt.decisions)
			}
			t.Logf("answered 200 after %v, %v decisions", took.Round(time.Millisecond), n)
		})
	}
}
