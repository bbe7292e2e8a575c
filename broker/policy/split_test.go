package policy_test

import (
	"strings"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// pdTable is a disaggregated model with two prefill and two decode
// replicas in the general pool.
const pdTable = `{
	"models.pd-model": {"disaggregation": {"enabled": true, "min_uncached_tokens": 4096}},
	"replicas.pd-p0": {"model": "pd-model", "version": "v1", "pool": "general", "state": "ready", "role": "prefill"},
	"replicas.pd-p1": {"model": "pd-model", "version": "v1", "pool": "general", "state": "ready", "role": "prefill"},
	"replicas.pd-d0": {"model": "pd-model", "version": "v1", "pool": "general", "state": "ready", "role": "decode"},
	"replicas.pd-d1": {"model": "pd-model", "version": "v1", "pool": "general", "state": "ready", "role": "decode"}
}`

func pdRequest(tokens int, prefix []uint64) *policy.Request {
	q := chat("pd-model")
	q.PromptTokens, q.Prefix = tokens, prefix
	return q
}

func isDecode(id string) bool  { return id == "pd-d0" || id == "pd-d1" }
func isPrefill(id string) bool { return id == "pd-p0" || id == "pd-p1" }

func TestSplitLongPromptsServeShortOnesWhole(t *testing.T) {
	e := newEnv(t, pdTable)
	for range 20 {
		d := e.decide(pdRequest(6000, nil))
		mustRoute(t, d)
		if !isDecode(d.Replica) || !isPrefill(d.Prefill) || d.Split != policy.SplitPrefill || d.UncachedTokens != 6000 {
			t.Fatalf("long prompt: decode %s prefill %q split %q uncached %d", d.Replica, d.Prefill, d.Split, d.UncachedTokens)
		}
		w := d.Wire(pdRequest(6000, nil))
		if w.PrefillReplica != d.Prefill || w.Split != policy.SplitPrefill || w.UncachedTokens != 6000 {
			t.Fatalf("wire %+v", w)
		}
	}
	for range 20 {
		d := e.decide(pdRequest(4095, nil))
		mustRoute(t, d)
		if !isDecode(d.Replica) || d.Prefill != "" || d.Split != policy.SplitWholeShort {
			t.Fatalf("short prompt: decode %s prefill %q split %q", d.Replica, d.Prefill, d.Split)
		}
	}
	q := pdRequest(6000, nil)
	q.Endpoint = subjects.EndpointEmbeddings
	if d := e.decide(q); d.Prefill != "" || d.Split != policy.SplitWholeEndpoint {
		t.Errorf("embeddings: prefill %q split %q", d.Prefill, d.Split)
	}
	q = pdRequest(6000, nil)
	q.ResumeFrom, q.ResumeTokens = "pd-d1", 10
	if d := e.decide(q); d.Prefill != "" || d.Split != policy.SplitWholeResume {
		t.Errorf("continuation: prefill %q split %q", d.Prefill, d.Split)
	}
}

// The uncached tokens are the prompt less what the prefix knowledge says
// the chosen decode replica holds: a prompt mostly cached there is served
// whole; one whose uncached rest still reaches the threshold is split,
// its prefill going to the replica holding its prefix.
func TestSplitCountsWhatTheDecodeReplicaHolds(t *testing.T) {
	e := newEnv(t, pdTable)
	prompt := strings.Repeat("A long system prompt shared by many requests. ", 400)
	blocks := features.AppendPrefix(nil, []byte(prompt), 256, 64) // 64 blocks of 64 tokens
	first := e.decide(pdRequest(6000, blocks))
	mustRoute(t, first)
	if first.Prefill == "" {
		t.Fatalf("first: served whole (%s)", first.Split)
	}
	again := e.decide(pdRequest(6000, blocks))
	mustRoute(t, again)
	if again.Replica != first.Replica || again.Prefill != "" || again.Split != policy.SplitWholeShort || again.UncachedTokens != 6000-64*64 {
		t.Fatalf("again: decode %s (first %s) prefill %q split %q uncached %d, want whole with %d uncached",
			again.Replica, first.Replica, again.Prefill, again.Split, again.UncachedTokens, 6000-64*64)
	}

	// Longer: the same prefix, then more. The prefill replica that holds
	// the prefix gets it although it is busier.
	other := "pd-p0"
	if first.Prefill == "pd-p0" {
		other = "pd-p1"
	}
	e.beat(first.Prefill, 0.5, 4, 0)
	e.beat(other, 0.05, 0, 0)
	long := e.explain(pdRequest(20000, blocks))
	mustRoute(t, long)
	if long.Prefill != first.Prefill || long.UncachedTokens != 20000-64*64 {
		t.Fatalf("long: prefill %q uncached %d, want %s (holds the prefix) and %d", long.Prefill, long.UncachedTokens, first.Prefill, 20000-64*64)
	}
	// Above the release threshold the prefix no longer holds it there.
	e.beat(first.Prefill, 0.9, 4, 0)
	if d := e.explain(pdRequest(20000, blocks)); d.Prefill != other {
		t.Fatalf("holder above the release threshold: prefill %q, want %s", d.Prefill, other)
	}
}

// Admission covers both legs: without a prefill replica that can take
// the prefill leg, the request is served whole, not refused; a prefill
// replica never gets a whole request.
func TestSplitWithoutPrefillReplicaServesWhole(t *testing.T) {
	e := newEnv(t, pdTable)
	q := pdRequest(6000, nil)
	q.Exclude = []string{"pd-p0"}
	for range 10 {
		if d := e.decide(q); d.Prefill != "pd-p1" {
			t.Fatalf("pd-p0 excluded: prefill %q, want pd-p1", d.Prefill)
		}
	}
	e.beat("pd-p1", 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.State = subjects.StateDraining })
	d := e.decide(q)
	mustRoute(t, d)
	if d.Prefill != "" || d.Split != policy.SplitWholeNoPrefill || !isDecode(d.Replica) {
		t.Fatalf("no prefill replica: decode %s prefill %q split %q", d.Replica, d.Prefill, d.Split)
	}
	// Full prefill replicas leave it whole too.
	e.beat("pd-p0", 0.99, 32, 128)
	if d := e.decide(pdRequest(6000, nil)); d.Prefill != "" || d.Split != policy.SplitWholeNoPrefill {
		t.Fatalf("prefill replicas full: prefill %q split %q", d.Prefill, d.Split)
	}

	// Prefill replicas alone cannot serve the model.
	e.beat("pd-p0", 0.1, 0, 0)
	for _, id := range []string{"pd-d0", "pd-d1"} {
		e.beat(id, 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.State = subjects.StateDraining })
	}
	mustReject(t, e.decide(pdRequest(100, nil)), 503, subjects.CodeNoReplicas)
}

