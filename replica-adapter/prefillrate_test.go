package adapter

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard-llm/switchyard/replica-adapter/prefillfit"
	"github.com/switchyard-llm/switchyard/subjects"
)

func TestPrefillRateIsLearnedBeyondTheBaseTTFT(t *testing.T) {
	var l loadState
	l.observePrefill(0, 1000, 150*time.Millisecond) // no base seen yet: nothing learned
	if l.prefillRate != 0 {
		t.Fatalf("rate %v learned without a base TTFT", l.prefillRate)
	}
	l.observeTTFT(50 * time.Millisecond)
	l.observePrefill(0, 1000, 150*time.Millisecond) // 1000 tokens in 100 ms beyond the base
	if l.prefillRate != 10000 {
		t.Fatalf("rate %v tokens/s, want 10000", l.prefillRate)
	}
	l.observePrefill(0, 1000, 50*time.Millisecond) // at the base: teaches nothing
	l.observePrefill(0, 8, 1000*time.Millisecond)  // too short a prompt
	if l.prefillRate != 10000 {
		t.Fatalf("rate %v tokens/s after samples that teach nothing", l.prefillRate)
	}
	// A slow first token weighs by its time: the rate is the ratio of the
	// averages, not the average of the ratios.
	l.observePrefill(0, 1000, 1050*time.Millisecond)
	work, ms := 1000.0, 100+ttftAlpha*(1000-100)
	if want := work / ms * 1000; math.Abs(l.prefillRate-want) > 1e-6 {
		t.Fatalf("rate %v, want %v", l.prefillRate, want)
	}
	for range 200 {
		l.observePrefill(0, maxPromptTokens, 51*time.Millisecond) // absurdly fast: bounded
	}
	if l.prefillRate != subjects.MaxPrefillTokensPerSec {
		t.Fatalf("rate %v, want the bound %v", l.prefillRate, subjects.MaxPrefillTokensPerSec)
	}
}

// The prompt tokens queued ahead of a request are prefill its first token
// waited for: a queue wait is not a slow prefill.
func TestPrefillRateCountsTheQueueAhead(t *testing.T) {
	var l loadState
	l.observeTTFT(50 * time.Millisecond)
	l.observePrefill(3000, 1000, 450*time.Millisecond) // 4000 tokens in 400 ms
	if l.prefillRate != 10000 {
		t.Fatalf("rate %v tokens/s, want 10000", l.prefillRate)
	}
}

// The engine's prefix-cache counters say which share of prompt tokens is
// served from cache: the rate and the queued prefill count the rest.
func TestPrefillIsCountedUncached(t *testing.T) {
	var l loadState
	known := func(q, h float64) LoadSample { return LoadSample{PrefixQueries: q, PrefixHits: h, PrefixKnown: true} }
	l.observeHits(LoadSample{}, known(1000, 750), false) // no earlier scrape
	if l.hitRatio != 0 {
		t.Fatalf("hit ratio %v from a single scrape", l.hitRatio)
	}
	l.observeHits(known(0, 0), known(1000, 750), true)
	if want := hitAlpha * 0.75; math.Abs(l.hitRatio-want) > 1e-12 {
		t.Fatalf("hit ratio %v, want %v", l.hitRatio, want)
	}
	h := l.hitRatio
	l.observeHits(known(1000, 750), known(500, 100), true)  // counters went back: an engine restart
	l.observeHits(known(1000, 750), known(1000, 750), true) // no queries since
	l.observeHits(known(1000, 750), LoadSample{}, true)     // counters gone
	if l.hitRatio != h {
		t.Fatalf("hit ratio %v after scrapes that teach nothing, want %v", l.hitRatio, h)
	}
	l.observeTTFT(50 * time.Millisecond)
	l.observePrefill(0, 1000, 150*time.Millisecond)
	if want := 1000 * (1 - h) / 100 * 1000; math.Abs(l.prefillRate-want) > 1e-6 {
		t.Fatalf("rate %v, want %v uncached tokens/s", l.prefillRate, want)
	}
}

