package lab

import (
	"slices"
	"time"

	"github.com/switchyard-llm/switchyard/internal/kvevents"
	"github.com/switchyard-llm/switchyard/subjects"
)

// The KV-event feed in the lab (Scenario.KVEvents). Each engine publishes
// its KV-cache events (enginesim's BlockStored and BlockRemoved, as vLLM
// tells them); a kvFeed per replica does what the replica adapter's feed
// does with them (docs/architecture.md, "Prefix knowledge from the
// engines"): it learns, for the requests its replica serves, which engine
// block ends each of the request's router keys, holds a key while a block
// that ends it is stored, reports it evicted when the removal that takes
// the block's reference count to zero arrives, and flushes what changed
// every kvFlushEvery as a subjects.KVUpdate. The routers apply the updates
// to the policy's exact index (policy.Router.ObserveKV) when they arrive,
// Scenario.KVEventsDelay after the flush: never at decision time.
//
// One simplification: the adapter keys engine blocks by a hash of its own,
// chained over each block's token ids, because it cannot recompute the
// engine's. The lab's engine hashes are already such a chain over the
// prompt's content (see chain), so the feed keys blocks by them directly
// and needs no parents.

// kvFlushEvery is how often a feed publishes what changed, as the replica
// adapter's does.
const kvFlushEvery = 20 * time.Millisecond

// KVEventsDelay is the default Scenario.KVEventsDelay: an update reaches
// the brokers 50 ms after the adapter flushes it, on top of the heartbeat
// delivery delay (Scenario.Staleness).
const KVEventsDelay = 50 * time.Millisecond

// kvObserver is a Picker that hosts an exact prefix index.
type kvObserver interface {
	ObserveKV(u *subjects.KVUpdate, now time.Time)
}

// kvFeed is one replica adapter's view of its engine's cache.
type kvFeed struct {
	replica  string
	kvBlocks int
	per      int // engine blocks per router block

	blocks  map[uint64]int      // stored engine block → reference count
	texts   map[uint64][]uint64 // engine block → the router keys it ends
	keyRef  map[uint64]int      // router key → stored blocks that end it
	pending map[uint64]bool     // router key → stored (true) or evicted
	reset   bool                // the next update voids what brokers hold
	live    bool                // the engine has sent events since the reset
	seq     uint64
	evs     []kvevents.Event // scratch
}

func newKVFeed(replica string, kvBlocks int) *kvFeed {
	return &kvFeed{
		replica: replica, kvBlocks: kvBlocks,
		per:    max(1, PrefixBlockChars/charsPerToken/BlockTokens),
		blocks: map[uint64]int{}, texts: map[uint64][]uint64{}, keyRef: map[uint64]int{}, pending: map[uint64]bool{},
		reset: true,
	}
}

// learn records which engine block ends each of req's router keys, as the
// adapter learns it from the request's token ids: router key i covers the
// first (i+1)·per engine blocks.
func (f *kvFeed) learn(req *Request) {
	for i, k := range req.Prefix {
		j := (i+1)*f.per - 1
		if j >= len(req.Blocks) {
			break
		}
		h := req.Blocks[j]
		ts := f.texts[h]
		if slices.Contains(ts, k) {
			continue
		}
		if len(f.texts) >= kvMaxTexts {
			f.pruneTexts()
		}
		f.texts[h] = append(ts, k)
		if f.blocks[h] > 0 {
			f.hold(k)
		}
	}
}

// take applies the events the engine told since the last call.
func (f *kvFeed) take(e interface {
	TakeKVEvents([]kvevents.Event) []kvevents.Event
}) {
	f.evs = e.TakeKVEvents(f.evs[:0])
	if len(f.evs) > 0 {
		f.live = true
	}
	for i := range f.evs {
		ev := &f.evs[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			for _, h := range ev.Hashes {
				if f.blocks[uint64(h)]++; f.blocks[uint64(h)] == 1 {
					for _, k := range f.texts[uint64(h)] {
						f.hold(k)
					}
				}
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.Hashes {
				f.removed(uint64(h))
			}
		case kvevents.AllBlocksCleared:
			clear(f.blocks)
			clear(f.keyRef)
			clear(f.pending)
			f.reset = true
		}
	}
	clear(f.evs) // keeps no token ids alive
}

func (f *kvFeed) removed(h uint64) {
	n, ok := f.blocks[h]
	if !ok {
		return
	}
	if n > 1 {
		f.blocks[h] = n - 1
		return
	}
	delete(f.blocks, h)
	for _, k := range f.texts[h] {
		if f.keyRef[k]--; f.keyRef[k] <= 0 {
			delete(f.keyRef, k)
			f.pending[k] = false
		}
	}
	// The keys stay learned: a request learned while the block was stored
	// may still be queued, and stores it again when it runs.
}

// kvMaxTexts bounds the engine blocks whose router keys a feed keeps, as
// the adapter bounds them.
const kvMaxTexts = 1 << 20

// pruneTexts forgets the keys of blocks the engine does not hold.
func (f *kvFeed) pruneTexts() {
	for h := range f.texts {
		if f.blocks[h] == 0 {
			delete(f.texts, h)
		}
	}
}

func (f *kvFeed) hold(k uint64) {
	if f.keyRef[k]++; f.keyRef[k] == 1 {
		f.pending[k] = true
	}
}

// isLive is the heartbeat's kv_events.
func (f *kvFeed) isLive() bool { return f.live && !f.reset }

// flush returns the updates that publish what changed since the last
// flush, in order, keys sorted so that runs are reproducible.
func (f *kvFeed) flush() []*subjects.KVUpdate {
	if len(f.pending) == 0 && !f.reset {
		return nil
	}
	keys := slices.Sorted(func(yield func(uint64) bool) {
		for k := range f.pending {
			if !yield(k) {
				return
			}
		}
	})
	var out []*subjects.KVUpdate
	u := &subjects.KVUpdate{Replica: f.replica, Model: ModelID, Reset: f.reset, KVBlocks: f.kvBlocks}
	for _, k := range keys {
		if f.pending[k] {
			u.Stored = append(u.Stored, k)
		} else if !f.reset {
			u.Evicted = append(u.Evicted, k)
		}
		if len(u.Stored)+len(u.Evicted) == subjects.MaxKVUpdateKeys {
			out = append(out, u)
			u = &subjects.KVUpdate{Replica: f.replica, Model: ModelID, KVBlocks: f.kvBlocks}
		}
	}
	out = append(out, u)
	for _, u := range out {
		f.seq++
		u.Seq = f.seq
	}
	clear(f.pending)
	f.reset = false
	return out
}
