package policy

import (
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// newSnapshot returns an empty snapshot and a function that sets one of
// its keys, as the table's bucket would.
func newSnapshot(t *testing.T) (*table.Snapshot, func(k, v string)) {
	s := table.NewSnapshot()
	return s, func(k, v string) {
		t.Helper()
		val, err := table.Decode(k, json.RawMessage(v))
		if err != nil {
			t.Fatalf("decode %s: %v", k, err)
		}
		s.Set(val, json.RawMessage(v))
	}
}

// TestLoadViewFollowsEveryChange drives a router through random
// heartbeats, load deltas, peers' placements and admitted decisions, and
// after each checks every replica whose kept load view claims to be
// current (its version) against the view computed afresh: a change to
// what load reads that forgets touch shows here as a stale view believed.
func TestLoadViewFollowsEveryChange(t *testing.T) {
	s, set := newSnapshot(t)
	set("models.m", `{"max_context_tokens": 131072}`)
	set("policy", `{"replica_choice": "predicted-ttft"}`)
	ids := make([]string, 6)
	for i := range ids {
		ids[i] = "r-" + strconv.Itoa(i)
		set("replicas."+ids[i], `{"model": "m", "pool": "general", "max_batch": 8, "max_queue": 32, "state": "ready"}`)
	}
	r := New(Config{Self: "test"})
	r.SetTable(s)
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	seqs := map[string]uint64{}
	beat := func(id string) {
		seqs[id]++
		r.ObserveHeartbeat(&subjects.Heartbeat{Replica: id, Model: "m", Pool: "general", State: subjects.StateReady, ScrapeOK: true,
			KVUsage: rng.Float64(), Running: rng.IntN(10), Waiting: rng.IntN(12), MaxBatch: 8, MaxQueue: 32,
			Inflight: rng.IntN(20), TTFTEWMAMillis: 100, QueueWaitMillis: 20, PrefillTokensPerSec: 1000 + rng.Float64()*9000,
			QueuedPrefillTokens: rng.IntN(5000), DecodeMillis: rng.Float64() * 2000, Scheduling: subjects.SchedulingPriority,
			BatchWaiting: rng.IntN(4), Seq: seqs[id]}, now)
	}
	for _, id := range ids {
		beat(id)
	}
	var deltaSeq uint64
	for i := range 3000 {
		now = now.Add(time.Millisecond)
		id := ids[rng.IntN(len(ids))]
		switch rng.IntN(4) {
		case 0:
			beat(id)
		case 1:
			deltaSeq++
			r.ObserveLoadDelta(&subjects.LoadDelta{Replica: id, Heartbeat: seqs[id], Seq: deltaSeq,
				Inflight: rng.IntN(20), QueuedPrefillTokens: rng.IntN(5000)}, now)
		case 2:
			r.ObservePlacement(&subjects.Placement{Model: "m", Replica: id, Uncached: rng.IntN(3000)})
		default:
			r.Decide(&Request{Tenant: "t", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 1 + rng.IntN(4000),
				MaxTokens: 64, ID: "q-" + strconv.Itoa(i)}, now, rng)
		}
		r.mu.Lock()
		for _, x := range r.view.replicas {
			v := x.scored
			if v.prof == nil || v.ver != x.ver {
				continue // not believed: the next decision computes it again
			}
			p := pick{saturation: v.sat, req: &Request{}, prof: v.prof}
			p.renew(x, &s.Policy.LoadWeights)
			if x.scored != v {
				r.mu.Unlock()
				t.Fatalf("step %d: %s's kept view %+v, computed afresh %+v", i, x.id, v, x.scored)
			}
		}
		r.mu.Unlock()
	}
}