func TestWithoutDisaggregationNothingIsSplit(t *testing.T) {
	e := newEnv(t, pdTable, `{"models.pd-model": {"disaggregation": {"enabled": false, "min_uncached_tokens": 1}}}`)
	for range 20 {
		d := e.decide(pdRequest(60000, nil))
		mustRoute(t, d)
		if !isDecode(d.Replica) || d.Prefill != "" || d.Split != "" || d.UncachedTokens != 0 {
			t.Fatalf("decode %s prefill %q split %q uncached %d", d.Replica, d.Prefill, d.Split, d.UncachedTokens)
		}
	}
	// A model without disaggregation reports nothing of it.
	if d := e.decide(chat("llama-3-8b-instruct")); d.Split != "" || d.Prefill != "" {
		t.Errorf("plain model: split %q prefill %q", d.Split, d.Prefill)
	}
}

// The uncached tokens read the exact index for a decode replica whose
// engine feeds its KV-cache events: what the engine holds is cached, what
// it evicted is not, whatever was placed there.
func TestSplitReadsTheEnginesCachesWhereFed(t *testing.T) {
	e := newEnv(t, pdTable)
	prompt := strings.Repeat("A long system prompt shared by many requests. ", 400)
	blocks := features.AppendPrefix(nil, []byte(prompt), 256, 64)
	feed := func(hb *subjects.Heartbeat) { hb.KVEvents, hb.KVBlocks, hb.BlockSize = true, 100000, 16 }
	for _, id := range []string{"pd-d0", "pd-d1"} {
		e.beat(id, 0.1, 0, 0, feed)
	}
	update := func(seq uint64, reset bool, stored, evicted []uint64) {
		t.Helper()
		if err := e.r.ObserveKV(&subjects.KVUpdate{Replica: "pd-d1", Model: "pd-model", Seq: seq, Reset: reset, KVBlocks: 100000, Stored: stored, Evicted: evicted}); err != nil {
			t.Fatal(err)
		}
	}
	update(1, true, blocks, nil)
	d := e.explain(pdRequest(6000, blocks))
	if d.Replica != "pd-d1" || d.Prefill != "" || d.Split != policy.SplitWholeShort || d.UncachedTokens != 6000-64*64 {
		t.Fatalf("engine holds the prefix: decode %s prefill %q split %q uncached %d", d.Replica, d.Prefill, d.Split, d.UncachedTokens)
	}
	update(2, false, nil, blocks)
	d = e.explain(pdRequest(6000, blocks))
	if d.Prefill == "" || d.UncachedTokens != 6000 {
		t.Fatalf("engine evicted the prefix: decode %s prefill %q split %q uncached %d", d.Replica, d.Prefill, d.Split, d.UncachedTokens)
	}
}

// A peer's placement of a split request teaches its prefill replica too:
// the next prompt with that prefix goes to the same prefill replica,
// though it is the busier one. A placement that names as its prefill a
// replica that is no prefill replica of the model teaches nothing of it.
func TestPeerPlacementOfASplitTeachesThePrefillReplica(t *testing.T) {
	prompt := strings.Repeat("A long system prompt shared by many requests. ", 400)
	blocks := features.AppendPrefix(nil, []byte(prompt), 256, 64) // 64 blocks of 64 tokens

	e := newEnv(t, pdTable)
	e.r.ObservePlacement(&subjects.Placement{Model: "pd-model", Replica: "pd-d1", Prefill: "pd-p1", Blocks: blocks})
	e.beat("pd-p1", 0.5, 4, 0)
	e.beat("pd-p0", 0.05, 0, 0)
	d := e.explain(pdRequest(20000, blocks))
	mustRoute(t, d)
	if d.Replica != "pd-d1" || d.Prefill != "pd-p1" || d.UncachedTokens != 20000-64*64 {
		t.Fatalf("decode %s prefill %q uncached %d, want pd-d1 and pd-p1 (they hold the prefix) and %d", d.Replica, d.Prefill, d.UncachedTokens, 20000-64*64)
	}

	e = newEnv(t, pdTable)
	e.r.ObservePlacement(&subjects.Placement{Model: "pd-model", Replica: "pd-d0", Prefill: "pd-d1", Blocks: blocks})
	e.beat("pd-d0", 0.1, 0, 0, func(hb *subjects.Heartbeat) { hb.State = subjects.StateDraining })
	d = e.explain(pdRequest(20000, blocks))
	mustRoute(t, d)
	if d.Replica != "pd-d1" || d.UncachedTokens != 20000 {
		t.Fatalf("decode %s uncached %d, want pd-d1 holding nothing: a decode replica named as the prefill was believed", d.Replica, d.UncachedTokens)
	}
}
