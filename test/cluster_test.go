package test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/broker"
	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/gateway"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	adapter "github.com/switchyard-llm/switchyard/replica-adapter"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// clusterConn connects to member first of c as role, then to the others
// when it goes away.
func clusterConn(t *testing.T, c *natstest.JSCluster, sec *natstest.Secured, role auth.Role, first int, name string) *nats.Conn {
	t.Helper()
	urls := strings.Split(c.URL(), ",")
	ordered := append(append([]string{}, urls[first:]...), urls[:first]...)
	nc, err := nats.Connect(strings.Join(ordered, ","), nats.Name(name), nats.DontRandomize(), nats.UserCredentials(sec.Creds(t, role)),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestThreeNodeClusterLosesANode runs brokers, a gateway and adapters on
// different members of a 3-node JetStream cluster with the table bucket at
// 3 replicas, stops the member leading the bucket under load, and checks
// that no request hangs, every one ends explicitly, routing continues, and
// the table stays readable and writable.
func TestThreeNodeClusterLosesANode(t *testing.T) {
	// Under Switchyard's authorization: an adapter's stream goes on after it
	// reconnects to another member.
	c, sec := natstest.ClusterSecured(t, 3, auth.Config{})
	ctx := context.Background()
	admin := clusterConn(t, c, sec, roleOperator, 0, "admin")
	js, _ := jetstream.New(admin)
	bucket, err := kv.EnsureBucket(ctx, js, subjects.DefaultBucket, 3)
	if err != nil {
		t.Fatal(err)
	}
	flat := examples.Flat()
	if _, err := kv.Seed(ctx, bucket, flat); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	var parts sync.WaitGroup
	t.Cleanup(func() { cancel(); parts.Wait() })
	run := func(f func(context.Context) error) { parts.Go(func() { _ = f(runCtx) }) }

	// Two engines and their adapters, on members 1 and 2.
	for i, member := range []int{1, 2} {
		id := "l8-gen-" + strconv.Itoa(i)
		eng := enginesim.NewServer(enginesim.ServerConfig{Engine: enginesim.Config{Model: "llama-3-8b-instruct"}, Speed: 4})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		run(func(ctx context.Context) error { return eng.Serve(ctx, ln) })
		a, err := adapter.New(clusterConn(t, c, sec, adapterRole(id), member, id), adapter.Config{
			Replica: id, Model: "llama-3-8b-instruct", Version: "v1.0.0", Flavor: "vllm",
			EngineURL: "http://" + ln.Addr().String(), MaxBatch: 32, MaxQueue: 128,
		})
		if err != nil {
			t.Fatal(err)
		}
		run(a.Run)
	}
	// A broker on each of members 1 and 2, the gateway on member 0.
	var brokers []*broker.Broker
	for i, member := range []int{1, 2} {
		b, err := broker.New(clusterConn(t, c, sec, roleBroker, member, "broker"), broker.Config{ID: "b-" + strconv.Itoa(i), StateDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		brokers = append(brokers, b)
		run(b.Run)
	}
	g, err := gateway.New(clusterConn(t, c, sec, roleGateway, 0, "gateway"), gateway.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	run(func(ctx context.Context) error { return g.Serve(ctx, gln) })
	url := "http://" + gln.Addr().String()
	seen := map[string]bool{}
	testkit.CheckFor(t, 30*time.Second, 10*time.Millisecond, func() error {
		o := send(ctx, url, chatBody("chat-small", 1, false))
		seen[o.replica] = o.status == 200
		if !seen["l8-gen-0"] || !seen["l8-gen-1"] {
			return fmt.Errorf("not both replicas yet: %v", o)
		}
		return nil
	})

	// Load: four clients, streamed and not, each request bounded so a hang
	// shows as a timeout rather than a stuck test.
	type result struct {
		outcome
		at time.Time
	}
	var (
		mu      sync.Mutex
		results []result
	)
	stopLoad := testkit.Load(t, 4, func(w, i int) {
		rctx, rcancel := context.WithTimeout(ctx, 15*time.Second)
		o := send(rctx, url, chatBody("chat-small", 20, (w+i)%2 == 0))
		rcancel()
		mu.Lock()
		results = append(results, result{o, time.Now()})
		mu.Unlock()
	})
	time.Sleep(time.Second)

	info, err := js.Stream(ctx, "KV_"+subjects.DefaultBucket)
	if err != nil {
		t.Fatal(err)
	}
	si, err := info.Info(ctx)
	if err != nil || si.Cluster == nil {
		t.Fatalf("stream info: %v", err)
	}
	victim, _ := strconv.Atoi(strings.TrimPrefix(si.Cluster.Leader, "n"))
	victim--
	stopped := time.Now()
	c.Stop(victim)

	// The table stays writable (through a surviving member) and readable
	// by both brokers.
	survivor := clusterConn(t, c, sec, roleOperator, (victim+1)%3, "writer")
	sjs, _ := jetstream.New(survivor)
	var rev uint64
	writable := testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		b, err := sjs.KeyValue(wctx, subjects.DefaultBucket)
		if err != nil {
			return err
		}
		rev, err = b.Put(wctx, "aliases.after-failover", []byte(`{"targets":[{"model":"llama-3-8b-instruct","version":"v1.0.0","weight":100}]}`))
		return err
	})

	readable := testkit.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		for _, b := range brokers {
			if b.Table().Revision < rev {
				return fmt.Errorf("broker %s at revision %d, want %d", b.ID(), b.Table().Revision, rev)
			}
		}
		return nil
	})

	time.Sleep(2 * time.Second) // load after the failover
	stopLoad()

	var ok, failed, hung int
	var firstOKAfter time.Duration = -1
	for _, r := range results {
		switch {
		case r.status == 200 && r.done:
			ok++
			if r.at.After(stopped) && (firstOKAfter < 0 || r.at.Sub(stopped) < firstOKAfter) {
				firstOKAfter = r.at.Sub(stopped)
			}
		case errors.Is(r.err, context.DeadlineExceeded):
			hung++
			t.Logf("hung: %v, ended %v after the stop", r.outcome, r.at.Sub(stopped).Round(time.Millisecond))
		case r.explicit():
			failed++
		default:
			t.Errorf("request ended neither complete nor with an explicit error: %v", r.outcome)
		}
	}
	if hung > 0 {
		t.Errorf("%d requests hung past 15s", hung)
	}
	// The last requests of every client succeed: routing continues.
	mu.Lock()
	tail := results[max(len(results)-8, 0):]
	mu.Unlock()
	for _, r := range tail {
		if r.status != 200 || !r.done {
			t.Errorf("after the failover: %v", r.outcome)
		}
	}
	t.Logf("stopped n%d (bucket leader): %d requests, %d ok, %d failed explicitly, 0 lost; first success %v after the stop; table writable after %v, both brokers at the new revision %v later",
		victim+1, len(results), ok, failed, firstOKAfter.Round(time.Millisecond), writable.Round(time.Millisecond), readable.Round(time.Millisecond))
}
