package policy_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// peers is a router of model m on replicas a and b (KV blocks of 16
// tokens, 1000 of them), with the profile selected.
type peers struct {
	t   *testing.T
	r   *policy.Router
	rng *rand.Rand
}

func newPeers(t *testing.T, profile string) *peers {
	t.Helper()
	s := build(t, []byte(fmt.Sprintf(`{
		"models.m": {"max_context_tokens": 65536},
		"policy": {"profile": %q},
		"replicas.a": {"model": "m", "pool": "general", "max_batch": 32, "max_queue": 128, "state": "ready"},
		"replicas.b": {"model": "m", "pool": "general", "max_batch": 32, "max_queue": 128, "state": "ready"}}`, profile)))
	r := policy.New(policy.Config{Self: "b1"})
	r.SetTable(s)
	p := &peers{t: t, r: r, rng: rand.New(rand.NewPCG(1, 2))}
	p.beat("a", 0, 0, 0, 0)
	p.beat("b", 0, 0, 0, 0)
	return p
}

// beat sends id's heartbeat: kv usage, running, waiting, queued prefill.
func (p *peers) beat(id string, kv float64, running, waiting, queued int) {
	p.r.ObserveHeartbeat(&subjects.Heartbeat{Replica: id, Model: "m", Pool: "general", State: subjects.StateReady,
		KVUsage: kv, Running: running, Waiting: waiting, MaxBatch: 32, MaxQueue: 128, ScrapeOK: true,
		KVBlocks: 1000, BlockSize: 16, QueuedPrefillTokens: queued}, t0)
}

// decide decides (and commits) a request of tokens prompt tokens whose
// prefix blocks are prefix.
func (p *peers) decide(tokens int, prefix ...uint64) *policy.Decision {
	p.t.Helper()
	d := p.r.Decide(&policy.Request{Model: "m", PromptTokens: tokens, Prefix: prefix}, t0, p.rng)
	mustRoute(p.t, &d)
	return &d
}

// place makes replica id hold prefix, as this router's placement: a
// request with it is sent there while the other replica is busy.
func (p *peers) place(id string, prefix ...uint64) {
	p.t.Helper()
	other := "a"
	if id == "a" {
		other = "b"
	}
	p.beat(other, 0.9, 32, 100, 100000)
	p.beat(id, 0, 0, 0, 0)
	if d := p.decide(len(prefix)*64, prefix...); d.Replica != id {
		p.t.Fatalf("placing on %s: went to %s (%s)", id, d.Replica, d.Reason)
	}
}

