package policy_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
)

const twoTenants = `{"tenants.a": {}, "tenants.b": {}}`

// admit decides n requests of tenant with ids prefix-0…, each 100 prompt
// and 400 answer tokens, and fails unless every one is admitted.
func admit(e *env, tenant, prefix string, n int) {
	e.t.Helper()
	for i := range n {
		q := chat("chat-small")
		q.Tenant, q.ID, q.MaxTokens = tenant, prefix+strconv.Itoa(i), 400
		mustRoute(e.t, e.decide(q))
	}
}

// saturate reports every chat-small replica saturated (kv above
// saturation_kv), as of now.
func saturate(e *env) {
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.97, 30, 10)
	}
}

func request(tenant string) *policy.Request {
	q := chat("chat-small")
	q.Tenant, q.ID, q.MaxTokens = tenant, tenant+"-next", 400
	return q
}

func TestASaturatedPoolRefusesTheTenantAboveItsShare(t *testing.T) {
	e := newEnv(t, twoTenants)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 2)
	// Not shedding: a tenant above its share is still admitted.
	mustRoute(t, e.explain(request("a")))

	saturate(e)
	d := e.decide(request("a"))
	mustReject(t, d, 429, subjects.CodeFairShareExceeded)
	if d.Err.RetryAfter < policy.RetryBusyMin || d.Err.RetryAfter > policy.RetryBusyMax {
		t.Fatalf("RetryAfter %v, want 1–30 s", d.Err.RetryAfter)
	}
	// The refusal shows the shares: a's 75% of the tokens in flight
	// against a fair half, then b's.
	want := []subjects.TenantShare{
		{Tenant: "a", Tokens: 3000, Share: 0.75, Weight: 1, FairShare: 0.5},
		{Tenant: "b", Tokens: 1000, Share: 0.25, Weight: 1, FairShare: 0.5},
	}
	if got := d.Wire(request("a")).Shares; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("shares %+v, want %+v", got, want)
	}
	// b, within its share, keeps being admitted, and is shown the shares.
	for i := range 3 {
		q := request("b")
		q.ID = "b-more-" + strconv.Itoa(i)
		d := e.decide(q)
		mustRoute(t, d)
		if d.NShares != 2 || d.Shares[0].Tenant != "b" {
			t.Fatalf("admitted while shedding without the shares: %+v", d.Shares[:d.NShares])
		}
	}
	// A tenant with nothing in flight is within any share.
	q := request("default")
	mustRoute(t, e.decide(q))

	// Once a's requests end (their usage events), a is within its share.
	for i := range 6 {
		e.r.ObserveUsage(&subjects.Usage{Tenant: "a", RequestID: "a-" + strconv.Itoa(i), PromptTokens: 100, CompletionTokens: 10}, e.now)
	}
	d = e.decide(request("a"))
	mustRoute(t, d)
	if d.Shares[0].Tokens != 0 || d.Shares[0].Share != 0 {
		t.Fatalf("a's share after its usage: %+v", d.Shares[0])
	}
}

func TestOneTenantIsNeverAboveItsShare(t *testing.T) {
	e := newEnv(t, twoTenants)
	admit(e, "a", "a-", 4)
	saturate(e)
	d := e.decide(request("a"))
	mustRoute(t, d)
	if d.NShares != 1 || d.Shares[0].Share != 1 || d.Shares[0].FairShare != 1 {
		t.Fatalf("shares %+v, want a alone at its whole share", d.Shares[:d.NShares])
	}
}

func TestShareWeights(t *testing.T) {
	// a holds 75% of the tokens in flight: above an equal half, within
	// the three quarters a weight of 3 against 1 gives it.
	e := newEnv(t, `{"tenants.a": {"share_weight": 3}, "tenants.b": {"share_weight": 1}}`)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 2)
	saturate(e)
	d := e.decide(request("a"))
	mustRoute(t, d)
	if s := d.Shares[0]; s.Weight != 3 || s.FairShare != 0.75 {
		t.Fatalf("a's share %+v, want weight 3 and a fair 75%%", s)
	}
	mustReject(t, e.decide(request("a")), 429, subjects.CodeFairShareExceeded)
}

func TestShedAfter(t *testing.T) {
	e := newEnv(t, twoTenants, `{"pools.general": {"shed_after": "500ms"}}`)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 2)
	// Predicted at 300 and 400 ms: below shed_after, nobody is refused.
	slow(e, "l8-gen-0", 300)
	slow(e, "l8-gen-1", 400)
	mustRoute(t, e.explain(request("a")))
	// One candidate predicted below it: the pool still takes work.
	slow(e, "l8-gen-0", 2000)
	mustRoute(t, e.explain(request("a")))
	// Every candidate above it: the pool sheds, unsaturated.
	slow(e, "l8-gen-1", 900)
	d := e.explain(request("a"))
	mustReject(t, d, 429, subjects.CodeFairShareExceeded)
	mustRoute(t, e.explain(request("b")))

	// Without shed_after only saturation sheds.
	e.retable(twoTenants)
	mustRoute(t, e.explain(request("a")))
}

