package batch

import (
	"testing"
	"time"
)

// TestARefusalCutsTheWindowNoLowerThanThePoolHeld: a refusal says the pool
// is full with the lines it holds (in flight, not waiting out a refusal),
// so the window keeps them; it is cut by a quarter only when it was wider
// than that by more, at most once a cutEvery, and never widened. Answers
// open it again, a line at a time.
func TestARefusalCutsTheWindowNoLowerThanThePoolHeld(t *testing.T) {
	var a admission
	a.init(256, newMetrics(nil))
	a.setActive(1)
	a.window = 40
	for range 40 {
		a.take("acme")
	}
	a.refused("acme", 503, time.Second)
	if a.window != 39 {
		t.Fatalf("a refusal with 39 of 40 lines held: window %v, want 39", a.window)
	}
	if n := a.room("acme"); n != 0 {
		t.Errorf("room %d with the window full", n)
	}
	a.refused("acme", 503, time.Second)
	if a.window != 39 {
		t.Errorf("a second refusal within %v cut the window to %v", cutEvery, a.window)
	}
	// Interactive traffic took the pool: lines ended and were not
	// replaced, and a second later most of those in flight wait out
	// refusals.
	for range 20 {
		a.release("acme")
	}
	for range 10 {
		a.refused("acme", 503, time.Second)
	}
	a.lastCut = time.Now().Add(-cutEvery)
	a.refused("acme", 503, time.Second)
	if want := 39 * cutTo; a.window != want {
		t.Errorf("a refusal with 7 of 20 held, a window of 39: window %v, want %v", a.window, want)
	}
	for range 12 {
		a.retry()
	}
	a.lastCut = time.Now().Add(-cutEvery)
	a.window = 10
	a.refused("acme", 503, time.Second)
	if a.window != 10 {
		t.Errorf("a refusal widened a window of 10 to %v", a.window)
	}
	a.retry()
	a.answered()
	if a.window != 11 {
		t.Errorf("an answer: window %v, want 11", a.window)
	}
}

// TestTenantsShareTheWindow: each tenant with running batches may start
// lines up to its share of the window, and a 429 pauses only its own.
func TestTenantsShareTheWindow(t *testing.T) {
	var a admission
	a.init(256, newMetrics(nil))
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
	a.lastCut = time.Now() // the window was cut just now: this refusal leaves it
	a.refused("globex", 429, time.Minute)
	if n := a.room("globex"); n != 0 {
		t.Errorf("globex after a 429: room %d, want 0 until its Retry-After", n)
	}
	a.release("acme")
	if n := a.room("acme"); n != 1 {
		t.Errorf("acme after a line ended: room %d, want 1", n)
	}
}
