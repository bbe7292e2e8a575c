package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/switchyard-llm/switchyard/auth"
	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// l8 are the two chat-small replicas: enough to see one excluded.
func l8() []devstack.Replica { return devstack.ReplicasNamed("l8-gen-0", "l8-gen-1") }

// TestEngineHealthDecidesCandidacy follows one replica through its engine's
// health: loading (no /health 200 yet) is excluded; once healthy it serves;
// failing health checks past the adapter's limit (scrape_ok=false) exclude
// it again, logged and counted by the broker; healthy again, it serves.
func TestEngineHealthDecidesCandidacy(t *testing.T) {
	faults := &devstack.Faults{}
	faults.SetHealth(http.StatusServiceUnavailable)
	st := startUnready(t, devstack.Config{
		Replicas: l8(), Faults: map[string]*devstack.Faults{"l8-gen-0": faults},
		ScrapeEvery: 100 * time.Millisecond, HeartbeatEvery: 100 * time.Millisecond,
	})
	url := st.GatewayURL()
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if s0, s1 := replicaState(st, "l8-gen-0"), replicaState(st, "l8-gen-1"); s0 != subjects.StateLoading || s1 != subjects.StateReady {
			return fmt.Errorf("l8-gen-0 %q, l8-gen-1 %q", s0, s1)
		}
		return nil
	})

	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if o := send(context.Background(), url, chatBody("chat-small", 1, false)); !o.done {
			return fmt.Errorf("%v", o)
		}
		return nil
	})

	if got := spread(t, url, "chat-small", 20); got["l8-gen-1"] != 20 {
		t.Fatalf("a loading replica got requests: %v", got)
	}

	faults.SetHealth(0)
	took := testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := spread(t, url, "chat-small", 10); got["l8-gen-0"] == 0 {
			return fmt.Errorf("l8-gen-0 gets nothing yet: %v", got)
		}
		return nil
	})

	t.Logf("loading → serving %v after /health turned 200", took.Round(time.Millisecond))

	unhealthy := map[string]string{"replica": "l8-gen-0"}
	faults.SetHealth(http.StatusInternalServerError)
	took = testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if metric(st, "switchyard_broker_unhealthy_heartbeats_total", unhealthy) == 0 {
			return errors.New("the broker has not seen scrape_ok=false yet")
		}
		return nil
	})

	t.Logf("failing /health → excluded %v later (3 failed scrapes at 100ms, then a heartbeat)", took.Round(time.Millisecond))
	if got := spread(t, url, "chat-small", 20); got["l8-gen-1"] != 20 {
		t.Errorf("a replica failing its health checks got requests: %v", got)
	}
	if n := metric(st, "switchyard_adapter_scrape_failures_total", unhealthy); n < 3 {
		t.Errorf("adapter counted %v scrape failures, want at least 3", n)
	}

	faults.SetHealth(0)
	took = testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if got := spread(t, url, "chat-small", 10); got["l8-gen-0"] == 0 {
			return fmt.Errorf("l8-gen-0 gets nothing yet: %v", got)
		}
		return nil
	})

	t.Logf("healthy again → serving %v later", took.Round(time.Millisecond))
}

// TestOperatorDrainAndDisable edits replicas.<id> in KV as an operator
// would: a drained replica finishes what it has and gets nothing new; a
// disabled one stays disabled across its adapter's restart; re-enabled, it
// serves again.
func TestOperatorDrainAndDisable(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1,
		ScrapeEvery: 100 * time.Millisecond, HeartbeatEvery: 100 * time.Millisecond})
	url, bucket, ctx := st.GatewayURL(), kvBucket(t, st), context.Background()
	setState := func(state string) {
		t.Helper()
		e, err := bucket.Get(ctx, "replicas.l8-gen-0")
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		_ = json.Unmarshal(e.Value(), &v)
		v["state"] = state
		if _, err := bucket.Update(ctx, "replicas.l8-gen-0", jsonMarshal(v), e.Revision()); err != nil {
			t.Fatal(err)
		}
	}

	// A stream on l8-gen-0 outlives its drain.
	resp, cancel := streamOn(t, url, "l8-gen-0", chatBody("chat-small", 200, true))
	defer cancel()
	setState(subjects.StateDraining)
	took := testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if s := replicaState(st, "l8-gen-0"); s != subjects.StateDraining {
			return fmt.Errorf("broker sees %q", s)
		}
		return nil
	})

	t.Logf("KV edit → broker sees draining in %v", took.Round(time.Millisecond))
	if got := spread(t, url, "chat-small", 20); got["l8-gen-1"] != 20 {
		t.Errorf("a drained replica got new requests: %v", got)
	}
	o := readAnswer(resp)
	resp.Body.Close()
	if !o.done || o.code != "" {
		t.Errorf("the stream in flight on the drained replica: %v; want it to finish", o)
	}

	// Disabled, and the adapter restarts: the key stays, and so does the state.
	setState(subjects.StateDisabled)
	if err := st.StopReplica("l8-gen-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := bucket.Get(ctx, "replicas.l8-gen-0"); err != nil {
		t.Fatalf("the operator's disabled replica was deregistered: %v", err)
	}
	nc, err := connectAs(st, auth.Role{Kind: auth.RoleObserver})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hbs, err := nc.SubscribeSync("llm.heartbeat.l8-gen-0")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.StartReplica("l8-gen-0"); err != nil {
		t.Fatal(err)
	}
	// The new adapter has registered and scraped a few times, and says
	// ready itself; the operator's disabled stays.
	for {
		m, err := hbs.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var hb subjects.Heartbeat
		_ = json.Unmarshal(m.Data, &hb)
		if hb.Seq >= 5 && hb.State == subjects.StateReady {
			break
		}
	}
	if s := stateOf(t, bucket, "l8-gen-0"); s != subjects.StateDisabled {
		t.Errorf("after the adapter's restart the state is %q, want the operator's disabled", s)
	}
	if got := spread(t, url, "chat-small", 20); got["l8-gen-1"] != 20 {
		t.Errorf("a disabled replica got requests: %v", got)
	}

	setState(subjects.StateReady)
	took = testkit.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if got := spread(t, url, "chat-small", 10); got["l8-gen-0"] == 0 {
			return fmt.Errorf("l8-gen-0 gets nothing yet: %v", got)
		}
		return nil
	})

	t.Logf("re-enabled → serving in %v", took.Round(time.Millisecond))
}

