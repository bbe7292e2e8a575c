package policy

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
)

// TestPendingBlocksLastUntilTheEngineReportsThem: a decider alone with
// predicted-ttft keeps the blocks it sent a replica with the KV-event feed
// and did not hold there as pending, until an update of that replica's
// feed, applied, reports them stored or evicted, or a reset (not a
// resend) says its engine or adapter started over. A refused update
// changes nothing; a decider with another live keeps none.
func TestPendingBlocksLastUntilTheEngineReportsThem(t *testing.T) {
	s, set := newSnapshot(t)
	set("models.m", `{"max_context_tokens": 131072}`)
	set("policy", `{"replica_choice": "predicted-ttft", "allow_anonymous": true}`)
	set("replicas.r-0", `{"model": "m", "pool": "general", "max_batch": 8, "max_queue": 32, "state": "ready"}`)
	set("replicas.r-1", `{"model": "m", "pool": "general", "max_batch": 8, "max_queue": 32, "state": "ready"}`)
	r := New(Config{Self: "test"})
	r.SetTable(s)
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seq := map[string]uint64{}
	kv := func(id string, u subjects.KVUpdate) error {
		u.Replica, u.Model, u.KVBlocks = id, "m", 1000
		if u.Seq == 0 {
			seq[id]++
			u.Seq = seq[id]
		}
		return r.ObserveKV(&u)
	}
	for i, id := range []string{"r-0", "r-1"} {
		// r-0 has less prefill queued: it takes the request.
		r.ObserveHeartbeat(&subjects.Heartbeat{Replica: id, Model: "m", Pool: "general", State: subjects.StateReady, ScrapeOK: true,
			MaxBatch: 8, MaxQueue: 32, TTFTEWMAMillis: 50, PrefillTokensPerSec: 1000, QueuedPrefillTokens: 1000 * i, Seq: 1,
			KVEvents: true, KVBlocks: 1000, BlockSize: 16}, now)
		if err := kv(id, subjects.KVUpdate{Reset: true, Stored: []uint64{uint64(900 + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	blocks := []uint64{11, 12, 13, 14, 15, 16, 17, 18}
	decide := func(want string) {
		d := r.Decide(&Request{Tenant: "default", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 512, Prefix: blocks}, now, rng)
		if d.Err != nil || (want != "" && d.Replica != want) {
			t.Fatalf("decision: %s (%v), want %s", d.Replica, d.Err, want)
		}
	}
	pending := func() int {
		if m := r.view.pending["m"]; m != nil {
			return m.len()
		}
		return 0
	}
	decide("r-0")
	if n := pending(); n != len(blocks) {
		t.Fatalf("%d blocks pending after the first request, want %d", n, len(blocks))
	}
	if err := kv("r-0", subjects.KVUpdate{Stored: blocks[:3]}); err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 5 {
		t.Fatalf("%d blocks pending after 3 stored, want 5", n)
	}
	// Sent again: the 3 held there are not pending; the 5 are already.
	decide("r-0")
	if n := pending(); n != 5 {
		t.Fatalf("%d blocks pending after a second request, want 5", n)
	}
	// An update after a missed one is refused: nothing is forgotten.
	if err := kv("r-0", subjects.KVUpdate{Seq: seq["r-0"] + 2, Stored: blocks[3:]}); err == nil {
		t.Fatal("an update after a missed one was applied")
	}
	if n := pending(); n != 5 {
		t.Fatalf("%d blocks pending after a refused update, want 5", n)
	}
	// A resend keeps them; a reset drops them.
	seq["r-0"] = 0
	if err := kv("r-0", subjects.KVUpdate{Reset: true, Resend: true, Stored: blocks[:3]}); err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 5 {
		t.Fatalf("%d blocks pending after a resend, want 5", n)
	}
	seq["r-0"] = 0
	if err := kv("r-0", subjects.KVUpdate{Reset: true}); err != nil {
		t.Fatal(err)
	}
	if n := pending(); n != 0 {
		t.Fatalf("%d blocks pending after a reset, want 0", n)
	}
	// With another decider live, none are kept.
	r.SetLiveBrokers(2)
	decide("")
	if n := pending(); n != 0 {
		t.Fatalf("%d blocks pending with another decider live, want 0", n)
	}
}
