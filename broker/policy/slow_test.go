package policy_test

import (
	"strconv"
	"testing"

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