func TestQueuedPrefillCountsUntilTheFirstToken(t *testing.T) {
	var l loadState
	a, aheadA := l.queuePrefill(promptTokens(nats.Header{subjects.HdrPromptTokens: {"700"}}))
	b, aheadB := l.queuePrefill(promptTokens(nats.Header{subjects.HdrPromptTokens: {"300"}}))
	if aheadA != 0 || aheadB != 700 {
		t.Fatalf("queued ahead %d and %d, want 0 and 700", aheadA, aheadB)
	}
	if n := l.queuedPrefill.Load(); n != 1000 {
		t.Fatalf("queued %d, want 1000", n)
	}
	a()
	a() // the call's end after its first token
	if n := l.queuedPrefill.Load(); n != 300 {
		t.Fatalf("queued %d after one first token, want 300", n)
	}
	b()
	if n := l.queuedPrefill.Load(); n != 0 {
		t.Fatalf("queued %d, want 0", n)
	}
	for _, v := range []string{"-5", "lots", ""} {
		if n := promptTokens(nats.Header{subjects.HdrPromptTokens: {v}}); n != 0 {
			t.Errorf("Llm-Prompt-Tokens %q counted %d", v, n)
		}
	}
	if n := promptTokens(nats.Header{subjects.HdrPromptTokens: {"999999999999"}}); n != maxPromptTokens {
		t.Errorf("a huge Llm-Prompt-Tokens counted %d, want the bound %d", n, maxPromptTokens)
	}
}

