package adapter

import (
	"math"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/subjects"
)

// The prefill view a heartbeat carries (prefill_tps, queued_prefill_tokens):
// brokers predict a request's time to first token from it.
const (
	// minRateSample is the shortest prompt whose first token teaches the
	// prefill rate: a short prompt's TTFT is the engine's base, not prefill.
	minRateSample = 32
	// maxPromptTokens bounds what one request adds to the queued prefill.
	maxPromptTokens = 1 << 22
)

// promptTokens is the request's Llm-Prompt-Tokens, bounded; 0 when absent.
func promptTokens(h nats.Header) int {
	n, err := strconv.Atoi(h.Get(subjects.HdrPromptTokens))
	if err != nil || n < 0 {
		return 0
	}
	return min(n, maxPromptTokens)
}

// queuePrefill counts a request's prompt tokens as queued until done is
// called (at its first token, or when the call ends without one); done is
// safe to call more than once.
func (l *loadState) queuePrefill(tokens int) (done func()) {
	l.queuedPrefill.Add(int64(tokens))
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			l.queuedPrefill.Add(-int64(tokens))
		}
	}
}

// observePrefill learns the prefill rate from one first token: the prompt's
// tokens over the time the first token took beyond the fastest one seen
// (the engine's base), in a moving average bounded to what a heartbeat may
// carry. A time at or below the base teaches nothing.
func (l *loadState) observePrefill(tokens int, ttft time.Duration) {
	l.observePrefillAt(tokens, ttft, time.Now())
}

func (l *loadState) observePrefillAt(tokens int, ttft time.Duration, now time.Time) {
	if tokens < minRateSample {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	beyond := float64(ttft)/float64(time.Millisecond) - l.ttftMin
	if l.ttftMin == 0 || beyond <= 0 {
		return
	}
	rate := min(float64(tokens)/beyond*1000, subjects.MaxPrefillTokensPerSec)
	if l.prefillRate == 0 {
		l.prefillRate, l.prefillPeak, l.prefillAt = rate, rate, now
		return
	}
	l.decayPrefillLocked(now)
	l.prefillRate += ttftAlpha * (rate - l.prefillRate)
	l.prefillPeak = max(l.prefillPeak, l.prefillRate)
	l.prefillAt = now
}

// decayPrefillLocked relaxes the rate toward the highest its moving
// average reached, by the time since its last sample, at the wait
// estimate's half-life (wait.go): a burst's long first tokens teach a slow
// rate, the slow rate predicts long first tokens, and deciders that avoid
// the replica for it (or refuse requests for their TTFT objective) send it
// nothing that could teach it otherwise. l.mu must be held.
func (l *loadState) decayPrefillLocked(now time.Time) {
	if l.prefillRate == 0 || l.prefillAt.IsZero() {
		return
	}
	age := now.Sub(l.prefillAt)
	if age <= 0 {
		return
	}
	l.prefillRate = l.prefillPeak - (l.prefillPeak-l.prefillRate)*math.Exp2(-float64(age)/float64(waitHalfLife))
	l.prefillAt = now
}

// prefillRateLocked is the rate a heartbeat carries: decayed to now.
// l.mu must be held.
func (l *loadState) prefillRateLocked(now time.Time) float64 {
	l.decayPrefillLocked(now)
	return l.prefillRate
}
