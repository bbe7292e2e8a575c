package test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/devstack"
	"github.com/switchyard-llm/switchyard/internal/testkit"
)

// TestPanicRoutesOverTheSilentAndRetriesExcludeTheDead: four replicas of
// chat-small, three of them crashed (their adapters gone from NATS, their
// registrations left ready). One of four alive is below the pool's panic
// threshold (0.5): the decider routes over all four, and a request that
// lands on a dead one finds nothing listening (no-responders) and is
// retried without it, while the deciding gateway takes that replica out
// of its candidates until it is heard again: each dead replica costs at
// most its first failure, whatever the number of requests. At the default
// two retries, only a first request that met all three dead ones could
// fail.
func TestPanicRoutesOverTheSilentAndRetriesExcludeTheDead(t *testing.T) {
	reps := devstack.ReplicasNamed("l8-gen-0", "l8-gen-1")
	for _, id := range []string{"l8-gen-2", "l8-gen-3"} {
		r := reps[0]
		r.ID = id
		reps = append(reps, r)
	}
	st := startStack(t, devstack.Config{Replicas: reps, HeartbeatEvery: 100 * time.Millisecond})
	url := st.GatewayURL()
	bucket := kvBucket(t, st)
	e, err := bucket.Get(context.Background(), "policy")
	if err != nil {
		t.Fatal(err)
	}
	var pol map[string]any
	if err := json.Unmarshal(e.Value(), &pol); err != nil {
		t.Fatal(err)
	}
	pol["dead_after"], pol["stale_after"] = "1s", "500ms"
	if _, err := bucket.Put(context.Background(), "policy", jsonMarshal(pol)); err != nil {
		t.Fatal(err)
	}
	testkit.CheckFor(t, 10*time.Second, 10*time.Millisecond, testkit.Cond("the gateway to read dead_after 1s", func() bool {
		s := st.Gateway().Table()
		return s != nil && time.Duration(s.Policy.DeadAfter) == time.Second
	}))
	for _, id := range []string{"l8-gen-1", "l8-gen-2", "l8-gen-3"} {
		if err := st.CrashReplica(id); err != nil {
			t.Fatal(err)
		}
	}
	// Past dead_after the crashed replicas are silent, not deregistered.
	testkit.CheckFor(t, 10*time.Second, 20*time.Millisecond, testkit.Cond("the crashed replicas silent past dead_after", func() bool {
		for _, id := range []string{"l8-gen-1", "l8-gen-2", "l8-gen-3"} {
			if _, live := st.Broker(0).Router().Live(id, time.Now()); live {
				return false
			}
		}
		return true
	}))

	const n = 30
	served := map[string]int{}
	failed := 0
	for i := range n {
		o := send(context.Background(), url, chatBody("chat-small", 2, i%2 == 0))
		if !o.done {
			if i > 0 || !o.explicit() {
				t.Fatalf("request %d in panic: %v; want it served", i, o)
			}
			failed++ // the first met every dead replica: its retries ran out
			continue
		}
		served[o.replica]++
	}
	panics := metric(st, "switchyard_broker_panic_decisions_total", map[string]string{"pool": "general"})
	retries := metric(st, "switchyard_gateway_retries_total", nil)
	t.Logf("%d requests in panic: served by %v; %v decisions in panic, %v retries", n, served, panics, retries)
	if served["l8-gen-0"] != n-failed {
		t.Errorf("served by %v, want l8-gen-0 only (the others are dead)", served)
	}
	if panics == 0 {
		t.Error("no decision in panic")
	}
	if retries == 0 {
		t.Error("no retry: the panic sent nothing to the dead replicas (the test cannot tell)")
	}
	if retries > 3 {
		t.Errorf("%v retries for 3 dead replicas: a dead replica was tried again after it failed", retries)
	}
}