func TestBatchIsShedBeforeInteractive(t *testing.T) {
	e := newEnv(t, twoTenants, `{"pools.general": {"shed_after": "100ms"}}`)
	admit(e, "a", "a-", 4)
	admit(e, "b", "b-", 6)
	slow(e, "l8-gen-0", 900)
	slow(e, "l8-gen-1", 900)
	// a holds 40%: within its half for interactive work, above the
	// quarter its batch work may hold.
	mustRoute(t, e.explain(request("a")))
	q := request("a")
	q.Priority = subjects.PriorityBatch
	mustReject(t, e.explain(q), 429, subjects.CodeFairShareExceeded)
}

func TestAContinuationIsNeverShed(t *testing.T) {
	e := newEnv(t, twoTenants)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 1)
	saturate(e)
	mustReject(t, e.explain(request("a")), 429, subjects.CodeFairShareExceeded)
	q := request("a")
	q.ResumeFrom, q.ResumeTokens = "l8-gen-0", 20
	mustRoute(t, e.decide(q))
}

func TestExplainCountsNothingInFlight(t *testing.T) {
	e := newEnv(t, twoTenants)
	for range 10 {
		mustRoute(t, e.explain(request("a")))
	}
	if n := e.r.Flights(); n != 0 {
		t.Fatalf("%d flights counted by Explain", n)
	}
	admit(e, "b", "b-", 1)
	saturate(e)
	mustRoute(t, e.decide(request("a")))
}

func TestFlightsAreSettledOnceAndExpire(t *testing.T) {
	e := newEnv(t, twoTenants)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 2)
	if n := e.r.Flights(); n != 8 {
		t.Fatalf("%d flights, want 8", n)
	}
	// A request id used twice counts once.
	admit(e, "a", "a-", 6)
	if n := e.r.Flights(); n != 8 {
		t.Fatalf("%d flights after the same ids again, want 8", n)
	}
	// Usage of another decider's request, or a made-up one, lands nothing.
	e.r.ObserveUsage(&subjects.Usage{Tenant: "a", RequestID: "not-ours"}, e.now)
	if n := e.r.Flights(); n != 8 {
		t.Fatalf("%d flights after an unknown usage, want 8", n)
	}
	// An adapter that died never sends the usage: after FlightTTL its
	// requests stop counting.
	e.now = e.now.Add(policy.FlightTTL + 2*time.Minute)
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.1, 0, 0)
	}
	admit(e, "b", "b-late-", 1)
	if n := e.r.Flights(); n != 1 {
		t.Fatalf("%d flights after FlightTTL, want only the new one", n)
	}
	saturate(e)
	mustRoute(t, e.decide(request("a")))
}

func TestTheFurthestAboveItsShareIsRefusedFirst(t *testing.T) {
	e := newEnv(t, `{"tenants.a": {}, "tenants.b": {}, "tenants.c": {}}`)
	admit(e, "a", "a-", 6)
	admit(e, "b", "b-", 4)
	admit(e, "c", "c-", 1)
	saturate(e)
	// b holds 4/11, above its fair third, but a holds more: b is admitted
	// and a is refused.
	d := e.explain(request("b"))
	mustRoute(t, d)
	if s := d.Shares[0]; s.Share <= s.FairShare {
		t.Fatalf("b's share %+v: not above its fair share", s)
	}
	mustReject(t, e.explain(request("a")), 429, subjects.CodeFairShareExceeded)
	// Once b holds as much as a, b is refused too.
	admit(e, "b", "b-more-", 2)
	mustReject(t, e.explain(request("b")), 429, subjects.CodeFairShareExceeded)
}

func TestAReplicaAboveShedAfterIsPassedOverForRoomLeft(t *testing.T) {
	e := newEnv(t, twoTenants, `{"pools.general": {"shed_after": "500ms"}}`)
	slow(e, "l8-gen-0", 2000)
	slow(e, "l8-gen-1", 300)
	for range 20 {
		d := e.explain(request("a"))
		mustRoute(t, d)
		if d.Replica != "l8-gen-1" {
			t.Fatalf("routed to %s (%s) predicted above shed_after, with l8-gen-1 below it", d.Replica, d.Reason)
		}
		if d.Reason == "power-of-two+fair-share" && (d.NAlts == 0 || d.Alts[0].Why != policy.WhyShedAfter) {
			t.Fatalf("switched without saying why: %+v", d.Alternatives())
		}
	}
	// Without shed_after the choice is power of two's.
	e.retable(twoTenants)
	seen := map[string]bool{}
	for range 40 {
		seen[e.explain(request("a")).Replica] = true
	}
	if !seen["l8-gen-0"] {
		t.Fatal("without shed_after, the slow replica was never chosen: the test shows nothing")
	}
}
