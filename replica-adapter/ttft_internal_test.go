package adapter

import (
	"math"
	"testing"
	"time"
)

// Non-streamed answers arrive whole: the adapter cannot time their first
// token, so it learns the engine's TTFT from the engine's own histogram
// between scrapes in which it timed none itself.
func TestEngineHistogramTeachesTTFTWithoutStreams(t *testing.T) {
	now := time.Now()
	sample := func(sum float64, count float64) LoadSample {
		return LoadSample{TTFTSeconds: sum, TTFTCount: count, TTFTKnown: true}
	}
	wait := func(l *loadState) float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		ttft, _ := l.waitEstimateLocked(now, 0)
		return ttft
	}

	t.Run("no evidence is no TTFT, not 0 ms of it", func(t *testing.T) {
		var l loadState
		l.mu.Lock()
		l.observeEngineTTFT(LoadSample{}, sample(0, 0), false, 0, now)
		l.observeEngineTTFT(sample(0, 0), sample(0, 0), true, 0, now)
		l.mu.Unlock()
		if got := wait(&l); got != 0 {
			t.Fatalf("TTFT %v ms from an engine that answered nothing", got)
		}
	})

	t.Run("the new observations' mean", func(t *testing.T) {
		var l loadState
		l.mu.Lock()
		l.observeEngineTTFT(LoadSample{}, sample(0, 0), false, 0, now)
		l.observeEngineTTFT(sample(0, 0), sample(0.24, 8), true, 0, now) // eight answers, 30 ms each on average
		l.mu.Unlock()
		if got := wait(&l); math.Abs(got-30) > 1e-9 {
			t.Fatalf("TTFT %v ms, want the eight answers' mean, 30 ms", got)
		}
	})

	t.Run("an engine that served before its adapter started", func(t *testing.T) {
		var l loadState
		l.mu.Lock()
		l.observeEngineTTFT(LoadSample{}, sample(0.168, 12), false, 0, now) // the llm-d simulator's golden exposition: 14 ms
		l.mu.Unlock()
		if got := wait(&l); math.Abs(got-14) > 1e-9 {
			t.Fatalf("TTFT %v ms, want the histogram's mean so far, 14 ms", got)
		}
	})

	t.Run("streamed answers timed in the interval teach it instead", func(t *testing.T) {
		var l loadState
		l.observeTTFTAt(50*time.Millisecond, now)
		l.mu.Lock()
		l.observeEngineTTFT(sample(0, 0), sample(8, 8), true, l.timed.Swap(0), now) // 1 s each: not counted
		l.mu.Unlock()
		if got := wait(&l); math.Abs(got-50) > 1e-9 {
			t.Fatalf("TTFT %v ms, want the streamed answer's 50 ms alone", got)
		}
	})

	t.Run("a histogram that went back teaches nothing", func(t *testing.T) {
		var l loadState
		l.mu.Lock()
		l.observeEngineTTFT(sample(5, 100), sample(0.01, 1), true, 0, now) // the engine restarted
		l.observeEngineTTFT(sample(0, 10), sample(1e9, 11), true, 0, now)  // a mean past any heartbeat's range
		l.mu.Unlock()
		if got := wait(&l); got != 0 {
			t.Fatalf("TTFT %v ms from a restart and an absurd mean", got)
		}
	})
}