func TestPrefillRateWithNoFreshSamplesDecaysTowardItsPeak(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var l loadState
	l.observeTTFTAt(50*time.Millisecond, t0)
	l.observePrefillAt(0, 1000, 150*time.Millisecond, t0) // 10,000 tokens/s unloaded
	for range 30 {
		// A burst: the same prompts take seconds, and teach a slow rate.
		l.observePrefillAt(0, 1000, 2050*time.Millisecond, t0)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	slow := l.prefillRateLocked(t0)
	if slow > 700 {
		t.Fatalf("rate %v after the burst, want near 500 tokens/s", slow)
	}
	// Nothing is sent to a replica that looks this slow: without decay
	// it would stay slow. One half-life halves the gap to the peak.
	half := l.prefillRateLocked(t0.Add(waitHalfLife))
	if want := 10000 - (10000-slow)/2; half < want-1 || half > want+1 {
		t.Fatalf("rate %v after one half-life, want %v", half, want)
	}
	if rest := l.prefillRateLocked(t0.Add(20 * waitHalfLife)); rest < 9990 || rest > 10000 {
		t.Fatalf("rate %v long after, want back at the peak 10000 and never past it", rest)
	}
}

// The line through (uncached tokens, TTFT) points has the engine's rate for
// its slope whatever its base: a base of 120 ms, which the estimate from
// the fastest first token would take for prefill-free, does not bias it.
// Points all of one size say nothing, nor do a few, nor a slope that is
// not positive, nor points that barely follow their tokens; a stalled
// first token among good points leaves the rate they gave.
func TestPrefillFitReadsTheRateAsTheSlope(t *testing.T) {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	var l loadState
	for i := range prefillfit.MinPoints - 1 {
		l.observePrefillExact(1200+i*800, ms(120+float64(1200+i*800)*0.08))
	}
	if r := l.prefillRateLocked(time.Now()); r != 0 {
		t.Fatalf("rate %v from %d points", r, prefillfit.MinPoints-1)
	}
	for i := range 200 {
		u := 1200 + (i%7)*1000
		l.observePrefillExact(u, ms(120+float64(u)*0.08))
	}
	if r := l.prefillRateLocked(time.Now()); math.Abs(r-12500) > 1 {
		t.Fatalf("rate %v tokens/s, want 12500 (80 µs a token)", r)
	}
	l.observePrefillExact(1200, time.Minute) // a stalled first token
	l.observePrefillExact(7200, 5*time.Second)
	if r := l.prefillRateLocked(time.Now()); math.Abs(r-12500) > 1 {
		t.Fatalf("rate %v tokens/s after stalled first tokens, want 12500 still", r)
	}
	// The engine gets twice as fast: the line follows, the stalls left
	// out of it.
	for i := range 80 {
		u := 1200 + (i%7)*1000
		l.observePrefillExact(u, ms(120+float64(u)*0.04))
	}
	if r := l.prefillRateLocked(time.Now()); math.Abs(r-25000) > 2500 {
		t.Fatalf("rate %v tokens/s 80 points after the engine got twice as fast, want 25000", r)
	}
	for i := range 120 {
		u := 1200 + (i%7)*1000
		l.observePrefillExact(u, ms(120+float64(u)*0.04))
	}
	// Then its traffic is all one size: the last rate stands a while
	// (100 points in a row that fit no line), then goes, and the
	// hit-ratio estimate answers again.
	for range 99 {
		l.observePrefillExact(1200, ms(120+1200*0.04))
	}
	if r := l.prefillRateLocked(time.Now()); math.Abs(r-25000) > 250 {
		t.Fatalf("rate %v tokens/s after 99 points of one size, want 25000 still", r)
	}
	for range 300 {
		l.observePrefillExact(1200, ms(120+1200*0.04))
	}
	if r := l.prefillRateLocked(time.Now()); r != l.prefillRate {
		t.Fatalf("rate %v after 399 points of one size, want the hit-ratio estimate %v", r, l.prefillRate)
	}

	var same loadState
	for range 50 {
		same.observePrefillExact(1200, 216*time.Millisecond)
	}
	if r := same.prefillRateLocked(time.Now()); r != 0 {
		t.Fatalf("rate %v from points all of one size", r)
	}
	var flat loadState
	for i := range 50 {
		flat.observePrefillExact(i*500, 100*time.Millisecond)
	}
	if r := flat.prefillRateLocked(time.Now()); r != 0 {
		t.Fatalf("rate %v from a flat line", r)
	}
	// TTFTs that barely follow the tokens: a tiny positive covariance
	// would read as a rate near the bound, a replica that looks free.
	var noise loadState
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range 200 {
		noise.observePrefillExact((i%10)*1000, ms(100+100*rng.Float64()))
	}
	if r := noise.prefillRateLocked(time.Now()); r != 0 {
		t.Fatalf("rate %v from TTFTs that do not follow the tokens", r)
	}
	var bad loadState
	bad.observePrefillExact(-5, time.Second)
	bad.observePrefillExact(100, 0)
	if bad.fit.Points() != 0 {
		t.Fatalf("%d impossible points taken", bad.fit.Points())
	}
}

// An engine whose prefix-cache counters went back restarted, perhaps with
// another speed: the line through its old points is forgotten.
func TestPrefillFitIsForgottenWhenTheEngineRestarts(t *testing.T) {
	var l loadState
	for i := range 50 {
		u := 1200 + (i%7)*1000
		l.observePrefillExact(u, time.Duration((120+float64(u)*0.08)*float64(time.Millisecond)))
	}
	if l.fit.Rate() == 0 {
		t.Fatal("no rate from a clean line")
	}
	known := func(q, h float64) LoadSample { return LoadSample{PrefixQueries: q, PrefixHits: h, PrefixKnown: true} }
	l.observeHits(known(1000, 500), known(2000, 900), true)
	if l.fit.Rate() == 0 {
		t.Fatal("the rate went with counters that moved on")
	}
	l.observeHits(known(2000, 900), known(10, 5), true)
	if l.fit.Rate() != 0 || l.fit.Points() != 0 {
		t.Fatalf("rate %v from %d points kept across a restart", l.fit.Rate(), l.fit.Points())
	}
}

// A point's uncached tokens are in the units brokers count the request's
// prompt in (its Llm-Prompt-Tokens), scaled by the share of the engine's
// own prompt count it did not serve from cache.
func TestUncachedIsInTheBrokersUnits(t *testing.T) {
	for _, c := range []struct {
		prompt, engine, cached, want int
		ok                           bool
	}{
		{2000, 1000, 500, 1000, true}, // the header counts twice the engine's tokens
		{2000, 1000, 0, 2000, true},
		{2000, 1000, 1000, 0, true},
		{2000, 0, 0, 0, false},       // no engine count
		{0, 1000, 500, 0, false},     // no header count (a split request's decode leg)
		{2000, 1000, 1001, 0, false}, // more cached than the prompt
		{2000, 1000, -1, 0, false},
		{1 << 30, 1 << 30, 0, 1 << 30, true}, // no overflow
	} {
		if got, ok := uncachedOf(c.prompt, c.engine, c.cached); got != c.want || ok != c.ok {
			t.Errorf("uncachedOf(%d, %d, %d) = %d %v, want %d %v", c.prompt, c.engine, c.cached, got, ok, c.want, c.ok)
		}
	}
}
