package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard-llm/switchyard/deploy/examples"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/natsconn/natstest"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table/kv"
)

// faultEnv is a running broker on a real nats-server, with the dev table
// and two registered chat-small replicas, r-0 and r-1, whose heartbeats the
// test publishes itself. The broker's clock is the test's.
type faultEnv struct {
	t      *testing.T
	nc     *nats.Conn
	bucket jetstream.KeyValue
	b      *Broker
	reg    *prometheus.Registry // the broker's metrics
	now    atomic.Int64         // unix ns of the broker's clock
	seq    atomic.Uint64
}

// metric is the value of the broker's series name{label="value"}.
func (e *faultEnv) metric(name, label, value string) float64 {
	return testkit.Sum(e.reg, name, map[string]string{label: value})
}

func newFaultEnv(t *testing.T) *faultEnv {
	t.Helper()
	e := startFaultEnv(t, -1)
	e.waitServing()
	return e
}

// startFaultEnv starts the broker with the given warm-up and returns
// without waiting for it to serve.
func startFaultEnv(t *testing.T, warmUp time.Duration) *faultEnv {
	t.Helper()
	_, url := natstest.Start(t)
	e := &faultEnv{t: t}
	e.now.Store(time.Now().UnixNano())
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	e.nc = nc
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	e.bucket, err = kv.EnsureBucket(ctx, js, subjects.DefaultBucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	flat := examples.Flat()
	if _, err := kv.Seed(ctx, e.bucket, flat); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r-0", "r-1"} {
		e.register(id, subjects.StateReady)
	}
	bnc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(bnc.Close)
	e.reg = prometheus.NewRegistry()
	e.b, err = New(bnc, Config{ID: "b-test", WarmUp: warmUp, Registerer: e.reg, Now: func() time.Time { return time.Unix(0, e.now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = e.b.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	e.waitTable(func() error {
		for _, id := range []string{"r-0", "r-1"} {
			if r := e.b.Table().Replicas[id]; r == nil || r.State != subjects.StateReady {
				return fmt.Errorf("%s not registered ready", id)
			}
		}
		return nil
	})
	return e
}

// waitServing waits until the broker answers pings: it subscribed and
// joined the queue group.
func (e *faultEnv) waitServing() {
	e.t.Helper()
	testkit.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		if _, err := e.nc.Request("$SRV.PING."+subjects.BrokerService, nil, time.Second); err != nil {
			return err
		}
		// The service answers its ping before its endpoints subscribe;
		// explain subscribes last, on the same connection, so an answer
		// from it (any answer) says every endpoint is there.
		_, err := e.nc.Request("llm.explain.acme", nil, time.Second)
		return err
	})
}

func (e *faultEnv) register(id, state string) {
	e.t.Helper()
	v := `{"model":"llama-3-8b-instruct","version":"v1.0.0","pool":"general","max_batch":32,"max_queue":128,"state":"` + state + `"}`
	if _, err := e.bucket.Put(context.Background(), "replicas."+id, []byte(v)); err != nil {
		e.t.Fatal(err)
	}
}

// waitTable polls the broker's table until ok holds.
func (e *faultEnv) waitTable(ok func() error) {
	e.t.Helper()
	testkit.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		if e.b.Table() == nil {
			return errors.New("no table yet")
		}
		return ok()
	})
}

// heartbeat publishes hb for its replica and waits until the broker took it
// (its KV gauge shows the unique value the heartbeat carries).
func (e *faultEnv) heartbeat(hb subjects.Heartbeat) {
	e.t.Helper()
	hb.Model, hb.Version, hb.Pool = "llama-3-8b-instruct", "v1.0.0", "general"
	hb.MaxBatch, hb.MaxQueue = 32, 128
	hb.Seq = e.seq.Add(1)
	// A unique low digit identifies this heartbeat in the gauge.
	hb.KVUsage += float64(hb.Seq%1000) * 1e-9
	b, _ := json.Marshal(hb)
	if err := e.nc.Publish(subjects.New("").Heartbeat(hb.Replica), b); err != nil {
		e.t.Fatal(err)
	}
	testkit.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := e.metric("switchyard_broker_replica_kv_usage_ratio", "replica", hb.Replica); got != hb.KVUsage {
			return fmt.Errorf("broker has kv %v for %s, want %v", got, hb.Replica, hb.KVUsage)
		}
		return nil
	})
}

