package gateway

import (
	"testing"
	"time"
)

// Past the limit, batch work is refused first (from ¾ of it), and a
// tenant below its fair share of the limit is still admitted while the
// tenant that fills it is refused.
func TestConcurrencyRefusesInFairShareOrder(t *testing.T) {
	c := newConcurrency(0, time.Unix(0, 0))
	c.limit = 100
	for range 75 {
		if !c.admit("a", false) {
			t.Fatal("refused below the limit")
		}
	}
	if c.admit("a", true) {
		t.Error("batch admitted at ¾ of the limit")
	}
	for range 25 {
		if !c.admit("a", false) {
			t.Fatal("interactive refused below the limit")
		}
	}
	if c.admit("a", false) {
		t.Error("the tenant holding the whole limit admitted past it")
	}
	if !c.admit("b", false) {
		t.Error("a tenant with nothing open refused: it is below its fair share")
	}
	if c.admit("b", true) {
		t.Error("batch admitted past the limit")
	}
	c.done("a")
	c.done("b")
	if c.inflight != 99 || c.tenants["a"] != 99 || c.tenants["b"] != 0 {
		t.Errorf("open %d, a %d, b %d after two ends; want 99, 99, 0", c.inflight, c.tenants["a"], c.tenants["b"])
	}
	if _, ok := c.tenants["b"]; ok {
		t.Error("a tenant with nothing open still counted among the active")
	}
}

// The ceiling (--max-inflight) is hard: nobody passes it, fair share or
// not, and the adaptive limit never exceeds it.
func TestConcurrencyCeilingIsHard(t *testing.T) {
	c := newConcurrency(3, time.Unix(0, 0))
	if c.Limit() != 3 {
		t.Fatalf("limit %v under a ceiling of 3", c.Limit())
	}
	for range 3 {
		c.admit("a", false)
	}
	if c.admit("b", false) {
		t.Error("admitted past the ceiling")
	}
}

// The limit follows the accept latency against its measured minimum:
// slower windows shrink it to the floor while it is in use, and windows
// back at the minimum grow it again, but not past twice what is open.
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
	for c.inflight < 3000 {
		c.admit("a", false)
	}
	c.peak = c.inflight
	for range 20 {
		window(400 * time.Millisecond)
	}
	if c.Limit() != MinInflightLimit {
		t.Errorf("limit %v after 20 windows 200 times slower, want the floor %d", c.Limit(), MinInflightLimit)
	}
	for range 20 {
		window(2 * time.Millisecond)
	}
	if l := c.Limit(); l < 2000 {
		t.Errorf("limit %v after 20 windows back at the minimum with 3000 open, want it grown back", l)
	}
	for c.inflight > 10 {
		c.done("a")
	}
	c.peak = c.inflight
	before := c.Limit()
	window(2 * time.Millisecond)
	if c.Limit() != before {
		t.Errorf("limit moved %v → %v with 10 open: it grows only in use", before, c.Limit())
	}
}
