package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/broker/policy/kvindex"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// Prefix affinity as a source: replicas whose adapters feed their engines'
// KV-cache events are read from the exact index, the others from the
// placements; a key evicted from an engine no longer draws requests there.
func TestPrefixFromKVEvents(t *testing.T) {
	const model = "llama-3-8b-instruct"
	prompt := []byte(strings.Repeat("You are a helpful assistant. ", 300))
	blocks := features.AppendPrefix(nil, prompt, 256, 32)
	req := func() *policy.Request {
		q := chat("chat-small")
		q.Prefix = blocks
		return q
	}
	feed := func(hb *subjects.Heartbeat) { hb.KVEvents, hb.KVBlocks, hb.BlockSize = true, 1000, 16 }
	update := func(e *env, replica string, seq uint64, reset bool, stored, evicted []uint64) error {
		return e.r.ObserveKV(&subjects.KVUpdate{Replica: replica, Model: model, Seq: seq, Reset: reset, KVBlocks: 1000, Stored: stored, Evicted: evicted})
	}

	t.Run("the engine's cache draws the request", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.1, 0, 0, feed)
		e.beat("l8-gen-1", 0.1, 0, 0, feed)
		if err := update(e, "l8-gen-1", 1, true, blocks[:24], nil); err != nil {
			t.Fatal(err)
		}
		d := e.explain(req())
		if d.Replica != "l8-gen-1" || d.Reason != policy.ReasonPrefix || d.PrefixMatched != 24 || d.PrefixSource != policy.PrefixKVEvents {
			t.Fatalf("%s (%s) matched %d from %q, want l8-gen-1 with 24 from kv-events", d.Replica, d.Reason, d.PrefixMatched, d.PrefixSource)
		}
		if w := d.Wire(req()); w.PrefixSource != policy.PrefixKVEvents {
			t.Fatalf("wire prefix_source %q", w.PrefixSource)
		}
	})
	t.Run("an evicted prefix no longer draws it, whatever was placed there", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.1, 0, 0, feed)
		e.beat("l8-gen-1", 0.1, 0, 0, feed)
		if err := update(e, "l8-gen-1", 1, true, blocks, nil); err != nil {
			t.Fatal(err)
		}
		e.decide(req()) // placed on l8-gen-1 too
		if err := update(e, "l8-gen-1", 2, false, nil, blocks); err != nil {
			t.Fatal(err)
		}
		if d := e.explain(req()); d.Reason == policy.ReasonPrefix {
			t.Fatalf("%s chosen for prefix affinity (%d from %s) after its engine evicted the prefix", d.Replica, d.PrefixMatched, d.PrefixSource)
		}
	})
	t.Run("a mixed fleet reads each replica from its own source", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-0", 0.1, 0, 0) // no feed: placements
		e.beat("l8-gen-1", 0.1, 0, 0, feed)
		if err := update(e, "l8-gen-1", 1, true, blocks[:8], nil); err != nil {
			t.Fatal(err)
		}
		e.r.ObservePlacement(&subjects.Placement{Model: model, Replica: "l8-gen-0", Blocks: blocks[:20]})
		d := e.explain(req())
		if d.Replica != "l8-gen-0" || d.PrefixMatched != 20 || d.PrefixSource != policy.PrefixPlacements {
			t.Fatalf("%s matched %d from %q, want l8-gen-0 with 20 from placements", d.Replica, d.PrefixMatched, d.PrefixSource)
		}
		// A placement guess about a replica with a feed is not believed.
		e.r.ObservePlacement(&subjects.Placement{Model: model, Replica: "l8-gen-1", Blocks: blocks})
		if d := e.explain(req()); d.Replica != "l8-gen-0" || d.PrefixMatched != 20 {
			t.Fatalf("%s matched %d: a placement outweighed l8-gen-1's engine", d.Replica, d.PrefixMatched)
		}
	})
	t.Run("a lost feed drops the replica's keys", func(t *testing.T) {
		e := newEnv(t)
		e.beat("l8-gen-1", 0.1, 0, 0, feed)
		if err := update(e, "l8-gen-1", 1, true, blocks, nil); err != nil {
			t.Fatal(err)
		}
		e.beat("l8-gen-1", 0.1, 0, 0) // kv_events false: the adapter lost events
		if d := e.explain(req()); d.PrefixSource == policy.PrefixKVEvents {
			t.Fatalf("matched %d from kv-events after the feed was lost", d.PrefixMatched)
		}
		if err := update(e, "l8-gen-1", 2, false, blocks, nil); !errors.Is(err, kvindex.ErrSeq) {
			t.Fatalf("update without a reset after the loss: err %v", err)
		}
	})
}
