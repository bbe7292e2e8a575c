package enginesim_test

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// ms is a shorthand for building virtual times and durations.
func ms(n float64) time.Duration { return time.Duration(n * float64(time.Millisecond)) }

// trace records what a run emitted, per request.
type trace struct {
	events []enginesim.Event
	first  map[enginesim.ID]time.Time
	finish map[enginesim.ID]time.Time
	tokens map[enginesim.ID][]time.Time
	cached map[enginesim.ID]int
}

func newTrace() *trace {
	return &trace{
		first:  map[enginesim.ID]time.Time{},
		finish: map[enginesim.ID]time.Time{},
		tokens: map[enginesim.ID][]time.Time{},
		cached: map[enginesim.ID]int{},
	}
}

func (tr *trace) add(evs []enginesim.Event) {
	for _, ev := range evs {
		tr.events = append(tr.events, ev)
		switch ev.Kind {
		case enginesim.EventFirstToken:
			tr.first[ev.ID] = ev.At
			tr.cached[ev.ID] = ev.CachedTokens
			tr.tokens[ev.ID] = append(tr.tokens[ev.ID], ev.At)
		case enginesim.EventToken:
			tr.tokens[ev.ID] = append(tr.tokens[ev.ID], ev.At)
		case enginesim.EventFinish:
			tr.finish[ev.ID] = ev.At
		}
	}
}

// runUntil advances the engine event by event up to `until` (or until idle
// when until is zero) and returns the engine's clock.
func runUntil(t *testing.T, e *enginesim.Engine, tr *trace, until time.Time) time.Time {
	t.Helper()
	for range 1_000_000 {
		next, ok := e.NextEvent()
		if !ok || (!until.IsZero() && next.After(until)) {
			if !until.IsZero() {
				tr.add(e.Advance(until))
			}
			return e.Now()
		}
		tr.add(e.Advance(next))
	}
	t.Fatal("engine never went idle")
	return time.Time{}
}

func submit(t *testing.T, e *enginesim.Engine, req enginesim.Request, at time.Time) enginesim.ID {
	t.Helper()
	id, err := e.Submit(req, at)
	if err != nil {
		t.Fatalf("submit %+v: %v", req, err)
	}
	return id
}

// chain builds n distinct chained block hashes starting from seed.
func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	h := seed
	for i := range out {
		h = h*6364136223846793005 + 1442695040888963407
		out[i] = h
	}
	return out
}

func TestPrefixCacheHitSkipsPrefill(t *testing.T) {
	e := enginesim.New(enginesim.Config{PrefillPerToken: time.Millisecond, MaxLoras: 2})
	prefix := chain(1, 10)
	req := enginesim.Request{PromptTokens: 160, MaxTokens: 2, Prefix: prefix}
	tr := newTrace()

	cold := submit(t, e, req, t0)
	now := runUntil(t, e, tr, time.Time{})
	warm := submit(t, e, req, now)
	now = runUntil(t, e, tr, time.Time{})
	other := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 2, Prefix: chain(2, 10)}, now)
	now = runUntil(t, e, tr, time.Time{})
	lora := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 2, Prefix: prefix, Lora: "a"}, now)
	runUntil(t, e, tr, time.Time{})

	if got, want := tr.first[cold].Sub(t0), ms(30+160); got != want {
		t.Errorf("cold TTFT = %v, want %v (base + 160 tokens of prefill)", got, want)
	}
	if tr.cached[cold] != 0 {
		t.Errorf("cold cached = %d, want 0", tr.cached[cold])
	}
	// The whole prompt is cached but one token, which is always computed.
	if tr.cached[warm] != 159 {
		t.Errorf("warm cached = %d, want 159", tr.cached[warm])
	}
	if tr.cached[other] != 0 {
		t.Errorf("different prefix cached = %d, want 0", tr.cached[other])
	}
	if tr.cached[lora] != 0 {
		t.Errorf("same prefix under an adapter cached = %d, want 0 (adapters change the KV)", tr.cached[lora])
	}
	st := e.Stats()
	if st.PrefixHitTokens != 159 || st.PrefixQueryTokens != 4*160 {
		t.Errorf("prefix stats hit=%d query=%d, want 159, 640", st.PrefixHitTokens, st.PrefixQueryTokens)
	}
}

