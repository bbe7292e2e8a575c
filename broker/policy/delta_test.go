package policy_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// seq sets a heartbeat's Seq and in-flight count.
func seq(n uint64, inflight int) func(*subjects.Heartbeat) {
	return func(h *subjects.Heartbeat) { h.Seq, h.Inflight = n, inflight }
}

func TestLoadDeltaMovesTheViewUntilTheNextHeartbeat(t *testing.T) {
	e := newEnv(t, predictedTTFT)
	e.beat("l8-gen-0", 0.1, 2, 0, prefill(1000, 0), seq(7, 2))
	e.beat("l8-gen-1", 0.1, 2, 0, prefill(1000, 600), seq(3, 2))
	q := chat("chat-small")
	q.PromptTokens = 400
	if d := e.explain(q); d.Replica != "l8-gen-0" || !near(d.PredictedTTFT, 450) {
		t.Fatalf("%s at %v ms, want l8-gen-0 at 450", d.Replica, d.PredictedTTFT)
	}
	delta := func(replica string, hb, n uint64, inflight, queued int) bool {
		return e.r.ObserveLoadDelta(&subjects.LoadDelta{Replica: replica, Heartbeat: hb, Seq: n, Inflight: inflight,
			QueuedPrefillTokens: queued, SentUnixMillis: e.now.UnixMilli()}, e.now)
	}
	// Twelve requests reached l8-gen-0 since its heartbeat: 5 s of prefill.
	if !delta("l8-gen-0", 7, 1, 14, 5000) {
		t.Fatal("a delta on top of the heartbeat held was not applied")
	}
	d := e.explain(q)
	if d.Replica != "l8-gen-1" || !near(d.PredictedTTFT, 1050) {
		t.Fatalf("%s at %v ms, want l8-gen-1 at 1050 after l8-gen-0's delta", d.Replica, d.PredictedTTFT)
	}
	if a := d.Alternatives(); len(a) != 1 || !near(a[0].PredictedTTFTMillis, 5450) {
		t.Fatalf("alternatives %+v, want l8-gen-0 at 5450 ms", a)
	}
	// A delta of another heartbeat (the next, not yet heard, or one
	// gone), and an older delta, change nothing.
	for _, c := range []struct {
		hb, n uint64
	}{{8, 2}, {6, 2}, {7, 1}} {
		if delta("l8-gen-0", c.hb, c.n, 2, 0) {
			t.Errorf("delta %d of heartbeat %d applied on top of heartbeat 7 after delta 1", c.n, c.hb)
		}
	}
	if d := e.explain(q); d.Replica != "l8-gen-1" {
		t.Fatalf("%s, want l8-gen-1 still", d.Replica)
	}
	// The next heartbeat is the truth: the delta is gone with it.
	e.beat("l8-gen-0", 0.1, 2, 0, prefill(1000, 0), seq(8, 2))
	if d := e.explain(q); d.Replica != "l8-gen-0" || !near(d.PredictedTTFT, 450) {
		t.Fatalf("%s at %v ms, want l8-gen-0 at 450 after its next heartbeat", d.Replica, d.PredictedTTFT)
	}
}

func TestLoadDeltaOfEndedRequestsLowersTheScore(t *testing.T) {
	e := newEnv(t)
	// l8-gen-0's heartbeat: a full batch and a queue; l8-gen-1 half busy.
	e.beat("l8-gen-0", 0.2, 32, 20, seq(4, 52))
	e.beat("l8-gen-1", 0.2, 16, 0, seq(9, 16))
	q := chat("chat-small")
	before := e.explain(q)
	if before.Replica != "l8-gen-1" {
		t.Fatalf("%s, want the less loaded l8-gen-1", before.Replica)
	}
	// Forty of l8-gen-0's requests ended since: the queue drained and
	// the batch is 12.
	if !e.r.ObserveLoadDelta(&subjects.LoadDelta{Replica: "l8-gen-0", Heartbeat: 4, Seq: 1, Inflight: 12}, e.now) {
		t.Fatal("delta not applied")
	}
	if d := e.explain(q); d.Replica != "l8-gen-0" {
		t.Fatalf("%s (score %v), want l8-gen-0 once its delta says 12 in flight", d.Replica, d.Score)
	}
}

func TestLoadViewAgeIsTheNewestMeasure(t *testing.T) {
	e := newEnv(t)
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.beat(id, 0.1, 0, 0, seq(1, 0), func(h *subjects.Heartbeat) { h.SentUnixMillis = t0.UnixMilli() })
	}
	e.now = t0.Add(800 * time.Millisecond)
	d := e.explain(chat("chat-small"))
	mustRoute(t, d)
	if d.LoadViewAge != 800*time.Millisecond {
		t.Fatalf("load view age %v, want the heartbeat's 800ms", d.LoadViewAge)
	}
	// A delta measured 10 ms ago, delivered now: the view is 10 ms old.
	for _, id := range []string{"l8-gen-0", "l8-gen-1"} {
		e.r.ObserveLoadDelta(&subjects.LoadDelta{Replica: id, Heartbeat: 1, Seq: 1, SentUnixMillis: e.now.Add(-10 * time.Millisecond).UnixMilli()}, e.now)
	}
	if d := e.explain(chat("chat-small")); d.LoadViewAge != 10*time.Millisecond {
		t.Fatalf("load view age %v, want the delta's 10ms", d.LoadViewAge)
	}
}

func TestAnotherDecidersPlacementCountsUntilTheNextDelta(t *testing.T) {
	e := newEnv(t, predictedTTFT)
	e.beat("l8-gen-0", 0.1, 2, 0, prefill(1000, 0), seq(5, 2))
	e.beat("l8-gen-1", 0.1, 2, 0, prefill(1000, 600), seq(5, 2))
	q := chat("chat-small")
	q.PromptTokens = 400
	// Another decider sent l8-gen-0 a request of 5000 uncached tokens.
	e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-0", Uncached: 5000})
	d := e.explain(q)
	if d.Replica != "l8-gen-1" {
		t.Fatalf("%s, want l8-gen-1 while l8-gen-0 prefills another decider's 5000 tokens", d.Replica)
	}
	if a := d.Alternatives(); len(a) != 1 || !near(a[0].PredictedTTFTMillis, 5450) {
		t.Fatalf("alternatives %+v, want l8-gen-0 at 5450 ms", a)
	}
	// Its delta counts the request (here: its first token already came).
	e.r.ObserveLoadDelta(&subjects.LoadDelta{Replica: "l8-gen-0", Heartbeat: 5, Seq: 1, Inflight: 3}, e.now)
	if d := e.explain(q); d.Replica != "l8-gen-0" || !near(d.PredictedTTFT, 450) {
		t.Fatalf("%s at %v ms, want l8-gen-0 at 450 once its delta counted the request", d.Replica, d.PredictedTTFT)
	}
	// An absurd count cannot overflow the view.
	e.r.ObservePlacement(&subjects.Placement{Model: "llama-3-8b-instruct", Replica: "l8-gen-1", Uncached: 1 << 62})
	if d := e.explain(q); d.Replica != "l8-gen-0" {
		t.Fatalf("%s, want l8-gen-0 beside l8-gen-1's huge placement", d.Replica)
	}
}
