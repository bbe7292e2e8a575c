package policy_test

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/features"
	"github.com/switchyard-llm/switchyard/subjects"
)

// BenchmarkDecide measures full decisions: an alias with a canary, the pool
// rules, the candidate filter, session affinity (half the requests) and
// prefix affinity over 32 blocks (the other half), power of two, quota,
// capacity, deadline and fair-share admission, alternatives, and the
// commit (its in-flight tokens counted under the request id, which comes
// round again every 256 decisions, as a request id seen twice).
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{8, 64, 1024} {
		b.Run("candidates="+strconv.Itoa(n), func(b *testing.B) { benchDecide(b, n, `{"policy": {}}`) })
	}
	// The same with predicted TTFT choosing, on prefill views that load
	// deltas move between heartbeats.
	b.Run("predicted-ttft/candidates=64", func(b *testing.B) {
		benchDecide(b, 64, `{"policy": {"replica_choice": "predicted-ttft"}}`)
	})
	// The switchyard profile by name, and weighing kv_usage beside
	// load_score: a scorer more costs nothing per decision (its value is
	// worked out per load-view update).
	b.Run("profile=switchyard/candidates=64", func(b *testing.B) {
		benchDecide(b, 64, `{"policy": {"profile": "switchyard"}}`)
	})
	b.Run("profile=switchyard+kv_usage/candidates=64", func(b *testing.B) {
		benchDecide(b, 64, `{"policy": {"profile": "switchyard", "scorers": {"kv_usage": 0.5}}}`)
	})
	// Regions configured, the router in eu, every replica healthy: the
	// 64 candidates are eu's; with 64 more in us, the region step leaves
	// those out.
	const regions = `{"policy": {"regions": {"eu": {"spill": ["us", "ap"], "penalty": "40ms"}, "us": {"spill": ["eu"]}}}}`
	b.Run("regions/candidates=64", func(b *testing.B) { benchDecideIn(b, 64, 0, regions, false) })
	b.Run("regions/candidates=64+64-remote", func(b *testing.B) { benchDecideIn(b, 64, 64, regions, false) })
	// Every replica feeds its engine's KV-cache events and holds every
	// system prompt: prefix affinity draws among all the holders of a
	// level.
	for _, n := range []int{64, 1024} {
		b.Run("kv-events-everywhere/candidates="+strconv.Itoa(n), func(b *testing.B) {
			benchDecideIn(b, n, -1, `{"policy": {}}`, true)
		})
	}
	// The same with predicted TTFT, the router alone: it weighs every
	// candidate, each credited the blocks it holds.
	for _, n := range []int{64, 1024} {
		b.Run("predicted-ttft/kv-events-everywhere/candidates="+strconv.Itoa(n), func(b *testing.B) {
			benchDecideIn(b, n, -1, `{"policy": {"replica_choice": "predicted-ttft"}}`, true)
		})
	}
}

func benchDecide(b *testing.B, n int, policyJSON string) { benchDecideIn(b, n, -1, policyJSON, false) }