func stateOf(t *testing.T, bucket jetstream.KeyValue, id string) string {
	t.Helper()
	e, err := bucket.Get(context.Background(), "replicas."+id)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		State string `json:"state"`
	}
	_ = json.Unmarshal(e.Value(), &v)
	return v.State
}

// TestAdapterSIGTERMDrains stops one adapter as SIGTERM would while it
// streams: it says draining at once, brokers send it nothing new (and no
// new request fails), the stream finishes, then it deregisters.
func TestAdapterSIGTERMDrains(t *testing.T) {
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1})
	url, bucket := st.GatewayURL(), kvBucket(t, st)
	resp, cancel := streamOn(t, url, "l8-gen-0", chatBody("chat-small", 300, true))
	defer cancel()

	stopped := make(chan time.Time, 1)
	start := time.Now()
	go func() {
		_ = st.StopReplica("l8-gen-0")
		stopped <- time.Now()
	}()
	took := testkit.CheckFor(t, 2*time.Second, 10*time.Millisecond, func() error {
		if s := replicaState(st, "l8-gen-0"); s != subjects.StateDraining {
			return fmt.Errorf("KV says %q", s)
		}
		return nil
	})

	t.Logf("SIGTERM → KV says draining in %v", took.Round(time.Millisecond))
	// From the first heartbeat on, nothing new goes there; what raced the
	// heartbeat is turned away with a 503 and retried elsewhere.
	for range 20 {
		if o := send(context.Background(), url, chatBody("chat-small", 1, false)); o.status != 200 || o.replica != "l8-gen-1" {
			t.Errorf("during the drain: %v", o)
		}
	}
	select {
	case <-stopped:
		t.Fatal("the adapter stopped before its stream finished")
	default:
	}
	o := readAnswer(resp)
	resp.Body.Close()
	if !o.done {
		t.Errorf("the stream in flight during the drain: %v; want it complete", o)
	}
	select {
	case at := <-stopped:
		t.Logf("adapter stopped %v after SIGTERM, once its stream ended", at.Sub(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the adapter did not stop after its last request")
	}
	if _, err := bucket.Get(context.Background(), "replicas.l8-gen-0"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("replicas.l8-gen-0 after the drain: %v, want deregistered", err)
	}
}

// TestDrainGraceCutsWhatIsLeftExplicitly: a request longer than the drain
// grace that cannot be continued elsewhere (logprobs) is cancelled when the
// grace ends, and the client is told. (TestDrainHandsStreamsOver has the
// answers that continue.)
func TestDrainGraceCutsWhatIsLeftExplicitly(t *testing.T) {
	const grace = 300 * time.Millisecond
	st := startStack(t, devstack.Config{Replicas: l8(), Speed: 1, DrainGrace: grace})
	url := st.GatewayURL()
	body := strings.Replace(chatBody("chat-small", 4000, true), `"max_tokens"`, `"logprobs":true,"max_tokens"`, 1)
	resp, cancel := streamOn(t, url, "l8-gen-0", body) // ~20s
	defer cancel()
	start := time.Now()
	if err := st.StopReplica("l8-gen-0"); err != nil {
		t.Fatal(err)
	}
	stoppedIn := time.Since(start)
	o := readAnswer(resp)
	resp.Body.Close()
	if o.done || o.code != subjects.CodeUpstreamError {
		t.Errorf("a stream cut by the drain grace: %v; want an SSE error event", o)
	}
	if stoppedIn > grace+2*time.Second {
		t.Errorf("the adapter took %v to stop with a %v grace", stoppedIn, grace)
	}
	t.Logf("adapter stopped %v after SIGTERM with a %v grace; the cut stream ended with %q", stoppedIn.Round(time.Millisecond), grace, o.code)
}
