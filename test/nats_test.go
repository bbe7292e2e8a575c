package test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// TestNATSServerRestart takes the NATS server away under a stream and
// brings it back on the same port and store: the stream in flight fails
// explicitly, requests during the outage get a fast explicit 503, and every
// part reconnects by itself so requests flow again.
func TestNATSServerRestart(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1})
	url := st.GatewayURL()
	stream := openStream(context.Background(), t, url, chatBody("chat-small", 2000, true))
	defer stream.Body.Close()

	down := time.Now()
	if err := st.StopNATS(); err != nil {
		t.Fatal(err)
	}
	o := readAnswer(stream)
	failedIn := time.Since(down)
	if o.done || o.code != subjects.CodeRouterUnavailable {
		t.Errorf("stream in flight when NATS went down: %v; want an SSE error event router_unavailable", o)
	}
	for range 5 {
		o := send(context.Background(), url, chatBody("chat-small", 1, false))
		if o.status != 503 || o.code != subjects.CodeRouterUnavailable || o.took > time.Second {
			t.Errorf("request while NATS is down: %v; want a fast 503 router_unavailable", o)
		}
	}
	time.Sleep(500 * time.Millisecond) // a real outage: clients retry meanwhile
	if err := st.StartNATS(); err != nil {
		t.Fatal(err)
	}
	var lastErr outcome
	took := testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		o := send(context.Background(), url, chatBody("chat-small", 1, false))
		if o.status == 200 && o.done {
			return nil
		}
		if !o.explicit() {
			t.Errorf("request during the recovery was not explicit: %v", o)
		}
		lastErr = o
		return fmt.Errorf("not yet: %v", o)
	})

	t.Logf("NATS down: the stream failed in %v; requests got 503 in ≤1s; after the restart requests flowed in %v (last error before: %v)",
		failedIn.Round(time.Millisecond), took.Round(time.Millisecond), lastErr)
	// Both replicas serve again, and the table is writable (adapters
	// re-register through the new server).
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := spread(t, url, "chat-small", 10); len(got) != 2 {
			return fmt.Errorf("not both replicas yet: %v", got)
		}
		return nil
	})

	bucket := kvBucket(t, st)
	if _, err := bucket.Put(context.Background(), "aliases.after-restart", []byte(`{"targets":[{"model":"llama-3-8b-instruct","version":"v1.0.0","weight":100}]}`)); err != nil {
		t.Errorf("table not writable after the restart: %v", err)
	}
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if st.Gateway().Table().Aliases["after-restart"] == nil {
			return errors.New("the gateway has not seen the new alias")
		}
		return nil
	})
}

// TestJetStreamUnavailableKeepsRouting disables JetStream under a running
// stack: brokers and the gateway keep the last good table and keep
// routing; a broker restarted meanwhile starts from its persisted snapshot.
// The gateway sends its requests through the brokers, so the requests
// after the restart are the restarted broker's to route.
func TestJetStreamUnavailableKeepsRouting(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Gateway: gateway.Config{Decide: gateway.DecideBroker}})
	url := st.GatewayURL()
	rev := st.Broker(0).Table().Revision
	if err := st.NATSServer().DisableJetStream(); err != nil {
		t.Fatal(err)
	}
	nc, err := connectAs(st, auth.Role{Kind: auth.RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := js.KeyValue(ctx, subjects.DefaultBucket); err == nil {
		t.Fatal("the bucket is still readable; JetStream should be off")
	}
	if got := spread(t, url, "chat-small", 20); got["l8-gen-0"]+got["l8-gen-1"] != 20 {
		t.Errorf("routing with JetStream off: %v", got)
	}

	st.StopBroker(0)
	if err := st.StartBroker(0); err != nil {
		t.Fatal(err)
	}
	took := testkit.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		o := send(context.Background(), url, chatBody("chat-small", 1, false))
		if o.status != 200 {
			if !o.explicit() {
				t.Errorf("request while the broker restarts: %v", o)
			}
			return fmt.Errorf("not yet: %v", o)
		}
		return nil
	})

	b := st.Broker(0)
	if src := b.TableSource(); src != kv.SourceStateDir {
		t.Errorf("restarted broker's table came from %q, want %q", src, kv.SourceStateDir)
	}
	if b.Table().Revision != rev {
		t.Errorf("restarted broker's table revision %d, want the last good %d", b.Table().Revision, rev)
	}
	if got := spread(t, url, "chat-small", 20); got["l8-gen-0"]+got["l8-gen-1"] != 20 {
		t.Errorf("routing from the persisted snapshot: %v", got)
	}
	t.Logf("broker restarted with JetStream off: routing from its persisted snapshot %v after the restart", took.Round(time.Millisecond))
}