// heartbeatRaw publishes hb until the broker took it, for a broker that
// may not be subscribed yet.
func (e *faultEnv) heartbeatRaw(hb subjects.Heartbeat) {
	e.t.Helper()
	hb.Model, hb.Version, hb.Pool = "llama-3-8b-instruct", "v1.0.0", "general"
	b, _ := json.Marshal(hb)
	testkit.CheckFor(e.t, 5*time.Second, 5*time.Millisecond, func() error {
		_ = e.nc.Publish(subjects.New("").Heartbeat(hb.Replica), b)
		if got := e.metric("switchyard_broker_replica_kv_usage_ratio", "replica", hb.Replica); got != hb.KVUsage {
			return fmt.Errorf("heartbeat of %s not taken", hb.Replica)
		}
		return nil
	})
}

func ready(id string, kv float64) subjects.Heartbeat {
	return subjects.Heartbeat{Replica: id, State: subjects.StateReady, KVUsage: kv, ScrapeOK: true}
}

// route sends one chat-small request as the gateway would and returns the
// replica the routed notice names, or the rejection's status and code.
func (e *faultEnv) route(exclude ...string) (replica string, status int, code string) {
	e.t.Helper()
	inbox := nats.NewInbox()
	sub, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m := nats.NewMsg("llm.route.default")
	m.Reply = inbox
	m.Header.Set(subjects.HdrModel, "chat-small")
	m.Header.Set(subjects.HdrEndpoint, subjects.EndpointChat)
	m.Header.Set(subjects.HdrPromptTokens, "10")
	m.Header.Set(subjects.HdrRequestID, strconv.FormatUint(e.seq.Add(1), 10))
	if len(exclude) > 0 {
		m.Header.Set(subjects.HdrExclude, strings.Join(exclude, ","))
	}
	m.Data = []byte(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`)
	if err := e.nc.PublishMsg(m); err != nil {
		e.t.Fatal(err)
	}
	r, err := sub.NextMsg(2 * time.Second)
	if err != nil {
		e.t.Fatalf("no answer from the broker: %v", err)
	}
	if rep := r.Header.Get(subjects.HdrRouted); rep != "" {
		return rep, 0, ""
	}
	var body struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(r.Data, &body)
	status, _ = strconv.Atoi(r.Header.Get(subjects.HdrStatus))
	return "", status, body.Error.Code
}

// spread routes n requests and counts them per replica ("" for rejections).
func (e *faultEnv) spread(n int) map[string]int {
	e.t.Helper()
	got := map[string]int{}
	for range n {
		rep, _, _ := e.route()
		got[rep]++
	}
	return got
}

func TestReplicaStatesDecideCandidacy(t *testing.T) {
	e := newFaultEnv(t)
	e.heartbeat(ready("r-0", 0.2))
	e.heartbeat(ready("r-1", 0.2))
	if got := e.spread(20); got["r-0"] == 0 || got["r-1"] == 0 {
		t.Fatalf("two healthy replicas should share the load: %v", got)
	}

	t.Run("loading is excluded", func(t *testing.T) {
		hb := ready("r-0", 0.2)
		hb.State = subjects.StateLoading
		e.heartbeat(hb)
		if got := e.spread(20); got["r-1"] != 20 {
			t.Errorf("a loading replica got requests: %v", got)
		}
		e.heartbeat(ready("r-0", 0.2))
	})

	t.Run("saturated is deprioritized, not excluded", func(t *testing.T) {
		e.heartbeat(ready("r-0", 0.97)) // over saturation_kv 0.95
		e.heartbeat(ready("r-1", 0.5))
		if got := e.spread(20); got["r-1"] != 20 {
			t.Errorf("the saturated replica was preferred: %v", got)
		}
		// With the other one out of the way, the saturated replica serves.
		if rep, status, code := e.route("r-1"); rep != "r-0" {
			t.Errorf("saturated replica excluded: got %q %d %s", rep, status, code)
		}
		e.heartbeat(ready("r-0", 0.2))
		e.heartbeat(ready("r-1", 0.2))
	})

	t.Run("failing health checks exclude, log and count", func(t *testing.T) {
		before := e.metric("switchyard_broker_unhealthy_heartbeats_total", "replica", "r-0")
		hb := ready("r-0", 0.2)
		hb.ScrapeOK = false
		e.heartbeat(hb)
		if got := e.spread(20); got["r-1"] != 20 {
			t.Errorf("a replica failing its health checks got requests: %v", got)
		}
		if n := e.metric("switchyard_broker_unhealthy_heartbeats_total", "replica", "r-0") - before; n != 1 {
			t.Errorf("unhealthy heartbeats counted %v, want 1", n)
		}
		// Alone, it is not served: no replica is better than a broken one.
		if rep, status, code := e.route("r-1"); rep != "" || status != 503 || code != subjects.CodeNoReplicas {
			t.Errorf("with only the unhealthy replica: %q %d %s, want 503 no_replicas", rep, status, code)
		}
		e.heartbeat(ready("r-0", 0.2))
		if got := e.spread(20); got["r-0"] == 0 {
			t.Errorf("a recovered replica got no requests: %v", got)
		}
	})

	t.Run("draining heartbeat gets no new requests", func(t *testing.T) {
		hb := ready("r-0", 0.2)
		hb.State = subjects.StateDraining
		e.heartbeat(hb)
		if got := e.spread(20); got["r-1"] != 20 {
			t.Errorf("a draining replica got requests: %v", got)
		}
		e.heartbeat(ready("r-0", 0.2))
	})

	t.Run("an operator's state in KV wins over a ready heartbeat", func(t *testing.T) {
		for _, state := range []string{subjects.StateDisabled, subjects.StateDraining} {
			e.register("r-0", state)
			e.waitTable(func() error {
				if s := e.b.Table().Replicas["r-0"].State; s != state {
					return fmt.Errorf("r-0 is %s", s)
				}
				return nil
			})
			e.heartbeat(ready("r-0", 0.0))
			if got := e.spread(20); got["r-1"] != 20 {
				t.Errorf("%s in KV: replica still got requests: %v", state, got)
			}
		}
		e.register("r-0", subjects.StateReady)
		e.waitTable(func() error {
			if s := e.b.Table().Replicas["r-0"].State; s != subjects.StateReady {
				return fmt.Errorf("r-0 is %s", s)
			}
			return nil
		})
	})

	t.Run("a heartbeat silent past dead_after is excluded", func(t *testing.T) {
		e.heartbeat(ready("r-0", 0.2))
		e.heartbeat(ready("r-1", 0.2))
		e.now.Add(int64(16 * time.Second)) // dead_after is 15s in the dev table
		e.heartbeat(ready("r-1", 0.2))
		if got := e.spread(20); got["r-1"] != 20 {
			t.Errorf("a replica silent for 16s got requests: %v", got)
		}
		e.heartbeat(ready("r-0", 0.2))
		if got := e.spread(20); got["r-0"] == 0 {
			t.Errorf("a replica heartbeating again got no requests: %v", got)
		}
	})
}

// TestStartingBrokerWaitsForHeartbeats: a broker joins the queue group
// only once it heard every ready replica (or its warm-up ran out), so it
// never answers no_replicas for want of a first heartbeat.
func TestStartingBrokerWaitsForHeartbeats(t *testing.T) {
	e := startFaultEnv(t, 5*time.Second)
	// Subscribed to heartbeats but not serving: publish until one is taken.
	e.heartbeatRaw(ready("r-0", 0.2))
	if _, err := e.nc.Request("$SRV.PING."+subjects.BrokerService, nil, 300*time.Millisecond); err == nil {
		t.Fatal("the broker serves with a ready replica it never heard from")
	}
	start := time.Now()
	e.heartbeatRaw(ready("r-1", 0.2))
	e.waitServing()
	t.Logf("serving %v after the last heartbeat it waited for", time.Since(start).Round(time.Millisecond))
	if rep, status, code := e.route(); rep == "" {
		t.Errorf("first request: %d %s", status, code)
	}
}

func TestBadHeartbeatsAreIgnoredAndCounted(t *testing.T) {
	e := newFaultEnv(t)
	e.heartbeat(ready("r-0", 0.2))
	e.heartbeat(ready("r-1", 0.2))
	bad := func() float64 { return e.metric("switchyard_broker_bad_messages_total", "kind", "heartbeat") }
	before := bad()
	hb := func(f func(*subjects.Heartbeat)) []byte {
		h := ready("r-0", 0.2)
		h.State = subjects.StateDraining // each would exclude r-0 if taken
		f(&h)
		b, _ := json.Marshal(h)
		return b
	}
	cases := []struct {
		name, subject string
		data          []byte
	}{
		{"not JSON", "llm.heartbeat.r-0", []byte(`{"replica":`)},
		{"invalid replica id", "llm.heartbeat.r-0", hb(func(h *subjects.Heartbeat) { h.Replica = "r 0!" })},
		{"empty replica id", "llm.heartbeat.r-0", hb(func(h *subjects.Heartbeat) { h.Replica = "" })},
		{"another replica's subject", "llm.heartbeat.r-1", hb(func(*subjects.Heartbeat) {})},
		{"unknown state", "llm.heartbeat.r-0", hb(func(h *subjects.Heartbeat) { h.State = "sleepy" })},
		{"wrong field type", "llm.heartbeat.r-0", []byte(`{"replica":"r-0","state":"draining","kv_usage":"high"}`)},
	}
	for _, tc := range cases {
		if err := e.nc.Publish(tc.subject, tc.data); err != nil {
			t.Fatal(err)
		}
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := bad() - before; n != float64(len(cases)) {
			return fmt.Errorf("%v bad heartbeats counted, want %d", n, len(cases))
		}
		return nil
	})

	if got := e.spread(20); got["r-0"] == 0 {
		t.Errorf("a bad heartbeat changed r-0's state: %v", got)
	}
}

func TestDirectClientWithABadTenantToken(t *testing.T) {
	e := newFaultEnv(t)
	body := []byte(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`)
	// One token that is not a valid tenant id: the broker answers 400.
	// The broker's route subscription may still be on its way to the
	// server: no responders until it arrives.
	var m *nats.Msg
	testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() (err error) {
		m, err = e.nc.Request("llm.route.b@d", body, 2*time.Second)
		return err
	})
	if m.Header.Get(subjects.HdrStatus) != "400" || m.Header.Get(subjects.HdrEOS) != "1" {
		t.Errorf("bad tenant token: %v %s, want a 400 rejection", m.Header, m.Data)
	}
	// Two tokens match no broker subscription: NATS says no responders.
	if _, err := e.nc.Request("llm.route.bad.token", body, 2*time.Second); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("llm.route.bad.token: %v, want no responders", err)
	}
	if n := e.metric("switchyard_broker_rejections_total", "code", subjects.CodeInvalidRequest); n != 1 {
		t.Errorf("invalid_request_error rejections = %v, want 1", n)
	}
}

