package adapter

import (
	"math"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

func TestDecodeTimeIsAMovingAverage(t *testing.T) {
	var l loadState
	l.observeDecode(0) // an instant stream teaches nothing
	l.observeDecode(-time.Second)
	if l.decode != 0 {
		t.Fatalf("decode %v ms learned from nothing", l.decode)
	}
	l.observeDecode(4 * time.Second)
	if l.decode != 4000 {
		t.Fatalf("decode %v ms, want 4000", l.decode)
	}
	l.observeDecode(2 * time.Second)
	if want := 4000 + decodeAlpha*(2000-4000); math.Abs(l.decode-want) > 1e-9 {
		t.Fatalf("decode %v ms, want %v", l.decode, want)
	}
	var m loadState
	m.observeDecode(1000 * time.Hour) // bounded to what a heartbeat may carry
	if m.decode != subjects.MaxHeartbeatMillis {
		t.Fatalf("decode %v ms, want the bound %d", m.decode, subjects.MaxHeartbeatMillis)
	}
}

// A request that finds the batch full waits for a slot: a slot frees every
// decode time / batch. That wait is not prefill, and the prefill rate is
// learned without it.
func TestSlotWait(t *testing.T) {
	var l loadState
	if w := l.slotWaitFor(40, 32); w != 0 {
		t.Fatalf("wait %v without a decode time", w)
	}
	l.observeDecode(3200 * time.Millisecond)
	for _, tt := range []struct {
		inflight, batch int
		want            time.Duration
	}{
		{10, 32, 0},
		{32, 32, 0},
		{33, 32, 100 * time.Millisecond},
		{42, 32, time.Second},
		{42, 0, 0},
	} {
		if got := l.slotWaitFor(tt.inflight, tt.batch); got != tt.want {
			t.Errorf("%d in flight, batch %d: wait %v, want %v", tt.inflight, tt.batch, got, tt.want)
		}
	}
	l.observeTTFT(50 * time.Millisecond)
	// 1000 tokens: 1050 ms to the first token, 900 of them waiting for a
	// slot; 100 ms beyond the base are prefill.
	l.observePrefill(0, 1000, 1050*time.Millisecond-l.slotWaitFor(41, 32))
	if l.prefillRate != 10000 {
		t.Fatalf("rate %v tokens/s, want 10000", l.prefillRate)
	}
}

// At a priority engine, the batch lines beyond the batch wait last: an
// interactive request's slot wait leaves them out, a batch line's does not,
// and the heartbeat says how many there are.
func TestBatchLinesWaitLast(t *testing.T) {
	var a Adapter
	a.load.observeDecode(3200 * time.Millisecond)
	a.book.batchHeld.Store(6)
	if got := a.batchWaiting(40, 32); got != 6 {
		t.Fatalf("batch waiting %d of 8 beyond the batch, 6 held: want 6", got)
	}
	if got := a.batchWaiting(35, 32); got != 3 {
		t.Fatalf("batch waiting %d of 3 beyond the batch: want 3", got)
	}
	if got := a.batchWaiting(20, 32); got != 0 {
		t.Fatalf("batch waiting %d with room in the batch", got)
	}
	a.limits = limits{batch: 32, batchFrom: LimitConfigured}
	a.book.inflight.Store(41) // the request's own included
	interactive, batch := a.slotWait(false), a.slotWait(true)
	if interactive != 300*time.Millisecond || batch != 900*time.Millisecond {
		t.Fatalf("slot wait %v interactive, %v batch; want 300ms, 900ms", interactive, batch)
	}
}
