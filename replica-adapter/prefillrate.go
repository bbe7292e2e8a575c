package adapter

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/replica-adapter/prefillfit"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The prefill view a heartbeat carries (prefill_tps, queued_prefill_tokens):
// brokers predict a request's time to first token from it, in uncached
// prompt tokens, as they count the tokens they send.
const (
	// minRateSample is the shortest prompt whose first token teaches the
	// prefill rate: a short prompt's TTFT is the engine's base, not prefill.
	minRateSample = 32
	// maxPromptTokens bounds what one request adds to the queued prefill.
	maxPromptTokens = 1 << 22
	// hitAlpha is the weight of one scrape in the hit ratio's average.
	hitAlpha = 0.2
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
// safe to call more than once. ahead is what was queued before it.
func (l *loadState) queuePrefill(tokens int) (done func(), ahead int) {
	ahead = int(l.queuedPrefill.Add(int64(tokens))) - tokens
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			l.queuedPrefill.Add(-int64(tokens))
		}
	}, max(ahead, 0)
}

// observePrefill learns the prefill rate from one first token: the
// uncached share (1 − the hit ratio) of the prompt tokens queued ahead of
// the request and its own is the prefill work its first token waited for;
// the time is what the first token took beyond the fastest one seen (the
// engine's base). The rate is the ratio of the moving averages of work and
// time, so a slow prefill counts for its time rather than as one sample
// among many fast ones, bounded to what a heartbeat may carry. A time at
// or below the base teaches nothing.
func (l *loadState) observePrefill(ahead, tokens int, ttft time.Duration) {
	l.observePrefillAt(ahead, tokens, ttft, time.Now())
}

func (l *loadState) observePrefillAt(ahead, tokens int, ttft time.Duration, now time.Time) {
	if tokens < minRateSample {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	beyond := float64(ttft)/float64(time.Millisecond) - l.ttftMin
	if l.ttftMin == 0 || beyond <= 0 {
		return
	}
	work := float64(ahead+tokens) * (1 - l.hitRatio)
	if l.rateTime == 0 {
		l.rateWork, l.rateTime = work, beyond
		l.prefillRate = min(work/beyond*1000, subjects.MaxPrefillTokensPerSec)
		l.prefillPeak, l.prefillAt = l.prefillRate, now
		return
	}
	l.decayPrefillLocked(now)
	l.rateWork += ttftAlpha * (work - l.rateWork)
	l.rateTime += ttftAlpha * (beyond - l.rateTime)
	l.prefillRate = min(l.rateWork/l.rateTime*1000, subjects.MaxPrefillTokensPerSec)
	l.prefillPeak = max(l.prefillPeak, l.prefillRate)
	l.prefillAt = now
}

// observePrefillExact learns the prefill rate from one first token of a
// request that had nothing queued ahead of it, whose engine said how many
// of its prompt tokens were cached (usage.prompt_tokens_details.
// cached_tokens): uncached tokens took ttft. Once the line through such
// points has a slope (prefillfit), it is the rate heartbeats carry: the
// estimate from the hit ratio spreads the engine's recent hits evenly
// over every request and times a first token from the fastest one seen,
// itself a prefill.
func (l *loadState) observePrefillExact(uncached int, ttft time.Duration) {
	if uncached < 0 || uncached > maxPromptTokens || ttft <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fit.Add(float64(uncached), float64(ttft)/float64(time.Millisecond))
}

// decayPrefillLocked relaxes the rate toward the highest it reached, by
// the time since its last sample, at the wait estimate's half-life
// (wait.go): a burst's long first tokens teach a slow rate, the slow rate
// predicts long first tokens, and deciders that avoid the replica for it
// (or refuse requests for their TTFT objective) send it nothing that could
// teach it otherwise. The averages follow, so the next sample moves the
// decayed rate. l.mu must be held.
func (l *loadState) decayPrefillLocked(now time.Time) {
	if l.prefillRate == 0 || l.prefillAt.IsZero() {
		return
	}
	age := now.Sub(l.prefillAt)
	if age <= 0 {
		return
	}
	l.prefillRate = relax(l.prefillRate, l.prefillPeak, age)
	l.prefillAt = now
	if l.prefillRate > 0 {
		l.rateTime = l.rateWork / l.prefillRate * 1000
	}
}

// prefillRateLocked is the rate a heartbeat carries: decayed to now.
// l.mu must be held.
func (l *loadState) prefillRateLocked(now time.Time) float64 {
	l.decayPrefillLocked(now)
	if r := l.fit.Rate(); r > 0 {
		return r
	}
	return l.prefillRate
}

// queuedUncachedLocked is the queued prefill a heartbeat or a load delta
// carries: the uncached share of the queued prompt tokens. l.mu must be
// held.
func (l *loadState) queuedUncachedLocked() int {
	return int(min(max(float64(l.queuedPrefill.Load())*(1-l.hitRatio), 0), subjects.MaxQueuedPrefillTokens))
}

// queuedUncached is queuedUncachedLocked for a caller without l.mu.
func (l *loadState) queuedUncached() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.queuedUncachedLocked()
}

// observeHits updates the hit ratio from two scrapes' prefix-cache
// counters: the hits over the queries between them. A counter that went
// back (an engine restart) or did not move teaches nothing. l.mu must be
// held.
func (l *loadState) observeHits(prev, cur LoadSample, had bool) {
	dq, dh := cur.PrefixQueries-prev.PrefixQueries, cur.PrefixHits-prev.PrefixHits
	if had && prev.PrefixKnown && cur.PrefixKnown && dq < 0 {
		// The engine restarted, perhaps with another speed: the line
		// through its old points is forgotten.
		l.fit = prefillfit.Fit{}
	}
	if !had || !prev.PrefixKnown || !cur.PrefixKnown || dq <= 0 || dh < 0 || dh > dq {
		return
	}
	l.hitRatio += hitAlpha * (dh/dq - l.hitRatio)
}