// benchDecideIn is benchDecide with regions when remote ≥ 0: the router
// and the n general replicas in eu, and remote more general replicas in
// us; with kvEverywhere, every replica's KV-event feed says it holds every
// request's prefix.
func benchDecideIn(b *testing.B, n, remote int, policyJSON string, kvEverywhere bool) {
	var sb strings.Builder
	sb.WriteString(`{
	"aliases.chat": {"targets": [{"model": "m", "version": "v1", "weight": 95}, {"model": "m", "version": "v2", "weight": 5}]},
	"models.m": {"versions": ["v1", "v2"], "max_context_tokens": 131072, "default_max_tokens": 512},
	"tenants.bench": {"quota": {"rpm": 1000000000000000, "tpm": 1000000000000000}},
	"replicas.long-0": {"model": "m", "version": "v1", "pool": "long-context", "max_batch": 64, "max_queue": 256, "state": "ready"}`)
	// The canary takes 5% of the traffic: one canary replica per 32 of
	// the general pool (at least two), or the canary's prefill queue, which
	// only heartbeats empty, outgrows the requests' deadline.
	for i := range max(2, n/32) {
		sb.WriteString(`,"replicas.canary-` + strconv.Itoa(i) + `": {"model": "m", "version": "v2", "pool": "canary", "max_batch": 64, "max_queue": 256, "state": "ready"}`)
	}
	for i := range n + max(remote, 0) {
		sb.WriteString(`,"replicas.gen-` + strconv.Itoa(i) + `": {"model": "m", "version": "v1", "pool": "general", "max_batch": 64, "max_queue": 256, "state": "ready"}`)
	}
	sb.WriteString("}")
	s := build(b, []byte(policyJSON), []byte(sb.String()))
	cfg := policy.Config{Self: "bench"}
	if remote >= 0 {
		cfg.Region = "eu"
	}
	r := policy.New(cfg)
	r.SetTable(s)
	now := t0
	rng := rand.New(rand.NewPCG(7, 7))
	heartbeats := make([]*subjects.Heartbeat, 0, len(s.Replicas))
	for id := range s.Replicas {
		heartbeats = append(heartbeats, &subjects.Heartbeat{Replica: id, State: subjects.StateReady,
			KVUsage: rng.Float64() * 0.9, Running: rng.IntN(64), Waiting: rng.IntN(16), MaxBatch: 64, MaxQueue: 256,
			TTFTEWMAMillis: 80, QueueWaitMillis: 20, ScrapeOK: true,
			PrefillTokensPerSec: 5000 + rng.Float64()*5000, QueuedPrefillTokens: rng.IntN(20000)})
	}
	if remote >= 0 {
		for _, hb := range heartbeats {
			hb.Region = "eu"
			if i, err := strconv.Atoi(strings.TrimPrefix(hb.Replica, "gen-")); err == nil && i >= n {
				hb.Region = "us"
			}
		}
	}
	if kvEverywhere {
		for _, hb := range heartbeats {
			hb.KVEvents, hb.KVBlocks, hb.BlockSize = true, 1<<20, 16
		}
	}
	deltas := make([]subjects.LoadDelta, len(heartbeats))
	for i, hb := range heartbeats {
		deltas[i] = subjects.LoadDelta{Replica: hb.Replica, Inflight: rng.IntN(80), QueuedPrefillTokens: rng.IntN(20000)}
	}
	beat := func() {
		for _, hb := range heartbeats {
			r.ObserveHeartbeat(hb, now)
		}
	}
	beat()

	// 256 requests over 16 shared system prompts: prefixes hit after the
	// first round, as they do in production.
	reqs := make([]policy.Request, 256)
	for i := range reqs {
		prompt := strings.Repeat("system prompt "+strconv.Itoa(i%16)+" ", 1200) + strconv.Itoa(i)
		reqs[i] = policy.Request{
			Tenant: "bench", Model: "chat", Endpoint: subjects.EndpointChat,
			PromptTokens: 2000, MaxTokens: 256, Deadline: now.Add(30 * time.Second), ID: "req-" + strconv.Itoa(i),
			Prefix: features.AppendPrefix(nil, []byte(prompt), 256, 32),
		}
		if i%2 == 0 {
			reqs[i].Conversation = "conversation-" + strconv.Itoa(i)
		}
	}
	if kvEverywhere {
		var stored []uint64
		for i := range 16 {
			stored = append(stored, reqs[i].Prefix...)
		}
		for _, hb := range heartbeats {
			if err := r.ObserveKV(&subjects.KVUpdate{Replica: hb.Replica, Model: "m", Seq: 1, Reset: true, KVBlocks: 1 << 20, Stored: stored}); err != nil {
				b.Fatal(err)
			}
		}
	}
	var d policy.Decision
	every := 8 * len(heartbeats) // each replica hears from its engine every 8·n decisions
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		d = r.Decide(&reqs[i%len(reqs)], now, rng)
		if d.Err != nil {
			b.Fatalf("rejected: %v", d.Err)
		}
		now = now.Add(time.Microsecond)
		if i++; i%every == 0 {
			beat()
		}
		// Each replica's adapter sends a delta every 8 decisions of the
		// fleet's, on top of the heartbeat held.
		if i%8 == 0 {
			dl := &deltas[(i/8)%len(deltas)]
			dl.Seq++
			r.ObserveLoadDelta(dl, now)
		}
	}
}
