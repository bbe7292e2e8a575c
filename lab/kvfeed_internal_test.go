package lab

import (
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/enginesim"
	"github.com/switchyard-llm/switchyard/subjects"
)

// engineHolds reports whether e's prefix cache holds the block hash h.
func engineHolds(e *enginesim.Engine, h uint64) bool {
	return e.CachedTokens(enginesim.Request{Prefix: []uint64{h}, PromptTokens: 2 * BlockTokens, MaxTokens: 1}) > 0
}

// The feed holds exactly the router keys whose ending engine block the
// engine caches, through stores and evictions, as the adapter's does.
func TestKVFeedHoldsWhatTheEngineCaches(t *testing.T) {
	cfg := Profile()
	cfg.KVBlocks, cfg.KVEvents = 512, true // 8192 tokens: a few prompts evict the others
	e := enginesim.New(cfg)
	f := newKVFeed("r-0", cfg.KVBlocks)
	w := Workload{Rate: 4, Duration: 60 * time.Second, SystemPrompts: 12, SystemTokens: 1500, SystemShare: 1, UserTokens: 200, OutputTokens: 20}
	reqs := w.Generate(3)
	held := map[uint64]bool{}
	apply := func() {
		f.take(e)
		for _, u := range f.flush() {
			if u.Reset {
				clear(held)
			}
			for _, k := range u.Stored {
				held[k] = true
			}
			for _, k := range u.Evicted {
				if !held[k] {
					t.Fatalf("key %x evicted without being stored", k)
				}
				delete(held, k)
			}
		}
	}
	start := Epoch()
	evictions := 0
	for _, q := range reqs {
		now := start.Add(q.At)
		for {
			at, ok := e.NextEvent()
			if !ok || at.After(now) {
				break
			}
			e.Advance(at)
		}
		f.learn(q)
		if _, err := e.Submit(enginesim.Request{PromptTokens: q.PromptTokens, MaxTokens: q.MaxTokens, Prefix: q.Blocks}, now); err != nil {
			t.Fatal(err)
		}
		before := len(held)
		apply()
		if len(held) < before {
			evictions++
		}
		// Every key of every request seen so far: held by the feed exactly
		// when the engine caches the block that ends it.
		for _, p := range reqs {
			if p.At > q.At {
				break
			}
			for i, k := range p.Prefix {
				want := engineHolds(e, p.Blocks[(i+1)*f.per-1])
				if held[k] != want {
					t.Fatalf("at %v key %d of a %d-token prompt: feed holds %v, engine caches its block %v", q.At, i, p.PromptTokens, held[k], want)
				}
			}
		}
	}
	if len(held) == 0 || evictions == 0 || len(held) > cfg.KVBlocks {
		t.Errorf("%d keys held, %d flushes that evicted: want the cache to fill and evict", len(held), evictions)
	}
}

// Updates reach the routers no sooner than the delay after the flush that
// carries them, in sequence, the first one a reset; the policy's index
// then holds the replicas' keys exactly.
func TestKVEventsReachThePolicyLate(t *testing.T) {
	reps := replicas("r", "general", 3, Profile())
	snap := mustTable(reps, nil)
	w := Workload{Rate: 6, Duration: 30 * time.Second, SystemPrompts: 20, SystemTokens: 2000, SystemShare: 1, UserTokens: 200, OutputTokens: 30}
	rec := &kvRecorder{Switchyard: NewSwitchyard(snap, "b"), seq: map[string]uint64{}}
	res := Run(&Scenario{
		Replicas: reps, Requests: w.Generate(5), Horizon: 30 * time.Second, SLO: time.Second, Seed: 5,
		KVEvents: true, Staleness: 200 * time.Millisecond,
		NewPicker: func(int) Picker { return rec },
	})
	if rec.err != "" {
		t.Fatal(rec.err)
	}
	if rec.n == 0 || rec.KVRefused != 0 {
		t.Fatalf("%d updates, %d refused by the index", rec.n, rec.KVRefused)
	}
	// The first update a router hears leaves the first flush at the start.
	if want := Epoch().Add(200*time.Millisecond + KVEventsDelay); !rec.first.Equal(want) {
		t.Errorf("first update heard at %v, want %v (heartbeat delay + %v after the first flush)", rec.first.Sub(Epoch()), want.Sub(Epoch()), KVEventsDelay)
	}
	for _, r := range reps {
		if !rec.Router().KVSynced(r.ID) || rec.Router().KVKeys(r.ID) == 0 {
			t.Errorf("%s: synced %v with %d keys", r.ID, rec.Router().KVSynced(r.ID), rec.Router().KVKeys(r.ID))
		}
	}
	if s := res.Summarize(nil); s.HitRate <= 0 {
		t.Errorf("hit rate %.3f", s.HitRate)
	}
}

// kvRecorder checks the updates a Switchyard picker hears.
type kvRecorder struct {
	*Switchyard
	seq   map[string]uint64
	n     int
	first time.Time
	err   string
}

func (r *kvRecorder) ObserveKV(u *subjects.KVUpdate, now time.Time) {
	if r.n == 0 {
		r.first = now
	}
	r.n++
	if prev := r.seq[u.Replica]; u.Seq != prev+1 || (prev == 0 && !u.Reset) {
		r.err = "updates of " + u.Replica + " out of order or without a first reset"
	}
	r.seq[u.Replica] = u.Seq
	r.Switchyard.ObserveKV(u, now)
}
