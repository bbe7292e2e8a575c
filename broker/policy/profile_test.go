package policy_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/switchyard-llm/switchyard/broker/policy"
	"github.com/switchyard-llm/switchyard/subjects"
	"github.com/switchyard-llm/switchyard/table"
)

// twoReplicas is a router on a table of model m with replicas "light-kv"
// (kv 0.2, its batch full and 96 waiting: a high load_score) and
// "light-queue" (kv 0.7, idle), and extra keys.
func twoReplicas(t *testing.T, extra string) *policy.Router {
	t.Helper()
	s := build(t, []byte(`{
		"models.m": {"max_context_tokens": 8192},
		"replicas.light-kv": {"model": "m", "pool": "general", "max_batch": 32, "max_queue": 128, "state": "ready"},
		"replicas.light-queue": {"model": "m", "pool": "general", "max_batch": 32, "max_queue": 128, "state": "ready"}}`), []byte(extra))
	r := policy.New(policy.Config{Self: "b1"})
	r.SetTable(s)
	for _, hb := range []*subjects.Heartbeat{
		{Replica: "light-kv", KVUsage: 0.2, Running: 32, Waiting: 96},
		{Replica: "light-queue", KVUsage: 0.7},
	} {
		hb.State, hb.MaxBatch, hb.MaxQueue, hb.ScrapeOK = subjects.StateReady, 32, 128, true
		r.ObserveHeartbeat(hb, t0)
	}
	return r
}

// checkSums: the chosen replica's score and each alternative's are the
// sums of the profile's weighted scorer values the decision reports.
func checkSums(t *testing.T, d *policy.Decision) {
	t.Helper()
	sum := func(v []float64) float64 {
		s := 0.0
		for k, w := range d.Weights {
			s += w * v[k]
		}
		return s
	}
	if got := sum(d.Values[:]); math.Abs(got-d.Score) > 1e-12 {
		t.Errorf("chosen %s: score %v, its scorers sum to %v (%v × %v)", d.Replica, d.Score, got, d.Weights, d.Values)
	}
	for k, a := range d.Alternatives() {
		if got := sum(d.AltValues[k][:]); math.Abs(got-a.Score) > 1e-12 {
			t.Errorf("alternative %s: score %v, its scorers sum to %v", a.Replica, a.Score, got)
		}
	}
}

// TestDefaultProfileIsLoadScore: without policy.profile the switchyard
// profile chooses, its score load_score plus the saturation penalty, and
// the decision names each scorer's value for the chosen replica and the
// one that lost, on the wire too.
func TestDefaultProfileIsLoadScore(t *testing.T) {
	r := twoReplicas(t, `{}`)
	d := r.Decide(&policy.Request{Tenant: "t", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 100}, t0, rand.New(rand.NewPCG(1, 2)))
	mustRoute(t, &d)
	if d.Replica != "light-queue" || d.Reason != policy.ReasonPowerOfTwo {
		t.Fatalf("chose %s (%s), want light-queue by power-of-two", d.Replica, d.Reason)
	}
	if d.Profile != table.ProfileSwitchyard || !slices.Equal(d.Scorers, []string{table.ScorerLoad, table.ScorerSaturated}) ||
		!slices.Equal(d.Weights, []float64{1, policy.SaturationPenalty}) {
		t.Fatalf("profile %s, scorers %v weighted %v", d.Profile, d.Scorers, d.Weights)
	}
	// light-queue: 0.6·0.7; light-kv: 0.6·0.2 + 0.3·96/128 + 0.1·32/32.
	if d.Values[0] != 0.6*0.7 || d.NAlts != 1 || math.Abs(d.AltValues[0][0]-(0.6*0.2+0.3*0.75+0.1)) > 1e-12 {
		t.Fatalf("load_score values: chosen %v, lost %v", d.Values, d.AltValues[0])
	}
	if d.Alts[0].Why != policy.WhyHigherLoad {
		t.Errorf("light-kv lost by %q, want %q", d.Alts[0].Why, policy.WhyHigherLoad)
	}
	checkSums(t, &d)
	w := d.Wire(&policy.Request{})
	if w.Profile != table.ProfileSwitchyard || len(w.Scores) != 2 || w.Scores[0] != (subjects.Score{Scorer: table.ScorerLoad, Weight: 1, Value: d.Values[0]}) ||
		len(w.Alternatives) != 1 || len(w.Alternatives[0].Scores) != 2 || w.Alternatives[0].Scores[0].Value != d.AltValues[0][0] {
		t.Errorf("wire: profile %q, scores %+v, alternatives %+v", w.Profile, w.Scores, w.Alternatives)
	}
}