func TestRoutedNoticePrecedesTheForward(t *testing.T) {
	e := newFaultEnv(t)
	e.heartbeat(ready("r-0", 0.2))
	e.heartbeat(ready("r-1", 0.2))
	fwd, err := e.nc.SubscribeSync("llm.replica.*")
	if err != nil {
		t.Fatal(err)
	}
	inbox := nats.NewInbox()
	replies, err := e.nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg("llm.route.default")
	m.Reply = inbox
	m.Data = []byte(`{"model":"chat-small","messages":[{"role":"user","content":"hi"}]}`)
	if err := e.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	notice, err := replies.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got, err := fwd.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rep := notice.Header.Get(subjects.HdrRouted)
	if rep == "" || got.Subject != "llm.replica."+rep || got.Reply != inbox {
		t.Errorf("notice names %q, request went to %q with reply %q", rep, got.Subject, got.Reply)
	}
	if notice.Header.Get(subjects.HdrSeq) != "" || len(notice.Data) != 0 {
		t.Errorf("the notice must carry no Llm-Seq and no body: %v %q", notice.Header, notice.Data)
	}
}

// TestStopForwardsWhatWasDelivered stops a broker while requests pour in:
// every request the server handed it is forwarded, none is dropped.
func TestStopForwardsWhatWasDelivered(t *testing.T) {
	_, url := natstest.Start(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	bucket, err := kv.EnsureBucket(context.Background(), js, subjects.DefaultBucket, 1)
	if err != nil {
		t.Fatal(err)
	}
	flat := examples.Flat()
	if _, err := kv.Seed(context.Background(), bucket, flat); err != nil {
		t.Fatal(err)
	}
	bnc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer bnc.Close()
	b, err := New(bnc, Config{ID: "b-stop"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(ctx) }()
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		_, err := nc.Request("$SRV.PING."+subjects.BrokerService, nil, time.Second)
		return err
	})

	// Every request is answered (a no_replicas rejection: no replica is
	// registered) or hears no responders once the broker left.
	var answered, noResponders, lost atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_, err := nc.Request("llm.route.default", []byte(`{"model":"chat-small","messages":[{"role":"user","content":"x"}]}`), 2*time.Second)
				switch {
				case err == nil:
					answered.Add(1)
				case errors.Is(err, nats.ErrNoResponders):
					noResponders.Add(1)
					return
				default:
					lost.Add(1)
				}
			}
		})
	}
	testkit.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if answered.Load() < 50 {
			return errors.New("warming up")
		}
		return nil
	})

	cancel()
	<-done
	close(stop)
	wg.Wait()
	t.Logf("answered %d, no responders %d, lost %d", answered.Load(), noResponders.Load(), lost.Load())
	if lost.Load() != 0 {
		t.Errorf("%d requests delivered to the stopping broker were dropped", lost.Load())
	}
}
