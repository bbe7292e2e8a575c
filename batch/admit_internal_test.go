package batch

import (
	"testing"
	"time"
)

// TestARefusalShrinksTheWindowToWhatThePoolHolds: a 503 says the pool is
// full with the lines it holds, so the window shrinks to the other lines
// in flight and the refused line leaves it: the place it had starts no
// line, while a line that ends is replaced. Answers grow the window
// slowly within probeAfter of a refusal, a line per answer after; a 429
// pauses its tenant and leaves the window.
func TestARefusalShrinksTheWindowToWhatThePoolHolds(t *testing.T) {
	var a admission
	a.init(256, newMetrics(nil), time.Now)
	a.setActive(1)
	a.window = 60
	for range 50 {
		a.take("acme")
	}
	if n := a.room("acme"); n != 10 {
		t.Fatalf("50 of a window of 60 in flight: room %d, want 10", n)
	}
	refuse := func() {
		a.refused("acme", 503, time.Second)
		a.release("acme", nil)
	}
	refuse()
	if a.window != 49 {
		t.Fatalf("a refusal with 49 other lines in flight: window %v, want 49", a.window)
	}
	if n := a.room("acme"); n != 0 {
		t.Errorf("after the refusal: room %d, want 0 (the pool holds what is in flight)", n)
	}
	// Interactive traffic takes the pool: lines end, their replacements
	// are refused, and the window follows what is left.
	for range 5 {
		a.release("acme", nil)
		a.take("acme")
		refuse()
	}
	if a.window != 44 || a.total != 44 {
		t.Errorf("five lines ended and their replacements refused: window %v with %d in flight, want 44 and 44", a.window, a.total)
	}
	// A line that ends and is answered is replaced at once; the window
	// grows a line per window of answers just after a refusal.
	a.release("acme", nil)
	a.answered()
	if n := a.room("acme"); n != 1 || a.window <= 44 || a.window >= 45 {
		t.Errorf("an answer just after a refusal: room %d, window %v; want 1 and a window between 44 and 45", n, a.window)
	}
	a.lastRefusal = time.Now().Add(-probeAfter)
	w := a.window
	a.answered()
	if a.window != w+1 {
		t.Errorf("an answer %v after a refusal: window %v, want %v", probeAfter, a.window, w+1)
	}
	a.refused("acme", 429, time.Minute)
	if a.window != w+1 || a.room("acme") != 0 {
		t.Errorf("a 429: window %v (want it left at %v), room %d (want 0: its tenant paused)", a.window, w+1, a.room("acme"))
	}
	for a.total > 0 {
		a.release("acme", nil)
	}
	a.refused("acme", 503, time.Second)
	if a.window != 1 {
		t.Errorf("a refusal with nothing else in flight: window %v, want 1", a.window)
	}
}

// TestTenantsShareTheWindow: each tenant with running batches may start
// lines up to its share of the window, and a 429 pauses only its own.
func TestTenantsShareTheWindow(t *testing.T) {
	var a admission
	a.init(256, newMetrics(nil), time.Now)
	a.setActive(2)
	a.window = 40
	for range 20 {
		a.take("acme")
	}
	if n := a.room("acme"); n != 0 {
		t.Errorf("acme holds its share of 20: room %d", n)
	}
	if n := a.room("globex"); n != 20 {
		t.Errorf("globex holds nothing: room %d, want its share of 20", n)
	}
	a.refused("globex", 429, time.Minute)
	if n := a.room("globex"); n != 0 {
		t.Errorf("globex after a 429: room %d, want 0 until its Retry-After", n)
	}
	a.release("acme", nil)
	if n := a.room("acme"); n != 1 {
		t.Errorf("acme after a line ended: room %d, want 1", n)
	}
}
