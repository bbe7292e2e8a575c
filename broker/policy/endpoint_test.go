package policy_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Only replicas whose engine serves the endpoint are candidates; when no
// replica of the model serves it, the answer says so (501), not "busy".
func TestOnlyReplicasServingTheEndpointAreCandidates(t *testing.T) {
	e := newEnv(t)
	all := func(hb *subjects.Heartbeat) { hb.Endpoints = subjects.AllEndpoints() }
	e.beat("l8-gen-1", 0.9, 20, 0, all) // loaded, but the only one serving Responses
	for range 20 {
		q := chat("chat-small")
		q.Endpoint = subjects.EndpointResponses
		d := e.decide(q)
		mustRoute(t, d)
		if d.Replica != "l8-gen-1" {
			t.Fatalf("responses went to %s, whose engine does not serve it", d.Replica)
		}
	}
	// chat-large's replicas lack it; its fallback chat-small has one.
	q := chat("chat-large")
	q.Endpoint = subjects.EndpointMessages
	d := e.decide(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" {
		t.Errorf("messages for chat-large went to %s (%s), want the fallback's l8-gen-1", d.Replica, d.Reason)
	}
	none := newEnv(t)
	mustReject(t, none.decide(q), 501, subjects.CodeEndpointNotSupported)
	// Chat still goes anywhere.
	seen := map[string]bool{}
	for range 40 {
		d := e.decide(chat("chat-small"))
		mustRoute(t, d)
		seen[d.Replica] = true
	}
	if !seen["l8-gen-0"] {
		t.Errorf("chat never reached l8-gen-0: %v", seen)
	}
}

// A previous response pins its replica, whatever pool the new turn would
// take; a pinned replica that is gone or draining is a clear 404.
func TestPreviousResponsePinsItsReplica(t *testing.T) {
	e := newEnv(t)
	for range 10 {
		q := chat("chat-large")
		q.Pin = "l70-long-0" // a short turn of a conversation that started long
		d := e.decide(q)
		mustRoute(t, d)
		if d.Replica != "l70-long-0" || d.Reason != policy.ReasonResponse || d.Pool != "long-context" {
			t.Fatalf("pinned turn went to %s (%s, pool %s)", d.Replica, d.Reason, d.Pool)
		}
	}
	e.beat("l70-long-0", 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.State = subjects.StateDraining })
	q := chat("chat-large")
	q.Pin = "l70-long-0"
	d := e.decide(q)
	mustReject(t, d, 404, subjects.CodePreviousResponseNotFound)
	// The policy knows the replica, not the response's id: it says which.
	if want := "replica l70-long-0 that stored it"; !strings.Contains(d.Err.Message, want) || strings.Contains(d.Err.Message, "id 'l70-long-0'") {
		t.Errorf("message %q, want it to name %s as the replica", d.Err.Message, "l70-long-0")
	}
	q.Pin = "no-such-replica"
	mustReject(t, e.decide(q), 404, subjects.CodePreviousResponseNotFound)
	q = chat("chat-small")
	q.Pin = "l70-gen-0" // another model's replica
	mustReject(t, e.decide(q), 404, subjects.CodePreviousResponseNotFound)
}
