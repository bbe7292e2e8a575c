package policy_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// TestAvoidedReplicaIsTheLastResort: a replica the gateway avoids (slow
// to accept this request) is chosen only when no other candidate is left;
// one it excludes (it failed) is not chosen at all.
func TestAvoidedReplicaIsTheLastResort(t *testing.T) {
	e := newEnv(t)
	for i := range 50 {
		q := chat("chat-small")
		q.Conversation = "c-" + strconv.Itoa(i) // session affinity would pin half of them to l8-gen-0
		q.Avoid = []string{"l8-gen-0"}
		d := e.decide(q)
		mustRoute(t, d)
		if d.Replica == "l8-gen-0" {
			t.Fatalf("decision %d chose the avoided l8-gen-0 beside l8-gen-1 (%s)", i, d.Reason)
		}
	}

	q := chat("qwen-coder-32b")
	q.Avoid = []string{"coder-gen-0"}
	d := e.decide(q)
	mustRoute(t, d)
	if d.Replica != "coder-gen-0" {
		t.Errorf("the only replica, avoided: routed to %q, want coder-gen-0 again", d.Replica)
	}

	q = chat("qwen-coder-32b")
	q.Exclude = []string{"coder-gen-0"}
	mustReject(t, e.decide(q), 503, subjects.CodeNoReplicas)
}

// TestAnAvoidedSilentReplicaGivesWayToTheFallback: an avoided replica not
// heard from for SilentAfter is not slow but silent (cut off, frozen): it
// is no candidate, so the alias's fallback serves, and a model without
// one is refused no_replicas; heard just within it, it is the last resort
// still. A router that itself lags does not count its own deafness.
func TestAnAvoidedSilentReplicaGivesWayToTheFallback(t *testing.T) {
	e := newEnv(t)
	beatAllBut := func(silent string) {
		for id := range e.r.Table().Replicas {
			if id != silent {
				e.beat(id, 0.1, 0, 0)
			}
		}
	}
	e.now = e.now.Add(policy.SilentAfter - time.Millisecond)
	beatAllBut("coder-gen-0")
	q := chat("code")
	q.Avoid = []string{"coder-gen-0"}
	if d := e.decide(q); d.Err != nil || d.Replica != "coder-gen-0" {
		t.Fatalf("avoided and heard %v ago: %s %v (%s), want coder-gen-0 again", policy.SilentAfter-time.Millisecond, d.Replica, d.Err, d.Reason)
	}

	e.now = e.now.Add(time.Millisecond)
	beatAllBut("coder-gen-0")
	d := e.decide(q)
	mustRoute(t, d)
	if d.Replica == "coder-gen-0" || !strings.HasPrefix(d.Reason, policy.ReasonFallback+"chat-large") {
		t.Errorf("avoided and silent for %v: %s (%s), want the fallback chat-large", policy.SilentAfter, d.Replica, d.Reason)
	}
	q = chat("qwen-coder-32b")
	q.Avoid = []string{"coder-gen-0"}
	mustReject(t, e.decide(q), 503, subjects.CodeNoReplicas)

	// Not avoided, the same silence is dead_after's to judge.
	q = chat("code")
	if d := e.decide(q); d.Replica != "coder-gen-0" {
		t.Errorf("not avoided, silent for %v: %s (%s), want coder-gen-0", policy.SilentAfter, d.Replica, d.Reason)
	}

	// A router that lags and has heard nobody for 3 s takes that silence
	// as its own: the avoided replica, unheard for 1.5 s before that
	// (4.5 s in all), is slow still.
	beatAllBut("")
	e.now = e.now.Add(1500 * time.Millisecond)
	beatAllBut("coder-gen-0")
	e.r.SetLagging(true)
	e.now = e.now.Add(3 * time.Second)
	q = chat("code")
	q.Avoid = []string{"coder-gen-0"}
	if d := e.decide(q); d.Err != nil || d.Replica != "coder-gen-0" {
		t.Errorf("a lagging router, deaf for 3 s: %s %v (%s), want coder-gen-0 again", d.Replica, d.Err, d.Reason)
	}
}
