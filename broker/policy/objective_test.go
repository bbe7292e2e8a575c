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

// loaded makes id's heartbeat say 3 s to the first token, of which 2.96 s
// is queue: its base TTFT (the fastest it ever answered) is 40 ms.
func loaded(e *env, id string) {
	e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.TTFTEWMAMillis, hb.QueueWaitMillis = 3000, 2960 })
}

// noEvidence makes id's heartbeat carry no TTFT evidence: its engine has
// timed no first token yet.
func noEvidence(e *env, id string) {
	e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.TTFTEWMAMillis, hb.QueueWaitMillis = 0, 0 })
}

// A replica whose engine has given no TTFT evidence is judged as the
// fastest unloaded replica of its group on top of its own queue: not as
// 0 ms, and not as the loaded ones. With no evidence anywhere nothing is
// judged, and the decision says so.
func TestObjectiveWithoutTTFTEvidence(t *testing.T) {
	q := chat("chat-small")
	q.TTFTObjective = time.Second

	t.Run("an idle newcomer beside a loaded replica is admitted", func(t *testing.T) {
		e := newEnv(t)
		loaded(e, "l8-gen-0")
		noEvidence(e, "l8-gen-1")
		d := e.decide(q)
		mustRoute(t, d)
		if d.Replica != "l8-gen-1" || !d.NoTTFTEvidence || d.PredictedTTFT != 0 {
			t.Fatalf("%s (no evidence %v, predicted %v); want the idle newcomer, no prediction of its own", d.Replica, d.NoTTFTEvidence, d.PredictedTTFT)
		}
	})
	t.Run("judged by the group's lowest base, not 0 ms", func(t *testing.T) {
		e := newEnv(t)
		loaded(e, "l8-gen-0")
		noEvidence(e, "l8-gen-1")
		tight := chat("chat-small")
		tight.TTFTObjective = time.Millisecond // below l8-gen-0's 40 ms base
		mustReject(t, e.decide(tight), 503, subjects.CodeTTFTObjectiveUnreachable)
	})
	t.Run("no evidence anywhere: nothing judged", func(t *testing.T) {
		e := newEnv(t)
		noEvidence(e, "l8-gen-0")
		noEvidence(e, "l8-gen-1")
		tight := chat("chat-small")
		tight.TTFTObjective = time.Millisecond
		d := e.decide(tight)
		mustRoute(t, d)
		if !d.NoTTFTEvidence || d.PredictedTTFT != 0 || !d.Wire(tight).NoTTFTEvidence {
			t.Fatalf("decision %+v; want it to say there is no TTFT evidence", d)
		}
	})
}