func TestPrefixCacheWarmTTFT(t *testing.T) {
	e := enginesim.New(enginesim.Config{PrefillPerToken: time.Millisecond})
	req := enginesim.Request{PromptTokens: 160, MaxTokens: 1, Prefix: chain(1, 10)}
	tr := newTrace()
	submit(t, e, req, t0)
	now := runUntil(t, e, tr, time.Time{})
	warm := submit(t, e, req, now)
	runUntil(t, e, tr, time.Time{})
	if got, want := tr.first[warm].Sub(now), ms(30+1); got != want {
		t.Errorf("warm TTFT = %v, want %v (base + the one uncached token)", got, want)
	}
}

func TestPrefixCacheEvictsLRU(t *testing.T) {
	e := enginesim.New(enginesim.Config{PrefixCacheBlocks: 4})
	tr := newTrace()
	a := enginesim.Request{PromptTokens: 64, MaxTokens: 1, Prefix: chain(1, 4)}
	b := enginesim.Request{PromptTokens: 64, MaxTokens: 1, Prefix: chain(2, 4)}
	submit(t, e, a, t0)
	now := runUntil(t, e, tr, time.Time{})
	submit(t, e, b, now) // evicts all of a
	now = runUntil(t, e, tr, time.Time{})
	again := submit(t, e, a, now)
	runUntil(t, e, tr, time.Time{})
	if tr.cached[again] != 0 {
		t.Errorf("evicted prefix cached = %d, want 0", tr.cached[again])
	}
	if got := e.Stats().PrefixCachedBlocks; got != 4 {
		t.Errorf("cached blocks = %d, want capacity 4", got)
	}
}

// CachedTokens reads the cache as the next admission would, without
// refreshing what it reads: a peek must not keep a prefix from eviction.
func TestCachedTokensPeeksWithoutTouching(t *testing.T) {
	e := enginesim.New(enginesim.Config{PrefixCacheBlocks: 8})
	tr := newTrace()
	a := enginesim.Request{PromptTokens: 64, MaxTokens: 1, Prefix: chain(1, 4)}
	b := enginesim.Request{PromptTokens: 64, MaxTokens: 1, Prefix: chain(2, 4)}
	c := enginesim.Request{PromptTokens: 64, MaxTokens: 1, Prefix: chain(3, 4)}
	if got := e.CachedTokens(a); got != 0 {
		t.Fatalf("cold CachedTokens = %d, want 0", got)
	}
	submit(t, e, a, t0)
	now := runUntil(t, e, tr, time.Time{})
	submit(t, e, b, now)
	now = runUntil(t, e, tr, time.Time{})
	if got := e.CachedTokens(a); got != 63 {
		t.Errorf("CachedTokens(a) = %d, want 63 (all but the computed token)", got)
	}
	// a is the least recent despite the peek: c evicts it, not b.
	submit(t, e, c, now)
	runUntil(t, e, tr, time.Time{})
	if got := e.CachedTokens(a); got != 0 {
		t.Errorf("after eviction CachedTokens(a) = %d, want 0", got)
	}
	if got := e.CachedTokens(b); got != 63 {
		t.Errorf("CachedTokens(b) = %d, want 63", got)
	}
}

// A decode leg pulls what a remote prefill computed: each pulled token
// costs the transfer, not the prefill, and blocks the decode replica
// already holds are neither pulled nor computed.
func TestTransferredTokensArePulledNotPrefilled(t *testing.T) {
	e := enginesim.New(enginesim.Config{PrefillPerToken: time.Millisecond, KVTransferPerToken: 100 * time.Microsecond})
	tr := newTrace()
	pulled := submit(t, e, enginesim.Request{PromptTokens: 160, MaxTokens: 1, Prefix: chain(1, 10), Transferred: 160}, t0)
	now := runUntil(t, e, tr, time.Time{})
	if got, want := tr.first[pulled].Sub(t0), ms(30+1+0.1*159); got != want {
		t.Errorf("pulled TTFT = %v, want %v (base + 1 computed token + 159 pulled)", got, want)
	}
	// The pulled blocks are now in this engine's prefix cache: half the
	// prompt cached, the rest pulled.
	half := submit(t, e, enginesim.Request{PromptTokens: 320, MaxTokens: 1, Prefix: chain(1, 20), Transferred: 320}, now)
	then := now
	runUntil(t, e, tr, time.Time{})
	if got, want := tr.first[half].Sub(then), ms(30+1+0.1*159); got != want {
		t.Errorf("half-cached TTFT = %v, want %v (160 cached, 159 pulled, 1 computed)", got, want)
	}
}
