package natstest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
)

func kvOn(t *testing.T, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
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

func TestStartAndRestartKeepTheStore(t *testing.T) {
	s, url := natstest.Start(t)
	_, js := kvOn(t, url)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "k", "v1"); err != nil {
		t.Fatal(err)
	}

	s2 := natstest.Restart(t, s)
	if s2.ClientURL() != url {
		t.Fatalf("restarted on %s, want %s", s2.ClientURL(), url)
	}
	// The old client reconnects to the new process on the same port.
	// Each read has its own second: the first ones can meet the
	// reconnect, and a loaded machine takes its time over the store's
	// recovery.
	var e jetstream.KeyValueEntry
	testkit.CheckFor(t, 30*time.Second, 50*time.Millisecond, func() (err error) {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		e, err = kv.Get(rctx, "k")
		return err
	})
	if string(e.Value()) != "v1" {
		t.Fatalf("value after restart = %q", e.Value())
	}
}

func TestClusterSurvivesALostMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-node cluster")
	}
	c := natstest.Cluster(t, 3)
	_, js := kvOn(t, c.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// The bucket's stream elects its own leader after the create returns:
	// until then a write gets no response.
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := kv.PutString(ctx, "k", "v1")
		return err
	})

	lost := c.Leader()
	c.Stop(lost)
	c.WaitLeader()
	if c.Leader() == lost {
		t.Fatal("a stopped member is still leader")
	}
	// Writes go on with two of three members.
	testkit.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		_, err := kv.PutString(ctx, "k", "v2")
		return err
	})
	c.Start(lost)
	c.WaitLeader()
	if got := len(c.Servers()); got != 3 {
		t.Fatalf("Servers() = %d", got)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "v2" {
		t.Fatalf("get = %v, %v", e, err)
	}
	if _, err := kv.Get(ctx, "missing"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("missing key: %v", err)
	}
}
