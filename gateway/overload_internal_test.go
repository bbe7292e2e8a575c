package gateway

import (
	"testing"
	"time"
)

// Past the limit, batch work is refused first (from ¾ of it), and a
// tenant below its fair share of the limit is still admitted while the
// tenant that fills it is refused.
func TestConcurrencyRefusesInFairShareOrder(t *testing.T) {
	now := time.Unix(0, 0)
	c := newConcurrency(0, now)
	c.limit = 100
	for range 75 {
		if !c.admit("a", false, now) {
			t.Fatal("refused below the limit")
		}
	}
	if c.admit("a", true, now) {
		t.Error("batch admitted at ¾ of the limit")
	}
	for range 25 {
		if !c.admit("a", false, now) {
			t.Fatal("interactive refused below the limit")
		}
	}
	if c.admit("a", false, now) {
		t.Error("the tenant holding the whole limit admitted past it")
	}
	if !c.admit("b", false, now) {
		t.Error("a tenant with nothing pending refused: it is below its fair share")
	}
	if c.admit("b", true, now) {
		t.Error("batch admitted past the limit")
	}
	c.done("a", false)
	c.done("b", false)
	if c.pending != 99 || c.open != 99 || c.tenants["a"] != 99 {
		t.Errorf("pending %d, open %d, a %d after two ends; want 99, 99, 99", c.pending, c.open, c.tenants["a"])
	}
	if _, ok := c.tenants["b"]; ok {
		t.Error("a tenant with nothing pending still counted among the active")
	}
}

// An accepted request (a stream a replica serves) no longer counts against
// the adaptive limit, only against the ceiling: long streams do not shut
// the door on new requests.
func TestAcceptedRequestsLeaveTheLimit(t *testing.T) {
	now := time.Unix(0, 0)
	c := newConcurrency(0, now)
	c.limit = 10
	for range 10 {
		c.admit("a", false, now)
		c.accepted("a")
	}
	if !c.admit("a", false, now) {
		t.Errorf("refused with 10 streams accepted and nothing pending (limit 10)")
	}
	c.done("a", false)
	for range 10 {
		c.done("a", true)
	}
	if c.pending != 0 || c.open != 0 || len(c.tenants) != 0 {
		t.Errorf("pending %d, open %d, tenants %v after every end; want 0, 0, none", c.pending, c.open, c.tenants)
	}
}

// The ceiling (--max-inflight) is hard: nobody passes it, fair share or
// not, accepted or not, and the adaptive limit never exceeds it.
func TestConcurrencyCeilingIsHard(t *testing.T) {
	now := time.Unix(0, 0)
	c := newConcurrency(3, now)
	if c.Limit() != 3 {
		t.Fatalf("limit %v under a ceiling of 3", c.Limit())
	}
	for range 3 {
		c.admit("a", false, now)
		c.accepted("a")
	}
	if c.admit("b", false, now) {
		t.Error("admitted past the ceiling")
	}
}

// The limit follows the accept latency against its measured minimum:
// slower windows shrink it to the floor while it is in use, and windows
// back at the minimum grow it again, but not past twice what is pending.
func TestConcurrencyLimitFollowsLatency(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newConcurrency(0, t0)
	now := t0
	window := func(latency time.Duration) {
		now = now.Add(limitWindow)
		for range limitSamples {
			c.observe(latency, now)
		}
	}
	window(2 * time.Millisecond) // the minimum
	if c.Limit() != InitialInflightLimit {
		t.Fatalf("limit %v after a window at the minimum, want it unchanged at %d (not in use)", c.Limit(), InitialInflightLimit)
	}
	for c.pending < 3000 {
		c.admit("a", false, now)
	}
	c.peak = c.pending
	for range 20 {
		window(800 * time.Millisecond)
	}
	if c.Limit() != MinInflightLimit {
		t.Errorf("limit %v after 20 windows 400 times slower, want the floor %d", c.Limit(), MinInflightLimit)
	}
	for range 20 {
		window(2 * time.Millisecond)
	}
	if l := c.Limit(); l < 2000 {
		t.Errorf("limit %v after 20 windows back at the minimum with 3000 pending, want it grown back", l)
	}
	for c.pending > 10 {
		c.done("a", false)
	}
	c.peak = c.pending
	before := c.Limit()
	window(2 * time.Millisecond)
	if c.Limit() != before {
		t.Errorf("limit moved %v → %v with 10 pending: it grows only in use", before, c.Limit())
	}
	// Jitter within the slack (a pause of a busy process) is not slower;
	// past it is.
	c.peak = 3000
	window(6 * time.Millisecond)
	if c.Limit() < before {
		t.Errorf("limit fell %v → %v on 6 ms accepts: within the slack", before, c.Limit())
	}
	before = c.Limit()
	c.peak = 3000
	window(9 * time.Millisecond)
	if c.Limit() >= before {
		t.Errorf("limit %v → %v on 9 ms accepts: past the slack (5 ms over the minimum's 1.25×), it falls", before, c.Limit())
	}
}

// A limit cut to its floor while everything pending is refused gets no
// sample; it grows back with time instead of staying shut.
func TestACutLimitGrowsBackWithoutSamples(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := newConcurrency(0, t0)
	c.limit = MinInflightLimit
	for range MinInflightLimit {
		c.admit("a", false, t0)
	}
	if c.admit("a", false, t0) {
		t.Fatal("admitted past the limit")
	}
	later := t0.Add(10 * limitWindow)
	if !c.admit("a", false, later) {
		t.Errorf("refused after 10 windows without a sample; limit %v", c.Limit())
	}
}