// TestKVUsageScorerInATestProfile: the kv_usage scorer, weighed instead of
// load_score, sends the request to the replica with the lower kv usage
// although its queue is long; the policy's weights apply to every pool,
// a pool's on top of them.
func TestKVUsageScorerInATestProfile(t *testing.T) {
	req := &policy.Request{Tenant: "t", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 100}
	for _, tc := range []struct {
		name, table string
		want        string
		scorers     []string
	}{
		{"policy", `{"policy": {"scorers": {"load_score": 0, "kv_usage": 1}}}`, "light-kv", []string{table.ScorerSaturated, table.ScorerKVUsage}},
		{"pool", `{"pools.general": {"profile": "switchyard", "scorers": {"load_score": 0, "kv_usage": 1}}}`, "light-kv", []string{table.ScorerSaturated, table.ScorerKVUsage}},
		{"pool over policy", `{"policy": {"scorers": {"load_score": 0, "kv_usage": 1}}, "pools.general": {"scorers": {"load_score": 1, "kv_usage": 0}}}`,
			"light-queue", []string{table.ScorerLoad, table.ScorerSaturated}},
		{"another pool's", `{"pools.premium": {"scorers": {"load_score": 0, "kv_usage": 1}}}`, "light-queue", []string{table.ScorerLoad, table.ScorerSaturated}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := twoReplicas(t, tc.table)
			d := r.Decide(req, t0, rand.New(rand.NewPCG(1, 2)))
			mustRoute(t, &d)
			if d.Replica != tc.want || !slices.Equal(d.Scorers, tc.scorers) {
				t.Fatalf("chose %s weighing %v, want %s weighing %v", d.Replica, d.Scorers, tc.want, tc.scorers)
			}
			checkSums(t, &d)
			if tc.want == "light-kv" {
				if d.Values[1] != 0.2 || d.AltValues[0][1] != 0.7 || d.Alts[0].Why != policy.WhyHigherScore {
					t.Errorf("kv_usage: chosen %v, lost %v by %q", d.Values, d.AltValues[0], d.Alts[0].Why)
				}
			}
		})
	}
}

// TestSaturatedStaysACandidate: a profile that weighs kv_usage alone
// still never excludes a saturated replica; the default penalizes it
// through the saturated scorer.
func TestSaturatedStaysACandidate(t *testing.T) {
	r := twoReplicas(t, `{"policy": {"scorers": {"load_score": 0, "saturated": 0, "kv_usage": 1}}}`)
	r.ObserveHeartbeat(&subjects.Heartbeat{Replica: "light-queue", State: subjects.StateReady, KVUsage: 0.99,
		MaxBatch: 32, MaxQueue: 128, ScrapeOK: true}, t0)
	r.ObserveHeartbeat(&subjects.Heartbeat{Replica: "light-kv", State: subjects.StateReady, KVUsage: 0.97,
		MaxBatch: 32, MaxQueue: 128, ScrapeOK: true}, t0)
	d := r.Decide(&policy.Request{Tenant: "t", Model: "m", Endpoint: subjects.EndpointChat, PromptTokens: 100}, t0, rand.New(rand.NewPCG(1, 2)))
	mustRoute(t, &d)
	if d.Replica != "light-kv" || d.NAlts != 1 || d.Alts[0].Why != policy.WhySaturated {
		t.Fatalf("chose %s, alternatives %+v: want light-kv, light-queue kept as a saturated alternative", d.Replica, d.Alternatives())
	}
	checkSums(t, &d)
}
