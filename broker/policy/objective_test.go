package policy_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

// slowPool makes both chat-small replicas slow: 3 s and 2 s to the first
// token.
func slowPool(e *env) {
	slow(e, "l8-gen-0", 3000)
	slow(e, "l8-gen-1", 2000)
}

func TestObjectiveUnreachableRefusesInteractive(t *testing.T) {
	e := newEnv(t)
	slowPool(e)
	q := chat("chat-small")
	q.TTFTObjective = 500 * time.Millisecond
	d := e.decide(q)
	mustReject(t, d, 503, subjects.CodeTTFTObjectiveUnreachable)
	// The fastest prediction is 2 s: 1.5 s over the objective.
	if d.Err.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("RetryAfter %v, want 1.5s", d.Err.RetryAfter)
	}
	if d.TTFTObjective != 500*time.Millisecond || d.Wire(q).TTFTObjectiveMillis != 500 {
		t.Fatalf("objective %v in the decision, %d ms on the wire", d.TTFTObjective, d.Wire(q).TTFTObjectiveMillis)
	}
	// Nothing was committed: an idle pool admits the next one.
	slow(e, "l8-gen-0", 50)
	mustRoute(t, e.decide(q))
}

func TestObjectiveRetryAfterHasAFloor(t *testing.T) {
	e := newEnv(t)
	slow(e, "l8-gen-0", 900)
	slow(e, "l8-gen-1", 900)
	q := chat("chat-small")
	q.TTFTObjective = 800 * time.Millisecond
	d := e.decide(q)
	mustReject(t, d, 503, subjects.CodeTTFTObjectiveUnreachable)
	if d.Err.RetryAfter != policy.RetryObjectiveMin {
		t.Fatalf("RetryAfter %v, want %v", d.Err.RetryAfter, policy.RetryObjectiveMin)
	}
}

func TestObjectiveUnreachableRoutesBatchToTheFastest(t *testing.T) {
	e := newEnv(t)
	slowPool(e)
	for range 20 {
		q := chat("chat-small")
		q.Priority = subjects.PriorityBatch
		q.TTFTObjective = 500 * time.Millisecond
		d := e.explain(q)
		mustRoute(t, d)
		if d.Replica != "l8-gen-1" {
			t.Fatalf("batch work went to %s (%s), want the fastest, l8-gen-1", d.Replica, d.Reason)
		}
	}
}

func TestObjectiveSwitchesToTheFastestReplica(t *testing.T) {
	e := newEnv(t)
	conv := convOn(t, e, "l8-gen-0")
	slow(e, "l8-gen-0", 3000)
	slow(e, "l8-gen-1", 200)
	q := chat("chat-small")
	q.Conversation, q.TTFTObjective = conv, time.Second
	d := e.decide(q)
	mustRoute(t, d)
	if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonSession+"+"+policy.ReasonObjective {
		t.Fatalf("%s (%s), want l8-gen-1 for the objective", d.Replica, d.Reason)
	}
	if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhyObjective {
		t.Fatalf("alternatives %+v", a)
	}
}

func TestDeadlineWinsOverObjective(t *testing.T) {
	e := newEnv(t)
	slowPool(e)
	q := chat("chat-small")
	q.Deadline, q.TTFTObjective = t0.Add(time.Second), 500*time.Millisecond
	mustReject(t, e.decide(q), 503, subjects.CodeDeadlineUnmeetable)
	// A deadline that fits leaves the objective to refuse.
	q.Deadline = t0.Add(time.Minute)
	mustReject(t, e.decide(q), 503, subjects.CodeTTFTObjectiveUnreachable)
}

func TestObjectiveDefaults(t *testing.T) {
	e := newEnv(t, `{"tenants.slo": {"ttft_objective": "500ms"},
		"models.llama-3-8b-instruct": {"versions": ["v1.0.0"], "tier": "hot", "max_context_tokens": 131072, "ttft_objective": "1s"}}`)
	slowPool(e)
	q := chat("chat-small")
	q.Tenant = "slo"
	d := e.decide(q)
	mustReject(t, d, 503, subjects.CodeTTFTObjectiveUnreachable)
	if d.TTFTObjective != 500*time.Millisecond {
		t.Fatalf("objective %v, want the tenant's 500ms", d.TTFTObjective)
	}
	// Another tenant gets the model's.
	q.Tenant = "default"
	if d = e.decide(q); d.Err == nil || d.TTFTObjective != time.Second {
		t.Fatalf("objective %v (%v), want the model's 1s", d.TTFTObjective, d.Err)
	}
	// The request's own objective comes first.
	q.Tenant, q.TTFTObjective = "slo", 5*time.Second
	d = e.decide(q)
	mustRoute(t, d)
	if d.TTFTObjective != 5*time.Second {
		t.Fatalf("objective %v, want the request's 5s", d.TTFTObjective)
	}
	// Without any, nothing is refused for it.
	e.retable()
	slowPool(e)
	q.TTFTObjective = 0
	mustRoute(t, e.decide(q))
}

func TestObjectiveNeverRefusesAContinuation(t *testing.T) {
	e := newEnv(t)
	slowPool(e)
	q := chat("chat-small")
	q.TTFTObjective = 500 * time.Millisecond
	q.ResumeFrom, q.ResumeTokens = "l8-gen-9", 12
	mustRoute(t, e.decide(q))
}
