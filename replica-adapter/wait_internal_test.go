package adapter

import (
	"testing"
	"time"
)

func TestWaitEstimateFollowsTheEngine(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	busy := func() *loadState {
		l := &loadState{have: true, sample: LoadSample{Running: 4, Waiting: 2}}
		l.observeTTFTAt(200*time.Millisecond, t0)
		for range 20 {
			l.observeTTFTAt(6*time.Second, t0)
		}
		return l
	}
	t.Run("busy engine keeps the average", func(t *testing.T) {
		l := busy()
		ttft, queue := l.waitEstimateLocked(t0, 0)
		if ttft < 5000 || queue < 4800 {
			t.Fatalf("ttft %v queue %v, want the burst's ~6 s", ttft, queue)
		}
	})
	t.Run("idle engine answers in its bare time to first token", func(t *testing.T) {
		l := busy()
		l.sample = LoadSample{}
		if ttft, queue := l.waitEstimateLocked(t0, 0); ttft != 200 || queue != 0 {
			t.Fatalf("ttft %v queue %v, want 200 and 0", ttft, queue)
		}
		// A request in flight here is load the scrape may not show yet.
		if ttft, _ := l.waitEstimateLocked(t0, 1); ttft < 5000 {
			t.Fatalf("ttft %v with a request in flight, want the average", ttft)
		}
	})
	t.Run("an estimate with no fresh samples decays", func(t *testing.T) {
		l := busy()
		ttft0, _ := l.waitEstimateLocked(t0, 0)
		ttft1, _ := l.waitEstimateLocked(t0.Add(waitHalfLife), 0)
		if want := 200 + (ttft0-200)/2; ttft1 < want-1 || ttft1 > want+1 {
			t.Fatalf("after one half-life %v, want %v", ttft1, want)
		}
		ttft2, queue := l.waitEstimateLocked(t0.Add(10*waitHalfLife), 0)
		if ttft2 > 210 || queue > 10 {
			t.Fatalf("after ten half-lives ttft %v queue %v, want near the 200 ms baseline", ttft2, queue)
		}
		// A new sample blends into the decayed average, not the stale one.
		l.observeTTFTAt(300*time.Millisecond, t0.Add(10*waitHalfLife))
		if l.ttftEWMA > 250 {
			t.Fatalf("new sample on a decayed average gave %v", l.ttftEWMA)
		}
	})
}