func close9(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestDynamoKVCost: Dynamo's KV router cost (lib/kv-router selector.rs)
// is prefill_load_scale × (active prefill tokens + the request's uncached
// ones) / block size + the worker's active decode blocks, the lowest cost
// wins, and the explanation names the two terms. Dynamo's own unit test
// (test_worker_logit_can_charge_active_requests) has a worker with 100
// active decode blocks and nothing to prefill cost exactly 100 with the
// default config.
func TestDynamoKVCost(t *testing.T) {
	p := newPeers(t, table.ProfileDynamoKV)
	p.place("b", 1, 2, 3, 4, 5, 6, 7, 8) // 8 blocks of 64 tokens: 512 tokens
	// a: nothing cached, 10 decode blocks, nothing queued; b: the first 512
	// of 1024 tokens cached, 20 decode blocks.
	p.beat("a", 0.010, 1, 0, 0)
	p.beat("b", 0.020, 1, 0, 0)
	d := p.decide(1024, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16)
	// a: 1024/16 + 10 = 74; b: 512/16 + 20 = 52.
	if d.Replica != "b" || d.Reason != policy.ReasonLowestScore || !close9(d.Score, 52) {
		t.Fatalf("chose %s (%s) at cost %v, want b at 52 (a: 74)", d.Replica, d.Reason, d.Score)
	}
	if !slices.Equal(d.Scorers, []string{table.ScorerPrefillBlocks, table.ScorerDecodeBlocks}) || !close9(d.Values[0], 32) || !close9(d.Values[1], 20) {
		t.Errorf("explained as %v = %v, want prefill_blocks 32, decode_blocks 20", d.Scorers, d.Values)
	}
	if alts := d.Alternatives(); len(alts) != 1 || alts[0].Replica != "a" || !close9(alts[0].Score, 74) ||
		!close9(d.AltValues[0][0], 64) || !close9(d.AltValues[0][1], 10) {
		t.Errorf("alternatives %+v %v, want a at 74 = 64 + 10", alts, d.AltValues[0])
	}
	if d.PrefixMatched != 8 {
		t.Errorf("prefix matched %d, want 8", d.PrefixMatched)
	}
	checkSums(t, d)

	// Dynamo's test: 100 active decode blocks, nothing to prefill (a
	// request whose every block is cached), costs 100.
	p.beat("b", 0.100, 1, 0, 0)
	p.beat("a", 0.5, 1, 0, 0)
	if d := p.decide(512, 1, 2, 3, 4, 5, 6, 7, 8); d.Replica != "b" || !close9(d.Score, 100) || !close9(d.Values[0], 0) {
		t.Errorf("a fully cached request on 100 decode blocks: %s at %v (%v), want b at 100", d.Replica, d.Score, d.Values)
	}
}

// TestLLMDPreciseScores: llm-d's precise-prefix guide weighs the
// prefix-cache scorer 2, kv-cache-utilization 1 and queue 1 under a
// max-score picker; each value here is 1 − llm-d's score. A replica
// holding the whole prefix at kv 0.5 with 4 waiting scores
// 2·1 + 1·0.5 + 1·0 = 2.5 in llm-d's terms, an empty one at kv 0.1 with
// none waiting 0 + 0.9 + 1 = 1.9: the warm one wins.
func TestLLMDPreciseScores(t *testing.T) {
	p := newPeers(t, table.ProfileLLMDPrecise)
	p.place("a", 1, 2, 3, 4)
	p.beat("a", 0.5, 10, 4, 0)
	p.beat("b", 0.1, 0, 0, 0)
	d := p.decide(256, 1, 2, 3, 4)
	if d.Replica != "a" || d.Reason != policy.ReasonLowestScore {
		t.Fatalf("chose %s (%s), want a", d.Replica, d.Reason)
	}
	if want := []float64{0, 0.5, 1}; !close9(d.Values[0], want[0]) || !close9(d.Values[1], want[1]) || !close9(d.Values[2], want[2]) || !close9(d.Score, 4-2.5) {
		t.Errorf("a's values %v (score %v), want %v (score 1.5: 4 − llm-d's 2.5)", d.Values, d.Score, want)
	}
	if a := d.Alternatives(); len(a) != 1 || !close9(a[0].Score, 4-1.9) {
		t.Errorf("b's score %+v, want 2.1 (4 − llm-d's 1.9)", a)
	}
	checkSums(t, d)
	// Half the prefix on a at kv 0.95: 2·0.5 + 0.05 + 0 = 1.05 < 1.9.
	p.beat("a", 0.95, 10, 6, 0)
	if d := p.decide(256, 1, 2, 7, 8); d.Replica != "b" {
		t.Errorf("a half-warm full replica: chose %s, want b", d.Replica)
	}
}

// TestLLMDStickyFilter: llm-d's prefix-cache-affinity filter keeps the
// replicas holding at least 80% of the prefix (its README) and the
// token-load scorer picks among them; when the best sticky replica's
// estimated wait (in-flight tokens at 15 928 tokens/s) exceeds the best
// other's by more than 18 s, stickiness is broken.
func TestLLMDStickyFilter(t *testing.T) {
	p := newPeers(t, table.ProfileLLMDSticky)
	p.place("a", 1, 2, 3, 4, 5)
	p.beat("a", 0.5, 10, 4, 100000) // 6.3 s of in-flight prefill
	p.beat("b", 0, 0, 0, 0)
	d := p.decide(320, 1, 2, 3, 4, 5)
	if d.Replica != "a" || d.Reason != policy.ReasonStickyPrefix {
		t.Fatalf("chose %s (%s), want a by %s", d.Replica, d.Reason, policy.ReasonStickyPrefix)
	}
	if a := d.Alternatives(); len(a) != 1 || a[0].Why != policy.WhyNotSticky {
		t.Errorf("b lost %+v, want %q", a, policy.WhyNotSticky)
	}
	// 4 of 5 blocks (80%) is still sticky; 3 of 5 is not: token load.
	if d := p.decide(320, 1, 2, 3, 4, 96); d.Replica != "a" || d.Reason != policy.ReasonStickyPrefix {
		t.Errorf("an 80%% match: %s (%s), want a by %s", d.Replica, d.Reason, policy.ReasonStickyPrefix)
	}
	if d := p.decide(320, 1, 2, 3, 97, 95); d.Replica != "b" || d.Reason != policy.ReasonLowestScore {
		t.Errorf("a 60%% match: %s (%s), want b by token load", d.Replica, d.Reason)
	}
	// 400 000 in-flight tokens: 25 s behind b, past the 18 s penalty.
	p.beat("a", 0.5, 10, 4, 400000)
	p.beat("b", 0, 0, 0, 0)
	if d := p.decide(320, 1, 2, 3, 4, 5); d.Replica != "b" || d.Reason != policy.ReasonTTFTGate {
		t.Errorf("a 25 s behind: %s (%s), want b by %s", d.Replica, d.Reason, policy.ReasonTTFTGate)
	}
}

// TestSGLangCacheAware reproduces SMG's cache_aware.rs tests with the
// default config: with balanced load the same text goes to the same
// worker and so does a prefix of it (test_cache_aware_with_balanced_load);
// with the load imbalanced past both thresholds the least loaded worker
// wins whatever it holds (test_cache_aware_with_imbalanced_load, there
// with thresholds 5 and 2.0, here 40 requests against none past 32 and
// 1.1).
func TestSGLangCacheAware(t *testing.T) {
	p := newPeers(t, table.ProfileSGLangCacheAware)
	first := p.decide(128, 1, 2)
	if first.Reason != policy.ReasonShortestQueue {
		t.Errorf("a new text: %s, want %s", first.Reason, policy.ReasonShortestQueue)
	}
	p.beat(first.Replica, 0.1, 1, 0, 0) // it took the request
	if d := p.decide(128, 1, 2); d.Replica != first.Replica || d.Reason != policy.ReasonCacheMatch || d.PrefixMatched != 2 {
		t.Errorf("the same text: %s (%s, %d matched), want %s by %s", d.Replica, d.Reason, d.PrefixMatched, first.Replica, policy.ReasonCacheMatch)
	}
	if d := p.decide(64, 1); d.Replica != first.Replica || d.Reason != policy.ReasonCacheMatch {
		t.Errorf("a prefix of it: %s (%s), want %s", d.Replica, d.Reason, first.Replica)
	}
	// Half matched is not more than cache_threshold 0.5: shortest queue.
	if d := p.decide(256, 1, 2, 7, 8); d.Reason != policy.ReasonShortestQueue {
		t.Errorf("half matched: %s, want %s", d.Reason, policy.ReasonShortestQueue)
	}
	other := "a"
	if first.Replica == "a" {
		other = "b"
	}
	p.beat(first.Replica, 0.5, 32, 8, 0)
	p.beat(other, 0, 0, 0, 0)
	for range 5 {
		if d := p.decide(128, 1, 2); d.Replica != other || d.Reason != policy.ReasonImbalanced {
			t.Fatalf("40 requests against none: %s (%s), want %s by %s", d.Replica, d.Reason, other, policy.ReasonImbalanced)
		}
	}
}

// TestPeerProfilesExplainInTheirTerms: `switchyard explain`'s view of a
// peer decision (Explain, the wire form) names the profile, its scorers
// with their weights and values, and the step that decided.
func TestPeerProfilesExplainInTheirTerms(t *testing.T) {
	for _, tc := range []struct {
		profile string
		scorers []string
		weights []float64
	}{
		{table.ProfileDynamoKV, []string{table.ScorerPrefillBlocks, table.ScorerDecodeBlocks}, []float64{1, 1}},
		{table.ProfileLLMDPrecise, []string{table.ScorerPrefixCache, table.ScorerKVUsage, table.ScorerQueue}, []float64{2, 1, 1}},
		{table.ProfileLLMDSticky, []string{table.ScorerTokenLoad}, []float64{1}},
		{table.ProfileSGLangCacheAware, []string{table.ScorerRequests}, []float64{1}},
	} {
		p := newPeers(t, tc.profile)
		q := &policy.Request{Model: "m", PromptTokens: 100, Prefix: []uint64{1}}
		d := p.r.Explain(q, t0, p.rng)
		mustRoute(t, &d)
		if d.Profile != tc.profile || !slices.Equal(d.Scorers, tc.scorers) || !slices.Equal(d.Weights, tc.weights) {
			t.Errorf("%s: explained as %s %v %v, want %v %v", tc.profile, d.Profile, d.Scorers, d.Weights, tc.scorers, tc.weights)
		}
		w := d.Wire(q)
		if w.Profile != tc.profile || len(w.Scores) != len(tc.scorers) || w.Reason == "" {
			t.Errorf("%s: on the wire %+v", tc.profile, w)
		}
		checkSums(t, &d)
	}
}

// TestPeerProfilesDoNotAllocate: a peer decision reuses the decision's
// scratch.
func TestPeerProfilesDoNotAllocate(t *testing.T) {
	for _, prof := range []string{table.ProfileDynamoKV, table.ProfileLLMDPrecise, table.ProfileLLMDSticky, table.ProfileSGLangCacheAware} {
		p := newPeers(t, prof)
		q := &policy.Request{Model: "m", PromptTokens: 100, Prefix: []uint64{1, 2}}
		p.r.Explain(q, t0, p.rng)
		if n := testing.AllocsPerRun(100, func() { p.r.Explain(q, t0, p.rng) }); n != 0 {
			t.Errorf("%s: %v allocations a decision", prof, n)
		}
	}
}
